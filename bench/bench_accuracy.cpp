// bench_accuracy: the accuracy picture. 8 threads hammer one limiter of 100 permits per 200 ms
// for 3 s; every grant is recorded with the server's clock (AcquireResult::grantTime), and
// <results>/accuracy.svg plots grants per 50 ms bucket against the configured rate, one panel per
// limiter type. A summary goes to stdout and <results>/bench_accuracy.summary.txt.
//
// To add a limiter type: write a benchmark like BM_Accuracy_RateLimiter whose attempt returns
// the grant's time, and push its GrantSeries onto gChart.series; the SVG gets one more panel.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/redlimit.hpp"
#include "support/bench_support.hpp"
#include "support/svg.hpp"

namespace {

namespace rb = redlimit::bench;
using std::chrono::milliseconds;

constexpr int kThreads = 8;
constexpr std::int64_t kRate = 100;
constexpr milliseconds kInterval{200};
constexpr milliseconds kDuration{3000};
constexpr milliseconds kBucket{50};

rb::BenchServer* gServer = nullptr;
rb::AccuracyChart gChart{kRate, kInterval.count(), kBucket.count(), kDuration.count(), {}};

struct Row {
  std::string title;
  rb::SeriesStats stats;
  std::int64_t attempts = 0;
  std::int64_t errors = 0;
  std::int64_t bound = 0;  // the most the limit allows over the span of the grants
};
std::vector<Row> gRows;

/// Calls `attempt` from kThreads threads until kDuration has passed. `attempt` returns the grant's
/// time in epoch ms, or -1 when denied. Returns every grant time; counts attempts and failures.
template <class Attempt>
std::vector<std::int64_t> hammer(Attempt&& attempt, std::int64_t& attempts, std::int64_t& errors) {
  std::vector<std::vector<std::int64_t>> perThread(kThreads);
  std::atomic<std::int64_t> calls{0}, failed{0};
  const auto deadline = rb::Clock::now() + kDuration;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto& mine = perThread[static_cast<std::size_t>(t)];
      std::int64_t n = 0;
      while (rb::Clock::now() < deadline) {
        ++n;
        try {
          const std::int64_t at = attempt();
          if (at >= 0) mine.push_back(at);
        } catch (const std::exception&) {
          failed.fetch_add(1, std::memory_order_relaxed);
        }
      }
      calls.fetch_add(n, std::memory_order_relaxed);
    });
  }
  for (auto& th : threads) th.join();
  attempts = calls.load();
  errors = failed.load();
  std::vector<std::int64_t> all;
  for (auto& v : perThread) all.insert(all.end(), v.begin(), v.end());
  return all;
}

void record(benchmark::State& state, const std::string& title, std::vector<std::int64_t> grants,
            std::int64_t attempts, std::int64_t errors) {
  Row row{title, rb::analyseSeries(gChart, grants), attempts, errors, 0};
  if (!grants.empty()) {
    const auto [lo, hi] = std::minmax_element(grants.begin(), grants.end());
    const std::int64_t span = *hi - *lo + 1;
    row.bound = kRate * ((span + kInterval.count() - 1) / kInterval.count());
  }
  state.counters["grants"] = static_cast<double>(row.stats.grants);
  state.counters["attempts"] = static_cast<double>(attempts);
  state.counters["errors"] = static_cast<double>(errors);
  state.counters["max_in_any_window"] = static_cast<double>(row.stats.maxPerWindow);
  state.counters["max_per_bucket"] = static_cast<double>(row.stats.maxPerBucket);
  state.counters["limit_per_window"] = static_cast<double>(kRate);
  gChart.series.push_back(rb::GrantSeries{title, std::move(grants)});
  gRows.push_back(std::move(row));
}

void BM_Accuracy_RateLimiter(benchmark::State& state) {
  try {
    redlimit::ClientOptions options;
    options.connection.host = gServer->host();
    options.connection.port = gServer->port();
    options.connection.commandTimeout = std::chrono::seconds(10);
    options.pool.size = kThreads;
    options.pool.waitTimeout = std::chrono::seconds(10);
    auto client = redlimit::Client::create(options);
    redlimit::RateLimiter limiter(client, "bench:accuracy:rate_limiter");
    limiter.setRate(redlimit::RateType::Overall, kRate, kInterval);
    std::vector<std::int64_t> grants;
    std::int64_t attempts = 0, errors = 0;
    for (auto _ : state) {
      grants = hammer(
          [&] {
            const redlimit::AcquireResult r = limiter.tryAcquireUpTo(1, 1);
            return r.granted > 0 ? r.grantTime.count() : std::int64_t{-1};
          },
          attempts, errors);
      state.SetIterationTime(std::chrono::duration<double>(kDuration).count());
    }
    record(state, "RateLimiter::tryAcquire, 8 threads", std::move(grants), attempts, errors);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

std::string summary() {
  std::ostringstream out;
  out << "Accuracy (bench_accuracy): " << kThreads << " threads for " << kDuration.count() << " ms on one limiter of "
      << kRate << " permits per " << kInterval.count() << " ms; grant times from the server clock\n"
      << "  limiter                                 attempts   grants   most in any " << kInterval.count()
      << " ms window   limit   grants / most allowed\n";
  for (const Row& r : gRows) {
    out << rb::format("  %-38s %9lld %8lld %26lld %7lld   %5.1f%%%s\n", r.title.c_str(), static_cast<long long>(r.attempts),
                      static_cast<long long>(r.stats.grants), static_cast<long long>(r.stats.maxPerWindow),
                      static_cast<long long>(kRate),
                      r.bound > 0 ? 100.0 * static_cast<double>(r.stats.grants) / static_cast<double>(r.bound) : 0.0,
                      r.stats.maxPerWindow > kRate ? "   ABOVE THE LIMIT" : "");
    if (r.errors > 0) out << rb::format("    (%lld calls failed)\n", static_cast<long long>(r.errors));
  }
  out << "  picture: accuracy.svg\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    rb::BenchServer server;
    gServer = &server;
    benchmark::RegisterBenchmark("Accuracy/RateLimiter", BM_Accuracy_RateLimiter)->Iterations(1)->UseManualTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    gServer = nullptr;

    const std::string dir = rb::resultsDir();
    if (!gChart.series.empty()) std::ofstream(dir + "/accuracy.svg") << rb::renderAccuracySvg(gChart);
    const std::string text = summary();
    std::cout << '\n' << text << std::flush;
    std::ofstream(dir + "/bench_accuracy.summary.txt") << text;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_accuracy: %s\n", e.what());
    return 1;
  }
}
