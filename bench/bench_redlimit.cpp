// bench_redlimit: what one RateLimiter decision costs, each figure beside its baseline measured
// in the same run, then a summary table of ratios (stdout and <results>/bench_redlimit.summary.txt).
//
//  1.-3. PING through redlimit's Client and through raw hiredis (the round-trip floor),
//        EVALSHA of acquire.lua through raw hiredis, RateLimiter::tryAcquire: interleaved call by
//        call, granted and denied; p50 and p99
//  4.    1..16 threads sharing one Client: one hot limiter, 10 000 limiters
//  5.    server cost per call of each script; acquire.lua against bench/reference_acquire.lua
//        on equal state (three servers in lockstep)
//  6.    growth of the permits log: 10, 1k, 100k live members; first acquire after 100k expired
//  7.    memory of one limiter's keys after 1k, 10k, 100k grants
//
// Latencies are timed per call by the caller (steady_clock around the call); p50/p99 are user
// counters, and the manual time Google Benchmark reports is the library call's.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_lua.hpp"
#include "support/bench_support.hpp"
#include "support/raw_acquire.hpp"

namespace {

namespace rb = redlimit::bench;
using rb::RawAcquire;
using redlimit::RateLimiter;
using redlimit::RateType;
using std::chrono::milliseconds;

constexpr std::int64_t kHuge = 1000000000;  // a rate no benchmark reaches: every call is granted
constexpr milliseconds kHour{3600000};      // an interval nothing expires in during the run
constexpr int kWarmup = 200;                // untimed calls before each latency benchmark
constexpr int kLatencyIterations = 4000;    // timed rounds per latency benchmark
constexpr std::string_view kEmptyScript = "return 1";

// --- State of the run -------------------------------------------------------------------------

struct World {
  std::unique_ptr<rb::BenchServer> server;   // everything but the script-cost comparison
  std::unique_ptr<rb::BenchServer> cost[3];  // for the acquire.lua / reference comparison
  std::unique_ptr<rb::RawRedis> admin;       // raw connection to `server`
  std::string referenceSource;
  std::string referenceSha;
  std::string emptySha;  // `return 1`: what any script costs
};
World* gWorld = nullptr;

// Figures for the summary, by name. Filled by the benchmarks (main thread or thread 0).
std::map<std::string, double> gFig;
std::mutex gFigMutex;

void figure(const std::string& key, double value) {
  std::lock_guard<std::mutex> lock(gFigMutex);
  gFig[key] = value;
}

redlimit::ClientOptions clientOptions(const rb::BenchServer& server, std::size_t poolSize) {
  redlimit::ClientOptions o;
  o.connection.host = server.host();
  o.connection.port = server.port();
  // Generous: a loaded 2-core machine must show up as latency, not as a TimeoutError.
  o.connection.commandTimeout = std::chrono::seconds(10);
  o.pool.size = poolSize;
  return o;
}

std::string freshName(const std::string& what) {
  static std::atomic<int> counter{0};
  return "bench:" + what + ":" + std::to_string(++counter);
}

std::int64_t serverTimeMs(rb::RawRedis& r) {
  auto t = r.command({"TIME"});
  return std::stoll(std::string(t->element[0]->str, t->element[0]->len)) * 1000 +
         std::stoll(std::string(t->element[1]->str, t->element[1]->len)) / 1000;
}

// The reference script as sent: without comment lines and blank lines, so a plain EVAL does not
// hash our comments on every call.
std::string stripLuaComments(const std::string& source) {
  std::istringstream in(source);
  std::string line, out;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line.compare(first, 2, "--") == 0) continue;
    out += line;
    out += '\n';
  }
  return out;
}

std::string loadScript(rb::RawRedis& r, std::string_view source) {
  auto reply = r.command({"SCRIPT", "LOAD", source});
  return std::string(reply->str, reply->len);
}

// Writes `count` members of one permit each, stamped `scoreMs`, into the limiter's permits log and
// sets its value: the state a limiter would have after that many grants.
void prefill(rb::RawRedis& r, const RateLimiter& limiter, std::int64_t count, std::int64_t scoreMs,
             std::int64_t value) {
  const auto& keys = limiter.keys();
  rb::addOnePermitMembers(r, keys[3], count, scoreMs, static_cast<std::uint64_t>(scoreMs));
  const std::string v = std::to_string(value);
  (void)r.command({"SET", keys[1], v});
}

// Runs `body`; a failure skips the benchmark with the message instead of ending the program.
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// --- 1.-3. Round-trip floor, raw script, tryAcquire ----------------------------------------------

