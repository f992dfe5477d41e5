// bench_algorithms: what one decision of each limiter costs Redis, next to the most direct
// textbook script for the same algorithm, what one limiter's key weighs, and how exactly each
// O(1) algorithm keeps its bound. A summary of ratios goes to stdout and
// <results>/bench_algorithms.summary.txt; the accuracy picture to <results>/accuracy_algorithms.svg.
//
//  1. Server cost. For each algorithm (a Limiter of a stored token bucket and GCRA: lua/gcra.lua;
//     of a stored fixed window: lua/fixed_window.lua; of a sliding window counter:
//     lua/sliding_window.lua; of a calendar day: lua/calendar_quota.lua, no
//     textbook script, compared with GCRA's; RateLimiter: lua/acquire.lua) and for each
//     workload (one hot key, all granted; one hot key, all denied; 10 000 keys round-robin, all
//     granted), a raw hiredis load (50 connections x 16 requests in flight) sends EVALSHA with the
//     exact keys and arguments the library class sends for decide(1) / tryAcquire() (checked
//     against MONITOR of one real library call at start). In the same run the same load drives the
//     textbook script for the algorithm (bench/textbook/*.lua; for RateLimiter
//     bench/reference_acquire.lua, Redisson's call sequence with the caller's clock). The same for
//     RateLimiter's availablePermits and release (available_permits.lua, release.lua against
//     bench/reference_available_permits.lua and bench/reference_release.lua), each on the state
//     its workload labels name, made by untimed acquires. Per phase: server µs per call (INFO
//     commandstats usec delta of EVALSHA / calls), whole server CPU per decision (INFO cpu delta /
//     decisions: parsing and I/O too), decisions/s. Every phase starts from FLUSHALL, sets its
//     keys up, warms up, then times kCalls decisions; all phases run kPasses times, every other
//     pass in mirrored order, and the figures are means.
//     Hierarchical limits: a MultiLimit of three GCRA levels (multi.lua, one call per
//     decision) runs the same workloads; the summary sets its server µs per call beside three GCRA
//     calls' (the same decision made level by level, without the all-or-nothing).
//     Reserve then settle and leases: Limiter::reserveFor(key, 10, id) and settle(key, id, 3)
//     (gcra.lua), a lease Limiter's acquire and release (concurrency.lua), each call with a fresh
//     id (a call counter in the id: PreparedCalls' counterArg); settle and release run on
//     reservations and leases opened by untimed calls before the phase, and in the "denied"
//     workload on ones settled or released already (retries). The summary sets each beside GCRA's
//     take, and a whole reservation or lease (the two calls) beside one take.
//     Redis Functions against EVALSHA: gcra.lua's take and acquire.lua, hot key granted and denied,
//     also as a function library loaded once (FUNCTION LOAD, the helpers made at load time) and
//     called with FCALL, the same argv otherwise; medians and minimums of kFunctionPasses passes
//     (docs/benchmarks.head.md has the numbers and the decision: EVALSHA stays).
//     The floor of the sliding log: each Redis command acquire.lua's fast path or Redisson's call
//     sequence sends, run kCommandRepeat times in a script with acquire.lua's argv on the state of
//     the acquire phases, less the empty loop (server µs per command; see kCommandProbes), summed
//     per side; and TIME's own cost, which ours pays and Redisson's (the caller's clock) does not.
//  2. Bytes per key: MEMORY USAGE of one limiter's key (ours and textbook), and RateLimiter's keys
//     with 1, 100 and 10 000 live permits.
//  3. Accuracy: kClients Clients x kThreadsPerClient threads call decide() on one limiter per
//     O(1) algorithm for kAccuracyRun; the grants' server times (Decision::time) are checked
//     exactly against the bound (burst + rate x T in any window T for the token bucket and GCRA;
//     limit per aligned window for the fixed window) and plotted.
//
//  4. Worst case on a random workload: the same bursts of calls, at about twice the limit, sent
//     with the time in the call to a sliding window counter, a fixed window and RateLimiter's exact
//     log; the most grants in any window-long interval of each, beside its bound.
//
// The server is pinned to CPU 0 and this process (load, set-up, callers, I/O threads) to CPU 1,
// as in bench_transport; with fewer than two usable CPUs nothing is pinned and the summary says so.
//
// To add a limiter (the distributed smooth limiter, say): one more entry in algorithms() with its
// library argv (oursArgv), its set-up (configure), optionally a textbook script, and optionally an
// accuracy run in runAccuracy(); the tables pick it up.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/redlimit.hpp"
#include "redlimit_lua.hpp"
#include "support/bench_support.hpp"
#include "support/envelope_svg.hpp"
#include "support/pinned_server.hpp"
#include "support/pipelined_load.hpp"

namespace {

namespace rb = redlimit::bench;
using std::chrono::milliseconds;

constexpr int kServerCpu = 0;
constexpr int kClientCpu = 1;
constexpr int kConnections = 50;          // the load: connections...
constexpr int kDepth = 16;                // ...and requests in flight on each
constexpr std::int64_t kCalls = 20000;    // timed decisions per phase
constexpr std::size_t kManyKeys = 10000;  // keys of the many-keys workload
constexpr int kPasses = 4;                // each phase this often, every other pass mirrored
constexpr std::size_t kIdArg = 11;        // acquire.lua's member id in its argv (EVALSHA sha 6 k*6 1 1 id)
constexpr std::size_t kClockArg = 12;     // ...then now: '' (server TIME) for ours, epoch ms for Redisson's
constexpr int kClients = 4;               // accuracy: Clients...
constexpr int kThreadsPerClient = 2;      // ...and threads calling decide() on each
constexpr milliseconds kAccuracyRun{2000};
constexpr double kMaxRatio = 1.0;           // one-key rows: ours no costlier than the textbook script
constexpr double kMaxRatioRedisson = 1.10;  // acquire.lua against Redisson's calls (which read no TIME)
constexpr std::int64_t kMaxKeyBytes = 100;  // target: memory per limiter key

// --- Limits of one phase ----------------------------------------------------------------------

/// burst (capacity, limit) and `permits` per `intervalMs`, the same numbers for ours and the textbook.
struct Limits {
  std::int64_t burst = 0;
  std::int64_t permits = 0;
  std::int64_t intervalMs = 0;
};
constexpr Limits kNeverReached{1000000000, 1000000000, 3600000};  // 10^9 per hour: every call granted
constexpr Limits kUsedUp{100, 100, 3600000};                      // 100 per hour, used up in the warm-up

enum WorkloadId { kHotGranted, kHotDenied, kManyGranted, kWorkloads };
struct Workload {
  const char* key;
  const char* label;
  std::size_t keys;
  Limits limits;
  std::int64_t warmup;  // untimed calls first: uses up the 100 (denied); touches every key (many)
};
const Workload kWorkloadSpecs[kWorkloads] = {
    {"hot_granted", "hot key, granted", 1, kNeverReached, 1000},
    {"hot_denied", "hot key, denied", 1, kUsedUp, 1000},
    {"10k_keys", "10k keys, granted", kManyKeys, kNeverReached, static_cast<std::int64_t>(kManyKeys)},
};

// --- State of the run -------------------------------------------------------------------------

struct World {
  rb::PinnedServer pinned;
  std::unique_ptr<rb::RawRedis> admin;
  std::shared_ptr<redlimit::Client> client;  // set-up through the library
  std::unique_ptr<rb::PipelinedLoad> load;
  std::string machine;
};
World* gWorld = nullptr;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench: cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string loadScript(std::string_view source) {
  auto reply = gWorld->admin->command({"SCRIPT", "LOAD", source});
  return std::string(reply->str, reply->len);
}

/// Copies key `from` to every key of `to` (DUMP, then RESTORE ... REPLACE, pipelined): many limiters
/// configured exactly as the library configured one.
void copyKey(const std::string& from, const std::vector<std::string>& to) {
  rb::RawRedis& admin = *gWorld->admin;
  auto dumped = admin.command({"DUMP", from});
  if (dumped->type != REDIS_REPLY_STRING) throw std::runtime_error("bench: DUMP found no key " + from);
  const std::string payload(dumped->str, dumped->len);
  for (std::size_t done = 0; done < to.size();) {
    const std::size_t batch = std::min<std::size_t>(1000, to.size() - done);
    for (std::size_t i = 0; i < batch; ++i) admin.append({"RESTORE", to[done + i], "0", payload, "REPLACE"});
    for (std::size_t i = 0; i < batch; ++i) (void)admin.reply();
    done += batch;
  }
}

// --- The algorithms -----------------------------------------------------------------------------

/// One script driven by the load: how to set its keys up and what each call sends.
struct Variant {
  std::string label;  // for the tables
  // Writes whatever configuration `names` need under `limits` (nothing for a textbook script).
  std::function<void(const std::vector<std::string>& names, const Limits& limits)> configure;
  // The whole command for one key.
  std::function<std::vector<std::string>(const std::string& name, const Limits& limits)> argv;
  std::size_t idArg = rb::PreparedCalls::kNoId;     // a 16-byte argument refreshed on every call
  std::size_t clockArg = rb::PreparedCalls::kNoId;  // the caller's epoch ms, refreshed on every call
  // An argument with `counterWidth` bytes of a call counter (a fresh reservation or lease id per
  // call), at its end or ending where `counterMarker` ends (see PreparedCalls). The MONITOR check
  // compares the rest of it.
  std::size_t counterArg = rb::PreparedCalls::kNoId;
  std::size_t counterWidth = 0;
  std::string counterMarker = {};
};

struct Algorithm {
  std::string key;    // short name for benchmark names and figures
  std::string title;  // for the tables
  Variant ours;
  std::optional<Variant> textbook;
  std::string textbookName = "textbook";  // what the ratio rows call the textbook script
  double maxRatio = kMaxRatio;            // ours / textbook must be <= this
  bool ratioTarget = false;               // its ratio rows have a target (else they are reports)
  bool oneKey = true;                     // one of the one-key limiters (not RateLimiter's five keys)
  // Per workload, what the phase does when it is not the spec's label (empty: kWorkloadSpecs' label).
  std::array<std::string, kWorkloads> workloadLabels{};
  // Two real library decisions on one handle of `name` (configured by ours.configure), for the
  // MONITOR check of ours.argv against the second (the steady form: a RateLimiter handle sends the
  // rate it saw last).
  std::function<void(const std::string& name)> libraryCall;
};

// The one-key rows are Limiters of a stored policy (the configuration in the key, none in the
// call: the rows of the 0.1 one-key classes made without a configuration). A row's `name` is the
// Redis key of one of its keys: a name of the form rl:<limiter>:<key> is that Limiter's key as it
// is (kMemoryName: 14 bytes), any other is the key `name` of the Limiter kOneKeyLimiter.
constexpr const char* kOneKeyLimiter = "bench1";
struct LimiterKey {
  std::string limiter;
  std::string key;
};
LimiterKey limiterKeyOf(const std::string& name) {
  const std::size_t colon = name.rfind("rl:", 0) == 0 ? name.find(':', 3) : std::string::npos;
  if (colon == std::string::npos) return {kOneKeyLimiter, name};
  return {name.substr(3, colon - 3), name.substr(colon + 1)};
}
std::string oneKeyRedisKey(const std::string& name) {
  const LimiterKey k = limiterKeyOf(name);
  return fmt::format("rl:{}:{}", k.limiter, k.key);
}

// A Limiter's decide(key, 1) under a stored policy sends `take "" <kind> 1 0` (permits, then
// maxWait 0 µs; no configuration in the call) on the key.
std::vector<std::string> oneKeyArgv(std::string_view sha, const std::string& name, char kind) {
  return {"EVALSHA", std::string(sha), "1", oneKeyRedisKey(name), "take", "", std::string(1, kind), "1", "0"};
}

// Two library decisions on the key `name` under a stored `policy`, for the MONITOR check.
void twoOneKeyDecisions(const std::string& name, const redlimit::Policy& policy) {
  const LimiterKey k = limiterKeyOf(name);
  redlimit::Limiter limiter(gWorld->client, k.limiter, policy.stored());
  for (int i = 0; i < 2; ++i) (void)limiter.decide(k.key, 1);
}

// The calendar quota the bench decides: `limit` per day in Europe/Berlin.
redlimit::Policy benchDay(std::int64_t limit) {
  return redlimit::Policy::calendar(limit, redlimit::CalendarUnit::Day, "Europe/Berlin");
}

// The Limiter the calendar and lease rows stand for: its name, and the Redis key of `key` under it
// (Limiter::redisKey's layout, which checkArgvAgainstLibrary's MONITOR check confirms).
constexpr const char* kBenchLimiter = "bench";
std::string limiterKey(const std::string& key) { return fmt::format("rl:{}:{}", kBenchLimiter, key); }

// The configuration in the call of a one-key policy that travels in every call: its key's 13-byte
// header, kind then L, W ms and keepAlive ms as little-endian uint32 (the sliding window counter's
// and the fixed window's), with the default keepAlive of 1 s.
std::string windowHeader(char kind, std::int64_t limit, std::int64_t windowMs) {
  std::string header(1, kind);
  for (const std::int64_t v : {limit, windowMs, std::int64_t{1000}}) {
    for (unsigned i = 0; i < 4; ++i)
      header.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8U * i)) & 0xFFU));
  }
  return header;
}

// A Limiter's decide(key, 1) under a sliding window counter of l.burst per l.intervalMs sends
// `take "" V 1 0 <its header>`: the policy travels in every call.
std::vector<std::string> slidingArgv(std::string_view sha, const std::string& name, const Limits& l) {
  return {"EVALSHA", std::string(sha),
          "1",       oneKeyRedisKey(name),
          "take",    "",
          "V",       "1",
          "0",       windowHeader('V', l.burst, l.intervalMs)};
}

