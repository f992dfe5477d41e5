// The one-key handles' configuration against a real redis-server: handles made with their
// configuration (it travels in every call, their keys are reclaimed when idle), setConfig that keeps
// the state for every kind, the clock-step clamp, a configuration in the call other than the key's
// (the scripts driven at chosen times), and MultiLimit with the configurations of its handles.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// A fixed window key (lua/lib/fixed_window_core.lua): 'W', L, W ms, keepAlive ms, start µs, count, next count.
std::string windowValue(std::int64_t l, std::int64_t windowMs, std::int64_t startUs, std::int64_t count) {
  std::string v(1, 'W');
  for (const std::int64_t f : {l, windowMs, std::int64_t{0}}) putLe(v, f, 4);
  putLe(v, startUs, 7);
  putLe(v, count, 4);
  putLe(v, 0, 4);
  return v;
}

// A bursty smooth key (lua/smooth.lua): 'S', P, I ms, maxBurst ms, C = 0, stored units and nextFree
// as 48 low bits plus their high bits in bytes A and B, which also hold e (the debt bound 2^e - 1 µs).
std::string smoothValue(std::int64_t p, std::int64_t intervalMs, std::int64_t maxBurstMs, std::int64_t nextFree,
                        int e) {
  std::string v(1, 'S');
  for (const std::int64_t f : {p, intervalMs, maxBurstMs}) putLe(v, f, 4);
  v.push_back('\0');
  constexpr std::int64_t kTwo48 = std::int64_t{1} << 48;
  putLe(v, 0, 6);
  putLe(v, nextFree % kTwo48, 6);
  v.push_back(static_cast<char>((e % 8) * 32));
  v.push_back(static_cast<char>(nextFree / kTwo48 + std::int64_t{e / 8} * 16 + 128));
  return v;
}

constexpr std::int64_t kHour = 3'600'000'000;                       // µs
constexpr std::int64_t kTwo53Minus1 = (std::int64_t{1} << 53) - 1;  // the largest TAT a key may hold

}  // namespace

class OneKeyConfiguration : public RedisTest {
 protected:
  std::int64_t now() { return serverTimeUs(admin()); }
  void set(const std::string& key, const std::string& value) { (void)raw({"SET", key, value}); }
  std::int64_t pttl(const std::string& key) { return raw({"PTTL", key}).integer; }

  // setConfig(c) on `key` about every 10 ms for ~1 s while 4 threads (each its own Client) decide
  // one permit at a time: the permits granted, and the span in seconds.
  template <class Limiter, class Config>
  std::pair<int, double> setConfigUnderDecisions(const std::string& key, const Config& c) {
    Limiter rl(client(), key);
    rl.setConfig(c);
    std::atomic<bool> stop{false};
    std::atomic<int> granted{0};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> deciders;
    for (int t = 0; t < 4; ++t) {
      deciders.emplace_back([&, mine = Limiter(newClient(), key)]() mutable {
        while (!stop.load()) {
          if (mine.tryAcquire()) granted.fetch_add(1);
        }
      });
    }
    for (int i = 0; i < 100; ++i) {
      rl.setConfig(c);
      sleepMs(10);
    }
    stop.store(true);
    for (auto& t : deciders) t.join();
    return {granted.load(), static_cast<double>(msSince(start)) / 1000.0};
  }

  /// `op` ("take" or "peek") of n permits on `key` at nowUs, with `cfg` in the call (gcra.lua or
  /// fixed_window.lua, as a Limiter and the handles made with a configuration send it).
  TakeReply withConfigAt(const std::string& op, const std::string& key, const LimiterConfig& cfg, std::int64_t nowUs,
                         std::int64_t n) {
    const std::string kind(1, cfg.kind);
    return takeReply(runOneKey(admin(), scriptOf(kind), key, {op, str(nowUs), kind, str(n), "0", header(cfg)}));
  }

