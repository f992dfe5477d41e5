// redlimit — MultiLimit: several Limiters decided together, all or nothing, in one script
// call (for example 10/s per user AND 1000/min per tenant AND 5000/s for the whole service).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redlimit/client.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/limits.hpp"

namespace redlimit {

/// Several Limiters (GCRA, token bucket, fixed window, calendar and concurrency policies; see on()
/// for their keys) on one Client, decided in one script call, all or nothing: if any limit denies,
/// no limit is charged. Each limit is computed exactly as its own limiter computes it (same script
/// code, bounds and exactness), all at one server time. Thread-safe; copies share one failure gate.
///
/// Concurrency limits ("10 per second AND at most 3 at once, per tenant"): a granted decide()
/// takes one place (a lease, whatever the permits) in every concurrency limit of the MultiLimit,
/// each with that limiter's limit and leaseTtl, under one lease id, returned in
/// MultiDecision::lease. Give it back with release(lease); renew(lease) extends it. A denial by
/// any limit takes no place and no permit. A place cannot be taken ahead of time and a lease must
/// not be lost, so a MultiLimit with a concurrency limit refuses (InvalidArgument, nothing sent)
/// the calls that wait or answer without the lease: tryAcquire, acquire, reserve, reserveFor,
/// tryAcquireAsync. Use decide or decideAsync.
///
/// Keys come with on(), one per limiter. On a single server (standalone, or behind Sentinel) any
/// keys may be combined: one script call. On a Redis Cluster a script may only touch keys of one
/// hash slot: keys that share one (one hash tag, the part between the first '{' and the next '}',
/// which is all Redis Cluster hashes: on({"{tenant42}:user:7", "{tenant42}"})) are one script call
/// there too. Keys of several slots (a limit shared by every tenant beside each tenant's) are
/// decided slot by slot (docs/algorithms.md, "Keys in several slots of a Cluster"): in slot order,
/// every slot reserves (all or nothing there, with a record in that slot; the last slot's record
/// is the decision's commit); when one denies or fails, the slots before it get their permits
/// back, once, before the call answers. Never more than any limit; a denied call holds the
/// earlier slots' permits only while the later calls run; a caller that dies between two slots
/// holds them for at most 2 x the slots x the call bound + 1 s, after which the next decision over
/// the same limits gives them back if the last slot has no record of the call (and keeps them if
/// it has). Across slots: decide, tryAcquire(permits), peek, decideAsync and
/// tryAcquireAsync; the others throw InvalidArgument before anything is sent.
///
/// The configurations: a Limiter of a stored policy uses the configuration stored in each key (set
/// it with Limiter::trySetPolicy or setPolicy; a key without one is NotInitializedError); any other
/// has its policy sent in the call, with its rules (a key without state is decided full and
/// written with the grant, another stored configuration of the same algorithm is replaced,
/// keeping the permits in use, by the first take whether granted or denied; the key expires once
/// idle: docs/algorithms.md, "Where the configuration lives"). The MultiLimit keeps the names,
/// kinds and policies of the limiters, not the limiter objects.
///
/// Errors: InvalidArgument before anything is sent (bad permits or waits; permits above the
/// burst or limit of a policy in the call); from the script, with
/// nothing written: InvalidArgument for permits above a limit's burst or limit, NotInitializedError
/// if a key holds no configuration, ScriptError (InvalidConfig) if a key holds another Redis type, another
/// kind of limiter or an unusable configuration, ScriptError (InvalidState) for unusable state — each
/// naming the key. When Redis cannot be asked, the deciding calls (decide, tryAcquire, acquire,
/// reserve, reserveFor, their ...Async forms) follow options.failure as the single limiters do:
/// Local runs an in-process bucket at the tightest rate the limits reported (permits per time),
/// refusing until one decision has reached Redis. peek, refund and settle throw the IoError.
class MultiLimit {
 public:
  /// Options of one MultiLimit handle.
  struct Options {
    FailureOptions failure;           // decisions when Redis cannot be asked (default: throw the IoError); the
                                      // limiters' own failure options are not used by the MultiLimit
    LimiterMonitor::Options monitor;  // metrics (on, into MetricsRegistry::global()), shadow mode (off), events;
                                      // the limiters' own are not used either
    std::string name;  // the name its metrics, events and error messages carry (UTF-8, <= 1024 bytes); empty:
                       // metrics carry the limits' names joined by '+' ("{t}:user+{t}:tenant"), events and
                       // messages "MultiLimit({t}:user + {t}:tenant)"
  };

  static constexpr std::size_t kMaxLimits = 32;
  /// As Limiter::Callback<Decision>, with the MultiDecision.
  using DecisionCallback = std::function<void(MultiDecision decision, std::exception_ptr error)>;

  /// A MultiLimit over `limits` (1..kMaxLimits distinct limiters, one Client), e.g.
  /// `MultiLimit both({perUser, perTenant});` (only their names, policies and Client are kept).
  /// Sends nothing. Throws InvalidArgument when there are none or too many, when two have the same
  /// name or another Client, or when one has a smooth policy.
  explicit MultiLimit(const std::vector<Limiter>& limits, const Options& options);
  /// As above with the default Options (an overload, not a default argument: a nested type's
  /// default member initializers are not usable inside its enclosing class, CWG 1397).
  explicit MultiLimit(const std::vector<Limiter>& limits) : MultiLimit(limits, Options{}) {}

