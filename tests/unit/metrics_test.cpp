// Unit tests of the metrics core (counters, histogram, registry and its cap, the monitor's shadow
// mode) and of the segment cache's use of it, on a manual clock and an in-process permit source.
#include "redlimit/metrics.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/clock.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/local_token_bucket.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit/smooth_rate_limiter.hpp"

namespace {

using namespace redlimit;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

constexpr int kMetricThreads = 8;

// Runs `body(thread index)` on kMetricThreads threads that start together.
template <class Body>
void onThreads(Body body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  threads.reserve(kMetricThreads);
  for (int t = 0; t < kMetricThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kMetricThreads) std::this_thread::yield();
      body(t);
    });
  }
  for (auto& th : threads) th.join();
}

TEST(LimiterMetrics, ConcurrentIncrementsFromEightThreadsSumExactly) {
  LimiterMetrics m("api");
  constexpr int kEach = 20000;
  onThreads([&](int t) {
    for (int i = 0; i < kEach; ++i) {
      m.decided(i % 4 != 0, 2);        // 3 of 4 granted, 2 permits each
      m.localHit(i % 2 == 0 ? 1 : 3);  // alternately 1 and 3 permits
      m.roundTrip();
      m.decisionLatency(microseconds(t * 100 + 10));  // thread t: its own bucket
      m.policyDecision(FailurePolicy::Local,
                       i % 2 == 0 ? LimiterMetrics::PolicyOutcome::Granted : LimiterMetrics::PolicyOutcome::Denied);
      m.error(ErrorKind::Timeout);
      if (i % 10 == 0) m.shadowDenied();
      if (i % 5 == 0) m.refunded(2);
    }
  });
  const LimiterMetrics::Snapshot s = m.snapshot();
  const std::uint64_t n = std::uint64_t{kMetricThreads} * kEach;
  EXPECT_EQ(s.limiter, "api");
  EXPECT_EQ(s.localHits, n);
  EXPECT_EQ(s.granted, n * 3 / 4 + n);  // decisions granted plus the local hits
  EXPECT_EQ(s.denied, n / 4);
  EXPECT_EQ(s.permitsGranted, n * 3 / 4 * 2 + n * 2);  // 2 each, and 1 + 3 per pair of hits
  EXPECT_EQ(s.shadowDenied, n / 10);
  EXPECT_EQ(s.permitsRefunded, n / 5 * 2);
  EXPECT_EQ(s.permitsGranted, n * 3 / 4 * 2 + n * 2) << "a refund leaves the grants counted";
  EXPECT_EQ(s.roundTrips, n);
  EXPECT_EQ(s.policyDecisions(FailurePolicy::Local, LimiterMetrics::PolicyOutcome::Granted), n / 2);
  EXPECT_EQ(s.policyDecisions(FailurePolicy::Local, LimiterMetrics::PolicyOutcome::Denied), n / 2);
  EXPECT_EQ(s.policyDecisions(FailurePolicy::Deny, LimiterMetrics::PolicyOutcome::Denied), 0u);
  EXPECT_EQ(s.errorCount(ErrorKind::Timeout), n);
  EXPECT_EQ(s.errorCount(ErrorKind::Closed), 0u);
  EXPECT_EQ(s.latency.count, n);
  // Threads 0 (10 µs) -> first bucket (<= 50 µs); 1 (110 µs) -> <= 250 µs; 2 (210) -> <= 250;
  // 3 (310), 4 (410) -> <= 500 µs; 5..7 (510..710 µs) -> <= 1 ms.
  EXPECT_EQ(s.latency.counts[0], std::uint64_t{kEach});
  EXPECT_EQ(s.latency.counts[1], 0u);
  EXPECT_EQ(s.latency.counts[2], std::uint64_t{2} * kEach);
  EXPECT_EQ(s.latency.counts[3], std::uint64_t{2} * kEach);
  EXPECT_EQ(s.latency.counts[4], std::uint64_t{3} * kEach);
  double expectedSum = 0;
  for (int t = 0; t < kMetricThreads; ++t) expectedSum += (t * 100 + 10) * 1e-6 * kEach;
  EXPECT_NEAR(s.latency.sumSeconds, expectedSum, 1e-9);
}

