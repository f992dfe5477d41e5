// redlimit — FixedWindowRateLimiter: at most `limit` permits per aligned window, in one Redis key.
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

/// A fixed window limiter's configuration, as stored in its key.
struct FixedWindowConfig {
  std::int64_t limit = 0;                  // permits per window, 1..kMaxPermits
  std::chrono::milliseconds window{0};     // 1 ms..kMaxInterval (49.7 days)
  std::chrono::milliseconds keepAlive{0};  // 0 (default): kept until deleteLimiter(); > 0: the key expires
                                           // this long after the last window with permits taken ends

  friend bool operator==(const FixedWindowConfig& a, const FixedWindowConfig& b) {
    return a.limit == b.limit && a.window == b.window && a.keepAlive == b.keepAlive;
  }
  friend bool operator!=(const FixedWindowConfig& a, const FixedWindowConfig& b) { return !(a == b); }
};

/// Options of one FixedWindowRateLimiter handle.
struct FixedWindowRateLimiterOptions {
  FailureOptions failure;      // decisions when Redis cannot be asked (default: throw the IoError)
  MonitorOptions monitor;      // metrics (on, into MetricsRegistry::global()), shadow mode (off), events
  bool permanentKeys = false;  // a handle made with a configuration: false (default): its keepAlive of 0
                               // becomes kDefaultIdleMargin, so the key expires once its windows end; true:
                               // kept until deleteLimiter(). Unused by a handle made without one
};

/// The fixed-window counter shared by every process that uses its name: at most `limit` permits
/// in each window, windows aligned to the epoch on the Redis server's clock (a window starts at
/// floor(serverTimeUs / windowUs) x windowUs, so every host agrees). Up to 2 x limit can pass
/// within one window's length across a boundary: that is the algorithm (use GCRA or the token
/// bucket for a bound over any window).
///
/// Storage: one string key, the name, holding configuration, the current window's start and
/// count, and the count reserved in the next window, in 28 bytes (88 bytes in Redis for a name of
/// up to 14 bytes): INCRBY + PEXPIRE semantics without a key per window. A handle made without a
/// configuration uses the stored one (no TTL unless keepAlive is set; NotInitializedError for a
/// key without one); a handle made with a configuration sends it in every call, and its key
/// expires at the end of the last window with permits counted, plus keepAlive (see
/// detail::ScriptLimiter). retryAfter of a denial is the start of the window that can take the
/// permits.
/// reserve() and tryAcquire(permits, timeout) book the next window when the current one is full.
///
/// Bounds, checked before sending: limit in 1..2^32-1, window in 1 ms..2^32-1 ms, keepAlive in
/// 0..2^32-1 ms. Keys: as TokenBucketRateLimiter (use one {hash tag} for limiters decided
/// together). Thread-safe; see detail::ScriptLimiter for the operations and errors.
class FixedWindowRateLimiter : public detail::ScriptLimiter {
 public:
  /// A handle on the limiter whose key is `name`. Sends nothing. Throws InvalidArgument for a null
  /// client, an empty name or one longer than kMaxNameLength, bad failure options.
  FixedWindowRateLimiter(std::shared_ptr<Client> client, std::string name, FixedWindowRateLimiterOptions options = {});
  /// A handle that decides with `config`, sent in every call (see detail::ScriptLimiter). Sends
  /// nothing. Throws InvalidArgument as the other constructor does, and for a bad configuration.
  FixedWindowRateLimiter(std::shared_ptr<Client> client, std::string name, const FixedWindowConfig& config,
                         FixedWindowRateLimiterOptions options = {});

  /// The checks every configuration write makes before it sends anything. Throws InvalidArgument.
  static void validateConfig(const FixedWindowConfig& config);
  /// Writes the configuration (with an empty current window) if the key does not exist. True if
  /// this call wrote it. A key of another kind: InvalidConfigError.
  [[nodiscard]] bool trySetConfig(const FixedWindowConfig& config);
  /// Writes the configuration keeping the counts: the permits counted in the current window and
  /// reserved in the next stay counted (at most the new limit); another window length counts them
  /// in the current and next windows of the new length, until those end (docs/algorithms.md). The
  /// same configuration again changes nothing. A key without one starts empty; one whose stored
  /// configuration or state is unusable is overwritten, empty. A handle made with a configuration
  /// decides with this one from now on. (To empty the window: deleteLimiter(), then trySetConfig.)
  void setConfig(const FixedWindowConfig& config);
  /// The stored configuration. Throws NotInitializedError if there is none (a handle made with a
  /// configuration answers its own then).
  [[nodiscard]] FixedWindowConfig getConfig();

 private:
  bool permanentKeys_ = false;
};

}  // namespace redlimit
