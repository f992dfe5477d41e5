// redlimit — metrics of every limiter, kept by the library itself (no dependency): what a
// dashboard graphs and an alert fires on. Counters are relaxed atomics on their own cache lines,
// the latency histogram has fixed buckets; nothing on a decision's path locks or allocates.
// redlimit::prometheus (redlimit/prometheus.hpp) exports a registry for Prometheus; anything
// else can read MetricsRegistry::snapshot().
#pragma once

#include <array>
#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redlimit/detail/cache_line.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/failure_policy.hpp"

namespace redlimit {

/// The metrics count the errors of calls that went to Redis, and bad input, under one label per
/// kind: the first kErrorKindCount ErrorKinds (redlimit/errors.hpp), each finer kind under its
/// label kind (errorLabelKind). A call not sent because its limiter is degraded is counted as the
/// failure policy's decision instead (LimiterMetrics::PolicyOutcome::Thrown under FailurePolicy::Throw).
inline constexpr std::size_t kErrorKindCount = 10;
/// The kind `kind` is counted under, one of the first kErrorKindCount: itself for those, else
/// CallbackBlocked -> PoolTimeout, Protocol -> Io, Replica / TlsPort / Tls / ResourceLimit /
/// RequestLimit -> Configuration, NoPermission -> Auth, UnexpectedReply / Script / InvalidConfig /
/// InvalidState / NotInitialized -> Reply.
[[nodiscard]] ErrorKind errorLabelKind(ErrorKind kind) noexcept;
/// The label word of `kind`'s label kind: "timeout", "closed", "pool_timeout", "unavailable", "io",
/// "configuration", "auth", "reply", "invalid_argument", "other" (errorKindName(ErrorKind::Tls) is
/// "configuration").
[[nodiscard]] const char* errorKindName(ErrorKind kind) noexcept;
/// The kind of `error` (a redlimit::Error's kind(), or Other). Rethrows and catches: not for hot paths.
[[nodiscard]] ErrorKind errorKindOf(const std::exception_ptr& error) noexcept;
/// The kind of the exception `error` (a redlimit::Error's kind(), or Other), without rethrowing.
[[nodiscard]] ErrorKind errorKindOf(const std::exception& error) noexcept;

inline constexpr std::size_t kFailurePolicyCount = 4;  // FailurePolicy's values
inline constexpr std::size_t kPolicyOutcomeCount = 3;  // LimiterMetrics::PolicyOutcome's values
/// "throw", "allow", "deny", "local".
[[nodiscard]] const char* failurePolicyName(FailurePolicy policy) noexcept;

/// The upper bounds of the decision-latency buckets, in seconds (a last bucket, +Inf, takes the
/// rest): 50 µs to 5 s, because a decision on a local Redis takes tens of µs and one that hits
/// the command timeout takes what that is (500 ms by default).
inline constexpr std::array<double, 16> kLatencyBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                           0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0};

/// A histogram of durations over kLatencyBuckets. observe() is wait-free (two relaxed additions);
/// snapshot() reads each bucket once, so a snapshot taken while others observe may count an
/// observation in its sum and not yet in its bucket. Thread-safe.
class LatencyHistogram {
 public:
  static constexpr std::size_t kBuckets = kLatencyBuckets.size() + 1;  // the last one is +Inf

  struct Snapshot {
    std::array<std::uint64_t, kBuckets> counts{};  // per bucket, not cumulative
    std::uint64_t count = 0;                       // the sum of counts
    double sumSeconds = 0;                         // the sum of the observed durations
  };