TEST(LimiterMetrics, DegradedCountsHandlesUpAndDown) {
  LimiterMetrics m("x");
  onThreads([&](int) {
    for (int i = 0; i < 1000; ++i) {
      m.degradedBy(1);
      m.degradedBy(-1);
    }
    m.degradedBy(1);
  });
  EXPECT_EQ(m.snapshot().degraded, std::uint64_t{kMetricThreads});
  for (int t = 0; t < kMetricThreads; ++t) m.degradedBy(-1);
  EXPECT_EQ(m.snapshot().degraded, 0u);
}

TEST(LatencyHistogram, BucketBoundsAreInclusiveUpperBounds) {
  LatencyHistogram h;
  h.observe(nanoseconds(-5));         // as 0: first bucket
  h.observe(microseconds(50));        // exactly the first bound: first bucket
  h.observe(nanoseconds(50001));      // just above: second (<= 100 µs)
  h.observe(milliseconds(5000));      // exactly the last bound (5 s)
  h.observe(milliseconds(5001));      // above every bound: +Inf
  h.observe(std::chrono::hours(24));  // +Inf too
  const LatencyHistogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.counts[0], 2u);
  EXPECT_EQ(s.counts[1], 1u);
  EXPECT_EQ(s.counts[kLatencyBuckets.size() - 1], 1u);
  EXPECT_EQ(s.counts[LatencyHistogram::kBuckets - 1], 2u);
  EXPECT_NEAR(s.sumSeconds, 50e-6 + 50001e-9 + 5.0 + 5.001 + 86400.0, 1e-6);
}

TEST(MetricsRegistry, NamesPastTheCapCollapseIntoOther) {
  MetricsRegistry r(3);
  auto a = r.limiter("a");
  EXPECT_EQ(r.limiter("a"), a) << "one entry per name";
  auto b = r.limiter("b");
  auto c = r.limiter("c");
  auto d = r.limiter("d");
  auto e = r.limiter("e");
  EXPECT_NE(a, b);
  EXPECT_NE(c, d);
  EXPECT_EQ(d, e) << "past the cap every name shares one entry";
  EXPECT_EQ(d->limiter(), MetricsRegistry::kOtherLabel);
  EXPECT_EQ(r.limiter("other"), d) << "a limiter named other shares it too";
  EXPECT_EQ(r.limiter("a"), a) << "names seen before keep their own";
  EXPECT_EQ(r.collapsedLookups(), 2u);
  d->decided(true, 1);
  e->decided(false, 1);
  const auto all = r.snapshot();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].limiter, "a");
  EXPECT_EQ(all[2].limiter, "c");
  EXPECT_EQ(all[3].limiter, "other");
  EXPECT_EQ(all[3].granted, 1u);
  EXPECT_EQ(all[3].denied, 1u);
  EXPECT_EQ(r.snapshot("e").denied, 1u) << "a collapsed name reads the shared entry";
  EXPECT_EQ(r.snapshot("a").granted, 0u);
  EXPECT_THROW((void)std::make_shared<MetricsRegistry>(0), InvalidArgument);
}

TEST(MetricsRegistry, ConcurrentLookupsOfManyNamesStayWithinTheCap) {
  MetricsRegistry r(50);
  onThreads([&](int t) {
    for (int i = 0; i < 200; ++i) r.limiter("tenant-" + std::to_string((t * 200 + i) % 120))->decided(true, 1);
  });
  const auto all = r.snapshot();
  ASSERT_EQ(all.size(), 51u);  // 50 names and other
  std::uint64_t total = 0;
  for (const auto& s : all) total += s.granted;
  EXPECT_EQ(total, std::uint64_t{kMetricThreads} * 200);
  EXPECT_EQ(all.back().limiter, "other");
}

