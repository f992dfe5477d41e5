// redlimit — the protocol of one limiter call, without I/O (as the transport's pipeline keeps a
// connection's, and Boost.Redis's exec_fsm a request's): the failure gate before sending, the
// call's deadline, the one resend rule, the gate's reading of the outcome and the round-trip
// metric. Events go in (start, a reply, an error); actions come out (send, answer, the failure
// policy's decision, fail). runSync and runAsync are the thin drivers every limiter call goes
// through; tests drive the machine itself on a ManualClock.
//
// The resend rule (docs/failure-modes.md, "A connection closed under a call"): a connection that
// closes under a call (ClosedError) is not by itself an outage. The call is sent again, at most
// triesOf(client) times in all and only while its deadline allows; only then does the error reach
// the failure gate. An operation that may already have been applied is resent only where that cannot
// grant twice: reserve and settle carry their record's id (the second answers the first), a take
// may count twice but grants only what the script grants on the try that answers. An operation
// whose resend could give permits back twice or answer its own write wrongly (refund, the
// set-if-absent configuration) is Resend::Never: its ClosedError reaches the caller.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "limiters/completion.hpp"
#include "redlimit/client.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/detail/reply.hpp"

namespace redlimit::detail {

class LimiterCall {
 public:
  /// The fewest tries in all a call is given, for a server that closes every connection: not
  /// retried forever (each try may cost it a new connection). Five, not three: a CLIENT KILL of
  /// every connection each 30 ms, under a sanitizer and a loaded machine, closed three tries of one
  /// call in a row (TransportTest.PipeliningUnderClientKillAndScriptFlushLosesNothing); the call's
  /// deadline bounds them all.
  static constexpr int kMinTries = 5;

  /// Tries in all for a call of a limiter on `client`: one per connection of its pool and one
  /// more, at least kMinTries. One CLIENT KILL closes the connections one after another, and a
  /// resend that moves to the next connection still open can be closed there too: every
  /// connection of the pool may close under one call before a new one, opened after the kill, answers.
  static int triesOf(const Client& client) {
    return static_cast<int>(std::max<std::size_t>(client.options().pool.size + 1, kMinTries));  // size <= 1024
  }

  /// A Decision passes the failure gate (an outage is decided by the failure policy, the outcome
  /// reported to the gate, the round trip counted); a Plain call (peek, settle, configuration,
  /// lease renewal) does not: its errors reach the caller.
  enum class Guard { Decision, Plain };
  /// Whether a call whose connection closed under it is sent again (see above).
  enum class Resend { IfClosed, Never };

  struct Params {
    Guard guard = Guard::Plain;
    Resend resend = Resend::IfClosed;
    std::chrono::microseconds bound{0};  // the whole call, every try, ends within it
    // For the failure policy's decision: the permits asked for, the last configuration seen.
    std::int64_t permits = 1;
    std::int64_t rate = 0;
    std::chrono::milliseconds interval{0};
    // A Decision's requests are counted (LimiterMetrics::roundTrip) here, one per try, unless its
    // sender counts them itself (a coalesced batch of several calls is one request).
    bool senderCountsRequests = false;
  };

  struct Action {
    enum class Kind { Send, Answer, Decide, Fail };
    Kind kind = Kind::Fail;
    std::chrono::microseconds budget{0};  // Send: how long this try may take (to the call's deadline)
    bool resend = false;                  // Send: a later try of the call (its connection closed under the last)
    bool allowed = false;                 // Decide: the failure policy's answer
    std::exception_ptr error;             // Fail: what the caller gets
  };

  /// A call of `tries` in all (triesOf(client) for a call that sends; more than 0).
  LimiterCall(FailureGate& gate, const Params& params, int tries = kMinTries)
      : gate_(&gate), params_(params), maxTries_(tries) {}

  /// The bound of one call of a limiter on `client`, every try: its connect and command
  /// timeouts, saturated.
  static std::chrono::milliseconds boundOf(const Client& client) {
    const ClientOptions::Connection& o = client.options().connection;
    return saturatingAdd(o.connectTimeout, o.commandTimeout);
  }
  /// A Decision of `permits`, sent again after a closed connection; `rate`/`interval` as
  /// FailureGate::decide takes them.
  static Params decision(std::chrono::microseconds bound, std::int64_t permits, std::int64_t rate,
                         std::chrono::milliseconds interval) {
    return Params{Guard::Decision, Resend::IfClosed, bound, permits, rate, interval};
  }
  static Params plain(std::chrono::microseconds bound, Resend resend = Resend::IfClosed) {
    return Params{Guard::Plain, resend, bound};
  }

