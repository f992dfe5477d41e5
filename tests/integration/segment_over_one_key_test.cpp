// SegmentedRateLimiter over the one-key limiters (token bucket, GCRA, fixed window, distributed
// smooth): each is a permit source, checked at compile time, and a local segment cache over it
// keeps the limiter's bound within one segment per node.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/distributed_smooth_rate_limiter.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"

namespace {

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

static_assert(isPermitSourceV<TokenBucketRateLimiter>);
static_assert(isPermitSourceV<GcraRateLimiter>);
static_assert(isPermitSourceV<FixedWindowRateLimiter>);
static_assert(isPermitSourceV<DistributedSmoothRateLimiter>);

class SegmentOverOneKey : public RedisTest {};

SegmentOptions segments(std::int64_t size) {
  SegmentOptions o;
  o.segmentSize = size;
  o.returnWhenIdle = false;
  return o;
}

// A bucket of 100 that refills 1 permit per 10 s: 4 threads draining it through a segment cache of
// 10 get exactly its 100 (no refill comes within the test), in about a tenth of the round trips.
TEST_F(SegmentOverOneKey, TokenBucketDrainsExactlyItsCapacityInSegments) {
  auto bucket = std::make_shared<TokenBucketRateLimiter>(client(), name("bucket"));
  TokenBucketConfig config;
  config.capacity = 100;
  config.refillPermits = 1;
  config.refillInterval = milliseconds(10000);
  ASSERT_TRUE(bucket->trySetConfig(config));
  SegmentedRateLimiter<TokenBucketRateLimiter> cached(bucket, segments(10));
  std::atomic<std::int64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (cached.tryAcquire(1)) granted.fetch_add(1);  // until the bucket is empty
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(granted.load(), 100);
  const SegmentStats s = cached.stats();
  EXPECT_EQ(s.permitsFromRemote, 100);
  EXPECT_LE(s.remoteRoundTrips, 20) << "segments of 10 for 100 permits, plus a denied refill or two per thread";
  EXPECT_EQ(bucket->peek(1).remaining, 0);
}

// Permits left in the segment go back to the bucket on close.
TEST_F(SegmentOverOneKey, CloseRefundsTheUnspentSegment) {
  auto gcra = std::make_shared<GcraRateLimiter>(client(), name("gcra"));
  GcraConfig config;
  config.rate = 1;
  config.period = milliseconds(10000);
  config.burst = 50;
  ASSERT_TRUE(gcra->trySetConfig(config));
  {
    SegmentedRateLimiter<GcraRateLimiter> cached(gcra, segments(20));
    ASSERT_TRUE(cached.tryAcquire(1));
    ASSERT_TRUE(cached.tryAcquire(2));
    EXPECT_EQ(gcra->peek(1).remaining, 30) << "one segment of 20 taken";
    cached.close();
    EXPECT_EQ(cached.stats().permitsReturned, 17);
  }
  EXPECT_EQ(gcra->peek(1).remaining, 47) << "3 spent, the rest given back";
}

// A fixed window's segment lives only until the window ends: permits from one window are never
// spent in the next.
TEST_F(SegmentOverOneKey, FixedWindowSegmentsEndWithTheirWindow) {
  auto window = std::make_shared<FixedWindowRateLimiter>(client(), name("window"));
  FixedWindowConfig config;
  config.limit = 1000;
  config.window = milliseconds(60000);
  ASSERT_TRUE(window->trySetConfig(config));
  const AcquireResult r = window->tryAcquireUpTo(1, 10);
  ASSERT_EQ(r.granted, 10);
  EXPECT_TRUE(r.member.empty());
  EXPECT_GT(r.interval.count(), 0);
  EXPECT_LE(r.interval.count(), 60000) << "no longer than the window";
  const Decision after = window->peek(1);
  EXPECT_LE(r.interval, std::chrono::ceil<milliseconds>(after.resetAfter)) << "not past the window's end";
}

// The range: all of atMost when there is room, else what remains, else a denial with the exact
// wait for atLeast.
TEST_F(SegmentOverOneKey, TryAcquireUpToTakesWhatRemainsAndDeniesWithTheWaitForAtLeast) {
  TokenBucketRateLimiter bucket(client(), name("range"));
  TokenBucketConfig config;
  config.capacity = 10;
  config.refillPermits = 1;
  config.refillInterval = milliseconds(1000);
  ASSERT_TRUE(bucket.trySetConfig(config));
  const AcquireResult first = bucket.tryAcquireUpTo(1, 4);
  EXPECT_EQ(first.granted, 4);
  EXPECT_EQ(first.interval.count(), 4000) << "4 permits come back in 4 s";
  EXPECT_EQ(bucket.tryAcquireUpTo(2, 3).granted, 3);
  EXPECT_EQ(bucket.tryAcquireUpTo(1, 8).granted, 3) << "what remains";
  const AcquireResult denied = bucket.tryAcquireUpTo(2, 5);
  EXPECT_EQ(denied.granted, 0);
  EXPECT_GT(denied.wait.count(), 1000) << "two permits take two seconds to come back";
  EXPECT_LE(denied.wait.count(), 2000);
}

}  // namespace
