// detail::RefillCoordinator (refill_coordinator.hpp), alone: one leader at a time, waits for the
// leader timed on a SimulatedClock, the shared denial, give-backs in flight and closing.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "redlimit/clock.hpp"
#include "redlimit/detail/refill_coordinator.hpp"

namespace {

using redlimit::SimulatedClock;
using redlimit::detail::LockGuard;
using redlimit::detail::RefillCoordinator;
using redlimit::detail::UniqueLock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(RefillCoordinator, OneLeaderAtATime) {
  RefillCoordinator c;
  const LockGuard lk(c.mutex());
  EXPECT_FALSE(c.leading());
  EXPECT_TRUE(c.tryLead());
  EXPECT_TRUE(c.leading());
  EXPECT_TRUE(c.busy());
  EXPECT_FALSE(c.tryLead()) << "the role is taken";
  c.endLead();
  EXPECT_FALSE(c.busy());
  EXPECT_TRUE(c.tryLead());
}

// A follower waits on the clock for the leader: the wait ends when the leader ends its lead, or
// when the test moves the time past the follower's deadline, not before.
TEST(RefillCoordinator, AFollowerWaitsForTheLeaderOrItsDeadlineOnTheClock) {
  SimulatedClock clock;
  RefillCoordinator c;
  {
    const LockGuard lk(c.mutex());
    ASSERT_TRUE(c.tryLead());
  }
  std::atomic<int> outcome{-1};
  std::thread follower([&] {
    UniqueLock lk(c.mutex());
    outcome = c.awaitLeader(clock, lk, microseconds{1000}) ? 1 : 0;
  });
  ASSERT_TRUE(clock.awaitBlocked(1));
  clock.advance(microseconds{999});
  EXPECT_EQ(outcome.load(), -1) << "still waiting before its deadline";
  clock.advance(microseconds{1});  // returns once the follower has left its wait
  follower.join();
  EXPECT_EQ(outcome.load(), 0) << "timed out: the leader has not finished";

  std::thread second([&] {
    UniqueLock lk(c.mutex());
    outcome = c.awaitLeader(clock, lk, microseconds{5000}) ? 1 : 0;
  });
  ASSERT_TRUE(clock.awaitBlocked(1));
  {
    const LockGuard lk(c.mutex());
    c.endLead();
  }
  second.join();
  EXPECT_EQ(outcome.load(), 1) << "woken by the end of the lead, before its deadline";
  EXPECT_EQ(clock.now(), microseconds{1000});
}

// The denial a leader brought back answers a follower that began waiting before it and asks for
// as many permits or more; not one that asks for fewer, and not one that began after it.
TEST(RefillCoordinator, ADenialIsSharedWithTheFollowersItCovers) {
  RefillCoordinator c;
  const LockGuard lk(c.mutex());
  const std::uint64_t before = c.attempts();
  c.recordDenial(5, milliseconds{40});
  EXPECT_EQ(c.attempts(), before + 1);
  EXPECT_EQ(c.sharedDenial(before, 5), std::optional<milliseconds>(milliseconds{40}));
  EXPECT_EQ(c.sharedDenial(before, 9), std::optional<milliseconds>(milliseconds{40}));
  EXPECT_EQ(c.sharedDenial(before, 4), std::nullopt) << "a smaller request may still fit";
  EXPECT_EQ(c.sharedDenial(c.attempts(), 9), std::nullopt) << "no attempt completed since it began waiting";
  const std::uint64_t seen = c.attempts();
  c.recordGrant();
  EXPECT_EQ(c.sharedDenial(seen, 9), std::nullopt) << "the last attempt was granted";
}

// reconfigure() and close() take the lead only once a give-back in flight has returned; a closed
// coordinator refuses the lead to everyone but close() itself.
TEST(RefillCoordinator, LeadWhenIdleWaitsForAGiveBackAndRespectsClose) {
  RefillCoordinator c;
  {
    const LockGuard lk(c.mutex());
    c.beginRelease();
    EXPECT_TRUE(c.busy());
    EXPECT_TRUE(c.tryLead()) << "a give-back does not hold the leader role";
    c.endLead();
  }
  std::atomic<bool> led{false};
  std::thread reconfigure([&] {
    UniqueLock lk(c.mutex());
    led = c.leadWhenIdle(lk);
  });
  {
    const LockGuard lk(c.mutex());
    c.endRelease();  // wakes the waiter; it may not have started waiting yet, which is fine too
  }
  reconfigure.join();
  EXPECT_TRUE(led.load());
  {
    const LockGuard lk(c.mutex());
    EXPECT_TRUE(c.leading());
    c.endLead();
    EXPECT_TRUE(c.close());
    EXPECT_FALSE(c.close()) << "closing twice is a no-op";
    EXPECT_TRUE(c.closed());
  }
  UniqueLock lk(c.mutex());
  EXPECT_FALSE(c.leadWhenIdle(lk)) << "closed: no lead for a reconfigure";
  EXPECT_TRUE(c.leadWhenIdle(lk, /*evenIfClosed=*/true)) << "close() itself gives the segment back as leader";
}

// close() wakes a follower waiting for a leader, long before its deadline.
TEST(RefillCoordinator, CloseWakesTheFollowers) {
  SimulatedClock clock;
  RefillCoordinator c;
  {
    const LockGuard lk(c.mutex());
    ASSERT_TRUE(c.tryLead());
  }
  std::atomic<int> outcome{-1};
  std::thread follower([&] {
    UniqueLock lk(c.mutex());
    const bool woken = c.awaitLeader(clock, lk, microseconds{1000000});
    outcome = woken && c.closed() ? 1 : 0;
  });
  ASSERT_TRUE(clock.awaitBlocked(1));
  {
    const LockGuard lk(c.mutex());
    EXPECT_TRUE(c.close());
  }
  follower.join();
  EXPECT_EQ(outcome.load(), 1);
  EXPECT_EQ(clock.now(), microseconds{0}) << "no time had to pass";
}

}  // namespace