// A fresh limiter on `client`: granted = a rate no one reaches; denied = 1 permit per hour, taken.
// Its deny cache is off: every call is a round trip, as the raw calls it is compared with are
// (bench_local_denials measures the cache's answers).
std::unique_ptr<RateLimiter> makeLimiter(const std::shared_ptr<redlimit::Client>& client, bool granted) {
  RateLimiter::Options options;
  options.denyCacheKeys = 0;
  auto limiter = std::make_unique<RateLimiter>(client, freshName(granted ? "granted" : "denied"), options);
  limiter->setRate(RateType::Overall, granted ? kHuge : 1, kHour);
  if (!granted && !limiter->tryAcquire()) throw std::runtime_error("bench: could not take the only permit");
  return limiter;
}

// The calls a user compares, interleaved call by call (the order rotates every round) so that
// drift in the machine's load hits all of them alike:
//   PING through redlimit's Client, PING through raw hiredis (the round-trip floor),
//   EVALSHA of `return 1` with acquire's arguments (what any script costs), EVALSHA of
//   acquire.lua through raw hiredis, RateLimiter::tryAcquire (same limiter, same arguments: the
//   script's share and the library's). Manual time = tryAcquire's.
void BM_RoundTrips(benchmark::State& state) {
  const bool granted = state.range(0) == 1;
  guarded(state, [&] {
    const rb::BenchServer& server = *gWorld->server;
    rb::RawRedis rawPing(server.host(), server.port());
    rb::RawRedis rawScript(server.host(), server.port());
    auto client = redlimit::Client::create(clientOptions(server, 1));
    auto limiter = makeLimiter(client, granted);
    RawAcquire script("EVALSHA", redlimit::detail::lua::acquire.sha1, limiter->keys());
    RawAcquire empty("EVALSHA", gWorld->emptySha, limiter->keys());
    const std::int64_t expected = granted ? 1 : 0;
    const char* pingArgv[] = {"PING"};
    const std::size_t pingLen[] = {4};

    enum Kind { kPingConnection, kPingHiredis, kEmptyHiredis, kScriptHiredis, kTryAcquire, kKinds };
    auto run = [&](int kind) {
      switch (kind) {
        case kPingConnection:
          benchmark::DoNotOptimize(redlimit::detail::command(*client, {"PING"}));
          break;
        case kPingHiredis: {
          auto* r = static_cast<redisReply*>(redisCommandArgv(rawPing.get(), 1, pingArgv, pingLen));
          if (r == nullptr) throw std::runtime_error("bench: PING failed");
          freeReplyObject(r);
          break;
        }
        case kEmptyHiredis:
          empty.newId();
          empty.callAnyReply(rawScript.get());
          break;
        case kScriptHiredis:
          script.newId();
          if (script.call(rawScript.get()) != expected) throw std::runtime_error("bench: unexpected decision");
          break;
        default:
          if (limiter->tryAcquire() != granted) throw std::runtime_error("bench: unexpected decision");
      }
    };
    for (int i = 0; i < kWarmup; ++i) {
      for (int k = 0; k < kKinds; ++k) run(k);
    }
    std::vector<double> us[kKinds];
    int round = 0;
    for (auto _ : state) {
      for (int step = 0; step < kKinds; ++step) {
        const int kind = (round + step) % kKinds;
        const auto t0 = rb::Clock::now();
        run(kind);
        const double d = rb::micros(t0, rb::Clock::now());
        us[kind].push_back(d);
        if (kind == kTryAcquire) state.SetIterationTime(d / 1e6);
      }
      ++round;
    }
    const char* names[] = {"ping_connection", "ping_hiredis", "empty_script_hiredis", "evalsha_hiredis", "tryAcquire"};
    for (int k = 0; k < kKinds; ++k) {
      const rb::LatencySummary s = rb::summarize(us[k]);
      state.counters[std::string(names[k]) + "_p50_us"] = s.p50;
      state.counters[std::string(names[k]) + "_p99_us"] = s.p99;
      const std::string key = std::string(granted ? "granted." : "denied.") + names[k];
      figure(key + ".p50", s.p50);
      figure(key + ".p99", s.p99);
    }
  });
}

// --- 4. Threads sharing one Client --------------------------------------------------------------

constexpr std::size_t kDistinctLimiters = 10000;

struct ThreadRun {
  std::shared_ptr<redlimit::Client> client;
  std::deque<RateLimiter> limiters;               // 1 (hot) or kDistinctLimiters
  std::vector<std::vector<double>> latencies;     // per thread, µs
  std::vector<rb::Clock::time_point> begin, end;  // per thread: first call, last reply
  std::atomic<std::uint64_t> next{0};
  std::atomic<std::uint64_t> errors{0};
};
ThreadRun* gRun = nullptr;