TEST(ErrorKind, EachErrorKindHasItsLabel) {
  auto label = [](auto e) { return std::string(errorKindName(errorKindOf(std::make_exception_ptr(e)))); };
  EXPECT_EQ(errorKindOf(std::make_exception_ptr(TimeoutError(ErrorKind::PoolTimeout, "x"))), ErrorKind::PoolTimeout);
  EXPECT_EQ(label(TimeoutError(ErrorKind::PoolTimeout, "x")), "pool_timeout");
  EXPECT_EQ(label(TimeoutError(ErrorKind::CallbackBlocked, "x")), "pool_timeout");
  EXPECT_EQ(label(TimeoutError("x")), "timeout");
  EXPECT_EQ(label(ClosedError("x")), "closed");
  EXPECT_EQ(label(IoError(ErrorKind::Unavailable, "LOADING", "x")), "unavailable");
  EXPECT_EQ(label(IoError(ErrorKind::Protocol, "", "x")), "io");
  EXPECT_EQ(label(IoError("x")), "io");
  for (ErrorKind k : {ErrorKind::Configuration, ErrorKind::Replica, ErrorKind::TlsPort, ErrorKind::Tls,
                      ErrorKind::ResourceLimit, ErrorKind::RequestLimit}) {
    EXPECT_EQ(label(ConfigurationError(k, "", "x")), "configuration");
  }
  EXPECT_EQ(label(AuthError("WRONGPASS", "x")), "auth");
  EXPECT_EQ(label(AuthError(ErrorKind::NoPermission, "NOPERM", "x")), "auth");
  EXPECT_EQ(label(ReplyError("OOM", "x")), "reply");
  EXPECT_EQ(label(ReplyError(ErrorKind::UnexpectedReply, "", "x")), "reply");
  for (ErrorKind k : {ErrorKind::Script, ErrorKind::InvalidConfig, ErrorKind::InvalidState}) {
    EXPECT_EQ(label(ScriptError(k, "ERR", "x")), "reply");
  }
  EXPECT_EQ(label(NotInitializedError("ERR", "x")), "reply");
  EXPECT_EQ(label(InvalidArgument("x")), "invalid_argument");
  EXPECT_EQ(label(Error("x")), "other");
  EXPECT_EQ(label(std::runtime_error("x")), "other");
  EXPECT_EQ(errorKindOf(nullptr), ErrorKind::Other);
  EXPECT_STREQ(errorKindName(ErrorKind::PoolTimeout), "pool_timeout");
  EXPECT_STREQ(failurePolicyName(FailurePolicy::Local), "local");
  EXPECT_STREQ(policyOutcomeName(LimiterMetrics::PolicyOutcome::Thrown), "thrown");
}

TEST(LimiterMonitor, ShadowModeAllowsCountsAndReportsEachDenial) {
  auto registry = std::make_shared<MetricsRegistry>();
  std::vector<LimiterMonitor::ShadowDenial> seen;
  LimiterMonitor::Options o;
  o.registry = registry;
  o.shadow = true;
  o.onShadowDenial = [&](const LimiterMonitor::ShadowDenial& d) { seen.push_back(d); };
  const LimiterMonitor m("s", o);
  EXPECT_TRUE(m.admit(true, 2));
  EXPECT_TRUE(m.admit(false, 3, microseconds(1500)));
  Decision d;
  d.permits = 1;
  d.retryAfter = microseconds(7);
  m.admit(d);
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.shadowDenied);
  EXPECT_EQ(d.retryAfter, microseconds(7)) << "what it would have been";
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].limiter, "s");
  EXPECT_EQ(seen[0].permits, 3);
  EXPECT_EQ(seen[0].retryAfter, microseconds(1500));
  const auto s = registry->snapshot("s");
  EXPECT_EQ(s.granted, 1u);
  EXPECT_EQ(s.permitsGranted, 2u);
  EXPECT_EQ(s.denied, 2u);
  EXPECT_EQ(s.shadowDenied, 2u);

  // Without shadow mode a denial stays one; with metrics off nothing is registered.
  LimiterMonitor::Options plain;
  plain.registry = registry;
  plain.metrics = false;
  const LimiterMonitor off("off", plain);
  EXPECT_FALSE(off.admit(false, 1));
  EXPECT_EQ(off.metrics(), nullptr);
  EXPECT_EQ(registry->snapshot().size(), 1u);
  EXPECT_FALSE(LimiterMonitor{}.admit(false, 1));
}