  /// A MultiLimit of Limiters (made once, e.g. `MultiLimit gateway({perKey, global});`) decides
  /// keys: on({apiKey, "all"}) is the same limits on those keys, keys[i] for limiter i, sharing
  /// this one's failure gate and metrics (one series, labelled with the limiters' names). Its
  /// calls are all or nothing in one script call, or on a Cluster over keys of several hash slots
  /// slot by slot (see the class comment). Throws InvalidArgument for a count other than size(), a
  /// bad key (Limiter's rules), or, on a Cluster, keys of several hash slots when a limit is a
  /// concurrency limit or a calendar quota (a hash tag in the keys co-locates them: "{user42}";
  /// slots are computed by CRC16, as Redis Cluster does). A MultiLimit of Limiters used without on()
  /// throws InvalidArgument on every call. Limiters with a smooth policy cannot be combined. A
  /// calendar quota can: each call carries its table of windows (sent once more around the
  /// server's time if that is outside it); it takes no permits ahead of time, so a MultiLimit with
  /// one refuses reserve, acquire and tryAcquire with a timeout (InvalidArgument, nothing sent).
  [[nodiscard]] MultiLimit on(const std::vector<std::string_view>& keys) const;

  /// Takes `permits` (1..kMaxPermits, at most every limit's burst or limit) from every limit if
  /// all have them now, else from none. Never waits. When Redis cannot be asked, the failure
  /// policy decides (Decision::byPolicy).
  [[nodiscard]] MultiDecision decide(std::int64_t permits = 1);
  /// decide(permits).allowed.
  [[nodiscard]] bool tryAcquire(std::int64_t permits = 1);
  /// Takes `permits` from every limit if all can give them within `timeout`: one call reserves
  /// them at the earliest time at which all can (as reserve(), with its cost), and this sleeps
  /// until then. Returns false at once when that time is beyond the timeout (nothing is taken).
  /// timeout <= 0: one attempt that never waits. No polling: one call.
  [[nodiscard]] bool tryAcquire(std::int64_t permits, std::chrono::milliseconds timeout);
  /// Takes `permits`, waiting as long as it takes (as Limiter::acquire).
  void acquire(std::int64_t permits = 1);
  /// Reserves `permits` in every limit at the earliest time E at which all can give them, if that
  /// is within `maxWait` (0..kMaxWait; longer is cut to it, and to each GCRA's
  /// longest reservation); the caller waits `delay` = E. Every limit takes them as arriving at E,
  /// which keeps each limit exact for the time the permits are used. The cost: a token bucket or
  /// GCRA keeps one time, not tokens plus a booking, so a limit that could give the permits
  /// sooner holds, until E, up to (E - its own wait) x its rate permits more than a bucket with
  /// separate tokens would (keep such waits short against the limits' intervals). A fixed window
  /// counts them in the window E falls in, the current or the next one only (it keeps no count
  /// further ahead). The combined Decision (Decision::delay = E); refused (nothing taken):
  /// retryAfter says when the same reservation would succeed.
  [[nodiscard]] Decision reserve(std::int64_t permits, std::chrono::microseconds maxWait);
  /// What decide(permits) would answer now, taking nothing (no lease either). Throws IoError when
  /// Redis cannot be asked.
  [[nodiscard]] MultiDecision peek(std::int64_t permits = 1);
  /// Gives back `permits` (0..kMaxPermits) to every limit, each as its own refund() does (a
  /// concurrency limit gets nothing back: release its lease).
  void refund(std::int64_t permits);

  /// Concurrency limits: extends the lease of a decide() in every concurrency limit, each to now +
  /// its own leaseTtl (or to now + `leaseTtl` in all), and sets lease.expiresAt to the soonest.
  /// False if it is no longer live in all of them (expired in one, released): it is then removed
  /// from every one, for good. A lease of the failure policy or shadow mode answers false.
  /// Throws InvalidArgument before sending for a MultiLimit without a concurrency limit, a lease id
  /// that is not 32 lowercase hex digits or a bad TTL; the IoError when Redis cannot be asked (safe
  /// to retry).
  [[nodiscard]] bool renew(Lease& lease);
  [[nodiscard]] bool renew(Lease& lease, std::chrono::milliseconds leaseTtl);
  /// Frees the lease's place in every concurrency limit. True if it was live in all of them;
  /// false if it had expired (in one) or was released already (a second release is a no-op).
  /// Errors as renew.
  bool release(const Lease& lease);
  /// renew() and release() without waiting, as Limiter's renewAsync and releaseAsync:
  /// the callback gets the renewed lease (nullopt when not live in all) or release()'s answer, or
  /// the error, once, on the Client's I/O thread (at once on this thread when refused before
  /// sending). Sent again if the connection closes before the reply.
  using RenewCallback = Limiter::Callback<std::optional<Lease>>;
  using ReleaseCallback = Limiter::Callback<bool>;
  void renewAsync(Lease lease, RenewCallback done);
  void renewAsync(Lease lease, std::chrono::milliseconds leaseTtl, RenewCallback done);
  [[nodiscard]] std::future<std::optional<Lease>> renewAsync(Lease lease);
  [[nodiscard]] std::future<std::optional<Lease>> renewAsync(Lease lease, std::chrono::milliseconds leaseTtl);
  void releaseAsync(const Lease& lease, ReleaseCallback done);
  [[nodiscard]] std::future<bool> releaseAsync(const Lease& lease);
  /// The shortest leaseTtl of its concurrency limits (0 without one): how long a renewal without a
  /// TTL keeps a lease for sure.
  [[nodiscard]] std::chrono::milliseconds leaseTtl() const noexcept;

