// bench_keyed: per-user limits at scale. 1 000 000 distinct keys decided once each
// through a Limiter of a GCRA policy (the limit in the call), then idle for one period: used_memory
// before, with the keys, and after (the keys are gone: each expires once its bucket is full again
// plus the idle margin). And the server's cost per decision with the configuration in the call
// next to a textbook GCRA in go-redis/redis_rate's argument shape (bench/textbook/
// redis_rate_gcra.lua, floats, SET EX), on new keys (the million, every call creates its key) and
// on hot keys (1000 keys, 200 calls each: the fast path). Server µs per decision is INFO
// commandstats (EVALSHA usec / decisions), CPU per decision INFO cpu's delta / decisions, as
// bench_algorithms measures them (a coalesced library call decides up to 64). The
// raw rows send the same argv from one pipelined hiredis connection (256 in flight) so the two
// scripts meet the same load; the library row is Limiter::decideAsync with 1024 in flight. Every
// row decides the same Redis keys, the library's (rl:<name>:<key>). Writing a million keys takes longer than their TTL (1.1 s), so the server's active
// expiry is paused while they are written (DEBUG SET-ACTIVE-EXPIRE 0: every key is still in memory
// when used_memory is read, expired or not) and turned on again for the idle period, whose end is
// when DBSIZE reads 0.
//
// Under load, two workloads: 10 000 keys round-robin and one hot key, the limit in the
// call and far above what the server decides (every decision granted). Five rows each, same run,
// same pinned server: one thread keeping 256 decisions in flight through the library coalesced
// (Limiter::decideAsync on a Client with ClientOptions::coalesce = true: the takes that queue
// behind the groups in flight go together as one batch.lua call, up to 64, each decided by its
// script's fast path), the same one by one (coalesce = false, the default), and the textbook GCRA
// as raw pipelined EVALSHA, one decision per call (support/pipelined_load.hpp, one connection, 256
// in flight): the one-by-one saturated rate; then 8 threads each calling Limiter::decide (sync) on
// one Client, coalesce on and off. Per row: server CPU µs per decision (INFO cpu user + sys delta
// / decisions), EVALSHA calls per decision (INFO commandstats: how the decisions were grouped) and
// decisions/s; two passes, the second in mirrored order. Target rows (met / MISSED), per workload:
// coalesced / textbook CPU per decision <= 0.6 and decisions/s >= 1.3 (256 in flight); coalesced /
// library one by one decisions/s >= 1 at 256 in flight and with 8 sync threads (a coalescer never
// lowers throughput below one by one; the sync rows within the noise, >= 0.95). A short summary
// goes to stdout and <results>/bench_keyed.summary.txt.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <redlimit/redlimit.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redlimit_lua.hpp"
#include "support/bench_support.hpp"
#include "support/collect_reporter.hpp"
#include "support/pinned_server.hpp"
#include "support/pipelined_load.hpp"

