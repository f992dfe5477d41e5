// DistributedSmoothRateLimiter against a real redis-server: the class over lua/smooth.lua (whose
// math and Guava's vectors are tested in smooth_script_test.cpp). Configuration, Guava's call
// semantics, setRate, refund, typed errors, bad input, memory, the failure policy, and warm-up
// shared by processes.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <memory>
#include <sstream>
#include <thread>

#include "one_key_support.hpp"
#include "redlimit/distributed_smooth_rate_limiter.hpp"
#include "redlimit/smooth_rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

using SmoothLimiter = DistributedSmoothRateLimiter;

class DistributedSmooth : public RedisTest {
 protected:
  Reply peekAt(const std::string& key, std::int64_t nowUs, std::int64_t permits) {
    return runOneKey(admin(), detail::lua::smooth, key, {"peek", std::to_string(nowUs), "S", std::to_string(permits)});
  }
};

TEST_F(DistributedSmooth, DecidesLikeGuava) {
  SmoothLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::bursty(5, milliseconds(1000))));
  const std::int64_t before = serverTimeUs(admin());
  const Decision first = rl.decide(3);
  EXPECT_TRUE(first.allowed) << "an idle limiter grants any request; the next caller pays";
  EXPECT_EQ(first.permits, 3);
  EXPECT_EQ(first.remaining, 0) << "a bursty limiter starts with nothing stored (Guava)";
  EXPECT_EQ(first.limit, 5);
  EXPECT_FALSE(first.byPolicy);
  EXPECT_GE(first.time.count(), before);
  // 3 permits at 200 ms (less what the idle time since trySetConfig stored): busy for up to
  // 600 ms, then 1 s to store 5 permits again.
  EXPECT_LE(first.resetAfter.count(), 600000 + 1000000);
  EXPECT_GT(first.resetAfter.count(), 500000 + 1000000);
  const Decision denied = rl.decide();
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.resetAfter.count() - denied.retryAfter.count(), 1000000);
  EXPECT_EQ(denied.time + denied.retryAfter, first.time + first.resetAfter - microseconds(1000000))
      << "retryAfter: exactly until the time the first decision left the limiter busy";
  EXPECT_FALSE(rl.peek().allowed);
  EXPECT_FALSE(rl.tryAcquire());
  // The exact retry time, asked at chosen server times.
  const std::int64_t at = denied.time.count() + denied.retryAfter.count();
  EXPECT_FALSE(takeReply(peekAt(name(), at - 1, 1)).allowed);
  EXPECT_TRUE(takeReply(peekAt(name(), at, 1)).allowed);
  EXPECT_EQ(takeReply(peekAt(name(), at + 400000, 1)).remaining, 2) << "400 ms idle stores 2 permits";
}

TEST_F(DistributedSmooth, AcquireReturnsTheWaitAndTryAcquireWaitsOnlyWhenItFits) {
  SmoothLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::bursty(20, milliseconds(1000), milliseconds(0))));  // 50 ms each
  EXPECT_EQ(rl.acquire().count(), 0);
  const std::int64_t t0 = serverTimeUs(admin());
  const microseconds waited = rl.acquire();
  EXPECT_GT(waited.count(), 0);
  EXPECT_LE(waited.count(), 50000);
  EXPECT_GE(serverTimeUs(admin()), t0 + waited.count());
  // Busy for about 50 ms now: a 1 ms timeout does not fit (false at once, nothing reserved).
  EXPECT_FALSE(rl.tryAcquire(1, milliseconds(1)));
  const Decision d = rl.peek();
  ASSERT_FALSE(d.allowed);
  EXPECT_GT(d.retryAfter.count(), 1000);
  EXPECT_TRUE(rl.tryAcquire(1, milliseconds(5000)));
  EXPECT_GE(serverTimeUs(admin()), d.time.count() + d.retryAfter.count()) << "slept the returned wait";
  EXPECT_FALSE(rl.tryAcquire(1, milliseconds(-5))) << "a negative timeout is one attempt";
  const Reservation r = rl.reserve(4, microseconds(10'000'000));
  EXPECT_TRUE(r.decision.allowed);
  EXPECT_GT(r.delay.count(), 0);
}

