// bench_transport: what the transport (one I/O thread per Client, a few multiplexed connections,
// automatic pipelining) gets out of a redis-server, against what the server can do, each figure
// beside its reference measured in the same run; then a summary of ratios (stdout and
// <results>/bench_transport.summary.txt).
//
//  1. Saturation reference: a raw hiredis driver, 50 connections with 16 EVALSHAs of acquire.lua
//     in flight on each, on one hot limiter: decisions/s
//  2. One Client (default pool), 8 threads calling RateLimiter::tryAcquire on that limiter
//  3. One Client, one thread keeping 256 RateLimiter::tryAcquireAsync in flight (each completion
//     issues the next)
//  4. One thread, sync: tryAcquire against raw hiredis EVALSHA of the same script, interleaved
//     call by call (as bench_redlimit's BM_RoundTrips), p50 and p99
//  5. The same over TLS: tryAcquire p50 (interleaved with 4) and the 8 threads of 2
//  6. The 8 threads of 2 with coalescing on (the default)
//  7. What a user would write instead of 2 and 6: 8 threads, each on its own blocking raw hiredis
//     connection, EVALSHA of the same script one call at a time (the baseline of 2 and 6)
//  8. The window of 3 with coalescing on (the default): against 3 and the reference
//  9. One thread, sync, one by one: tryAcquire against raw blocking hiredis EVALSHA of acquire.lua,
//     for the client CPU a decision costs (a sync call on an idle connection does its own I/O)
// 10. One-key: 8 threads calling Limiter::decide (a stored GCRA policy) on one Client against 8
//     threads each on its own blocking hiredis connection, EVALSHA of gcra.lua with the same args
//
// One redis-server with a plain and a TLS port serves everything, pinned to CPU 0; this process
// (the drivers, the callers and every Client's I/O thread) runs on CPU 1. With fewer than two
// usable CPUs nothing is pinned and the summary says so.
//
// Equal state: every call asks for one permit of a limiter whose rate (10^9 per hour) is never
// reached, so every call is a grant and adds one member to the permits log. Each throughput
// phase makes exactly kDecisions decisions on a fresh limiter (deleted afterwards), so every phase
// meets the same sequence of states. The throughput phases run kPasses times, every other pass in
// mirrored order (1 2 3 5, 5 3 2 1, ...), so that a drift in the machine's speed hits them alike;
// figures are the means. Other load on the machine shows in the summary (CPU n: client/all).
//
// Per phase the summary also says where the CPU went: this process (getrusage, all threads), of
// it the Client's own threads (the I/O thread, from /proc/self/task/<tid>/schedstat), the server
// (INFO cpu), each per decision and as the share of one CPU while the phase ran; context switches
// per decision; and requests per write (PoolStats: the effect of automatic pipelining).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_lua.hpp"
#include "support/bench_support.hpp"
#include "support/cpu_usage.hpp"
#include "support/pinned_server.hpp"
#include "support/pipelined_load.hpp"
#include "support/raw_acquire.hpp"
#include "support/tls_files.hpp"

namespace {

namespace rb = redlimit::bench;
using redlimit::RateLimiter;
using redlimit::RateType;
using std::chrono::milliseconds;

constexpr std::int64_t kHuge = 1000000000;  // a rate no benchmark reaches: every call is granted
constexpr milliseconds kHour{3600000};      // an interval nothing expires in during the run
constexpr std::int64_t kDecisions = 30000;  // decisions per throughput phase
constexpr int kRawConnections = 50;         // reference driver: connections...
constexpr int kRawDepth = 16;               // ...and requests in flight on each
constexpr int kThreads = 8;                 // callers of the sync phases
constexpr std::int64_t kWindow = 256;       // async requests in flight
constexpr int kPasses = 4;                  // repetitions of the throughput phases, mirrored
constexpr int kWarmup = 200;                // untimed rounds before the latency rounds
constexpr int kLatencyRounds = 4000;        // timed rounds of the interleaved latency phase
constexpr int kServerCpu = 0;
constexpr int kClientCpu = 1;

// Targets. Rows 2 and 6 are held to what a user would write instead (row 7), not to the saturated
// rate: 8 sync callers cannot pass 8 / round trip.
constexpr double kMinThroughputRatio = 0.8;        // row 3 against the reference
constexpr double kMaxLatencyRatio = 1.05;          // row 4
constexpr double kMinOwnConnections = 1.0;         // rows 2, 6 and 10 against their raw baselines
constexpr double kMinCoalescedOverOneByOne = 1.0;  // row 8 against row 3: coalescing must not lose
// A sync call on an idle connection does its own I/O (no hand-off to the I/O thread).
constexpr double kMaxSyncCpuOverRaw = 1.5;  // row 9: client CPU per decision, 1 thread, against raw blocking

// --- State of the run -------------------------------------------------------------------------

struct World {
  std::unique_ptr<rb::TlsFiles> tls;
  std::unique_ptr<rb::BenchServer> server;  // plain and TLS port
  std::unique_ptr<rb::RawRedis> admin;      // plain connection: set-up and INFO
  std::string placement;                    // what the summary says about CPU pinning
  bool pinned = false;                      // server on kServerCpu, this process on kClientCpu
};
World* gWorld = nullptr;

enum Phase {
  kRaw,
  kSyncTcp,
  kAsync,
  kSyncTls,
  kSyncCoalesced,
  kRawThreads,
  kAsyncCoalesced,
  kSyncOne,
  kRawOne,
  kOneKeyThreads,
  kRawOneKeyThreads,
  kPhases
};
const char* const kPhaseNames[kPhases] = {"raw_pipelined_50x16",
                                          "tryAcquire_8_threads",
                                          "tryAcquireAsync_256_in_flight",
                                          "tryAcquire_8_threads_tls",
                                          "tryAcquire_8_threads_coalesced",
                                          "raw_blocking_8_threads",
                                          "tryAcquireAsync_256_in_flight_coalesced",
                                          "tryAcquire_1_thread",
                                          "raw_blocking_1_thread",
                                          "limiter_gcra_decide_8_threads",
                                          "raw_blocking_gcra_8_threads"};

/// What one throughput phase did and what it cost. CPU times in seconds.
struct PhaseResult {
  bool valid = false;
  std::int64_t decisions = 0;
  std::int64_t granted = 0;
  std::int64_t errors = 0;
  double seconds = 0;            // first request to last reply
  double clientCpu = 0;          // this process, user + system
  double clientSystem = 0;       // of it, system
  double libraryCpu = NAN;       // of it, the threads the Client started (its I/O thread)
  double serverCpu = 0;          // INFO cpu: used_cpu_user + used_cpu_sys
  std::int64_t serverCalls = 0;  // EVALSHA + EVAL the server ran
  std::int64_t switches = 0;     // voluntary + involuntary context switches of this process
  std::uint64_t requests = 0;    // PoolStats: requests written
  std::uint64_t writes = 0;      // PoolStats: writes that carried them
  double serverCpuBusy = NAN;    // /proc/stat: kServerCpu busy, whoever ran there (pinned runs only)
  double clientCpuBusy = NAN;    // the same for kClientCpu

