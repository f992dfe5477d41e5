// Limiter: one policy over any keys, each key's state under the limiter's name. Every policy
// through every operation, sync and async (the capability table of docs/api.md); the namespace
// (two names never share state, no caller key reaches a record); refusals before sending.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "helpers.hpp"
#include "redlimit/calendar.hpp"
#include "redlimit/events.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit_test/fixture.hpp"
#include "topology/key_slot.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::hours;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

class LimiterTest : public RedisTest {
 protected:
  // Takes one permit at a time from `key` until a denial; returns how many were granted.
  static std::int64_t exhaust(Limiter& limiter, const std::string& key) {
    std::int64_t granted = 0;
    while (granted <= limiter.policy().limit() + 1 && limiter.tryAcquire(key)) ++granted;
    return granted;
  }
};

// --- Every policy through every operation ---------------------------------------------------------

// Five permits at once and about one a day back: nothing refills during a test.
// kGranted: how many one-permit takes a fresh key grants before the first denial.
struct GcraPolicy {
  static Policy make() { return Policy::gcra(1, hours(24), 5); }
  static constexpr std::int64_t kGranted = 5;
};
struct TokenBucketPolicy {
  static Policy make() { return Policy::tokenBucket(5, 1, hours(24)); }
  static constexpr std::int64_t kGranted = 5;
};
struct FixedWindowPolicy {
  static Policy make() { return Policy::fixedWindow(5, hours(24)); }
  static constexpr std::int64_t kGranted = 5;
};
// Aligned to UTC midnight like the fixed window; a fresh key has no previous window to weigh.
struct SlidingWindowPolicy {
  static Policy make() { return Policy::slidingWindow(5, hours(24)); }
  static constexpr std::int64_t kGranted = 5;
};
// Guava's bursty limiter storing 5 permits (one per 5 h, 25 h of burst); as Guava's, it lends the
// next permit ahead, so a sixth take is granted and the seventh pays its debt.
struct SmoothPolicy {
  static Policy make() { return Policy::smoothBursty(1, hours(5), hours(25)); }
  static constexpr std::int64_t kGranted = 6;
};

template <class P>
class LimiterPolicies : public LimiterTest {};
using Policies = ::testing::Types<GcraPolicy, TokenBucketPolicy, FixedWindowPolicy, SlidingWindowPolicy, SmoothPolicy>;
TYPED_TEST_SUITE(LimiterPolicies, Policies);

TYPED_TEST(LimiterPolicies, DecideTakesUntilTheLimitThenDeniesWithARetryAfter) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  const std::int64_t limit = limiter.policy().limit();
  ASSERT_EQ(limit, 5);
  for (std::int64_t i = 0; i < TypeParam::kGranted; ++i) {
    const Decision d = limiter.decide("u");
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.remaining, std::max<std::int64_t>(limit - 1 - i, 0));
    EXPECT_EQ(d.limit, limit);
  }
  const Decision denied = limiter.decide("u");
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_TRUE(limiter.tryAcquire("v")) << "another key has its own state";
}

TYPED_TEST(LimiterPolicies, DecideAsyncAnswersAsDecideDoes) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  for (std::int64_t i = 0; i < TypeParam::kGranted; ++i) ASSERT_TRUE(limiter.decideAsync("u").get().allowed) << i;
  EXPECT_FALSE(limiter.decideAsync("u").get().allowed);
  std::promise<Decision> seen;
  limiter.decideAsync("v", 1, [&](Decision d, const std::exception_ptr& e) {
    if (e) {
      seen.set_exception(e);
    } else {
      seen.set_value(d);
    }
  });
  EXPECT_TRUE(seen.get_future().get().allowed);
}

