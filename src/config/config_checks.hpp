// Checks of the one-key limiters' configurations, before anything is sent: each throws
// InvalidArgument naming the field, its bound and the value.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "redlimit/detail/rate_units.hpp"
#include "redlimit/detail/limits.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

inline void checkCount(std::string_view what, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) {
    throw InvalidArgument(fmt::format("redlimit: {} must be in {}..{}, got {}", what, lo, hi, value));
  }
}

inline void checkMillis(std::string_view what, std::chrono::milliseconds value, std::int64_t lo) {
  if (value.count() < lo || value > kMaxInterval) {
    throw InvalidArgument(
        fmt::format("redlimit: {} must be in {}..{} ms, got {} ms", what, lo, kMaxInterval.count(), value.count()));
  }
}

// A burst of `burst` at `permits` per `interval` (each already in range) keeps lua/gcra.lua exact.
inline void checkExact(std::string_view burstName, std::int64_t burst, std::int64_t permits,
                       std::chrono::milliseconds interval) {
  const RateUnits u = rateUnits(permits, interval);
  if (!burstFitsExactly(burst, u)) {
    throw InvalidArgument(fmt::format(
        "redlimit: {} {} is too large for {} permits per {} ms: {} x (interval in us / gcd(permits, interval in us) "
        "= {}) must be at most 2^50, so at most {} here",
        burstName, burst, permits, interval.count(), burstName, u.permitUnits, kMaxBurstUnits / u.permitUnits));
  }
}

}  // namespace redlimit::detail
