// RateLimiter::decide: the sliding-window limiter's answer as the same Decision the one-key
// limiters give.
#include <memory>
#include <string>

#include <fmt/format.h>

#include "redlimit/metrics.hpp"

#include "helpers.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

class RateLimiterDecision : public RedisTest {};

TEST_F(RateLimiterDecision, AllowedAndDeniedCarryTheWholeAnswer) {
  RateLimiter::Options o;
  o.denyCacheKeys = 0;  // the permits are aged by hand below: the same call must reach Redis again
  RateLimiter rl(client(), name(), o);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(200)));
  const std::int64_t before = serverTimeUs(admin());
  const Decision d = rl.decide(3);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.permits, 3);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.retryAfter.count(), 0);
  EXPECT_EQ(d.resetAfter, milliseconds(200)) << "the grant is the newest permit: free again one interval later";
  EXPECT_FALSE(d.byPolicy);
  EXPECT_GE(d.time.count(), before);
  EXPECT_LE(d.time.count(), serverTimeUs(admin()));

  const Decision denied = rl.decide(3);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 2);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_LE(denied.retryAfter, milliseconds(200));
  EXPECT_EQ(denied.retryAfter.count() % 1000, 0) << "RateLimiter's waits are whole ms";
  // The wait is when the first grant's permits expire: once they are retryAfter older, the same
  // call succeeds. They are aged in place (their scores, ms on the server's clock, moved back)
  // rather than waited for on the wall clock.
  const Reply counted = raw({"ZRANGE", rl.keys()[3], "0", "-1", "WITHSCORES"});
  ASSERT_EQ(counted.elements.size(), 2u) << "one grant counted";
  const double aged = std::stod(counted.elements[1].str) - static_cast<double>(denied.retryAfter.count()) / 1000.0;
  ASSERT_EQ(raw({"ZADD", rl.keys()[3], "XX", "CH", fmt::format("{:.3f}", aged), counted.elements[0].str}).integer, 1);
  EXPECT_TRUE(rl.decide(3).allowed);
  EXPECT_THROW((void)rl.decide(6), InvalidArgument);
  EXPECT_THROW((void)rl.decide(0), InvalidArgument);
}

TEST_F(RateLimiterDecision, AsyncFormsAndThePolicy) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(10000)));
  EXPECT_TRUE(rl.decideAsync(2).get().allowed);
  std::promise<Decision> got;
  rl.decideAsync(1, [&](Decision d, const std::exception_ptr& error) {
    EXPECT_FALSE(error);
    got.set_value(d);
  });
  const Decision denied = got.get_future().get();
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.limit, 2);

  RedisServer server;
  ClientOptions co;
  co.connection = parseUri(server.uri());
  co.connection.connectTimeout = milliseconds(200);
  co.connection.commandTimeout = milliseconds(200);
  RateLimiter::Options options;
  options.failure.policy = FailurePolicy::Allow;
  RateLimiter gone(Client::create(co), "gone", options);
  ASSERT_TRUE(gone.trySetRate(RateType::Overall, 7, milliseconds(1000)));
  ASSERT_TRUE(gone.decide().allowed);
  server.kill();
  const Decision d = gone.decide();
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.byPolicy);
  EXPECT_EQ(d.limit, 7) << "the rate last seen";
  EXPECT_EQ(d.time.count(), 0);
  EXPECT_TRUE(gone.decideAsync(1).get().byPolicy);
}

// An async call that ends in an error (refused before sending, or by the script) gives the caller
// that error and no decision: nothing is counted as granted or denied.
TEST_F(RateLimiterDecision, AnAsyncCallThatFailsCountsNoDecision) {
  auto registry = std::make_shared<MetricsRegistry>();
  RateLimiter::Options options;
  options.monitor.registry = registry;
  RateLimiter rl(client(), name(), options);
  EXPECT_THROW((void)rl.decideAsync(0).get(), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync(1).get(), NotInitializedError) << "no configuration yet";
  EXPECT_THROW((void)rl.tryAcquireAsync(1).get(), NotInitializedError);
  const LimiterMetrics::Snapshot s = registry->snapshot(name());
  EXPECT_EQ(s.granted, 0u);
  EXPECT_EQ(s.denied, 0u);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, milliseconds(60000)));
  EXPECT_TRUE(rl.decideAsync(1).get().allowed);
  EXPECT_FALSE(rl.decideAsync(1).get().allowed);
  EXPECT_EQ(registry->snapshot(name()).granted, 1u);
  EXPECT_EQ(registry->snapshot(name()).denied, 1u);
}
