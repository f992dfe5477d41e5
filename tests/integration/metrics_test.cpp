// Metrics, shadow mode and events against a real Redis: a known sequence of decisions, one outage
// under FailurePolicy::Deny, and every counter checked against what was done.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/metrics.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit/limiter.hpp"
#include "helpers.hpp"
#include "redlimit_test/fixture.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

class Metrics : public RedisTest {};

TEST_F(Metrics, AKnownSequenceWithOneOutageUnderDenyShowsInEveryMetric) {
  EventLog clientEvents, limiterEvents;
  ClientOptions co;
  co.connection = parseUri(server().uri());
  // A limiter call's bound is connectTimeout + commandTimeout: 200 ms, well inside the stall below.
  co.connection.connectTimeout = milliseconds(100);
  co.connection.commandTimeout = milliseconds(100);
  co.onEvent = clientEvents.callback();
  auto client = Client::create(co);
  auto registry = std::make_shared<MetricsRegistry>();
  RateLimiter::Options o;
  o.failure.policy = FailurePolicy::Deny;
  o.failure.probeInterval = milliseconds(20);
  o.monitor.registry = registry;
  o.monitor.onEvent = limiterEvents.callback();
  o.denyCacheKeys = 0;  // every denial reaches Redis: the outage below is met by a call to it
  const std::string n = name();
  RateLimiter rl(client, n, o);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 7, milliseconds(60000)));

  // N = 5 granted (all 7 permits: 1+1+1+2+2), M = 3 denied.
  for (std::int64_t p : {1, 1, 1, 2, 2}) EXPECT_TRUE(rl.tryAcquire(p));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(rl.tryAcquire());

  // One outage: the server stalls past the command timeout; Deny refuses that call.
  ClientOptions sleeperOptions;
  sleeperOptions.connection = parseUri(server().uri());
  sleeperOptions.connection.commandTimeout = milliseconds(3000);
  auto sleeper = Client::create(sleeperOptions);
  std::thread stall([&] { (void)detail::command(*sleeper, {"DEBUG", "SLEEP", "0.4"}); });
  sleepMs(50);
  EXPECT_FALSE(rl.tryAcquire());
  {
    const auto s = registry->snapshot(n);
    EXPECT_EQ(s.degraded, 1u);
    EXPECT_EQ(s.errorCount(ErrorKind::Timeout), 1u);
    EXPECT_EQ(s.policyDecisions(FailurePolicy::Deny, LimiterMetrics::PolicyOutcome::Denied), 1u);
  }
  stall.join();
  sleepMs(30);  // past the probe interval: the next call goes to Redis, which denies (7 of 7 used)
  EXPECT_FALSE(rl.tryAcquire());

  const auto s = registry->snapshot(n);
  EXPECT_EQ(s.limiter, n);
  EXPECT_EQ(s.granted, 5u);
  EXPECT_EQ(s.permitsGranted, 7u);
  EXPECT_EQ(s.denied, 5u);  // 3, the policy's, and the one after recovery
  EXPECT_EQ(s.shadowDenied, 0u);
  EXPECT_EQ(s.localHits, 0u);
  EXPECT_EQ(s.roundTrips, 10u);  // every deciding call went to Redis, the timed-out one included
  EXPECT_EQ(s.degraded, 0u);
  EXPECT_EQ(s.policyDecisions(FailurePolicy::Deny, LimiterMetrics::PolicyOutcome::Denied), 1u);
  std::uint64_t policyTotal = 0;
  for (const auto& byOutcome : s.policy)
    for (std::uint64_t c : byOutcome) policyTotal += c;
  EXPECT_EQ(policyTotal, 1u);
  std::uint64_t errorTotal = 0;
  for (std::uint64_t c : s.errors) errorTotal += c;
  EXPECT_EQ(errorTotal, 1u);
  EXPECT_EQ(s.errorCount(ErrorKind::Timeout), 1u);
  EXPECT_EQ(s.latency.count, 10u);
  // The timed-out call took about the command timeout: one observation in (50 ms, 250 ms].
  EXPECT_EQ(s.latency.counts[10] + s.latency.counts[11], 1u);
  EXPECT_GE(s.latency.sumSeconds, 0.09);
  EXPECT_EQ(rl.failureStats().denied, 1u) << "failureStats() still counts as before";

  // Events with causes, the same on the limiter and on the Client.
  for (const auto& events : {limiterEvents.all(), clientEvents.all()}) {
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].kind, Event::Kind::Health);
    EXPECT_EQ(events[0].health.kind, HealthEvent::Kind::Degraded);
    EXPECT_EQ(events[0].health.cause, HealthEvent::Cause::Outage);
    EXPECT_EQ(events[0].health.limiter, n);
    EXPECT_EQ(events[0].health.errorType, "redlimit::TimeoutError");
    EXPECT_NE(events[0].description.find("degraded by an outage"), std::string::npos) << events[0].description;
    EXPECT_EQ(events[1].health.kind, HealthEvent::Kind::Recovered);
    EXPECT_NE(events[1].description.find("recovered"), std::string::npos) << events[1].description;
  }
}

