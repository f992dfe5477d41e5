// Script-level tests of lua/smooth.lua (the smooth policies' state machine), run through
// detail::eval on a real redis-server. Two ways of checking it:
//
//  1. Replay against the local model on the server's clock. Every reply carries the server time
//     the script used. The test replays each call on BasicSmoothRateLimiter
//     (include/redlimit/smooth_rate_limiter.hpp) with a clock that reads exactly that time. The
//     bursty run (1024 µs per permit: 125 per 128 ms) keeps the local limiter's doubles exact and
//     requires the same answer to the µs. A warming-up limiter configured in whole ms cannot make
//     them exact (its slope and cool-down bring in factors of 5: 1/1000 is no binary fraction),
//     and the double model then truncates or rounds up 1 µs off where the exact cost is a whole
//     number; the warm-up run counts those and allows them (a few in hundreds), nothing more.
//  2. Guava's reference vectors (reference/guava-semantics.md) at chosen times. The script takes
//     "now" as an argument (as every script of the one-key family does; the limiters pass '' for
//     the server's TIME), so the test runs a virtual clock: each call is made at the virtual time,
//     the returned wait is "slept" by moving the clock on, and the vectors' own sleeps likewise.
//     Every wait must equal Guava's to the µs.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/smooth_rate_limiter.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;

namespace {

constexpr std::int64_t kSecond = 1'000'000;
constexpr std::int64_t kLongWait = 31'536'000'000'000;  // detail::kMaxWait: acquire()'s reservation

// A clock policy that reads a time the test sets (the server's, from each reply) and never sleeps.
struct ReplayClock {
  const std::int64_t* t;
  [[nodiscard]] std::chrono::microseconds now() const { return std::chrono::microseconds{*t}; }
  void sleepFor(std::chrono::microseconds) const {}
};
using Model = BasicSmoothRateLimiter<ReplayClock>;

// P permits per I ms; L ms (maxBurst, or the warm-up period when C > 0); cold factor C (0 = bursty).
struct Config {
  std::int64_t P, I, L, C;
};

class SmoothScript : public RedisTest {
 public:
  std::string key() { return name("smooth"); }

  // Runs an operation at `at` (epoch µs; '' = the server's clock).
  Reply run(const std::string& op, const std::string& at, std::vector<std::string> args) {
    args.insert(args.begin(), {op, at, "S"});
    return runOneKey(admin(), detail::lua::smooth, key(), args);
  }
  static std::string t(std::int64_t at) { return std::to_string(at); }