void setupThreads(const benchmark::State& state, bool distinct) {
  static bool distinctConfigured = false;
  auto threads = static_cast<std::size_t>(state.threads());
  gRun = new ThreadRun;
  gRun->client = redlimit::Client::create(clientOptions(*gWorld->server, threads));
  gRun->latencies.resize(threads);
  gRun->begin.resize(threads);
  gRun->end.resize(threads);
  if (!distinct) {
    gRun->limiters.emplace_back(gRun->client, freshName("hot"));
    gRun->limiters.back().setRate(RateType::Overall, kHuge, kHour);
    return;
  }
  for (std::size_t i = 0; i < kDistinctLimiters; ++i) {
    gRun->limiters.emplace_back(gRun->client, "bench:many:" + std::to_string(i));
  }
  if (!distinctConfigured) {  // once per run: 10 000 configurations
    for (RateLimiter& l : gRun->limiters) l.setRate(RateType::Overall, kHuge, kHour);
    distinctConfigured = true;
  }
}
void setupHot(const benchmark::State& state) { setupThreads(state, false); }
void setupDistinct(const benchmark::State& state) { setupThreads(state, true); }
void teardownThreads(const benchmark::State&) {
  delete gRun;
  gRun = nullptr;
}

void BM_Threads(benchmark::State& state, bool distinct) {
  ThreadRun& run = *gRun;
  const auto me = static_cast<std::size_t>(state.thread_index());
  std::vector<double>& us = run.latencies[me];
  us.reserve(static_cast<std::size_t>(state.max_iterations));
  bool first = true;
  for (auto _ : state) {
    RateLimiter& limiter = distinct
                               ? run.limiters[run.next.fetch_add(1, std::memory_order_relaxed) % run.limiters.size()]
                               : run.limiters[0];
    const auto t0 = rb::Clock::now();
    try {
      benchmark::DoNotOptimize(limiter.tryAcquire());
    } catch (const std::exception&) {
      run.errors.fetch_add(1, std::memory_order_relaxed);  // never leave the loop: the others wait for us
    }
    const auto t1 = rb::Clock::now();
    if (first) run.begin[me] = t0;
    first = false;
    run.end[me] = t1;
    us.push_back(rb::micros(t0, t1));
  }
  state.SetItemsProcessed(state.iterations());
  if (me != 0) return;
  // Every thread has left its loop (Google Benchmark's stop barrier): merge.
  std::vector<double> all;
  for (auto& v : run.latencies) all.insert(all.end(), v.begin(), v.end());
  const auto begin = *std::min_element(run.begin.begin(), run.begin.end());
  const auto end = *std::max_element(run.end.begin(), run.end.end());
  const double seconds = std::chrono::duration<double>(end - begin).count();
  const double perSecond = static_cast<double>(all.size()) / seconds;
  const rb::LatencySummary s = rb::summarize(all);
  state.counters["p50_us"] = s.p50;
  state.counters["p99_us"] = s.p99;
  state.counters["decisions_per_s"] = perSecond;
  state.counters["errors"] = static_cast<double>(run.errors.load());
  const std::string key =
      std::string(distinct ? "threads.distinct." : "threads.hot.") + std::to_string(state.threads());
  figure(key + ".rate", perSecond);
  figure(key + ".p99", s.p99);
  figure(key + ".errors", static_cast<double>(run.errors.load()));
}
void BM_Threads_HotLimiter(benchmark::State& state) { BM_Threads(state, false); }
void BM_Threads_10kLimiters(benchmark::State& state) { BM_Threads(state, true); }

// --- 5. Server cost of each script ---------------------------------------------------------------

// The acquire script and the reference, compared on equal state: three variants (acquire.lua by
// EVALSHA, reference_acquire.lua by EVALSHA, the reference as a plain EVAL), each on its own
// throwaway server, called in lockstep with the same keys and member ids, so every call of one
// meets the state the matching call of the others meets. Each server runs one variant at a time,
// so INFO commandstats and INFO cpu separate them; three phases rotate the variants over the
// servers so no server's luck favours one of them.
constexpr int kVariants = 3;
const char* const kVariantNames[kVariants] = {"ours", "ref", "ref_eval"};

struct Lockstep {
  std::vector<std::shared_ptr<redlimit::Client>> clients;
  std::vector<std::unique_ptr<rb::RawRedis>> raw;  // per variant: its server
  std::vector<std::unique_ptr<RawAcquire>> calls;  // per variant

  // Variant v runs on cost server (v + phase) % 3.
  Lockstep(int phase, std::int64_t rate, milliseconds interval) {
    const std::string name = freshName("cost");
    std::string clientId;
    for (int v = 0; v < kVariants; ++v) {
      const rb::BenchServer& server = *gWorld->cost[static_cast<std::size_t>((v + phase) % kVariants)];
      auto options = clientOptions(server, 1);
      options.clientId = clientId;  // identical keys on every server
      clients.push_back(redlimit::Client::create(options));
      clientId = clients.back()->clientId();
      RateLimiter limiter(clients.back(), name);
      limiter.setRate(RateType::Overall, rate, interval);
      raw.push_back(std::make_unique<rb::RawRedis>(server.host(), server.port()));
      (void)loadScript(*raw.back(), redlimit::detail::lua::acquire.source);
      (void)loadScript(*raw.back(), gWorld->referenceSource);
      if (v == 0)
        calls.push_back(std::make_unique<RawAcquire>("EVALSHA", redlimit::detail::lua::acquire.sha1, limiter.keys()));
      if (v == 1) calls.push_back(std::make_unique<RawAcquire>("EVALSHA", gWorld->referenceSha, limiter.keys()));
      if (v == 2) calls.push_back(std::make_unique<RawAcquire>("EVAL", gWorld->referenceSource, limiter.keys()));
    }
  }