  /// The key holds `stored`, full at t0 (every permit in use, or the window's limit counted). A take
  /// of n with `cfg` in the call at t0 is denied, and its answer is exact: retryAfter (R, `retry`) is
  /// the first instant the same take is granted (denied at t0 + R - 1 µs); remaining and
  /// resetAfter are the state the denial left (a peek then answers the same; n = remaining fits and
  /// one more does not; the limiter is full again at t0 + resetAfter and not a µs earlier).
  void expectExactDenialUnderAnotherConfiguration(const LimiterConfig& stored, const LimiterConfig& cfg,
                                                  std::int64_t t0, std::int64_t n, std::int64_t retry) {
    const std::string kind(1, stored.kind);
    const std::string key = name(kind + str(stored.limit) + "." + str(stored.permits) + "." + str(stored.intervalMs) +
                                 "-" + str(cfg.limit) + "." + str(cfg.permits) + "." + str(cfg.intervalMs));
    (void)runOneKey(admin(), scriptOf(kind), key, setArgs(stored, t0, 0));
    if (stored.kind == 'W') {
      ASSERT_TRUE(
          takeReply(runOneKey(admin(), scriptOf(kind), key, {"take", str(t0), kind, str(stored.limit), "0"})).allowed);
    }
    const TakeReply denied = withConfigAt("take", key, cfg, t0, n);
    ASSERT_FALSE(denied.allowed);
    const std::int64_t r = denied.retryAfterUs;
    ASSERT_GT(r, 0);
    EXPECT_EQ(r, retry);

    const TakeReply peeked = withConfigAt("peek", key, cfg, t0, n);
    EXPECT_FALSE(peeked.allowed);
    EXPECT_EQ(peeked.retryAfterUs, r);
    EXPECT_EQ(peeked.remaining, denied.remaining);
    EXPECT_EQ(peeked.resetAfterUs, denied.resetAfterUs);
    if (denied.remaining > 0) {
      EXPECT_TRUE(withConfigAt("peek", key, cfg, t0, denied.remaining).allowed);
    }
    EXPECT_FALSE(withConfigAt("peek", key, cfg, t0, std::max<std::int64_t>(denied.remaining, 0) + 1).allowed);
    ASSERT_GT(denied.resetAfterUs, 0);
    EXPECT_LT(withConfigAt("peek", key, cfg, t0 + denied.resetAfterUs - 1, 1).remaining, cfg.limit);
    EXPECT_EQ(withConfigAt("peek", key, cfg, t0 + denied.resetAfterUs, 1).remaining, cfg.limit);

    EXPECT_FALSE(withConfigAt("take", key, cfg, t0 + r - 1, n).allowed) << "retryAfter " << r << " us";
    EXPECT_TRUE(withConfigAt("take", key, cfg, t0 + r, n).allowed) << "retryAfter " << r << " us";
  }
};

// --- One-key handles made with their configuration ------------------------------------------------

