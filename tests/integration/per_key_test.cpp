// Per-key limits at scale against a real redis-server: the limit in the call (keyed
// families), idle keys reclaimed by default, a configuration change that keeps the permits in use.
#include <atomic>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>
#include <string>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {}  // namespace

using PerKey = RedisTest;

// A key with no configuration is decided with the caller's (no trySetConfig),
// and the key then holds it, readable by the one-key handle.
TEST_F(PerKey, KeyWithoutConfigurationIsDecidedWithTheCallersLimit) {
  const GcraConfig c = gcra(3, 1, milliseconds(10000));
  KeyedGcraRateLimiter api(client(), "api", c);
  const std::string key = name("user:42");
  for (std::int64_t left = 2; left >= 0; --left) {
    const Decision d = api.decide(key);
    ASSERT_TRUE(d.allowed);
    EXPECT_FALSE(d.byPolicy);
    EXPECT_EQ(d.remaining, left);
    EXPECT_EQ(d.limit, 3);
  }
  const Decision denied = api.decide(key);
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 9000000);
  EXPECT_LE(denied.retryAfter.count(), 10000000);
  EXPECT_TRUE(api.tryAcquire(name("user:43"))) << "another key, another limit";

  GcraRateLimiter one(client(), key);
  EXPECT_EQ(one.getConfig(), api.config());
  EXPECT_EQ(api.config().keepAlive, kDefaultIdleMargin);
  EXPECT_FALSE(one.tryAcquire()) << "the handle sees the keyed state";
}

// The failure policy on a key with no configuration. The limit in the call: a
// normal decision (not the policy's); the explicit path: NotInitializedError, also under Allow.
TEST_F(PerKey, FailurePolicyOnAKeyWithoutConfiguration) {
  KeyedRateLimiterOptions keyedOptions;
  keyedOptions.failure.policy = FailurePolicy::Allow;
  KeyedGcraRateLimiter keyed(client(), "allow", gcra(2, 1, milliseconds(10000)), keyedOptions);
  const Decision d = keyed.decide(name("fresh"));
  EXPECT_TRUE(d.allowed);
  EXPECT_FALSE(d.byPolicy);
  EXPECT_EQ(d.remaining, 1);

  GcraRateLimiterOptions explicitOptions;
  explicitOptions.failure.policy = FailurePolicy::Allow;
  GcraRateLimiter plain(client(), name("unset"), explicitOptions);
  EXPECT_THROW((void)plain.decide(), NotInitializedError);
  EXPECT_EQ(plain.failureStats().allowed, 0U);
}

// Keys expire once full again plus the idle margin (kDefaultIdleMargin), as
// redis_rate's do; permanentKeys keeps them.
TEST_F(PerKey, KeysExpireOnceFullByDefault) {
  KeyedGcraRateLimiter api(client(), "ttl", gcra(10, 10, milliseconds(10000)));
  const Decision d = api.decide(name("a"), 4);
  ASSERT_TRUE(d.allowed);
  const std::int64_t ttl = raw({"PTTL", name("a")}).integer;
  const std::int64_t resetMs = (d.resetAfter.count() + 999) / 1000;
  EXPECT_GT(ttl, resetMs) << "the time until full, plus the margin";
  EXPECT_LE(ttl, resetMs + 1000);

  KeyedRateLimiterOptions permanent;
  permanent.permanentKeys = true;
  KeyedGcraRateLimiter kept(client(), "kept", gcra(10, 10, milliseconds(10000)), permanent);
  ASSERT_TRUE(kept.tryAcquire(name("b")));
  EXPECT_EQ(raw({"PTTL", name("b")}).integer, -1);
}

// An expired key (its configuration gone with the state) decides as a full one.
TEST_F(PerKey, ExpiredKeyDecidesAsFull) {
  KeyedTokenBucketRateLimiter api(client(), "expiring", [] {
    TokenBucketConfig c = bucket(2, 2, milliseconds(20));
    c.keepAlive = milliseconds(30);
    return c;
  }());
  const std::string key = name("k");
  ASSERT_TRUE(api.tryAcquire(key, 2));
  for (int i = 0; i < 200 && raw({"EXISTS", key}).integer == 1; ++i) sleepMs(10);
  ASSERT_EQ(raw({"EXISTS", key}).integer, 0) << "the idle key expired";
  const Decision d = api.decide(key);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
}

