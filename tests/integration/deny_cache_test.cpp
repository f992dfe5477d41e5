// The deny cache of Limiter and RateLimiter against a real Redis: a key Redis denied is answered
// locally, denied, until its retryAfter (no script call: INFO commandstats does not move), then goes
// to Redis again; this process's give-backs forget it; shadow mode lets a local denial through as
// it lets a Redis denial through; denyCacheKeys = 0 sends every call; a give-back by another
// process costs at most the documented false denials (until the retryAfter remembered).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include "helpers.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::hours;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

constexpr int kLocalCalls = 20;

// Options counting into a registry of the test's own, and what it counted for a limiter.
template <class L>
class DenyCacheTest : public RedisTest {
 protected:
  typename L::Options options() {
    typename L::Options o;
    o.monitor.registry = registry_;
    return o;
  }
  LimiterMetrics::Snapshot stats(const L& l) const {
    if constexpr (std::is_same_v<L, Limiter>) {
      return registry_->snapshot(l.name());
    } else {
      return registry_->snapshot(l.getName());
    }
  }
  std::shared_ptr<MetricsRegistry> registry_ = std::make_shared<MetricsRegistry>();
};
using LimiterDenyCache = DenyCacheTest<Limiter>;
using RateLimiterDenyCache = DenyCacheTest<RateLimiter>;

// Sync and async decide under each policy whose denial's retryAfter is exact: after Redis's
// denial, kLocalCalls more of them send nothing and are counted as local denials.
TEST_F(LimiterDenyCache, AnswersARedisDenialLocallyUnderEveryRatePolicy) {
  const Policy policies[] = {Policy::gcra(1, hours(24), 2), Policy::tokenBucket(2, 1, hours(24)),
                             Policy::fixedWindow(2, hours(24)), Policy::smoothBursty(1, hours(5), hours(5)),
                             Policy::calendar(2, CalendarUnit::Day, "UTC")};
  int i = 0;
  for (const Policy& policy : policies) {
    SCOPED_TRACE(i);
    Limiter limiter(client(), limiterName(std::to_string(i++)), policy, options());
    Decision first;
    do {
      first = limiter.decide("k");
    } while (first.allowed);  // until Redis's denial, remembered
    ASSERT_FALSE(first.byPolicy);
    ASSERT_GT(first.retryAfter.count(), 0);
    const std::int64_t sent = scriptCalls();
    for (int n = 0; n < kLocalCalls; ++n) {
      const Decision d = n % 2 == 0 ? limiter.decide("k") : limiter.decideAsync("k").get();
      EXPECT_FALSE(d.allowed);
      EXPECT_GT(d.retryAfter.count(), 0);
      EXPECT_LE(d.retryAfter, first.retryAfter);
      EXPECT_EQ(d.limit, first.limit);
      EXPECT_FALSE(limiter.tryAcquire("k"));
    }
    EXPECT_EQ(scriptCalls(), sent) << "the local denials sent nothing";
    EXPECT_EQ(stats(limiter).localDenials, static_cast<std::uint64_t>(2 * kLocalCalls));
    EXPECT_EQ(stats(limiter).denied, static_cast<std::uint64_t>(2 * kLocalCalls + 1));  // with Redis's
  }
}

// A sync decide in a completion callback (on the Client's I/O thread) is refused as it is for a
// key the cache does not hold, never answered from the cache: the callback fails the same way
// whatever was denied lately.
TEST_F(LimiterDenyCache, ASyncDecideOnTheIoThreadIsRefusedEvenForADeniedKey) {
  Limiter limiter(client(), limiterName(), Policy::gcra(1, hours(24), 1), options());
  RateLimiter rl(client(), name(), RateLimiter::Options{});
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, hours(24)));
  ASSERT_TRUE(limiter.decide("k").allowed);
  ASSERT_FALSE(limiter.decide("k").allowed);  // remembered
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_FALSE(rl.decide(1).allowed);  // remembered
  std::promise<int> refused;
  limiter.decideAsync("other", 1, [&](const Decision&, const std::exception_ptr&) {
    int n = 0;
    try {
      (void)limiter.decide("k");
    } catch (const InvalidArgument&) {
      ++n;
    }
    try {
      (void)rl.decide(1);
    } catch (const InvalidArgument&) {
      ++n;
    }
    refused.set_value(n);
  });
  EXPECT_EQ(refused.get_future().get(), 2);
  EXPECT_EQ(stats(limiter).localDenials, 0u);
}

