// redlimit — clocks for the in-process algorithms.
//
// Local limiters take a clock policy so that tests drive time by hand instead of sleeping
// (abseil's Clock/SimulatedClock, Guava's fake stopwatch). A clock policy is any type with
//   std::chrono::microseconds now() const;          // monotonic, arbitrary epoch
//   void sleepFor(std::chrono::microseconds) const; // blocks (or, in tests, advances time)
// and optionally
//   std::chrono::microseconds maxLag() const;        // how far now() may trail the true time
//   bool waitUntil(std::unique_lock<std::mutex>&, std::condition_variable&,
//                  std::chrono::microseconds deadline, Pred) const;  // a timed wait on this clock
// maxLag() is subtracted from deadlines that must not be outlived (see CoarseSteadyClock).
// Every timed wait of the local algorithms goes through clockWaitUntil(), which uses the
// policy's waitUntil() if it has one (SimulatedClock) and a real-time wait otherwise.
//
// Non-template code (the failure gate) holds a clock as a ClockView: a policy behind a pointer.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <ctime>

#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit {

/// The default clock: std::chrono::steady_clock and a real sleep. Thread-safe.
struct SteadyClock {
  [[nodiscard]] std::chrono::microseconds now() const noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch());
  }
  void sleepFor(std::chrono::microseconds d) const {
    if (d.count() > 0) std::this_thread::sleep_for(d);
  }
};

/// CLOCK_MONOTONIC_COARSE (Linux): the time of the last timekeeping tick, read from the vDSO at a
/// fraction of what steady_clock costs (bench_segment measures both), but behind the true time. For hot paths that compare against a deadline: subtract maxLag()
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
      return std::chrono::microseconds{3 *
                                       (static_cast<std::int64_t>(res.tv_sec) * 1000000 + (res.tv_nsec + 999) / 1000)};
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
struct AlwaysFalse {
  bool operator()() const noexcept { return false; }
};
template <class Clock, class = void>
struct HasWaitUntil : std::false_type {};
template <class Clock>
struct HasWaitUntil<Clock, std::void_t<decltype(bool(std::declval<const Clock&>().waitUntil(
                               std::declval<std::unique_lock<std::mutex>&>(), std::declval<std::condition_variable&>(),
                               std::chrono::microseconds{}, AlwaysFalse{})))>> : std::true_type {};
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

/// Waits on `cv` (with `lk` held, as std::condition_variable::wait) until `pred()` holds or
/// `clock.now()` reaches `deadline` (µs on that clock); returns pred(). Uses the policy's
/// waitUntil() if it has one (SimulatedClock: the wait ends when the test advances time past the
/// deadline), else waits in real time for the time the clock has left until the deadline.
template <class Clock, class Pred>
bool clockWaitUntil(const Clock& clock, std::unique_lock<std::mutex>& lk, std::condition_variable& cv,
                    std::chrono::microseconds deadline, Pred pred) {
  if constexpr (detail::HasWaitUntil<Clock>::value) {
    return clock.waitUntil(lk, cv, deadline, std::move(pred));
  } else {
    // The clock's time left, waited in real time from now: the same wait for SteadyClock, and one
    // that ends for a ManualClock nobody advances.
    const std::chrono::microseconds left = deadline - clock.now();
    if (left.count() <= 0) return pred();
    return cv.wait_until(lk, std::chrono::steady_clock::now() + left, std::move(pred));
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

/// A clock for tests of code that sleeps and waits (abseil's SimulatedClock): time moves only when
/// the test calls advance(). sleepFor() and timed waits (waitUntil, through clockWaitUntil) block
/// until the time they wait for is reached; advance() wakes them in deadline order, one deadline
/// at a time, each woken thread having left its wait before the next deadline is reached. So a
/// test can have several threads sleep and wake them in order without a real sleep or a polling
/// loop: awaitBlocked(n) returns once n threads are blocked on the clock.
///
/// Thread-safe. A waiter must not hold a mutex that another waiter's wake needs (as with any
/// condition variable); advance() waits for each woken thread to leave its wait.
class SimulatedClock {
 public:
  explicit SimulatedClock(std::chrono::microseconds start = std::chrono::microseconds{0}) noexcept
      : now_(start.count()) {}
  SimulatedClock(const SimulatedClock&) = delete;
  SimulatedClock& operator=(const SimulatedClock&) = delete;

  [[nodiscard]] std::chrono::microseconds now() const {
    detail::LockGuard g(mutex_);
    return std::chrono::microseconds{now_};
  }

  /// Blocks until advance() brings the time to now() + d (returns at once if d <= 0).
  void sleepFor(std::chrono::microseconds d) const {
    if (d.count() <= 0) return;
    std::condition_variable own;
    detail::UniqueLock g(mutex_);
    Waiter w{now_ + d.count(), &own};
    enlist(w);
    own.wait(g.native(), [&] { return w.fired; });
    leave(w);
  }

  /// As std::condition_variable::wait_until on this clock: waits on `cv` (with `lk` held) until
  /// pred() holds or advance() reaches `deadline`; returns pred(). Wakes by cv.notify_*() as usual.
  template <class Pred>
  bool waitUntil(std::unique_lock<std::mutex>& lk, std::condition_variable& cv, std::chrono::microseconds deadline,
                 Pred pred) const {
    if (pred()) return true;
    Waiter w{deadline.count(), &cv};
    {
      detail::LockGuard g(mutex_);
      if (now_ >= w.deadline) return pred();
      enlist(w);
    }
    for (;;) {
      if (pred()) break;
      {
        detail::LockGuard g(mutex_);
        if (w.fired) break;
      }
      cv.wait(lk);
    }
    {
      detail::LockGuard g(mutex_);
      leave(w);
    }
    return pred();
  }

  /// Moves the time forward by d (nothing if d <= 0), waking the sleepers and waiters it passes.
  void advance(std::chrono::microseconds d) {
    if (d.count() > 0) advanceTo(std::chrono::microseconds{now() + d});
  }

  /// Moves the time to t (nothing if t <= now()): for each deadline up to t in order, sets the
  /// time to it, wakes the threads waiting for it and waits until they have left their waits.
  void advanceTo(std::chrono::microseconds t) {
    detail::UniqueLock g(mutex_);
    for (;;) {
      std::int64_t next = t.count();
      for (const Waiter* w : waiters_) {
        if (!w->fired) next = std::min(next, w->deadline);
      }
      now_ = std::max(now_, next);
      bool woke = false;
      for (Waiter* w : waiters_) {
        if (!w->fired && w->deadline <= now_) w->fired = woke = true;
      }
      // A waiter on someone else's condition variable checks `fired` outside its own lock, so a
      // single notification can fall between its check and its wait: notify until it has left.
      while (std::any_of(waiters_.begin(), waiters_.end(), [](const Waiter* w) { return w->fired; })) {
        for (Waiter* w : waiters_) {
          if (w->fired) w->cv->notify_all();
        }
        changed_.wait_for(g.native(), std::chrono::microseconds{200});
      }
      if (!woke || now_ >= t.count()) break;
    }
    changed_.notify_all();
  }

  /// Threads blocked on this clock now (in sleepFor or waitUntil).
  [[nodiscard]] std::size_t blocked() const {
    detail::LockGuard g(mutex_);
    return waiters_.size();
  }

  /// Waits (in real time, at most `bound`) until at least n threads are blocked on this clock;
  /// returns whether they are. For tests: "the other threads are waiting now", without polling.
  [[nodiscard]] bool awaitBlocked(std::size_t n, std::chrono::milliseconds bound = std::chrono::seconds(30)) const {
    detail::UniqueLock g(mutex_);
    return changed_.wait_for(g.native(), bound, [&] {
      mutex_.assertHeld();
      return waiters_.size() >= n;
    });
  }

 private:
  struct Waiter {
    std::int64_t deadline;
    std::condition_variable* cv;
    bool fired = false;
  };
  void enlist(Waiter& w) const REDLIMIT_REQUIRES(mutex_) {
    waiters_.push_back(&w);
    changed_.notify_all();
  }
  void leave(Waiter& w) const REDLIMIT_REQUIRES(mutex_) {
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &w));
    changed_.notify_all();
  }

  mutable detail::Mutex mutex_;
  mutable std::condition_variable changed_;                           // a waiter arrived or left
  mutable std::vector<Waiter*> waiters_ REDLIMIT_GUARDED_BY(mutex_);  // blocked threads' waits, in arrival order
  std::int64_t now_ REDLIMIT_GUARDED_BY(mutex_);
};

