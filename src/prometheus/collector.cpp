// redlimit::prometheus: MetricsRegistry snapshots as prometheus-cpp metric families.
#include "redlimit/prometheus.hpp"

#include <cstddef>
#include <limits>
#include <utility>

#include <prometheus/text_serializer.h>

#include "redlimit/errors.hpp"

namespace redlimit::prometheus {
namespace {

using ::prometheus::ClientMetric;
using ::prometheus::MetricFamily;
using ::prometheus::MetricType;

MetricFamily family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

ClientMetric counter(const std::string& limiter, std::uint64_t value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label.push_back({"limiter", limiter});
  for (auto& l : labels) m.label.push_back(std::move(l));
  m.counter.value = static_cast<double>(value);
  return m;
}

}  // namespace

Collector::Collector(std::shared_ptr<MetricsRegistry> registry) : registry_(std::move(registry)) {
  if (!registry_) throw InvalidArgument("redlimit::prometheus::Collector needs a MetricsRegistry");
}

std::vector<MetricFamily> Collector::Collect() const {
  const std::vector<LimiterMetrics::Snapshot> all = registry_->snapshot();
  MetricFamily decisions = family("redlimit_decisions_total", "Decisions made, by outcome", MetricType::Counter);
  MetricFamily permits =
      family("redlimit_permits_granted_total", "Permits taken by granted decisions", MetricType::Counter);
  MetricFamily refunded =
      family("redlimit_permits_refunded_total",
             "Permits callers gave back with refund() (their grants stay counted as granted)", MetricType::Counter);
  MetricFamily reservations =
      family("redlimit_reservations_total",
             "Reservations of reserveFor, by state: opened (recorded under an id) and settled (settle or cancel)",
             MetricType::Counter);
  MetricFamily shadow = family("redlimit_shadow_denials_total",
                               "Denials that shadow mode let through (also counted as denied)", MetricType::Counter);
  MetricFamily local =
      family("redlimit_local_hits_total", "Decisions the segment cache served without Redis (also counted as granted)",
             MetricType::Counter);
  MetricFamily localDenials =
      family("redlimit_local_denials_total",
             "Denials the deny cache answered without Redis, until the retryAfter of Redis's denial (also counted "
             "as denied)",
             MetricType::Counter);
  MetricFamily trips = family("redlimit_redis_round_trips_total",
                              "Requests sent to Redis to decide (a coalesced batch is one; segment refills included)",
                              MetricType::Counter);
  MetricFamily policy =
      family("redlimit_policy_decisions_total", "Decisions made by the failure policy while Redis could not be asked",
             MetricType::Counter);
  MetricFamily errors =
      family("redlimit_errors_total", "Deciding calls that failed, by error type", MetricType::Counter);
  MetricFamily latency =
      family("redlimit_decision_seconds", "Time of a deciding call to Redis until its answer", MetricType::Histogram);
  MetricFamily threw = family(
      "redlimit_callbacks_threw_total",
      "Completion callbacks of async calls that threw (caught and dropped; the call was decided)", MetricType::Counter);
  MetricFamily degraded =
      family("redlimit_degraded", "Limiter handles in degraded mode now (an outage or a configuration error)",
             MetricType::Gauge);
  for (const LimiterMetrics::Snapshot& s : all) {
    decisions.metric.push_back(counter(s.limiter, s.granted, {{"outcome", "granted"}}));
    decisions.metric.push_back(counter(s.limiter, s.denied, {{"outcome", "denied"}}));
    permits.metric.push_back(counter(s.limiter, s.permitsGranted));
    refunded.metric.push_back(counter(s.limiter, s.permitsRefunded));
    reservations.metric.push_back(counter(s.limiter, s.reservationsOpened, {{"state", "opened"}}));
    reservations.metric.push_back(counter(s.limiter, s.reservationsSettled, {{"state", "settled"}}));
    shadow.metric.push_back(counter(s.limiter, s.shadowDenied));
    local.metric.push_back(counter(s.limiter, s.localHits));
    localDenials.metric.push_back(counter(s.limiter, s.localDenials));
    trips.metric.push_back(counter(s.limiter, s.roundTrips));
    threw.metric.push_back(counter(s.limiter, s.callbacksThrew));
    for (std::size_t p = 0; p < kFailurePolicyCount; ++p) {
      for (std::size_t o = 0; o < kPolicyOutcomeCount; ++o) {
        if (s.policy[p][o] == 0) continue;
        policy.metric.push_back(
            counter(s.limiter, s.policy[p][o],
                    {{"policy", failurePolicyName(static_cast<FailurePolicy>(p))},
                     {"outcome", policyOutcomeName(static_cast<LimiterMetrics::PolicyOutcome>(o))}}));
      }
    }
    for (std::size_t k = 0; k < kErrorKindCount; ++k) {
      if (s.errors[k] == 0) continue;
      errors.metric.push_back(counter(s.limiter, s.errors[k], {{"type", errorKindName(static_cast<ErrorKind>(k))}}));
    }
    ClientMetric h;
    h.label.push_back({"limiter", s.limiter});
    h.histogram.sample_count = s.latency.count;
    h.histogram.sample_sum = s.latency.sumSeconds;
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
      cumulative += s.latency.counts[i];
      ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound = i < kLatencyBuckets.size() ? kLatencyBuckets[i] : std::numeric_limits<double>::infinity();
      h.histogram.bucket.push_back(b);
    }
    latency.metric.push_back(std::move(h));
    ClientMetric g;
    g.label.push_back({"limiter", s.limiter});
    g.gauge.value = static_cast<double>(s.degraded);
    degraded.metric.push_back(std::move(g));
  }
  std::vector<MetricFamily> out;
  out.reserve(13);  // the families below
  for (MetricFamily* f : {&decisions, &permits, &refunded, &reservations, &shadow, &local, &localDenials, &trips,
                          &threw, &policy, &errors, &latency, &degraded}) {
    out.push_back(std::move(*f));
  }
  return out;
}

std::string exposition(const std::shared_ptr<MetricsRegistry>& registry) {
  return ::prometheus::TextSerializer().Serialize(Collector(registry).Collect());
}

}  // namespace redlimit::prometheus