TEST_F(LimiterDenyCache, GoesToRedisAgainOnceTheRetryAfterHasPassed) {
  Limiter limiter(client(), limiterName(), Policy::gcra(1, milliseconds(800), 1), options());
  ASSERT_TRUE(limiter.decide("k").allowed);
  const Decision first = limiter.decide("k");
  ASSERT_FALSE(first.allowed);
  const std::int64_t sent = scriptCalls();
  EXPECT_FALSE(limiter.decide("k").allowed);
  EXPECT_EQ(scriptCalls(), sent);
  std::this_thread::sleep_for(first.retryAfter);
  EXPECT_TRUE(limiter.decide("k").allowed);
  EXPECT_EQ(scriptCalls(), sent + 1) << "the call after the retryAfter reached Redis";
  EXPECT_EQ(stats(limiter).localDenials, 1u);
}

TEST_F(LimiterDenyCache, SendsPermitsBelowTheDeniedOnesToRedis) {
  Limiter limiter(client(), limiterName(), Policy::gcra(1, hours(24), 5), options());
  ASSERT_TRUE(limiter.decide("k", 3).allowed);
  ASSERT_FALSE(limiter.decide("k", 3).allowed);  // 2 left: denied, remembered for 3
  const std::int64_t sent = scriptCalls();
  EXPECT_FALSE(limiter.decide("k", 4).allowed);
  EXPECT_EQ(scriptCalls(), sent);
  EXPECT_TRUE(limiter.decide("k", 2).allowed);
  EXPECT_EQ(scriptCalls(), sent + 1);
  EXPECT_THROW((void)limiter.decide("k", 6), InvalidArgument) << "above the limit: refused, not denied locally";
}

TEST_F(LimiterDenyCache, SharesItsCacheWithItsCopies) {
  Limiter limiter(client(), limiterName(), Policy::fixedWindow(1, hours(24)), options());
  ASSERT_TRUE(limiter.decide("k").allowed);
  ASSERT_FALSE(limiter.decide("k").allowed);
  Limiter copy = limiter;
  const std::int64_t sent = scriptCalls();
  EXPECT_FALSE(copy.decide("k").allowed);
  EXPECT_EQ(scriptCalls(), sent);
}

TEST_F(LimiterDenyCache, SendsTheNextCallToRedisAfterEachGiveBackOfThisProcess) {
  Limiter limiter(client(), limiterName(), Policy::tokenBucket(2, 1, hours(24)), options());
  const auto exhaust = [&] {
    while (limiter.decide("k").allowed) {
    }
  };
  exhaust();
  limiter.refund("k", 1);
  EXPECT_TRUE(limiter.decide("k").allowed) << "refund";
  exhaust();
  EXPECT_TRUE(limiter.refundAsync("k", 1).get());
  EXPECT_TRUE(limiter.decide("k").allowed) << "refundAsync";
  exhaust();
  EXPECT_TRUE(limiter.deleteKey("k"));
  EXPECT_TRUE(limiter.decide("k").allowed) << "deleteKey";
  exhaust();
  EXPECT_TRUE(limiter.deleteKeyAsync("k").get());
  EXPECT_TRUE(limiter.decide("k").allowed) << "deleteKeyAsync";
  exhaust();
  ASSERT_FALSE(limiter.reserveFor("k", 1, "r1").allowed);
  limiter.refund("k", 1);
  ASSERT_TRUE(limiter.reserveFor("k", 1, "r1").allowed);
  exhaust();
  EXPECT_EQ(limiter.cancel("k", "r1").status, Settlement::Status::Settled);
  EXPECT_TRUE(limiter.decide("k").allowed) << "settle";
  EXPECT_EQ(stats(limiter).localDenials, 0u) << "every call after a give-back went to Redis";
}

