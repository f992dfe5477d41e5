// Redis loses its data (FLUSHALL, or a restart without persistence) under each
// failure policy. A limiter that knows its configuration (a one-key handle made with it, a Limiter
// and its policy) decides normally afterwards, writing its key again; a handle made without one (the
// Redisson way) answers NotInitializedError until someone sets the configuration again; set-up
// calls during the outage throw the IoError under every policy; FailurePolicy::Local can be
// seeded for a limiter that has not seen its configuration yet. Against a real redis-server.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "redlimit/redlimit.hpp"
#include "helpers.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

constexpr FailurePolicy kEveryPolicy[] = {FailurePolicy::Throw, FailurePolicy::Allow, FailurePolicy::Deny,
                                          FailurePolicy::Local};

const char* policyName(FailurePolicy p) {
  switch (p) {
    case FailurePolicy::Throw:
      return "Throw";
    case FailurePolicy::Allow:
      return "Allow";
    case FailurePolicy::Deny:
      return "Deny";
    case FailurePolicy::Local:
      return "Local";
  }
  return "?";
}

// 3 at once, then one a minute: nothing refills while a test runs.
Policy threeAMinutePolicy() { return Policy::gcra(1, milliseconds(60000), 3); }

FailureOptions failureOptions(FailurePolicy policy) {
  FailureOptions f;
  f.policy = policy;
  f.probeInterval = milliseconds(20);
  return f;
}

// The first decision that Redis answered again (not the policy's), after a restart. Under Throw
// the calls before it throw the IoError; under the others the policy decides them between probes.
template <class Decide>
Decision firstAnswerFromRedis(Decide decide) {
  for (int i = 0; i < 500; ++i) {
    try {
      const Decision d = decide();
      if (!d.byPolicy) return d;
    } catch (const IoError&) {
    }
    sleepMs(10);
  }
  ADD_FAILURE() << "Redis never answered again";
  return {};
}

// A limiter made without its configuration, after data loss: once Redis answers again, its
// decisions throw NotInitializedError (never decided by the policy). Returns whether that was seen.
template <class Decide>
bool seesNotInitialized(Decide decide) {
  for (int i = 0; i < 500; ++i) {
    try {
      (void)decide();  // the policy's decision (or its IoError) until Redis answers
    } catch (const NotInitializedError&) {
      return true;
    } catch (const IoError&) {
    }
    sleepMs(10);
  }
  return false;
}

}  // namespace

class DataLoss : public RedisTest {};

// FLUSHALL: Redis is up all along, so no policy decides anything; the data is simply gone.
TEST_F(DataLoss, FlushAllUnderEveryPolicy) {
  for (const FailurePolicy policy : kEveryPolicy) {
    SCOPED_TRACE(policyName(policy));
    const std::string tag = policyName(policy);
    Limiter::Options limiterOptions;
    limiterOptions.failure = failureOptions(policy);
    limiterOptions.denyCacheKeys = 0;  // the data is lost behind the limiters' backs: every call asks Redis
    Limiter perKey(client(), limiterName("perKey" + tag), threeAMinutePolicy(), limiterOptions);
    const std::string key = "user" + tag;
    RateLimiter::Options centralOptions;
    centralOptions.failure = failureOptions(policy);
    centralOptions.denyCacheKeys = 0;
    RateLimiter central(client(), name("central" + tag), centralOptions);
    ASSERT_TRUE(central.trySetRate(RateType::Overall, 3, milliseconds(60000)));

    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(perKey.decide(key).allowed);
      ASSERT_TRUE(central.tryAcquire());
    }
    ASSERT_FALSE(perKey.decide(key).allowed);
    ASSERT_FALSE(central.tryAcquire());

    (void)raw({"FLUSHALL"});

    // Known configuration: the next decision writes the key again and decides as a new limiter.
    const Decision k = perKey.decide(key);
    EXPECT_TRUE(k.allowed);
    EXPECT_FALSE(k.byPolicy);
    EXPECT_EQ(k.remaining, 2);
    EXPECT_TRUE(exists(admin(), perKey.redisKey(key))) << "written again under the limiter's name";
    // Made without one: the documented rule, under every policy.
    EXPECT_THROW((void)central.tryAcquire(), NotInitializedError);
    EXPECT_TRUE(central.trySetRate(RateType::Overall, 3, milliseconds(60000)));
    EXPECT_TRUE(central.tryAcquire());
    EXPECT_FALSE(perKey.failureStats().degraded);
    EXPECT_EQ(perKey.failureStats().outages, 0u);
    (void)raw({"FLUSHALL"});
  }
}