  /// Reserve, then settle, for all limits at once (docs/algorithms.md "Reserve, then settle"):
  /// takes `permits` as decide(permits) does (all or nothing) and, when granted, writes ONE record
  /// of them (reservationKey(id), in the first limit's hash slot, same script call) naming every limit,
  /// with each fixed window's start; it expires after `recordTtl` (1 ms..kMaxReservationTtl). The
  /// same id again takes nothing and answers the grant (Decision::repeated; `limits` as the limits
  /// are now); other permits: InvalidArgument
  /// from the script. A denial (by any limit) records nothing and charges nothing. When Redis
  /// cannot be asked the failure policy decides and nothing is recorded; sent again if its
  /// connection closes (the record makes that safe). Bad permits, id or TTL: InvalidArgument
  /// before sending; a record that is not this MultiLimit's (corrupt, a single key's, another
  /// MultiLimit's limits): ScriptError (InvalidState) naming it, nothing written.
  [[nodiscard]] MultiDecision reserveFor(std::int64_t permits, const std::string& id,
                                         std::chrono::milliseconds recordTtl = detail::kDefaultReservationTtl);
  /// Settles the reservation `id` with the permits really used, once, in every limit: each gives
  /// back reserved - actual or charges actual - reserved under its own debt rule, as its own
  /// limiter's settle does (see MultiSettlement). A retry answers AlreadySettled with the first
  /// answer and changes nothing; no record (never reserved, by the policy, expired): Unknown,
  /// nothing changes. Not a decision: throws the IoError when Redis cannot be asked (safe to
  /// retry); InvalidArgument before sending for a bad id or actual; ScriptError (InvalidState) as reserveFor.
  MultiSettlement settle(const std::string& id, std::int64_t actual);
  /// settle(id, 0).
  MultiSettlement cancel(const std::string& id);
  using SettleCallback = std::function<void(MultiSettlement settlement, std::exception_ptr error)>;
  /// reserveFor and settle without waiting: the same answers through `done` (once, as
  /// DecisionCallback) or a future; bad arguments reach `done` before anything is sent.
  void reserveForAsync(std::int64_t permits, const std::string& id, std::chrono::milliseconds recordTtl,
                       DecisionCallback done);
  [[nodiscard]] std::future<MultiDecision> reserveForAsync(
      std::int64_t permits, const std::string& id,
      std::chrono::milliseconds recordTtl = detail::kDefaultReservationTtl);
  void settleAsync(const std::string& id, std::int64_t actual, SettleCallback done);
  [[nodiscard]] std::future<MultiSettlement> settleAsync(const std::string& id, std::int64_t actual);
  /// The record key of `id`: the first limit's name + ":mrsv:" + id (that name wrapped in braces
  /// if it has no hash tag). Throws InvalidArgument (also when a limit is a concurrency limit, or
  /// on a Cluster when the keys are in several hash slots).
  [[nodiscard]] std::string reservationKey(const std::string& id) const;

  /// decide() without waiting for the reply (see Limiter::decideAsync for the callback).
  void decideAsync(std::int64_t permits, DecisionCallback done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<MultiDecision> decideAsync(std::int64_t permits = 1);
  /// tryAcquire(permits) without waiting for the reply.
  void tryAcquireAsync(std::int64_t permits, std::function<void(bool allowed, std::exception_ptr error)> done);
  /// tryAcquireAsync with a future.
  [[nodiscard]] std::future<bool> tryAcquireAsync(std::int64_t permits = 1);

  /// The limiters' names (their keys), in construction order.
  [[nodiscard]] const std::vector<std::string>& names() const noexcept;
  /// Number of limits.
  [[nodiscard]] std::size_t size() const noexcept;
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Decisions made under the failure policy, and whether the MultiLimit is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// Its metrics, shadow mode and events (Options::monitor).
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 private:
  friend class LeaseHeartbeat;
  class Core;
  explicit MultiLimit(std::shared_ptr<Core> core) noexcept;
  // "MultiLimit(a + b)": the name its events and messages give it (and its heartbeats').
  [[nodiscard]] const std::string& label() const noexcept;
  std::shared_ptr<Core> core_;

  void renewAsyncWith(Lease lease, std::optional<std::chrono::milliseconds> leaseTtl, RenewCallback done);
};

}  // namespace redlimit
