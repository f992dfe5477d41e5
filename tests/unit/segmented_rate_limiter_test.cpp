// Unit tests of SegmentedRateLimiter's local state machine: a manual clock and an in-process
// permit source (a sliding-window log with RateLimiter's acquire/release contract — a stand-in
// for the distributed limiter, not a Redis mock; tests/integration runs the real thing).
#include "redlimit/segmented_rate_limiter.hpp"
// Only for the static_asserts at the end (RateLimiter is a permit source): the tests run over an
// in-process stand-in and need nothing of the Client.
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/sanitizers.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#if REDLIMIT_TEST_SANITIZER_OWNS_NEW
#include <sanitizer/allocator_interface.h>
#endif

// Counts allocations per thread so a test can show that the local hit path allocates nothing.
// (A replacement of the global operator new applies to the whole test binary; it only counts.
// Where the sanitizer's runtime owns operator new, its allocator's malloc hook counts instead.)
namespace {
thread_local std::int64_t tAllocations = 0;
}  // namespace
#if REDLIMIT_TEST_SANITIZER_OWNS_NEW
namespace {
void countAllocation(const volatile void*, std::size_t) { ++tAllocations; }
void ignoreFree(const volatile void*) {}  // the runtime installs a pair or nothing
const int gAllocationHookInstalled = __sanitizer_install_malloc_and_free_hooks(countAllocation, ignoreFree);
}  // namespace
#else
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // g++ 12 flags free() in a replacement delete
#endif
void* operator new(std::size_t n) {
  ++tAllocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (std::stable_sort's buffer uses it), so every delete frees what malloc gave.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++tAllocations;
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace {

using namespace redlimit;
using std::chrono::microseconds;
using std::chrono::milliseconds;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the hot path needs a lock-free 64-bit atomic");

/// The clock a FakeSource stamps grants with and moves by its latency: the ManualClock of most
/// tests, or the SimulatedClock of those where threads wait on the clock.
class SourceClock {
 public:
  SourceClock(ManualClock& clock) : manual_(&clock) {}        // NOLINT(google-explicit-constructor)
  SourceClock(SimulatedClock& clock) : simulated_(&clock) {}  // NOLINT(google-explicit-constructor)
  microseconds now() const { return manual_ != nullptr ? manual_->now() : simulated_->now(); }
  void advance(microseconds d) const {
    if (manual_ != nullptr) {
      manual_->advance(d);
    } else {
      simulated_->advance(d);
    }
  }

 private:
  ManualClock* manual_ = nullptr;
  SimulatedClock* simulated_ = nullptr;
};

/// An in-process permit source on a test clock: grants are members (time, permits) that live
/// one interval; value = rate - live permits. Thread-safe. Test controls: latency (the clock moves
/// during a call, half before the grant is stamped and half after), a gate that holds acquire
/// calls until opened, and a one-shot failure.
class FakeSource {
 public:
  struct AcquireCall {
    std::int64_t atLeast, atMost, granted;
  };
  struct ReleaseCall {
    std::string member;
    std::int64_t permits, released;
  };

  FakeSource(SourceClock clock, std::int64_t rate, milliseconds interval)
      : clock_(clock), rate_(rate), interval_(interval) {}

  detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
    std::unique_lock<std::mutex> lk(m_);
    ++atGate_;
    gateCv_.notify_all();
    gateCv_.wait(lk, [&] { return !gateClosed_; });
    --atGate_;
    if (failNext_) {
      failNext_ = false;
      throw IoError("fake: connection reset");
    }
    if (!initialized_) throw NotInitializedError("ERR", "fake: not initialized");
    clock_.advance(latency_ / 2);
    const std::int64_t now = clock_.now().count();
    dropExpiredLocked(now);
    detail::AcquireResult r;
    r.rate = rate_;
    r.interval = interval_;
    r.grantTime = milliseconds{now / 1000};
    const std::int64_t value = availableLocked(now);
    if (value < atLeast) {
      // wait until enough of the oldest live members have expired
      std::int64_t freed = value, expiry = now;
      for (const Member& mem : members_) {
        if (!live(mem, now) || mem.permits == 0) continue;
        freed += mem.permits;
        expiry = mem.time + microseconds{interval_}.count();
        if (freed >= atLeast) break;
      }
      r.wait = milliseconds{std::max<std::int64_t>(1, (expiry - now + 999) / 1000)};
      r.remaining = value;
    } else {
      r.granted = std::min(atMost, value);
      r.member = "m" + std::to_string(nextId_++);
      members_.push_back({r.member, now, r.granted});
      r.remaining = value - r.granted;
    }
    acquires_.push_back({atLeast, atMost, r.granted});
    clock_.advance(latency_ - latency_ / 2);
    return r;
  }

  std::int64_t releaseGrant(const std::string& member, std::int64_t permits) {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lk(m_);
      hook = releaseHook_;
    }
    if (hook) hook();
    std::unique_lock<std::mutex> lk(m_);
    ++atReleaseGate_;
    gateCv_.notify_all();
    gateCv_.wait(lk, [&] { return !releaseGateClosed_; });
    --atReleaseGate_;
    if (failNextRelease_) {
      failNextRelease_ = false;
      throw TimeoutError("fake: no reply in time");
    }
    const std::int64_t now = clock_.now().count();
    dropExpiredLocked(now);
    std::int64_t released = 0;
    for (Member& mem : members_) {
      if (mem.id == member && live(mem, now)) {
        released = std::min(permits, mem.permits);
        mem.permits -= released;
      }
    }
    releases_.push_back({member, permits, released});
    return released;
  }

  RateLimiterConfig getConfig() {
    std::lock_guard<std::mutex> lk(m_);
    ++configReads_;
    if (!initialized_) throw NotInitializedError("ERR", "fake: not initialized");
    return RateLimiterConfig{RateType::Overall, rate_, interval_, keepAlive_};
  }
  bool trySetRate(RateType, std::int64_t rate, milliseconds interval) {
    std::lock_guard<std::mutex> lk(m_);
    if (initialized_) return false;
    initialized_ = true;
    rate_ = rate;
    interval_ = interval;
    ++configWrites_;
    return true;
  }
  void setRate(RateType, std::int64_t rate, milliseconds interval, milliseconds keepAlive, bool keepState) {
    std::lock_guard<std::mutex> lk(m_);
    initialized_ = true;
    rate_ = rate;
    interval_ = interval;
    keepAlive_ = keepAlive;
    lastKeepState_ = keepState;
    ++configWrites_;
  }

  // --- test controls and observations ---
  std::int64_t available() {
    std::lock_guard<std::mutex> lk(m_);
    return availableLocked(clock_.now().count());
  }
  std::vector<AcquireCall> acquires() {
    std::lock_guard<std::mutex> lk(m_);
    return acquires_;
  }
  std::vector<ReleaseCall> releases() {
    std::lock_guard<std::mutex> lk(m_);
    return releases_;
  }
  void setLatency(microseconds d) {
    std::lock_guard<std::mutex> lk(m_);
    latency_ = d;
  }
  void failNext() {
    std::lock_guard<std::mutex> lk(m_);
    failNext_ = true;
  }
  void failNextRelease() {
    std::lock_guard<std::mutex> lk(m_);
    failNextRelease_ = true;
  }
  void closeGate() {
    std::lock_guard<std::mutex> lk(m_);
    gateClosed_ = true;
  }
  void openGate() {
    std::lock_guard<std::mutex> lk(m_);
    gateClosed_ = false;
    gateCv_.notify_all();
  }
  /// Waits (real time, bounded) until `n` acquire calls are held at the gate.
  bool waitAtGate(int n) {
    std::unique_lock<std::mutex> lk(m_);
    return gateCv_.wait_for(lk, std::chrono::seconds(10), [&] { return atGate_ >= n; });
  }
  /// The same for releaseGrant calls: held while the release gate is closed.
  void closeReleaseGate() {
    std::lock_guard<std::mutex> lk(m_);
    releaseGateClosed_ = true;
  }
  void openReleaseGate() {
    std::lock_guard<std::mutex> lk(m_);
    releaseGateClosed_ = false;
    gateCv_.notify_all();
  }
  bool waitAtReleaseGate(int n, milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk(m_);
    return gateCv_.wait_for(lk, limit, [&] { return atReleaseGate_ >= n; });
  }
  /// Runs `hook` at the start of each releaseGrant call, on the calling thread.
  void setReleaseHook(std::function<void()> hook) {
    std::lock_guard<std::mutex> lk(m_);
    releaseHook_ = std::move(hook);
  }
  void uninitialize() {
    std::lock_guard<std::mutex> lk(m_);
    initialized_ = false;
  }
  int configReads() {
    std::lock_guard<std::mutex> lk(m_);
    return configReads_;
  }
  int configWrites() {
    std::lock_guard<std::mutex> lk(m_);
    return configWrites_;
  }
  bool lastKeepState() {
    std::lock_guard<std::mutex> lk(m_);
    return lastKeepState_;
  }
  milliseconds interval() {
    std::lock_guard<std::mutex> lk(m_);
    return interval_;
  }

 private:
  struct Member {
    std::string id;
    std::int64_t time;  // µs on the manual clock
    std::int64_t permits;
  };
  bool live(const Member& mem, std::int64_t now) const { return now < mem.time + microseconds{interval_}.count(); }
  // Grants are kept in the order they were made (the clock only moves forward), so the expired
  // ones are at the front. Dropped on every call, as Redisson's script removes them from the
  // sorted set: a grant that has expired never counts again. Keeps each call short however many
  // refills a test makes.
  void dropExpiredLocked(std::int64_t now) {
    while (!members_.empty() && !live(members_.front(), now)) members_.pop_front();
  }
  std::int64_t availableLocked(std::int64_t now) const {
    std::int64_t used = 0;
    for (const Member& mem : members_) {
      if (live(mem, now)) used += mem.permits;
    }
    return rate_ - used;
  }

  SourceClock clock_;
  std::mutex m_;
  std::condition_variable gateCv_;
  std::function<void()> releaseHook_;
  std::int64_t rate_;
  milliseconds interval_;
  milliseconds keepAlive_{0};
  bool initialized_ = true;
  bool failNext_ = false;
  bool failNextRelease_ = false;
  bool gateClosed_ = false;
  bool releaseGateClosed_ = false;
  bool lastKeepState_ = false;
  int atGate_ = 0;
  int atReleaseGate_ = 0;
  int configReads_ = 0, configWrites_ = 0;
  microseconds latency_{0};
  std::int64_t nextId_ = 1;
  std::deque<Member> members_;
  std::vector<AcquireCall> acquires_;
  std::vector<ReleaseCall> releases_;
};

using Limiter = SegmentedRateLimiter<FakeSource, ClockRef<ManualClock>>;

/// FakeSource with the two optional members a source may have (RateLimiter has both): a
/// best-effort give-back, skipped while `unreachable`, and the failure policy's answer for a call
/// that got no answer in time. Thread-safe.
class PolicySource : public FakeSource {
 public:
  struct Decision {
    std::int64_t permits;
    std::string reason;
  };
  using FakeSource::FakeSource;

  std::optional<std::int64_t> releaseGrantBestEffort(const std::string& member, std::int64_t permits) {
    if (unreachable_.load()) {
      ++skipped_;
      return std::nullopt;
    }
    return releaseGrant(member, permits);
  }
  bool decideUnanswered(std::int64_t permits, const std::string& reason) {
    std::lock_guard<std::mutex> lk(m_);
    decisions_.push_back({permits, reason});
    return answer_;
  }

  void setUnreachable(bool u) { unreachable_ = u; }
  int skipped() const { return skipped_.load(); }
  void setAnswer(bool a) {
    std::lock_guard<std::mutex> lk(m_);
    answer_ = a;
  }
  std::vector<Decision> decisions() {
    std::lock_guard<std::mutex> lk(m_);
    return decisions_;
  }

 private:
  std::atomic<bool> unreachable_{false};
  std::atomic<int> skipped_{0};
  std::mutex m_;
  bool answer_ = true;
  std::vector<Decision> decisions_;
};

using PolicyLimiter = SegmentedRateLimiter<PolicySource, ClockRef<ManualClock>>;
// Waits for another thread's refill are timed on the clock: on a SimulatedClock they block until
// the test advances it, so the tests of those waits sleep for nothing.
using SimLimiter = SegmentedRateLimiter<FakeSource, ClockRef<SimulatedClock>>;
using SimPolicyLimiter = SegmentedRateLimiter<PolicySource, ClockRef<SimulatedClock>>;

class SegmentedRateLimiterTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeSource> makeSource(std::int64_t rate, milliseconds interval) {
    return std::make_shared<FakeSource>(clock_, rate, interval);
  }
  std::unique_ptr<Limiter> make(std::shared_ptr<FakeSource> source, std::int64_t segment, SegmentOptions o = {}) {
    o.segmentSize = segment;
    o.returnWhenIdle = false;  // tests drive releaseIfIdle() on the manual clock
    return std::make_unique<Limiter>(std::move(source), o, ClockRef<ManualClock>(clock_));
  }
  /// The counters add up: everything granted remotely was handed out, is held, went back or expired.
  static void expectConserved(const SegmentStats& s) {
    EXPECT_EQ(s.permitsFromRemote,
              s.directGrants + s.localGrants + s.permitsHeld + s.permitsReturned + s.permitsExpired);
    EXPECT_GE(s.localGrants, 0);
  }

  std::unique_ptr<SimLimiter> makeSim(std::shared_ptr<FakeSource> source, std::int64_t segment, SegmentOptions o = {}) {
    o.segmentSize = segment;
    o.returnWhenIdle = false;
    return std::make_unique<SimLimiter>(std::move(source), o, ClockRef<SimulatedClock>(sim_));
  }

  ManualClock clock_{std::chrono::seconds(1000)};
  SimulatedClock sim_{std::chrono::seconds(1000)};
};

