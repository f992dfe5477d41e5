// Test support: a scope in which this process cannot open another descriptor (EMFILE).
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace redlimit::test {

/// Descriptors this process has open now.
inline std::size_t openDescriptors() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

/// Lowers RLIMIT_NOFILE to the lowest free descriptor, so that the next open fails with EMFILE;
/// restores the limit on destruction. Not thread-safe with other descriptor changes: a descriptor
/// closed below the limit meanwhile would be free again. So it first waits (at most 2 s) until the
/// count of open descriptors has not changed for 60 ms: a Client whose last reference was dropped
/// on its own I/O thread (a completion held a limiter a moment longer than its caller) closes its
/// sockets there, a little after the caller moved on.
class NoFreeDescriptors {
 public:
  NoFreeDescriptors() {
    std::size_t last = openDescriptors();
    int steady = 0;
    for (int i = 0; i < 100 && steady < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const std::size_t now = openDescriptors();
      steady = now == last ? steady + 1 : 0;
      last = now;
    }
    if (::getrlimit(RLIMIT_NOFILE, &saved_) != 0) throw std::runtime_error("getrlimit failed");
    const int lowestFree = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (lowestFree < 0) throw std::runtime_error("open failed");
    ::close(lowestFree);
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(lowestFree);  // every descriptor below it is in use
    if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) throw std::runtime_error("setrlimit failed");
  }
  ~NoFreeDescriptors() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  NoFreeDescriptors(const NoFreeDescriptors&) = delete;
  NoFreeDescriptors& operator=(const NoFreeDescriptors&) = delete;

 private:
  rlimit saved_{};
};

}  // namespace redlimit::test
