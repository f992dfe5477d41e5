// redlimit — Decision: the one result every limiter gives for a decision (go-redis/redis_rate's
// Result plays the same role): enough for a caller to act on, a web handler to answer 429 with
// Retry-After and RateLimit headers, and a scheduler to come back at the right time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "redlimit/lease.hpp"

namespace redlimit {

/// The outcome of one decision, and of a reservation: reserve() (the leaky bucket as a queue:
/// permits not there yet are taken ahead of time, `delay` says when to use them) and reserveFor()
/// (reserve, then settle: `repeated` says the id was reserved already). All durations are exact
/// integer microseconds, computed by the script on the server's clock (or, for local limiters, on
/// the limiter's clock). A trivially copyable value type.
struct Decision {
  /// No limit denied (Decision::deniedBy when allowed, and for a single limiter's decision).
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

  bool allowed = false;                     // the permits were taken
  std::int64_t permits = 0;                 // permits asked for (and taken when allowed)
  std::int64_t remaining = 0;               // permits that could be taken at once after this decision
  std::chrono::microseconds retryAfter{0};  // denied: the earliest time from now at which the same
                                            // request can succeed (if nobody else takes permits);
                                            // allowed: 0
  std::chrono::microseconds resetAfter{0};  // until the limiter is full again (back to `limit`)
  std::int64_t limit = 0;                   // the most permits one decision can ever get (capacity,
                                            // burst, window limit)
  std::size_t deniedBy = kNone;             // multi-limit: index of the limit that denied; else kNone
  bool byPolicy = false;                    // decided by the failure policy: Redis was not asked, and
                                            // remaining/retryAfter/resetAfter are estimates (0 if unknown)
  std::chrono::microseconds time{0};        // the server time of the decision, epoch µs (0 by policy)
  bool shadowDenied = false;                // shadow mode (LimiterMonitor::Options::shadow): the limiter denied and
                                            // the caller is let through: allowed is true, nothing was
                                            // taken, retryAfter says when it would have been allowed
  std::chrono::microseconds delay{0};       // reserve: the permits are taken ahead of time; wait this long
                                            // after the decision (time) before using them; 0 = at once.
                                            // Refused, and every other call: 0
  bool repeated = false;                    // reserveFor: the id was reserved already (a retried call, or a
                                            // resend after a closed connection): nothing more was taken;
                                            // allowed for the same permits, with remaining, resetAfter and
                                            // time as the limiter is now; the metrics count nothing (the
                                            // first grant was counted, unless its reply was lost and this
                                            // is the resend). Every other call: false

  explicit operator bool() const noexcept { return allowed; }
};

/// What a lease acquisition (Limiter::acquireLease under a concurrency policy) answers: the
/// Decision (permits 1, limit, remaining = places free after it, retryAfter when denied = until the
/// soonest live lease expires, though a release may free one sooner; resetAfter = until the last
/// live lease expires) and the lease when allowed.
struct LeaseDecision {
  Decision decision;
  std::optional<Lease> lease;  // set exactly when decision.allowed
};

/// A MultiLimit's decision: the combined Decision (the base), and each limit's own view in
/// `limits`. The combined fields apply Decision's definitions to "every limit at once":
///  * allowed     every limit took the permits (if any denied, none took any);
///  * remaining   the least of the limits' remaining: what one call could take at once from all;
///  * retryAfter  denied: the earliest time from now at which the same call succeeds, if nobody
///                else takes permits (exact, computed by the script). With token buckets and GCRA
///                only, that is the largest retryAfter of the limits that deny; a fixed window
///                whose next window is full too can push it to the window after;
///  * resetAfter  the longest of the limits' resetAfter: until every limit is full again;
///  * limit       the least of the limits' limits: the most permits one call can ever get;
///  * deniedBy    denied: the index (construction order) of the limit that needs the longest
///                wait on its own (the first of equals), the one that Retry-After is about;
///                kNone when allowed and for decisions of the failure policy;
///  * time        the server time of the decision, the same instant for every limit.
/// A concurrency limit (a Limiter under Policy::concurrency in the MultiLimit) takes one place per call, whatever
/// the permits; its remaining and limit count places, so a combined remaining of r says r more
/// calls of one permit could be granted now.
struct MultiDecision : Decision {
  /// One per limit, in construction order (empty only for a default-constructed value): allowed
  /// and retryAfter are what that limiter alone would have answered to the same call (so several
  /// may deny); remaining and resetAfter are its state after this call (permits taken only if
  /// the combined decision allowed); limit is that limiter's own; permits, byPolicy and time are
  /// the combined decision's; delay and repeated are the combined decision's only (0 and false
  /// here).
  std::vector<Decision> limits;
  /// Set exactly when allowed and the MultiLimit has a concurrency limit: the place taken in each
  /// of them, under one id; give it back with MultiLimit::release (renew it with MultiLimit::renew).
  std::optional<Lease> lease;
};

}  // namespace redlimit