TEST_F(LimiterDenyCache, ForgetsAKeyWhosePolicyThisProcessWrites) {
  Limiter limiter(client(), limiterName(), Policy::gcra(1, hours(24), 1).stored(), options());
  ASSERT_TRUE(limiter.trySetPolicy("k"));
  ASSERT_TRUE(limiter.decide("k").allowed);
  ASSERT_FALSE(limiter.decide("k").allowed);
  limiter.setPolicy("k", Policy::gcra(1, hours(24), 3).stored());
  EXPECT_TRUE(limiter.decide("k").allowed);
  EXPECT_EQ(stats(limiter).localDenials, 0u);
}

TEST_F(LimiterDenyCache, ShadowModeLetsALocalDenialThroughAsARedisOne) {
  Limiter::Options o = options();
  o.monitor.shadow = true;
  std::atomic<int> reported{0};
  o.monitor.onShadowDenial = [&](const LimiterMonitor::ShadowDenial& d) {
    EXPECT_GT(d.retryAfter.count(), 0);
    EXPECT_FALSE(d.byPolicy);
    ++reported;
  };
  Limiter limiter(client(), limiterName(), Policy::fixedWindow(1, hours(24)), o);
  ASSERT_TRUE(limiter.decide("k").allowed);
  const Decision first = limiter.decide("k");  // Redis denied: let through
  ASSERT_TRUE(first.allowed);
  ASSERT_TRUE(first.shadowDenied);
  const std::int64_t sent = scriptCalls();
  for (int n = 0; n < kLocalCalls; ++n) {
    const Decision d = n % 2 == 0 ? limiter.decide("k") : limiter.decideAsync("k").get();
    EXPECT_TRUE(d.allowed);
    EXPECT_TRUE(d.shadowDenied);
    EXPECT_LE(d.retryAfter, first.retryAfter);
  }
  EXPECT_EQ(scriptCalls(), sent);
  EXPECT_EQ(reported.load(), kLocalCalls + 1);
  const LimiterMetrics::Snapshot s = stats(limiter);
  EXPECT_EQ(s.localDenials, static_cast<std::uint64_t>(kLocalCalls));
  EXPECT_EQ(s.shadowDenied, static_cast<std::uint64_t>(kLocalCalls + 1));
  EXPECT_EQ(s.denied, static_cast<std::uint64_t>(kLocalCalls + 1));
}

TEST_F(LimiterDenyCache, SendsEveryCallWithZeroKeys) {
  Limiter::Options o = options();
  o.denyCacheKeys = 0;
  Limiter limiter(client(), limiterName(), Policy::fixedWindow(1, hours(24)), o);
  ASSERT_TRUE(limiter.decide("k").allowed);
  const std::int64_t sent = scriptCalls();
  for (int n = 0; n < kLocalCalls; ++n) EXPECT_FALSE(limiter.decide("k").allowed);
  EXPECT_EQ(scriptCalls(), sent + kLocalCalls);
  EXPECT_EQ(stats(limiter).localDenials, 0u);
}

TEST_F(LimiterDenyCache, RefusesACapAboveItsBound) {
  Limiter::Options o = options();
  o.denyCacheKeys = (std::size_t{1} << 24) + 1;
  EXPECT_THROW(Limiter(client(), limiterName(), Policy::fixedWindow(1, hours(24)), o), InvalidArgument);
  o.denyCacheKeys = std::size_t{1} << 24;
  EXPECT_NO_THROW(Limiter(client(), limiterName(), Policy::fixedWindow(1, hours(24)), o));
}

