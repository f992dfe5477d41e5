// The limiters against what their callers and peers may do to them: a completion callback that
// throws (it must not break its coalesced batch, nor run twice), a fork() with requests in flight
// (the child's handle must work), and a hostile peer's nested array headers (no memory
// amplification; the parser's own tests are in tests/unit/resp_test.cpp, RespLimits.*).
#include <malloc.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/events.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fake_peer.hpp"
#include "redlimit_test/fd_io.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/sanitizers.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// ----- A throwing completion callback -----------------------------------------------------------

class LimiterCallbacks : public RedisTest {};

struct Completion {
  std::atomic<int> runs{0};
  std::atomic<std::int64_t> granted{-1};
  std::atomic<bool> failed{false};
};

TEST_F(LimiterCallbacks, AThrowingCallbackLeavesItsBatchMatesAlone) {
  constexpr int kCalls = 200;
  constexpr int kThrower = 5;
  constexpr std::int64_t kRate = 100;
  auto registry = std::make_shared<MetricsRegistry>();
  std::mutex eventsMutex;
  std::vector<Event> events;
  RateLimiter::Options options;  // coalesce is on by default
  ASSERT_TRUE(options.coalesce);
  options.monitor.registry = registry;
  options.monitor.onEvent = [&](const Event& e) {
    const std::lock_guard<std::mutex> lock(eventsMutex);
    events.push_back(e);
  };
  ClientOptions co;
  co.pool.size = 1;
  co.connection.commandTimeout = milliseconds(3000);
  RateLimiter limiter(newClient(co), name(), options);
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kRate, seconds(60)));

  // Redis holds the first acquisition while the others queue behind it on the handle, so they go
  // as batches of up to 64 (the thrower in the first one).
  (void)raw({"CLIENT", "PAUSE", "300", "ALL"});
  std::vector<Completion> seen(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpToAsync(
        limiter, 1, 1, [&seen, i](const detail::AcquireResult& r, const std::exception_ptr& e) {
          Completion& c = seen[static_cast<std::size_t>(i)];
          c.failed = e != nullptr;
          c.granted = r.granted;
          c.runs.fetch_add(1);
          if (i == kThrower) throw std::runtime_error("callback 5 throws");
        });
  }
  ASSERT_TRUE(waitFor(
      [&] {
        for (const auto& c : seen)
          if (c.runs.load() == 0) return false;
        return true;
      },
      seconds(20)))
      << "every callback runs";
  // A callback that ran twice would have done so by the time the others completed; give a late
  // second run a moment anyway (a condition checked below, not a timing bound).
  std::this_thread::sleep_for(milliseconds(100));
  for (int i = 0; i < kCalls; ++i) {
    SCOPED_TRACE(i);
    const Completion& c = seen[static_cast<std::size_t>(i)];
    EXPECT_EQ(c.runs.load(), 1) << "each callback runs exactly once";
    EXPECT_FALSE(c.failed.load()) << "no callback gets another's exception";
    EXPECT_EQ(c.granted.load(), i < kRate ? 1 : 0) << "each gets its own decision, in order";
  }
  const LimiterMetrics::Snapshot m = limiter.monitor().metrics()->snapshot();
  EXPECT_EQ(m.callbacksThrew, 1u);
  EXPECT_LT(m.roundTrips, static_cast<std::uint64_t>(kCalls)) << "the acquisitions were coalesced";
  const std::lock_guard<std::mutex> lock(eventsMutex);
  int threw = 0;
  for (const Event& e : events) {
    if (e.kind != Event::Kind::CallbackThrew) continue;
    ++threw;
    EXPECT_EQ(e.limiter, limiter.getName());
    EXPECT_NE(e.description.find("callback 5 throws"), std::string::npos) << e.description;
  }
  EXPECT_EQ(threw, 1) << "reported once";
}

// The other async forms of a RateLimiter: the throw is reported and nothing runs twice (the
// policy's path used to call a throwing callback again with its own exception).
TEST_F(LimiterCallbacks, ThrowingDecideAndTryAcquireCallbacksRunOnce) {
  auto registry = std::make_shared<MetricsRegistry>();
  RateLimiter::Options options;
  options.monitor.registry = registry;
  RateLimiter limiter(client(), name(), options);
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 10, seconds(60)));
  std::atomic<int> decideRuns{0}, tryRuns{0};
  limiter.decideAsync(1, [&](Decision, const std::exception_ptr&) {
    decideRuns.fetch_add(1);
    throw std::runtime_error("decide callback throws");
  });
  limiter.tryAcquireAsync(1, [&](bool, const std::exception_ptr&) {
    tryRuns.fetch_add(1);
    throw 42;  // not a std::exception
  });
  ASSERT_TRUE(waitFor([&] { return limiter.monitor().metrics()->snapshot().callbacksThrew == 2; }, seconds(20)));
  // Both callbacks ran before they threw: the counts are final.
  EXPECT_EQ(decideRuns.load(), 1);
  EXPECT_EQ(tryRuns.load(), 1);
  // The handle still decides.
  EXPECT_TRUE(limiter.tryAcquireAsync(1).get());
}