  // One call of every variant; throws if they decide differently.
  void step() {
    calls[0]->newId();
    std::int64_t first = 0;
    for (int v = 0; v < kVariants; ++v) {
      const auto i = static_cast<std::size_t>(v);
      if (v > 0) calls[i]->copyId(*calls[0]);
      const std::int64_t granted = calls[i]->call(raw[i]->get());
      if (v == 0) first = granted;
      if (granted != first) throw std::runtime_error("bench: acquire.lua and the reference decided differently");
    }
  }
  // `n` calls of every variant, pipelined (set-up only).
  void pipelined(int n) {
    for (int done = 0; done < n;) {
      const int batch = std::min(500, n - done);
      for (int b = 0; b < batch; ++b) {
        calls[0]->newId();
        for (std::size_t v = 0; v < kVariants; ++v) {
          if (v > 0) calls[v]->copyId(*calls[0]);
          calls[v]->append(raw[v]->get());
        }
      }
      for (int b = 0; b < batch; ++b) {
        for (std::size_t v = 0; v < kVariants; ++v) (void)RawAcquire::read(raw[v]->get());
      }
      done += batch;
    }
  }
  // Server cost of each variant while `body` runs.
  std::array<rb::ServerCost, kVariants> measure(const std::function<void()>& body) {
    std::array<rb::ServerSample, kVariants> before;
    for (std::size_t v = 0; v < kVariants; ++v) before[v] = rb::sampleServer(*raw[v]);
    body();
    std::array<rb::ServerCost, kVariants> out;
    for (std::size_t v = 0; v < kVariants; ++v) out[v] = rb::ServerCost::between(before[v], rb::sampleServer(*raw[v]));
    return out;
  }
};

// range(0): 0 granted (1k live members, nothing expires); 1 steady (every call is granted and
// returns what expired since the previous one: a 50 ms window); 2 denied (rate 1000, used up);
// 3 the first call after 1000 members expired at once.
void BM_ServerCost_Acquire(benchmark::State& state) {
  const auto scenario = state.range(0);
  static const char* kKeys[] = {"granted", "steady", "denied", "burst1k"};
  guarded(state, [&] {
    constexpr int kSteps = 1500;
    std::array<rb::ServerCost, kVariants> cost{};
    const auto t0 = rb::Clock::now();
    for (int phase = 0; phase < kVariants; ++phase) {
      if (scenario <= 2) {
        Lockstep ls(phase, scenario == 2 ? 1000 : kHuge, scenario == 1 ? milliseconds{50} : kHour);
        ls.pipelined(1000);
        if (scenario == 1) {
          for (int i = 0; i < 500; ++i) ls.step();  // the steady state of a 50 ms window
        }
        const auto c = ls.measure([&] {
          for (int i = 0; i < kSteps; ++i) ls.step();
        });
        for (std::size_t v = 0; v < kVariants; ++v) cost[v].add(c[v]);
      } else {
        Lockstep ls(phase, kHuge, milliseconds{20});
        for (int cycle = 0; cycle < 4; ++cycle) {
          ls.pipelined(1000);
          std::this_thread::sleep_for(milliseconds{30});  // all 1000 expire
          const auto c = ls.measure([&] { ls.step(); });
          for (std::size_t v = 0; v < kVariants; ++v) cost[v].add(c[v]);
        }
      }
    }
    if (scenario == 3) {
      // INFO cpu cannot resolve a single call (the INFO command itself weighs as much)
      for (auto& c : cost) c.cpuUsPerCall = std::nan("");
    }
    for (auto _ : state) state.SetIterationTime(std::chrono::duration<double>(rb::Clock::now() - t0).count());
    for (std::size_t v = 0; v < kVariants; ++v) {
      const std::string n = kVariantNames[v];
      state.counters[n + "_usec_per_call"] = cost[v].usecPerCall;
      state.counters[n + "_cpu_us_per_call"] = cost[v].cpuUsPerCall;
      state.counters[n + "_lua_and_glue_us_per_call"] = cost[v].usecPerCall - cost[v].innerPerCall;
      state.counters[n + "_calls"] = static_cast<double>(cost[v].calls);
      const std::string key = std::string("cost.") + kKeys[scenario] + "." + n;
      figure(key, cost[v].usecPerCall);
      figure(key + ".cpu", cost[v].cpuUsPerCall);
      figure(key + ".lua", cost[v].usecPerCall - cost[v].innerPerCall);
    }
  });
}

