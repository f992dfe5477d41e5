// Limiter under the smooth policies (Policy::smoothBursty, smoothWarmingUp) against a real
// redis-server, over lua/smooth.lua (whose math and Guava's vectors are tested in
// smooth_script_test.cpp): a policy stored in the key, Guava's call semantics, refund, typed errors,
// bad input, memory, the failure policy, and warm-up shared by processes.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <memory>
#include <sstream>
#include <thread>

#include "one_key_support.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/smooth_rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

class LimiterSmooth : public RedisTest {
 protected:
  /// A Limiter named `suffix` whose `policy` is stored in its keys (trySetPolicy, setPolicy).
  Limiter storedLimiter(const Policy& policy, const std::string& suffix = "l") {
    return Limiter(client(), limiterName(suffix), policy.stored());
  }
  Reply peekAt(const std::string& key, std::int64_t nowUs, std::int64_t permits) {
    return runOneKey(admin(), detail::lua::smooth, key, {"peek", std::to_string(nowUs), "S", std::to_string(permits)});
  }
};

TEST_F(LimiterSmooth, DecidesLikeGuava) {
  Limiter rl = storedLimiter(Policy::smoothBursty(5, milliseconds(1000)));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const std::int64_t before = serverTimeUs(admin());
  const Decision first = rl.decide("k", 3);
  EXPECT_TRUE(first.allowed) << "an idle limiter grants any request; the next caller pays";
  EXPECT_EQ(first.permits, 3);
  EXPECT_EQ(first.remaining, 0) << "a bursty limiter starts with nothing stored (Guava)";
  EXPECT_EQ(first.limit, 5);
  EXPECT_FALSE(first.byPolicy);
  EXPECT_GE(first.time.count(), before);
  // 3 permits at 200 ms (less what the idle time since trySetPolicy stored): busy for up to
  // 600 ms, then 1 s to store 5 permits again.
  EXPECT_LE(first.resetAfter.count(), 600000 + 1000000);
  EXPECT_GT(first.resetAfter.count(), 500000 + 1000000);
  const Decision denied = rl.decide("k");
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.resetAfter.count() - denied.retryAfter.count(), 1000000);
  EXPECT_EQ(denied.time + denied.retryAfter, first.time + first.resetAfter - microseconds(1000000))
      << "retryAfter: exactly until the time the first decision left the limiter busy";
  EXPECT_FALSE(rl.peek("k").allowed);
  EXPECT_FALSE(rl.tryAcquire("k"));
  // The exact retry time, asked at chosen server times.
  const std::int64_t at = denied.time.count() + denied.retryAfter.count();
  EXPECT_FALSE(takeReply(peekAt(rl.redisKey("k"), at - 1, 1)).allowed);
  EXPECT_TRUE(takeReply(peekAt(rl.redisKey("k"), at, 1)).allowed);
  EXPECT_EQ(takeReply(peekAt(rl.redisKey("k"), at + 400000, 1)).remaining, 2) << "400 ms idle stores 2 permits";
}

TEST_F(LimiterSmooth, AcquireReturnsTheWaitAndTryAcquireWaitsOnlyWhenItFits) {
  Limiter rl = storedLimiter(Policy::smoothBursty(20, milliseconds(1000), milliseconds(0)));
  ASSERT_TRUE(rl.trySetPolicy("k"));  // 50 ms each
  EXPECT_EQ(rl.acquire("k").count(), 0);
  const std::int64_t t0 = serverTimeUs(admin());
  const microseconds waited = rl.acquire("k");
  EXPECT_GT(waited.count(), 0);
  EXPECT_LE(waited.count(), 50000);
  EXPECT_GE(serverTimeUs(admin()), t0 + waited.count());
  // Busy for about 50 ms now: a 1 ms timeout does not fit (false at once, nothing reserved).
  EXPECT_FALSE(rl.tryAcquire("k", 1, milliseconds(1)));
  const Decision d = rl.peek("k");
  ASSERT_FALSE(d.allowed);
  EXPECT_GT(d.retryAfter.count(), 1000);
  EXPECT_TRUE(rl.tryAcquire("k", 1, milliseconds(5000)));
  EXPECT_GE(serverTimeUs(admin()), d.time.count() + d.retryAfter.count()) << "slept the returned wait";
  EXPECT_FALSE(rl.tryAcquire("k", 1, milliseconds(-5))) << "a negative timeout is one attempt";
  const Decision r = rl.reserve("k", 4, microseconds(10'000'000));
  EXPECT_TRUE(r.allowed);
  EXPECT_GT(r.delay.count(), 0);
}

