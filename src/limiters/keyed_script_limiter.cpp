#include "redlimit/detail/keyed_script_limiter.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "limiters/one_key_batcher.hpp"
#include "limiters/script_call.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

using Steady = std::chrono::steady_clock;

// The take/peek reply of the script of `kind` on `key`.
Decision parseDecision(const std::string& key, char kind, const Reply& r, std::int64_t permits) {
  return decisionOf(parseDecisionReply(r, decisionFormOf(kind), key), permits);
}

}  // namespace

class KeyedScriptLimiter::Core : public std::enable_shared_from_this<KeyedScriptLimiter::Core> {
 public:
  Core(std::shared_ptr<Client> client, std::string name, FailureOptions failure, const MonitorOptions& monitor,
       const Script& script, char kind, KeyedPolicy policy)
      : client_(std::move(client)),
        name_(std::move(name)),
        script_(script),
        kind_(1, kind),
        policy_(std::move(policy)),
        gate_(name_, std::move(failure), ClockView{}, checkedMonitor(client_, name_, monitor)) {
    const ClientOptions& o = client_->options();
    callBound_ = saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
    if (kind == 'T' || kind == 'G' || kind == 'W') batcher_ = OneKeyBatcher::of(client_);
  }

  void check(std::string_view key, std::int64_t permits) const {
    if (key.empty()) throw InvalidArgument(fmt::format("redlimit: {}: the key must not be empty", name_));
    if (key.size() > ScriptLimiter::kMaxNameLength) {
      throw InvalidArgument(fmt::format("redlimit: {}: key is {} bytes; at most {} are allowed", name_, key.size(),
                                        ScriptLimiter::kMaxNameLength));
    }
    checkNotRecordKey(key, "key");
    if (permits < 1 || permits > policy_.maxPermits) {
      throw InvalidArgument(fmt::format("redlimit: {}: permits must be in 1..{} (the most one call may take), got {}",
                                        name_, policy_.maxPermits, permits));
    }
  }

  Decision byPolicy(std::int64_t permits, bool allowed) const {
    Decision d;
    d.allowed = allowed;
    d.permits = permits;
    d.limit = policy_.limit;
    d.byPolicy = true;
    return d;
  }

  // A call of the script on `key` (and `recordKey`, KEYS[2], unless empty): ARGV op, now, kind,
  // `a`, `b` and the configuration (ARGV[6]: the same position for every operation); a take
  // through the Client's coalescing when `coalesce`.
  ScriptRequest request(std::string_view op, std::string_view key, std::string a, std::string b,
                        std::string recordKey = {}, bool coalesce = false) {
    ScriptRequest r{&script_,
                    {std::string(key)},
                    {std::string(op), "", kind_, std::move(a), std::move(b), policy_.packed},
                    coalesce ? batcher_.get() : nullptr};
    if (!recordKey.empty()) r.keys.push_back(std::move(recordKey));
    return r;
  }
  LimiterCall::Params decision(std::int64_t permits) const {
    return LimiterCall::decision(callBound_, permits, policy_.localRate, milliseconds{policy_.localIntervalMs});
  }

  Decision take(std::string_view key, std::int64_t permits) {
    check(key, permits);
    // A resent take may count twice, never grant twice (docs/failure-modes.md).
    return runScript(
        *this, decision(permits), "decide", request("take", key, fmt::to_string(permits), "0", {}, true),
        OneKeyErrors{std::string(key), kind_[0]},
        [&](const Reply& r) { return parseDecision(std::string(key), kind_[0], r, permits); },
        [&](bool allowed) { return byPolicy(permits, allowed); });
  }