  [[nodiscard]] double rate() const { return static_cast<double>(decisions) / seconds; }
  [[nodiscard]] double perDecisionUs(double cpuSeconds) const {
    return cpuSeconds * 1e6 / static_cast<double>(decisions);
  }
};
PhaseResult gResults[kPhases][kPasses];

/// Latencies of the interleaved phase (rows 4 and 5), µs.
enum LatencyKind { kEvalshaHiredis, kTryAcquireTcp, kTryAcquireTls, kLatencyKinds };
const char* const kLatencyNames[kLatencyKinds] = {"evalsha_hiredis", "tryAcquire_tcp", "tryAcquire_tls"};
rb::LatencySummary gLatency[kLatencyKinds];
bool gLatencyValid = false;

std::string freshName(const std::string& what) {
  static std::atomic<int> counter{0};
  return "bench:transport:" + what + ":" + std::to_string(++counter);
}
// A Limiter's name holds no ':' (its keys are rl:<name>:<key>).
std::string freshLimiterName(const std::string& what) {
  static std::atomic<int> counter{0};
  return "bench.transport." + what + "." + std::to_string(++counter);
}

redlimit::ClientOptions clientOptions(bool tls) {
  const rb::BenchServer& server = *gWorld->server;
  redlimit::ClientOptions o;
  o.connection.host = server.host();
  o.connection.port = tls ? server.tlsPort() : server.port();
  o.connection.tls.enabled = tls;
  if (tls) o.connection.tls.caFile = gWorld->tls->caFile();
  // Generous: a loaded machine must show up as latency, not as a TimeoutError. The pool keeps
  // its default size: the transport as a user gets it.
  o.connection.commandTimeout = std::chrono::seconds(10);
  o.connection.connectTimeout = std::chrono::seconds(5);
  return o;
}

/// A Client with its connections open and the threads it started known.
struct PhaseClient {
  std::shared_ptr<redlimit::Client> client;
  std::vector<pid_t> threads;  // started by the Client (its I/O thread)
};

PhaseClient makeClient(bool tls) {
  PhaseClient out;
  const std::vector<pid_t> before = rb::threadIds(::getpid());
  out.client = redlimit::Client::create(clientOptions(tls));
  // Requests spread round-robin over the connections: this opens each of them, and runs the
  // script once on each (it was loaded at start, so no NOSCRIPT round is left for the phase).
  RateLimiter warm(out.client, freshName("warm"));
  warm.setRate(RateType::Overall, kHuge, kHour);
  for (std::size_t i = 0; i < 4 * out.client->options().pool.size; ++i) {
    if (!warm.tryAcquire()) throw std::runtime_error("bench: warm-up acquire denied");
  }
  (void)warm.deleteLimiter();
  for (pid_t tid : rb::threadIds(::getpid())) {
    if (!std::binary_search(before.begin(), before.end(), tid)) out.threads.push_back(tid);
  }
  return out;
}

// `coalesce`: RateLimiter::Options::coalesce (the default is on; the one-by-one rows turn it off).
RateLimiter freshLimiter(const std::shared_ptr<redlimit::Client>& client, bool coalesce = false) {
  redlimit::RateLimiter::Options options;
  options.coalesce = coalesce;
  RateLimiter limiter(client, freshName("hot"), options);
  limiter.setRate(RateType::Overall, kHuge, kHour);
  return limiter;
}

// --- Measuring a phase ------------------------------------------------------------------------

/// The counters a phase is measured between.
struct Snapshot {
  rb::Clock::time_point at;
  rb::ProcessUsage usage;
  double libraryCpu = NAN;
  rb::ServerSample server;
  redlimit::PoolStats pool;
  rb::CpuTimes serverCpu, clientCpu;

