#include "redlimit/metrics.hpp"

#include <algorithm>
#include <utility>

#include "redlimit/errors.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit {

const char* errorKindName(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::Timeout:
      return "timeout";
    case ErrorKind::Closed:
      return "closed";
    case ErrorKind::PoolTimeout:
      return "pool_timeout";
    case ErrorKind::Unavailable:
      return "unavailable";
    case ErrorKind::Io:
      return "io";
    case ErrorKind::Configuration:
      return "configuration";
    case ErrorKind::Auth:
      return "auth";
    case ErrorKind::Reply:
      return "reply";
    case ErrorKind::InvalidArgument:
      return "invalid_argument";
    case ErrorKind::Other:
      break;
  }
  return "other";
}

ErrorKind errorKindOf(const std::exception_ptr& error) noexcept {
  if (!error) return ErrorKind::Other;
  try {
    std::rethrow_exception(error);
  } catch (const PoolTimeoutError&) {  // before TimeoutError, its base
    return ErrorKind::PoolTimeout;
  } catch (const TimeoutError&) {
    return ErrorKind::Timeout;
  } catch (const ClosedError&) {
    return ErrorKind::Closed;
  } catch (const UnavailableError&) {
    return ErrorKind::Unavailable;
  } catch (const IoError&) {
    return ErrorKind::Io;
  } catch (const ConfigurationError&) {
    return ErrorKind::Configuration;
  } catch (const AuthError&) {  // before ReplyError, its base
    return ErrorKind::Auth;
  } catch (const ReplyError&) {
    return ErrorKind::Reply;
  } catch (const InvalidArgument&) {
    return ErrorKind::InvalidArgument;
  } catch (...) {
    return ErrorKind::Other;
  }
}

const char* failurePolicyName(FailurePolicy policy) noexcept {
  switch (policy) {
    case FailurePolicy::Allow:
      return "allow";
    case FailurePolicy::Deny:
      return "deny";
    case FailurePolicy::Local:
      return "local";
    case FailurePolicy::Throw:
      break;
  }
  return "throw";
}

const char* policyOutcomeName(PolicyOutcome outcome) noexcept {
  switch (outcome) {
    case PolicyOutcome::Allowed:
      return "allowed";
    case PolicyOutcome::Denied:
      return "denied";
    case PolicyOutcome::Thrown:
      break;
  }
  return "thrown";
}

LatencyHistogram::Snapshot LatencyHistogram::snapshot() const noexcept {
  Snapshot s;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sumSeconds = static_cast<double>(sumNanos_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

LimiterMetricsSnapshot LimiterMetrics::snapshot() const noexcept {
  LimiterMetricsSnapshot s;
  s.limiter = limiter_;
  // The local hits are read first: a hit counted between the reads then shows up in no total
  // rather than in localHits and not in granted.
  const std::uint64_t localPermits = local_.permits.load(std::memory_order_relaxed);
  const std::uint64_t localExtra = local_.extra.load(std::memory_order_relaxed);
  s.localHits = localPermits - std::min(localExtra, localPermits);
  s.granted = decisions_.granted.load(std::memory_order_relaxed) + s.localHits;
  s.denied = decisions_.denied.load(std::memory_order_relaxed);
  s.permitsGranted = decisions_.permits.load(std::memory_order_relaxed) + localPermits;
  s.shadowDenied = decisions_.shadowDenied.load(std::memory_order_relaxed);
  s.roundTrips = calls_.roundTrips.load(std::memory_order_relaxed);
  s.degraded = calls_.degraded.load(std::memory_order_relaxed);
  for (std::size_t p = 0; p < kFailurePolicyCount; ++p) {
    for (std::size_t o = 0; o < kPolicyOutcomeCount; ++o)
      s.policy[p][o] = calls_.policy[p][o].load(std::memory_order_relaxed);
  }
  for (std::size_t k = 0; k < kErrorKindCount; ++k) s.errors[k] = calls_.errors[k].load(std::memory_order_relaxed);
  s.latency = latency_.snapshot();
  return s;
}

MetricsRegistry::MetricsRegistry(std::size_t maxLimiters) : maxLimiters_(maxLimiters) {
  if (maxLimiters_ == 0) throw InvalidArgument("redlimit: MetricsRegistry needs maxLimiters >= 1");
}

const std::shared_ptr<MetricsRegistry>& MetricsRegistry::global() {
  // Never destroyed: limiters in static objects may count into it during exit.
  static const auto* registry = new std::shared_ptr<MetricsRegistry>(std::make_shared<MetricsRegistry>());
  return *registry;
}

std::shared_ptr<LimiterMetrics> MetricsRegistry::limiter(const std::string& name) {
  const detail::LockGuard lock(mutex_);
  if (name != kOtherLabel) {
    if (auto it = entries_.find(name); it != entries_.end()) return it->second;
    if (entries_.size() < maxLimiters_) {
      auto metrics = std::make_shared<LimiterMetrics>(name);
      entries_.emplace(name, metrics);
      return metrics;
    }
    ++collapsed_;
  }
  if (!other_) other_ = std::make_shared<LimiterMetrics>(kOtherLabel);
  return other_;
}

std::vector<LimiterMetricsSnapshot> MetricsRegistry::snapshot() const {
  std::vector<std::shared_ptr<LimiterMetrics>> all;
  {
    const detail::LockGuard lock(mutex_);
    all.reserve(entries_.size() + 1);
    for (const auto& entry : entries_) all.push_back(entry.second);
    if (other_) all.push_back(other_);
  }
  std::vector<LimiterMetricsSnapshot> out;
  out.reserve(all.size());
  for (const auto& m : all) out.push_back(m->snapshot());
  return out;
}

LimiterMetricsSnapshot MetricsRegistry::snapshot(const std::string& name) const {
  std::shared_ptr<LimiterMetrics> m;
  {
    const detail::LockGuard lock(mutex_);
    if (auto it = entries_.find(name); it != entries_.end()) {
      m = it->second;
    } else {
      m = other_;
    }
  }
  if (!m) {
    LimiterMetricsSnapshot empty;
    empty.limiter = name;
    return empty;
  }
  return m->snapshot();
}

std::uint64_t MetricsRegistry::collapsedLookups() const {
  const detail::LockGuard lock(mutex_);
  return collapsed_;
}

LimiterMonitor::LimiterMonitor(const std::string& limiter, const MonitorOptions& options, EventCallback clientEvents)
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

void LimiterMonitor::shadowDenial(std::int64_t permits, std::chrono::microseconds retryAfter, bool byPolicy) const {
  if (metrics_) metrics_->shadowDenied();
  if (!state_ || !state_->onShadowDenial) return;
  ShadowDenial d;
  d.limiter = state_->limiter;
  d.permits = permits;
  d.retryAfter = retryAfter;
  d.byPolicy = byPolicy;
  state_->onShadowDenial(d);
}

void LimiterMonitor::publish(const Event& event) const {
  if (!state_) return;
  if (state_->onEvent) state_->onEvent(event);
  if (state_->clientEvents) state_->clientEvents(event);
}

}  // namespace redlimit