/// A clock policy that refers to a clock owned elsewhere, so a test can keep a ManualClock or a
/// SimulatedClock and hand the limiter a reference to it. Thread-safe if Clock is.
template <class Clock>
class ClockRef {
 public:
  explicit ClockRef(const Clock& clock) noexcept : clock_(&clock) {}
  [[nodiscard]] std::chrono::microseconds now() const { return clock_->now(); }
  void sleepFor(std::chrono::microseconds d) const { clock_->sleepFor(d); }
  [[nodiscard]] std::chrono::microseconds maxLag() const { return clockMaxLag(*clock_); }
  template <class Pred>
  bool waitUntil(std::unique_lock<std::mutex>& lk, std::condition_variable& cv, std::chrono::microseconds deadline,
                 Pred pred) const {
    return clockWaitUntil(*clock_, lk, cv, deadline, std::move(pred));
  }

 private:
  const Clock* clock_;
};

/// A clock policy behind a pointer, for code that is not a template over its clock (the failure
/// gate). Refers to a clock owned elsewhere, which must outlive the view; the default view reads
/// SteadyClock. Thread-safe if the clock is. Timed waits through a view are not offered: code that
/// waits is a template over its clock.
class ClockView {
 public:
  /// A view of SteadyClock.
  ClockView() noexcept = default;
  /// A view of `clock` (SteadyClock, CoarseSteadyClock, ManualClock, SimulatedClock, ...).
  template <class Clock, class = std::enable_if_t<!std::is_same_v<std::decay_t<Clock>, ClockView>>>
  explicit ClockView(const Clock& clock) noexcept
      : clock_(&clock),
        now_([](const void* c) { return static_cast<const Clock*>(c)->now(); }),
        sleep_([](const void* c, std::chrono::microseconds d) { static_cast<const Clock*>(c)->sleepFor(d); }),
        lag_([](const void* c) { return clockMaxLag(*static_cast<const Clock*>(c)); }) {}

  [[nodiscard]] std::chrono::microseconds now() const { return now_(clock_); }
  void sleepFor(std::chrono::microseconds d) const { sleep_(clock_, d); }
  [[nodiscard]] std::chrono::microseconds maxLag() const { return lag_(clock_); }

 private:
  const void* clock_ = nullptr;
  std::chrono::microseconds (*now_)(const void*) = [](const void*) { return SteadyClock{}.now(); };
  void (*sleep_)(const void*, std::chrono::microseconds) = [](const void*, std::chrono::microseconds d) {
    SteadyClock{}.sleepFor(d);
  };
  std::chrono::microseconds (*lag_)(const void*) = [](const void*) { return std::chrono::microseconds{0}; };
};

}  // namespace redlimit
