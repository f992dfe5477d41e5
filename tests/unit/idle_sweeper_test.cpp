// Unit tests of detail::IdleSweeper, the one thread that runs every SegmentedRateLimiter's idle
// give-back: tasks run when due and again when they ask, remove() waits for a running task but
// not from inside one, and a thread that cannot start is a redlimit::Error. Each test uses its
// own sweeper; waits are on condition variables (bounded), never sleeps.
#include "redlimit/detail/idle_sweeper.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "redlimit/errors.hpp"

namespace {

using redlimit::detail::IdleSweeper;
using std::chrono::microseconds;

/// A task owner: counts its runs, can be held inside a run, and can run a hook.
struct Owner {
  std::mutex m;
  std::condition_variable cv;
  int runs = 0;
  bool inside = false;
  bool hold = false;           // a run waits here until released
  std::int64_t next = -1;      // what a run returns
  int againUntil = 0;          // while runs < againUntil, return 0 (run again at once)
  std::function<void()> hook;  // runs inside each run, on the sweeper thread

  static std::int64_t task(void* self) noexcept { return static_cast<Owner*>(self)->run(); }
  std::int64_t run() noexcept {
    std::function<void()> h;
    {
      std::unique_lock<std::mutex> lk(m);
      ++runs;
      inside = true;
      cv.notify_all();
      cv.wait(lk, [&] { return !hold; });
      h = hook;
    }
    if (h) h();
    std::lock_guard<std::mutex> lk(m);
    inside = false;
    cv.notify_all();
    return runs < againUntil ? 0 : next;
  }
  template <class Pred>
  bool waitFor(Pred pred) {
    std::unique_lock<std::mutex> lk(m);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return pred(); });
  }
  void release() {
    std::lock_guard<std::mutex> lk(m);
    hold = false;
    cv.notify_all();
  }
  int runCount() {
    std::lock_guard<std::mutex> lk(m);
    return runs;
  }
};

TEST(SegmentIdleSweeper, RunsATaskWhenScheduledAndAgainWhenItAsks) {
  IdleSweeper sweeper;
  Owner a;
  a.againUntil = 3;  // runs 1 and 2 ask to run again at once; run 3 waits for schedule()
  const std::uint64_t id = sweeper.add(&a, &Owner::task);
  EXPECT_NE(id, 0u);
  EXPECT_EQ(sweeper.size(), 1u);
  EXPECT_EQ(a.runCount(), 0) << "not scheduled yet";
  sweeper.schedule(id, microseconds{0});
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 3 && !a.inside; }));
  sweeper.schedule(id, microseconds{0});
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 4 && !a.inside; }));
  sweeper.remove(id);
  EXPECT_EQ(sweeper.size(), 0u);
  sweeper.schedule(id, microseconds{0});  // a removed id is ignored
  EXPECT_EQ(a.runCount(), 4);
}

TEST(SegmentIdleSweeper, RemoveWaitsForTheRunningTask) {
  IdleSweeper sweeper;
  Owner a;
  a.hold = true;
  const std::uint64_t id = sweeper.add(&a, &Owner::task);
  sweeper.schedule(id, microseconds{0});
  ASSERT_TRUE(a.waitFor([&] { return a.inside; }));
  std::atomic<bool> finishedWhenRemoved{false};
  std::thread closer([&] {
    sweeper.remove(id);
    std::lock_guard<std::mutex> lk(a.m);
    finishedWhenRemoved = !a.inside;
  });
  // remove() unregisters first, then waits: once the entry is gone the closer is waiting.
  while (sweeper.size() != 0) std::this_thread::yield();
  a.release();
  closer.join();
  EXPECT_TRUE(finishedWhenRemoved.load()) << "remove() returned while the task was still running";
  EXPECT_EQ(a.runCount(), 1);
}

