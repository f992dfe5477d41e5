// Fault injection against a real redis-server: crashes, lost scripts, killed connections, a
// stalled server, bad credentials, a full server, a corrupted config. Each test prints a
// "FAULT ..." line with what it measured (the README's reliability table comes from these).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kConnectTimeout{200};
constexpr milliseconds kCommandTimeout{200};
constexpr milliseconds kProbe{100};
// A call may take connect + command timeout; the slack is for a loaded 2-core machine.
constexpr milliseconds kCallBound = kConnectTimeout + kCommandTimeout;
constexpr milliseconds kCallSlack{500};

ClientOptions faultClientOptions(const std::string& uri, std::size_t poolSize) {
  ClientOptions o;
  o.connection = parseUri(uri);
  o.connection.connectTimeout = kConnectTimeout;
  o.connection.commandTimeout = kCommandTimeout;
  o.pool.size = poolSize;
  return o;
}

std::int64_t msBetween(Clock::time_point origin, Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(t - origin).count();
}

enum class CallOutcome { Granted, Denied, IoFailure, OtherFailure };

struct Call {
  Clock::time_point start, end;
  CallOutcome outcome;
};

// Runs `threads` threads calling limiter.tryAcquire() until `stop`; records every call.
class Load {
 public:
  Load(RateLimiter& limiter, int threads) {
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this, &limiter] {
        std::vector<Call> mine;
        while (!stop_.load()) {
          Call c;
          c.start = Clock::now();
          try {
            c.outcome = limiter.tryAcquire() ? CallOutcome::Granted : CallOutcome::Denied;
          } catch (const IoError& e) {
            c.outcome = CallOutcome::IoFailure;
            if (std::getenv("REDLIMIT_TEST_VERBOSE")) std::fprintf(stderr, "io error: %s\n", e.what());
          } catch (const Error& e) {
            c.outcome = CallOutcome::OtherFailure;
            std::fprintf(stderr, "unexpected error: %s\n", e.what());
          }
          c.end = Clock::now();
          mine.push_back(c);
          std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
        std::lock_guard<std::mutex> lock(mutex_);
        calls_.insert(calls_.end(), mine.begin(), mine.end());
      });
    }
  }
  ~Load() { stop(); }
  const std::vector<Call>& stop() {
    stop_.store(true);
    for (auto& w : workers_) {
      if (w.joinable()) w.join();
    }
    return calls_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::vector<Call> calls_;
};

struct PolicyEvents {
  std::mutex mutex;
  std::vector<std::pair<HealthEvent::Kind, Clock::time_point>> seen;
  std::string log;  // the events with their errors, for failure messages
  FailureOptions options(FailurePolicy policy, double share = 1.0) {
    FailureOptions f;
    f.policy = policy;
    f.localShare = share;
    f.probeInterval = kProbe;
    f.onHealthChange = [this](const HealthEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.emplace_back(e.kind, Clock::now());
      log += (e.kind == HealthEvent::Kind::Degraded ? "Degraded: " + e.error : std::string("Recovered")) + "\n";
    };
    return f;
  }
};

}  // namespace

// --- SIGKILL during load, restart a second later on the same port --------------------------

class ServerCrash : public ::testing::TestWithParam<FailurePolicy> {};

