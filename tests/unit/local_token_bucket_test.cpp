// LocalTokenBucket (local_token_bucket.hpp): exact integer refill, the window bound, waits taken
// ahead of time, argument checks. Time is a ManualClock: no test sleeps.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "redlimit/local_token_bucket.hpp"

namespace {

using redlimit::BasicLocalTokenBucket;
using redlimit::ClockRef;
using redlimit::InvalidArgument;
using redlimit::ManualClock;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using Bucket = BasicLocalTokenBucket<ClockRef<ManualClock>>;

TEST(LocalTokenBucket, StartsFullAndRefillsOnePermitPerIntervalOverRate) {
  ManualClock clock{milliseconds(5000)};
  Bucket b(10, 10, milliseconds(1000), ClockRef<ManualClock>(clock));
  EXPECT_EQ(b.availablePermits(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(b.tryAcquire()) << i;
  EXPECT_FALSE(b.tryAcquire());
  EXPECT_EQ(b.waitFor(1), milliseconds(100));
  clock.advance(microseconds(99999));
  EXPECT_FALSE(b.tryAcquire()) << "one µs short of a permit";
  clock.advance(microseconds(1));
  EXPECT_TRUE(b.tryAcquire());
  EXPECT_FALSE(b.tryAcquire());
  clock.advance(milliseconds(60000));
  EXPECT_EQ(b.availablePermits(), 10) << "never more than capacity";
}

// 3 permits per 10 µs: one every 3.33 µs. Taken as they come over a million µs, the total is
// exactly capacity + floor(3 x T / 10): no rounding accumulates.
TEST(LocalTokenBucket, FractionalRefillIsExactOverAMillionSteps) {
  ManualClock clock;
  Bucket b(2, 3, microseconds(10), ClockRef<ManualClock>(clock));
  std::int64_t granted = 0;
  constexpr std::int64_t kSteps = 1000000;
  for (std::int64_t t = 0; t < kSteps; ++t) {
    while (b.tryAcquire()) ++granted;
    clock.advance(microseconds(1));
  }
  while (b.tryAcquire()) ++granted;
  EXPECT_EQ(granted, 2 + 3 * kSteps / 10);
}

// In any window of length T: at most capacity + refillPermits x T / refillInterval grants.
TEST(LocalTokenBucket, RandomCallsNeverExceedTheWindowBound) {
  ManualClock clock;
  constexpr std::int64_t kCapacity = 7, kRefill = 5;
  constexpr microseconds kInterval{1000};
  Bucket b(kCapacity, kRefill, kInterval, ClockRef<ManualClock>(clock));
  std::mt19937_64 rng(42);
  std::vector<std::pair<std::int64_t, std::int64_t>> grants;  // (time µs, permits)
  for (int i = 0; i < 20000; ++i) {
    const auto permits = static_cast<std::int64_t>(1 + rng() % 3);
    if (b.tryAcquire(permits)) grants.emplace_back(clock.now().count(), permits);
    clock.advance(microseconds(static_cast<std::int64_t>(rng() % 400)));
  }
  ASSERT_GT(grants.size(), 1000u);
  for (const std::int64_t window : {1, 500, 1000, 3333, 20000}) {
    std::int64_t inWindow = 0;
    std::size_t first = 0;
    for (std::size_t i = 0; i < grants.size(); ++i) {
      inWindow += grants[i].second;
      while (grants[i].first - grants[first].first >= window) inWindow -= grants[first++].second;
      // Grants at times t0 <= t < t0 + window: capacity plus what refills in (last - first) µs.
      const std::int64_t span = grants[i].first - grants[first].first;
      EXPECT_LE(inWindow, kCapacity + kRefill * span / kInterval.count()) << "window " << window << " at " << i;
    }
  }
}

TEST(LocalTokenBucket, TryAcquireWithTimeoutTakesAheadAndSleepsTheWaitOnTheClock) {
  ManualClock clock;
  Bucket b(10, 10, milliseconds(1000), ClockRef<ManualClock>(clock));
  ASSERT_TRUE(b.tryAcquire(10));
  EXPECT_FALSE(b.tryAcquire(2, milliseconds(199))) << "the wait (200 ms) does not fit";
  EXPECT_EQ(clock.now(), microseconds(0)) << "a refusal does not sleep";
  EXPECT_TRUE(b.tryAcquire(2, milliseconds(200)));
  EXPECT_EQ(clock.now(), milliseconds(200)) << "slept exactly the wait (ManualClock advances)";
  EXPECT_EQ(b.availablePermits(), 0);
  // Debt: the permits were taken ahead, so the next one waits its own 100 ms.
  EXPECT_EQ(b.waitFor(1), milliseconds(100));
}

TEST(LocalTokenBucket, MoreThanCapacityIsNeverGranted) {
  ManualClock clock;
  Bucket b(5, 1, milliseconds(1), ClockRef<ManualClock>(clock));
  EXPECT_FALSE(b.tryAcquire(6, milliseconds(1000000)));
  EXPECT_EQ(b.waitFor(6), microseconds::max());
  EXPECT_EQ(b.availablePermits(), 5) << "nothing taken";
}

TEST(LocalTokenBucket, SetAvailablePermitsDrainsOrFills) {
  ManualClock clock;
  Bucket b(10, 10, milliseconds(10), ClockRef<ManualClock>(clock));
  b.setAvailablePermits(3);
  EXPECT_EQ(b.availablePermits(), 3);
  b.setAvailablePermits(0);
  EXPECT_FALSE(b.tryAcquire());
  clock.advance(milliseconds(1));
  EXPECT_TRUE(b.tryAcquire());
  b.setAvailablePermits(10);
  EXPECT_EQ(b.availablePermits(), 10);
  EXPECT_THROW(b.setAvailablePermits(11), InvalidArgument);
  EXPECT_THROW(b.setAvailablePermits(-1), InvalidArgument);
}

TEST(LocalTokenBucket, BadArgumentsAreRefusedBeforeAnyChange) {
  ManualClock clock;
  const ClockRef<ManualClock> ref(clock);
  EXPECT_THROW(Bucket(0, 1, milliseconds(1), ref), InvalidArgument);
  EXPECT_THROW(Bucket(Bucket::kMaxPermits + 1, 1, milliseconds(1), ref), InvalidArgument);
  EXPECT_THROW(Bucket(1, 0, milliseconds(1), ref), InvalidArgument);
  EXPECT_THROW(Bucket(1, 1, microseconds(0), ref), InvalidArgument);
  EXPECT_THROW(Bucket(1, 1, Bucket::kMaxInterval + microseconds(1), ref), InvalidArgument);
  Bucket b(3, 1, milliseconds(1), ref);
  EXPECT_THROW((void)b.tryAcquire(0), InvalidArgument);
  EXPECT_THROW((void)b.tryAcquire(-1, milliseconds(5)), InvalidArgument);
  EXPECT_THROW((void)b.waitFor(0), InvalidArgument);
  EXPECT_EQ(b.availablePermits(), 3);
}

TEST(LocalTokenBucket, ExtremeBoundsDoNotOverflow) {
  ManualClock clock{microseconds(std::int64_t{1} << 60)};
  Bucket b(Bucket::kMaxPermits, Bucket::kMaxPermits, Bucket::kMaxInterval, ClockRef<ManualClock>(clock));
  EXPECT_TRUE(b.tryAcquire(Bucket::kMaxPermits));
  EXPECT_EQ(b.availablePermits(), 0);
  EXPECT_EQ(b.waitFor(Bucket::kMaxPermits), Bucket::kMaxInterval);
  clock.advance(Bucket::kMaxInterval);
  EXPECT_EQ(b.availablePermits(), Bucket::kMaxPermits);
  Bucket slow(1, 1, Bucket::kMaxInterval, ClockRef<ManualClock>(clock));
  ASSERT_TRUE(slow.tryAcquire());
  EXPECT_EQ(slow.waitFor(1), Bucket::kMaxInterval);
}

// Four threads take from one bucket while time moves: what they got plus what is left is exactly
// what the bucket held and refilled (its capacity is large enough that no refill is capped), so
// no permit is handed out twice or lost (run under TSan too). Time moves only once every thread
// is taking, and the threads stop only once they have drained the bucket, so a slow start (a
// sanitizer, a busy machine) cannot leave them nothing to contend for.
TEST(LocalTokenBucket, ConcurrentCallersShareTheRateExactly) {
  ManualClock clock;
  Bucket b(1000000, 1000, milliseconds(1), ClockRef<ManualClock>(clock));  // 1 per µs
  b.setAvailablePermits(0);                                                // a full bucket refills nothing: start empty
  std::atomic<std::int64_t> granted{0};
  std::atomic<int> running{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::int64_t mine = 0;
      ++running;
      while (!done.load()) mine += b.tryAcquire() ? 1 : 0;
      granted += mine;
    });
  }
  while (running.load() < 4) std::this_thread::yield();
  for (int i = 0; i < 2000; ++i) {
    clock.advance(microseconds(5));
    std::this_thread::yield();
  }
  while (b.availablePermits() > 0) std::this_thread::yield();
  done = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 2000 * 5);
  EXPECT_EQ(b.availablePermits(), 0);
}

}  // namespace
