#include "fork_guard.hpp"

#include <atomic>

#include <pthread.h>
#include <unistd.h>

namespace redlimit::detail {
namespace {

std::atomic<std::uint64_t> gForkGeneration{0};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the fork handler must not take a lock");

// Runs in the child, in the only thread there, between fork() and its return: async-signal-safe
// work only. A lock-free atomic increment is.
void bumpForkGeneration() { gForkGeneration.fetch_add(1, std::memory_order_relaxed); }

// Above any count of real forks, so the two kinds of value cannot meet.
constexpr std::uint64_t kPidBased = std::uint64_t{1} << 63;

}  // namespace

std::uint64_t forkGeneration() noexcept {
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &bumpForkGeneration) == 0;
  if (!registered) return kPidBased | static_cast<std::uint64_t>(::getpid());
  return gForkGeneration.load(std::memory_order_relaxed);
}

}  // namespace redlimit::detail
