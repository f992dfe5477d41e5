// SegmentedRateLimiter against a real redis-server that stalls
// (SIGSTOP: connections are accepted and requests queued, nothing is answered — an unreachable
// server that does not refuse), with many limiters, and with bad reconfigure() arguments.
#include <csignal>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
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

// Fault tests on this 2-core machine allow this much beyond a computed bound.
constexpr milliseconds kSlack{500};

class SegmentedRateLimiterFaults : public RedisTest {};

}  // namespace

// close() gave back each limiter's unspent permits with no failure gate, one command
// timeout (~512 ms) per limiter, one after another. Closing 20 limiters on one Client while the
// server stalls must cost one bounded attempt in total; the others are skipped and their
// permits counted as expired (they expire in Redis within one interval anyway).
TEST_F(SegmentedRateLimiterFaults, CloseWhileRedisDownIsOneAttemptInTotal) {
  constexpr int kLimiters = 20;
  RedisServer own;
  ClientOptions co;
  co.connection = parseUri(own.uri());  // default timeouts: connect 500 ms, command 500 ms, pool wait 100 ms
  auto client = Client::create(co);
  auto admin = Client::create(co);
  std::vector<std::unique_ptr<Segmented>> limiters;
  SegmentOptions so;
  so.segmentSize = 10;
  so.returnWhenIdle = false;
  for (int i = 0; i < kLimiters; ++i) {
    auto source = std::make_shared<RateLimiter>(client, "close" + std::to_string(i));
    ASSERT_TRUE(source->trySetRate(RateType::Overall, 100, milliseconds(60000)));
    limiters.push_back(std::make_unique<Segmented>(source, so));
    ASSERT_TRUE(limiters.back()->tryAcquire());  // holds 9
  }
  const std::int64_t evalsBefore = commandCalls(*admin, "evalsha");
  const pid_t pid = serverPid(*admin);

  Stall stall(pid);
  const auto start = SteadyTime::now();
  std::int64_t returned = 0;
  for (auto& l : limiters) returned += l->close();
  const std::int64_t took = msSince(start);
  stall.resume();

  const PoolStats be = client->poolStats();
  const ClientOptions::Connection& c = co.connection;
  const milliseconds oneAttempt = c.connectTimeout + c.commandTimeout;
  std::printf("[ close  ] closing %d limiters while stalled took %lld ms; give-backs sent %llu, skipped %llu\n",
              kLimiters, static_cast<long long>(took), static_cast<unsigned long long>(be.bestEffortSent),
              static_cast<unsigned long long>(be.bestEffortSkipped));
  EXPECT_EQ(be.bestEffortSent, 1u) << "the first give-back finds the server stalled";
  EXPECT_EQ(be.bestEffortSkipped, static_cast<std::uint64_t>(kLimiters - 1)) << "the others are skipped";
  EXPECT_TRUE(be.unreachable);
  EXPECT_EQ(returned, 0) << "nothing could be given back";
  EXPECT_LE(took, (oneAttempt + kSlack).count()) << "one bounded attempt in total, not one per limiter";
  for (auto& l : limiters) {
    const SegmentStats s = l->stats();
    EXPECT_EQ(s.permitsExpired, 9) << "a skipped or failed give-back counts its permits as expired";
    EXPECT_EQ(s.permitsHeld, 0);
  }
  // The server, once resumed, runs what reached it during the stall: the one attempt.
  for (int i = 0; i < 100 && commandCalls(*admin, "evalsha") - evalsBefore < 1; ++i) sleepMs(10);
  sleepMs(100);
  const std::int64_t sent = commandCalls(*admin, "evalsha") - evalsBefore;
  std::printf("[ close  ] give-backs that reached the server: %lld\n", static_cast<long long>(sent));
  EXPECT_EQ(sent, 1);

  // Once a call reaches Redis again, give-backs go at once.
  auto after = std::make_shared<RateLimiter>(client, "close-after");
  ASSERT_TRUE(after->trySetRate(RateType::Overall, 100, milliseconds(60000)));
  EXPECT_FALSE(client->poolStats().unreachable);
  Segmented last(after, so);
  ASSERT_TRUE(last.tryAcquire());
  EXPECT_EQ(last.close(), 9);
  EXPECT_EQ(client->poolStats().bestEffortSent, 2u);
}

