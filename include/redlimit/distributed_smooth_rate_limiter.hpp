// redlimit — DistributedSmoothRateLimiter: Guava's RateLimiter (SmoothBursty, SmoothWarmingUp)
// with its state in one Redis key, so that a whole fleet paces and warms up together.
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

/// A smooth limiter's configuration, as stored in its key. Build one with bursty() or warmingUp().
struct SmoothConfig {
  std::int64_t permits = 0;                   // the stable rate: `permits` per `interval`, 1..kMaxPermits
  std::chrono::milliseconds interval{1000};   // 1 ms..kMaxInterval (49.7 days); one permit costs
                                              // interval / permits, exactly
  std::chrono::milliseconds maxBurst{1000};   // bursty: permits stored while idle, up to maxBurst's
                                              // worth (Guava: 1 s, fixed), handed out free;
                                              // 0..kMaxInterval, 0 = strictly paced. Unused when warming up
  std::chrono::milliseconds warmupPeriod{0};  // 0 (default): bursty; > 0 (up to kMaxInterval): warming up,
                                              // starts cold and reaches the stable rate after this
                                              // long of full use
  std::int64_t coldFactor = 3;                // warming up: a permit costs up to coldFactor x the
                                              // stable interval when cold (Guava: 3), 1..kMaxColdFactor.
                                              // Unused when bursty
  std::chrono::milliseconds keepAlive{0};     // a handle made with a configuration, or a keyed policy: the
                                              // key expires once the limiter has been idle (full, or cold)
                                              // this long; 0 (default): kDefaultIdleMargin unless
                                              // permanentKeys. Up to kMaxInterval. Not stored in the key:
                                              // trySetConfig and setConfig of a handle made without a
                                              // configuration refuse a keepAlive (its key is kept)

  /// Guava's create(permitsPerSecond) as `permits` per `interval`, with the burst chosen by the caller.
  [[nodiscard]] static SmoothConfig bursty(std::int64_t permits, std::chrono::milliseconds interval,
                                           std::chrono::milliseconds maxBurst = std::chrono::milliseconds{1000}) {
    SmoothConfig c;
    c.permits = permits;
    c.interval = interval;
    c.maxBurst = maxBurst;
    return c;
  }
  /// Guava's create(permitsPerSecond, warmupPeriod) as `permits` per `interval`, with Guava's
  /// hidden cold factor exposed.
  [[nodiscard]] static SmoothConfig warmingUp(std::int64_t permits, std::chrono::milliseconds interval,
                                              std::chrono::milliseconds warmupPeriod, std::int64_t coldFactor = 3) {
    SmoothConfig c;
    c.permits = permits;
    c.interval = interval;
    c.warmupPeriod = warmupPeriod;
    c.coldFactor = coldFactor;
    return c;
  }
  [[nodiscard]] bool isWarmingUp() const noexcept { return warmupPeriod.count() != 0; }

  /// Equal when they configure the same limiter (the unused one of maxBurst / coldFactor is ignored).
  friend bool operator==(const SmoothConfig& a, const SmoothConfig& b) {
    if (a.permits != b.permits || a.interval != b.interval || a.warmupPeriod != b.warmupPeriod ||
        a.keepAlive != b.keepAlive) {
      return false;
    }
    return a.isWarmingUp() ? a.coldFactor == b.coldFactor : a.maxBurst == b.maxBurst;
  }
  friend bool operator!=(const SmoothConfig& a, const SmoothConfig& b) { return !(a == b); }
};

/// Options of one DistributedSmoothRateLimiter handle.
struct DistributedSmoothRateLimiterOptions {
  FailureOptions failure;      // decisions when Redis cannot be asked (default: throw the IoError)
  MonitorOptions monitor;      // metrics (on, into MetricsRegistry::global()), shadow mode (off), events
  bool permanentKeys = false;  // a handle made with a configuration: false (default): its keepAlive of 0
                               // becomes kDefaultIdleMargin, so the key expires once idle (full, or
                               // cold) again; true: kept until deleteLimiter(). Unused by a handle
                               // made without one
};

