// redlimit — the reply of a one-key limiter's take/peek (lua/gcra.lua, lua/fixed_window.lua, each
// decision of lua/batch.lua) and of lua/smooth.lua's, turned into numbers in one place.
#pragma once

#include <cstddef>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "redlimit/decision.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/reply.hpp"

namespace redlimit::detail {

/// The nine values of a take/peek reply.
struct DecisionReply {
  bool allowed = false;
  std::int64_t remaining = 0;     // may be below 0 (a window counted past a lowered limit)
  std::int64_t retryAfterUs = 0;  // denied: when the same call succeeds
  std::int64_t resetAfterUs = 0;  // until no permit is counted any more
  std::int64_t limit = 0;
  std::int64_t nowUs = 0;      // the time decided at, epoch µs
  std::int64_t delayUs = 0;    // a reservation: how long the caller waits
  std::int64_t localRate = 0;  // the Local failure policy's bucket: permits per localIntervalMs
  std::int64_t localIntervalMs = 0;
};

/// The packed form (lib/onekey.lua's packDecision), 65 bytes, little-endian: byte 0 is
/// kPackedDecisionMarker + allowed (0xA0 denied, 0xA1 granted), then remaining, retryAfterUs,
/// resetAfterUs, limit, nowUs, delayUs, localRate, localIntervalMs as signed 64-bit integers.
/// The script's values are integers below 2^53 in magnitude (limit and localRate 1..2^32-1,
/// localIntervalMs up to 1e12, nowUs up to 9e15, remaining above -2^32), all exact in int64.
/// Byte 0 is not ASCII: batch.lua's error elements ("CODE message") never start with it.
inline constexpr std::size_t kPackedDecisionSize = 1 + 8 * 8;
inline constexpr unsigned char kPackedDecisionMarker = 0xA0;

/// The little-endian signed 64-bit integer at bytes [at, at + 8) of `packed` (struct.pack's i8,
/// two's complement). The caller checked the size.
[[nodiscard]] inline std::int64_t packedInt64(const std::string& packed, std::size_t at) noexcept {
  std::uint64_t v = 0;
  for (std::size_t b = 8; b-- > 0;) v = (v << 8) | static_cast<unsigned char>(packed[at + b]);
  return static_cast<std::int64_t>(v);
}

/// Whether `r` is a packed decision: a string of exactly kPackedDecisionSize bytes whose first
/// byte is 0xA0 or 0xA1. Anything else in a batch.lua reply is an error text.
[[nodiscard]] inline bool isPackedDecision(const Reply& r) noexcept {
  return r.type == Reply::Type::String && r.str.size() == kPackedDecisionSize &&
         (static_cast<unsigned char>(r.str[0]) & 0xFEu) == kPackedDecisionMarker;
}

/// A reserve reply (gcra.lua, fixed_window.lua): an array of the nine values in DecisionReply's
/// order (not packed: reserve is rare), then repeated (0 or 1).
inline constexpr std::size_t kReserveReplySize = 10;

/// Which form a limiter's script answers in.
enum class DecisionForm {
  Packed,  // gcra.lua, fixed_window.lua, calendar_quota.lua, batch.lua's elements (kinds T, G, W, Q)
  Array,   // smooth.lua (kind S): an array of 9 integers in DecisionReply's order
};

/// The reply of `limiter`'s take or peek in `form`. Throws ReplyError (UnexpectedReply) naming `limiter`
/// for anything else (another type, size or marker). An Array reply must have `arraySize`
/// elements, the nine values first (a reserve reply has one more: repeated).
[[nodiscard]] DecisionReply parseDecisionReply(const Reply& r, DecisionForm form, std::string_view limiter,
                                               std::size_t arraySize = 9);

/// The Decision of a decoded reply for `permits` (remaining floored at 0; delay as the script said:
/// 0 unless a reservation was made ahead of time).
[[nodiscard]] inline Decision decisionOf(const DecisionReply& v, std::int64_t permits) {
  Decision d;
  d.allowed = v.allowed;
  d.permits = permits;
  d.remaining = std::max<std::int64_t>(0, v.remaining);
  d.retryAfter = std::chrono::microseconds{v.retryAfterUs};
  d.resetAfter = std::chrono::microseconds{v.resetAfterUs};
  d.limit = v.limit;
  d.time = std::chrono::microseconds{v.nowUs};
  d.delay = std::chrono::microseconds{v.delayUs};
  return d;
}

/// A reserve reply of `limiter` for `permits` (kReserveReplySize values: take's nine, then
/// repeated, in Decision::repeated); `values` gets the nine. Throws ReplyError (UnexpectedReply)
/// for another shape.
[[nodiscard]] Decision parseHeld(const Reply& r, const std::string& limiter, std::int64_t permits,
                                 DecisionReply& values);

/// A reserve's answer (a Limiter's Decision, a MultiLimit's MultiDecision) counted in `monitor`: a
/// decision (shadow mode applied) and, when Redis recorded it, an opened reservation; a repeat
/// counts nothing (counted when granted).
inline void admitHeld(const LimiterMonitor& monitor, Decision& held) {
  if (held.repeated) return;  // counted when it was granted
  monitor.admit(held);
  if (held.allowed && !held.byPolicy && !held.shadowDenied) monitor.reservationOpened();
}

/// The status code of a settle reply (every settling script: 0 no record, 1 settled by this call,
/// 2 settled before). Another code is ReplyError (UnexpectedReply) naming `who` ("limiter x", a MultiLimit's
/// label).
[[nodiscard]] Settlement::Status settleStatusOf(std::int64_t code, std::string_view who);

/// The form kind `kind`'s script answers in.
[[nodiscard]] constexpr DecisionForm decisionFormOf(char kind) noexcept {
  return kind == 'S' ? DecisionForm::Array : DecisionForm::Packed;
}

}  // namespace redlimit::detail
