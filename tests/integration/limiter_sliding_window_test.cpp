// Limiter under Policy::slidingWindow (lua/sliding_window.lua, lib/sliding_window_core.lua) against a
// real redis-server: the weighted estimate, its exact retryAfter, the documented worst case reached
// by a sequence, and what the policy refuses before anything is sent. Its place in a MultiLimit is
// in multi_limit_test.cpp.
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "one_key_support.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit_test/expect_error.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

class LimiterSlidingWindow : public RedisTest {
 protected:
  /// The configuration in the call: the key's 13-byte header ('V', L, W ms, keepAlive ms).
  static std::string config(std::int64_t limit, std::int64_t windowMs) {
    std::string out(1, 'V');
    for (const std::int64_t v : {limit, windowMs, std::int64_t{0}}) putLe(out, v, 4);
    return out;
  }
  /// `op` ("take" or "peek") of n permits on `key` at nowUs (epoch µs), as a Limiter sends it.
  TakeReply at(const std::string& op, const std::string& key, std::int64_t nowUs, std::int64_t n,
               const std::string& cfg) {
    return takeReply(runOneKey(admin(), detail::lua::sliding_window, key, {op, str(nowUs), "V", str(n), "0", cfg}));
  }

  /// The most permits a greedy caller gets into the W-long interval [start - 1 µs, start + W - 1 µs)
  /// of a limit of `limit` per `windowMs`, `start` a window's start: all of the previous window's
  /// limit at its last µs, then at each time everything the estimate leaves, going on to the
  /// time its retryAfter names.
  std::int64_t greedyMostInOneWindow(std::int64_t limit, std::int64_t windowMs) {
    const std::string key = name("greedy" + str(limit) + "." + str(windowMs));
    const std::string cfg = config(limit, windowMs);
    const std::int64_t wus = windowMs * 1000;
    const std::int64_t start = windowTime(windowMs, 0);
    EXPECT_TRUE(at("take", key, start - 1, limit, cfg).allowed) << "the previous window takes its whole limit";
    std::int64_t taken = limit;
    for (std::int64_t t = start; t <= start + wus - 2;) {
      const TakeReply look = at("peek", key, t, 1, cfg);
      if (look.allowed) {
        const TakeReply got = at("take", key, t, look.remaining, cfg);
        EXPECT_TRUE(got.allowed) << "at +" << (t - start) << " µs the estimate left " << look.remaining;
        taken += look.remaining;
        continue;  // the same time again: nothing is left, and the denial says when
      }
      EXPECT_GT(look.retryAfterUs, 0);
      EXPECT_FALSE(at("peek", key, t + look.retryAfterUs - 1, 1, cfg).allowed) << "retryAfter is exact";
      t += look.retryAfterUs;
    }
    return taken;
  }
};

// The bound of docs/algorithms.md: any W-long interval holds at most L + floor(L x (W - 2 µs) / W).
std::int64_t documentedWorstCase(std::int64_t limit, std::int64_t windowMs) {
  const std::int64_t wus = windowMs * 1000;
  return limit + limit * (wus - 2) / wus;
}

TEST_F(LimiterSlidingWindow, AGreedyCallerReachesTheDocumentedWorstCaseAndNoMore) {
  EXPECT_EQ(documentedWorstCase(10, 1000), 19);  // 2L - 1 while W >= 2L µs
  EXPECT_EQ(greedyMostInOneWindow(10, 1000), 19);
  EXPECT_EQ(documentedWorstCase(7, 3), 13);
  EXPECT_EQ(greedyMostInOneWindow(7, 3), 13);
  EXPECT_EQ(documentedWorstCase(1000, 1), 1998);  // W < 2L µs: 2L - 2
  EXPECT_EQ(greedyMostInOneWindow(1000, 1), 1998);
}

