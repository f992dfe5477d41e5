// SimulatedClock and ClockView (clock.hpp): sleepers and timed waits block until the test advances
// time, and wake in deadline order.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/clock.hpp"

namespace {

using redlimit::ClockRef;
using redlimit::ClockView;
using redlimit::ManualClock;
using redlimit::SimulatedClock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// advance() wakes exactly the sleepers whose deadlines it passes and returns once they have left
// their waits; the others stay blocked. (What a woken thread does after its wait may interleave
// with the next one's: advance() waits for each to leave the clock, not for its work.)
TEST(SimulatedClock, SleepersBlockUntilTheTestAdvancesTimeAndWakeInDeadlineOrder) {
  SimulatedClock clock{milliseconds(1000)};
  std::array<std::atomic<bool>, 4> woke{};
  std::vector<std::thread> threads;  // threads[0] sleeps 30 ms, threads[1] 20 ms, threads[2] 10 ms
  for (int i = 3; i >= 1; --i) {
    threads.emplace_back([&, i] {
      clock.sleepFor(milliseconds(10 * i));
      woke[static_cast<std::size_t>(i)] = true;
    });
    ASSERT_TRUE(clock.awaitBlocked(static_cast<std::size_t>(4 - i)));
  }
  EXPECT_EQ(clock.blocked(), 3u);
  clock.advance(milliseconds(15));  // passes the 10 ms deadline only
  EXPECT_EQ(clock.blocked(), 2u);
  threads[2].join();
  EXPECT_TRUE(woke[1]);
  EXPECT_FALSE(woke[2] || woke[3]);
  clock.advance(milliseconds(10));  // the 20 ms one
  EXPECT_EQ(clock.blocked(), 1u);
  threads[1].join();
  EXPECT_TRUE(woke[2]);
  EXPECT_FALSE(woke[3]);
  clock.advance(milliseconds(100));
  threads[0].join();
  EXPECT_TRUE(woke[3]);
  EXPECT_EQ(clock.now(), milliseconds(1125));
  EXPECT_EQ(clock.blocked(), 0u);
}

TEST(SimulatedClock, AdvanceStopsAtEachDeadlineSoAWokenThreadSeesItsOwnTime) {
  SimulatedClock clock;
  std::vector<microseconds> seen(2);
  std::thread a([&] {
    clock.sleepFor(milliseconds(5));
    seen[0] = clock.now();
  });
  std::thread b([&] {
    clock.sleepFor(milliseconds(8));
    seen[1] = clock.now();
  });
  ASSERT_TRUE(clock.awaitBlocked(2));
  clock.advance(milliseconds(20));
  a.join();
  b.join();
  // Each woke at its own deadline; the clock reached the target after both had left their waits.
  EXPECT_GE(seen[0], milliseconds(5));
  EXPECT_GE(seen[1], milliseconds(8));
  EXPECT_EQ(clock.now(), milliseconds(20));
}

TEST(SimulatedClock, TimedWaitEndsAtTheDeadlineOrWhenNotified) {
  SimulatedClock clock;
  std::mutex m;
  std::condition_variable cv;
  bool ready = false;
  std::atomic<int> result{-1};
  std::thread timedOut([&] {
    std::unique_lock<std::mutex> lk(m);
    result = redlimit::clockWaitUntil(clock, lk, cv, milliseconds(50), [&] { return ready; }) ? 1 : 0;
  });
  ASSERT_TRUE(clock.awaitBlocked(1));
  clock.advance(milliseconds(49));
  EXPECT_EQ(clock.blocked(), 1u) << "the deadline has not come";
  EXPECT_EQ(result.load(), -1);
  clock.advance(milliseconds(1));
  timedOut.join();
  EXPECT_EQ(result.load(), 0) << "timed out: pred() still false";

  std::thread notified([&] {
    std::unique_lock<std::mutex> lk(m);
    result =
        redlimit::clockWaitUntil(ClockRef<SimulatedClock>(clock), lk, cv, milliseconds(1000), [&] { return ready; })
            ? 1
            : 0;
  });
  ASSERT_TRUE(clock.awaitBlocked(1));
  {
    std::lock_guard<std::mutex> g(m);
    ready = true;
  }
  cv.notify_all();
  notified.join();
  EXPECT_EQ(result.load(), 1);
  EXPECT_EQ(clock.now(), milliseconds(50)) << "a notification moves no time";
}

TEST(SimulatedClock, ZeroSleepsAndPastDeadlinesDoNotBlock) {
  SimulatedClock clock{milliseconds(10)};
  clock.sleepFor(microseconds(0));
  clock.sleepFor(microseconds(-5));
  std::mutex m;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lk(m);
  EXPECT_FALSE(clock.waitUntil(lk, cv, milliseconds(10), [] { return false; }));
  EXPECT_TRUE(clock.waitUntil(lk, cv, milliseconds(99), [] { return true; }));
  clock.advance(microseconds(-1));
  clock.advanceTo(milliseconds(5));
  EXPECT_EQ(clock.now(), milliseconds(10)) << "time never goes back";
}

TEST(ClockView, ReadsTheClockItViewsAndSteadyClockByDefault) {
  ManualClock manual{milliseconds(7)};
  const ClockView view(manual);
  EXPECT_EQ(view.now(), milliseconds(7));
  view.sleepFor(milliseconds(3));  // ManualClock: advances
  EXPECT_EQ(manual.now(), milliseconds(10));
  EXPECT_EQ(view.maxLag(), microseconds(0));

  const redlimit::CoarseSteadyClock coarse;
  EXPECT_EQ(ClockView(coarse).maxLag(), coarse.maxLag());

  const ClockView steady;
  const microseconds a = steady.now();
  const microseconds b = redlimit::SteadyClock{}.now();
  EXPECT_LE(a, b);
  EXPECT_GT(a.count(), 0);
}

}  // namespace
