// Limiter: per-key limits against a real redis-server. A key needs no set-up (the policy travels in
// the call), idle keys are reclaimed by default, another policy of the same algorithm keeps the
// permits in use, keys written by a one-key handle are decided by the policy, and one limiter is one
// metrics series whatever its keys. Every policy through every operation is in limiter_test.cpp.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

namespace redlimit::test {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

class LimiterPerKey : public RedisTest {
 protected:
  std::int64_t pttl(const std::string& key) { return raw({"PTTL", key}).integer; }
};

// A key without state is decided with the policy (no set-up, no NotInitializedError), and then
// holds it: a Limiter of the same name under a stored policy reads the policy and the state.
TEST_F(LimiterPerKey, AKeyWithoutStateIsDecidedWithThePolicyAndThenHoldsIt) {
  Limiter api(client(), limiterName("api"), Policy::gcra(1, milliseconds(10000), 3));
  for (std::int64_t left = 2; left >= 0; --left) {
    const Decision d = api.decide("user:42");
    ASSERT_TRUE(d.allowed);
    EXPECT_FALSE(d.byPolicy);
    EXPECT_EQ(d.remaining, left);
    EXPECT_EQ(d.limit, 3);
  }
  const Decision denied = api.decide("user:42");
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 9000000);
  EXPECT_LE(denied.retryAfter.count(), 10000000);
  EXPECT_TRUE(api.tryAcquire("user:43")) << "another key, another limit";

  Limiter stored(client(), api.name(), Policy::gcra(1, milliseconds(10000), 5).stored());
  const Decision seen = stored.peek("user:42");
  EXPECT_EQ(seen.limit, 3) << "the policy was written with the grant";
  EXPECT_FALSE(seen.allowed) << "a stored limiter of the name sees the key's state";
}

// A key without state is a normal decision, not the failure policy's, under Allow too.
TEST_F(LimiterPerKey, AKeyWithoutStateIsDecidedByRedisNotByTheFailurePolicy) {
  Limiter::Options options;
  options.failure.policy = FailurePolicy::Allow;
  Limiter allow(patientClient(), limiterName("allow"), Policy::gcra(1, milliseconds(10000), 2), options);
  const Decision d = allow.decide("fresh");
  EXPECT_TRUE(d.allowed);
  EXPECT_FALSE(d.byPolicy);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_EQ(allow.failureStats().allowed, 0U);
}

// Keys expire once full again plus the idle margin (kDefaultIdleMargin), as redis_rate's do; a
// permanent policy keeps them.
TEST_F(LimiterPerKey, KeysExpireOnceFullAgainPlusTheIdleMarginAndPermanentOnesStay) {
  Limiter api(client(), limiterName("ttl"), Policy::gcra(10, milliseconds(10000), 10));
  const Decision d = api.decide("a", 4);
  ASSERT_TRUE(d.allowed);
  const std::int64_t ttl = pttl(api.redisKey("a"));
  const std::int64_t resetMs = (d.resetAfter.count() + 999) / 1000;
  EXPECT_GT(ttl, resetMs) << "the time until full, plus the margin";
  EXPECT_LE(ttl, resetMs + kDefaultIdleMargin.count());

  Limiter kept(client(), limiterName("kept"), Policy::gcra(10, milliseconds(10000), 10).permanent());
  ASSERT_TRUE(kept.tryAcquire("b"));
  EXPECT_EQ(pttl(kept.redisKey("b")), -1);
}

// An expired key (the policy's state gone with it) decides as a full one.
TEST_F(LimiterPerKey, AnExpiredKeyDecidesAsAFullOne) {
  Limiter api(client(), limiterName("expiring"),
              Policy::tokenBucket(2, 2, milliseconds(20)).keepAlive(milliseconds(30)));
  const std::string key = api.redisKey("k");
  ASSERT_TRUE(api.tryAcquire("k", 2));
  for (int i = 0; i < 200 && raw({"EXISTS", key}).integer == 1; ++i) sleepMs(10);
  ASSERT_EQ(raw({"EXISTS", key}).integer, 0) << "the idle key expired";
  const Decision d = api.decide("k");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
}

