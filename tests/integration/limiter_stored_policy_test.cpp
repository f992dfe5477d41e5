// Limiter under a stored policy (Policy::stored): the configuration lives in each key, written by
// trySetPolicy and setPolicy from any process and read by every decision; what is refused before
// anything is sent; and that no caller key of another limiter reaches a stored configuration.
#include <algorithm>
#include <chrono>
#include <string>

#include "helpers.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::hours;

namespace {

class LimiterStoredPolicy : public RedisTest {
 protected:
};

// Five permits at once, about one a day back: nothing refills during a test.
struct StoredGcra {
  static Policy make(std::int64_t burst = 5) { return Policy::gcra(1, hours(24), burst).stored(); }
  static constexpr bool kStartsFull = true;
};
struct StoredTokenBucket {
  static Policy make(std::int64_t capacity = 5) { return Policy::tokenBucket(capacity, 1, hours(24)).stored(); }
  static constexpr bool kStartsFull = true;
};
struct StoredFixedWindow {
  static Policy make(std::int64_t limit = 5) { return Policy::fixedWindow(limit, hours(24)).stored(); }
  static constexpr bool kStartsFull = true;
};
// Guava's bursty limiter: one permit per 5 h stored up to `stored` permits; it lends the next one
// ahead, so a fresh key grants one more than it stores.
struct StoredSmooth {
  static Policy make(std::int64_t stored = 5) { return Policy::smoothBursty(1, hours(5), hours(5 * stored)).stored(); }
  static constexpr bool kStartsFull = false;
};

template <class P>
class LimiterStoredPolicies : public LimiterStoredPolicy {};
using StoredPolicies = ::testing::Types<StoredGcra, StoredTokenBucket, StoredFixedWindow, StoredSmooth>;
TYPED_TEST_SUITE(LimiterStoredPolicies, StoredPolicies);

TYPED_TEST(LimiterStoredPolicies, AKeyWithoutAStoredPolicyIsNotInitializedUntilTrySetPolicyWritesIt) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  try {
    (void)limiter.decide("global");
    FAIL() << "a stored policy's key without a configuration has nothing to decide with";
  } catch (const NotInitializedError& e) {
    EXPECT_NE(std::string(e.what()).find("trySetPolicy"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(limiter.trySetPolicy("global"));
  EXPECT_FALSE(limiter.trySetPolicy("global")) << "written once";
  const Decision d = limiter.decide("global");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(this->raw({"PTTL", limiter.redisKey("global")}).integer, -1) << "a stored policy's key is permanent";
}

TYPED_TEST(LimiterStoredPolicies, SetPolicyChangesTheLimitForEveryHandleOfTheKeyKeepingThePermitsInUse) {
  const std::string name = this->limiterName();
  Limiter admin(this->client(), name, TypeParam::make());
  Limiter service(this->client(), name, TypeParam::make(), {});  // another process's handle
  ASSERT_TRUE(admin.trySetPolicy("global"));
  ASSERT_TRUE(service.tryAcquire("global", 2));
  admin.setPolicy("global", TypeParam::make(50));
  const Decision d = service.decide("global");
  // A smooth key stored by trySetPolicy starts with nothing stored, as Guava's: the two permits
  // were lent ahead, and that debt is kept across the change too.
  EXPECT_EQ(d.allowed, TypeParam::kStartsFull);
  EXPECT_EQ(d.limit, 50) << "every handle decides by the stored configuration";
  EXPECT_LE(d.remaining, 50 - 3) << "the two permits taken before the change are still in use";
  EXPECT_FALSE(admin.trySetPolicy("global")) << "setPolicy wrote the key";
}

TEST_F(LimiterStoredPolicy, NoCallerKeyOfAnotherLimiterReachesAStoredConfiguration) {
  const std::string svc = limiterName("svc");
  Limiter central(client(), svc, Policy::gcra(1000, std::chrono::seconds(1), 1000).stored());
  ASSERT_TRUE(central.trySetPolicy("global"));
  const Reply before = raw({"GET", central.redisKey("global")});
  ASSERT_EQ(before.type, Reply::Type::String);
  // A per-user limiter whose end users choose their keys, some spelled like the stored key.
  Limiter perUser(client(), limiterName("login"), Policy::perMinute(5));
  for (const std::string& hostile : {std::string("global"), svc + ":global", "rl:" + svc + ":global",
                                     central.redisKey("global"), std::string("{") + svc + "}:global"}) {
    for (int i = 0; i < 6; ++i) (void)perUser.decide(hostile);
    EXPECT_NE(perUser.redisKey(hostile), central.redisKey("global")) << hostile;
  }
  const Reply after = raw({"GET", central.redisKey("global")});
  EXPECT_EQ(after.str, before.str) << "the stored configuration and state are untouched";
  const Decision d = central.decide("global", 10);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 1000) << "still 1 000 a second";
}

TEST_F(LimiterStoredPolicy, WhatCannotBeStoredIsRefusedBeforeAnythingIsSent) {
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)Policy::calendar(5, CalendarUnit::Day, "Europe/Berlin").stored(), InvalidArgument);
  EXPECT_THROW((void)Policy::concurrency(5, std::chrono::seconds(10)).stored(), InvalidArgument);
  EXPECT_THROW((void)Policy::perSecond(5).stored().keepAlive(std::chrono::seconds(1)), InvalidArgument)
      << "a stored policy's keys are permanent";
  Limiter inCall(client(), limiterName("incall"), Policy::perSecond(5));
  EXPECT_THROW((void)inCall.trySetPolicy("k"), InvalidArgument) << "its policy travels in every call";
  EXPECT_THROW(inCall.setPolicy("k", Policy::perSecond(5).stored()), InvalidArgument);
  Limiter stored(client(), limiterName("stored"), Policy::perSecond(5).stored());
  EXPECT_THROW(stored.setPolicy("k", Policy::fixedWindow(5, hours(1)).stored()), InvalidArgument)
      << "another algorithm";
  EXPECT_THROW(stored.setPolicy("k", Policy::perSecond(9)), InvalidArgument) << "not a stored policy";
  EXPECT_THROW((void)stored.trySetPolicy(""), InvalidArgument) << "a bad key";
  EXPECT_EQ(scriptCalls(), calls);
  EXPECT_TRUE(Policy::perSecond(5).stored().isStored());
  EXPECT_NE(Policy::perSecond(5).stored(), Policy::perSecond(5).permanent());
}