TEST_P(ServerCrash, EveryCallAnsweredPerPolicyAndRecoveryWithinOneSecond) {
  const FailurePolicy policy = GetParam();
  // AOF so the limiter's configuration survives the crash, as it would on a real deployment.
  // (everysec: an acknowledged write is in the file before the reply, which is all a SIGKILL
  // needs; "always" adds an fsync per write and stalls a loaded machine.)
  RedisServer server({"--appendonly", "yes", "--appendfsync", "everysec"});
  auto client = Client::create(faultClientOptions(server.uri(), 8));
  PolicyEvents events;
  RateLimiter::Options lo;
  lo.failure = events.options(policy, 0.5);
  RateLimiter limiter(client, "crash", lo);
  // Local is checked against a saturated limiter; the others against one that always grants.
  const bool saturated = policy == FailurePolicy::Local;
  const std::int64_t rate = saturated ? 100 : 1000000;
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, rate, milliseconds(1000)));

  const auto origin = Clock::now();
  Load load(limiter, 8);
  sleepMs(400);
  const auto killedAt = Clock::now();
  server.kill();
  sleepMs(1000);
  const auto restartAt = Clock::now();
  server.restart();
  const auto restartedAt = Clock::now();
  sleepMs(1200);
  const std::vector<Call>& calls = load.stop();

  ASSERT_FALSE(calls.empty());
  std::int64_t maxCall = 0;
  int outageCalls = 0, outageGranted = 0, outageDenied = 0, outageFailed = 0, other = 0;
  int afterCalls = 0, afterFailed = 0;
  std::vector<std::pair<HealthEvent::Kind, Clock::time_point>> seen;
  {
    std::lock_guard<std::mutex> lock(events.mutex);
    seen = events.seen;
  }
  // One Degraded and one Recovered per outage, never one per call. The crash is one outage; a
  // restarted server on a loaded 2-core machine can stall past the command timeout once more
  // (it rebuilds its AOF), which is a second, real outage and is reported as one.
  ASSERT_GE(seen.size(), 2u) << events.log;
  ASSERT_LE(seen.size(), 4u) << "events must come per outage, not per call:\n" << events.log;
  ASSERT_EQ(seen.size() % 2, 0u) << "the limiter must end recovered:\n" << events.log;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, i % 2 == 0 ? HealthEvent::Kind::Degraded : HealthEvent::Kind::Recovered) << events.log;
  }
  const auto firstRecoveredAt = seen[1].second;
  const auto recoveredAt = seen.back().second;
  for (const Call& c : calls) {
    maxCall = std::max<std::int64_t>(maxCall, msBetween(c.start, c.end));
    if (c.outcome == CallOutcome::OtherFailure) ++other;
    // Calls that began after the crash and ended before the restart began.
    if (c.start > killedAt + milliseconds(50) && c.end < restartAt) {
      ++outageCalls;
      outageGranted += c.outcome == CallOutcome::Granted;
      outageDenied += c.outcome == CallOutcome::Denied;
      outageFailed += c.outcome == CallOutcome::IoFailure;
    }
    if (c.start > recoveredAt + milliseconds(20)) {
      ++afterCalls;
      afterFailed += c.outcome == CallOutcome::IoFailure || c.outcome == CallOutcome::OtherFailure;
    }
  }
  const auto recoveryMs = msBetween(restartedAt, firstRecoveredAt);
  if (seen.size() > 2) std::printf("FAULT sigkill second outage after the restart:\n%s", events.log.c_str());
  std::printf(
      "FAULT sigkill policy=%s calls=%zu outage_calls=%d granted=%d denied=%d errors=%d "
      "max_call_ms=%lld recovery_after_restart_ms=%lld\n",
      failurePolicyName(policy), calls.size(), outageCalls, outageGranted, outageDenied, outageFailed,
      static_cast<long long>(maxCall), static_cast<long long>(recoveryMs));

  EXPECT_EQ(other, 0);
  EXPECT_LE(maxCall, (kCallBound + kCallSlack).count());
  EXPECT_GT(outageCalls, 50);
  EXPECT_LE(recoveryMs, 1000);
  EXPECT_GT(afterCalls, 0);
  EXPECT_EQ(afterFailed, 0);
  const FailureStats stats = limiter.failureStats();
  EXPECT_EQ(stats.outages, seen.size() / 2);
  EXPECT_FALSE(stats.degraded);
  switch (policy) {
    case FailurePolicy::Throw:
      EXPECT_EQ(outageFailed, outageCalls);
      EXPECT_GE(stats.thrown, static_cast<std::uint64_t>(outageFailed));
      EXPECT_EQ(stats.allowed + stats.denied, 0u);
      break;
    case FailurePolicy::Allow:
      EXPECT_EQ(outageGranted, outageCalls);
      EXPECT_GE(stats.allowed, static_cast<std::uint64_t>(outageGranted));
      EXPECT_EQ(stats.thrown + stats.denied, 0u);
      break;
    case FailurePolicy::Deny:
      EXPECT_EQ(outageDenied, outageCalls);
      EXPECT_GE(stats.denied, static_cast<std::uint64_t>(outageDenied));
      EXPECT_EQ(stats.thrown + stats.allowed, 0u);
      break;
    case FailurePolicy::Local: {
      EXPECT_EQ(outageFailed, 0);
      EXPECT_EQ(outageGranted + outageDenied, outageCalls);
      // rate 100 per 1 s at share 0.5: a bucket of 50, refilled at 50 per second.
      const double outageSeconds = static_cast<double>(msBetween(killedAt, restartAt)) / 1000.0;
      EXPECT_GT(outageGranted, 0);
      EXPECT_LE(outageGranted, static_cast<int>(50 + 50 * outageSeconds) + 1);
      EXPECT_GT(outageDenied, 0);
      EXPECT_EQ(stats.thrown, 0u);
      break;
    }
  }
  (void)origin;
}