/// Guava's RateLimiter shared by every process that uses its name: SmoothBursty (permits stored
/// while idle, up to maxBurst's worth, are handed out free) or SmoothWarmingUp (an idle limiter is
/// cold and hands out permits slowly; it reaches the stable rate after warmupPeriod of use, and
/// cools down again while idle). The math is redlimit's SmoothRateLimiter's (Guava 31.1 to the µs,
/// see smooth_rate_limiter.hpp: the cost of fresh permits rounded up, the tryAcquire fix), on the
/// Redis server's clock, in exact integers (lua/smooth.lua).
///
/// Guava's model: a request waits only until the limiter's current "next free" time and then
/// pushes it on by its own cost, so an idle limiter grants any request at once and the NEXT caller
/// pays for it. Here:
///  * acquire(n) reserves and sleeps, returning the time waited (Guava: seconds as a double).
///  * tryAcquire(n) (decide, Decision::allowed) is granted iff the limiter is free now.
///  * tryAcquire(n, timeout) is Guava's: granted iff the limiter is free within `timeout`; then it
///    has reserved and sleeps exactly the wait the script returned; otherwise false at once,
///    nothing reserved.
///  * A Decision's retryAfter (denied) is exact: the time until the limiter is free; remaining is
///    the whole stored permits (bursty: free permits; warming up: how cold the limiter is — they
///    are not free, each costs between the stable and the cold interval); limit is Guava's
///    maxPermits, whole (bursty: maxBurst's worth; warming up: the cold maximum, where it starts);
///    resetAfter is the time until it holds maxPermits again (bursty: full; warming up: cold).
///  * Any number of permits may be asked for at once (as in Guava), up to kMaxPermits and to
///    2^53 / K units (see lua/smooth.lua; K = interval in µs / gcd(permits, interval in µs), times
///    2(1 + coldFactor) when warming up): the script says InvalidArgument beyond.
///  * refund(n) gives back n permits' worth of time (the next free time moves back by n stable
///    intervals, not before now); a bursty limiter stores what is left, up to its maximum, a
///    warming-up one does not (that would cool it). Guava has no refund.
///
/// Storage: one string key, the name, 28 bytes (88 bytes in Redis for a name of up to 14 bytes,
/// MEMORY USAGE): rate, interval, maxBurst or warm-up period, cold factor, stored permits (exact,
/// in 1/K permit), the next free time in µs, and a power of two at least the debt owed at the
/// write (after a server clock stepped back, the next free time is clamped to it). A handle made
/// without a configuration uses the stored one: no TTL (decisions keep a TTL set on the key by
/// hand; setConfig clears it), and a key without one answers NotInitializedError. A
/// handle made with a configuration sends it in every call: a key without one is decided as a
/// limiter idle for long (bursty: maxBurst's worth stored; warming up: cold), which is what an
/// expired key was, and the key expires once idle again plus keepAlive (kDefaultIdleMargin for 0).
///
/// Bounds, checked before sending (InvalidArgument): permits in 1..2^32-1, interval in
/// 1 ms..2^32-1 ms, maxBurst, warmupPeriod and keepAlive in 0..2^32-1 ms, coldFactor in 1..127; with
/// P' = permits / g and T' = interval in µs / g (g = gcd(permits, interval in µs)): bursty,
/// maxBurst in µs x P' <= 2^52; warming up, W x P'^2 x 16(1 + coldFactor) <= 2^52 (W the warm-up in
/// µs) and a few weaker bounds (lua/smooth.lua). Rates that divide a second evenly (P' = 1: 1000/s,
/// 100/s, 5/s...) allow any warm-up period; 999 per second (P' = 999) allows about 70 s.
///
/// Thread-safe; see detail::ScriptLimiter for the other operations and the errors.
class DistributedSmoothRateLimiter : public detail::ScriptLimiter {
 public:
  static constexpr std::int64_t kMaxColdFactor = 127;

  /// A handle on the limiter whose key is `name`. Sends nothing. Throws InvalidArgument for a null
  /// client, an empty name or one longer than kMaxNameLength, bad failure options.
  DistributedSmoothRateLimiter(std::shared_ptr<Client> client, std::string name,
                               const DistributedSmoothRateLimiterOptions& options = {});
  /// A handle that decides with `config`, sent in every call (see the class comment). Sends
  /// nothing. Throws InvalidArgument as the other constructor does, and for a bad configuration.
  DistributedSmoothRateLimiter(std::shared_ptr<Client> client, std::string name, const SmoothConfig& config,
                               const DistributedSmoothRateLimiterOptions& options = {});

  /// The checks every configuration write makes before it sends anything (see the class comment).
  /// Throws InvalidArgument naming the bound.
  static void validateConfig(const SmoothConfig& config);
  /// Writes the configuration if the key does not exist, starting as Guava does: bursty with
  /// nothing stored, warming up cold. True if this call wrote it. A key of another kind:
  /// InvalidConfigError.
  [[nodiscard]] bool trySetConfig(const SmoothConfig& config);
  /// Writes the configuration keeping the state, as setRate does: the debt owed is kept, stored
  /// permits are brought up to now at the old configuration and scaled to the new maximum (stored x
  /// newMax / oldMax, rounded down: an idle limiter stays full, or cold, a busy one as busy). The
  /// same configuration again changes nothing. A key without one starts as trySetConfig's; one
  /// whose stored configuration or state is unusable is overwritten. A handle made with a
  /// configuration decides with this one from now on. (To restart: deleteLimiter(), then
  /// trySetConfig.)
  void setConfig(const SmoothConfig& config);
  /// The stored configuration. Throws NotInitializedError if there is none (a handle made with a
  /// configuration answers its own then).
  [[nodiscard]] SmoothConfig getConfig();

  /// Guava's setRate: changes the stable rate to `permits` per `interval`, keeping the state. Time
  /// already owed is kept (the next request still pays the previous debt at the old rate); stored
  /// permits are first brought up to now at the old rate, then scaled to the new maximum (stored x
  /// newMax / oldMax, rounded down; maxBurst, warm-up period and cold factor are unchanged, so the
  /// maximum moves with the rate). Throws InvalidArgument before sending for a bad rate (and from
  /// the script if the new rate breaks the bounds with the stored warm-up), NotInitializedError
  /// if the limiter has no configuration, IoError if Redis cannot be asked. A handle made with a
  /// configuration changes its own: setConfig with the new rate.
  void setRate(std::int64_t permits, std::chrono::milliseconds interval);

  /// Guava's acquire(permits): reserves `permits` (always granted by the script, reserving up to
  /// kMaxWait ahead) and sleeps until the limiter's previous debt is paid. Returns the time slept
  /// (0 if the limiter was free), or, when the failure policy decided, the time spent waiting for
  /// it. Under the failure policy's denials, asks again every probe interval; IoErrors are
  /// thrown (FailurePolicy::Throw).
  std::chrono::microseconds acquire(std::int64_t permits = 1);

 private:
  std::chrono::milliseconds probeInterval_;
  bool permanentKeys_ = false;
};

}  // namespace redlimit
