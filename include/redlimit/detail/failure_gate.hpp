// redlimit — the circuit a distributed limiter's calls pass through: tracks whether Redis is
// reachable, lets one probe per interval through while it is not, and makes the policy's decision.
// It also tracks configuration errors (ConfigurationError, AuthError), which it reports but never
// decides or gates: every call goes on to Redis and throws until the set-up works.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "redlimit/clock.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/local_token_bucket.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit::detail {

/// Thread-safe. Memory ordering: the health state and probe time are relaxed atomics (a stale
/// read only sends one extra probe or decides one extra call locally); transitions use exchange
/// so each event fires once.
///
/// States: Healthy; Outage (an IoError: one probe per interval, the others decided by the
/// policy); Misconfigured (a configuration error: no gating, nothing decided). A failure of
/// another cause moves between the two and reports Degraded again with the new cause; the first
/// success reports Recovered once, with the cause that ended.
class FailureGate {
 public:
  /// Throws InvalidArgument for a bad share, probe interval or Local seed. `clock` (default SteadyClock) times
  /// the probes, the outage's length, the calls' latency and the Local policy's bucket; tests pass
  /// a ManualClock's. `monitor` counts what the gate sees (round trips and their latency, errors,
  /// the policy's decisions, the degraded state) and publishes its health events.
  FailureGate(std::string limiter, FailureOptions options, ClockView clock = ClockView{},
              LimiterMonitor monitor = LimiterMonitor{});
  ~FailureGate();
  FailureGate(const FailureGate&) = delete;
  FailureGate& operator=(const FailureGate&) = delete;

  /// True if this call should go to Redis: always, except during an outage, when one caller per
  /// probe interval goes.
  [[nodiscard]] bool shouldTry();
  /// The call reached Redis and ran: leaves an outage or misconfiguration (reporting Recovered once).
  void succeeded();
  /// succeeded() for a deciding call that started at `startedAt` (callStart()): also counts its
  /// latency (the limiter counts its requests, LimiterMetrics::roundTrip).
  void answered(std::int64_t startedAt);
  /// When a call starts, for failed(): µs on the gate's clock.
  [[nodiscard]] std::int64_t callStart() const { return nowMicros(); }
  /// The call that started at `startedAt` could not reach Redis: enters degraded mode (reporting
  /// Degraded once) and schedules the next probe. A call that started before the last recovery
  /// reports stale news (it was sent while the server was still coming back, e.g. answered
  /// LOADING after another call already succeeded) and does not degrade the gate again.
  void failed(const IoError& error, std::int64_t startedAt);
  /// The call that started at `startedAt` failed with a configuration error (ConfigurationError,
  /// AuthError): reports Degraded with HealthEvent::Cause::Configuration once, and gates nothing.
  /// Stale news is ignored as in failed().
  void misconfigured(const Error& error, std::int64_t startedAt);
  /// Records the outcome of the call that started at `startedAt` and failed with `error` (looked
  /// at in place, without rethrowing it): a TimeoutError of kind PoolTimeout or CallbackBlocked
  /// (every connection busy: congestion in this process) changes nothing; another IoError is
  /// failed(); ConfigurationError and AuthError are misconfigured(); any other redlimit::Error
  /// means Redis answered: succeeded(); anything else changes nothing. The one place that says
  /// what each error means for a limiter's health.
  void noteError(const std::exception_ptr& error, std::int64_t startedAt);
  /// The policy's decision for `permits` while Redis cannot be asked, counted in stats().
  /// `rate`/`interval` are the last configuration seen (0 if never seen; Local then uses
  /// FailureOptions::localSeedRate/localSeedInterval, and refuses without a seed).
  /// nullopt under FailurePolicy::Throw: the caller rethrows its error, or throwUnavailable().
  [[nodiscard]] std::optional<bool> decide(std::int64_t permits, std::int64_t rate, std::chrono::milliseconds interval);
  /// The end of a guarded call that started at `startedAt` and failed with `error`: records it
  /// (as noteError, and its latency and error kind), then returns the policy's decision for `permits` if the failure was an outage
  /// (an IoError), or nullopt if the caller must throw `error`: any other error, or an outage under
  /// FailurePolicy::Throw. The one classification of a decision's outcome, for sync calls (from a
  /// catch block) and for completions of async ones alike. `rate`/`interval` as for decide().
  [[nodiscard]] std::optional<bool> settle(const std::exception_ptr& error, std::int64_t startedAt,
                                           std::int64_t permits, std::int64_t rate, std::chrono::milliseconds interval);
  /// Throws the IoError for a call that was not sent because the limiter is degraded.
  [[noreturn]] void throwUnavailable() const;
  [[nodiscard]] FailureStats stats() const;
  [[nodiscard]] const FailureOptions& options() const noexcept { return options_; }
  /// The limiter's name, as its events give it.
  [[nodiscard]] const std::string& limiter() const noexcept { return limiter_; }
  /// The limiter's clock: the gate's probe timing and the limiter's own retry sleeps read it.
  [[nodiscard]] const ClockView& clock() const noexcept { return clock_; }
  /// The limiter's metrics, shadow mode and event hooks.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept { return monitor_; }

