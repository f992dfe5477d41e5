// Uses every header of redlimit::local, with no Redis: the clocks, SmoothRateLimiter,
// LocalTokenBucket and the segment cache's word. Exits non-zero if a result is wrong.
#include <chrono>
#include <cstdio>
#include <exception>

#include <redlimit/clock.hpp>
#include <redlimit/detail/segment_word.hpp>
#include <redlimit/local_token_bucket.hpp>
#include <redlimit/smooth_rate_limiter.hpp>

int main() try {
  using std::chrono::milliseconds;
  redlimit::ManualClock clock;
  using Clock = redlimit::ClockRef<redlimit::ManualClock>;

  auto smooth = redlimit::BasicSmoothRateLimiter<Clock>::bursty(10.0, 1.0, Clock(clock));
  const auto waited = smooth.acquire();  // first permit: no wait
  redlimit::BasicLocalTokenBucket<Clock> bucket(2, 1, milliseconds(100), Clock(clock));
  const bool two = bucket.tryAcquire(2), third = bucket.tryAcquire();
  clock.advance(milliseconds(100));
  const bool refilled = bucket.tryAcquire();

  redlimit::detail::SegmentWord word;
  word.install(word.takeAll(), 3, 10);
  const bool took = word.tryTake(3, [] { return std::int64_t{0}; });

  const bool ok = waited.count() == 0 && two && !third && refilled && took && word.left() == 0;
  std::printf("local consumer: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "local_project", e.what());
  return 1;
}
