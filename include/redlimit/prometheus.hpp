// redlimit — the Prometheus exporter (the optional component redlimit::prometheus, built when
// prometheus-cpp is found): the metrics of a MetricsRegistry as Prometheus metric families.
//
//   auto exposer = std::make_shared<prometheus::Exposer>("0.0.0.0:9464");
//   auto collector = std::make_shared<redlimit::prometheus::Collector>();  // the global registry
//   exposer->RegisterCollectable(collector);  // GET /metrics; held weakly: keep `collector` alive
//
// Each scrape reads the registry's counters (one relaxed load each); nothing is copied on the
// decision path. Families (label `limiter` on every one; names past the registry's cap share
// limiter="other"):
//   redlimit_decisions_total{outcome="granted|denied"}              counter
//   redlimit_permits_granted_total                                  counter
//   redlimit_permits_refunded_total                                 counter (refund(); grants stay counted)
//   redlimit_reservations_total{state="opened|settled"}             counter (reserveFor records, settles)
//   redlimit_shadow_denials_total                                   counter (shadow mode's let-through denials)
//   redlimit_local_hits_total                                       counter (segment cache hits, in decisions)
//   redlimit_local_denials_total                                    counter (deny cache answers, in decisions)
//   redlimit_redis_round_trips_total                                counter (requests sent to Redis to decide)
//   redlimit_policy_decisions_total{policy="...",outcome="granted|denied|thrown"}   counter
//     (one word, "granted", for a permitted decision in every family)
//   redlimit_errors_total{type="timeout|closed|..."}                counter
//   redlimit_decision_seconds                                       histogram (deciding calls' latency)
//   redlimit_degraded                                               gauge (handles degraded now)
// The policy and error series appear once they are non-zero.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "redlimit/metrics.hpp"

namespace redlimit::prometheus {

/// A prometheus-cpp Collectable over a MetricsRegistry. Thread-safe (scrapes may run concurrently
/// with decisions and with each other).
class Collector : public ::prometheus::Collectable {
 public:
  /// Exports `registry` (default: the one limiters use unless told otherwise). Throws
  /// InvalidArgument for a null registry.
  explicit Collector(std::shared_ptr<MetricsRegistry> registry = MetricsRegistry::global());

  [[nodiscard]] std::vector<::prometheus::MetricFamily> Collect() const override;

 private:
  std::shared_ptr<MetricsRegistry> registry_;
};

/// The registry's metrics in the Prometheus text exposition format (version 0.0.4), for a service
/// that serves /metrics with its own HTTP server.
[[nodiscard]] std::string exposition(const std::shared_ptr<MetricsRegistry>& registry = MetricsRegistry::global());

}  // namespace redlimit::prometheus