// availablePermits and release through the library, on the main server (1k live members).
void BM_ServerCost_OtherScripts(benchmark::State& state) {
  guarded(state, [&] {
    auto client = redlimit::Client::create(clientOptions(*gWorld->server, 1));
    RateLimiter limiter(client, freshName("other"));
    limiter.setRate(RateType::Overall, kHuge, kHour);
    prefill(*gWorld->admin, limiter, 2000, serverTimeMs(*gWorld->admin), kHuge - 2000);
    const auto t0 = rb::Clock::now();
    auto s0 = rb::sampleServer(*gWorld->admin);
    for (int i = 0; i < 1000; ++i) benchmark::DoNotOptimize(limiter.availablePermits());
    auto s1 = rb::sampleServer(*gWorld->admin);
    for (int i = 0; i < 1000; ++i) limiter.release(1);
    auto s2 = rb::sampleServer(*gWorld->admin);
    for (auto _ : state) state.SetIterationTime(std::chrono::duration<double>(rb::Clock::now() - t0).count());
    const auto available = rb::ServerCost::between(s0, s1), release = rb::ServerCost::between(s1, s2);
    state.counters["available_usec_per_call"] = available.usecPerCall;
    state.counters["available_cpu_us_per_call"] = available.cpuUsPerCall;
    state.counters["release_usec_per_call"] = release.usecPerCall;
    state.counters["release_cpu_us_per_call"] = release.cpuUsPerCall;
    figure("cost.available.ours", available.usecPerCall);
    figure("cost.available.ours_cpu", available.cpuUsPerCall);
    figure("cost.release.ours", release.usecPerCall);
    figure("cost.release.ours_cpu", release.cpuUsPerCall);
  });
}

// --- 6. Growth of the permits log ---------------------------------------------------------------

// tryAcquire with `range(0)` live members; after each timed call its member is removed again
// (untimed), so the log keeps its size.
void BM_Growth_LiveMembers(benchmark::State& state) {
  const std::int64_t live = state.range(0);
  guarded(state, [&] {
    auto client = redlimit::Client::create(clientOptions(*gWorld->server, 1));
    RateLimiter limiter(client, freshName("growth"));
    limiter.setRate(RateType::Overall, kHuge, kHour);
    rb::RawRedis& admin = *gWorld->admin;
    prefill(admin, limiter, live, serverTimeMs(admin), kHuge - live);
    const std::string& permitsKey = limiter.keys()[3];
    const std::string& valueKey = limiter.keys()[1];
    std::vector<double> us;
    rb::ServerCost cost;
    for (int i = 0; i < kWarmup; ++i)
      (void)redlimit::detail::SegmentAccess<redlimit::RateLimiter>::tryAcquireUpTo(limiter, {}, 1, 1);
    const rb::ServerSample s0 = rb::sampleServer(admin);
    for (auto _ : state) {
      const auto t0 = rb::Clock::now();
      const redlimit::detail::AcquireResult r =
          redlimit::detail::SegmentAccess<redlimit::RateLimiter>::tryAcquireUpTo(limiter, {}, 1, 1);
      const auto t1 = rb::Clock::now();
      const double d = rb::micros(t0, t1);
      state.SetIterationTime(d / 1e6);
      us.push_back(d);
      admin.append({"ZREM", permitsKey, r.member});
      admin.append({"INCRBY", valueKey, "1"});
      (void)admin.reply();
      (void)admin.reply();
    }
    cost = rb::ServerCost::between(s0, rb::sampleServer(admin));
    const rb::LatencySummary s = rb::summarize(us);
    state.counters["p50_us"] = s.p50;
    state.counters["p99_us"] = s.p99;
    state.counters["usec_per_call"] = cost.usecPerCall;
    const std::string key = "growth." + std::to_string(live);
    figure(key + ".p50", s.p50);
    figure(key + ".p99", s.p99);
    figure(key + ".usec", cost.usecPerCall);
  });
}

