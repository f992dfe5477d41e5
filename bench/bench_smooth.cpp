// SmoothRateLimiter: nanoseconds per call of tryAcquire() and reserve(), uncontended and with
// 2 and 4 threads contending for one limiter. The steady clock's now() is part of every call;
// the ManualClock variant shows the cost without it. Nothing here sleeps: a granted
// tryAcquire() never owes anything, and reserve() does not wait. A short summary goes to stdout
// and <results>/bench_smooth.summary.txt.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <redlimit/clock.hpp>
#include <redlimit/smooth_rate_limiter.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>

#include "support/bench_support.hpp"
#include "support/collect_reporter.hpp"

namespace {

using redlimit::SmoothRateLimiter;

constexpr double kNoLimit = std::numeric_limits<double>::infinity();

// Refused: the only permit of a 1/s limiter is taken; every call finds the limiter busy.
void BM_TryAcquireRefused(benchmark::State& state) {
  auto limiter = SmoothRateLimiter::bursty(1.0);
  (void)limiter.tryAcquire();
  for (auto _ : state) benchmark::DoNotOptimize(limiter.tryAcquire());
}
BENCHMARK(BM_TryAcquireRefused);

// Granted: a limiter with no limit grants every call (the full reservation path).
void BM_TryAcquireGranted(benchmark::State& state) {
  auto limiter = SmoothRateLimiter::bursty(kNoLimit);
  for (auto _ : state) benchmark::DoNotOptimize(limiter.tryAcquire());
}
BENCHMARK(BM_TryAcquireGranted);

// The same refused call without reading the steady clock.
void BM_TryAcquireRefusedManualClock(benchmark::State& state) {
  redlimit::ManualClock clock;
  auto limiter = redlimit::BasicSmoothRateLimiter<redlimit::ClockRef<redlimit::ManualClock>>::bursty(
      1.0, 1.0, redlimit::ClockRef<redlimit::ManualClock>(clock));
  (void)limiter.tryAcquire();
  for (auto _ : state) benchmark::DoNotOptimize(limiter.tryAcquire());
}
BENCHMARK(BM_TryAcquireRefusedManualClock);

void BM_ReserveBursty(benchmark::State& state) {
  auto limiter = SmoothRateLimiter::bursty(1e6);
  for (auto _ : state) benchmark::DoNotOptimize(limiter.reserve());
}
BENCHMARK(BM_ReserveBursty);

void BM_ReserveWarmingUp(benchmark::State& state) {
  auto limiter = SmoothRateLimiter::warmingUp(1e6, std::chrono::seconds{1});
  for (auto _ : state) benchmark::DoNotOptimize(limiter.reserve());
}
BENCHMARK(BM_ReserveWarmingUp);

// Contended: all benchmark threads share one limiter. At 1e6/s most calls are refused and some
// are granted. Real time per call, so the figure includes waiting for the mutex.
SmoothRateLimiter& sharedLimiter() {
  static auto limiter = SmoothRateLimiter::bursty(1e6);
  return limiter;
}

void BM_TryAcquireContended(benchmark::State& state) {
  SmoothRateLimiter& limiter = sharedLimiter();
  for (auto _ : state) benchmark::DoNotOptimize(limiter.tryAcquire());
}
BENCHMARK(BM_TryAcquireContended)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_ReserveContended(benchmark::State& state) {
  SmoothRateLimiter& limiter = sharedLimiter();
  for (auto _ : state) benchmark::DoNotOptimize(limiter.reserve());
}
BENCHMARK(BM_ReserveContended)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

using redlimit::bench::cell;

std::string summary(const redlimit::bench::CollectReporter& r) {
  namespace rb = redlimit::bench;
  std::ostringstream out;
  out << "Machine: " << rb::machineDescription("(not used)") << "\n"
      << "SmoothRateLimiter (bench_smooth), in-process, ns per call (real time)\n"
      << fmt::format(
             "  uncontended: tryAcquire granted {}, refused {} ({} without the clock read); "
             "reserve {} (bursty), {} (warming up)\n",
             cell(r.ns("BM_TryAcquireGranted")), cell(r.ns("BM_TryAcquireRefused")),
             cell(r.ns("BM_TryAcquireRefusedManualClock")), cell(r.ns("BM_ReserveBursty")),
             cell(r.ns("BM_ReserveWarmingUp")))
      << "  one limiter shared by N threads    tryAcquire: all threads / per thread   reserve: all threads / per "
         "thread\n";
  for (int t : {1, 2, 4}) {
    const std::string suffix = "/real_time/threads:" + std::to_string(t);
    const double a = r.ns("BM_TryAcquireContended" + suffix), b = r.ns("BM_ReserveContended" + suffix);
    out << fmt::format("  {} thread{}                          {:>10} / {:<10}            {:>10} / {:<10}\n", t,
                       t == 1 ? " " : "s", cell(a), cell(a * t), cell(b), cell(b * t));
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  redlimit::bench::CollectReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const std::string text = summary(reporter);
  std::cout << '\n' << text << std::flush;
  std::ofstream(redlimit::bench::resultsDir() + "/bench_smooth.summary.txt") << text;
  return 0;
}