// A key holding another policy of the same algorithm (the limiter's policy changed between
// deployments) is decided with the caller's, keeping the permits in use; peek writes nothing.
TEST_F(LimiterPerKey, AnotherPolicyOfTheSameAlgorithmKeepsThePermitsInUse) {
  const std::string shared = limiterName("api");
  Limiter a(client(), shared, Policy::gcra(1, milliseconds(10000), 10));
  ASSERT_TRUE(a.decide("k", 6).allowed);
  EXPECT_EQ(a.peek("k").remaining, 4);
  EXPECT_EQ(a.peek("k").remaining, 4) << "peek writes nothing";

  Limiter biggerBurst(client(), shared, Policy::gcra(1, milliseconds(10000), 20));
  EXPECT_EQ(biggerBurst.peek("k").remaining, 14) << "6 in use of 20";
  Limiter slower(client(), shared, Policy::gcra(1, milliseconds(20000), 10));
  const Decision d = slower.decide("k");
  ASSERT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3) << "6 in use, then 1";
  Limiter stored(client(), shared, Policy::gcra(1, milliseconds(10000), 1).stored());
  const Decision byKey = stored.peek("k", 4);
  const Decision byCall = slower.peek("k", 4);
  EXPECT_EQ(byKey.limit, 10);
  EXPECT_EQ(byKey.time + byKey.retryAfter, byCall.time + byCall.retryAfter)
      << "the caller's policy was written with the grant: the key's own is one permit per 20 s";
  EXPECT_EQ(a.peek("k").remaining, 3) << "7 in use, back to the first policy";
}

// A key written under a stored policy (keepAlive 0) keeps its state exactly under a policy in the
// call that differs in keepAlive only; a key of another kind or Redis type is refused, nothing
// written.
TEST_F(LimiterPerKey, KeysWrittenUnderAStoredPolicyAreDecidedByThePolicyInTheCall) {
  Limiter api(client(), limiterName("api"), Policy::gcra(1, milliseconds(10000), 5));
  Limiter stored(client(), api.name(), Policy::gcra(1, milliseconds(10000), 5).stored());
  ASSERT_TRUE(stored.trySetPolicy("one"));
  ASSERT_TRUE(stored.decide("one", 2).allowed);
  EXPECT_EQ(api.decide("one").remaining, 2);

  Limiter bucket(client(), api.name(), Policy::tokenBucket(5, 1, milliseconds(10000)).stored());
  ASSERT_TRUE(bucket.trySetPolicy("bucket"));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)api.decide("bucket"); }));
  (void)raw({"SET", api.redisKey("str"), "hello"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)api.decide("str"); }));
  EXPECT_EQ(raw({"GET", api.redisKey("str")}).str, "hello");
  (void)raw({"HSET", api.redisKey("hash"), "a", "b"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)api.decide("hash"); }));
}

TEST_F(LimiterPerKey, AsyncDecisionsOnManyKeysShareOnePolicy) {
  Limiter api(client(), limiterName("async"), Policy::tokenBucket(2, 1, milliseconds(10000)));
  std::vector<std::future<Decision>> futures;
  for (int k = 0; k < 20; ++k) {
    for (int i = 0; i < 3; ++i) futures.push_back(api.decideAsync("u" + std::to_string(k)));
  }
  int allowed = 0;
  for (auto& f : futures) allowed += f.get().allowed ? 1 : 0;
  EXPECT_EQ(allowed, 40) << "2 of 3 on each of 20 keys";
  Limiter stored(client(), api.name(), Policy::tokenBucket(1, 1, milliseconds(1000)).stored());
  EXPECT_EQ(stored.peek("u7").limit, 2) << "one policy written to every key";
}

