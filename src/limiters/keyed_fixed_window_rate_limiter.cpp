#include "redlimit/keyed_fixed_window_rate_limiter.hpp"

#include "limiters/keyed_policy.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

namespace {

const detail::Script kFixedWindow{detail::lua::fixed_window.name, detail::lua::fixed_window.sha1,
                                  detail::lua::fixed_window.source};

FixedWindowConfig checked(FixedWindowConfig c, bool permanentKeys) {
  FixedWindowRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

}  // namespace

KeyedFixedWindowRateLimiter::KeyedFixedWindowRateLimiter(std::shared_ptr<Client> client, std::string name,
                                                         const FixedWindowConfig& config,
                                                         KeyedRateLimiterOptions options)
    : KeyedScriptLimiter(std::move(client), std::move(name), std::move(options.failure), options.monitor, kFixedWindow,
                         'W',
                         [&] {
                           const FixedWindowConfig c = checked(config, options.permanentKeys);
                           return detail::windowPolicy(c.limit, c.window, c.keepAlive);
                         }()),
      config_(checked(config, options.permanentKeys)) {}

}  // namespace redlimit