TEST_F(SegmentedRateLimiterTest, TakesOneSegmentPerRoundTrip) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(rl->tryAcquire()) << i;
  ASSERT_EQ(src->acquires().size(), 1u);
  EXPECT_EQ(src->acquires()[0].atLeast, 1);
  EXPECT_EQ(src->acquires()[0].atMost, 10);
  SegmentStats s = rl->stats();
  EXPECT_EQ(s.remoteRoundTrips, 1);
  EXPECT_EQ(s.directGrants, 1);
  EXPECT_EQ(s.localGrants, 9);
  EXPECT_EQ(s.permitsHeld, 0);
  EXPECT_EQ(src->available(), 90);

  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 2u);
  s = rl->stats();
  EXPECT_EQ(s.permitsHeld, 9);
  EXPECT_EQ(s.permitsFromRemote, 20);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, MultiPermitCallUsesTheLeftoverAndAsksOnlyForTheRest) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  EXPECT_TRUE(rl->tryAcquire(4));  // refill: 4 to the caller, 6 held
  EXPECT_TRUE(rl->tryAcquire(4));  // local: 2 held
  EXPECT_EQ(rl->stats().permitsHeld, 2);
  EXPECT_TRUE(rl->tryAcquire(4));  // 2 from the leftover + 2 from a new grant of 10
  const auto calls = src->acquires();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].atLeast, 2);
  EXPECT_EQ(calls[1].atMost, 10);
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsHeld, 8);
  EXPECT_EQ(s.directGrants, 6);
  EXPECT_EQ(s.localGrants, 6);
  EXPECT_EQ(src->available(), 80);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, SegmentExpiresOneIntervalAfterTheRequestWasSent) {
  auto src = makeSource(100, milliseconds(1000));
  src->setLatency(milliseconds(4));  // the grant is stamped 2 ms after the request left
  auto rl = make(src, 10);
  const auto sent = clock_.now();
  ASSERT_TRUE(rl->tryAcquire());
  clock_.advance(sent + milliseconds(1000) - microseconds(1) - clock_.now());
  EXPECT_TRUE(rl->tryAcquire()) << "one microsecond before the edge the segment is still good";
  EXPECT_EQ(src->acquires().size(), 1u);
  EXPECT_EQ(rl->stats().permitsHeld, 8);

  clock_.advance(microseconds(1));  // exactly sent + interval; the grant itself lives 2 ms longer
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 2u) << "the expired segment must not be spent";
  EXPECT_EQ(src->acquires()[1].atLeast, 1) << "expired leftover is not counted towards the call";
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsExpired, 8);
  EXPECT_TRUE(src->releases().empty()) << "nothing is given back at expiry";
  expectConserved(s);
}