TEST_F(LimiterSlidingWindow, WeighsThePreviousWindowByItsOverlapWithAnExactRetryAfter) {
  const std::string key = name("k");
  const std::string cfg = config(10, 1000);
  const std::int64_t start = windowTime(1000, 0);
  ASSERT_TRUE(at("take", key, start + 500000, 8, cfg).allowed);
  // A quarter into the next window: 8 x 3/4 = 6 of the previous window still count.
  const std::int64_t t = start + 1000000 + 250000;
  const TakeReply look = at("peek", key, t, 1, cfg);
  EXPECT_TRUE(look.allowed);
  EXPECT_EQ(look.remaining, 4);
  EXPECT_TRUE(at("take", key, t, 4, cfg).allowed);
  const TakeReply denied = at("take", key, t, 1, cfg);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 0);
  // 8 x (W - e) <= (10 - 4 - 1) x W from e = 3/8 W: 375 000 µs into the window.
  EXPECT_EQ(denied.retryAfterUs, 125000);
  EXPECT_EQ(denied.resetAfterUs, 2000000 - 250000) << "the 4 count until the window after this one ends";
  EXPECT_FALSE(at("take", key, t + 124999, 1, cfg).allowed);
  EXPECT_TRUE(at("take", key, t + 125000, 1, cfg).allowed);
}

TEST_F(LimiterSlidingWindow, TakeAnswersAsPeekDoesAtEveryStep) {
  // take's fast path (lua/sliding_window.lua, above its include line) against peek, which the
  // full code answers (lib/sliding_window_core.lua): random calls across many short windows.
  std::mt19937_64 rng(7);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    const std::int64_t limit = 1 + static_cast<std::int64_t>(rng() % 30);
    const std::int64_t windowMs = 1 + static_cast<std::int64_t>(rng() % 50);
    const std::string key = name("k" + str(round));
    const std::string cfg = config(limit, windowMs);
    std::int64_t t = windowTime(windowMs, 0);
    for (int step = 0; step < 300; ++step) {
      SCOPED_TRACE(step);
      t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(windowMs * 300));
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(limit));
      const TakeReply look = at("peek", key, t, n, cfg);
      const TakeReply took = at("take", key, t, n, cfg);
      ASSERT_EQ(took.allowed, look.allowed);
      EXPECT_EQ(took.retryAfterUs, look.retryAfterUs);
      EXPECT_EQ(took.limit, look.limit);
      const TakeReply after = at("peek", key, t, 1, cfg);
      EXPECT_EQ(took.remaining, after.remaining);
      EXPECT_EQ(took.resetAfterUs, after.resetAfterUs);
      if (!took.allowed) {
        EXPECT_EQ(took.remaining, look.remaining);
      }
    }
  }
}

TEST_F(LimiterSlidingWindow, StaysExactWithTheLargestLimitAndWindow) {
  // L = W (ms) = 2^32 - 1: the rule's products reach 2^74; the script computes them in two parts.
  const std::int64_t limit = 4294967295, windowMs = 4294967295, wus = windowMs * 1000;
  const std::string key = name("k");
  const std::string cfg = config(limit, windowMs);
  const std::int64_t start = windowTime(windowMs, 0);
  const std::int64_t prev = limit - 12345;
  ASSERT_TRUE(at("take", key, start - 1, prev, cfg).allowed);
  const std::int64_t t = start + 1234567;  // µs into the next window
  __extension__ typedef __int128 Wide;     // exact products of up to 74 bits
  const auto ceilDiv = [](Wide a, Wide b) { return static_cast<std::int64_t>((a + b - 1) / b); };
  const std::int64_t weighted = ceilDiv(Wide{prev} * (wus - 1234567), wus);
  const TakeReply look = at("peek", key, t, 1, cfg);
  EXPECT_EQ(look.remaining, limit - weighted);
  ASSERT_TRUE(at("take", key, t, look.remaining, cfg).allowed);
  const TakeReply denied = at("take", key, t, 1000, cfg);
  EXPECT_FALSE(denied.allowed);
  // prev x (W - e) <= (L - count - 1000) x W from W - e <= floor((L - count - 1000) x W / prev).
  const std::int64_t a = limit - look.remaining - 1000;
  const auto most = static_cast<std::int64_t>(Wide{a} * wus / prev);
  EXPECT_EQ(denied.retryAfterUs, start + wus - most - t);
  EXPECT_FALSE(at("peek", key, t + denied.retryAfterUs - 1, 1000, cfg).allowed);
  EXPECT_TRUE(at("peek", key, t + denied.retryAfterUs, 1000, cfg).allowed);
}

