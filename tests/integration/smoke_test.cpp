#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

class Smoke : public RedisTest {};

TEST_F(Smoke, AcquireDenyAndRefill) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 3, milliseconds(200)));
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_TRUE(rl.tryAcquire(2));
  EXPECT_FALSE(rl.tryAcquire());
  EXPECT_EQ(rl.availablePermits(), 0);
  sleepMs(220);
  EXPECT_EQ(rl.availablePermits(), 3);
}
