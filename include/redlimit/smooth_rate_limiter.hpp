// redlimit — SmoothRateLimiter: Guava's RateLimiter for in-process pacing, exact to the µs.
//
// Independent of Redis. Reproduces the semantics of Google Guava's RateLimiter (SmoothBursty and
// SmoothWarmingUp, as of Guava 31.1; see the RateLimiter Javadoc) and its test vectors to the
// microsecond, with two of Guava's defects fixed.
//
// The model (facts from Guava's documentation and behaviour):
//  * A limiter hands out permits at a stable rate; one permit costs `stableInterval = 1 s / rate`.
//  * `nextFree` is the moment the limiter is next free. A request waits only until the *previous*
//    `nextFree`, then pushes `nextFree` forward by its own cost: an idle limiter grants any request
//    at once and the next caller pays for it.
//  * While idle (now > nextFree) the limiter stores unused permits, one per `coolDownInterval`,
//    up to `maxPermits`. A bursty limiter's stored permits are free (a burst of up to
//    `maxBurstSeconds` worth of permits). A warming-up limiter's stored permits are *expensive*:
//    above `thresholdPermits` a permit costs up to `coldFactor * stableInterval`, so a limiter
//    that has been idle starts slowly and reaches the stable rate after `warmupPeriod` of use.
//  * tryAcquire(timeout) succeeds if the previous debt can be paid within the timeout; it then
//    reserves and sleeps like acquire(). When it fails it reserves nothing.
//
// Differences from Guava, by design:
//  * acquire() returns the time waited as std::chrono::microseconds (Guava: seconds as a double),
//    so waits compare exactly; reserve() exposes the wait without sleeping.
//  * bursty() lets the caller choose maxBurstSeconds (Guava fixes it at 1 s).
//  * getRate() returns the rate exactly as set (Guava recomputes it from the interval).
//  * The cost of fresh (not stored) permits is rounded *up* to whole microseconds; Guava
//    truncates it. Truncation lets every grant come up to 1 us early: at 3/s Guava waits
//    333333 us and runs fast, and above 1e6/s a single permit costs 0 us and Guava stops
//    limiting. Rounding up, a bursty limiter provably never grants more than
//    rate * (T + maxBurstSeconds) + 1 single permits in any window of T >= 1 s, and above
//    1e6/s single permits are paced at 1 us (microsecond resolution). Every reference vector
//    is unchanged (their fresh costs are whole microseconds). The cost of stored warm-up
//    permits is truncated exactly as in Guava, which its cold-factor-10 vectors pin down.
//  * Permits are std::int64_t (Guava: int). Time comes from a clock policy (clock.hpp).
//
// Defects of Guava fixed here:
//  1. Zero warm-up period. Guava computes maxPermits = 0 and coolDownInterval = 0 / 0 = NaN; the
//     NaN then spreads into storedPermits and every wait becomes (long) NaN = 0, so the limiter
//     stops limiting. Here warmingUp(rate, 0) is the limit of the warm-up math as the period goes
//     to 0: a bursty limiter with maxBurstSeconds = 0, i.e. strictly paced at the stable rate
//     with no stored permits. (Callers who want a burst ask for bursty(rate) explicitly.)
//  2. A stream of tryAcquire() calls keeping a warm-up limiter cold. A refused tryAcquire leaves
//     no trace, so when nextFree passes, the limiter counts the time until the refused caller's
//     next attempt as idle and stores permits for it -- cooling down while demand is waiting.
//     A caller polling at about the stable rate is refused most of the time, and the idle gaps
//     after each refusal refill exactly what its rare successes consume: Guava stays cold forever
//     (a 10/s limiter with a 500 ms warm-up serves a poller every 120 ms at 2.8/s, alternating
//     between 5 and 4 stored permits; a poller every 100 ms gets 5/s). Fix: a refusal records
//     that demand is waiting. In the first idle gap after a refusal, the first `coldFactor *
//     stableInterval` (the longest one permit can cost, hence the longest a refused caller that
//     keeps asking at more than the cold rate can stay away) may refill stored permits only up to
//     thresholdPermits, where they cost the stable interval, and cannot cool the limiter above it;
//     idle time beyond that cools it as in Guava. The refusal itself still reserves nothing; the
//     fix only lets the limiter warm up, and a warm limiter never runs faster than its stable
//     rate (every permit costs at least the stable interval, less Guava's sub-microsecond
//     truncation of stored permits' cost); acquire()/reserve()-only use, bursty limiters and
//     every Guava test vector are unchanged. (A poller whose period is between half the stable
//     interval and the interval still loses the rest of each interval, warm or not, as in Guava.)
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <ratio>
#include <string>
#include <type_traits>
#include <utility>

