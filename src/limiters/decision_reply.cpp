#include "limiters/decision_reply.hpp"

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "limiters/script_helpers.hpp"

namespace redlimit::detail {

namespace {

// The little-endian signed 64-bit integer at `at`.
std::int64_t int64At(const std::string& s, std::size_t at) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 8; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return static_cast<std::int64_t>(v);  // two's complement: what struct.pack's i8 wrote
}

}  // namespace

DecisionReply parseDecisionReply(const Reply& r, DecisionForm form, std::string_view limiter, std::size_t arraySize) {
  const bool packed = form == DecisionForm::Packed;
  if (packed && !isPackedDecision(r)) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: limiter {}: expected a packed decision of {} bytes from the script, got {}",
                                 limiter, kPackedDecisionSize, r.describe()));
  }
  if (!packed && (r.type != Reply::Type::Array || arraySize < 9 || r.elements.size() != arraySize)) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: limiter {}: expected an array of {} from the script, got {}", limiter,
                                 arraySize, r.describe()));
  }
  // Value i of the nine in DecisionReply's order; packed, value 0 is the marker byte and value i
  // the int64 at byte 1 + 8 (i - 1).
  const auto at = [&](std::size_t i) { return packed ? int64At(r.str, 8 * i - 7) : r.elements[i].asInteger(); };
  DecisionReply d;
  d.allowed = packed ? static_cast<unsigned char>(r.str[0]) == kPackedDecisionMarker + 1 : at(0) == 1;
  d.remaining = at(1);
  d.retryAfterUs = at(2);
  d.resetAfterUs = at(3);
  d.limit = at(4);
  d.nowUs = at(5);
  d.delayUs = at(6);
  d.localRate = at(7);
  d.localIntervalMs = at(8);
  return d;
}

Decision parseHeld(const Reply& r, const std::string& limiter, std::int64_t permits, DecisionReply& values) {
  const bool repeated = parseReserveRepeated(limiter, r);
  values = parseDecisionReply(r, DecisionForm::Array, limiter, kReserveReplySize);
  Decision out = decisionOf(values, permits);
  out.repeated = repeated;
  return out;
}

Settlement::Status settleStatusOf(std::int64_t code, std::string_view who) {
  switch (code) {
    case 0:
      return Settlement::Status::Unknown;
    case 1:
      return Settlement::Status::Settled;
    case 2:
      return Settlement::Status::AlreadySettled;
    default:
      throw ReplyError(ErrorKind::UnexpectedReply, "",
                       fmt::format("redlimit: {}: settle answered status {}", who, code));
  }
}

}  // namespace redlimit::detail
