// redlimit — a limiter's script call through the call protocol (limiter_call.hpp): what one try
// sends (the script, its keys and ARGV, through the Client's coalescing of takes or not) and the
// drivers that send it, written once for every limiter that calls a script.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "limiters/calendar_tables.hpp"
#include "limiters/limiter_call.hpp"
#include "limiters/one_key_batcher.hpp"
#include "redlimit/detail/client_access.hpp"
#include "limiters/script_helpers.hpp"

namespace redlimit::detail {

/// One script call, as every try sends it.
struct ScriptRequest {
  const Script* script = nullptr;  // lives as long as the limiter (a resend needs the limiter)
  std::vector<std::string> keys;
  std::vector<std::string> argv;
  OneKeyBatcher* batcher = nullptr;  // a one-key take through the Client's coalescing; null: alone
  // Calendar tables filled into argv in every try around the server's now, and sent once more
  // around the server's answer when it was outside one (calendar_tables.hpp); null: none.
  std::shared_ptr<const CalendarTables> tables;

  Reply send(Client& client, std::chrono::steady_clock::time_point deadline) const {
    if (!tables) return sendArgv(client, argv, deadline);
    std::chrono::microseconds around = tables->serverNowGuess();
    for (int tries = 0; tries < 2; ++tries) {
      Reply reply = sendArgv(client, tables->filled(argv, around), deadline);
      if (reply.type != Reply::Type::Integer) return reply;
      around = std::chrono::microseconds{reply.integer};  // the server's now, outside a table: nothing written
      tables->sawServerNow(around);
    }
    throw tables->outsideTwice();
  }
  // send() without waiting: tables around `around` (the second try's) or the guess. The request
  // outlives `done` (runOpAsync's shared op holds it while its call is in flight): not copied.
  void sendAsync(Client& client, std::chrono::steady_clock::time_point deadline, ReplyCallback done,
                 std::optional<std::chrono::microseconds> around = std::nullopt) const {
    if (!tables) return sendArgvAsync(client, argv, deadline, std::move(done));
    std::vector<std::string> args;
    if (std::exception_ptr error =
            thrownBy([&] { args = tables->filled(argv, around.value_or(tables->serverNowGuess())); })) {
      return done(Reply{}, std::move(error));
    }
    // The Client outlives its own callbacks: `client` is alive when this runs.
    sendArgvAsync(client, args, deadline,
                  [this, &client, deadline, second = around.has_value(), done = std::move(done)](
                      const Reply& reply, std::exception_ptr error) mutable {
                    if (error || reply.type != Reply::Type::Integer) return done(reply, std::move(error));
                    if (second) return done(Reply{}, std::make_exception_ptr(tables->outsideTwice()));
                    const std::chrono::microseconds serverNow{reply.integer};
                    tables->sawServerNow(serverNow);
                    sendAsync(client, deadline, std::move(done), serverNow);
                  });
  }

 private:
  // `v` as the Client takes it.
  static std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }
  Reply sendArgv(Client& client, const std::vector<std::string>& args,
                 std::chrono::steady_clock::time_point deadline) const {
    if (batcher != nullptr) return batcher->take(OneKeyCall{keys.front(), script, args, deadline, nullptr});
    return eval(client, *script, views(keys), views(args), deadline);
  }
  void sendArgvAsync(Client& client, const std::vector<std::string>& args,
                     std::chrono::steady_clock::time_point deadline, ReplyCallback done) const {
    if (batcher != nullptr) {
      return batcher->takeAsync(OneKeyCall{keys.front(), script, args, deadline, std::move(done)});
    }
    evalAsync(client, *script, views(keys), views(args), std::move(done), deadline);
  }
};

/// `r` through the protocol, waiting: `mapError(error)` makes a ScriptError the limiter's error,
/// `parse(reply)` reads the answer, `byPolicy(allowed)` is the failure policy's. `what` names the
/// call for the I/O-thread guard. `owner` has a Client client_ and a FailureGate gate_.
template <class Owner, class MapError, class Parse, class ByPolicy>
auto runScript(Owner& owner, const LimiterCall::Params& params, std::string_view what, const ScriptRequest& r,
               MapError&& mapError, Parse&& parse, ByPolicy&& byPolicy) {
  return runSync(
      *owner.client_, owner.gate_, params, what,
      [&](std::chrono::steady_clock::time_point deadline) {
        try {
          return r.send(*owner.client_, deadline);
        } catch (const ScriptError&) {
          std::rethrow_exception(mapError(std::current_exception()));
        }
      },
      parse, byPolicy);
}

/// One operation of a script, made by its checks before anything is sent, as both faces send it
/// (runOp waiting, runOpAsync without): the protocol's parameters, its name for the I/O-thread
/// guard, the request, how its reply reads (`self` null: the handle is gone), the failure
/// policy's answer (a deciding call's) and what is done with a result before the caller has it
/// (counting), if anything. `Owner` as for runScript. A `Read` may take the request too
/// (`parse(self, request, reply)`: its key, not a copy in a capture) and a `Then` the owner's
/// monitor (`then(monitor, out)`): then small captures fit in std::function and a call allocates
/// nothing for them.
template <class Owner, class Out, class Read = std::function<Out(Owner*, const Reply&)>,
          class Then = std::function<void(Out&)>>