// A decideAsync callback that throws runs once, is counted and reported once under the limiter's
// name, and the other keys' callbacks are unaffected.
TEST_F(LimiterPerKey, AThrowingCallbackIsCountedOnceAndLeavesTheOthersAlone) {
  Limiter::Options o;
  o.monitor.registry = std::make_shared<MetricsRegistry>();
  std::atomic<int> events{0};
  std::promise<void> reported;  // the event comes after the count (reportCallbackThrew)
  o.monitor.onEvent = [&](const Event& e) {
    if (e.kind == Event::Kind::CallbackThrew && events.fetch_add(1) == 0) reported.set_value();
  };
  Limiter api(client(), limiterName("throwing"), Policy::tokenBucket(2, 1, milliseconds(10000)), o);
  std::atomic<int> runs{0}, others{0};
  std::promise<void> othersDone;
  for (int k = 0; k < 10; ++k) {
    api.decideAsync("t" + std::to_string(k), 1, [&, k](const Decision& d, const std::exception_ptr& error) {
      if (k == 5) {
        runs.fetch_add(1);
        throw std::runtime_error("key 5's callback throws");
      }
      if (!error && d.allowed && others.fetch_add(1) == 8) othersDone.set_value();
    });
  }
  ASSERT_EQ(reported.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  ASSERT_EQ(othersDone.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(events.load(), 1);
  EXPECT_EQ(others.load(), 9);
  EXPECT_EQ(api.monitor().metrics()->snapshot().callbacksThrew, 1u);
}

// A fixed window key needs no set-up, and expires at the window's end plus the idle margin.
TEST_F(LimiterPerKey, AFixedWindowKeyNeedsNoSetUpAndExpiresAtTheWindowsEnd) {
  Limiter::Options allow;
  allow.failure.policy = FailurePolicy::Allow;
  constexpr std::int64_t kWindowMs = 60000;
  Limiter quota(patientClient(), limiterName("quota"), Policy::fixedWindow(3, milliseconds(kWindowMs)), allow);
  // Windows are aligned to the epoch on the server's clock: a sequence that a window's start cut
  // in two (about once in 2 000 runs) is done again on a new key, and only a whole one is checked.
  std::string key;
  std::vector<Decision> decisions;
  std::int64_t ttl = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    key = "user:42:" + std::to_string(attempt);
    decisions.clear();
    const std::int64_t before = serverTimeMs(admin());
    for (int i = 0; i < 4; ++i) decisions.push_back(quota.decide(key));
    ttl = pttl(quota.redisKey(key));
    if (serverTimeMs(admin()) / kWindowMs == before / kWindowMs) break;
  }
  for (std::int64_t left = 2; left >= 0; --left) {
    const Decision& d = decisions[static_cast<std::size_t>(2 - left)];
    ASSERT_TRUE(d.allowed);
    EXPECT_FALSE(d.byPolicy) << "a key without state is a normal decision, not the failure policy's";
    EXPECT_EQ(d.remaining, left);
  }
  const Decision& denied = decisions[3];
  EXPECT_FALSE(denied.allowed);
  const std::int64_t endMs = (denied.retryAfter.count() + 999) / 1000;  // the window's end
  EXPECT_GT(ttl, endMs) << "the window's end plus the margin";
  // At most what the window's first grant set with the whole key (the later ones write the count
  // alone, keeping the TTL): its window's end, in ms rounded up, plus the margin. (Not a later
  // grant's or the denial's end plus the margin: the server's TIME is µs, its key clock ms, cached
  // per command, so the two can round a millisecond apart.)
  const std::int64_t setMs = (decisions[0].resetAfter.count() + 999) / 1000 + kDefaultIdleMargin.count();
  EXPECT_LE(ttl, setMs);
  EXPECT_GE(setMs, endMs + kDefaultIdleMargin.count()) << "the grant's window is the denial's";
  Limiter stored(client(), quota.name(), Policy::fixedWindow(1, milliseconds(1000)).stored());
  EXPECT_EQ(stored.peek(key).limit, 3) << "the policy was written with the grant";
  EXPECT_THROW((void)quota.decide(key, 4), InvalidArgument) << "more than the limit, before sending";
}

// In the window its key holds, which counted permits already, a grant writes the 4 bytes of the
// count in place (SETRANGE): the rest of the key and its TTL (the window's end plus the margin)
// stay as the first grant of the window wrote them.
TEST_F(LimiterPerKey, AFixedWindowGrantInTheKeysWindowWritesOnlyTheCount) {
  constexpr std::int64_t kWindowMs = 60000;
  Limiter quota(client(), limiterName("quota"), Policy::fixedWindow(1000, milliseconds(kWindowMs)));
  constexpr int kGrants = 5;
  // Windows are aligned to the epoch: a sequence that a window's start cut in two is done again on
  // a new key, and only a whole one is checked.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string key = "user:" + std::to_string(attempt);
    const std::int64_t start = serverTimeMs(admin());
    ASSERT_TRUE(quota.tryAcquire(key));  // a new key: the whole key, with its TTL
    const std::string first = raw({"GET", quota.redisKey(key)}).str;
    const std::int64_t ttl = pttl(quota.redisKey(key));
    const std::int64_t sets = commandCalls(admin(), "set"), setranges = commandCalls(admin(), "setrange");
    for (int i = 0; i < kGrants; ++i) ASSERT_TRUE(quota.tryAcquire(key));
    const std::int64_t wroteSet = commandCalls(admin(), "set") - sets,
                       wroteRange = commandCalls(admin(), "setrange") - setranges;
    const std::string after = raw({"GET", quota.redisKey(key)}).str;
    const std::int64_t ttlAfter = pttl(quota.redisKey(key));
    if (serverTimeMs(admin()) / kWindowMs != start / kWindowMs) continue;
    EXPECT_EQ(wroteRange, kGrants);
    EXPECT_EQ(wroteSet, 0);
    ASSERT_EQ(after.size(), first.size());
    EXPECT_EQ(after.substr(0, 20), first.substr(0, 20)) << "configuration and window as they were";
    EXPECT_EQ(after.substr(24), first.substr(24)) << "nothing reserved in the next window";
    EXPECT_EQ(static_cast<unsigned char>(after[20]), 1 + kGrants) << "the count, little-endian";
    EXPECT_EQ(after.substr(21, 3), std::string(3, '\0'));
    EXPECT_GT(ttlAfter, 0);
    EXPECT_LE(ttlAfter, ttl) << "the TTL of the window's first grant, kept";
    EXPECT_EQ(quota.peek(key).remaining, 1000 - 1 - kGrants);
    return;
  }
  FAIL() << "three sequences in a row were cut by a window's start";
}