  /// The call begins: Send; or, for a Decision while the gate holds calls back, the policy's
  /// Decide, or Fail with the gate's IoError (FailurePolicy::Throw).
  Action start() {
    if (params_.guard == Guard::Decision && !gate_->shouldTry()) {
      const std::optional<bool> d = gate_->decide(params_.permits, params_.rate, params_.interval);
      return d ? decide(*d) : fail(thrownBy([this] { gate_->throwUnavailable(); }));
    }
    started_ = gate_->callStart();
    deadline_ = saturatingAdd(started_, params_.bound.count());
    return send();
  }

  /// The try answered and its reply was read: Answer (a Decision reports it to the gate).
  Action replied() {
    if (params_.guard == Guard::Decision) gate_->answered(started_);
    return {Action::Kind::Answer, {}, false, false, nullptr};
  }

  /// The try failed with `error` (the limiter's error types), or its reply could not be read:
  /// Send again after a closed connection while the rule allows; else a Decision's outcome as the
  /// gate reads it (Decide under the policy, or Fail), a Plain call's Fail.
  Action failed(std::exception_ptr error) {
    if (params_.resend == Resend::IfClosed && tries_ < maxTries_ && gate_->clock().now().count() < deadline_ &&
        closedConnection(error)) {
      return send();
    }
    const std::optional<bool> d = params_.guard == Guard::Decision
                                      ? gate_->settle(error, started_, params_.permits, params_.rate, params_.interval)
                                      : std::nullopt;
    return d ? decide(*d) : fail(std::move(error));
  }

  [[nodiscard]] int tries() const noexcept { return tries_; }

 private:
  Action send() {
    ++tries_;
    if (params_.guard == Guard::Decision && !params_.senderCountsRequests) {
      gate_->monitor().roundTrip();  // a resend is another request
    }
    const std::int64_t left = std::max<std::int64_t>(deadline_ - gate_->clock().now().count(), 0);
    return {Action::Kind::Send, std::chrono::microseconds{left}, tries_ > 1, false, nullptr};
  }
  static Action decide(bool allowed) { return {Action::Kind::Decide, {}, false, allowed, nullptr}; }
  static Action fail(std::exception_ptr error) { return {Action::Kind::Fail, {}, false, false, std::move(error)}; }

  FailureGate* gate_;
  Params params_;
  std::int64_t started_ = 0;   // µs, the gate's clock
  std::int64_t deadline_ = 0;  // µs, the gate's clock
  int maxTries_ = kMinTries;
  int tries_ = 0;
};

/// `f(args..., last)` when `f` takes `last` after `args`, else `f(args...)`: a callback takes what
/// a driver offers only if it needs it (a sender, whether the try is a resend: one whose script
/// answers a grant already made under the call's id; a reader, the owner's monitor; an error
/// mapping, the request).
template <class F, class Last, class... Args>
decltype(auto) callMaybeWith(F& f, Last&& last, Args&&... args) {
  if constexpr (std::is_invocable_v<F&, Args..., Last>) {
    return f(std::forward<Args>(args)..., std::forward<Last>(last));
  } else {
    return f(std::forward<Args>(args)...);
  }
}

/// The steady-clock deadline of a try given `budget`.
inline std::chrono::steady_clock::time_point tryDeadline(std::chrono::microseconds budget) {
  return deadlineAfter<std::chrono::steady_clock>(std::chrono::steady_clock::now(), budget);
}

/// One call, waiting for its outcome on this thread. `send(deadline[, resend])` sends one try and returns
/// its reply (a Reply, or what a sender that groups calls makes of its reply for this one), throwing its error as the limiter's types; `parse(reply)` reads the answer (may
/// throw); `byPolicy(allowed)` is the failure policy's answer. A Decision refuses to wait on the
/// Client's I/O thread (it would wait for itself): InvalidArgument naming `what`.
template <class Send, class Parse, class ByPolicy>
auto runSync(Client& client, FailureGate& gate, const LimiterCall::Params& params, std::string_view what, Send&& send,
             Parse&& parse, ByPolicy&& byPolicy)
    -> decltype(parse(callMaybeWith(send, false, std::chrono::steady_clock::time_point{}))) {
  if (params.guard == LimiterCall::Guard::Decision && client.onIoThread()) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: a sync {} from a completion callback would wait for the thread that runs "
                    "it; use {}Async there",
                    gate.limiter(), what, what));
  }
  LimiterCall call(gate, params, LimiterCall::triesOf(client));
  LimiterCall::Action a = call.start();
  while (a.kind == LimiterCall::Action::Kind::Send) {
    try {
      auto out = parse(callMaybeWith(send, a.resend, tryDeadline(a.budget)));
      (void)call.replied();
      return out;
    } catch (const Error&) {
      a = call.failed(std::current_exception());
    }
  }
  if (a.kind == LimiterCall::Action::Kind::Decide) return byPolicy(a.allowed);
  std::rethrow_exception(a.error);  // Fail: start() and failed() never answer Answer
}

