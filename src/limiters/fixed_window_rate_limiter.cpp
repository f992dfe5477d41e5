#include "redlimit/fixed_window_rate_limiter.hpp"

#include <fmt/format.h>

#include "config/config_checks.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

const detail::Script kFixedWindow{detail::lua::fixed_window.name, detail::lua::fixed_window.sha1,
                                  detail::lua::fixed_window.source};

std::vector<std::string> configArgs(const FixedWindowConfig& c) {
  return {fmt::to_string(c.limit), fmt::to_string(c.window.count()), fmt::to_string(c.keepAlive.count())};
}

// The configuration a handle made with one sends: keepAlive 0 becomes the idle margin.
FixedWindowConfig sent(FixedWindowConfig c, bool permanentKeys) {
  FixedWindowRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

}  // namespace

FixedWindowRateLimiter::FixedWindowRateLimiter(std::shared_ptr<Client> client, std::string name,
                                               FixedWindowRateLimiterOptions options)
    : ScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kFixedWindow,
                    'W') {}

FixedWindowRateLimiter::FixedWindowRateLimiter(std::shared_ptr<Client> client, std::string name,
                                               const FixedWindowConfig& config, FixedWindowRateLimiterOptions options)
    : ScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kFixedWindow, 'W'),
      permanentKeys_(options.permanentKeys) {
  const FixedWindowConfig c = sent(config, permanentKeys_);
  configure(detail::windowPolicy(c.limit, c.window, c.keepAlive));
}

void FixedWindowRateLimiter::validateConfig(const FixedWindowConfig& c) {
  detail::checkCount("limit", c.limit, 1, kMaxPermits);
  detail::checkMillis("window", c.window, 1);
  detail::checkMillis("keepAlive", c.keepAlive, 0);
}

bool FixedWindowRateLimiter::trySetConfig(const FixedWindowConfig& c) {
  validateConfig(c);
  return writeConfig(true, configArgs(c));
}

void FixedWindowRateLimiter::setConfig(const FixedWindowConfig& config) {
  validateConfig(config);
  FixedWindowConfig c = config;
  if (configured()) {
    c = sent(config, permanentKeys_);
    configure(detail::windowPolicy(c.limit, c.window, c.keepAlive));
  }
  writeConfigKeepingState(configArgs(c));
}

FixedWindowConfig FixedWindowRateLimiter::getConfig() {
  const std::vector<std::int64_t> f = readConfig();  // L, W ms, keepAlive ms
  if (f.size() != 3)
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: bad configuration reply", getName()));
  FixedWindowConfig c;
  c.limit = f[0];
  c.window = std::chrono::milliseconds{f[1]};
  c.keepAlive = std::chrono::milliseconds{f[2]};
  return c;
}

}  // namespace redlimit
