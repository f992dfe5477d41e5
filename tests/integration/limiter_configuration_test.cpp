// Limiter's configuration in the keys against a real redis-server: setPolicy of a stored policy
// that keeps the state for every algorithm, the clock-step clamp, a configuration in the call other
// than the key's (the scripts driven at chosen times), and MultiLimit with policies in the call.
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
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
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

class LimiterConfiguration : public RedisTest {
 protected:
  std::int64_t now() { return serverTimeUs(admin()); }
  void set(const std::string& key, const std::string& value) { (void)raw({"SET", key, value}); }
  std::int64_t pttl(const std::string& key) { return raw({"PTTL", key}).integer; }

  /// A Limiter named `suffix` whose `policy` is stored in its keys (trySetPolicy, setPolicy).
  // Its denials are not remembered: the tests write keys' state by hand, and the next call must
  // reach Redis.
  Limiter storedLimiter(const Policy& policy, const std::string& suffix = "l") {
    Limiter::Options o;
    o.denyCacheKeys = 0;
    return Limiter(client(), limiterName(suffix), policy.stored(), o);
  }

  // setPolicy("k", p) about every 10 ms for ~1 s while 4 threads (each its own Client) decide one
  // permit at a time: the permits granted, and the span in seconds.
  std::pair<int, double> setPolicyUnderDecisions(const std::string& suffix, const Policy& p) {
    Limiter rl = storedLimiter(p, suffix);
    rl.setPolicy("k", p.stored());
    std::atomic<bool> stop{false};
    std::atomic<int> granted{0};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> deciders;
    for (int t = 0; t < 4; ++t) {
      deciders.emplace_back([&, mine = Limiter(newClient(), rl.name(), p.stored())]() mutable {
        while (!stop.load()) {
          if (mine.tryAcquire("k")) granted.fetch_add(1);
        }
      });
    }
    for (int i = 0; i < 100; ++i) {
      rl.setPolicy("k", p.stored());
      sleepMs(10);
    }
    stop.store(true);
    for (auto& t : deciders) t.join();
    return {granted.load(), static_cast<double>(msSince(start)) / 1000.0};
  }

  /// `op` ("take" or "peek") of n permits on `key` at nowUs, with `cfg` in the call (gcra.lua or
  /// fixed_window.lua, as a Limiter sends it).
  TakeReply withConfigAt(const std::string& op, const std::string& key, const LimiterConfig& cfg, std::int64_t nowUs,
                         std::int64_t n) {
    const std::string kind(1, cfg.kind);
    return takeReply(runOneKey(admin(), scriptOf(kind), key, {op, str(nowUs), kind, str(n), "0", header(cfg)}));
  }