// A clock that declares it may trail the true time (as CoarseSteadyClock does by one tick).
struct LaggingClock {
  const ManualClock* clock;
  std::chrono::microseconds now() const { return clock->now(); }
  void sleepFor(std::chrono::microseconds d) const { clock->sleepFor(d); }
  std::chrono::microseconds maxLag() const { return milliseconds(4); }
};

TEST_F(SegmentedRateLimiterTest, ALaggingClockEndsTheSegmentThatMuchEarlier) {
  auto src = makeSource(100, milliseconds(1000));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = false;
  SegmentedRateLimiter<FakeSource, LaggingClock> rl(src, o, LaggingClock{&clock_});
  const auto sent = clock_.now();
  ASSERT_TRUE(rl.tryAcquire());
  clock_.advance(sent + milliseconds(996) - microseconds(1) - clock_.now());
  EXPECT_TRUE(rl.tryAcquire()) << "before interval - lag the segment is good";
  EXPECT_EQ(src->acquires().size(), 1u);
  clock_.advance(microseconds(1));  // sent + interval - lag: the true time may be at the edge
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_EQ(src->acquires().size(), 2u) << "the segment must end maxLag() early";
  EXPECT_EQ(rl.stats().permitsExpired, 8);
}

// maxLag() is a measured bound (three ticks), so this checks it holds with room on this machine.
TEST(CoarseSteadyClock, DeclaresALagAndNeverRunsAheadOfSteadyClock) {
  CoarseSteadyClock coarse;
  SteadyClock steady;
  EXPECT_GT(clockMaxLag(coarse).count(), 0);
  EXPECT_EQ(clockMaxLag(steady).count(), 0);
  EXPECT_EQ(clockMaxLag(ManualClock{}).count(), 0);
  for (int i = 0; i < 100000; ++i) {
    // before <= true time at the coarse read <= after, whatever the scheduler does in between
    const auto before = steady.now();
    const auto c = coarse.now();
    const auto after = steady.now();
    EXPECT_LE(c, after) << "never ahead";
    EXPECT_LE(before - c, clockMaxLag(coarse)) << "trails by at most one tick";
  }
}

TEST_F(SegmentedRateLimiterTest, DeadlineUsesTheIntervalReportedWithEachGrant) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());
  src->setRate(RateType::Overall, 100, milliseconds(200), milliseconds(0), true);  // another node
  clock_.advance(milliseconds(300));
  EXPECT_TRUE(rl->tryAcquire()) << "the old segment keeps the interval it was granted under";
  EXPECT_EQ(src->acquires().size(), 1u);
  clock_.advance(milliseconds(700));
  ASSERT_TRUE(rl->tryAcquire());  // expired: new segment under the 200 ms interval
  ASSERT_EQ(src->acquires().size(), 2u);
  clock_.advance(milliseconds(199));
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 2u);
  clock_.advance(milliseconds(1));
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 3u);
}

TEST_F(SegmentedRateLimiterTest, TakesAPartialSegmentWhenFewerPermitsAreLeft) {
  auto src = makeSource(5, milliseconds(1000));
  auto a = make(src, 3);
  auto b = make(src, 3);
  EXPECT_TRUE(a->tryAcquire());  // segment of 3: A holds 2
  EXPECT_TRUE(b->tryAcquire());  // only 2 left in the source: a partial segment, B holds 1
  const auto calls = src->acquires();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].atLeast, 1);
  EXPECT_EQ(calls[1].atMost, 3);
  EXPECT_EQ(calls[1].granted, 2);
  EXPECT_TRUE(b->tryAcquire());
  EXPECT_FALSE(b->tryAcquire());
  EXPECT_TRUE(a->tryAcquire());
  EXPECT_TRUE(a->tryAcquire());
  EXPECT_FALSE(a->tryAcquire());
  EXPECT_EQ(src->available(), 0);
  expectConserved(a->stats());
  expectConserved(b->stats());
}

