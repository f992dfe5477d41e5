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
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
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
  Reply rawCommand(std::initializer_list<std::string_view> argv) { return raw(argv); }
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

// ---- 2. Guava's reference vectors on a virtual clock (see the file comment) ------------------

class VirtualRun {
 public:
  // `factor`: the most a stored permit costs, in µs per µs of idle time that stored it
  // (bursty: 1; warm-up: coldFactor * stableInterval / coolDownInterval).
  VirtualRun(SmoothScript& t, const Config& c, double factor) : t_(t), factor_(factor) {
    const auto [created, at] = t_.init(c);
    EXPECT_TRUE(created);
    virtualNow_ = at;
    lastServer_ = at;
    nextFreeVirtual_ = at;
  }
  /// Guava's state is full here (a cold warm-up limiter at the start, or after an idle period
  /// of more than enough to fill it), and so is the script's: idle time the vector does not have
  /// changes nothing at the next call.
  void bothFull() { bothFull_ = true; }
  void userSleep(std::int64_t micros) { virtualNow_ += micros; }

  /// acquire(permits): the wait Guava's acquire() would sleep, in virtual time.
  std::int64_t acquire(std::int64_t permits) {
    shift();
    const Reply5 r = t_.reserve(permits);
    return observe(r);
  }
  /// tryAcquire(permits, timeout): granted or not (the wait slept is in lastWait()).
  bool tryAcquire(std::int64_t permits, std::int64_t timeoutUs) {
    shift();
    const Reply5 r = t_.tryAcquire(permits, timeoutUs);
    lastWait_ = observe(r);
    return r.granted;
  }
  [[nodiscard]] std::int64_t lastWait() const { return lastWait_; }
  /// How far a wait may be from Guava's after the idle time the vector does not have.
  [[nodiscard]] std::int64_t tolerance() const {
    return static_cast<std::int64_t>(static_cast<double>(lastExtra_) + factor_ * static_cast<double>(extraIdle_)) + 1;
  }
  [[nodiscard]] std::int64_t extraIdle() const { return extraIdle_; }

 private:
  // Moves the stored nextFree back by what the virtual clock gained over the server's.
  void shift() {
    const std::int64_t gap = virtualNow_ - (lastServer_ + offset_);
    if (gap <= 0) return;
    const Reply r = t_.rawCommand({"HINCRBY", t_.key(), "n", std::to_string(-gap)});
    ASSERT_EQ(r.integer + offset_ + gap, nextFreeVirtual_);
    offset_ += gap;
  }
  std::int64_t observe(const Reply5& r) {
    const std::int64_t nowVirtual = r.now + offset_;
    // Idle time the script saw at this call that Guava's limiter did not (the call came late).
    const std::int64_t extra = std::max<std::int64_t>(nowVirtual - nextFreeVirtual_, 0) -
                               std::max<std::int64_t>(virtualNow_ - nextFreeVirtual_, 0);
    lastExtra_ = extra;
    if (!bothFull_) extraIdle_ += extra;
    bothFull_ = false;
    lastServer_ = r.now;
    nextFreeVirtual_ = r.nextFree + offset_;
    if (!r.granted) return 0;
    const std::int64_t wait = nowVirtual + r.wait - virtualNow_;  // from Guava's call time
    virtualNow_ += wait;                                         // the caller sleeps it
    return wait;
  }

  SmoothScript& t_;
  double factor_;
  std::int64_t virtualNow_ = 0;       // Guava's clock
  std::int64_t offset_ = 0;           // virtual - server
  std::int64_t lastServer_ = 0;       // server time of the last reply
  std::int64_t nextFreeVirtual_ = 0;  // the stored nextFree, in virtual time
  std::int64_t extraIdle_ = 0;        // idle time the vector does not have, summed
  std::int64_t lastExtra_ = 0;
  std::int64_t lastWait_ = 0;
  bool bothFull_ = false;
};

constexpr std::int64_t kSecond = 1'000'000;