  static Snapshot take(const PhaseClient* pc) {
    Snapshot s;
    s.serverCpu = rb::CpuTimes::of(kServerCpu);
    s.clientCpu = rb::CpuTimes::of(kClientCpu);
    s.server = rb::sampleServer(*gWorld->admin);
    if (pc != nullptr) {
      s.pool = pc->client->poolStats();
      if (!pc->threads.empty()) {
        s.libraryCpu = 0;
        for (pid_t tid : pc->threads) s.libraryCpu += rb::threadCpuSeconds(tid);
      }
    }
    s.usage = rb::ProcessUsage::now();
    s.at = rb::Clock::now();
    return s;
  }
};

/// `end` is when the last reply arrived; a, b the snapshots around the phase.
PhaseResult between(const Snapshot& a, const Snapshot& b, rb::Clock::time_point end, std::int64_t decisions,
                    std::int64_t granted, std::int64_t errors) {
  PhaseResult r;
  r.valid = true;
  r.decisions = decisions;
  r.granted = granted;
  r.errors = errors;
  r.seconds = std::chrono::duration<double>(end - a.at).count();
  r.clientSystem = b.usage.systemSeconds - a.usage.systemSeconds;
  r.clientCpu = b.usage.userSeconds - a.usage.userSeconds + r.clientSystem;
  r.libraryCpu = b.libraryCpu - a.libraryCpu;  // NaN without a Client
  r.serverCpu = b.server.cpuSeconds - a.server.cpuSeconds;
  r.serverCalls = b.server.scriptCalls - a.server.scriptCalls;
  r.switches = (b.usage.voluntarySwitches - a.usage.voluntarySwitches) +
               (b.usage.involuntarySwitches - a.usage.involuntarySwitches);
  r.requests = b.pool.requests - a.pool.requests;
  r.writes = b.pool.writes - a.pool.writes;
  if (gWorld->pinned) {
    r.serverCpuBusy = b.serverCpu.busy - a.serverCpu.busy;
    r.clientCpuBusy = b.clientCpu.busy - a.clientCpu.busy;
  }
  return r;
}

// --- 1. The saturation reference: raw hiredis, 50 connections x 16 in flight ----------------------

PhaseResult runRawPipelined() {
  const rb::BenchServer& server = *gWorld->server;
  // A handle only for the keys and the configuration; the calls go through raw hiredis.
  auto setup = redlimit::Client::create(clientOptions(false));
  RateLimiter limiter = freshLimiter(setup);
  std::vector<std::unique_ptr<rb::RawRedis>> conns;
  std::vector<pollfd> fds;
  for (int i = 0; i < kRawConnections; ++i) {
    conns.push_back(std::make_unique<rb::RawRedis>(server.host(), server.port()));
    (void)conns.back()->command({"PING"});
    fds.push_back(pollfd{conns.back()->get()->fd, POLLIN, 0});
  }
  rb::RawAcquire acquire("EVALSHA", redlimit::detail::lua::acquire.sha1, limiter.keys());
  std::int64_t issued = 0, done = 0, granted = 0;
  auto send = [&](redisContext* ctx) {
    acquire.newId();
    acquire.append(ctx);
    ++issued;
  };
  auto flush = [](redisContext* ctx) {
    int written = 0;  // blocking socket: redisBufferWrite returns once a write took everything
    while (written == 0) {
      if (redisBufferWrite(ctx, &written) != REDIS_OK) {
        throw std::runtime_error(std::string("bench: raw driver write failed: ") + ctx->errstr);
      }
    }
  };

  const Snapshot a = Snapshot::take(nullptr);
  for (auto& c : conns) {
    for (int k = 0; k < kRawDepth && issued < kDecisions; ++k) send(c->get());
    flush(c->get());
  }
  while (done < kDecisions) {
    const int ready = ::poll(fds.data(), fds.size(), 10000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) throw std::runtime_error("bench: raw driver: no reply in 10 s");
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      redisContext* ctx = conns[i]->get();
      // The socket is readable: one read() returns what arrived without blocking.
      if (redisBufferRead(ctx) != REDIS_OK) {
        throw std::runtime_error(std::string("bench: raw driver read failed: ") + ctx->errstr);
      }
      bool sent = false;
      for (;;) {
        void* reply = nullptr;
        if (redisGetReplyFromReader(ctx, &reply) != REDIS_OK) {
          throw std::runtime_error(std::string("bench: raw driver protocol error: ") + ctx->errstr);
        }
        if (reply == nullptr) break;
        granted += rb::RawAcquire::decision(ctx, static_cast<redisReply*>(reply));
        ++done;
        if (issued < kDecisions) {
          send(ctx);
          sent = true;
        }
      }
      if (sent) flush(ctx);
    }
  }
  const auto end = rb::Clock::now();
  const PhaseResult r = between(a, Snapshot::take(nullptr), end, done, granted, 0);
  (void)limiter.deleteLimiter();
  return r;
}

// --- 2. and 5. Threads calling tryAcquire on one Client -------------------------------------------

// `threads` threads make kDecisions calls of `decide(thread)` (true: granted) between the
// snapshots of `pc` (nullptr: no Client to look at).
PhaseResult runThreads(int threads, const PhaseClient* pc, const std::function<bool(int)>& decide) {
  std::atomic<std::int64_t> next{0}, granted{0}, errors{0};
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::vector<rb::Clock::time_point> ends(static_cast<std::size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return go; });
      }
      while (next.fetch_add(1, std::memory_order_relaxed) < kDecisions) {
        try {
          if (decide(t)) granted.fetch_add(1, std::memory_order_relaxed);
        } catch (const std::exception&) {
          errors.fetch_add(1, std::memory_order_relaxed);
        }
      }
      ends[static_cast<std::size_t>(t)] = rb::Clock::now();
    });
  }
  const Snapshot a = Snapshot::take(pc);
  {
    std::lock_guard<std::mutex> lock(m);
    go = true;
  }
  cv.notify_all();
  for (auto& w : workers) w.join();
  const auto end = *std::max_element(ends.begin(), ends.end());
  return between(a, Snapshot::take(pc), end, kDecisions, granted.load(), errors.load());
}

