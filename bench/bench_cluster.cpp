// bench_cluster: what routing over a Redis Cluster costs. 10 000 RateLimiters decided by 8
// threads (one call each at a time) and by one thread with 256 asynchronous calls in flight, on
// one standalone server, on a cluster of one primary (every slot on one node: the cost of the
// cluster code path alone) and on a cluster of three primaries, all measured in one run. On a
// 2-core machine three servers share the cores with the client, so the 3-primary row cannot
// scale: it shows what spreading costs, not what it gains.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_test/redis_server.hpp"
#include "support/bench_support.hpp"

namespace rb = redlimit::bench;
using namespace std::chrono;

namespace {

constexpr int kLimiters = 10000;
constexpr int kThreads = 8;
constexpr int kInFlight = 256;
constexpr milliseconds kMeasure{3000};

std::string infoField(redlimit::Client& c, const std::string& section, const std::string& field) {
  const std::string text = redlimit::detail::command(c, {"INFO", section}).str;
  const auto at = text.find(field + ":");
  if (at == std::string::npos) return {};
  const auto start = at + field.size() + 1;
  return text.substr(start, text.find_first_of("\r\n", start) - start);
}

// N cluster-enabled servers with the slots split evenly, met, and agreeing (cluster_state:ok).
class BenchCluster {
 public:
  explicit BenchCluster(int primaries) {
    for (int i = 0; i < primaries; ++i) {
      // The bus on a port of its own: the default, port + 10000, does not exist above 55535.
      busPorts_.push_back(redlimit::test::freeLoopbackPort());
      nodes_.push_back(std::make_unique<redlimit::test::RedisServer>(std::vector<std::string>{
          "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
          "--cluster-port", std::to_string(busPorts_.back())}));
      admins_.push_back(redlimit::Client::fromUri(nodes_.back()->uri()));
    }
    for (int i = 0; i < primaries; ++i) {
      const int first = 16384 * i / primaries;
      const int last = 16384 * (i + 1) / primaries - 1;
      redlimit::detail::command(*admins_[static_cast<std::size_t>(i)],
                                {"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)});
      if (i > 0) {
        redlimit::detail::command(
            *admins_[static_cast<std::size_t>(i)],
            {"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[0]->port()), std::to_string(busPorts_[0])});
      }
    }
    const auto deadline = steady_clock::now() + seconds(30);
    for (;;) {
      bool ok = true;
      for (auto& a : admins_) {
        const std::string info = redlimit::detail::command(*a, {"CLUSTER", "INFO"}).str;
        ok = ok && info.find("cluster_state:ok") != std::string::npos &&
             info.find(fmt::format("cluster_known_nodes:{}", primaries)) != std::string::npos;
      }
      if (ok) break;
      if (steady_clock::now() > deadline) throw std::runtime_error("bench: the cluster did not form in 30 s");
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  [[nodiscard]] std::string uri() const {
    std::string u = "redis-cluster://";
    for (std::size_t i = 0; i < nodes_.size(); ++i) u += fmt::format("{}127.0.0.1:{}", i ? "," : "", nodes_[i]->port());
    return u;
  }

 private:
  std::vector<int> busPorts_;
  std::vector<std::unique_ptr<redlimit::test::RedisServer>> nodes_;
  std::vector<std::shared_ptr<redlimit::Client>> admins_;
};

struct Row {
  std::string target;
  double syncPerSecond = 0;
  double asyncPerSecond = 0;
  std::uint64_t errors = 0;
};

Row measure(const std::string& target, const std::string& uri) {
  Row row;
  row.target = target;
  auto client = redlimit::Client::fromUri(uri);
  std::vector<redlimit::RateLimiter> limiters;
  limiters.reserve(kLimiters);
  for (int i = 0; i < kLimiters; ++i) {
    limiters.emplace_back(client, "bench:cluster:" + std::to_string(i));
    limiters.back().setRate(redlimit::RateType::Overall, 1000000000, hours(1));
  }
  std::atomic<std::uint64_t> errors{0};

  // 8 threads, each one call at a time, each over the limiters in its own order.
  {
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> decisions{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::uint64_t n = 0;
        std::size_t i = static_cast<std::size_t>(t) * 1237;
        while (!stop.load(std::memory_order_relaxed)) {
          i = (i + 7919) % kLimiters;
          try {
            (void)limiters[i].tryAcquire();
            ++n;
          } catch (const redlimit::Error&) {
            errors.fetch_add(1);
          }
        }
        decisions.fetch_add(n);
      });
    }
    const auto start = steady_clock::now();
    std::this_thread::sleep_for(kMeasure);
    stop = true;
    for (auto& th : threads) th.join();
    row.syncPerSecond = static_cast<double>(decisions.load()) / duration<double>(steady_clock::now() - start).count();
  }

  // One thread keeping 256 asynchronous decisions in flight.
  {
    std::atomic<std::uint64_t> decisions{0};
    std::atomic<int> inFlight{0};
    const auto start = steady_clock::now();
    const auto end = start + kMeasure;
    std::size_t i = 0;
    while (steady_clock::now() < end) {
      if (inFlight.load(std::memory_order_acquire) >= kInFlight) {
        std::this_thread::yield();
        continue;
      }
      inFlight.fetch_add(1);
      i = (i + 7919) % kLimiters;
      limiters[i].decideAsync(1, [&](redlimit::Decision, const std::exception_ptr& error) {
        if (error) errors.fetch_add(1);
        decisions.fetch_add(1, std::memory_order_relaxed);
        inFlight.fetch_sub(1, std::memory_order_release);
      });
    }
    while (inFlight.load() > 0) std::this_thread::sleep_for(milliseconds(1));
    row.asyncPerSecond = static_cast<double>(decisions.load()) / duration<double>(steady_clock::now() - start).count();
  }
  row.errors = errors.load();
  return row;
}

std::string summary(const std::vector<Row>& rows, const std::string& machine) {
  std::string out = fmt::format("bench_cluster ({}): {} RateLimiters, each call on another limiter\n{}\n\n",
                                rb::nowText(), kLimiters, machine);
  out += fmt::format(
      "| target | {} threads, one call each, decisions/s | vs standalone | 1 thread, {} async in flight, "
      "decisions/s | vs standalone | errors |\n|---|---|---|---|---|---|\n",
      kThreads, kInFlight);
  for (const Row& r : rows) {
    out += fmt::format("| {} | {:.0f} | {:.2f} | {:.0f} | {:.2f} | {} |\n", r.target, r.syncPerSecond,
                       r.syncPerSecond / rows.front().syncPerSecond, r.asyncPerSecond,
                       r.asyncPerSecond / rows.front().asyncPerSecond, r.errors);
  }
  out +=
      "\nThe 1-primary cluster serves every slot from one server, as the standalone one does: the gap is the cost "
      "of the cluster path (slot lookup, a copy of each request for redirects). The 3-primary cluster adds two "
      "servers on the same two cores.\n";
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    std::vector<Row> rows;
    std::string version;
    {
      redlimit::test::RedisServer standalone;
      auto admin = redlimit::Client::fromUri(standalone.uri());
      version = infoField(*admin, "server", "redis_version");
      rows.push_back(measure("standalone server", standalone.uri()));
    }
    {
      BenchCluster one(1);
      rows.push_back(measure("cluster, 1 primary", one.uri()));
    }
    {
      BenchCluster three(3);
      rows.push_back(measure("cluster, 3 primaries", three.uri()));
    }
    // Nothing is registered with Google Benchmark (its flags are parsed, for run-bench.sh): the
    // measurements above are whole-run throughputs, printed as a table.
    const std::string text = summary(rows, rb::machineDescription(version));
    std::cout << text << std::flush;
    std::ofstream(rb::resultsDir() + "/bench_cluster.summary.txt") << text;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cluster: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_cluster", e.what());
  return 1;
}