// A Limiter's decide(key, 1) under a calendar policy sends `take "" Q 1 <limit> D <keepAlive ms>
// <table>`, the table being the four windows around now (the day before, today, the two after)
// packed as little-endian int64 (label, start, end): the same all day, so one argv serves a whole
// run (unless it crosses Berlin's midnight).
std::vector<std::string> calendarArgv(std::string_view sha, const std::string& name, std::int64_t limit) {
  const auto now =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  const redlimit::Policy day = benchDay(limit);
  const redlimit::CalendarWindow today = day.windowAt(now);
  const redlimit::CalendarWindow tomorrow = day.windowAt(today.end);
  std::string table;
  for (const redlimit::CalendarWindow& w :
       {day.windowAt(today.start - std::chrono::microseconds(1)), today, tomorrow, day.windowAt(tomorrow.end)}) {
    for (const std::int64_t v : {w.label, w.start.count(), w.end.count()}) {
      for (unsigned i = 0; i < 8; ++i)
        table.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8U * i)) & 0xFFU));
    }
  }
  return {"EVALSHA",
          std::string(sha),
          "1",
          limiterKey(name),
          "take",
          "",
          "Q",
          "1",
          std::to_string(limit),
          "D",
          std::to_string(redlimit::kDefaultIdleMargin.count()),
          table};
}

// Stores makePolicy(limits) in the key of names.front() (Limiter::setPolicy) and copies it to the
// others' keys.
template <class MakePolicy>
std::function<void(const std::vector<std::string>&, const Limits&)> configureOneKey(MakePolicy makePolicy) {
  return [makePolicy](const std::vector<std::string>& names, const Limits& limits) {
    const LimiterKey k = limiterKeyOf(names.front());
    const redlimit::Policy policy = makePolicy(limits).stored();
    redlimit::Limiter(gWorld->client, k.limiter, policy).setPolicy(k.key, policy);
    std::vector<std::string> rest;
    for (std::size_t i = 1; i < names.size(); ++i) rest.push_back(oneKeyRedisKey(names[i]));
    if (!rest.empty()) copyKey(oneKeyRedisKey(names.front()), rest);
  };
}

// The three levels of a hierarchical limit: Limiters of a stored GCRA, and the key `{name}` of each
// (one hash tag: a MultiLimit's keys share a slot).
constexpr std::array<const char*, 3> kLevelLimiters{"org", "team", "user"};
std::string hierarchyKey(const std::string& name) { return "{" + name + "}"; }
// The Redis keys of the three levels of the hierarchical limit `name`.
std::array<std::string, 3> hierarchyLevels(const std::string& name) {
  std::array<std::string, 3> out;
  for (std::size_t i = 0; i < 3; ++i) out[i] = fmt::format("rl:{}:{}", kLevelLimiters[i], hierarchyKey(name));
  return out;
}

// What RateLimiter::tryAcquire() sends once it has seen the rate: acquire.lua with the five keys
// plus the config hash in the partial-grant record's place, permits 1..1, a fresh 16-byte member id,
// '' (server clock), resend flag 0, the record TTL (twice connect + command timeout, 1 s..1 h) and
// the rate it saw last.
std::vector<std::string> acquireArgv(std::string_view sha, const std::string& name, const Limits& limits) {
  const redlimit::RateLimiter handle(gWorld->client, name);  // sends nothing: the keys only
  std::vector<std::string> argv{"EVALSHA", std::string(sha), "6"};
  argv.insert(argv.end(), handle.keys().begin(), handle.keys().end());
  argv.push_back(handle.keys().front());
  const auto& c = gWorld->client->options().connection;
  const auto recordTtl =
      std::clamp(2 * (c.connectTimeout + c.commandTimeout), milliseconds{1000}, milliseconds{3600000});
  for (std::string a : {std::string("1"), std::string("1"), std::string(16, '\0'), std::string(), std::string("0"),
                        std::to_string(recordTtl.count()), std::to_string(limits.permits)}) {
    argv.push_back(std::move(a));
  }
  return argv;
}

void configureRateLimiter(const std::vector<std::string>& names, const Limits& limits) {
  redlimit::RateLimiter limiter(gWorld->client, names.front());
  limiter.setRate(redlimit::RateType::Overall, limits.permits, milliseconds{limits.intervalMs});
  if (names.size() > 1) copyKey(names.front(), std::vector<std::string>(names.begin() + 1, names.end()));
}

// availablePermits and release are measured on the state a load of acquires leaves: every limiter
// configured as configureRateLimiter does, then `grants` acquire.lua calls of `permits` each
// (round-robin over the names, through the same pipelined load). The calls made here are not timed.
void configureWithLog(const std::vector<std::string>& names, const Limits& limits, std::int64_t grants,
                      std::int64_t permits) {
  configureRateLimiter(names, limits);
  std::vector<std::vector<std::string>> argvs;
  argvs.reserve(names.size());
  for (const std::string& n : names) {
    std::vector<std::string> argv = acquireArgv(redlimit::detail::lua::acquire.sha1, n, limits);
    argv[kIdArg - 2] = argv[kIdArg - 1] = std::to_string(permits);  // most = least = permits
    argvs.push_back(std::move(argv));
  }
  rb::PreparedCalls calls(std::move(argvs), kIdArg);
  const rb::LoadResult r = gWorld->load->run(calls, grants);
  if (r.allowed != grants) throw std::runtime_error("bench: the acquires that set up a log were not all granted");
}

// The state availablePermits reads: what each workload's acquire warm-up leaves (hot key, granted:
// 1000 one-permit members; hot key, denied: 100 members, value 0; 10k keys: one member each).
void configureAvailable(const std::vector<std::string>& names, const Limits& limits) {
  const std::int64_t grants =
      names.size() > 1 ? static_cast<std::int64_t>(names.size()) : std::min<std::int64_t>(limits.permits, 1000);
  configureWithLog(names, limits, grants, 1);
}

// The state release(1) gives permits back to, enough for every call of the phase (warm-up and
// timed): a hot key holds 10 grants of 10 000 permits (of 10^9 per hour; the "denied" workload's
// limiter, 100 000 per hour, is used up by them); each of 10 000 keys holds one grant of 10.
constexpr std::int64_t kReleaseHotGrants = 10, kReleaseHotPermits = 10000, kReleaseKeyPermits = 10;
void configureRelease(const std::vector<std::string>& names, const Limits& limits) {
  Limits l = limits;
  if (l.permits < kReleaseHotGrants * kReleaseHotPermits) l.permits = l.burst = kReleaseHotGrants * kReleaseHotPermits;
  if (names.size() > 1) {
    configureWithLog(names, l, static_cast<std::int64_t>(names.size()), kReleaseKeyPermits);
  } else {
    configureWithLog(names, l, kReleaseHotGrants, kReleaseHotPermits);
  }
}

// EVALSHA of `sha` on the five keys of RateLimiter `name`, then `args`:
//   availablePermits() sends '' (server clock) and '' (the rate seen last: neither
//   availablePermits nor release learns it);
//   release(1) sends 1 permit, '' (the newest live members), '' (server clock), '' (the rate);
//   the Redisson-equivalent scripts take the caller's clock in epoch ms (refreshed on every call)
//   or the permits.
std::function<std::vector<std::string>(const std::string&, const Limits&)> fiveKeyArgv(
    const std::string& sha, const std::vector<std::string>& args) {
  return [sha, args](const std::string& name, const Limits&) {
    const redlimit::RateLimiter handle(gWorld->client, name);
    std::vector<std::string> argv{"EVALSHA", sha, "5"};
    argv.insert(argv.end(), handle.keys().begin(), handle.keys().end());
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  };
}
constexpr std::size_t kRedissonClockArg = 8;  // EVALSHA sha 5 k*5 now

// RateLimiter's scripts are compared with Redisson's call sequences. The target holds for
// acquire.lua alone (`target`); availablePermits and release are reports (ours are checked reads
// that also reclaim expired members, Redisson's trust what they find).
void comparedWithRedisson(Algorithm& a, bool target) {
  a.textbookName = "Redisson's calls";
  a.maxRatio = kMaxRatioRedisson;
  a.ratioTarget = target;
  a.oneKey = false;
}

// A textbook script's argv: its one key, then the numbers.
std::function<std::vector<std::string>(const std::string&, const Limits&)> textbookArgv(const std::string& sha,
                                                                                        bool withBurst) {
  return [sha, withBurst](const std::string& name, const Limits& l) {
    std::vector<std::string> argv{"EVALSHA", sha, "1", name};
    if (withBurst) argv.push_back(std::to_string(l.burst));
    argv.push_back(std::to_string(l.permits));
    argv.push_back(std::to_string(l.intervalMs));
    argv.emplace_back("1");
    return argv;
  };
}

// --- Reserve then settle, and leases ----------------------------------------------------------------

constexpr std::int64_t kReservePermits = 10;     // reserveFor(10, id): the estimate...
constexpr std::int64_t kSettleActual = 3;        // ...and settle(id, 3): 7 given back
constexpr std::size_t kRecordKeyArg = 4;         // EVALSHA sha 2 name <record key> ...
constexpr std::size_t kReservationIdWidth = 10;  // the bench's reservation ids: "r" + a 10-digit call counter
constexpr std::size_t kLeaseIdArg = 7;           // EVALSHA sha 1 name acquire|release '' C <lease id> ...
constexpr std::size_t kLeaseIdWidth = 32;        // a lease id: 32 hex digits (here decimal ones: a counter)
const std::string kFirstReservationId = "r" + std::string(kReservationIdWidth, '0');

// The policies of the one-key rows under `l`: a burst (capacity, limit) of l.burst, l.permits per
// l.intervalMs (the fixed window: l.burst per window of l.intervalMs).
redlimit::Policy gcraPolicy(const Limits& l) {
  return redlimit::Policy::gcra(l.permits, milliseconds{l.intervalMs}, l.burst);
}
redlimit::Policy tokenBucketPolicy(const Limits& l) {
  return redlimit::Policy::tokenBucket(l.burst, l.permits, milliseconds{l.intervalMs});
}
redlimit::Policy fixedWindowPolicy(const Limits& l) {
  return redlimit::Policy::fixedWindow(l.burst, milliseconds{l.intervalMs});
}
redlimit::Policy slidingWindowPolicy(const Limits& l) {
  return redlimit::Policy::slidingWindow(l.burst, milliseconds{l.intervalMs});
}

// The calls one phase makes on `names` (its warm-up and timed calls, see runVariant): the ids a
// settle or release phase needs open, in the order its calls use them.
std::int64_t callsPerPhase(const std::vector<std::string>& names) {
  return (names.size() > 1 ? kWorkloadSpecs[kManyGranted].warmup : kWorkloadSpecs[kHotGranted].warmup) + kCalls;
}
// The settle and release phases of the "hot key, denied" workload repeat calls that went through
// already (a retry after a timeout): nothing to deny there.
bool retryWorkload(const std::vector<std::string>& names, const Limits& limits) {
  return names.size() == 1 && limits.permits == kUsedUp.permits;
}

// Limiter::reserveFor(key, 10, id) under a stored GCRA sends `reserve "" G 10 <record TTL ms>` on
// the key and its record (recordKey(key, id), the id inside it); settle(key, id, 3) sends
// `settle "" G 3 0` on the same two.
std::vector<std::string> reservationArgv(const std::string& name, const std::vector<std::string>& args) {
  const LimiterKey k = limiterKeyOf(name);
  const redlimit::Limiter limiter(gWorld->client, k.limiter, gcraPolicy(kNeverReached).stored());  // sends nothing
  std::vector<std::string> argv{"EVALSHA", std::string(redlimit::detail::lua::gcra.sha1), "2", oneKeyRedisKey(name),
                                limiter.recordKey(k.key, kFirstReservationId)};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}
std::vector<std::string> reserveArgv(const std::string& name) {
  return reservationArgv(name, {"reserve", "", "G", std::to_string(kReservePermits),
                                std::to_string(redlimit::Limiter::kDefaultRecordTtl.count())});
}
std::vector<std::string> settleArgv(const std::string& name) {
  return reservationArgv(name, {"settle", "", "G", std::to_string(kSettleActual), "0"});
}

// A Limiter's acquireLease(key) under a concurrency policy sends `acquire "" C <lease id> <limit>
// <lease TTL ms>` on limiterKey(key), release(key, lease) `release "" C <lease id>`. The bench's
// policies: limit = the workload's burst, TTL its interval.
std::vector<std::string> acquireLeaseArgv(const std::string& name, const Limits& l) {
  return {"EVALSHA",
          std::string(redlimit::detail::lua::concurrency.sha1),
          "1",
          limiterKey(name),
          "acquire",
          "",
          "C",
          std::string(kLeaseIdWidth, '0'),
          std::to_string(l.burst),
          std::to_string(l.intervalMs)};
}
std::vector<std::string> releaseLeaseArgv(const std::string& name) {
  return {"EVALSHA", std::string(redlimit::detail::lua::concurrency.sha1),
          "1",       limiterKey(name),
          "release", "",
          "C",       std::string(kLeaseIdWidth, '0')};
}
redlimit::Policy leasePolicy(const Limits& l) {
  return redlimit::Policy::concurrency(l.burst, milliseconds{l.intervalMs});
}

