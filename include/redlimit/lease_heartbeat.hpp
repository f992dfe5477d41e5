// redlimit — LeaseHeartbeat: keeps a lease (of a Limiter under Policy::concurrency, or a MultiLimit's)
// alive while its holder works, by renewing it in the background (Redisson's lock watchdog, etcd's
// lease keep-alive).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "redlimit/lease.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"

namespace redlimit {

/// Renews one lease every `interval` until it is released, stopped or lost, so that a holder may
/// work longer than the TTL and a crashed holder still frees its place one TTL after the last
/// renewal. The renewals are timed by one thread for the whole process (the one that gives back
/// SegmentedRateLimiter's idle segments) and sent with Limiter::renewAsync, so no call
/// waits on Redis there and the replies are handled on the Client's I/O thread; no thread is made
/// per heartbeat. A renewal that fails (an IoError) is tried again at the next interval, and
/// sooner when the lease would expire before it. The same thread gives segments back, each waiting
/// for Redis up to one call deadline: keep the TTL well above the Client's connectTimeout +
/// commandTimeout.
///
/// Destroying the heartbeat stops the renewals and releases the lease without waiting (a failed
/// release leaves it to expire), like a lock guard; release() does it and waits for the answer,
/// stop() keeps the lease as it is. A lease that Redis does not hold (granted by the failure
/// policy or shadow mode: expiresAt 0) is never renewed nor released, and is never lost.
///
/// Throws InvalidArgument from the constructor (nothing sent) for a lease id that is not a lease's,
/// a bad leaseTtl or interval, or redlimit::Error if the heartbeat thread cannot start. Thread-safe;
/// move-only. After fork(): a heartbeat made in the child renews and reports there (the child gets
/// a heartbeat thread of its own); one the child inherited is the parent's and does nothing there,
/// its destructor included (the parent's lease is neither renewed nor released by the child).
class LeaseHeartbeat {
 public:
  /// Options of a LeaseHeartbeat.
  struct Options {
    /// Each renewal's TTL. 0 (default): the limiter's configured leaseTtl.
    std::chrono::milliseconds leaseTtl{0};
    /// Time between renewals, 1 ms..leaseTtl - 1 ms. 0 (default): a third of leaseTtl (at least 1 ms),
    /// so two more tries fit before the lease expires when one fails.
    std::chrono::milliseconds interval{0};
    /// Called once when the lease is lost: a renewal answered that it was not live (expired, or
    /// released by someone else; `why` is null), or no renewal was answered before the lease's
    /// expiry as last known (`why` is the last error, or a TimeoutError if a renewal is still in
    /// flight and none failed). The loss is declared at that expiry even while a renewal is in
    /// flight (its deadline may come later, with a TTL not above the call deadline); that renewal's
    /// late answer then changes nothing. Runs on the Client's I/O thread or the
    /// heartbeat thread; it must not block or make sync calls. An exception from it is reported
    /// through the limiter's events and dropped.
    std::function<void(const Lease& lease, std::exception_ptr why)> onLost;
  };

  /// The lease of `key` of a Limiter under a concurrency policy (Limiter::acquireLease), renewed
  /// with the policy's leaseTtl unless options.leaseTtl sets one. InvalidArgument for another
  /// policy or a bad key.
  LeaseHeartbeat(Limiter limiter, std::string key, const Lease& lease, Options options);
  /// As above with the default Options (an overload, not a default argument: a nested type's
  /// default member initializers are not usable inside its enclosing class, CWG 1397).
  LeaseHeartbeat(Limiter limiter, std::string key, const Lease& lease)
      : LeaseHeartbeat(std::move(limiter), std::move(key), lease, Options{}) {}
  /// The lease of a MultiLimit's decision, renewed in every concurrency limit (MultiLimit::renewAsync):
  /// with each limit's own leaseTtl unless options.leaseTtl sets one for all; the default interval
  /// is a third of the shortest. InvalidArgument for a MultiLimit without a concurrency limit.
  LeaseHeartbeat(MultiLimit limits, const Lease& lease, Options options);
  /// As above with the default Options.
  LeaseHeartbeat(MultiLimit limits, const Lease& lease) : LeaseHeartbeat(std::move(limits), lease, Options{}) {}
  /// stop(), then releaseAsync unless the lease was released, stopped or lost.
  ~LeaseHeartbeat();
  LeaseHeartbeat(LeaseHeartbeat&& other) noexcept;
  LeaseHeartbeat& operator=(LeaseHeartbeat&& other) noexcept;
  LeaseHeartbeat(const LeaseHeartbeat&) = delete;
  LeaseHeartbeat& operator=(const LeaseHeartbeat&) = delete;

  /// The lease, with the expiry of its last renewal.
  [[nodiscard]] Lease lease() const;
  /// True once the lease is lost (see Options::onLost): the holder should stop.
  [[nodiscard]] bool lost() const;
  /// Renewals answered so far (a lease that was live each time).
  [[nodiscard]] std::uint64_t renewals() const;
  /// Stops the renewals and releases the lease, waiting for the answer: release()'s (false if it
  /// had expired or was released; false without sending for a lease Redis does not hold). Throws
  /// what Limiter::release throws; the lease then expires by itself. Not from a
  /// completion callback.
  bool release();
  /// Stops the renewals and returns the lease, which lives on until its expiry (or a release).
  /// Waits for a renewal being sent, never for Redis.
  Lease stop();

  /// The interval and TTL the options give for `limiter`, a Limiter under a concurrency policy
  /// (defaults filled in), after the checks of the constructor. Throws InvalidArgument.
  [[nodiscard]] static Options resolved(const Limiter& limiter, Options options);
  /// As above for a MultiLimit: leaseTtl stays 0 (each limit's own) unless set.
  [[nodiscard]] static Options resolved(const MultiLimit& limits, Options options);

 private:
  class State;
  std::shared_ptr<State> state_;  // null once moved from

  void start(std::shared_ptr<State> state);
  void halt() noexcept;
};

}  // namespace redlimit