TYPED_TEST(LimiterPolicies, PeekWritesNothingAndRefundGivesBack) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  const std::int64_t limit = limiter.policy().limit();
  EXPECT_TRUE(limiter.peek("u").allowed);
  EXPECT_EQ(limiter.peek("u").remaining, limit) << "the permits there now";
  EXPECT_EQ(this->raw({"EXISTS", limiter.redisKey("u")}).integer, 0) << "peek writes nothing";
  ASSERT_TRUE(limiter.tryAcquire("u", 2));
  EXPECT_EQ(limiter.peek("u").remaining, limit - 2);
  limiter.refund("u", 2);
  EXPECT_EQ(limiter.peek("u").remaining, limit);
}

TYPED_TEST(LimiterPolicies, ReserveSaysTheDelayAndTryAcquireWithATimeoutWaitsNoLongerThanItFits) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  ASSERT_EQ(LimiterTest::exhaust(limiter, "u"), TypeParam::kGranted);
  if (!limiter.policy().canWait()) {
    const std::int64_t before = this->scriptCalls();
    EXPECT_THROW((void)limiter.reserve("u", 1, microseconds(0)), InvalidArgument);
    EXPECT_THROW((void)limiter.tryAcquire("u", 1, milliseconds(1)), InvalidArgument);
    EXPECT_THROW((void)limiter.acquire("w"), InvalidArgument);
    EXPECT_THROW((void)limiter.reserveAsync("u", 1, microseconds(0)).get(), InvalidArgument);
    EXPECT_EQ(this->scriptCalls(), before) << "nothing sent";
    return;
  }
  const Decision now = limiter.reserve("u", 1, microseconds(0));
  EXPECT_FALSE(now.allowed) << "nothing within no wait";
  EXPECT_FALSE(limiter.tryAcquire("u", 1, milliseconds(1))) << "the next permit is hours away";
  const Decision async = limiter.reserveAsync("u", 1, microseconds(0)).get();
  EXPECT_FALSE(async.allowed);
  const Decision fresh = limiter.reserve("v", 1, microseconds(0));
  EXPECT_TRUE(fresh.allowed);
  EXPECT_EQ(fresh.delay.count(), 0);
  EXPECT_EQ(limiter.acquire("w").count(), 0) << "available at once: no sleep";
}

TYPED_TEST(LimiterPolicies, ReserveForAndSettleHoldThenGiveBackOnceOrAreRefusedBeforeSending) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  const std::int64_t limit = limiter.policy().limit();
  if (!limiter.policy().canHold()) {
    const std::int64_t before = this->scriptCalls();
    EXPECT_THROW((void)limiter.reserveFor("u", 1, "order-1"), InvalidArgument);
    EXPECT_THROW((void)limiter.settle("u", "order-1", 1), InvalidArgument);
    EXPECT_THROW((void)limiter.reserveForAsync("u", 1, "order-1").get(), InvalidArgument);
    EXPECT_THROW((void)limiter.settleAsync("u", "order-1", 1).get(), InvalidArgument);
    EXPECT_EQ(this->scriptCalls(), before) << "nothing sent";
    return;
  }
  const Decision held = limiter.reserveFor("u", 3, "order-1");
  ASSERT_TRUE(held.allowed);
  EXPECT_FALSE(held.repeated);
  EXPECT_TRUE(limiter.reserveFor("u", 3, "order-1").repeated) << "the same id answers the first";
  EXPECT_EQ(limiter.peek("u").remaining, limit - 3);
  const Settlement s = limiter.settle("u", "order-1", 1);
  EXPECT_EQ(s.status, Settlement::Status::Settled);
  EXPECT_EQ(s.returned, 2);
  EXPECT_EQ(limiter.settle("u", "order-1", 1).status, Settlement::Status::AlreadySettled);
  EXPECT_EQ(limiter.peek("u").remaining, limit - 1);
  // Async, and cancel.
  const Decision second = limiter.reserveForAsync("u", 2, "order-2").get();
  ASSERT_TRUE(second.allowed);
  EXPECT_EQ(limiter.settleAsync("u", "order-2", 2).get().status, Settlement::Status::Settled);
  ASSERT_TRUE(limiter.reserveFor("v", 2, "order-3").allowed);
  EXPECT_EQ(limiter.cancel("v", "order-3").returned, 2);
}

