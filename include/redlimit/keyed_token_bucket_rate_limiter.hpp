// redlimit — KeyedTokenBucketRateLimiter: one token-bucket policy applied to many keys, the limit
// sent in every call.
#pragma once

#include <memory>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/keyed_gcra_rate_limiter.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"

namespace redlimit {

/// One token-bucket policy (capacity, refillPermits per refillInterval) for many keys, as
/// KeyedGcraRateLimiter (same script, same rules; the keys are TokenBucketRateLimiter's). A key
/// without state starts full: config.initialTokens must be empty. Thread-safe.
class KeyedTokenBucketRateLimiter : public detail::KeyedScriptLimiter {
 public:
  /// The policy `name` with `config`. Sends nothing. Throws InvalidArgument for a bad
  /// configuration (TokenBucketRateLimiter::validateConfig), initialTokens set, or a bad client, name or failure options.
  KeyedTokenBucketRateLimiter(std::shared_ptr<Client> client, std::string name, const TokenBucketConfig& config,
                              KeyedRateLimiterOptions options = {});

  /// The policy's configuration, with the keepAlive its keys get.
  [[nodiscard]] const TokenBucketConfig& config() const noexcept { return config_; }

  /// Reserve, then settle, on the limiter `key` (see detail::ScriptLimiter::reserveFor and settle;
  /// docs/algorithms.md "Reserve, then settle").
  using KeyedScriptLimiter::cancel;
  using KeyedScriptLimiter::reservationKey;
  using KeyedScriptLimiter::reserveFor;
  using KeyedScriptLimiter::reserveForAsync;
  using KeyedScriptLimiter::settle;
  using KeyedScriptLimiter::settleAsync;

 private:
  TokenBucketConfig config_;
};

}  // namespace redlimit
