#include "redlimit/gcra_rate_limiter.hpp"

#include <fmt/format.h>

#include "config/config_checks.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

const detail::Script kGcra{detail::lua::gcra.name, detail::lua::gcra.sha1, detail::lua::gcra.source};

std::vector<std::string> configArgs(const GcraConfig& c) {
  // The script's order: burst, permits per interval, interval, keepAlive, initial permits (all).
  return {fmt::to_string(c.burst), fmt::to_string(c.rate), fmt::to_string(c.period.count()),
          fmt::to_string(c.keepAlive.count()), fmt::to_string(c.burst)};
}

// The configuration a handle made with one sends: keepAlive 0 becomes the idle margin.
GcraConfig sent(GcraConfig c, bool permanentKeys) {
  GcraRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

detail::KeyedPolicy policyOf(const GcraConfig& c) {
  return detail::gcraPolicy('G', c.burst, c.rate, c.period, c.keepAlive);
}

}  // namespace

GcraRateLimiter::GcraRateLimiter(std::shared_ptr<Client> client, std::string name, GcraRateLimiterOptions options)
    : ScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kGcra, 'G') {}

GcraRateLimiter::GcraRateLimiter(std::shared_ptr<Client> client, std::string name, const GcraConfig& config,
                                 GcraRateLimiterOptions options)
    : ScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kGcra, 'G'),
      permanentKeys_(options.permanentKeys) {
  configure(policyOf(sent(config, permanentKeys_)));
}

void GcraRateLimiter::validateConfig(const GcraConfig& c) {
  detail::checkCount("rate", c.rate, 1, kMaxPermits);
  detail::checkMillis("period", c.period, 1);
  detail::checkCount("burst", c.burst, 1, kMaxPermits);
  detail::checkMillis("keepAlive", c.keepAlive, 0);
  detail::checkExact("burst", c.burst, c.rate, c.period);
}

bool GcraRateLimiter::trySetConfig(const GcraConfig& c) {
  validateConfig(c);
  return writeConfig(true, configArgs(c));
}

void GcraRateLimiter::setConfig(const GcraConfig& c) {
  validateConfig(c);
  if (configured()) {
    const GcraConfig own = sent(c, permanentKeys_);
    configure(policyOf(own));
    writeConfigKeepingState(configArgs(own));
    return;
  }
  writeConfigKeepingState(configArgs(c));
}

GcraConfig GcraRateLimiter::getConfig() {
  const std::vector<std::int64_t> f = readConfig();  // B, P, I ms, keepAlive ms
  if (f.size() != 4)
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: bad configuration reply", getName()));
  GcraConfig c;
  c.burst = f[0];
  c.rate = f[1];
  c.period = std::chrono::milliseconds{f[2]};
  c.keepAlive = std::chrono::milliseconds{f[3]};
  return c;
}

}  // namespace redlimit
