#include "base/fork_guard.hpp"

#include <unistd.h>

#include "redlimit/detail/fork_generation.hpp"

namespace redlimit::detail {
namespace {

// Above any count of real forks, so the two kinds of value cannot meet.
constexpr std::uint64_t kPidBased = std::uint64_t{1} << 63;

}  // namespace

// The counter and its handler are the header-only ones (redlimit/detail/fork_generation.hpp), so
// the segment cache, which is header-only, and the library see the same generation.
std::uint64_t forkGeneration() noexcept {
  if (!registerForkCounter()) return kPidBased | static_cast<std::uint64_t>(::getpid());
  return forkCounter();
}

}  // namespace redlimit::detail