// Limits in the call: a key holding another configuration of the kind is decided
// with the caller's, keeping the permits in use; the same configuration changes nothing.
TEST_F(PerKey, AnotherConfigurationInTheCallKeepsThePermitsInUse) {
  const std::string key = name("k");
  KeyedGcraRateLimiter a(client(), "a", gcra(10, 1, milliseconds(10000)));
  ASSERT_TRUE(a.decide(key, 6).allowed);
  EXPECT_EQ(a.peek(key).remaining, 4);
  EXPECT_EQ(a.peek(key).remaining, 4) << "peek writes nothing";

  KeyedGcraRateLimiter biggerBurst(client(), "b", gcra(20, 1, milliseconds(10000)));
  EXPECT_EQ(biggerBurst.peek(key).remaining, 14) << "6 in use of 20";
  KeyedGcraRateLimiter slower(client(), "c", gcra(10, 1, milliseconds(20000)));
  const Decision d = slower.decide(key);
  ASSERT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3) << "6 in use, then 1";
  GcraRateLimiter one(client(), key);
  EXPECT_EQ(one.getConfig(), slower.config()) << "the caller's configuration was written with the grant";
  EXPECT_EQ(a.peek(key).remaining, 3) << "7 in use, back to the first configuration";
}

// A key written by the explicit path (keepAlive 0) keeps its state exactly under a keyed policy
// that differs in keepAlive only; a key of another kind is refused before anything is written.
TEST_F(PerKey, ExplicitKeysAreDecidedByTheKeyedPolicy) {
  GcraRateLimiter one(client(), name("one"));
  one.setConfig(gcra(5, 1, milliseconds(10000)));
  ASSERT_TRUE(one.decide(2).allowed);
  KeyedGcraRateLimiter api(client(), "api", gcra(5, 1, milliseconds(10000)));
  EXPECT_EQ(api.decide(name("one")).remaining, 2);

  TokenBucketRateLimiter other(client(), name("bucket"));
  other.setConfig(bucket(5, 1, milliseconds(10000)));
  EXPECT_THROW((void)api.decide(name("bucket")), InvalidConfigError);
  (void)raw({"SET", name("str"), "hello"});
  EXPECT_THROW((void)api.decide(name("str")), InvalidConfigError);
  (void)raw({"HSET", name("hash"), "a", "b"});
  EXPECT_THROW((void)api.decide(name("hash")), InvalidConfigError);
}

TEST_F(PerKey, BadKeysAndPermitsAreRefusedBeforeSending) {
  KeyedGcraRateLimiter api(client(), "api", gcra(5, 1, milliseconds(10000)));
  EXPECT_THROW((void)api.decide(""), InvalidArgument);
  EXPECT_THROW((void)api.decide(std::string(detail::ScriptLimiter::kMaxNameLength + 1, 'k')), InvalidArgument);
  EXPECT_THROW((void)api.decide(name("k"), 6), InvalidArgument);
  EXPECT_THROW((void)api.decide(name("k"), 0), InvalidArgument);
  EXPECT_EQ(raw({"EXISTS", name("k")}).integer, 0);
  EXPECT_THROW(KeyedGcraRateLimiter(client(), "bad", gcra(0, 1, milliseconds(10))), InvalidArgument);
  TokenBucketConfig withInitial = bucket(5, 1, milliseconds(10));
  withInitial.initialTokens = 1;
  EXPECT_THROW(KeyedTokenBucketRateLimiter(client(), "bad", withInitial), InvalidArgument);
}

TEST_F(PerKey, AsyncDecisionsOnManyKeysShareOnePolicy) {
  KeyedTokenBucketRateLimiter api(client(), "async", bucket(2, 1, milliseconds(10000)));
  std::vector<std::future<Decision>> futures;
  for (int k = 0; k < 20; ++k) {
    for (int i = 0; i < 3; ++i) futures.push_back(api.decideAsync(name("u" + std::to_string(k))));
  }
  int allowed = 0;
  for (auto& f : futures) allowed += f.get().allowed ? 1 : 0;
  EXPECT_EQ(allowed, 40) << "2 of 3 on each of 20 keys";
  TokenBucketRateLimiter one(client(), name("u7"));
  EXPECT_EQ(one.getConfig(), api.config());
}

