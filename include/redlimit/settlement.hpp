// redlimit — reserve, then settle: a cost known only afterwards (tokens of an LLM answer, bytes of
// a response). reserveFor(estimate, id) takes the estimate and records it under a reservation id;
// settle(id, actual) gives back what was not used (or takes what was used beyond it) exactly once,
// however often it is retried. reserveFor answers a Decision (Decision::repeated: the id was
// reserved already; a MultiLimit's a MultiDecision), settle a Settlement.
#pragma once

#include <cstdint>
#include <vector>

#include "redlimit/decision.hpp"

namespace redlimit {

/// The outcome of settle(id, actual) and cancel(id). A value type. For AlreadySettled every field
/// is the first settle's answer (its `actual` included, whatever this call asked); for Unknown they
/// are all 0. Invariant: actual == reserved - returned - forgiven + charged + unpaid, where
/// forgiven (not a field) is what the limiter could not take back because it was full already.
struct Settlement {
  /// What a settle found under the reservation id.
  enum class Status : std::uint8_t {
    Settled,         // this call settled the reservation
    AlreadySettled,  // an earlier call did: nothing changed, the fields are that call's answer
    Unknown,         // no record: never reserved, reserved by the failure policy, or its record expired
                     // (an expired reservation stays counted as fully used: nothing is given back)
  };

  Status status = Status::Unknown;
  std::int64_t reserved = 0;   // permits the reservation took
  std::int64_t actual = 0;     // permits used, as the settling call said
  std::int64_t returned = 0;   // permits given back: reserved - actual, less when the limiter was full
                               // again sooner (it never holds more than full), 0 when a fixed window's or
                               // calendar quota's reservation was made in a window that has ended
                               // (its count is gone)
  std::int64_t charged = 0;    // permits taken beyond the reservation (actual > reserved): the debt
                               // rule, see docs/algorithms.md "Reserve, then settle"
  std::int64_t unpaid = 0;     // actual - reserved - charged: beyond the furthest the limiter may owe,
                               // not taken
  std::int64_t remaining = 0;  // permits that could be taken at once right after the settling call
};

/// The outcome of MultiLimit::settle and cancel: one settle settles every limit of the
/// reservation. `limits` holds each limit's own Settlement, in construction order (status,
/// reserved and actual are the combined ones; returned, charged, unpaid and remaining that
/// limit's, as its own settle would answer: a bucket that refilled meanwhile gives back less, a
/// fixed window whose window ended gives back 0). The combined fields: status, reserved, actual;
/// returned and charged the least of the limits' (what every limit got back, or was charged),
/// unpaid the most, remaining the least (what one call could take at once from all). The
/// Settlement invariant holds for the combined fields too. Unknown: every field 0, `limits` one
/// zero Settlement per limit.
struct MultiSettlement : Settlement {
  std::vector<Settlement> limits;
};

}  // namespace redlimit