  bool set(const Config& c, const std::string& at = "", const char* mode = "try") {
    return run("set", at, {mode, t(c.P), t(c.I), t(c.L), t(c.C)}).elements.at(0).asInteger() == 1;
  }
  TakeReply take(std::int64_t permits, std::int64_t maxWaitUs, const std::string& at = "") {
    return takeReply(run("take", at, {t(permits), t(maxWaitUs)}));
  }
  TakeReply peek(std::int64_t permits, const std::string& at = "") { return takeReply(run("peek", at, {t(permits)})); }
  std::string value() { return raw({"GET", key()}).str; }
  Client& adminClient() { return admin(); }
  void drop() { (void)raw({"DEL", key()}); }
  // The packed fields (lua/smooth.lua): stored units (low 48 bits at bytes 14..19, bits 48..52 in
  // byte 26) and nextFree (low 48 bits at 20..25, bits 48..51 in byte 27), little-endian.
  static std::int64_t field48(const std::string& v, std::size_t at) {
    std::int64_t out = 0;
    for (std::size_t i = 6; i-- > 0;) out = out * 256 + static_cast<unsigned char>(v.at(at + i));
    return out;
  }
  static std::int64_t high(const std::string& v, std::size_t at, int bits) {
    return (static_cast<unsigned char>(v.at(at)) % (1 << bits)) * (std::int64_t{1} << 48);
  }
  std::int64_t storedUnits() {
    const std::string v = value();
    return field48(v, 14) + high(v, 26, 5);
  }
  std::int64_t nextFree() {
    const std::string v = value();
    return field48(v, 20) + high(v, 27, 4);
  }
};

// ---- 1. Replay against the local model at the server's times --------------------------------

// Random reservations (acquire) and tryAcquire calls with short real pauses; every answer must
// equal the model's at the same server time.
void replayAgainstModel(SmoothScript& s, Model& model, std::int64_t& clockNow, unsigned seed, int calls,
                        std::int64_t tolerance = 0, bool bigReserves = false) {
  std::mt19937 rng(seed);
  int granted = 0, refused = 0, offByOne = 0;
  for (int i = 0; i < calls; ++i) {
    // bigReserves: every tenth call asks for 20 permits, whose debt outlasts the next calls' pauses,
    // so some tries are refused however slowly this machine makes the calls (a sanitizer build).
    // Not with a tolerance: the model's µs then carries over the long busy stretches.
    const std::int64_t permits = bigReserves && i % 10 == 9 ? 20 : 1 + static_cast<std::int64_t>(rng() % 3);
    const auto pause = static_cast<std::int64_t>(rng() % 4);  // ms
    if (pause > 0) sleepMs(pause);
    if (rng() % 2 == 0) {
      const TakeReply r = s.take(permits, kLongWait);
      clockNow = r.nowUs;
      const auto expected = model.reserve(permits).count();
      ASSERT_TRUE(r.allowed);
      if (r.delayUs != expected && tolerance > 0) {
        ++offByOne;
        ASSERT_LE(std::abs(expected - r.delayUs), tolerance)
            << "call " << i << ": reserve(" << permits << ") at " << r.nowUs;
      } else {
        ASSERT_EQ(r.delayUs, expected) << "call " << i << ": reserve(" << permits << ") at " << r.nowUs;
      }
      ++granted;
    } else {
      const std::int64_t timeout = std::vector<std::int64_t>{0, 500, 3000}[rng() % 3];
      const TakeReply r = s.take(permits, timeout);
      clockNow = r.nowUs;
      const bool expected = model.tryAcquire(permits, std::chrono::microseconds{timeout});
      if (r.allowed != expected && tolerance > 0) {
        ++offByOne;  // the call came within the model's µs of error of the limiter's next free time
      } else {
        ASSERT_EQ(r.allowed, expected) << "call " << i << ": try(" << permits << ", " << timeout << ") at " << r.nowUs;
      }
      (r.allowed ? granted : refused)++;
    }
  }
  EXPECT_GT(granted, calls / 4);
  EXPECT_GT(refused, 0);
  // One such µs carries over to every following call while the limiter stays busy (both add the
  // same costs to nextFree), so a single one can show in several calls in a row.
  EXPECT_LE(offByOne, calls / 4) << "off by a µs only where the model's doubles are";
  std::printf("[ replay ] %d calls, %d granted, %d refused, %d off by a us\n", calls, granted, refused, offByOne);
}

TEST_F(SmoothScript, BurstyReplaysTheLocalLimiterExactly) {
  // 125 permits per 128 ms (1024 µs each, 976.5625/s), a burst of 128 ms (125 permits): every
  // double of the local limiter is exact.
  const std::int64_t at = serverTimeUs(admin());
  ASSERT_TRUE(set({125, 128, 128, 0}, t(at)));
  std::int64_t clockNow = at;
  Model model = Model::bursty(976.5625, 0.128, ReplayClock{&clockNow});
  replayAgainstModel(*this, model, clockNow, 11, 300, 0, true);
}

TEST_F(SmoothScript, WarmingUpReplaysTheLocalLimiterExactly) {
  // stable interval 1000 µs, warm-up 64 ms, cold factor 3: threshold 32, max 64 permits, slope
  // 62.5 µs per permit, cool-down 1000 µs per permit (idle time / 1000 is what the model cannot
  // hold exactly). Includes refused tries (the local limiter's fix 2) and idle gaps that cool it.
  const std::int64_t at = serverTimeUs(admin());
  ASSERT_TRUE(set({1, 1, 64, 3}, t(at)));
  std::int64_t clockNow = at;
  Model model = Model::warmingUp(1000.0, std::chrono::microseconds{64000}, 3.0, ReplayClock{&clockNow});
  replayAgainstModel(*this, model, clockNow, 7, 300, 2);
  sleepMs(80);  // cools down completely (more than the warm-up period of idle)
  replayAgainstModel(*this, model, clockNow, 8, 100, 2);
}

__extension__ using Int128 = __int128;  // exact reference arithmetic for the test only

TEST_F(SmoothScript, WarmUpCostOfTheColdPermitsIsTheWarmUpPeriodEvenWithLargeNumbers) {
  // 100/s with a 60 s warm-up: the trapezoid's numerator passes 2^53, so the script takes its
  // exact 24-bit-limb path (mulDiv). Each take's cost is checked against the same formula in
  // 128-bit integers, and the sum against Guava's property: from cold, the (max - threshold)
  // permits above the threshold cost exactly W, however the takes are split (each take
  // truncates, so W minus less than 1 µs per take).
  const std::int64_t W = 60'000'000;
  const std::int64_t at = serverTimeUs(admin());
  ASSERT_TRUE(set({100, 1000, 60'000, 3}, t(at)));
  // Reduced rate 1 per 10000 µs; K = 2T(1+C) = 80000 units per permit; threshold 3000 permits,
  // max 6000 (thrK = W*P*(1+C), maxK = W*P*(5+C)).
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
    cost += spend / Int128{8};  // below the threshold: s/K = 1/(2P(1+C)) µs per unit, truncated
    storedK -= permits * K;
    return static_cast<std::int64_t>(cost);
  };
  const TakeReply first = take(1, kLongWait, t(at));
  EXPECT_EQ(first.delayUs, 0);
  EXPECT_EQ(first.limit, 6000);
  std::int64_t next = nextFree();
  std::int64_t sum = next - at;
  EXPECT_EQ(sum, expectedCost(1));
  EXPECT_EQ(sum, 29996);  // the coldest permit: 30000 µs (c*s) less half the slope (20000/3000), truncated
  for (const std::int64_t chunk : {999, 1, 1500, 250, 250}) {
    const TakeReply r = take(chunk, kLongWait, t(at));
    ASSERT_EQ(r.delayUs, next - at) << "the limiter stays busy (no refill at one time)";
    EXPECT_EQ(nextFree() - next, expectedCost(chunk)) << "take of " << chunk;
    sum += nextFree() - next;
    next = nextFree();
  }
  // 3000 permits above the threshold, then 1 at the stable interval (10000 µs).
  EXPECT_LE(sum, W + 10000);
  EXPECT_GT(sum, W + 10000 - 6);
  EXPECT_EQ(storedUnits(), static_cast<std::int64_t>(storedK));
}

// ---- 2. Guava's reference vectors on a virtual clock (see the file comment) ------------------

class VirtualRun {
 public:
  VirtualRun(SmoothScript& s, const Config& c) : s_(s), config_(c) {
    s_.drop();
    now_ = serverTimeUs(s_.adminClient());
    EXPECT_TRUE(s_.set(c, SmoothScript::t(now_)));
  }
  void userSleep(std::int64_t micros) { now_ += micros; }
  /// acquire(permits): the wait Guava's acquire() sleeps (the clock moves on by it).
  std::int64_t acquire(std::int64_t permits) {
    const TakeReply r = s_.take(permits, kLongWait, SmoothScript::t(now_));
    EXPECT_TRUE(r.allowed);
    EXPECT_EQ(r.nowUs, now_);
    now_ += r.delayUs;
    return r.delayUs;
  }
  /// tryAcquire(permits, timeout): granted or not; a grant sleeps its wait (lastWait()).
  bool tryAcquire(std::int64_t permits, std::int64_t timeoutUs) {
    const TakeReply r = s_.take(permits, timeoutUs, SmoothScript::t(now_));
    lastWait_ = r.delayUs;
    now_ += r.delayUs;
    return r.allowed;
  }
  /// Guava's setRate(p per interval): the configuration written keeping the state (set keep,
  /// the script call of Limiter::setPolicy), the warm-up period and cold factor unchanged.
  void setRate(std::int64_t p, std::int64_t intervalMs) {
    config_.P = p;
    config_.I = intervalMs;
    EXPECT_TRUE(s_.set(config_, SmoothScript::t(now_), "keep"));
  }
  [[nodiscard]] std::int64_t lastWait() const { return lastWait_; }

 private:
  SmoothScript& s_;
  Config config_;
  std::int64_t now_ = 0;
  std::int64_t lastWait_ = 0;
};

// Runs acquire(permits[i]) and requires each wait to be Guava's.
void expectWaits(VirtualRun& run, const std::vector<std::int64_t>& permits, const std::vector<std::int64_t>& guava) {
  ASSERT_EQ(permits.size(), guava.size());
  for (std::size_t i = 0; i < guava.size(); ++i) {
    EXPECT_EQ(run.acquire(permits[i]), guava[i]) << "acquire #" << i << " (" << permits[i] << ")";
  }
}
std::vector<std::int64_t> ones(std::size_t n) { return std::vector<std::int64_t>(n, 1); }

const Config kQps5{5, 1000, 1000, 0};

TEST_F(SmoothScript, GuavaVectorsBursty) {
  {  // simple
    VirtualRun run(*this, kQps5);
    expectWaits(run, ones(3), {0, 200000, 200000});
  }
  {  // simple with wait
    VirtualRun run(*this, kQps5);
    expectWaits(run, ones(1), {0});
    run.userSleep(200000);
    expectWaits(run, ones(2), {0, 200000});
  }
  {  // earliest available in the past
    VirtualRun run(*this, kQps5);
    expectWaits(run, ones(1), {0});
    run.userSleep(400000);
    expectWaits(run, ones(3), {0, 0, 200000});
  }
  {  // one-second burst
    VirtualRun run(*this, kQps5);
    run.userSleep(kSecond);
    run.userSleep(kSecond);
    expectWaits(run, {1, 1, 3, 1, 1}, {0, 0, 0, 0, 200000});
  }
  {  // weights, qps 1
    VirtualRun run(*this, {1, 1000, 1000, 0});
    expectWaits(run, {1, 1, 2, 4, 8, 1}, {0, 1000000, 1000000, 2000000, 4000000, 8000000});
  }
  {  // bursty and update, qps 1 -> 2
    VirtualRun run(*this, {1, 1000, 1000, 0});
    expectWaits(run, {1, 1}, {0, 1000000});
    run.setRate(2, 1000);
    expectWaits(run, {1, 2, 4, 1}, {1000000, 500000, 1000000, 2000000});
  }
}

TEST_F(SmoothScript, GuavaVectorsWarmingUp) {
  {  // warm-up: qps 2, W 4 s, cold factor 3
    const std::vector<std::int64_t> eight{0, 1375000, 1125000, 875000, 625000, 500000, 500000, 500000};
    VirtualRun run(*this, {2, 1000, 4000, 3});
    expectWaits(run, ones(8), eight);
    run.userSleep(500000);
    run.userSleep(4000000);
    expectWaits(run, ones(8), eight);
    run.userSleep(500000);
    run.userSleep(2000000);
    expectWaits(run, ones(8), {0, 500000, 500000, 500000, 500000, 500000, 500000, 500000});
  }
  {  // cold factor 10: qps 5, W 4 s (300227 is a truncated trapezoid that straddles the threshold)
    const std::vector<std::int64_t> eight{0, 1752500, 1257500, 762500, 300227, 200000, 200000, 200000};
    VirtualRun run(*this, {5, 1000, 4000, 10});
    expectWaits(run, ones(8), eight);
    run.userSleep(200000);
    run.userSleep(4000000);
    expectWaits(run, ones(8), eight);
    run.userSleep(200000);
    run.userSleep(1000000);
    expectWaits(run, ones(8), {0, 200000, 200000, 200000, 200000, 200000, 200000, 200000});
  }
  {  // cold factor 1: qps 5, W 4 s
    const std::vector<std::int64_t> eight{0, 200000, 200000, 200000, 200000, 200000, 200000, 200000};
    VirtualRun run(*this, {5, 1000, 4000, 1});
    expectWaits(run, ones(8), eight);
    run.userSleep(340000);
    expectWaits(run, ones(8), eight);
  }
}

TEST_F(SmoothScript, GuavaVectorsWarmUpAndUpdate) {
  {  // qps 2 -> 4, W 4 s, cold factor 3
    VirtualRun run(*this, {2, 1000, 4000, 3});
    expectWaits(run, ones(8), {0, 1375000, 1125000, 875000, 625000, 500000, 500000, 500000});
    run.userSleep(4500000);
    expectWaits(run, ones(3), {0, 1375000, 1125000});
    run.setRate(4, 1000);
    expectWaits(run, ones(5), {875000, 343750, 281250, 250000, 250000});
    run.userSleep(4250000);
    expectWaits(run, ones(11), {0, 718750, 656250, 593750, 531250, 468750, 406250, 343750, 281250, 250000, 250000});
  }
  {  // qps 5 -> 10, W 4 s, cold factor 10
    VirtualRun run(*this, {5, 1000, 4000, 10});
    expectWaits(run, ones(8), {0, 1752500, 1257500, 762500, 300227, 200000, 200000, 200000});
    run.userSleep(4200000);
    expectWaits(run, ones(3), {0, 1752500, 1257500});
    run.setRate(10, 1000);
    expectWaits(run, ones(5), {762500, 195625, 104602, 100000, 100000});
    run.userSleep(4100000);
    expectWaits(run, ones(11), {0, 938125, 814375, 690625, 566875, 443125, 319375, 195625, 104602, 100000, 100000});
  }
}

TEST_F(SmoothScript, GuavaVectorsTryAcquire) {
  {  // no wait
    VirtualRun run(*this, kQps5);
    EXPECT_TRUE(run.tryAcquire(1, 0));
    EXPECT_FALSE(run.tryAcquire(1, 0));
    EXPECT_FALSE(run.tryAcquire(1, 0));
    run.userSleep(100000);
    EXPECT_FALSE(run.tryAcquire(1, 0));
  }
  {  // some wait
    VirtualRun run(*this, kQps5);
    EXPECT_TRUE(run.tryAcquire(1, 0));
    EXPECT_TRUE(run.tryAcquire(1, 200000));
    EXPECT_EQ(run.lastWait(), 200000);
    EXPECT_FALSE(run.tryAcquire(1, 100000));
    run.userSleep(100000);
    EXPECT_TRUE(run.tryAcquire(1, 100000));
    EXPECT_EQ(run.lastWait(), 100000);
  }
  {  // overflow: the longest wait the script takes (the client clamps to detail::kMaxWait)
    VirtualRun run(*this, kQps5);
    EXPECT_TRUE(run.tryAcquire(1, 0));
    run.userSleep(100000);
    EXPECT_TRUE(run.tryAcquire(1, 99'999'999'999'999));
  }
  {  // negative timeouts count as 0 (the client clamps them before sending)
    VirtualRun run(*this, kQps5);
    EXPECT_TRUE(run.tryAcquire(5, 0));
    run.userSleep(900000);
    EXPECT_FALSE(run.tryAcquire(1, 0));
    run.userSleep(100000);
    EXPECT_TRUE(run.tryAcquire(1, 0));
  }
}

TEST_F(SmoothScript, GuavaWarmUpIsHonouredWithWeights) {
  // 10 permits between the threshold and the maximum (W = 5 x s x (1 + c)): from cold, taking
  // them in random chunks and then 1 more (which repays the last chunk) takes (1 + c) x 10 x s / 2,
  // less at most 1 µs per take (each truncates).
  std::mt19937 rng(5);
  for (const std::int64_t c : {2, 3, 10}) {
    for (const std::int64_t sMs : {250, 500, 1000, 2000, 10000}) {  // qps 4, 2, 1, 0.5, 0.1
      VirtualRun run(*this, {1, sMs, 5 * sMs * (1 + c), c});
      std::int64_t left = 10, waited = 0, takes = 0;
      while (left > 0) {
        const std::int64_t chunk = std::min<std::int64_t>(left, 1 + static_cast<std::int64_t>(rng() % 3));
        waited += run.acquire(chunk);
        left -= chunk;
        ++takes;
      }
      waited += run.acquire(1);
      ++takes;
      const std::int64_t expected = (1 + c) * 10 * sMs * 1000 / 2;
      EXPECT_LE(waited, expected) << "c " << c << ", s " << sMs << " ms";
      EXPECT_GE(waited, expected - takes) << "c " << c << ", s " << sMs << " ms";
    }
  }
}

// ---- Refund and a rate kept with the state, at chosen times ------------------------------------

TEST_F(SmoothScript, RefundMovesTheDebtBackAndStoresTheRestWhenBursty) {
  const std::int64_t at = serverTimeUs(admin());
  ASSERT_TRUE(set({1, 1000, 3000, 0}, t(at)));  // 1/s, up to 3 stored
  EXPECT_EQ(take(2, 0, t(at)).delayUs, 0);      // free; the next caller pays 2 s
  EXPECT_EQ(nextFree(), at + 2 * kSecond);
  EXPECT_EQ(run("refund", t(at), {"1"}).asInteger(), 0);  // reply: remaining
  EXPECT_EQ(nextFree(), at + kSecond);
  (void)run("refund", t(at), {"5"});  // 1 s of debt back, 4 permits left over, 3 kept
  EXPECT_EQ(nextFree(), at);
  EXPECT_EQ(peek(1, t(at)).remaining, 3);
  // Warming up: time comes back at the stable rate, stored permits (coldness) do not change.
  (void)raw({"DEL", key()});
  ASSERT_TRUE(set({2, 1000, 4000, 3}, t(at)));
  const std::int64_t cold = storedUnits();
  (void)take(1, 0, t(at));
  const std::int64_t after = nextFree();
  EXPECT_EQ(after - at, 1375000);
  (void)run("refund", t(at), {"2"});
  EXPECT_EQ(nextFree(), at + 1375000 - 1000000);
  EXPECT_EQ(storedUnits(), cold - 4000000) << "one permit (K = 4e6 units) still spent";
}

TEST_F(SmoothScript, KeepingTheStateResyncsThenScalesStoredPermits) {
  const std::int64_t at = serverTimeUs(admin());
  ASSERT_TRUE(set({2, 1000, 2000, 0}, t(at)));  // 2/s, up to 4 stored
  // 1.5 s idle at the old rate: 3 stored; then 4/s: the maximum is 8, so 6 stored.
  ASSERT_TRUE(set({4, 1000, 2000, 0}, t(at + 1'500'000), "keep"));
  EXPECT_EQ(peek(1, t(at + 1'500'000)).remaining, 6);
  EXPECT_EQ(peek(1, t(at + 1'500'000)).limit, 8);
  EXPECT_EQ(nextFree(), at + 1'500'000);
  // Debt is kept: 10 permits (6 stored free, 4 fresh at 250 ms) push nextFree 1 s on; a rate
  // change then does not move it.
  (void)take(10, 0, t(at + 1'500'000));
  EXPECT_EQ(nextFree(), at + 2'500'000);
  ASSERT_TRUE(set({1, 1000, 2000, 0}, t(at + 1'600'000), "keep"));
  EXPECT_EQ(nextFree(), at + 2'500'000);
  EXPECT_EQ(peek(1, t(at + 1'600'000)).retryAfterUs, 900'000);
  EXPECT_EQ(peek(1, t(at + 1'600'000)).limit, 2);
}

// ---- Validation, errors, layout --------------------------------------------------------------

TEST_F(SmoothScript, RejectsBadArgumentsBeforeWriting) {
  EXPECT_THROW(set({0, 1000, 1000, 0}), InvalidArgument);
  EXPECT_THROW(set({5, 0, 1000, 0}), InvalidArgument);
  EXPECT_THROW(set({5, 1000, 0, 3}), InvalidArgument);       // warming up without a warm-up period
  EXPECT_THROW(set({5, 1000, 4000, 128}), InvalidArgument);  // cold factor above 127
  EXPECT_THROW((void)run("set", "", {"try", "5", "1000", "-1", "0"}), InvalidArgument);
  EXPECT_THROW((void)run("set", "", {"try", "5", "1000", "0.5", "0"}),
               InvalidArgument);                                  // read as Lua's tonumber: "01" is 1
  EXPECT_THROW(set({999, 1000, 3'600'000, 3}), InvalidArgument);  // too large to keep exact
  EXPECT_FALSE(exists(admin(), key()));
  EXPECT_THROW((void)take(1, 0), NotInitializedError);
  ASSERT_TRUE(set(kQps5));
  const std::string before = value();
  EXPECT_THROW((void)take(0, 0), InvalidArgument);
  EXPECT_THROW((void)run("take", "", {"-1", "0"}), InvalidArgument);
  EXPECT_THROW((void)run("take", "", {"1.5", "0"}), InvalidArgument);
  EXPECT_THROW((void)run("take", "", {"1", "-1"}), InvalidArgument);
  EXPECT_THROW((void)run("nope", "", {"1"}), InvalidArgument);
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::smooth, key(), {"take", "", "G", "1", "0"}), InvalidArgument);
  EXPECT_EQ(value(), before);
}

TEST_F(SmoothScript, ConfigIsWrittenOnlyWhenAbsent) {
  ASSERT_TRUE(set(kQps5));
  const std::string before = value();
  EXPECT_FALSE(set({7, 1000, 4000, 3}));
  EXPECT_EQ(value(), before);
  EXPECT_EQ(peek(1).limit, 5) << "5 per second with 1 s of burst, as first written";
}

TEST_F(SmoothScript, UnusableStateIsATypedErrorAndNothingIsWritten) {
  (void)raw({"HSET", key(), "cfg", "x"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)take(1, 0); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { set(kQps5); }));
  (void)raw({"DEL", key()});
  ASSERT_TRUE(set({2, 1000, 4000, 3}));
  const std::string good = value();
  ASSERT_EQ(good.size(), 28u);
  auto expectError = [&](std::size_t at, std::size_t n, unsigned char byte, bool config) {
    std::string v = good;
    for (std::size_t i = 0; i < n; ++i) v[at + i] = static_cast<char>(byte);
    (void)detail::command(admin(), {"SET", key(), v});
    if (config) {
      EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)take(1, 0); }))
          << "bytes " << at;
    } else {
      EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { (void)take(1, 0); })) << "bytes " << at;
    }
    EXPECT_EQ(value(), v) << "nothing written";
  };
  expectError(1, 4, 0, true);       // P = 0
  expectError(5, 4, 0, true);       // I = 0
  expectError(9, 4, 0, true);       // W = 0 while warming up
  expectError(13, 1, 0, false);     // bursty: the cold limiter's stored permits pass its maximum
  expectError(14, 7, 0xFF, false);  // stored above the maximum
  expectError(21, 7, 0xFF, false);  // nextFree past 2^52
  (void)detail::command(admin(), {"SET", key(), good});
  EXPECT_TRUE(take(1, 0).allowed);
}

// The target is <= 100 bytes per limiter key (MEMORY USAGE); the typed test of the class
// measures it under a 14-byte name, this one records the layout's size under a one-byte name.
TEST_F(SmoothScript, OneSmallKeyPerLimiter) {
  auto measure = [&](const Config& c, std::int64_t permits) {
    (void)raw({"DEL", key()});
    EXPECT_TRUE(set(c));
    (void)take(permits, kLongWait);
    (void)raw({"RENAME", key(), "k"});
    const std::int64_t bytes = raw({"MEMORY", "USAGE", "k"}).integer;
    (void)raw({"DEL", "k"});
    return bytes;
  };
  const std::int64_t bursty = measure(kQps5, 3);
  const std::int64_t warm = measure({100, 1000, 60'000, 3}, 1500);
  std::printf("[ memory ] key \"k\": bursty %lld bytes, warming-up %lld bytes\n", static_cast<long long>(bursty),
              static_cast<long long>(warm));
  EXPECT_LE(bursty, 80);
  EXPECT_LE(warm, 80);
}

}  // namespace