TYPED_TEST(LimiterPolicies, DeleteKeyStartsTheKeyFull) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  ASSERT_EQ(LimiterTest::exhaust(limiter, "u"), TypeParam::kGranted);
  EXPECT_TRUE(limiter.deleteKey("u"));
  EXPECT_FALSE(limiter.deleteKey("u"));
  EXPECT_EQ(LimiterTest::exhaust(limiter, "u"), TypeParam::kGranted);
}

TYPED_TEST(LimiterPolicies, ExistsSaysWhetherTheKeyHasStateAndWritesNothing) {
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make());
  EXPECT_FALSE(limiter.exists("u"));
  EXPECT_EQ(this->raw({"EXISTS", limiter.redisKey("u")}).integer, 0) << "exists writes nothing";
  ASSERT_TRUE(limiter.tryAcquire("u"));
  EXPECT_TRUE(limiter.exists("u"));
  EXPECT_FALSE(limiter.exists("v")) << "another key";
  EXPECT_TRUE(limiter.deleteKey("u"));
  EXPECT_FALSE(limiter.exists("u"));
  EXPECT_THROW((void)limiter.exists(""), InvalidArgument);
}

TYPED_TEST(LimiterPolicies, PeekRefundAndDeleteKeyAsyncAnswerAsTheirSyncForms) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter::Options options;
  options.monitor.registry = registry;
  Limiter limiter(this->client(), this->limiterName(), TypeParam::make(), options);
  const std::int64_t limit = limiter.policy().limit();
  ASSERT_TRUE(limiter.tryAcquire("u", 2));
  EXPECT_TRUE(limiter.existsAsync("u").get());
  EXPECT_EQ(limiter.peekAsync("u").get().remaining, limit - 2);
  EXPECT_EQ(limiter.peekAsync("u", 2).get().remaining, limiter.peek("u", 2).remaining);
  EXPECT_TRUE(limiter.refundAsync("u", 2).get());
  EXPECT_EQ(limiter.peek("u").remaining, limit) << "given back";
  EXPECT_EQ(registry->snapshot(limiter.name()).permitsRefunded, 2u) << "counted as refund() counts";
  std::promise<bool> deleted;
  limiter.deleteKeyAsync("u", [&](bool existed, const std::exception_ptr& e) {
    if (e) {
      deleted.set_exception(e);
    } else {
      deleted.set_value(existed);
    }
  });
  EXPECT_TRUE(deleted.get_future().get());
  EXPECT_FALSE(limiter.existsAsync("u").get());
  EXPECT_FALSE(limiter.deleteKeyAsync("u").get()) << "nothing left to delete";
  // Refused before anything is sent, through the future.
  const std::int64_t calls = this->scriptCalls();
  EXPECT_THROW((void)limiter.refundAsync("u", limiter.policy().maxPermits() + 1).get(), InvalidArgument);
  EXPECT_THROW((void)limiter.refundAsync("u", -1).get(), InvalidArgument);
  EXPECT_THROW((void)limiter.peekAsync("", 1).get(), InvalidArgument);
  EXPECT_THROW((void)limiter.deleteKeyAsync("").get(), InvalidArgument);
  EXPECT_THROW((void)limiter.heldAsync("u").get(), InvalidArgument) << "held is a lease policy's";
  EXPECT_EQ(this->scriptCalls(), calls);
}

// --- A concurrency policy: leases -----------------------------------------------------------------

