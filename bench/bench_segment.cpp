// bench_segment: the SegmentedRateLimiter local-hit path next to a Redis round trip, in one run
// and how many calls still need Redis in a realistic run.
//
//   BM_SegmentLocalHit/threads:N    tryAcquire() served from the local segment (N threads on
//                                   one limiter; the segment is large enough that no call in
//                                   the run needs Redis — the run checks this)
//   BM_SegmentLocalHitNoMetrics     the 1-thread hit with the source's metrics off: the metrics'
//                                   cost on the hit is the difference
//   BM_SegmentLocalHitCoarse/...    the same with CoarseSteadyClock (opt-in, 4x cheaper clock read)
//   BM_SegmentHitFrozenClock        the same path with a clock that costs nothing: what the
//                                   limiter itself costs, without the clock read
//   BM_SteadyClockNow               std::chrono::steady_clock::now() alone (a vDSO read on Linux)
//   BM_CoarseSteadyClockNow         CoarseSteadyClock::now(), the opt-in fast clock
//   BM_RateLimiterTryAcquire        RateLimiter::tryAcquire(): one acquire script per call (also
//   ...NoMetrics, ...Again)         with metrics off, and each again: the metrics' cost on a decision)
//   BM_Ping                         a bare PING on a pooled connection, for scale
//   RedisFraction/<case>            segment 100, 4 threads paced at 5 000 calls/s each for 1 s:
//                                   the calls that needed Redis (SegmentStats::remoteRoundTrips
//                                   / calls), on a limiter whose rate is not the bottleneck and
//                                   on one that callers ask twice its rate of
//
// Times are wall-clock (UseRealTime). With N threads Google Benchmark divides the wall time by
// the calls of all threads, so "Time" is the inverse of the total throughput; each thread sees
// N times that per call. The summary (stdout and <results>/bench_segment.summary.txt) puts the
// targets first: the round trip >= 500x the single-threaded hit, and the hit <= 25 ns with the
// exact clock and metrics on, and its cost beyond its one clock read <= 10 ns.
// Run: cmake --preset release && cmake --build --preset release -j2 &&
//      build/release/bench/bench_segment --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/client.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "support/bench_support.hpp"
#include "support/collect_reporter.hpp"

namespace {

using namespace redlimit;
namespace rb = redlimit::bench;
using std::chrono::milliseconds;

std::shared_ptr<Client> gClient;
std::shared_ptr<RateLimiter> gRemote;
std::unique_ptr<SegmentedRateLimiter<RateLimiter>> gSegment;  // default: SteadyClock
// The same limiters with metrics off (LimiterMonitor::Options::metrics = false): the metrics' cost is the
// difference, measured in this run.
std::shared_ptr<RateLimiter> gRemoteNoMetrics;
std::unique_ptr<SegmentedRateLimiter<RateLimiter>> gSegmentNoMetrics;
std::unique_ptr<SegmentedRateLimiter<RateLimiter, CoarseSteadyClock>> gCoarse;  // opt-in fast clock

// A clock policy that never moves and costs nothing (the segment never expires).
struct FrozenClock {
  [[nodiscard]] std::chrono::microseconds now() const noexcept { return std::chrono::microseconds{1}; }
  void sleepFor(std::chrono::microseconds) const noexcept {}
};
std::unique_ptr<SegmentedRateLimiter<RateLimiter, FrozenClock>> gFrozen;

// Figures of the paced runs for the summary, by name.
std::map<std::string, double> gFig;

double fig(const std::string& key) {
  auto it = gFig.find(key);
  return it == gFig.end() ? std::nan("") : it->second;
}

// tryAcquire() from a segment that never runs dry, for every iteration of every thread.
template <class Limiter>
void hitLoop(benchmark::State& state, Limiter& limiter) {
  bool all = true;
  for (auto _ : state) {
    const bool ok = limiter.tryAcquire();
    all = all && ok;
    benchmark::DoNotOptimize(ok);
  }
  if (!all) state.SkipWithError("a call was denied");
  state.SetItemsProcessed(state.iterations());
}

void BM_SegmentLocalHit(benchmark::State& state) { hitLoop(state, *gSegment); }
BENCHMARK(BM_SegmentLocalHit)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_SegmentLocalHitNoMetrics(benchmark::State& state) { hitLoop(state, *gSegmentNoMetrics); }
BENCHMARK(BM_SegmentLocalHitNoMetrics)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_SegmentLocalHitCoarse(benchmark::State& state) { hitLoop(state, *gCoarse); }
BENCHMARK(BM_SegmentLocalHitCoarse)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_SegmentHitFrozenClock(benchmark::State& state) { hitLoop(state, *gFrozen); }
BENCHMARK(BM_SegmentHitFrozenClock)->Threads(1)->UseRealTime();

void BM_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_SteadyClockNow)->UseRealTime();

