// redlimit — RateLimiter: Redisson's RRateLimiter in C++, on the same Redis data.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redlimit/detail/acquire_result.hpp"
#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/rate_limiter_config.hpp"

namespace redlimit {

namespace detail {
template <class Source>
struct SegmentAccess;
}  // namespace detail

/// A distributed sliding-window rate limiter that reads and writes Redisson's RRateLimiter data
/// layout (3.38+), so Java services using Redisson and C++ services using redlimit can take
/// permits from one limiter. At most `rate` permits are granted in any window of
/// `rateInterval`, across every process that uses the limiter's name.
///
/// The handle is a cheap, movable value (its state is shared, so copies share one failure gate
/// and one view of the configuration); many handles may name the same limiter. Every call is one
/// round trip (one atomic script) unless it says otherwise. The acquire calls have ...Async forms
/// that return at once; the sync ones wait for the same request.
/// Thread-safe.
///
/// Errors: InvalidArgument before anything is sent (bad name, rate, interval, permits);
/// NotInitializedError if no configuration exists; ScriptError (InvalidConfig) if the hash holds values
/// redlimit cannot use; ScriptError (InvalidState) if a state key does (nothing is written then);
/// ConfigurationError (a replica, a TLS port, no file descriptors, a request over the server's
/// limits) and AuthError (wrong or missing password, a missing ACL permission) when the set-up
/// cannot work, under every failure policy; IoError and subclasses (TimeoutError, ClosedError,
/// kinds PoolTimeout, Unavailable) when Redis cannot be reached in time — then no decision
/// was made. For the acquire calls, RateLimiter::Options::failure decides instead what an
/// unreachable Redis means (throw, allow, deny, or a local limiter), and while Redis stays
/// unreachable only one call per probe interval tries it; the others are decided at once.
///
/// The deny cache (Options::denyCacheKeys; docs/api.md, "The deny cache"): once Redis denied
/// `permits`, decide and tryAcquire without a timeout (and their async forms) answer calls of at
/// least those permits here, denied, until the denial's retryAfter less 1 ms (the script rounds
/// its wait up to whole ms); never granted locally. This handle's release, setRate, trySetRate,
/// updateRate and deleteLimiter forget it; another process's give-back or rate change is not
/// seen, so the limiter may be denied here up to that retryAfter after Redis would grant again.
///
/// Bound: no call takes longer than connect timeout + command timeout (one request's deadline, plus
/// the connecting it had to wait for), except acquire() and tryAcquire(permits, timeout), which
/// sleep the waits the limiter asks for.
class RateLimiter {
 public:
  /// Options of one RateLimiter handle.
  struct Options {
    TimeSource timeSource = TimeSource::Server;  // clock that stamps permits
    FailureOptions failure;                      // decisions when Redis cannot be asked
                                                 // (default: throw the IoError)
    bool coalesce = true;                        // acquisitions of this handle that arrive while it
                                                 // has 4 calls in flight on each connection of the
                                                 // pool queue up and go to Redis together, as one
                                                 // script call deciding each in order; fewer go at
                                                 // once, alone (false: one call each)
    LimiterMonitor::Options monitor;             // metrics (on, into MetricsRegistry::global()), shadow
                                                 // mode (off), events
    std::size_t denyCacheKeys = 10000;           // keys remembered as denied until their retryAfter
                                                 // (LRU; 0 = off, at most 2^24): a handle is one key,
                                                 // so any value above 0 remembers this limiter's
                                                 // denial, answered locally by decide and tryAcquire
                                                 // without a timeout
  };

  static constexpr std::int64_t kMaxRate = 4294967295;                     // uint32 in a member
  static constexpr std::chrono::milliseconds kMaxInterval{1000000000000};  // about 31 years
  static constexpr std::size_t kMaxNameLength = 1024;                      // bytes
  static constexpr std::size_t kMaxClientIdLength = 128;                   // bytes

  /// The checks every configuration write makes before it sends anything: throws InvalidArgument
  /// for an unknown type, rate outside 1..kMaxRate, interval outside 1 ms..kMaxInterval, or a
  /// keepAliveTime that is neither 0 nor in rateInterval..kMaxInterval.
  static void validateConfig(RateType type, std::int64_t rate, std::chrono::milliseconds rateInterval,
                             std::chrono::milliseconds keepAliveTime = std::chrono::milliseconds{0});