TEST_F(LimiterTest, AConcurrencyPolicyGivesLeasesUpToItsLimitPerKeyAndTakesThemBack) {
  Limiter inFlight(client(), limiterName(), Policy::concurrency(2, std::chrono::seconds(30)));
  LeaseDecision first = inFlight.acquireLease("u");
  ASSERT_TRUE(first.decision.allowed);
  ASSERT_TRUE(first.lease.has_value());
  const LeaseDecision second = inFlight.acquireLeaseAsync("u").get();
  ASSERT_TRUE(second.lease.has_value());
  const LeaseDecision third = inFlight.acquireLease("u");
  EXPECT_FALSE(third.decision.allowed);
  EXPECT_FALSE(third.lease.has_value());
  EXPECT_GT(third.decision.retryAfter.count(), 0) << "until the first lease expires";
  EXPECT_TRUE(inFlight.acquireLease("v").decision.allowed) << "another key has its own places";
  EXPECT_EQ(inFlight.held("u"), 2);
  const std::chrono::microseconds expiry = first.lease->expiresAt;
  EXPECT_TRUE(inFlight.renew("u", *first.lease, std::chrono::seconds(60)));
  EXPECT_GT(first.lease->expiresAt, expiry);
  const std::optional<Lease> renewed = inFlight.renewAsync("u", *second.lease).get();
  ASSERT_TRUE(renewed.has_value());
  EXPECT_TRUE(inFlight.release("u", *first.lease));
  EXPECT_FALSE(inFlight.release("u", *first.lease)) << "released once";
  EXPECT_TRUE(inFlight.releaseAsync("u", *renewed).get());
  EXPECT_EQ(inFlight.held("u"), 0);
  EXPECT_FALSE(inFlight.renew("u", *first.lease)) << "a released lease is not renewed";
  EXPECT_TRUE(inFlight.exists("v"));
  EXPECT_TRUE(inFlight.deleteKey("v"));
  EXPECT_FALSE(inFlight.exists("v"));
}

TEST_F(LimiterTest, AConcurrencyPolicysHeldAndDeleteKeyHaveAsyncForms) {
  Limiter inFlight(client(), limiterName(), Policy::concurrency(3, std::chrono::seconds(30)));
  ASSERT_TRUE(inFlight.acquireLease("u").lease.has_value());
  ASSERT_TRUE(inFlight.acquireLease("u").lease.has_value());
  EXPECT_EQ(inFlight.heldAsync("u").get(), 2);
  EXPECT_EQ(inFlight.heldAsync("v").get(), 0);
  EXPECT_TRUE(inFlight.existsAsync("u").get());
  EXPECT_TRUE(inFlight.deleteKeyAsync("u").get());
  EXPECT_EQ(inFlight.heldAsync("u").get(), 0) << "every lease of the key is gone";
  EXPECT_FALSE(inFlight.existsAsync("u").get());
  EXPECT_THROW((void)inFlight.peekAsync("u").get(), InvalidArgument) << "a lease policy takes no permits";
  EXPECT_THROW((void)inFlight.refundAsync("u", 1).get(), InvalidArgument);
}