struct ScriptOp {
  // parse's answer to `reply`.
  Out read(Owner* self, const Reply& reply) const {
    if constexpr (std::is_invocable_v<const Read&, Owner*, const ScriptRequest&, const Reply&>) {
      return parse(self, request, reply);
    } else {
      return parse(self, reply);
    }
  }
  // `out` after `then` (`monitor`: the owner's), if any.
  Out finished(const LimiterMonitor& monitor, Out out) const {
    if (!then) return out;
    if constexpr (std::is_invocable_v<const Then&, const LimiterMonitor&, Out&>) {
      then(monitor, out);
    } else {
      then(out);
    }
    return out;
  }

  LimiterCall::Params params;
  std::string_view what;
  ScriptRequest request;
  Read parse;
  std::function<Out(Owner&, bool)> byPolicy = [](Owner&, bool) { return Out{}; };  // a Plain call's: never asked
  Then then = {};
};

/// `op` through the protocol, waiting; `mapError` as for runScript, or taking the request too
/// (`mapError(error, request)`, for one that names the request's keys).
template <class Owner, class Op, class MapError>
auto runOp(Owner& owner, const Op& op, MapError&& mapError) {
  const auto mapped = [&](std::exception_ptr e) { return callMaybeWith(mapError, op.request, std::move(e)); };
  const auto read = [&](const Reply& r) { return op.read(&owner, r); };
  const auto policy = [&](bool allowed) { return op.byPolicy(owner, allowed); };
  return op.finished(owner.gate_.monitor(), runScript(owner, op.params, op.what, op.request, mapped, read, policy));
}

/// The operation `make()` makes, without waiting (runAsync; `mapError` as for runOp): `done` is isolated (a callback that
/// throws is reported once, naming `limiter`, and runs no second time) and gets the checks' error
/// at once, else the outcome on the I/O thread.
template <class Out, class Owner, class Make, class MapError>
void runOpAsync(const std::shared_ptr<Owner>& owner, const std::string& limiter, Make&& make, MapError mapError,
                std::function<void(Out, std::exception_ptr)> done) {
  using Op = std::decay_t<decltype(make())>;
  std::shared_ptr<const Op> op;  // one for the sender, the reader and the policy
  if (!checkedOrAnswered(done, owner->gate_.monitor(), limiter, [&] { op = std::make_shared<const Op>(make()); })) {
    return;
  }
  runAsync<Out>(
      owner, op->params,
      [op](Owner& self, std::chrono::steady_clock::time_point deadline, ReplyCallback&& sent) {
        op->request.sendAsync(*self.client_, deadline, std::move(sent));
      },
      [op, mapError = std::move(mapError)](std::exception_ptr e) mutable {
        return callMaybeWith(mapError, op->request, std::move(e));
      },
      [op](Owner* self, const Reply& r, const LimiterMonitor& monitor) {
        return op->finished(monitor, op->read(self, r));
      },
      [op](Owner& self, bool allowed) { return op->finished(self.gate_.monitor(), op->byPolicy(self, allowed)); },
      std::move(done));
}

/// A command (HGETALL, PTTL) through the protocol, waiting: its reply (`owner` as for runScript,
/// with its call bound callBound_). `what` names it for the I/O-thread guard.
template <class Owner>
Reply plainCommand(Owner& owner, std::string_view what, std::initializer_list<std::string_view> argv,
                   LimiterCall::Resend resend) {
  return runSync(
      *owner.client_, owner.gate_, LimiterCall::plain(owner.callBound_, resend), what,
      [&](std::chrono::steady_clock::time_point deadline) { return command(*owner.client_, argv, deadline); },
      [](Reply r) { return r; }, [](bool) { return Reply{}; });
}

/// A command answered by an integer (DEL, EXISTS) through the protocol (plainCommand).
template <class Owner>
std::int64_t integerCommand(Owner& owner, std::string_view what, std::initializer_list<std::string_view> argv,
                            LimiterCall::Resend resend) {
  return plainCommand(owner, what, argv, resend).asInteger();
}

/// A command on one key answered 1 or 0 (`name` `key`), and how it is sent again after a closed
/// connection; `what` names it for the I/O-thread guard.
struct KeyCommand {
  std::string_view what;
  std::string_view name;
  LimiterCall::Resend resend;
};
/// DEL: true if the key existed. Not sent again: a second DEL after a first that went through
/// answers 0.
inline constexpr KeyCommand kDeleteKey{"deleteKey", "DEL", LimiterCall::Resend::Never};
/// EXISTS: true if the key exists. Sent again after a closed connection (it changes nothing).
inline constexpr KeyCommand kKeyExists{"exists", "EXISTS", LimiterCall::Resend::IfClosed};

/// `c` on `key` through the protocol, waiting (integerCommand): true for 1.
template <class Owner>
bool keyCommand(Owner& owner, const KeyCommand& c, const std::string& key) {
  return integerCommand(owner, c.what, {c.name, key}, c.resend) == 1;
}

/// keyCommand without waiting: `done` gets the answer or the error (runAsync).
template <class Owner>
void keyCommandAsync(const std::shared_ptr<Owner>& owner, const KeyCommand& c, const std::string& key,
                     std::function<void(bool, std::exception_ptr)> done) {
  runAsync<bool>(
      owner, LimiterCall::plain(owner->callBound_, c.resend),
      [name = c.name, key](Owner& self, std::chrono::steady_clock::time_point deadline, ReplyCallback&& sent) {
        commandAsync(*self.client_, {name, key}, std::move(sent), deadline);
      },
      [](std::exception_ptr error) { return error; }, [](Owner*, const Reply& r) { return r.asInteger() == 1; },
      [](Owner&, bool) { return false; }, std::move(done));
}

/// keyCommand of EXISTS.
template <class Owner>
bool keyExists(Owner& owner, const std::string& key) {
  return keyCommand(owner, kKeyExists, key);
}

}  // namespace redlimit::detail
