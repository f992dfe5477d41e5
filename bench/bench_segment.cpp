// bench_segment: the SegmentedRateLimiter local-hit path next to a Redis round trip, in one run.
//
//   BM_SegmentLocalHit/threads:N    tryAcquire() served from the local segment (N threads on
//                                   one limiter; the segment is large enough that no call in
//                                   the run needs Redis — the run checks this)
//   BM_SegmentHitFrozenClock        the same path with a clock that costs nothing: what the
//                                   limiter itself costs, without the steady_clock read
//   BM_SteadyClockNow               steady_clock::now() alone (a vDSO read on Linux)
//   BM_RateLimiterTryAcquire        RateLimiter::tryAcquire(): one acquire script per call
//   BM_Ping                         a bare PING on a pooled connection, for scale
//
// Times are wall-clock (UseRealTime). With N threads Google Benchmark divides the wall time by
// the calls of all threads, so "Time" is the inverse of the total throughput; each thread sees
// N times that per call. At the end the run prints the cost split of the hit and the ratio of
// the round trip to the single-threaded hit.
// Run: cmake --preset release && cmake --build --preset release -j2 &&
//      build/release/bench/bench_segment --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit_test/redis_server.hpp"

namespace {

using namespace redlimit;

std::shared_ptr<Client> gClient;
std::shared_ptr<RateLimiter> gRemote;
std::unique_ptr<SegmentedRateLimiter<RateLimiter>> gSegment;

// A clock policy that never moves and costs nothing (the segment never expires).
struct FrozenClock {
  [[nodiscard]] std::chrono::microseconds now() const noexcept { return std::chrono::microseconds{1}; }
  void sleepFor(std::chrono::microseconds) const noexcept {}
};
std::unique_ptr<SegmentedRateLimiter<RateLimiter, FrozenClock>> gFrozen;

void BM_SegmentLocalHit(benchmark::State& state) {
  bool all = true;
  for (auto _ : state) {
    const bool ok = gSegment->tryAcquire();
    all = all && ok;
    benchmark::DoNotOptimize(ok);
  }
  if (!all) state.SkipWithError("a call was denied");
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SegmentLocalHit)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_SegmentHitFrozenClock(benchmark::State& state) {
  bool all = true;
  for (auto _ : state) {
    const bool ok = gFrozen->tryAcquire();
    all = all && ok;
    benchmark::DoNotOptimize(ok);
  }
  if (!all) state.SkipWithError("a call was denied");
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SegmentHitFrozenClock)->Threads(1)->UseRealTime();

void BM_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_SteadyClockNow)->UseRealTime();

void BM_RateLimiterTryAcquire(benchmark::State& state) {
  bool all = true;
  for (auto _ : state) {
    const bool ok = gRemote->tryAcquire();
    all = all && ok;
  }
  if (!all) state.SkipWithError("a call was denied");
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RateLimiterTryAcquire)->UseRealTime();

void BM_Ping(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(gClient->command({"PING"}));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Ping)->UseRealTime();

// Prints the console table and keeps each run's real time for the ratio.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (!r.error_occurred) ns_[r.benchmark_name()] = r.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  /// The median of the repetitions if there were several, else the one run; 0 if missing.
  double ns(const std::string& name) const {
    auto it = ns_.find(name + "_median");
    if (it == ns_.end()) it = ns_.find(name);
    return it == ns_.end() ? 0.0 : it->second;
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  redlimit::test::RedisServer server;
  gClient = Client::fromUri(server.uri());
  // A rate no run can use up, over an hour: every call is granted, none waits.
  gRemote = std::make_shared<RateLimiter>(gClient, "bench:remote");
  (void)gRemote->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
  auto segmentSource = std::make_shared<RateLimiter>(gClient, "bench:segment");
  (void)segmentSource->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
  SegmentOptions options;
  options.segmentSize = RateLimiter::kMaxRate;  // one refill for the whole run
  gSegment = std::make_unique<SegmentedRateLimiter<RateLimiter>>(segmentSource, options);
  auto frozenSource = std::make_shared<RateLimiter>(gClient, "bench:frozen");
  (void)frozenSource->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
  SegmentOptions frozenOptions = options;
  frozenOptions.returnWhenIdle = false;
  gFrozen = std::make_unique<SegmentedRateLimiter<RateLimiter, FrozenClock>>(frozenSource, frozenOptions);
  if (!gSegment->tryAcquire() || !gFrozen->tryAcquire()) {
    std::fprintf(stderr, "bench_segment: the first refill was denied\n");
    return 1;
  }

  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  const SegmentStats s = gSegment->stats();
  std::printf("\nsegment: %lld local grants, %lld round trips (1 = every hit was local)\n",
              static_cast<long long>(s.localGrants), static_cast<long long>(s.remoteRoundTrips));
  const double hit = reporter.ns("BM_SegmentLocalHit/real_time/threads:1");
  const double remote = reporter.ns("BM_RateLimiterTryAcquire/real_time");
  const double ping = reporter.ns("BM_Ping/real_time");
  const double frozen = reporter.ns("BM_SegmentHitFrozenClock/real_time/threads:1");
  const double clock = reporter.ns("BM_SteadyClockNow/real_time");
  if (frozen > 0 && clock > 0) {
    std::printf("of the hit: steady_clock::now() %.1f ns, the rest (load, checks, CAS) %.1f ns\n", clock, frozen);
  }
  if (hit > 0 && remote > 0) {
    std::printf("local hit (1 thread) %.1f ns; RateLimiter::tryAcquire %.1f us (%.0fx the hit)", hit, remote / 1000,
                remote / hit);
    if (ping > 0) std::printf("; PING %.1f us (%.0fx the hit)", ping / 1000, ping / hit);
    std::printf("\n");
  }
  gSegment.reset();
  gFrozen.reset();
  benchmark::Shutdown();
  return 0;
}
