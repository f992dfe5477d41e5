// redlimit — an algorithm and its parameters as a value: what a Limiter applies to each key.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "redlimit/calendar.hpp"

namespace redlimit {

/// How long a key whose configuration travels in the call (a Limiter's) lives once idle, by default: it expires this long after its limiter is
/// full again (the fixed window: its window ended), and an expired key decides exactly as a full
/// one, so nothing is lost. Policy::keepAlive changes it, Policy::permanent keeps keys.
inline constexpr std::chrono::milliseconds kDefaultIdleMargin{1000};

class Limiter;
class MultiLimit;

namespace detail {
struct KeyedPolicy;
struct CalendarQuota;
}  // namespace detail

/// An algorithm with its parameters, checked when it is made (InvalidArgument, before anything is
/// sent), immutable, cheap to copy. A Limiter sends it with every call: a key without state is
/// decided as a full limiter, a key holding another policy's state of the same algorithm is
/// decided with this one keeping the permits in use (docs/algorithms.md, "Where the configuration
/// lives"). Every duration is exact: integer milliseconds, decisions in integer microseconds.
///
/// The algorithms (docs/algorithms.md has each one's bound, layout and cost):
///  - gcra / perSecond / perMinute / perHour: the generic cell rate algorithm (redis_rate's
///    Limit): `rate` per `period` sustained, up to `burst` at once after an idle time;
///  - tokenBucket: `capacity` tokens, `refill` more every `period` (Bucket4j's greedy refill);
///    the same script and key layout as GCRA (a bucket is a GCRA of burst = capacity);
///  - fixedWindow: at most `limit` per window of `window`, windows aligned to the epoch;
///  - slidingWindow: about `limit` per sliding `window` (the sliding-window counter: the previous
///    window's count weighted by its overlap), 28 bytes per key; any `window`-long interval holds at
///    most limit + floor(limit x (window - 2 us) / window), 2 x limit - 1 for window >= 2 x limit us;
///  - smoothBursty / smoothWarmingUp: Guava's SmoothBursty and SmoothWarmingUp on the server,
///    for every process at once (reservations pay the debt of the previous caller; no reserveFor);
///  - calendar: at most `limit` per calendar day, week or month of an IANA time zone (DST days
///    are 23 or 25 hours), e.g. a daily token budget per tenant;
///  - concurrency: at most `limit` leases held at once, each for a TTL so that a crashed holder's
///    lease frees itself (Redisson's RPermitExpirableSemaphore): acquireLease, renew, release.
class Policy {
 public:
  enum class Kind { Gcra, TokenBucket, FixedWindow, Smooth, Concurrency, Calendar, SlidingWindow };

  /// `rate` permits per `period` (1 ms..49.7 days), at most `burst` at once; rate and burst in
  /// 1..4294967295.
  [[nodiscard]] static Policy gcra(std::int64_t rate, std::chrono::milliseconds period, std::int64_t burst);
  /// gcra(rate, 1 s, burst); the burst defaults to the rate, as redis_rate's PerSecond.
  [[nodiscard]] static Policy perSecond(std::int64_t rate, std::int64_t burst = 0);
  /// gcra(rate, 1 min, burst); the burst defaults to the rate.
  [[nodiscard]] static Policy perMinute(std::int64_t rate, std::int64_t burst = 0);
  /// gcra(rate, 1 h, burst); the burst defaults to the rate.
  [[nodiscard]] static Policy perHour(std::int64_t rate, std::int64_t burst = 0);
  /// A bucket of `capacity`, `refill` tokens added every `period` (continuously, to the µs).
  [[nodiscard]] static Policy tokenBucket(std::int64_t capacity, std::int64_t refill, std::chrono::milliseconds period);
  /// At most `limit` per window of `window`.
  [[nodiscard]] static Policy fixedWindow(std::int64_t limit, std::chrono::milliseconds window);
  /// About `limit` (1..4294967295) per sliding window of `window` (1 ms..49.7 days): granted while
  /// the previous window's count x the part of it still inside the sliding window + the current
  /// window's count + the permits asked for stay within `limit`, exactly (integer µs). Cheaper than
  /// the exact sliding log (RateLimiter; ~118 bytes per permit in the window), closer to the limit
  /// than the fixed window on ordinary traffic; its worst case is in the class comment. Permits are
  /// taken now or not at all (no waiting; reserveFor counts them now, settle gives back).
  [[nodiscard]] static Policy slidingWindow(std::int64_t limit, std::chrono::milliseconds window);
  /// Guava's SmoothBursty: `permits` per `interval`, up to `maxBurst` worth stored while idle.
  [[nodiscard]] static Policy smoothBursty(std::int64_t permits, std::chrono::milliseconds interval,
                                           std::chrono::milliseconds maxBurst = std::chrono::seconds(1));
  /// Guava's SmoothWarmingUp: `permits` per `interval`, cold at first, reaching the stable rate
  /// after `warmup` of full use; a cold permit costs up to `coldFactor` (1..127) stable ones.
  [[nodiscard]] static Policy smoothWarmingUp(std::int64_t permits, std::chrono::milliseconds interval,
                                              std::chrono::milliseconds warmup, std::int64_t coldFactor = 3);

