#include "redlimit/keyed_distributed_smooth_rate_limiter.hpp"

#include "limiters/keyed_policy.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

namespace {

const detail::Script kSmooth{detail::lua::smooth.name, detail::lua::smooth.sha1, detail::lua::smooth.source};

SmoothConfig checked(SmoothConfig c, bool permanentKeys) {
  DistributedSmoothRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

detail::KeyedPolicy policyOf(const SmoothConfig& c) {
  if (c.isWarmingUp()) return detail::smoothPolicy(c.permits, c.interval, c.warmupPeriod, c.coldFactor, c.keepAlive);
  return detail::smoothPolicy(c.permits, c.interval, c.maxBurst, 0, c.keepAlive);
}

}  // namespace

KeyedDistributedSmoothRateLimiter::KeyedDistributedSmoothRateLimiter(std::shared_ptr<Client> client, std::string name,
                                                                     const SmoothConfig& config,
                                                                     KeyedRateLimiterOptions options)
    : KeyedScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kSmooth, 'S',
                         policyOf(checked(config, options.permanentKeys))),
      config_(checked(config, options.permanentKeys)) {}

}  // namespace redlimit