TEST_F(LimiterTest, EachPolicyRefusesTheOperationsItHasNotBeforeSending) {
  Limiter leases(client(), limiterName("leases"), Policy::concurrency(2, std::chrono::seconds(30)));
  Limiter permits(client(), limiterName("permits"), Policy::perSecond(10));
  Lease lease;
  lease.id = std::string(32, 'a');
  const std::int64_t before = scriptCalls();
  EXPECT_THROW((void)leases.decide("u"), InvalidArgument);
  EXPECT_THROW((void)leases.tryAcquire("u"), InvalidArgument);
  EXPECT_THROW((void)leases.tryAcquire("u", 1, milliseconds(10)), InvalidArgument);
  EXPECT_THROW((void)leases.acquire("u"), InvalidArgument);
  EXPECT_THROW((void)leases.reserve("u", 1, microseconds(0)), InvalidArgument);
  EXPECT_THROW((void)leases.peek("u"), InvalidArgument);
  EXPECT_THROW(leases.refund("u", 1), InvalidArgument);
  EXPECT_THROW((void)leases.reserveFor("u", 1, "id"), InvalidArgument);
  EXPECT_THROW((void)leases.settle("u", "id", 1), InvalidArgument);
  EXPECT_THROW((void)leases.decideAsync("u").get(), InvalidArgument);
  EXPECT_THROW((void)leases.reserveAsync("u", 1, microseconds(0)).get(), InvalidArgument);
  EXPECT_THROW((void)leases.reserveForAsync("u", 1, "id").get(), InvalidArgument);
  EXPECT_THROW((void)permits.acquireLease("u"), InvalidArgument);
  EXPECT_THROW((void)permits.renew("u", lease), InvalidArgument);
  EXPECT_THROW((void)permits.release("u", lease), InvalidArgument);
  EXPECT_THROW((void)permits.held("u"), InvalidArgument);
  EXPECT_THROW((void)permits.acquireLeaseAsync("u").get(), InvalidArgument);
  EXPECT_THROW((void)permits.renewAsync("u", lease).get(), InvalidArgument);
  EXPECT_THROW((void)permits.releaseAsync("u", lease).get(), InvalidArgument);
  EXPECT_THROW((void)leases.acquireLease("u", milliseconds(0)), InvalidArgument) << "a lease TTL of 0";
  Limiter daily(client(), limiterName("daily"), Policy::calendar(10, CalendarUnit::Day, "UTC"));
  EXPECT_THROW((void)daily.tryAcquire("u", 1, milliseconds(10)), InvalidArgument) << "no permit ahead of time";
  EXPECT_THROW((void)daily.acquire("u"), InvalidArgument);
  EXPECT_THROW((void)daily.reserve("u", 1, microseconds(0)), InvalidArgument);
  EXPECT_THROW((void)daily.reserveAsync("u", 1, microseconds(0)).get(), InvalidArgument);
  EXPECT_THROW((void)daily.acquireLease("u"), InvalidArgument);
  EXPECT_THROW((void)daily.decide("u", 11), InvalidArgument) << "above the limit";
  EXPECT_THROW((void)MultiLimit({daily, permits}).on({"u", "u"}).reserve(1, microseconds(0)), InvalidArgument)
      << "in a MultiLimit neither";
  EXPECT_THROW((void)Policy::calendar(10, CalendarUnit::Day, "Mars/Olympus"), InvalidArgument);
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
}