  /// At most `limit` (1..4294967295) leases held at once per key, each for `leaseTtl` (1 ms..49.7
  /// days) unless renewed.
  [[nodiscard]] static Policy concurrency(std::int64_t limit, std::chrono::milliseconds leaseTtl);

  /// At most `limit` (1..4294967295) permits per calendar `unit` (day, week from `weekStart`,
  /// month) of the time zone `zone` (an IANA name of the system's database, "Europe/Berlin").
  /// Throws InvalidArgument for an unknown zone.
  [[nodiscard]] static Policy calendar(std::int64_t limit, CalendarUnit unit, std::string zone, Weekday weekStart);
  [[nodiscard]] static Policy calendar(std::int64_t limit, CalendarUnit unit, std::string zone);

  /// A calendar policy's window holding `at` (µs since the epoch, UTC), from the system's time zone
  /// database (/usr/share/zoneinfo, read by Howard Hinnant's date/tz, the basis of C++20's <chrono>
  /// zones): a day starts at the first instant of its local date (local midnight, or the end of a
  /// DST gap that skips midnight; where midnight occurs twice, the first). The window a Limiter
  /// counts in is the one its key holds, which this host's database may date differently
  /// (docs/algorithms.md, "Calendar quotas"). Sends nothing; thread-safe. Throws InvalidArgument
  /// for a policy that is not a calendar quota or `at` before 1970.
  [[nodiscard]] CalendarWindow windowAt(std::chrono::microseconds at) const;

  /// This policy with keys that expire once idle (full again, or cold) for `idle` (1 ms..49.7
  /// days); by default kDefaultIdleMargin (1 s). Permanent keys: permanent().
  [[nodiscard]] Policy keepAlive(std::chrono::milliseconds idle) const;
  /// This policy with keys kept until deleted.
  [[nodiscard]] Policy permanent() const;
  /// This policy kept in Redis, per key, rather than sent with every call: a Limiter of a stored
  /// policy decides each key by the configuration stored in it, which Limiter::trySetPolicy and
  /// setPolicy write (here or in any process: one place to change a limit for every caller), and
  /// a key without one is NotInitializedError. Its keys are permanent (the configuration must
  /// outlive idle time; deleteKey removes one), so keepAlive() refuses it. GCRA, token bucket,
  /// fixed window and smooth; a calendar quota, a sliding window counter or a concurrency limit
  /// travels in every call (InvalidArgument).
  [[nodiscard]] Policy stored() const;
  /// Whether the configuration lives in each key (stored()).
  [[nodiscard]] bool isStored() const noexcept { return stored_; }

  [[nodiscard]] Kind kind() const noexcept { return kind_; }
  /// What a decision reports as its limit: the burst, the capacity, the window's limit, or the
  /// smooth limiter's stored permits.
  [[nodiscard]] std::int64_t limit() const noexcept;
  /// The most permits one call may ask for.
  [[nodiscard]] std::int64_t maxPermits() const noexcept;
  /// How long limit() permits take to come back at the sustained rate, rounded up (a fixed
  /// window: the window); saturating. What an HTTP RateLimit-Policy advertises as its window.
  [[nodiscard]] std::chrono::milliseconds refillTime() const noexcept;
  /// Whether reserveFor/settle work under it (all but these two: a smooth limiter lends ahead
  /// rather than holding, a concurrency limit holds leases).
  [[nodiscard]] bool canHold() const noexcept { return kind_ != Kind::Smooth && kind_ != Kind::Concurrency; }
  /// Whether it can take permits ahead of time (tryAcquire with a timeout, acquire, reserve): not a
  /// calendar quota (its next window opens at the zone's next midnight), a sliding window counter
  /// (a permit booked ahead would count in every estimate until it is used) nor a concurrency limit.
  [[nodiscard]] bool canWait() const noexcept {
    return kind_ != Kind::Calendar && kind_ != Kind::Concurrency && kind_ != Kind::SlidingWindow;
  }
  /// Whether it gives leases (acquireLease, renew, release) rather than permits.
  [[nodiscard]] bool givesLeases() const noexcept { return kind_ == Kind::Concurrency; }
  /// A concurrency policy's lease TTL (0 for the others).
  [[nodiscard]] std::chrono::milliseconds leaseTtl() const noexcept {
    return std::chrono::milliseconds{kind_ == Kind::Concurrency ? b_ : 0};
  }

  friend bool operator==(const Policy& a, const Policy& b) noexcept;
  friend bool operator!=(const Policy& a, const Policy& b) noexcept { return !(a == b); }

 private:
  friend class Limiter;
  friend class MultiLimit;
  [[nodiscard]] const detail::KeyedPolicy& packedPolicy() const noexcept { return *packed_; }
  // A calendar policy's quota (InvalidArgument for another policy, naming `what` it was asked for).
  [[nodiscard]] detail::CalendarQuota calendarQuota(const char* what) const;

  // The parameters as given, and how long an idle key lives (0: permanent).
  Policy(Kind kind, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, std::int64_t keepAliveMs,
         std::string zone = {});

  Kind kind_;
  std::int64_t a_, b_, c_, d_;
  std::string zone_;  // a calendar quota's time zone
  std::int64_t keepAliveMs_;
  std::shared_ptr<const detail::KeyedPolicy> packed_;
  bool stored_ = false;
};

}  // namespace redlimit
