// redlimit — TokenBucketRateLimiter: a distributed token bucket in one Redis key.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/detail/script_limiter.hpp"

namespace redlimit {

/// A token bucket's configuration, as stored in its key.
struct TokenBucketConfig {
  std::int64_t capacity = 0;                    // most permits the bucket holds (the burst), 1..kMaxPermits
  std::int64_t refillPermits = 0;               // permits added every refillInterval, 1..kMaxPermits
  std::chrono::milliseconds refillInterval{0};  // 1 ms..kMaxInterval (49.7 days); the refill is continuous:
                                                // one permit every refillInterval / refillPermits, exactly
  std::chrono::milliseconds keepAlive{0};       // 0 (default): the key is kept until deleteLimiter(); > 0:
                                                // it expires once the bucket has been full this long
                                                // (configuration included), up to kMaxInterval
  std::optional<std::int64_t> initialTokens;    // permits in the bucket when trySetConfig writes it, or
                                                // setConfig restarts it, 0..capacity; empty (default):
                                                // full (setConfig: keep the permits in use). State, not
                                                // configuration: getConfig() leaves it empty, == ignores it

  friend bool operator==(const TokenBucketConfig& a, const TokenBucketConfig& b) {
    return a.capacity == b.capacity && a.refillPermits == b.refillPermits && a.refillInterval == b.refillInterval &&
           a.keepAlive == b.keepAlive;
  }
  friend bool operator!=(const TokenBucketConfig& a, const TokenBucketConfig& b) { return !(a == b); }
};

/// Options of one TokenBucketRateLimiter handle.
struct TokenBucketRateLimiterOptions {
  FailureOptions failure;      // decisions when Redis cannot be asked (default: throw the IoError)
  MonitorOptions monitor;      // metrics (on, into MetricsRegistry::global()), shadow mode (off), events
  bool permanentKeys = false;  // a handle made with a configuration: false (default): its keepAlive of 0
                               // becomes kDefaultIdleMargin, so the key expires once full again; true:
                               // kept until deleteLimiter(). Unused by a handle made without one
};

/// A token bucket shared by every process that uses its name: it holds up to `capacity` permits
/// and refills `refillPermits` per `refillInterval`, continuously and exactly (no whole-second
/// steps). In any window of length T at most capacity + refillPermits x T / refillInterval permits
/// are granted. Time is the Redis server's clock, so client clock skew does not matter.
///
/// Storage: one string key, the name, holding configuration and state in 28 bytes (88 bytes in
/// Redis for a name of up to 14 bytes, MEMORY USAGE): the bucket is computed as its equivalent
/// GCRA (lua/gcra.lua), storing the time at which it is full again instead of tokens and a
/// timestamp. A handle made without a configuration uses the stored one: no TTL unless keepAlive
/// is set, and a key without one answers NotInitializedError. A handle made with a configuration
/// sends it in every call, and its key expires once full (see detail::ScriptLimiter).
///
/// Keys: the name is the key. To keep several limiters in one Redis Cluster slot (a multi-limit
/// decides them in one script), give them one hash tag: "{user:42}:burst", "{user:42}:daily".
///
/// Bounds, checked before sending (InvalidArgument): capacity and refillPermits in 1..2^32-1,
/// refillInterval in 1 ms..2^32-1 ms, keepAlive in 0..2^32-1 ms, and capacity x I' <= 2^50 where
/// I' = refillInterval in µs / gcd(refillPermits, refillInterval in µs) (any capacity up to 2^32-1
/// fits for rates like 100 per second, where I' = 10^4; 1 permit per 49 days allows a capacity of
/// about 260). Then every value the script computes is an exact integer.
///
/// tryAcquire(permits, timeout), acquire() and reserve() take permits ahead of time (the bucket
/// goes into debt) when the wait fits, and at most max(capacity x T, refillInterval) ahead, so a
/// waiting caller is served in one call. Thread-safe; see
/// detail::ScriptLimiter for the operations and errors.
class TokenBucketRateLimiter : public detail::ScriptLimiter {
 public:
  /// A handle on the token bucket whose key is `name`. Sends nothing. Throws InvalidArgument for a
  /// null client, an empty name or one longer than kMaxNameLength, bad failure options.
  TokenBucketRateLimiter(std::shared_ptr<Client> client, std::string name, TokenBucketRateLimiterOptions options = {});
  /// A handle that decides with `config`, sent in every call (as GcraRateLimiter's). A key without
  /// state starts full: config.initialTokens must be empty. Sends nothing. Throws InvalidArgument.
  TokenBucketRateLimiter(std::shared_ptr<Client> client, std::string name, const TokenBucketConfig& config,
                         TokenBucketRateLimiterOptions options = {});

  /// The checks every configuration write makes before it sends anything (see the class comment).
  /// Throws InvalidArgument naming the bound.
  static void validateConfig(const TokenBucketConfig& config);
  /// Writes the configuration and a bucket with config.initialTokens (default full) if the key
  /// does not exist. True if this call wrote it. A key of another kind: InvalidConfigError.
  [[nodiscard]] bool trySetConfig(const TokenBucketConfig& config);
  /// Writes the configuration keeping the permits in use (as a Limiter's token bucket policy does
  /// on a change: they come back at the new rate, and count against the new capacity); the same
  /// configuration again changes nothing. With config.initialTokens set, restarts the bucket with
  /// them instead. A key without a configuration starts with initialTokens (default full); one
  /// whose stored configuration or state is unusable is overwritten. A handle made with a
  /// configuration decides with this one from now on.
  void setConfig(const TokenBucketConfig& config);
  /// The stored configuration. Throws NotInitializedError if there is none (a handle made with a
  /// configuration answers its own then).
  [[nodiscard]] TokenBucketConfig getConfig();

 private:
  bool permanentKeys_ = false;
};

}  // namespace redlimit