TEST_F(DistributedSmooth, ConfigurationIsWrittenOnlyWhenAbsentOrAsked) {
  SmoothLimiter rl(client(), name());
  const SmoothConfig bursty = SmoothConfig::bursty(5, milliseconds(1000), milliseconds(2000));
  const SmoothConfig warm = SmoothConfig::warmingUp(2, milliseconds(1000), milliseconds(4000), 3);
  EXPECT_FALSE(rl.isExists());
  ASSERT_TRUE(rl.trySetConfig(bursty));
  EXPECT_FALSE(rl.trySetConfig(warm)) << "a caller's configuration never overwrites the stored one";
  EXPECT_EQ(rl.getConfig(), bursty);
  rl.setConfig(warm);
  EXPECT_EQ(rl.getConfig(), warm);
  EXPECT_NE(rl.getConfig(), bursty);
  const Decision kept = rl.peek();
  EXPECT_EQ(kept.limit, 8) << "threshold 4 + 2W / (s (1 + c)) = 4";
  EXPECT_EQ(kept.remaining, 0) << "setConfig keeps the state: nothing was stored, so it is warm, not cold";
  rl.setConfig(warm);
  EXPECT_EQ(rl.peek().remaining, 0) << "the same configuration again changes nothing";
  ASSERT_TRUE(rl.deleteLimiter());
  ASSERT_TRUE(rl.trySetConfig(warm));
  EXPECT_EQ(rl.peek().remaining, 8) << "a warming-up limiter starts cold";
  SmoothLimiter other(newClient(), name());
  EXPECT_EQ(other.getConfig(), warm);
  EXPECT_TRUE(rl.deleteLimiter());
  EXPECT_FALSE(rl.deleteLimiter());
  EXPECT_THROW((void)rl.decide(), NotInitializedError);
}

TEST_F(DistributedSmooth, ConfigRaceBetweenTwoWritersLeavesExactlyOne) {
  auto c1 = newClient();
  auto c2 = newClient();
  const SmoothConfig a = SmoothConfig::bursty(7, milliseconds(1000));
  const SmoothConfig b = SmoothConfig::warmingUp(11, milliseconds(1000), milliseconds(3000), 4);
  for (int round = 0; round < 25; ++round) {
    const std::string n = name("race" + std::to_string(round));
    SmoothLimiter l1(c1, n), l2(c2, n);
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    auto f1 = std::async(std::launch::async, [&] {
      start.wait();
      return l1.trySetConfig(a);
    });
    auto f2 = std::async(std::launch::async, [&] {
      start.wait();
      return l2.trySetConfig(b);
    });
    go.set_value();
    const bool won1 = f1.get(), won2 = f2.get();
    ASSERT_NE(won1, won2) << "exactly one writer wins, round " << round;
    EXPECT_EQ(l1.getConfig(), won1 ? a : b);
    EXPECT_EQ(l2.getConfig(), l1.getConfig());
  }
}

TEST_F(DistributedSmooth, SetRateKeepsTheStateAndScalesStoredPermits) {
  SmoothLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::warmingUp(2, milliseconds(1000), milliseconds(4000))));
  rl.setRate(4, milliseconds(1000));
  EXPECT_EQ(rl.getConfig(), SmoothConfig::warmingUp(4, milliseconds(1000), milliseconds(4000)));
  const Decision d = rl.peek();
  EXPECT_EQ(d.limit, 16) << "the maximum moves with the rate";
  EXPECT_EQ(d.remaining, 16) << "still cold: stored x 16 / 8";
  // A debt is kept across a rate change.
  SmoothLimiter paced(client(), name("paced"));
  ASSERT_TRUE(paced.trySetConfig(SmoothConfig::bursty(1, milliseconds(1000), milliseconds(0))));
  ASSERT_TRUE(paced.tryAcquire(3));
  paced.setRate(1000, milliseconds(1000));
  const Decision owed = paced.peek();
  EXPECT_FALSE(owed.allowed);
  EXPECT_GT(owed.retryAfter.count(), 2'000'000) << "the 3 s debt at the old rate stays";
  EXPECT_THROW(paced.setRate(0, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW(paced.setRate(1, milliseconds(0)), InvalidArgument);
  SmoothLimiter missing(client(), name("missing"));
  EXPECT_THROW(missing.setRate(1, milliseconds(1000)), NotInitializedError);
}

TEST_F(DistributedSmooth, RefundGivesTimeBackAndStoresNoMoreThanTheMaximum) {
  SmoothLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::bursty(1, milliseconds(10000), milliseconds(30000))));  // 10 s each, 3 max
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_FALSE(rl.tryAcquire());
  rl.refund(1);
  EXPECT_TRUE(rl.tryAcquire()) << "the debt of the refunded permit is gone";
  rl.refund(0);
  rl.refund(SmoothLimiter::kMaxPermits / 100000);  // far more than the debt: the rest is stored, up to 3
  EXPECT_EQ(rl.peek().remaining, 3);
  EXPECT_TRUE(rl.tryAcquire(4)) << "3 stored and 1 the next caller pays for";
  EXPECT_FALSE(rl.tryAcquire());
}