#include "redlimit/clock.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit {

/// A smooth rate limiter with Guava's RateLimiter semantics (see the file comment), in-process,
/// independent of Redis. Create one with bursty() or warmingUp().
///
/// Clock is a clock policy (clock.hpp): SteadyClock by default; tests pass ClockRef<ManualClock>
/// or their own recording clock. Its now() and sleepFor() must be thread-safe if the limiter is
/// shared between threads.
///
/// All waits are in microseconds. Thread-safe: one mutex guards the state; sleeps happen outside
/// it. Neither copyable nor movable (it owns a mutex); `auto limiter = SmoothRateLimiter::bursty(
/// 50.0);` works by guaranteed copy elision, and so does `new SmoothRateLimiter(
/// SmoothRateLimiter::bursty(50.0))`.
template <class Clock = SteadyClock>
class BasicSmoothRateLimiter {
 public:
  /// Guava's create(permitsPerSecond), with the burst length chosen by the caller: permits not
  /// used while idle are stored, up to maxBurstSeconds * permitsPerSecond, and handed out free.
  /// Starts with nothing stored. permitsPerSecond may be +infinity (no limit).
  /// Throws InvalidArgument if permitsPerSecond <= 0 or NaN, or maxBurstSeconds is negative,
  /// NaN or infinite.
  [[nodiscard]] static BasicSmoothRateLimiter bursty(double permitsPerSecond, double maxBurstSeconds = 1.0,
                                                     Clock clock = Clock{}) {
    checkRate(permitsPerSecond);
    if (!(maxBurstSeconds >= 0.0) || std::isinf(maxBurstSeconds)) {
      throw InvalidArgument("SmoothRateLimiter: maxBurstSeconds must be finite and >= 0, got " +
                            std::to_string(maxBurstSeconds));
    }
    return BasicSmoothRateLimiter(std::move(clock), permitsPerSecond, maxBurstSeconds, 0.0, 1.0);
  }

  /// Guava's create(permitsPerSecond, warmupPeriod) with Guava's hidden cold factor exposed:
  /// starts cold, where a permit costs coldFactor / permitsPerSecond, and reaches the stable rate
  /// after warmupPeriod of full use; cools down again while idle. warmupPeriod is converted to
  /// whole microseconds (truncated, saturated). A zero warm-up period gives a strictly paced
  /// limiter, bursty(permitsPerSecond, 0.0) (Guava stops limiting; see the file comment).
  /// permitsPerSecond may be +infinity (no limit; a later finite rate starts warm, as in Guava).
  /// Throws InvalidArgument if permitsPerSecond <= 0 or NaN, warmupPeriod is negative or NaN,
  /// or coldFactor < 1, NaN or infinite.
  template <class Rep, class Period>
  [[nodiscard]] static BasicSmoothRateLimiter warmingUp(double permitsPerSecond,
                                                        std::chrono::duration<Rep, Period> warmupPeriod,
                                                        double coldFactor = 3.0, Clock clock = Clock{}) {
    checkRate(permitsPerSecond);
    if constexpr (std::is_floating_point_v<Rep>) {
      if (std::isnan(static_cast<double>(warmupPeriod.count()))) {
        throw InvalidArgument("SmoothRateLimiter: warmupPeriod must not be NaN");
      }
    }
    const std::int64_t warmupMicros = saturatedMicros(warmupPeriod);
    if (warmupMicros < 0) {
      throw InvalidArgument("SmoothRateLimiter: warmupPeriod must be >= 0, got " + std::to_string(warmupMicros) +
                            " us");
    }
    if (!(coldFactor >= 1.0) || std::isinf(coldFactor)) {
      throw InvalidArgument("SmoothRateLimiter: coldFactor must be finite and >= 1, got " + std::to_string(coldFactor));
    }
    // A zero period makes a bursty limiter with maxBurstSeconds 0 (isWarmingUp() is false).
    return BasicSmoothRateLimiter(std::move(clock), permitsPerSecond, 0.0, static_cast<double>(warmupMicros),
                                  coldFactor);
  }