  void takeAsync(std::string_view key, std::int64_t permits, DecisionCallback done) {
    try {
      check(key, permits);
    } catch (...) {
      done(Decision{}, std::current_exception());
      return;
    }
    runScriptAsync<Decision>(
        shared_from_this(), decision(permits), request("take", key, fmt::to_string(permits), "0", {}, true),
        OneKeyErrors{std::string(key), kind_[0]},
        [key = std::string(key), kind = kind_[0], permits](Core*, const Reply& r) {
          return parseDecision(key, kind, r, permits);
        },
        [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); }, std::move(done));
  }

  Decision peek(std::string_view key, std::int64_t permits) {
    check(key, permits);
    // peek ignores the wait: the same positions keep the configuration at ARGV[6] for both.
    return runScript(
        *this, LimiterCall::plain(callBound_), "peek", request("peek", key, fmt::to_string(permits), "0"),
        OneKeyErrors{std::string(key), kind_[0]},
        [&](const Reply& r) { return parseDecision(std::string(key), kind_[0], r, permits); },
        [](bool) { return Decision{}; });
  }

  // A reserve's reply: take's nine values, then repeated.
  static HeldPermits held(const std::string& key, const Reply& reply, std::int64_t permits) {
    HeldPermits out;
    out.repeated = parseReserveRepeated(key, reply);
    out.decision = decisionOf(parseDecisionReply(reply, DecisionForm::Array, key, kReserveReplySize), permits);
    return out;
  }
  HeldPermits heldByPolicy(std::int64_t permits, bool allowed) const {
    HeldPermits out;
    out.decision = byPolicy(permits, allowed);
    return out;
  }

  // The reserve and settle calls are sent again if the connection closed under them: the record
  // says what was done.
  HeldPermits hold(std::string_view key, std::int64_t permits, const std::string& recordKey, milliseconds recordTtl) {
    check(key, permits);
    return runScript(
        *this, decision(permits), "reserveFor",
        request("reserve", key, fmt::to_string(permits), fmt::to_string(recordTtl.count()), recordKey),
        OneKeyErrors{std::string(key), kind_[0]}, [&](const Reply& r) { return held(std::string(key), r, permits); },
        [&](bool allowed) { return heldByPolicy(permits, allowed); });
  }

  // hold() without waiting: `done` gets what hold() would return or throw, once.
  void holdAsync(std::string_view key, std::int64_t permits, std::string recordKey, milliseconds recordTtl,
                 std::function<void(HeldPermits, std::exception_ptr)> done) {
    try {
      check(key, permits);
    } catch (...) {
      done(HeldPermits{}, std::current_exception());
      return;
    }
    runScriptAsync<HeldPermits>(
        shared_from_this(), decision(permits),
        request("reserve", key, fmt::to_string(permits), fmt::to_string(recordTtl.count()), std::move(recordKey)),
        OneKeyErrors{std::string(key), kind_[0]},
        [key = std::string(key), permits](Core*, const Reply& r) { return held(key, r, permits); },
        [permits](Core& self, bool allowed) { return self.heldByPolicy(permits, allowed); }, std::move(done));
  }

  Settlement settle(std::string_view key, const std::string& recordKey, std::int64_t actual) {
    return runScript(
        *this, LimiterCall::plain(callBound_), "settle", request("settle", key, fmt::to_string(actual), "0", recordKey),
        OneKeyErrors{std::string(key), kind_[0]},
        [&](const Reply& r) { return parseSettlement(std::string(key), r, gate_.monitor()); },
        [](bool) { return Settlement{}; });
  }

  void settleAsync(std::string_view key, std::string recordKey, std::int64_t actual,
                   ScriptLimiter::SettleCallback done) {
    runScriptAsync<Settlement>(
        shared_from_this(), LimiterCall::plain(callBound_),
        request("settle", key, fmt::to_string(actual), "0", std::move(recordKey)),
        OneKeyErrors{std::string(key), kind_[0]},
        [key = std::string(key), monitor = gate_.monitor()](Core*, const Reply& r) {
          return parseSettlement(key, r, monitor);
        },
        [](Core&, bool) { return Settlement{}; }, std::move(done));
  }

  std::shared_ptr<Client> client_;
  std::string name_;
  Script script_;
  std::string kind_;
  KeyedPolicy policy_;
  FailureGate gate_;
  milliseconds callBound_{0};
  std::shared_ptr<OneKeyBatcher> batcher_;  // the Client's coalescing of takes (null: one call each)
};

KeyedScriptLimiter::KeyedScriptLimiter(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
                                       const MonitorOptions& monitor, const Script& script, char kind,
                                       KeyedPolicy policy)
    : core_(std::make_shared<Core>(std::move(client), std::move(name), std::move(failure), monitor, script, kind,
                                   std::move(policy))) {}

Decision KeyedScriptLimiter::decide(std::string_view key, std::int64_t permits) {
  Decision d = core_->take(key, permits);
  monitor().admit(d);
  return d;
}