// A restart without persistence: an outage (decided by the policy), then an empty Redis.
TEST_F(DataLoss, RestartWithoutPersistenceUnderEveryPolicy) {
  for (const FailurePolicy policy : kEveryPolicy) {
    SCOPED_TRACE(policyName(policy));
    RedisServer server;  // no persistence: a restart comes back empty
    auto c = shortTimeoutClient(server);
    Limiter::Options limiterOptions;
    limiterOptions.failure = failureOptions(policy);
    limiterOptions.denyCacheKeys = 0;  // the data is lost behind the limiters' backs: every call asks Redis
    Limiter perKey(c, "perKey", threeAMinutePolicy(), limiterOptions);
    Limiter centralGcra(c, "central-gcra", threeAMinutePolicy().stored(), limiterOptions);  // stored in the key
    RateLimiter::Options centralOptions;
    centralOptions.failure = failureOptions(policy);
    centralOptions.denyCacheKeys = 0;
    RateLimiter central(c, "central", centralOptions);
    ASSERT_TRUE(central.trySetRate(RateType::Overall, 3, milliseconds(60000)));
    ASSERT_TRUE(centralGcra.trySetPolicy("k"));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(perKey.decide("user:{1}").allowed);
    ASSERT_FALSE(perKey.decide("user:{1}").allowed);

    server.kill();
    // During the outage: decisions follow the policy ...
    try {
      const Decision d = perKey.decide("user:{1}");
      EXPECT_NE(policy, FailurePolicy::Throw);
      EXPECT_TRUE(d.byPolicy);
      EXPECT_EQ(d.allowed, policy != FailurePolicy::Deny) << "Local: the limiter's own policy";
    } catch (const IoError&) {
      EXPECT_EQ(policy, FailurePolicy::Throw);
    }
    const FailureStats during = perKey.failureStats();
    EXPECT_TRUE(during.degraded);
    EXPECT_EQ(during.outages, 1u);
    EXPECT_EQ(during.allowed, policy == FailurePolicy::Allow || policy == FailurePolicy::Local ? 1u : 0u);
    EXPECT_EQ(during.denied, policy == FailurePolicy::Deny ? 1u : 0u);
    EXPECT_EQ(during.thrown, policy == FailurePolicy::Throw ? 1u : 0u);
    // ... and set-up calls are not decisions: they throw the IoError under every policy.
    EXPECT_THROW((void)central.trySetRate(RateType::Overall, 3, milliseconds(60000)), IoError);
    EXPECT_THROW((void)centralGcra.trySetPolicy("k"), IoError);
    EXPECT_THROW(perKey.refund("user:{1}", 1), IoError);
    EXPECT_EQ(perKey.failureStats().outages, 1u) << "set-up calls do not count as decisions";
    EXPECT_EQ(centralGcra.failureStats().outages, 0u);
    EXPECT_EQ(central.failureStats().outages, 0u);

    server.restart();
    // Known configuration: decided as a new limiter (full), the key written again.
    const Decision k = firstAnswerFromRedis([&] { return perKey.decide("user:{1}"); });
    EXPECT_TRUE(k.allowed);
    EXPECT_EQ(k.remaining, 2);
    EXPECT_FALSE(perKey.failureStats().degraded);
    EXPECT_TRUE(exists(*c, perKey.redisKey("user:{1}"))) << "written again by the decision";
    // Made without one: NotInitializedError until the configuration is set again, then normal.
    EXPECT_TRUE(seesNotInitialized([&] { return central.decide(); }));
    EXPECT_FALSE(exists(*c, "central")) << "nothing re-created it";
    EXPECT_TRUE(central.trySetRate(RateType::Overall, 3, milliseconds(60000)));
    EXPECT_TRUE(central.tryAcquire());
    EXPECT_TRUE(seesNotInitialized([&] { return centralGcra.decide("k"); }));
    EXPECT_TRUE(centralGcra.trySetPolicy("k"));
    const Decision g = centralGcra.decide("k");
    EXPECT_TRUE(g.allowed);
    EXPECT_EQ(g.remaining, 2);
  }
}

// A service that starts while Redis is down has seen no configuration: Local refuses, unless
// FailureOptions seeds it.
TEST_F(DataLoss, LocalCanBeSeededBeforeAConfigurationIsSeen) {
  ClientOptions gone;
  gone.connection.port = freeLoopbackPort();  // nothing listens there
  gone.connection.connectTimeout = milliseconds(200);
  auto c = Client::create(gone);
  RateLimiter::Options unseeded;
  unseeded.failure.policy = FailurePolicy::Local;
  RateLimiter refusing(c, "unseeded", unseeded);
  EXPECT_FALSE(refusing.tryAcquire()) << "no configuration seen, no seed: refuse";

  RateLimiter::Options seeded = unseeded;
  seeded.failure.localSeedRate = 2;
  seeded.failure.localSeedInterval = milliseconds(60000);
  RateLimiter central(c, "seeded", seeded);
  EXPECT_TRUE(central.tryAcquire());
  EXPECT_TRUE(central.tryAcquire());
  EXPECT_FALSE(central.tryAcquire()) << "the seed's 2 a minute";
  EXPECT_EQ(central.failureStats().allowed, 2u);
  EXPECT_EQ(central.failureStats().denied, 1u);

  Limiter::Options gcraSeeded;
  gcraSeeded.failure = seeded.failure;
  Limiter stored(c, "gcra", threeAMinutePolicy().stored(), gcraSeeded);  // no configuration seen: its keys hold it
  EXPECT_TRUE(stored.decide("k", 2).allowed);
  EXPECT_FALSE(stored.decide("k").allowed);

  RateLimiter::Options bad = unseeded;
  bad.failure.localSeedRate = 2;  // without an interval
  EXPECT_THROW(RateLimiter(c, "bad", bad), InvalidArgument);
  bad.failure.localSeedRate = -1;
  bad.failure.localSeedInterval = milliseconds(1000);
  EXPECT_THROW(RateLimiter(c, "bad", bad), InvalidArgument);
}
