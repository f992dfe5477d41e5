// Issue 9, item 11: SegmentedRateLimiter against a real redis-server, with bad reconfigure()
// arguments.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/segmented_rate_limiter.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

using Segmented = SegmentedRateLimiter<RateLimiter>;

class SegmentedDefects : public RedisTest {};

}  // namespace

// Item 11: reconfigure() read the configuration and gave the segment back before the source
// refused an interval above kMaxInterval or an unknown RateType. It must refuse first, sending
// nothing.
TEST_F(SegmentedDefects, Item11_ReconfigureRefusesBadArgumentsBeforeSendingAnything) {
  auto source = std::make_shared<RateLimiter>(client(), name());
  ASSERT_TRUE(source->trySetRate(RateType::Overall, 100, milliseconds(60000)));
  SegmentOptions so;
  so.segmentSize = 10;
  so.returnWhenIdle = false;
  Segmented seg(source, so);
  ASSERT_TRUE(seg.tryAcquire());  // holds 9
  struct Bad {
    const char* what;
    RateType type;
    std::int64_t rate;
    milliseconds interval;
    std::int64_t segment;
  };
  const Bad bad[] = {
      {"interval above kMaxInterval", RateType::Overall, 100, RateLimiter::kMaxInterval + milliseconds(1), 10},
      {"unknown RateType", static_cast<RateType>(7), 100, milliseconds(60000), 10},
      {"interval 0", RateType::Overall, 100, milliseconds(0), 10},
      {"rate above kMaxRate", RateType::Overall, RateLimiter::kMaxRate + 1, milliseconds(60000), 10},
      {"segment 0", RateType::Overall, 100, milliseconds(60000), 0},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    const auto keysBefore = keyStates(admin(), source->keys());
    const std::int64_t calibrate = totalCommandCalls(admin());
    const std::int64_t overhead = totalCommandCalls(admin()) - calibrate;  // the INFO itself
    const std::int64_t before = totalCommandCalls(admin());
    EXPECT_THROW((void)seg.reconfigure(b.type, b.rate, b.interval, b.segment), InvalidArgument);
    EXPECT_EQ(totalCommandCalls(admin()) - before, overhead) << "a command reached Redis";
    EXPECT_EQ(keyStates(admin(), source->keys()), keysBefore);
    EXPECT_EQ(seg.stats().permitsHeld, 9) << "the segment stays";
  }
  EXPECT_TRUE(seg.tryAcquire());
  EXPECT_EQ(seg.stats().remoteRoundTrips, 1);
}