// The policy's refusal is checked first, before the key and the permits, in every form; an async
// form's refusal reaches its callback once, on the calling thread, and a callback that throws on
// it is reported once.
TEST_F(LimiterTest, APolicysRefusalComesBeforeABadKeyOrPermitsInEveryFormAndReachesTheCallbackOnce) {
  std::atomic<int> threw{0};
  Limiter::Options options;
  options.monitor.onEvent = [&](const Event& e) {
    if (e.kind == Event::Kind::CallbackThrew) threw.fetch_add(1);
  };
  Limiter leases(client(), limiterName("leases"), Policy::concurrency(2, std::chrono::seconds(30)), options);
  Limiter permits(client(), limiterName("permits"), Policy::perSecond(10));
  Limiter daily(client(), limiterName("daily"), Policy::calendar(10, CalendarUnit::Day, "UTC"));
  Limiter smooth(client(), limiterName("smooth"), SmoothPolicy::make());
  const auto refusal = [](auto&& call) {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  const auto says = [](const std::string& message, std::string_view part) {
    return message.find(part) != std::string::npos;
  };
  const std::int64_t before = scriptCalls();
  const std::string gives = "its concurrency policy gives leases";
  EXPECT_PRED2(says, refusal([&] { (void)leases.decide("", 0); }), gives);
  EXPECT_PRED2(says, refusal([&] { (void)leases.reserve("", 0, microseconds(-1)); }), gives);
  EXPECT_PRED2(says, refusal([&] { (void)leases.reserveAsync("", 0, microseconds(-1)).get(); }), "reserveAsync");
  EXPECT_PRED2(says, refusal([&] { (void)leases.tryAcquire("", 0, milliseconds(10)); }), gives);
  EXPECT_PRED2(says, refusal([&] { (void)leases.reserveFor("", 0, "a b"); }), gives);
  EXPECT_PRED2(says, refusal([&] { (void)leases.settleAsync("", "a b", -1).get(); }), gives);
  EXPECT_PRED2(says, refusal([&] { leases.refund("", 99); }), gives);
  EXPECT_PRED2(says, refusal([&] { (void)leases.refundAsync("", -1).get(); }), "refundAsync");
  EXPECT_PRED2(says, refusal([&] { (void)permits.heldAsync("").get(); }), "heldAsync works on leases");
  EXPECT_PRED2(says, refusal([&] { (void)permits.acquireLease("", milliseconds(0)); }), "works on leases");
  EXPECT_PRED2(says, refusal([&] { (void)daily.reserveAsync("", 0, microseconds(-1)).get(); }), "calendar quota");
  EXPECT_PRED2(says, refusal([&] { (void)daily.acquire(""); }), "calendar quota");
  EXPECT_PRED2(says, refusal([&] { (void)smooth.reserveForAsync("", 0, "a b").get(); }), "smooth policy");
  EXPECT_PRED2(says, refusal([&] { (void)smooth.recordKey("", "a b"); }), "smooth policy");
  EXPECT_PRED2(says, refusal([&] { permits.refund("", 11); }), "permits to refund must be in 0..10");
  EXPECT_THROW((void)permits.refundAsync("", 0).get(), InvalidArgument) << "a bad key, though nothing to give back";
  EXPECT_THROW((void)permits.existsAsync("").get(), InvalidArgument);

  int runs = 0;
  leases.peekAsync("", 1, [&](const Decision&, const std::exception_ptr& e) {
    ++runs;
    EXPECT_PRED2(says, refusal([&] { std::rethrow_exception(e); }), "peekAsync takes permits");
    throw std::runtime_error("the callback throws");
  });
  leases.deleteKeyAsync("", [&](bool, const std::exception_ptr& e) {
    ++runs;
    EXPECT_TRUE(e != nullptr);
    throw std::runtime_error("the callback throws");
  });
  EXPECT_EQ(runs, 2) << "on the calling thread, before the call returned, once each";
  EXPECT_EQ(threw.load(), 2) << "each throw reported once";
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
}

// --- A calendar policy ------------------------------------------------------------------------

// On Redis's clock: should Berlin's midnight fall inside a run, the run is made again on a fresh
// key (a second midnight cannot follow within the same seconds).
TEST_F(LimiterTest, ACalendarPolicyTakesHoldsSettlesAndRefundsPerKeyInItsZone) {
  const Policy daily = Policy::calendar(10, CalendarUnit::Day, "Europe/Berlin");
  Limiter quota(client(), limiterName(), daily);
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 2) << "two Berlin midnights within one test";
    const std::string key = "tenant-" + std::to_string(attempt);
    const Decision first = quota.decide(key, 3);
    ASSERT_TRUE(first.allowed);
    const Decision held = quota.reserveFor(key, 4, "r1");
    const Settlement settled = quota.settle(key, "r1", 1);
    quota.refund(key, 1);
    const Decision async = quota.decideAsync(key, 1).get();
    const Decision heldAsync = quota.reserveForAsync(key, 2, "r2").get();
    const Settlement settledAsync = quota.settleAsync(key, "r2", 2).get();
    const Decision last = quota.peek(key);
    if (daily.windowAt(first.time).label != daily.windowAt(last.time).label) continue;
    EXPECT_EQ(first.remaining, 7);
    EXPECT_TRUE(held.allowed);
    EXPECT_EQ(held.remaining, 3);
    EXPECT_EQ(settled.status, Settlement::Status::Settled);
    EXPECT_EQ(settled.returned, 3);
    EXPECT_TRUE(async.allowed);
    EXPECT_EQ(async.remaining, 6) << "3 + 1 settled - 1 refunded + 1";
    EXPECT_TRUE(heldAsync.allowed);
    EXPECT_EQ(settledAsync.returned, 0);
    EXPECT_EQ(last.remaining, 4);
    EXPECT_EQ(quota.recordKey(key, "r1").rfind("rl::rsv:r1:", 0), 0u) << quota.recordKey(key, "r1");
    EXPECT_EQ(raw({"EXISTS", quota.recordKey(key, "r1")}).integer, 1);
    EXPECT_TRUE(quota.exists(key));
    EXPECT_TRUE(quota.deleteKey(key));
    EXPECT_FALSE(quota.exists(key));
    return;
  }
}

