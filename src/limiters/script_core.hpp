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
#include "limiters/deny_answers.hpp"
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
  /// try around the server's time. decide remembers up to `denyCacheKeys` keys denied (0: none;
  /// the caller checked it: denyCacheOf). A key's reservation records live in redlimit's own namespace,
  /// where no caller's key can reach (docs/api.md, "Keys"). `script` points at one of the program's
  /// (static) scripts, never at a copy: the Client keeps pointers to the scripts its requests
  /// ran, after this core is gone. Sends nothing. Throws InvalidArgument
  /// for a null client, a bad name, quota or keepAlive, or bad failure options.
  ScriptCore(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
             const LimiterMonitor::Options& monitor, const Script* script, char kind,
             std::shared_ptr<const KeyedPolicy> policy, std::size_t denyCacheKeys = 0);

  // An operation on the Redis key `key`, made by its checks before anything is sent
  // (InvalidArgument), for both faces: run(op) waits, runAsync(make, done) does not and runs the
  // face's own checks inside make() too (their error reaches `done` at once, isolated, as the
  // op's). How each is sent again after a closed connection is beside its builder. Its reply is
  // read with its request (the key is KEYS[1], not a copy in the capture), its result counted into
  // the monitor it is given: what they capture fits in std::function's own buffer where it
  // matters, and a decision allocates nothing for them.
  template <class Out>
  using Read = std::function<Out(ScriptCore*, const ScriptRequest&, const Reply&)>;
  template <class Out>
  using Op = ScriptOp<ScriptCore, Out, Read<Out>, std::function<void(const LimiterMonitor&, Out&)>>;
  // The errors of a request's key as the limiter's (oneKeyScriptError).
  auto keyErrors() const {
    return [kind = kind_](std::exception_ptr e, const ScriptRequest& r) {
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

  // The deciding operations (the failure gate first; an outage is the failure policy's): a take
  // of `permits` at most `maxWait` (>= 0) ahead, counted with shadow mode applied (decide: no
  // wait; reserve) or not (taking, takeUpTo); a take under the record of `id`, counted; a
  // concurrency limit's lease of `key` for `ttl`, counted (its limit is the configuration's).
  Op<Decision> takeOp(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait,
                      bool counted = false) const;
  Op<Decision> reserveForOp(const std::string& key, std::int64_t permits, const std::string& id,
                            std::chrono::milliseconds recordTtl) const;
  Op<LeaseDecision> acquireOp(const std::string& key, std::chrono::milliseconds ttl) const;
  // decide: takeOp of `permits`, counted, without a wait, on the key `redisKey()` makes for the
  // caller's `key`, through the deny cache (deny_answers.hpp; the cache is keyed by the caller's
  // key: a key found there was valid when Redis denied it). decideAsync without waiting.
  template <class Key>
  Decision decide(std::string_view key, std::int64_t permits, Key&& redisKey) {
    if (denials_->enabled()) checkPermits(permits);  // before the cache: it holds only valid calls
    return decideThrough(*denials_, key, permits, gate_.monitor(), {}, client_->onIoThread(),
                         [&] { return run(takeOp(redisKey(), permits, {}, true)); });
  }
  template <class Key>
  void decideAsync(std::string_view key, std::int64_t permits, Key&& redisKey, Done<Decision> done) {
    decideThroughAsync(
        denials_, key, permits, gate_.monitor(), name_, {},
        [&] {
          if (denials_->enabled()) checkPermits(permits);
        },
        [&](Done<Decision> asked) {
          runAsync<Decision>([&] { return takeOp(redisKey(), permits, {}, true); }, std::move(asked));
        },
        std::move(done));
  }
  // The take of tryAcquireWithin and acquireWaiting: takeOp, uncounted, waiting, on `key` (kept
  // by reference: it must outlive the wait).
  TakeWithin taking(const std::string& key, std::int64_t permits) {
    return [this, &key, permits](std::chrono::microseconds maxWait) { return run(takeOp(key, permits, maxWait)); };
  }

  // The other operations (their IoError reaches the caller): peek, settle, renew (renewedTo),
  // release and held.
  Op<Decision> peekOp(const std::string& key, std::int64_t permits) const;
  Op<Settlement> settleOp(const std::string& key, const std::string& id, std::int64_t actual) const;
  Op<std::optional<Lease>> renewOp(const std::string& key, const Lease& lease, std::chrono::milliseconds ttl) const;
  Op<bool> releaseOp(const std::string& key, const Lease& lease) const;
  Op<std::int64_t> heldOp(const std::string& key) const;
  /// Gives `permits` (0..kMaxPermits; 0 sends nothing) back to `key`, counted as a caller's refund
  /// when `counted` (a segment's give-back is not); never sent again (it could give back twice).
  void giveBack(const std::string& key, std::int64_t permits, bool counted = false) {
    if (permits != 0) (void)run(giveBackOp(key, permits, counted));  // 0: nothing to send
  }
  /// A caller's refund (giveBack, counted) without waiting, to the key `key()` makes: its error,
  /// or true for 0 permits (nothing to send), reaches `done` at once (isolated).
  template <class Key>
  void refundAsync(Key&& key, std::int64_t permits, Done<bool> done) {
    if (permits != 0) return runAsync([&] { return giveBackOp(key(), permits, true); }, std::move(done));
    if (checkedOrAnswered(done, gate_.monitor(), name_, key)) callOnce(done, &gate_.monitor(), name_, true, nullptr);
  }
  /// `c` (DEL, EXISTS; keyCommand waits) without waiting, on the key `key()` makes: its error
  /// reaches `done` at once (isolated).
  template <class Key>
  void keyAsync(const KeyCommand& c, Key&& key, Done<bool> done) {
    std::string k;
    if (checkedOrAnswered(done, gate_.monitor(), name_, [&] { k = key(); })) {
      keyCommandAsync(shared_from_this(), c, k, std::move(done));
    }
  }

  /// How writeConfig writes: only where the key has none (not sent again: a resend of a write that
  /// went through would say false), or keeping the permits in use (safe to send again).
  enum class ConfigWrite { IfAbsent, KeepState };
  /// Writes a configuration (the script's "set" arguments after the mode) into `key`; true if
  /// written (KeepState: always).
  bool writeConfig(const std::string& key, ConfigWrite how, const std::vector<std::string>& config);

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
  char kind_;             // ARGV[3]
  FailureGate gate_;
  // Keys denied by Redis (by the caller's key), answered locally by decide until their retryAfter.
  std::shared_ptr<LimiterDenyCache> denials_;
  std::chrono::milliseconds callBound_{0};   // connect + command timeout, saturated
  std::atomic<std::int64_t> knownLimit_{0};  // the limit last seen; 0 = unknown
  std::atomic<std::int64_t> localRate_{0};   // the Local policy's bucket, last seen
  std::atomic<std::int64_t> localIntervalMs_{0};

 private:
  // The limit and the Local policy's bucket last seen (a reply's, or the configuration's).
  void remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept;
  // 1..kMaxPermits, and under a configuration in the call its own bound.
  void checkPermits(std::int64_t permits) const {
    checkPermitsUpTo(permits, policy_ ? policy_->maxPermits : kMaxPermits, "limiter ", name_,
                     "the most one call may take");
  }
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

  // A give-back of 1.. permits (giveBack, refundAsync).
  Op<bool> giveBackOp(const std::string& key, std::int64_t permits, bool counted) const;
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
