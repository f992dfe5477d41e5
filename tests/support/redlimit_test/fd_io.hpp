// Test support: whole writes and reads on a pipe or socket, for tests that pass reports between
// processes.
#pragma once

#include <cerrno>
#include <cstddef>
#include <string>

#include <unistd.h>

namespace redlimit::test {

/// Writes all `size` bytes (retrying after EINTR). False if the descriptor failed first.
inline bool writeAll(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

/// Everything readable until end of file or an error (retrying after EINTR).
inline std::string readToEnd(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

}  // namespace redlimit::test
