// Unit tests for redlimit::BasicSmoothRateLimiter: Guava's RateLimiter test vectors in exact
// microseconds (/work/shared/reference/guava-semantics.md), property tests over random
// sequences, the two defect fixes, and one short real-clock thread test.
#include "redlimit/smooth_rate_limiter.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

namespace {

using redlimit::BasicSmoothRateLimiter;
using redlimit::ClockRef;
using redlimit::InvalidArgument;
using redlimit::ManualClock;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// --- A recording clock, like Guava's FakeStopwatch -----------------------------------------

// One sleep: 'R' if the limiter slept (acquire/tryAcquire), 'U' if the test ("user") did.
struct Event {
  char kind;
  std::int64_t micros;
  friend bool operator==(const Event& a, const Event& b) { return a.kind == b.kind && a.micros == b.micros; }
  friend void PrintTo(const Event& e, std::ostream* os) { *os << e.kind << e.micros; }
};
Event R(std::int64_t micros) { return {'R', micros}; }
Event U(std::int64_t micros) { return {'U', micros}; }

// Time that moves only by sleeps, and the list of sleeps. Not thread-safe (single-threaded tests).
class FakeStopwatch {
 public:
  [[nodiscard]] std::int64_t nowMicros() const { return nowMicros_; }
  void limiterSleep(std::int64_t micros) {
    nowMicros_ += micros;
    events_.push_back(R(micros));
  }
  void userSleep(std::int64_t micros) {
    nowMicros_ += micros;
    events_.push_back(U(micros));
  }
  // Returns the events so far and forgets them.
  std::vector<Event> readEvents() {
    std::vector<Event> out;
    out.swap(events_);
    return out;
  }

 private:
  std::int64_t nowMicros_ = 0;
  std::vector<Event> events_;
};

// The clock policy handed to the limiter: reads and records through a FakeStopwatch.
class RecordingClock {
 public:
  explicit RecordingClock(FakeStopwatch& stopwatch) : stopwatch_(&stopwatch) {}
  [[nodiscard]] microseconds now() const { return microseconds{stopwatch_->nowMicros()}; }
  void sleepFor(microseconds d) const { stopwatch_->limiterSleep(d.count()); }

 private:
  FakeStopwatch* stopwatch_;
};

using RecordingLimiter = BasicSmoothRateLimiter<RecordingClock>;
using ManualLimiter = BasicSmoothRateLimiter<ClockRef<ManualClock>>;

class SmoothRateLimiterTest : public ::testing::Test {
 protected:
  RecordingLimiter bursty(double qps, double maxBurstSeconds = 1.0) {
    return RecordingLimiter::bursty(qps, maxBurstSeconds, RecordingClock(stopwatch_));
  }
  RecordingLimiter warmingUp(double qps, microseconds warmup, double coldFactor = 3.0) {
    return RecordingLimiter::warmingUp(qps, warmup, coldFactor, RecordingClock(stopwatch_));
  }
  // n acquire(1) calls; checks that each returns what the limiter slept.
  void acquireTimes(RecordingLimiter& limiter, int n) {
    for (int i = 0; i < n; ++i) {
      const std::int64_t before = stopwatch_.nowMicros();
      const microseconds waited = limiter.acquire();
      ASSERT_EQ(waited.count(), stopwatch_.nowMicros() - before);
    }
  }
  void sleepMicros(std::int64_t micros) { stopwatch_.userSleep(micros); }
  std::vector<Event> events() { return stopwatch_.readEvents(); }

