// redlimit — one limiter of a one-key script (lua/gcra.lua, lua/fixed_window.lua, lua/smooth.lua)
// over any number of keys: the Client, the name (the metrics label and the limiter named in
// events), the failure gate, the configuration the calls carry (none: each key's stored one), and
// every operation of the script on a key given per call, through the call protocol
// (limiter_call.hpp). Limiter (a key per call, under its name) is its face.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "limiters/limiter_call.hpp"
#include "limiters/permit_core.hpp"
#include "limiters/one_key_batcher.hpp"
#include "limiters/script_call.hpp"
#include "redlimit/detail/acquire_result.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

class ScriptCore : public PermitCore, public std::enable_shared_from_this<ScriptCore> {
 public:
  /// Every call carries `policy`; null: each key's stored configuration (a stored Policy). A key's
  /// reservation records live in redlimit's own namespace, where no caller's key can reach
  /// (docs/api.md, "Keys"). Sends nothing. Throws InvalidArgument for a null client, a bad name or
  /// bad failure options.
  ScriptCore(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
             const LimiterMonitor::Options& monitor, const Script& script, char kind,
             std::shared_ptr<const KeyedPolicy> policy);

  // The deciding operations on `key` (the failure gate first; an outage is the failure policy's).
  // A resent take may count twice, never grant twice (docs/failure-modes.md).
  Decision take(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait);
  void takeAsync(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait, Done<Decision> done);
  /// take() without a wait, counted in the metrics (shadow mode applied).
  Decision decide(const std::string& key, std::int64_t permits) override;
  /// Takes `permits` if they come within `timeout` (one call reserves them, then this sleeps the
  /// wait); false at once when they do not (nothing taken). Shadow mode never waits.
  bool tryAcquire(const std::string& key, std::int64_t permits, std::chrono::milliseconds timeout);
  /// Takes `permits`, waiting as long as it takes (the failure policy's denial: a probe interval);
  /// returns the time slept.
  std::chrono::microseconds acquire(const std::string& key, std::int64_t permits);
  /// A reservation of `permits` at most `maxWait` (>= 0) ahead, counted.
  Decision reserve(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait);
  /// reserve() without waiting for the reply; `done` isolated.
  void reserveAsync(const std::string& key, std::int64_t permits, std::chrono::microseconds maxWait,
                    Done<Decision> done);
  /// decide() without waiting; `done` isolated (a callback that throws is reported once).
  void decideAsync(const std::string& key, std::int64_t permits, Done<Decision> done) override;
  /// A reserve under the record of `id` (sent again after a closed connection: the record makes a
  /// resend take nothing twice), counted; bad id or TTL: InvalidArgument before sending.
  Decision reserveFor(const std::string& key, std::int64_t permits, const std::string& id,
                      std::chrono::milliseconds recordTtl) override;
  void reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id,
                       std::chrono::milliseconds recordTtl, Done<Decision> done) override;

  // The other operations: their IoError reaches the caller.
  Decision peek(const std::string& key, std::int64_t permits) override;
  void peekAsync(const std::string& key, std::int64_t permits, Done<Decision> done) override;
  /// Gives `permits` (0..kMaxPermits) back to `key`; never sent again (it could give back twice).
  void giveBack(const std::string& key, std::int64_t permits);
  void giveBackAsync(const std::string& key, std::int64_t permits, std::function<void(bool, std::exception_ptr)> done);
  /// giveBack, counted as a caller's refund (a segment's give-back is not).
  void refund(const std::string& key, std::int64_t permits) override;
  void refundAsync(const std::string& key, std::int64_t permits, Done<bool> done) override;
  /// Settles the reservation `id` of `key` (safe to send again: a second answers AlreadySettled).
  Settlement settle(const std::string& key, const std::string& id, std::int64_t actual) override;
  void settleAsync(const std::string& key, const std::string& id, std::int64_t actual, Done<Settlement> done) override;
  /// The script's `op` on `key` with its arguments after now and kind; `recordKey` is KEYS[2].
  Reply call(const std::string& key, std::string_view op, const std::vector<std::string>& args,
             LimiterCall::Resend resend, const std::string* recordKey = nullptr);
  /// How writeConfig writes: only where the key has none (not sent again: a resend of a write that
  /// went through would say false), or keeping the permits in use (safe to send again).
  enum class ConfigWrite { IfAbsent, KeepState };
  /// Writes a configuration (the script's "set" arguments after the mode) into `key`; true if
  /// written (KeepState: always).
  bool writeConfig(const std::string& key, ConfigWrite how, const std::vector<std::string>& config);
  /// DEL of `key` (not sent again: a second DEL after a first that was applied would answer 0) and
  /// EXISTS (sent again after a closed connection).
  bool deleteKey(const std::string& key) override;
  void deleteKeyAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) override;
  bool exists(const std::string& key) override;
  void existsAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) override;

  /// The configuration every call carries, or null (each key's stored one).
  [[nodiscard]] const KeyedPolicy* policy() const noexcept { return policy_.get(); }
  /// The limit and the Local policy's bucket last seen (a reply's, or the configuration's).
  void remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept;
  /// 1..kMaxPermits, and under a configuration in the call its own bound.
  void checkPermits(std::int64_t permits, const KeyedPolicy* policy) const;
  /// The key of the reservation record `id` of `key`; InvalidArgument for a bad id.
  [[nodiscard]] std::string recordKey(const std::string& key, const std::string& id) const override;
  [[nodiscard]] const std::string& coreName() const noexcept override { return name_; }
  [[nodiscard]] const std::shared_ptr<Client>& coreClient() const noexcept override { return client_; }
  [[nodiscard]] const FailureGate& coreGate() const noexcept override { return gate_; }
  void sleepFor(std::chrono::microseconds d) const { gate_.clock().sleepFor(d); }

  /// The failure policy's decision of `permits` without a reply (the segment cache's wait that
  /// timed out): the policy's answer, or TimeoutError naming `reason`.
  bool decideUnanswered(std::int64_t permits, const std::string& reason);
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
  Script script_;
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
                        bool coalesce = false);
  // argv for `op` on a key: op, now ('' = the server's), kind, `a`, `b`, and the configuration at
  // ARGV[6] when the handle has one (the same position for every operation).
  std::vector<std::string> args(std::string_view op, std::string a, std::string b, const KeyedPolicy* policy) const;
  LimiterCall::Params decision(std::int64_t permits) const;
  // peek's and refund's calls, checked before anything is sent (refund of 0: no call, nullopt).
  ScriptRequest peekRequest(const std::string& key, std::int64_t permits);
  std::optional<ScriptRequest> refundRequest(const std::string& key, std::int64_t permits);
  OneKeyErrors mapError(const std::string& key) const { return OneKeyErrors{key, kind_[0]}; }
  // The take/peek reply of this script; `self` (may be null: the handle is gone) remembers the
  // configuration it tells.
  static Decision parse(ScriptCore* self, const std::string& key, char kind, const Reply& r, std::int64_t permits);
  // A reserve's reply: take's values, then repeated.
  static Decision held(ScriptCore* self, const std::string& key, const Reply& r, std::int64_t permits);
  Decision byPolicy(std::int64_t permits, bool allowed) const;

  const std::shared_ptr<const KeyedPolicy> policy_;
  // The Client's coalescing of takes (token bucket, GCRA, fixed window; null: one call each).
  std::shared_ptr<OneKeyBatcher> batcher_;
};

}  // namespace redlimit::detail
