#include "redlimit/distributed_smooth_rate_limiter.hpp"

#include <limits>
#include <numeric>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "config/config_checks.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

const detail::Script kSmooth{detail::lua::smooth.name, detail::lua::smooth.sha1, detail::lua::smooth.source};

constexpr std::int64_t kTwo52 = std::int64_t{1} << 52;
constexpr std::int64_t kTwo53 = std::int64_t{1} << 53;

// a x b, or the largest int64 when it overflows (every bound below is far under it).
std::int64_t mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::numeric_limits<std::int64_t>::max();
  return out;
}
std::int64_t add(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<std::int64_t>::max();
  return out;
}

// The exactness bounds of lua/smooth.lua's derive(), for a configuration whose fields are in range.
void checkExact(const SmoothConfig& c) {
  const std::int64_t intervalUs = c.interval.count() * 1000;
  const std::int64_t g = std::gcd(c.permits, intervalUs);
  const std::int64_t p = c.permits / g;
  const std::int64_t t = intervalUs / g;
  if (!c.isWarmingUp()) {
    if (mul(c.maxBurst.count() * 1000, p) > kTwo52) {
      throw InvalidArgument(fmt::format(
          "redlimit: maxBurst {} ms is too long for {} permits per {} ms: maxBurst in us x {} (permits / gcd(permits, "
          "interval in us)) must be at most 2^52",
          c.maxBurst.count(), c.permits, c.interval.count(), p));
    }
    return;
  }
  const std::int64_t w = c.warmupPeriod.count() * 1000;
  const std::int64_t cold = c.coldFactor;
  const std::int64_t m = 2 * (1 + cold);
  const std::int64_t earn = mul(p, 5 + cold);
  const std::int64_t maxK = mul(mul(w, p), 5 + cold);
  const std::int64_t d = mul(mul(mul(16 * w, p), p), 1 + cold);
  const std::int64_t retryK = mul(mul(cold, t), 5 + cold);
  const bool fits = mul(t, m) < kTwo53 && earn < kTwo53 && maxK <= kTwo52 && d <= kTwo52 &&
                    mul(mul(8 * w, p), cold) < kTwo53 && mul(t, 5 + cold) < kTwo53 && mul(p, m) < kTwo53 &&
                    add(add(maxK, retryK), earn) < kTwo53;
  if (!fits) {
    throw InvalidArgument(fmt::format(
        "redlimit: a warm-up period of {} ms with cold factor {} is too long for {} permits per {} ms to keep exact: "
        "warm-up in us x P'^2 x 16 x (1 + coldFactor) must be at most 2^52, with P' = {} (permits / gcd(permits, "
        "interval in us))",
        c.warmupPeriod.count(), cold, c.permits, c.interval.count(), p));
  }
}

std::vector<std::string> configArgs(const SmoothConfig& c) {
  // The script's order: P, I ms, L ms (maxBurst or warm-up period), C (0 = bursty), keepAlive ms
  // (not stored: the TTL of this write, for a handle made with a configuration).
  if (c.isWarmingUp()) {
    return {fmt::to_string(c.permits), fmt::to_string(c.interval.count()), fmt::to_string(c.warmupPeriod.count()),
            fmt::to_string(c.coldFactor), fmt::to_string(c.keepAlive.count())};
  }
  return {fmt::to_string(c.permits), fmt::to_string(c.interval.count()), fmt::to_string(c.maxBurst.count()), "0",
          fmt::to_string(c.keepAlive.count())};
}

// A configuration stored in the key (trySetConfig, setConfig of a handle made without one): the
// 28-byte key has no room for keepAlive, which only travels in the call.
void checkStorable(const SmoothConfig& c) {
  if (c.keepAlive.count() != 0) {
    throw InvalidArgument(fmt::format(
        "redlimit: keepAlive {} ms: a DistributedSmoothRateLimiter's key stores no keepAlive (28 bytes); make the "
        "handle with its configuration (or use a Limiter of Policy::smoothBursty): it then travels in every call and "
        "the key expires once idle",
        c.keepAlive.count()));
  }
}

// The configuration a handle made with one sends: keepAlive 0 becomes the idle margin.
SmoothConfig sent(SmoothConfig c, bool permanentKeys) {
  DistributedSmoothRateLimiter::validateConfig(c);
  c.keepAlive = detail::keyedKeepAlive(c.keepAlive, permanentKeys);
  return c;
}

detail::KeyedPolicy policyOf(const SmoothConfig& c) {
  if (c.isWarmingUp()) return detail::smoothPolicy(c.permits, c.interval, c.warmupPeriod, c.coldFactor, c.keepAlive);
  return detail::smoothPolicy(c.permits, c.interval, c.maxBurst, 0, c.keepAlive);
}

