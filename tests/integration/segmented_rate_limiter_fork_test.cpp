// A limiter with requests in flight at fork() must not be dead in the child; the segment cache's
// part (RateLimiterFork and FailureGate's fork test have the rest): a fork() child's
// SegmentedRateLimiter must neither spend nor
// give back the segment it inherited (the parent's), nor wait for a refill that a parent thread
// was leading; its calls decide with fresh segments from Redis.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit_test/fd_io.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/sanitizers.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class SegmentedRateLimiterFork : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
#if REDLIMIT_TEST_TSAN
    // The child's Client starts an I/O thread: ThreadSanitizer must not kill it (the tsan preset
    // sets die_after_fork=0; these tests are never skipped).
    const char* tsanOptions = std::getenv("TSAN_OPTIONS");
    ASSERT_TRUE(tsanOptions != nullptr && std::strstr(tsanOptions, "die_after_fork=0") != nullptr)
        << "under ThreadSanitizer, run with TSAN_OPTIONS=die_after_fork=0 (the tsan preset does)";
#endif
  }
};

// What a child reports through its pipe (the child runs redlimit calls only, no gtest).
struct ChildReport {
  std::int64_t granted = 0;
  std::int64_t denied = 0;
  std::int64_t timeouts = 0;
  std::int64_t otherErrors = 0;
  std::int64_t returnedAtClose = -1;  // what the child's close() gave back to Redis
  char firstError[256] = {};          // what() of the first error (for the failure message)
};

// Runs `child` in a fork() child, which reports through a pipe and _exits; returns its report.
template <class Child>
void runChild(Child&& child, ChildReport& out) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0) << std::strerror(errno);
  // The parent's other threads asleep first: see waitUntilOtherThreadsSleep (ThreadSanitizer).
  (void)waitUntilOtherThreadsSleep();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ChildReport r;
    child(r);
    ::_exit(writeAll(fds[1], &r, sizeof r) ? 0 : 3);
  }
  ::close(fds[1]);
  ASSERT_GT(pid, 0) << std::strerror(errno);
  const std::string bytes = readToEnd(fds[0]);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_EQ(bytes.size(), sizeof(ChildReport));
  std::memcpy(&out, bytes.data(), sizeof out);
}

// One call, counted by outcome.
template <class Call>
void countCall(ChildReport& r, Call&& call) {
  try {
    if (call()) {
      ++r.granted;
    } else {
      ++r.denied;
    }
  } catch (const TimeoutError& e) {
    if (r.timeouts + r.otherErrors == 0) std::strncpy(r.firstError, e.what(), sizeof r.firstError - 1);
    ++r.timeouts;
  } catch (const std::exception& e) {
    if (r.timeouts + r.otherErrors == 0) std::strncpy(r.firstError, e.what(), sizeof r.firstError - 1);
    ++r.otherErrors;
  } catch (...) {
    ++r.otherErrors;
  }
}

// The parent holds 49 permits of a segment of 50; the rest of the window (50) is taken directly,
// so Redis has nothing left. A child spending its inherited copy of the segment would admit
// permits Redis never granted to it (old code: 5 of 5 granted, and its close() gave the parent's
// 49 back to Redis). Now the child is denied, gives nothing back, and the parent keeps its 49.
TEST_F(SegmentedRateLimiterFork, ChildDoesNotSpendTheParentsSegment) {
  constexpr int kChildCalls = 5;
  ClientOptions co;
  co.connection.commandTimeout = milliseconds(3000);
  auto source = std::make_shared<RateLimiter>(newClient(co), name());
  ASSERT_TRUE(source->trySetRate(RateType::Overall, 100, seconds(60)));
  SegmentOptions so;
  so.segmentSize = 50;
  SegmentedRateLimiter<> segmented(source, so);
  ASSERT_TRUE(segmented.tryAcquire());
  ASSERT_EQ(segmented.stats().permitsHeld, 49);
  ASSERT_TRUE(source->tryAcquire(50));
  ASSERT_EQ(source->availablePermits(), 0);

  ChildReport child;
  ASSERT_NO_FATAL_FAILURE(runChild(
      [&](ChildReport& r) {
        for (int i = 0; i < kChildCalls; ++i) countCall(r, [&] { return segmented.tryAcquire(); });
        r.returnedAtClose = segmented.close();
      },
      child));
  EXPECT_EQ(child.granted, 0) << "the child spent permits of the parent's segment";
  EXPECT_EQ(child.denied, kChildCalls) << "Redis has nothing left: the child's own refills are denied";
  EXPECT_EQ(child.timeouts + child.otherErrors, 0) << child.firstError;
  EXPECT_EQ(child.returnedAtClose, 0) << "the child gave the parent's segment back to Redis";

  // The parent's segment is intact, and Redis still counts it as taken.
  EXPECT_EQ(source->availablePermits(), 0);
  EXPECT_EQ(segmented.stats().permitsHeld, 49);
  for (int i = 0; i < 49; ++i) ASSERT_TRUE(segmented.tryAcquire()) << i;
  EXPECT_FALSE(segmented.tryAcquire());
}

// A parent thread is leading a refill (Redis is paused) when the process forks. The child's
// coordinator must not wait for that leader, which does not exist in the child: on the old code
// each child call waited refillWait and then the Throw policy gave a TimeoutError. Now the
// child's calls lead their own refills and are granted once Redis answers.
TEST_F(SegmentedRateLimiterFork, RefillInFlightAtForkLeavesTheChildWorking) {
  constexpr int kChildCalls = 5;
  ClientOptions co;
  co.connection.commandTimeout = milliseconds(5000);
  co.connection.connectTimeout = milliseconds(5000);  // the child's new connection PINGs Redis while it is paused
  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Throw;
  auto source = std::make_shared<RateLimiter>(newClient(co), name(), lo);
  ASSERT_TRUE(source->trySetRate(RateType::Overall, 1000, seconds(60)));
  SegmentOptions so;
  so.segmentSize = 10;
  so.refillWait = milliseconds(2000);
  SegmentedRateLimiter<> segmented(source, so);
  ASSERT_TRUE(segmented.tryAcquire());  // the connection is open; 9 permits held
  ASSERT_EQ(segmented.stats().remoteRoundTrips, 1);

  (void)raw({"CLIENT", "PAUSE", "1000", "ALL"});
  std::atomic<bool> leaderGranted{false};
  // Needs 10 with 9 held: leads a refill for the difference, which Redis holds.
  std::thread leader([&] { leaderGranted = segmented.tryAcquire(10); });
  // The round trip is counted just before the request goes out, with the mutex released.
  while (segmented.stats().remoteRoundTrips < 2) std::this_thread::sleep_for(milliseconds(1));

  ChildReport child;
  runChild(
      [&](ChildReport& r) {
        for (int i = 0; i < kChildCalls && r.timeouts + r.otherErrors == 0; ++i) {
          countCall(r, [&] { return segmented.tryAcquire(); });
        }
        r.returnedAtClose = segmented.close();
      },
      child);
  leader.join();
  EXPECT_EQ(child.timeouts, 0) << "the child's calls waited for the parent's leader: " << child.firstError;
  EXPECT_EQ(child.otherErrors, 0) << child.firstError;
  EXPECT_EQ(child.granted, kChildCalls);
  EXPECT_TRUE(leaderGranted.load());
}

}  // namespace
}  // namespace redlimit::test
