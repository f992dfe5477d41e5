// redlimit — what the one-key limiters (TokenBucketRateLimiter, GcraRateLimiter,
// FixedWindowRateLimiter) share: the Client, the limiter's name (which is its one key), the failure
// gate, and the calls of their scripts. Each script (lua/gcra.lua, lua/fixed_window.lua) answers
// the same operations with the same reply shapes, so everything here is independent of the
// algorithm; the public classes add their typed configuration.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit/acquire_result.hpp"
#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/reservation.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/script.hpp"

namespace redlimit {
class MultiLimit;
}  // namespace redlimit

namespace redlimit::detail {

class ScriptCore;  // src/limiters/script_core.hpp

/// A configuration sent in every call (a Limiter's policy, and the one-key handles made with a
/// configuration): `packed` is the configuration as the script stores it (the key's header: 17
/// bytes for the token bucket and GCRA, 13 for the fixed window; 18 for the smooth limiter: its
/// key's 14 and the keepAlive, which its key has no room for),
/// `limit` what a decision reports as its limit, `maxPermits` the most one call may ask for,
/// `localRate` per `localIntervalMs` the Local failure policy's bucket, and `fields` the
/// configuration in the order of the script's `config` reply.
struct KeyedPolicy {
  std::string packed;
  std::int64_t limit = 0;
  std::int64_t maxPermits = 0;
  std::int64_t localRate = 0;
  std::int64_t localIntervalMs = 0;
  std::vector<std::int64_t> fields;
};

/// The operations every one-key limiter offers (the public classes derive from it). The handle is
/// a cheap, copyable value: copies share one failure gate. Thread-safe.
///
/// Errors: InvalidArgument before anything is sent (bad name, configuration, permits, waits); from
/// the script, InvalidArgument for permits above the limiter's burst or limit,
/// NotInitializedError if the key holds no configuration, InvalidConfigError if it holds another
/// Redis type, another kind of limiter, or a configuration redlimit cannot use, InvalidStateError
/// if its state is unusable (the script checks everything before it writes: nothing is written
/// then); ConfigurationError and AuthError when the set-up cannot work, under every failure
/// policy; IoError and subclasses when Redis cannot be asked in time. For the deciding calls
/// (decide, tryAcquire, acquire, reserve and their ...Async forms) the failure policy of the
/// options decides instead what an unreachable Redis means, as for RateLimiter; the other calls
/// (peek, refund, configuration, deleteLimiter) throw the IoError.
///
/// A call whose connection closes before its reply came is sent again within its deadline (three
/// tries at most) before the failure policy hears of it: a resent take may count twice, never
/// grant twice; refund and trySetConfig are not sent again (docs/failure-modes.md, "A connection
/// closed under a call").
///
/// Where the configuration lives. A handle made WITHOUT a configuration (the Redisson way) uses
/// the one stored in the key, written by trySetConfig or setConfig here or anywhere else: a key
/// without one answers NotInitializedError (under every failure policy), and the key has no TTL
/// unless the configuration's keepAlive says so (its configuration would go with it). A handle
/// made WITH a configuration (the Bucket4j and redis_rate way) sends it in every call, as a
/// Limiter does: a key without one is decided as a full limiter and written with the first
/// grant, a key holding another configuration is decided with this one keeping the permits in use
/// and written with it by the first take, granted or denied (the change applies from then on, so a
/// denial's retryAfter is exact), there is no NotInitializedError, and the key expires once the
/// limiter is full again plus keepAlive (kDefaultIdleMargin for 0, unless the options ask for
/// permanentKeys). Its setConfig replaces the handle's configuration (for it and its copies) and
/// writes it keeping the state.
///
/// Reservations (tryAcquire with a timeout, acquire, reserve) of the token bucket and GCRA wait at
/// most the horizon max(burst x T, period) (T = one permit's time): a longer wait is refused, with
/// the retryAfter at which it fits. So a stored time is never legitimately more than
/// burst x T + horizon ahead, and one further ahead (a server clock stepped back) is clamped there:
/// the fixed window likewise to one window ahead, the smooth limiter to the debt owed when the key
/// was written (docs/algorithms.md, "The server's clock stepped back").
class ScriptLimiter {
 public:
  static constexpr std::int64_t kMaxPermits = 4294967295;               // uint32 in the key
  static constexpr std::chrono::milliseconds kMaxInterval{4294967295};  // uint32 ms, 49.7 days
  static constexpr std::size_t kMaxNameLength = 1024;                   // bytes
  /// The longest wait a reservation may be made for (longer ones are cut to this): 365 days.
  static constexpr std::chrono::microseconds kMaxWait{31536000000000};
  /// Reservation ids (reserveFor, settle): 1..128 bytes of [A-Za-z0-9._:-].
  static constexpr std::size_t kMaxReservationIdLength = 128;
  /// How long a reservation record lives by default (reserveFor): 1 hour.
  static constexpr std::chrono::milliseconds kDefaultReservationTtl{3600000};
  /// The longest a reservation record may live: 7 days.
  static constexpr std::chrono::milliseconds kMaxReservationTtl{604800000};