// A throwing callback, on the keyed family: a decideAsync callback that throws runs once, is counted
// and reported once under the policy's name, and the other keys' callbacks are unaffected.
TEST_F(PerKey, AThrowingCallbackIsCountedOnceAndLeavesTheOthersAlone) {
  KeyedRateLimiterOptions o;
  o.monitor.registry = std::make_shared<MetricsRegistry>();
  std::atomic<int> events{0};
  std::promise<void> reported;  // the event comes after the count (reportCallbackThrew)
  o.monitor.onEvent = [&](const Event& e) {
    if (e.kind == Event::Kind::CallbackThrew && events.fetch_add(1) == 0) reported.set_value();
  };
  KeyedTokenBucketRateLimiter api(client(), "throwing", bucket(2, 1, milliseconds(10000)), o);
  std::atomic<int> runs{0}, others{0};
  std::promise<void> othersDone;
  for (int k = 0; k < 10; ++k) {
    api.decideAsync(name("t" + std::to_string(k)), 1, [&, k](const Decision& d, const std::exception_ptr& error) {
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

// setConfig keeps the permits in use for the token bucket and GCRA, on a change
// of rate, of period and of burst; the same configuration again changes nothing.
TEST_F(PerKey, SetConfigKeepsThePermitsInUse) {
  struct Change {
    const char* what;
    GcraConfig to;
    std::int64_t remaining;  // after 6 of 10 were taken and one more now
  };
  const GcraConfig from = gcra(10, 1, milliseconds(10000));
  for (const Change& c :
       {Change{"rate", gcra(10, 2, milliseconds(10000)), 3}, Change{"period", gcra(10, 1, milliseconds(20000)), 3},
        Change{"burst", gcra(20, 1, milliseconds(10000)), 13}, Change{"same", from, 3}}) {
    GcraRateLimiter rl(client(), name(c.what));
    rl.setConfig(from);
    ASSERT_TRUE(rl.decide(6).allowed) << c.what;
    rl.setConfig(c.to);
    EXPECT_EQ(rl.getConfig(), c.to) << c.what;
    const Decision d = rl.decide();
    EXPECT_TRUE(d.allowed) << c.what;
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
  }
  TokenBucketRateLimiter bucketed(client(), name("bucket"));
  bucketed.setConfig(bucket(10, 1, milliseconds(10000)));
  ASSERT_TRUE(bucketed.decide(10).allowed);
  bucketed.setConfig(bucket(10, 1, milliseconds(10000)));
  EXPECT_FALSE(bucketed.tryAcquire()) << "the same configuration does not refill";
  TokenBucketConfig refill = bucket(10, 1, milliseconds(10000));
  refill.initialTokens = 10;
  bucketed.setConfig(refill);
  EXPECT_TRUE(bucketed.tryAcquire()) << "asking for initialTokens restarts the bucket with them";
}

// setConfig of the same configuration about every 10 ms under 4 deciding
// threads stays within capacity + rate x T (it granted 971 in 1 s against a bound of 20).
TEST_F(PerKey, SetConfigUnderDecisionsStaysWithinTheBound) {
  const TokenBucketConfig c = bucket(10, 10, milliseconds(1000));
  TokenBucketRateLimiter rl(client(), name("hot"));
  rl.setConfig(c);
  std::atomic<bool> stop{false};
  std::atomic<int> granted{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> deciders;
  for (int t = 0; t < 4; ++t) {
    deciders.emplace_back([&] {
      TokenBucketRateLimiter mine(newClient(), name("hot"));
      while (!stop.load()) {
        if (mine.tryAcquire()) granted.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 100; ++i) {
    rl.setConfig(c);
    sleepMs(10);
  }
  stop.store(true);
  for (auto& t : deciders) t.join();
  const double seconds = static_cast<double>(msSince(start)) / 1000.0;
  // The bound over the whole span (it only grows with the span, so a slow machine loosens it).
  EXPECT_LE(granted.load(), 10 + static_cast<int>(10 * seconds) + 1) << "over " << seconds << " s";
  EXPECT_GE(granted.load(), 10) << "the first burst at least";
}