TEST_F(LimiterStoredPolicy, AStoredLimiterJoinsAMultiLimitWithAPolicyInTheCall) {
  Limiter global(client(), limiterName("global"), Policy::gcra(1, hours(24), 3).stored());
  Limiter perUser(client(), limiterName("user"), Policy::gcra(1, hours(24), 10));
  ASSERT_TRUE(global.trySetPolicy("all"));
  MultiLimit both({perUser, global});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(both.on({"u1", "all"}).decide().allowed) << i;
  EXPECT_FALSE(both.on({"u1", "all"}).decide().allowed) << "the stored global limit of 3";
  EXPECT_EQ(perUser.peek("u1").remaining, 7) << "all or nothing: the denied call took nothing";
  global.setPolicy("all", Policy::gcra(1, hours(24), 4).stored());
  EXPECT_TRUE(both.on({"u1", "all"}).decide().allowed) << "the new stored limit, read by the MultiLimit too";
}

// With no policy in the call, every operation of the MultiLimit reads each key's stored one.
TEST_F(LimiterStoredPolicy, AMultiLimitOfStoredLimitersPeeksRefundsReservesAndSettlesUnderTheKeysPolicies) {
  Limiter global(client(), limiterName("global"), Policy::gcra(1, hours(24), 3).stored());
  Limiter perUser(client(), limiterName("user"), Policy::fixedWindow(5, hours(24)).stored());
  ASSERT_TRUE(global.trySetPolicy("all"));
  ASSERT_TRUE(perUser.trySetPolicy("u1"));
  MultiLimit both = MultiLimit({global, perUser}).on({"all", "u1"});
  const MultiDecision peeked = both.peek(1);
  ASSERT_TRUE(peeked.allowed);
  EXPECT_EQ(peeked.limits.at(0).limit, 3);
  EXPECT_EQ(peeked.limits.at(1).limit, 5);
  ASSERT_TRUE(both.decide(2).allowed);
  both.refund(1);
  EXPECT_EQ(global.peek("all").remaining, 2);
  EXPECT_EQ(perUser.peek("u1").remaining, 4);
  ASSERT_TRUE(both.reserveFor(2, "r1", hours(1)).allowed);
  const MultiSettlement settled = both.settle("r1", 1);
  EXPECT_EQ(settled.status, Settlement::Status::Settled);
  EXPECT_EQ(settled.returned, 1);
  EXPECT_EQ(global.peek("all").remaining, 1);
  EXPECT_EQ(perUser.peek("u1").remaining, 3);
}

}  // namespace
