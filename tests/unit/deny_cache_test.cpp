// DenyCache (redlimit/detail/deny_cache.hpp) on a manual clock: what it answers, when it forgets,
// and its bound.
#include "redlimit/detail/deny_cache.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "redlimit/clock.hpp"

namespace redlimit {
namespace {

using std::chrono::microseconds;
using Cache = detail::DenyCache<ClockRef<ManualClock>>;

// A denial of `permits` by Redis, to be retried after `retryAfterUs`.
Cache::Denial denialOf(std::int64_t permits, std::int64_t retryAfterUs) {
  Cache::Denial d;
  d.permits = permits;
  d.retryAfter = microseconds{retryAfterUs};
  d.remaining = 0;
  d.resetAfter = microseconds{retryAfterUs * 2};
  d.limit = 10;
  d.time = microseconds{1'000'000};
  return d;
}

TEST(DenyCache, NeverAnswersGranted) {
  // The answer's type has no "allowed": it is a denial or nothing.
  static_assert(std::is_same_v<decltype(std::declval<Cache&>().denied("k", 1)), std::optional<Cache::Denial>>);
  ManualClock clock;
  Cache cache(100, ClockRef<ManualClock>(clock));
  cache.remember("k", cache.ticket(), denialOf(3, 1000));
  int denials = 0;
  for (int t = 0; t < 1200; t += 7) {
    for (std::int64_t permits = 1; permits <= 5; ++permits) {
      const std::optional<Cache::Denial> d = cache.denied("k", permits);
      if (!d) continue;
      ++denials;
      EXPECT_GE(permits, 3);
      EXPECT_GT(d->retryAfter.count(), 0);
      EXPECT_EQ(d->retryAfter.count(), 1000 - t);
    }
    clock.advance(microseconds{7});
  }
  EXPECT_EQ(denials, 3 * 143);  // t = 0, 7, ..., 994: permits 3, 4 and 5
}

TEST(DenyCache, ForgetsAKeyAtItsRetryAfter) {
  ManualClock clock(microseconds{5000});
  Cache cache(100, ClockRef<ManualClock>(clock));
  const Cache::Ticket sent = cache.ticket();  // the call leaves at 5000 µs
  clock.advance(microseconds{300});           // Redis's answer arrives 300 µs later
  cache.remember("k", sent, denialOf(1, 2000));
  clock.advance(microseconds{1699});  // 6999: until is 5000 + 2000, counted from the send
  const std::optional<Cache::Denial> last = cache.denied("k", 1);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->retryAfter, microseconds{1});
  EXPECT_EQ(last->time, microseconds{1'000'000 + 1999});  // the denial's server time, moved on locally
  clock.advance(microseconds{1});                         // 7000
  EXPECT_FALSE(cache.denied("k", 1).has_value());
  EXPECT_EQ(cache.size(), 0u);
}

TEST(DenyCache, SendsPermitsBelowTheDeniedOnesToRedis) {
  ManualClock clock;
  Cache cache(100, ClockRef<ManualClock>(clock));
  cache.remember("k", cache.ticket(), denialOf(4, 1000));
  EXPECT_FALSE(cache.denied("k", 3).has_value());
  EXPECT_TRUE(cache.denied("k", 4).has_value());
  EXPECT_TRUE(cache.denied("k", 9).has_value());
  EXPECT_FALSE(cache.denied("other", 9).has_value());
  // A later denial of fewer permits replaces the first.
  cache.remember("k", cache.ticket(), denialOf(2, 500));
  EXPECT_TRUE(cache.denied("k", 3).has_value());
  EXPECT_EQ(cache.denied("k", 2)->retryAfter, microseconds{500});
  EXPECT_EQ(cache.size(), 1u);
}

TEST(DenyCache, EvictsTheLeastRecentlyUsed) {
  ManualClock clock;
  Cache cache(3, ClockRef<ManualClock>(clock));
  for (const char* k : {"a", "b", "c"}) cache.remember(k, cache.ticket(), denialOf(1, 1000));
  ASSERT_TRUE(cache.denied("a", 1).has_value());  // a is used: b is now the least recently used
  cache.remember("d", cache.ticket(), denialOf(1, 1000));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_FALSE(cache.denied("b", 1).has_value());
  EXPECT_TRUE(cache.denied("a", 1).has_value());
  EXPECT_TRUE(cache.denied("c", 1).has_value());
  EXPECT_TRUE(cache.denied("d", 1).has_value());
  cache.remember("c", cache.ticket(), denialOf(1, 900));  // remembered again: c is the most recent
  cache.remember("e", cache.ticket(), denialOf(1, 1000));
  EXPECT_FALSE(cache.denied("a", 1).has_value());
  EXPECT_TRUE(cache.denied("c", 1).has_value());
}

TEST(DenyCache, StaysWithinItsCapUnderAMillionDistinctDeniedKeys) {
  ManualClock clock;
  constexpr std::size_t kCap = 10000;
  Cache cache(kCap, ClockRef<ManualClock>(clock));
  std::size_t most = 0;
  std::string key;
  const Cache::Ticket sent = cache.ticket();
  const Cache::Denial denial = denialOf(1, 60'000'000);
  for (int i = 0; i < 1'000'000; ++i) {
    key = "user:" + std::to_string(i);
    cache.remember(key, sent, denial);
    if (i % 10'000 == 0) most = std::max(most, cache.size());
  }
  most = std::max(most, cache.size());
  EXPECT_LE(most, kCap);
  EXPECT_EQ(cache.size(), kCap);                  // full: the shards' caps add up to the cap
  EXPECT_TRUE(cache.denied(key, 1).has_value());  // the newest is there, the oldest gone
  EXPECT_FALSE(cache.denied("user:0", 1).has_value());
}

TEST(DenyCache, ForgetsWhatACallInFlightDuringAGiveBackWouldRemember) {
  ManualClock clock;
  Cache cache(100, ClockRef<ManualClock>(clock));
  const Cache::Ticket before = cache.ticket();
  cache.forget("k");  // this process gave permits back while the call was in flight
  cache.remember("k", before, denialOf(1, 1000));
  EXPECT_FALSE(cache.denied("k", 1).has_value());
  cache.remember("k", cache.ticket(), denialOf(1, 1000));
  EXPECT_TRUE(cache.denied("k", 1).has_value());
  cache.remember("j", cache.ticket(), denialOf(1, 1000));
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.denied("j", 1).has_value());
}

TEST(DenyCache, RemembersNothingWithACapOfZeroOrADenialAlreadyOver) {
  ManualClock clock;
  Cache off(0, ClockRef<ManualClock>(clock));
  off.remember("k", off.ticket(), denialOf(1, 1000));
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.denied("k", 1).has_value());
  Cache cache(10, ClockRef<ManualClock>(clock));
  const Cache::Ticket sent = cache.ticket();
  clock.advance(microseconds{1000});  // the answer came as late as its retryAfter
  cache.remember("k", sent, denialOf(1, 1000));
  EXPECT_EQ(cache.size(), 0u);
}

