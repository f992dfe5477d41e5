// redlimit — ConcurrencyLimiter: at most `limit` leases held at once across every process, each
// with a TTL so that a crashed holder's lease frees itself (Redisson's RPermitExpirableSemaphore).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/lease.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit {

namespace detail {
class LeaseCore;  // src/limiters/lease_core.hpp
}  // namespace detail

/// A ConcurrencyLimiter's configuration (not stored in Redis: every acquire sends it).
struct ConcurrencyConfig {
  std::int64_t limit = 0;                 // most leases live at once, 1..ConcurrencyLimiter::kMaxLimit
  std::chrono::milliseconds leaseTtl{0};  // a lease's time to live when acquired or renewed without
                                          // one, 1 ms..ConcurrencyLimiter::kMaxLeaseTtl (49.7 days)
};

/// Options of one ConcurrencyLimiter handle.
struct ConcurrencyLimiterOptions {
  FailureOptions failure;  // acquisitions when Redis cannot be asked (default: throw the IoError)
  MonitorOptions monitor;  // metrics (on, into MetricsRegistry::global()), shadow mode (off), events
};

/// What an acquisition answers: the Decision (permits 1, limit, remaining = places free after it,
/// retryAfter when denied = until the soonest live lease expires, though a release may free one
/// sooner; resetAfter = until the last live lease expires) and the lease when allowed.
struct LeaseDecision {
  Decision decision;
  std::optional<Lease> lease;  // set exactly when decision.allowed
};

/// At most `limit` leases live at once across every process that uses the name; a lease lives
/// until its expiry (now + TTL on the server's clock, extended by renew) or until it is released,
/// so a holder that crashes frees its places one TTL after its last acquire or renew, never
/// before. Holders that work longer than the TTL renew their leases.
///
/// Storage: one key, the name: a sorted set of lease ids scored by expiry (epoch µs, the server's
/// TIME). Each call reclaims at most 100 expired leases and otherwise makes O(log n) reads: no call
/// scans every lease. The key's TTL follows the latest live expiry, and the key is deleted when a
/// call leaves no lease live. See lua/concurrency.lua and docs/algorithms.md.
///
/// An acquire is safe to send twice: its lease id is made by the client, and a live lease with that
/// id is granted again, not added. Release is idempotent (false the second time); renew and release
/// of an expired lease answer false.
///
/// Errors: InvalidArgument before anything is sent (a bad name, configuration, TTL, or a lease id
/// that is not 32 lowercase hex digits); InvalidConfigError if the key holds another Redis type,
/// InvalidStateError if a member or score the call read is not a lease (nothing is written then);
/// IoError and subclasses when Redis cannot be asked in time. For acquisitions (decide,
/// tryAcquire) the failure policy decides instead: Allow grants a lease Redis does not hold
/// (byPolicy), Deny refuses, Local grants at most limit x localShare leases per leaseTtl from this
/// handle (a local bucket: it bounds the leases made, not the leases held). renew, release and held
/// throw the IoError. A handle is a cheap copyable value (copies share the failure gate and
/// metrics). Thread-safe.
class ConcurrencyLimiter {
 public:
  static constexpr std::int64_t kMaxLimit = 4294967295;
  static constexpr std::chrono::milliseconds kMaxLeaseTtl{4294967295};  // 49.7 days
  static constexpr std::size_t kMaxNameLength = 1024;                   // bytes

  /// A handle on the limiter whose key is `name`. Sends nothing. Throws InvalidArgument for a null
  /// client, an empty name or one longer than kMaxNameLength, a bad configuration or bad failure
  /// options.
  ConcurrencyLimiter(std::shared_ptr<Client> client, std::string name, const ConcurrencyConfig& config,
                     ConcurrencyLimiterOptions options = {});

  /// The checks the constructor makes. Throws InvalidArgument.
  static void validateConfig(const ConcurrencyConfig& config);

  /// Takes a lease for `leaseTtl` (the configuration's by default) if fewer than `limit` are live.
  /// Never waits. When Redis cannot be asked, the failure policy decides (decision.byPolicy).
  [[nodiscard]] LeaseDecision decide();
  [[nodiscard]] LeaseDecision decide(std::chrono::milliseconds leaseTtl);
  /// decide() without waiting for the reply: `done` gets the decision or the error, once, on the
  /// Client's I/O thread (at once on this thread when the failure policy decides or the TTL is
  /// refused). It must not block or make sync calls. A callback that throws is reported (events)
  /// and counted, not run again.
  using LeaseCallback = std::function<void(LeaseDecision decision, std::exception_ptr error)>;
  void decideAsync(LeaseCallback done);
  void decideAsync(std::chrono::milliseconds leaseTtl, LeaseCallback done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<LeaseDecision> decideAsync();
  [[nodiscard]] std::future<LeaseDecision> decideAsync(std::chrono::milliseconds leaseTtl);
  /// decide().lease: the lease, or nullopt when `limit` leases are live.
  [[nodiscard]] std::optional<Lease> tryAcquire();
  [[nodiscard]] std::optional<Lease> tryAcquire(std::chrono::milliseconds leaseTtl);
  /// Extends a live lease to now + leaseTtl (the configuration's by default; a shorter one
  /// shortens it) and updates lease.expiresAt. False if it expired or was released (an expired
  /// lease is removed then: it cannot come back).
  [[nodiscard]] bool renew(Lease& lease);
  [[nodiscard]] bool renew(Lease& lease, std::chrono::milliseconds leaseTtl);
  /// Frees the lease. True if it was live; false if it had expired or was released already (a
  /// second release is a no-op).
  bool release(const Lease& lease);
  /// renew() without waiting: `done` gets the lease with its new expiresAt, or nullopt if it had
  /// expired or was released, or the error; once, on the Client's I/O thread (at once on this
  /// thread when the lease id or TTL is refused: InvalidArgument, nothing sent). It must not block
  /// or make sync calls. Sent again (three tries in all, within the call's deadline) if the
  /// connection closes before the reply.
  using RenewCallback = std::function<void(std::optional<Lease> renewed, std::exception_ptr error)>;
  void renewAsync(Lease lease, RenewCallback done);
  void renewAsync(Lease lease, std::chrono::milliseconds leaseTtl, RenewCallback done);
  /// renewAsync with a future.
  [[nodiscard]] std::future<std::optional<Lease>> renewAsync(Lease lease);
  [[nodiscard]] std::future<std::optional<Lease>> renewAsync(Lease lease, std::chrono::milliseconds leaseTtl);
  /// release() without waiting: `done` gets release()'s answer or the error, as renewAsync.
  using ReleaseCallback = std::function<void(bool released, std::exception_ptr error)>;
  void releaseAsync(const Lease& lease, ReleaseCallback done);
  /// releaseAsync with a future.
  [[nodiscard]] std::future<bool> releaseAsync(const Lease& lease);
  /// Live leases now (may exceed `limit` after a handle with a higher limit acquired).
  [[nodiscard]] std::int64_t held();
  /// limit - held(), at least 0.
  [[nodiscard]] std::int64_t available();
  /// Deletes the key: every lease. True if it existed.
  bool deleteLimiter();

  [[nodiscard]] const std::string& getName() const noexcept;
  [[nodiscard]] const ConcurrencyConfig& config() const noexcept;
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Acquisitions made under the failure policy, and whether the limiter is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The handle's metrics, shadow mode and events; decisions are decide and tryAcquire.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 private:
  std::shared_ptr<detail::LeaseCore> core_;
};

}  // namespace redlimit