INSTANTIATE_TEST_SUITE_P(Policies, ServerCrash,
                         ::testing::Values(FailurePolicy::Throw, FailurePolicy::Allow, FailurePolicy::Deny,
                                           FailurePolicy::Local),
                         [](const ::testing::TestParamInfo<FailurePolicy>& param) {
                           std::string n = failurePolicyName(param.param);
                           n[0] = static_cast<char>(std::toupper(n[0]));
                           return n;
                         });

// --- Faults on a live server ----------------------------------------------------------------

class Faults : public RedisTest {};

TEST_F(Faults, ScriptFlushDuringLoadReachesNoCaller) {
  auto client = Client::create(faultClientOptions(server().uri(), 4));
  RateLimiter limiter(client, name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 100, milliseconds(10000)));
  std::atomic<bool> stop{false};
  std::atomic<int> flushes{0};
  std::thread flusher([&] {
    while (!stop.load()) {
      (void)raw({"SCRIPT", "FLUSH"});
      ++flushes;
      sleepMs(2);
    }
  });
  Load load(limiter, 4);
  // The load runs until the scripts have been flushed 60 times and the 100 permits are taken,
  // however long that takes on this machine.
  const std::string permits = suffixName(name(), "permits");
  const auto giveUp = Clock::now() + std::chrono::seconds(120);  // a bound for a broken build, not a timing
  while ((flushes.load() < 60 || raw({"ZCARD", permits}).asInteger() < 100) && Clock::now() < giveUp) sleepMs(5);
  const std::vector<Call>& calls = load.stop();
  stop.store(true);
  flusher.join();
  int granted = 0, failed = 0;
  for (const Call& c : calls) {
    granted += c.outcome == CallOutcome::Granted;
    failed += c.outcome == CallOutcome::IoFailure || c.outcome == CallOutcome::OtherFailure;
  }
  std::printf("FAULT script-flush flushes=%d calls=%zu granted=%d errors=%d loads=%lld\n", flushes.load(), calls.size(),
              granted, failed, static_cast<long long>(commandCalls(admin(), "script|load")));
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(granted, 100);
  EXPECT_GT(commandCalls(admin(), "script|load"), 1);
  EXPECT_EQ(raw({"ZCARD", permits}).asInteger(), 100);
}