// The first acquire after 100 000 members expired at once (a limiter of 100 000 per second,
// used up, then idle); the median of 5 rounds, each on a fresh limiter. range(0): 0 = tryAcquire, 1 = reference script, 2 = tryAcquire with one
// member still live (the expired ones are then removed one by one with ZREMRANGEBYSCORE).
void BM_FirstAfterExpiry(benchmark::State& state) {
  const auto variant = state.range(0);
  static const char* kKeys[] = {"first.ours", "first.ref", "first.ours_one_live"};
  guarded(state, [&] {
    constexpr std::int64_t kMembers = 100000;
    constexpr int kRounds = 5;
    auto client = redlimit::Client::create(clientOptions(*gWorld->server, 1));
    rb::RawRedis& admin = *gWorld->admin;
    rb::RawRedis raw(gWorld->server->host(), gWorld->server->port());
    std::vector<double> us, usec;
    for (int round = 0; round < kRounds; ++round) {
      RateLimiter limiter(client, freshName("expiry"));
      limiter.setRate(RateType::Overall, kMembers, milliseconds{1000});
      const std::int64_t now = serverTimeMs(admin);
      prefill(admin, limiter, kMembers - (variant == 2 ? 1 : 0), now - 5000, 0);
      if (variant == 2) prefill(admin, limiter, 1, now, 0);
      RawAcquire reference("EVALSHA", gWorld->referenceSha, limiter.keys());
      reference.newId();
      const rb::ServerSample s0 = rb::sampleServer(admin);
      const auto t0 = rb::Clock::now();
      const bool granted = variant == 1 ? reference.call(raw.get()) == 1 : limiter.tryAcquire();
      const auto t1 = rb::Clock::now();
      const rb::ServerCost cost = rb::ServerCost::between(s0, rb::sampleServer(admin));
      if (!granted) throw std::runtime_error("bench: the first acquire after expiry was denied");
      us.push_back(rb::micros(t0, t1));
      usec.push_back(cost.usecPerCall);
      (void)limiter.deleteLimiter();
    }
    const double medianUs = rb::percentile(us, 50), medianUsec = rb::percentile(usec, 50);
    for (auto _ : state) state.SetIterationTime(medianUs / 1e6);
    state.counters["median_us"] = medianUs;
    state.counters["min_us"] = us.front();  // sorted by percentile()
    state.counters["max_us"] = us.back();
    state.counters["server_usec"] = medianUsec;
    figure(std::string(kKeys[variant]) + ".us", medianUs);
    figure(std::string(kKeys[variant]) + ".usec", medianUsec);
  });
}

// --- 7. Memory of one limiter ---------------------------------------------------------------------

void BM_Memory(benchmark::State& state) {
  const std::int64_t grants = state.range(0);
  guarded(state, [&] {
    auto client = redlimit::Client::create(clientOptions(*gWorld->server, 1));
    RateLimiter limiter(client, freshName("memory"));
    limiter.setRate(RateType::Overall, kHuge, kHour);
    rb::RawRedis& admin = *gWorld->admin;
    RawAcquire acquire("EVALSHA", redlimit::detail::lua::acquire.sha1, limiter.keys());
    for (std::int64_t done = 0; done < grants;) {  // real grants by the real script, pipelined
      const std::int64_t batch = std::min<std::int64_t>(1000, grants - done);
      for (std::int64_t i = 0; i < batch; ++i) {
        acquire.newId();
        acquire.append(admin.get());
      }
      for (std::int64_t i = 0; i < batch; ++i) {
        if (RawAcquire::read(admin.get()) != 1) throw std::runtime_error("bench: grant refused");
      }
      done += batch;
    }
    const char* names[] = {"hash", "value", "client_value", "permits", "client_permits"};
    double total = 0;
    for (std::size_t k = 0; k < limiter.keys().size(); ++k) {
      auto r = admin.command({"MEMORY", "USAGE", limiter.keys()[k], "SAMPLES", "0"});
      const double bytes = r->type == REDIS_REPLY_INTEGER ? static_cast<double>(r->integer) : 0;
      state.counters[std::string(names[k]) + "_bytes"] = bytes;
      figure("memory." + std::to_string(grants) + "." + names[k], bytes);
      total += bytes;
    }
    state.counters["bytes_per_live_permit"] = total / static_cast<double>(grants);
    figure("memory." + std::to_string(grants) + ".total", total);
    for (auto _ : state) state.SetIterationTime(1e-6);
    (void)limiter.deleteLimiter();
  });
}