TEST_F(OneKeyConfiguration, HandlesMadeWithAConfigurationReclaimTheirKeysAndRecreateThem) {
  GcraRateLimiter g(client(), name("g"), gcra(3, 1, milliseconds(10000)));
  TokenBucketRateLimiter t(client(), name("t"), bucket(3, 1, milliseconds(10000)));
  FixedWindowRateLimiter w(client(), name("w"), window(3, milliseconds(60000)));
  DistributedSmoothRateLimiter s(client(), name("s"), SmoothConfig::bursty(3, milliseconds(1000)));
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    EXPECT_EQ(g.decide(2).remaining, 1);
    EXPECT_EQ(t.decide(2).remaining, 1);
    EXPECT_EQ(w.decide(2).remaining, 1);
    EXPECT_EQ(s.decide(2).remaining, 1);
    for (const char* k : {"g", "t", "w", "s"}) EXPECT_GT(pttl(name(k)), 0) << k << ": the key expires when idle";
    EXPECT_EQ(g.getConfig().keepAlive, kDefaultIdleMargin);
    // Redis lost the keys (they expired, a restart without persistence, a failover): the next
    // decision writes them again, with no NotInitializedError.
    (void)raw({"DEL", name("g"), name("t"), name("w"), name("s")});
    EXPECT_EQ(s.getConfig(), [] {
      SmoothConfig c = SmoothConfig::bursty(3, milliseconds(1000));
      c.keepAlive = kDefaultIdleMargin;
      return c;
    }()) << "a handle with a configuration answers its own for a key that has none";
  }
  GcraRateLimiterOptions permanent;
  permanent.permanentKeys = true;
  GcraRateLimiter kept(client(), name("kept"), gcra(3, 1, milliseconds(10000)), permanent);
  ASSERT_TRUE(kept.tryAcquire());
  EXPECT_EQ(pttl(name("kept")), -1);

  // Without a configuration: the central way, unchanged.
  GcraRateLimiterOptions allow;
  allow.failure.policy = FailurePolicy::Allow;
  GcraRateLimiter central(client(), name("central"), allow);
  EXPECT_THROW((void)central.decide(), NotInitializedError);
  EXPECT_THROW((void)DistributedSmoothRateLimiter(client(), name("sc")).trySetConfig([] {
    SmoothConfig c = SmoothConfig::bursty(3, milliseconds(1000));
    c.keepAlive = milliseconds(5);
    return c;
  }()),
               InvalidArgument)
      << "a smooth key stores no keepAlive";
  EXPECT_THROW((void)g.decide(4), InvalidArgument) << "above the handle's burst, before sending";
}

TEST_F(OneKeyConfiguration, SetConfigOfAHandleMadeWithAConfigurationReplacesItsOwn) {
  GcraRateLimiter a(client(), name("k"), gcra(10, 1, milliseconds(10000)));
  GcraRateLimiter copy = a;
  ASSERT_TRUE(a.decide(6).allowed);
  a.setConfig(gcra(20, 1, milliseconds(10000)));
  const Decision d = copy.decide();
  EXPECT_EQ(d.limit, 20) << "the copy decides with the new configuration too";
  EXPECT_EQ(d.remaining, 13) << "6 kept in use of 20, then 1";
}

// A handle made without a configuration, on a key without one: NotInitializedError, also under
// Allow (the failure policy decides outages, not a missing configuration).
TEST_F(OneKeyConfiguration, AHandleWithoutAConfigurationOnAnEmptyKeyThrowsNotInitializedUnderAllow) {
  GcraRateLimiterOptions explicitOptions;
  explicitOptions.failure.policy = FailurePolicy::Allow;
  GcraRateLimiter plain(client(), name("unset"), explicitOptions);
  EXPECT_THROW((void)plain.decide(), NotInitializedError);
  EXPECT_EQ(plain.failureStats().allowed, 0U);
}

// --- setConfig keeps the state; the concurrency bound for each kind --------------------------------

// setConfig keeps the permits in use for the token bucket and GCRA, on a change
// of rate, of period and of burst; the same configuration again changes nothing.
TEST_F(OneKeyConfiguration, SetConfigKeepsThePermitsInUse) {
  struct Change {
    const char* what;
    GcraConfig to;
    std::int64_t remaining;  // after 6 of 10 were taken and one more now
  };
  const GcraConfig from = gcra(10, 1, milliseconds(10000));
  for (const Change& c :
       {Change{"rate", gcra(10, 2, milliseconds(10000)), 3}, Change{"period", gcra(10, 1, milliseconds(20000)), 3},
        Change{"burst", gcra(20, 1, milliseconds(10000)), 13}, Change{"same", from, 3}}) {
    GcraRateLimiter rl(client(), name(c.what));
    rl.setConfig(from);
    ASSERT_TRUE(rl.decide(6).allowed) << c.what;
    rl.setConfig(c.to);
    EXPECT_EQ(rl.getConfig(), c.to) << c.what;
    const Decision d = rl.decide();
    EXPECT_TRUE(d.allowed) << c.what;
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
  }
  TokenBucketRateLimiter bucketed(client(), name("bucket"));
  bucketed.setConfig(bucket(10, 1, milliseconds(10000)));
  ASSERT_TRUE(bucketed.decide(10).allowed);
  bucketed.setConfig(bucket(10, 1, milliseconds(10000)));
  EXPECT_FALSE(bucketed.tryAcquire()) << "the same configuration does not refill";
  TokenBucketConfig refill = bucket(10, 1, milliseconds(10000));
  refill.initialTokens = 10;
  bucketed.setConfig(refill);
  EXPECT_TRUE(bucketed.tryAcquire()) << "asking for initialTokens restarts the bucket with them";
}