TEST_F(Metrics, AConfigurationErrorIsAnEventWithItsCause) {
  EventLog events;
  auto registry = std::make_shared<MetricsRegistry>();
  RateLimiter::Options o;
  o.failure.policy = FailurePolicy::Allow;
  o.monitor.registry = registry;
  o.monitor.onEvent = events.callback();
  RateLimiter rl(client(), name(), o);
  EXPECT_THROW((void)rl.tryAcquire(), NotInitializedError) << "no configuration: a reply error, not a health change";
  const auto s = registry->snapshot(rl.getName());
  EXPECT_EQ(s.errorCount(ErrorKind::Reply), 1u);
  EXPECT_EQ(s.granted + s.denied, 0u) << "an error is no decision";
  EXPECT_TRUE(events.all().empty());
}

TEST_F(Metrics, AScriptFlushIsAScriptReloadEventOfTheClientAndNoCallFails) {
  EventLog clientEvents, limiterEvents;
  ClientOptions co;
  co.connection = parseUri(server().uri());
  co.onEvent = clientEvents.callback();
  auto client = Client::create(co);
  RateLimiter::Options o;
  o.monitor.onEvent = limiterEvents.callback();
  RateLimiter rl(client, name(), o);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 100, milliseconds(60000)));
  ASSERT_TRUE(rl.tryAcquire());
  (void)raw({"SCRIPT", "FLUSH"});
  EXPECT_TRUE(rl.tryAcquire()) << "the reload is transparent to the caller";
  const auto reloads = clientEvents.of(Event::Kind::ScriptReload);
  ASSERT_EQ(reloads.size(), 1u);
  EXPECT_EQ(reloads[0].script, "acquire");
  EXPECT_EQ(reloads[0].node, "127.0.0.1:" + std::to_string(server().port()));
  EXPECT_NE(reloads[0].description.find("NOSCRIPT"), std::string::npos) << reloads[0].description;
  EXPECT_TRUE(limiterEvents.all().empty()) << "a reload is the connection's, not the limiter's health";
}

// The scripts a server was seen to hold are the library's, not a limiter's: a limiter made after
// another of its kind ran sees the flush as a reload too (the Client keeps pointers to the
// scripts, never into a limiter, which may be gone when a NOSCRIPT comes back).
TEST_F(Metrics, AScriptFlushIsAScriptReloadEventAlsoForALimiterMadeAfterItsScriptRan) {
  EventLog clientEvents;
  ClientOptions co;
  co.connection = parseUri(server().uri());
  co.onEvent = clientEvents.callback();
  auto client = Client::create(co);
  Limiter first(client, limiterName("first"), Policy::gcra(10, milliseconds(1000), 10));
  ASSERT_TRUE(first.decide("k").allowed);
  Limiter second(client, limiterName("second"), Policy::gcra(10, milliseconds(1000), 10));
  (void)raw({"SCRIPT", "FLUSH"});
  EXPECT_TRUE(second.decide("k").allowed) << "the reload is transparent to the caller";
  const auto reloads = clientEvents.of(Event::Kind::ScriptReload);
  ASSERT_EQ(reloads.size(), 1u) << "the server had gcra.lua: the flush took it";
  EXPECT_EQ(reloads[0].script, "gcra");
}