namespace {

namespace rb = redlimit::bench;
using std::chrono::milliseconds;

constexpr std::int64_t kKeys = 1'000'000;
constexpr std::int64_t kHotKeys = 1000;
constexpr std::int64_t kHotCalls = 200'000;
constexpr int kRawDepth = 256;          // requests in flight on the raw connection
constexpr int kLibraryInFlight = 1024;  // decideAsync calls in flight
constexpr int kServerCpu = 0;
constexpr int kClientCpu = 1;
// 10 per second, bursts of 10: a key decided once is full again 100 ms later, and its key expires
// kDefaultIdleMargin (1 s) after that.
constexpr std::int64_t kBurst = 10;
constexpr std::int64_t kRate = 10;
constexpr milliseconds kPeriod{1000};
// Under load: one thread keeping kRawDepth decisions in flight, or kSyncThreads threads
// calling decide, over kLoadKeys keys round-robin or one hot key, granted: 10^6 per 1 s, burst
// 10^6, far above what one server decides.
constexpr std::int64_t kLoadKeys = 10'000;
constexpr std::int64_t kLoadRate = 1'000'000;
constexpr std::int64_t kLoadBurst = 1'000'000;
constexpr std::int64_t kLoadDecisions = 100'000;  // timed decisions per row and pass
constexpr int kLoadPasses = 2;                    // the second in mirrored order
constexpr int kSyncThreads = 8;                   // threads calling decide in the sync rows
constexpr double kMaxCpuRatio = 0.6;              // target: coalesced CPU per decision / textbook
constexpr double kMinRateRatio = 1.3;             // target: coalesced decisions/s / textbook
constexpr double kMinOnOffRatio = 1.0;            // target: coalesced / library one by one decisions/s
constexpr double kSyncNoise = 0.95;               // the sync rows: coalesce on / off within the noise

struct World {
  rb::PinnedServer pinned;
  std::unique_ptr<rb::RawRedis> admin;
  std::unique_ptr<rb::RawRedis> load;
  std::shared_ptr<redlimit::Client> client;    // default options (coalesce off)
  std::shared_ptr<redlimit::Client> oneByOne;  // ClientOptions::coalesce = false
  std::shared_ptr<redlimit::Client> together;  // ClientOptions::coalesce = true
  std::string oursSha;
  std::string textbookSha;
  std::string packed;  // the 17 bytes the library sends: 'G', burst, rate, period ms, keepAlive ms
  std::unique_ptr<redlimit::Limiter> perKey;  // the library's limiter of the new and hot keys rows
};
World* gWorld = nullptr;

struct Phase {
  bool ran = false;
  std::int64_t calls = 0;
  std::int64_t allowed = 0;
  double seconds = 0;
  rb::ServerCost cost;
  std::int64_t usedBefore = 0;  // used_memory, bytes
  std::int64_t usedWith = 0;
  std::int64_t usedAfter = 0;
  double goneAfter = NAN;  // seconds from the last decision until DBSIZE was 0
};
std::map<std::string, Phase> gPhases;

std::string keyOf(std::int64_t i) { return fmt::format("k{:07}", i); }  // 8 bytes

// The limiter of the load rows: 10^6 per 1 s, burst 10^6 (every decision granted).
constexpr const char* kLoadName = "bench-load";
redlimit::Policy loadPolicy() { return redlimit::Policy::gcra(kLoadRate, kPeriod, kLoadBurst); }

// The Redis key of the caller's key i of the new and hot keys rows: the library's.
std::string redisKeyOf(std::int64_t i) { return gWorld->perKey->redisKey(keyOf(i)); }

std::int64_t usedMemory() { return std::stoll(rb::parseInfo(gWorld->admin->info({"memory"})).at("used_memory")); }
std::int64_t dbsize() { return gWorld->admin->command({"DBSIZE"})->integer; }

std::string loadScript(const std::string& source) {
  auto r = gWorld->admin->command({"SCRIPT", "LOAD", source});
  return std::string(r->str, r->len);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench: cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string packU32(std::int64_t v) {
  std::string out;
  for (int shift = 0; shift < 32; shift += 8)
    out.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> shift) & 0xffU));
  return out;
}

// Raw pipelined calls of argvOf(i), i in [0, n), from one connection.
void rawRun(std::int64_t n, const std::function<std::vector<std::string>(std::int64_t)>& argvOf, Phase& p) {
  std::int64_t sent = 0;
  std::int64_t read = 0;
  const auto start = rb::Clock::now();
  while (read < n) {
    while (sent < n && sent - read < kRawDepth) {
      const std::vector<std::string> argv = argvOf(sent++);
      gWorld->load->append(std::vector<std::string_view>(argv.begin(), argv.end()));
    }
    auto r = gWorld->load->reply();
    ++read;
    if ((r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->integer == 1) ||
        rb::packedDecisionAllowed(r.get()) == 1) {
      ++p.allowed;
    }
  }
  p.seconds = std::chrono::duration<double>(rb::Clock::now() - start).count();
  p.calls = n;
}

// Pauses (false) or resumes the server's active expiry.
void activeExpire(bool on) { (void)gWorld->admin->command({"DEBUG", "SET-ACTIVE-EXPIRE", on ? "1" : "0"}); }