  /// Counts one duration (negative ones as 0).
  void observe(std::chrono::nanoseconds duration) noexcept {
    const std::int64_t ns = duration.count() < 0 ? 0 : duration.count();
    std::size_t i = 0;
    while (i < kLatencyBuckets.size() && ns > kBoundsNanos[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    sumNanos_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  }
  [[nodiscard]] Snapshot snapshot() const noexcept;

 private:
  static constexpr std::array<std::int64_t, kLatencyBuckets.size()> kBoundsNanos = {
      50000,    100000,   250000,    500000,    1000000,   2500000,    5000000,    10000000,
      25000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000, 5000000000};
  std::array<std::atomic<std::uint64_t>, kBuckets> counts_{};
  std::atomic<std::uint64_t> sumNanos_{0};
};

/// The counters of one limiter name, shared by every handle of that name made with the same
/// registry. The record calls are wait-free relaxed additions (no lock, no allocation); the
/// segment cache's hit costs one of them. Thread-safe.
class LimiterMetrics {
 public:
  /// How a decision of the failure policy ended (the label words "granted", "denied", "thrown").
  enum class PolicyOutcome : std::uint8_t { Granted, Denied, Thrown };

  /// What a LimiterMetrics has counted, read at one moment (each counter read once).
  struct Snapshot {
    std::string limiter;                    // the name, or MetricsRegistry::kOtherLabel for the collapsed ones
    std::uint64_t granted = 0;              // decisions that allowed (the segment cache's local hits included)
    std::uint64_t denied = 0;               // decisions that refused (in shadow mode: still counted here;
                                            // the deny cache's local denials included)
    std::uint64_t permitsGranted = 0;       // permits those granted decisions took
    std::uint64_t shadowDenied = 0;         // shadow mode: denials the caller was let through anyway
    std::uint64_t permitsRefunded = 0;      // permits callers gave back with refund(): their grants stay
                                            // counted in granted and permitsGranted
    std::uint64_t localHits = 0;            // decisions the segment cache served without Redis (in granted)
    std::uint64_t localDenials = 0;         // denials the deny cache answered without Redis (in denied): a key
                                            // Redis denied, asked again before its retryAfter
    std::uint64_t reservationsOpened = 0;   // reserveFor grants recorded under a reservation id (also in granted)
    std::uint64_t reservationsSettled = 0;  // settle/cancel calls that settled a reservation (their give-back is
                                            // in permitsRefunded)
    std::uint64_t roundTrips = 0;           // requests deciding calls sent to Redis (a coalesced batch is one,
                                            // a resend another), the segment cache's refills included
    std::uint64_t degraded = 0;             // handles of this name degraded now (outage or configuration error)
    std::uint64_t callbacksThrew = 0;       // completion callbacks of ...Async calls that threw (caught and dropped)
    std::array<std::array<std::uint64_t, kPolicyOutcomeCount>, kFailurePolicyCount>
        policy{};                                         // [FailurePolicy][PolicyOutcome]
    std::array<std::uint64_t, kErrorKindCount> errors{};  // [label ErrorKind]; errorCount() maps a finer kind
    LatencyHistogram::Snapshot latency;  // deciding calls' time from the call to Redis's answer (or the
                                         // failure), on the limiter's clock

    [[nodiscard]] std::uint64_t policyDecisions(FailurePolicy p, PolicyOutcome o) const noexcept {
      return policy[static_cast<std::size_t>(p)][static_cast<std::size_t>(o)];
    }
    [[nodiscard]] std::uint64_t errorCount(ErrorKind kind) const noexcept {
      return errors[static_cast<std::size_t>(errorLabelKind(kind))];
    }
  };

  explicit LimiterMetrics(std::string limiter) : limiter_(std::move(limiter)) {}
  LimiterMetrics(const LimiterMetrics&) = delete;
  LimiterMetrics& operator=(const LimiterMetrics&) = delete;

  [[nodiscard]] const std::string& limiter() const noexcept { return limiter_; }

  /// A decision that asked Redis or the failure policy (not a local hit): granted or not, for
  /// `permits`.
  void decided(bool granted, std::int64_t permits) noexcept {
    if (granted) {
      decisions_.granted.fetch_add(1, std::memory_order_relaxed);
      decisions_.permits.fetch_add(static_cast<std::uint64_t>(permits), std::memory_order_relaxed);
    } else {
      decisions_.denied.fetch_add(1, std::memory_order_relaxed);
    }
  }
  /// A decision the segment cache served from its segment: counted as granted, with its permits.
  /// One addition for a call of one permit (the hit's only extra cost), two for more, on the
  /// calling thread's stripe: threads hitting one limiter do not share a counter's cache line.
  void localHit(std::int64_t permits) noexcept {
    Local& stripe = local_[threadStripe()];
    stripe.permits.fetch_add(static_cast<std::uint64_t>(permits), std::memory_order_relaxed);
    if (permits > 1) stripe.extra.fetch_add(static_cast<std::uint64_t>(permits - 1), std::memory_order_relaxed);
  }
  /// A denial the limiter's deny cache answered without Redis: counted as denied. One addition, on
  /// the calling thread's stripe (as localHit).
  void localDenial() noexcept { local_[threadStripe()].denials.fetch_add(1, std::memory_order_relaxed); }
  /// A denial that shadow mode let through (also counted by decided(false, ...)).
  void shadowDenied() noexcept { decisions_.shadowDenied.fetch_add(1, std::memory_order_relaxed); }
  /// A request a deciding call sent to Redis (a coalesced batch is one; a resend is another).
  void roundTrip() noexcept { calls_.roundTrips.fetch_add(1, std::memory_order_relaxed); }
  /// A deciding call that asked Redis got its answer (or failed) after `latency`.
  void decisionLatency(std::chrono::nanoseconds latency) noexcept { latency_.observe(latency); }
  /// A decision made by the failure policy.
  void policyDecision(FailurePolicy policy, PolicyOutcome outcome) noexcept {
    calls_.policy[static_cast<std::size_t>(policy)][static_cast<std::size_t>(outcome)].fetch_add(
        1, std::memory_order_relaxed);
  }
  /// A call that failed with an error of `kind`.
  void error(ErrorKind kind) noexcept {
    calls_.errors[static_cast<std::size_t>(errorLabelKind(kind))].fetch_add(1, std::memory_order_relaxed);
  }
  /// `permits` given back by a caller's refund() (a segment cache's give-back is not one). The
  /// decision that took them stays counted as granted.
  void refunded(std::int64_t permits) noexcept {
    calls_.refunded.fetch_add(static_cast<std::uint64_t>(permits), std::memory_order_relaxed);
  }
  /// A reservation recorded under an id (reserveFor's grant).
  void reservationOpened() noexcept { calls_.reservationsOpened.fetch_add(1, std::memory_order_relaxed); }
  /// A reservation settled (settle or cancel; a repeated settle is not counted again).
  void reservationSettled() noexcept { calls_.reservationsSettled.fetch_add(1, std::memory_order_relaxed); }
  /// A completion callback of an ...Async call threw (the exception was caught and dropped).
  void callbackThrew() noexcept { calls_.callbacksThrew.fetch_add(1, std::memory_order_relaxed); }
  /// A handle of this name became degraded (+1) or recovered (-1).
  void degradedBy(std::int64_t delta) noexcept {
    calls_.degraded.fetch_add(static_cast<std::uint64_t>(delta), std::memory_order_relaxed);
  }

  [[nodiscard]] Snapshot snapshot() const noexcept;

 private:
  const std::string limiter_;
  struct alignas(detail::kCacheLine) Decisions {
    std::atomic<std::uint64_t> granted{0}, denied{0}, permits{0}, shadowDenied{0};
  } decisions_;
  // The segment cache's hits, in stripes on lines of their own (summed by snapshot()): a thread
  // adds to the stripe of its own index, so up to kStripes threads never contend on one.
  static constexpr std::size_t kStripes = 8;
  static std::size_t threadStripe() noexcept {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
    return mine;
  }
  struct alignas(detail::kCacheLine) Local {
    std::atomic<std::uint64_t> permits{0};  // permits handed out locally
    std::atomic<std::uint64_t> extra{0};    // of them, the permits beyond the first of each call
    std::atomic<std::uint64_t> denials{0};  // the deny cache's local denials
  };
  std::array<Local, kStripes> local_{};
  struct alignas(detail::kCacheLine) Calls {
    std::atomic<std::uint64_t> roundTrips{0};
    std::atomic<std::uint64_t> degraded{0};  // wraps through negative deltas, read as a count
    std::atomic<std::uint64_t> callbacksThrew{0};
    std::atomic<std::uint64_t> refunded{0};
    std::atomic<std::uint64_t> reservationsOpened{0};
    std::atomic<std::uint64_t> reservationsSettled{0};
    std::array<std::array<std::atomic<std::uint64_t>, kPolicyOutcomeCount>, kFailurePolicyCount> policy{};
    std::array<std::atomic<std::uint64_t>, kErrorKindCount> errors{};
  } calls_;
  alignas(detail::kCacheLine) LatencyHistogram latency_;
};

/// "granted", "denied", "thrown" (the word of redlimit_decisions_total's outcome label too).
[[nodiscard]] const char* policyOutcomeName(LimiterMetrics::PolicyOutcome outcome) noexcept;

/// The metrics of many limiters, by name. Limiters are often made per tenant or per user, so the
/// number of names is capped: the first `maxLimiters` distinct names get their own counters, every
/// later one shares the counters named kOtherLabel ("other"), so what a scrape returns stays
/// bounded. An entry lives as long as the registry (counters never go backwards for a scraper).
/// Thread-safe; limiter() locks (limiters call it once, when a handle is made), the counters do not.
class MetricsRegistry {
 public:
  static constexpr std::size_t kDefaultMaxLimiters = 1000;
  /// The label of the counters shared by the names past the cap.
  static constexpr const char* kOtherLabel = "other";

  /// Throws InvalidArgument for maxLimiters of 0.
  explicit MetricsRegistry(std::size_t maxLimiters = kDefaultMaxLimiters);
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  /// The process-wide registry limiters use unless their LimiterMonitor::Options name another.
  [[nodiscard]] static const std::shared_ptr<MetricsRegistry>& global();

  /// The counters for `name`: its own while fewer than maxLimiters names have some (or it has
  /// them already), else the shared kOtherLabel counters. A limiter named "other" shares those too.
  [[nodiscard]] std::shared_ptr<LimiterMetrics> limiter(const std::string& name);
  /// Every entry's counters, sorted by name, the kOtherLabel entry (if any name was collapsed) last.
  [[nodiscard]] std::vector<LimiterMetrics::Snapshot> snapshot() const;
  /// The snapshot of one name's entry (kOtherLabel's if it was collapsed); all zero if unknown.
  [[nodiscard]] LimiterMetrics::Snapshot snapshot(const std::string& name) const;
  [[nodiscard]] std::size_t maxLimiters() const noexcept { return maxLimiters_; }
  /// Calls of limiter() answered with the kOtherLabel counters (handles made past the cap).
  [[nodiscard]] std::uint64_t collapsedLookups() const;

 private:
  const std::size_t maxLimiters_;
  mutable detail::Mutex mutex_;
  std::map<std::string, std::shared_ptr<LimiterMetrics>> entries_ REDLIMIT_GUARDED_BY(mutex_);
  std::shared_ptr<LimiterMetrics> other_ REDLIMIT_GUARDED_BY(mutex_);
  std::uint64_t collapsed_ REDLIMIT_GUARDED_BY(mutex_) = 0;
};

// --- Definitions (header-only: the in-process limiters of redlimit::local count too) ----------

inline ErrorKind errorLabelKind(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::CallbackBlocked:
      return ErrorKind::PoolTimeout;
    case ErrorKind::Protocol:
      return ErrorKind::Io;
    case ErrorKind::Replica:
    case ErrorKind::TlsPort:
    case ErrorKind::Tls:
    case ErrorKind::ResourceLimit:
    case ErrorKind::RequestLimit:
      return ErrorKind::Configuration;
    case ErrorKind::NoPermission:
      return ErrorKind::Auth;
    case ErrorKind::UnexpectedReply:
    case ErrorKind::Script:
    case ErrorKind::InvalidConfig:
    case ErrorKind::InvalidState:
    case ErrorKind::NotInitialized:
      return ErrorKind::Reply;
    default:
      return static_cast<std::size_t>(kind) < kErrorKindCount ? kind : ErrorKind::Other;
  }
}

inline const char* errorKindName(ErrorKind kind) noexcept {
  switch (errorLabelKind(kind)) {
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
    default:
      break;
  }
  return "other";
}

inline ErrorKind errorKindOf(const std::exception& error) noexcept {
  if (const auto* e = dynamic_cast<const Error*>(&error)) return e->kind();
  return ErrorKind::Other;
}

inline ErrorKind errorKindOf(const std::exception_ptr& error) noexcept {
  if (!error) return ErrorKind::Other;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return errorKindOf(e);
  } catch (...) {
    return ErrorKind::Other;
  }
}

