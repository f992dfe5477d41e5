// The checks a Policy makes when it is made and the exact units of a rate (no server needed).
#include <gtest/gtest.h>

#include <string>

#include "redlimit/errors.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/detail/rate_units.hpp"

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

TEST(Policy, TokenBucketChecksEveryParameter) {
  const milliseconds second(1000);
  const milliseconds longest(4294967295);
  EXPECT_NO_THROW((void)Policy::tokenBucket(10, 5, second));
  EXPECT_THROW((void)Policy::tokenBucket(0, 5, second), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(4294967296, 5, second), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(10, 0, second), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(10, 5, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(10, 5, longest + milliseconds(1)), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(10, 5, second).keepAlive(milliseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)Policy::tokenBucket(263, 1, longest), InvalidArgument);
  EXPECT_NO_THROW((void)Policy::tokenBucket(262, 1, longest));
  try {
    (void)Policy::tokenBucket(263, 1, longest);
    ADD_FAILURE() << "a capacity of 263 at 1 per 49.7 days is not exact";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("at most 262"), std::string::npos) << e.what();
  }
}

TEST(Policy, GcraAndFixedWindowCheckEveryParameter) {
  const milliseconds second(1000);
  EXPECT_NO_THROW((void)Policy::gcra(100, second, 10));
  EXPECT_THROW((void)Policy::gcra(0, second, 10), InvalidArgument);
  EXPECT_THROW((void)Policy::gcra(100, milliseconds(0), 10), InvalidArgument);
  EXPECT_THROW((void)Policy::gcra(100, second, 0), InvalidArgument);
  EXPECT_THROW((void)Policy::gcra(100, second, 10).keepAlive(milliseconds(-5)), InvalidArgument);
  EXPECT_THROW((void)Policy::gcra(7, milliseconds(4294967295), 4294967295), InvalidArgument);
  EXPECT_NO_THROW((void)Policy::fixedWindow(4294967295, milliseconds(4294967295)));
  EXPECT_THROW((void)Policy::fixedWindow(0, second), InvalidArgument);
  EXPECT_THROW((void)Policy::fixedWindow(10, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::fixedWindow(10, second).keepAlive(milliseconds(4294967296)), InvalidArgument);
}

TEST(Policy, SmoothPoliciesCheckEveryParameterAndExactness) {
  const milliseconds second(1000);
  EXPECT_NO_THROW((void)Policy::smoothBursty(10, second, second));
  EXPECT_NO_THROW((void)Policy::smoothBursty(10, second, milliseconds(0)));
  EXPECT_THROW((void)Policy::smoothBursty(0, second), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(10, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothBursty(10, second, milliseconds(-1)), InvalidArgument);
  EXPECT_NO_THROW((void)Policy::smoothWarmingUp(10, second, second, 127));
  EXPECT_THROW((void)Policy::smoothWarmingUp(10, second, second, 128), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(10, second, second, 0), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(10, second, milliseconds(0)), InvalidArgument);
  // Exactness (lua/smooth.lua's derive()): maxBurst in us x permits' units at most 2^52, and a
  // warm-up whose stored units would pass 2^52.
  EXPECT_THROW((void)Policy::smoothBursty(4294967295, milliseconds(1), milliseconds(4294967295)), InvalidArgument);
  EXPECT_THROW((void)Policy::smoothWarmingUp(4294967295, milliseconds(1), milliseconds(4294967295)), InvalidArgument);
}