  /// How an asynchronous decision ends: the decision (error == nullptr) or the exception the sync
  /// call would have thrown. Called exactly once, on the Client's I/O thread, or on the calling
  /// thread before the call returns when it was decided without Redis (bad arguments, the failure
  /// policy while the limiter is degraded). Must not throw or block, and must not make sync calls
  /// on this Client.
  using DecisionCallback = std::function<void(Decision decision, std::exception_ptr error)>;

  /// Takes `permits` (1..kMaxPermits, and at most the limiter's burst or limit) if available now,
  /// and says what remains and when to retry. Never waits. When Redis cannot be asked, the failure
  /// policy decides (Decision::byPolicy).
  [[nodiscard]] Decision decide(std::int64_t permits = 1);
  /// decide(permits).allowed.
  [[nodiscard]] bool tryAcquire(std::int64_t permits = 1);
  /// Takes `permits` if they are available within `timeout`: one call reserves them if the wait
  /// the script computes fits in the timeout (token bucket and GCRA: and in the reservation
  /// horizon), and this sleeps exactly that wait (no polling). Returns false at once when it does
  /// not fit (nothing is taken then). timeout <= 0: one attempt that never waits. Returns after at
  /// most timeout plus one call.
  [[nodiscard]] bool tryAcquire(std::int64_t permits, std::chrono::milliseconds timeout);
  /// Takes `permits`, waiting as long as it takes (reserve with the longest wait, then sleep it).
  /// Under the failure policy's denials, asks again every probe interval. IoErrors are thrown
  /// (FailurePolicy::Throw).
  void acquire(std::int64_t permits = 1);
  /// Reserves `permits` if they are available now or will be within `maxWait` (0..kMaxWait; longer
  /// is cut to it, and further, for the token bucket and GCRA, to the horizon max(burst x T,
  /// period), see lua/lib/gcra_core.lua):
  /// the leaky bucket as a queue. The permits are taken at once, possibly ahead of time, and the
  /// result says how long to wait before using them. Refused (nothing taken) when the wait would
  /// exceed maxWait; then decision.retryAfter says when the same reservation would succeed. The
  /// fixed window reserves in the next window only.
  [[nodiscard]] Reservation reserve(std::int64_t permits, std::chrono::microseconds maxWait);
  /// What decide(permits) would answer now, without taking anything: allowed, retryAfter, and
  /// remaining and resetAfter as the limiter is. Not a decision of the failure policy: throws
  /// IoError when Redis cannot be asked.
  [[nodiscard]] Decision peek(std::int64_t permits = 1);
  /// Gives back `permits` (0..kMaxPermits) taken earlier; the limiter never holds more than it
  /// is full with (its capacity, burst, or limit for the current window). Counted in the metrics'
  /// permitsRefunded; the decision that took them stays counted as granted.
  void refund(std::int64_t permits);
  /// Takes `permits` as decide(permits) does and, when granted, records them under the reservation
  /// `id` in a key of their own (reservationKey(id), same hash slot, written in the same script
  /// call as the grant) that expires after `recordTtl` (1 ms..kMaxReservationTtl). Idempotent: the
  /// same id again (a retry after a timeout) takes nothing more and answers the first grant
  /// (HeldPermits::repeated); with other permits it is refused (InvalidArgument from the script).
  /// A denial records nothing. When Redis cannot be asked the failure policy decides and nothing
  /// is recorded. Never coalesced with other takes. Throws InvalidArgument before sending for
  /// permits out of range, an id that is empty, longer than kMaxReservationIdLength or has a byte
  /// other than [A-Za-z0-9._:-], a recordTtl out of range, or a name that no record key can share
  /// a slot with (see reservationKey); InvalidStateError if the record holds something redlimit
  /// did not write (nothing is written then).
  [[nodiscard]] HeldPermits reserveFor(std::int64_t permits, const std::string& id,
                                       std::chrono::milliseconds recordTtl = kDefaultReservationTtl);
  /// Settles the reservation `id` with the permits really used (`actual` >= 0), once: gives back
  /// reserved - actual (the limiter never holds more than full), or takes actual - reserved more,
  /// into debt as far as a reservation with the longest maxWait may go (token bucket, GCRA: TAT up
  /// to burst x T + the horizon ahead; fixed window: up to the limit in the current window, then in
  /// the next one), reporting what could not be taken as unpaid. Marks the record settled with its
  /// answer and keeps it for the rest of its TTL: a retry answers AlreadySettled with that answer
  /// and changes nothing. No record: SettleStatus::Unknown, nothing changes. The give-back is
  /// counted in the metrics' permitsRefunded. Safe to retry after any error. Not a decision: throws
  /// the IoError when Redis cannot be asked (no failure policy); InvalidArgument before sending for
  /// a bad id or actual < 0 or > kMaxPermits; InvalidStateError naming the record key if it holds
  /// something redlimit did not write or a reservation of another kind of limiter (nothing is
  /// written then).
  Settlement settle(const std::string& id, std::int64_t actual);
  /// settle(id, 0): gives the whole reservation back.
  Settlement cancel(const std::string& id);
  /// The key of the reservation record `id`: name + ":rsv:" + id if the name has a hash tag (the
  /// record shares it), else "{" + name + "}:rsv:" + id (the whole name is the tag, as the name
  /// alone is hashed whole). Throws InvalidArgument for a bad id, and for a name without a hash
  /// tag that holds a '}' (no record key could share its slot).
  [[nodiscard]] std::string reservationKey(const std::string& id) const;
  /// Deletes the limiter's key: configuration and state. True if it existed.
  bool deleteLimiter();
  /// True if the limiter's key exists.
  [[nodiscard]] bool isExists();

