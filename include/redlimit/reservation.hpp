// redlimit — Reservation: the outcome of reserve(), the leaky bucket as a queue. Permits that are
// not there yet are taken ahead of time, and the caller is told when it may use them, so a
// producer is shaped to the rate with one round trip per request and no polling.
#pragma once

#include <chrono>

#include "redlimit/decision.hpp"

namespace redlimit {

/// The outcome of one reservation (Limiter::reserve). A value type.
struct Reservation {
  Decision decision;                   // allowed = reserved: the permits are taken (possibly ahead of
                                       // time). Refused: retryAfter is the earliest time from now at which
                                       // the same reservation (same permits, same maxWait) would succeed
  std::chrono::microseconds delay{0};  // reserved: wait this long after the decision (decision.time)
                                       // before using the permits; 0 = at once. Refused: 0

  explicit operator bool() const noexcept { return decision.allowed; }
};

}  // namespace redlimit