TEST_F(Faults, ClientKillDuringLoadNeverCountsAGrantTwice) {
  auto client = Client::create(faultClientOptions(server().uri(), 4));
  RateLimiter::Options o;
  o.denyCacheKeys = 0;  // the load keeps calling Redis after the rate is used up, under the kills
  RateLimiter limiter(client, name(), o);
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 300, milliseconds(10000)));
  std::atomic<bool> stop{false};
  int kills = 0;
  std::thread killer([&] {
    while (!stop.load()) {
      kills += static_cast<int>(raw({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}).asInteger() > 0);
      sleepMs(10);
    }
  });
  Load load(limiter, 4);
  sleepMs(1000);
  const std::vector<Call>& calls = load.stop();
  stop.store(true);
  killer.join();
  int granted = 0, ioFailed = 0, other = 0;
  for (const Call& c : calls) {
    granted += c.outcome == CallOutcome::Granted;
    ioFailed += c.outcome == CallOutcome::IoFailure;
    other += c.outcome == CallOutcome::OtherFailure;
  }
  const std::int64_t members = raw({"ZCARD", suffixName(name(), "permits")}).asInteger();
  const std::int64_t value = raw({"GET", suffixName(name(), "value")}).asInteger();
  std::printf("FAULT client-kill kills=%d calls=%zu granted=%d io_errors=%d members=%lld value=%lld discarded=%llu\n",
              kills, calls.size(), granted, ioFailed, static_cast<long long>(members), static_cast<long long>(value),
              static_cast<unsigned long long>(client->poolStats().discarded));
  EXPECT_GT(kills, 10);
  EXPECT_GT(client->poolStats().discarded, 0u);
  EXPECT_EQ(other, 0);
  // Every grant the callers saw is exactly one member, and the layout's invariant holds: a resend
  // that had been granted before was not granted again. A call that ended in an IoError after its
  // connection was killed under it three times (every try is resent with the same id) may have
  // been granted by one of those tries, never twice: at most one member each.
  EXPECT_GE(members, granted);
  EXPECT_LE(members, granted + ioFailed);
  EXPECT_EQ(value + members, 300);
  // Retried on a fresh connection: most killed connections never reach the caller. (A retry that
  // is killed too degrades the limiter for a probe interval, so under heavy machine load the
  // share of errors grows; the bound is loose on purpose.)
  EXPECT_LT(ioFailed, static_cast<int>(calls.size()) / 2);
}

TEST_F(Faults, StalledServerTimesOutWithinCommandTimeoutAndRecovers) {
  auto client = Client::create(faultClientOptions(server().uri(), 4));
  PolicyEvents events;
  RateLimiter::Options lo;
  lo.failure = events.options(FailurePolicy::Throw);
  RateLimiter limiter(client, name(), lo);
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 1000000, milliseconds(1000)));
  ASSERT_TRUE(limiter.tryAcquire());
  ClientOptions sleeperOptions;
  sleeperOptions.connection = parseUri(server().uri());
  sleeperOptions.connection.commandTimeout = milliseconds(3000);
  auto sleeper = Client::create(sleeperOptions);
  std::thread stall([&] { (void)detail::command(*sleeper, {"DEBUG", "SLEEP", "0.5"}); });
  sleepMs(50);
  const auto start = Clock::now();
  EXPECT_THROW((void)limiter.tryAcquire(), TimeoutError);
  const auto took = msBetween(start, Clock::now());
  stall.join();
  const auto stallEnded = Clock::now();
  // The next probe reaches the server again.
  bool ok = false;
  while (!ok && Clock::now() - stallEnded < milliseconds(1000)) {
    try {
      ok = limiter.tryAcquire();
    } catch (const IoError&) {
      sleepMs(10);
    }
  }
  const auto recovery = msBetween(stallEnded, Clock::now());
  std::printf("FAULT debug-sleep timeout_after_ms=%lld recovery_after_stall_ms=%lld\n", static_cast<long long>(took),
              static_cast<long long>(recovery));
  EXPECT_GE(took, kCommandTimeout.count() - 20);
  EXPECT_LE(took, (kCommandTimeout + kCallSlack).count());
  EXPECT_TRUE(ok);
  EXPECT_LE(recovery, 1000);
  EXPECT_EQ(limiter.failureStats().outages, 1u);
}

TEST_F(Faults, WrongPasswordIsAnAuthErrorAtOnceUnderEveryPolicy) {
  RedisServer secured({"--requirepass", "right"});
  for (FailurePolicy policy : {FailurePolicy::Throw, FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Local}) {
    ClientOptions o = faultClientOptions(secured.uri(), 2);
    o.connection.password = "wrong";
    auto client = Client::create(o);
    RateLimiter::Options lo;
    lo.failure.policy = policy;
    RateLimiter limiter(client, "auth", lo);
    const auto start = Clock::now();
    EXPECT_THROW((void)limiter.tryAcquire(), AuthError) << failurePolicyName(policy);
    EXPECT_LE(msBetween(start, Clock::now()), kConnectTimeout.count()) << "no retry loop";
    EXPECT_EQ(limiter.failureStats().outages, 0u) << "bad credentials are not an outage";
  }
  ClientOptions o = faultClientOptions(secured.uri(), 1);
  o.connection.user = "nobody";
  o.connection.password = "right";
  auto client = Client::create(o);
  try {
    (void)detail::command(*client, {"PING"});
    FAIL() << "unknown ACL user accepted";
  } catch (const AuthError& e) {
    EXPECT_EQ(e.code(), "WRONGPASS");
    EXPECT_NE(std::string(e.what()).find("authentication failed"), std::string::npos);
  }
}

