// The one-key limiters' configuration checks and the exact units of a rate (no server needed).
#include <gtest/gtest.h>

#include "redlimit/detail/rate_units.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"

using namespace redlimit;
using std::chrono::milliseconds;

TEST(RateUnits, ReduceByTheGcd) {
  // 100 per second: 1e6 µs / 100 = 10^4 µs per permit, exactly 1 unit per µs.
  auto u = detail::rateUnits(100, milliseconds(1000));
  EXPECT_EQ(u.unitsPerMicro, 1);
  EXPECT_EQ(u.permitUnits, 10000);
  // 3 per 10 ms: 10000 / 3 µs; units of 1/3 µs, a permit is 10000 of them.
  u = detail::rateUnits(3, milliseconds(10));
  EXPECT_EQ(u.unitsPerMicro, 3);
  EXPECT_EQ(u.permitUnits, 10000);
  // 10^9 per hour: gcd(10^9, 3.6 * 10^9) = 2 * 10^8.
  u = detail::rateUnits(1000000000, milliseconds(3600000));
  EXPECT_EQ(u.unitsPerMicro, 5);
  EXPECT_EQ(u.permitUnits, 18);
  // A prime rate over the longest interval: nothing to reduce.
  u = detail::rateUnits(4294967291, milliseconds(4294967295));
  EXPECT_EQ(u.unitsPerMicro, 4294967291);
  EXPECT_EQ(u.permitUnits, 4294967295000);
}

TEST(RateUnits, BurstBoundIsBurstTimesPermitUnitsAtMost2To50) {
  const auto slow = detail::rateUnits(1, milliseconds(4294967295));  // I' = 4294967295000
  EXPECT_TRUE(detail::burstFitsExactly(262, slow));
  EXPECT_FALSE(detail::burstFitsExactly(263, slow));
  const auto exact = detail::RateUnits{1, 1024};
  EXPECT_TRUE(detail::burstFitsExactly(std::int64_t{1} << 40, exact));
  EXPECT_FALSE(detail::burstFitsExactly((std::int64_t{1} << 40) + 1, exact));
  EXPECT_TRUE(detail::burstFitsExactly(4294967295, detail::rateUnits(1000, milliseconds(1000))));
}

TEST(OneKeyConfig, TokenBucketChecksEveryField) {
  TokenBucketConfig c{10, 5, milliseconds(1000), milliseconds(0), std::nullopt};
  EXPECT_NO_THROW(TokenBucketRateLimiter::validateConfig(c));
  auto bad = [&](auto change) {
    TokenBucketConfig b = c;
    change(b);
    EXPECT_THROW(TokenBucketRateLimiter::validateConfig(b), InvalidArgument);
  };
  bad([](TokenBucketConfig& b) { b.capacity = 0; });
  bad([](TokenBucketConfig& b) { b.capacity = TokenBucketRateLimiter::kMaxPermits + 1; });
  bad([](TokenBucketConfig& b) { b.refillPermits = 0; });
  bad([](TokenBucketConfig& b) { b.refillInterval = milliseconds(0); });
  bad([](TokenBucketConfig& b) { b.refillInterval = TokenBucketRateLimiter::kMaxInterval + milliseconds(1); });
  bad([](TokenBucketConfig& b) { b.keepAlive = milliseconds(-1); });
  bad([](TokenBucketConfig& b) { b.initialTokens = 11; });
  bad([](TokenBucketConfig& b) { b.initialTokens = -1; });
  bad([](TokenBucketConfig& b) {
    b.refillPermits = 1;
    b.refillInterval = TokenBucketRateLimiter::kMaxInterval;
    b.capacity = 263;
  });
  c.initialTokens = 0;
  EXPECT_NO_THROW(TokenBucketRateLimiter::validateConfig(c));
  try {
    TokenBucketRateLimiter::validateConfig({263, 1, TokenBucketRateLimiter::kMaxInterval, milliseconds(0), {}});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("at most 262"), std::string::npos) << e.what();
  }
}

TEST(OneKeyConfig, GcraAndFixedWindowCheckEveryField) {
  EXPECT_NO_THROW(GcraRateLimiter::validateConfig({100, milliseconds(1000), 10, milliseconds(0)}));
  EXPECT_THROW(GcraRateLimiter::validateConfig({0, milliseconds(1000), 10, milliseconds(0)}), InvalidArgument);
  EXPECT_THROW(GcraRateLimiter::validateConfig({100, milliseconds(0), 10, milliseconds(0)}), InvalidArgument);
  EXPECT_THROW(GcraRateLimiter::validateConfig({100, milliseconds(1000), 0, milliseconds(0)}), InvalidArgument);
  EXPECT_THROW(GcraRateLimiter::validateConfig({100, milliseconds(1000), 10, milliseconds(-5)}), InvalidArgument);
  EXPECT_THROW(GcraRateLimiter::validateConfig({7, GcraRateLimiter::kMaxInterval, 4294967295, milliseconds(0)}),
               InvalidArgument);
  EXPECT_NO_THROW(FixedWindowRateLimiter::validateConfig({4294967295, milliseconds(4294967295), milliseconds(0)}));
  EXPECT_THROW(FixedWindowRateLimiter::validateConfig({0, milliseconds(1000), milliseconds(0)}), InvalidArgument);
  EXPECT_THROW(FixedWindowRateLimiter::validateConfig({10, milliseconds(0), milliseconds(0)}), InvalidArgument);
  EXPECT_THROW(FixedWindowRateLimiter::validateConfig({10, milliseconds(1000), milliseconds(4294967296)}),
               InvalidArgument);
}
