// redlimit — how a limiter is watched: its metrics, shadow mode, and its events. Every limiter's
// options have a LimiterMonitor::Options `monitor`; the handle's LimiterMonitor applies it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "redlimit/decision.hpp"
#include "redlimit/events.hpp"
#include "redlimit/metrics.hpp"

namespace redlimit {

/// The part of a limiter that applies its LimiterMonitor::Options. A cheap copyable value (one shared
/// pointer: copies share the counters and callbacks); default-constructed it counts nothing and is
/// not in shadow mode. Thread-safe.
class LimiterMonitor {
 public:
  /// A denial that shadow mode let through: what the limiter would have answered.
  struct ShadowDenial {
    std::string limiter;                      // the limiter's name
    std::int64_t permits = 0;                 // the permits asked for
    std::chrono::microseconds retryAfter{0};  // when the same call would have been allowed (0 = unknown,
                                              // e.g. a denial of the failure policy)
    bool byPolicy = false;                    // the failure policy denied (Redis could not be asked)
  };

  /// Metrics, shadow mode and events of one limiter handle.
  ///
  /// Shadow mode is for rolling a limit out safely: every decision is made as usual (permits are
  /// taken from Redis when granted, the failure policy decides when Redis cannot be asked) and
  /// counted, but the caller is always allowed; a denial is counted as such and again as
  /// `shadowDenied`, and reported to onShadowDenial. A waiting call (acquire, tryAcquire with a
  /// timeout) never waits in shadow mode: it makes one attempt, and a denial there is a would-be
  /// denial. Errors are still thrown (shadow mode changes decisions, not failures: choose
  /// FailurePolicy::Allow with it to let traffic through an outage too).
  struct Options {
    bool metrics = true;                                      // count this limiter's decisions (cheap: relaxed atomics)
    std::shared_ptr<MetricsRegistry> registry;                // where; null = MetricsRegistry::global()
    bool shadow = false;                                      // decide and count, but always allow (see above)
    std::function<void(const ShadowDenial&)> onShadowDenial;  // shadow mode: called for each denial let
                                                              // through, on the deciding thread (the I/O
                                                              // thread for ...Async calls); must not throw
    EventCallback onEvent;                                    // this limiter's events (health; see events.hpp)
  };

  LimiterMonitor() = default;
  /// The monitor of the limiter `limiter`: its counters come from the options' registry (made or
  /// found there now: this locks the registry once). `clientEvents` also receives its events (the
  /// Client's ClientOptions::onEvent).
  LimiterMonitor(const std::string& limiter, const Options& options, EventCallback clientEvents = {});

  /// The counters, or null when metrics are off.
  [[nodiscard]] LimiterMetrics* metrics() const noexcept { return metrics_; }
  [[nodiscard]] bool shadow() const noexcept { return shadow_; }

  /// Counts a decision (one that asked Redis or the failure policy) and returns what the caller
  /// gets: `allowed`, or true in shadow mode (counting the would-be denial and reporting it).
  bool admit(bool allowed, std::int64_t permits, std::chrono::microseconds retryAfter = std::chrono::microseconds{0},
             bool byPolicy = false) const {
    if (metrics_) metrics_->decided(allowed, permits);
    if (allowed || !shadow_) return allowed;
    shadowDenial(permits, retryAfter, byPolicy);
    return true;
  }
  /// admit() for a whole Decision: in shadow mode a denial becomes allowed with shadowDenied set.
  void admit(Decision& decision) const {
    if (decision.allowed) {
      (void)admit(true, decision.permits);
      return;
    }
    decision.allowed = admit(false, decision.permits, decision.retryAfter, decision.byPolicy);
    decision.shadowDenied = decision.allowed;
  }
  /// Counts a denial the limiter's deny cache answered without Redis (LimiterMetrics::localDenial:
  /// a denial, as admit() counts one) and makes it what the caller gets: in shadow mode allowed,
  /// with shadowDenied set, the would-be denial reported as admit() reports one.
  void admitLocalDenial(Decision& decision) const {
    if (metrics_) metrics_->localDenial();
    if (!shadow_) return;
    shadowDenial(decision.permits, decision.retryAfter, false);
    decision.allowed = true;
    decision.shadowDenied = true;
  }
  /// Counts a request a deciding call sent to Redis (LimiterMetrics::roundTrip).
  void roundTrip() const noexcept {
    if (metrics_) metrics_->roundTrip();
  }
  /// Counts `permits` a caller gave back with refund() (LimiterMetrics::refunded).
  void refunded(std::int64_t permits) const noexcept {
    if (metrics_) metrics_->refunded(permits);
  }
  /// Counts a reservation recorded by reserveFor (LimiterMetrics::reservationOpened).
  void reservationOpened() const noexcept {
    if (metrics_) metrics_->reservationOpened();
  }
  /// Counts a reservation settled (LimiterMetrics::reservationSettled).
  void reservationSettled() const noexcept {
    if (metrics_) metrics_->reservationSettled();
  }
  /// Counts a decision served from a segment (SegmentedRateLimiter's hit): one relaxed addition.
  void localHit(std::int64_t permits) const noexcept {
    if (metrics_) metrics_->localHit(permits);
  }
  /// Hands `event` to the limiter's onEvent, then to the Client's. Call it with no lock held.
  void publish(const Event& event) const;

 private:
  void shadowDenial(std::int64_t permits, std::chrono::microseconds retryAfter, bool byPolicy) const;

  struct State {
    std::string limiter;
    std::shared_ptr<LimiterMetrics> metrics;
    std::function<void(const ShadowDenial&)> onShadowDenial;
    EventCallback onEvent, clientEvents;
  };
  std::shared_ptr<const State> state_;
  LimiterMetrics* metrics_ = nullptr;  // state_->metrics, read on every decision
  bool shadow_ = false;
};

// --- Definitions ---------------------------------------------------------------------------------

inline LimiterMonitor::LimiterMonitor(const std::string& limiter, const Options& options, EventCallback clientEvents)
    : shadow_(options.shadow) {
  auto state = std::make_shared<State>();
  state->limiter = limiter;
  if (options.metrics) {
    const std::shared_ptr<MetricsRegistry>& registry = options.registry ? options.registry : MetricsRegistry::global();
    state->metrics = registry->limiter(limiter);
  }
  state->onShadowDenial = options.onShadowDenial;
  state->onEvent = options.onEvent;
  state->clientEvents = std::move(clientEvents);
  metrics_ = state->metrics.get();
  state_ = std::move(state);
}

inline void LimiterMonitor::shadowDenial(std::int64_t permits, std::chrono::microseconds retryAfter,
                                         bool byPolicy) const {
  if (metrics_) metrics_->shadowDenied();
  if (!state_ || !state_->onShadowDenial) return;
  ShadowDenial d;
  d.limiter = state_->limiter;
  d.permits = permits;
  d.retryAfter = retryAfter;
  d.byPolicy = byPolicy;
  state_->onShadowDenial(d);
}

inline void LimiterMonitor::publish(const Event& event) const {
  if (!state_) return;
  if (state_->onEvent) state_->onEvent(event);
  if (state_->clientEvents) state_->clientEvents(event);
}

}  // namespace redlimit