TEST_F(SegmentedRateLimiterTest, DeniedRefillKeepsTheLeftover) {
  auto src = makeSource(12, milliseconds(1000));
  auto rl = make(src, 10);
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(rl->tryAcquire());  // 1 held, 2 left in the source
  EXPECT_FALSE(rl->tryAcquire(5));                            // leftover 1 + need 4 > 2: denied
  EXPECT_EQ(src->acquires().back().atLeast, 4);
  EXPECT_EQ(src->acquires().back().granted, 0);
  EXPECT_EQ(rl->stats().permitsHeld, 1);
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 2u);
  expectConserved(rl->stats());
}

TEST_F(SegmentedRateLimiterTest, CloseGivesBackTheUnspentPart) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->available(), 90);
  EXPECT_EQ(rl->close(), 6);
  const auto rel = src->releases();
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_EQ(rel[0].member, "m1");
  EXPECT_EQ(rel[0].permits, 6);
  EXPECT_EQ(src->available(), 96);
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsReturned, 6);
  EXPECT_EQ(s.permitsHeld, 0);
  expectConserved(s);
  EXPECT_THROW((void)rl->tryAcquire(), Error);
  EXPECT_THROW((void)rl->tryAcquire(50), Error);
  EXPECT_EQ(rl->close(), 0);
  EXPECT_EQ(src->releases().size(), 1u);
}

TEST_F(SegmentedRateLimiterTest, DestructionGivesBackTheUnspentPart) {
  auto src = makeSource(100, milliseconds(1000));
  {
    auto rl = make(src, 10);
    ASSERT_TRUE(rl->tryAcquire());
    ASSERT_TRUE(rl->tryAcquire(2));
  }
  ASSERT_EQ(src->releases().size(), 1u);
  EXPECT_EQ(src->releases()[0].permits, 7);
  EXPECT_EQ(src->available(), 97);
}

TEST_F(SegmentedRateLimiterTest, IdleSegmentGoesBackAfterAQuarterIntervalWithoutLocalAcquires) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());
  ASSERT_TRUE(rl->tryAcquire());
  EXPECT_EQ(rl->releaseIfIdle(), 0);  // first look at this segment
  clock_.advance(milliseconds(200));
  ASSERT_TRUE(rl->tryAcquire());      // activity
  EXPECT_EQ(rl->releaseIfIdle(), 0);  // sees the change: idle time starts again
  clock_.advance(milliseconds(249));
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  EXPECT_TRUE(src->releases().empty());
  clock_.advance(milliseconds(1));
  EXPECT_EQ(rl->releaseIfIdle(), 7);
  ASSERT_EQ(src->releases().size(), 1u);
  EXPECT_EQ(src->releases()[0].permits, 7);
  EXPECT_EQ(src->available(), 97);
  EXPECT_EQ(rl->stats().permitsHeld, 0);
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  // the limiter keeps working after a give-back
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 2u);
  expectConserved(rl->stats());
}

TEST_F(SegmentedRateLimiterTest, IdleReturnAfterOptionOverridesTheDefault) {
  auto src = makeSource(100, milliseconds(1000));
  SegmentOptions o;
  o.idleReturnAfter = milliseconds(40);
  auto rl = make(src, 10, o);
  ASSERT_TRUE(rl->tryAcquire());
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  clock_.advance(milliseconds(39));
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  clock_.advance(milliseconds(1));
  EXPECT_EQ(rl->releaseIfIdle(), 9);
}

TEST_F(SegmentedRateLimiterTest, NothingGoesBackOnceTheSegmentHasExpired) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  clock_.advance(milliseconds(1000));
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  EXPECT_EQ(rl->close(), 0);
  EXPECT_TRUE(src->releases().empty());
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsExpired, 9);
  EXPECT_EQ(s.permitsReturned, 0);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, ConcurrentCallsOnAnEmptySegmentShareOneRefill) {
  auto src = std::make_shared<FakeSource>(sim_, 100, milliseconds(1000));
  SegmentOptions o;
  o.refillWait = milliseconds(10000);  // on the simulated clock, which does not move here
  auto rl = makeSim(src, 10, o);
  src->closeGate();
  constexpr int kThreads = 4;
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] { granted += rl->tryAcquire() ? 1 : 0; });
  }
  ASSERT_TRUE(src->waitAtGate(1));
  ASSERT_TRUE(sim_.awaitBlocked(kThreads - 1)) << "the other threads wait for the refill in flight";
  EXPECT_EQ(rl->stats().refillWaits, kThreads - 1);
  src->openGate();
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), kThreads);
  EXPECT_EQ(src->acquires().size(), 1u);
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsHeld, 10 - kThreads);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, WaitersShareADeniedRefillInsteadOfEachAsking) {
  auto src = std::make_shared<FakeSource>(sim_, 10, milliseconds(1000));
  auto other = makeSim(src, 10);
  ASSERT_TRUE(other->tryAcquire(10));  // the source is empty
  SegmentOptions o;
  o.refillWait = milliseconds(10000);  // on the simulated clock, which does not move here
  auto rl = makeSim(src, 10, o);
  src->closeGate();
  constexpr int kThreads = 4;
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] { granted += rl->tryAcquire() ? 1 : 0; });
  }
  ASSERT_TRUE(src->waitAtGate(1));
  ASSERT_TRUE(sim_.awaitBlocked(kThreads - 1));
  src->openGate();
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 0);
  EXPECT_EQ(src->acquires().size(), 2u) << "one for `other`, one shared by the four callers";
}

TEST_F(SegmentedRateLimiterTest, WaiterGivesUpAfterRefillWait) {
  auto src = std::make_shared<FakeSource>(sim_, 100, milliseconds(1000));
  SegmentOptions o;
  o.refillWait = milliseconds(20);
  auto rl = makeSim(src, 10, o);
  src->closeGate();
  std::thread leader([&] { EXPECT_TRUE(rl->tryAcquire()); });
  ASSERT_TRUE(src->waitAtGate(1));
  std::atomic<int> waiter{-1};
  std::thread follower([&] { waiter = rl->tryAcquire() ? 1 : 0; });
  ASSERT_TRUE(sim_.awaitBlocked(1));
  sim_.advance(milliseconds(19));
  EXPECT_EQ(waiter.load(), -1) << "still waiting 1 ms before refillWait";
  EXPECT_EQ(sim_.blocked(), 1u);
  sim_.advance(milliseconds(1));
  follower.join();
  EXPECT_EQ(waiter.load(), 0) << "the refill in flight did not finish within refillWait";
  EXPECT_EQ(rl->stats().refillWaits, 1);
  src->openGate();
  leader.join();
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().size(), 1u);
}

