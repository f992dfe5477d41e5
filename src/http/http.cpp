// redlimit — HTTP header fields from a Decision (see include/redlimit/http.hpp).
#include "redlimit/http.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/rate_limiter.hpp"

namespace redlimit::http {
namespace {

constexpr std::int64_t kMicrosPerSecond = 1'000'000;

// Microseconds to whole seconds, rounded up; 0 for d <= 0. Cannot overflow: the result is at
// most 2^63 / 10^6 (and below kMaxSfInteger).
std::int64_t ceilSeconds(std::chrono::microseconds d) noexcept {
  const std::int64_t us = d.count();
  if (us <= 0) return 0;
  return us / kMicrosPerSecond + (us % kMicrosPerSecond != 0 ? 1 : 0);
}

std::int64_t clampSf(std::int64_t n) noexcept { return std::clamp<std::int64_t>(n, 0, kMaxSfInteger); }

// The policy name as an sf-string (RFC 9651 §3.3.3): printable ASCII inside quotes, '"' and '\'
// escaped with '\'.
std::string sfString(const std::string& name) {
  std::string out;
  out.reserve(name.size() + 2);
  out.push_back('"');
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char ch = name[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c > 0x7E) {
      throw InvalidArgument(
          fmt::format("redlimit: RateLimitPolicy::name must be printable ASCII (0x20..0x7E) to be sent as a "
                      "structured-field string; byte 0x{:02X} at offset {} is not",
                      c, i));
    }
    if (ch == '"' || ch == '\\') out.push_back('\\');
    out.push_back(ch);
  }
  out.push_back('"');
  return out;
}

void checkPolicy(const RateLimitPolicy& policy) {
  if (policy.quota < 0 || policy.quota > kMaxSfInteger) {
    throw InvalidArgument(
        fmt::format("redlimit: RateLimitPolicy::quota must be in 0..{}, got {}", kMaxSfInteger, policy.quota));
  }
  const auto w = static_cast<std::int64_t>(policy.window.count());
  if (w < 0 || w > kMaxSfInteger) {
    throw InvalidArgument(fmt::format(
        "redlimit: RateLimitPolicy::window must be in 1..{} s (or 0 to leave w out), got {} s", kMaxSfInteger, w));
  }
}

// Seconds for RateLimit's t and X-RateLimit-Reset: the denial's wait, else the time to full.
std::int64_t effectiveWindowSeconds(const Decision& decision) noexcept {
  return decision.allowed ? ceilSeconds(decision.resetAfter)
                          : std::max<std::int64_t>(1, ceilSeconds(decision.retryAfter));
}

// One RateLimit item: `"name";r=..;t=..`.
std::string rateLimitItem(const Decision& decision, const RateLimitPolicy& policy) {
  return fmt::format("{};r={};t={}", sfString(policy.name), clampSf(decision.remaining),
                     effectiveWindowSeconds(decision));
}

void checkPolicies(const std::vector<RateLimitPolicy>& policies) {
  if (policies.empty()) throw InvalidArgument("redlimit: a RateLimit-Policy list needs at least one policy");
  for (std::size_t i = 0; i < policies.size(); ++i) {
    checkPolicy(policies[i]);
    for (std::size_t j = 0; j < i; ++j) {
      if (policies[j].name == policies[i].name) {
        throw InvalidArgument(fmt::format(
            "redlimit: RateLimitPolicy names must differ (clients tell the items apart by name); \"{}\" is used twice",
            policies[i].name));
      }
    }
  }
}

void checkOnePerLimit(const MultiDecision& decision, const std::vector<RateLimitPolicy>& policies) {
  checkPolicies(policies);
  if (policies.size() != decision.limits.size()) {
    throw InvalidArgument(fmt::format("redlimit: a decision of {} limits needs {} RateLimitPolicy values, got {}",
                                      decision.limits.size(), decision.limits.size(), policies.size()));
  }
}

// Limit i's item: its own numbers, except that the limit that denied the call says when the
// whole call succeeds (never less than Retry-After).
Decision itemDecision(const MultiDecision& decision, std::size_t i) {
  Decision one = decision.limits[i];
  if (!decision.allowed && decision.deniedBy == i) {
    one.allowed = false;
    one.retryAfter = decision.retryAfter;
  }
  return one;
}

// The limit the X-RateLimit triple describes: the one that denied, else the least remaining.
std::size_t describedLimit(const MultiDecision& decision) {
  if (!decision.allowed && decision.deniedBy < decision.limits.size()) return decision.deniedBy;
  std::size_t best = 0;
  for (std::size_t i = 1; i < decision.limits.size(); ++i) {
    if (decision.limits[i].remaining < decision.limits[best].remaining) best = i;
  }
  return best;
}

// `permits` come back in `intervalMs` x permits / per, as whole seconds rounded up, 1..kMaxSfInteger.
// The factors are validated limits (at most 2^32 and 2^42): their product is checked, not assumed.
std::chrono::seconds refillSeconds(std::int64_t permits, std::int64_t intervalMs, std::int64_t per) {
  constexpr std::int64_t kMsPerSecond = 1000;
  std::int64_t ms = 0;
  if (permits > std::numeric_limits<std::int64_t>::max() / intervalMs) {
    ms = std::numeric_limits<std::int64_t>::max();
  } else {
    const std::int64_t product = permits * intervalMs;
    ms = product / per + (product % per != 0 ? 1 : 0);
  }
  const std::int64_t seconds = ms / kMsPerSecond + (ms % kMsPerSecond != 0 ? 1 : 0);
  return std::chrono::seconds(std::clamp<std::int64_t>(seconds, 1, kMaxSfInteger));
}

RateLimitPolicy made(std::string name, std::int64_t quota, std::chrono::seconds window) {
  RateLimitPolicy p;
  p.name = std::move(name);
  p.quota = std::min(quota, kMaxSfInteger);
  p.window = window;
  (void)rateLimitPolicyField(p);  // checks the name
  return p;
}

}  // namespace

