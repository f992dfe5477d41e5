// redlimit — LocalTokenBucket: an in-process token bucket, exact in integer arithmetic.
//
// The bucket holds up to `capacity` permits and refills `refillPermits` every `refillInterval`,
// continuously: one permit every refillInterval / refillPermits, with no rounding that
// accumulates (the same definition as a Limiter's Policy::tokenBucket). In any window of
// length T it grants at most capacity + refillPermits x T / refillInterval permits.
//
// Design choices:
//  * State is one number, the time at which the bucket is full again (as GCRA and as
//    lua/gcra.lua keep it), held in units of 1 / refillPermits µs, so every refill is an exact
//    integer: a permit costs refillInterval-in-µs units. The arithmetic is 128-bit (GCC/clang
//    __int128): no bound on capacity x interval beyond the argument limits below.
//  * Time comes from a clock policy (clock.hpp); tests drive SimulatedClock or ManualClock.
//  * A mutex guards the state (folly's TokenBucket is lock-free over a double; an exact
//    integer state is two words). Not for a hot path that needs lock-freedom: that is what the
//    segment cache's word is for.
//  * tryAcquire(permits, timeout) may take permits ahead of time (the bucket goes into debt)
//    when the wait fits in the timeout, then sleeps that wait on the clock, like
//    Policy::tokenBucket and Guava's tryAcquire(permits, timeout).
//  * A request for more than `capacity` permits can never be granted: it returns false (and
//    waitFor() answers microseconds::max()).
//
// Used by the failure gate's FailurePolicy::Local and available to users. Needs nothing from
// Redis: part of the header-only redlimit::local target. Metrics and shadow mode: setMonitor().
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <utility>

#include "redlimit/clock.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit {

namespace detail {
__extension__ using Int128 = __int128;  // GCC and clang; -Wpedantic-clean with __extension__
}  // namespace detail

/// An in-process token bucket (see the file comment). Thread-safe. Errors: InvalidArgument for
/// bad arguments, nothing else.
template <class Clock = SteadyClock>
class BasicLocalTokenBucket {
 public:
  static constexpr std::int64_t kMaxPermits = 4294967295;  // capacity and refillPermits, as Policy::tokenBucket
  static constexpr std::chrono::microseconds kMaxInterval{std::int64_t{1} << 52};  // about 142 years

  /// A full bucket of `capacity` permits refilled with `refillPermits` per `refillInterval`.
  /// Throws InvalidArgument unless capacity and refillPermits are in 1..kMaxPermits and
  /// refillInterval in 1 µs..kMaxInterval.
  BasicLocalTokenBucket(std::int64_t capacity, std::int64_t refillPermits, std::chrono::microseconds refillInterval,
                        Clock clock = Clock{})
      : clock_(std::move(clock)),
        capacity_(capacity),
        refillPermits_(refillPermits),
        intervalMicros_(refillInterval.count()) {
    checkRange("capacity", capacity, 1, kMaxPermits);
    checkRange("refillPermits", refillPermits, 1, kMaxPermits);
    checkRange("refillInterval (µs)", refillInterval.count(), 1, kMaxInterval.count());
    fullAt_ = scaled(clock_.now());
  }

  /// Takes `permits` (1..kMaxPermits) if the bucket holds them now.
  [[nodiscard]] bool tryAcquire(std::int64_t permits = 1) { return tryAcquire(permits, std::chrono::microseconds{0}); }

  /// Takes `permits` if they are available within `timeout`: taken at once, ahead of time if need
  /// be, then the wait is slept on the clock. False at once, taking nothing, if the wait is longer
  /// or permits > capacity. timeout <= 0 means now only. Counted by the monitor; in shadow mode
  /// one attempt that never waits, and a denial returns true.
  [[nodiscard]] bool tryAcquire(std::int64_t permits, std::chrono::microseconds timeout) {
    checkRange("permits", permits, 1, kMaxPermits);
    if (permits > capacity_) return monitor_.admit(false, permits);
    if (monitor_.shadow()) timeout = std::chrono::microseconds{0};
    bool granted = false;
    std::int64_t waitMicros = 0;  // granted: to sleep; denied: until it would be granted
    {
      detail::LockGuard g(mutex_);
      const detail::Int128 now = scaled(clock_.now());
      const detail::Int128 next = std::max(fullAt_, now) + detail::Int128{permits} * intervalMicros_;
      const detail::Int128 debt = next - now - detail::Int128{capacity_} * intervalMicros_;
      const detail::Int128 allowed = detail::Int128{std::max<std::int64_t>(timeout.count(), 0)} * refillPermits_;
      granted = debt <= allowed;
      if (granted) fullAt_ = next;
      if (debt > 0) waitMicros = static_cast<std::int64_t>(ceilDiv(debt, refillPermits_));
    }
    if (!granted) return monitor_.admit(false, permits, std::chrono::microseconds{waitMicros});
    (void)monitor_.admit(true, permits);
    if (waitMicros > 0) clock_.sleepFor(std::chrono::microseconds{waitMicros});
    return true;
  }