// A Limiter under a token bucket and MultiLimit: a throwing callback is caught, counted and
// reported (it used to escape into the transport, which dropped it unreported), and runs once.
TEST_F(LimiterCallbacks, LimiterAndMultiLimitCallbacksThatThrowAreCountedOnce) {
  Limiter::Options bucketOptions;
  bucketOptions.monitor.registry = std::make_shared<MetricsRegistry>();
  std::atomic<int> bucketEvents{0};
  bucketOptions.monitor.onEvent = [&](const Event& e) {
    if (e.kind == Event::Kind::CallbackThrew) bucketEvents.fetch_add(1);
  };
  Limiter bucket(client(), limiterName("bucket"), Policy::tokenBucket(10, 10, milliseconds(60000)), bucketOptions);
  MultiLimit::Options multiOptions;
  multiOptions.monitor.registry = std::make_shared<MetricsRegistry>();
  MultiLimit multi = MultiLimit({bucket}, multiOptions).on({"k"});

  std::atomic<int> bucketRuns{0}, multiRuns{0};
  bucket.decideAsync("k", 1, [&](const Decision&, const std::exception_ptr&) {
    bucketRuns.fetch_add(1);
    throw std::runtime_error("bucket callback throws");
  });
  multi.tryAcquireAsync(1, [&](bool, const std::exception_ptr&) {
    multiRuns.fetch_add(1);
    throw std::runtime_error("multi callback throws");
  });
  // The metric is counted before the event is published (on the I/O thread): wait for both.
  ASSERT_TRUE(waitFor(
      [&] {
        return bucket.monitor().metrics()->snapshot().callbacksThrew == 1 &&
               multi.monitor().metrics()->snapshot().callbacksThrew == 1 && bucketEvents.load() >= 1;
      },
      seconds(20)));
  EXPECT_EQ(bucketEvents.load(), 1);
  EXPECT_EQ(bucketRuns.load(), 1);
  EXPECT_EQ(multiRuns.load(), 1);
  EXPECT_TRUE(bucket.decideAsync("k", 1).get().allowed);
  EXPECT_TRUE(multi.tryAcquireAsync(1).get());
}

// ----- fork() with requests in flight -----------------------------------------------------------

class RateLimiterFork : public RedisTest {};

struct LimiterChildReport {
  std::int64_t granted = 0;
  std::int64_t timeouts = 0;
  std::int64_t otherErrors = 0;
  std::int64_t asyncGranted = -1;  // 1 granted, 0 denied, -1 not answered, -2 threw
};

TEST_F(RateLimiterFork, AcquiresInFlightAtForkLeaveTheChildsHandleWorking) {
#if REDLIMIT_TEST_TSAN
  // The child's Client starts an I/O thread: ThreadSanitizer must not kill it (the tsan preset
  // sets die_after_fork=0; this test is never skipped).
  const char* tsanOptions = std::getenv("TSAN_OPTIONS");
  ASSERT_TRUE(tsanOptions != nullptr && std::strstr(tsanOptions, "die_after_fork=0") != nullptr)
      << "under ThreadSanitizer, run with TSAN_OPTIONS=die_after_fork=0 (the tsan preset does)";
#endif
  constexpr int kInFlight = 1000;
  constexpr int kChildCalls = 5;
  constexpr std::int64_t kRate = 100000;
  ClientOptions co;
  co.pool.size = 1;
  co.connection.commandTimeout = milliseconds(3000);
  RateLimiter limiter(newClient(co), name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kRate, seconds(60)));
  ASSERT_TRUE(limiter.tryAcquire());  // the connection is open

  // Redis holds the first acquisition: the other 999 wait on the handle's coalescing queue, and
  // the group is in flight when the process forks.
  (void)raw({"CLIENT", "PAUSE", "300", "ALL"});
  std::atomic<int> parentDone{0}, parentGranted{0};
  for (int i = 0; i < kInFlight; ++i) {
    limiter.tryAcquireAsync(1, [&](bool granted, const std::exception_ptr& e) {
      if (!e && granted) parentGranted.fetch_add(1);
      parentDone.fetch_add(1);
    });
  }
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0) << std::strerror(errno);
  // The parent's other threads asleep first: see waitUntilOtherThreadsSleep (ThreadSanitizer).
  (void)waitUntilOtherThreadsSleep();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: redlimit calls only, no gtest; the report goes through the pipe. It stops at the
    // first failure (on the old code each ended with TimeoutError after the call's bound).
    ::close(fds[0]);
    LimiterChildReport r;
    for (int i = 0; i < kChildCalls && r.timeouts + r.otherErrors == 0; ++i) {
      try {
        r.granted += limiter.tryAcquire() ? 1 : 0;
      } catch (const TimeoutError&) {
        ++r.timeouts;
      } catch (...) {
        ++r.otherErrors;
      }
    }
    if (r.timeouts + r.otherErrors == 0) {
      try {
        std::future<bool> f = limiter.tryAcquireAsync(1);
        if (f.wait_for(seconds(10)) == std::future_status::ready) r.asyncGranted = f.get() ? 1 : 0;
      } catch (...) {
        r.asyncGranted = -2;
      }
    }
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
  ASSERT_EQ(bytes.size(), sizeof(LimiterChildReport));
  LimiterChildReport child;
  std::memcpy(&child, bytes.data(), sizeof child);
  EXPECT_EQ(child.timeouts, 0) << "the child's calls on the handle decide (they waited for the parent's group)";
  EXPECT_EQ(child.otherErrors, 0);
  EXPECT_EQ(child.granted, kChildCalls);
  EXPECT_EQ(child.asyncGranted, 1);

  // The parent's acquisitions all complete, granted (the rate is far above what was asked).
  ASSERT_TRUE(waitFor([&] { return parentDone.load() == kInFlight; }, seconds(20)));
  EXPECT_EQ(parentGranted.load(), kInFlight);
}