inline const char* failurePolicyName(FailurePolicy policy) noexcept {
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

inline const char* policyOutcomeName(LimiterMetrics::PolicyOutcome outcome) noexcept {
  switch (outcome) {
    case LimiterMetrics::PolicyOutcome::Granted:
      return "granted";
    case LimiterMetrics::PolicyOutcome::Denied:
      return "denied";
    case LimiterMetrics::PolicyOutcome::Thrown:
      break;
  }
  return "thrown";
}

inline LatencyHistogram::Snapshot LatencyHistogram::snapshot() const noexcept {
  Snapshot s;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sumSeconds = static_cast<double>(sumNanos_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

inline LimiterMetrics::Snapshot LimiterMetrics::snapshot() const noexcept {
  LimiterMetrics::Snapshot s;
  s.limiter = limiter_;
  // The local hits are read first: a hit counted between the reads then shows up in no total
  // rather than in localHits and not in granted.
  std::uint64_t localPermits = 0, localExtra = 0;
  for (const Local& stripe : local_) {
    localPermits += stripe.permits.load(std::memory_order_relaxed);
    localExtra += stripe.extra.load(std::memory_order_relaxed);
    s.localDenials += stripe.denials.load(std::memory_order_relaxed);
  }
  s.localHits = localPermits - std::min(localExtra, localPermits);
  s.granted = decisions_.granted.load(std::memory_order_relaxed) + s.localHits;
  s.denied = decisions_.denied.load(std::memory_order_relaxed) + s.localDenials;
  s.permitsGranted = decisions_.permits.load(std::memory_order_relaxed) + localPermits;
  s.shadowDenied = decisions_.shadowDenied.load(std::memory_order_relaxed);
  s.roundTrips = calls_.roundTrips.load(std::memory_order_relaxed);
  s.degraded = calls_.degraded.load(std::memory_order_relaxed);
  s.callbacksThrew = calls_.callbacksThrew.load(std::memory_order_relaxed);
  s.permitsRefunded = calls_.refunded.load(std::memory_order_relaxed);
  s.reservationsOpened = calls_.reservationsOpened.load(std::memory_order_relaxed);
  s.reservationsSettled = calls_.reservationsSettled.load(std::memory_order_relaxed);
  for (std::size_t p = 0; p < kFailurePolicyCount; ++p) {
    for (std::size_t o = 0; o < kPolicyOutcomeCount; ++o)
      s.policy[p][o] = calls_.policy[p][o].load(std::memory_order_relaxed);
  }
  for (std::size_t k = 0; k < kErrorKindCount; ++k) s.errors[k] = calls_.errors[k].load(std::memory_order_relaxed);
  s.latency = latency_.snapshot();
  return s;
}

inline MetricsRegistry::MetricsRegistry(std::size_t maxLimiters) : maxLimiters_(maxLimiters) {
  if (maxLimiters_ == 0) throw InvalidArgument("redlimit: MetricsRegistry needs maxLimiters >= 1");
}

inline const std::shared_ptr<MetricsRegistry>& MetricsRegistry::global() {
  // Never destroyed: limiters in static objects may count into it during exit. An inline
  // function's static is one object in the whole program.
  static const auto* registry = new std::shared_ptr<MetricsRegistry>(std::make_shared<MetricsRegistry>());
  return *registry;
}

inline std::shared_ptr<LimiterMetrics> MetricsRegistry::limiter(const std::string& name) {
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

inline std::vector<LimiterMetrics::Snapshot> MetricsRegistry::snapshot() const {
  std::vector<std::shared_ptr<LimiterMetrics>> all;
  {
    const detail::LockGuard lock(mutex_);
    all.reserve(entries_.size() + 1);
    for (const auto& entry : entries_) all.push_back(entry.second);
    if (other_) all.push_back(other_);
  }
  std::vector<LimiterMetrics::Snapshot> out;
  out.reserve(all.size());
  for (const auto& m : all) out.push_back(m->snapshot());
  return out;
}

inline LimiterMetrics::Snapshot MetricsRegistry::snapshot(const std::string& name) const {
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
    LimiterMetrics::Snapshot empty;
    empty.limiter = name;
    return empty;
  }
  return m->snapshot();
}

inline std::uint64_t MetricsRegistry::collapsedLookups() const {
  const detail::LockGuard lock(mutex_);
  return collapsed_;
}

}  // namespace redlimit
