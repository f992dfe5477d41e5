// redlimit — KeyedFixedWindowRateLimiter: one fixed-window policy applied to many keys, the limit
// sent in every call.
#pragma once

#include <memory>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/keyed_rate_limiter_options.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"

namespace redlimit {

/// One fixed-window policy (limit per window, windows aligned to the epoch) for many keys, as
/// KeyedGcraRateLimiter: decide("quota:{user:42}") counts in that key, the configuration sent in
/// the call (13 bytes, compared with the key's first 13). A key without state is an empty window;
/// a key holding another configuration keeps its counts (lua/lib/fixed_window_core.lua,
/// windowRescale). Keys expire at the end of the last window with permits counted, plus keepAlive
/// (kDefaultIdleMargin by default). The keys are FixedWindowRateLimiter's. Thread-safe; copies
/// share the policy. See detail::KeyedScriptLimiter for the operations, errors and failure policy.
class KeyedFixedWindowRateLimiter : public detail::KeyedScriptLimiter {
 public:
  /// The policy `name` (its metrics label) with `config`. Sends nothing. Throws InvalidArgument for
  /// a bad configuration (FixedWindowRateLimiter::validateConfig), or a bad client, name or
  /// failure options.
  KeyedFixedWindowRateLimiter(std::shared_ptr<Client> client, std::string name, const FixedWindowConfig& config,
                              KeyedRateLimiterOptions options = {});

  /// The policy's configuration, with the keepAlive its keys get.
  [[nodiscard]] const FixedWindowConfig& config() const noexcept { return config_; }

  /// Reserve, then settle, on the limiter `key` (see detail::ScriptLimiter::reserveFor and settle;
  /// docs/algorithms.md "Reserve, then settle").
  using KeyedScriptLimiter::cancel;
  using KeyedScriptLimiter::reservationKey;
  using KeyedScriptLimiter::reserveFor;
  using KeyedScriptLimiter::reserveForAsync;
  using KeyedScriptLimiter::settle;
  using KeyedScriptLimiter::settleAsync;

 private:
  FixedWindowConfig config_;
};

}  // namespace redlimit