// ----- A hostile peer's nested array headers ----------------------------------------------------

class RateLimiterHostilePeer : public RedisTest {};

// Bytes the process has allocated with malloc now (in use from the heap plus mmap'd blocks), as
// glibc counts them (mallinfo2). Sanitizers replace malloc, so under them this reads glibc's idle
// heap: the memory check below then holds trivially and the rest of the test still counts.
std::uint64_t mallocInUseBytes() {
  const struct mallinfo2 mi = ::mallinfo2();
  return static_cast<std::uint64_t>(mi.uordblks) + static_cast<std::uint64_t>(mi.hblkhd);
}

// 70 bytes of "*1048576\r\n" nested 7 deep, then silence: the old parser reserved every level's
// announced count (about 530 MB of address space here, held until the request's deadline; under
// `ulimit -v` the caller got std::bad_alloc, which no failure policy sees). Now the request ends at
// its deadline with a TimeoutError, the limiter's policy decides, and the memory in use while the
// reply is pending stays within a few MB of what it was (sampled by a second thread).
TEST_F(RateLimiterHostilePeer, NestedArrayHeadersCostNoMemory) {
  FakePeer::Options po;
  po.behaviour = FakePeer::Behaviour::Trickle;  // the reply below, a byte a millisecond, then nothing
  po.trickleEvery = milliseconds(1);
  po.trickleReply.clear();
  for (int i = 0; i < 7; ++i) po.trickleReply += "*1048576\r\n";
  ASSERT_EQ(po.trickleReply.size(), 70u);
  FakePeer peer(po);
  ClientOptions co;
  co.connection.host = "127.0.0.1";
  co.connection.port = peer.port();
  co.connection.commandTimeout = milliseconds(500);
  co.pool.size = 1;
  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Deny;
  lo.monitor.registry = std::make_shared<MetricsRegistry>();
  auto client = Client::create(co);
  RateLimiter limiter(client, "nested-array-headers", lo);
  // A request the peer answers (CLIENT is part of its greeting) first: the Client's threads and their malloc arenas (64 MB of
  // address space each) exist before the baseline is taken.
  EXPECT_EQ(redlimit::detail::command(*client, {"CLIENT", "SETNAME", "nested-array-headers"}).str, "OK");
  const std::uint64_t before = mallocInUseBytes();
  std::atomic<bool> decided{false};
  std::uint64_t most = before;
  std::thread sampler([&] {
    while (!decided.load()) {
      most = std::max(most, mallocInUseBytes());
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  const Decision d = limiter.decide(1);
  decided = true;
  sampler.join();
  EXPECT_TRUE(d.byPolicy) << "the policy decided the call the peer never answered";
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(limiter.failureStats().denied, 1u);
  const LimiterMetrics::Snapshot m = limiter.monitor().metrics()->snapshot();
  EXPECT_EQ(m.errorCount(ErrorKind::Timeout), 1u) << "a typed error (TimeoutError) at the deadline";
  EXPECT_EQ(m.errorCount(ErrorKind::Other), 0u) << "no std::bad_alloc or other untyped error";
  const std::uint64_t grown = most - before;
  EXPECT_LT(grown, std::uint64_t{32} << 20) << "memory in use grew by " << grown << " bytes for 70 bytes received";
}

}  // namespace
}  // namespace redlimit::test