  /// Whether `script` would grant one permit of `rl`'s key "k" (stored policy, kind `kind`) at the
  /// server time atUs: its peek, which writes nothing, at that time instead of a sleep until then.
  bool peekAllowedAt(const detail::lua::EmbeddedScript& script, const Limiter& rl, char kind, std::int64_t atUs) {
    return takeReply(runOneKey(admin(), script, rl.redisKey("k"), {"peek", str(atUs), std::string(1, kind), "1"}))
        .allowed;
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

// --- A stored policy -------------------------------------------------------------------------------

// A key without a stored configuration: NotInitializedError, also under Allow (the failure policy
// decides outages, not a missing configuration).
TEST_F(LimiterConfiguration, AKeyWithoutAStoredPolicyIsNotInitializedEvenUnderAllow) {
  Limiter::Options allow;
  allow.failure.policy = FailurePolicy::Allow;
  Limiter plain(client(), limiterName("unset"), Policy::gcra(1, milliseconds(10000), 10).stored(), allow);
  EXPECT_THROW((void)plain.decide("k"), NotInitializedError);
  EXPECT_EQ(plain.failureStats().allowed, 0U);
}

// --- setPolicy keeps the state; the concurrency bound for each algorithm ----------------------------

// setPolicy keeps the permits in use for the token bucket and GCRA, on a change of rate, of period
// and of burst; the same policy again changes nothing.
TEST_F(LimiterConfiguration, SetPolicyKeepsThePermitsInUse) {
  struct Change {
    const char* what;
    Policy to;
    std::int64_t remaining;  // after 6 of 10 were taken and one more now
  };
  const Policy from = Policy::gcra(1, milliseconds(10000), 10).stored();
  for (const Change& c :
       {Change{"rate", Policy::gcra(2, milliseconds(10000), 10).stored(), 3},
        Change{"period", Policy::gcra(1, milliseconds(20000), 10).stored(), 3},
        Change{"burst", Policy::gcra(1, milliseconds(10000), 20).stored(), 13}, Change{"same", from, 3}}) {
    Limiter rl = storedLimiter(from, c.what);
    rl.setPolicy("k", from);
    ASSERT_TRUE(rl.decide("k", 6).allowed) << c.what;
    rl.setPolicy("k", c.to);
    const Decision d = rl.decide("k");
    EXPECT_TRUE(d.allowed) << c.what;
    EXPECT_EQ(d.limit, c.to.limit()) << c.what;
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
  }
  const Policy bucket = Policy::tokenBucket(10, 1, milliseconds(10000)).stored();
  Limiter bucketed = storedLimiter(bucket, "bucket");
  bucketed.setPolicy("k", bucket);
  ASSERT_TRUE(bucketed.decide("k", 10).allowed);
  bucketed.setPolicy("k", bucket);
  EXPECT_FALSE(bucketed.tryAcquire("k")) << "the same policy does not refill";
}

TEST_F(LimiterConfiguration, FixedWindowSetPolicyKeepsTheCounts) {
  struct Change {
    const char* what;
    Policy to;
    bool allowed;
    std::int64_t remaining;  // after 6 of 10 were taken and one more asked for now
  };
  // Windows of 24.8 and 49.7 days (aligned to the epoch): a window's start falls inside the test
  // about once in ten million runs (an hour-long window: once in 20 000).
  constexpr milliseconds kLong{4294967295};
  constexpr milliseconds kHalf = kLong / 2;
  const Policy from = Policy::fixedWindow(10, kHalf).stored();
  for (const Change& c :
       {Change{"limit up", Policy::fixedWindow(20, kHalf).stored(), true, 13},
        Change{"limit down", Policy::fixedWindow(4, kHalf).stored(), false, 0},
        Change{"window", Policy::fixedWindow(10, kLong).stored(), true, 3}, Change{"same", from, true, 3}}) {
    Limiter rl = storedLimiter(from, c.what);
    rl.setPolicy("k", from);
    ASSERT_TRUE(rl.decide("k", 6).allowed) << c.what;
    rl.setPolicy("k", c.to);
    const Decision d = rl.decide("k");
    EXPECT_EQ(d.limit, c.to.limit()) << c.what;
    EXPECT_EQ(d.allowed, c.allowed) << c.what;
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
  }
}

TEST_F(LimiterConfiguration, SmoothSetPolicyScalesTheStoredPermits) {
  struct Change {
    const char* what;
    Policy to;
    std::int64_t remaining;  // stored: 6 of 10, scaled to the new maximum
  };
  const Policy from = Policy::smoothBursty(10, milliseconds(1000), milliseconds(1000));
  for (const Change& c : {Change{"rate", Policy::smoothBursty(20, milliseconds(1000), milliseconds(1000)), 12},
                          Change{"burst", Policy::smoothBursty(10, milliseconds(1000), milliseconds(2000)), 12},
                          Change{"period", Policy::smoothBursty(10, milliseconds(2000), milliseconds(1000)), 3},
                          Change{"same", from, 6}}) {
    // The policy in the call first (a new key starts full: 10 stored), then stored over the same
    // key by a Limiter of the same name.
    Limiter inCall(client(), limiterName(c.what), from);
    ASSERT_TRUE(inCall.decide("k", 4).allowed) << c.what;
    Limiter rl(client(), inCall.name(), from.stored());
    rl.setPolicy("k", c.to.stored());
    const Decision d = rl.peek("k");
    EXPECT_EQ(d.remaining, c.remaining) << c.what;
    EXPECT_TRUE(d.allowed) << c.what << ": the debt owed (none) is kept";
  }
  // Stored from the start: kept the same way.
  const Policy strict = Policy::smoothBursty(10, milliseconds(1000), milliseconds(0)).stored();
  Limiter central = storedLimiter(strict, "central");
  ASSERT_TRUE(central.trySetPolicy("k"));
  ASSERT_TRUE(central.tryAcquire("k", 5)) << "free: granted, and the next caller pays 500 ms";
  central.setPolicy("k", strict);
  EXPECT_FALSE(central.tryAcquire("k")) << "the same policy again: the debt is still owed";
}

// setPolicy of the same policy about every 10 ms under 4 deciding threads stays within each
// algorithm's bound.
TEST_F(LimiterConfiguration, SetPolicyUnderDecisionsStaysWithinTheBoundForEachAlgorithm) {
  {
    const auto [granted, seconds] = setPolicyUnderDecisions("t", Policy::tokenBucket(10, 10, milliseconds(1000)));
    // The bound over the whole span (it only grows with the span, so a slow machine loosens it).
    EXPECT_LE(granted, 10 + static_cast<int>(10 * seconds) + 1) << "token bucket over " << seconds << " s";
    EXPECT_GE(granted, 10) << "the first burst at least";
  }
  {
    const auto [granted, seconds] = setPolicyUnderDecisions("g", Policy::gcra(10, milliseconds(1000), 10));
    EXPECT_LE(granted, 10 + static_cast<int>(10 * seconds) + 1) << "GCRA over " << seconds << " s";
    EXPECT_GE(granted, 10);
  }
  {
    // 10 per 200 ms window: every window the span touches (whole ones and the two ends) at most 10.
    const auto [granted, seconds] = setPolicyUnderDecisions("w", Policy::fixedWindow(10, milliseconds(200)));
    EXPECT_LE(granted, 10 * (static_cast<int>(seconds / 0.2) + 2)) << "fixed window over " << seconds << " s";
    EXPECT_GE(granted, 10);
  }
  {
    // 10 per second, 1 s of burst: what is stored, the one the next caller pays for, the rate.
    const auto [granted, seconds] =
        setPolicyUnderDecisions("s", Policy::smoothBursty(10, milliseconds(1000), milliseconds(1000)));
    EXPECT_LE(granted, 10 + 1 + static_cast<int>(10 * seconds) + 1) << "smooth over " << seconds << " s";
    EXPECT_GE(granted, 1);
  }
}

// --- The clock-step clamp ------------------------------------------------------------------------

// A stored time an hour (or 2^53-1 µs) ahead of the server's clock, as a server clock stepped back
// leaves it: the denial lasts one horizon plus one permit (GCRA, token bucket), never the step.
TEST_F(LimiterConfiguration, AStoredTimeFarAheadIsClampedForGcraAndTheTokenBucket) {
  // 2 per 200 ms: T = 100 ms, burst x T = 200 ms, period 200 ms: the horizon is 200 ms, so TAT is
  // at most 400 ms ahead and one permit comes 300 ms after the clamp.
  for (const std::int64_t ahead : {kHour, std::int64_t{0}}) {
    for (const char kind : {'G', 'T'}) {
      SCOPED_TRACE(std::string(1, kind) + (ahead == 0 ? " 2^53-1" : " an hour"));
      Limiter rl = storedLimiter(
          kind == 'G' ? Policy::gcra(2, milliseconds(200), 2) : Policy::tokenBucket(2, 2, milliseconds(200)),
          std::string(1, kind) + std::to_string(ahead));
      set(rl.redisKey("k"), gcraValue(kind, 2, 2, 200, ahead == 0 ? kTwo53Minus1 : now() + ahead));
      const Decision peeked = rl.peek("k");
      EXPECT_FALSE(peeked.allowed);
      EXPECT_EQ(peeked.retryAfter.count(), 300000) << "peek (the full path)";
      const Decision d = rl.decide("k");
      EXPECT_FALSE(d.allowed);
      EXPECT_EQ(d.retryAfter.count(), 300000) << "decide (the fast path)";
      EXPECT_EQ(d.resetAfter.count(), 400000);
      // The denial wrote the clamped time back: at the retry time the permit is there (a key still
      // an hour ahead would be clamped again at that time, and denied).
      const std::int64_t at = d.time.count() + d.retryAfter.count();
      EXPECT_FALSE(peekAllowedAt(detail::lua::gcra, rl, kind, at - 1));
      EXPECT_TRUE(peekAllowedAt(detail::lua::gcra, rl, kind, at)) << "the step is over";
    }
  }
}

// What legitimately puts TAT ahead (reservations, up to the horizon) is not clamped.
TEST_F(LimiterConfiguration, ReservationsWithinTheHorizonAreNotClamped) {
  Limiter rl = storedLimiter(Policy::gcra(2, milliseconds(200), 2), "r");
  ASSERT_TRUE(rl.trySetPolicy("k"));  // the horizon is 200 ms
  const Decision first = rl.decide("k", 2);
  ASSERT_TRUE(first.allowed);
  // Each call is decided at the server's time, which moves on between the calls (more so on a
  // loaded machine): the expectations count from the first one's time, as the script does.
  const auto since = [&](const Decision& x) { return x.time.count() - first.time.count(); };
  const Decision r = rl.reserve("k", 2, microseconds(10'000'000));
  ASSERT_TRUE(r.allowed);
  EXPECT_EQ(r.delay.count(), 200000 - since(r)) << "booked a whole burst ahead";
  const Decision d = rl.peek("k");
  EXPECT_EQ(d.retryAfter.count(), 300000 - since(d)) << "the booking stands: TAT 400 ms ahead, the furthest legal";
  const Decision further = rl.reserve("k", 1, microseconds(10'000'000));
  EXPECT_FALSE(further.allowed) << "beyond the horizon: refused, with when it fits";
  EXPECT_EQ(further.retryAfter.count(), 100000 - since(further));
  EXPECT_THROW(rl.refund("k", -1), InvalidArgument) << "a negative refund cannot push TAT ahead";
}

TEST_F(LimiterConfiguration, AStoredWindowFarAheadIsClampedToTheNextWindow) {
  constexpr std::int64_t kWindowUs = 100000;  // 100 ms
  for (const bool extreme : {false, true}) {
    SCOPED_TRACE(extreme ? "2^53-1" : "an hour");
    Limiter rl = storedLimiter(Policy::fixedWindow(3, milliseconds(100)), extreme ? "x" : "h");
    const std::int64_t start = extreme ? kTwo53Minus1 - kTwo53Minus1 % kWindowUs : now() + kHour;
    set(rl.redisKey("k"), windowValue(3, 100, start - start % kWindowUs, 3));
    const Decision d = rl.decide("k");
    EXPECT_FALSE(d.allowed);
    EXPECT_LE(d.retryAfter.count(), 2 * kWindowUs) << "the rest of this window and the next one, full";
    // The denial wrote the clamped window back: its successor opens at the retry time.
    const std::int64_t at = d.time.count() + d.retryAfter.count();
    EXPECT_FALSE(peekAllowedAt(detail::lua::fixed_window, rl, 'W', at - 1));
    EXPECT_TRUE(peekAllowedAt(detail::lua::fixed_window, rl, 'W', at)) << "the clamped window was written back";
  }
}

TEST_F(LimiterConfiguration, ASmoothKeysNextFreeTimeIsClampedToTheDebtOwedAtTheWrite) {
  Limiter rl = storedLimiter(Policy::smoothBursty(10, milliseconds(1000), milliseconds(0)), "s");
  const std::string key = rl.redisKey("k");
  // 10 per second; written with e = 17 (a debt of at most 2^17 - 1 µs), its next free time an hour ahead.
  set(key, smoothValue(10, 1000, 0, now() + kHour, 17));
  const Decision d = rl.decide("k");
  EXPECT_FALSE(d.allowed);
  EXPECT_LE(d.retryAfter.count(), 131071);
  // The refusal wrote the clamped time back: at the retry time the permit is there.
  const std::int64_t at = d.time.count() + d.retryAfter.count();
  EXPECT_FALSE(peekAllowedAt(detail::lua::smooth, rl, 'S', at - 1));
  EXPECT_TRUE(peekAllowedAt(detail::lua::smooth, rl, 'S', at)) << "the clamped time was written back";
  // The largest time a key may hold (2^52 - 1 µs), with the bound of a key that owed nothing.
  set(key, smoothValue(10, 1000, 0, (std::int64_t{1} << 52) - 1, 0));
  EXPECT_TRUE(rl.tryAcquire("k")) << "owed nothing at the write: free now";
  // A legitimate debt (Guava: the next caller pays for a big acquire) is kept whole.
  const Decision big = rl.reserve("k", 20, microseconds(10'000'000));
  ASSERT_TRUE(big.allowed);
  const Decision after = rl.peek("k");
  EXPECT_GT(after.retryAfter.count(), 1'900'000) << "20 permits at 10/s: 2 s owed";
}

// --- a key holding another configuration than the call's: the change applies from the first take -

// Denied or granted, a take with another configuration than the key's writes the state kept under
// it (lib/gcra_core.lua's gcraRescale): the permits in use come back at the new rate from then on,
// so retryAfter is exact. Before, a denial wrote nothing: the permits kept coming back at the
// stored pace, and a retry at retryAfter was denied again (1/s -> 10/s: 100 ms, then 90 ms...).
TEST_F(LimiterConfiguration, RetryAfterUnderAnotherConfigurationInTheCallIsExactForGcraAndTheTokenBucket) {
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
TEST_F(LimiterConfiguration, RetryAfterUnderAnotherConfigurationInTheCallIsExactForTheFixedWindow) {
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
TEST_F(LimiterConfiguration, MultiLimitRetryAfterUnderAnotherConfigurationInTheCallIsExact) {
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

TEST_F(LimiterConfiguration, MultiLimitSendsThePoliciesOfItsLimiters) {
  const std::shared_ptr<Client> patient = patientClient();
  Limiter perUser(patient, limiterName("user"), Policy::gcra(1, milliseconds(10000), 2));
  Limiter perTenant(patient, limiterName("tenant"), Policy::fixedWindow(3, milliseconds(4294967295)));
  MultiLimit::Options allow;
  allow.failure.policy = FailurePolicy::Allow;
  const std::string user = "{" + name("tag") + "}u";
  const std::string tenant = "{" + name("tag") + "}t";
  MultiLimit both = MultiLimit({perUser, perTenant}, allow).on({user, tenant});
  const MultiDecision first = both.decide();
  ASSERT_TRUE(first.allowed) << "no set-up: the keys are written with the grant";
  EXPECT_FALSE(first.byPolicy);
  EXPECT_EQ(first.limits[0].remaining, 1);
  EXPECT_EQ(first.limits[1].remaining, 2);
  EXPECT_GT(pttl(perUser.redisKey(user)), 0);
  EXPECT_GT(pttl(perTenant.redisKey(tenant)), 0);
  ASSERT_TRUE(both.decide().allowed);
  const MultiDecision third = both.decide();
  EXPECT_FALSE(third.allowed);
  EXPECT_EQ(third.deniedBy, 0U);
  EXPECT_EQ(perTenant.peek(tenant).remaining, 1) << "all or nothing: the tenant gave nothing";
  EXPECT_THROW((void)both.decide(3), InvalidArgument) << "above the user's burst, before sending";

  // A key holding another policy of the same algorithm keeps its permits in use.
  (void)raw({"DEL", perUser.redisKey(user)});
  Limiter older(client(), perUser.name(), Policy::gcra(1, milliseconds(10000), 4));
  ASSERT_TRUE(older.decide(user, 3).allowed);
  const MultiDecision kept = both.decide();
  EXPECT_FALSE(kept.allowed) << "3 in use of the policy's burst of 2";
  both.refund(1);
  EXPECT_EQ(perTenant.peek(tenant).remaining, 2);
}
