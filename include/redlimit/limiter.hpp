// redlimit — one distributed limiter: a Policy applied to every key its callers name, each key's
// state in Redis under the limiter's name.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/lease.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/settlement.hpp"

namespace redlimit {

namespace detail {
class FailureGate;
class ScriptCore;
template <class Source>
struct SegmentAccess;
}  // namespace detail

/// A Policy applied to any number of keys (a user, an API key, a tenant, "global"), the way
/// redis_rate's Limiter and Bucket4j's proxy manager are: each call names its key and carries the
/// policy, so a key needs no set-up, never goes uninitialized, and expires once idle (the
/// policy's keepAlive). The object is a cheap, copyable value (copies share one failure gate and
/// one metrics series, labelled with the limiter's name, never with a key). Thread-safe.
///
/// Keys. The state of `key` is the Redis key `rl:<name>:<key>`: the name (which holds no ':') is
/// the namespace of its keys, so two limiters with different names never share state whatever
/// keys their callers pass ("login" and "search" on one user are two limits). A caller's key may
/// be any 1..1024 bytes. Reservation records live at `rl::rsv:<id>:...`, where no caller's key can
/// reach. On a Redis Cluster a key's slot is its hash tag's, if it has one: "{user42}" puts the
/// keys of user 42 of every limiter in one slot (for one MultiLimit call); a '{' in an end
/// user's key only moves that key to another slot.
///
/// The failure policy is the limiter's, for all its keys: one outage degrades every key (they
/// share one Redis), and FailurePolicy::Local runs ONE local bucket of the policy's rate for all
/// the keys of this process together.
///
/// The deny cache (Options::denyCacheKeys; docs/api.md, "The deny cache"): a key Redis denied is
/// answered by decide/tryAcquire/decideAsync here, denied, until the denial's retryAfter, for at
/// least the permits denied; never granted locally. This object's give-backs on the key (refund,
/// settle, deleteKey, setPolicy) forget it; another process's give-back is not seen, so the key
/// may be denied here up to that retryAfter after Redis would grant it again.
///
/// A concurrency policy gives leases, not permits: acquireLease / renew / release (and their
/// ...Async forms), and the permit operations are refused before anything is sent; the lease
/// operations under a rate policy likewise.
///
/// Errors: InvalidArgument before anything is sent (a bad key, permits outside 1..the policy's
/// maxPermits, a bad wait, id or TTL, reserveFor under a smooth policy, an operation its policy
/// has not); ScriptError (InvalidConfig) if the
/// key holds another Redis type or another kind of limiter, ScriptError (InvalidState) if its state is
/// unusable; ConfigurationError and AuthError; IoError and subclasses, which the failure policy
/// decides for the deciding calls (decide, tryAcquire, acquire, reserve, reserveFor and their
/// ...Async forms); peek, refund, settle and deleteKey throw them. A call whose connection closed
/// under it is sent again within its deadline (docs/failure-modes.md, "A connection closed under
/// a call").
class Limiter {
 public:
  /// Options of a Limiter.
  struct Options {
    FailureOptions failure;             // decisions when Redis cannot be asked (default: throw the IoError)
    LimiterMonitor::Options monitor;    // metrics (on, into MetricsRegistry::global()), shadow mode (off), events
    std::size_t denyCacheKeys = 10000;  // keys remembered as denied until their retryAfter (LRU; 0 = off,
                                        // at most 2^24): decide answers them locally, denied
  };

  /// How an asynchronous call ends: its answer (error == nullptr) or the exception the sync call
  /// would have thrown. Called exactly once, on the Client's I/O thread, or on the calling thread
  /// before the call returns when it was decided without Redis. Must not block or make sync calls
  /// on this Client; one that throws is reported (Event::Kind::CallbackThrew) and dropped.
  template <class T>
  using Callback = std::function<void(T result, std::exception_ptr error)>;

  /// Kept this long by default: reserveFor's record (1 hour).
  static constexpr std::chrono::milliseconds kDefaultRecordTtl{3600000};

  /// Sends nothing. Throws InvalidArgument for a null client, a bad name (1..1024 bytes of UTF-8,
  /// no ':') and bad failure options.
  Limiter(std::shared_ptr<Client> client, std::string name, Policy policy, Options options);
  /// As above with the default Options (an overload, not a default argument: a nested type's
  /// default member initializers are not usable inside its enclosing class, CWG 1397).
  Limiter(std::shared_ptr<Client> client, std::string name, Policy policy)
      : Limiter(std::move(client), std::move(name), std::move(policy), Options{}) {}