  /// A handle on the limiter called `name`. Sends nothing. Throws InvalidArgument for a name that
  /// is empty, longer than kMaxNameLength, or that would address another limiter's keys under
  /// Redisson's key scheme: "{x}" (whose state keys are those of "x"), and any name with a '{'
  /// that ends in ":value", ":permits", ":value:...", ":permits:..." or ":grant:..." (which are
  /// the state keys of the name before that colon). Also for a ClientOptions::clientId that is
  /// empty, longer than kMaxClientIdLength or contains '{' or '}'.
  RateLimiter(std::shared_ptr<Client> client, std::string name, Options options);
  /// As above with the default Options (an overload, not a default argument: a nested type's
  /// default member initializers are not usable inside its enclosing class, CWG 1397).
  RateLimiter(std::shared_ptr<Client> client, std::string name)
      : RateLimiter(std::move(client), std::move(name), Options{}) {}

  /// Writes the configuration if none exists (HSETNX semantics); touches no other key. Returns
  /// true if this call created it. keepAliveTime > 0 (at least rateInterval) sets an idle TTL.
  [[nodiscard]] bool trySetRate(RateType type, std::int64_t rate, std::chrono::milliseconds rateInterval,
                                std::chrono::milliseconds keepAliveTime = std::chrono::milliseconds{0});
  /// Overwrites the configuration and resets the state: the limiter restarts full.
  void setRate(RateType type, std::int64_t rate, std::chrono::milliseconds rateInterval,
               std::chrono::milliseconds keepAliveTime = std::chrono::milliseconds{0});
  /// Overwrites the configuration; with keepState, keeps the permits in use (Redisson 4.4):
  /// members older than the new interval are dropped, available = new rate - permits in use.
  /// A change of type always clears the state.
  void setRate(RateType type, std::int64_t rate, std::chrono::milliseconds rateInterval,
               std::chrono::milliseconds keepAliveTime, bool keepState);
  /// setRate with keepState, but only if the limiter exists. Returns false (and creates nothing)
  /// if it does not.
  [[nodiscard]] bool updateRate(RateType type, std::int64_t rate, std::chrono::milliseconds rateInterval,
                                std::chrono::milliseconds keepAliveTime = std::chrono::milliseconds{0});

  /// Takes one permit if available now. Never waits.
  [[nodiscard]] bool tryAcquire() { return tryAcquire(1); }
  /// Takes `permits` (1..rate) if available now. Never waits.
  [[nodiscard]] bool tryAcquire(std::int64_t permits);
  /// Takes one permit, waiting up to `timeout` for it.
  [[nodiscard]] bool tryAcquire(std::chrono::milliseconds timeout) { return tryAcquire(1, timeout); }
  /// Takes `permits`, waiting up to `timeout`: on a denial it sleeps the wait the script returns
  /// and tries again; it returns false at once when the time left cannot cover the next wait
  /// (Redisson sleeps the rest of the timeout first). timeout <= 0 means one attempt.
  [[nodiscard]] bool tryAcquire(std::int64_t permits, std::chrono::milliseconds timeout);
  /// Takes one permit, waiting as long as it takes. Transport errors are thrown, not retried.
  void acquire() { acquire(1); }
  /// Takes `permits` (1..rate), waiting as long as it takes.
  void acquire(std::int64_t permits);

