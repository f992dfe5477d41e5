// one_key_worker KIND URI NAME KEY THREADS DURATION_MS MAX_WAIT_US: hammers the key KEY of the
// Limiter NAME, whose policy of KIND (token_bucket, gcra, fixed_window or smooth) is stored in the
// key (Policy::stored: the test wrote it with trySetPolicy), from THREADS threads for DURATION_MS. Thread 0
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

#include <optional>

#include "redlimit/limiter.hpp"
#include "redlimit/policy.hpp"

namespace {

// A stored policy of `kind`: each key's own configuration decides, so its numbers do not matter.
std::optional<redlimit::Policy> storedPolicy(const std::string& kind) {
  const std::chrono::seconds second(1);
  if (kind == "token_bucket") return redlimit::Policy::tokenBucket(1, 1, second).stored();
  if (kind == "gcra") return redlimit::Policy::gcra(1, second, 1).stored();
  if (kind == "fixed_window") return redlimit::Policy::fixedWindow(1, second).stored();
  if (kind == "smooth") return redlimit::Policy::smoothBursty(1, second).stored();
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: one_key_worker KIND URI NAME KEY THREADS DURATION_MS MAX_WAIT_US\n");
    return 2;
  }
  try {
    const std::string key = argv[4];
    const int threads = std::atoi(argv[5]);
    const auto duration = std::chrono::milliseconds(std::atoll(argv[6]));
    const auto maxWait = std::chrono::microseconds(std::atoll(argv[7]));
    redlimit::ClientOptions options;
    options.pool.size = static_cast<std::size_t>(threads);
    auto client = redlimit::Client::fromUri(argv[2], options);
    const std::optional<redlimit::Policy> policy = storedPolicy(argv[1]);
    if (!policy) {
      std::fprintf(stderr, "one_key_worker: unknown kind %s\n", argv[1]);
      return 2;
    }
    redlimit::Limiter limiter(client, argv[3], *policy);
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
            redlimit::Decision r;
            if (t == 0 && maxWait.count() > 0) {
              r = limiter.reserve(key, permits, maxWait);
            } else {
              r = limiter.decide(key, permits);
            }
            if (r.allowed) mine.emplace_back((r.time + r.delay).count(), permits);
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
