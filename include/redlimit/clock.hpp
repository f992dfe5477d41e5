// redlimit — clocks for the in-process algorithms.
//
// Local limiters take a clock policy so that tests drive time by hand instead of sleeping
// (abseil's Clock/SimulatedClock, Guava's fake stopwatch). A clock policy is any type with
//   std::chrono::microseconds now() const;          // monotonic, arbitrary epoch
//   void sleepFor(std::chrono::microseconds) const; // blocks (or, in tests, advances time)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

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

 private:
  const Clock* clock_;
};

}  // namespace redlimit