// Runs acquire(permits[i]) and compares each wait with Guava's, within the run's tolerance.
void expectWaits(VirtualRun& run, const std::vector<std::int64_t>& permits, const std::vector<std::int64_t>& guava,
                 int& exact) {
  ASSERT_EQ(permits.size(), guava.size());
  for (std::size_t i = 0; i < guava.size(); ++i) {
    const std::int64_t wait = run.acquire(permits[i]);
    EXPECT_LE(std::llabs(wait - guava[i]), run.tolerance())
        << "acquire #" << i << " (" << permits[i] << "): " << wait << " vs Guava's " << guava[i];
    if (wait == guava[i]) ++exact;
  }
}
std::vector<std::int64_t> ones(std::size_t n) { return std::vector<std::int64_t>(n, 1); }

double warmUpFactor(double qps, double warmupUs, double cold) {
  const double s = 1e6 / qps;
  const double maxPermits = 0.5 * warmupUs / s + 2.0 * warmupUs / (s + cold * s);
  return cold * s / (warmupUs / maxPermits);
}

TEST_F(SmoothScript, GuavaVectorsBursty) {
  int exact = 0, total = 0;
  const Config qps5{5, kSecond, kSecond, 0, 1, 1};
  {  // simple
    VirtualRun run(*this, qps5, 1.0);
    expectWaits(run, ones(3), {0, 200000, 200000}, exact);
    total += 3;
  }
  raw({"DEL", key()});
  {  // simple with wait
    VirtualRun run(*this, qps5, 1.0);
    expectWaits(run, ones(1), {0}, exact);
    run.userSleep(200000);
    expectWaits(run, ones(2), {0, 200000}, exact);
    total += 3;
  }
  raw({"DEL", key()});
  {  // earliest available in the past
    VirtualRun run(*this, qps5, 1.0);
    expectWaits(run, ones(1), {0}, exact);
    run.userSleep(400000);
    expectWaits(run, ones(3), {0, 0, 200000}, exact);
    total += 4;
  }
  raw({"DEL", key()});
  {  // one-second burst
    VirtualRun run(*this, qps5, 1.0);
    run.userSleep(kSecond);
    run.userSleep(kSecond);
    run.bothFull();
    expectWaits(run, {1, 1, 3, 1, 1}, {0, 0, 0, 0, 200000}, exact);
    total += 5;
  }
  raw({"DEL", key()});
  {  // weights, qps 1
    VirtualRun run(*this, {1, kSecond, kSecond, 0, 1, 1}, 1.0);
    expectWaits(run, {1, 1, 2, 4, 8, 1}, {0, 1000000, 1000000, 2000000, 4000000, 8000000}, exact);
    total += 6;
  }
  RecordProperty("exact", exact);
  std::printf("[ bursty vectors ] %d of %d waits exact to the µs\n", exact, total);
}