  BasicSmoothRateLimiter(const BasicSmoothRateLimiter&) = delete;
  BasicSmoothRateLimiter& operator=(const BasicSmoothRateLimiter&) = delete;
  BasicSmoothRateLimiter(BasicSmoothRateLimiter&&) = delete;
  BasicSmoothRateLimiter& operator=(BasicSmoothRateLimiter&&) = delete;
  ~BasicSmoothRateLimiter() = default;

  /// Takes `permits`, sleeping (Clock::sleepFor) until the limiter's previous debt is paid, and
  /// returns the time slept in microseconds (0 if the limiter was free). Guava returns seconds
  /// as a double; the limiter computes whole microseconds, so the value returned is exact.
  /// Thread-safe. Throws InvalidArgument if permits <= 0.
  /// In shadow mode (setMonitor) one attempt that never waits: tryAcquire(permits), and 0.
  std::chrono::microseconds acquire(std::int64_t permits = 1) {
    if (monitor_.shadow()) {
      (void)tryAcquire(permits);
      return std::chrono::microseconds{0};
    }
    const std::chrono::microseconds wait = reserve(permits);
    clock_.sleepFor(wait);
    return wait;
  }

  /// Takes `permits` now if the limiter is free, without waiting. Same as
  /// tryAcquire(permits, 0us). Thread-safe. Throws InvalidArgument if permits <= 0.
  [[nodiscard]] bool tryAcquire(std::int64_t permits = 1) { return tryAcquireMicros(permits, 0); }

  /// Same as tryAcquire(1, timeout), below.
  template <class Rep, class Period>
  [[nodiscard]] bool tryAcquire(std::chrono::duration<Rep, Period> timeout) {
    return tryAcquire(1, timeout);
  }

  /// Takes `permits` if the limiter's previous debt can be paid within `timeout` (Guava's rule:
  /// nextFree - timeout <= now), sleeping for that debt, and returns true; otherwise returns
  /// false at once and reserves nothing. Negative timeouts count as 0; timeouts too large for
  /// int64 microseconds are saturated. Thread-safe. Throws InvalidArgument if permits <= 0 or
  /// timeout is a NaN floating-point duration. In shadow mode (setMonitor) the timeout is 0 and a
  /// refusal returns true (counted, nothing reserved).
  template <class Rep, class Period>
  [[nodiscard]] bool tryAcquire(std::int64_t permits, std::chrono::duration<Rep, Period> timeout) {
    if constexpr (std::is_floating_point_v<Rep>) {
      if (std::isnan(static_cast<double>(timeout.count()))) {
        throw InvalidArgument("SmoothRateLimiter: timeout must not be NaN");
      }
    }
    return tryAcquireMicros(permits, saturatedMicros(timeout));
  }

  /// Takes `permits` without sleeping and returns how long the caller must wait before using
  /// them, in microseconds (0 if the limiter was free). The caller sleeps or schedules the work
  /// itself; the permits are taken whether or not it does. Thread-safe. Throws InvalidArgument
  /// if permits <= 0. Never refused, so shadow mode does not change it (counted as granted).
  [[nodiscard]] std::chrono::microseconds reserve(std::int64_t permits = 1) {
    checkPermits(permits);
    std::int64_t wait = 0;
    {
      const detail::LockGuard lock(mutex_);
      wait = reserveAndGetWait(permits, clock_.now().count());
    }
    (void)monitor_.admit(true, permits);
    return std::chrono::microseconds{wait};
  }

  /// Counts this limiter's decisions and applies shadow mode (LimiterMonitor::Options: a registry, shadow,
  /// onShadowDenial), e.g. setMonitor(LimiterMonitor("pacer", options)). Not thread-safe: call it
  /// before the limiter is shared. By default nothing is counted.
  void setMonitor(LimiterMonitor monitor) { monitor_ = std::move(monitor); }
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept { return monitor_; }

