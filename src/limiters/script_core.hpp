// redlimit — one limiter of a one-key script (lua/gcra.lua, lua/fixed_window.lua, lua/smooth.lua,
// lua/calendar_quota.lua, lua/concurrency.lua) over any number of keys: the Client, the name (the
// metrics label and the limiter named in events), the failure gate, the configuration the calls
// carry (none: each key's stored one; a calendar quota: with a table of its windows; a concurrency
// limit: its limit), and every operation of the script on a key given per call, through the call
// protocol (limiter_call.hpp). Limiter (a key per call, under its name) is its only face: it
// refuses, before anything is sent, the operations its policy has not (the permit operations
// under a concurrency limit, the lease operations under the others).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "limiters/calendar_tables.hpp"
#include "limiters/limiter_call.hpp"
#include "limiters/one_key_batcher.hpp"
#include "limiters/script_call.hpp"
#include "redlimit/detail/acquire_result.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/lease.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

struct DecisionReply;

class ScriptCore : public std::enable_shared_from_this<ScriptCore> {
 public:
  template <class T>
  using Done = std::function<void(T, std::exception_ptr)>;

  /// Every call carries `policy`; null: each key's stored configuration (a stored Policy). A
  /// calendar quota's (KeyedPolicy::calendar) goes with a table of its windows, filled in every
  /// try around the server's time. A key's reservation records live in redlimit's own namespace,
  /// where no caller's key can reach (docs/api.md, "Keys"). `script` points at one of the program's
  /// (static) scripts, never at a copy: the Client keeps pointers to the scripts its requests
  /// ran, after this core is gone. Sends nothing. Throws InvalidArgument
  /// for a null client, a bad name, quota or keepAlive, or bad failure options.
  ScriptCore(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
             const LimiterMonitor::Options& monitor, const Script* script, char kind,
             std::shared_ptr<const KeyedPolicy> policy);

  // Every operation on `key` is checked before anything is sent (InvalidArgument); an ...Async
  // form's `done` is isolated (a callback that throws is reported once), and gets the checks'
  // error at once.