TEST_F(SmoothScript, GuavaVectorsWarmingUp) {
  int exact = 0, total = 0;
  {  // warm-up: qps 2, W 4 s, cold factor 3
    const std::vector<std::int64_t> eight{0, 1375000, 1125000, 875000, 625000, 500000, 500000, 500000};
    VirtualRun run(*this, {2, kSecond, 0, 4 * kSecond, 3, 1}, warmUpFactor(2, 4e6, 3));
    run.bothFull();
    expectWaits(run, ones(8), eight, exact);
    run.userSleep(500000);
    run.userSleep(4000000);
    run.bothFull();
    expectWaits(run, ones(8), eight, exact);
    run.userSleep(500000);
    run.userSleep(2000000);
    expectWaits(run, ones(8), {0, 500000, 500000, 500000, 500000, 500000, 500000, 500000}, exact);
    total += 24;
  }
  raw({"DEL", key()});
  {  // cold factor 10: qps 5, W 4 s (300227 is a truncated trapezoid that straddles the threshold)
    const std::vector<std::int64_t> eight{0, 1752500, 1257500, 762500, 300227, 200000, 200000, 200000};
    VirtualRun run(*this, {5, kSecond, 0, 4 * kSecond, 10, 1}, warmUpFactor(5, 4e6, 10));
    run.bothFull();
    expectWaits(run, ones(8), eight, exact);
    run.userSleep(200000);
    run.userSleep(4000000);
    run.bothFull();
    expectWaits(run, ones(8), eight, exact);
    run.userSleep(200000);
    run.userSleep(1000000);
    expectWaits(run, ones(8), {0, 200000, 200000, 200000, 200000, 200000, 200000, 200000}, exact);
    total += 24;
  }
  raw({"DEL", key()});
  {  // cold factor 1: qps 5, W 4 s
    const std::vector<std::int64_t> eight{0, 200000, 200000, 200000, 200000, 200000, 200000, 200000};
    VirtualRun run(*this, {5, kSecond, 0, 4 * kSecond, 1, 1}, warmUpFactor(5, 4e6, 1));
    run.bothFull();
    expectWaits(run, ones(8), eight, exact);
    run.userSleep(340000);
    expectWaits(run, ones(8), eight, exact);
    total += 16;
  }
  std::printf("[ warm-up vectors ] %d of %d waits exact to the µs\n", exact, total);
}

TEST_F(SmoothScript, GuavaVectorsTryAcquire) {
  const Config qps5{5, kSecond, kSecond, 0, 1, 1};
  {  // no wait
    VirtualRun run(*this, qps5, 1.0);
    EXPECT_TRUE(run.tryAcquire(1, 0));
    EXPECT_FALSE(run.tryAcquire(1, 0));
    EXPECT_FALSE(run.tryAcquire(1, 0));
    run.userSleep(100000);
    EXPECT_FALSE(run.tryAcquire(1, 0));
  }
  raw({"DEL", key()});
  {  // some wait
    VirtualRun run(*this, qps5, 1.0);
    EXPECT_TRUE(run.tryAcquire(1, 0));
    EXPECT_TRUE(run.tryAcquire(1, 200000));
    EXPECT_LE(std::llabs(run.lastWait() - 200000), run.tolerance()) << run.lastWait();
    EXPECT_FALSE(run.tryAcquire(1, 100000));
    run.userSleep(100000);
    EXPECT_TRUE(run.tryAcquire(1, 100000));
    EXPECT_LE(std::llabs(run.lastWait() - 100000), run.tolerance()) << run.lastWait();
  }
  raw({"DEL", key()});
  {  // overflow: the largest timeout the script takes (the client clamps to it)
    VirtualRun run(*this, qps5, 1.0);
    EXPECT_TRUE(run.tryAcquire(1, 0));
    run.userSleep(100000);
    EXPECT_TRUE(run.tryAcquire(1, std::int64_t{1} << 52));
  }
  raw({"DEL", key()});
  {  // negative timeouts count as 0 (the client clamps them before sending)
    VirtualRun run(*this, qps5, 1.0);
    EXPECT_TRUE(run.tryAcquire(5, 0));
    run.userSleep(900000);
    EXPECT_FALSE(run.tryAcquire(1, 0));
    run.userSleep(100000);
    EXPECT_TRUE(run.tryAcquire(1, 0));
  }
}

// ---- Validation, errors, layout --------------------------------------------------------------

