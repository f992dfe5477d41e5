// Script-level tests of lua/smooth.lua (the distributed smooth limiter's state machine), run
// through detail::eval on a real redis-server and on the server's clock (the script has no time
// override). Two ways of checking it:
//
//  1. Replay against the local model. Every reply carries the server time the script used. The
//     test replays each call on BasicSmoothRateLimiter (include/redlimit/smooth_rate_limiter.hpp)
//     with a clock that reads exactly that time, and requires the same answer to the µs. Rates,
//     warm-up periods and bursts are powers of two in µs there, so the local limiter's doubles
//     are exact too and any difference would be a real one.
//  2. Guava's reference vectors (reference/guava-semantics.md) on a virtual clock. Guava's
//     vectors assume the caller sleeps each returned wait (R) and the test's own sleeps (U). The
//     script uses time only as (now - nextFree), so moving the stored nextFree back by X
//     (HINCRBY n -X) is, for the algorithm, the same as the server's clock moving on by X: the
//     test keeps "virtual time = server time + offset" and, before each call, shifts nextFree by
//     what the virtual clock gained since the last reply (the sleeps it skipped). The waits are
//     then compared in virtual time. What is not exact is the real server time that passes
//     between one reply and the next call (the "slack", measured from the replies' own `now`):
//     idle time the vector does not have. The tolerance of each comparison is derived from the
//     slack accumulated so far — at most (1 + cost of a stored permit / its cool-down) µs per µs
//     of slack — plus 1 µs; most waits match exactly, and the test counts them.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/smooth_rate_limiter.hpp"

using namespace redlimit;
using namespace redlimit::test;

namespace {

const Script kSmooth{detail::lua::smooth.name, detail::lua::smooth.sha1, detail::lua::smooth.source};

struct Reply5 {
  bool granted = false;
  std::int64_t wait = 0;      // µs
  std::int64_t now = 0;       // server epoch µs
  std::int64_t nextFree = 0;  // epoch µs
  std::int64_t stored = 0;    // units of 1/scale permit
  std::int64_t scale = 0;
};

// A clock policy that reads a time the test sets (the server's, from each reply) and never sleeps.
struct ReplayClock {
  const std::int64_t* t;
  [[nodiscard]] std::chrono::microseconds now() const { return std::chrono::microseconds{*t}; }
  void sleepFor(std::chrono::microseconds) const {}
};
using Model = BasicSmoothRateLimiter<ReplayClock>;

struct Config {
  std::int64_t P, T, B, W, CN, CD;
};

class SmoothScript : public RedisTest {
 public:
  std::string key() { return name("smooth"); }

  Reply evalScript(const std::vector<std::string>& args) {
    const std::string k = key();
    const std::vector<std::string_view> keys{k};
    const std::vector<std::string_view> views(args.begin(), args.end());
    try {
      return detail::eval(*client(), kSmooth, keys, views);
    } catch (const ScriptError&) {
      std::rethrow_exception(detail::limiterError(std::current_exception()));
    }
  }

  // init; returns {created, now}.
  std::pair<bool, std::int64_t> init(const Config& c) {
    const Reply r = evalScript({"init", std::to_string(c.P), std::to_string(c.T), std::to_string(c.B),
                                std::to_string(c.W), std::to_string(c.CN), std::to_string(c.CD)});
    return {r.elements.at(0).asInteger() == 1, r.elements.at(1).asInteger()};
  }