// An idle give-back held the leader role during its I/O, so while it was stuck
// on the source every acquirer that found the segment empty waited refillWait and got false.
// The give-back holds no role: the acquirer leads its own refill at once.
TEST_F(SegmentedRateLimiterTest, StuckIdleGiveBackDoesNotBlockAcquirers) {
  auto src = makeSource(100, milliseconds(1000));
  SegmentOptions o;
  o.refillWait = milliseconds(50);
  auto rl = make(src, 10, o);
  ASSERT_TRUE(rl->tryAcquire());  // holds 9
  EXPECT_EQ(rl->releaseIfIdle(), 0);
  clock_.advance(milliseconds(250));
  src->closeReleaseGate();
  std::int64_t givenBack = -1;
  std::thread giver([&] { givenBack = rl->releaseIfIdle(); });
  ASSERT_TRUE(src->waitAtReleaseGate(1));  // the give-back is stuck in the source
  EXPECT_TRUE(rl->tryAcquire()) << "an acquirer leads its own refill while the give-back is stuck";
  EXPECT_EQ(rl->stats().refillWaits, 0) << "nobody waited for the give-back";
  EXPECT_EQ(src->acquires().size(), 2u);
  src->openReleaseGate();
  giver.join();
  EXPECT_EQ(givenBack, 9);
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsReturned, 9);
  EXPECT_EQ(s.permitsHeld, 9) << "the new segment is untouched by the old give-back";
  expectConserved(s);
  EXPECT_EQ(src->available(), 89);
}

// A waiter that gives up on a refill still in flight asks the source's failure policy
// (detail::SegmentAccess::decideUnanswered: a stand-in's member, detected at compile time);
// FakeSource has none and the waiter gets false (WaiterGivesUpAfterRefillWait).
TEST_F(SegmentedRateLimiterTest, WaiterGetsTheSourcesPolicyAnswerWhenTheRefillIsStillInFlight) {
  auto src = std::make_shared<PolicySource>(sim_, 100, milliseconds(1000));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = false;
  o.refillWait = milliseconds(20);
  SimPolicyLimiter rl(src, o, ClockRef<SimulatedClock>(sim_));
  src->closeGate();
  std::thread leader([&] { EXPECT_TRUE(rl.tryAcquire()); });
  ASSERT_TRUE(src->waitAtGate(1));
  // Each waiter runs on a thread of its own and gives up when the test moves the clock past its wait.
  auto waitOut = [&](auto call, milliseconds wait) {
    std::atomic<int> answer{-1};
    std::thread waiter([&] { answer = call() ? 1 : 0; });
    EXPECT_TRUE(sim_.awaitBlocked(1));
    sim_.advance(wait);
    waiter.join();
    return answer.load();
  };
  EXPECT_EQ(waitOut([&] { return rl.tryAcquire(); }, milliseconds(20)), 1) << "the policy's answer (Allow)";
  EXPECT_EQ(waitOut([&] { return rl.tryAcquire(2, milliseconds(30)); }, milliseconds(30)), 1);
  src->setAnswer(false);
  EXPECT_EQ(waitOut([&] { return rl.tryAcquire(); }, milliseconds(20)), 0) << "the policy's answer (Deny)";
  src->openGate();
  leader.join();
  const auto d = src->decisions();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].permits, 1);
  EXPECT_NE(d[0].reason.find("waited 20 ms (refillWait)"), std::string::npos) << d[0].reason;
  EXPECT_NE(d[0].reason.find("refill in flight"), std::string::npos) << d[0].reason;
  EXPECT_EQ(d[1].permits, 2);
  EXPECT_NE(d[1].reason.find("waited 30 ms (the call's timeout)"), std::string::npos) << d[1].reason;
  EXPECT_EQ(src->acquires().size(), 1u) << "the waiters sent nothing";
  EXPECT_EQ(rl.stats().refillWaits, 3);
}

// Closing while Redis is down, at the segment: a give-back the source skips (its Client has just found Redis
// unreachable) sends nothing and counts its permits as expired; one that goes is a round trip.
TEST_F(SegmentedRateLimiterTest, SkippedBestEffortGiveBackSendsNothingAndCountsThePermitsAsExpired) {
  auto src = std::make_shared<PolicySource>(clock_, 100, milliseconds(1000));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = false;
  PolicyLimiter skipped(src, o, ClockRef<ManualClock>(clock_));
  PolicyLimiter sent(src, o, ClockRef<ManualClock>(clock_));
  PolicyLimiter failed(src, o, ClockRef<ManualClock>(clock_));
  ASSERT_TRUE(skipped.tryAcquire());
  ASSERT_TRUE(sent.tryAcquire());
  ASSERT_TRUE(failed.tryAcquire());
  src->setUnreachable(true);
  EXPECT_EQ(skipped.close(), 0);
  EXPECT_EQ(src->skipped(), 1);
  EXPECT_TRUE(src->releases().empty());
  SegmentStats s = skipped.stats();
  EXPECT_EQ(s.permitsExpired, 9);
  EXPECT_EQ(s.permitsReturned, 0);
  EXPECT_EQ(s.remoteRoundTrips, 1) << "only the refill: the skipped give-back is no round trip";
  expectConserved(s);
  src->setUnreachable(false);
  EXPECT_EQ(sent.close(), 9);
  s = sent.stats();
  EXPECT_EQ(s.permitsReturned, 9);
  EXPECT_EQ(s.remoteRoundTrips, 2);
  expectConserved(s);
  src->failNextRelease();  // sent, and it fails: a round trip, the permits count as expired
  EXPECT_EQ(failed.close(), 0);
  s = failed.stats();
  EXPECT_EQ(s.permitsReturned, 0);
  EXPECT_EQ(s.permitsExpired, 9);
  EXPECT_EQ(s.remoteRoundTrips, 2);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, RequestsLargerThanASegmentGoStraightToTheSource) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());  // 9 held
  EXPECT_TRUE(rl->tryAcquire(15));
  const auto calls = src->acquires();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].atLeast, 15);
  EXPECT_EQ(calls[1].atMost, 15);
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsHeld, 9);
  EXPECT_EQ(s.directGrants, 16);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, TimedTryAcquireSleepsTheReturnedWaitOnTheClock) {
  auto src = makeSource(2, milliseconds(100));
  auto rl = make(src, 2);
  ASSERT_TRUE(rl->tryAcquire());
  ASSERT_TRUE(rl->tryAcquire());
  const auto t0 = clock_.now();
  EXPECT_FALSE(rl->tryAcquire(milliseconds(50))) << "the wait (100 ms) exceeds the timeout";
  EXPECT_EQ(clock_.now(), t0) << "returns at once instead of sleeping the timeout";
  EXPECT_FALSE(rl->tryAcquire(1, milliseconds(0)));
  EXPECT_TRUE(rl->tryAcquire(1, milliseconds(150)));
  EXPECT_GE(clock_.now() - t0, milliseconds(100));
  EXPECT_LT(clock_.now() - t0, milliseconds(150));
}

