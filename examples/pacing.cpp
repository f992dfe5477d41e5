// Pacing an outbound client at 50 requests/s with a warm-up, in-process (no Redis).
//
// A service that has been idle should not hit its backend at full speed at once: caches are
// cold, connections are new. A warming-up SmoothRateLimiter starts at a third of the rate
// (cold factor 3) and reaches 50 requests/s after one second of use. Best-effort traffic
// (here a metrics ping) uses tryAcquire(): it goes out when the client paused long enough to
// leave a permit free, and is skipped rather than delayed otherwise. Runs in under 3 s and
// prints what it sent, per quarter second.
#include <redlimit/smooth_rate_limiter.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

// Stands in for the real client call; records when each request went out.
struct FakeBackend {
  Clock::time_point start = Clock::now();
  std::vector<double> sentAt;  // seconds since start
  void send() { sentAt.push_back(std::chrono::duration<double>(Clock::now() - start).count()); }
};

}  // namespace

int main() try {
  constexpr int kRequests = 100;
  auto limiter = redlimit::SmoothRateLimiter::warmingUp(50.0, std::chrono::seconds{1});
  FakeBackend backend;
  int pingsSent = 0;
  int pingsSkipped = 0;
  std::chrono::microseconds totalWait{0};

  for (int i = 0; i < kRequests; ++i) {
    if (i % 25 == 24) {  // now and then the client is busy with something else for a while
      std::this_thread::sleep_for(std::chrono::milliseconds{60});
    }
    if (i % 5 == 4) {  // best effort: only if a permit is free right now
      if (limiter.tryAcquire()) {
        ++pingsSent;
      } else {
        ++pingsSkipped;
      }
    }
    const std::chrono::microseconds waited = limiter.acquire();  // blocks until our turn
    totalWait += waited;
    if (i < 3 || i == 30 || i == kRequests - 1) {
      fmt::print("request {:3} waited {:6.1f} ms\n", i, static_cast<double>(waited.count()) / 1e3);
    }
    backend.send();
  }

  const double elapsed = backend.sentAt.back();
  fmt::print(
      "\nsent {} requests in {:.2f} s (waited {:.2f} s in total); metrics pings: {} sent, "
      "{} skipped\n",
      kRequests, elapsed, static_cast<double>(totalWait.count()) / 1e6, pingsSent, pingsSkipped);
  fmt::print(
      "requests per quarter second (cold start at ~17/s, stable at 50/s = 12.5 per "
      "quarter):\n");
  const auto quarters = static_cast<int>(elapsed / 0.25) + 1;
  for (int q = 0; q < quarters; ++q) {
    int count = 0;
    for (double t : backend.sentAt) {
      if (t >= q * 0.25 && t < (q + 1) * 0.25) ++count;
    }
    constexpr std::string_view kBar = "##################################################";
    fmt::print("  {:4.2f}-{:4.2f} s: {:2}  {:.{}}\n", q * 0.25, (q + 1) * 0.25, count, kBar, count);
  }
  return 0;
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "pacing", e.what());
  return 1;
}
