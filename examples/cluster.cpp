// cluster: per-tenant limits on a Redis Cluster. Each tenant has a Redisson-compatible limiter
// and two limits (Limiters, one key per tenant) decided together by a MultiLimit; the tenants
// spread over the cluster's primaries, and each tenant's keys share one slot through the hash tag
// in their names.
//
//   cluster [redis-cluster://host:port[,host:port...]]   (default: $REDLIMIT_URI)
//
// The test suite runs it against a throwaway 3-primary cluster (`with-redis --cluster`).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "redlimit/redlimit.hpp"

int main(int argc, char** argv) try {
  using namespace std::chrono;
  std::string uri = "redis-cluster://127.0.0.1:7000";
  if (const char* env = std::getenv("REDLIMIT_URI")) uri = env;
  if (argc == 2) uri = argv[1];
  try {
    // Seed nodes only: the client learns the slot map from the cluster and follows it.
    auto client = redlimit::Client::fromUri(uri);

    constexpr int kTenants = 6;
    constexpr std::int64_t kRate = 5;
    int failures = 0;
    // Two limits decided together, all or nothing: 3 per second and 4 per minute, per tenant.
    redlimit::Limiter perSecond(client, "per-second", redlimit::Policy::tokenBucket(3, 3, seconds(1)));
    redlimit::Limiter perMinute(client, "per-minute", redlimit::Policy::fixedWindow(4, minutes(1)));
    const redlimit::MultiLimit both({perSecond, perMinute});
    for (int t = 0; t < kTenants; ++t) {
      const std::string tag = fmt::format("{{tenant-{}}}", t);  // "{tenant-3}": one slot per tenant

      // A limiter Java services can share through Redisson: its keys are "{tenant-3}:api",
      // "{tenant-3}:api:value", ..., all in the tenant's slot.
      redlimit::RateLimiter api(client, tag + ":api");
      api.setRate(redlimit::RateType::Overall, kRate, seconds(10));
      int granted = 0;
      for (int i = 0; i < 8; ++i) granted += api.tryAcquire() ? 1 : 0;

      // The tenant's keys: "rl:per-second:{tenant-3}" and "rl:per-minute:{tenant-3}", one slot.
      redlimit::MultiLimit tenant = both.on({tag, tag});
      int together = 0;
      for (int i = 0; i < 6; ++i) together += tenant.tryAcquire() ? 1 : 0;

      fmt::print("tenant {}: api {}/8 granted (rate {}), per-second AND per-minute {}/6 granted (3/s)\n", t, granted,
                 kRate, together);
      if (granted != kRate || together != 3) ++failures;
      api.deleteLimiter();
      (void)perSecond.deleteKey(tag);
      (void)perMinute.deleteKey(tag);
    }
    const redlimit::PoolStats stats = client->poolStats();
    fmt::print("connections opened: {} (one pool per primary)\n", stats.created);
    if (failures != 0) {
      fmt::print(stderr, "cluster: {} tenants did not get exactly their limits\n", failures);
      return 1;
    }
    return 0;
  } catch (const redlimit::Error& e) {
    fmt::print(stderr, "cluster: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "cluster", e.what());
  return 1;
}
