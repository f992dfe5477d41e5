#include "redlimit/detail/failure_gate.hpp"

#include <algorithm>
#include <cmath>
#include <exception>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "base/fork_guard.hpp"
#include "redlimit/detail/deadline.hpp"

namespace redlimit::detail {
FailureGate::FailureGate(std::string limiter, FailureOptions options, ClockView clock, LimiterMonitor monitor)
    : limiter_(std::move(limiter)),
      options_(std::move(options)),
      clock_(clock),
      monitor_(std::move(monitor)),
      probeMicros_(saturatingCast<std::chrono::microseconds>(options_.probeInterval).count()) {
  if (!(options_.localShare > 0.0 && options_.localShare <= 1.0)) {
    throw InvalidArgument("redlimit: FailureOptions::localShare must be in (0, 1]");
  }
  if (options_.probeInterval.count() <= 0) {
    throw InvalidArgument("redlimit: FailureOptions::probeInterval must be > 0 ms");
  }
  // The seed is checked here, before the limiter sends anything: a bad one is a set-up error.
  using Bucket = BasicLocalTokenBucket<ClockView>;
  const bool noSeed = options_.localSeedRate == 0 && options_.localSeedInterval.count() == 0;
  const bool seed = options_.localSeedRate > 0 && options_.localSeedRate <= Bucket::kMaxPermits &&
                    options_.localSeedInterval.count() > 0;
  if (!noSeed && !seed) {
    throw InvalidArgument(
        fmt::format("redlimit: FailureOptions::localSeedRate ({}) must be in 1..{} and localSeedInterval ({} ms) "
                    "> 0, or both 0 (no seed)",
                    options_.localSeedRate, Bucket::kMaxPermits, options_.localSeedInterval.count()));
  }
  locked_.store(new Locked(forkGeneration()), std::memory_order_release);
}

FailureGate::~FailureGate() {
  // A handle that goes away degraded no longer counts as one.
  if (state_.load(std::memory_order_relaxed) != kHealthy && monitor_.metrics()) monitor_.metrics()->degradedBy(-1);
  Locked* l = locked_.load(std::memory_order_acquire);
  if (l->generation == forkGeneration()) delete l;  // else a fork parent's: leaked (see Locked)
}

FailureGate::Locked& FailureGate::locked() const {
  // A fork child's first use makes a fresh one (without a lock: one could be held by a parent
  // thread); the inherited one is leaked. Events the parent had queued are its own and stay with it.
  return ofThisProcess(locked_, &Locked::generation,
                       [](Locked*) { return std::make_unique<Locked>(forkGeneration()); });
}

void FailureGate::report(const HealthEvent& event) const {
  if (options_.onHealthChange) options_.onHealthChange(event);
  Event e;
  e.kind = Event::Kind::Health;
  e.health = event;
  const char* cause = event.cause == HealthEvent::Cause::Outage ? "an outage" : "a configuration error";
  e.description = event.kind == HealthEvent::Kind::Degraded
                      ? fmt::format("limiter {} degraded by {}: {} ({})", limiter_, cause, event.error, event.errorType)
                      : fmt::format("limiter {} recovered from {} after {} ms", limiter_, cause, event.outage.count());
  monitor_.publish(e);
}

void FailureGate::countLatency(std::int64_t startedAt) const {
  if (LimiterMetrics* m = monitor_.metrics()) m->decisionLatency(std::chrono::microseconds(nowMicros() - startedAt));
}

void FailureGate::answered(std::int64_t startedAt) {
  countLatency(startedAt);
  succeeded();
}

bool FailureGate::shouldTry() {
  if (state_.load(std::memory_order_relaxed) != kOutage) return true;
  const std::int64_t now = nowMicros();
  std::int64_t probe = nextProbe_.load(std::memory_order_relaxed);
  const std::int64_t next = saturatingAdd(now, probeMicros_);
  // One caller per interval wins the probe.
  return now >= probe && nextProbe_.compare_exchange_strong(probe, next, std::memory_order_relaxed);
}

void FailureGate::succeeded() {
  if (state_.load(std::memory_order_relaxed) == kHealthy) return;
  Locked& l = locked();
  {
    const LockGuard lock(l.eventsMutex);
    const int was = state_.exchange(kHealthy, std::memory_order_relaxed);
    if (was == kHealthy) return;
    recoveredAt_.store(nowMicros(), std::memory_order_relaxed);
    if (LimiterMetrics* m = monitor_.metrics()) m->degradedBy(-1);
    HealthEvent event;
    event.kind = HealthEvent::Kind::Recovered;
    event.cause = was == kMisconfigured ? HealthEvent::Cause::Configuration : HealthEvent::Cause::Outage;
    event.limiter = limiter_;
    event.outage = std::chrono::milliseconds((nowMicros() - degradedSince_.load(std::memory_order_relaxed)) / 1000);
    l.pending.push_back(std::move(event));
  }
  deliver();
}

void FailureGate::deliver() {
  Locked& l = locked();
  UniqueLock lk(l.eventsMutex);
  if (l.delivering) return;  // the thread delivering now reports ours after the ones before it
  l.delivering = true;
  while (!l.pending.empty()) {
    const HealthEvent event = std::move(l.pending.front());
    l.pending.pop_front();
    lk.unlock();
    try {
      report(event);
    } catch (...) {  // a callback threw: the next transition delivers what is still queued
      lk.lock();
      l.delivering = false;
      throw;
    }
    lk.lock();
  }
  l.delivering = false;
}

void FailureGate::failed(const IoError& error, std::int64_t startedAt) { enter(kOutage, error, startedAt); }

void FailureGate::misconfigured(const Error& error, std::int64_t startedAt) { enter(kMisconfigured, error, startedAt); }

void FailureGate::noteError(const std::exception_ptr& error, std::int64_t startedAt) {
  note(errorIn(error), startedAt);
}

void FailureGate::note(const Error* error, std::int64_t startedAt) {
  if (error == nullptr || isCongestion(*error)) return;
  if (const auto* outage = dynamic_cast<const IoError*>(error)) {
    failed(*outage, startedAt);
  } else if (dynamic_cast<const ConfigurationError*>(error) != nullptr ||
             dynamic_cast<const AuthError*>(error) != nullptr) {
    misconfigured(*error, startedAt);
  } else {
    succeeded();
  }
}

void FailureGate::enter(State to, const Error& error, std::int64_t startedAt) {
  if (startedAt < recoveredAt_.load(std::memory_order_relaxed)) return;  // stale news
  const std::int64_t now = nowMicros();
  Locked& l = locked();
  {
    const LockGuard lock(l.mutex);
    l.lastError = error.what();
  }
  if (to == kOutage) nextProbe_.store(saturatingAdd(now, probeMicros_), std::memory_order_relaxed);
  {
    const LockGuard lock(l.eventsMutex);
    const int was = state_.exchange(to, std::memory_order_relaxed);
    if (was == to) return;
    if (was == kHealthy) {
      degradedSince_.store(now, std::memory_order_relaxed);
      if (LimiterMetrics* m = monitor_.metrics()) m->degradedBy(1);
    }
    (to == kOutage ? outages_ : misconfigurations_).fetch_add(1, std::memory_order_relaxed);
    HealthEvent event;
    event.kind = HealthEvent::Kind::Degraded;
    event.cause = to == kOutage ? HealthEvent::Cause::Outage : HealthEvent::Cause::Configuration;
    event.limiter = limiter_;
    event.error = error.what();
    event.errorType = errorTypeName(error);
    event.errorKind = error.kind();
    event.exception = copyError(error);  // the event's own object, of the error's own type
    l.pending.push_back(std::move(event));
  }
  deliver();
}

bool FailureGate::takeLocal(std::int64_t permits, std::int64_t rate, std::chrono::milliseconds interval) {
  if (rate <= 0 || interval.count() <= 0) {  // never saw a configuration: the seed, else refuse
    rate = options_.localSeedRate;
    interval = options_.localSeedInterval;
    if (rate <= 0 || interval.count() <= 0) return false;
  }
  // A token bucket holding rate x share permits (at least one), refilled with that many per
  // interval: this instance's share of the limit while Redis cannot be asked.
  using Bucket = BasicLocalTokenBucket<ClockView>;
  const double share = std::floor(static_cast<double>(rate) * options_.localShare);
  const std::int64_t capacity = std::clamp<std::int64_t>(static_cast<std::int64_t>(share), 1, Bucket::kMaxPermits);
  const std::chrono::microseconds every =
      std::min(saturatingCast<std::chrono::microseconds>(interval), Bucket::kMaxInterval);
  if (permits > capacity) return false;
  Locked& l = locked();
  const LockGuard lock(l.mutex);
  if (!l.local || l.local->capacity() != capacity || l.local->refillInterval() != every) {
    const std::int64_t held = l.local ? std::min(l.local->availablePermits(), capacity) : capacity;
    l.local.emplace(capacity, capacity, every, clock_);
    l.local->setAvailablePermits(held);
  }
  return l.local->tryAcquire(permits);
}

std::optional<bool> FailureGate::decide(std::int64_t permits, std::int64_t rate, std::chrono::milliseconds interval) {
  std::optional<bool> decision;
  switch (options_.policy) {
    case FailurePolicy::Allow:
      decision = true;
      break;
    case FailurePolicy::Deny:
      decision = false;
      break;
    case FailurePolicy::Local:
      decision = takeLocal(permits, rate, interval);
      break;
    case FailurePolicy::Throw:
      break;
  }
  using Outcome = LimiterMetrics::PolicyOutcome;
  (!decision ? thrown_ : *decision ? allowed_ : denied_).fetch_add(1, std::memory_order_relaxed);
  if (LimiterMetrics* m = monitor_.metrics()) {
    m->policyDecision(options_.policy, !decision ? Outcome::Thrown : *decision ? Outcome::Granted : Outcome::Denied);
  }
  return decision;
}

std::optional<bool> FailureGate::settle(const std::exception_ptr& error, std::int64_t startedAt, std::int64_t permits,
                                        std::int64_t rate, std::chrono::milliseconds interval) {
  // The error is looked at in place, once (errorIn): no rethrow per failed call.
  const Error* e = errorIn(error);
  if (LimiterMetrics* m = monitor_.metrics()) {
    countLatency(startedAt);
    m->error(e != nullptr ? errorKindOf(*e) : ErrorKind::Other);
  }
  note(e, startedAt);
  if (dynamic_cast<const IoError*>(e) == nullptr) return std::nullopt;
  return decide(permits, rate, interval);
}

void FailureGate::throwUnavailable() const {
  Locked& l = locked();
  UniqueLock lock(l.mutex);
  const std::string last = l.lastError;
  lock.unlock();
  const auto since = (nowMicros() - degradedSince_.load(std::memory_order_relaxed)) / 1000;
  throw IoError(
      fmt::format("redlimit: Redis unavailable for limiter {} for {} ms; not asking again before the next "
                  "probe (last error: {})",
                  limiter_, since, last));
}

FailureStats FailureGate::stats() const {
  FailureStats s;
  s.allowed = allowed_.load(std::memory_order_relaxed);
  s.denied = denied_.load(std::memory_order_relaxed);
  s.thrown = thrown_.load(std::memory_order_relaxed);
  s.outages = outages_.load(std::memory_order_relaxed);
  s.misconfigurations = misconfigurations_.load(std::memory_order_relaxed);
  const int state = state_.load(std::memory_order_relaxed);
  s.degraded = state == kOutage;
  s.misconfigured = state == kMisconfigured;
  return s;
}

}  // namespace redlimit::detail