TEST_F(OneKeyConfiguration, FixedWindowSetConfigKeepsTheCounts) {
  struct Change {
    const char* what;
    FixedWindowConfig to;
    bool allowed;
    std::int64_t remaining;  // after 6 of 10 were taken and one more asked for now
  };
  // Windows of 24.8 and 49.7 days (aligned to the epoch): a window's start falls inside the test
  // about once in ten million runs (an hour-long window: once in 20 000).
  constexpr milliseconds kLong = GcraRateLimiter::kMaxInterval;
  constexpr milliseconds kHalf = kLong / 2;
  const FixedWindowConfig from = window(10, kHalf);
  for (const Change& c : {Change{"limit up (the rate)", window(20, kHalf), true, 13},
                          Change{"limit down (the burst)", window(4, kHalf), false, 0},
                          Change{"window (the period)", window(10, kLong), true, 3}, Change{"same", from, true, 3}}) {
    FixedWindowRateLimiter rl(client(), name(c.what));
    rl.setConfig(from);
    ASSERT_TRUE(rl.decide(6).allowed) << c.what;
    rl.setConfig(c.to);
    EXPECT_EQ(rl.getConfig(), c.to) << c.what;
    const Decision d = rl.decide();
    EXPECT_EQ(d.allowed, c.allowed) << c.what;
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
  }
}

TEST_F(OneKeyConfiguration, SmoothSetConfigScalesTheStoredPermits) {
  struct Change {
    const char* what;
    SmoothConfig to;
    std::int64_t remaining;  // stored: 6 of 10, scaled to the new maximum
  };
  const SmoothConfig from = SmoothConfig::bursty(10, milliseconds(1000), milliseconds(1000));
  for (const Change& c : {Change{"rate", SmoothConfig::bursty(20, milliseconds(1000), milliseconds(1000)), 12},
                          Change{"burst", SmoothConfig::bursty(10, milliseconds(1000), milliseconds(2000)), 12},
                          Change{"period", SmoothConfig::bursty(10, milliseconds(2000), milliseconds(1000)), 3},
                          Change{"same", from, 6}}) {
    DistributedSmoothRateLimiter rl(client(), name(c.what), from);  // a new key starts full: 10 stored
    ASSERT_TRUE(rl.decide(4).allowed) << c.what;
    rl.setConfig(c.to);
    const Decision d = rl.peek();
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
    EXPECT_TRUE(d.allowed) << c.what << ": the debt owed (none) is kept";
  }
  // Without a configuration in the handle: the stored one, kept the same way.
  DistributedSmoothRateLimiter central(client(), name("central"));
  ASSERT_TRUE(central.trySetConfig(SmoothConfig::bursty(10, milliseconds(1000), milliseconds(0))));
  ASSERT_TRUE(central.tryAcquire(5)) << "free: granted, and the next caller pays 500 ms";
  central.setConfig(SmoothConfig::bursty(10, milliseconds(1000), milliseconds(0)));
  EXPECT_FALSE(central.tryAcquire()) << "the same configuration again: the debt is still owed";
}