TEST_F(Metrics, ShadowModeAtTenPerTenSecondsOfferedAHundredCallsAllowsAllAndReportsNinety) {
  auto registry = std::make_shared<MetricsRegistry>();
  std::atomic<int> hook{0};
  LimiterMonitor::Options shadow;
  shadow.registry = registry;
  shadow.shadow = true;
  shadow.onShadowDenial = [&](const LimiterMonitor::ShadowDenial& d) {
    if (d.permits == 1 && !d.byPolicy) hook.fetch_add(1);
  };

  RateLimiter::Options ro;
  ro.monitor = shadow;
  RateLimiter rl(client(), name("redisson"), ro);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(10000)));
  Limiter::Options to;
  to.monitor = shadow;
  // A burst of 10, refilled over 10 s: a bucket refills continuously (at 10 per 1000 ms one token
  // every 100 ms, and the 100 calls take longer than that under TSan), so at one per second no
  // whole token comes back within the 900 ms the calls are given below.
  Limiter bucket(client(), limiterName("bucket"), Policy::tokenBucket(10, 10, milliseconds(10000)), to);
  RateLimiter segmentSource(client(), name("segment"), ro);
  ASSERT_TRUE(segmentSource.trySetRate(RateType::Overall, 10, milliseconds(10000)));
  SegmentOptions so;
  so.segmentSize = 5;
  so.returnWhenIdle = false;
  SegmentedRateLimiter<> segment(std::make_shared<RateLimiter>(segmentSource), so);

  int allowed[3] = {0, 0, 0};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) {
    allowed[0] += rl.tryAcquire() ? 1 : 0;
    allowed[1] += bucket.tryAcquire("k") ? 1 : 0;
    allowed[2] += segment.tryAcquire() ? 1 : 0;
  }
  const auto took = msSince(start);
  ASSERT_LT(took, 900) << "the 100 calls must fit in the limiter's second for the count to be 90";
  for (int a : allowed) EXPECT_EQ(a, 100);
  EXPECT_EQ(hook.load(), 270);
  for (const std::string& limiter : {rl.getName(), bucket.name(), segmentSource.getName()}) {
    const auto s = registry->snapshot(limiter);
    EXPECT_EQ(s.granted, 10u) << limiter;
    EXPECT_EQ(s.denied, 90u) << limiter;
    EXPECT_EQ(s.shadowDenied, 90u) << limiter;
  }
  EXPECT_EQ(registry->snapshot(segmentSource.getName()).localHits, 8u);
  // The permits really were taken: Redis holds the 10 granted ones, not 100.
  EXPECT_EQ(rl.availablePermits(), 0);
  const Decision peeked = bucket.peek("k");
  EXPECT_FALSE(peeked.allowed);
  // A Decision in shadow mode says what it would have been.
  const Decision d = rl.decide();
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.shadowDenied);
  EXPECT_GT(d.retryAfter.count(), 0);
  // Waiting calls do not wait in shadow mode.
  const auto before = std::chrono::steady_clock::now();
  EXPECT_TRUE(rl.tryAcquire(1, milliseconds(5000)));
  rl.acquire();
  (void)bucket.acquire("k");
  segment.acquire();
  // A wait would last until a permit of a 10 s interval comes back: seconds, not the half here.
  EXPECT_LT(msSince(before), 5000);
}

TEST_F(Metrics, AsyncDecisionsAndMultiLimitsAreCountedToo) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter::Options to;
  to.monitor.registry = registry;
  const Policy cfg = Policy::tokenBucket(3, 1, milliseconds(60000));
  Limiter a(client(), limiterName("a"), cfg, to);
  Limiter b(client(), limiterName("b"), cfg, to);
  int granted = 0;
  for (int i = 0; i < 5; ++i) granted += a.decideAsync("k", 1).get().allowed ? 1 : 0;
  EXPECT_EQ(granted, 3);
  const auto sa = registry->snapshot(a.name());
  EXPECT_EQ(sa.granted, 3u);
  EXPECT_EQ(sa.denied, 2u);
  EXPECT_EQ(sa.localDenials, 1u) << "the second denial: the deny cache's";
  EXPECT_EQ(sa.roundTrips, 4u);

  MultiLimit::Options mo;
  mo.monitor.registry = registry;
  mo.name = "both";
  MultiLimit both = MultiLimit({a, b}, mo).on({"k", "k"});
  EXPECT_FALSE(both.decide().allowed);  // a is empty
  EXPECT_FALSE(both.decideAsync().get().allowed);
  const auto sm = registry->snapshot("both");
  EXPECT_EQ(sm.denied, 2u);
  EXPECT_EQ(sm.roundTrips, 2u);
  EXPECT_EQ(registry->snapshot(b.name()).roundTrips, 0u) << "the limits' own metrics are not the MultiLimit's";
}

// A caller's refund is counted as permits refunded, its grant staying counted as granted; a
// MultiLimit counts its own refunds.
TEST_F(Metrics, RefundsAreCountedUnderTheLimiterThatMadeThem) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter::Options to;
  to.monitor.registry = registry;
  const Policy cfg = Policy::tokenBucket(20, 1, milliseconds(60000));
  Limiter bucket(client(), limiterName("bucket"), cfg, to);
  ASSERT_TRUE(bucket.tryAcquire("k", 3));
  bucket.refund("k", 2);
  const auto s = registry->snapshot(bucket.name());
  EXPECT_EQ(s.granted, 1u);
  EXPECT_EQ(s.permitsGranted, 3u);
  EXPECT_EQ(s.permitsRefunded, 2u);

  Limiter other(client(), limiterName("other"), cfg, to);
  MultiLimit::Options mo;
  mo.monitor.registry = registry;
  mo.name = "both-refund";
  MultiLimit both = MultiLimit({bucket, other}, mo).on({"k", "k"});
  ASSERT_TRUE(both.decide(2).allowed);
  both.refund(2);
  EXPECT_EQ(registry->snapshot("both-refund").permitsRefunded, 2u);
  EXPECT_EQ(registry->snapshot(bucket.name()).permitsRefunded, 2u) << "counted under the MultiLimit's name only";
}

}  // namespace
}  // namespace redlimit::test
