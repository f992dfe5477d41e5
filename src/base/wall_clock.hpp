// This host's wall clock as the scripts count time: µs since the Unix epoch.
#pragma once

#include <chrono>

namespace redlimit::detail {

/// std::chrono::system_clock's now in µs since the epoch (1970-01-01 UTC), the unit of a Lease's
/// expiresAt and of the server's TIME. Thread-safe; never throws.
[[nodiscard]] inline std::chrono::microseconds systemNow() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
}

}  // namespace redlimit::detail