// Untimed calls that make the state a phase starts from: `count` calls of argvOf(name) round-robin
// over `names` with the counter from 0 (so the phase's own calls, counting from 0 as well, find
// their ids in the same keys); each must be answered allowed (granted, settled, released).
void runSetUp(const std::vector<std::string>& names,
              const std::function<std::vector<std::string>(const std::string&)>& argvOf, std::size_t counterArg,
              std::size_t counterWidth, std::int64_t count, const char* what, const std::string& counterMarker = {}) {
  std::vector<std::vector<std::string>> argvs;
  argvs.reserve(names.size());
  for (const std::string& n : names) argvs.push_back(argvOf(n));
  rb::PreparedCalls calls(std::move(argvs), rb::PreparedCalls::kNoId, rb::PreparedCalls::kNoId, counterArg,
                          counterWidth, counterMarker);
  const rb::LoadResult r = gWorld->load->run(calls, count);
  if (r.allowed != count) {
    throw std::runtime_error(
        fmt::format("bench: {}: {} of {} calls were not answered allowed", what, count - r.allowed, count));
  }
}

// A settle phase settles reservations made here (10 permits each, one id per call it will make);
// in the retry workload they are settled once here too, so its calls answer AlreadySettled.
void configureSettle(const std::vector<std::string>& names, const Limits& limits) {
  const bool retry = retryWorkload(names, limits);
  configureOneKey(gcraPolicy)(names, retry ? kNeverReached : limits);
  runSetUp(names, reserveArgv, kRecordKeyArg, kReservationIdWidth, callsPerPhase(names), "the reservations to settle",
           kFirstReservationId);
  if (retry) {
    runSetUp(names, settleArgv, kRecordKeyArg, kReservationIdWidth, callsPerPhase(names), "the first settles",
             kFirstReservationId);
  }
}

// A release phase frees leases acquired here (one id per call it will make); in the retry workload
// they are released once here too (the key is gone then), so its calls answer false.
void configureLeaseRelease(const std::vector<std::string>& names, const Limits& limits) {
  const auto acquire = [](const std::string& n) { return acquireLeaseArgv(n, kNeverReached); };
  runSetUp(names, acquire, kLeaseIdArg, kLeaseIdWidth, callsPerPhase(names), "the leases to release");
  if (retryWorkload(names, limits)) {
    runSetUp(names, releaseLeaseArgv, kLeaseIdArg, kLeaseIdWidth, callsPerPhase(names), "the first releases");
  }
}

std::vector<Algorithm> algorithms() {
  namespace lua = redlimit::detail::lua;
  const std::string dir = REDLIMIT_BENCH_SOURCE_DIR;
  std::vector<Algorithm> out;

  Algorithm tb;
  tb.key = "token_bucket";
  tb.title = "token bucket";
  tb.ours.label = "Limiter tokenBucket (gcra.lua)";
  tb.ours.configure = configureOneKey(tokenBucketPolicy);
  tb.ours.argv = [](const std::string& name, const Limits&) { return oneKeyArgv(lua::gcra.sha1, name, 'T'); };
  tb.textbook = Variant{"textbook/token_bucket.lua (HMGET, floats, HSET, PEXPIRE)", nullptr,
                        textbookArgv(loadScript(readFile(dir + "/textbook/token_bucket.lua")), true)};
  tb.ratioTarget = true;
  tb.libraryCall = [](const std::string& name) { twoOneKeyDecisions(name, tokenBucketPolicy(kNeverReached)); };
  out.push_back(std::move(tb));

  Algorithm gcra;
  gcra.key = "gcra";
  gcra.title = "GCRA";
  gcra.ours.label = "Limiter gcra (gcra.lua)";
  gcra.ours.configure = configureOneKey(gcraPolicy);
  gcra.ours.argv = [](const std::string& name, const Limits&) { return oneKeyArgv(lua::gcra.sha1, name, 'G'); };
  gcra.textbook = Variant{"textbook/gcra.lua (GET, floats, SET PX)", nullptr,
                          textbookArgv(loadScript(readFile(dir + "/textbook/gcra.lua")), true)};
  gcra.ratioTarget = true;
  gcra.libraryCall = [](const std::string& name) { twoOneKeyDecisions(name, gcraPolicy(kNeverReached)); };
  out.push_back(std::move(gcra));

  Algorithm fw;
  fw.key = "fixed_window";
  fw.title = "fixed window";
  fw.ours.label = "Limiter fixedWindow (fixed_window.lua)";
  fw.ours.configure = configureOneKey(fixedWindowPolicy);
  fw.ours.argv = [](const std::string& name, const Limits&) { return oneKeyArgv(lua::fixed_window.sha1, name, 'W'); };
  fw.textbook = Variant{"textbook/fixed_window.lua (INCRBY + PEXPIRE, key per window)", nullptr,
                        textbookArgv(loadScript(readFile(dir + "/textbook/fixed_window.lua")), false)};
  fw.ratioTarget = true;
  fw.libraryCall = [](const std::string& name) { twoOneKeyDecisions(name, fixedWindowPolicy(kNeverReached)); };
  out.push_back(std::move(fw));

  // The sliding window counter: its policy travels in every call, so nothing to configure (the
  // first take writes each key).
  Algorithm sw;
  sw.key = "sliding_window";
  sw.title = "sliding counter";
  sw.ours.label = "Limiter slidingWindow (sliding_window.lua)";
  sw.ours.configure = [](const std::vector<std::string>&, const Limits&) {};
  sw.ours.argv = [](const std::string& name, const Limits& l) {
    return slidingArgv(lua::sliding_window.sha1, name, l);
  };
  sw.textbook = Variant{"textbook/sliding_window.lua (MGET, floats, INCRBY + PEXPIRE)", nullptr,
                        textbookArgv(loadScript(readFile(dir + "/textbook/sliding_window.lua")), false)};
  sw.ratioTarget = true;
  sw.libraryCall = [](const std::string& name) {
    const LimiterKey k = limiterKeyOf(name);
    redlimit::Limiter limiter(gWorld->client, k.limiter, slidingWindowPolicy(kNeverReached));
    for (int i = 0; i < 2; ++i) (void)limiter.decide(k.key, 1);
  };
  out.push_back(std::move(sw));

  // Calendar quotas: a day in Europe/Berlin; the quota is in the call, so nothing to
  // configure (the first take writes each key). No textbook script: the summary sets its server µs
  // per call beside GCRA's.
  Algorithm cal;
  cal.key = "calendar";
  cal.title = "calendar day";
  cal.ours.label = "Limiter, calendar day (calendar_quota.lua)";
  cal.ours.configure = [](const std::vector<std::string>&, const Limits&) {};
  cal.ours.argv = [](const std::string& name, const Limits& l) {
    return calendarArgv(lua::calendar_quota.sha1, name, l.burst);
  };
  cal.libraryCall = [](const std::string& name) {
    redlimit::Limiter limiter(gWorld->client, kBenchLimiter, benchDay(kNeverReached.burst));
    for (int i = 0; i < 2; ++i) (void)limiter.decide(name, 1);
  };
  out.push_back(std::move(cal));

  Algorithm rl;
  rl.key = "rate_limiter";
  rl.title = "sliding log";
  rl.ours.label = "RateLimiter (acquire.lua)";
  rl.ours.configure = configureRateLimiter;
  rl.ours.argv = [](const std::string& name, const Limits& l) { return acquireArgv(lua::acquire.sha1, name, l); };
  rl.ours.idArg = kIdArg;
  const std::string referenceSha = loadScript(readFile(dir + "/reference_acquire.lua"));
  rl.textbook =
      Variant{"reference_acquire.lua (Redisson's calls, caller's clock)", configureRateLimiter,
              [referenceSha](const std::string& name, const Limits& l) { return acquireArgv(referenceSha, name, l); },
              kIdArg, kClockArg};
  comparedWithRedisson(rl, true);
  rl.libraryCall = [](const std::string& name) {
    redlimit::RateLimiter limiter(gWorld->client, name);
    for (int i = 0; i < 2; ++i) (void)limiter.tryAcquire();
  };
  out.push_back(std::move(rl));

  Algorithm av;
  av.key = "available_permits";
  av.title = "availablePermits";
  av.ours = Variant{"RateLimiter::availablePermits (available_permits.lua)", configureAvailable,
                    fiveKeyArgv(lua::available_permits.sha1, {"", ""})};
  av.textbook = Variant{"reference_available_permits.lua (Redisson's calls, caller's clock)", configureAvailable,
                        fiveKeyArgv(loadScript(readFile(dir + "/reference_available_permits.lua")), {"0000000000000"}),
                        rb::PreparedCalls::kNoId, kRedissonClockArg};
  comparedWithRedisson(av, false);
  av.workloadLabels = {"hot key, 1000 live", "hot key, used up", "10k keys, 1 live"};
  av.libraryCall = [](const std::string& name) {
    redlimit::RateLimiter limiter(gWorld->client, name);
    for (int i = 0; i < 2; ++i) (void)limiter.availablePermits();
  };
  out.push_back(std::move(av));

  Algorithm rel;
  rel.key = "release";
  rel.title = "release";
  rel.ours = Variant{"RateLimiter::release(1) (release.lua)", configureRelease,
                     fiveKeyArgv(lua::release.sha1, {"1", "", "", ""})};
  rel.textbook = Variant{"reference_release.lua (Redisson's calls)", configureRelease,
                         fiveKeyArgv(loadScript(readFile(dir + "/reference_release.lua")), {"1"})};
  comparedWithRedisson(rel, false);
  rel.workloadLabels = {"hot key, 10 x 10 000 held", "hot key, used up by 10 x 10 000", "10k keys, 1 x 10 held"};
  rel.libraryCall = [](const std::string& name) {
    redlimit::RateLimiter limiter(gWorld->client, name);
    for (int i = 0; i < 2; ++i) limiter.release(1);
  };
  out.push_back(std::move(rel));

  // Reserve, then settle: Limiter::reserveFor(key, 10, id) with a fresh id per call
  // (a record key per reservation), and settle(id, 3) of reservations opened before the phase. No
  // textbook script: the summary sets their server µs per call beside GCRA's take.
  Algorithm reserve;
  reserve.key = "reserve";
  reserve.title = "reserveFor";
  reserve.oneKey = false;
  reserve.ours.label = "Limiter gcra reserveFor(key, 10, id) (gcra.lua reserve)";
  reserve.ours.configure = configureOneKey(gcraPolicy);
  reserve.ours.argv = [](const std::string& name, const Limits&) { return reserveArgv(name); };
  reserve.ours.counterArg = kRecordKeyArg;
  reserve.ours.counterWidth = kReservationIdWidth;
  reserve.ours.counterMarker = kFirstReservationId;
  reserve.libraryCall = [](const std::string& name) {
    const LimiterKey k = limiterKeyOf(name);
    redlimit::Limiter limiter(gWorld->client, k.limiter, gcraPolicy(kNeverReached).stored());
    for (int i = 0; i < 2; ++i) (void)limiter.reserveFor(k.key, kReservePermits, "r0000000042");
  };
  out.push_back(std::move(reserve));

  Algorithm settle;
  settle.key = "settle";
  settle.title = "settle";
  settle.oneKey = false;
  settle.ours.label = "Limiter gcra settle(key, id, 3) of 10 (gcra.lua settle)";
  settle.ours.configure = configureSettle;
  settle.ours.argv = [](const std::string& name, const Limits&) { return settleArgv(name); };
  settle.ours.counterArg = kRecordKeyArg;
  settle.ours.counterWidth = kReservationIdWidth;
  settle.ours.counterMarker = kFirstReservationId;
  settle.workloadLabels = {"hot key, open reservations", "hot key, settled already", "10k keys, open reservations"};
  settle.libraryCall = [](const std::string& name) {
    const LimiterKey k = limiterKeyOf(name);
    redlimit::Limiter limiter(gWorld->client, k.limiter, gcraPolicy(kNeverReached).stored());
    (void)limiter.reserveFor(k.key, kReservePermits, "r0000000042");
    for (int i = 0; i < 2; ++i) (void)limiter.settle(k.key, "r0000000042", kSettleActual);
  };
  out.push_back(std::move(settle));

  // Leases: a Limiter's acquireLease with a fresh lease id per call (limit: the
  // workload's burst; the hot key's leases pile up, as nothing releases them during the phase), and
  // release of leases acquired before the phase.
  Algorithm acquireLease;
  acquireLease.key = "lease_acquire";
  acquireLease.title = "lease acquire";
  acquireLease.oneKey = false;
  acquireLease.ours.label = "Limiter::acquireLease(key) (concurrency.lua acquire)";
  acquireLease.ours.configure = [](const std::vector<std::string>&, const Limits&) {};
  acquireLease.ours.argv = acquireLeaseArgv;
  acquireLease.ours.counterArg = kLeaseIdArg;
  acquireLease.ours.counterWidth = kLeaseIdWidth;
  acquireLease.workloadLabels = {"hot key, granted, 1k..21k live", "hot key, denied, 100 live", ""};
  acquireLease.libraryCall = [](const std::string& name) {
    redlimit::Limiter limiter(gWorld->client, kBenchLimiter, leasePolicy(kNeverReached));
    for (int i = 0; i < 2; ++i) (void)limiter.acquireLease(name);
  };
  out.push_back(std::move(acquireLease));

  Algorithm releaseLease;
  releaseLease.key = "lease_release";
  releaseLease.title = "lease release";
  releaseLease.oneKey = false;
  releaseLease.ours.label = "Limiter::release(key, lease) (concurrency.lua release)";
  releaseLease.ours.configure = configureLeaseRelease;
  releaseLease.ours.argv = [](const std::string& name, const Limits&) { return releaseLeaseArgv(name); };
  releaseLease.ours.counterArg = kLeaseIdArg;
  releaseLease.ours.counterWidth = kLeaseIdWidth;
  releaseLease.workloadLabels = {"hot key, 21k live, freed one by one", "hot key, released already",
                                 "10k keys, 2..3 live each"};
  releaseLease.libraryCall = [](const std::string& name) {
    redlimit::Limiter limiter(gWorld->client, kBenchLimiter, leasePolicy(kNeverReached));
    const std::optional<redlimit::Lease> lease = limiter.acquireLease(name).lease;
    if (!lease) throw std::runtime_error("bench: no lease for the MONITOR check");
    for (int i = 0; i < 2; ++i) (void)limiter.release(name, *lease);
  };
  out.push_back(std::move(releaseLease));

  // Hierarchical limits: org > team > user as one MultiLimit of three GCRA levels, one
  // multi.lua call per decision, next to the GCRA row's one level per call (the summary compares it
  // with three of those).
  Algorithm multi;
  multi.key = "multi3";
  multi.title = "3-level MultiLimit";
  multi.oneKey = false;
  multi.ours.label = "MultiLimit of 3 Limiters gcra (multi.lua)";
  multi.ours.configure = [](const std::vector<std::string>& names, const Limits& l) {
    const redlimit::Policy policy = gcraPolicy(l).stored();
    for (const char* level : kLevelLimiters) {
      redlimit::Limiter(gWorld->client, level, policy).setPolicy(hierarchyKey(names.front()), policy);
    }
    for (std::size_t k = 0; k < 3 && names.size() > 1; ++k) {
      std::vector<std::string> rest;
      rest.reserve(names.size() - 1);
      for (std::size_t i = 1; i < names.size(); ++i) rest.push_back(hierarchyLevels(names[i])[k]);
      copyKey(hierarchyLevels(names.front())[k], rest);
    }
  };
  multi.ours.argv = [](const std::string& name, const Limits&) {
    std::vector<std::string> argv{"EVALSHA", lua::multi.sha1, "3"};
    for (const std::string& level : hierarchyLevels(name)) argv.push_back(level);
    argv.insert(argv.end(), {"take", "", "GGG", "1", "0"});  // stored configurations: none in the call
    return argv;
  };
  multi.libraryCall = [](const std::string& name) {
    const std::array<std::string, 3> levels = hierarchyLevels(name);
    const redlimit::Policy policy = gcraPolicy(kNeverReached).stored();
    const redlimit::Limiter org(gWorld->client, kLevelLimiters[0], policy),
        team(gWorld->client, kLevelLimiters[1], policy), user(gWorld->client, kLevelLimiters[2], policy);
    const std::string key = hierarchyKey(name);
    redlimit::MultiLimit all = redlimit::MultiLimit({org, team, user}).on({key, key, key});
    for (int i = 0; i < 2; ++i) (void)all.decide(1);
  };
  out.push_back(std::move(multi));
  return out;
}