 private:
  enum State : int { kHealthy = 0, kOutage = 1, kMisconfigured = 2 };

  std::int64_t nowMicros() const { return clock_.now().count(); }
  bool takeLocal(std::int64_t permits, std::int64_t rate, std::chrono::milliseconds interval);
  // noteError() for `error` (null: not a redlimit::Error, which changes nothing).
  void note(const Error* error, std::int64_t startedAt);
  // Moves to `to` because of `error`; reports Degraded if the state changed.
  void enter(State to, const Error& error, std::int64_t startedAt);
  // Reports a health change to onHealthChange and the monitor's subscribers (no lock held).
  void report(const HealthEvent& event) const;
  // Reports the queued events in the order of their transitions: one thread at a time, with no
  // lock held while a callback runs (a callback that causes a transition queues it and returns).
  void deliver();
  void countLatency(std::int64_t startedAt) const;

  const std::string limiter_;
  const FailureOptions options_;
  const ClockView clock_;
  const LimiterMonitor monitor_;
  const std::int64_t probeMicros_;  // options_.probeInterval in µs, saturated
  std::atomic<int> state_{kHealthy};
  std::atomic<std::int64_t> degradedSince_{0};  // µs, clock_
  std::atomic<std::int64_t> nextProbe_{0};      // µs, clock_
  std::atomic<std::int64_t> recoveredAt_{0};    // µs, clock_; last Recovered
  std::atomic<std::uint64_t> allowed_{0}, denied_{0}, thrown_{0}, outages_{0}, misconfigurations_{0};
  // The gate's locked state, one per process. A fork() child makes a fresh one on first use
  // (locked()): the inherited mutexes may be held by parent threads that do not exist in the
  // child, and an inherited delivering flag would leave the child's events queued for a
  // delivering thread that is not there. The parent's is leaked in the child, never touched.
  struct Locked {
    explicit Locked(std::uint64_t g) : generation(g) {}
    const std::uint64_t generation;  // forkGeneration() of the process it serves
    Mutex mutex;
    std::string lastError REDLIMIT_GUARDED_BY(mutex);
    // FailurePolicy::Local: rate x share per interval, made on first use and remade (keeping what
    // it holds, up to the new capacity) when the configuration seen changes.
    std::optional<BasicLocalTokenBucket<ClockView>> local REDLIMIT_GUARDED_BY(mutex);
    // A transition changes state_ and queues its event under this lock, so events are delivered
    // in the order the state changed (two threads reporting on their own could swap a Degraded
    // and the Recovered that followed it).
    Mutex eventsMutex;
    std::deque<HealthEvent> pending REDLIMIT_GUARDED_BY(eventsMutex);
    bool delivering REDLIMIT_GUARDED_BY(eventsMutex) = false;
  };
  // This process's locked state (made anew, without a lock, after a fork). May throw bad_alloc
  // in a fork child's first call.
  Locked& locked() const;
  // Owned (~FailureGate deletes it unless it is a fork parent's, which is leaked).
  mutable std::atomic<Locked*> locked_{nullptr};
};

}  // namespace redlimit::detail