// 8 threads looking up, remembering and forgetting 64 keys of a 16-key cache (and the clock moving):
// every answer a denial of the permits remembered, never more keys than the cap.
TEST(DenyCache, EightThreadsLookUpRememberAndForgetTogether) {
  ManualClock clock;
  Cache cache(16, ClockRef<ManualClock>(clock));
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0), denials(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        const std::string key = "k" + std::to_string((i * 7 + t) % 64);
        switch (i % 5) {
          case 0:
            cache.remember(key, cache.ticket(), denialOf(2, 1000));
            break;
          case 1:
            if (t == 0) cache.forget(key);
            break;
          case 2:
            if (t == 1) clock.advance(microseconds{1});
            break;
          default:
            if (const std::optional<Cache::Denial> d = cache.denied(key, 2 + i % 2)) {
              ++denials[static_cast<std::size_t>(t)];
              if (d->permits != 2 || d->retryAfter.count() <= 0) ++bad[static_cast<std::size_t>(t)];
            }
        }
        if (i % 1000 == 0 && cache.size() > 16) ++bad[static_cast<std::size_t>(t)];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  int totalBad = 0, totalDenials = 0;
  for (int t = 0; t < 8; ++t) {
    totalBad += bad[static_cast<std::size_t>(t)];
    totalDenials += denials[static_cast<std::size_t>(t)];
  }
  EXPECT_EQ(totalBad, 0);
  EXPECT_GT(totalDenials, 0);
  EXPECT_LE(cache.size(), 16u);
}

}  // namespace
}  // namespace redlimit