TEST_F(DistributedSmooth, AsyncFormsDecideLikeTheSyncOnes) {
  SmoothLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::bursty(1, milliseconds(10000))));
  const Decision first = rl.decideAsync(1).get();
  EXPECT_TRUE(first.allowed);
  EXPECT_FALSE(rl.tryAcquireAsync(1).get());
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.decideAsync(2, [&](Decision d, const std::exception_ptr& error) { got.set_value({d, error}); });
  const auto [denied, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_THROW((void)rl.decideAsync(0).get(), InvalidArgument);
  rl.refund(1);
  std::vector<std::future<bool>> many;
  for (int i = 0; i < 50; ++i) many.push_back(rl.tryAcquireAsync(1));
  int granted = 0;
  for (auto& f : many) granted += f.get() ? 1 : 0;
  EXPECT_EQ(granted, 1);
}

TEST_F(DistributedSmooth, WrongTypeOrKindOrCorruptContentsAreTypedErrorsAndNothingIsWritten) {
  SmoothLimiter rl(client(), name());
  (void)raw({"HSET", name(), "rate", "10"});
  const std::string before = keyState(admin(), name());
  const SmoothConfig c = SmoothConfig::bursty(5, milliseconds(1000));
  auto expectConfigError = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " succeeded";
    } catch (const InvalidConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
    }
  };
  expectConfigError([&] { (void)rl.decide(); }, "decide");
  expectConfigError([&] { (void)rl.peek(); }, "peek");
  expectConfigError([&] { (void)rl.trySetConfig(c); }, "trySetConfig");
  expectConfigError([&] { rl.setConfig(c); }, "setConfig");
  expectConfigError([&] { rl.setRate(1, milliseconds(1000)); }, "setRate");
  expectConfigError([&] { rl.refund(1); }, "refund");
  EXPECT_EQ(keyState(admin(), name()), before);
  // Another kind of one-key limiter, and a foreign string.
  (void)raw({"DEL", name()});
  GcraRateLimiter gcra(client(), name());
  ASSERT_TRUE(gcra.trySetConfig(GcraTraits::config(5, 5, milliseconds(1000))));
  const std::string gcraState = keyState(admin(), name());
  expectConfigError([&] { (void)rl.decide(); }, "decide on a GCRA key");
  expectConfigError([&] { rl.setConfig(c); }, "setConfig on a GCRA key");
  EXPECT_EQ(keyState(admin(), name()), gcraState);
  EXPECT_TRUE(rl.deleteLimiter());
  ASSERT_TRUE(rl.trySetConfig(c));
  EXPECT_THROW((void)gcra.decide(), InvalidConfigError) << "and the other way round";
  // Corrupt contents: a rate of 0 (configuration), a time past 2^52 (state).
  const std::string good = raw({"GET", name()}).str;
  ASSERT_EQ(good.size(), 28u);
  std::string bad = good;
  for (int i = 1; i < 5; ++i) bad[static_cast<std::size_t>(i)] = '\0';
  (void)detail::command(admin(), {"SET", name(), bad});
  EXPECT_THROW((void)rl.decide(), InvalidConfigError);
  EXPECT_THROW((void)rl.getConfig(), InvalidConfigError);
  bad = good;
  for (int i = 21; i < 28; ++i) bad[static_cast<std::size_t>(i)] = '\xFF';
  (void)detail::command(admin(), {"SET", name(), bad});
  EXPECT_THROW((void)rl.decide(), InvalidStateError);
  EXPECT_THROW(rl.refund(1), InvalidStateError);
  EXPECT_EQ(raw({"GET", name()}).str, bad) << "nothing written";
  rl.setConfig(c);  // setConfig repairs a limiter of its own kind
  EXPECT_TRUE(rl.tryAcquire());
}

