// redlimit — RateType, TimeSource and RateLimiterConfig: RateLimiter's configuration as plain
// values, apart from the limiter (SegmentedRateLimiter's reconfigure() uses them without
// depending on RateLimiter, the Client or the transport).
#pragma once

#include <chrono>
#include <cstdint>

namespace redlimit {

/// Whom a limit applies to (Redisson's RateType; the numbers are the hash's `type` field).
enum class RateType {
  Overall = 0,    // one limit shared by every client
  PerClient = 1,  // each client (ClientOptions::clientId) gets the whole rate for itself
};

/// Which clock stamps permits.
enum class TimeSource {
  Server,  // redis.call('TIME') inside the script: immune to client clock skew (default)
  Client,  // this host's wall clock (epoch µs), sent with each call: what Redisson does (in ms)
};

/// A limiter's configuration as stored in its hash.
struct RateLimiterConfig {
  RateType rateType = RateType::Overall;       // field `type`
  std::int64_t rate = 0;                       // field `rate`: permits per interval
  std::chrono::milliseconds rateInterval{0};   // field `interval`, ms
  std::chrono::milliseconds keepAliveTime{0};  // field `keepAliveTime`, ms; 0 = none

  friend bool operator==(const RateLimiterConfig& a, const RateLimiterConfig& b) {
    return a.rateType == b.rateType && a.rate == b.rate && a.rateInterval == b.rateInterval &&
           a.keepAliveTime == b.keepAliveTime;
  }
  friend bool operator!=(const RateLimiterConfig& a, const RateLimiterConfig& b) { return !(a == b); }
};

}  // namespace redlimit
