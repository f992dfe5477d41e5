// limiter_worker URI NAME THREADS DURATION_MS: hammers the limiter NAME with tryAcquire() from
// THREADS threads for DURATION_MS and prints the number of grants. Used by the multi-process
// integration tests: each worker is a separate process with its own Client.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/rate_limiter.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: limiter_worker URI NAME THREADS DURATION_MS\n");
    return 2;
  }
  try {
    const int threads = std::atoi(argv[3]);
    const auto duration = std::chrono::milliseconds(std::atoll(argv[4]));
    redlimit::ClientOptions options;
    options.pool.size = static_cast<std::size_t>(threads);
    auto client = redlimit::Client::fromUri(argv[1], options);
    redlimit::RateLimiter limiter(client, argv[2]);
    std::atomic<long> grants{0};
    std::atomic<long> errors{0};
    const auto end = std::chrono::steady_clock::now() + duration;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        while (std::chrono::steady_clock::now() < end) {
          try {
            if (limiter.tryAcquire()) grants.fetch_add(1);
          } catch (const redlimit::Error& e) {
            errors.fetch_add(1);
            std::fprintf(stderr, "limiter_worker: %s\n", e.what());
          }
        }
      });
    }
    for (auto& t : pool) t.join();
    std::printf("%ld %ld\n", grants.load(), errors.load());
    return errors.load() == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "limiter_worker: %s\n", e.what());
    return 1;
  }
}
