// redlimit — a Policy as its script takes it in every call (policy.cpp builds it, ScriptCore and
// MultiLimit send it).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "limiters/calendar_tables.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/detail/limits.hpp"
#include "redlimit/detail/rate_units.hpp"

namespace redlimit::detail {

/// A configuration sent in every call (a Limiter's policy): `packed` is the configuration as the
/// script stores it (the key's header: 17 bytes for the token bucket and GCRA, 13 for the fixed
/// window; 18 for the smooth limiter: its key's 14 and the keepAlive, which its key has no room
/// for), `limit` what a decision reports as its limit, `maxPermits` the most one call may ask for,
/// `localRate` per `localIntervalMs` the Local failure policy's bucket, and `fields` the
/// configuration in the order of the script's `config` reply, keepAlive last. A calendar quota
/// (kind 'Q') is sent otherwise: `calendar` holds it, its script takes it as arguments of their own
/// (calendarArgs) with a table of its windows, and `packed` only tells policies apart.
struct KeyedPolicy {
  std::string packed;
  std::int64_t limit = 0;
  std::int64_t maxPermits = 0;
  std::int64_t localRate = 0;
  std::int64_t localIntervalMs = 0;
  std::vector<std::int64_t> fields;
  std::optional<CalendarQuota> calendar;
};

/// Appends the low `bytes` bytes of `v` to `out`, little-endian: struct.pack's I4 for 4 (`v`
/// checked: 0..2^32-1), its i8 for 8.
inline void packLe(std::string& out, std::int64_t v, int bytes) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int shift = 0; shift < 8 * bytes; shift += 8) out.push_back(static_cast<char>((u >> shift) & 0xffU));
}

/// ceil(permits x intervalMs / rate) ms in 1..10^12: the Local policy's interval for `permits` at
/// `rate` per `intervalMs`, as the scripts compute it (an estimate for an emergency).
inline std::int64_t localIntervalMs(std::int64_t permits, std::int64_t intervalMs, std::int64_t rate) {
  const double ms =
      std::ceil(static_cast<double>(permits) * static_cast<double>(intervalMs) / static_cast<double>(rate));
  return ms < 1 ? 1 : ms > 1e12 ? 1000000000000 : static_cast<std::int64_t>(ms);
}

/// A policy of `packed` and `fields` (see KeyedPolicy) that reports `limit`, takes up to `limit` a
/// call, and has `limit` per `localMs` as the Local bucket.
inline KeyedPolicy keyedPolicy(std::string packed, std::vector<std::int64_t> fields, std::int64_t limit,
                               std::int64_t localMs) {
  return KeyedPolicy{std::move(packed), limit, limit, limit, localMs, std::move(fields), std::nullopt};
}

/// keyedPolicy() with the key header `kind`, then each of `fields` as struct.pack's I4 (each
/// checked: 0..2^32-1).
inline KeyedPolicy headerPolicy(char kind, std::vector<std::int64_t> fields, std::int64_t limit, std::int64_t localMs) {
  std::string header(1, kind);
  for (const std::int64_t v : fields) packLe(header, v, 4);
  return keyedPolicy(std::move(header), std::move(fields), limit, localMs);
}

/// The policy of a checked GCRA configuration (kind 'G' or 'T'): the key's header as
/// lua/lib/gcra_core.lua packs it ('<c1I4I4I4I4', little-endian), and the Local bucket as the
/// script's gcraLocalRate computes it.
inline KeyedPolicy gcraPolicy(char kind, std::int64_t burst, std::int64_t rate, std::chrono::milliseconds period,
                              std::chrono::milliseconds keepAlive) {
  return headerPolicy(kind, {burst, rate, period.count(), keepAlive.count()}, burst,
                      localIntervalMs(burst, period.count(), rate));
}

/// The policy of a checked fixed window configuration: the key's header as
/// lua/lib/fixed_window_core.lua packs it ('<c1I4I4I4'); the Local bucket is the window.
inline KeyedPolicy windowPolicy(std::int64_t limit, std::chrono::milliseconds window,
                                std::chrono::milliseconds keepAlive) {
  return headerPolicy('W', {limit, window.count(), keepAlive.count()}, limit, window.count());
}

/// The policy of a checked smooth configuration: `permits` per `interval`, `span` the maxBurst
/// (cold = 0, bursty) or the warm-up period, `cold` the cold factor. The key's header as
/// lua/smooth.lua packs it ('<c1I4I4I4BI4'); limit, the most permits per call (n x K < 2^53) and
/// the Local bucket as the script's derive() computes them.
inline KeyedPolicy smoothPolicy(std::int64_t permits, std::chrono::milliseconds interval,
                                std::chrono::milliseconds span, std::int64_t cold,
                                std::chrono::milliseconds keepAlive) {
  KeyedPolicy p;
  p.packed.push_back('S');
  for (const std::int64_t v : {permits, interval.count(), span.count()}) packLe(p.packed, v, 4);
  packLe(p.packed, cold, 1);  // 0..127
  packLe(p.packed, keepAlive.count(), 4);
  const auto [pp, t] = rateUnits(permits, interval);  // P' and I'
  // K units per permit and the most units stored (checked by validateConfig: below 2^53).
  const std::int64_t k = cold == 0 ? t : t * 2 * (1 + cold);
  const std::int64_t maxK = cold == 0 ? span.count() * 1000 * pp : span.count() * 1000 * pp * (5 + cold);
  p.limit = maxK / k;
  p.maxPermits = std::min<std::int64_t>(kMaxPermits, ((std::int64_t{1} << 53) - 1) / k);
  p.localRate = cold == 0 ? p.limit + 1 : 1;
  p.localIntervalMs = localIntervalMs(p.localRate, interval.count(), permits);
  p.fields = {permits, interval.count(), span.count(), cold, keepAlive.count()};
  return p;
}

}  // namespace redlimit::detail
