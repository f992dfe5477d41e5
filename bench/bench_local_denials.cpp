// The deny cache (Limiter::Options / RateLimiter::Options denyCacheKeys): a hot key used up (a
// fixed window of 10 per 30 s for Limiter::decide, 10 per 30 s for RateLimiter::tryAcquire), then
// 1 and 8 threads calling it for about 2 s each. What a denial costs once Redis has denied the key:
// Redis script calls per decision (INFO commandstats, this program's only client), and the CPU
// nanoseconds per local denial (the threads' own CPU time, CLOCK_THREAD_CPUTIME_ID, over the calls
// they made), beside the wall time per call of all threads together. The same run with
// denyCacheKeys = 0 (every call a script call) is the baseline. A short summary goes to stdout and
// <results>/bench_local_denials.summary.txt.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>  // clock_gettime, CLOCK_THREAD_CPUTIME_ID (POSIX, through <time.h>)
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/client.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/rate_limiter.hpp"
#include "support/bench_support.hpp"

namespace {

namespace rb = redlimit::bench;
using redlimit::Client;
using redlimit::Limiter;
using redlimit::MetricsRegistry;
using redlimit::Policy;
using redlimit::RateLimiter;
using redlimit::RateType;

constexpr double kMaxCallsPerDecision = 0.01;  // Redis script calls per decision, target
constexpr double kMaxNsPerDenial = 200;        // ns per local denial, target
constexpr std::chrono::milliseconds kRun{2000};

double threadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// One run: `threads` threads calling `decide` (true = allowed) for kRun.
struct Run {
  std::uint64_t calls = 0;
  std::uint64_t allowed = 0;
  double cpuNs = 0;   // the threads' CPU time together
  double wallNs = 0;  // the run's
  std::int64_t scriptCalls = 0;
  std::uint64_t localDenials = 0;

  [[nodiscard]] double cpuNsPerCall() const { return calls == 0 ? std::nan("") : cpuNs / static_cast<double>(calls); }
  [[nodiscard]] double wallNsPerCall() const { return calls == 0 ? std::nan("") : wallNs / static_cast<double>(calls); }
  [[nodiscard]] double scriptCallsPerCall() const {
    return calls == 0 ? std::nan("") : static_cast<double>(scriptCalls) / static_cast<double>(calls);
  }
};

Run run(rb::RawRedis& admin, int threads, const std::function<bool()>& decide,
        const std::function<std::uint64_t()>& localDenials) {
  Run r;
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  std::vector<std::uint64_t> calls(static_cast<std::size_t>(threads)), allowed(calls.size());
  std::vector<double> cpu(calls.size());
  const rb::ServerSample before = rb::sampleServer(admin);
  const std::uint64_t localBefore = localDenials();
  std::atomic<bool> go{false};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto i = static_cast<std::size_t>(t);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double start = threadCpuNs();
      std::uint64_t n = 0, a = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 64; ++k) a += decide() ? 1 : 0;
        n += 64;
      }
      cpu[i] = threadCpuNs() - start;
      calls[i] = n;
      allowed[i] = a;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(kRun);
  stop.store(true);
  for (std::thread& t : pool) t.join();
  r.wallNs = static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    r.calls += calls[i];
    r.allowed += allowed[i];
    r.cpuNs += cpu[i];
  }
  r.scriptCalls = rb::ServerCost::between(before, rb::sampleServer(admin)).calls;
  r.localDenials = localDenials() - localBefore;
  return r;
}

using redlimit::bench::cell;

struct Face {
  std::string label;  // "Limiter::decide", "RateLimiter::tryAcquire"
  Run one, eight, uncached;
};