// Each SegmentedRateLimiter started its own idle give-back thread (10 000 limiters =
// 10 001 threads). The thread count must not depend on the number of limiters: with one limiter
// or with 200 it is the same (one shared sweeper), and that one thread still gives back every
// idle limiter's segment. (The count is taken after the first limiter, because a sanitizer
// runtime may start a helper thread of its own with the process's second thread.)
TEST_F(SegmentedRateLimiterFaults, TwoHundredLimitersShareOneSweeperThread) {
  constexpr int kLimiters = 200;
  const std::size_t none = threadCount();
  std::vector<std::unique_ptr<Segmented>> limiters;
  SegmentOptions so;
  so.segmentSize = 10;
  so.returnWhenIdle = true;
  so.idleReturnAfter = milliseconds(50);
  std::size_t withOne = 0;
  for (int i = 0; i < kLimiters; ++i) {
    auto source = std::make_shared<RateLimiter>(client(), name(std::to_string(i)));
    ASSERT_TRUE(source->trySetRate(RateType::Overall, 100, milliseconds(60000)));
    limiters.push_back(std::make_unique<Segmented>(source, so));
    ASSERT_TRUE(limiters.back()->tryAcquire());  // holds 9
    if (i == 0) withOne = threadCount();
  }
  const std::size_t withAll = threadCount();
  std::printf("[ sweeper] threads: %lld without limiters, %lld with one, %lld with %d\n", static_cast<long long>(none),
              static_cast<long long>(withOne), static_cast<long long>(withAll), kLimiters);
  EXPECT_EQ(withAll, withOne) << "thread count independent of the number of limiters";

  // Every limiter goes idle; the shared sweeper gives each segment back (bounded wait).
  auto allReturned = [&] {
    for (auto& l : limiters) {
      if (l->stats().permitsReturned != 9) return false;
    }
    return true;
  };
  for (int i = 0; i < 1000 && !allReturned(); ++i) sleepMs(10);
  EXPECT_TRUE(allReturned());
  for (auto& l : limiters) EXPECT_EQ(l->source()->availablePermits(), 99);
  limiters.clear();
  EXPECT_EQ(threadCount(), withOne);
}

// While the leader's refill is stuck on an unresponsive server, the other callers waited
// refillWait and got `false` whatever the policy. They must get the policy's answer.
TEST_F(SegmentedRateLimiterFaults, WaitersForAStuckRefillGetThePolicysAnswer) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Local, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer own;
    ClientOptions co;
    co.connection = parseUri(own.uri());
    co.connection.commandTimeout = milliseconds(3000);  // the leader stays stuck well past refillWait
    auto client = Client::create(co);
    auto admin = Client::create(co);
    RateLimiter::Options lo;
    lo.failure.policy = policy;
    const std::string limiterName = "stuck-refill";
    auto source = std::make_shared<RateLimiter>(client, limiterName, lo);
    ASSERT_TRUE(source->trySetRate(RateType::Overall, 100, milliseconds(60000)));  // the rate is known
    SegmentOptions so;
    so.segmentSize = 10;
    so.returnWhenIdle = false;
    so.refillWait = milliseconds(100);
    Segmented seg(source, so);
    const pid_t pid = serverPid(*admin);

    Stall stall(pid);
    std::thread leader([&] {
      try {
        (void)seg.tryAcquire();
      } catch (const IoError&) {
      }
    });
    while (seg.stats().remoteRoundTrips < 1) std::this_thread::yield();  // the leader's refill is in flight
    const auto start = SteadyTime::now();
    bool granted = false, timedOut = false;
    std::string message;
    try {
      granted = seg.tryAcquire();
    } catch (const TimeoutError& e) {
      timedOut = true;
      message = e.what();
    }
    const std::int64_t took = msSince(start);
    const FailureStats fs = source->failureStats();
    stall.resume();
    leader.join();

    EXPECT_LT(took, co.connection.commandTimeout.count()) << "the waiter did not wait for the stuck leader";
    switch (policy) {
      case FailurePolicy::Allow:
        EXPECT_TRUE(granted);
        EXPECT_EQ(fs.allowed, 1u);
        break;
      case FailurePolicy::Deny:
        EXPECT_FALSE(granted);
        EXPECT_EQ(fs.denied, 1u);
        break;
      case FailurePolicy::Local:  // the local bucket (100 x 1.0 per minute) has room
        EXPECT_TRUE(granted);
        EXPECT_EQ(fs.allowed, 1u);
        break;
      case FailurePolicy::Throw:
        EXPECT_TRUE(timedOut);
        EXPECT_EQ(fs.thrown, 1u);
        EXPECT_NE(message.find("refill in flight"), std::string::npos) << message;
        EXPECT_NE(message.find("100 ms"), std::string::npos) << message;
        EXPECT_NE(message.find(limiterName), std::string::npos) << message;
        break;
    }
  }
}

// reconfigure() read the configuration and gave the segment back before the source
// refused an interval above kMaxInterval or an unknown RateType. It must refuse first, sending
// nothing.
TEST_F(SegmentedRateLimiterFaults, ReconfigureRefusesBadArgumentsBeforeSendingAnything) {
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