// P, I ms, L ms, C (the key's), and keepAlive ms (a handle's own).
SmoothConfig configOf(const std::vector<std::int64_t>& f, const std::string& name) {
  if (f.size() != 4 && f.size() != 5) {
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: bad configuration reply", name));
  }
  SmoothConfig c = f[3] == 0 ? SmoothConfig::bursty(f[0], milliseconds{f[1]}, milliseconds{f[2]})
                             : SmoothConfig::warmingUp(f[0], milliseconds{f[1]}, milliseconds{f[2]}, f[3]);
  if (f.size() == 5) c.keepAlive = milliseconds{f[4]};
  return c;
}

}  // namespace

DistributedSmoothRateLimiter::DistributedSmoothRateLimiter(std::shared_ptr<Client> client, std::string name,
                                                           const DistributedSmoothRateLimiterOptions& options)
    : ScriptLimiter(std::move(client), std::move(name), options.failure, options.monitor, kSmooth, 'S'),
      probeInterval_(options.failure.probeInterval) {}

DistributedSmoothRateLimiter::DistributedSmoothRateLimiter(std::shared_ptr<Client> client, std::string name,
                                                           const SmoothConfig& config,
                                                           const DistributedSmoothRateLimiterOptions& options)
    : ScriptLimiter(std::move(client), std::move(name), options.failure, options.monitor, kSmooth, 'S'),
      probeInterval_(options.failure.probeInterval),
      permanentKeys_(options.permanentKeys) {
  configure(policyOf(sent(config, permanentKeys_)));
}

void DistributedSmoothRateLimiter::validateConfig(const SmoothConfig& c) {
  detail::checkCount("permits", c.permits, 1, kMaxPermits);
  detail::checkMillis("interval", c.interval, 1);
  detail::checkMillis("warmupPeriod", c.warmupPeriod, 0);
  detail::checkMillis("keepAlive", c.keepAlive, 0);
  if (c.isWarmingUp()) {
    detail::checkCount("coldFactor", c.coldFactor, 1, kMaxColdFactor);
  } else {
    detail::checkMillis("maxBurst", c.maxBurst, 0);
  }
  checkExact(c);
}

bool DistributedSmoothRateLimiter::trySetConfig(const SmoothConfig& c) {
  validateConfig(c);
  checkStorable(c);
  return writeConfig(true, configArgs(c));
}

void DistributedSmoothRateLimiter::setConfig(const SmoothConfig& config) {
  validateConfig(config);
  SmoothConfig c = config;
  if (configured()) {
    c = sent(config, permanentKeys_);
    configure(policyOf(c));
  } else {
    checkStorable(c);
  }
  writeConfigKeepingState(configArgs(c));
}

SmoothConfig DistributedSmoothRateLimiter::getConfig() {
  SmoothConfig c = configOf(readConfig(), getName());
  if (configured()) c.keepAlive = configOf(ownConfigFields(), getName()).keepAlive;  // not in the key
  return c;
}

void DistributedSmoothRateLimiter::setRate(std::int64_t permits, milliseconds interval) {
  detail::checkCount("permits", permits, 1, kMaxPermits);
  detail::checkMillis("interval", interval, 1);
  if (configured()) {  // this handle's own configuration, at the new rate
    SmoothConfig c = configOf(ownConfigFields(), getName());
    c.permits = permits;
    c.interval = interval;
    setConfig(c);
    return;
  }
  const std::string p = fmt::to_string(permits);
  const std::string i = fmt::to_string(interval.count());
  const std::vector<std::string_view> keys{getName()};
  const std::vector<std::string_view> args{"rate", "", "S", p, i};
  try {
    const detail::Reply r = detail::eval(*client(), kSmooth, keys, args);
    if (r.type != detail::Reply::Type::Array || r.elements.size() != 4) {
      throw UnexpectedReplyError(
          fmt::format("redlimit: limiter {}: expected an array of 4 from setRate, got {}", getName(), r.describe()));
    }
  } catch (const ScriptError&) {
    std::rethrow_exception(detail::limiterError(std::current_exception()));
  }
}

microseconds DistributedSmoothRateLimiter::acquire(std::int64_t permits) {
  microseconds waited{0};
  for (;;) {
    const Reservation r = reserve(permits, kMaxWait);
    if (r.decision.allowed) {
      if (r.delay.count() > 0) sleepFor(r.delay);
      return microseconds{detail::saturatingAdd(waited.count(), r.delay.count())};
    }
    // Denied by the failure policy (no wait known): ask again after a probe interval. Denied by
    // the script: the debt is longer than a reservation may be; sleep until it fits.
    const microseconds pause =
        r.decision.byPolicy ? detail::saturatingCast<microseconds>(probeInterval_) : r.decision.retryAfter;
    sleepFor(pause);
    waited = microseconds{detail::saturatingAdd(waited.count(), pause.count())};
  }
}

}  // namespace redlimit