TEST_F(SegmentedRateLimiterTest, AcquireWaitsUntilGranted) {
  auto src = makeSource(3, milliseconds(100));
  auto rl = make(src, 3);
  for (int i = 0; i < 3; ++i) rl->acquire();
  const auto t0 = clock_.now();
  rl->acquire(2);
  EXPECT_GE(clock_.now() - t0, milliseconds(100));
  EXPECT_EQ(rl->stats().permitsHeld, 1);
  rl->acquire(1);  // local
  EXPECT_EQ(rl->stats().permitsHeld, 0);
}

TEST_F(SegmentedRateLimiterTest, RejectsBadArgumentsBeforeAskingTheSource) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  EXPECT_THROW((void)rl->tryAcquire(0), InvalidArgument);
  EXPECT_THROW((void)rl->tryAcquire(-3), InvalidArgument);
  EXPECT_THROW((void)rl->tryAcquire(-1, milliseconds(10)), InvalidArgument);
  EXPECT_THROW(rl->acquire(0), InvalidArgument);
  EXPECT_THROW((void)rl->reconfigure(RateType::Overall, 10, milliseconds(100), 0), InvalidArgument);
  EXPECT_TRUE(src->acquires().empty());
  SegmentOptions bad;
  bad.segmentSize = 0;
  EXPECT_THROW(Limiter(src, bad, ClockRef<ManualClock>(clock_)), InvalidArgument);
  bad = {};
  bad.refillWait = milliseconds(0);
  EXPECT_THROW(Limiter(src, bad, ClockRef<ManualClock>(clock_)), InvalidArgument);
  EXPECT_THROW(Limiter(nullptr, {}, ClockRef<ManualClock>(clock_)), InvalidArgument);
}

// A huge refillWait or idleReturnAfter overflowed the µs and steady_clock
// deadlines computed from it (a refill wait ended in the past; the idle check spun). Refused.
TEST_F(SegmentedRateLimiterTest, HugeWaitOptionsAreRefusedAtConstruction) {
  auto src = makeSource(100, milliseconds(1000));
  for (const milliseconds huge : {milliseconds::max(), Limiter::kMaxWait + milliseconds(1)}) {
    SegmentOptions bad;
    bad.refillWait = huge;
    EXPECT_THROW(Limiter(src, bad, ClockRef<ManualClock>(clock_)), InvalidArgument);
    bad = {};
    bad.idleReturnAfter = huge;
    EXPECT_THROW(Limiter(src, bad, ClockRef<ManualClock>(clock_)), InvalidArgument);
  }
  SegmentOptions longest;
  longest.refillWait = Limiter::kMaxWait;
  longest.idleReturnAfter = Limiter::kMaxWait;
  longest.returnWhenIdle = false;
  Limiter ok(src, longest, ClockRef<ManualClock>(clock_));
  EXPECT_TRUE(ok.tryAcquire());
}

TEST_F(SegmentedRateLimiterTest, SourceErrorPropagatesAndTheNextCallRefillsAgain) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(rl->tryAcquire());  // 1 held
  src->failNext();
  EXPECT_THROW((void)rl->tryAcquire(3), IoError);
  EXPECT_EQ(rl->stats().permitsHeld, 1) << "the leftover is restored";
  EXPECT_TRUE(rl->tryAcquire(3));
  EXPECT_EQ(rl->stats().permitsHeld, 8);
  expectConserved(rl->stats());
}

TEST_F(SegmentedRateLimiterTest, FailedGiveBackOnCloseCountsThePermitsAsExpired) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());
  src->failNextRelease();
  EXPECT_EQ(rl->close(), 0);  // does not throw: the permits come back in the source at expiry
  const SegmentStats s = rl->stats();
  EXPECT_EQ(s.permitsReturned, 0);
  EXPECT_EQ(s.permitsExpired, 9);
  expectConserved(s);
}

TEST_F(SegmentedRateLimiterTest, FailedGiveBackOnReconfigureIsThrownAndTheLimiterStaysUsable) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());
  src->failNextRelease();
  EXPECT_THROW((void)rl->reconfigure(RateType::Overall, 60, milliseconds(1000), 10), TimeoutError);
  EXPECT_EQ(src->configWrites(), 0);
  EXPECT_EQ(rl->stats().permitsExpired, 9);
  EXPECT_TRUE(rl->tryAcquire());  // the leader role was released
  EXPECT_TRUE(rl->reconfigure(RateType::Overall, 60, milliseconds(1000), 10));
  expectConserved(rl->stats());
}

TEST_F(SegmentedRateLimiterTest, ReconfigureWritesOnlyWhenTheConfigurationDiffers) {
  auto src = makeSource(100, milliseconds(1000));
  auto rl = make(src, 10);
  ASSERT_TRUE(rl->tryAcquire());
  EXPECT_FALSE(rl->reconfigure(RateType::Overall, 100, milliseconds(1000), 10));
  EXPECT_EQ(src->configWrites(), 0);
  EXPECT_TRUE(src->releases().empty()) << "nothing changed: the segment stays";
  EXPECT_EQ(rl->stats().permitsHeld, 9);

  EXPECT_TRUE(rl->reconfigure(RateType::Overall, 50, milliseconds(1000), 10));
  EXPECT_EQ(src->configWrites(), 1);
  EXPECT_TRUE(src->lastKeepState()) << "state is kept";
  ASSERT_EQ(src->releases().size(), 1u);
  EXPECT_EQ(src->releases()[0].permits, 9);
  EXPECT_EQ(src->available(), 49);
  EXPECT_EQ(rl->stats().permitsHeld, 0);

  ASSERT_TRUE(rl->tryAcquire());  // new segment, 9 held
  EXPECT_FALSE(rl->reconfigure(RateType::Overall, 50, milliseconds(1000), 5)) << "only the segment size changes";
  EXPECT_EQ(src->configWrites(), 1);
  EXPECT_EQ(src->releases().size(), 2u);
  EXPECT_EQ(rl->segmentSize(), 5);
  ASSERT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->acquires().back().atMost, 5);
  expectConserved(rl->stats());
}

TEST_F(SegmentedRateLimiterTest, ReconfigureCreatesAMissingConfiguration) {
  auto src = makeSource(1, milliseconds(1));
  src->uninitialize();
  auto rl = make(src, 10);
  EXPECT_TRUE(rl->reconfigure(RateType::Overall, 30, milliseconds(500), 10));
  EXPECT_EQ(src->interval(), milliseconds(500));
  EXPECT_TRUE(rl->tryAcquire());
  EXPECT_EQ(src->available(), 20);
}