std::string summary(const std::string& machine, const std::vector<Face>& faces) {
  std::ostringstream out;
  out << "Deny cache (bench_local_denials), " << rb::nowText() << "\n"
      << "Machine: " << machine << "\n"
      << "A hot key used up (10 per 30 s), then N threads calling it for 2 s; ns of CPU per call are the\n"
      << "threads' own CPU time over their calls, wall ns per call the run's time over all threads' calls.\n\n"
      << "  face / run                                               calls   allowed  script calls  local denials"
         "  CPU ns/call  wall ns/call\n";
  for (const Face& f : faces) {
    const std::pair<const char*, const Run*> rows[] = {
        {"1 thread", &f.one}, {"8 threads", &f.eight}, {"8 threads, denyCacheKeys = 0", &f.uncached}};
    for (const auto& [what, r] : rows) {
      out << fmt::format("  {:<56} {:>8} {:>9} {:>13} {:>14} {:>12} {:>13}\n", f.label + ", " + what, r->calls,
                         r->allowed, r->scriptCalls, r->localDenials, cell(r->cpuNsPerCall(), 1),
                         cell(r->wallNsPerCall(), 1));
    }
  }
  out << "\n  Ratios and costs, each measured in this run                                   value  target\n";
  auto target = [&](const std::string& what, double value, double most) {
    const std::string verdict = std::isnan(value) ? "n/a" : value <= most ? "met" : "MISSED";
    out << fmt::format("  {:<76} {:>7}  {:<22} {}\n", what, cell(value, most < 1 ? 4 : 1), fmt::format("<= {:g}", most),
                       verdict);
  };
  auto report = [&](const std::string& what, double value) {
    out << fmt::format("  {:<76} {:>7}  {:<22} report\n", what, cell(value, 2), "");
  };
  for (const Face& f : faces) {
    target(f.label + ": Redis script calls per decision, 8 threads", f.eight.scriptCallsPerCall(),
           kMaxCallsPerDecision);
    target(f.label + ": CPU ns per local denial, 1 thread", f.one.cpuNsPerCall(), kMaxNsPerDenial);
    target(f.label + ": CPU ns per local denial, 8 threads", f.eight.cpuNsPerCall(), kMaxNsPerDenial);
    report(f.label + ": denials per s, 8 threads, cached / denyCacheKeys = 0",
           f.uncached.wallNsPerCall() / f.eight.wallNsPerCall());
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);  // takes run-bench.sh's --benchmark_out flags; no benchmark runs
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  rb::BenchServer server;
  rb::RawRedis admin(server.host(), server.port());
  auto client = Client::fromUri(server.uri());
  auto registry = std::make_shared<MetricsRegistry>();
  const auto localOf = [registry](const std::string& name) {
    return [registry, name] { return registry->snapshot(name).localDenials; };
  };
  // A face's three runs: `make(name, denyCacheKeys)` makes a limiter of `name` (counting into
  // `registry`) and returns its deciding call, after using the hot key up.
  const auto measure = [&](const std::string& label, const std::string& prefix, const auto& make) {
    Face f{label, {}, {}, {}};
    const std::string cached = prefix + ".cached", uncached = prefix + ".uncached";
    const std::function<bool()> decide = make(cached, std::size_t{10000});
    f.one = run(admin, 1, decide, localOf(cached));
    f.eight = run(admin, 8, decide, localOf(cached));
    f.uncached = run(admin, 8, make(uncached, std::size_t{0}), localOf(uncached));
    return f;
  };
  // 10 granted, then Redis's first denial (remembered); else the set-up is not what it says.
  const auto usedUp = [](const std::function<bool()>& decide) {
    int granted = 0;
    while (decide()) ++granted;
    if (granted != 10) throw std::runtime_error(fmt::format("bench: {} granted before the first denial", granted));
  };
  std::vector<Face> faces;
  faces.push_back(measure("Limiter::decide", "limiter", [&](const std::string& name, std::size_t keys) {
    Limiter::Options o;
    o.monitor.registry = registry;
    o.denyCacheKeys = keys;
    auto l = std::make_shared<Limiter>(client, name, Policy::fixedWindow(10, std::chrono::seconds(30)), o);
    std::function<bool()> decide = [l] { return l->decide("hot").allowed; };
    usedUp(decide);
    return decide;
  }));
  faces.push_back(measure("RateLimiter::tryAcquire", "ratelimiter", [&](const std::string& name, std::size_t keys) {
    RateLimiter::Options o;
    o.monitor.registry = registry;
    o.denyCacheKeys = keys;
    auto l = std::make_shared<RateLimiter>(client, name, o);
    (void)l->trySetRate(RateType::Overall, 10, std::chrono::seconds(30));
    std::function<bool()> decide = [l] { return l->tryAcquire(); };
    usedUp(decide);
    return decide;
  }));

  const std::string text = summary(rb::machineDescription(server.version()), faces);
  std::cout << text << std::flush;
  std::ofstream(rb::resultsDir() + "/bench_local_denials.summary.txt") << text;
  benchmark::Shutdown();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_local_denials: " << e.what() << "\n";
  return 1;
}