TEST_F(LimiterSmooth, APolicyIsStoredOnlyWhenAbsentOrAsked) {
  const Policy bursty = Policy::smoothBursty(5, milliseconds(1000), milliseconds(2000)).stored();
  const Policy warm = Policy::smoothWarmingUp(2, milliseconds(1000), milliseconds(4000), 3).stored();
  Limiter rl = storedLimiter(bursty);
  Limiter warmWriter(client(), rl.name(), warm);
  EXPECT_FALSE(rl.exists("k"));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  EXPECT_FALSE(warmWriter.trySetPolicy("k")) << "another writer's policy never overwrites the stored one";
  EXPECT_EQ(warmWriter.peek("k").limit, 10) << "the stored policy decides: 2 s of 5 per second";
  rl.setPolicy("k", warm);
  const Decision kept = rl.peek("k");
  EXPECT_EQ(kept.limit, 8) << "threshold 4 + 2W / (s (1 + c)) = 4";
  EXPECT_EQ(kept.remaining, 0) << "setPolicy keeps the state: nothing was stored, so it is warm, not cold";
  rl.setPolicy("k", warm);
  EXPECT_EQ(rl.peek("k").remaining, 0) << "the same policy again changes nothing";
  ASSERT_TRUE(rl.deleteKey("k"));
  ASSERT_TRUE(warmWriter.trySetPolicy("k"));
  EXPECT_EQ(rl.peek("k").remaining, 8) << "a warming-up limiter starts cold";
  Limiter other(newClient(), rl.name(), bursty);
  EXPECT_EQ(other.peek("k").limit, 8);
  EXPECT_TRUE(rl.deleteKey("k"));
  EXPECT_FALSE(rl.deleteKey("k"));
  EXPECT_THROW((void)rl.decide("k"), NotInitializedError);
}

TEST_F(LimiterSmooth, APolicyRaceBetweenTwoWritersLeavesExactlyOne) {
  expectOneStoredPolicyWriterWins(newClient(), newClient(), Policy::smoothBursty(7, milliseconds(1000)).stored(),
                                  Policy::smoothWarmingUp(11, milliseconds(1000), milliseconds(3000), 4).stored(),
                                  [&](int round) { return limiterName("race" + std::to_string(round)); });
}

TEST_F(LimiterSmooth, RefundGivesTimeBackAndStoresNoMoreThanTheMaximum) {
  Limiter rl = storedLimiter(Policy::smoothBursty(1, milliseconds(10000), milliseconds(30000)));
  ASSERT_TRUE(rl.trySetPolicy("k"));  // 10 s each, 3 max
  ASSERT_TRUE(rl.tryAcquire("k"));
  EXPECT_FALSE(rl.tryAcquire("k"));
  rl.refund("k", 1);
  EXPECT_TRUE(rl.tryAcquire("k")) << "the debt of the refunded permit is gone";
  rl.refund("k", 0);
  rl.refund("k", 4294967295 / 100000);  // far more than the debt: the rest is stored, up to 3
  EXPECT_EQ(rl.peek("k").remaining, 3);
  EXPECT_TRUE(rl.tryAcquire("k", 4)) << "3 stored and 1 the next caller pays for";
  EXPECT_FALSE(rl.tryAcquire("k"));
}