// setConfig of the same configuration about every 10 ms under 4 deciding threads stays within each
// kind's bound.
TEST_F(OneKeyConfiguration, SetConfigUnderDecisionsStaysWithinTheBoundForEachKind) {
  {
    const auto [granted, seconds] =
        setConfigUnderDecisions<TokenBucketRateLimiter>(name("t"), bucket(10, 10, milliseconds(1000)));
    // The bound over the whole span (it only grows with the span, so a slow machine loosens it).
    EXPECT_LE(granted, 10 + static_cast<int>(10 * seconds) + 1) << "token bucket over " << seconds << " s";
    EXPECT_GE(granted, 10) << "the first burst at least";
  }
  {
    const auto [granted, seconds] =
        setConfigUnderDecisions<GcraRateLimiter>(name("g"), gcra(10, 10, milliseconds(1000)));
    EXPECT_LE(granted, 10 + static_cast<int>(10 * seconds) + 1) << "GCRA over " << seconds << " s";
    EXPECT_GE(granted, 10);
  }
  {
    // 10 per 200 ms window: every window the span touches (whole ones and the two ends) at most 10.
    const auto [granted, seconds] =
        setConfigUnderDecisions<FixedWindowRateLimiter>(name("w"), window(10, milliseconds(200)));
    EXPECT_LE(granted, 10 * (static_cast<int>(seconds / 0.2) + 2)) << "fixed window over " << seconds << " s";
    EXPECT_GE(granted, 10);
  }
  {
    // 10 per second, 1 s of burst: what is stored, the one the next caller pays for, the rate.
    const auto [granted, seconds] = setConfigUnderDecisions<DistributedSmoothRateLimiter>(
        name("s"), SmoothConfig::bursty(10, milliseconds(1000), milliseconds(1000)));
    EXPECT_LE(granted, 10 + 1 + static_cast<int>(10 * seconds) + 1) << "smooth over " << seconds << " s";
    EXPECT_GE(granted, 1);
  }
}

// --- The clock-step clamp ------------------------------------------------------------------------

// A stored time an hour (or 2^53-1 µs) ahead of the server's clock, as a server clock stepped back
// leaves it: the denial lasts one horizon plus one permit (GCRA, token bucket), never the step.
TEST_F(OneKeyConfiguration, AStoredTimeFarAheadIsClampedForGcraAndTheTokenBucket) {
  // 2 per 200 ms: T = 100 ms, burst x T = 200 ms, period 200 ms: the horizon is 200 ms, so TAT is
  // at most 400 ms ahead and one permit comes 300 ms after the clamp.
  for (const std::int64_t ahead : {kHour, std::int64_t{0}}) {
    for (const char kind : {'G', 'T'}) {
      SCOPED_TRACE(std::string(1, kind) + (ahead == 0 ? " 2^53-1" : " an hour"));
      const std::string key = name(std::string(1, kind) + std::to_string(ahead));
      set(key, gcraValue(kind, 2, 2, 200, ahead == 0 ? kTwo53Minus1 : now() + ahead));
      const Decision peeked =
          kind == 'G' ? GcraRateLimiter(client(), key).peek() : TokenBucketRateLimiter(client(), key).peek();
      EXPECT_FALSE(peeked.allowed);
      EXPECT_EQ(peeked.retryAfter.count(), 300000) << "peek (the full path)";
      const Decision d =
          kind == 'G' ? GcraRateLimiter(client(), key).decide() : TokenBucketRateLimiter(client(), key).decide();
      EXPECT_FALSE(d.allowed);
      EXPECT_EQ(d.retryAfter.count(), 300000) << "decide (the fast path)";
      EXPECT_EQ(d.resetAfter.count(), 400000);
      std::this_thread::sleep_for(std::min(d.retryAfter, microseconds(1000000)));  // no hour-long hang on failure
      EXPECT_TRUE(kind == 'G' ? GcraRateLimiter(client(), key).tryAcquire()
                              : TokenBucketRateLimiter(client(), key).tryAcquire())
          << "the denial wrote the clamped time back: the step is over";
    }
  }
}