RateLimitPolicy policyOf(const Policy& policy, std::string name) {
  return made(std::move(name), policy.limit(),
              refillSeconds(1, std::max<std::int64_t>(policy.refillTime().count(), 1), 1));
}

RateLimitPolicy policyOf(const RateLimiterConfig& config, std::string name) {
  RateLimiter::validateConfig(config.rateType, config.rate, config.rateInterval, config.keepAliveTime);
  return made(std::move(name), config.rate, refillSeconds(1, config.rateInterval.count(), 1));
}

std::int64_t retryAfterSeconds(const Decision& decision) noexcept {
  // A denial says at least 1 s: "Retry-After: 0" invites the retry that is denied again.
  return decision.allowed ? 0 : std::max<std::int64_t>(1, ceilSeconds(decision.retryAfter));
}

std::optional<std::string> retryAfterHeader(const Decision& decision) {
  if (decision.allowed) return std::nullopt;
  if (decision.byPolicy && ceilSeconds(decision.retryAfter) == 0) return std::nullopt;  // no estimate: say nothing
  return fmt::format("{}", retryAfterSeconds(decision));
}

std::string rateLimitPolicyField(const RateLimitPolicy& policy) {
  checkPolicy(policy);
  std::string out = fmt::format("{};q={}", sfString(policy.name), policy.quota);
  if (policy.window.count() > 0) fmt::format_to(std::back_inserter(out), ";w={}", policy.window.count());
  return out;
}

std::optional<std::string> rateLimitField(const Decision& decision, const RateLimitPolicy& policy) {
  checkPolicy(policy);
  if (decision.byPolicy) return std::nullopt;
  return rateLimitItem(decision, policy);
}

Headers rateLimitHeaders(const Decision& decision, const RateLimitPolicy& policy, const HeaderOptions& options) {
  checkPolicy(policy);
  Headers out;
  if (options.ietf) {
    out.emplace_back("RateLimit-Policy", rateLimitPolicyField(policy));
    if (auto field = rateLimitField(decision, policy)) out.emplace_back("RateLimit", std::move(*field));
  }
  if (options.xRateLimit) {
    out.emplace_back("X-RateLimit-Limit", fmt::format("{}", policy.quota));
    if (!decision.byPolicy) {
      out.emplace_back("X-RateLimit-Remaining", fmt::format("{}", clampSf(decision.remaining)));
      out.emplace_back("X-RateLimit-Reset", fmt::format("{}", effectiveWindowSeconds(decision)));
    }
  }
  if (options.retryAfter) {
    if (auto field = retryAfterHeader(decision)) out.emplace_back("Retry-After", std::move(*field));
  }
  return out;
}

std::string rateLimitPolicyField(const std::vector<RateLimitPolicy>& policies) {
  checkPolicies(policies);
  std::string out;
  for (const RateLimitPolicy& p : policies) {
    if (!out.empty()) out += ", ";
    out += rateLimitPolicyField(p);
  }
  return out;
}

std::optional<std::string> rateLimitField(const MultiDecision& decision, const std::vector<RateLimitPolicy>& policies) {
  checkOnePerLimit(decision, policies);
  if (decision.byPolicy) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < policies.size(); ++i) {
    if (i > 0) out += ", ";
    out += rateLimitItem(itemDecision(decision, i), policies[i]);
  }
  return out;
}

Headers rateLimitHeaders(const MultiDecision& decision, const std::vector<RateLimitPolicy>& policies,
                         const HeaderOptions& options) {
  checkOnePerLimit(decision, policies);
  Headers out;
  if (options.ietf) {
    out.emplace_back("RateLimit-Policy", rateLimitPolicyField(policies));
    if (auto field = rateLimitField(decision, policies)) out.emplace_back("RateLimit", std::move(*field));
  }
  if (options.xRateLimit) {
    const std::size_t i = describedLimit(decision);
    out.emplace_back("X-RateLimit-Limit", fmt::format("{}", policies[i].quota));
    if (!decision.byPolicy) {
      const Decision one = itemDecision(decision, i);
      out.emplace_back("X-RateLimit-Remaining", fmt::format("{}", clampSf(one.remaining)));
      out.emplace_back("X-RateLimit-Reset", fmt::format("{}", effectiveWindowSeconds(one)));
    }
  }
  if (options.retryAfter) {
    if (auto field = retryAfterHeader(decision)) out.emplace_back("Retry-After", std::move(*field));
  }
  return out;
}

}  // namespace redlimit::http