/// One call reporting through `done`, once: on this thread when it is decided without sending,
/// else on the I/O thread. A try's raw outcome is a Raw (a Reply, or what a sender that groups
/// calls makes of its reply for this one). `owner` (the limiter's core, with its FailureGate gate_
/// and its Client client_, whose pool sets the tries: LimiterCall::triesOf) is held weakly
/// while the call is in flight: a dropped limiter's call is not sent again, its error reaches
/// `done` as it is, and its reply is read with a null owner. `send(owner, deadline, completion[,
/// resend])` sends one try; `mapError(error)` makes a transport error the limiter's; `parse(owner*, reply[,
/// monitor])` reads the answer (`monitor`: the owner's, alive with the call when the owner is not);
/// `byPolicy(owner, allowed)` is the failure policy's. A `send` that throws (its
/// try not even queued, a first try or a resend) ends the call: `done` has that error. A `done`
/// that throws is reported (Event::Kind::CallbackThrew) and affects nothing else.
template <class Out, class Raw = Reply, class Owner, class Send, class MapError, class Parse, class ByPolicy>
void runAsync(const std::shared_ptr<Owner>& owner, const LimiterCall::Params& params, Send send, MapError mapError,
              Parse parse, ByPolicy byPolicy, std::function<void(Out, std::exception_ptr)> done) {
  using Kind = LimiterCall::Action::Kind;
  struct State {
    std::weak_ptr<Owner> owner;
    LimiterCall call;
    Send send;
    MapError mapError;
    Parse parse;
    ByPolicy byPolicy;
    std::function<void(Out, std::exception_ptr)> done;
    LimiterMonitor monitor;  // the owner's: a callback that throws is reported after the owner is gone too
    std::string limiter;

    void deliver(Out out, std::exception_ptr error) noexcept {
      callOnce(done, &monitor, limiter, std::move(out), std::move(error));
    }
    static void act(const std::shared_ptr<State>& s, Owner& self, LimiterCall::Action a) {
      if (a.kind == Kind::Decide) return s->deliver(s->byPolicy(self, a.allowed), nullptr);
      if (a.kind != Kind::Send) return s->deliver(Out{}, std::move(a.error));
      try {
        callMaybeWith(s->send, a.resend, self, tryDeadline(a.budget),
                      [s](const Raw& reply, std::exception_ptr error) { completed(s, reply, std::move(error)); });
      } catch (...) {  // the try could not even be queued (a first try or a resend): `done` has why
        s->deliver(Out{}, std::current_exception());
      }
    }
    static void completed(const std::shared_ptr<State>& s, const Raw& reply, std::exception_ptr error) {
      const std::shared_ptr<Owner> self = s->owner.lock();
      Out out{};
      error = error ? s->mapError(std::move(error))
                    : thrownBy([&] { out = callMaybeWith(s->parse, std::as_const(s->monitor), self.get(), reply); });
      // A dropped owner's call has no gate to report to and is not sent again.
      if (self && error) return act(s, *self, s->call.failed(std::move(error)));
      if (self) (void)s->call.replied();
      s->deliver(std::move(out), std::move(error));  // `out` is Out{} when there is an error
    }
  };
  FailureGate& gate = owner->gate_;
  auto s = std::make_shared<State>(State{owner, LimiterCall(gate, params, LimiterCall::triesOf(*owner->client_)),
                                         std::move(send), std::move(mapError), std::move(parse), std::move(byPolicy),
                                         std::move(done), gate.monitor(), gate.limiter()});
  State::act(s, *owner, s->call.start());
}

}  // namespace redlimit::detail