  FakeStopwatch stopwatch_;
};

// R0 followed by n - 1 waits of `micros` each.
std::vector<Event> paced(int n, std::int64_t micros) {
  std::vector<Event> out{R(0)};
  for (int i = 1; i < n; ++i) out.push_back(R(micros));
  return out;
}

std::vector<Event> concat(std::initializer_list<std::vector<Event>> parts) {
  std::vector<Event> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// --- The reference's test vectors ------------------------------------------------------------

TEST_F(SmoothRateLimiterTest, Simple) {
  auto limiter = bursty(5.0);
  acquireTimes(limiter, 3);
  EXPECT_THAT(events(), ElementsAre(R(0), R(200000), R(200000)));
}

TEST_F(SmoothRateLimiterTest, AcquireReturnsTheWaitInMicroseconds) {
  auto limiter = bursty(5.0);
  EXPECT_EQ(limiter.acquire(), microseconds{0});
  EXPECT_EQ(limiter.acquire(), microseconds{200000});
  EXPECT_EQ(limiter.acquire(3), microseconds{200000});
  EXPECT_EQ(limiter.acquire(), microseconds{600000});
}

TEST_F(SmoothRateLimiterTest, SimpleWithWait) {
  auto limiter = bursty(5.0);
  acquireTimes(limiter, 1);
  sleepMicros(200000);
  acquireTimes(limiter, 2);
  EXPECT_THAT(events(), ElementsAre(R(0), U(200000), R(0), R(200000)));
}

TEST_F(SmoothRateLimiterTest, EarliestAvailableInPast) {
  auto limiter = bursty(5.0);
  acquireTimes(limiter, 1);
  sleepMicros(400000);
  acquireTimes(limiter, 3);
  EXPECT_THAT(events(), ElementsAre(R(0), U(400000), R(0), R(0), R(200000)));
}

TEST_F(SmoothRateLimiterTest, OneSecondBurst) {
  auto limiter = bursty(5.0);
  sleepMicros(1000000);
  sleepMicros(1000000);
  (void)limiter.acquire(1);
  (void)limiter.acquire(1);
  (void)limiter.acquire(3);
  (void)limiter.acquire(1);
  (void)limiter.acquire(1);
  EXPECT_THAT(events(), ElementsAre(U(1000000), U(1000000), R(0), R(0), R(0), R(0), R(200000)));
}

TEST_F(SmoothRateLimiterTest, WarmUp) {
  auto limiter = warmingUp(2.0, seconds{4});
  const std::vector<Event> cold{R(0), R(1375000), R(1125000), R(875000), R(625000), R(500000), R(500000), R(500000)};
  acquireTimes(limiter, 8);
  sleepMicros(500000);   // repays the last acquire
  sleepMicros(4000000);  // cold again
  acquireTimes(limiter, 8);
  sleepMicros(500000);
  sleepMicros(2000000);  // half-way to cold: stored permits are all below the threshold
  acquireTimes(limiter, 8);
  EXPECT_THAT(events(), ElementsAreArray(
                            concat({cold, {U(500000), U(4000000)}, cold, {U(500000), U(2000000)}, paced(8, 500000)})));
}

TEST_F(SmoothRateLimiterTest, WarmUpColdFactor10) {
  auto limiter = warmingUp(5.0, seconds{4}, 10.0);
  const std::vector<Event> cold{R(0), R(1752500), R(1257500), R(762500), R(300227), R(200000), R(200000), R(200000)};
  acquireTimes(limiter, 8);
  sleepMicros(200000);
  sleepMicros(4000000);
  acquireTimes(limiter, 8);
  sleepMicros(200000);
  sleepMicros(1000000);
  acquireTimes(limiter, 8);
  EXPECT_THAT(events(), ElementsAreArray(
                            concat({cold, {U(200000), U(4000000)}, cold, {U(200000), U(1000000)}, paced(8, 200000)})));
}

TEST_F(SmoothRateLimiterTest, WarmUpColdFactor1) {
  auto limiter = warmingUp(5.0, seconds{4}, 1.0);
  acquireTimes(limiter, 8);
  sleepMicros(340000);
  acquireTimes(limiter, 8);
  EXPECT_THAT(events(), ElementsAreArray(concat({paced(8, 200000), {U(340000)}, paced(8, 200000)})));
}

TEST_F(SmoothRateLimiterTest, WarmUpAndUpdate) {
  auto limiter = warmingUp(2.0, seconds{4});
  acquireTimes(limiter, 8);
  sleepMicros(4500000);  // repays the last acquire, then cold again
  acquireTimes(limiter, 3);
  limiter.setRate(4.0);
  acquireTimes(limiter, 5);
  sleepMicros(4250000);
  acquireTimes(limiter, 11);
  EXPECT_THAT(
      events(),
      ElementsAreArray(concat({{R(0), R(1375000), R(1125000), R(875000), R(625000), R(500000), R(500000), R(500000)},
                               {U(4500000)},
                               {R(0), R(1375000), R(1125000)},
                               {R(875000), R(343750), R(281250), R(250000), R(250000)},
                               {U(4250000)},
                               {R(0), R(718750), R(656250), R(593750), R(531250), R(468750), R(406250), R(343750),
                                R(281250), R(250000), R(250000)}})));
}

TEST_F(SmoothRateLimiterTest, WarmUpAndUpdateColdFactor10) {
  auto limiter = warmingUp(5.0, seconds{4}, 10.0);
  acquireTimes(limiter, 8);
  sleepMicros(4200000);
  acquireTimes(limiter, 3);
  limiter.setRate(10.0);
  acquireTimes(limiter, 5);
  sleepMicros(4100000);
  acquireTimes(limiter, 11);
  EXPECT_THAT(
      events(),
      ElementsAreArray(concat({{R(0), R(1752500), R(1257500), R(762500), R(300227), R(200000), R(200000), R(200000)},
                               {U(4200000)},
                               {R(0), R(1752500), R(1257500)},
                               {R(762500), R(195625), R(104602), R(100000), R(100000)},
                               {U(4100000)},
                               {R(0), R(938125), R(814375), R(690625), R(566875), R(443125), R(319375), R(195625),
                                R(104602), R(100000), R(100000)}})));
}

TEST_F(SmoothRateLimiterTest, BurstyAndUpdate) {
  auto limiter = bursty(1.0);
  (void)limiter.acquire(1);
  (void)limiter.acquire(1);
  limiter.setRate(2.0);
  (void)limiter.acquire(1);  // still pays the previous permit at the old rate
  (void)limiter.acquire(2);
  (void)limiter.acquire(4);
  (void)limiter.acquire(1);
  EXPECT_THAT(events(), ElementsAre(R(0), R(1000000), R(1000000), R(500000), R(1000000), R(2000000)));
}

TEST_F(SmoothRateLimiterTest, Weights) {
  auto limiter = bursty(1.0);
  for (std::int64_t permits : {1, 1, 2, 4, 8, 1}) (void)limiter.acquire(permits);
  EXPECT_THAT(events(), ElementsAre(R(0), R(1000000), R(1000000), R(2000000), R(4000000), R(8000000)));
}

TEST_F(SmoothRateLimiterTest, TryAcquireNoWait) {
  auto limiter = bursty(5.0);
  EXPECT_TRUE(limiter.tryAcquire(microseconds{0}));
  EXPECT_FALSE(limiter.tryAcquire(microseconds{0}));
  EXPECT_FALSE(limiter.tryAcquire());
  sleepMicros(100000);
  EXPECT_FALSE(limiter.tryAcquire());
  EXPECT_THAT(events(), ElementsAre(R(0), U(100000)));
}

TEST_F(SmoothRateLimiterTest, TryAcquireSomeWait) {
  auto limiter = bursty(5.0);
  EXPECT_TRUE(limiter.tryAcquire(milliseconds{0}));
  EXPECT_TRUE(limiter.tryAcquire(milliseconds{200}));
  EXPECT_FALSE(limiter.tryAcquire(milliseconds{100}));
  sleepMicros(100000);
  EXPECT_TRUE(limiter.tryAcquire(milliseconds{100}));
  EXPECT_THAT(events(), ElementsAre(R(0), R(200000), U(100000), R(100000)));
}

TEST_F(SmoothRateLimiterTest, TryAcquireOverflow) {
  auto limiter = bursty(5.0);
  EXPECT_TRUE(limiter.tryAcquire(microseconds{0}));
  sleepMicros(100000);
  EXPECT_TRUE(limiter.tryAcquire(microseconds::max()));
  EXPECT_THAT(events(), ElementsAre(R(0), U(100000), R(100000)));
}

TEST_F(SmoothRateLimiterTest, TryAcquireTimeoutsTooLargeForMicrosecondsSaturate) {
  auto limiter = bursty(5.0);
  EXPECT_TRUE(limiter.tryAcquire(1, std::chrono::hours::max()));
  using UnsignedDays = std::chrono::duration<std::uint64_t, std::ratio<86400>>;
  EXPECT_TRUE(limiter.tryAcquire(1, UnsignedDays::max()));
  EXPECT_TRUE(limiter.tryAcquire(1, std::chrono::duration<double>(1e300)));
  EXPECT_FALSE(limiter.tryAcquire(1, std::chrono::hours::min()));
  EXPECT_FALSE(limiter.tryAcquire(1, std::chrono::duration<double>(-1e300)));
  EXPECT_THAT(events(), ElementsAre(R(0), R(200000), R(200000)));
}

TEST_F(SmoothRateLimiterTest, TryAcquireNegative) {
  auto limiter = bursty(5.0);
  EXPECT_TRUE(limiter.tryAcquire(5, microseconds{0}));
  sleepMicros(900000);
  EXPECT_FALSE(limiter.tryAcquire(1, microseconds::min()));
  sleepMicros(100000);
  EXPECT_TRUE(limiter.tryAcquire(1, seconds{-1}));
  EXPECT_THAT(events(), ElementsAre(R(0), U(900000), U(100000), R(0)));
}

TEST_F(SmoothRateLimiterTest, Validation) {
  auto limiter = bursty(999.0);
  EXPECT_THROW((void)limiter.acquire(0), InvalidArgument);
  EXPECT_THROW((void)limiter.acquire(-1), InvalidArgument);
  EXPECT_THROW((void)limiter.tryAcquire(0), InvalidArgument);
  EXPECT_THROW((void)limiter.tryAcquire(-1), InvalidArgument);
  EXPECT_THROW((void)limiter.tryAcquire(0, microseconds{1}), InvalidArgument);
  EXPECT_THROW((void)limiter.tryAcquire(-1, microseconds{1}), InvalidArgument);
  EXPECT_THROW((void)limiter.reserve(0), InvalidArgument);
  EXPECT_THROW((void)limiter.reserve(-1), InvalidArgument);
  EXPECT_THROW((void)limiter.tryAcquire(1, std::chrono::duration<double>(std::nan(""))), InvalidArgument);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {0.0, -0.0, -1.0, nan, -std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(limiter.setRate(bad), InvalidArgument) << bad;
    EXPECT_THROW((void)bursty(bad), InvalidArgument) << bad;
    EXPECT_THROW((void)warmingUp(bad, seconds{1}), InvalidArgument) << bad;
  }
  EXPECT_THROW((void)warmingUp(1.0, microseconds{-1}), InvalidArgument);
  EXPECT_THROW(
      (void)RecordingLimiter::warmingUp(1.0, std::chrono::duration<double>(nan), 3.0, RecordingClock(stopwatch_)),
      InvalidArgument);
  for (double bad : {0.999, 0.0, -1.0, nan, std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW((void)warmingUp(1.0, seconds{1}, bad), InvalidArgument) << bad;
  }
  for (double bad : {-0.001, nan, std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW((void)bursty(1.0, bad), InvalidArgument) << bad;
  }
  // Nothing above changed the limiter or slept.
  EXPECT_EQ(limiter.getRate(), 999.0);
  EXPECT_THAT(events(), ElementsAre());
}

TEST_F(SmoothRateLimiterTest, TinyRate) {
  auto limiter = bursty(std::numeric_limits<double>::denorm_min());
  EXPECT_TRUE(limiter.tryAcquire());
  EXPECT_FALSE(limiter.tryAcquire());
  sleepMicros(5000000);
  EXPECT_FALSE(limiter.tryAcquire());
  EXPECT_EQ(limiter.getRate(), std::numeric_limits<double>::denorm_min());
}

TEST_F(SmoothRateLimiterTest, TinyRateWarmingUp) {
  auto limiter = warmingUp(std::numeric_limits<double>::denorm_min(), seconds{1});
  EXPECT_TRUE(limiter.tryAcquire());
  EXPECT_FALSE(limiter.tryAcquire());
  sleepMicros(5000000);
  EXPECT_FALSE(limiter.tryAcquire());
}

TEST_F(SmoothRateLimiterTest, InfinityBursty) {
  auto limiter = bursty(std::numeric_limits<double>::infinity());
  (void)limiter.acquire(std::numeric_limits<std::int32_t>::max() / 4);
  (void)limiter.acquire(std::numeric_limits<std::int32_t>::max() / 2);
  (void)limiter.acquire(std::numeric_limits<std::int64_t>::max());
  EXPECT_THAT(events(), ElementsAre(R(0), R(0), R(0)));
  limiter.setRate(2.0);  // from no limit to a limit: a full (1 s) burst is stored
  acquireTimes(limiter, 5);
  EXPECT_THAT(events(), ElementsAre(R(0), R(0), R(0), R(500000), R(500000)));
  limiter.setRate(std::numeric_limits<double>::infinity());
  acquireTimes(limiter, 3);  // repays the last permit at the old rate, then no limit
  EXPECT_THAT(events(), ElementsAre(R(500000), R(0), R(0)));
}

TEST_F(SmoothRateLimiterTest, InfinityBurstyTimeElapsed) {
  auto limiter = bursty(std::numeric_limits<double>::infinity());
  sleepMicros(1000000);
  limiter.setRate(2.0);
  acquireTimes(limiter, 5);
  EXPECT_THAT(events(), ElementsAre(U(1000000), R(0), R(0), R(0), R(500000), R(500000)));
}

TEST_F(SmoothRateLimiterTest, InfinityWarmingUp) {
  auto limiter = warmingUp(std::numeric_limits<double>::infinity(), seconds{10});
  (void)limiter.acquire(std::numeric_limits<std::int32_t>::max() / 4);
  (void)limiter.acquire(std::numeric_limits<std::int32_t>::max());
  EXPECT_THAT(events(), ElementsAre(R(0), R(0)));
  limiter.setRate(1.0);  // from no limit to a limit: warm
  acquireTimes(limiter, 3);
  EXPECT_THAT(events(), ElementsAre(R(0), R(1000000), R(1000000)));
  limiter.setRate(std::numeric_limits<double>::infinity());
  acquireTimes(limiter, 3);
  EXPECT_THAT(events(), ElementsAre(R(1000000), R(0), R(0)));
}

TEST_F(SmoothRateLimiterTest, InfinityWarmingUpTimeElapsed) {
  auto limiter = warmingUp(std::numeric_limits<double>::infinity(), seconds{10});
  sleepMicros(1000000);
  limiter.setRate(1.0);
  acquireTimes(limiter, 5);
  EXPECT_THAT(events(), ElementsAre(U(1000000), R(0), R(1000000), R(1000000), R(1000000), R(1000000)));
}

// --- The rest of the API ----------------------------------------------------------------------

TEST_F(SmoothRateLimiterTest, ReserveReturnsTheWaitWithoutSleeping) {
  auto limiter = bursty(5.0);
  EXPECT_EQ(limiter.reserve(), microseconds{0});
  EXPECT_EQ(limiter.reserve(), microseconds{200000});
  EXPECT_EQ(limiter.reserve(2), microseconds{400000});
  EXPECT_EQ(limiter.reserve(), microseconds{800000});  // the caller did not wait: debts add up
  EXPECT_FALSE(limiter.tryAcquire(microseconds{999999}));
  EXPECT_TRUE(limiter.tryAcquire(microseconds{1000000}));
  EXPECT_THAT(events(), ElementsAre(R(1000000)));  // only tryAcquire slept
}

TEST_F(SmoothRateLimiterTest, RefusedTryAcquireReservesNothing) {
  auto refused = warmingUp(2.0, seconds{4});
  FakeStopwatch otherStopwatch;
  auto untouched = RecordingLimiter::warmingUp(2.0, seconds{4}, 3.0, RecordingClock(otherStopwatch));
  for (int i = 0; i < 6; ++i) {
    (void)refused.acquire();
    (void)untouched.acquire();
    EXPECT_FALSE(refused.tryAcquire());
    EXPECT_FALSE(refused.tryAcquire(3, milliseconds{100}));
  }
  EXPECT_EQ(events(), otherStopwatch.readEvents());
}

TEST_F(SmoothRateLimiterTest, GetRateReturnsTheRateAsSet) {
  auto limiter = bursty(5.0);
  EXPECT_EQ(limiter.getRate(), 5.0);
  limiter.setRate(1.0 / 3.0);
  EXPECT_EQ(limiter.getRate(), 1.0 / 3.0);
  auto warm = warmingUp(0.7, seconds{1});
  EXPECT_EQ(warm.getRate(), 0.7);
}

TEST_F(SmoothRateLimiterTest, BurstLengthIsChosenByTheCaller) {
  auto limiter = bursty(5.0, 2.0);
  sleepMicros(10000000);
  (void)limiter.acquire(10);  // two seconds' worth, stored
  acquireTimes(limiter, 3);   // fresh: the first is granted at once, the next one pays for it
  EXPECT_THAT(events(), ElementsAre(U(10000000), R(0), R(0), R(200000), R(200000)));
}

TEST_F(SmoothRateLimiterTest, FractionalBurst) {
  auto limiter = bursty(5.0, 0.5);  // 2.5 permits
  sleepMicros(10000000);
  acquireTimes(limiter, 5);  // 1 + 1 stored, then 0.5 stored + 0.5 fresh (100 ms), then fresh
  EXPECT_THAT(events(), ElementsAre(U(10000000), R(0), R(0), R(0), R(100000), R(200000)));
}

TEST_F(SmoothRateLimiterTest, ZeroBurstIsStrictlyPaced) {
  auto limiter = bursty(5.0, 0.0);
  sleepMicros(10000000);
  acquireTimes(limiter, 3);
  EXPECT_THAT(events(), ElementsAre(U(10000000), R(0), R(200000), R(200000)));
}

TEST_F(SmoothRateLimiterTest, FreshPermitCostIsRoundedUpToWholeMicroseconds) {
  auto limiter = bursty(3.0);  // 333333.3 us per permit; Guava truncates to 333333 and runs fast
  acquireTimes(limiter, 3);
  auto fast = bursty(2e6);  // 0.5 us per permit; Guava's waits would all be 0: no limit at all
  acquireTimes(fast, 3);
  EXPECT_THAT(events(), ElementsAre(R(0), R(333334), R(333334), R(0), R(1), R(1)));
}

TEST(SmoothRateLimiterClock, WorksWithAManualClockThroughClockRef) {
  ManualClock clock(seconds{1000});
  auto limiter = ManualLimiter::bursty(10.0, 1.0, ClockRef<ManualClock>(clock));
  EXPECT_EQ(limiter.acquire(), microseconds{0});
  EXPECT_EQ(limiter.acquire(), microseconds{100000});  // ManualClock::sleepFor advanced time
  EXPECT_EQ(clock.now(), seconds{1000} + microseconds{100000});
  EXPECT_FALSE(limiter.tryAcquire());
  clock.advance(microseconds{100000});
  EXPECT_TRUE(limiter.tryAcquire());
}

// --- Weights and bursts (Guava's randomized tests, fixed seeds) -------------------------------

// Takes `permits` in random chunks, then one more permit to repay the debt of the last chunk;
// returns the microseconds that took.
std::int64_t measureTotalMicros(ManualLimiter& limiter, const ManualClock& clock, std::int64_t permits,
                                std::mt19937_64& rng) {
  const std::int64_t start = clock.now().count();
  while (permits > 0) {
    std::uniform_int_distribution<std::int64_t> chunk(1, permits);
    const std::int64_t n = chunk(rng);
    permits -= n;
    (void)limiter.acquire(n);
  }
  (void)limiter.acquire(1);
  return clock.now().count() - start;
}

TEST(SmoothRateLimiterProperty, WarmUpIsHonouredEvenWithWeights) {
  constexpr std::int64_t kWarmupPermits = 10;
  std::mt19937_64 rng(20240601);
  for (int trial = 0; trial < 30; ++trial) {
    for (double coldFactor : {2.0, 3.0, 10.0}) {
      for (double qps : {4.0, 2.0, 1.0, 0.5, 0.1}) {
        // maxPermits - thresholdPermits = 2 W / (s (1 + c)) = 10  <=>  W = 5 (1 + c) / qps s.
        const auto warmupMicros =
            static_cast<std::int64_t>(std::llround((1.0 + coldFactor) * kWarmupPermits / (2.0 * qps) * 1e6));
        ManualClock clock(microseconds{123456789});
        auto limiter =
            ManualLimiter::warmingUp(qps, microseconds{warmupMicros}, coldFactor, ClockRef<ManualClock>(clock));
        ASSERT_EQ(measureTotalMicros(limiter, clock, kWarmupPermits, rng), warmupMicros)
            << "trial " << trial << " coldFactor " << coldFactor << " qps " << qps;
      }
    }
  }
}

TEST(SmoothRateLimiterProperty, NeverMoreThanOneSecondOfBurst) {
  ManualClock clock;
  auto limiter = ManualLimiter::bursty(1.0, 1.0, ClockRef<ManualClock>(clock));
  std::mt19937_64 rng(7);
  for (std::int64_t rate : {1000, 1, 10, 1000000, 10, 1}) {
    const std::int64_t oneSecondOfWork = rate;
    clock.advance(seconds{rate});  // idle long enough to store a full burst at any rate
    limiter.setRate(static_cast<double>(rate));
    EXPECT_LE(measureTotalMicros(limiter, clock, oneSecondOfWork, rng), 1000000) << rate;
    EXPECT_GE(measureTotalMicros(limiter, clock, oneSecondOfWork, rng), 1000000) << rate;
  }
}

// --- Guava's defects, reproduced with a Guava-faithful model, and fixed ----------------------

// Java's Math.min: NaN if either argument is NaN (std::min is not).
double javaMin(double a, double b) {
  return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : std::min(a, b);
}

// Java's (and IEEE 754's) a / b, spelled out for b == 0 so that sanitizers stay quiet.
double javaDiv(double a, double b) {
  if (b != 0.0) return a / b;
  if (a == 0.0 || std::isnan(a)) return std::numeric_limits<double>::quiet_NaN();
  return std::copysign(std::numeric_limits<double>::infinity(), a) * std::copysign(1.0, b);
}

// Java's (long) cast of a double: truncates, saturates, NaN -> 0.
std::int64_t javaLong(double x) {
  if (std::isnan(x)) return 0;
  if (x >= 9223372036854775808.0) return std::numeric_limits<std::int64_t>::max();
  if (x <= -9223372036854775808.0) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(x);
}

// Guava 31.1's SmoothWarmingUp written out from the reference's formulas, with Java's
// arithmetic and no fixes: the oracle for the two defects. Time starts at 0; the caller owns it.
class GuavaWarmingUpModel {
 public:
  GuavaWarmingUpModel(double qps, std::int64_t warmupMicros, double coldFactor)
      : stable_(1e6 / qps), warmup_(static_cast<double>(warmupMicros)) {
    const double cold = stable_ * coldFactor;
    threshold_ = 0.5 * warmup_ / stable_;
    max_ = threshold_ + 2.0 * warmup_ / (stable_ + cold);
    slope_ = javaDiv(cold - stable_, max_ - threshold_);
    stored_ = max_;  // starts cold
  }
  // acquire(1) at `now`: returns how long the caller sleeps.
  std::int64_t acquire(std::int64_t now) { return std::max<std::int64_t>(reserve(now) - now, 0); }
  // tryAcquire() at `now` (timeout 0; a success never sleeps).
  bool tryAcquire(std::int64_t now) {
    if (nextFree_ > now) return false;
    (void)reserve(now);
    return true;
  }

 private:
  std::int64_t reserve(std::int64_t now) {
    if (now > nextFree_) {
      const double coolDown = javaDiv(warmup_, max_);
      stored_ = javaMin(max_, stored_ + javaDiv(static_cast<double>(now - nextFree_), coolDown));
      nextFree_ = now;
    }
    const std::int64_t ret = nextFree_;
    const double spend = javaMin(1.0, stored_);
    const double fresh = 1.0 - spend;
    nextFree_ += waitForStored(stored_, spend) + javaLong(fresh * stable_);
    stored_ -= spend;
    return ret;
  }
  std::int64_t waitForStored(double stored, double take) const {
    const double above = stored - threshold_;
    std::int64_t micros = 0;
    if (above > 0.0) {
      const double aboveTake = javaMin(above, take);
      const double length = permitsToTime(above) + permitsToTime(above - aboveTake);
      micros = javaLong(aboveTake * length / 2.0);
      take -= aboveTake;
    }
    return micros + javaLong(stable_ * take);
  }
  double permitsToTime(double permits) const { return stable_ + permits * slope_; }

  double stable_, warmup_, threshold_ = 0, max_ = 0, slope_ = 0, stored_ = 0;
  std::int64_t nextFree_ = 0;
};

TEST(GuavaWarmingUpModel, ReproducesTheReferenceWarmUpVector) {
  GuavaWarmingUpModel guava(2.0, 4000000, 3.0);
  std::int64_t now = 0;
  std::vector<std::int64_t> waits;
  for (int i = 0; i < 8; ++i) {
    waits.push_back(guava.acquire(now));
    now += waits.back();
  }
  EXPECT_THAT(waits, ElementsAre(0, 1375000, 1125000, 875000, 625000, 500000, 500000, 500000));
}

// Defect 1: with a zero warm-up period Guava's coolDownInterval is 0 / 0; after the first idle
// microsecond storedPermits is NaN and nothing ever waits again.
TEST(GuavaWarmingUpModel, ZeroWarmUpStopsLimitingAfterAnyIdleTime) {
  GuavaWarmingUpModel guava(5.0, 0, 3.0);
  std::int64_t now = 0;
  EXPECT_EQ(guava.acquire(now), 0);
  EXPECT_EQ(guava.acquire(now), 200000);
  now += 200000;      // slept; the second permit is paid at 400000
  now += 200000 + 1;  // one idle microsecond after that
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(guava.acquire(now), 0) << i;
}

TEST_F(SmoothRateLimiterTest, ZeroWarmUpIsStrictlyPacedNotUnlimited) {
  auto limiter = warmingUp(5.0, microseconds{0});
  acquireTimes(limiter, 3);
  sleepMicros(10000000);  // no burst is stored, and nothing breaks
  acquireTimes(limiter, 3);
  EXPECT_FALSE(limiter.tryAcquire());
  limiter.setRate(10.0);
  acquireTimes(limiter, 3);
  EXPECT_THAT(events(), ElementsAre(R(0), R(200000), R(200000), U(10000000), R(0), R(200000), R(200000), R(200000),
                                    R(100000), R(100000)));
  // A sub-microsecond warm-up truncates to zero and is the same limiter.
  auto tiny = RecordingLimiter::warmingUp(5.0, std::chrono::nanoseconds{999}, 3.0, RecordingClock(stopwatch_));
  acquireTimes(tiny, 2);
  EXPECT_THAT(events(), ElementsAre(R(0), R(200000)));
}

TEST(SmoothRateLimiterFix, ZeroWarmUpBehavesExactlyAsBurstyWithZeroBurst) {
  ManualClock clockA;
  ManualClock clockB;
  auto warm = ManualLimiter::warmingUp(7.0, seconds{0}, 3.0, ClockRef<ManualClock>(clockA));
  auto paced = ManualLimiter::bursty(7.0, 0.0, ClockRef<ManualClock>(clockB));
  std::mt19937_64 rng(99);
  std::uniform_int_distribution<int> op(0, 3);
  std::uniform_int_distribution<std::int64_t> micros(0, 400000);
  for (int i = 0; i < 2000; ++i) {
    switch (op(rng)) {
      case 0: {
        const std::int64_t n = 1 + micros(rng) % 3;
        ASSERT_EQ(warm.acquire(n), paced.acquire(n)) << i;
        break;
      }
      case 1: {
        const microseconds timeout{micros(rng)};
        ASSERT_EQ(warm.tryAcquire(1, timeout), paced.tryAcquire(1, timeout)) << i;
        break;
      }
      case 2:
        ASSERT_EQ(warm.reserve(), paced.reserve()) << i;
        break;
      default: {
        const microseconds idle{micros(rng)};
        clockA.advance(idle);
        clockB.advance(idle);
        break;
      }
    }
    ASSERT_EQ(clockA.now(), clockB.now()) << i;
  }
}

// Defect 2: a caller that polls tryAcquire() at a fixed period against a 10/s limiter with a
// 500 ms warm-up (cold factor 3). Returns the permits it got in [fromMicros, toMicros).
template <class TryAcquireAt>
int servedToPoller(TryAcquireAt&& tryAcquireAt, std::int64_t pollMicros, std::int64_t fromMicros,
                   std::int64_t toMicros) {
  int served = 0;
  for (std::int64_t now = 0; now < toMicros; now += pollMicros) {
    if (tryAcquireAt(now) && now >= fromMicros) ++served;
  }
  return served;
}

int guavaServed(std::int64_t pollMicros, std::int64_t fromMicros, std::int64_t toMicros) {
  GuavaWarmingUpModel guava(10.0, 500000, 3.0);
  return servedToPoller([&](std::int64_t now) { return guava.tryAcquire(now); }, pollMicros, fromMicros, toMicros);
}

int fixedServed(std::int64_t pollMicros, std::int64_t fromMicros, std::int64_t toMicros) {
  ManualClock clock;
  auto limiter = ManualLimiter::warmingUp(10.0, milliseconds{500}, 3.0, ClockRef<ManualClock>(clock));
  return servedToPoller(
      [&](std::int64_t now) {
        clock.advance(microseconds{now} - clock.now());
        return limiter.tryAcquire();
      },
      pollMicros, fromMicros, toMicros);
}

TEST(GuavaWarmingUpModel, TryAcquireStreamKeepsTheLimiterColdForever) {
  // Between 30 s and 90 s, long after any warm-up. 60 s at the stable rate would be 600.
  // Polling every 120 ms (8.3/s offered): Guava alternates between 5 and 4 stored permits and
  // serves one poll in three, 2.8/s.
  EXPECT_EQ(guavaServed(120000, 30000000, 90000000), 166);
  // Polling every 100 ms (exactly the stable rate): one poll in two, 5/s.
  EXPECT_EQ(guavaServed(100000, 30000000, 90000000), 300);
  // Polling every 250 ms (4/s offered, more than the cold rate of 3.3/s): 2/s.
  EXPECT_EQ(guavaServed(250000, 30000000, 90000000), 120);
}

TEST(SmoothRateLimiterFix, TryAcquireStreamWarmsTheLimiterUpToTheStableRate) {
  // The same pollers against the fixed limiter get what they ask for, up to the stable rate.
  EXPECT_EQ(fixedServed(120000, 30000000, 90000000), 500);  // every poll: 8.3/s
  EXPECT_EQ(fixedServed(100000, 30000000, 90000000), 600);  // the stable rate, 10/s
  EXPECT_EQ(fixedServed(250000, 30000000, 90000000), 240);  // every poll: 4/s
  // Faster pollers get the stable rate too (Guava also warms up for these).
  for (std::int64_t poll : {1000, 10000, 50000}) {
    EXPECT_EQ(fixedServed(poll, 30000000, 90000000), 600) << poll;
    EXPECT_EQ(guavaServed(poll, 30000000, 90000000), 600) << poll;
  }
  // And it gets there within about the warm-up period: 1 s to 2 s is already at 10/s.
  EXPECT_EQ(fixedServed(100000, 1000000, 2000000), 10);
}

// The fix is bounded: only the first coldFactor * stableInterval (300 ms here) of the idle gap
// after a refusal cannot raise stored permits above the threshold (2.5 here); the rest cools.
TEST_F(SmoothRateLimiterTest, RetryGapAfterARefusalRefillsOnlyUpToTheThreshold) {
  for (const std::int64_t gap : {300000, 400000}) {
    auto limiter = warmingUp(10.0, milliseconds{500});
    GuavaWarmingUpModel guava(10.0, 500000, 3.0);
    const std::int64_t start = stopwatch_.nowMicros();
    for (int i = 0; i < 5; ++i) {  // spends all 5 stored permits; the last one costs 100 ms
      const microseconds waited = limiter.acquire();
      ASSERT_EQ(waited.count(), guava.acquire(stopwatch_.nowMicros() - waited.count() - start));
    }
    EXPECT_FALSE(limiter.tryAcquire());
    EXPECT_FALSE(guava.tryAcquire(stopwatch_.nowMicros() - start));
    sleepMicros(100000 + gap);  // nextFree, then the gap
    const std::int64_t now = stopwatch_.nowMicros() - start;
    EXPECT_EQ(limiter.acquire(), microseconds{0});
    EXPECT_EQ(guava.acquire(now), 0);
    const microseconds fixedCost = limiter.acquire();
    const std::int64_t guavaCost = guava.acquire(now);
    if (gap == 300000) {
      EXPECT_EQ(fixedCost.count(), 100000);  // refilled to 2.5: warm, the stable interval
      EXPECT_EQ(guavaCost, 110000);          // refilled to 3: half a permit above the threshold
    } else {
      EXPECT_EQ(fixedCost.count(), 140000);  // 2.5, then 100 ms of cooling: 3.5
      EXPECT_EQ(guavaCost, 180000);          // 4
    }
    (void)events();
  }
}

TEST_F(SmoothRateLimiterTest, RefusalDoesNotKeepAnIdleLimiterWarm) {
  auto limiter = warmingUp(2.0, seconds{4});
  acquireTimes(limiter, 8);
  EXPECT_FALSE(limiter.tryAcquire());
  sleepMicros(500000);   // repays the last acquire
  sleepMicros(4000000);  // idle long after the refusal: cold again, as in Guava
  acquireTimes(limiter, 8);
  const std::vector<Event> cold{R(0), R(1375000), R(1125000), R(875000), R(625000), R(500000), R(500000), R(500000)};
  EXPECT_THAT(events(), ElementsAreArray(concat({cold, {U(500000), U(4000000)}, cold})));
}

// Over any window of length T >= 1 s, a bursty limiter grants at most
// rate * (T + maxBurstSeconds) + 1 single permits, whatever the mix of acquire, tryAcquire
// (with and without timeouts), reserve and idle time. A grant happens when its caller's wait
// ends: after acquire/tryAcquire return, or at now + wait for reserve.
// Rates whose interval is not a whole number of microseconds are included: fresh permits'
// costs are rounded up (Guava truncates, and would fail this test at 3/s by 1 us per permit).
TEST(SmoothRateLimiterProperty, BurstyNeverGrantsMoreThanRateTimesWindowPlusBurst) {
  const double rates[] = {0.5, 1.0, 4.0, 8.0, 50.0, 250.0, 1000.0, 3.0, 7.5, 333.0};
  const double bursts[] = {0.0, 0.25, 1.0, 2.5};
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed);
    const double rate = rates[seed % 10];
    const double maxBurstSeconds = bursts[(seed / 10) % 4];
    const auto intervalMicros = static_cast<std::int64_t>(1e6 / rate);
    ManualClock clock(seconds{seed * 1000});
    auto limiter = ManualLimiter::bursty(rate, maxBurstSeconds, ClockRef<ManualClock>(clock));
    std::vector<std::int64_t> grants;
    std::uniform_int_distribution<int> op(0, 5);
    std::uniform_int_distribution<std::int64_t> shortIdle(0, 2 * intervalMicros);
    std::uniform_int_distribution<std::int64_t> longIdle(0, 3000000 + 4 * intervalMicros);
    for (int step = 0; step < 1500; ++step) {
      switch (op(rng)) {
        case 0:
          (void)limiter.acquire();
          grants.push_back(clock.now().count());
          break;
        case 1:
          if (limiter.tryAcquire()) grants.push_back(clock.now().count());
          break;
        case 2:
          if (limiter.tryAcquire(1, microseconds{shortIdle(rng)})) {
            grants.push_back(clock.now().count());
          }
          break;
        case 3:
          grants.push_back(clock.now().count() + limiter.reserve().count());
          break;
        case 4:
          clock.advance(microseconds{shortIdle(rng)});
          break;
        default:
          if (step % 7 == 0) clock.advance(microseconds{longIdle(rng)});
          break;
      }
    }
    ASSERT_GT(grants.size(), 400u) << "seed " << seed;  // the sequence did exercise the limiter
    std::sort(grants.begin(), grants.end());
    // Any window holds the grants i..j of some pair; it is at least as long as max(1 s, g_j - g_i).
    for (std::size_t i = 0; i < grants.size(); ++i) {
      for (std::size_t j = i; j < grants.size(); ++j) {
        const double windowSeconds = std::max(1.0, static_cast<double>(grants[j] - grants[i]) / 1e6);
        const double bound = rate * (windowSeconds + maxBurstSeconds) + 1.0;
        const auto granted = static_cast<double>(j - i + 1);
        if (granted > bound + 1e-9) {
          FAIL() << "seed " << seed << " rate " << rate << " burst " << maxBurstSeconds << ": " << granted
                 << " permits in " << windowSeconds << " s, bound " << bound;
        }
      }
    }
  }
}

// The bound above is tight: a saturated limiter with a full burst reaches it.
TEST(SmoothRateLimiterProperty, BurstyBoundIsReachedBySaturation) {
  ManualClock clock;
  auto limiter = ManualLimiter::bursty(4.0, 1.0, ClockRef<ManualClock>(clock));
  clock.advance(seconds{10});
  const std::int64_t start = clock.now().count();
  int granted = 0;
  while (clock.now().count() + limiter.reserve().count() <= start + 1000000) ++granted;
  EXPECT_EQ(granted, 4 * (1 + 1) + 1);
}

// The one test on the real clock: 4 threads share a limiter for about a second. Checks
// behaviour, not speed: the limiter's guarantee (never more than rate * (T + burst) + 1 in the
// elapsed time T, which holds however slow the machine is) and a very loose floor.
TEST(SmoothRateLimiterThreads, FourThreadsShareTheRate) {
  constexpr double kRate = 200.0;
  constexpr double kBurstSeconds = 0.05;
  const auto start = std::chrono::steady_clock::now();
  auto limiter = redlimit::SmoothRateLimiter::bursty(kRate, kBurstSeconds);
  const auto deadline = start + milliseconds{1000};
  std::atomic<std::int64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      while (std::chrono::steady_clock::now() < deadline) {
        if (t % 2 == 0) {
          (void)limiter.acquire();
          granted.fetch_add(1, std::memory_order_relaxed);
        } else if (limiter.tryAcquire(1, milliseconds{20})) {
          granted.fetch_add(1, std::memory_order_relaxed);
        } else {
          limiter.setRate(kRate);  // also exercise setRate and getRate under contention
          EXPECT_EQ(limiter.getRate(), kRate);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const double elapsedSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto total = static_cast<double>(granted.load());
  EXPECT_LE(total, kRate * (elapsedSeconds + kBurstSeconds) + 1.0) << elapsedSeconds << " s";
  EXPECT_GE(total, kRate * 0.25) << elapsedSeconds << " s";  // ~200 expected; 50 is very loose
}

}  // namespace
