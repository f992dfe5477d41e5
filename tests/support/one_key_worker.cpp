// one_key_worker KIND URI NAME THREADS DURATION_MS MAX_WAIT_US: hammers the one-key limiter NAME
// (KIND: token_bucket, gcra, fixed_window or smooth) from THREADS threads for DURATION_MS. Thread 0
// reserves (maxWait MAX_WAIT_US, without sleeping the delay) when MAX_WAIT_US > 0; the others call
// decide(), asking for 1 or 2 permits in turn. Prints "grants errors" and then one line per grant:
// "useTimeUs permits", where useTime is the server time of the decision plus the reservation's
// delay (when the permits may be used). Output is buffered until the end.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "redlimit/distributed_smooth_rate_limiter.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"

namespace {

// shared_ptr: it deletes the limiter as the class it was made as.
std::shared_ptr<redlimit::detail::ScriptLimiter> makeLimiter(const std::string& kind,
                                                             const std::shared_ptr<redlimit::Client>& client,
                                                             const std::string& name) {
  if (kind == "token_bucket") return std::make_shared<redlimit::TokenBucketRateLimiter>(client, name);
  if (kind == "gcra") return std::make_shared<redlimit::GcraRateLimiter>(client, name);
  if (kind == "fixed_window") return std::make_shared<redlimit::FixedWindowRateLimiter>(client, name);
  if (kind == "smooth") return std::make_shared<redlimit::DistributedSmoothRateLimiter>(client, name);
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: one_key_worker KIND URI NAME THREADS DURATION_MS MAX_WAIT_US\n");
    return 2;
  }
  try {
    const int threads = std::atoi(argv[4]);
    const auto duration = std::chrono::milliseconds(std::atoll(argv[5]));
    const auto maxWait = std::chrono::microseconds(std::atoll(argv[6]));
    redlimit::ClientOptions options;
    options.pool.size = static_cast<std::size_t>(threads);
    auto client = redlimit::Client::fromUri(argv[2], options);
    auto limiter = makeLimiter(argv[1], client, argv[3]);
    if (!limiter) {
      std::fprintf(stderr, "one_key_worker: unknown kind %s\n", argv[1]);
      return 2;
    }
    std::mutex mutex;
    std::vector<std::pair<long long, long long>> grants;
    std::atomic<long> errors{0};
    const auto end = std::chrono::steady_clock::now() + duration;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<std::pair<long long, long long>> mine;
        std::int64_t permits = 1;
        while (std::chrono::steady_clock::now() < end) {
          try {
            redlimit::Reservation r;
            if (t == 0 && maxWait.count() > 0) {
              r = limiter->reserve(permits, maxWait);
            } else {
              r.decision = limiter->decide(permits);
            }
            if (r.decision.allowed) mine.emplace_back((r.decision.time + r.delay).count(), permits);
          } catch (const redlimit::Error& e) {
            errors.fetch_add(1);
            std::fprintf(stderr, "one_key_worker: %s\n", e.what());
          }
          permits = 3 - permits;
        }
        std::lock_guard<std::mutex> lock(mutex);
        grants.insert(grants.end(), mine.begin(), mine.end());
      });
    }
    for (auto& th : pool) th.join();
    std::printf("%zu %ld\n", grants.size(), errors.load());
    for (const auto& g : grants) std::printf("%lld %lld\n", g.first, g.second);
    return errors.load() == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "one_key_worker: %s\n", e.what());
    return 1;
  }
}