  /// decide() without waiting for the reply; one thread can keep thousands in flight.
  void decideAsync(std::int64_t permits, DecisionCallback done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<Decision> decideAsync(std::int64_t permits = 1);
  /// tryAcquire(permits) without waiting for the reply: `done` gets allowed or the error.
  void tryAcquireAsync(std::int64_t permits, std::function<void(bool allowed, std::exception_ptr error)> done);
  /// tryAcquireAsync with a future.
  [[nodiscard]] std::future<bool> tryAcquireAsync(std::int64_t permits = 1);

  /// How an asynchronous reserveFor ends: what reserveFor would return (error == nullptr) or the
  /// exception it would have thrown. Called once, as DecisionCallback is (same threads, same rules).
  using HeldCallback = std::function<void(HeldPermits held, std::exception_ptr error)>;
  /// How an asynchronous settle ends: what settle would return (error == nullptr) or the exception
  /// it would have thrown. Called once, as DecisionCallback is (same threads, same rules).
  using SettleCallback = std::function<void(Settlement settlement, std::exception_ptr error)>;

  /// reserveFor(permits, id, recordTtl) without waiting for the reply: the same answers, failure
  /// policy, shadow mode and metrics. Bad arguments (those reserveFor refuses before sending) and
  /// the failure policy while the limiter is degraded reach `done` on this thread before the call
  /// returns; nothing is sent then. Sent once more if the connection closed under it (the record
  /// makes a resend take nothing twice).
  void reserveForAsync(std::int64_t permits, const std::string& id, std::chrono::milliseconds recordTtl,
                       HeldCallback done);
  /// reserveForAsync with the default record TTL.
  void reserveForAsync(std::int64_t permits, const std::string& id, HeldCallback done);
  /// reserveForAsync with a future.
  [[nodiscard]] std::future<HeldPermits> reserveForAsync(std::int64_t permits, const std::string& id,
                                                         std::chrono::milliseconds recordTtl = kDefaultReservationTtl);
  /// settle(id, actual) without waiting for the reply: the same answers and metrics; not a
  /// decision, so an IoError reaches `done` (no failure policy). Bad arguments reach `done` on
  /// this thread before the call returns, nothing sent. Sent once more if the connection closed
  /// under it (a settle that went through answers AlreadySettled).
  void settleAsync(const std::string& id, std::int64_t actual, SettleCallback done);
  /// settleAsync with a future.
  [[nodiscard]] std::future<Settlement> settleAsync(const std::string& id, std::int64_t actual);

  /// The permit-source members, so that a SegmentedRateLimiter can hand this limiter's permits
  /// out locally (SegmentedRateLimiter<TokenBucketRateLimiter> etc.).
  ///
  /// One attempt for between atLeast and atMost permits (1 <= atLeast <= atMost; atMost is cut to
  /// the limit once it is known): atMost if available now; else, if at least atLeast remain, what
  /// remains (a second call); else denied with the wait for atLeast (a second call, exact). Never
  /// waits. AcquireResult::interval is how long the granted permits count against the limiter:
  /// the time they take to come back (permits x one permit's share of the Local bucket's interval)
  /// or, if sooner, until the limiter is full again (the fixed window: its end), rounded down to
  /// ms. So a segment spent within it keeps the limiter's bound, plus at most one segment per
  /// node. The failure policy decides when Redis cannot be asked (AcquireResult::byPolicy).
  [[nodiscard]] AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost);
  /// Gives back `permits` of a segment: refund(permits); `member` is unused (these limiters
  /// record no grant). Returns permits.
  std::int64_t releaseGrant(const std::string& member, std::int64_t permits);
  /// The failure policy's answer for a call that got no answer in time: Allow true, Deny false,
  /// Local its bucket; Throw: TimeoutError with `reason`.
  [[nodiscard]] bool decideUnanswered(std::int64_t permits, const std::string& reason);

