// redlimit — KeyedDistributedSmoothRateLimiter: one Guava-style smooth policy applied to many keys,
// the limit sent in every call.
#pragma once

#include <memory>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/distributed_smooth_rate_limiter.hpp"
#include "redlimit/keyed_rate_limiter_options.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"

namespace redlimit {

/// One smooth policy (SmoothBursty or SmoothWarmingUp, as DistributedSmoothRateLimiter) for many
/// keys, as KeyedGcraRateLimiter: decide("pace:{host:7}") paces that key, the configuration sent in
/// the call (18 bytes, compared with the key's first 18). A key without state is decided as a
/// limiter idle for long (bursty: maxBurst's worth stored; warming up: cold), which is also what an
/// expired key was; a key holding another configuration keeps its state (the debt owed, the
/// stored permits scaled to the new maximum, as setRate). Keys expire once idle (full, or cold)
/// again plus keepAlive (kDefaultIdleMargin by default). decide() is Guava's tryAcquire(): granted
/// when the key is free now. The keys are DistributedSmoothRateLimiter's. Thread-safe; copies share
/// the policy. See detail::KeyedScriptLimiter for the operations, errors and failure policy.
class KeyedDistributedSmoothRateLimiter : public detail::KeyedScriptLimiter {
 public:
  /// The policy `name` (its metrics label) with `config`. Sends nothing. Throws InvalidArgument for
  /// a bad configuration (DistributedSmoothRateLimiter::validateConfig), or a bad client, name or
  /// failure options.
  KeyedDistributedSmoothRateLimiter(std::shared_ptr<Client> client, std::string name, const SmoothConfig& config,
                                    KeyedRateLimiterOptions options = {});

  /// The policy's configuration, with the keepAlive its keys get.
  [[nodiscard]] const SmoothConfig& config() const noexcept { return config_; }

 private:
  SmoothConfig config_;
};

}  // namespace redlimit