TEST_F(SegmentedRateLimiterTest, LocalHitDoesNotAllocate) {
  auto src = makeSource(1000, milliseconds(1000));
  auto rl = make(src, 100);
#if REDLIMIT_TEST_SANITIZER_OWNS_NEW
  ASSERT_NE(gAllocationHookInstalled, 0) << "the sanitizer's malloc hook counts this test's allocations";
#endif
  ASSERT_TRUE(rl->tryAcquire());
  const std::int64_t before = tAllocations;
  bool all = true;
  for (int i = 0; i < 50; ++i) all = rl->tryAcquire() && all;
  const std::int64_t after = tAllocations;
  EXPECT_TRUE(all);
  EXPECT_EQ(after, before);
  EXPECT_EQ(src->acquires().size(), 1u);
}

TEST_F(SegmentedRateLimiterTest, RegistersWithTheIdleSweeperAndLeavesItOnClose) {
  auto& sweeper = detail::IdleSweeper::instance();
  const std::size_t before = sweeper.size();
  auto src = makeSource(100, milliseconds(1000));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = true;  // the sweeper sees a manual clock that does not move: never idle
  Limiter rl(src, o, ClockRef<ManualClock>(clock_));
  EXPECT_EQ(sweeper.size(), before + 1);
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_EQ(rl.close(), 9);
  EXPECT_EQ(sweeper.size(), before);
  EXPECT_EQ(src->available(), 99);
}

// close() waits for the sweeper's give-back of this limiter if one is in flight, so the counters
// are final (and the limiter may be destroyed) when it returns.
TEST_F(SegmentedRateLimiterTest, CloseWaitsForTheSweepersGiveBackInFlight) {
  auto& sweeper = detail::IdleSweeper::instance();
  auto src = makeSource(100, milliseconds(1000));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = true;
  o.idleReturnAfter = milliseconds(40);
  Limiter rl(src, o, ClockRef<ManualClock>(clock_));
  ASSERT_TRUE(rl.tryAcquire());
  src->closeReleaseGate();
  // Move the manual clock until the sweeper finds the segment idle and its give-back is stuck.
  while (!src->waitAtReleaseGate(1, milliseconds(5))) clock_.advance(milliseconds(50));
  const std::size_t registered = sweeper.size();
  std::int64_t closeReturned = -1;
  SegmentStats atClose;
  std::thread closer([&] {
    closeReturned = rl.close();
    atClose = rl.stats();
  });
  while (sweeper.size() == registered) std::this_thread::yield();  // close() left the sweeper: now it waits
  src->openReleaseGate();
  closer.join();
  EXPECT_EQ(closeReturned, 0) << "the sweeper had taken the segment";
  EXPECT_EQ(atClose.permitsReturned, 9) << "close() returned before the give-back in flight ended";
  expectConserved(atClose);
}