TEST_F(LimiterSmooth, AsyncFormsDecideLikeTheSyncOnes) {
  Limiter rl = storedLimiter(Policy::smoothBursty(1, milliseconds(10000)));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const Decision first = rl.decideAsync("k", 1).get();
  EXPECT_TRUE(first.allowed);
  EXPECT_FALSE(rl.decideAsync("k", 1).get().allowed);
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.decideAsync("k", 2, [&](Decision d, const std::exception_ptr& error) { got.set_value({d, error}); });
  const auto [denied, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_THROW((void)rl.decideAsync("k", 0).get(), InvalidArgument);
  rl.refund("k", 1);
  std::vector<std::future<Decision>> many;
  for (int i = 0; i < 50; ++i) many.push_back(rl.decideAsync("k", 1));
  int granted = 0;
  for (auto& f : many) granted += f.get().allowed ? 1 : 0;
  EXPECT_EQ(granted, 1);
}

TEST_F(LimiterSmooth, WrongTypeOrKindOrCorruptContentsAreTypedErrorsAndNothingIsWritten) {
  const Policy c = Policy::smoothBursty(5, milliseconds(1000)).stored();
  Limiter rl = storedLimiter(c);
  const std::string key = rl.redisKey("k");
  (void)raw({"HSET", key, "rate", "10"});
  const std::string before = keyState(admin(), key);
  auto expectConfigError = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " succeeded";
    } catch (const ScriptError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidConfig) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expectConfigError([&] { (void)rl.decide("k"); }, "decide");
  expectConfigError([&] { (void)rl.peek("k"); }, "peek");
  expectConfigError([&] { (void)rl.trySetPolicy("k"); }, "trySetPolicy");
  expectConfigError([&] { rl.setPolicy("k", c); }, "setPolicy");
  expectConfigError([&] { rl.refund("k", 1); }, "refund");
  EXPECT_EQ(keyState(admin(), key), before);
  // A key of another algorithm, and a foreign string.
  (void)raw({"DEL", key});
  Limiter gcra(client(), rl.name(), Policy::gcra(5, milliseconds(1000), 5).stored());
  ASSERT_TRUE(gcra.trySetPolicy("k"));
  const std::string gcraState = keyState(admin(), key);
  expectConfigError([&] { (void)rl.decide("k"); }, "decide on a GCRA key");
  expectConfigError([&] { rl.setPolicy("k", c); }, "setPolicy on a GCRA key");
  EXPECT_EQ(keyState(admin(), key), gcraState);
  EXPECT_TRUE(rl.deleteKey("k"));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)gcra.decide("k"); }))
      << "and the other way round";
  // Corrupt contents: a rate of 0 (configuration), a time past 2^52 (state).
  const std::string good = raw({"GET", key}).str;
  ASSERT_EQ(good.size(), 28u);
  std::string bad = good;
  for (int i = 1; i < 5; ++i) bad[static_cast<std::size_t>(i)] = '\0';
  (void)detail::command(admin(), {"SET", key, bad});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)rl.decide("k"); }));
  bad = good;
  for (int i = 21; i < 28; ++i) bad[static_cast<std::size_t>(i)] = '\xFF';
  (void)detail::command(admin(), {"SET", key, bad});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { (void)rl.decide("k"); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { rl.refund("k", 1); }));
  EXPECT_EQ(raw({"GET", key}).str, bad) << "nothing written";
  rl.setPolicy("k", c);  // setPolicy repairs a key of its own algorithm
  EXPECT_TRUE(rl.tryAcquire("k"));
}