std::vector<Algorithm>* gAlgorithms = nullptr;

std::size_t rateLimiterIndex() {
  for (std::size_t a = 0; a < gAlgorithms->size(); ++a) {
    if ((*gAlgorithms)[a].key == "rate_limiter") return a;
  }
  throw std::logic_error("bench: no rate_limiter entry");
}
const Algorithm& rateLimiter() { return (*gAlgorithms)[rateLimiterIndex()]; }

const std::string& workloadLabel(const Algorithm& a, int w) {
  const std::string& own = a.workloadLabels[static_cast<std::size_t>(w)];
  static const std::array<std::string, kWorkloads> specs{kWorkloadSpecs[0].label, kWorkloadSpecs[1].label,
                                                         kWorkloadSpecs[2].label};
  return own.empty() ? specs[static_cast<std::size_t>(w)] : own;
}

std::vector<std::string> limiterNames(const std::string& prefix, std::size_t count) {
  std::vector<std::string> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) out.push_back(fmt::format("{}:{:05}", prefix, i));
  return out;
}

std::unique_ptr<rb::PreparedCalls> prepare(const Variant& v, const std::vector<std::string>& keys,
                                           const Limits& limits) {
  if (v.configure) v.configure(keys, limits);
  std::vector<std::vector<std::string>> argvs;
  argvs.reserve(keys.size());
  for (const std::string& k : keys) argvs.push_back(v.argv(k, limits));
  return std::make_unique<rb::PreparedCalls>(std::move(argvs), v.idArg, v.clockArg, v.counterArg, v.counterWidth,
                                             v.counterMarker);
}

// --- MONITOR: the argv the library really sends ---------------------------------------------------