  /// Changes the stable rate (permits per second; +infinity means no limit). Time already owed
  /// is kept: the next request still pays the previous debt at the old rate. Stored permits are
  /// scaled to the new maximum, as in Guava. Thread-safe. Throws InvalidArgument if
  /// permitsPerSecond <= 0 or NaN.
  void setRate(double permitsPerSecond) {
    checkRate(permitsPerSecond);
    const detail::LockGuard lock(mutex_);
    resync(clock_.now().count());
    applyRate(permitsPerSecond);
  }

  /// The stable rate in permits per second, exactly as last set. Thread-safe.
  [[nodiscard]] double getRate() const {
    const detail::LockGuard lock(mutex_);
    return rate_;
  }

 private:
  static constexpr double kMicrosPerSecond = 1e6;
  static constexpr double kInfinity = std::numeric_limits<double>::infinity();
  static constexpr std::int64_t kMaxMicros = std::numeric_limits<std::int64_t>::max();
  static constexpr std::int64_t kMinMicros = std::numeric_limits<std::int64_t>::min();

  BasicSmoothRateLimiter(Clock clock, double permitsPerSecond, double maxBurstSeconds, double warmupMicros,
                         double coldFactor)
      : clock_(std::move(clock)),
        maxBurstSeconds_(maxBurstSeconds),
        warmupMicros_(warmupMicros),
        coldFactor_(coldFactor) {
    const detail::LockGuard lock(mutex_);  // uncontended: the analysis sees every write under it
    nextFreeMicros_ = clock_.now().count();
    applyRate(permitsPerSecond);
  }

  static void checkRate(double permitsPerSecond) {
    if (!(permitsPerSecond > 0.0)) {
      throw InvalidArgument("SmoothRateLimiter: permitsPerSecond must be > 0, got " + std::to_string(permitsPerSecond));
    }
  }

  static void checkPermits(std::int64_t permits) {
    if (permits <= 0) {
      throw InvalidArgument("SmoothRateLimiter: permits must be > 0, got " + std::to_string(permits));
    }
  }

  // Java's (long) cast: truncates toward zero, saturates, NaN -> 0.
  static std::int64_t saturatedMicros(double micros) noexcept {
    if (std::isnan(micros)) return 0;
    // 2^63 is exactly representable; every double below it fits in int64.
    if (micros >= 9223372036854775808.0) return kMaxMicros;
    if (micros <= -9223372036854775808.0) return kMinMicros;
    return static_cast<std::int64_t>(micros);
  }

  // Any std::chrono duration to whole microseconds, truncated toward zero and saturated.
  template <class Rep, class Period>
  static std::int64_t saturatedMicros(std::chrono::duration<Rep, Period> d) noexcept {
    if constexpr (std::is_floating_point_v<Rep>) {
      return saturatedMicros(std::chrono::duration<double, std::micro>(d).count());
    } else {
      using Ratio = std::ratio_divide<Period, std::micro>;
      if constexpr (std::numeric_limits<Rep>::digits > 63) {  // wider than int64
        if (d.count() > static_cast<Rep>(kMaxMicros)) return kMaxMicros;
        if constexpr (std::is_signed_v<Rep>) {
          if (d.count() < static_cast<Rep>(kMinMicros)) return kMinMicros;
        }
      }
      const auto count = static_cast<std::int64_t>(d.count());
      const std::int64_t num = Ratio::num;
      const std::int64_t den = Ratio::den;
      const std::int64_t whole = count / den;  // count = whole * den + rest
      const std::int64_t rest = count % den;
      if (whole > kMaxMicros / num) return kMaxMicros;
      if (whole < kMinMicros / num) return kMinMicros;
      return saturatedAdd(whole * num, rest * num / den);
    }
  }

  static std::int64_t saturatedAdd(std::int64_t a, std::int64_t b) noexcept {
    if (b > 0 && a > kMaxMicros - b) return kMaxMicros;
    if (b < 0 && a < kMinMicros - b) return kMinMicros;
    return a + b;
  }

  static std::int64_t saturatedSub(std::int64_t a, std::int64_t b) noexcept {
    if (b < 0 && a > kMaxMicros + b) return kMaxMicros;
    if (b > 0 && a < kMinMicros + b) return kMinMicros;
    return a - b;
  }

  // Fix 1: a zero warm-up period is not a warming-up limiter but bursty with maxBurstSeconds 0.
  [[nodiscard]] bool isWarmingUp() const noexcept { return warmupMicros_ > 0.0; }

