// redlimit — clocks for the in-process algorithms.
//
// Local limiters take a clock policy so that tests drive time by hand instead of sleeping
// (abseil's Clock/SimulatedClock, Guava's fake stopwatch). A clock policy is any type with
//   std::chrono::microseconds now() const;          // monotonic, arbitrary epoch
//   void sleepFor(std::chrono::microseconds) const; // blocks (or, in tests, advances time)
// and optionally
//   std::chrono::microseconds maxLag() const;        // how far now() may trail the true time
// which limiters that must not outlive a deadline subtract from it (see CoarseSteadyClock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <type_traits>

#include <time.h>

namespace redlimit {

/// The default clock: std::chrono::steady_clock and a real sleep. Thread-safe.
struct SteadyClock {
  [[nodiscard]] std::chrono::microseconds now() const noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now().time_since_epoch());
  }
  void sleepFor(std::chrono::microseconds d) const {
    if (d.count() > 0) std::this_thread::sleep_for(d);
  }
};

/// CLOCK_MONOTONIC_COARSE (Linux): the time of the last timekeeping tick, read from the vDSO in
/// about a fifth of what steady_clock costs (11 ns against 52 ns on the 2-core development VM),
/// but behind the true time. For hot paths that compare against a deadline: subtract maxLag()
/// from the deadline. maxLag() is three ticks (12 ms at HZ=250, from clock_getres): not a proof,
/// a measured bound with margin: the tick that updates this clock can come late, and on the
/// development VM the lag reached 6.3 ms (one tick is 4 ms) in 120 million reads under load.
/// Use SteadyClock where a deadline must hold exactly. Elsewhere than Linux it falls back to
/// steady_clock with no lag. Thread-safe.
struct CoarseSteadyClock {
  [[nodiscard]] std::chrono::microseconds now() const noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return std::chrono::microseconds{static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000};
#else
    return SteadyClock{}.now();
#endif
  }
  void sleepFor(std::chrono::microseconds d) const {
    if (d.count() > 0) std::this_thread::sleep_for(d);
  }
  /// Three ticks of the coarse clock (see the class comment), rounded up to whole µs.
  [[nodiscard]] std::chrono::microseconds maxLag() const noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
    static const std::chrono::microseconds lag = [] {
      timespec res{};
      if (::clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0) return std::chrono::microseconds{10000};
      return std::chrono::microseconds{3 * (static_cast<std::int64_t>(res.tv_sec) * 1000000 + (res.tv_nsec + 999) / 1000)};
    }();
    return lag;
#else
    return std::chrono::microseconds{0};
#endif
  }
};

namespace detail {
template <class Clock, class = void>
struct HasMaxLag : std::false_type {};
template <class Clock>
struct HasMaxLag<Clock, std::void_t<decltype(std::declval<const Clock&>().maxLag())>> : std::true_type {};
}  // namespace detail

/// How far `clock.now()` may trail the true time: clock.maxLag() if the policy declares it, else 0.
template <class Clock>
[[nodiscard]] std::chrono::microseconds clockMaxLag(const Clock& clock) {
  if constexpr (detail::HasMaxLag<Clock>::value) {
    return clock.maxLag();
  } else {
    (void)clock;
    return std::chrono::microseconds{0};
  }
}

/// A clock that moves only when told to. sleepFor() advances it instead of blocking, like
/// Guava's FakeStopwatch, so a limiter's own sleeps show up as elapsed time. Thread-safe.
/// Memory ordering: relaxed; the clock orders nothing but itself.
class ManualClock {
 public:
  explicit ManualClock(std::chrono::microseconds start = std::chrono::microseconds{0}) noexcept
      : nowMicros_(start.count()) {}

  [[nodiscard]] std::chrono::microseconds now() const noexcept {
    return std::chrono::microseconds{nowMicros_.load(std::memory_order_relaxed)};
  }
  /// Advances the clock by d (ignored if d <= 0).
  void sleepFor(std::chrono::microseconds d) const noexcept {
    if (d.count() > 0) nowMicros_.fetch_add(d.count(), std::memory_order_relaxed);
  }
  /// Advances the clock by d (ignored if d <= 0).
  void advance(std::chrono::microseconds d) noexcept { sleepFor(d); }

 private:
  mutable std::atomic<std::int64_t> nowMicros_;
};

/// A clock policy that refers to a clock owned elsewhere, so a test can keep a ManualClock and
/// hand the limiter a reference to it. Thread-safe if Clock is.
template <class Clock>
class ClockRef {
 public:
  explicit ClockRef(const Clock& clock) noexcept : clock_(&clock) {}
  [[nodiscard]] std::chrono::microseconds now() const { return clock_->now(); }
  void sleepFor(std::chrono::microseconds d) const { clock_->sleepFor(d); }
  [[nodiscard]] std::chrono::microseconds maxLag() const { return clockMaxLag(*clock_); }

 private:
  const Clock* clock_;
};

}  // namespace redlimit