bool KeyedScriptLimiter::tryAcquire(std::string_view key, std::int64_t permits) { return decide(key, permits).allowed; }

Decision KeyedScriptLimiter::peek(std::string_view key, std::int64_t permits) { return core_->peek(key, permits); }

void KeyedScriptLimiter::decideAsync(std::string_view key, std::int64_t permits, DecisionCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = isolated(std::move(done), monitor(), core_->name_);
  core_->takeAsync(key, permits, [monitor = monitor(), done = std::move(done)](Decision d, std::exception_ptr error) {
    if (!error) monitor.admit(d);
    done(d, std::move(error));
  });
}

std::future<Decision> KeyedScriptLimiter::decideAsync(std::string_view key, std::int64_t permits) {
  return futureOf<Decision>([&](auto done) { decideAsync(key, permits, std::move(done)); });
}

bool KeyedScriptLimiter::deleteKey(std::string_view key) {
  core_->check(key, 1);
  return command(*core_->client_, {"DEL", key}).asInteger() > 0;
}

std::string KeyedScriptLimiter::reservationKey(std::string_view key, const std::string& id) const {
  core_->check(key, 1);
  return reservationRecordKey(std::string(key), id);
}

HeldPermits KeyedScriptLimiter::reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                                           milliseconds recordTtl) {
  const std::string recordKey = reservationKey(key, id);
  checkReservationTtl(recordTtl);
  HeldPermits out = core_->hold(key, permits, recordKey, recordTtl);
  if (out.repeated) return out;  // counted when it was granted
  monitor().admit(out.decision);
  if (out.decision.allowed && !out.decision.byPolicy && !out.decision.shadowDenied) monitor().reservationOpened();
  return out;
}

Settlement KeyedScriptLimiter::settle(std::string_view key, const std::string& id, std::int64_t actual) {
  const std::string recordKey = reservationKey(key, id);
  checkActualPermits(actual);
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  return core_->settle(key, recordKey, actual);
}

Settlement KeyedScriptLimiter::cancel(std::string_view key, const std::string& id) { return settle(key, id, 0); }

void KeyedScriptLimiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                                         milliseconds recordTtl, ScriptLimiter::HeldCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = isolated(std::move(done), monitor(), core_->name_);
  std::string recordKey;
  try {
    recordKey = reservationKey(key, id);
    checkReservationTtl(recordTtl);
  } catch (...) {
    done(HeldPermits{}, std::current_exception());
    return;
  }
  core_->holdAsync(key, permits, std::move(recordKey), recordTtl,
                   [monitor = monitor(), done = std::move(done)](HeldPermits out, std::exception_ptr error) {
                     if (!error && !out.repeated) {  // a repeat was counted when it was granted
                       monitor.admit(out.decision);
                       if (out.decision.allowed && !out.decision.byPolicy && !out.decision.shadowDenied) {
                         monitor.reservationOpened();
                       }
                     }
                     done(out, std::move(error));
                   });
}

std::future<HeldPermits> KeyedScriptLimiter::reserveForAsync(std::string_view key, std::int64_t permits,
                                                             const std::string& id, milliseconds recordTtl) {
  return futureOf<HeldPermits>([&](auto done) { reserveForAsync(key, permits, id, recordTtl, std::move(done)); });
}

void KeyedScriptLimiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual,
                                     ScriptLimiter::SettleCallback done) {
  done = isolated(std::move(done), monitor(), core_->name_);
  std::string recordKey;
  try {
    recordKey = reservationKey(key, id);
    checkActualPermits(actual);
  } catch (...) {
    done(Settlement{}, std::current_exception());
    return;
  }
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  core_->settleAsync(key, std::move(recordKey), actual, std::move(done));
}

std::future<Settlement> KeyedScriptLimiter::settleAsync(std::string_view key, const std::string& id,
                                                        std::int64_t actual) {
  return futureOf<Settlement>([&](auto done) { settleAsync(key, id, actual, std::move(done)); });
}

const std::string& KeyedScriptLimiter::getName() const noexcept { return core_->name_; }
const std::shared_ptr<Client>& KeyedScriptLimiter::client() const noexcept { return core_->client_; }
FailureStats KeyedScriptLimiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& KeyedScriptLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit::detail