void BM_CoarseSteadyClockNow(benchmark::State& state) {
  const CoarseSteadyClock clock;
  for (auto _ : state) benchmark::DoNotOptimize(clock.now());
}
BENCHMARK(BM_CoarseSteadyClockNow)->UseRealTime();

void remoteLoop(benchmark::State& state, RateLimiter& limiter) {
  bool all = true;
  for (auto _ : state) {
    const bool ok = limiter.tryAcquire();
    all = all && ok;
  }
  if (!all) state.SkipWithError("a call was denied");
  state.SetItemsProcessed(state.iterations());
}
// With and without metrics, each twice in alternation, so that a drift of the machine during the
// run shows up in both (the summary takes the mean of each pair).
void BM_RateLimiterTryAcquire(benchmark::State& state) { remoteLoop(state, *gRemote); }
void BM_RateLimiterTryAcquireNoMetrics(benchmark::State& state) { remoteLoop(state, *gRemoteNoMetrics); }
BENCHMARK(BM_RateLimiterTryAcquire)->UseRealTime();
BENCHMARK(BM_RateLimiterTryAcquireNoMetrics)->UseRealTime();
BENCHMARK(BM_RateLimiterTryAcquire)->Name("BM_RateLimiterTryAcquireAgain")->UseRealTime();
BENCHMARK(BM_RateLimiterTryAcquireNoMetrics)->Name("BM_RateLimiterTryAcquireNoMetricsAgain")->UseRealTime();