TEST_F(Faults, MaxmemoryNoevictionNamesTheCauseAndWritesNothing) {
  RateLimiter limiter(client(), name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 10, milliseconds(10000)));
  ASSERT_TRUE(limiter.tryAcquire(3));
  const std::string valueKey = suffixName(name(), "value"), permitsKey = suffixName(name(), "permits");
  const Reply before = raw({"ZRANGE", permitsKey, "0", "-1", "WITHSCORES"});
  (void)raw({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
  (void)raw({"CONFIG", "SET", "maxmemory", "1"});
  try {
    (void)limiter.tryAcquire(2);
    ADD_FAILURE() << "acquire succeeded over maxmemory";
  } catch (const ScriptError&) {
    ADD_FAILURE() << "out of memory must not look like a script bug";
  } catch (const ReplyError& e) {
    EXPECT_EQ(e.code(), "OOM");
    EXPECT_NE(std::string(e.what()).find("maxmemory"), std::string::npos);
  }
  (void)raw({"CONFIG", "SET", "maxmemory", "0"});
  EXPECT_EQ(raw({"GET", valueKey}).str, "7");
  const Reply after = raw({"ZRANGE", permitsKey, "0", "-1", "WITHSCORES"});
  ASSERT_EQ(after.elements.size(), before.elements.size());
  for (std::size_t i = 0; i < after.elements.size(); ++i) EXPECT_EQ(after.elements[i].str, before.elements[i].str);
  EXPECT_TRUE(limiter.tryAcquire(2));
  EXPECT_EQ(limiter.availablePermits(), 5);
}

TEST_F(Faults, CorruptedConfigIsATypedErrorAndWritesNothing) {
  RateLimiter limiter(client(), name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 10, milliseconds(10000)));
  ASSERT_TRUE(limiter.tryAcquire());
  (void)raw({"HSET", name(), "type", "x"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)limiter.tryAcquire(); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)limiter.getConfig(); }));
  (void)raw({"HSET", name(), "type", "0", "rate", "abc"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)limiter.tryAcquire(); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)limiter.availablePermits(); }));
  EXPECT_EQ(raw({"GET", suffixName(name(), "value")}).str, "9");
  EXPECT_EQ(raw({"ZCARD", suffixName(name(), "permits")}).asInteger(), 1);
}

TEST(SegmentFaults, SegmentedLimiterFollowsItsSourcesFailurePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(failurePolicyName(policy));
    RedisServer server;
    auto client = Client::create(faultClientOptions(server.uri(), 2));
    RateLimiter::Options lo;
    lo.failure.policy = policy;
    lo.failure.probeInterval = kProbe;
    auto source = std::make_shared<RateLimiter>(client, "segmented", lo);
    ASSERT_TRUE(source->trySetRate(RateType::Overall, 1000, milliseconds(200)));
    SegmentOptions so;
    so.segmentSize = 5;
    so.returnWhenIdle = false;
    SegmentedRateLimiter<> segmented(source, so);
    ASSERT_TRUE(segmented.tryAcquire());
    server.kill();
    sleepMs(250);  // the segment has expired: the next calls need Redis
    int granted = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 20; ++i) {
      const auto start = Clock::now();
      try {
        (segmented.tryAcquire() ? granted : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
      EXPECT_LE(msBetween(start, Clock::now()), (kCallBound + kCallSlack).count());
    }
    (void)segmented.close();
    EXPECT_EQ(granted, policy == FailurePolicy::Allow ? 20 : 0);
    EXPECT_EQ(denied, policy == FailurePolicy::Deny ? 20 : 0);
    EXPECT_EQ(thrown, policy == FailurePolicy::Throw ? 20 : 0);
    EXPECT_EQ(source->failureStats().outages, 1u);
  }
}