void registerBenchmarks() {
  using benchmark::RegisterBenchmark;
  RegisterBenchmark("RoundTrips/granted", BM_RoundTrips)->Arg(1)->Iterations(kLatencyIterations)->UseManualTime();
  RegisterBenchmark("RoundTrips/denied", BM_RoundTrips)->Arg(0)->Iterations(kLatencyIterations)->UseManualTime();
  for (int threads : {1, 2, 4, 8, 16}) {
    const auto perThread = static_cast<benchmark::IterationCount>(std::max(500, 8000 / threads));
    RegisterBenchmark("Threads/one_hot_limiter", BM_Threads_HotLimiter)
        ->Threads(threads)
        ->Iterations(perThread)
        ->UseRealTime()
        ->Setup(setupHot)
        ->Teardown(teardownThreads);
    RegisterBenchmark("Threads/10k_limiters", BM_Threads_10kLimiters)
        ->Threads(threads)
        ->Iterations(perThread)
        ->UseRealTime()
        ->Setup(setupDistinct)
        ->Teardown(teardownThreads);
  }
  const char* scenarios[] = {"granted_1k_live", "steady_50ms_window", "denied", "first_after_1k_expired"};
  for (int s = 0; s < 4; ++s) {
    RegisterBenchmark((std::string("ServerCost/acquire_vs_reference/") + scenarios[s]).c_str(), BM_ServerCost_Acquire)
        ->Arg(s)
        ->Iterations(1)
        ->UseManualTime();
  }
  RegisterBenchmark("ServerCost/available_permits_and_release", BM_ServerCost_OtherScripts)
      ->Iterations(1)
      ->UseManualTime();
  for (int live : {10, 1000, 100000}) {
    RegisterBenchmark("Growth/tryAcquire_live_members", BM_Growth_LiveMembers)
        ->Arg(live)
        ->Iterations(1000)
        ->UseManualTime();
  }
  const char* expiry[] = {"tryAcquire", "reference_script", "tryAcquire_one_still_live"};
  for (int v = 0; v < 3; ++v) {
    RegisterBenchmark((std::string("Growth/first_acquire_after_100k_expired/") + expiry[v]).c_str(),
                      BM_FirstAfterExpiry)
        ->Arg(v)
        ->Iterations(1)
        ->UseManualTime();
  }
  for (int grants : {1000, 10000, 100000}) {
    RegisterBenchmark("Memory/grants_in_window", BM_Memory)->Arg(grants)->Iterations(1)->UseManualTime();
  }
}

// --- Summary --------------------------------------------------------------------------------------

double fig(const std::string& key) {
  auto it = gFig.find(key);
  return it == gFig.end() ? std::nan("") : it->second;
}

using redlimit::bench::cell;