  /// Takes `permits` from `key` if available now, and says what remains and when to retry. Never
  /// waits. When Redis cannot be asked, the failure policy decides (Decision::byPolicy).
  [[nodiscard]] Decision decide(std::string_view key, std::int64_t permits = 1);
  /// decide(key, permits).allowed.
  [[nodiscard]] bool tryAcquire(std::string_view key, std::int64_t permits = 1);
  /// Takes `permits` if they come within `timeout`: one call reserves them when the wait fits,
  /// and this sleeps exactly that wait; false at once when it does not (nothing taken).
  [[nodiscard]] bool tryAcquire(std::string_view key, std::int64_t permits, std::chrono::milliseconds timeout);
  /// Takes `permits`, waiting as long as it takes; returns the time slept.
  std::chrono::microseconds acquire(std::string_view key, std::int64_t permits = 1);
  /// Takes `permits` now or reserves them up to `maxWait` ahead (>= 0), without sleeping:
  /// Decision::delay is how long the caller must wait before using them. Refused (nothing taken):
  /// retryAfter is the earliest time from now at which the same reservation (same permits, same
  /// maxWait) would succeed.
  [[nodiscard]] Decision reserve(std::string_view key, std::int64_t permits, std::chrono::microseconds maxWait);
  /// What decide(key, permits) would answer now, taking and writing nothing.
  [[nodiscard]] Decision peek(std::string_view key, std::int64_t permits = 1);
  /// Gives `permits` (0..the policy's maxPermits) back to `key`, at most up to full. Never sent
  /// twice (a resend could give them back twice): a closed connection reaches the caller.
  void refund(std::string_view key, std::int64_t permits);

  /// Takes `permits` under the reservation `id` (1..128 bytes of A-Z a-z 0-9 - _ .), recorded for
  /// `recordTtl`: settle(key, id, actual) later keeps `actual` and gives the rest back, once. A
  /// second reserveFor of the id answers the first's decision (Decision::repeated). When the
  /// failure policy decides (byPolicy) nothing is recorded, and a settle of the id answers
  /// Settlement::Status::Unknown. Not for a smooth policy (InvalidArgument before sending).
  [[nodiscard]] Decision reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                                    std::chrono::milliseconds recordTtl = kDefaultRecordTtl);
  /// Settles the reservation `id` of `key`: keeps `actual` (0..kMaxPermits), gives back the rest;
  /// a settle of a settled reservation changes nothing (Settlement::Status::AlreadySettled).
  Settlement settle(std::string_view key, const std::string& id, std::int64_t actual);
  /// settle(key, id, 0).
  Settlement cancel(std::string_view key, const std::string& id);

  /// Deletes `key`'s state: the next decision finds it full (a concurrency limit: every lease of
  /// it is gone; a stored policy: its configuration too). True if it existed.
  bool deleteKey(std::string_view key);
  /// Whether `key` has state in Redis now (a key expires once idle: the policy's keepAlive).
  /// Writes nothing; its IoError reaches the caller.
  [[nodiscard]] bool exists(std::string_view key);

  /// A stored policy (Policy::stored): writes this limiter's policy into `key` unless the key
  /// holds a configuration already (true if written), as Redisson's trySetRate. Not sent again
  /// after a closed connection (a resend of a write that went through would answer false): the
  /// ClosedError reaches the caller. InvalidArgument for a policy sent with every call.
  bool trySetPolicy(std::string_view key);
  /// A stored policy: writes `policy` (the same algorithm, stored()) into `key`, keeping the
  /// permits in use, for every process that decides `key` from now on; a key without one starts
  /// as trySetPolicy's. Safe to send again.
  void setPolicy(std::string_view key, const Policy& policy);

  /// Concurrency: a lease of `key` if fewer than the limit are held (LeaseDecision::lease, set
  /// exactly when allowed), for the policy's leaseTtl or `leaseTtl`; never waits. Release it when
  /// done (a crashed holder's lease expires).
  [[nodiscard]] LeaseDecision acquireLease(std::string_view key);
  [[nodiscard]] LeaseDecision acquireLease(std::string_view key, std::chrono::milliseconds leaseTtl);
  /// Extends `lease` to the policy's leaseTtl (or `leaseTtl`) from now; false when it was no
  /// longer held (it expired or was released: the place may be someone else's).
  bool renew(std::string_view key, Lease& lease);
  bool renew(std::string_view key, Lease& lease, std::chrono::milliseconds leaseTtl);
  /// Gives `lease` back; false when it was no longer held.
  bool release(std::string_view key, const Lease& lease);
  /// The leases of `key` live now.
  [[nodiscard]] std::int64_t held(std::string_view key);