// What the metrics add to one Redis decision, on its own: the monitor's count of the decision,
// the request counted, the second clock read and the histogram of its latency. Measured apart
// because the A/B difference of two round trips is smaller than this machine's noise.
void BM_MetricsOnADecision(benchmark::State& state) {
  LimiterMonitor::Options o;
  o.registry = std::make_shared<MetricsRegistry>();
  const LimiterMonitor monitor("bench:metrics", o);
  const SteadyClock clock;
  for (auto _ : state) {
    const auto started = clock.now();
    monitor.metrics()->roundTrip();
    monitor.metrics()->decisionLatency(clock.now() - started);
    benchmark::DoNotOptimize(monitor.admit(true, 1));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MetricsOnADecision)->UseRealTime();

void BM_Ping(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(detail::command(*gClient, {"PING"}));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Ping)->UseRealTime();

// --- How many calls need Redis: paced callers on one SegmentedRateLimiter -------------------------

constexpr int kPacedThreads = 4;
constexpr std::int64_t kCallsPerThread = 5000;  // per thread, over kPacedDuration
constexpr milliseconds kPacedDuration{1000};
constexpr std::int64_t kFractionSegment = 100;

struct Case {
  const char* key;
  std::int64_t rate;
  milliseconds interval;
};
// 20 000 calls/s offered in total: 20% of the first limiter's rate, twice the second's.
constexpr Case kCases[] = {{"roomy", 100000, milliseconds{1000}}, {"tight", 2000, milliseconds{200}}};

void BM_RedisFraction(benchmark::State& state) {
  const Case& c = kCases[static_cast<std::size_t>(state.range(0))];
  try {
    auto source = std::make_shared<RateLimiter>(gClient, std::string("bench:fraction:") + c.key);
    source->setRate(RateType::Overall, c.rate, c.interval);
    SegmentOptions options;
    options.segmentSize = kFractionSegment;
    SegmentedRateLimiter<RateLimiter> limiter(source, options);
    std::atomic<std::int64_t> calls{0}, granted{0}, failed{0};
    double seconds = 0;
    for (auto _ : state) {
      const auto period = std::chrono::duration_cast<rb::Clock::duration>(kPacedDuration) / kCallsPerThread;
      const auto start = rb::Clock::now();
      std::vector<std::thread> threads;
      for (int t = 0; t < kPacedThreads; ++t) {
        threads.emplace_back([&, t] {
          // Threads offset by a fraction of the period, so calls do not arrive in lockstep.
          const auto offset = period * t / kPacedThreads;
          std::int64_t mine = 0, ok = 0, bad = 0;
          for (std::int64_t i = 0; i < kCallsPerThread; ++i) {
            std::this_thread::sleep_until(start + offset + period * i);
            ++mine;
            try {
              if (limiter.tryAcquire()) ++ok;
            } catch (const std::exception&) {
              ++bad;
            }
          }
          calls.fetch_add(mine);
          granted.fetch_add(ok);
          failed.fetch_add(bad);
        });
      }
      for (auto& th : threads) th.join();
      seconds = std::chrono::duration<double>(rb::Clock::now() - start).count();
      state.SetIterationTime(seconds);
    }
    const SegmentStats s = limiter.stats();  // before close(): its give-back is not a call's
    const std::string k = std::string("fraction.") + c.key;
    const auto n = static_cast<double>(calls.load());
    gFig[k + ".calls"] = n;
    gFig[k + ".granted"] = static_cast<double>(granted.load());
    gFig[k + ".errors"] = static_cast<double>(failed.load());
    gFig[k + ".roundTrips"] = static_cast<double>(s.remoteRoundTrips);
    gFig[k + ".refillWaits"] = static_cast<double>(s.refillWaits);
    gFig[k + ".fraction"] = n > 0 ? static_cast<double>(s.remoteRoundTrips) / n : std::nan("");
    gFig[k + ".seconds"] = seconds;
    state.counters["calls"] = n;
    state.counters["granted"] = static_cast<double>(granted.load());
    state.counters["remote_round_trips"] = static_cast<double>(s.remoteRoundTrips);
    state.counters["refill_waits"] = static_cast<double>(s.refillWaits);
    state.counters["fraction_needing_redis"] = gFig[k + ".fraction"];
    if (failed.load() > 0) state.SkipWithError("some calls failed");
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_RedisFraction)->Name("RedisFraction/roomy")->Arg(0)->Iterations(1)->UseManualTime();
BENCHMARK(BM_RedisFraction)->Name("RedisFraction/tight")->Arg(1)->Iterations(1)->UseManualTime();

// --- Summary --------------------------------------------------------------------------------------

using redlimit::bench::cell;

std::string summary(const rb::CollectReporter& r, const std::string& machine, const SegmentStats& hitStats) {
  const double hit = r.ns("BM_SegmentLocalHit/real_time/threads:1");
  const double remote = r.ns("BM_RateLimiterTryAcquire/real_time");
  const double ping = r.ns("BM_Ping/real_time");
  std::ostringstream out;
  auto targetRow = [&](const char* what, double value, int precision, bool atLeast, double target) {
    const char* verdict = std::isnan(value) ? "n/a" : (atLeast ? value >= target : value <= target) ? "met" : "MISSED";
    const std::string goal = fmt::format("{} {:g}", atLeast ? ">=" : "<=", target);
    out << fmt::format("  {:<68} {:>7}  {:<7} {}\n", what, cell(value, precision), goal, verdict);
  };
  out << "Segment cache (bench_segment), " << rb::nowText() << "\n"
      << "Machine: " << machine << "\n"
      << "SegmentedRateLimiter<RateLimiter> (default clock: SteadyClock, exact) and\n"
      << "SegmentedRateLimiter<RateLimiter, CoarseSteadyClock> (opt-in); real time per call, Google Benchmark.\n\n"
      << "Targets, each measured in this run                                       value  target\n";
  const double coarseHit = r.ns("BM_SegmentLocalHitCoarse/real_time/threads:1");
  targetRow("RateLimiter::tryAcquire / local hit (1 thread, SteadyClock)", remote / hit, 0, true, 500);
  // The hit reads the clock once: what it costs beyond that read is the limiter's own work (the
  // target is at most 10 ns of it, metrics on; the clock read is the platform's, printed beside it).
  const double clockRead = r.ns("BM_SteadyClockNow/real_time");
  targetRow("local hit, 1 thread, ns per call (SteadyClock, the default, metrics on)", hit, 1, false, 25);
  targetRow(fmt::format("  of it beyond its one clock read ({} ns)", cell(clockRead)).c_str(), hit - clockRead, 1,
            false, 10);
  targetRow("local hit, 1 thread, ns per call (CoarseSteadyClock)", coarseHit, 1, false, 50);
  const double hitNoMetrics = r.ns("BM_SegmentLocalHitNoMetrics/real_time/threads:1");
  targetRow("metrics' cost on the local hit, ns (with - without, SteadyClock)", hit - hitNoMetrics, 1, false, 5);
  const double withMetrics = (remote + r.ns("BM_RateLimiterTryAcquireAgain/real_time")) / 2;
  const double withoutMetrics =
      (r.ns("BM_RateLimiterTryAcquireNoMetrics/real_time") + r.ns("BM_RateLimiterTryAcquireNoMetricsAgain/real_time")) /
      2;
  const double metricsWork = r.ns("BM_MetricsOnADecision/real_time");
  targetRow("metrics' work per Redis decision / its round trip, %", 100 * metricsWork / withoutMetrics, 3, false, 1);

  out << "\nLocal hit (tryAcquire from the segment)     ns per call, all threads   ns per call, per thread\n";
  for (const auto& [label, bench] :
       {std::pair<const char*, const char*>{"SteadyClock", "BM_SegmentLocalHit"},
        std::pair<const char*, const char*>{"SteadyClock, the source's metrics off", "BM_SegmentLocalHitNoMetrics"},
        std::pair<const char*, const char*>{"CoarseSteadyClock", "BM_SegmentLocalHitCoarse"}}) {
    out << "  " << label << "\n";
    for (int t : {1, 2, 4}) {
      const double ns = r.ns(std::string(bench) + "/real_time/threads:" + std::to_string(t));
      out << fmt::format("    {} thread{}                                {:>10}                 {:>10}\n", t,
                         t == 1 ? " " : "s", cell(ns), cell(ns * t));
    }
  }
  out << fmt::format("  frozen clock (no clock read), 1 thread    {:>10}\n",
                     cell(r.ns("BM_SegmentHitFrozenClock/real_time/threads:1")))
      << fmt::format("  clock reads: steady_clock::now() {} ns, CoarseSteadyClock::now() {} ns (may trail by {} us)\n",
                     cell(r.ns("BM_SteadyClockNow/real_time")), cell(r.ns("BM_CoarseSteadyClockNow/real_time")),
                     CoarseSteadyClock{}.maxLag().count())
      << fmt::format("  round trips: RateLimiter::tryAcquire {} us, PING {} us ({} x the hit)\n", cell(remote / 1000),
                     cell(ping / 1000), cell(ping / hit, 0))
      << fmt::format(
             "  metrics on a Redis decision: {} ns of work (BM_MetricsOnADecision); tryAcquire with metrics\n"
             "    {} / {} us, without {} / {} us, A/B {}% (two runs each, alternated: the spread is this "
             "machine's noise)\n",
             cell(metricsWork), cell(remote / 1000), cell(r.ns("BM_RateLimiterTryAcquireAgain/real_time") / 1000),
             cell(r.ns("BM_RateLimiterTryAcquireNoMetrics/real_time") / 1000),
             cell(r.ns("BM_RateLimiterTryAcquireNoMetricsAgain/real_time") / 1000),
             cell(100 * (withMetrics / withoutMetrics - 1), 2))
      << fmt::format("  the hit runs made {} round trip(s) for {} local grants (1 = all local)\n",
                     hitStats.remoteRoundTrips, hitStats.localGrants);

  out << "\nCalls that needed Redis: segment " << kFractionSegment << ", " << kPacedThreads << " threads paced at "
      << kCallsPerThread * 1000 / kPacedDuration.count() << " calls/s each for " << kPacedDuration.count() << " ms\n"
      << "  limiter                                       calls   granted  round trips  needed Redis\n";
  const std::pair<const char*, const char*> rows[] = {{"100000 per 1 s (rate not the bottleneck)", "roomy"},
                                                      {"2000 per 200 ms (offered 2x the rate)", "tight"}};
  for (const auto& [what, key] : rows) {
    const std::string k = std::string("fraction.") + key;
    out << fmt::format("  {:<42} {:>8}  {:>8}  {:>11}  {:>11}\n", what, cell(fig(k + ".calls"), 0),
                       cell(fig(k + ".granted"), 0), cell(fig(k + ".roundTrips"), 0),
                       cell(100 * fig(k + ".fraction"), 2) + "%");
    if (fig(k + ".errors") > 0) out << fmt::format("    ({:.0f} calls failed)\n", fig(k + ".errors"));
  }
  out << "  (RateLimiter alone: one round trip per call. A denied call finds the segment empty and asks\n"
      << "   Redis itself, unless another thread's refill is in flight.)\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    rb::BenchServer server;
    gClient = Client::fromUri(server.uri());
    // A rate no run can use up, over an hour: every call is granted, none waits.
    gRemote = std::make_shared<RateLimiter>(gClient, "bench:remote");
    (void)gRemote->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
    auto segmentSource = std::make_shared<RateLimiter>(gClient, "bench:segment");
    (void)segmentSource->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
    SegmentOptions options;
    options.segmentSize = RateLimiter::kMaxRate;  // one refill for the whole run
    gSegment = std::make_unique<SegmentedRateLimiter<RateLimiter>>(segmentSource, options);
    RateLimiter::Options noMetrics;
    noMetrics.monitor.metrics = false;
    gRemoteNoMetrics = std::make_shared<RateLimiter>(gClient, "bench:remote", noMetrics);
    auto plainSource = std::make_shared<RateLimiter>(gClient, "bench:segment-no-metrics", noMetrics);
    (void)plainSource->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
    gSegmentNoMetrics = std::make_unique<SegmentedRateLimiter<RateLimiter>>(plainSource, options);
    auto coarseSource = std::make_shared<RateLimiter>(gClient, "bench:coarse");
    (void)coarseSource->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
    gCoarse = std::make_unique<SegmentedRateLimiter<RateLimiter, CoarseSteadyClock>>(coarseSource, options);
    auto frozenSource = std::make_shared<RateLimiter>(gClient, "bench:frozen");
    (void)frozenSource->trySetRate(RateType::Overall, RateLimiter::kMaxRate, std::chrono::hours(1));
    SegmentOptions frozenOptions = options;
    frozenOptions.returnWhenIdle = false;
    gFrozen = std::make_unique<SegmentedRateLimiter<RateLimiter, FrozenClock>>(frozenSource, frozenOptions);
    if (!gSegment->tryAcquire() || !gSegmentNoMetrics->tryAcquire() || !gCoarse->tryAcquire() ||
        !gFrozen->tryAcquire()) {
      fmt::print(stderr, "bench_segment: the first refill was denied\n");
      return 1;
    }

    rb::CollectReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);

    const SegmentStats hitStats = gSegment->stats();
    const std::string text = summary(reporter, rb::machineDescription(server.version()), hitStats);
    std::cout << '\n' << text << std::flush;
    std::ofstream(rb::resultsDir() + "/bench_segment.summary.txt") << text;
    gSegment.reset();
    gSegmentNoMetrics.reset();
    gRemoteNoMetrics.reset();
    gCoarse.reset();
    gFrozen.reset();
    gRemote.reset();
    gClient.reset();
    benchmark::Shutdown();
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_segment: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_segment", e.what());
  return 1;
}