TEST_F(LimiterSmooth, InvalidArgumentsAreRefusedBeforeAnythingIsSent) {
  Limiter rl = storedLimiter(Policy::smoothBursty(5, milliseconds(1000)));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const std::int64_t calls = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  const milliseconds longest(4294967295);
  EXPECT_THROW((void)Policy::smoothBursty(0, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(4294967296, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(5, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(5, longest + milliseconds(1)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(5, milliseconds(1000), milliseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(1'000'003, milliseconds(1), longest), InvalidArgument)
      << "maxBurst x P' > 2^52";
  EXPECT_THROW((void)Policy::smoothWarmingUp(5, milliseconds(1000), milliseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(5, milliseconds(1000), milliseconds(4000), 0), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(5, milliseconds(1000), milliseconds(4000), 128), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(999, milliseconds(1000), milliseconds(3'600'000)), InvalidArgument)
      << "too large to keep exact";
  EXPECT_THROW(rl.setPolicy("k", Policy::smoothBursty(5, milliseconds(1000))), InvalidArgument)
      << "not stored: it travels in the call";
  EXPECT_THROW(rl.setPolicy("k", Policy::gcra(5, milliseconds(1000), 5).stored()), InvalidArgument)
      << "another algorithm";
  EXPECT_THROW((void)rl.decide("k", 0), InvalidArgument);
  EXPECT_THROW((void)rl.decide("k", -1), InvalidArgument);
  EXPECT_THROW((void)rl.tryAcquire("k", 4294967296), InvalidArgument);
  EXPECT_THROW((void)rl.tryAcquire("k", 0, milliseconds(10)), InvalidArgument);
  EXPECT_THROW((void)rl.acquire("k", 0), InvalidArgument);
  EXPECT_THROW((void)rl.peek("k", 0), InvalidArgument);
  EXPECT_THROW(rl.refund("k", -1), InvalidArgument);
  EXPECT_THROW((void)rl.reserve("k", 1, microseconds(-1)), InvalidArgument);
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"), calls) << "nothing sent";
  // The bounds the client checks are the script's: the largest exact ones are accepted.
  EXPECT_NO_THROW(rl.setPolicy("k", Policy::smoothWarmingUp(999, milliseconds(1000), milliseconds(70'000)).stored()));
  EXPECT_NO_THROW(rl.setPolicy("k", Policy::smoothBursty(1, milliseconds(1), longest).stored()));
}

TEST_F(LimiterSmooth, MemoryUsageIsAtMost100BytesPerKey) {
  const std::string user = "{S123456}";  // rl:m:{S123456}, a key of 14 bytes, as for the other algorithms
  for (const Policy& c : {Policy::smoothBursty(4294967295, milliseconds(1000)),
                          Policy::smoothWarmingUp(100, milliseconds(1000), milliseconds(60000), 10)}) {
    Limiter rl(client(), "m", c.stored());
    ASSERT_EQ(rl.redisKey(user).size(), 14u);
    rl.setPolicy(user, c.stored());
    ASSERT_TRUE(rl.tryAcquire(user, 123456));
    (void)rl.reserve(user, 1000, microseconds(100'000'000));
    const std::int64_t bytes = raw({"MEMORY", "USAGE", rl.redisKey(user)}).asInteger();
    std::printf("MEMORY smooth limit=%lld bytes=%lld\n", static_cast<long long>(c.limit()),
                static_cast<long long>(bytes));
    EXPECT_LE(bytes, 100);
    EXPECT_TRUE(rl.deleteKey(user));
  }
}

TEST_F(LimiterSmooth, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    // 3 stored at most (3 s at 1/s): the Local policy's bucket is that burst + 1.
    Limiter rl(client, "policy", Policy::smoothBursty(1, milliseconds(1000), milliseconds(3000)).stored(), options);
    ASSERT_TRUE(rl.trySetPolicy("k"));
    ASSERT_TRUE(rl.decide("k").allowed);  // the limiter learns its limit
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const Decision d = rl.decide("k");
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.limit, 3);
        (d.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    // Local: its bucket grants the burst and the one the next caller pays for.
    expectDecidedByPolicy(policy, allowed, denied, thrown, 6, 4);
    if (policy == FailurePolicy::Allow) {
      EXPECT_TRUE(rl.decideAsync("k", 1).get().byPolicy);
      EXPECT_TRUE(rl.tryAcquire("k", 1, milliseconds(100)));
    }
    if (policy == FailurePolicy::Deny) {
      EXPECT_FALSE(rl.decideAsync("k", 1).get().allowed);
      EXPECT_FALSE(rl.tryAcquire("k", 1, milliseconds(100)));
    }
    EXPECT_THROW((void)rl.peek("k"), IoError);
    EXPECT_THROW(rl.refund("k", 1), IoError);
    EXPECT_THROW(rl.setPolicy("k", Policy::smoothBursty(2, milliseconds(1000)).stored()), IoError);
    EXPECT_TRUE(rl.failureStats().degraded);
  }
}

// Two processes share one warming-up limiter and warm it up together: each reserves (without
// sleeping) as fast as it can, so the limiter stays busy, and the grants of both, ordered by the
// time each may be used, must be exactly the waits of ONE local Guava limiter that served them all
// in that order. Then this process sees the warm state the workers left.
TEST_F(LimiterSmooth, WarmsUpAcrossProcesses) {
  Limiter rl = storedLimiter(Policy::smoothWarmingUp(100, milliseconds(1000), milliseconds(200), 3));
  const std::string n = rl.name();
  // 100/s (s = 10 ms), warm-up 200 ms, cold factor 3: threshold 10, max 20 permits; exact doubles.
  ASSERT_TRUE(rl.trySetPolicy("k"));
  struct Grant {
    std::int64_t useUs = 0, permits = 0;
    int worker = 0;
  };
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{REDLIMIT_ONE_KEY_WORKER, "smooth", server().uri(), n, "k", "1", "300", "400000"}));
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
  const Decision a = rl.reserve("k", 1, microseconds(5'000'000));
  const Decision b = rl.reserve("k", 1, microseconds(5'000'000));
  ASSERT_TRUE(a.allowed);
  ASSERT_TRUE(b.allowed);
  EXPECT_EQ((b.time + b.delay - a.time - a.delay).count(), 10000);
  EXPECT_EQ(a.remaining, 0) << "nothing stored: warm";
}

}  // namespace