  bool tryAcquireMicros(std::int64_t permits, std::int64_t timeoutMicros) {
    checkPermits(permits);
    timeoutMicros = monitor_.shadow() ? 0 : std::max<std::int64_t>(timeoutMicros, 0);
    std::int64_t wait = 0;
    std::int64_t refusedFor = -1;  // refused: until the limiter is free
    {
      const detail::LockGuard lock(mutex_);
      const std::int64_t now = clock_.now().count();
      if (saturatedSub(nextFreeMicros_, timeoutMicros) > now) {
        demandRefused_ = true;  // Fix 2; nothing is reserved.
        refusedFor = saturatedSub(nextFreeMicros_, now);
      } else {
        wait = reserveAndGetWait(permits, now);
      }
    }
    if (refusedFor >= 0) return monitor_.admit(false, permits, std::chrono::microseconds{refusedFor});
    (void)monitor_.admit(true, permits);
    clock_.sleepFor(std::chrono::microseconds{wait});
    return true;
  }

  // Reserves and returns how long the caller waits: until the previous nextFree.
  std::int64_t reserveAndGetWait(std::int64_t permits, std::int64_t now) REDLIMIT_REQUIRES(mutex_) {
    const std::int64_t momentAvailable = reserveEarliestAvailable(permits, now);
    return std::max<std::int64_t>(saturatedSub(momentAvailable, now), 0);
  }

  // Guava's reserveEarliestAvailable: returns the old nextFree.
  std::int64_t reserveEarliestAvailable(std::int64_t permits, std::int64_t now) REDLIMIT_REQUIRES(mutex_) {
    resync(now);
    const std::int64_t previousNextFree = nextFreeMicros_;
    const double requested = static_cast<double>(permits);
    const double storedToSpend = std::min(requested, storedPermits_);
    const double freshPermits = requested - storedToSpend;
    const std::int64_t freshMicros =
        freshPermits > 0.0 ? saturatedMicros(std::ceil(freshPermits * stableIntervalMicros_)) : 0;
    const std::int64_t waitMicros = saturatedAdd(storedPermitsToWaitTime(storedPermits_, storedToSpend), freshMicros);
    nextFreeMicros_ = saturatedAdd(nextFreeMicros_, waitMicros);
    storedPermits_ -= storedToSpend;
    demandRefused_ = false;
    return previousNextFree;
  }

  // Stores the permits earned while idle (now > nextFree) and moves nextFree to now.
  void resync(std::int64_t now) REDLIMIT_REQUIRES(mutex_) {
    if (now <= nextFreeMicros_) return;
    double idleMicros = static_cast<double>(now - nextFreeMicros_);
    if (demandRefused_ && isWarmingUp()) {
      // Fix 2: the refused caller's retry gap refills only up to the threshold.
      const double retryMicros = std::min(idleMicros, coldFactor_ * stableIntervalMicros_);
      if (storedPermits_ < thresholdPermits_) {
        storedPermits_ = std::min(thresholdPermits_, storedPermits_ + permitsEarned(retryMicros));
      }
      idleMicros -= retryMicros;
      if (idleMicros > 0.0) {
        storedPermits_ = std::min(maxPermits_, storedPermits_ + permitsEarned(idleMicros));
      }
    } else {
      storedPermits_ = std::min(maxPermits_, storedPermits_ + permitsEarned(idleMicros));
    }
    demandRefused_ = false;
    nextFreeMicros_ = now;
  }

  [[nodiscard]] double permitsEarned(double idleMicros) const noexcept REDLIMIT_REQUIRES(mutex_) {
    if (coolDownIntervalMicros_ == 0.0) return kInfinity;  // infinite rate
    return idleMicros / coolDownIntervalMicros_;
  }

