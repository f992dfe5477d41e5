#include "redlimit/detail/keyed_script_limiter.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "limiters/one_key_batcher.hpp"
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

  [[nodiscard]] std::optional<bool> policyDecide(std::int64_t permits) {
    return gate_.decide(permits, policy_.localRate, milliseconds{policy_.localIntervalMs});
  }

  // The script's arguments for `op` ("take" or "peek") of `permits`; `digits` holds the number.
  std::vector<std::string_view> args(std::string_view op, const fmt::format_int& digits) const {
    // peek ignores the wait: the same positions keep the configuration at ARGV[6] for both.
    return {op, "", kind_, std::string_view(digits.data(), digits.size()), "0", policy_.packed};
  }

  Decision take(std::string_view key, std::int64_t permits) {
    check(key, permits);
    if (client_->onIoThread()) {
      throw InvalidArgument(fmt::format(
          "redlimit: {}: a sync decision from a completion callback would wait for the thread that runs it; "
          "use decideAsync there",
          name_));
    }
    if (!gate_.shouldTry()) {
      if (auto d = policyDecide(permits)) return byPolicy(permits, *d);
      gate_.throwUnavailable();
    }
    const fmt::format_int digits(permits);
    const std::vector<std::string_view> keys{key};
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    try {
      Reply reply;
      try {
        const auto deadline = deadlineAfter<Steady>(Steady::now(), callBound_);
        if (batcher_) {
          const std::vector<std::string_view> a = args("take", digits);
          reply = batcher_->take(OneKeyCall{std::string(key), script_, {a.begin(), a.end()}, deadline, nullptr});
        } else {
          reply = eval(*client_, script_, keys, args("take", digits), deadline);
        }
      } catch (const ScriptError&) {
        std::rethrow_exception(oneKeyScriptError(std::current_exception(), std::string(key), kind_[0]));
      }
      Decision d = parseDecision(std::string(key), kind_[0], reply, permits);
      gate_.answered(started);
      return d;
    } catch (const Error&) {
      if (auto d = gate_.settle(std::current_exception(), started, permits, policy_.localRate,
                                milliseconds{policy_.localIntervalMs})) {
        return byPolicy(permits, *d);
      }
      throw;
    }
  }

  void takeAsync(std::string_view key, std::int64_t permits, DecisionCallback done) {
    try {
      check(key, permits);
    } catch (...) {
      done(Decision{}, std::current_exception());
      return;
    }
    if (gate_.answerWithoutRedis(
            permits, policy_.localRate, milliseconds{policy_.localIntervalMs},
            [&](bool allowed) { done(byPolicy(permits, allowed), nullptr); },
            [&](const std::exception_ptr& e) { done(Decision{}, e); })) {
      return;
    }
    const fmt::format_int digits(permits);
    const std::vector<std::string_view> keys{key};
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    // The completion holds the policy weakly, as ScriptLimiter's does.
    ReplyCallback completion = [weak = weak_from_this(), key = std::string(key), kind = kind_[0], permits, started,
                                done = std::move(done)](const Reply& reply, std::exception_ptr error) {
      const std::shared_ptr<Core> self = weak.lock();
      Decision out;
      if (!error) {
        try {
          out = parseDecision(key, kind, reply, permits);
        } catch (...) {
          error = std::current_exception();
        }
      } else {
        error = oneKeyScriptError(std::move(error), key, kind);
      }
      finish(
          self, error, started, permits, [&] { done(out, nullptr); },
          [&](bool allowed) { done(self->byPolicy(permits, allowed), nullptr); },
          [&](const std::exception_ptr& e) { done(Decision{}, e); });
    };
    const auto deadline = deadlineAfter<Steady>(Steady::now(), callBound_);
    if (batcher_) {
      const std::vector<std::string_view> a = args("take", digits);
      batcher_->takeAsync(OneKeyCall{std::string(key), script_, {a.begin(), a.end()}, deadline, std::move(completion)});
      return;
    }
    evalAsync(*client_, script_, keys, args("take", digits), std::move(completion), deadline);
  }

  Decision peek(std::string_view key, std::int64_t permits) {
    check(key, permits);
    const fmt::format_int digits(permits);
    const std::vector<std::string_view> keys{key};
    try {
      return parseDecision(
          std::string(key), kind_[0],
          eval(*client_, script_, keys, args("peek", digits), deadlineAfter<Steady>(Steady::now(), callBound_)),
          permits);
    } catch (const ScriptError&) {
      std::rethrow_exception(oneKeyScriptError(std::current_exception(), std::string(key), kind_[0]));
    }
  }

  // An unguarded script call of `op` on `key` and its reservation record `recordKey`: ARGV[4] and
  // [5] are `a` and `b`, the configuration ARGV[6]. Sent again if the connection closed under it
  // (reserve and settle are safe to send twice: the record says what was done).
  Reply callWithRecord(std::string_view op, std::string_view key, const std::string& recordKey, const std::string& a,
                       const std::string& b) {
    const std::vector<std::string_view> argv{op, "", kind_, a, b, policy_.packed};
    const std::vector<std::string_view> keys{key, recordKey};
    const auto deadline = deadlineAfter<Steady>(Steady::now(), callBound_);
    constexpr int kMaxTries = 3;  // a server that closes every connection is not retried forever
    for (int tries = 1;; ++tries) {
      try {
        const auto tryDeadline =
            std::min(deadline, deadlineAfter<Steady>(Steady::now(), client_->options().connection.commandTimeout));
        return eval(*client_, script_, keys, argv, tryDeadline);
      } catch (const ScriptError&) {
        std::rethrow_exception(oneKeyScriptError(std::current_exception(), std::string(key), kind_[0]));
      } catch (const ClosedError&) {
        if (tries == kMaxTries || Steady::now() >= deadline) throw;
      }
    }
  }

  // callWithRecord without waiting: `done` gets the reply or the error once, on the I/O thread.
  // Sent again (3 tries in all, as the sync call) if the connection closed under it, while the
  // deadline allows; the completion holds the policy weakly, and a dropped policy's call is not
  // sent again.
  struct RecordCall {
    std::string op, key, recordKey, a, b;
  };
  void callWithRecordAsync(RecordCall call, ReplyCallback done) {
    sendWithRecord(std::make_shared<const RecordCall>(std::move(call)),
                   deadlineAfter<Steady>(Steady::now(), callBound_), 1, std::move(done));
  }

  void sendWithRecord(std::shared_ptr<const RecordCall> call, Steady::time_point deadline, int tries,
                      ReplyCallback done) {
    const std::vector<std::string_view> argv{call->op, "", kind_, call->a, call->b, policy_.packed};
    const std::vector<std::string_view> keys{call->key, call->recordKey};
    const auto tryDeadline =
        std::min(deadline, deadlineAfter<Steady>(Steady::now(), client_->options().connection.commandTimeout));
    evalAsync(
        *client_, script_, keys, argv,
        [weak = weak_from_this(), call, deadline, tries, kind = kind_[0], done = std::move(done)](
            const Reply& reply, std::exception_ptr error) mutable {
          constexpr int kMaxTries = 3;
          if (error && closedConnection(error) && tries < kMaxTries && Steady::now() < deadline) {
            if (const std::shared_ptr<Core> self = weak.lock()) {
              self->sendWithRecord(std::move(call), deadline, tries + 1, std::move(done));
              return;
            }
          }
          done(reply, error ? oneKeyScriptError(std::move(error), call->key, kind) : nullptr);
        },
        tryDeadline);
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
    const auto byPolicyHeld = [&](bool allowed) {
      HeldPermits out;
      out.decision = byPolicy(permits, allowed);
      done(out, nullptr);
    };
    if (gate_.answerWithoutRedis(permits, policy_.localRate, milliseconds{policy_.localIntervalMs}, byPolicyHeld,
                                 [&](const std::exception_ptr& e) { done(HeldPermits{}, e); })) {
      return;
    }
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    callWithRecordAsync(RecordCall{"reserve", std::string(key), std::move(recordKey), fmt::to_string(permits),
                                   fmt::to_string(recordTtl.count())},
                        [weak = weak_from_this(), key = std::string(key), permits, started, done = std::move(done)](
                            const Reply& reply, std::exception_ptr error) {
                          const std::shared_ptr<Core> self = weak.lock();
                          HeldPermits out;
                          if (!error) {
                            try {
                              out.repeated = parseReserveRepeated(key, reply);
                              out.decision = decisionOf(
                                  parseDecisionReply(reply, DecisionForm::Array, key, kReserveReplySize), permits);
                            } catch (...) {
                              error = std::current_exception();
                            }
                          }
                          finish(
                              self, error, started, permits, [&] { done(out, nullptr); },
                              [&](bool allowed) {
                                HeldPermits decided;
                                decided.decision = self->byPolicy(permits, allowed);
                                done(decided, nullptr);
                              },
                              [&](const std::exception_ptr& e) { done(HeldPermits{}, e); });
                        });
  }

  // FailureGate::finish with the policy's local rate, for a completion whose policy may have been
  // dropped meanwhile (`self` null).
  template <class Ok, class Decided, class Failed>
  static void finish(const std::shared_ptr<Core>& self, const std::exception_ptr& error, std::int64_t started,
                     std::int64_t permits, Ok&& ok, Decided&& decided, Failed&& failed) {
    FailureGate::finish(self ? &self->gate_ : nullptr, error, started, permits, self ? self->policy_.localRate : 0,
                        milliseconds{self ? self->policy_.localIntervalMs : 0}, std::forward<Ok>(ok),
                        std::forward<Decided>(decided), std::forward<Failed>(failed));
  }

  HeldPermits hold(std::string_view key, std::int64_t permits, const std::string& recordKey, milliseconds recordTtl) {
    check(key, permits);
    if (client_->onIoThread()) {
      throw InvalidArgument(fmt::format(
          "redlimit: {}: a sync reserveFor from a completion callback would wait for the thread that runs it", name_));
    }
    HeldPermits out;
    if (!gate_.shouldTry()) {
      if (auto d = policyDecide(permits)) {
        out.decision = byPolicy(permits, *d);
        return out;
      }
      gate_.throwUnavailable();
    }
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    try {
      const Reply reply =
          callWithRecord("reserve", key, recordKey, fmt::to_string(permits), fmt::to_string(recordTtl.count()));
      out.repeated = parseReserveRepeated(std::string(key), reply);
      // A reserve reply is an array: take's nine values, then repeated.
      out.decision = decisionOf(parseDecisionReply(reply, DecisionForm::Array, key, kReserveReplySize), permits);
      gate_.answered(started);
      return out;
    } catch (const Error&) {
      if (auto d = gate_.settle(std::current_exception(), started, permits, policy_.localRate,
                                milliseconds{policy_.localIntervalMs})) {
        out.decision = byPolicy(permits, *d);
        return out;
      }
      throw;
    }
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
  return parseSettlement(std::string(key), core_->callWithRecord("settle", key, recordKey, fmt::to_string(actual), "0"),
                         monitor());
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
  core_->callWithRecordAsync(
      Core::RecordCall{"settle", std::string(key), std::move(recordKey), fmt::to_string(actual), "0"},
      [key = std::string(key), monitor = monitor(), done = std::move(done)](const Reply& reply,
                                                                            std::exception_ptr error) {
        Settlement out;
        if (!error) {
          try {
            out = parseSettlement(key, reply, monitor);
          } catch (...) {
            error = std::current_exception();
          }
        }
        done(out, std::move(error));
      });
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