std::string summary(const std::string& machine) {
  std::ostringstream out;
  auto ratioRow = [&](const char* what, double value, double target) {
    std::string verdict = "report";
    if (target > 0 && !std::isnan(value)) verdict = value <= target ? "met" : "MISSED";
    const std::string goal = target > 0 ? fmt::format("<= {:g}", target) : std::string();
    out << fmt::format("  {:<68} {:>6}  {:<8} {}\n", what, cell(value, 2), goal, verdict);
  };
  out << "redlimit benchmark (bench_redlimit), " << rb::nowText() << "\n"
      << "Machine: " << machine << "\n"
      << "Loopback TCP to throwaway redis-servers; latencies are per call, timed by the caller.\n\n"
      << "Ratios, each measured in this run                                      value  target\n";
  ratioRow("tryAcquire p50 / PING p50, both on redlimit's Client",
           fig("granted.tryAcquire.p50") / fig("granted.ping_connection.p50"), 1.3);
  ratioRow("tryAcquire p50 / raw hiredis EVALSHA of acquire.lua p50",
           fig("granted.tryAcquire.p50") / fig("granted.evalsha_hiredis.p50"), 1.05);
  ratioRow("acquire.lua / reference, script execution us per call (steady)",
           fig("cost.steady.ours") / fig("cost.steady.ref"), 0.8);
  ratioRow("acquire.lua / reference as plain EVAL, server CPU per call (steady)",
           fig("cost.steady.ours.cpu") / fig("cost.steady.ref_eval.cpu"), 0.8);
  ratioRow("first acquire after 100k expired / normal acquire (p50)",
           fig("first.ours.us") / fig("granted.tryAcquire.p50"), 10);
  ratioRow("8-thread / 1-thread throughput, one hot limiter", fig("threads.hot.8.rate") / fig("threads.hot.1.rate"), 0);

  out << "\nLatency per call, us (interleaved call by call)              granted p50/p99    denied p50/p99\n";
  const std::pair<const char*, const char*> latRows[] = {
      {"PING, redlimit Client", "ping_connection"},
      {"PING, raw hiredis", "ping_hiredis"},
      {"EVALSHA `return 1`, same arguments, raw hiredis", "empty_script_hiredis"},
      {"EVALSHA acquire.lua, raw hiredis", "evalsha_hiredis"},
      {"RateLimiter::tryAcquire", "tryAcquire"}};
  for (const auto& [what, key] : latRows) {
    const std::string g = std::string("granted.") + key, d = std::string("denied.") + key;
    out << fmt::format("  {:<58} {:>7} / {:<7}  {:>7} / {:<7}\n", what, cell(fig(g + ".p50")), cell(fig(g + ".p99")),
                       cell(fig(d + ".p50")), cell(fig(d + ".p99")));
  }

  out << "\nThreads sharing one Client (pool = threads), tryAcquire, all granted\n"
      << "  threads   one hot limiter: decisions/s  p99 us   10k limiters: decisions/s  p99 us\n";
  for (int t : {1, 2, 4, 8, 16}) {
    const std::string h = "threads.hot." + std::to_string(t), d = "threads.distinct." + std::to_string(t);
    out << fmt::format("  {:>7}   {:>28} {:>7}   {:>25} {:>7}\n", t, cell(fig(h + ".rate"), 0), cell(fig(h + ".p99")),
                       cell(fig(d + ".rate"), 0), cell(fig(d + ".p99")));
    const double errors = fig(h + ".errors") + fig(d + ".errors");
    if (errors > 0) out << fmt::format("            ({:.0f} calls failed)\n", errors);
  }

  out << "\nServer cost per call, us: script execution (commandstats) / whole server CPU (INFO cpu)\n"
      << "  equal state, three servers in lockstep        acquire.lua     reference     ref. as EVAL   ratio\n";
  const std::pair<const char*, const char*> costRows[] = {{"granted, 1k live members", "granted"},
                                                          {"steady, 50 ms window (expiry every call)", "steady"},
                                                          {"denied (rate used up)", "denied"},
                                                          {"first call after 1k expired at once", "burst1k"}};
  for (const auto& [what, key] : costRows) {
    const std::string k = std::string("cost.") + key;
    out << fmt::format("  {:<44} {:>5} / {:<5}  {:>5} / {:<5}  {:>5} / {:<5}  {:>5}\n", what, cell(fig(k + ".ours")),
                       cell(fig(k + ".ours.cpu")), cell(fig(k + ".ref")), cell(fig(k + ".ref.cpu")),
                       cell(fig(k + ".ref_eval")), cell(fig(k + ".ref_eval.cpu")),
                       cell(fig(k + ".ours") / fig(k + ".ref"), 2));
  }
  out << fmt::format("  {:<44} {:>5}          {:>5}\n", "  of which Lua and its calls into Redis (steady)",
                     cell(fig("cost.steady.ours.lua")), cell(fig("cost.steady.ref.lua")))
      << fmt::format("  {:<44} {:>5} / {:<5}\n", "available_permits.lua, 2k live", cell(fig("cost.available.ours")),
                     cell(fig("cost.available.ours_cpu")))
      << fmt::format("  {:<44} {:>5} / {:<5}\n", "release.lua (1 permit), 2k live", cell(fig("cost.release.ours")),
                     cell(fig("cost.release.ours_cpu")));

  out << "\nGrowth of the permits log (tryAcquire, granted)        p50 us   p99 us   server us/call\n";
  for (int n : {10, 1000, 100000}) {
    const std::string k = "growth." + std::to_string(n);
    out << fmt::format("  {:<52} {:>6}   {:>6}   {:>6}\n", fmt::format("{} live members", n), cell(fig(k + ".p50")),
                       cell(fig(k + ".p99")), cell(fig(k + ".usec")));
  }
  out << "  first acquire after 100k members expired at once      median us   server us\n";
  const std::pair<const char*, const char*> firstRows[] = {
      {"tryAcquire", "first.ours"},
      {"reference script (unpacks every member)", "first.ref"},
      {"tryAcquire, one member still live", "first.ours_one_live"}};
  for (const auto& [what, key] : firstRows) {
    out << fmt::format("    {:<50} {:>9}   {:>9}\n", what, cell(fig(std::string(key) + ".us")),
                       cell(fig(std::string(key) + ".usec")));
  }

  out << "\nMemory of one limiter (MEMORY USAGE, bytes)      hash   value     permits   per live permit\n";
  for (int n : {1000, 10000, 100000}) {
    const std::string k = "memory." + std::to_string(n);
    out << fmt::format("  {:<44} {:>6}  {:>6}  {:>10}   {:>6}\n", fmt::format("after {} grants", n),
                       cell(fig(k + ".hash"), 0), cell(fig(k + ".value"), 0), cell(fig(k + ".permits"), 0),
                       cell(fig(k + ".total") / n, 1));
  }
  return out.str();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench: cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    World world;
    world.server = std::make_unique<rb::BenchServer>();
    for (auto& c : world.cost) c = std::make_unique<rb::BenchServer>();
    world.admin = std::make_unique<rb::RawRedis>(world.server->host(), world.server->port());
    world.referenceSource = stripLuaComments(readFile(REDLIMIT_BENCH_SOURCE_DIR "/reference_acquire.lua"));
    if (loadScript(*world.admin, redlimit::detail::lua::acquire.source) != redlimit::detail::lua::acquire.sha1) {
      throw std::runtime_error("bench: SCRIPT LOAD of acquire.lua returned another SHA1");
    }
    world.referenceSha = loadScript(*world.admin, world.referenceSource);
    world.emptySha = loadScript(*world.admin, kEmptyScript);
    gWorld = &world;
    const std::string machine = rb::machineDescription(world.server->version());

    registerBenchmarks();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();

    const std::string text = summary(machine);
    std::cout << '\n' << text << std::flush;
    const std::string path = rb::resultsDir() + "/bench_redlimit.summary.txt";
    std::ofstream(path) << text;
    gWorld = nullptr;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_redlimit: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_redlimit", e.what());
  return 1;
}