PhaseResult runSyncThreads(bool tls, bool coalesce, int threads = kThreads) {
  const PhaseClient pc = makeClient(tls);
  RateLimiter limiter = freshLimiter(pc.client, coalesce);
  const PhaseResult r = runThreads(threads, &pc, [&](int) { return limiter.tryAcquire(); });
  (void)limiter.deleteLimiter();
  return r;
}

// --- 10. One-key: Limiter::decide under a stored GCRA policy --------------------------------------

// A policy no phase reaches, stored in the key: decide(key) then sends `take "" G 1 0` on
// rl:<limiter>:<key> (no configuration in the call), which the raw threads send too.
redlimit::Policy hugeGcra() { return redlimit::Policy::gcra(kHuge, kHour, kHuge).stored(); }

PhaseResult runOneKeyThreads() {
  const PhaseClient pc = makeClient(false);
  const std::string name = freshLimiterName("gcra");
  redlimit::Limiter limiter(pc.client, name, hugeGcra());
  limiter.setPolicy("k", hugeGcra());
  if (!limiter.decide("k").allowed) throw std::runtime_error("bench: the GCRA limiter denied its first call");
  const PhaseResult r = runThreads(kThreads, &pc, [&](int) { return limiter.decide("k").allowed; });
  (void)redlimit::detail::command(*pc.client, {"DEL", "rl:" + name + ":k"});
  return r;
}

PhaseResult runRawOneKeyThreads() {
  const rb::BenchServer& server = *gWorld->server;
  auto setup = redlimit::Client::create(clientOptions(false));
  const std::string name = freshLimiterName("gcra");
  redlimit::Limiter(setup, name, hugeGcra()).setPolicy("k", hugeGcra());
  const std::string key = "rl:" + name + ":k";
  // The command prepared once per thread (no argv built per call, as a blocking caller would do).
  const std::vector<std::string> argv{"EVALSHA", redlimit::detail::lua::gcra.sha1, "1", key, "take", "", "G", "1", "0"};
  std::vector<std::unique_ptr<rb::RawRedis>> conns;
  std::vector<std::unique_ptr<rb::PreparedCalls>> calls;
  // One call on thread t's connection: true if it was answered with a decision (the packed
  // string), not an error.
  auto call = [&](std::size_t t) {
    redisContext* ctx = conns[t]->get();
    calls[t]->append(ctx, 0);
    void* reply = nullptr;
    if (redisGetReply(ctx, &reply) != REDIS_OK) reply = nullptr;
    if (reply == nullptr) throw std::runtime_error(std::string("bench: raw gcra call failed: ") + ctx->errstr);
    const rb::RawRedis::ReplyPtr owned(static_cast<redisReply*>(reply));
    return owned->type == REDIS_REPLY_STRING;
  };
  for (std::size_t t = 0; t < static_cast<std::size_t>(kThreads); ++t) {
    conns.push_back(std::make_unique<rb::RawRedis>(server.host(), server.port()));
    calls.push_back(std::make_unique<rb::PreparedCalls>(std::vector<std::vector<std::string>>{argv}));
    if (!call(t)) throw std::runtime_error("bench: raw gcra call: not a decision (gcra.lua not loaded?)");
  }
  const PhaseResult r = runThreads(kThreads, nullptr, [&](int t) { return call(static_cast<std::size_t>(t)); });
  (void)redlimit::detail::command(*setup, {"DEL", key});
  return r;
}

// --- 7. What a user would write instead: 8 threads, each on its own blocking hiredis connection ---

PhaseResult runRawThreads(int threads = kThreads) {
  const rb::BenchServer& server = *gWorld->server;
  auto setup = redlimit::Client::create(clientOptions(false));
  RateLimiter limiter = freshLimiter(setup);
  std::vector<std::unique_ptr<rb::RawRedis>> conns;
  std::vector<std::unique_ptr<rb::RawAcquire>> calls;
  for (int t = 0; t < threads; ++t) {
    conns.push_back(std::make_unique<rb::RawRedis>(server.host(), server.port()));
    calls.push_back(std::make_unique<rb::RawAcquire>("EVALSHA", redlimit::detail::lua::acquire.sha1, limiter.keys()));
    calls.back()->newId();
    (void)calls.back()->call(conns.back()->get());  // connected, and the script run once on it
  }
  const PhaseResult r = runThreads(threads, nullptr, [&](int t) {
    rb::RawAcquire& call = *calls[static_cast<std::size_t>(t)];
    call.newId();
    return call.call(conns[static_cast<std::size_t>(t)]->get()) == 1;
  });
  (void)limiter.deleteLimiter();
  return r;
}

// --- 3. One thread, a window of tryAcquireAsync ------------------------------------------------------

