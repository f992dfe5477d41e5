// redlimit — building a keyed family's policy (src/keyed_*_rate_limiter.cpp).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "redlimit/keyed_gcra_rate_limiter.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"

namespace redlimit::detail {

/// The keepAlive a keyed family's keys get: `keepAlive`, or kDefaultIdleMargin for 0
/// unless the keys are to be permanent.
inline std::chrono::milliseconds keyedKeepAlive(std::chrono::milliseconds keepAlive, bool permanent) {
  if (keepAlive.count() == 0 && !permanent) return kDefaultIdleMargin;
  return keepAlive;
}

/// The policy of a checked GCRA configuration (kind 'G' or 'T'): the key's header as
/// lua/lib/gcra_core.lua packs it ('<c1I4I4I4I4', little-endian), and the Local bucket as the
/// script's gcraLocalRate computes it.
inline KeyedPolicy gcraPolicy(char kind, std::int64_t burst, std::int64_t rate, std::chrono::milliseconds period,
                              std::chrono::milliseconds keepAlive) {
  KeyedPolicy p;
  p.packed.push_back(kind);
  for (const std::int64_t v :
       {burst, rate, static_cast<std::int64_t>(period.count()), static_cast<std::int64_t>(keepAlive.count())}) {
    const auto u = static_cast<std::uint32_t>(v);  // checked: 0..2^32-1
    for (int shift = 0; shift < 32; shift += 8) p.packed.push_back(static_cast<char>((u >> shift) & 0xffU));
  }
  p.limit = burst;
  p.localRate = burst;
  const double ms =
      std::ceil(static_cast<double>(burst) * static_cast<double>(period.count()) / static_cast<double>(rate));
  p.localIntervalMs = ms < 1 ? 1 : ms > 1e12 ? 1000000000000 : static_cast<std::int64_t>(ms);
  return p;
}

}  // namespace redlimit::detail