  // The deciding operations on `key` (the failure gate first; an outage is the failure policy's).
  // A resent take may count twice, never grant twice (docs/failure-modes.md).
  /// Takes `permits` now if available, counted in the metrics (shadow mode applied).
  Decision decide(const std::string& key, std::int64_t permits) { return run(takeOp(key, permits, {}, true)); }
  /// Takes `permits` if they come within `timeout` (one call reserves them, then this sleeps the
  /// wait); false at once when they do not (nothing taken). Shadow mode never waits.
  bool tryAcquire(const std::string& key, std::int64_t permits, std::chrono::milliseconds timeout) {
    return tryAcquireWithin(gate_, permits, timeout, taking(key, permits));
  }
  /// Takes `permits`, waiting as long as it takes (the failure policy's denial: a probe interval);
  /// returns the time slept.
  std::chrono::microseconds acquire(const std::string& key, std::int64_t permits) {
    return acquireWaiting(gate_, permits, taking(key, permits));
  }
  /// A reservation of `permits` at most `maxWait` (>= 0) ahead, counted.
  Decision reserve(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait) {
    return run(takeOp(key, permits, maxWait, true));
  }
  void reserveAsync(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait,
                    Done<Decision> done) {
    runAsync([&] { return takeOp(key, permits, maxWait, true); }, std::move(done));
  }
  void decideAsync(const std::string& key, std::int64_t permits, Done<Decision> done) {
    reserveAsync(key, permits, {}, std::move(done));
  }
  /// A reserve under the record of `id` (sent again after a closed connection: the record makes a
  /// resend take nothing twice), counted; bad id or TTL: InvalidArgument before sending.
  Decision reserveFor(const std::string& key, std::int64_t permits, const std::string& id,
                      std::chrono::milliseconds recordTtl) {
    return run(reserveForOp(key, permits, id, recordTtl));
  }
  void reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id,
                       std::chrono::milliseconds recordTtl, Done<Decision> done) {
    runAsync([&] { return reserveForOp(key, permits, id, recordTtl); }, std::move(done));
  }

  // The other operations: their IoError reaches the caller.
  Decision peek(const std::string& key, std::int64_t permits) { return run(peekOp(key, permits)); }
  void peekAsync(const std::string& key, std::int64_t permits, Done<Decision> done) {
    runAsync([&] { return peekOp(key, permits); }, std::move(done));
  }
  /// Gives `permits` (0..kMaxPermits; 0 sends nothing) back to `key`, counted as a caller's refund
  /// when `counted` (a segment's give-back is not); never sent again (it could give back twice).
  void giveBack(const std::string& key, std::int64_t permits, bool counted = false) {
    if (permits != 0) (void)run(giveBackOp(key, permits, counted));  // 0: nothing to send
  }
  void giveBackAsync(const std::string& key, std::int64_t permits, bool counted, Done<bool> done) {
    if (permits == 0) return callOnce(done, &gate_.monitor(), name_, true, nullptr);  // nothing to send
    runAsync([&] { return giveBackOp(key, permits, counted); }, std::move(done));
  }
  void refund(const std::string& key, std::int64_t permits) { giveBack(key, permits, true); }
  void refundAsync(const std::string& key, std::int64_t permits, Done<bool> done) {
    giveBackAsync(key, permits, true, std::move(done));
  }
  /// Settles the reservation `id` of `key` (safe to send again: a second answers AlreadySettled).
  Settlement settle(const std::string& key, const std::string& id, std::int64_t actual) {
    return run(settleOp(key, id, actual));
  }
  void settleAsync(const std::string& key, const std::string& id, std::int64_t actual, Done<Settlement> done) {
    runAsync([&] { return settleOp(key, id, actual); }, std::move(done));
  }

  // A concurrency limit's operations (lua/concurrency.lua; its limit is the configuration's).
  /// A lease of `key` for `ttl` if fewer than the limit are held (the failure gate first: an
  /// outage is the failure policy's), counted (shadow mode: a denial let through, with a lease
  /// Redis does not hold). Sent again after a closed connection with the same lease id (a live
  /// lease with that id is granted again, not added).
  LeaseDecision acquireLease(const std::string& key, std::chrono::milliseconds ttl) { return run(acquireOp(key, ttl)); }
  void acquireLeaseAsync(const std::string& key, std::chrono::milliseconds ttl, Done<LeaseDecision> done) {
    runAsync([&] { return acquireOp(key, ttl); }, std::move(done));
  }
  /// Extends `lease` of `key` to `ttl` from now; false (async: nullopt) when it was no longer held.
  bool renew(const std::string& key, Lease& lease, std::chrono::milliseconds ttl) {
    return renewedTo(lease, run(renewOp(key, lease, ttl)));
  }
  void renewAsync(const std::string& key, Lease lease, std::chrono::milliseconds ttl, Done<std::optional<Lease>> done) {
    runAsync([&] { return renewOp(key, lease, ttl); }, std::move(done));
  }
  /// Gives `lease` of `key` back; false when it was no longer held.
  bool release(const std::string& key, const Lease& lease) { return run(releaseOp(key, lease)); }
  void releaseAsync(const std::string& key, const Lease& lease, Done<bool> done) {
    runAsync([&] { return releaseOp(key, lease); }, std::move(done));
  }
  /// The leases of `key` live now.
  std::int64_t held(const std::string& key) { return run(heldOp(key)); }
  void heldAsync(const std::string& key, Done<std::int64_t> done) {
    runAsync([&] { return heldOp(key); }, std::move(done));
  }

  /// How writeConfig writes: only where the key has none (not sent again: a resend of a write that
  /// went through would say false), or keeping the permits in use (safe to send again).
  enum class ConfigWrite { IfAbsent, KeepState };
  /// Writes a configuration (the script's "set" arguments after the mode) into `key`; true if
  /// written (KeepState: always).
  bool writeConfig(const std::string& key, ConfigWrite how, const std::vector<std::string>& config);
  /// DEL of `key` (not sent again: a second DEL after a first that was applied would answer 0) and
  /// EXISTS (sent again after a closed connection).
  bool deleteKey(const std::string& key) { return keyCommand(*this, kDeleteKey, key); }
  void deleteKeyAsync(const std::string& key, Done<bool> done) { keyAsync(kDeleteKey, key, std::move(done)); }
  bool exists(const std::string& key) { return keyCommand(*this, kKeyExists, key); }
  void existsAsync(const std::string& key, Done<bool> done) { keyAsync(kKeyExists, key, std::move(done)); }

  /// The limit and the Local policy's bucket last seen (a reply's, or the configuration's).
  void remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept;
  /// 1..kMaxPermits, and under a configuration in the call its own bound.
  void checkPermits(std::int64_t permits) const {
    checkPermitsUpTo(permits, policy_ ? policy_->maxPermits : kMaxPermits, "limiter ", name_,
                     "the most one call may take");
  }
  /// The key of the reservation record `id` of `key`; InvalidArgument for a bad id.
  [[nodiscard]] std::string recordKey(const std::string& key, const std::string& id) const {
    return namespacedRecordKey(key, id);
  }

  /// The failure policy's decision of `permits` without a reply (the segment cache's wait that
  /// timed out): the policy's answer, or TimeoutError naming `reason`.
  bool decideUnanswered(std::int64_t permits, const std::string& reason) {
    return detail::decideUnanswered(gate_, permits, localRate_.load(std::memory_order_relaxed),
                                    std::chrono::milliseconds{localIntervalMs_.load(std::memory_order_relaxed)},
                                    reason);
  }
  /// The segment cache's refill from `key`: one attempt for between atLeast and atMost permits
  /// (1 <= atLeast <= atMost; atMost cut to the limit, once known): atMost if available now; else,
  /// if at least atLeast remain, what remains (a second call); else denied with the wait for
  /// atLeast (a second call, exact). Never waits. AcquireResult::interval is how long the granted
  /// permits count against the key: the time they take to come back (permits x one permit's share
  /// of the Local bucket's interval) or, if sooner, until the key is full again (a fixed window:
  /// its end), rounded down to ms; with a configuration the handle's own rate, else the one the
  /// reply told. The failure policy decides when Redis cannot be asked (AcquireResult::byPolicy).
  AcquireResult takeUpTo(const std::string& key, std::int64_t atLeast, std::int64_t atMost);

  std::shared_ptr<Client> client_;
  std::string name_;
  const Script* script_;  // static: see the constructor
  std::string kind_;
  FailureGate gate_;
  std::chrono::milliseconds callBound_{0};   // connect + command timeout, saturated
  std::atomic<std::int64_t> knownLimit_{0};  // the limit last seen; 0 = unknown
  std::atomic<std::int64_t> localRate_{0};   // the Local policy's bucket, last seen
  std::atomic<std::int64_t> localIntervalMs_{0};

 private:
  // A call of the script on `key`: `argv` (op, now, kind and the operation's arguments), and
  // `recordKey` (KEYS[2], a reservation record) unless it is empty; a take through the Client's
  // coalescing when `coalesce`.
  ScriptRequest request(const std::string& key, std::vector<std::string> argv, std::string recordKey = {},
                        bool coalesce = false) const;
  // argv for `op` on a key: op, now ('' = the server's), kind, then `rest` (a configuration's
  // write, the lease operations), with room for `more` after them.
  std::vector<std::string> argvOf(std::string_view op, std::initializer_list<std::string_view> rest,
                                  std::size_t more = 0) const;
  // argv for `op` on a key: argvOf's, `a`, `b`, and the configuration at ARGV[6] when the handle
  // has one (the same position for every operation). A calendar quota's: argvOf's, `a`,
  // calendarArgs_ (the table's place last), and `b` only for reserve (its TTL).
  std::vector<std::string> args(std::string_view op, std::int64_t a, std::int64_t b) const;

  // An operation: its reply read with its request (the key is KEYS[1], not a copy in the
  // capture), its result counted into the monitor it is given. What they capture fits in
  // std::function's own buffer where it matters: a decision allocates nothing for them.
  template <class Out>
  using Read = std::function<Out(ScriptCore*, const ScriptRequest&, const Reply&)>;
  template <class Out>
  using Op = ScriptOp<ScriptCore, Out, Read<Out>, std::function<void(const LimiterMonitor&, Out&)>>;
  // The errors of a request's key as the limiter's (oneKeyScriptError).
  auto keyErrors() const {
    return [kind = kind_[0]](std::exception_ptr e, const ScriptRequest& r) {
      return oneKeyScriptError(std::move(e), r.keys[0], kind);
    };
  }
  // `op` waiting, and the operation `make()` makes without waiting (runOp, runOpAsync), with the
  // errors of its key (keyErrors).
  template <class Out>
  Out run(const Op<Out>& op) {
    return runOp(*this, op, keyErrors());
  }
  template <class Out, class Make>
  void runAsync(Make&& make, Done<Out> done) {
    runOpAsync<Out>(shared_from_this(), name_, std::forward<Make>(make), keyErrors(), std::move(done));
  }
  // `c` on `key` without waiting (runAsync's delivery isolates `done`).
  void keyAsync(const KeyCommand& c, const std::string& key, Done<bool> done) {
    keyCommandAsync(shared_from_this(), c, key, std::move(done));
  }
  // The take of tryAcquire and acquire: takeOp, waiting.
  TakeWithin taking(const std::string& key, std::int64_t permits) {
    return [this, &key, permits](std::chrono::microseconds maxWait) { return run(takeOp(key, permits, maxWait)); };
  }
  // Each operation on `key`, made by its checks, as both faces send it: a take (uncounted, or
  // counted: decide, no wait; reserve), reserveFor, peek, a give-back (1.. permits), settle and
  // the lease operations.
  Op<Decision> takeOp(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait,
                      bool counted = false) const;
  Op<Decision> reserveForOp(const std::string& key, std::int64_t permits, const std::string& id,
                            std::chrono::milliseconds recordTtl) const;
  Op<Decision> peekOp(const std::string& key, std::int64_t permits) const;
  Op<bool> giveBackOp(const std::string& key, std::int64_t permits, bool counted) const;
  Op<Settlement> settleOp(const std::string& key, const std::string& id, std::int64_t actual) const;
  Op<LeaseDecision> acquireOp(const std::string& key, std::chrono::milliseconds ttl) const;
  Op<std::optional<Lease>> renewOp(const std::string& key, const Lease& lease, std::chrono::milliseconds ttl) const;
  Op<bool> releaseOp(const std::string& key, const Lease& lease) const;
  Op<std::int64_t> heldOp(const std::string& key) const;
  LimiterCall::Params decision(std::int64_t permits) const;
  // How a take/peek reply of `permits` reads (its key and kind are the request's); `self` (may be
  // null: the handle is gone) remembers the configuration it tells (saw).
  static Read<Decision> reading(std::int64_t permits);
  // The failure policy's decision (a lease's: with a lease Redis was not asked for).
  Decision byPolicy(std::int64_t permits, bool allowed) const;
  LeaseDecision leaseByPolicy(bool allowed) const;
  // `v`: `self`, unless null, remembers its limit and Local bucket and, for the calendar tables,
  // the server's time.
  static const DecisionReply& saw(ScriptCore* self, const DecisionReply& v);

  const std::shared_ptr<const KeyedPolicy> policy_;
  // The Client's coalescing of takes (token bucket, GCRA, fixed window; null: one call each).
  std::shared_ptr<OneKeyBatcher> batcher_;
  // A calendar quota's arguments after the count (calendarArgs) and its tables; empty and null
  // for the other scripts.
  std::vector<std::string> calendarArgs_;
  std::shared_ptr<CalendarTables> tables_;
};

}  // namespace redlimit::detail