PhaseResult runAsyncWindow(bool coalesce) {
  const PhaseClient pc = makeClient(false);
  RateLimiter limiter = freshLimiter(pc.client, coalesce);
  std::atomic<std::int64_t> issued{0}, completed{0}, granted{0}, errors{0};
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  rb::Clock::time_point end;
  // Each completion (on the Client's I/O thread) issues the next request, so kWindow stay in
  // flight until kDecisions were issued. Everything a completion touches here happens before it
  // counts itself, so the last count is the last touch.
  std::function<void()> issue = [&] {
    if (issued.fetch_add(1, std::memory_order_relaxed) >= kDecisions) return;
    limiter.tryAcquireAsync(1, [&](bool ok, const std::exception_ptr& error) {
      if (error) {
        errors.fetch_add(1, std::memory_order_relaxed);
      } else if (ok) {
        granted.fetch_add(1, std::memory_order_relaxed);
      }
      issue();
      if (completed.fetch_add(1, std::memory_order_acq_rel) + 1 == kDecisions) {
        std::lock_guard<std::mutex> lock(m);
        end = rb::Clock::now();
        finished = true;
        cv.notify_one();
      }
    });
  };
  const Snapshot a = Snapshot::take(&pc);
  for (std::int64_t i = 0; i < kWindow; ++i) issue();
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return finished; });
  }
  const PhaseResult r = between(a, Snapshot::take(&pc), end, kDecisions, granted.load(), errors.load());
  (void)limiter.deleteLimiter();
  return r;
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

// One pass of one phase. Manual time = the phase's wall time.
void BM_Throughput(benchmark::State& state, Phase phase, std::size_t pass) {
  guarded(state, [&] {
    PhaseResult r;
    switch (phase) {
      case kRaw:
        r = runRawPipelined();
        break;
      case kSyncTcp:
        r = runSyncThreads(false, false);
        break;
      case kSyncCoalesced:
        r = runSyncThreads(false, true);
        break;
      case kAsync:
        r = runAsyncWindow(false);
        break;
      case kAsyncCoalesced:
        r = runAsyncWindow(true);
        break;
      case kRawThreads:
        r = runRawThreads();
        break;
      case kSyncOne:
        r = runSyncThreads(false, false, 1);
        break;
      case kRawOne:
        r = runRawThreads(1);
        break;
      case kOneKeyThreads:
        r = runOneKeyThreads();
        break;
      case kRawOneKeyThreads:
        r = runRawOneKeyThreads();
        break;
      default:
        r = runSyncThreads(true, false);
    }
    for (auto _ : state) state.SetIterationTime(r.seconds);
    state.counters["decisions_per_s"] = r.rate();
    state.counters["client_cpu_us_per_decision"] = r.perDecisionUs(r.clientCpu);
    state.counters["server_cpu_us_per_decision"] = r.perDecisionUs(r.serverCpu);
    state.counters["server_busy"] = r.serverCpu / r.seconds;
    state.counters["client_busy"] = r.clientCpu / r.seconds;
    if (r.writes > 0)
      state.counters["requests_per_write"] = static_cast<double>(r.requests) / static_cast<double>(r.writes);
    state.counters["errors"] = static_cast<double>(r.errors);
    gResults[phase][pass] = r;
  });
}

// --- 4. and 5. One thread, sync, interleaved call by call ------------------------------------------

// Raw hiredis EVALSHA, tryAcquire over TCP and over TLS, on one limiter, the order rotating every
// round so that drift in the machine's load hits all of them alike. Manual time = tryAcquire's.
void BM_SyncLatency(benchmark::State& state) {
  guarded(state, [&] {
    const rb::BenchServer& server = *gWorld->server;
    rb::RawRedis raw(server.host(), server.port());
    const PhaseClient tcp = makeClient(false);
    const PhaseClient tls = makeClient(true);
    RateLimiter overTcp = freshLimiter(tcp.client);
    RateLimiter overTls(tls.client, overTcp.getName());
    rb::RawAcquire script("EVALSHA", redlimit::detail::lua::acquire.sha1, overTcp.keys());
    auto run = [&](int kind) {
      bool granted = false;
      switch (kind) {
        case kEvalshaHiredis:
          script.newId();
          granted = script.call(raw.get()) == 1;
          break;
        case kTryAcquireTcp:
          granted = overTcp.tryAcquire();
          break;
        default:
          granted = overTls.tryAcquire();
      }
      if (!granted) throw std::runtime_error("bench: unexpected denial");
    };
    for (int i = 0; i < kWarmup; ++i) {
      for (int k = 0; k < kLatencyKinds; ++k) run(k);
    }
    std::vector<double> us[kLatencyKinds];
    int round = 0;
    for (auto _ : state) {
      for (int step = 0; step < kLatencyKinds; ++step) {
        const int kind = (round + step) % kLatencyKinds;
        const auto t0 = rb::Clock::now();
        run(kind);
        const double d = rb::micros(t0, rb::Clock::now());
        us[kind].push_back(d);
        if (kind == kTryAcquireTcp) state.SetIterationTime(d / 1e6);
      }
      ++round;
    }
    for (int k = 0; k < kLatencyKinds; ++k) {
      gLatency[k] = rb::summarize(us[k]);
      state.counters[std::string(kLatencyNames[k]) + "_p50_us"] = gLatency[k].p50;
      state.counters[std::string(kLatencyNames[k]) + "_p99_us"] = gLatency[k].p99;
    }
    gLatencyValid = true;
    (void)overTcp.deleteLimiter();
  });
}

void registerBenchmarks() {
  using benchmark::RegisterBenchmark;
  RegisterBenchmark("SyncLatency/evalsha_vs_tryAcquire_tcp_tls", BM_SyncLatency)
      ->Iterations(kLatencyRounds)
      ->UseManualTime();
  for (int pass = 0; pass < kPasses; ++pass) {
    for (int i = 0; i < kPhases; ++i) {
      const auto phase = static_cast<Phase>(pass % 2 == 0 ? i : kPhases - 1 - i);  // mirrored on odd passes
      RegisterBenchmark(fmt::format("Throughput/{}/pass:{}", kPhaseNames[phase], pass + 1).c_str(), BM_Throughput,
                        phase, static_cast<std::size_t>(pass))
          ->Iterations(1)
          ->UseManualTime();
    }
  }
}

