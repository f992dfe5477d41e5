// redlimit — a Policy as its script takes it in every call (policy.cpp builds it, ScriptCore and
// MultiLimit send it).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "limiters/calendar_tables.hpp"
#include "redlimit/policy.hpp"

namespace redlimit::detail {

/// A configuration sent in every call (a Limiter's policy): `packed` is the configuration as the
/// script stores it (the key's header: 17 bytes for the token bucket and GCRA, 13 for the fixed
/// window; 18 for the smooth limiter: its key's 14 and the keepAlive, which its key has no room
/// for), `limit` what a decision reports as its limit, `maxPermits` the most one call may ask for,
/// `localRate` per `localIntervalMs` the Local failure policy's bucket, and `fields` the
/// configuration as given, keepAlive last (the script's `set` arguments for a kind that can be
/// stored). A calendar quota (kind 'Q') is sent otherwise: `calendar` holds it, its script takes
/// it as arguments of their own (calendarArgs) with a table of its windows, and `packed` only tells
/// policies apart.
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

/// A policy whose packed form is the key header `kind`, then each of `fields` (see KeyedPolicy) as
/// struct.pack's I4 (each checked: 0..2^32-1); it reports `limit`, takes up to `limit` a call, and
/// has `limit` per `localMs` as the Local bucket.
inline KeyedPolicy headerPolicy(char kind, std::vector<std::int64_t> fields, std::int64_t limit, std::int64_t localMs) {
  std::string header(1, kind);
  for (const std::int64_t v : fields) packLe(header, v, 4);
  return KeyedPolicy{std::move(header), limit, limit, limit, localMs, std::move(fields), std::nullopt};
}

/// The policy of a checked GCRA configuration (kind 'G' or 'T'): the key's header as
/// lua/lib/gcra_core.lua packs it ('<c1I4I4I4I4', little-endian), and the Local bucket as the
/// script's gcraLocalRate computes it.
inline KeyedPolicy gcraPolicy(char kind, std::int64_t burst, std::int64_t rate, std::chrono::milliseconds period,
                              std::chrono::milliseconds keepAlive) {
  return headerPolicy(kind, {burst, rate, period.count(), keepAlive.count()}, burst,
                      localIntervalMs(burst, period.count(), rate));
}

/// Why a policy of `kind` takes no permits ahead of time (Policy::canWait is false), as refusals
/// say it: "a calendar quota takes no permits ahead of time (...)".
inline const char* whyNoWait(Policy::Kind kind) noexcept {
  return kind == Policy::Kind::SlidingWindow
             ? "a sliding window counter takes permits now or not at all (a permit booked ahead would count in "
               "every estimate until it is used)"
             : "a calendar quota takes no permits ahead of time (its next window opens at the zone's next midnight)";
}

}  // namespace redlimit::detail