// What legitimately puts TAT ahead (reservations, up to the horizon) is not clamped.
TEST_F(OneKeyConfiguration, ReservationsWithinTheHorizonAreNotClamped) {
  GcraRateLimiter rl(client(), name("r"));
  ASSERT_TRUE(rl.trySetConfig(gcra(2, 2, milliseconds(200))));  // the horizon is 200 ms
  ASSERT_TRUE(rl.decide(2).allowed);
  const Reservation r = rl.reserve(2, microseconds(10'000'000));
  ASSERT_TRUE(r.decision.allowed);
  EXPECT_GT(r.delay.count(), 190000) << "booked a whole burst ahead";
  const Decision d = rl.peek();
  EXPECT_GT(d.retryAfter.count(), 290000) << "the booking stands: TAT 400 ms ahead, the furthest legal";
  const Reservation further = rl.reserve(1, microseconds(10'000'000));
  EXPECT_FALSE(further.decision.allowed) << "beyond the horizon: refused, with when it fits";
  EXPECT_GT(further.decision.retryAfter.count(), 90000);
  EXPECT_LE(further.decision.retryAfter.count(), 100000);
  EXPECT_THROW(rl.refund(-1), InvalidArgument) << "a negative refund cannot push TAT ahead";
}

TEST_F(OneKeyConfiguration, AStoredWindowFarAheadIsClampedToTheNextWindow) {
  constexpr std::int64_t kWindowUs = 100000;  // 100 ms
  for (const bool extreme : {false, true}) {
    SCOPED_TRACE(extreme ? "2^53-1" : "an hour");
    const std::string key = name(extreme ? "x" : "h");
    const std::int64_t start = extreme ? kTwo53Minus1 - kTwo53Minus1 % kWindowUs : now() + kHour;
    set(key, windowValue(3, 100, start - start % kWindowUs, 3));
    FixedWindowRateLimiter rl(client(), key);
    const Decision d = rl.decide();
    EXPECT_FALSE(d.allowed);
    EXPECT_LE(d.retryAfter.count(), 2 * kWindowUs) << "the rest of this window and the next one, full";
    std::this_thread::sleep_for(std::min(d.retryAfter, microseconds(1000000)));  // no hour-long hang on failure
    EXPECT_TRUE(rl.tryAcquire()) << "the denial wrote the clamped window back";
  }
}

TEST_F(OneKeyConfiguration, ASmoothLimitersNextFreeTimeIsClampedToTheDebtOwedAtTheWrite) {
  const std::string key = name("s");
  // 10 per second; written with e = 17 (a debt of at most 2^17 - 1 µs), its next free time an hour ahead.
  set(key, smoothValue(10, 1000, 0, now() + kHour, 17));
  DistributedSmoothRateLimiter rl(client(), key);
  const Decision d = rl.decide();
  EXPECT_FALSE(d.allowed);
  EXPECT_LE(d.retryAfter.count(), 131071);
  std::this_thread::sleep_for(std::min(d.retryAfter, microseconds(1000000)));  // no hour-long hang on failure
  EXPECT_TRUE(rl.tryAcquire()) << "the refusal wrote the clamped time back";
  // The largest time a key may hold (2^52 - 1 µs), with the bound of a key that owed nothing.
  set(key, smoothValue(10, 1000, 0, (std::int64_t{1} << 52) - 1, 0));
  EXPECT_TRUE(rl.tryAcquire()) << "owed nothing at the write: free now";
  // A legitimate debt (Guava: the next caller pays for a big acquire) is kept whole.
  const Reservation big = rl.reserve(20, microseconds(10'000'000));
  ASSERT_TRUE(big.decision.allowed);
  const Decision after = rl.peek();
  EXPECT_GT(after.retryAfter.count(), 1'900'000) << "20 permits at 10/s: 2 s owed";
}

// --- a key holding another configuration than the call's: the change applies from the first take -

