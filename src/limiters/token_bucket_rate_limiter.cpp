#include "redlimit/token_bucket_rate_limiter.hpp"

#include <fmt/format.h>

#include "config/config_checks.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

const detail::Script kGcra{detail::lua::gcra.name, detail::lua::gcra.sha1, detail::lua::gcra.source};

std::vector<std::string> configArgs(const TokenBucketConfig& c) {
  return {fmt::to_string(c.capacity), fmt::to_string(c.refillPermits), fmt::to_string(c.refillInterval.count()),
          fmt::to_string(c.keepAlive.count()), fmt::to_string(c.initialTokens.value_or(c.capacity))};
}

// The configuration a handle made with one sends: keepAlive 0 becomes the idle margin.
TokenBucketConfig sent(TokenBucketConfig c, bool permanentKeys) {
  TokenBucketRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

detail::KeyedPolicy policyOf(const TokenBucketConfig& c) {
  return detail::gcraPolicy('T', c.capacity, c.refillPermits, c.refillInterval, c.keepAlive);
}

}  // namespace

TokenBucketRateLimiter::TokenBucketRateLimiter(std::shared_ptr<Client> client, std::string name,
                                               TokenBucketRateLimiterOptions options)
    : ScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kGcra, 'T') {}

TokenBucketRateLimiter::TokenBucketRateLimiter(std::shared_ptr<Client> client, std::string name,
                                               const TokenBucketConfig& config, TokenBucketRateLimiterOptions options)
    : ScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kGcra, 'T'),
      permanentKeys_(options.permanentKeys) {
  if (config.initialTokens) {
    throw InvalidArgument(
        "redlimit: a TokenBucketRateLimiter made with a configuration starts full: "
        "initialTokens must be empty");
  }
  configure(policyOf(sent(config, permanentKeys_)));
}

void TokenBucketRateLimiter::validateConfig(const TokenBucketConfig& c) {
  detail::checkCount("capacity", c.capacity, 1, kMaxPermits);
  detail::checkCount("refillPermits", c.refillPermits, 1, kMaxPermits);
  detail::checkMillis("refillInterval", c.refillInterval, 1);
  detail::checkMillis("keepAlive", c.keepAlive, 0);
  if (c.initialTokens) detail::checkCount("initialTokens", *c.initialTokens, 0, c.capacity);
  detail::checkExact("capacity", c.capacity, c.refillPermits, c.refillInterval);
}

bool TokenBucketRateLimiter::trySetConfig(const TokenBucketConfig& c) {
  validateConfig(c);
  return writeConfig(true, configArgs(c));
}

void TokenBucketRateLimiter::setConfig(const TokenBucketConfig& config) {
  validateConfig(config);
  TokenBucketConfig c = config;
  if (configured()) {
    c = sent(config, permanentKeys_);
    configure(policyOf(c));
  }
  if (c.initialTokens) {
    (void)writeConfig(false, configArgs(c));  // a state was asked for: restart with it
  } else {
    writeConfigKeepingState(configArgs(c));
  }
}

TokenBucketConfig TokenBucketRateLimiter::getConfig() {
  const std::vector<std::int64_t> f = readConfig();  // B, P, I ms, keepAlive ms
  if (f.size() != 4)
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: bad configuration reply", getName()));
  TokenBucketConfig c;
  c.capacity = f[0];
  c.refillPermits = f[1];
  c.refillInterval = std::chrono::milliseconds{f[2]};
  c.keepAlive = std::chrono::milliseconds{f[3]};
  return c;
}

}  // namespace redlimit