TEST_F(SmoothScript, RejectsBadArgumentsBeforeWriting) {
  EXPECT_THROW(init({0, kSecond, kSecond, 0, 1, 1}), InvalidArgument);
  EXPECT_THROW(init({5, 0, kSecond, 0, 1, 1}), InvalidArgument);
  EXPECT_THROW(init({5, kSecond, 0, 4 * kSecond, 1, 2}), InvalidArgument);  // cold factor < 1
  EXPECT_THROW(evalScript({"init", "5", "1000000", "-1", "0", "1", "1"}), InvalidArgument);
  EXPECT_THROW(evalScript({"init", "5", "1000000", "01", "0", "1", "1"}), InvalidArgument);
  EXPECT_THROW(init({1000000, 1, 0, 3600 * kSecond, 3, 1}), InvalidArgument);  // too large to keep exact
  EXPECT_EQ(raw({"EXISTS", key()}).integer, 0);
  EXPECT_THROW(reserve(1), NotInitializedError);
  ASSERT_TRUE(init({5, kSecond, kSecond, 0, 1, 1}).first);
  const std::string before = field("n") + "/" + field("s") + "/" + field("r");
  EXPECT_THROW(reserve(0), InvalidArgument);
  EXPECT_THROW(evalScript({"reserve", "-1"}), InvalidArgument);
  EXPECT_THROW(evalScript({"reserve", "1.5"}), InvalidArgument);
  EXPECT_THROW(evalScript({"try", "0", "0"}), InvalidArgument);
  EXPECT_THROW(evalScript({"try", "1", "-1"}), InvalidArgument);
  EXPECT_THROW(evalScript({"nope", "1"}), InvalidArgument);
  EXPECT_EQ(field("n") + "/" + field("s") + "/" + field("r"), before);
}

TEST_F(SmoothScript, ConfigIsWrittenOnlyWhenAbsent) {
  ASSERT_TRUE(init({5, kSecond, kSecond, 0, 1, 1}).first);
  EXPECT_FALSE(init({7, kSecond, 0, 4 * kSecond, 3, 1}).first);
  EXPECT_EQ(field("cfg"), "1:200000:1000000:0:1:1");  // 5 per second, reduced by the gcd
}

TEST_F(SmoothScript, UnusableStateIsATypedErrorAndNothingIsWritten) {
  raw({"SET", key(), "x"});
  EXPECT_THROW(reserve(1), InvalidConfigError);
  EXPECT_THROW(init({5, kSecond, kSecond, 0, 1, 1}), InvalidConfigError);
  raw({"DEL", key()});
  ASSERT_TRUE(init({5, kSecond, kSecond, 0, 1, 1}).first);
  for (const auto& [f, bad] : std::vector<std::pair<std::string, std::string>>{
           {"s", "-1"}, {"s", "99999999"}, {"n", "abc"}, {"r", "2"}, {"cfg", "1:2:3"}, {"cfg", "0:1:0:0:1:1"}}) {
    const std::string good = field(f);
    raw({"HSET", key(), f, bad});
    const std::string n = field("n");
    EXPECT_THROW(reserve(1), InvalidConfigError) << f << "=" << bad;
    EXPECT_EQ(field("n"), n);
    raw({"HSET", key(), f, good});
  }
  EXPECT_TRUE(reserve(1).granted);
}

// Issue 11 asks for <= 100 bytes per limiter key (MEMORY USAGE). This layout (a hash: cfg, s, n, r)
// takes 112 bytes under a one-byte key name on Redis 7.0 (jemalloc size classes: 96 needs a
// listpack a few bytes shorter); the key name adds its length. NOT MET YET: the test records the
// size and guards against growth (<= 128 under a short name); see the report for the options.
TEST_F(SmoothScript, OneSmallKeyPerLimiter) {
  auto measure = [&](const Config& c, std::int64_t permits) {
    raw({"DEL", key()});
    EXPECT_TRUE(init(c).first);
    (void)reserve(permits);
    raw({"RENAME", key(), "k"});  // a short name: measure the layout, not the test's prefix
    const std::int64_t bytes = raw({"MEMORY", "USAGE", "k"}).integer;
    raw({"DEL", "k"});
    return bytes;
  };
  const std::int64_t bursty = measure({5, kSecond, kSecond, 0, 1, 1}, 3);
  const std::int64_t warm = measure({100, kSecond, 0, 60 * kSecond, 3, 1}, 1500);
  std::printf("[ memory ] key \"k\": bursty %lld bytes, warming-up %lld bytes\n", static_cast<long long>(bursty),
              static_cast<long long>(warm));
  EXPECT_LE(bursty, 128);
  EXPECT_LE(warm, 128);
}

}  // namespace
