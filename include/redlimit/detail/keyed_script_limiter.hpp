// redlimit — what the keyed one-key limiters (KeyedGcraRateLimiter, KeyedTokenBucketRateLimiter,
// KeyedFixedWindowRateLimiter, KeyedDistributedSmoothRateLimiter) share: one policy (a configuration, a failure gate, a metrics label) applied to many keys, the
// configuration sent in every call so that a key needs no set-up and never goes uninitialized.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <string_view>

#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/detail/script_limiter.hpp"

namespace redlimit::detail {

/// The error a one-key limiter's script call ended with, as ScriptLimiter reports it (a
/// WRONGTYPE from the script's read of `key` becomes InvalidConfigError naming it and the kind).
std::exception_ptr oneKeyScriptError(std::exception_ptr error, const std::string& key, char kind);
/// The monitor of a one-key handle named `name`, after the checks of its client and name (throws
/// InvalidArgument), as ScriptLimiter makes it.
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const MonitorOptions& monitor);
/// The key of the reservation record `id` of the limiter whose key is `name`
/// (ScriptLimiter::reservationKey): name:<infix>:id, wrapped as {name}:<infix>:id for a name
/// without a hash tag. MultiLimit's records use the infix "mrsv". Throws InvalidArgument.
std::string reservationRecordKey(const std::string& name, const std::string& id, std::string_view infix = "rsv");
/// Throw InvalidArgument for a record TTL outside 1 ms..kMaxReservationTtl, actual permits outside
/// 0..kMaxPermits.
void checkReservationTtl(std::chrono::milliseconds recordTtl);
void checkActualPermits(std::int64_t actual);
/// The `repeated` flag of a reserve reply (checking its shape: UnexpectedReplyError).
bool parseReserveRepeated(const std::string& name, const Reply& reply);
/// A settle reply, counted in `monitor` when it settled (UnexpectedReplyError for a bad shape).
Settlement parseSettlement(const std::string& name, const Reply& reply, const LimiterMonitor& monitor);

/// One policy, many keys: each decision names its key and carries the policy's configuration, so
/// the script writes it to a key that has none, uses a key's stored state when it holds the same
/// configuration, and decides with this one (the state kept: see docs/algorithms.md)
/// when it holds another. No trySetConfig, and no NotInitializedError. The object is a cheap,
/// copyable value (copies share one failure gate and one metrics series, labelled with the
/// policy's name, never with a key). Thread-safe.
///
/// The failure policy is the policy's, for all its keys: one outage degrades every key (they
/// share one Redis), and FailurePolicy::Local runs ONE local bucket of the policy's rate for all
/// the keys of this process together, not one per key.
///
/// Errors: InvalidArgument before anything is sent (an empty key or one longer than
/// ScriptLimiter::kMaxNameLength, permits outside 1..the most one call may take: the burst, the limit); InvalidConfigError if the key holds
/// another Redis type or another kind of limiter (a one-key limiter of this kind with another
/// configuration is not an error), InvalidStateError if its state is unusable; ConfigurationError
/// and AuthError; IoError and subclasses, which the failure policy decides for decide, tryAcquire
/// and decideAsync (peek and deleteKey throw them).
class KeyedScriptLimiter {
 public:
  using DecisionCallback = ScriptLimiter::DecisionCallback;

  /// Takes `permits` (1..the policy's burst or limit) from the limiter `key` if available now. Never waits.
  [[nodiscard]] Decision decide(std::string_view key, std::int64_t permits = 1);
  /// decide(key, permits).allowed.
  [[nodiscard]] bool tryAcquire(std::string_view key, std::int64_t permits = 1);
  /// What decide(key, permits) would answer now, taking and writing nothing (a key without a
  /// configuration reads as a full one). Not a decision of the failure policy: throws IoError.
  [[nodiscard]] Decision peek(std::string_view key, std::int64_t permits = 1);
  /// decide() without waiting for the reply; `done` as for ScriptLimiter::decideAsync.
  void decideAsync(std::string_view key, std::int64_t permits, DecisionCallback done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<Decision> decideAsync(std::string_view key, std::int64_t permits = 1);
  /// Deletes the key (configuration and state): the next decision finds it full. True if it existed.
  /// Reservation records of the key stay until their TTL.
  bool deleteKey(std::string_view key);

  /// The policy's name: the metrics label and the limiter named in events.
  [[nodiscard]] const std::string& getName() const noexcept;
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Decisions made under the failure policy (all keys), and whether the policy is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The policy's metrics, shadow mode and events.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 protected:
  /// ScriptLimiter::reserveFor on the limiter `key` (the policy's configuration in the call): the
  /// failure policy decides an outage. Made public by the token bucket, GCRA and fixed window
  /// families. Throws InvalidArgument before sending for a bad key, permits, id or TTL.
  [[nodiscard]] HeldPermits reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                                       std::chrono::milliseconds recordTtl = ScriptLimiter::kDefaultReservationTtl);
  /// ScriptLimiter::settle on the limiter `key`: throws the IoError when Redis cannot be asked.
  Settlement settle(std::string_view key, const std::string& id, std::int64_t actual);
  /// settle(key, id, 0).
  Settlement cancel(std::string_view key, const std::string& id);
  /// ScriptLimiter::reserveForAsync and settleAsync on the limiter `key`: the same answers without
  /// waiting (callback or future), bad arguments to `done` before anything is sent.
  void reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                       std::chrono::milliseconds recordTtl, ScriptLimiter::HeldCallback done);
  [[nodiscard]] std::future<HeldPermits> reserveForAsync(
      std::string_view key, std::int64_t permits, const std::string& id,
      std::chrono::milliseconds recordTtl = ScriptLimiter::kDefaultReservationTtl);
  void settleAsync(std::string_view key, const std::string& id, std::int64_t actual,
                   ScriptLimiter::SettleCallback done);
  [[nodiscard]] std::future<Settlement> settleAsync(std::string_view key, const std::string& id, std::int64_t actual);
  /// The key of the reservation record `id` of the limiter `key` (ScriptLimiter::reservationKey).
  [[nodiscard]] std::string reservationKey(std::string_view key, const std::string& id) const;

  /// Sends nothing. Throws InvalidArgument for a null client, a bad policy name (as a limiter
  /// name) and bad failure options.
  KeyedScriptLimiter(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
                     const MonitorOptions& monitor, const Script& script, char kind, KeyedPolicy policy);
  ~KeyedScriptLimiter() = default;
  KeyedScriptLimiter(const KeyedScriptLimiter&) = default;
  KeyedScriptLimiter(KeyedScriptLimiter&&) noexcept = default;
  KeyedScriptLimiter& operator=(const KeyedScriptLimiter&) = default;
  KeyedScriptLimiter& operator=(KeyedScriptLimiter&&) noexcept = default;

 private:
  // Checks `key` (InvalidArgument: empty, too long, a record's key) and returns it as the core takes it.
  [[nodiscard]] std::string checkedKey(std::string_view key) const;

  std::shared_ptr<ScriptCore> core_;
};

}  // namespace redlimit::detail
