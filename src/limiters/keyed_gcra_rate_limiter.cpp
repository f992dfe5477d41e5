#include "redlimit/keyed_gcra_rate_limiter.hpp"

#include "limiters/keyed_policy.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

namespace {

const detail::Script kGcra{detail::lua::gcra.name, detail::lua::gcra.sha1, detail::lua::gcra.source};

GcraConfig checked(GcraConfig c, bool permanentKeys) {
  GcraRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

detail::KeyedPolicy policyOf(const GcraConfig& c) {
  return detail::gcraPolicy('G', c.burst, c.rate, c.period, c.keepAlive);
}

}  // namespace

KeyedGcraRateLimiter::KeyedGcraRateLimiter(std::shared_ptr<Client> client, std::string name, const GcraConfig& config,
                                           KeyedRateLimiterOptions options)
    : KeyedScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kGcra, 'G',
                         policyOf(checked(config, options.permanentKeys))),
      config_(checked(config, options.permanentKeys)) {}

}  // namespace redlimit