// Denied or granted, a take with another configuration than the key's writes the state kept under
// it (lib/gcra_core.lua's gcraRescale): the permits in use come back at the new rate from then on,
// so retryAfter is exact. Before, a denial wrote nothing: the permits kept coming back at the
// stored pace, and a retry at retryAfter was denied again (1/s -> 10/s: 100 ms, then 90 ms...).
TEST_F(OneKeyConfiguration, RetryAfterUnderAnotherConfigurationInTheCallIsExactForGcraAndTheTokenBucket) {
  const std::int64_t t0 = windowTime(1000, 0);
  for (const char kind : {'G', 'T'}) {
    struct Change {
      const char* what;
      LimiterConfig stored, call;
      std::int64_t permits, retry;
    };
    const Change changes[] = {
        {"rate up", {kind, 1, 1, 1000}, {kind, 1, 10, 1000}, 1, 100000},
        {"rate down", {kind, 1, 10, 1000}, {kind, 1, 1, 1000}, 1, 1000000},
        {"burst up", {kind, 3, 1, 1000}, {kind, 5, 1, 1000}, 3, 1000000},
        {"burst down", {kind, 5, 1, 1000}, {kind, 3, 1, 1000}, 1, 3000000},
        {"period up", {kind, 1, 1, 100}, {kind, 1, 1, 1000}, 1, 1000000},
        {"period down", {kind, 1, 1, 1000}, {kind, 1, 1, 100}, 1, 100000},
        {"rate in units of 1/7 us", {kind, 2, 3, 1000}, {kind, 2, 7, 1000}, 1, 142858},
    };
    for (const Change& c : changes) {
      SCOPED_TRACE(std::string(1, kind) + ": " + c.what);
      expectExactDenialUnderAnotherConfiguration(c.stored, c.call, t0, c.permits, c.retry);
    }
  }
}

// The same for the fixed window: the counts kept under the call's configuration are written by the
// denial, so they end with the new windows. Before, 3 per 1 s (full) asked as 3 per 100 ms was
// denied again at its retryAfter, until the stored 1 s window ended.
TEST_F(OneKeyConfiguration, RetryAfterUnderAnotherConfigurationInTheCallIsExactForTheFixedWindow) {
  const std::int64_t t0 = windowTime(1000, 250000);  // 250 ms into a second, 50 ms into 100 ms
  struct Change {
    const char* what;
    LimiterConfig stored, call;
    std::int64_t permits, retry;
  };
  const Change changes[] = {
      {"shorter window", {'W', 3, 0, 1000}, {'W', 3, 0, 100}, 1, 50000},
      {"longer window", {'W', 3, 0, 100}, {'W', 3, 0, 1000}, 1, 750000},
      {"lower limit", {'W', 3, 0, 1000}, {'W', 2, 0, 1000}, 1, 750000},
      {"higher limit", {'W', 3, 0, 1000}, {'W', 4, 0, 1000}, 2, 750000},
  };
  for (const Change& c : changes) {
    SCOPED_TRACE(c.what);
    expectExactDenialUnderAnotherConfiguration(c.stored, c.call, t0, c.permits, c.retry);
  }
}

// MultiLimit with the configurations in the call: a denial writes every limit whose key held
// another configuration, so the combined retryAfter is exact.
TEST_F(OneKeyConfiguration, MultiLimitRetryAfterUnderAnotherConfigurationInTheCallIsExact) {
  const std::int64_t t0 = windowTime(1000, 250000);
  struct Change {
    const char* what;
    LimiterConfig storedG, storedW, callG, callW;
    std::int64_t retry;
  };
  const Change changes[] = {
      {"faster", {'G', 1, 1, 1000}, {'W', 3, 0, 1000}, {'G', 1, 1, 100}, {'W', 3, 0, 100}, 100000},
      {"slower", {'G', 1, 1, 100}, {'W', 3, 0, 100}, {'G', 1, 1, 1000}, {'W', 3, 0, 1000}, 1000000},
  };
  for (const Change& c : changes) {
    SCOPED_TRACE(c.what);
    const std::string tag = "{" + name(c.what) + "}";
    const std::vector<std::string> keys{tag + ":g", tag + ":w"};
    (void)runOneKey(admin(), detail::lua::gcra, keys[0], setArgs(c.storedG, t0, 0));
    (void)runOneKey(admin(), detail::lua::fixed_window, keys[1], setArgs(c.storedW, t0, 0));
    ASSERT_TRUE(
        takeReply(runOneKey(admin(), detail::lua::fixed_window, keys[1], {"take", str(t0), "W", "3", "0"})).allowed);
    const auto multi = [&](const std::string& op, std::int64_t at) {
      return runMulti(admin(), keys, {op, str(at), "GW", "1", "0", header(c.callG), header(c.callW)});
    };
    const Reply denied = multi("take", t0);
    ASSERT_EQ(denied.elements[0].asInteger(), 0);
    const std::int64_t r = denied.elements[2].asInteger();
    EXPECT_EQ(r, c.retry);

    const Reply peeked = multi("peek", t0);
    for (const std::size_t field : {0U, 1U, 2U, 3U}) {
      EXPECT_EQ(peeked.elements[field].asInteger(), denied.elements[field].asInteger()) << "field " << field;
    }
    const std::int64_t reset = denied.elements[3].asInteger();
    ASSERT_GT(reset, 0);
    const auto full = [&](const Reply& m, std::size_t i) {  // limit i: remaining == its limit
      return m.elements[8 + 7 * i + 1].asInteger() == m.elements[8 + 7 * i + 4].asInteger();
    };
    const Reply justBefore = multi("peek", t0 + reset - 1);
    EXPECT_FALSE(full(justBefore, 0) && full(justBefore, 1)) << "resetAfter " << reset << " us";
    const Reply atReset = multi("peek", t0 + reset);
    EXPECT_TRUE(full(atReset, 0) && full(atReset, 1)) << "resetAfter " << reset << " us";

    EXPECT_EQ(multi("take", t0 + r - 1).elements[0].asInteger(), 0) << "retryAfter " << r << " us";
    EXPECT_EQ(multi("take", t0 + r).elements[0].asInteger(), 1) << "retryAfter " << r << " us";
  }
}