  /// Counts this bucket's decisions and applies shadow mode (LimiterMonitor::Options: a registry, shadow,
  /// onShadowDenial), e.g. setMonitor(LimiterMonitor("local:api", options)). Not thread-safe: call
  /// it before the bucket is shared. By default nothing is counted.
  void setMonitor(LimiterMonitor monitor) { monitor_ = std::move(monitor); }
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept { return monitor_; }

  /// Permits the bucket holds now (0 while it is in debt).
  [[nodiscard]] std::int64_t availablePermits() const {
    detail::LockGuard g(mutex_);
    const detail::Int128 now = scaled(clock_.now());
    const detail::Int128 room = detail::Int128{capacity_} * intervalMicros_ - (std::max(fullAt_, now) - now);
    return room <= 0 ? 0 : static_cast<std::int64_t>(room / intervalMicros_);
  }

  /// How long until `permits` (1..kMaxPermits) are available: 0 if now, microseconds::max() if
  /// permits > capacity (never).
  [[nodiscard]] std::chrono::microseconds waitFor(std::int64_t permits) const {
    checkRange("permits", permits, 1, kMaxPermits);
    if (permits > capacity_) return std::chrono::microseconds::max();
    detail::LockGuard g(mutex_);
    const detail::Int128 now = scaled(clock_.now());
    const detail::Int128 debt = std::max(fullAt_, now) + detail::Int128{permits} * intervalMicros_ - now -
                                detail::Int128{capacity_} * intervalMicros_;
    return std::chrono::microseconds{debt <= 0 ? 0 : static_cast<std::int64_t>(ceilDiv(debt, refillPermits_))};
  }

  /// Sets the permits held now to `permits` (0..capacity), as if the bucket had been drained or
  /// filled to that level.
  void setAvailablePermits(std::int64_t permits) {
    checkRange("permits", permits, 0, capacity_);
    detail::LockGuard g(mutex_);
    fullAt_ = scaled(clock_.now()) + detail::Int128{capacity_ - permits} * intervalMicros_;
  }

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t refillPermits() const noexcept { return refillPermits_; }
  [[nodiscard]] std::chrono::microseconds refillInterval() const noexcept {
    return std::chrono::microseconds{intervalMicros_};
  }

 private:
  static void checkRange(const char* what, std::int64_t value, std::int64_t lo, std::int64_t hi) {
    if (value < lo || value > hi) {
      throw InvalidArgument(std::string("redlimit: LocalTokenBucket ") + what + " must be in " + std::to_string(lo) +
                            ".." + std::to_string(hi) + ", got " + std::to_string(value));
    }
  }
  // A clock reading in units of 1 / refillPermits µs.
  detail::Int128 scaled(std::chrono::microseconds t) const noexcept {
    return detail::Int128{t.count()} * refillPermits_;
  }
  static detail::Int128 ceilDiv(detail::Int128 a, std::int64_t b) noexcept { return (a + b - 1) / b; }

  const Clock clock_;
  const std::int64_t capacity_;
  const std::int64_t refillPermits_;
  const std::int64_t intervalMicros_;
  LimiterMonitor monitor_;  // set before use (setMonitor), read-only after
  mutable detail::Mutex mutex_;
  detail::Int128 fullAt_ REDLIMIT_GUARDED_BY(mutex_) = 0;  // when the bucket is full again, scaled()
};

/// The bucket on the real clock (SteadyClock).
using LocalTokenBucket = BasicLocalTokenBucket<SteadyClock>;

}  // namespace redlimit