// The arguments of one MONITOR line: `<time> [<db> <addr>] "arg" "arg" ...`, each argument quoted
// with \\, \", \n, \r, \t, \a, \b and \xHH escapes.
std::vector<std::string> parseMonitorLine(const std::string& line) {
  std::vector<std::string> out;
  std::size_t i = line.find(']');
  if (i == std::string::npos) throw std::runtime_error("bench: unexpected MONITOR line: " + line);
  for (++i; i < line.size(); ++i) {
    if (line[i] != '"') continue;
    std::string arg;
    for (++i; i < line.size() && line[i] != '"'; ++i) {
      if (line[i] != '\\' || i + 1 >= line.size()) {
        arg += line[i];
        continue;
      }
      const char c = line[++i];
      switch (c) {
        case 'n':
          arg += '\n';
          break;
        case 'r':
          arg += '\r';
          break;
        case 't':
          arg += '\t';
          break;
        case 'a':
          arg += '\a';
          break;
        case 'b':
          arg += '\b';
          break;
        case 'x':
          arg += static_cast<char>(std::stoi(line.substr(i + 1, 2), nullptr, 16));
          i += 2;
          break;
        default:
          arg += c;
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

// Runs `call` (library decisions) under MONITOR and returns the last EVALSHA it sent.
std::vector<std::string> monitoredEvalsha(const std::function<void()>& call) {
  rb::RawRedis monitor(gWorld->pinned.server->host(), gWorld->pinned.server->port());
  (void)monitor.command({"MONITOR"});
  call();
  (void)gWorld->admin->command({"ECHO", "bench:monitor:end"});  // every command of the call came before it
  std::vector<std::string> last;
  for (;;) {
    auto r = monitor.reply();
    auto args = parseMonitorLine(std::string(r->str, r->len));
    if (args.size() == 2 && args[0] == "ECHO" && args[1] == "bench:monitor:end") break;
    if (!args.empty() && args[0] == "EVALSHA") last = std::move(args);
  }
  if (last.empty()) throw std::runtime_error("bench: MONITOR saw no EVALSHA from the library call");
  return last;
}

// Checks each algorithm's argv against what its library class sends (every argument but the id).
std::string checkArgvAgainstLibrary() {
  std::string report;
  for (const Algorithm& a : *gAlgorithms) {
    (void)gWorld->admin->command({"FLUSHALL"});
    const std::string name = "bench:monitor:" + a.key;
    a.ours.configure({name}, kNeverReached);
    const std::vector<std::string> sent = monitoredEvalsha([&] { a.libraryCall(name); });
    std::vector<std::string> mine = a.ours.argv(name, kNeverReached);
    std::vector<std::string> theirs = sent;
    if (a.ours.idArg != rb::PreparedCalls::kNoId && a.ours.idArg < theirs.size()) {
      if (theirs[a.ours.idArg].size() != 16) throw std::runtime_error("bench: the library's member id is not 16 bytes");
      theirs[a.ours.idArg] = mine[a.ours.idArg];
    }
    if (const std::size_t c = a.ours.counterArg; c != rb::PreparedCalls::kNoId && c < theirs.size()) {
      // The id the library made (or was given) in place of the counter: same length, same text
      // around it.
      const std::size_t end = a.ours.counterMarker.empty()
                                  ? mine[c].size()
                                  : mine[c].find(a.ours.counterMarker) + a.ours.counterMarker.size();
      const std::size_t keep = end - a.ours.counterWidth;
      if (theirs[c].size() == mine[c].size() && theirs[c].compare(0, keep, mine[c], 0, keep) == 0 &&
          theirs[c].compare(end, std::string::npos, mine[c], end, std::string::npos) == 0) {
        theirs[c] = mine[c];
      }
    }
    if (mine != theirs) {
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const std::string& x : v) s += "'" + x + "' ";
        return s;
      };
      throw std::runtime_error(
          fmt::format("bench: {} sends {}but the bench would send {}", a.ours.label, join(sent), join(mine)));
    }
    report += (report.empty() ? "" : ", ") + a.key;
  }
  (void)gWorld->admin->command({"FLUSHALL"});
  return report;
}

// --- 1. Server cost ---------------------------------------------------------------------------------

struct PhaseResult {
  bool valid = false;
  rb::LoadResult load;
  rb::ServerCost cost;
  double serverCpuBusy = NAN;  // seconds CPU kServerCpu was busy during the timed part, whoever ran (pinned runs)
};
// [algorithm][0 ours, 1 textbook][workload][pass]
std::vector<std::array<std::array<std::array<PhaseResult, kPasses>, kWorkloads>, 2>> gCost;

// FLUSHALL, `v`'s keys for `w` set up, the warm-up, then kCalls timed decisions.
PhaseResult runVariant(const Variant& v, const std::string& prefix, const Workload& w) {
  (void)gWorld->admin->command({"FLUSHALL"});
  const auto calls = prepare(v, limiterNames(prefix, w.keys), w.limits);
  (void)gWorld->load->run(*calls, w.warmup);
  PhaseResult r;
  const rb::CpuTimes cpuBefore = rb::CpuTimes::of(kServerCpu);
  const rb::ServerSample before = rb::sampleServer(*gWorld->admin);
  r.load = gWorld->load->run(*calls, kCalls, static_cast<std::size_t>(w.warmup) % calls->size());
  r.cost = rb::ServerCost::between(before, rb::sampleServer(*gWorld->admin));
  if (gWorld->pinned.pinned) r.serverCpuBusy = rb::CpuTimes::of(kServerCpu).busy - cpuBefore.busy;
  r.valid = true;
  return r;
}

PhaseResult runPhase(const Algorithm& a, int variant, const Workload& w) {
  return runVariant(variant == 0 ? a.ours : *a.textbook, fmt::format("b:{}:{}", a.key, variant == 0 ? "o" : "t"), w);
}

// Where the time of ours goes: scripts with the token bucket's keys and arguments that stop early,
// on the hot key (granted workload), in every pass beside the others.
enum ProbeId { kProbeFloor, kProbePrelude, kProbes };
const char* const kProbeKeys[kProbes] = {"floor", "prelude"};
std::array<Variant, kProbes> gProbes;
std::array<std::array<PhaseResult, kPasses>, kProbes> gProbeCost;

void makeProbes() {
  // gcra.lua's take and acquire.lua's fast path run above their `-- include:` line, before the
  // libraries' helpers are made; the probe measures what the full code pays for acquire.lua's
  // libraries (lib/base.lua, lib/redisson.lua) before its first line: the text cmake/EmbedLua.cmake
  // puts between the include line and the script's continuation.
  const std::string full = redlimit::detail::lua::acquire.source;
  const std::string begin = "-- ==== lib/", end = "-- ==== acquire.lua, continued ====\n";
  const auto from = full.find(begin), to = full.find(end);
  if (from == std::string::npos || to == std::string::npos) {
    throw std::runtime_error("bench: the embedded acquire.lua has no library markers");
  }
  const std::string sources[kProbes] = {"return {1}\n", full.substr(from, to - from) + "return {1}\n"};
  const char* const labels[kProbes] = {
      "EVALSHA of `return {1}` (the floor of any script call)",
      "acquire.lua's libraries + `return {1}` (the full code's prelude; fast paths run before it)"};
  for (int p = 0; p < kProbes; ++p) {
    const std::string sha = loadScript(sources[p]);
    gProbes[static_cast<std::size_t>(p)] = Variant{labels[p], nullptr, [sha](const std::string& name, const Limits&) {
                                                     auto argv =
                                                         oneKeyArgv(redlimit::detail::lua::gcra.sha1, name, 'T');
                                                     argv[1] = sha;
                                                     return argv;
                                                   }};
  }
}

// The floor of the sliding log: what each Redis command of acquire.lua's fast path and of Redisson's
// sequence (bench/reference_acquire.lua) costs inside a script, on the state the acquire phases
// work on. Each probe is a script that runs its command kCommandRepeat times (then `return {1}`),
// sent with acquire.lua's keys and arguments (a fresh member id per call); a command's cost is the
// probe's server us per call less the empty loop's, over kCommandRepeat (repeating it keeps the
// load's noise small beside it). State: configureWithLog's untimed acquires (hot key: 1000 live
// one-permit members, a skiplist; 10k keys: one member each, listpacks). The ZADD probes add the
// call's member after every stamp in the log and remove it again (ZREM), so the state stays; the
// two differ only in the score, whole ms or with three decimals.
constexpr int kCommandRepeat = 16;
struct CommandProbe {
  const char* key;
  const char* label;
  const char* command;  // Lua, run kCommandRepeat times
  int oursCalls;        // how often acquire.lua's fast path sends it on a grant without reclaim
  int redissonCalls;    // how often Redisson's sequence does
};
constexpr std::array<CommandProbe, 11> kCommandProbes{{
    {"loop", "EVALSHA of the empty loop and `return {1}`, acquire.lua's argv (subtracted below)", "", 0, 0},
    {"time", "TIME", "redis.call('TIME')", 1, 0},
    {"hmget", "HMGET of the four config fields",
     "redis.call('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime')", 1, 0},
    {"hget", "HGET of one config field", "redis.call('HGET', KEYS[1], 'rate')", 0, 4},
    {"get", "GET of the value", "redis.call('GET', KEYS[2])", 1, 1},
    {"zrangebyscore", "ZRANGEBYSCORE of the expired members (none), whole-ms edge",
     "redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '1000000000000', 'LIMIT', '0', '1000')", 1, 1},
    {"zcard", "ZCARD of the log", "redis.call('ZCARD', KEYS[4])", 1, 0},
    {"decrby", "DECRBY of the value", "redis.call('DECRBY', KEYS[2], '1')", 1, 1},
    {"pttl", "PTTL of the config hash", "redis.call('PTTL', KEYS[1])", 0, 1},
    {"zadd", "ZADD of a member, whole-ms score, + ZREM of it",
     "redis.call('ZADD', KEYS[4], '4102444800000', ARGV[3]) redis.call('ZREM', KEYS[4], ARGV[3])", 1, 1},
    {"zadd_fraction", "ZADD of a member, score with three decimals, + ZREM of it",
     "redis.call('ZADD', KEYS[4], '4102444800000.123', ARGV[3]) redis.call('ZREM', KEYS[4], ARGV[3])", 0, 0},
}};
constexpr std::array<int, 2> kCommandWorkloads{kHotGranted, kManyGranted};
std::array<Variant, kCommandProbes.size()> gCommandProbes;
std::array<std::array<std::array<PhaseResult, kPasses>, kCommandWorkloads.size()>, kCommandProbes.size()> gCommandCost;

void makeCommandProbes() {
  for (std::size_t p = 0; p < kCommandProbes.size(); ++p) {
    const std::string sha =
        loadScript(fmt::format("for _ = 1, {} do {} end\nreturn {{1}}\n", kCommandRepeat, kCommandProbes[p].command));
    gCommandProbes[p] =
        Variant{kCommandProbes[p].label, configureAvailable,
                [sha](const std::string& name, const Limits& l) { return acquireArgv(sha, name, l); }, kIdArg};
  }
}

void BM_CommandProbe(benchmark::State& state, std::size_t probe, std::size_t workload, int pass) {
  try {
    PhaseResult r;
    for (auto _ : state) {
      r = runVariant(gCommandProbes[probe], "b:cmd", kWorkloadSpecs[kCommandWorkloads[workload]]);
      state.SetIterationTime(r.load.seconds);
    }
    gCommandCost[probe][workload][static_cast<std::size_t>(pass)] = r;
    state.counters["usec_per_call"] = r.cost.usecPerCall;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Server us per call of command probe `p` in workload `w` above the `return {1}` probe; NaN if a
// pass is missing.
double commandCost(std::size_t p, std::size_t w) {
  double sum = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const PhaseResult& r = gCommandCost[p][w][static_cast<std::size_t>(pass)];
    const PhaseResult& floor = gCommandCost[0][w][static_cast<std::size_t>(pass)];
    if (!r.valid || !floor.valid) return NAN;
    sum += r.cost.usecPerCall - floor.cost.usecPerCall;
  }
  return sum / kPasses / kCommandRepeat;
}

// The cost of the commands one side sends (each probe's cost times its `calls` on that side).
double commandSum(std::size_t w, int CommandProbe::*calls) {
  double sum = 0;
  for (std::size_t p = 1; p < kCommandProbes.size(); ++p) sum += kCommandProbes[p].*calls * commandCost(p, w);
  return sum;
}

void BM_Probe(benchmark::State& state, int probe, int pass) {
  try {
    PhaseResult r;
    for (auto _ : state) {
      r = runVariant(gProbes[static_cast<std::size_t>(probe)], "b:probe", kWorkloadSpecs[kHotGranted]);
      state.SetIterationTime(r.load.seconds);
    }
    gProbeCost[static_cast<std::size_t>(probe)][static_cast<std::size_t>(pass)] = r;
    state.counters["usec_per_call"] = r.cost.usecPerCall;
    state.counters["server_cpu_us_per_decision"] = r.cost.cpuUsPerCall;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Redis Functions against EVALSHA: gcra.lua's take (a stored GCRA Limiter's argv) and acquire.lua (RateLimiter's),
// hot key granted and denied, each also as a Redis 7 function library loaded once (FUNCTION LOAD) and
// called with FCALL, the same keys and arguments. The library holds the script's libraries at its
// top level, so their helpers are made once, at load time, not on every call; the function's body is
// the script's own text (the fast path above its `-- include:` line, the full code below it), with
// KEYS and ARGV upvalues it sets from its arguments. Same load as the other phases; kFunctionPasses passes,
// every other one mirrored, and the medians and minimums shown: on a shared machine a pass that other
// jobs preempted is far off, and preemption only adds.
enum FunctionCaseId { kFnGcra, kFnAcquire, kFunctionCases };
const char* const kFunctionAlgorithms[kFunctionCases] = {"gcra", "rate_limiter"};
const int kFunctionWorkloads[] = {kHotGranted, kHotDenied};
constexpr int kFunctionWorkloadCount = 2;
constexpr int kFunctionPasses = 10;
std::array<std::array<Variant, 2>, kFunctionCases> gFunctionVariants;  // [case][0 EVALSHA, 1 FCALL]
// [case][variant][workload index in kFunctionWorkloads][pass]
std::array<std::array<std::array<std::array<PhaseResult, kFunctionPasses>, kFunctionWorkloadCount>, 2>, kFunctionCases>
    gFunctionCost;

// The blocks of the libraries' text that a script's flag runs where the libraries are included: a
// shared fast path (lib/gcra_fast.lua, lib/fixed_window_fast.lua) decides the script's own take
// there, under `if gcraFastCall then` ... `end` at the start of a line.
std::string fastPathBlocks(const std::string& libraries) {
  std::string blocks;
  for (const char* flag : {"gcraFastCall", "windowFastCall"}) {
    const std::string opening = fmt::format("\nif {} then\n", flag);
    const auto from = libraries.find(opening);
    if (from == std::string::npos) continue;
    const auto to = libraries.find("\nend\n", from + opening.size());
    if (to == std::string::npos) throw std::runtime_error(fmt::format("bench: no end of the {} block", flag));
    blocks += libraries.substr(from + 1, to + 5 - (from + 1));
  }
  return blocks;
}

// The library for one embedded script: its libraries at the top level, every helper of theirs made
// (each lib/*_core.lua makes its helpers under a flag a script sets above its include line; here
// all are set at the top, but the fast paths' flags, which the script sets per call), its own text
// as the function, with the fast-path blocks of its libraries where its include line was.
std::string functionLibrary(const redlimit::detail::lua::EmbeddedScript& script) {
  const std::string text = script.source;
  const std::string include = "\n-- include:";
  const std::string resume = fmt::format("-- ==== {}.lua, continued ====\n", script.name);
  const auto line = text.find(include);
  const auto libs = line == std::string::npos ? std::string::npos : text.find('\n', line + 1);
  const auto rest = text.find(resume);
  if (libs == std::string::npos || rest == std::string::npos || rest < libs) {
    throw std::runtime_error(fmt::format("bench: the embedded {}.lua has no include line and libraries", script.name));
  }
  return fmt::format(
      "#!lua name=bench_{0}\n"
      "local KEYS, ARGV\n"
      "local makesGcra, makesWindow, makesCalendar, makesLeases, makesRecords = true, true, true, true, true\n"
      "local gcraFastCall, windowFastCall = false, false\n"
      "{1}"
      "redis.register_function('{0}', function(keys, args)\n"
      "KEYS, ARGV = keys, args\n"
      "{2}{4}{3}\n"
      "end)\n",
      script.name, text.substr(libs + 1, rest - libs - 1), text.substr(0, libs + 1), text.substr(rest),
      fastPathBlocks(text.substr(libs + 1, rest - libs - 1)));
}

void makeFunctionVariants() {
  const redlimit::detail::lua::EmbeddedScript* scripts[kFunctionCases] = {&redlimit::detail::lua::gcra,
                                                                          &redlimit::detail::lua::acquire};
  for (std::size_t c = 0; c < kFunctionCases; ++c) {
    const Algorithm* alg = nullptr;
    for (const Algorithm& a : *gAlgorithms) {
      if (a.key == kFunctionAlgorithms[c]) alg = &a;
    }
    if (alg == nullptr) throw std::logic_error(fmt::format("bench: no {} entry", kFunctionAlgorithms[c]));
    auto loaded = gWorld->admin->command({"FUNCTION", "LOAD", "REPLACE", functionLibrary(*scripts[c])});
    if (loaded->type == REDIS_REPLY_ERROR) {
      throw std::runtime_error(
          fmt::format("bench: FUNCTION LOAD of {}.lua: {}", scripts[c]->name, std::string(loaded->str, loaded->len)));
    }
    Variant evalsha = alg->ours;
    evalsha.label = fmt::format("{}.lua, EVALSHA", scripts[c]->name);
    Variant fcall = alg->ours;
    fcall.label = fmt::format("{}.lua, FCALL (helpers made at FUNCTION LOAD)", scripts[c]->name);
    fcall.argv = [argv = alg->ours.argv, name = std::string(scripts[c]->name)](const std::string& key,
                                                                               const Limits& l) {
      std::vector<std::string> a = argv(key, l);  // EVALSHA sha numkeys ...: FCALL name numkeys ...
      a[0] = "FCALL";
      a[1] = name;
      return a;
    };
    gFunctionVariants[c] = {evalsha, fcall};
  }
}

void BM_Function(benchmark::State& state, int fcase, int variant, int workload, int pass) {
  try {
    const Variant& v = gFunctionVariants[static_cast<std::size_t>(fcase)][static_cast<std::size_t>(variant)];
    PhaseResult r;
    for (auto _ : state) {
      r = runVariant(v, fmt::format("b:fn:{}:{}", fcase, variant), kWorkloadSpecs[kFunctionWorkloads[workload]]);
      state.SetIterationTime(r.load.seconds);
    }
    gFunctionCost[static_cast<std::size_t>(fcase)][static_cast<std::size_t>(variant)]
                 [static_cast<std::size_t>(workload)][static_cast<std::size_t>(pass)] = r;
    state.counters["usec_per_call"] = r.cost.usecPerCall;
    state.counters["server_cpu_us_per_decision"] = r.cost.cpuUsPerCall;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Cost(benchmark::State& state, std::size_t alg, int variant, int workload, int pass) {
  try {
    const Algorithm& a = (*gAlgorithms)[alg];
    PhaseResult r;
    for (auto _ : state) {
      r = runPhase(a, variant, kWorkloadSpecs[workload]);
      state.SetIterationTime(r.load.seconds);
    }
    gCost[alg][static_cast<std::size_t>(variant)][static_cast<std::size_t>(workload)][static_cast<std::size_t>(pass)] =
        r;
    state.counters["usec_per_call"] = r.cost.usecPerCall;
    state.counters["server_cpu_us_per_decision"] = r.cost.cpuUsPerCall;
    state.counters["decisions_per_s"] = static_cast<double>(r.load.calls) / r.load.seconds;
    state.counters["allowed_share"] = static_cast<double>(r.load.allowed) / static_cast<double>(r.load.calls);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// --- 2. Bytes per key -------------------------------------------------------------------------------

struct MemoryRow {
  std::string what;
  std::int64_t ours = -1;  // bytes, -1 = not measured
  std::int64_t textbook = -1;
  bool target = false;  // the target <= kMaxKeyBytes applies to `ours`
  std::string note;
};
std::vector<MemoryRow> gMemory;
constexpr const char* kMemoryName = "rl:user:000042";  // 14 bytes, as the library's headers quote

std::int64_t memoryUsage(const std::string& key) {
  auto r = gWorld->admin->command({"MEMORY", "USAGE", key, "SAMPLES", "0"});
  return r->type == REDIS_REPLY_INTEGER ? static_cast<std::int64_t>(r->integer) : 0;
}

// One decision through `v` on `name` (configured first), then the bytes of every key it made.
std::int64_t bytesAfterOneCall(const Variant& v, const std::string& name) {
  (void)gWorld->admin->command({"FLUSHALL"});
  auto calls = prepare(v, {name}, kNeverReached);
  (void)gWorld->load->run(*calls, 1);
  auto keys = gWorld->admin->command({"KEYS", "*"});
  std::int64_t total = 0;
  for (std::size_t i = 0; i < keys->elements; ++i)
    total += memoryUsage(std::string(keys->element[i]->str, keys->element[i]->len));
  return total;
}

void BM_Memory(benchmark::State& state) {
  try {
    for (auto _ : state) {
      gMemory.clear();
      for (const Algorithm& a : *gAlgorithms) {
        if (!a.oneKey) continue;  // RateLimiter: below (its log holds a member per live grant)
        MemoryRow row{a.title, bytesAfterOneCall(a.ours, kMemoryName), -1, true, ""};
        if (a.textbook) row.textbook = bytesAfterOneCall(*a.textbook, kMemoryName);
        if (a.key == "sliding_window") row.note = "textbook: a counter per window; two once a window has ended";
        state.counters[a.key + "_ours_bytes"] = static_cast<double>(row.ours);
        state.counters[a.key + "_textbook_bytes"] = static_cast<double>(row.textbook);
        gMemory.push_back(row);
      }
      const Algorithm& rl = rateLimiter();
      for (std::int64_t live : {1, 100, 10000}) {
        (void)gWorld->admin->command({"FLUSHALL"});
        auto calls = prepare(rl.ours, {kMemoryName}, kNeverReached);
        (void)gWorld->load->run(*calls, live);
        const redlimit::RateLimiter handle(gWorld->client, kMemoryName);
        std::int64_t total = 0;
        std::string parts;
        for (std::size_t k : {std::size_t{0}, std::size_t{1},
                              std::size_t{3}}) {  // config hash, value, permits (the client keys stay empty)
          const std::int64_t b = memoryUsage(handle.keys()[k]);
          total += b;
          parts += (parts.empty() ? "" : " + ") + std::to_string(b);
        }
        gMemory.push_back(MemoryRow{fmt::format("RateLimiter, {} live permit{}", live, live == 1 ? "" : "s"), total, -1,
                                    false,
                                    fmt::format("hash + value + permits = {}; {:.1f} per live permit", parts,
                                                static_cast<double>(total) / static_cast<double>(live))});
        state.counters[fmt::format("rate_limiter_{}_live_bytes", live)] = static_cast<double>(total);
      }
      state.SetIterationTime(1e-3);
    }
    (void)gWorld->admin->command({"FLUSHALL"});
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// --- 3. Accuracy ------------------------------------------------------------------------------------

struct AccuracyRow {
  std::string title;
  std::int64_t attempts = 0;
  std::int64_t errors = 0;
  std::int64_t grants = 0;
  std::string boundText;     // the bound, in words
  std::string observedText;  // what the grants did against it
  bool met = false;
};
std::vector<AccuracyRow> gAccuracy;
std::vector<rb::EnvelopeSeries> gEnvelopes;

// One key of a Limiter, decided as the accuracy rows decide it.
struct OneKey {
  redlimit::Limiter limiter;
  std::string key;
  redlimit::Decision decide(std::int64_t permits) { return limiter.decide(key, permits); }
};

// Calls `decide()` from kClients x kThreadsPerClient threads for kAccuracyRun; returns the server
// times (µs) of the grants, sorted.
template <class MakeLimiter>
std::vector<std::int64_t> hammer(MakeLimiter makeLimiter, std::int64_t& attempts, std::int64_t& errors) {
  std::vector<std::shared_ptr<redlimit::Client>> clients;
  for (int c = 0; c < kClients; ++c) {
    redlimit::ClientOptions o = gWorld->client->options();
    o.pool.size = kThreadsPerClient;
    clients.push_back(redlimit::Client::create(o));
  }
  std::vector<std::vector<std::int64_t>> perThread(std::size_t{kClients} * kThreadsPerClient);
  std::atomic<std::int64_t> calls{0}, failed{0};
  std::vector<std::thread> threads;
  const auto deadline = rb::Clock::now() + kAccuracyRun;
  for (int t = 0; t < kClients * kThreadsPerClient; ++t) {
    threads.emplace_back([&, t] {
      auto limiter = makeLimiter(clients[static_cast<std::size_t>(t / kThreadsPerClient)]);
      auto& mine = perThread[static_cast<std::size_t>(t)];
      std::int64_t n = 0;
      while (rb::Clock::now() < deadline) {
        ++n;
        try {
          const redlimit::Decision d = limiter.decide(1);
          if (d.allowed && !d.byPolicy) mine.push_back(d.time.count());
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
  std::sort(all.begin(), all.end());
  return all;
}

// Token bucket and GCRA: in any closed window [a, a + T] at most B + floor(T x P / I) grants. The
// worst window over all pairs of grants i <= j: max of (j - i + 1) x I - (t_j - t_i) x P, which
// must stay <= B x I (integers; times relative to the first grant).
void checkBucket(AccuracyRow& row, const std::vector<std::int64_t>& us, std::int64_t burst, std::int64_t permits,
                 std::int64_t intervalMs) {
  const std::int64_t iUs = intervalMs * 1000;
  std::int64_t worst = 0, bestStart = std::numeric_limits<std::int64_t>::min();
  for (std::size_t j = 0; j < us.size(); ++j) {
    const auto idx = static_cast<std::int64_t>(j);
    const std::int64_t rel = us[j] - us.front();
    bestStart = std::max(bestStart, rel * permits - idx * iUs);  // best i <= j
    worst = std::max(worst, (idx + 1) * iUs - rel * permits + bestStart);
  }
  row.boundText = fmt::format("<= {} + {} per {} ms x T in any window T", burst, permits, intervalMs);
  row.observedText =
      fmt::format("most over any window: {:.2f} + rate x T", static_cast<double>(worst) / static_cast<double>(iUs));
  row.met = worst <= burst * iUs;
}

// Fixed window: at most L in each aligned window [k W, (k + 1) W).
void checkWindows(AccuracyRow& row, const std::vector<std::int64_t>& us, std::int64_t limit, std::int64_t windowMs) {
  const std::int64_t wUs = windowMs * 1000;
  std::int64_t most = 0, run = 0, current = std::numeric_limits<std::int64_t>::min();
  for (std::int64_t t : us) {
    const std::int64_t w = t / wUs;
    run = w == current ? run + 1 : 1;
    current = w;
    most = std::max(most, run);
  }
  row.boundText = fmt::format("<= {} per aligned {} ms window", limit, windowMs);
  row.observedText = fmt::format("most in one aligned window: {}; in any {} ms: {} (<= 2 x limit)", most, windowMs,
                                 rb::mostInAnyWindow(us, wUs - 1));
  row.met = most <= limit;
}

constexpr Limits kAccuracyBucket{50, 100, 200};   // burst 50, 100 per 200 ms (500/s)
constexpr Limits kAccuracyWindow{100, 100, 200};  // 100 per aligned 200 ms window

void BM_Accuracy(benchmark::State& state, const std::string& which) {
  try {
    AccuracyRow row;
    rb::EnvelopeSeries series;
    series.durationUs = std::chrono::duration_cast<std::chrono::microseconds>(kAccuracyRun).count();
    series.maxWindowUs = 1000000;
    const std::string name = "bench:accuracy:" + which;
    const std::string threads =
        fmt::format("{} Clients x {} threads, decide(1) for {} ms", kClients, kThreadsPerClient, kAccuracyRun.count());
    (void)gWorld->admin->command({"FLUSHALL"});
    std::vector<std::int64_t> us;
    for (auto _ : state) {
      const Limits l = which == "fixed_window" ? kAccuracyWindow : kAccuracyBucket;
      redlimit::Policy policy = which == "token_bucket" ? tokenBucketPolicy(l)
                                : which == "gcra"       ? gcraPolicy(l)
                                                        : fixedWindowPolicy(l);
      policy = policy.stored();
      const LimiterKey k = limiterKeyOf(name);
      redlimit::Limiter(gWorld->client, k.limiter, policy).setPolicy(k.key, policy);
      us = hammer(
          [&](const std::shared_ptr<redlimit::Client>& client) {
            return OneKey{{client, k.limiter, policy}, k.key};
          },
          row.attempts, row.errors);
      if (which == "token_bucket") {
        row.title = fmt::format("Limiter tokenBucket, capacity {}, {} per {} ms", l.burst, l.permits, l.intervalMs);
      } else if (which == "gcra") {
        row.title = fmt::format("Limiter gcra, burst {}, {} per {} ms", l.burst, l.permits, l.intervalMs);
      } else {
        row.title = fmt::format("Limiter fixedWindow, {} per aligned {} ms window", l.burst, l.intervalMs);
      }
      state.SetIterationTime(std::chrono::duration<double>(kAccuracyRun).count());
      row.grants = static_cast<std::int64_t>(us.size());
      if (which == "fixed_window") {
        checkWindows(row, us, l.burst, l.intervalMs);
        const std::int64_t wUs = l.intervalMs * 1000;
        series.boundFrom = [l, wUs](std::int64_t from, std::int64_t len) {
          return l.burst * ((from + len) / wUs - from / wUs + 1);  // the aligned windows [from, from + len] touches
        };
        series.boundAny = [l, wUs](std::int64_t len) { return l.burst * ((len + wUs - 1) / wUs + 1); };
        series.boundLabel = fmt::format("limit x (ceil(T / {} ms) + 1)", l.intervalMs);
      } else {
        checkBucket(row, us, l.burst, l.permits, l.intervalMs);
        const std::int64_t iUs = l.intervalMs * 1000;
        series.boundFrom = [l, iUs](std::int64_t, std::int64_t len) { return l.burst + len * l.permits / iUs; };
        series.boundAny = [l, iUs](std::int64_t len) { return l.burst + len * l.permits / iUs; };
        series.boundLabel = fmt::format("burst + rate x T = {} + {}/s x T", l.burst, l.permits * 1000 / l.intervalMs);
      }
    }
    series.title = row.title;
    series.note = fmt::format("{}: {} attempts, {} permits granted\n{}: {}", threads, row.attempts, row.grants,
                              row.met ? "within the bound" : "ABOVE THE BOUND", row.observedText);
    series.grantUs = us;
    state.counters["attempts"] = static_cast<double>(row.attempts);
    state.counters["grants"] = static_cast<double>(row.grants);
    state.counters["errors"] = static_cast<double>(row.errors);
    state.counters["within_bound"] = row.met ? 1 : 0;
    gAccuracy.push_back(row);
    gEnvelopes.push_back(std::move(series));
    (void)gWorld->admin->command({"FLUSHALL"});
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// --- 4. Worst case on a random workload ----------------------------------------------------------

// Bursts of 1..10 one-permit calls (1 µs apart) at random times (exponential gaps), offered at about
// twice the limit, sent with the time in the call so that the sliding window counter, the fixed
// window and the exact sliding log (RateLimiter) see the same calls at the same instants. The
// figure is the most grants in any window-long interval, against the limit.
constexpr std::int64_t kRandomLimit = 100;
constexpr std::int64_t kRandomWindowMs = 1000;
constexpr std::int64_t kRandomWindows = 120;
constexpr std::uint64_t kRandomSeed = 20261207;

struct RandomRow {
  std::string title;
  std::int64_t offered = 0;
  std::int64_t grants = 0;
  std::int64_t most = 0;   // grants in the busiest window-long interval
  std::int64_t bound = 0;  // what the algorithm promises for it
  std::string boundText;
};
std::vector<RandomRow> gRandom;

// The call times (epoch µs, from a window's start in 2030) of the random workload.
std::vector<std::int64_t> randomArrivals() {
  std::mt19937_64 rng(kRandomSeed);
  const std::int64_t wus = kRandomWindowMs * 1000;
  const std::int64_t start = 1'900'000'000'000'000 - 1'900'000'000'000'000 % wus;
  std::exponential_distribution<double> gap(2.0 * kRandomLimit / 5.5 / static_cast<double>(wus));  // bursts per µs
  std::uniform_int_distribution<int> size(1, 10);
  std::vector<std::int64_t> out;
  double t = static_cast<double>(start);
  while (t < static_cast<double>(start + kRandomWindows * wus)) {
    t += std::ceil(gap(rng)) + 10;
    const int k = size(rng);
    for (int i = 0; i < k; ++i) out.push_back(static_cast<std::int64_t>(t) + i);
  }
  return out;
}

// The times among `times` at which the call argvAt(time, index) was granted (granted(reply)),
// sent in order, pipelined on one connection.
template <class ArgvAt, class Granted>
std::vector<std::int64_t> grantsAt(const std::vector<std::int64_t>& times, ArgvAt argvAt, Granted granted) {
  rb::RawRedis& admin = *gWorld->admin;
  std::vector<std::int64_t> out;
  for (std::size_t done = 0; done < times.size();) {
    const std::size_t batch = std::min<std::size_t>(1000, times.size() - done);
    std::vector<std::vector<std::string>> argvs;
    argvs.reserve(batch);
    for (std::size_t i = 0; i < batch; ++i) argvs.push_back(argvAt(times[done + i], done + i));
    for (const auto& argv : argvs) admin.append(std::vector<std::string_view>(argv.begin(), argv.end()));
    for (std::size_t i = 0; i < batch; ++i) {
      const auto r = admin.reply();
      if (granted(r.get())) out.push_back(times[done + i]);
    }
    done += batch;
  }
  return out;
}

// A one-key decision's packed reply (lib/onekey.lua's packDecision): 0xA1 first when granted.
bool packedGranted(const redisReply* r) {
  if (r->type != REDIS_REPLY_STRING || r->len != 65) throw std::runtime_error("bench: unexpected decision reply");
  return static_cast<unsigned char>(r->str[0]) == 0xA1;
}

void BM_RandomWorkload(benchmark::State& state) {
  namespace lua = redlimit::detail::lua;
  try {
    for (auto _ : state) {
      gRandom.clear();
      (void)gWorld->admin->command({"FLUSHALL"});
      const std::vector<std::int64_t> times = randomArrivals();
      const std::int64_t wus = kRandomWindowMs * 1000;
      const Limits l{kRandomLimit, kRandomLimit, kRandomWindowMs};
      const auto oneKey = [&](std::string_view sha, char kind, const std::string& key) {
        const std::string header = windowHeader(kind, kRandomLimit, kRandomWindowMs);
        return grantsAt(
            times,
            [&](std::int64_t t, std::size_t) {
              return std::vector<std::string>{"EVALSHA",         std::string(sha),     "1", key, "take",
                                              std::to_string(t), std::string(1, kind), "1", "0", header};
            },
            packedGranted);
      };
      const std::vector<std::int64_t> sliding = oneKey(lua::sliding_window.sha1, 'V', "bench:random:sliding");
      const std::vector<std::int64_t> fixed = oneKey(lua::fixed_window.sha1, 'W', "bench:random:fixed");
      configureRateLimiter({"bench:random:log"}, l);
      std::vector<std::string> logArgv = acquireArgv(lua::acquire.sha1, "bench:random:log", l);
      const std::vector<std::int64_t> log = grantsAt(
          times,
          [&](std::int64_t t, std::size_t i) {
            logArgv[kIdArg] = fmt::format("{:016d}", i);
            logArgv[kClockArg] = std::to_string(t);
            return logArgv;
          },
          [](const redisReply* r) {
            const std::int64_t granted = rb::packedAcquireGranted(r);
            if (granted < 0) throw std::runtime_error("bench: unexpected acquire.lua reply");
            return granted > 0;
          });
      const auto offered = static_cast<std::int64_t>(times.size());
      const std::int64_t worst = kRandomLimit + kRandomLimit * (wus - 2) / wus;  // lib/sliding_window_core.lua
      gRandom.push_back({"Limiter slidingWindow (sliding window counter)", offered,
                         static_cast<std::int64_t>(sliding.size()), rb::mostInAnyWindow(sliding, wus - 1), worst,
                         "L + floor(L x (W - 2 us) / W)"});
      gRandom.push_back({"Limiter fixedWindow", offered, static_cast<std::int64_t>(fixed.size()),
                         rb::mostInAnyWindow(fixed, wus - 1), 2 * kRandomLimit, "2 L"});
      gRandom.push_back({"RateLimiter (exact sliding log)", offered, static_cast<std::int64_t>(log.size()),
                         rb::mostInAnyWindow(log, wus - 1), kRandomLimit, "L"});
      for (const RandomRow& r : gRandom) {
        state.counters[r.title.substr(0, r.title.find(' ', 8)) + "_most"] = static_cast<double>(r.most);
      }
      state.SetIterationTime(1e-3);
    }
    (void)gWorld->admin->command({"FLUSHALL"});
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// --- Registration -------------------------------------------------------------------------------------

void registerBenchmarks() {
  using benchmark::RegisterBenchmark;
  struct Step {
    std::size_t alg;
    int variant;
    int workload;
  };
  std::vector<Step> order;
  for (int w = 0; w < kWorkloads; ++w) {
    for (std::size_t a = 0; a < gAlgorithms->size(); ++a) {
      for (int v = 0; v < 2; ++v) {
        if (v == 1 && !(*gAlgorithms)[a].textbook) continue;
        order.push_back(Step{a, v, w});
      }
    }
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    for (int p = 0; p < kProbes; ++p) {
      RegisterBenchmark(fmt::format("Probe/{}/pass:{}", kProbeKeys[p], pass + 1).c_str(), BM_Probe, p, pass)
          ->Iterations(1)
          ->UseManualTime();
    }
    for (std::size_t i = 0; i < kCommandProbes.size() * kCommandWorkloads.size(); ++i) {
      const std::size_t step = pass % 2 == 0 ? i : kCommandProbes.size() * kCommandWorkloads.size() - 1 - i;
      const std::size_t p = step / kCommandWorkloads.size(), w = step % kCommandWorkloads.size();
      RegisterBenchmark(fmt::format("Command/{}/{}/pass:{}", kCommandProbes[p].key,
                                    kWorkloadSpecs[kCommandWorkloads[w]].key, pass + 1)
                            .c_str(),
                        BM_CommandProbe, p, w, pass)
          ->Iterations(1)
          ->UseManualTime();
    }
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Step& s = order[pass % 2 == 0 ? i : order.size() - 1 - i];  // mirrored on odd passes
      const Algorithm& a = (*gAlgorithms)[s.alg];
      RegisterBenchmark(fmt::format("Cost/{}/{}/{}/pass:{}", a.key, s.variant == 0 ? "ours" : "textbook",
                                    kWorkloadSpecs[s.workload].key, pass + 1)
                            .c_str(),
                        BM_Cost, s.alg, s.variant, s.workload, pass)
          ->Iterations(1)
          ->UseManualTime();
    }
  }
  for (int pass = 0; pass < kFunctionPasses; ++pass) {
    for (int i = 0; i < kFunctionCases * 2 * kFunctionWorkloadCount; ++i) {
      const int step = pass % 2 == 0 ? i : kFunctionCases * 2 * kFunctionWorkloadCount - 1 - i;  // mirrored
      const int c = step / (2 * kFunctionWorkloadCount), w = step / 2 % kFunctionWorkloadCount, v = step % 2;
      RegisterBenchmark(fmt::format("Functions/{}/{}/{}/pass:{}", kFunctionAlgorithms[c], v == 0 ? "evalsha" : "fcall",
                                    kWorkloadSpecs[kFunctionWorkloads[w]].key, pass + 1)
                            .c_str(),
                        BM_Function, c, v, w, pass)
          ->Iterations(1)
          ->UseManualTime();
    }
  }
  RegisterBenchmark("Memory/bytes_per_key", BM_Memory)->Iterations(1)->UseManualTime();
  for (const char* which : {"token_bucket", "gcra", "fixed_window"}) {
    RegisterBenchmark(fmt::format("Accuracy/{}", which).c_str(), BM_Accuracy, std::string(which))
        ->Iterations(1)
        ->UseManualTime();
  }
  RegisterBenchmark("WorstCase/random_workload", BM_RandomWorkload)->Iterations(1)->UseManualTime();
}

// --- Summary -----------------------------------------------------------------------------------------

using redlimit::bench::cell;

/// Mean over the passes of `f` of one phase; NaN if a pass is missing.
template <class F>
double mean(std::size_t alg, int variant, int workload, F&& f) {
  double sum = 0;
  for (const PhaseResult& r : gCost[alg][static_cast<std::size_t>(variant)][static_cast<std::size_t>(workload)]) {
    if (!r.valid) return NAN;
    sum += f(r);
  }
  return sum / kPasses;
}
double usecPerCall(std::size_t a, int v, int w) {
  return mean(a, v, w, [](const PhaseResult& r) { return r.cost.usecPerCall; });
}
double cpuPerDecision(std::size_t a, int v, int w) {
  return mean(a, v, w, [](const PhaseResult& r) { return r.cost.cpuUsPerCall; });
}
double rate(std::size_t a, int v, int w) {
  return mean(a, v, w, [](const PhaseResult& r) { return static_cast<double>(r.load.calls) / r.load.seconds; });
}
// "server/all": the share of CPU kServerCpu's time the server used while the phase ran / the share
// anything used (other processes on the machine run there too).
std::string cpu0Share(const std::array<PhaseResult, kPasses>& passes) {
  double server = 0, all = 0;
  for (const PhaseResult& r : passes) {
    if (!r.valid || std::isnan(r.serverCpuBusy)) return "n/a";
    server += r.cost.cpuUsPerCall * static_cast<double>(r.cost.calls) / 1e6 / r.load.seconds;
    all += r.serverCpuBusy / r.load.seconds;
  }
  return fmt::format("{:.2f}/{:.2f}", server / kPasses, all / kPasses);
}
double allowedShare(std::size_t a, int v, int w) {
  return mean(a, v, w, [](const PhaseResult& r) {
    return static_cast<double>(r.load.allowed) / static_cast<double>(r.load.calls);
  });
}

std::string summary(const std::string& argvChecked) {
  std::string out;
  const auto& algs = *gAlgorithms;
  auto row = [&](const std::string& what, double value, int precision, const std::string& goal, bool met) {
    const std::string verdict = goal.empty() ? "report" : std::isnan(value) ? "n/a" : met ? "met" : "MISSED";
    out += fmt::format("  {:<80} {:>7}  {:<20} {}\n", what, cell(value, precision), goal, verdict);
  };

  out += fmt::format("redlimit algorithms benchmark (bench_algorithms), {}\n", rb::nowText());
  out += fmt::format("Machine: {}\n", gWorld->machine);
  out += fmt::format("CPU placement: {}\n", gWorld->pinned.placement);
  out += fmt::format(
      "Load: raw hiredis, {} connections x {} requests in flight, EVALSHA of each script with exactly the keys and\n"
      "arguments its library class sends for one permit (checked against MONITOR of real library calls: {}),\n"
      "and of the textbook script for the same algorithm (bench/textbook/*.lua; for RateLimiter's acquire,\n"
      "availablePermits and release bench/reference_*.lua, Redisson's call sequences), same load, same server, same\n"
      "run. Every script reads the server's TIME but Redisson's, which take the caller's clock as Redisson does.\n"
      "availablePermits and release run on the state their rows name, made by untimed acquires. Per phase: FLUSHALL,\n"
      "keys configured, an untimed warm-up, then {} timed calls; {} passes,\n"
      "every other one in mirrored order; means shown. Granted: 10^9 permits per hour (never reached); denied: 100 per "
      "hour, used up in\n"
      "the warm-up. server us/call: INFO commandstats (EVALSHA usec / calls); server CPU/decision: INFO cpu\n"
      "(user + sys, the whole process: parsing and I/O too) / decisions.\n"
      "Taken on a shared 2-core machine while other jobs (builds, tests) ran: absolute figures are noisy, the ratios\n"
      "compare phases of the same run.\n\n",
      kConnections, kDepth, argvChecked, kCalls, kPasses);

  out += fmt::format("{:<82} {:>7}  {}\n", "Ratios, each measured in this run", "value", "target");
  for (std::size_t a = 0; a < algs.size(); ++a) {
    if (!algs[a].textbook) continue;
    for (int w = 0; w < kWorkloads; ++w) {
      const double us = usecPerCall(a, 0, w) / usecPerCall(a, 1, w);
      const double cpu = cpuPerDecision(a, 0, w) / cpuPerDecision(a, 1, w);
      const std::string goal = algs[a].ratioTarget ? fmt::format("<= {:g}", algs[a].maxRatio) : "";
      row(fmt::format("{}, {}: ours / {}, server us per call", algs[a].title, workloadLabel(algs[a], w),
                      algs[a].textbookName),
          us, 2, goal, us <= algs[a].maxRatio);
      row(fmt::format("{}, {}: ours / {}, server CPU per call", algs[a].title, workloadLabel(algs[a], w),
                      algs[a].textbookName),
          cpu, 2, goal, cpu <= algs[a].maxRatio);
    }
  }
  // The floor of the sliding log (the command probes): TIME, and the commands of ours against
  // Redisson's, each summed as often as its calls send them.
  for (std::size_t w = 0; w < kCommandWorkloads.size(); ++w) {
    const std::string label = kWorkloadSpecs[kCommandWorkloads[w]].label;
    row(fmt::format("sliding log, {}: TIME in a script, server us (the server clock's floor)", label),
        commandCost(1, w), 2, "", false);
    row(fmt::format("sliding log, {}: commands of ours / of Redisson's grant, server us (the floor)", label),
        commandSum(w, &CommandProbe::oursCalls) / commandSum(w, &CommandProbe::redissonCalls), 2, "", false);
    row(fmt::format("sliding log, {}: ZADD + ZREM, fractional / whole-ms score, server us", label),
        commandCost(kCommandProbes.size() - 1, w) / commandCost(kCommandProbes.size() - 2, w), 2, "", false);
  }
  const std::size_t rl = rateLimiterIndex();
  for (std::size_t a = 0; a < algs.size(); ++a) {
    if (!algs[a].oneKey) continue;
    for (int w = 0; w < kWorkloads; ++w) {
      row(fmt::format("{}, {}: ours / RateLimiter, server us per call", algs[a].title, kWorkloadSpecs[w].label),
          usecPerCall(a, 0, w) / usecPerCall(rl, 0, w), 2, "", false);
    }
  }
  std::size_t gcraIndex = algs.size(), multiIndex = algs.size(), calendarIndex = algs.size();
  for (std::size_t a = 0; a < algs.size(); ++a) {
    if (algs[a].key == "gcra") gcraIndex = a;
    if (algs[a].key == "multi3") multiIndex = a;
    if (algs[a].key == "calendar") calendarIndex = a;
  }
  if (gcraIndex < algs.size() && calendarIndex < algs.size()) {
    for (int w = 0; w < kWorkloads; ++w) {
      row(fmt::format("calendar day, {}: ours / one-key GCRA, server us per call", kWorkloadSpecs[w].label),
          usecPerCall(calendarIndex, 0, w) / usecPerCall(gcraIndex, 0, w), 2, "", false);
    }
  }
  // Reserve then settle, leases: each call beside GCRA's take in the same workload, and a whole
  // reservation (reserve + settle) or lease (acquire + release) beside one take.
  for (std::size_t a = 0; a < algs.size() && gcraIndex < algs.size(); ++a) {
    const std::string& k = algs[a].key;
    if (k != "reserve" && k != "settle" && k != "lease_acquire" && k != "lease_release") continue;
    for (int w = 0; w < kWorkloads; ++w) {
      const std::string& state = workloadLabel(algs[a], w);
      row(state == kWorkloadSpecs[w].label
              ? fmt::format("{}, {}: ours / GCRA take, server us per call", algs[a].title, state)
              : fmt::format("{}, {}: ours / GCRA take ({}), server us", algs[a].title, state, kWorkloadSpecs[w].label),
          usecPerCall(a, 0, w) / usecPerCall(gcraIndex, 0, w), 2, "", false);
    }
  }
  for (const auto& [first, second, what] :
       {std::array<std::string, 3>{"reserve", "settle", "reserveFor + settle"},
        std::array<std::string, 3>{"lease_acquire", "lease_release", "lease acquire + release"}}) {
    std::size_t i = algs.size(), j = algs.size();
    for (std::size_t a = 0; a < algs.size(); ++a) {
      if (algs[a].key == first) i = a;
      if (algs[a].key == second) j = a;
    }
    if (i == algs.size() || j == algs.size() || gcraIndex == algs.size()) continue;
    for (const int w : {static_cast<int>(kHotGranted), static_cast<int>(kManyGranted)}) {
      row(fmt::format("{}, {}: one pair / one GCRA take, server us", what, kWorkloadSpecs[w].label),
          (usecPerCall(i, 0, w) + usecPerCall(j, 0, w)) / usecPerCall(gcraIndex, 0, w), 2, "", false);
    }
  }
  if (gcraIndex < algs.size() && multiIndex < algs.size()) {
    for (int w = 0; w < kWorkloads; ++w) {
      row(fmt::format("3-level MultiLimit, {}: one multi.lua call / 3 GCRA calls, server us", kWorkloadSpecs[w].label),
          usecPerCall(multiIndex, 0, w) / (3 * usecPerCall(gcraIndex, 0, w)), 2, "", false);
    }
  }
  for (const MemoryRow& m : gMemory) {
    if (!m.target) continue;
    row(fmt::format("{}: bytes per limiter key (MEMORY USAGE, name of {} bytes)", m.what, std::strlen(kMemoryName)),
        static_cast<double>(m.ours), 0, fmt::format("<= {}", kMaxKeyBytes), m.ours <= kMaxKeyBytes);
  }
  for (const AccuracyRow& r : gAccuracy) {
    row(fmt::format("{}: grants above the bound", r.title.substr(0, r.title.find(','))), r.met ? 0 : 1, 0, "= 0",
        r.met);
  }
  for (const RandomRow& r : gRandom) {
    row(fmt::format("{}, random workload: most grants in any {} ms / limit {}", r.title, kRandomWindowMs, kRandomLimit),
        static_cast<double>(r.most) / static_cast<double>(kRandomLimit), 2,
        fmt::format("<= {:.2f} ({})", static_cast<double>(r.bound) / static_cast<double>(kRandomLimit), r.boundText),
        r.most <= r.bound);
  }

  out += fmt::format(
      "\nServer cost, means of {} passes     script                                        server us/call  server CPU "
      "us/dec   decisions/s  granted  CPU {}: server/all\n",
      kPasses, kServerCpu);
  for (int w = 0; w < kWorkloads; ++w) {
    out += fmt::format("  {}\n", kWorkloadSpecs[w].label);
    for (std::size_t a = 0; a < algs.size(); ++a) {
      for (int v = 0; v < 2; ++v) {
        if (v == 1 && !algs[a].textbook) continue;
        const Variant& var = v == 0 ? algs[a].ours : *algs[a].textbook;
        const bool own = v == 0 && !algs[a].workloadLabels[static_cast<std::size_t>(w)].empty();
        out += fmt::format("    {:<14} {:<5} {:<58} {:>8}  {:>18}  {:>12}  {:>7}  {:>18}{}\n",
                           v == 0 ? algs[a].title : "", v == 0 ? "ours" : "text", var.label,
                           cell(usecPerCall(a, v, w), 2), cell(cpuPerDecision(a, v, w), 2), cell(rate(a, v, w), 0),
                           cell(allowedShare(a, v, w) * 100, 0) + "%",
                           cpu0Share(gCost[a][static_cast<std::size_t>(v)][static_cast<std::size_t>(w)]),
                           own ? "  state: " + workloadLabel(algs[a], w) : std::string());
      }
    }
  }
  std::string notes;
  for (std::size_t a = 0; a < algs.size(); ++a) {
    for (int v = 0; v < 2; ++v) {
      for (int w = 0; w < kWorkloads; ++w) {
        for (const PhaseResult& r : gCost[a][static_cast<std::size_t>(v)][static_cast<std::size_t>(w)]) {
          if (r.valid && r.cost.calls != r.load.calls) {
            notes += fmt::format("  ({} {} {}: the server counted {} script calls for {} decisions)\n", algs[a].key,
                                 v == 0 ? "ours" : "textbook", kWorkloadSpecs[w].key, r.cost.calls, r.load.calls);
          }
        }
      }
    }
  }
  out += notes;
  out += fmt::format(
      "  server us/call is the wall time EVALSHA ran (commandstats): time the server spent preempted by other\n"
      "  processes on CPU {} counts in it, so it can exceed the server's CPU per decision. CPU {}: server/all = share\n"
      "  of that CPU's time the server used / share anything used (/proc/stat); what is left of 'all' is other load.\n",
      kServerCpu, kServerCpu);
  out +=
      "  textbook scripts take their configuration from the caller's arguments; ours read it from the key and check\n"
      "  it, the state and the arguments before any write (lua/lib/, gcra.lua, fixed_window.lua).\n"
      "  textbook token bucket writes on every call (granted or not), as the classic does; textbook fixed window\n"
      "  counts denied calls too (INCRBY first); textbook GCRA writes only when it grants.\n";

  out += fmt::format(
      "\nWhere the time of ours goes: {}, token bucket argv, means of {} passes   server us/call  "
      "server CPU us/dec\n",
      kWorkloadSpecs[kHotGranted].label, kPasses);
  auto probeMean = [](int p, auto f) -> double {
    double sum = 0;
    for (const PhaseResult& r : gProbeCost[static_cast<std::size_t>(p)]) {
      if (!r.valid) return NAN;
      sum += f(r);
    }
    return sum / kPasses;
  };
  for (int p = 0; p < kProbes; ++p) {
    out += fmt::format("  {:<86} {:>8}  {:>17}\n", gProbes[static_cast<std::size_t>(p)].label,
                       cell(probeMean(p, [](const PhaseResult& r) { return r.cost.usecPerCall; }), 2),
                       cell(probeMean(p, [](const PhaseResult& r) { return r.cost.cpuUsPerCall; }), 2));
  }
  for (int v = 0; v < 2; ++v) {
    out += fmt::format("  {:<86} {:>8}  {:>17}\n", (v == 0 ? algs[0].ours : *algs[0].textbook).label + ", whole",
                       cell(usecPerCall(0, v, kHotGranted), 2), cell(cpuPerDecision(0, v, kHotGranted), 2));
  }

  out += fmt::format(
      "\nThe floor of the sliding log: each command of acquire.lua's fast path and of Redisson's sequence, {} times "
      "in\n"
      "a script with acquire.lua's argv, on the acquires' state (hot key: 1000 live members, a skiplist; 10k keys: 1\n"
      "each, listpacks); server us per command above the first row's, means of {} passes\n"
      "  {:<88} {:>7}  {:>8}  {:>4}  {:>10}\n",
      kCommandRepeat, kPasses, "", "hot key", "10k keys", "ours", "Redisson's");
  for (std::size_t p = 0; p < kCommandProbes.size(); ++p) {
    const CommandProbe& c = kCommandProbes[p];
    auto value = [p](std::size_t w) {
      if (p > 0) return commandCost(p, w);
      double sum = 0;
      for (const PhaseResult& r : gCommandCost[0][w]) sum += r.valid ? r.cost.usecPerCall : NAN;
      return sum / kPasses;
    };
    out += fmt::format("  {:<88} {:>7}  {:>8}  {:>4}  {:>10}\n", c.label, cell(value(0), 2), cell(value(1), 2),
                       c.oursCalls, c.redissonCalls);
  }
  for (const auto& [what, calls] :
       {std::pair<const char*, int CommandProbe::*>{"ours", &CommandProbe::oursCalls},
        std::pair<const char*, int CommandProbe::*>{"Redisson's", &CommandProbe::redissonCalls}}) {
    out += fmt::format("  {:<88} {:>7}  {:>8}\n", fmt::format("the commands of {} grant, summed", what),
                       cell(commandSum(0, calls), 2), cell(commandSum(1, calls), 2));
  }

  out += fmt::format(
      "\nRedis Functions against EVALSHA, {} passes (FCALL of a library loaded once, its helpers made at FUNCTION\n"
      "LOAD; the same keys and arguments): median (min) of the passes     server us/call     server CPU us/dec"
      "   FCALL/EVALSHA, medians: us, CPU\n",
      kFunctionPasses);
  // The median and the minimum of one figure over the passes; NaN if a pass is missing.
  auto spread = [](const std::array<PhaseResult, kFunctionPasses>& passes, double rb::ServerCost::*figure) {
    std::vector<double> v;
    for (const PhaseResult& r : passes) v.push_back(r.valid ? r.cost.*figure : NAN);
    if (std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
      return std::pair<double, double>{NAN, NAN};
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return std::pair<double, double>{n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front()};
  };
  for (std::size_t c = 0; c < kFunctionCases; ++c) {
    for (std::size_t w = 0; w < kFunctionWorkloadCount; ++w) {
      std::pair<double, double> us[2], cpu[2];
      for (std::size_t v = 0; v < 2; ++v) {
        us[v] = spread(gFunctionCost[c][v][w], &rb::ServerCost::usecPerCall);
        cpu[v] = spread(gFunctionCost[c][v][w], &rb::ServerCost::cpuUsPerCall);
      }
      for (std::size_t v = 0; v < 2; ++v) {
        out += fmt::format(
            "  {:<78} {:>7} ({:>5})  {:>9} ({:>5})  {}\n",
            fmt::format("{}, {}", gFunctionVariants[c][v].label, kWorkloadSpecs[kFunctionWorkloads[w]].label),
            cell(us[v].first, 2), cell(us[v].second, 2), cell(cpu[v].first, 2), cell(cpu[v].second, 2),
            v == 0 ? std::string()
                   : fmt::format("{}, {}", cell(us[1].first / us[0].first, 2), cell(cpu[1].first / cpu[0].first, 2)));
      }
    }
  }
  out += "\nBytes per key (MEMORY USAGE key SAMPLES 0, after one decision)                ours   textbook\n";
  for (const MemoryRow& m : gMemory) {
    out += fmt::format("  {:<74} {:>6}   {:>8}{}\n", m.what, m.ours,
                       m.textbook < 0 ? std::string("-") : std::to_string(m.textbook),
                       m.note.empty() ? std::string() : "   " + m.note);
  }
  out +=
      fmt::format("  name: \"{}\" ({} bytes); the textbook fixed window's key is the counter of the current window\n",
                  kMemoryName, std::strlen(kMemoryName));

  out += fmt::format(
      "\nAccuracy: {} Clients x {} threads calling decide(1) for {} ms on one limiter; grants by their server\n"
      "time (Decision::time, us), checked exactly over every pair of grants\n",
      kClients, kThreadsPerClient, kAccuracyRun.count());
  for (const AccuracyRow& r : gAccuracy) {
    out += fmt::format("  {}\n    {} attempts, {} granted, {} failed; bound {}; {}: {}\n", r.title, r.attempts,
                       r.grants, r.errors, r.boundText, r.met ? "met" : "ABOVE THE BOUND", r.observedText);
  }
  out += "  picture: accuracy_algorithms.svg\n";

  out += fmt::format(
      "\nWorst case on a random workload: bursts of 1..10 calls at random times, offered at about twice the limit\n"
      "of {} per {} ms for {} windows, the same calls at the same instants (the time in the call) for each\n",
      kRandomLimit, kRandomWindowMs, kRandomWindows);
  for (const RandomRow& r : gRandom) {
    out +=
        fmt::format("  {:<48} offered {:>6}, granted {:>6}; most in any {} ms: {:>4} ({:.2f} x limit; bound {}: {})\n",
                    r.title, r.offered, r.grants, kRandomWindowMs, r.most,
                    static_cast<double>(r.most) / static_cast<double>(kRandomLimit), r.boundText, r.bound);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    World world;
    world.pinned = rb::startPinnedServer({}, kServerCpu, kClientCpu);
    gWorld = &world;
    const rb::BenchServer& server = *world.pinned.server;
    world.admin = std::make_unique<rb::RawRedis>(server.host(), server.port());
    world.machine = rb::machineDescription(server.version());
    redlimit::ClientOptions options;
    options.connection.host = server.host();
    options.connection.port = server.port();
    options.connection.commandTimeout = std::chrono::seconds(10);  // a loaded machine: latency, not errors
    world.client = redlimit::Client::create(options);
    for (const auto& script :
         {redlimit::detail::lua::gcra, redlimit::detail::lua::fixed_window, redlimit::detail::lua::sliding_window,
          redlimit::detail::lua::acquire, redlimit::detail::lua::available_permits, redlimit::detail::lua::release,
          redlimit::detail::lua::concurrency}) {
      if (loadScript(script.source) != script.sha1)
        throw std::runtime_error("bench: SCRIPT LOAD returned another SHA1");
    }
    world.load = std::make_unique<rb::PipelinedLoad>(server.host(), server.port(), kConnections, kDepth);
    std::vector<Algorithm> algs = algorithms();
    gAlgorithms = &algs;
    gCost.resize(algs.size());
    makeProbes();
    makeCommandProbes();
    makeFunctionVariants();
    const std::string checked = checkArgvAgainstLibrary();
    std::cout << "CPU placement: " << world.pinned.placement << "\nargv checked against the library: " << checked
              << '\n'
              << std::flush;

    registerBenchmarks();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();

    const std::string dir = rb::resultsDir();
    if (!gEnvelopes.empty()) {
      std::ofstream(dir + "/accuracy_algorithms.svg")
          << rb::renderEnvelopeSvg("redlimit accuracy: the O(1) limiters against their bounds", gEnvelopes);
    }
    const std::string text = summary(checked);
    std::cout << '\n' << text << std::flush;
    std::ofstream(dir + "/bench_algorithms.summary.txt") << text;
    gAlgorithms = nullptr;
    gWorld = nullptr;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_algorithms: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_algorithms", e.what());
  return 1;
}
