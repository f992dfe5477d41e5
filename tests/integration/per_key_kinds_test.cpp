// Per-key limits at scale (issue 25), the rest: the clock-step clamp. Against a real redis-server.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/redlimit.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

GcraConfig gcra(std::int64_t burst, std::int64_t rate, milliseconds period) {
  GcraConfig c;
  c.burst = burst;
  c.rate = rate;
  c.period = period;
  return c;
}

// Little-endian fields, as the scripts' struct.pack writes them.
void putLe(std::string& out, std::int64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xffU));
}

// A GCRA or token bucket key (lua/lib/gcra_core.lua): kind, B, P, I ms, keepAlive ms, TAT µs, remainder.
std::string gcraValue(char kind, std::int64_t b, std::int64_t p, std::int64_t intervalMs, std::int64_t tatUs) {
  std::string v(1, kind);
  for (const std::int64_t f : {b, p, intervalMs, std::int64_t{0}}) putLe(v, f, 4);
  putLe(v, tatUs, 7);
  putLe(v, 0, 4);
  return v;
}

// A fixed window key (lua/lib/fixed_window_core.lua): 'W', L, W ms, keepAlive ms, start µs, count, next count.
std::string windowValue(std::int64_t l, std::int64_t windowMs, std::int64_t startUs, std::int64_t count) {
  std::string v(1, 'W');
  for (const std::int64_t f : {l, windowMs, std::int64_t{0}}) putLe(v, f, 4);
  putLe(v, startUs, 7);
  putLe(v, count, 4);
  putLe(v, 0, 4);
  return v;
}

constexpr std::int64_t kHour = 3'600'000'000;                       // µs
constexpr std::int64_t kTwo53Minus1 = (std::int64_t{1} << 53) - 1;  // the largest TAT a key may hold

}  // namespace

class PerKeyKinds : public RedisTest {
 protected:
  std::int64_t now() { return serverTimeUs(admin()); }
  void set(const std::string& key, const std::string& value) { (void)raw({"SET", key, value}); }
  std::int64_t pttl(const std::string& key) { return raw({"PTTL", key}).integer; }
};

// --- (d) the clock-step clamp --------------------------------------------------------------------

// A stored time an hour (or 2^53-1 µs) ahead of the server's clock, as a server clock stepped back
// leaves it: the denial lasts one horizon plus one permit (GCRA, token bucket), never the step.
TEST_F(PerKeyKinds, AStoredTimeFarAheadIsClampedForGcraAndTheTokenBucket) {
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
  // The limit in the call meets the same clamp.
  const std::string key = name("keyed");
  set(key, gcraValue('G', 2, 2, 200, now() + kHour));
  KeyedGcraRateLimiter keyed(client(), "api", gcra(2, 2, milliseconds(200)));
  EXPECT_LE(keyed.decide(key).retryAfter.count(), 300000);
}

// What legitimately puts TAT ahead (reservations, up to the horizon) is not clamped.
TEST_F(PerKeyKinds, ReservationsWithinTheHorizonAreNotClamped) {
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

TEST_F(PerKeyKinds, AStoredWindowFarAheadIsClampedToTheNextWindow) {
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
