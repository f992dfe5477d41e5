// redlimit — Decision: the one result every limiter gives for a decision (go-redis/redis_rate's
// Result plays the same role): enough for a caller to act on, a web handler to answer 429 with
// Retry-After and RateLimit headers, and a scheduler to come back at the right time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace redlimit {

/// The outcome of one decision. All durations are exact integer microseconds, computed by the
/// script on the server's clock (or, for local limiters, on the limiter's clock).
struct Decision {
  /// No limit denied (Decision::deniedBy when allowed, and for a single limiter's decision).
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

  bool allowed = false;                        // the permits were taken
  std::int64_t permits = 0;                    // permits asked for (and taken when allowed)
  std::int64_t remaining = 0;                  // permits that could be taken at once after this decision
  std::chrono::microseconds retryAfter{0};     // denied: the earliest time from now at which the same
                                               // request can succeed (if nobody else takes permits);
                                               // allowed: 0
  std::chrono::microseconds resetAfter{0};     // until the limiter is full again (back to `limit`)
  std::int64_t limit = 0;                      // the most permits one decision can ever get (capacity,
                                               // burst, window limit)
  std::size_t deniedBy = kNone;                // multi-limit: index of the limit that denied; else kNone
  bool byPolicy = false;                       // decided by the failure policy: Redis was not asked, and
                                               // remaining/retryAfter/resetAfter are estimates (0 if unknown)
  std::chrono::microseconds time{0};           // the server time of the decision, epoch µs (0 by policy)

  explicit operator bool() const noexcept { return allowed; }
};

}  // namespace redlimit
