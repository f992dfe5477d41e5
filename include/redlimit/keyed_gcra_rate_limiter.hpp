// redlimit — KeyedGcraRateLimiter: one GCRA policy applied to many keys (per user, per API key, per
// IP), the limit sent in every call.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/keyed_rate_limiter_options.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"

namespace redlimit {

/// One GCRA policy (rate per period, burst) for many keys: decide("api:{user:42}") limits that
/// key, with the configuration sent in the call. A key needs no set-up: the script writes the
/// configuration when the key has none, uses the key's state when it holds this configuration,
/// and when it holds another (another process, an older policy) decides with this one, keeping
/// the permits in use (lua/lib/gcra_core.lua, gcraRescale). Keys expire once full (plus
/// keepAlive, kDefaultIdleMargin by default), so idle keys cost no memory. The keys are the same
/// 28-byte values as GcraRateLimiter's: a GcraRateLimiter on one of the keys sees the state.
///
/// The configuration travels as 17 bytes in ARGV and is compared with the key's first 17 bytes,
/// so a decision costs the server what a GcraRateLimiter decision costs. Thread-safe; copies share
/// the policy. See detail::KeyedScriptLimiter for the operations, errors and failure policy.
class KeyedGcraRateLimiter : public detail::KeyedScriptLimiter {
 public:
  /// The policy `name` (its metrics label) with `config`. Sends nothing. Throws InvalidArgument for
  /// a bad configuration (GcraRateLimiter::validateConfig), or a
  /// bad client, name or failure options.
  KeyedGcraRateLimiter(std::shared_ptr<Client> client, std::string name, const GcraConfig& config,
                       KeyedRateLimiterOptions options = {});

  /// The policy's configuration, with the keepAlive its keys get.
  [[nodiscard]] const GcraConfig& config() const noexcept { return config_; }

  /// Reserve, then settle, on the limiter `key` (see detail::ScriptLimiter::reserveFor and settle;
  /// docs/algorithms.md "Reserve, then settle").
  using KeyedScriptLimiter::cancel;
  using KeyedScriptLimiter::reservationKey;
  using KeyedScriptLimiter::reserveFor;
  using KeyedScriptLimiter::reserveForAsync;
  using KeyedScriptLimiter::settle;
  using KeyedScriptLimiter::settleAsync;

 private:
  GcraConfig config_;
};

}  // namespace redlimit
