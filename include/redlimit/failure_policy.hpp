// redlimit — what a distributed limiter decides when Redis cannot be asked.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace redlimit {

/// The decision a limiter makes when Redis is unreachable, times out, or the pool is exhausted
/// (an IoError). Other errors (bad input, auth, script, out of memory) are always thrown.
enum class FailurePolicy {
  Throw,  // the IoError reaches the caller (default): you decide, at the call site
  Allow,  // fail open: grant
  Deny,   // fail closed: refuse
  Local,  // decide with an in-process limiter at rate x FailureOptions::localShare
};

/// A change of a limiter's health, reported once per transition.
struct HealthEvent {
  enum class Kind {
    Degraded,   // the first call that could not reach Redis
    Recovered,  // the first call that reached Redis again
  };
  Kind kind = Kind::Degraded;
  std::string limiter;                       // the limiter's name
  std::string error;                         // Degraded: the error that started it
  std::chrono::milliseconds outage{0};       // Recovered: how long it was degraded
};

/// Failure handling of one limiter.
struct FailureOptions {
  FailurePolicy policy = FailurePolicy::Throw;       // decision when Redis cannot be asked
  double localShare = 1.0;                           // Local: this instance's share of the rate, in (0, 1],
                                                     // e.g. 1.0 / number of instances
  std::chrono::milliseconds probeInterval{250};      // while degraded, one call per interval goes to Redis;
                                                     // the others are decided at once; > 0
                                                     // (huge values saturate: probe "never")
  std::function<void(const HealthEvent&)> onHealthChange;  // called once on Degraded, once on
                                                     // Recovered, on the calling thread; must not throw
};

/// Counters of decisions made under the failure policy (since the limiter handle was made).
struct FailureStats {
  std::uint64_t allowed = 0;       // Allow, and Local grants
  std::uint64_t denied = 0;        // Deny, and Local refusals
  std::uint64_t thrown = 0;        // Throw: IoErrors passed to the caller
  std::uint64_t outages = 0;       // Degraded events
  bool degraded = false;           // degraded now
};

}  // namespace redlimit