// A permit source of `rate` permits per fixed window of one second on a manual clock, with a
// monitor (as RateLimiter has): the segment cache takes its metrics and shadow mode from it.
class WindowSource {
 public:
  WindowSource(ManualClock& clock, std::int64_t rate, LimiterMonitor monitor)
      : clock_(clock), rate_(rate), monitor_(std::move(monitor)) {}
  detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
    ++calls_;
    const std::int64_t window = clock_.now().count() / 1000000;
    if (window != window_) {
      window_ = window;
      used_ = 0;
    }
    detail::AcquireResult r;
    const std::int64_t left = rate_ - used_;
    if (left < atLeast) {
      r.wait = milliseconds((window + 1) * 1000 - clock_.now().count() / 1000);
      return r;
    }
    r.granted = std::min(atMost, left);
    used_ += r.granted;
    r.member = "m";
    r.interval = milliseconds((window + 1) * 1000 - clock_.now().count() / 1000);
    return r;
  }
  std::int64_t releaseGrant(const std::string&, std::int64_t permits) {
    used_ -= permits;
    return permits;
  }
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept { return monitor_; }
  int calls() const { return calls_; }

 private:
  ManualClock& clock_;
  std::int64_t rate_;
  std::int64_t window_ = -1, used_ = 0;
  int calls_ = 0;
  LimiterMonitor monitor_;
};
static_assert(detail::HasMonitor<WindowSource>::value, "the segment cache must find the source's monitor");

using WindowLimiter = SegmentedRateLimiter<WindowSource, ClockRef<ManualClock>>;

SegmentOptions segmentOf(std::int64_t size) {
  SegmentOptions o;
  o.segmentSize = size;
  o.returnWhenIdle = false;
  return o;
}

TEST(SegmentMetrics, HitsAndRefillsAreCountedWithTheSourcesMonitor) {
  ManualClock clock{std::chrono::seconds(100)};
  auto registry = std::make_shared<MetricsRegistry>();
  LimiterMonitor::Options o;
  o.registry = registry;
  auto source = std::make_shared<WindowSource>(clock, 10, LimiterMonitor("seg", o));
  WindowLimiter rl(source, segmentOf(5), ClockRef<ManualClock>(clock));
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(rl.tryAcquire()) << i;
  EXPECT_FALSE(rl.tryAcquire());
  EXPECT_TRUE(rl.tryAcquire(2, milliseconds(0)) == false);
  const auto s = registry->snapshot("seg");
  EXPECT_EQ(s.localHits, 8u);  // two refills of 5: the caller's permit plus 4 hits each
  EXPECT_EQ(s.granted, 10u);
  EXPECT_EQ(s.permitsGranted, 10u);
  EXPECT_EQ(s.denied, 2u);
  EXPECT_EQ(s.shadowDenied, 0u);
}

TEST(SegmentMetrics, ShadowModeOfferedAHundredCallsAtTenPerSecondAllowsAllAndReportsNinety) {
  ManualClock clock{std::chrono::seconds(100)};
  auto registry = std::make_shared<MetricsRegistry>();
  int hook = 0;
  std::vector<microseconds> waits;
  LimiterMonitor::Options o;
  o.registry = registry;
  o.shadow = true;
  o.onShadowDenial = [&](const LimiterMonitor::ShadowDenial& d) {
    ++hook;
    waits.push_back(d.retryAfter);
  };
  auto source = std::make_shared<WindowSource>(clock, 10, LimiterMonitor("shadow", o));
  WindowLimiter rl(source, segmentOf(5), ClockRef<ManualClock>(clock));
  int allowed = 0;
  for (int i = 0; i < 100; ++i) {
    // Spread over the second (10 ms apart), as a client offering 100 calls in it.
    if (rl.tryAcquire()) ++allowed;
    clock.advance(milliseconds(9));
  }
  EXPECT_EQ(allowed, 100);
  EXPECT_EQ(hook, 90);
  // Each would-be denial reports the source's wait: the window (100..101 s) ends 910 ms after the
  // first denial (at 100.090 s), 9 ms sooner at each call after it.
  ASSERT_EQ(waits.size(), 90u);
  EXPECT_EQ(waits.front(), milliseconds(910));
  EXPECT_EQ(waits.back(), milliseconds(910 - 89 * 9));
  const auto s = registry->snapshot("shadow");
  EXPECT_EQ(s.granted, 10u);
  EXPECT_EQ(s.denied, 90u);
  EXPECT_EQ(s.shadowDenied, 90u);
  // acquire() in shadow mode does not wait either.
  rl.acquire();
  EXPECT_EQ(registry->snapshot("shadow").shadowDenied, 91u);
}