// A smooth key starts idle (bursty: maxBurst's worth stored; warming up: cold) and expires once
// idle again plus the margin; permanent policies keep their keys.
TEST_F(LimiterPerKey, ASmoothKeyStartsIdleAndExpiresOnceIdle) {
  Limiter pace(client(), limiterName("pace"), Policy::smoothBursty(10, milliseconds(1000)));
  const Decision first = pace.decide("host:7", 4);
  ASSERT_TRUE(first.allowed);
  EXPECT_EQ(first.limit, 10);
  EXPECT_EQ(first.remaining, 6) << "a new key is an idle limiter: maxBurst's worth stored, 4 spent";
  const std::int64_t ttl = pttl(pace.redisKey("host:7"));
  const std::int64_t resetMs = (first.resetAfter.count() + 999) / 1000;
  EXPECT_GT(ttl, resetMs) << "until full again, plus the margin";
  EXPECT_LE(ttl, resetMs + kDefaultIdleMargin.count());

  Limiter warm(client(), limiterName("warm"), Policy::smoothWarmingUp(2, milliseconds(1000), milliseconds(4000)));
  const Decision cold = warm.peek("cold");
  EXPECT_EQ(cold.remaining, 8);
  EXPECT_EQ(raw({"EXISTS", warm.redisKey("cold")}).integer, 0) << "peek writes nothing";

  Limiter kept(client(), limiterName("kept"), Policy::smoothBursty(10, milliseconds(1000)).permanent());
  ASSERT_TRUE(kept.tryAcquire("p"));
  EXPECT_EQ(pttl(kept.redisKey("p")), -1);
  Limiter keptWindow(client(), limiterName("keptw"), Policy::fixedWindow(3, milliseconds(1000)).permanent());
  ASSERT_TRUE(keptWindow.tryAcquire("w"));
  EXPECT_EQ(pttl(keptWindow.redisKey("w")), -1);
}