// --- Summary --------------------------------------------------------------------------------------

/// The mean over the passes of `f` applied to the phase's results; NaN if a pass is missing.
template <class F>
double mean(Phase phase, F&& f) {
  double sum = 0;
  for (const PhaseResult& r : gResults[phase]) {
    if (!r.valid) return NAN;
    sum += f(r);
  }
  return sum / kPasses;
}
double meanRate(Phase phase) {
  return mean(phase, [](const PhaseResult& r) { return r.rate(); });
}

using redlimit::bench::cell;

std::string summary(const std::string& machine) {
  std::string out;
  auto row = [&](const std::string& what, double value, int precision, const char* op, double target) {
    std::string goal, verdict = "report";
    if (op != nullptr) {
      goal = fmt::format("{} {:g}", op, target);
      const bool met = op[0] == '>' ? value >= target : value <= target;
      verdict = std::isnan(value) ? "n/a" : met ? "met" : "MISSED";
    }
    out += fmt::format("  {:<72} {:>8}  {:<19} {}\n", what, cell(value, precision), goal, verdict);
  };
  const double reference = meanRate(kRaw);
  auto requestsPerWrite = [](Phase p) {
    return mean(p, [](const PhaseResult& r) {
      return r.writes > 0 ? static_cast<double>(r.requests) / static_cast<double>(r.writes) : NAN;
    });
  };

  out += fmt::format("redlimit transport benchmark (bench_transport), {}\n", rb::nowText());
  out += fmt::format("Machine: {}\n", machine);
  out += fmt::format("CPU placement: {}\n", gWorld->placement);
  out += fmt::format(
      "One redis-server (plain and TLS port), acquire.lua on one hot limiter, every call granted; each throughput\n"
      "phase: {} decisions on a fresh limiter (equal state), run {} times in mirrored order, means shown.\n"
      "Clients: default pool ({} connections); raw driver: hiredis {}.{}.{}.\n\n",
      kDecisions, kPasses, redlimit::ClientOptions::Pool{}.size, HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH);

  out += fmt::format("{:<74} {:>8}  {}\n", "Ratios, each measured in this run", "value", "target");
  row(fmt::format("1. raw hiredis, {} conns x {} in flight: decisions/s (the reference)", kRawConnections, kRawDepth),
      reference, 0, nullptr, 0);
  row(fmt::format("7. {} threads, each its own blocking raw hiredis connection: decisions/s", kThreads),
      meanRate(kRawThreads), 0, nullptr, 0);
  row(fmt::format("2. {} threads, one Client, tryAcquire one by one: decisions/s / (7)", kThreads),
      meanRate(kSyncTcp) / meanRate(kRawThreads), 2, ">=", kMinOwnConnections);
  row("   the same / (1)", meanRate(kSyncTcp) / reference, 2, nullptr, 0);
  row(fmt::format("   requests per write ({:.0f} decisions/s)", meanRate(kSyncTcp)), requestsPerWrite(kSyncTcp), 1,
      nullptr, 0);
  row(fmt::format("3. 1 thread, tryAcquireAsync, {} in flight: decisions/s / (1)", kWindow),
      meanRate(kAsync) / reference, 2, ">=", kMinThroughputRatio);
  row(fmt::format("   requests per write ({:.0f} decisions/s)", meanRate(kAsync)), requestsPerWrite(kAsync), 1, nullptr,
      0);
  row(fmt::format("6. {} threads, coalesced (the default): decisions/s / (7)", kThreads),
      meanRate(kSyncCoalesced) / meanRate(kRawThreads), 2, ">=", kMinOwnConnections);
  row("   the same / (1)", meanRate(kSyncCoalesced) / reference, 2, nullptr, 0);
  auto serverUsPerDecision = [](Phase p) {
    return mean(p, [](const PhaseResult& r) { return r.perDecisionUs(r.serverCpu); });
  };
  row("   server CPU per decision, coalesced / one by one (row 2)",
      serverUsPerDecision(kSyncCoalesced) / serverUsPerDecision(kSyncTcp), 2, nullptr, 0);
  row("   server CPU per decision, 8 own connections (row 7) / one by one (row 2)",
      serverUsPerDecision(kRawThreads) / serverUsPerDecision(kSyncTcp), 2, nullptr, 0);
  row(fmt::format("   requests per write ({:.0f} decisions/s)", meanRate(kSyncCoalesced)),
      requestsPerWrite(kSyncCoalesced), 1, nullptr, 0);
  row("   coalesced / one by one (row 2): decisions/s", meanRate(kSyncCoalesced) / meanRate(kSyncTcp), 2, nullptr, 0);
  row(fmt::format("8. 1 thread, tryAcquireAsync, {} in flight, coalesced (the default): decisions/s / (3)", kWindow),
      meanRate(kAsyncCoalesced) / meanRate(kAsync), 2, ">=", kMinCoalescedOverOneByOne);
  row("   the same / (1)", meanRate(kAsyncCoalesced) / reference, 2, nullptr, 0);
  row("   server CPU per decision, coalesced / one by one (row 3)",
      serverUsPerDecision(kAsyncCoalesced) / serverUsPerDecision(kAsync), 2, nullptr, 0);
  row(fmt::format("   requests per write ({:.0f} decisions/s)", meanRate(kAsyncCoalesced)),
      requestsPerWrite(kAsyncCoalesced), 1, nullptr, 0);
  const double nan = NAN;
  const rb::LatencySummary* lat = gLatencyValid ? gLatency : nullptr;
  auto p50 = [&](LatencyKind k) { return lat != nullptr ? lat[k].p50 : nan; };
  // A sync caller has one call in flight, and no call is shorter than one round trip: rows 2 and 6
  // cannot pass kThreads / (round trip) whatever the client does. The round trip is the raw
  // EVALSHA p50 of the latency phase (one thread, so the server answers at once).
  row(fmt::format("   ceiling of rows 2, 6 and 7: {} callers / raw EVALSHA p50 ({:.0f}/s) / (1)", kThreads,
                  kThreads * 1e6 / p50(kEvalshaHiredis)),
      kThreads * 1e6 / p50(kEvalshaHiredis) / reference, 2, nullptr, 0);
  row("4. 1 thread: tryAcquire p50 / raw hiredis EVALSHA p50 (interleaved)", p50(kTryAcquireTcp) / p50(kEvalshaHiredis),
      2, "<=", kMaxLatencyRatio);
  auto clientUsPerDecision = [](Phase p) {
    return mean(p, [](const PhaseResult& r) { return r.perDecisionUs(r.clientCpu); });
  };
  row("9. 1 thread, tryAcquire one by one: client CPU per decision / raw blocking EVALSHA's",
      clientUsPerDecision(kSyncOne) / clientUsPerDecision(kRawOne), 2, "<=", kMaxSyncCpuOverRaw);
  row(fmt::format("   the same: {} / {} us", cell(clientUsPerDecision(kSyncOne), 2),
                  cell(clientUsPerDecision(kRawOne), 2)),
      NAN, 2, nullptr, 0);
  row("   1 thread, tryAcquire one by one / raw blocking EVALSHA: decisions/s", meanRate(kSyncOne) / meanRate(kRawOne),
      2, nullptr, 0);
  row(fmt::format("10. {} threads, one Client, Limiter gcra decide: decisions/s / {} own raw EVALSHA gcra.lua",
                  kThreads, kThreads),
      meanRate(kOneKeyThreads) / meanRate(kRawOneKeyThreads), 2, ">=", kMinOwnConnections);
  row(fmt::format("   the same: {:.0f} / {:.0f} decisions/s", meanRate(kOneKeyThreads), meanRate(kRawOneKeyThreads)),
      NAN, 2, nullptr, 0);
  row("5. TLS / TCP, tryAcquire p50, 1 thread (interleaved)", p50(kTryAcquireTls) / p50(kTryAcquireTcp), 2, nullptr, 0);
  row(fmt::format("   TLS / TCP, {}-thread tryAcquire decisions/s", kThreads), meanRate(kSyncTls) / meanRate(kSyncTcp),
      2, nullptr, 0);
  row(fmt::format("   TLS {}-thread decisions/s / (1)", kThreads), meanRate(kSyncTls) / reference, 2, nullptr, 0);

  out += fmt::format(
      "\nThroughput phases, means of {} passes        decisions/s (min-max)  req/write  client CPU us/dec  "
      "of it I/O thread  server CPU us/dec  server-bound  CPU {}: client/all  CPU {}: server/all  switches/dec\n",
      kPasses, kClientCpu, kServerCpu);
  const Phase order[] = {kRaw,        kSyncTcp, kAsync,  kSyncTls,       kSyncCoalesced,   kAsyncCoalesced,
                         kRawThreads, kSyncOne, kRawOne, kOneKeyThreads, kRawOneKeyThreads};
  const int numbers[] = {1, 2, 3, 5, 6, 8, 7, 9, 9, 10, 10};
  const char* labels[] = {"1. raw hiredis 50 x 16",
                          "2. 8 threads, tryAcquire",
                          "3. tryAcquireAsync, 256 in flight",
                          "5. 8 threads, tryAcquire, TLS",
                          "6. 8 threads, tryAcquire, coalesced",
                          "8. tryAcquireAsync, 256, coalesced",
                          "7. 8 threads, raw blocking EVALSHA",
                          "9. 1 thread, tryAcquire",
                          "9. 1 thread, raw blocking EVALSHA",
                          "10. 8 threads, Limiter gcra decide",
                          "10. 8 threads, raw blocking gcra.lua"};
  constexpr std::size_t kTableRows = sizeof(order) / sizeof(order[0]);
  auto share = [](double part, double whole) {
    return std::isnan(part) || std::isnan(whole) ? std::string("n/a") : fmt::format("{:.2f}/{:.2f}", part, whole);
  };
  const double refServerUs = mean(kRaw, [](const PhaseResult& r) { return r.perDecisionUs(r.serverCpu); });
  std::string notes;
  for (std::size_t i = 0; i < kTableRows; ++i) {
    const Phase p = order[i];
    auto m = [&](auto f) { return mean(p, f); };
    double lo = INFINITY, hi = 0;
    for (const PhaseResult& r : gResults[p]) {
      if (!r.valid) continue;
      lo = std::min(lo, r.rate());
      hi = std::max(hi, r.rate());
      if (r.errors > 0 || r.granted != r.decisions) {
        notes += fmt::format("  ({}: {} errors, {} of {} granted: the phase did not run as designed)\n", labels[i],
                             r.errors, r.granted, r.decisions);
      }
      if (r.serverCalls < r.decisions) {
        notes += fmt::format("  ({}: the server counted {} script calls for {} decisions)\n", labels[i], r.serverCalls,
                             r.decisions);
      }
    }
    const double rate = meanRate(p);
    const std::string rates = std::isnan(rate) ? "n/a" : fmt::format("{:.0f} ({:.0f}-{:.0f})", rate, lo, hi);
    out += fmt::format(
        "  {:<42} {:>21}  {:>9}  {:>17}  {:>16}  {:>17}  {:>12}  {:>18}  {:>18}  {:>12}\n", labels[i], rates,
        cell(requestsPerWrite(p)), cell(m([](const PhaseResult& r) { return r.perDecisionUs(r.clientCpu); }), 2),
        cell(m([](const PhaseResult& r) { return r.perDecisionUs(r.libraryCpu); }), 2),
        cell(m([](const PhaseResult& r) { return r.perDecisionUs(r.serverCpu); }), 2),
        cell(refServerUs / m([](const PhaseResult& r) { return r.perDecisionUs(r.serverCpu); }), 2),
        share(m([](const PhaseResult& r) { return r.clientCpu / r.seconds; }),
              m([](const PhaseResult& r) { return r.clientCpuBusy / r.seconds; })),
        share(m([](const PhaseResult& r) { return r.serverCpu / r.seconds; }),
              m([](const PhaseResult& r) { return r.serverCpuBusy / r.seconds; })),
        cell(m([](const PhaseResult& r) { return static_cast<double>(r.switches) / static_cast<double>(r.decisions); }),
             2));
  }
  out += notes;
  out += fmt::format(
      "  client CPU: this process, every thread (getrusage); of it the Client's I/O thread (schedstat); server CPU: "
      "INFO\n"
      "  cpu. server-bound: (1)'s server CPU per decision / this phase's, the ratio to (1) the phase would reach if\n"
      "  the server's CPU were the limit of both (smaller batches cost the server more per decision). CPU n: x/y =\n"
      "  share of that CPU's time the process used / all of it that was busy (/proc/stat, in clock ticks, so y can\n"
      "  read a little below x): what is left of y is other load on the machine, what is left of 1.00 idle.\n"
      "  System share of client CPU: {}.\n",
      [&] {
        std::string s;
        for (std::size_t i = 0; i < kTableRows; ++i) {
          const double sys = mean(order[i], [](const PhaseResult& r) { return r.clientSystem / r.clientCpu; });
          s += fmt::format("{}({}) {}", i == 0 ? "" : ", ", numbers[i], cell(sys, 2));
        }
        return s;
      }());
  const double refBusy = mean(kRaw, [](const PhaseResult& r) { return r.serverCpu / r.seconds; });
  const double refCpuBusy = mean(kRaw, [](const PhaseResult& r) { return r.serverCpuBusy / r.seconds; });
  if (!std::isnan(refBusy) && refBusy < 0.9) {
    out += fmt::format(
        "  NOTE: during the reference the server ran {:.0f}% of the time{}: the reference is below the server's\n"
        "  saturated rate on an idle CPU; the ratios compare phases that met the same conditions only on average.\n",
        refBusy * 100,
        std::isnan(refCpuBusy)
            ? std::string()
            : fmt::format(" and other processes took {:.0f}% of its CPU", (refCpuBusy - refBusy) * 100));
  }

  out += fmt::format("\nLatency per call, 1 thread, us (interleaved call by call, {} rounds)       p50       p99\n",
                     kLatencyRounds);
  const char* latLabels[] = {"EVALSHA acquire.lua, raw hiredis, TCP", "RateLimiter::tryAcquire, TCP",
                             "RateLimiter::tryAcquire, TLS"};
  for (int k = 0; k < kLatencyKinds; ++k) {
    out += fmt::format("  {:<70} {:>8}  {:>8}\n", latLabels[k], cell(lat != nullptr ? lat[k].p50 : nan),
                       cell(lat != nullptr ? lat[k].p99 : nan));
  }
  return out;
}