  /// The limiter's name, which is also its Redis key.
  [[nodiscard]] const std::string& getName() const noexcept;
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Decisions made under the failure policy, and whether the limiter is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The handle's metrics, shadow mode and events (the options' `monitor`); a SegmentedRateLimiter
  /// over this limiter counts and applies shadow mode with it. Decisions are decide, tryAcquire,
  /// acquire, reserve and their ...Async forms; tryAcquireUpTo (the segment cache's) counts round
  /// trips only.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 protected:
  /// A handle on the limiter whose key is `name`, run by `script` with kind byte `kind` (see the
  /// script). Sends nothing. Throws InvalidArgument for a null client, an empty name or one longer
  /// than kMaxNameLength, and bad failure options.
  ScriptLimiter(std::shared_ptr<Client> client, std::string name, FailureOptions failure, const MonitorOptions& monitor,
                const Script& script, char kind);
  /// Not virtual: a limiter is used as its own class (or held by a smart pointer made for it,
  /// which deletes it as that class), never deleted through this base.
  ~ScriptLimiter() = default;
  ScriptLimiter(const ScriptLimiter&) = default;
  ScriptLimiter(ScriptLimiter&&) noexcept = default;
  ScriptLimiter& operator=(const ScriptLimiter&) = default;
  ScriptLimiter& operator=(ScriptLimiter&&) noexcept = default;

  /// The script's `set` operation with `config` (its arguments after the mode): true if written.
  /// onlyIfAbsent: writes only if the key does not exist.
  bool writeConfig(bool onlyIfAbsent, const std::vector<std::string>& config);
  /// The script's `set` operation in mode 'keep': writes `config` keeping the state (the permits
  /// in use, the counts, the stored permits), nothing if the key holds it already; the initial
  /// permits in `config` (gcra.lua) apply to a key that does not exist.
  void writeConfigKeepingState(const std::vector<std::string>& config);
  /// The script's `config` operation: the configuration's numbers, in the script's order. A handle
  /// with a configuration answers its own for a key that has none (it expired, or was never written).
  std::vector<std::int64_t> readConfig();
  /// Makes every later call of this handle and its copies carry `policy` (see the class comment).
  void configure(KeyedPolicy policy);
  /// True if the handle was made with a configuration.
  [[nodiscard]] bool configured() const noexcept;
  /// The handle's own configuration in the order of readConfig(); empty if it has none.
  [[nodiscard]] std::vector<std::int64_t> ownConfigFields() const;
  /// Sleeps `d` on the limiter's clock (its failure gate's): every retry sleep goes through it.
  void sleepFor(std::chrono::microseconds d) const;

 private:
  friend class redlimit::MultiLimit;  // decides several limiters by their names and kinds

  /// refund() without counting it: a segment's give-back (releaseGrant).
  void giveBack(std::int64_t permits);
  /// The kind byte the limiter's script checks: 'T', 'G' or 'W'.
  [[nodiscard]] char kind() const noexcept;
  /// The configuration the handle sends, null if it has none (MultiLimit sends it too).
  [[nodiscard]] std::shared_ptr<const KeyedPolicy> policySnapshot() const;

  std::shared_ptr<ScriptCore> core_;
};

}  // namespace redlimit::detail
