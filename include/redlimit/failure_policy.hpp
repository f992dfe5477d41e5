// redlimit — what a distributed limiter decides when Redis cannot be asked.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "redlimit/errors.hpp"

namespace redlimit {

/// The decision a limiter makes when Redis is unreachable, times out, or the pool is exhausted
/// (an IoError). Other errors are always thrown: bad input, script and reply errors, and the
/// configuration errors (ConfigurationError, AuthError) that no retry or policy can fix.
enum class FailurePolicy {
  Throw,  // the IoError reaches the caller (default): you decide, at the call site
  Allow,  // fail open: grant
  Deny,   // fail closed: refuse
  Local,  // decide with an in-process limiter at rate x FailureOptions::localShare
};

/// A change of a limiter's health, reported once per transition.
struct HealthEvent {
  enum class Kind {
    Degraded,   // the first call that failed (or the first whose failure has another cause)
    Recovered,  // the first call that reached Redis and ran again
  };
  enum class Cause {
    Outage,         // an IoError: Redis unreachable, slow or not serving yet; the policy decides
                    // and only one call per probe interval tries Redis
    Configuration,  // a ConfigurationError or AuthError: the set-up is wrong; every call still
                    // goes to Redis and throws, under every policy, until it works again
  };
  Kind kind = Kind::Degraded;
  Cause cause = Cause::Outage;             // Degraded: why; Recovered: the cause that ended
  std::string limiter;                     // the limiter's name
  std::string error;                       // Degraded: the text of the error that started it
  std::string errorType;                   // Degraded: its type, e.g. "redlimit::ConfigurationError"
  ErrorKind errorKind = ErrorKind::Other;  // Degraded: its kind, e.g. ErrorKind::Replica
  std::exception_ptr exception;            // Degraded: the error itself (rethrow to catch by type)
  std::chrono::milliseconds outage{0};     // Recovered: how long it was degraded
};

/// Failure handling of one limiter.
struct FailureOptions {
  FailurePolicy policy = FailurePolicy::Throw;             // decision when Redis cannot be asked
  double localShare = 1.0;                                 // Local: this instance's share of the rate, in (0, 1],
                                                           // e.g. 1.0 / number of instances
  std::chrono::milliseconds probeInterval{250};            // during an outage, one call per interval goes to
                                                           // Redis; the others are decided at once; > 0
                                                           // (huge values saturate: probe "never")
  std::int64_t localSeedRate = 0;                          // Local: permits per localSeedInterval its bucket
                                                           // uses until the limiter has seen a configuration
                                                           // (from Redis, or its own); 0 (default) = no seed:
                                                           // refuse until then; 0..4294967295, set together
                                                           // with localSeedInterval (both > 0, or both 0)
  std::chrono::milliseconds localSeedInterval{0};          // Local: the interval of localSeedRate, ms; 0 = no seed
  std::function<void(const HealthEvent&)> onHealthChange;  // called once per Degraded (and again
                                                           // if the cause changes), once on Recovered, on the
                                                           // calling thread; must not throw
};

/// Counters of decisions made under the failure policy (since the limiter handle was made).
struct FailureStats {
  std::uint64_t allowed = 0;            // Allow, and Local grants
  std::uint64_t denied = 0;             // Deny, and Local refusals
  std::uint64_t thrown = 0;             // Throw: IoErrors passed to the caller
  std::uint64_t outages = 0;            // Degraded events with cause Outage
  std::uint64_t misconfigurations = 0;  // Degraded events with cause Configuration
  bool degraded = false;                // in an outage now: calls are decided by the policy between probes
  bool misconfigured = false;           // the last call failed with a configuration error
};

}  // namespace redlimit