// Another process's refund is not seen: the key is denied locally at most until the retryAfter
// remembered (the documented bound), never granted locally, and granted by Redis after it.
TEST_F(LimiterDenyCache, AGiveBackElsewhereCostsAtMostTheRetryAfterOfFalseDenials) {
  Limiter limiter(client(), limiterName(), Policy::gcra(1, milliseconds(1500), 1), options());
  Limiter elsewhere(newClient(), limiter.name(), limiter.policy());
  ASSERT_TRUE(limiter.decide("k").allowed);
  const Decision first = limiter.decide("k");
  ASSERT_FALSE(first.allowed);
  elsewhere.refund("k", 1);
  EXPECT_TRUE(elsewhere.peek("k").allowed) << "Redis would grant now";
  const Decision local = limiter.decide("k");
  EXPECT_FALSE(local.allowed) << "a false denial, within the bound";
  EXPECT_LE(local.retryAfter, first.retryAfter);
  std::this_thread::sleep_for(local.retryAfter);
  EXPECT_TRUE(limiter.decide("k").allowed);
  EXPECT_EQ(stats(limiter).localDenials, 1u);
}

TEST_F(LimiterDenyCache, NeverRemembersADecisionOfTheFailurePolicy) {
  Limiter::Options o = options();
  o.failure.policy = FailurePolicy::Deny;
  o.failure.probeInterval = milliseconds(20);
  Limiter limiter(shortTimeoutClient(server(), milliseconds(100)), limiterName(), Policy::fixedWindow(1, hours(24)), o);
  ASSERT_TRUE(limiter.decide("warm").allowed);  // connected
  // An outage: the server stalls past the call's bound; Deny refuses the call.
  ClientOptions sleeperOptions;
  sleeperOptions.connection = parseUri(server().uri());
  sleeperOptions.connection.commandTimeout = milliseconds(5000);
  auto sleeper = Client::create(sleeperOptions);
  std::promise<void> stalling;
  std::thread stall([&] {
    stalling.set_value();
    (void)detail::command(*sleeper, {"DEBUG", "SLEEP", "0.5"});
  });
  stalling.get_future().wait();
  Decision d;
  std::string key;
  for (int i = 0; !d.byPolicy; ++i) {  // fresh keys (each granted by Redis) until the stall's start
    key = "k" + std::to_string(i);
    d = limiter.decide(key);
  }
  stall.join();
  EXPECT_FALSE(d.allowed);
  do {
    d = limiter.decide(key);  // that key's denial was the policy's: not remembered
  } while (d.byPolicy);       // until the failure gate lets a call reach Redis again
  EXPECT_EQ(stats(limiter).localDenials, 0u) << "Redis answered";
}

TEST_F(RateLimiterDenyCache, AnswersARedisDenialLocallyUntilItsRetryAfter) {
  RateLimiter rl(client(), name(), options());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(1500)));
  ASSERT_TRUE(rl.tryAcquire(2));
  const Decision first = rl.decide(1);
  const auto decided = std::chrono::steady_clock::now();
  ASSERT_FALSE(first.allowed);
  ASSERT_GT(first.retryAfter.count(), 0);
  const std::int64_t sent = scriptCalls();
  for (int n = 0; n < kLocalCalls; ++n) {
    switch (n % 4) {
      case 0: {
        const Decision d = rl.decide(1);
        EXPECT_FALSE(d.allowed);
        EXPECT_LE(d.retryAfter, first.retryAfter);
        EXPECT_EQ(d.limit, 2);
        break;
      }
      case 1:
        EXPECT_FALSE(rl.decideAsync(2).get().allowed);
        break;
      case 2:
        EXPECT_FALSE(rl.tryAcquire());
        break;
      default:
        EXPECT_FALSE(rl.tryAcquireAsync(1).get());
    }
  }
  EXPECT_EQ(scriptCalls(), sent) << "the local denials sent nothing";
  EXPECT_EQ(stats(rl).localDenials, static_cast<std::uint64_t>(kLocalCalls));
  std::this_thread::sleep_until(decided + first.retryAfter);
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_EQ(scriptCalls(), sent + 1) << "the call after the retryAfter reached Redis";
}