  static Reply5 decode(const Reply& r) {
    Reply5 out;
    out.granted = r.elements.at(0).asInteger() == 1;
    out.wait = r.elements.at(1).asInteger();
    out.now = r.elements.at(2).asInteger();
    out.nextFree = r.elements.at(3).asInteger();
    out.stored = r.elements.at(4).asInteger();
    out.scale = r.elements.at(5).asInteger();
    return out;
  }
  Reply5 reserve(std::int64_t permits) { return decode(evalScript({"reserve", std::to_string(permits)})); }
  Reply5 tryAcquire(std::int64_t permits, std::int64_t timeoutUs) {
    return decode(evalScript({"try", std::to_string(permits), std::to_string(timeoutUs)}));
  }
  std::string field(const std::string& f) {
    const Reply r = raw({"HGET", key(), f});
    return r.isNil() ? "<nil>" : r.str;
  }
};

// ---- 1. Replay against the local model ------------------------------------------------------

// Random reserve/try calls with short real pauses; every answer must equal the model's at the
// same server time.
void replayAgainstModel(SmoothScript& t, Model& model, std::int64_t& clockNow, unsigned seed, int calls) {
  std::mt19937 rng(seed);
  int granted = 0, refused = 0;
  for (int i = 0; i < calls; ++i) {
    const std::int64_t permits = 1 + static_cast<std::int64_t>(rng() % 3);
    const auto pause = static_cast<std::int64_t>(rng() % 4);  // ms
    if (pause > 0) sleepMs(pause);
    if (rng() % 2 == 0) {
      const Reply5 r = t.reserve(permits);
      clockNow = r.now;
      const auto expected = model.reserve(permits).count();
      ASSERT_TRUE(r.granted);
      ASSERT_EQ(r.wait, expected) << "call " << i << ": reserve(" << permits << ") at " << r.now;
      ++granted;
    } else {
      const std::int64_t timeout = std::vector<std::int64_t>{0, 500, 3000}[rng() % 3];
      const Reply5 r = t.tryAcquire(permits, timeout);
      clockNow = r.now;
      const bool expected = model.tryAcquire(permits, std::chrono::microseconds{timeout});
      ASSERT_EQ(r.granted, expected) << "call " << i << ": try(" << permits << ", " << timeout << ") at " << r.now;
      (r.granted ? granted : refused)++;
    }
  }
  EXPECT_GT(granted, calls / 4);
  EXPECT_GT(refused, 0);
}

TEST_F(SmoothScript, BurstyReplaysTheLocalLimiterExactly) {
  // 1 permit per 1024 µs (976.5625/s), a burst of 62500 µs (61.03515625 permits): dyadic, so the
  // local limiter's doubles are exact.
  const auto [created, at] = init({1, 1024, 62500, 0, 1, 1});
  ASSERT_TRUE(created);
  std::int64_t clockNow = at;
  Model model = Model::bursty(1e6 / 1024.0, 0.0625, ReplayClock{&clockNow});
  replayAgainstModel(*this, model, clockNow, 11, 300);
}

TEST_F(SmoothScript, WarmingUpReplaysTheLocalLimiterExactly) {
  // stable interval 1024 µs, warm-up 65536 µs, cold factor 3: threshold 32, max 64 permits,
  // slope 64 µs per permit, cool-down 1024 µs per permit, all exact in doubles. Includes
  // refused tries (the local limiter's fix 2) and idle gaps that cool it.
  const auto [created, at] = init({1, 1024, 0, 65536, 3, 1});
  ASSERT_TRUE(created);
  std::int64_t clockNow = at;
  Model model = Model::warmingUp(1e6 / 1024.0, std::chrono::microseconds{65536}, 3.0, ReplayClock{&clockNow});
  replayAgainstModel(*this, model, clockNow, 7, 300);
  sleepMs(80);  // cools down completely (more than the warm-up period of idle)
  replayAgainstModel(*this, model, clockNow, 8, 100);
}

__extension__ typedef __int128 Int128;  // exact reference arithmetic for the test only

TEST_F(SmoothScript, WarmUpCostOfTheColdPermitsIsTheWarmUpPeriodEvenWithLargeNumbers) {
  // 100/s with a 60 s warm-up: the trapezoid's numerator passes 2^53, so the script takes its
  // exact 24-bit-limb path (mulDiv). Each take's cost is checked against the same formula in
  // 128-bit integers, and the sum against Guava's property: from cold, the (max - threshold)
  // permits above the threshold cost exactly W, however the takes are split (each take
  // truncates, so W minus less than 1 µs per take).
  const std::int64_t W = 60'000'000;
  ASSERT_TRUE(init({100, 1'000'000, 0, W, 3, 1}).first);
  // Reduced rate 1 per 10000 µs; K = 2T(CD+CN) = 80000 units per permit; threshold 3000 permits,
  // max 6000 (thrK = W*P*(CD+CN), maxK = W*P*(5CD+CN)).
  const Int128 K = 80000, thrK = Int128{W} * 4, maxK = Int128{W} * 8, B8 = Int128{W} * 8, D = Int128{W} * 16 * 4;
  Int128 storedK = maxK;
  auto expectedCost = [&](std::int64_t permits) {
    Int128 spend = permits * K;
    Int128 cost = 0;
    const Int128 above = storedK - thrK;
    if (above > 0) {
      const Int128 a = std::min(above, spend);
      cost += a * (B8 + (2 * above - a) * 2) / D;
      spend -= a;
    }
    cost += spend / (2 * 4);  // below the threshold: s/K = 1/(2P(CD+CN)) µs per unit, truncated
    storedK -= permits * K;
    return static_cast<std::int64_t>(cost);
  };
  const Reply5 first = reserve(1);
  EXPECT_EQ(first.wait, 0);
  EXPECT_EQ(first.scale, 80000);
  std::int64_t sum = first.nextFree - first.now;
  EXPECT_EQ(sum, expectedCost(1));
  EXPECT_EQ(sum, 29996);  // the coldest permit: 30000 µs (c*s) less half the slope (20000/3000), truncated
  std::int64_t next = first.nextFree;
  for (const std::int64_t chunk : {999, 1, 1500, 250, 250}) {
    const Reply5 r = reserve(chunk);
    ASSERT_GT(r.wait, 0) << "the limiter must stay busy (no refill between calls)";
    EXPECT_EQ(r.nextFree - next, expectedCost(chunk)) << "take of " << chunk;
    sum += r.nextFree - next;
    next = r.nextFree;
  }
  // 3000 permits above the threshold, then 1 at the stable interval (10000 µs).
  EXPECT_LE(sum, W + 10000);
  EXPECT_GT(sum, W + 10000 - 6);
  EXPECT_EQ(field("s"), std::to_string(static_cast<std::int64_t>(storedK)));
}

}  // namespace
