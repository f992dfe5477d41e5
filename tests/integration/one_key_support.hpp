// Shared by the one-key limiter tests: a traits type per class (for typed tests) and running the
// limiters' scripts directly with an explicit time, as the limiters run them with the server's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"
#include "helpers.hpp"
#include "limiters/decision_reply.hpp"
#include "redlimit_lua.hpp"
#include "redlimit_test/fixture.hpp"

namespace redlimit::test {

/// Runs a one-key limiter script on `key`: `args` are the operation, now in epoch µs ('' = the
/// server's clock), the kind byte, then the operation's arguments. Maps REDLIMIT_* codes as the
/// limiters do.
inline Reply runOneKey(Client& c, const detail::lua::EmbeddedScript& s, const std::string& key,
                       const std::vector<std::string>& args) {
  const Script script{s.name, s.sha1, s.source};
  const std::vector<std::string_view> keys{key};
  const std::vector<std::string_view> views(args.begin(), args.end());
  try {
    return detail::eval(c, script, keys, views);
  } catch (const ScriptError&) {
    std::rethrow_exception(detail::limiterError(std::current_exception()));
  }
}

/// A take/peek reply: {allowed, remaining, retryAfterUs, resetAfterUs, limit, nowUs, delayUs, ...}.
using TakeReply = detail::DecisionReply;

/// The values of a take/peek reply, parsed as the limiters parse it: the packed string of
/// gcra.lua, fixed_window.lua and batch.lua's decisions, or smooth.lua's array of 9. Throws
/// UnexpectedReplyError for anything else.
inline TakeReply takeReply(const Reply& r) {
  const detail::DecisionForm form =
      r.type == Reply::Type::Array ? detail::DecisionForm::Array : detail::DecisionForm::Packed;
  return detail::parseDecisionReply(r, form, "(test)");
}

struct TokenBucketTraits {
  using Limiter = TokenBucketRateLimiter;
  using Config = TokenBucketConfig;
  using Options = TokenBucketRateLimiterOptions;
  static constexpr const char* kKind = "T";
  static constexpr const char* kWorkerKind = "token_bucket";
  static const detail::lua::EmbeddedScript& script() { return detail::lua::gcra; }
  /// `limit` permits at once, `permits` more per `interval`.
  static Config config(std::int64_t limit, std::int64_t permits, std::chrono::milliseconds interval,
                       std::chrono::milliseconds keepAlive = std::chrono::milliseconds{0}) {
    Config c;
    c.capacity = limit;
    c.refillPermits = permits;
    c.refillInterval = interval;
    c.keepAlive = keepAlive;
    return c;
  }
  static std::int64_t limitOf(const Config& c) { return c.capacity; }
};

struct GcraTraits {
  using Limiter = GcraRateLimiter;
  using Config = GcraConfig;
  using Options = GcraRateLimiterOptions;
  static constexpr const char* kKind = "G";
  static constexpr const char* kWorkerKind = "gcra";
  static const detail::lua::EmbeddedScript& script() { return detail::lua::gcra; }
  static Config config(std::int64_t limit, std::int64_t permits, std::chrono::milliseconds interval,
                       std::chrono::milliseconds keepAlive = std::chrono::milliseconds{0}) {
    Config c;
    c.burst = limit;
    c.rate = permits;
    c.period = interval;
    c.keepAlive = keepAlive;
    return c;
  }
  static std::int64_t limitOf(const Config& c) { return c.burst; }
};

struct FixedWindowTraits {
  using Limiter = FixedWindowRateLimiter;
  using Config = FixedWindowConfig;
  using Options = FixedWindowRateLimiterOptions;
  static constexpr const char* kKind = "W";
  static constexpr const char* kWorkerKind = "fixed_window";
  static const detail::lua::EmbeddedScript& script() { return detail::lua::fixed_window; }
  /// `limit` per window of `interval` (`permits` is not used: the window refills all at once).
  static Config config(std::int64_t limit, std::int64_t /*permits*/, std::chrono::milliseconds interval,
                       std::chrono::milliseconds keepAlive = std::chrono::milliseconds{0}) {
    Config c;
    c.limit = limit;
    c.window = interval;
    c.keepAlive = keepAlive;
    return c;
  }
  static std::int64_t limitOf(const Config& c) { return c.limit; }
};

}  // namespace redlimit::test