// Another handle's release is not seen: denied here at most until the retryAfter remembered.
TEST_F(RateLimiterDenyCache, AGiveBackElsewhereCostsAtMostTheRetryAfterOfFalseDenials) {
  RateLimiter rl(client(), name(), options());
  RateLimiter elsewhere(newClient(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, milliseconds(1500)));
  ASSERT_TRUE(rl.tryAcquire());
  const Decision first = rl.decide(1);
  const auto decided = std::chrono::steady_clock::now();
  ASSERT_FALSE(first.allowed);
  elsewhere.release(1);
  EXPECT_EQ(elsewhere.availablePermits(), 1) << "Redis would grant now";
  const Decision local = rl.decide(1);
  EXPECT_FALSE(local.allowed) << "a false denial, within the bound";
  EXPECT_LE(local.retryAfter, first.retryAfter);
  std::this_thread::sleep_until(decided + first.retryAfter);
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_EQ(stats(rl).localDenials, 1u);
}

TEST_F(RateLimiterDenyCache, SendsTheNextCallToRedisAfterEachGiveBackOrRateOfThisProcess) {
  RateLimiter rl(client(), name(), options());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_FALSE(rl.tryAcquire());
  rl.release(1);
  EXPECT_TRUE(rl.tryAcquire()) << "release";
  ASSERT_FALSE(rl.tryAcquire());
  rl.setRate(RateType::Overall, 2, hours(1), milliseconds(0), true);
  EXPECT_TRUE(rl.tryAcquire()) << "setRate";
  ASSERT_FALSE(rl.tryAcquire());
  EXPECT_TRUE(rl.deleteLimiter());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, hours(1)));
  EXPECT_TRUE(rl.tryAcquire()) << "deleteLimiter";
  EXPECT_EQ(stats(rl).localDenials, 0u);
}

TEST_F(RateLimiterDenyCache, TryAcquireWithATimeoutGoesToRedis) {
  RateLimiter rl(client(), name(), options());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_FALSE(rl.tryAcquire());
  const std::int64_t sent = scriptCalls();
  EXPECT_FALSE(rl.tryAcquire(1, milliseconds(1)));
  EXPECT_EQ(scriptCalls(), sent + 1);
}

TEST_F(RateLimiterDenyCache, SendsEveryCallWithZeroKeys) {
  RateLimiter::Options o = options();
  o.denyCacheKeys = 0;
  RateLimiter rl(client(), name(), o);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  const std::int64_t sent = scriptCalls();
  for (int n = 0; n < kLocalCalls; ++n) EXPECT_FALSE(rl.tryAcquire());
  EXPECT_EQ(scriptCalls(), sent + kLocalCalls);
  EXPECT_EQ(stats(rl).localDenials, 0u);
}

TEST_F(RateLimiterDenyCache, ShadowModeLetsALocalDenialThroughAsARedisOne) {
  RateLimiter::Options o = options();
  o.monitor.shadow = true;
  RateLimiter rl(client(), name(), o);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_TRUE(rl.tryAcquire());  // Redis denied: let through
  const std::int64_t sent = scriptCalls();
  for (int n = 0; n < kLocalCalls; ++n) {
    const Decision d = rl.decide(1);
    EXPECT_TRUE(d.allowed);
    EXPECT_TRUE(d.shadowDenied);
  }
  EXPECT_EQ(scriptCalls(), sent);
  EXPECT_EQ(stats(rl).shadowDenied, static_cast<std::uint64_t>(kLocalCalls + 1));
  EXPECT_EQ(stats(rl).localDenials, static_cast<std::uint64_t>(kLocalCalls));
}

}  // namespace
