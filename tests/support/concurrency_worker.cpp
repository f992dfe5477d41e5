// concurrency_worker: one process of the multi-process tests of a Limiter under a concurrency
// policy (tests/integration/limiter_leases_test.cpp). NAME is the Limiter's name, KEY the key whose
// leases it takes, under Policy::concurrency(LIMIT, TTL_MS).
//
//   concurrency_worker hold URI NAME KEY LIMIT TTL_MS COUNT
//     acquires COUNT leases of TTL_MS (asking until it has them), prints their ids, one a line,
//     then "held", and sleeps until it is killed: the crashed holder.
//   concurrency_worker churn URI NAME KEY LIMIT TTL_MS THREADS DURATION_MS
//     THREADS threads acquire a lease, hold it about 1 ms, and release it, for DURATION_MS. Prints
//     "grants denials errors maxInProcess": maxInProcess is the most leases this process held at
//     once, counted by the holders themselves.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/limiter.hpp"

namespace {

int hold(redlimit::Limiter& limiter, const std::string& key, int count) {
  std::vector<redlimit::Lease> leases;
  while (static_cast<int>(leases.size()) < count) {
    if (auto lease = limiter.acquireLease(key).lease) {
      leases.push_back(*lease);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (const auto& l : leases) std::printf("%s\n", l.id.c_str());
  std::printf("held\n");
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

int churn(redlimit::Limiter& limiter, const std::string& key, int threads, std::chrono::milliseconds duration) {
  std::atomic<long> grants{0}, denials{0}, errors{0};
  std::atomic<int> inProcess{0}, maxInProcess{0};
  const auto end = std::chrono::steady_clock::now() + duration;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (std::chrono::steady_clock::now() < end) {
        try {
          const std::optional<redlimit::Lease> lease = limiter.acquireLease(key).lease;
          if (!lease) {
            denials.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            continue;
          }
          grants.fetch_add(1);
          const int now = inProcess.fetch_add(1) + 1;
          int seen = maxInProcess.load();
          while (now > seen && !maxInProcess.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          inProcess.fetch_sub(1);
          if (!limiter.release(key, *lease)) {
            errors.fetch_add(1);
            std::fprintf(stderr, "concurrency_worker: a live lease was not released\n");
          }
        } catch (const redlimit::Error& e) {
          errors.fetch_add(1);
          std::fprintf(stderr, "concurrency_worker: %s\n", e.what());
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("%ld %ld %ld %d\n", grants.load(), denials.load(), errors.load(), maxInProcess.load());
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr,
                 "usage: concurrency_worker hold URI NAME KEY LIMIT TTL_MS COUNT\n"
                 "       concurrency_worker churn URI NAME KEY LIMIT TTL_MS THREADS DURATION_MS\n");
    return 2;
  }
  try {
    const std::string mode = argv[1];
    const std::string key = argv[4];
    redlimit::ClientOptions options;
    options.pool.size = 4;
    auto client = redlimit::Client::fromUri(argv[2], options);
    redlimit::Limiter limiter(
        client, argv[3],
        redlimit::Policy::concurrency(std::atoll(argv[5]), std::chrono::milliseconds(std::atoll(argv[6]))));
    if (mode == "hold") return hold(limiter, key, std::atoi(argv[7]));
    if (mode == "churn" && argc == 9) {
      return churn(limiter, key, std::atoi(argv[7]), std::chrono::milliseconds(std::atoll(argv[8])));
    }
    std::fprintf(stderr, "concurrency_worker: bad mode or arguments\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "concurrency_worker: %s\n", e.what());
    return 1;
  }
}