TEST_F(DistributedSmooth, InvalidArgumentsAreRefusedBeforeAnythingIsSent) {
  SmoothLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::bursty(5, milliseconds(1000))));
  const std::int64_t calls = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  const SmoothConfig bad[] = {
      SmoothConfig::bursty(0, milliseconds(1000)),
      SmoothConfig::bursty(SmoothLimiter::kMaxPermits + 1, milliseconds(1000)),
      SmoothConfig::bursty(5, milliseconds(0)),
      SmoothConfig::bursty(5, SmoothLimiter::kMaxInterval + milliseconds(1)),
      SmoothConfig::bursty(5, milliseconds(1000), milliseconds(-1)),
      SmoothConfig::bursty(1'000'003, milliseconds(1), SmoothLimiter::kMaxInterval),  // maxBurst x P' > 2^52
      SmoothConfig::warmingUp(5, milliseconds(1000), milliseconds(-1)),
      SmoothConfig::warmingUp(5, milliseconds(1000), milliseconds(4000), 0),
      SmoothConfig::warmingUp(5, milliseconds(1000), milliseconds(4000), SmoothLimiter::kMaxColdFactor + 1),
      SmoothConfig::warmingUp(999, milliseconds(1000), milliseconds(3'600'000)),  // too large to keep exact
  };
  for (const SmoothConfig& c : bad) {
    EXPECT_THROW((void)rl.trySetConfig(c), InvalidArgument) << c.permits;
    EXPECT_THROW(rl.setConfig(c), InvalidArgument) << c.permits;
  }
  EXPECT_THROW((void)rl.decide(0), InvalidArgument);
  EXPECT_THROW((void)rl.decide(-1), InvalidArgument);
  EXPECT_THROW((void)rl.tryAcquire(SmoothLimiter::kMaxPermits + 1), InvalidArgument);
  EXPECT_THROW((void)rl.tryAcquire(0, milliseconds(10)), InvalidArgument);
  EXPECT_THROW((void)rl.acquire(0), InvalidArgument);
  EXPECT_THROW((void)rl.peek(0), InvalidArgument);
  EXPECT_THROW(rl.refund(-1), InvalidArgument);
  EXPECT_THROW((void)rl.reserve(1, microseconds(-1)), InvalidArgument);
  EXPECT_THROW(rl.setRate(0, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW(rl.setRate(5, milliseconds(0)), InvalidArgument);
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"), calls) << "nothing sent";
  // The bounds the client checks are the script's: the largest exact ones are accepted.
  EXPECT_NO_THROW(rl.setConfig(SmoothConfig::warmingUp(999, milliseconds(1000), milliseconds(70'000))));
  EXPECT_NO_THROW(rl.setConfig(SmoothConfig::bursty(1, milliseconds(1), SmoothLimiter::kMaxInterval)));
  EXPECT_THROW([&] { SmoothLimiter unnamed(client(), ""); }(), InvalidArgument);
  EXPECT_THROW([&] { SmoothLimiter clientless(nullptr, name()); }(), InvalidArgument);
}

TEST_F(DistributedSmooth, MemoryUsageIsAtMost100BytesPerKey) {
  const std::string key = "{o1:S123456}:m";  // a name of 14 bytes, as for the other one-key limiters
  ASSERT_EQ(key.size(), 14u);
  for (const SmoothConfig& c : {SmoothConfig::bursty(SmoothLimiter::kMaxPermits, milliseconds(1000)),
                                SmoothConfig::warmingUp(100, milliseconds(1000), milliseconds(60000), 10)}) {
    SmoothLimiter rl(client(), key);
    rl.setConfig(c);
    ASSERT_TRUE(rl.tryAcquire(123456));
    (void)rl.reserve(1000, microseconds(100'000'000));
    const std::int64_t bytes = raw({"MEMORY", "USAGE", key}).asInteger();
    std::printf("MEMORY smooth warmingUp=%d bytes=%lld\n", c.isWarmingUp() ? 1 : 0, static_cast<long long>(bytes));
    EXPECT_LE(bytes, 100);
    EXPECT_TRUE(rl.deleteLimiter());
  }
}

TEST_F(DistributedSmooth, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    DistributedSmoothRateLimiterOptions options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    SmoothLimiter rl(client, "policy", options);
    // 3 stored at most (3 s at 1/s): the Local policy's bucket is that burst + 1.
    ASSERT_TRUE(rl.trySetConfig(SmoothConfig::bursty(1, milliseconds(1000), milliseconds(3000))));
    ASSERT_TRUE(rl.decide().allowed);  // the limiter learns its limit
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const Decision d = rl.decide();
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.limit, 3);
        (d.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    switch (policy) {
      case FailurePolicy::Allow:
        EXPECT_EQ(allowed, 6);
        break;
      case FailurePolicy::Deny:
        EXPECT_EQ(denied, 6);
        break;
      case FailurePolicy::Throw:
        EXPECT_EQ(thrown, 6);
        break;
      case FailurePolicy::Local:
        EXPECT_EQ(allowed, 4) << "the local bucket: the burst and the one the next caller pays for";
        EXPECT_EQ(denied, 2);
        break;
    }
    if (policy == FailurePolicy::Allow) {
      EXPECT_TRUE(rl.decideAsync(1).get().byPolicy);
      EXPECT_TRUE(rl.tryAcquire(1, milliseconds(100)));
    }
    if (policy == FailurePolicy::Deny) {
      EXPECT_FALSE(rl.tryAcquireAsync(1).get());
      EXPECT_FALSE(rl.tryAcquire(1, milliseconds(100)));
    }
    EXPECT_THROW((void)rl.peek(), IoError);
    EXPECT_THROW(rl.refund(1), IoError);
    EXPECT_THROW(rl.setRate(2, milliseconds(1000)), IoError);
    EXPECT_TRUE(rl.failureStats().degraded);
  }
}

// Two processes share one warming-up limiter and warm it up together: each reserves (without
// sleeping) as fast as it can, so the limiter stays busy, and the grants of both, ordered by the
// time each may be used, must be exactly the waits of ONE local Guava limiter that served them all
// in that order. Then this process sees the warm state the workers left.
TEST_F(DistributedSmooth, WarmsUpAcrossProcesses) {
  const std::string n = name();
  SmoothLimiter rl(client(), n);
  // 100/s (s = 10 ms), warm-up 200 ms, cold factor 3: threshold 10, max 20 permits; exact doubles.
  ASSERT_TRUE(rl.trySetConfig(SmoothConfig::warmingUp(100, milliseconds(1000), milliseconds(200), 3)));
  struct Grant {
    std::int64_t useUs = 0, permits = 0;
    int worker = 0;
  };
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{REDLIMIT_ONE_KEY_WORKER, "smooth", server().uri(), n, "1", "300", "400000"}));
  }
  std::vector<Grant> grants;
  int perWorker[2] = {0, 0};
  for (int w = 0; w < 2; ++w) {
    std::string out;
    EXPECT_EQ(workers[static_cast<std::size_t>(w)]->wait(out), 0) << out;
    std::istringstream in(out);
    long long count = -1, errors = -1;
    in >> count >> errors;
    EXPECT_EQ(errors, 0);
    for (long long i = 0; i < count; ++i) {
      Grant g;
      g.worker = w;
      in >> g.useUs >> g.permits;
      grants.push_back(g);
      ++perWorker[w];
    }
  }
  ASSERT_GT(perWorker[0], 0);
  ASSERT_GT(perWorker[1], 0);
  std::sort(grants.begin(), grants.end(), [](const Grant& a, const Grant& b) { return a.useUs < b.useUs; });
  struct FixedClock {
    std::int64_t t;
    [[nodiscard]] microseconds now() const { return microseconds{t}; }
    void sleepFor(microseconds) const {}
  };
  const std::int64_t t0 = grants.front().useUs;  // the first reservation found the limiter cold and free
  auto model = BasicSmoothRateLimiter<FixedClock>::warmingUp(100.0, microseconds(200000), 3.0, FixedClock{t0});
  int switches = 0;
  for (std::size_t i = 0; i < grants.size(); ++i) {
    const std::int64_t expected = t0 + model.reserve(grants[i].permits).count();
    ASSERT_EQ(grants[i].useUs, expected) << "grant " << i << " of " << grants.size();
    if (i > 0 && grants[i].worker != grants[i - 1].worker) ++switches;
  }
  EXPECT_GT(switches, 0) << "the processes' reservations interleave";
  // The first permits cost the cold interval (30 ms less half a slope step); later ones 10 ms.
  ASSERT_GE(grants.size(), 15u);
  EXPECT_GT(grants[1].useUs - grants[0].useUs, 20000);
  // This process now finds the limiter warm: one more permit costs exactly the stable interval.
  const Reservation a = rl.reserve(1, microseconds(5'000'000));
  const Reservation b = rl.reserve(1, microseconds(5'000'000));
  ASSERT_TRUE(a.decision.allowed);
  ASSERT_TRUE(b.decision.allowed);
  EXPECT_EQ((b.decision.time + b.delay - a.decision.time - a.delay).count(), 10000);
  EXPECT_EQ(a.decision.remaining, 0) << "nothing stored: warm";
}

}  // namespace