TEST(SegmentIdleSweeper, RemoveFromInsideATaskDoesNotWaitAndTheRemovedNeverRunAgain) {
  IdleSweeper sweeper;
  Owner a, b, c;
  const std::uint64_t idA = sweeper.add(&a, &Owner::task);
  const std::uint64_t idB = sweeper.add(&b, &Owner::task);
  const std::uint64_t idC = sweeper.add(&c, &Owner::task);
  a.next = 0;  // A asks to run again at once, but removes itself (and B) first
  a.hook = [&] {
    sweeper.remove(idB);  // an owner destroyed from inside the sweeper
    sweeper.remove(idA);  // the running task itself: must not wait for itself
  };
  c.againUntil = 2;  // C runs twice; its second run comes after anything A could have rescheduled
  sweeper.schedule(idB, std::chrono::hours(1));
  sweeper.schedule(idA, microseconds{0});
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 1 && !a.inside; }));
  sweeper.schedule(idC, microseconds{0});
  ASSERT_TRUE(c.waitFor([&] { return c.runs == 2 && !c.inside; }));
  EXPECT_EQ(a.runCount(), 1);
  EXPECT_EQ(b.runCount(), 0);
  EXPECT_EQ(sweeper.size(), 1u);
  sweeper.remove(idC);
}

TEST(SegmentIdleSweeper, ThreadThatCannotStartIsARedlimitErrorAndRegistersNothing) {
  int attempts = 0;
  IdleSweeper sweeper([&](std::function<void()> body) {
    if (++attempts == 1) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    return std::thread(std::move(body));
  });
  Owner a;
  try {
    (void)sweeper.add(&a, &Owner::task);
    FAIL() << "no error";
  } catch (const std::system_error&) {
    FAIL() << "a std::system_error escaped";
  } catch (const redlimit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start the thread"), std::string::npos) << e.what();
  }
  EXPECT_EQ(sweeper.size(), 0u);
  const std::uint64_t id = sweeper.add(&a, &Owner::task);  // the next add starts it
  sweeper.schedule(id, microseconds{0});
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 1 && !a.inside; }));
  EXPECT_EQ(attempts, 2);
  sweeper.remove(id);
}

TEST(SegmentIdleSweeper, AfterStopNothingRunsAndRegistrationStillWorks) {
  int started = 0;
  IdleSweeper sweeper([&](std::function<void()> body) {
    ++started;
    return std::thread(std::move(body));
  });
  Owner a, b;
  const std::uint64_t idA = sweeper.add(&a, &Owner::task);
  sweeper.schedule(idA, microseconds{0});
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 1 && !a.inside; }));
  sweeper.stop();  // joins the thread: nothing can run after this
  sweeper.schedule(idA, microseconds{0});
  const std::uint64_t idB = sweeper.add(&b, &Owner::task);  // registers, starts no thread
  sweeper.schedule(idB, microseconds{0});
  sweeper.remove(idA);  // does not wait
  sweeper.remove(idB);
  EXPECT_EQ(started, 1);
  EXPECT_EQ(sweeper.runs(), 1u);
  EXPECT_EQ(a.runCount(), 1);
  EXPECT_EQ(b.runCount(), 0);
  sweeper.stop();  // idempotent
}

TEST(SegmentIdleSweeper, OneThreadForAnyNumberOfOwners) {
  int started = 0;
  IdleSweeper sweeper([&](std::function<void()> body) {
    ++started;
    return std::thread(std::move(body));
  });
  std::vector<Owner> owners(500);
  std::vector<std::uint64_t> ids;
  for (Owner& o : owners) ids.push_back(sweeper.add(&o, &Owner::task));
  for (std::uint64_t id : ids) sweeper.schedule(id, microseconds{0});
  for (Owner& o : owners) ASSERT_TRUE(o.waitFor([&] { return o.runs == 1 && !o.inside; }));
  EXPECT_EQ(started, 1);
  // The owner's own count is visible before the sweeper counts the run (it counts after the
  // task returns); remove() waits for a running task, so after the removes the count is final.
  for (std::uint64_t id : ids) sweeper.remove(id);
  EXPECT_EQ(sweeper.runs(), 500u);
}

TEST(SegmentIdleSweeper, AnEarlierScheduleWinsOverALaterOne) {
  IdleSweeper sweeper;
  Owner a;
  const std::uint64_t id = sweeper.add(&a, &Owner::task);
  sweeper.schedule(id, std::chrono::hours(1));
  sweeper.schedule(id, microseconds{0});  // due sooner: replaces the hour
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 1 && !a.inside; }));
  sweeper.schedule(id, microseconds{0});
  sweeper.schedule(id, std::chrono::hours(1));  // later than the due time it has: ignored
  ASSERT_TRUE(a.waitFor([&] { return a.runs == 2 && !a.inside; }));
  sweeper.remove(id);
}

}  // namespace