  /// The ...Async forms: the same answers without waiting, through `done` or a future. Bad
  /// arguments reach `done` before anything is sent.
  void decideAsync(std::string_view key, std::int64_t permits, Callback<Decision> done);
  [[nodiscard]] std::future<Decision> decideAsync(std::string_view key, std::int64_t permits = 1);
  void reserveAsync(std::string_view key, std::int64_t permits, std::chrono::microseconds maxWait,
                    Callback<Decision> done);
  [[nodiscard]] std::future<Decision> reserveAsync(std::string_view key, std::int64_t permits,
                                                   std::chrono::microseconds maxWait);
  void reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                       std::chrono::milliseconds recordTtl, Callback<Decision> done);
  [[nodiscard]] std::future<Decision> reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                                                      std::chrono::milliseconds recordTtl = kDefaultRecordTtl);
  void settleAsync(std::string_view key, const std::string& id, std::int64_t actual, Callback<Settlement> done);
  [[nodiscard]] std::future<Settlement> settleAsync(std::string_view key, const std::string& id, std::int64_t actual);
  /// peek, refund (true once given back), deleteKey, exists and held without waiting. The waiting
  /// operations (tryAcquire with a timeout, acquire) have no async form: reserveAsync says the
  /// delay, and the caller waits it on its own timer (nothing of redlimit blocks a thread).
  void peekAsync(std::string_view key, std::int64_t permits, Callback<Decision> done);
  [[nodiscard]] std::future<Decision> peekAsync(std::string_view key, std::int64_t permits = 1);
  void refundAsync(std::string_view key, std::int64_t permits, Callback<bool> done);
  [[nodiscard]] std::future<bool> refundAsync(std::string_view key, std::int64_t permits);
  void deleteKeyAsync(std::string_view key, Callback<bool> done);
  [[nodiscard]] std::future<bool> deleteKeyAsync(std::string_view key);
  void existsAsync(std::string_view key, Callback<bool> done);
  [[nodiscard]] std::future<bool> existsAsync(std::string_view key);
  void heldAsync(std::string_view key, Callback<std::int64_t> done);
  [[nodiscard]] std::future<std::int64_t> heldAsync(std::string_view key);
  void acquireLeaseAsync(std::string_view key, Callback<LeaseDecision> done);
  void acquireLeaseAsync(std::string_view key, std::chrono::milliseconds leaseTtl, Callback<LeaseDecision> done);
  [[nodiscard]] std::future<LeaseDecision> acquireLeaseAsync(std::string_view key);
  [[nodiscard]] std::future<LeaseDecision> acquireLeaseAsync(std::string_view key, std::chrono::milliseconds leaseTtl);
  /// The renewed lease, or nullopt when it was no longer held.
  void renewAsync(std::string_view key, Lease lease, Callback<std::optional<Lease>> done);
  void renewAsync(std::string_view key, Lease lease, std::chrono::milliseconds leaseTtl,
                  Callback<std::optional<Lease>> done);
  [[nodiscard]] std::future<std::optional<Lease>> renewAsync(std::string_view key, Lease lease);
  [[nodiscard]] std::future<std::optional<Lease>> renewAsync(std::string_view key, Lease lease,
                                                             std::chrono::milliseconds leaseTtl);
  void releaseAsync(std::string_view key, const Lease& lease, Callback<bool> done);
  [[nodiscard]] std::future<bool> releaseAsync(std::string_view key, const Lease& lease);

  /// The Redis key holding `key`'s state (rl:<name>:<key>); InvalidArgument for a bad key.
  [[nodiscard]] std::string redisKey(std::string_view key) const;
  /// The Redis key of the reservation record `id` of `key`.
  [[nodiscard]] std::string recordKey(std::string_view key, const std::string& id) const;

  [[nodiscard]] const std::string& name() const noexcept;
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Decisions made under the failure policy (all keys), and whether it is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The limiter's metrics, shadow mode and events.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 private:
  // The segment cache over one key (SegmentedRateLimiter<Limiter>, segmented_rate_limiter.hpp):
  // take-up-to and give-back over the ScriptCore, the failure policy's decision of an unanswered call.
  friend struct detail::SegmentAccess<Limiter>;

  // The Redis key of `key` (redisKey) for the operation `what`, after InvalidArgument naming
  // `what` unless the policy has it: the permit operations, those that take permits ahead (not a
  // calendar quota), reserveFor/settle (not a smooth policy), a refund of `permits` (0..the
  // policy's maxPermits), the lease operations.
  std::string permitKey(std::string_view what, std::string_view key) const;
  std::string waitKey(std::string_view what, std::string_view key) const;
  std::string holdKey(std::string_view what, std::string_view key) const;
  std::string refundKey(std::string_view what, std::string_view key, std::int64_t permits) const;
  std::string leaseKey(std::string_view what, std::string_view key) const;
  // InvalidArgument naming `what` unless the policy is stored (trySetPolicy, setPolicy).
  void checkStored(std::string_view what) const;

  std::shared_ptr<detail::ScriptCore> core_;  // every policy's: its script's operations on a key
  Policy policy_;
};

}  // namespace redlimit

// The segment caches over a Limiter key: compiled into the library (src/limiters/segmented_rate_limiter.cpp),
// as RateLimiter's are.
#include "redlimit/segmented_rate_limiter.hpp"

namespace redlimit {
extern template class SegmentedRateLimiter<Limiter, SteadyClock>;
extern template class SegmentedRateLimiter<Limiter, CoarseSteadyClock>;
}  // namespace redlimit