// A limiter destroyed on the sweeper thread (here by a hook in another limiter's give-back) leaves
// the sweeper without waiting for the visit it is part of, and gives its own segment back.
TEST_F(SegmentedRateLimiterTest, LimiterDestroyedFromInsideTheSweeperDoesNotDeadlock) {
  auto srcA = makeSource(100, milliseconds(1000));
  auto srcB = makeSource(100, milliseconds(1000));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = true;
  o.idleReturnAfter = milliseconds(40);
  auto a = std::make_unique<Limiter>(srcA, o, ClockRef<ManualClock>(clock_));
  o.idleReturnAfter = std::chrono::hours(1);  // B is registered but never idle itself
  auto b = std::make_unique<Limiter>(srcB, o, ClockRef<ManualClock>(clock_));
  ASSERT_TRUE(a->tryAcquire());
  ASSERT_TRUE(b->tryAcquire());
  std::mutex m;
  std::condition_variable cv;
  bool destroyed = false;
  std::int64_t bReturned = -1;
  srcA->setReleaseHook([&] {
    if (!b) return;
    const std::int64_t r = b->close();  // on the sweeper thread, inside A's visit
    b.reset();
    std::lock_guard<std::mutex> lk(m);
    bReturned = r;
    destroyed = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lk(m);
  for (int i = 0; i < 2000 && !destroyed; ++i) {
    clock_.advance(milliseconds(50));
    cv.wait_for(lk, milliseconds(5), [&] { return destroyed; });
  }
  ASSERT_TRUE(destroyed);
  EXPECT_EQ(bReturned, 9);
  lk.unlock();
  ASSERT_EQ(srcB->releases().size(), 1u);
  EXPECT_EQ(srcB->available(), 99);
  a->close();
  EXPECT_EQ(a->stats().permitsReturned, 9);
}

// A limiter in a global holder (constructed before main, so destroyed after anything made
// later) is closed during static destruction: the sweeper it leaves must still exist then.
ManualClock gAtExitClock{std::chrono::seconds(1000)};
std::unique_ptr<Limiter> gAtExit;

TEST_F(SegmentedRateLimiterTest, LimiterInAGlobalHolderClosesCleanlyAtExit) {
  EXPECT_EXIT(
      {
        SegmentOptions o;
        o.segmentSize = 10;
        o.returnWhenIdle = true;  // the first limiter of this process: starts the sweeper
        gAtExit = std::make_unique<Limiter>(std::make_shared<FakeSource>(gAtExitClock, 100, milliseconds(1000)), o,
                                            ClockRef<ManualClock>(gAtExitClock));
        if (!gAtExit->tryAcquire()) std::_Exit(3);
        std::exit(0);  // static destruction closes gAtExit
      },
      ::testing::ExitedWithCode(0), "");
}

// 10 000 limiters, each holding a segment and registered for idle give-back: the process has as
// many threads as with one (the shared sweeper; tests/integration/segmented_rate_limiter_faults_test.cpp shows
// that thread giving back every idle limiter's segment).
TEST_F(SegmentedRateLimiterTest, TenThousandLimitersAddNoThreads) {
  auto threads = [] {
    const std::filesystem::directory_iterator tasks("/proc/self/task");
    return std::distance(std::filesystem::begin(tasks), std::filesystem::end(tasks));
  };
  // A source that grants every request in O(1) (FakeSource's bookkeeping is linear in its grants).
  struct Endless {
    std::atomic<std::int64_t> out{0};
    detail::AcquireResult tryAcquireUpTo(std::int64_t, std::int64_t atMost) {
      out += atMost;
      detail::AcquireResult r;
      r.granted = atMost;
      r.interval = milliseconds(60000);
      r.member = "m";
      return r;
    }
    std::int64_t releaseGrant(const std::string&, std::int64_t permits) {
      out -= permits;
      return permits;
    }
  };
  constexpr int kLimiters = 10000;
  auto src = std::make_shared<Endless>();
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = true;
  o.idleReturnAfter = milliseconds(100);
  using EndlessLimiter = SegmentedRateLimiter<Endless, ClockRef<ManualClock>>;
  std::vector<std::unique_ptr<EndlessLimiter>> limiters;
  limiters.reserve(kLimiters);
  std::ptrdiff_t withOne = 0;
  for (int i = 0; i < kLimiters; ++i) {
    limiters.push_back(std::make_unique<EndlessLimiter>(src, o, ClockRef<ManualClock>(clock_)));
    ASSERT_TRUE(limiters.back()->tryAcquire());  // holds 9: armed for the sweeper's visits
    if (i == 0) withOne = threads();
  }
  EXPECT_EQ(threads(), withOne) << "thread count independent of the number of limiters";
  EXPECT_GE(detail::IdleSweeper::instance().size(), static_cast<std::size_t>(kLimiters));
  limiters.clear();
  EXPECT_EQ(src->out.load(), kLimiters) << "closing gave every unspent segment back (one permit each was used)";
}

// Threads hammer one limiter, moving the clock across segment deadlines, while another runs
// the idle check: every permit handed out is accounted for, none twice (run under TSan too).
TEST_F(SegmentedRateLimiterTest, ContendedHotPathHandsOutEachPermitOnce) {
  auto src = makeSource(500, milliseconds(50));
  SegmentOptions o;
  o.refillWait = milliseconds(10000);
  auto rl = make(src, 16, o);
  constexpr int kThreads = 4, kCalls = 20000;
  std::atomic<std::int64_t> handedOut{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::int64_t mine = 0;
      for (int i = 0; i < kCalls; ++i) {
        const std::int64_t permits = 1 + (i + t) % 3;
        if (rl->tryAcquire(permits)) mine += permits;
        if (i % 40 == 0) clock_.advance(microseconds(500));  // time moves with the work
        if (i % 997 == 0) clock_.advance(milliseconds(30));  // and sometimes jumps (expiry, idle)
      }
      handedOut += mine;
    });
  }
  std::thread mover([&] {
    while (!done.load()) {
      (void)rl->releaseIfIdle();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  mover.join();
  rl->close();
  const SegmentStats s = rl->stats();
  EXPECT_EQ(handedOut.load(), s.localGrants + s.directGrants);
  expectConserved(s);
  EXPECT_GT(s.localGrants, 0);
  EXPECT_GE(src->available(), 0);
}

// A seeded random mix of calls, idle checks, clock moves and reconfigurations: the counters
// must add up after every step, and the source must never be over-drawn.
TEST_F(SegmentedRateLimiterTest, CountersAddUpUnderARandomMix) {
  auto src = makeSource(40, milliseconds(100));
  auto a = make(src, 7);
  auto b = make(src, 4);
  std::mt19937 rng(12345);
  for (int step = 0; step < 3000; ++step) {
    Limiter& rl = (rng() % 2 == 0) ? *a : *b;
    switch (rng() % 6) {
      case 0:
      case 1:
        (void)rl.tryAcquire();
        break;
      case 2:
        (void)rl.tryAcquire(static_cast<std::int64_t>(1 + rng() % 9));
        break;
      case 3:
        (void)rl.releaseIfIdle();
        break;
      case 4:
        clock_.advance(microseconds(rng() % 20000));
        break;
      case 5:
        if (rng() % 50 == 0) (void)rl.reconfigure(RateType::Overall, 40, milliseconds(100), 3 + rng() % 6);
        break;
    }
    ASSERT_GE(src->available(), 0) << "step " << step;
    const SegmentStats sa = a->stats(), sb = b->stats();
    ASSERT_EQ(sa.permitsFromRemote,
              sa.directGrants + sa.localGrants + sa.permitsHeld + sa.permitsReturned + sa.permitsExpired)
        << "step " << step;
    ASSERT_EQ(sb.permitsFromRemote,
              sb.directGrants + sb.localGrants + sb.permitsHeld + sb.permitsReturned + sb.permitsExpired)
        << "step " << step;
  }
  a->close();
  b->close();
  expectConserved(a->stats());
  expectConserved(b->stats());
  EXPECT_GT(a->stats().localGrants + b->stats().localGrants, 0);
  EXPECT_GT(a->stats().permitsReturned + b->stats().permitsReturned, 0);
  EXPECT_GT(a->stats().permitsExpired + b->stats().permitsExpired, 0);
}

}  // namespace

// The permit-source concept is checked at compile time (detail::IsPermitSource; SegmentedRateLimiter's
// static_asserts name the missing member): the library's sources reach their private members
// through their detail::SegmentAccess, a stand-in its public ones. Stand-ins that lack one member each:
namespace {
struct NoRelease {
  redlimit::detail::AcquireResult tryAcquireUpTo(std::int64_t, std::int64_t) { return {}; }
};
struct NoAcquire {
  std::int64_t releaseGrant(const std::string&, std::int64_t) { return 0; }
};
struct Tag {};
struct WrongAcquire {  // takes a Tag where the count goes: not callable as a source
  redlimit::detail::AcquireResult tryAcquireUpTo(Tag, std::int64_t) { return {}; }
  std::int64_t releaseGrant(const std::string&, std::int64_t) { return 0; }
};
struct Minimal : NoRelease {
  std::int64_t releaseGrant(const std::string&, std::int64_t) { return 0; }
};
static_assert(redlimit::detail::isPermitSourceV<redlimit::RateLimiter>);
static_assert(redlimit::detail::isPermitSourceV<FakeSource>);
static_assert(redlimit::detail::isPermitSourceV<Minimal>);
static_assert(!redlimit::detail::isPermitSourceV<NoRelease>);
static_assert(!redlimit::detail::isPermitSourceV<NoAcquire>);
static_assert(!redlimit::detail::isPermitSourceV<WrongAcquire>);
static_assert(!redlimit::detail::isPermitSourceV<int>);
static_assert(redlimit::detail::isPermitSourceV<redlimit::Limiter>);
static_assert(!redlimit::detail::HasDecideUnanswered<Minimal>::value);
static_assert(redlimit::detail::HasConfigCalls<redlimit::RateLimiter>::value);
static_assert(!redlimit::detail::HasConfigCalls<Minimal>::value);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
static_assert(redlimit::detail::PermitSource<redlimit::RateLimiter> && !redlimit::detail::PermitSource<NoRelease>);
#endif
}  // namespace

TEST(PermitSourceConcept, TraitAcceptsSourcesAndRejectsTypesMissingAMember) {
  // The checks above are static_asserts; this test records that they compiled, and that a source
  // with only the required members drives a SegmentedRateLimiter (reconfigure() not used).
  using MinimalLimiter = redlimit::SegmentedRateLimiter<Minimal, redlimit::ClockRef<redlimit::ManualClock>>;
  redlimit::ManualClock clock;
  redlimit::SegmentOptions options;
  options.returnWhenIdle = false;
  MinimalLimiter limiter(std::make_shared<Minimal>(), options, redlimit::ClockRef<redlimit::ManualClock>(clock));
  EXPECT_FALSE(limiter.tryAcquire());  // Minimal grants nothing
}