  /// Takes `permits` (1..rate) if available now, like tryAcquire(permits), and returns the whole
  /// answer: remaining, retryAfter, resetAfter, limit (the rate) and the server time of the
  /// decision. retryAfter is the script's wait, rounded up to whole ms: a retry then succeeds if
  /// nobody else takes permits (and 1 ms earlier does not, unless the permits needed expire within
  /// that ms). resetAfter is exact when allowed (the grant is the newest permit in use: one
  /// interval) and otherwise one interval, an upper bound (the script does not read when the newest
  /// permit in use was taken). When Redis cannot be asked the failure policy decides
  /// (Decision::byPolicy, limit = the rate last seen). Never waits.
  [[nodiscard]] Decision decide(std::int64_t permits = 1);
  /// decide() without waiting for the reply; `done` is called as tryAcquireAsync's.
  void decideAsync(std::int64_t permits, std::function<void(Decision decision, std::exception_ptr error)> done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<Decision> decideAsync(std::int64_t permits = 1);

  /// tryAcquire(permits) without waiting for the reply: `done` gets granted or the error (the
  /// exception the sync call would have thrown). Called exactly once: on the Client's I/O thread,
  /// or on the calling thread before the call returns when the call is decided without Redis (bad
  /// arguments, the failure policy while the limiter is degraded, a request refused before it was
  /// queued). `done` must not throw, must not block, and must not make sync calls on this Client
  /// (they would wait for the thread the callback runs on; they throw InvalidArgument instead).
  /// The failure policy and the health events apply as for tryAcquire. One thread can keep
  /// thousands in flight.
  void tryAcquireAsync(std::int64_t permits, std::function<void(bool granted, std::exception_ptr error)> done);
  /// tryAcquireAsync with a future instead of a callback.
  [[nodiscard]] std::future<bool> tryAcquireAsync(std::int64_t permits = 1);

  /// Permits that could be taken now, 0..rate. Returns expired permits first, like tryAcquire.
  [[nodiscard]] std::int64_t availablePermits();
  /// Reads the configuration hash. Throws NotInitializedError if it does not exist.
  [[nodiscard]] RateLimiterConfig getConfig();
  /// Gives back up to `permits` (>= 0) taken earlier, newest first: the available permits become
  /// min(available + permits, rate). 0 is a no-op.
  void release(std::int64_t permits);

  /// Sets a TTL on all of the limiter's keys. True if any key exists.
  bool expire(std::chrono::milliseconds ttl);
  /// Sets an absolute expiry (wall clock) on all of the limiter's keys. True if any key exists.
  bool expireAt(std::chrono::system_clock::time_point when);
  /// Removes the TTL from all of the limiter's keys. True if any key had one.
  bool clearExpire();
  /// TTL of the configuration hash in ms; -1 if it has none, -2 if it does not exist (as PTTL).
  [[nodiscard]] std::chrono::milliseconds remainTimeToLive();
  /// True if the configuration hash exists.
  [[nodiscard]] bool isExists();
  /// Deletes the configuration and this client's state. True if any key existed.
  bool deleteLimiter();

  [[nodiscard]] const std::string& getName() const noexcept;
  /// The five keys in Redisson's order: hash, value, client value, permits, client permits.
  [[nodiscard]] const std::vector<std::string>& keys() const noexcept;
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Decisions made under the failure policy, and whether the limiter is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The handle's metrics, shadow mode and events (Options::monitor). A
  /// SegmentedRateLimiter over this limiter counts its decisions and applies shadow mode with it.
  /// Decisions are the calls that decide (tryAcquire, acquire, decide and their ...Async forms);
  /// the segment cache's refills and give-backs count round trips only.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 private:
  // The segment cache's calls (segmented_rate_limiter.hpp): take-up-to and give-back of a grant,
  // the failure policy's decision of an unanswered call.
  friend struct detail::SegmentAccess<RateLimiter>;
  using AcquireCallback = std::function<void(detail::AcquireResult result, std::exception_ptr error)>;
  class Impl;
  std::shared_ptr<Impl> impl_;
};

/// Redisson's key naming: `{name}:suffix`, or `name:suffix` when the name already has a '{'.
[[nodiscard]] std::string suffixName(const std::string& name, const std::string& suffix);

}  // namespace redlimit

// RateLimiter's segment caches: compiled into the library (src/limiters/segmented_rate_limiter.cpp), so
// users of the default template arguments do not compile the slow path in every translation unit.
#include "redlimit/segmented_rate_limiter.hpp"

namespace redlimit {
extern template class SegmentedRateLimiter<RateLimiter, SteadyClock>;
extern template class SegmentedRateLimiter<RateLimiter, CoarseSteadyClock>;
static_assert(SegmentedRateLimiter<>::kMaxPermits == RateLimiter::kMaxRate &&
                  SegmentedRateLimiter<>::kMaxWait == RateLimiter::kMaxInterval,
              "the segment cache's bounds are RateLimiter's");
}  // namespace redlimit
