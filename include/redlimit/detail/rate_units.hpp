// redlimit — the exact integer units of a rate, shared by the C++ checks of the token bucket and
// GCRA configurations and by lua/gcra.lua (which computes the same numbers).
//
// A rate of P permits per interval I is rarely a whole number of µs per permit. With
// g = gcd(P, I in µs), P' = P / g and I' = I / g, one permit takes exactly I' units of 1/P' µs,
// and the script keeps every time difference in those units. Its values stay exact integers in a
// Lua double (below 2^53) when burst x I' <= 2^50 (see lua/gcra.lua for the rest of the argument).
#pragma once

#include <chrono>
#include <cstdint>
#include <numeric>

namespace redlimit::detail {

struct RateUnits {
  std::int64_t unitsPerMicro = 0;  // P': units in one µs
  std::int64_t permitUnits = 0;    // I': units one permit takes
};

/// The largest burst x I' the script's arithmetic allows: 2^50.
inline constexpr std::int64_t kMaxBurstUnits = std::int64_t{1} << 50;

/// P' and I' of `permits` (>= 1) per `interval` (>= 1 ms, < 2^32 ms: its µs fit easily).
[[nodiscard]] constexpr RateUnits rateUnits(std::int64_t permits, std::chrono::milliseconds interval) noexcept {
  const std::int64_t micros = interval.count() * 1000;
  const std::int64_t g = std::gcd(permits, micros);
  return RateUnits{permits / g, micros / g};
}

/// True if a burst (capacity) of `burst` permits keeps the script exact at this rate: burst x I' <=
/// 2^50 (compared by division, so nothing overflows).
[[nodiscard]] constexpr bool burstFitsExactly(std::int64_t burst, RateUnits units) noexcept {
  return units.permitUnits > 0 && burst <= kMaxBurstUnits / units.permitUnits;
}

}  // namespace redlimit::detail
