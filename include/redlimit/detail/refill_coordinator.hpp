// The segment cache's refill coordinator: which thread leads (a refill, a reconfigure, close), the
// give-back in flight, closing, and the denial a leader's refill brought back, shared with the
// threads that waited for it. It owns the slow path's mutex; SegmentedRateLimiter keeps its own
// slow-path counters under the same mutex (mutex()) and the packed word outside it
// (detail::SegmentWord).
//
// One leader at a time: a thread that finds the segment short either takes the lead (tryLead)
// and asks the source, or waits for the leader (awaitLeader) and then tries the segment again.
// A waiter whose request the leader's denied refill already covered (a denial for as many
// permits or fewer, after it began waiting) takes that denial instead of asking again
// (sharedDenial): one round trip answers them all.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <new>
#include <optional>

#include "redlimit/clock.hpp"
#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

class RefillCoordinator {
 public:
  /// The slow path's mutex: every member function but mutex() needs it held.
  [[nodiscard]] Mutex& mutex() const REDLIMIT_RETURN_CAPABILITY(mutex_) { return mutex_; }

  [[nodiscard]] bool closed() const REDLIMIT_REQUIRES(mutex_) { return closed_; }
  [[nodiscard]] bool leading() const REDLIMIT_REQUIRES(mutex_) { return leading_; }
  /// A leader or a give-back is in flight.
  [[nodiscard]] bool busy() const REDLIMIT_REQUIRES(mutex_) { return leading_ || releasing_; }

  /// Takes the leader role if no thread holds it; true if taken.
  bool tryLead() REDLIMIT_REQUIRES(mutex_) {
    if (leading_) return false;
    leading_ = true;
    return true;
  }
  /// Waits until neither a leader nor a give-back is in flight, then takes the leader role; false
  /// (without it) if the limiter is or gets closed, unless `evenIfClosed` (close() itself).
  bool leadWhenIdle(UniqueLock& lk, bool evenIfClosed = false) REDLIMIT_REQUIRES(mutex_) {
    cv_.wait(lk.native(), [&] {
      mutex_.assertHeld();
      return !busy() || (closed_ && !evenIfClosed);
    });
    if (closed_ && !evenIfClosed) return false;
    leading_ = true;
    return true;
  }
  /// Ends the leader role and wakes the waiters.
  void endLead() REDLIMIT_REQUIRES(mutex_) {
    leading_ = false;
    cv_.notify_all();
  }

  /// Waits (on `clock`, until `deadline` µs) for the leader to finish or the limiter to close.
  /// False if the deadline came first. Counts the wait once per call of countWait().
  template <class Clock>
  bool awaitLeader(const Clock& clock, UniqueLock& lk, std::chrono::microseconds deadline) REDLIMIT_REQUIRES(mutex_) {
    return clockWaitUntil(clock, lk.native(), cv_, deadline, [&] {
      mutex_.assertHeld();
      return !leading_ || closed_;
    });
  }
  /// A thread began waiting for a leader's refill (SegmentStats::refillWaits).
  void countWait() REDLIMIT_REQUIRES(mutex_) { ++refillWaits_; }
  [[nodiscard]] std::int64_t refillWaits() const REDLIMIT_REQUIRES(mutex_) { return refillWaits_; }

  /// Refill attempts completed so far: a waiter notes it before waiting (for sharedDenial).
  [[nodiscard]] std::uint64_t attempts() const REDLIMIT_REQUIRES(mutex_) { return attempts_; }
  /// The leader's refill came back granted.
  void recordGrant() REDLIMIT_REQUIRES(mutex_) {
    ++attempts_;
    lastDenied_ = false;
  }
  /// The leader's refill for `permits` came back denied, to retry after `wait`.
  void recordDenial(std::int64_t permits, std::chrono::microseconds wait) REDLIMIT_REQUIRES(mutex_) {
    ++attempts_;
    lastDenied_ = true;
    lastDeniedPermits_ = permits;
    lastWait_ = wait;
  }
  /// The retry-after of a denied refill completed since `seenAttempts` that asked for `permits`
  /// or fewer (so it covers this request too), if the last one was such.
  [[nodiscard]] std::optional<std::chrono::microseconds> sharedDenial(std::uint64_t seenAttempts,
                                                                      std::int64_t permits) const
      REDLIMIT_REQUIRES(mutex_) {
    if (attempts_ != seenAttempts && lastDenied_ && permits >= lastDeniedPermits_) return lastWait_;
    return std::nullopt;
  }

  /// A give-back begins (at most one at a time: busy() is false before it).
  void beginRelease() REDLIMIT_REQUIRES(mutex_) { releasing_ = true; }
  /// The give-back returned: wakes close() and reconfigure(), which wait for it.
  void endRelease() REDLIMIT_REQUIRES(mutex_) {
    releasing_ = false;
    cv_.notify_all();
  }

  /// Marks the limiter closed and wakes every waiter; false if it already was.
  bool close() REDLIMIT_REQUIRES(mutex_) {
    if (closed_) return false;
    closed_ = true;
    cv_.notify_all();
    return true;
  }

  /// In a fork() child: replaces `c` by a fresh coordinator in the same storage, closed if `c`
  /// was. The inherited one is leaked in place: its mutex may be held, and its leader or
  /// give-back in flight is a parent thread that does not exist here, so it is never locked,
  /// waited on or destroyed (its destructor does not run; nothing depends on it). The caller
  /// guarantees that no other thread uses `c` meanwhile (SegmentedRateLimiter's renewal claim).
  /// Never throws.
  static void renewInPlace(RefillCoordinator& c) noexcept REDLIMIT_NO_THREAD_SAFETY_ANALYSIS {
    const bool wasClosed = c.closed_;  // the parent's memory as it was at fork(): read, not locked
    RefillCoordinator* fresh = ::new (static_cast<void*>(&c)) RefillCoordinator();
    fresh->closed_ = wasClosed;
  }

 private:
  mutable Mutex mutex_;
  std::condition_variable cv_;                          // a lead or a give-back ended, or closed
  bool leading_ REDLIMIT_GUARDED_BY(mutex_) = false;    // a thread holds the leader role
  bool releasing_ REDLIMIT_GUARDED_BY(mutex_) = false;  // a give-back is in flight (at most one)
  bool closed_ REDLIMIT_GUARDED_BY(mutex_) = false;
  std::uint64_t attempts_ REDLIMIT_GUARDED_BY(mutex_) = 0;  // refill attempts completed
  bool lastDenied_ REDLIMIT_GUARDED_BY(mutex_) = false;     // outcome of the last attempt
  std::int64_t lastDeniedPermits_ REDLIMIT_GUARDED_BY(mutex_) = 0;
  std::chrono::microseconds lastWait_ REDLIMIT_GUARDED_BY(mutex_){0};
  std::int64_t refillWaits_ REDLIMIT_GUARDED_BY(mutex_) = 0;
};

}  // namespace redlimit::detail