// The in-process limiters (redlimit::local): the same monitor, set before use.
LimiterMonitor::Options shadowInto(const std::shared_ptr<MetricsRegistry>& registry, int& hook) {
  LimiterMonitor::Options o;
  o.registry = registry;
  o.shadow = true;
  o.onShadowDenial = [&hook](const LimiterMonitor::ShadowDenial&) { ++hook; };
  return o;
}

TEST(LocalShadowMode, ATokenBucketOfTenPerSecondOfferedAHundredCallsAllowsAllAndReportsNinety) {
  ManualClock clock{std::chrono::seconds(100)};
  auto registry = std::make_shared<MetricsRegistry>();
  int hook = 0;
  BasicLocalTokenBucket<ClockRef<ManualClock>> bucket(10, 10, std::chrono::seconds(1), ClockRef<ManualClock>(clock));
  bucket.setMonitor(LimiterMonitor("bucket", shadowInto(registry, hook)));
  bucket.setAvailablePermits(1);  // a bucket that starts at its steady rate: 10 grants in the second
  int allowed = 0;
  for (int i = 0; i < 100; ++i) {
    allowed += bucket.tryAcquire() ? 1 : 0;
    clock.advance(milliseconds(10));
  }
  EXPECT_EQ(allowed, 100);
  EXPECT_EQ(hook, 90);
  const auto s = registry->snapshot("bucket");
  EXPECT_EQ(s.granted, 10u);
  EXPECT_EQ(s.denied, 90u);
  EXPECT_EQ(s.shadowDenied, 90u);
  // A waiting call makes one attempt: no sleep on the clock, a denial let through (5 > the 1 held).
  const auto before = clock.now();
  EXPECT_TRUE(bucket.tryAcquire(5, std::chrono::seconds(10)));
  EXPECT_EQ(clock.now(), before);
  EXPECT_EQ(registry->snapshot("bucket").shadowDenied, 91u);
}

TEST(LocalShadowMode, AGuavaLimiterOfTenPerSecondOfferedAHundredCallsAllowsAllAndReportsNinety) {
  ManualClock clock{std::chrono::seconds(100)};
  auto registry = std::make_shared<MetricsRegistry>();
  int hook = 0;
  auto limiter = BasicSmoothRateLimiter<ClockRef<ManualClock>>::bursty(10.0, 1.0, ClockRef<ManualClock>(clock));
  limiter.setMonitor(LimiterMonitor("guava", shadowInto(registry, hook)));
  int allowed = 0;
  for (int i = 0; i < 100; ++i) {
    allowed += limiter.tryAcquire() ? 1 : 0;
    clock.advance(milliseconds(10));
  }
  EXPECT_EQ(allowed, 100);
  EXPECT_EQ(hook, 90);
  const auto s = registry->snapshot("guava");
  EXPECT_EQ(s.granted, 10u);
  EXPECT_EQ(s.denied, 90u);
  EXPECT_EQ(s.shadowDenied, 90u);
  // acquire() in shadow mode does not wait (the clock would have been slept on).
  const auto before = clock.now();
  (void)limiter.acquire();
  (void)limiter.acquire();
  EXPECT_EQ(clock.now(), before);
  EXPECT_EQ(registry->snapshot("guava").shadowDenied, 91u) << "the first was free, the second would have waited";
}

TEST(LocalShadowMode, WithoutShadowModeTheLocalLimitersCountAndStillRefuse) {
  ManualClock clock{std::chrono::seconds(100)};
  auto registry = std::make_shared<MetricsRegistry>();
  LimiterMonitor::Options o;
  o.registry = registry;
  BasicLocalTokenBucket<ClockRef<ManualClock>> bucket(2, 1, std::chrono::seconds(1), ClockRef<ManualClock>(clock));
  bucket.setMonitor(LimiterMonitor("plain", o));
  EXPECT_TRUE(bucket.tryAcquire());
  EXPECT_TRUE(bucket.tryAcquire());
  EXPECT_FALSE(bucket.tryAcquire());
  EXPECT_FALSE(bucket.tryAcquire(3));  // over capacity: never
  const auto s = registry->snapshot("plain");
  EXPECT_EQ(s.granted, 2u);
  EXPECT_EQ(s.denied, 2u);
  EXPECT_EQ(s.shadowDenied, 0u);
}

}  // namespace
