// segment_worker: one "node" of the cluster-wide SegmentedRateLimiter test. Runs `threads`
// threads calling tryAcquire() on a SegmentedRateLimiter over the real RateLimiter from
// `startAtMs` (epoch ms) for `durationMs`. With sessionPermits > 0 it works in sessions: once
// the node has used that many permits it stays silent for `idleMs`, so its idle give-back runs
// in the middle of the load (sessionPermits = 0: calls without pause). Then it closes the
// limiter and prints what happened:
//   G <grant time, server epoch ms> <permits granted> <member hex>   one per grant Redis made
//   R <member hex> <permits asked> <permits released>                one per give-back
//   U <count>                                                        permits used locally
//   S <localGrants> <directGrants> <fromRemote> <returned> <expired> <held> <roundTrips>
// The grants and give-backs are Redis's own replies, recorded by a source that forwards to
// RateLimiter, so the test can rebuild the sorted set's history and check it against Redis.
//
// Usage: segment_worker URI NAME SEGMENT THREADS START_AT_MS DURATION_MS SESSION_PERMITS IDLE_MS
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redlimit_test/hex.hpp"
#include "redlimit/client.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"

namespace {

using namespace redlimit;

using redlimit::test::hex;

// Forwards to a RateLimiter and records every grant and give-back it answers.
class RecordingSource {
 public:
  RecordingSource(std::shared_ptr<Client> client, std::string name) : limiter_(std::move(client), std::move(name)) {}

  detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
    detail::AcquireResult r =
        redlimit::detail::SegmentAccess<redlimit::RateLimiter>::tryAcquireUpTo(limiter_, {}, atLeast, atMost);
    if (r.granted > 0) {
      std::lock_guard<std::mutex> lk(m_);
      log_ += "G " + std::to_string(r.grantTime.count()) + " " + std::to_string(r.granted) + " " + hex(r.member) + "\n";
    }
    return r;
  }
  std::int64_t releaseGrant(const std::string& member, std::int64_t permits) {
    const std::int64_t released =
        redlimit::detail::SegmentAccess<redlimit::RateLimiter>::releaseGrant(limiter_, member, permits);
    std::lock_guard<std::mutex> lk(m_);
    log_ += "R " + hex(member) + " " + std::to_string(permits) + " " + std::to_string(released) + "\n";
    return released;
  }
  std::string log() {
    std::lock_guard<std::mutex> lk(m_);
    return log_;
  }

 private:
  RateLimiter limiter_;
  std::mutex m_;
  std::string log_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s URI NAME SEGMENT THREADS START_AT_MS DURATION_MS SESSION_PERMITS IDLE_MS\n",
                 argv[0]);
    return 2;
  }
  try {
    const std::string uri = argv[1], name = argv[2];
    const std::int64_t segment = std::atoll(argv[3]);
    const int threads = std::atoi(argv[4]);
    const std::chrono::system_clock::time_point startAt{std::chrono::milliseconds{std::atoll(argv[5])}};
    const std::chrono::milliseconds duration{std::atoll(argv[6])};
    const std::int64_t sessionPermits = std::atoll(argv[7]);
    const std::chrono::milliseconds idle{std::atoll(argv[8])};

    ClientOptions options;
    options.pool.size = 2;
    auto source = std::make_shared<RecordingSource>(Client::fromUri(uri, options), name);
    SegmentOptions segmentOptions;
    segmentOptions.segmentSize = segment;
    SegmentedRateLimiter<RecordingSource> limiter(source, segmentOptions);

    std::this_thread::sleep_until(startAt);
    const auto stopAt = std::chrono::steady_clock::now() + duration;
    std::atomic<std::int64_t> sessionUsed{0};
    std::atomic<std::chrono::steady_clock::rep> idleUntil{0};
    std::vector<std::int64_t> used(static_cast<std::size_t>(threads), 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::int64_t n = 0;
        for (auto now = std::chrono::steady_clock::now(); now < stopAt; now = std::chrono::steady_clock::now()) {
          const std::chrono::steady_clock::time_point quietUntil{std::chrono::steady_clock::duration{idleUntil.load()}};
          if (now < quietUntil) {
            std::this_thread::sleep_until(std::min(quietUntil, stopAt));
            continue;
          }
          if (!limiter.tryAcquire()) continue;
          ++n;
          if (sessionPermits > 0 && sessionUsed.fetch_add(1) + 1 == sessionPermits) {
            sessionUsed.store(0);
            idleUntil.store((std::chrono::steady_clock::now() + idle).time_since_epoch().count());
          }
        }
        used[static_cast<std::size_t>(t)] = n;
      });
    }
    for (auto& th : pool) th.join();
    limiter.close();

    std::int64_t total = 0;
    for (std::int64_t n : used) total += n;
    const SegmentStats s = limiter.stats();
    std::string out = source->log();
    out += "U " + std::to_string(total) + "\n";
    out += "S " + std::to_string(s.localGrants) + " " + std::to_string(s.directGrants) + " " +
           std::to_string(s.permitsFromRemote) + " " + std::to_string(s.permitsReturned) + " " +
           std::to_string(s.permitsExpired) + " " + std::to_string(s.permitsHeld) + " " +
           std::to_string(s.remoteRoundTrips) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "segment_worker: %s\n", e.what());
    return 1;
  }
}