// Resumes the active expiry, waits one period and the idle margin, then until no key is left (the
// active expiry removes them), at most 60 s more.
void waitUntilGone(Phase& p) {
  activeExpire(true);
  const auto last = rb::Clock::now();
  std::this_thread::sleep_for(kPeriod + redlimit::kDefaultIdleMargin);
  while (dbsize() > 0 && rb::Clock::now() - last < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  if (dbsize() == 0) p.goneAfter = std::chrono::duration<double>(rb::Clock::now() - last).count();
  p.usedAfter = usedMemory();
}

void report(benchmark::State& state, const Phase& p) {
  state.SetIterationTime(p.seconds);
  state.counters["calls"] = static_cast<double>(p.calls);
  state.counters["usec_per_call"] = p.cost.usecPerCall;
  state.counters["cpu_us_per_call"] = p.cost.cpuUsPerCall;
  if (p.usedWith > 0) state.counters["bytes_per_key"] = static_cast<double>(p.usedWith - p.usedBefore) / kKeys;
}

// A million new keys through the library: memory with them and after one idle period.
void BM_LibraryNewKeys(benchmark::State& state) {
  for (auto _ : state) {
    Phase& p = gPhases["library"];
    (void)gWorld->admin->command({"FLUSHALL"});
    redlimit::Limiter& perKey = *gWorld->perKey;
    // The raw rows below send exactly the configuration the library sends (the key's first 17 bytes).
    (void)perKey.decide("check");
    auto v = gWorld->admin->command({"GET", perKey.redisKey("check")});
    if (v->type != REDIS_REPLY_STRING || std::string(v->str, v->len).compare(0, 17, gWorld->packed) != 0) {
      state.SkipWithError("the raw argv's configuration is not the library's");
      return;
    }
    (void)gWorld->admin->command({"DEL", perKey.redisKey("check")});
    p.usedBefore = usedMemory();
    activeExpire(false);
    const rb::ServerSample before = rb::sampleServer(*gWorld->admin);
    std::mutex m;
    std::condition_variable cv;
    std::int64_t inFlight = 0;
    std::int64_t allowed = 0;
    std::int64_t failed = 0;
    const auto start = rb::Clock::now();
    for (std::int64_t i = 0; i < kKeys; ++i) {
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return inFlight < kLibraryInFlight; });
        ++inFlight;
      }
      perKey.decideAsync(keyOf(i), 1, [&](const redlimit::Decision& d, const std::exception_ptr& error) {
        const std::lock_guard<std::mutex> lock(m);
        if (error) ++failed;
        if (!error && d.allowed) ++allowed;
        --inFlight;
        cv.notify_one();
      });
    }
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return inFlight == 0; });
    }
    p.seconds = std::chrono::duration<double>(rb::Clock::now() - start).count();
    p.cost = rb::ServerCost::between(before, rb::sampleServer(*gWorld->admin));
    p.calls = kKeys;
    p.allowed = allowed;
    p.usedWith = usedMemory();
    if (failed > 0 || allowed != kKeys || dbsize() != kKeys) {
      activeExpire(true);
      state.SkipWithError(fmt::format("{} failed, {} allowed, {} keys", failed, allowed, dbsize()).c_str());
      return;
    }
    waitUntilGone(p);
    p.ran = true;
    report(state, p);
  }
}

void rawNewKeys(benchmark::State& state, const std::string& name, bool ours) {
  for (auto _ : state) {
    Phase& p = gPhases[name];
    (void)gWorld->admin->command({"FLUSHALL"});
    p.usedBefore = usedMemory();
    activeExpire(false);
    const rb::ServerSample before = rb::sampleServer(*gWorld->admin);
    rawRun(
        kKeys,
        [ours](std::int64_t i) -> std::vector<std::string> {
          if (ours) return {"EVALSHA", gWorld->oursSha, "1", redisKeyOf(i), "take", "", "G", "1", "0", gWorld->packed};
          return {"EVALSHA",
                  gWorld->textbookSha,
                  "1",
                  redisKeyOf(i),
                  fmt::to_string(kBurst),
                  fmt::to_string(kRate),
                  fmt::format("{}", static_cast<double>(kPeriod.count()) / 1000.0),
                  "1"};
        },
        p);
    p.cost = rb::ServerCost::between(before, rb::sampleServer(*gWorld->admin));
    p.usedWith = usedMemory();
    if (p.allowed != kKeys || dbsize() != kKeys) {
      activeExpire(true);
      state.SkipWithError(fmt::format("{} allowed, {} keys", p.allowed, dbsize()).c_str());
      return;
    }
    waitUntilGone(p);
    p.ran = true;
    report(state, p);
  }
}