TEST_F(LimiterPerKey, ExpiredFixedWindowAndSmoothKeysDecideAsNewOnes) {
  Limiter quota(client(), limiterName("q"), Policy::fixedWindow(2, milliseconds(50)).keepAlive(milliseconds(20)));
  Limiter pace(client(), limiterName("s"),
               Policy::smoothBursty(2, milliseconds(50), milliseconds(50)).keepAlive(milliseconds(20)));
  ASSERT_TRUE(quota.tryAcquire("w", 2));
  ASSERT_TRUE(pace.tryAcquire("s", 2));
  const std::string w = quota.redisKey("w"), s = pace.redisKey("s");
  for (int i = 0; i < 200 && raw({"EXISTS", w, s}).integer > 0; ++i) sleepMs(10);
  ASSERT_EQ(raw({"EXISTS", w, s}).integer, 0) << "both idle keys expired";
  EXPECT_EQ(quota.decide("w").remaining, 1);
  EXPECT_EQ(pace.decide("s").remaining, 1) << "full again: 2 stored, 1 spent";
}

// A stored time an hour ahead of the server's clock, as a server clock stepped back leaves it: the
// policy in the call meets the clamp of the one-key scripts (one_key_configuration_test.cpp), so
// the denial lasts one horizon plus one permit, never the step.
TEST_F(LimiterPerKey, AStoredTimeFarAheadIsClampedUnderThePolicyInTheCall) {
  constexpr std::int64_t kAnHourUs = 3'600'000'000;
  Limiter api(client(), limiterName("api"), Policy::gcra(2, milliseconds(200), 2));
  (void)raw({"SET", api.redisKey("k"), gcraValue('G', 2, 2, 200, serverTimeUs(admin()) + kAnHourUs)});
  EXPECT_LE(api.decide("k").retryAfter.count(), 300000);
}

// One limiter is one metrics series, whatever keys its callers pass.
TEST_F(LimiterPerKey, EachLimiterIsOneMetricsSeriesWhateverItsKeys) {
  Limiter::Options o;
  o.monitor.registry = std::make_shared<MetricsRegistry>();
  Limiter g(client(), limiterName("g"), Policy::gcra(1, milliseconds(1000), 2), o);
  Limiter t(client(), limiterName("t"), Policy::tokenBucket(2, 1, milliseconds(1000)), o);
  Limiter w(client(), limiterName("w"), Policy::fixedWindow(2, milliseconds(1000)), o);
  Limiter s(client(), limiterName("s"), Policy::smoothBursty(2, milliseconds(1000)), o);
  for (int k = 0; k < 50; ++k) {
    const std::string key = "k" + std::to_string(k);
    (void)g.decide(key);
    (void)t.decide(key);
    (void)w.decide(key);
    (void)s.decide(key);
  }
  const std::vector<LimiterMetrics::Snapshot> all = o.monitor.registry->snapshot();
  EXPECT_EQ(all.size(), 4U) << "200 keys, four limiters";
  for (const auto& m : all) EXPECT_EQ(m.granted + m.denied, 50U) << m.limiter;
}

}  // namespace
}  // namespace redlimit::test