// Puts the server on kServerCpu and this process on kClientCpu (support/pinned_server.hpp).
// Returns what the summary says.
std::string startPinnedServer(World& world) {
  rb::PinnedServer started = rb::startPinnedServer(world.tls->serverArgs(), kServerCpu, kClientCpu);
  world.server = std::move(started.server);
  world.pinned = started.pinned;
  return started.placement;
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    World world;
    world.tls = std::make_unique<rb::TlsFiles>();
    world.placement = startPinnedServer(world);
    world.admin = std::make_unique<rb::RawRedis>(world.server->host(), world.server->port());
    auto loaded = world.admin->command({"SCRIPT", "LOAD", redlimit::detail::lua::acquire.source});
    if (std::string(loaded->str, loaded->len) != redlimit::detail::lua::acquire.sha1) {
      throw std::runtime_error("bench: SCRIPT LOAD of acquire.lua returned another SHA1");
    }
    loaded = world.admin->command({"SCRIPT", "LOAD", redlimit::detail::lua::gcra.source});
    if (std::string(loaded->str, loaded->len) != redlimit::detail::lua::gcra.sha1) {
      throw std::runtime_error("bench: SCRIPT LOAD of gcra.lua returned another SHA1");
    }
    gWorld = &world;
    const std::string machine = rb::machineDescription(world.server->version());
    std::cout << "CPU placement: " << world.placement << '\n' << std::flush;

    registerBenchmarks();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();

    const std::string text = summary(machine);
    std::cout << '\n' << text << std::flush;
    std::ofstream(rb::resultsDir() + "/bench_transport.summary.txt") << text;
    gWorld = nullptr;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_transport: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_transport", e.what());
  return 1;
}
