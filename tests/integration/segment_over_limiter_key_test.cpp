// SegmentedRateLimiter over one key of a Limiter (GCRA, token bucket, fixed window, smooth
// policies): a local segment cache over the key keeps the policy's bound within one segment per
// node, touches no other key, and is refused before anything is sent for a policy that cannot
// serve segments.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/calendar.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"

namespace {

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::hours;
using std::chrono::milliseconds;

using KeyAccess = redlimit::detail::SegmentAccess<Limiter>;

static_assert(redlimit::detail::isPermitSourceV<Limiter>);
static_assert(!redlimit::detail::HasConfigCalls<Limiter>::value, "reconfigure() is RateLimiter's");

class SegmentOverLimiterKey : public RedisTest {};

SegmentOptions keySegments(std::int64_t size) {
  SegmentOptions o;
  o.segmentSize = size;
  o.returnWhenIdle = false;
  return o;
}

// A bucket of 100 that refills 1 permit an hour: 4 threads draining one key through a segment
// cache of 10 get exactly its 100 (no refill comes within the test), in about a tenth of the round
// trips.
TEST_F(SegmentOverLimiterKey, TokenBucketKeyDrainsExactlyItsCapacityInSegments) {
  auto bucket = std::make_shared<Limiter>(client(), limiterName("bucket"), Policy::tokenBucket(100, 1, hours(1)));
  SegmentedRateLimiter<Limiter> cached(bucket, "user:42", keySegments(10));
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
  EXPECT_EQ(bucket->peek("user:42").remaining, 0);
  EXPECT_EQ(bucket->peek("user:43").remaining, 100) << "another key of the limiter is untouched";
  EXPECT_EQ(cached.key(), "user:42");
}

// Permits left in the segment go back to the key on close (the coarse clock: the other compiled
// instantiation).
TEST_F(SegmentOverLimiterKey, CloseGivesTheUnspentSegmentBackToTheKey) {
  Limiter gcra(client(), limiterName("gcra"), Policy::gcra(1, hours(1), 50));
  {
    SegmentedRateLimiter<Limiter, CoarseSteadyClock> cached(gcra, "user:42", keySegments(20));
    ASSERT_TRUE(cached.tryAcquire(1));
    ASSERT_TRUE(cached.tryAcquire(2));
    EXPECT_EQ(cached.source()->peek("user:42").remaining, 30) << "one segment of 20 taken";
    cached.close();
    EXPECT_EQ(cached.stats().permitsReturned, 17);
    ASSERT_NE(gcra.monitor().metrics(), nullptr);
    EXPECT_EQ(gcra.monitor().metrics()->snapshot().permitsRefunded, 0u)
        << "a segment's give-back is not a caller's refund";
  }
  EXPECT_EQ(gcra.peek("user:42").remaining, 47) << "3 spent, the rest given back";
}

// A fixed window's segment lives only until the window ends: permits from one window are never
// spent in the next.
TEST_F(SegmentOverLimiterKey, FixedWindowSegmentsEndWithTheirWindow) {
  Limiter window(client(), limiterName("window"), Policy::fixedWindow(1000, milliseconds(60000)));
  const detail::AcquireResult r = KeyAccess::tryAcquireUpTo(window, "user:42", 1, 10);
  ASSERT_EQ(r.granted, 10);
  EXPECT_TRUE(r.member.empty());
  EXPECT_GT(r.interval.count(), 0);
  EXPECT_LE(r.interval.count(), 60000) << "no longer than the window";
  const Decision after = window.peek("user:42");
  EXPECT_LE(r.interval, std::chrono::ceil<milliseconds>(after.resetAfter)) << "not past the window's end";
}

// The range: all of atMost when there is room, else what remains, else a denial with the exact
// wait for atLeast (a permit a minute: none comes back during the test).
TEST_F(SegmentOverLimiterKey, TryAcquireUpToTakesWhatRemainsAndDeniesWithTheWaitForAtLeast) {
  Limiter bucket(client(), limiterName("range"), Policy::tokenBucket(10, 1, milliseconds(60000)));
  const detail::AcquireResult first = KeyAccess::tryAcquireUpTo(bucket, "user:42", 1, 4);
  EXPECT_EQ(first.granted, 4);
  EXPECT_EQ(first.interval.count(), 240000) << "4 permits come back in 4 minutes";
  EXPECT_EQ(KeyAccess::tryAcquireUpTo(bucket, "user:42", 2, 3).granted, 3);
  EXPECT_EQ(KeyAccess::tryAcquireUpTo(bucket, "user:42", 1, 8).granted, 3) << "what remains";
  const detail::AcquireResult denied = KeyAccess::tryAcquireUpTo(bucket, "user:42", 2, 5);
  EXPECT_EQ(denied.granted, 0);
  EXPECT_GT(denied.wait, milliseconds(60000)) << "two permits take two minutes to come back";
  EXPECT_LE(denied.wait, milliseconds(120000));
}

// Every permit policy sent with the calls serves segments: a cache of 3 over a key whose policy
// grants a few permits (none refill during the test) hands out exactly what the key grants.
TEST_F(SegmentOverLimiterKey, EveryPermitPolicyServesSegmentsOfItsKey) {
  struct Case {
    const char* label;
    Policy policy;
    std::int64_t granted;  // one-permit takes a fresh key grants before the first denial
  };
  const std::vector<Case> cases{
      {"gcra", Policy::gcra(1, hours(24), 5), 5},
      {"bucket", Policy::tokenBucket(5, 1, hours(24)), 5},
      {"window", Policy::fixedWindow(5, hours(24)), 5},
      {"sliding", Policy::slidingWindow(5, hours(24)), 5},
      // Guava's bursty limiter storing 5 permits lends a sixth ahead.
      {"smooth", Policy::smoothBursty(1, hours(5), hours(25)), 6},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    Limiter limiter(client(), limiterName(c.label), c.policy);
    SegmentedRateLimiter<Limiter> cached(limiter, "k", keySegments(3));
    std::int64_t granted = 0;
    while (granted <= c.granted && cached.tryAcquire()) ++granted;
    EXPECT_EQ(granted, c.granted);
    EXPECT_EQ(cached.stats().permitsFromRemote, c.granted);
    EXPECT_FALSE(limiter.exists("other")) << "no other key is written";
  }
}

// A policy that cannot serve segments, a bad key and a null limiter are refused with
// InvalidArgument when the cache is made, before anything is sent.
TEST_F(SegmentOverLimiterKey, PoliciesThatCannotServeSegmentsAreRefusedBeforeSending) {
  const Limiter leases(client(), limiterName("leases"), Policy::concurrency(4, milliseconds(30000)));
  const Limiter daily(client(), limiterName("daily"), Policy::calendar(100, CalendarUnit::Day, "UTC"));
  const Limiter stored(client(), limiterName("stored"), Policy::perSecond(10).stored());
  const Limiter rate(client(), limiterName("rate"), Policy::perSecond(10));
  const std::int64_t before = scriptCalls();
  EXPECT_THROW((void)SegmentedRateLimiter<Limiter>(leases, "k", keySegments(3)), InvalidArgument)
      << "leases, not permits";
  EXPECT_THROW((void)SegmentedRateLimiter<Limiter>(daily, "k", keySegments(3)), InvalidArgument) << "a calendar quota";
  EXPECT_THROW((void)SegmentedRateLimiter<Limiter>(stored, "k", keySegments(3)), InvalidArgument) << "a stored policy";
  EXPECT_THROW((void)SegmentedRateLimiter<Limiter>(rate, "", keySegments(3)), InvalidArgument) << "an empty key";
  EXPECT_THROW((void)SegmentedRateLimiter<Limiter>(std::shared_ptr<Limiter>(), "k", keySegments(3)), InvalidArgument);
  EXPECT_THROW((void)SegmentedRateLimiter<Limiter>(rate, "k", keySegments(0)), InvalidArgument) << "a segment of 0";
  try {
    SegmentedRateLimiter<Limiter> refused(daily, "k", keySegments(3));
    ADD_FAILURE() << "a calendar quota was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(daily.name()), std::string::npos) << what;
    EXPECT_NE(what.find("calendar"), std::string::npos) << what;
  }
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
}

}  // namespace
