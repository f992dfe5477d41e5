#include "limiters/decision_reply.hpp"

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "limiters/script_helpers.hpp"

namespace redlimit::detail {

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
  // the little-endian int64 at byte 1 + 8 (i - 1), two's complement: what struct.pack's i8 wrote.
  const auto at = [&](std::size_t i) { return packed ? packedInt64(r.str, 8 * i - 7) : r.elements[i].asInteger(); };
  const bool allowed = packed ? static_cast<unsigned char>(r.str[0]) == kPackedDecisionMarker + 1 : at(0) == 1;
  return DecisionReply{allowed, at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8)};
}

Decision parseHeld(const Reply& r, const std::string& limiter, std::int64_t permits, DecisionReply& values) {
  const bool repeated = parseReserveRepeated(limiter, r);
  values = parseDecisionReply(r, DecisionForm::Array, limiter, kReserveReplySize);
  Decision out = decisionOf(values, permits);
  out.repeated = repeated;
  return out;
}

Settlement::Status settleStatusOf(std::int64_t code, std::string_view who) {
  using Status = Settlement::Status;
  constexpr Status kOfCode[] = {Status::Unknown, Status::Settled, Status::AlreadySettled};
  if (code < 0 || code > 2) {
    throw ReplyError(ErrorKind::UnexpectedReply, "", fmt::format("redlimit: {}: settle answered status {}", who, code));
  }
  return kOfCode[code];
}

}  // namespace redlimit::detail