// --- MultiLimit with the configurations in the call ----------------------------------------------

TEST_F(OneKeyConfiguration, MultiLimitSendsTheConfigurationsOfHandlesMadeWithThem) {
  const std::string user = "{" + name("tag") + "}:user";
  const std::string tenant = "{" + name("tag") + "}:tenant";
  GcraRateLimiter perUser(client(), user, gcra(2, 1, milliseconds(10000)));
  FixedWindowRateLimiter perTenant(client(), tenant, window(3, GcraRateLimiter::kMaxInterval));
  MultiLimitOptions allow;
  allow.failure.policy = FailurePolicy::Allow;
  MultiLimit both({perUser, perTenant}, allow);
  const MultiDecision first = both.decide();
  ASSERT_TRUE(first.allowed) << "no trySetConfig: the keys are written with the grant";
  EXPECT_FALSE(first.byPolicy);
  EXPECT_EQ(first.limits[0].remaining, 1);
  EXPECT_EQ(first.limits[1].remaining, 2);
  EXPECT_GT(pttl(user), 0);
  EXPECT_GT(pttl(tenant), 0);
  ASSERT_TRUE(both.decide().allowed);
  const MultiDecision third = both.decide();
  EXPECT_FALSE(third.allowed);
  EXPECT_EQ(third.deniedBy, 0U);
  EXPECT_EQ(perTenant.peek().remaining, 1) << "all or nothing: the tenant gave nothing";
  EXPECT_THROW((void)both.decide(3), InvalidArgument) << "above the user's burst, before sending";

  // A key holding another configuration keeps its permits in use; a key without one is full.
  (void)raw({"DEL", user});
  GcraRateLimiter older(client(), user);
  older.setConfig(gcra(4, 1, milliseconds(10000)));
  ASSERT_TRUE(older.decide(3).allowed);
  const MultiDecision kept = both.decide();
  EXPECT_FALSE(kept.allowed) << "3 in use of the handle's burst of 2";
  both.refund(1);
  EXPECT_EQ(perTenant.peek().remaining, 2);

  // Mixed with a limiter whose configuration is stored.
  const std::string stored = "{" + name("tag") + "}:stored";
  GcraRateLimiter central(client(), stored);
  MultiLimit mixed({perTenant, central});
  EXPECT_THROW((void)mixed.decide(), NotInitializedError);
  ASSERT_TRUE(central.trySetConfig(gcra(5, 1, milliseconds(10000))));
  EXPECT_TRUE(mixed.decide().allowed);
}
