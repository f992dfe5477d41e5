// deadline_lateness: how late past its deadline a request's answer comes when many requests are
// in flight and the server stops answering. Not a benchmark of `make bench` (run-bench.sh runs
// bench_* only): a measuring tool, built by the release preset as target deadline_lateness.
//
//   cmake --preset release && cmake --build --preset release --target deadline_lateness
//   build/release/bench/deadline_lateness [calls] [stopAfter]      (defaults 20000 10000)
//
// One thread makes `calls` async Limiter decisions (a GCRA policy; default options: the bound of a
// call is connectTimeout + commandTimeout = 1 000 ms) on 1 000 keys; after the first `stopAfter`
// it SIGSTOPs redis-server, so the rest (and whatever of the first was not answered yet) end by
// their deadline, through the failure policy. Each answer's time is taken in its callback; a
// call's deadline is taken as its start plus the bound (the library's own deadline is a little
// later, so lateness is over-, not under-stated). Prints the count of calls answered at or past
// their deadline and, over every call, the worst and the p50/p99 lateness of those.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "redlimit/redlimit.hpp"
#include "support/bench_support.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

int main(int argc, char** argv) try {
  const std::size_t calls = argc > 1 ? std::stoul(argv[1]) : 20000;
  const std::size_t stopAfter = argc > 2 ? std::stoul(argv[2]) : 10000;
  redlimit::bench::BenchServer server;
  redlimit::ClientOptions options;
  options.connection.host = server.host();
  options.connection.port = server.port();
  options.pool.maxPending = std::max<std::size_t>(options.pool.maxPending, calls * 2);
  const auto bound = options.connection.connectTimeout + options.connection.commandTimeout;
  auto client = redlimit::Client::create(options);
  redlimit::Limiter limiter(client, "lateness", redlimit::Policy::gcra(1000000, std::chrono::seconds(1), 1000000));
  (void)limiter.decide("warm:{0}");  // the script loaded, the connections open

  std::vector<Clock::time_point> started(calls), answered(calls);
  std::vector<std::string> keys;
  for (int k = 0; k < 1000; ++k) keys.push_back(fmt::format("lateness:{{{}}}", k));
  std::mutex m;
  std::condition_variable cv;
  std::size_t left = calls;
  std::atomic<std::size_t> failed{0}, byPolicy{0};
  for (std::size_t i = 0; i < calls; ++i) {
    if (i == stopAfter) ::kill(server.pid(), SIGSTOP);
    started[i] = Clock::now();
    limiter.decideAsync(keys[i % keys.size()], 1, [&, i](redlimit::Decision d, const std::exception_ptr& error) {
      answered[i] = Clock::now();
      if (error) failed.fetch_add(1, std::memory_order_relaxed);
      if (d.byPolicy) byPolicy.fetch_add(1, std::memory_order_relaxed);
      const std::lock_guard<std::mutex> lock(m);
      if (--left == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return left == 0; });
  }
  ::kill(server.pid(), SIGCONT);

  std::vector<double> late;  // ms past the deadline, of the calls answered at or past it
  double worst = -1e9;
  for (std::size_t i = 0; i < calls; ++i) {
    const double l = ms(answered[i] - (started[i] + bound));
    worst = std::max(worst, l);
    if (l >= 0) late.push_back(l);
  }
  std::sort(late.begin(), late.end());
  // The cost of one completion on the I/O thread: the longest run of answers that came back to
  // back (no gap of 1 ms or more), as a connection's timeout fails its whole queue at once.
  std::vector<Clock::time_point> times(answered);
  std::sort(times.begin(), times.end());
  std::size_t runStart = 0, bestStart = 0, bestEnd = 0;
  for (std::size_t i = 1; i <= times.size(); ++i) {
    if (i == times.size() || times[i] - times[i - 1] >= std::chrono::milliseconds(1)) {
      if (i - runStart > bestEnd - bestStart) bestStart = runStart, bestEnd = i;
      runStart = i;
    }
  }
  const std::size_t burst = bestEnd - bestStart;
  const double burstMs = burst > 1 ? ms(times[bestEnd - 1] - times[bestStart]) : 0.0;
  auto pct = [&](double p) { return late.empty() ? 0.0 : late[static_cast<std::size_t>(p * double(late.size() - 1))]; };
  fmt::print(
      "{} calls, redis SIGSTOPped after {}; bound {} ms; {} answered by the failure policy, {} with an error\n"
      "answered at or past the deadline: {}; lateness past the deadline: p50 {:.1f} ms, p99 {:.1f} ms, worst {:.1f} "
      "ms (worst answer {:.1f} ms after its call); the calls after the stop were made within {:.1f} ms\n"
      "longest run of back-to-back answers: {} in {:.1f} ms, {:.2f} µs per completion\n",
      calls, stopAfter, bound.count(), byPolicy.load(), failed.load(), late.size(), pct(0.5), pct(0.99), worst,
      worst + double(bound.count()), stopAfter < calls ? ms(started[calls - 1] - started[stopAfter]) : 0.0, burst,
      burstMs, burst > 1 ? burstMs * 1000.0 / double(burst - 1) : 0.0);
  return 0;
} catch (const std::exception& e) {  // what the library or the harness threw: said, not an abort
  std::fprintf(stderr, "deadline_lateness: %s\n", e.what());
  return 1;
}
