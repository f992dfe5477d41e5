// bench_large_logs: the worst time one script call holds Redis when a limiter's permits log holds
// a million members, in each state that used to make a single call do work proportional to the
// log. Every call is bounded now: at most BATCH (1000) members are read, unpacked or
// removed per call, and expired members not yet reclaimed still count as in use.
//
// Per-call server time comes from SLOWLOG (threshold 0: every command is logged with its duration
// in µs). States, each on a fresh limiter of 2 000 000 permits per 60 s:
//   A. 500k expired + 500k live      tryAcquire until every expired member is reclaimed
//   B. 1M expired + 1 live           the same
//   C. 1M expired                    one tryAcquire (the whole log is dropped with UNLINK)
//   D. value key deleted, 1M live    tryAcquire (no recount: the limiter refuses until the log expires)
//   E. updateRate (keepState) over 1M live
// For A and B the Redisson-equivalent reference script (bench/reference_acquire.lua, which unpacks
// every expired member in one call) runs on a copy of the same state, for comparison.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "redlimit/redlimit.hpp"
#include "support/bench_support.hpp"

namespace {

namespace rb = redlimit::bench;
using redlimit::RateLimiter;
using redlimit::RateType;
using std::chrono::milliseconds;

constexpr std::int64_t kRate = 2000000;
constexpr std::int64_t kMillion = 1000000;
constexpr milliseconds kInterval{60000};

struct World {
  std::unique_ptr<rb::BenchServer> server;
  std::unique_ptr<rb::RawRedis> admin;
  std::string referenceSource;
  std::string referenceSha;
};
World* gWorld = nullptr;
std::map<std::string, double> gFig;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench: cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::int64_t serverTimeMs(rb::RawRedis& r) {
  auto t = r.command({"TIME"});
  return std::stoll(std::string(t->element[0]->str, t->element[0]->len)) * 1000 +
         std::stoll(std::string(t->element[1]->str, t->element[1]->len)) / 1000;
}

std::shared_ptr<redlimit::Client> patientClient() {
  redlimit::ClientOptions o;
  o.connection.host = gWorld->server->host();
  o.connection.port = gWorld->server->port();
  o.connection.commandTimeout = std::chrono::seconds(60);
  o.pool.size = 1;
  return redlimit::Client::create(o);
}

void fill(rb::RawRedis& r, const std::string& key, std::int64_t count, std::int64_t scoreMs, std::uint64_t seed) {
  rb::addOnePermitMembers(r, key, count, scoreMs, seed);
}

// Durations (µs) of the EVAL/EVALSHA calls in SLOWLOG since the last reset.
std::vector<double> scriptDurations(rb::RawRedis& r) {
  auto log = r.command({"SLOWLOG", "GET", "-1"});
  std::vector<double> out;
  for (std::size_t i = 0; i < log->elements; ++i) {
    const redisReply* e = log->element[i];
    if (e->elements < 4) continue;
    const redisReply* args = e->element[3];
    if (args->elements == 0) continue;
    const std::string cmd(args->element[0]->str, args->element[0]->len);
    if (cmd == "EVALSHA" || cmd == "EVAL" || cmd == "evalsha" || cmd == "eval") {
      out.push_back(static_cast<double>(e->element[2]->integer));
    }
  }
  return out;
}

void resetSlowlog(rb::RawRedis& r) { (void)r.command({"SLOWLOG", "RESET"}); }

struct Outcome {
  double worstUs = 0;
  double medianUs = 0;
  double calls = 0;
};

Outcome summarize(std::vector<double> d) {
  Outcome o;
  if (d.empty()) return o;
  o.calls = static_cast<double>(d.size());
  o.worstUs = *std::max_element(d.begin(), d.end());
  o.medianUs = rb::percentile(d, 50);
  return o;
}

void record(benchmark::State& state, const std::string& key, const Outcome& o) {
  for (auto _ : state) state.SetIterationTime(o.worstUs / 1e6);
  state.counters["worst_us"] = o.worstUs;
  state.counters["median_us"] = o.medianUs;
  state.counters["calls"] = o.calls;
  gFig[key + ".worst"] = o.worstUs;
  gFig[key + ".median"] = o.medianUs;
  gFig[key + ".calls"] = o.calls;
}

// The reference script (Redisson's call sequence) on `limiter`'s keys, one call. It leaves the
// Lua heap full of garbage (every expired member as a Lua string), whose collection would then
// stall later scripts for tens of ms: SCRIPT FLUSH gives the next measurement a fresh Lua state.
double referenceOnce(rb::RawRedis& r, const RateLimiter& limiter) {
  const auto& k = limiter.keys();
  resetSlowlog(r);
  auto reply = r.command(
      {"EVALSHA", gWorld->referenceSha, "5", k[0], k[1], k[2], k[3], k[4], "1", "1", "0123456789abcdef", "", "0"});
  const std::vector<double> d = scriptDurations(r);
  (void)r.command({"SCRIPT", "FLUSH"});
  auto loaded = r.command({"SCRIPT", "LOAD", gWorld->referenceSource});
  gWorld->referenceSha.assign(loaded->str, loaded->len);
  return d.empty() ? 0 : d.front();
}

// A, B: expired and live members; tryAcquire until no expired member is left.
void BM_ReclaimUntilClean(benchmark::State& state) {
  const bool oneLive = state.range(0) == 1;
  const std::string key = oneLive ? "B" : "A";
  try {
    rb::RawRedis& admin = *gWorld->admin;
    const std::int64_t expired = oneLive ? kMillion : kMillion / 2, live = oneLive ? 1 : kMillion / 2;
    auto setUp = [&](const std::string& name) {
      auto rl = std::make_unique<RateLimiter>(patientClient(), name);
      rl->setRate(RateType::Overall, kRate, kInterval);
      const std::int64_t now = serverTimeMs(admin);
      fill(admin, rl->keys()[3], expired, now - 2 * kInterval.count(), 1);
      fill(admin, rl->keys()[3], live, now, 2);
      (void)admin.command({"SET", rl->keys()[1], std::to_string(kRate - expired - live)});
      return rl;
    };
    auto rl = setUp("bench:large:" + key);
    resetSlowlog(admin);
    for (int i = 0; i < 5000; ++i) {
      if (!rl->tryAcquire()) throw std::runtime_error("bench: a grant was refused");
      auto card =
          admin.command({"ZCOUNT", rl->keys()[3], "-inf", std::to_string(serverTimeMs(admin) - kInterval.count())});
      if (card->integer == 0) break;
    }
    record(state, key, summarize(scriptDurations(admin)));
    (void)rl->deleteLimiter();
    auto reference = setUp("bench:large:" + key + ":ref");
    gFig[key + ".reference"] = referenceOnce(admin, *reference);
    state.counters["reference_us"] = gFig[key + ".reference"];
    (void)reference->deleteLimiter();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// C, D, E: one state each, the first call(s) on it.
void BM_OneState(benchmark::State& state) {
  static const char* kKeys[] = {"C", "D", "E"};
  const auto variant = state.range(0);
  const std::string key = kKeys[variant];
  try {
    rb::RawRedis& admin = *gWorld->admin;
    RateLimiter rl(patientClient(), "bench:large:" + key);
    rl.setRate(RateType::Overall, kRate, kInterval);
    const std::int64_t now = serverTimeMs(admin);
    if (variant == 0) {
      fill(admin, rl.keys()[3], kMillion, now - 2 * kInterval.count(), 3);
      (void)admin.command({"SET", rl.keys()[1], std::to_string(kRate - kMillion)});
    } else {
      fill(admin, rl.keys()[3], kMillion, now, 4);
      if (variant == 2) (void)admin.command({"SET", rl.keys()[1], std::to_string(kRate - kMillion)});
    }
    resetSlowlog(admin);
    if (variant == 0) {
      if (!rl.tryAcquire()) throw std::runtime_error("bench: the grant after expiry was refused");
    } else if (variant == 1) {
      if (rl.tryAcquire()) throw std::runtime_error("bench: a rebuild over 1M members granted");
      (void)rl.availablePermits();
    } else {
      if (!rl.updateRate(RateType::Overall, kRate / 2, kInterval)) throw std::runtime_error("bench: updateRate failed");
    }
    record(state, key, summarize(scriptDurations(admin)));
    (void)rl.deleteLimiter();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

std::string summary(const std::string& machine) {
  auto fig = [](const std::string& k) {
    auto it = gFig.find(k);
    return it == gFig.end() ? -1.0 : it->second;
  };
  auto cell = [](double v) { return v < 0 ? std::string("-") : fmt::format("{:.0f}", v); };
  std::ostringstream out;
  out << "redlimit benchmark (bench_large_logs), " << rb::nowText() << "\n"
      << "Machine: " << machine << "\n"
      << "One limiter of 2 000 000 permits per 60 s whose log holds 1 000 000 one-permit members;\n"
      << "server time of each script call from SLOWLOG (us). Bound: 1000 members per call.\n\n"
      << "  state                                           calls   worst us  median us   reference us\n";
  const std::pair<const char*, const char*> rows[] = {{"A. 500k expired + 500k live, until reclaimed", "A"},
                                                      {"B. 1M expired + 1 live, until reclaimed", "B"},
                                                      {"C. 1M expired (dropped whole)", "C"},
                                                      {"D. value key deleted, 1M live", "D"},
                                                      {"E. updateRate keepState, 1M live", "E"}};
  for (const auto& [what, k] : rows) {
    const std::string key = k;
    out << fmt::format("  {:<46} {:>6}  {:>9}  {:>9}   {:>12}\n", what, cell(fig(key + ".calls")),
                       cell(fig(key + ".worst")), cell(fig(key + ".median")), cell(fig(key + ".reference")));
  }
  out << "  (reference: bench/reference_acquire.lua, Redisson's call sequence, one call on the same state)\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    World world;
    world.server = std::make_unique<rb::BenchServer>();
    world.admin = std::make_unique<rb::RawRedis>(world.server->host(), world.server->port());
    (void)world.admin->command({"CONFIG", "SET", "slowlog-log-slower-than", "0"});
    (void)world.admin->command({"CONFIG", "SET", "slowlog-max-len", "100000"});
    world.referenceSource = readFile(REDLIMIT_BENCH_SOURCE_DIR "/reference_acquire.lua");
    auto loaded = world.admin->command({"SCRIPT", "LOAD", world.referenceSource});
    world.referenceSha.assign(loaded->str, loaded->len);
    gWorld = &world;
    const std::string machine = rb::machineDescription(world.server->version());

    benchmark::RegisterBenchmark("LargeLogs/reclaim_until_clean/500k_expired_500k_live", BM_ReclaimUntilClean)
        ->Arg(0)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("LargeLogs/reclaim_until_clean/1M_expired_1_live", BM_ReclaimUntilClean)
        ->Arg(1)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("LargeLogs/first_call/1M_expired", BM_OneState)
        ->Arg(0)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("LargeLogs/first_call/value_deleted_1M_live", BM_OneState)
        ->Arg(1)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("LargeLogs/first_call/updateRate_1M_live", BM_OneState)
        ->Arg(2)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();

    const std::string text = summary(machine);
    std::cout << '\n' << text << std::flush;
    std::ofstream(rb::resultsDir() + "/bench_large_logs.summary.txt") << text;
    gWorld = nullptr;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_large_logs: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_large_logs", e.what());
  return 1;
}
