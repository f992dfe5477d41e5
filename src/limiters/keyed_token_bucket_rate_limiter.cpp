#include "redlimit/keyed_token_bucket_rate_limiter.hpp"

#include "limiters/keyed_policy.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

namespace {

const detail::Script kGcra{detail::lua::gcra.name, detail::lua::gcra.sha1, detail::lua::gcra.source};

TokenBucketConfig checked(TokenBucketConfig c, bool permanentKeys) {
  TokenBucketRateLimiter::validateConfig(c);
  if (c.initialTokens) {
    throw InvalidArgument("redlimit: a KeyedTokenBucketRateLimiter's keys start full: initialTokens must be empty");
  }
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

detail::KeyedPolicy policyOf(const TokenBucketConfig& c) {
  return detail::gcraPolicy('T', c.capacity, c.refillPermits, c.refillInterval, c.keepAlive);
}

}  // namespace

KeyedTokenBucketRateLimiter::KeyedTokenBucketRateLimiter(std::shared_ptr<Client> client, std::string name,
                                                         const TokenBucketConfig& config,
                                                         KeyedRateLimiterOptions options)
    : KeyedScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kGcra, 'T',
                         policyOf(checked(config, options.permanentKeys))),
      config_(checked(config, options.permanentKeys)) {}

}  // namespace redlimit
