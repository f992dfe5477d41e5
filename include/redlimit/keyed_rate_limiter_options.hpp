// redlimit — what the keyed families (KeyedGcraRateLimiter, KeyedTokenBucketRateLimiter,
// KeyedFixedWindowRateLimiter, KeyedDistributedSmoothRateLimiter) take besides their
// configuration, and the idle margin of keys that carry their configuration in the call.
#pragma once

#include <chrono>

#include "redlimit/failure_policy.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit {

/// The idle margin of keys whose configuration travels in the call (the keyed families, and the
/// one-key handles made with a configuration) by default: a key expires this long after its
/// limiter is full (the fixed window: empty) again, and an expired key decides exactly as a full
/// one, so nothing is lost.
inline constexpr std::chrono::milliseconds kDefaultIdleMargin{1000};

/// Options of a keyed family.
struct KeyedRateLimiterOptions {
  FailureOptions failure;      // decisions when Redis cannot be asked, for every key (default: throw)
  MonitorOptions monitor;      // metrics under the policy's name (one series, not one per key), shadow, events
  bool permanentKeys = false;  // false (default): a configuration's keepAlive of 0 becomes
                               // kDefaultIdleMargin, so every key expires once it is full again;
                               // true: keys without keepAlive are kept until deleted
};

}  // namespace redlimit