// --- The namespace ------------------------------------------------------------------------------

TEST_F(LimiterTest, TwoLimitersWithDifferentNamesNeverShareStateWhateverKeysTheirCallersPass) {
  Limiter login(client(), limiterName("login"), Policy::perMinute(20));
  Limiter search(client(), limiterName("search"), Policy::perMinute(5));
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(login.tryAcquire("user:1")) << i;
  EXPECT_FALSE(login.tryAcquire("user:1"));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(search.tryAcquire("user:1")) << "search has its own bucket, " << i;
  EXPECT_NE(login.redisKey("user:1"), search.redisKey("user:1"));
  EXPECT_EQ(login.redisKey("user:1"), "rl:" + login.name() + ":user:1");
  EXPECT_EQ(raw({"EXISTS", "user:1"}).integer, 0) << "the caller's key as given is never written";
  // A caller key that spells another limiter's name reaches only its own limiter's namespace.
  const std::string spelled = search.name() + ":user:1";
  EXPECT_TRUE(login.tryAcquire(spelled));
  EXPECT_EQ(search.peek("user:1").remaining, 0) << "search's key was not touched";
}

TEST_F(LimiterTest, ANameWithAColonIsRefusedSoTheSplitOfAKeyIsUnique) {
  try {
    Limiter bad(client(), "api:login", Policy::perSecond(10));
    ADD_FAILURE() << "a name with ':' was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("api.login"), std::string::npos) << e.what();
  }
}

TEST_F(LimiterTest, NoCallerKeyReachesAReservationRecord) {
  Limiter limiter(client(), limiterName(), Policy::tokenBucket(10, 1, hours(24)));
  ASSERT_TRUE(limiter.reserveFor("u", 4, "order-1").allowed);
  const std::string record = limiter.recordKey("u", "order-1");
  EXPECT_EQ(record.rfind("rl::rsv:order-1:", 0), 0u) << record;
  EXPECT_EQ(raw({"EXISTS", record}).integer, 1);
  const std::string before = raw({"GET", record}).str;
  // Keys spelled like the record, or like its parts, are keys of their own.
  for (const std::string& k : {record, std::string(":rsv:order-1"), std::string("u:rsv:order-1"),
                               record.substr(std::string("rl:").size() + limiter.name().size() + 1)}) {
    EXPECT_TRUE(limiter.tryAcquire(k, 10)) << k;
    EXPECT_NE(limiter.redisKey(k), record);
  }
  EXPECT_EQ(raw({"GET", record}).str, before) << "the record is as the reservation left it";
  EXPECT_EQ(limiter.settle("u", "order-1", 1).returned, 3);
}

TEST_F(LimiterTest, AHashTagInTheKeyPutsOneUsersKeysOfEveryLimiterInOneSlot) {
  Limiter login(client(), limiterName("login"), Policy::perSecond(5));
  Limiter search(client(), limiterName("search"), Policy::perSecond(5));
  EXPECT_EQ(detail::keySlot(login.redisKey("{user42}")), detail::keySlot(search.redisKey("{user42}")));
  EXPECT_EQ(detail::keySlot(login.recordKey("{user42}", "id")), detail::keySlot(login.redisKey("{user42}")));
  EXPECT_EQ(detail::keySlot(login.recordKey("user42", "id")), detail::keySlot(login.redisKey("user42")));
}

// --- Refusals before sending --------------------------------------------------------------------

