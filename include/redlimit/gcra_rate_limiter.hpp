// redlimit — GcraRateLimiter: the generic cell rate algorithm (leaky bucket) in one Redis key.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/detail/script_limiter.hpp"

namespace redlimit {

/// A GCRA limiter's configuration, as stored in its key.
struct GcraConfig {
  std::int64_t rate = 0;                   // permits per period (the sustained rate), 1..kMaxPermits
  std::chrono::milliseconds period{0};     // 1 ms..kMaxInterval (49.7 days)
  std::int64_t burst = 0;                  // most permits granted at once after an idle time, and the
                                           // most one call may ask for, 1..kMaxPermits
  std::chrono::milliseconds keepAlive{0};  // 0 (default): kept until deleteLimiter(); > 0: the key expires
                                           // once the limiter has been idle (full) this long

  friend bool operator==(const GcraConfig& a, const GcraConfig& b) {
    return a.rate == b.rate && a.period == b.period && a.burst == b.burst && a.keepAlive == b.keepAlive;
  }
  friend bool operator!=(const GcraConfig& a, const GcraConfig& b) { return !(a == b); }
};

/// Options of one GcraRateLimiter handle.
struct GcraRateLimiterOptions {
  FailureOptions failure;      // decisions when Redis cannot be asked (default: throw the IoError)
  MonitorOptions monitor;      // metrics (on, into MetricsRegistry::global()), shadow mode (off), events
  bool permanentKeys = false;  // a handle made with a configuration: false (default): its keepAlive of 0
                               // becomes kDefaultIdleMargin, so the key expires once full again; true:
                               // kept until deleteLimiter(). Unused by a handle made without one
};

/// The generic cell rate algorithm shared by every process that uses its name: one stored
/// "theoretical arrival time" (TAT); a request for n permits conforms when
/// max(TAT, now) + n x T <= now + burst x T, with T = period / rate exactly. In any window of
/// length T' at most burst + rate x T' / period permits are granted.
///
/// The same algorithm meters (decide, tryAcquire: policing, a denial says exactly when to retry)
/// and queues (reserve: the leaky bucket as a queue, shaping — every reservation that fits in
/// maxWait is granted, and told when it may proceed, so callers leave at the rate, one call each).
///
/// Storage, keys, bounds (burst x I' <= 2^50 with I' = period in µs / gcd(rate, period in µs)) and
/// TTL as for TokenBucketRateLimiter, which runs the same script: a GCRA with burst B and rate P
/// per period is a token bucket of capacity B refilled P per period. Made with a configuration, the
/// handle sends it in every call and its key expires when idle (see detail::ScriptLimiter). A
/// reservation waits at most max(burst x T, period). Thread-safe; see detail::ScriptLimiter for
/// the operations and errors.
class GcraRateLimiter : public detail::ScriptLimiter {
 public:
  /// A handle on the limiter whose key is `name`. Sends nothing. Throws InvalidArgument for a null
  /// client, an empty name or one longer than kMaxNameLength, bad failure options.
  GcraRateLimiter(std::shared_ptr<Client> client, std::string name, GcraRateLimiterOptions options = {});
  /// A handle on the limiter whose key is `name` that decides with `config`, sent in every call:
  /// no trySetConfig needed, no NotInitializedError, and the key expires once the limiter is full
  /// again plus keepAlive (kDefaultIdleMargin for 0 unless options.permanentKeys). Sends nothing.
  /// Throws InvalidArgument as the other constructor does, and for a bad configuration.
  GcraRateLimiter(std::shared_ptr<Client> client, std::string name, const GcraConfig& config,
                  GcraRateLimiterOptions options = {});

  /// The checks every configuration write makes before it sends anything. Throws InvalidArgument.
  static void validateConfig(const GcraConfig& config);
  /// Writes the configuration (the limiter starts idle: burst available) if the key does not
  /// exist. True if this call wrote it. A key of another kind: InvalidConfigError.
  [[nodiscard]] bool trySetConfig(const GcraConfig& config);
  /// Writes the configuration keeping the permits in use (the TAT's distance from now, scaled
  /// to the new time per permit, see docs/algorithms.md); the same configuration again changes
  /// nothing. A key without one starts idle; one whose stored configuration or state is unusable
  /// is overwritten, idle. A handle made with a configuration decides with this one from now on.
  void setConfig(const GcraConfig& config);
  /// The stored configuration. Throws NotInitializedError if there is none (a handle made with a
  /// configuration answers its own then).
  [[nodiscard]] GcraConfig getConfig();

 private:
  bool permanentKeys_ = false;
};

}  // namespace redlimit