void rawHotKeys(benchmark::State& state, const std::string& name, bool ours) {
  for (auto _ : state) {
    Phase& p = gPhases[name];
    (void)gWorld->admin->command({"FLUSHALL"});
    // Far above the rate: most calls are denied, as a limited user's are; denials write nothing.
    const auto argvOf = [ours](std::int64_t i) -> std::vector<std::string> {
      const std::string key = redisKeyOf(i % kHotKeys);
      if (ours) return {"EVALSHA", gWorld->oursSha, "1", key, "take", "", "G", "1", "0", gWorld->packed};
      return {"EVALSHA",
              gWorld->textbookSha,
              "1",
              key,
              fmt::to_string(kBurst),
              fmt::to_string(kRate),
              fmt::format("{}", static_cast<double>(kPeriod.count()) / 1000.0),
              "1"};
    };
    Phase warm;
    rawRun(kHotKeys * 2, argvOf, warm);  // every key exists
    const rb::ServerSample before = rb::sampleServer(*gWorld->admin);
    rawRun(kHotCalls, argvOf, p);
    p.cost = rb::ServerCost::between(before, rb::sampleServer(*gWorld->admin));
    p.ran = true;
    report(state, p);
  }
}

void BM_OursRawNewKeys(benchmark::State& state) { rawNewKeys(state, "ours_new", true); }
void BM_TextbookRawNewKeys(benchmark::State& state) { rawNewKeys(state, "textbook_new", false); }
void BM_OursRawHotKeys(benchmark::State& state) { rawHotKeys(state, "ours_hot", true); }
void BM_TextbookRawHotKeys(benchmark::State& state) { rawHotKeys(state, "textbook_hot", false); }

// --- Under load: coalesced decisions next to one-by-one calls ---------------------------------

enum LoadVariant { kCoalesced, kLibraryOneByOne, kTextbook, kSyncCoalesced, kSyncOneByOne, kVariants };
enum LoadWorkload { kManyKeys, kHotKey, kWorkloads };
const char* const kWorkloadLabels[kWorkloads] = {"10 000 keys", "1 hot key"};

// One row's totals over its passes.
struct LoadTotals {
  std::int64_t decisions = 0;
  std::int64_t granted = 0;
  std::int64_t failed = 0;
  std::int64_t scriptCalls = 0;  // EVALSHA + EVAL, INFO commandstats
  std::int64_t scriptUsec = 0;   // their execution time, INFO commandstats
  double cpuSeconds = 0;         // server user + sys, INFO cpu
  double seconds = 0;

  [[nodiscard]] bool ran() const noexcept { return decisions > 0; }
  [[nodiscard]] double cpuUsPerDecision() const {
    return ran() ? cpuSeconds * 1e6 / static_cast<double>(decisions) : NAN;
  }
  [[nodiscard]] double scriptUsPerDecision() const {
    return ran() ? static_cast<double>(scriptUsec) / static_cast<double>(decisions) : NAN;
  }
  [[nodiscard]] double callsPerDecision() const {
    return ran() ? static_cast<double>(scriptCalls) / static_cast<double>(decisions) : NAN;
  }
  [[nodiscard]] double rate() const { return ran() && seconds > 0 ? static_cast<double>(decisions) / seconds : NAN; }
};
LoadTotals gLoad[kWorkloads][kVariants];

std::vector<std::string> loadKeys(int workload) {
  std::vector<std::string> keys;
  const std::int64_t n = workload == kManyKeys ? kLoadKeys : 1;
  keys.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) keys.push_back(keyOf(i));
  return keys;
}