TEST_F(LimiterSlidingWindow, DecidesEachKeyWithTheLimitInTheCallAndExpiresIdleKeys) {
  // A window of 49.7 days: nothing of it ends during the test.
  Limiter rl(client(), limiterName(), Policy::slidingWindow(3, milliseconds(4294967295)));
  EXPECT_EQ(rl.policy().limit(), 3);
  const Decision first = rl.decide("a", 2);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 1);
  EXPECT_EQ(first.limit, 3);
  EXPECT_TRUE(rl.tryAcquire("a"));
  const Decision denied = rl.decide("a");
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_FALSE(denied.byPolicy);
  EXPECT_TRUE(rl.tryAcquire("b", 3)) << "each key its own counter";
  EXPECT_EQ(rl.peek("a").remaining, 0);
  rl.refund("a", 2);
  EXPECT_EQ(rl.peek("a").remaining, 2);

  const Reply value = raw({"GET", rl.redisKey("a")});
  ASSERT_EQ(value.str.size(), 28U) << "one key of 28 bytes";
  EXPECT_EQ(value.str.front(), 'V');
  // kDefaultIdleMargin: the key lives until its permits stop counting, then 1 s more.
  const std::int64_t ttl = raw({"PTTL", rl.redisKey("a")}).asInteger();
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, std::chrono::duration_cast<milliseconds>(first.resetAfter).count() + 1000 + 1);
}

TEST_F(LimiterSlidingWindow, SettleGivesBackToTheWindowThePermitsWereCountedIn) {
  const std::string key = name("k");
  const std::string record = name("k") + ":rsv:r1";
  const std::string cfg = config(10, 1000);
  const std::int64_t start = windowTime(1000, 0);
  const auto run = [&](const std::vector<std::string>& args) {
    return runScript(admin(), detail::lua::sliding_window, {key, record}, args);
  };
  const Reply held = run({"reserve", str(start + 100000), "V", "6", "60000", cfg});
  ASSERT_EQ(held.elements.at(0).asInteger(), 1);
  EXPECT_EQ(held.elements.at(1).asInteger(), 4);
  EXPECT_EQ(run({"reserve", str(start + 100001), "V", "6", "60000", cfg}).elements.at(9).asInteger(), 1)
      << "the same id answers the first grant again";
  // Half into the next window the 6 count as the previous window's, at half weight.
  const std::int64_t later = start + 1000000 + 500000;
  EXPECT_EQ(at("peek", key, later, 1, cfg).remaining, 7);
  const Reply settled = run({"settle", str(later), "V", "2", "0", cfg});
  ASSERT_EQ(settled.elements.size(), 7U);
  EXPECT_EQ(settled.elements[0].asInteger(), 1);
  EXPECT_EQ(settled.elements[3].asInteger(), 4) << "returned to the previous window";
  EXPECT_EQ(settled.elements[6].asInteger(), 9) << "10 - ceil(2 x 1/2)";
  EXPECT_EQ(at("peek", key, later, 1, cfg).remaining, 9);
  EXPECT_EQ(run({"settle", str(later), "V", "2", "0", cfg}).elements[0].asInteger(), 2) << "settled once";
}

TEST_F(LimiterSlidingWindow, RefusesWaitingAndStoringBeforeSending) {
  Limiter rl(client(), limiterName(), Policy::slidingWindow(3, milliseconds(1000)));
  const std::int64_t before = scriptCalls();
  const auto refusal = [](auto&& statement) {
    return messageOfError<InvalidArgument>(ErrorKind::InvalidArgument, statement);
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(refusal([&] { (void)rl.tryAcquire("k", 1, milliseconds(100)); }), HasSubstr("now or not at all"));
  EXPECT_THAT(refusal([&] { (void)rl.acquire("k"); }), HasSubstr("now or not at all"));
  EXPECT_THAT(refusal([&] { (void)rl.reserve("k", 1, microseconds(1000)); }), HasSubstr("now or not at all"));
  EXPECT_THAT(refusal([&] { (void)Policy::slidingWindow(3, milliseconds(1000)).stored(); }),
              HasSubstr("sliding window counter travels in every call"));
  EXPECT_THAT(refusal([&] { (void)Policy::slidingWindow(0, milliseconds(1000)); }), HasSubstr("limit"));
  EXPECT_THAT(refusal([&] { (void)Policy::slidingWindow(3, milliseconds(0)); }), HasSubstr("window"));
  EXPECT_THAT(refusal([&] { (void)rl.decide("k", 4); }), HasSubstr("permits must be in 1..3"));
  EXPECT_EQ(scriptCalls(), before) << "nothing was sent";
}

}  // namespace