  // Guava's doSetRate for both kinds.
  void applyRate(double permitsPerSecond) REDLIMIT_REQUIRES(mutex_) {
    const double oldMaxPermits = maxPermits_;
    rate_ = permitsPerSecond;
    const double s = kMicrosPerSecond / permitsPerSecond;  // 0 if infinite, +inf if tiny
    stableIntervalMicros_ = s;
    if (isWarmingUp()) {
      const double w = warmupMicros_;
      if (s == 0.0) {
        thresholdPermits_ = kInfinity;
        maxPermits_ = kInfinity;
        slope_ = 0.0;
        coolDownIntervalMicros_ = 0.0;
      } else {
        const double coldIntervalMicros = s * coldFactor_;
        thresholdPermits_ = 0.5 * w / s;
        maxPermits_ = thresholdPermits_ + 2.0 * w / (s + coldIntervalMicros);
        slope_ = maxPermits_ > thresholdPermits_ ? (coldIntervalMicros - s) / (maxPermits_ - thresholdPermits_) : 0.0;
        coolDownIntervalMicros_ = maxPermits_ > 0.0 ? w / maxPermits_ : kInfinity;
      }
      if (std::isinf(oldMaxPermits)) {
        storedPermits_ = 0.0;  // from no limit to a limit: warm
      } else if (oldMaxPermits == 0.0) {
        storedPermits_ = maxPermits_;  // initially cold
      } else {
        storedPermits_ = rescaledStoredPermits(oldMaxPermits);
      }
    } else {
      maxPermits_ = maxBurstSeconds_ == 0.0 ? 0.0 : maxBurstSeconds_ * permitsPerSecond;
      thresholdPermits_ = maxPermits_;
      slope_ = 0.0;
      coolDownIntervalMicros_ = s;
      if (std::isinf(oldMaxPermits)) {
        storedPermits_ = maxPermits_;  // from no limit to a limit: a full burst
      } else if (oldMaxPermits == 0.0) {
        storedPermits_ = 0.0;
      } else {
        storedPermits_ = rescaledStoredPermits(oldMaxPermits);
      }
    }
  }

  [[nodiscard]] double rescaledStoredPermits(double oldMaxPermits) const noexcept REDLIMIT_REQUIRES(mutex_) {
    if (std::isinf(maxPermits_)) return maxPermits_;  // no limit: permits are free anyway
    return storedPermits_ * maxPermits_ / oldMaxPermits;
  }

  // The cost of spending `permitsToTake` of `storedPermits` stored permits: free
  // for a bursty limiter; for a warming-up one, the area under permitsToTime() above the
  // threshold plus the stable interval for each permit below it.
  [[nodiscard]] std::int64_t storedPermitsToWaitTime(double storedPermits, double permitsToTake) const noexcept
      REDLIMIT_REQUIRES(mutex_) {
    if (!isWarmingUp() || stableIntervalMicros_ == 0.0) return 0;
    const double aboveThreshold = storedPermits - thresholdPermits_;
    std::int64_t micros = 0;
    if (aboveThreshold > 0.0) {
      const double takeAbove = std::min(aboveThreshold, permitsToTake);
      const double length = permitsToTime(aboveThreshold) + permitsToTime(aboveThreshold - takeAbove);
      micros = saturatedMicros(takeAbove * length / 2.0);
      permitsToTake -= takeAbove;
    }
    if (permitsToTake > 0.0) {
      micros = saturatedAdd(micros, saturatedMicros(stableIntervalMicros_ * permitsToTake));
    }
    return micros;
  }

  [[nodiscard]] double permitsToTime(double permits) const noexcept REDLIMIT_REQUIRES(mutex_) {
    return stableIntervalMicros_ + permits * slope_;
  }

  Clock clock_;
  LimiterMonitor monitor_;  // set before use (setMonitor), read-only after
  mutable detail::Mutex mutex_;
  const double maxBurstSeconds_;                   // bursty only
  const double warmupMicros_;                      // > 0 for a warming-up limiter, 0 for a bursty one
  const double coldFactor_;                        // warming-up only
  double rate_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;  // permits per second, as set
  double stableIntervalMicros_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;
  double maxPermits_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;
  double storedPermits_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;
  double thresholdPermits_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;
  double slope_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;  // microseconds per permit, per permit above the threshold
  double coolDownIntervalMicros_ REDLIMIT_GUARDED_BY(mutex_) = 0.0;
  std::int64_t nextFreeMicros_ REDLIMIT_GUARDED_BY(mutex_) = 0;  // clock time, microseconds
  bool demandRefused_ REDLIMIT_GUARDED_BY(mutex_) = false;       // a tryAcquire was refused since the last reservation
};

/// The smooth rate limiter on the steady clock with real sleeps.
using SmoothRateLimiter = BasicSmoothRateLimiter<SteadyClock>;

}  // namespace redlimit