// n decisions through `perKey`, round-robin over `keys`, kRawDepth in flight from this thread.
void libraryLoad(redlimit::Limiter& perKey, const std::vector<std::string>& keys, std::int64_t n, LoadTotals& t) {
  std::mutex m;
  std::condition_variable cv;
  std::int64_t inFlight = 0;
  std::int64_t granted = 0;
  std::int64_t failed = 0;
  const auto start = rb::Clock::now();
  for (std::int64_t i = 0; i < n; ++i) {
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return inFlight < kRawDepth; });
      ++inFlight;
    }
    perKey.decideAsync(keys[static_cast<std::size_t>(i) % keys.size()], 1,
                       [&](const redlimit::Decision& d, const std::exception_ptr& error) {
                         const std::lock_guard<std::mutex> lock(m);
                         if (error) ++failed;
                         if (!error && d.allowed) ++granted;
                         --inFlight;
                         cv.notify_one();
                       });
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return inFlight == 0; });
  t.seconds += std::chrono::duration<double>(rb::Clock::now() - start).count();
  t.decisions += n;
  t.granted += granted;
  t.failed += failed;
}

// n decisions through `perKey`, round-robin over `keys`, from kSyncThreads threads calling decide.
void syncLoad(redlimit::Limiter& perKey, const std::vector<std::string>& keys, std::int64_t n, LoadTotals& t) {
  std::atomic<std::int64_t> next{0};
  std::atomic<std::int64_t> granted{0};
  std::atomic<std::int64_t> failed{0};
  const auto start = rb::Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < kSyncThreads; ++i) {
    threads.emplace_back([&] {
      for (std::int64_t j = next++; j < n; j = next++) {
        try {
          if (perKey.decide(keys[static_cast<std::size_t>(j) % keys.size()]).allowed) ++granted;
        } catch (const std::exception&) {
          ++failed;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  t.seconds += std::chrono::duration<double>(rb::Clock::now() - start).count();
  t.decisions += n;
  t.granted += granted.load();
  t.failed += failed.load();
}

// One row of one pass: FLUSHALL, an untimed warm-up (every key exists, the scripts are loaded),
// then kLoadDecisions timed decisions between two INFO samples.
void loadRow(int workload, int variant) {
  (void)gWorld->admin->command({"FLUSHALL"});
  const std::vector<std::string> keys = loadKeys(workload);
  const auto warmUp = static_cast<std::int64_t>(keys.size()) + std::int64_t{2} * kRawDepth;
  LoadTotals& t = gLoad[workload][variant];
  LoadTotals scratch;
  rb::ServerSample before;
  if (variant == kTextbook) {
    const redlimit::Limiter names(gWorld->client, kLoadName, loadPolicy());  // the library's keys, nothing sent
    std::vector<std::vector<std::string>> argvs;
    for (const std::string& k : keys) {
      argvs.push_back({"EVALSHA", gWorld->textbookSha, "1", names.redisKey(k), fmt::to_string(kLoadBurst),
                       fmt::to_string(kLoadRate), fmt::format("{}", static_cast<double>(kPeriod.count()) / 1000.0),
                       "1"});
    }
    rb::PreparedCalls prepared(std::move(argvs));
    rb::PipelinedLoad load(gWorld->pinned.server->host(), gWorld->pinned.server->port(), 1, kRawDepth);
    (void)load.run(prepared, warmUp);
    before = rb::sampleServer(*gWorld->admin);
    const rb::LoadResult r = load.run(prepared, kLoadDecisions);
    t.seconds += r.seconds;
    t.decisions += r.calls;
    t.granted += r.allowed;
  } else {
    const bool together = variant == kCoalesced || variant == kSyncCoalesced;
    const bool sync = variant == kSyncCoalesced || variant == kSyncOneByOne;
    redlimit::Limiter perKey(together ? gWorld->together : gWorld->oneByOne, kLoadName, loadPolicy());
    const auto run = sync ? syncLoad : libraryLoad;
    run(perKey, keys, warmUp, scratch);
    before = rb::sampleServer(*gWorld->admin);
    run(perKey, keys, kLoadDecisions, t);
  }
  const rb::ServerSample after = rb::sampleServer(*gWorld->admin);
  t.scriptCalls += after.scriptCalls - before.scriptCalls;
  t.scriptUsec += after.scriptUsec - before.scriptUsec;
  t.cpuSeconds += after.cpuSeconds - before.cpuSeconds;
  t.failed += scratch.failed;
}

void BM_Load(benchmark::State& state) {
  const auto workload = static_cast<int>(state.range(0));
  for (auto _ : state) {
    for (int pass = 0; pass < kLoadPasses; ++pass) {
      for (int i = 0; i < kVariants; ++i) loadRow(workload, pass % 2 == 0 ? i : kVariants - 1 - i);
    }
    const LoadTotals(&row)[kVariants] = gLoad[workload];
    double seconds = 0;
    for (const LoadTotals& t : row) seconds += t.seconds;
    state.SetIterationTime(seconds);
    for (const LoadTotals& t : row) {
      if (t.failed > 0) {
        state.SkipWithError(fmt::format("{} decisions failed", t.failed).c_str());
        return;
      }
    }
    const char* names[kVariants] = {"coalesced", "one_by_one", "textbook", "sync_coalesced", "sync_one_by_one"};
    for (int v = 0; v < kVariants; ++v) {
      state.counters[fmt::format("{}_cpu_us_per_decision", names[v])] = row[v].cpuUsPerDecision();
      state.counters[fmt::format("{}_evalsha_per_decision", names[v])] = row[v].callsPerDecision();
      state.counters[fmt::format("{}_script_us_per_decision", names[v])] = row[v].scriptUsPerDecision();
      state.counters[fmt::format("{}_decisions_per_s", names[v])] = row[v].rate();
    }
  }
}

std::string num(double v, int digits) { return std::isnan(v) ? std::string("n/a") : fmt::format("{:.{}f}", v, digits); }

std::string summary() {
  std::ostringstream out;
  const auto& lib = gPhases["library"];
  out << "Per-user limits at scale (bench_keyed): Limiter, Policy::gcra in the call, 10 per 1 s, burst 10\n"
      << "  " << gWorld->pinned.placement << "\n"
      << "  " << rb::machineDescription(gWorld->pinned.server->version()) << "\n";
  out << fmt::format("  1 000 000 distinct keys (8-byte names, rl:<name>: before them) decided once each{}:\n",
                     lib.ran ? "" : " (not run)");
  out << "                                        used_memory: before      with keys   after idle  bytes/key  keys "
         "gone "
         "after\n";
  auto memoryRow = [&](const char* label, const Phase& p) {
    if (!p.ran) return;
    out << fmt::format("  {:<38} {:>14} {:>14} {:>12} {:>10} {:>11}\n", label, p.usedBefore, p.usedWith, p.usedAfter,
                       num(static_cast<double>(p.usedWith - p.usedBefore) / kKeys, 1),
                       std::isnan(p.goneAfter) ? std::string("NOT gone") : num(p.goneAfter, 1) + " s");
  };
  memoryRow("Limiter (library)", lib);
  memoryRow("ours, raw EVALSHA (same argv)", gPhases["ours_new"]);
  memoryRow("textbook/redis_rate_gcra.lua", gPhases["textbook_new"]);
  out << "  (active expiry paused while the keys are written; after idle: resumed, then one period and the idle\n"
         "  margin, then until DBSIZE is 0, timed from the resume)\n";
  out << "  server cost per decision                  server us/dec    server CPU us/dec    decisions/s\n";
  // Per decision: a coalesced library call decides up to 64 (the raw rows decide one per call).
  auto costRow = [&](const char* label, const Phase& p) {
    if (!p.ran) return;
    const double perDecision = static_cast<double>(p.cost.calls) / static_cast<double>(p.calls);
    out << fmt::format("  {:<42} {:>14} {:>20} {:>13}\n", label, num(p.cost.usecPerCall * perDecision, 2),
                       num(p.cost.cpuUsPerCall * perDecision, 2), num(static_cast<double>(p.calls) / p.seconds, 0));
  };
  costRow("new keys: library (decideAsync, 1024)", lib);
  costRow("new keys: ours, raw (256 in flight)", gPhases["ours_new"]);
  costRow("new keys: textbook, raw (256 in flight)", gPhases["textbook_new"]);
  costRow("hot keys: ours, raw", gPhases["ours_hot"]);
  costRow("hot keys: textbook, raw", gPhases["textbook_hot"]);
  const auto ratio = [&](const char* a, const char* b) {
    const Phase& x = gPhases[a];
    const Phase& y = gPhases[b];
    return x.ran && y.ran ? num(x.cost.usecPerCall / y.cost.usecPerCall, 2) : std::string("n/a");
  };
  out << fmt::format("  ours / textbook, server us/call: new keys {}, hot keys {}\n", ratio("ours_new", "textbook_new"),
                     ratio("ours_hot", "textbook_hot"));
  out << "  hot keys: 1000 keys, 200 000 calls far above the rate (mostly denied, as a limited user's); the keys\n"
         "  existed before the timed calls. Ours decides in exact integer µs and checks the key's type, kind,\n"
         "  configuration and state; the textbook script trusts what it reads.\n";
  out << fmt::format(
      "  Under load: one thread keeping {} decisions in flight (async rows) or {} threads calling\n"
      "  decide (sync rows), {} per 1 s, burst {} in the call (far above what the server decides: every\n"
      "  decision is granted), {} passes of {} timed decisions per row, the\n"
      "  second in mirrored order, each after FLUSHALL and an untimed warm-up; sums shown. CPU us/dec: INFO cpu\n"
      "  (user + sys) / decisions; script us/dec: INFO commandstats EVALSHA usec / decisions (the scripts' own\n"
      "  execution, the rest of the CPU is parsing, I/O and replies); EVALSHA/dec: INFO commandstats calls /\n"
      "  decisions; server busy: its CPU time / wall time.\n",
      kRawDepth, kSyncThreads, kLoadRate, kLoadBurst, kLoadPasses, kLoadDecisions);
  out << "  workload     row                                               CPU us/dec  script us/dec  EVALSHA/dec  "
         "decisions/s  granted  server busy\n";
  const char* const rowLabels[kVariants] = {
      "library, coalesced (decideAsync, coalesce = true)", "library, one by one (ClientOptions::coalesce = false)",
      "textbook, raw EVALSHA pipelined (one connection)", "library, coalesced, 8 sync threads (decide)",
      "library, one by one, 8 sync threads (decide)"};
  for (int w = 0; w < kWorkloads; ++w) {
    for (int v = 0; v < kVariants; ++v) {
      const LoadTotals& t = gLoad[w][v];
      if (!t.ran()) continue;
      out << fmt::format("  {:<12} {:<53} {:>6} {:>14} {:>12} {:>12} {:>7}% {:>11}%\n",
                         v == 0 ? kWorkloadLabels[w] : "", rowLabels[v], num(t.cpuUsPerDecision(), 2),
                         num(t.scriptUsPerDecision(), 2), num(t.callsPerDecision(), 3), num(t.rate(), 0),
                         num(100.0 * static_cast<double>(t.granted) / static_cast<double>(t.decisions), 0),
                         num(100.0 * t.cpuSeconds / t.seconds, 0));
    }
  }
  out << "  Ratios, each measured in this run                                                 value  target\n";
  auto target = [&](const std::string& what, double value, const std::string& goal, bool met) {
    const std::string verdict = goal.empty() ? "report" : std::isnan(value) ? "n/a" : met ? "met" : "MISSED";
    out << fmt::format("  {:<80} {:>5}  {:<18} {}\n", what, num(value, 2), goal, verdict);
  };
  for (int w = 0; w < kWorkloads; ++w) {
    const LoadTotals& co = gLoad[w][kCoalesced];
    const LoadTotals& one = gLoad[w][kLibraryOneByOne];
    const LoadTotals& text = gLoad[w][kTextbook];
    const LoadTotals& syncCo = gLoad[w][kSyncCoalesced];
    const LoadTotals& syncOne = gLoad[w][kSyncOneByOne];
    const double cpu = co.cpuUsPerDecision() / text.cpuUsPerDecision();
    const double rate = co.rate() / text.rate();
    const double onOff = co.rate() / one.rate();
    const double syncOnOff = syncCo.rate() / syncOne.rate();
    target(fmt::format("{}: coalesced CPU per decision / textbook one by one", kWorkloadLabels[w]), cpu,
           fmt::format("<= {:g}", kMaxCpuRatio), cpu <= kMaxCpuRatio);
    target(fmt::format("{}: coalesced decisions/s / textbook one-by-one decisions/s", kWorkloadLabels[w]), rate,
           fmt::format(">= {:g}", kMinRateRatio), rate >= kMinRateRatio);
    target(fmt::format("{}: coalesced CPU per decision / library one by one", kWorkloadLabels[w]),
           co.cpuUsPerDecision() / one.cpuUsPerDecision(), "", false);
    target(fmt::format("{}: coalesced decisions/s / library one by one, 256 in flight", kWorkloadLabels[w]), onOff,
           fmt::format(">= {:g}", kMinOnOffRatio), onOff >= kMinOnOffRatio);
    target(fmt::format("{}: coalesce on / off decisions/s, {} sync threads", kWorkloadLabels[w], kSyncThreads),
           syncOnOff, fmt::format(">= {:g}", kSyncNoise), syncOnOff >= kSyncNoise);
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  World world{rb::startPinnedServer({}, kServerCpu, kClientCpu),
              nullptr,
              nullptr,
              nullptr,
              nullptr,
              nullptr,
              "",
              "",
              "",
              nullptr};
  gWorld = &world;
  world.admin = std::make_unique<rb::RawRedis>(world.pinned.server->host(), world.pinned.server->port());
  world.load = std::make_unique<rb::RawRedis>(world.pinned.server->host(), world.pinned.server->port());
  world.client = redlimit::Client::fromUri(world.pinned.server->uri());
  redlimit::ClientOptions separate;
  separate.coalesce = false;
  world.oneByOne = redlimit::Client::fromUri(world.pinned.server->uri(), separate);
  redlimit::ClientOptions coalescing;
  coalescing.coalesce = true;
  world.together = redlimit::Client::fromUri(world.pinned.server->uri(), coalescing);
  world.oursSha = loadScript(redlimit::detail::lua::gcra.source);
  world.textbookSha = loadScript(readFile(REDLIMIT_BENCH_SOURCE_DIR "/textbook/redis_rate_gcra.lua"));
  world.packed =
      "G" + packU32(kBurst) + packU32(kRate) + packU32(kPeriod.count()) + packU32(redlimit::kDefaultIdleMargin.count());
  world.perKey =
      std::make_unique<redlimit::Limiter>(world.client, "bench-keyed", redlimit::Policy::gcra(kRate, kPeriod, kBurst));

  benchmark::RegisterBenchmark("LimiterGcra/library/new_keys", BM_LibraryNewKeys)->Iterations(1)->UseManualTime();
  benchmark::RegisterBenchmark("LimiterGcra/ours_raw/new_keys", BM_OursRawNewKeys)->Iterations(1)->UseManualTime();
  benchmark::RegisterBenchmark("LimiterGcra/textbook_raw/new_keys", BM_TextbookRawNewKeys)
      ->Iterations(1)
      ->UseManualTime();
  benchmark::RegisterBenchmark("LimiterGcra/ours_raw/hot_keys", BM_OursRawHotKeys)->Iterations(1)->UseManualTime();
  benchmark::RegisterBenchmark("LimiterGcra/textbook_raw/hot_keys", BM_TextbookRawHotKeys)
      ->Iterations(1)
      ->UseManualTime();
  benchmark::RegisterBenchmark("LimiterGcra/load/10000_keys", BM_Load)->Arg(kManyKeys)->Iterations(1)->UseManualTime();
  benchmark::RegisterBenchmark("LimiterGcra/load/hot_key", BM_Load)->Arg(kHotKey)->Iterations(1)->UseManualTime();
  rb::CollectReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const std::string text = summary();
  std::cout << '\n' << text << std::flush;
  std::ofstream(rb::resultsDir() + "/bench_keyed.summary.txt") << text;
  world.perKey.reset();
  world.client.reset();
  world.oneByOne.reset();
  gWorld = nullptr;
  return 0;
} catch (const std::exception& e) {  // what the library or the harness threw: said, not an abort
  std::fprintf(stderr, "bench_keyed: %s\n", e.what());
  return 1;
}