TEST_F(LimiterTest, BadKeysPermitsAndIdsAreRefusedBeforeAnythingIsSent) {
  Limiter limiter(client(), limiterName(), Policy::perSecond(10));
  const std::int64_t before = scriptCalls();
  EXPECT_THROW((void)limiter.decide(""), InvalidArgument);
  EXPECT_THROW((void)limiter.decide(std::string(1025, 'k')), InvalidArgument);
  EXPECT_THROW((void)limiter.decide("u", 0), InvalidArgument);
  EXPECT_THROW((void)limiter.decide("u", 11), InvalidArgument) << "above the burst";
  EXPECT_THROW((void)limiter.peek("u", 11), InvalidArgument);
  EXPECT_THROW(limiter.refund("u", -1), InvalidArgument);
  EXPECT_THROW(limiter.refund("u", 11), InvalidArgument);
  EXPECT_THROW((void)limiter.reserve("u", 1, microseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)limiter.reserveFor("u", 1, "a:b"), InvalidArgument) << "':' in an id";
  EXPECT_THROW((void)limiter.reserveFor("u", 1, ""), InvalidArgument);
  EXPECT_THROW((void)limiter.reserveFor("a}b", 1, "id"), InvalidArgument) << "no record could share its slot";
  EXPECT_THROW((void)limiter.settle("u", "id", -1), InvalidArgument);
  EXPECT_THROW((void)limiter.decideAsync("", 1).get(), InvalidArgument);
  EXPECT_THROW((void)limiter.decideAsync("u", 0).get(), InvalidArgument);
  EXPECT_THROW((void)limiter.reserveForAsync("u", 1, "a b").get(), InvalidArgument);
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
}

TEST_F(LimiterTest, ARefundAboveTheLimitOfACalendarPolicyIsRefusedBeforeSendingNamingTheLimiter) {
  Limiter daily(client(), limiterName("daily"), Policy::calendar(10, CalendarUnit::Day, "UTC"));
  const std::int64_t before = scriptCalls();
  try {
    daily.refund("u", 11);
    ADD_FAILURE() << "a refund above the limit was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(daily.name()), std::string::npos) << e.what();
  }
  EXPECT_THROW(daily.refund("u", -1), InvalidArgument);
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
}

TEST_F(LimiterTest, BadPoliciesAreRefusedWhenMade) {
  EXPECT_THROW((void)Policy::gcra(0, std::chrono::seconds(1), 1), InvalidArgument);
  EXPECT_THROW((void)Policy::gcra(1, milliseconds(0), 1), InvalidArgument);
  EXPECT_THROW((void)Policy::perSecond(10, -1), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(0, 1, std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW((void)Policy::fixedWindow(1, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(1, std::chrono::seconds(1), milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(1, std::chrono::seconds(1), std::chrono::seconds(1), 0), InvalidArgument);
  EXPECT_THROW((void)Policy::perSecond(10).keepAlive(milliseconds(0)), InvalidArgument);
  EXPECT_EQ(Policy::perSecond(10), Policy::gcra(10, std::chrono::seconds(1), 10));
  EXPECT_NE(Policy::perSecond(10), Policy::perSecond(10).permanent());
  EXPECT_EQ(Policy::perMinute(100, 20).limit(), 20);
}

TEST_F(LimiterTest, AKeyIdleForItsKeepAliveExpiresAndAPermanentOneStays) {
  Limiter idle(client(), limiterName("idle"), Policy::perSecond(1000).keepAlive(milliseconds(50)));
  Limiter kept(client(), limiterName("kept"), Policy::perSecond(1000).permanent());
  ASSERT_TRUE(idle.tryAcquire("u"));
  ASSERT_TRUE(kept.tryAcquire("u"));
  EXPECT_GT(raw({"PTTL", idle.redisKey("u")}).integer, 0);
  EXPECT_EQ(raw({"PTTL", kept.redisKey("u")}).integer, -1);
}

}  // namespace
