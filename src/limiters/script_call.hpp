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
  void sendAsync(Client& client, std::chrono::steady_clock::time_point deadline, ReplyCallback done) const {
    if (!tables) {
      sendArgvAsync(client, argv, deadline, std::move(done));
      return;
    }
    sendAround(client, deadline, std::move(done), std::nullopt);
  }

 private:
  Reply sendArgv(Client& client, const std::vector<std::string>& args,
                 std::chrono::steady_clock::time_point deadline) const {
    if (batcher != nullptr) return batcher->take(OneKeyCall{keys.front(), *script, args, deadline, nullptr});
    const std::vector<std::string_view> k(keys.begin(), keys.end()), a(args.begin(), args.end());
    return eval(client, *script, k, a, deadline);
  }
  void sendArgvAsync(Client& client, const std::vector<std::string>& args,
                     std::chrono::steady_clock::time_point deadline, ReplyCallback done) const {
    if (batcher != nullptr) {
      batcher->takeAsync(OneKeyCall{keys.front(), *script, args, deadline, std::move(done)});
      return;
    }
    const std::vector<std::string_view> k(keys.begin(), keys.end()), a(args.begin(), args.end());
    evalAsync(client, *script, k, a, std::move(done), deadline);
  }
  // send() without waiting: tables around `around` (the second try's) or the guess.
  void sendAround(Client& client, std::chrono::steady_clock::time_point deadline, ReplyCallback done,
                  std::optional<std::chrono::microseconds> around) const {
    std::vector<std::string> args;
    try {
      args = tables->filled(argv, around.value_or(tables->serverNowGuess()));
    } catch (...) {
      done(Reply{}, std::current_exception());
      return;
    }
    const bool second = around.has_value();
    // The Client outlives its own callbacks: `client` is alive when this runs.
    sendArgvAsync(client, args, deadline,
                  [self = *this, &client, deadline, second, done = std::move(done)](const Reply& reply,
                                                                                    std::exception_ptr error) mutable {
                    if (error || reply.type != Reply::Type::Integer) {
                      done(reply, std::move(error));
                      return;
                    }
                    if (second) {
                      done(Reply{}, std::make_exception_ptr(self.tables->outsideTwice()));
                      return;
                    }
                    const std::chrono::microseconds serverNow{reply.integer};
                    self.tables->sawServerNow(serverNow);
                    self.sendAround(client, deadline, std::move(done), serverNow);
                  });
  }
};

/// The errors of a one-key script on `key` as the limiter's (oneKeyScriptError).
struct OneKeyErrors {
  std::string key;
  char kind;
  std::exception_ptr operator()(std::exception_ptr e) const { return oneKeyScriptError(std::move(e), key, kind); }
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

/// `r` through the protocol, reporting to `done` (runAsync): `parse(Owner*, reply)`,
/// `byPolicy(Owner&, allowed)`.
template <class Out, class Owner, class MapError, class Parse, class ByPolicy>
void runScriptAsync(const std::shared_ptr<Owner>& owner, const LimiterCall::Params& params, ScriptRequest r,
                    MapError mapError, Parse parse, ByPolicy byPolicy,
                    std::function<void(Out, std::exception_ptr)> done) {
  runAsync<Out>(
      owner, params,
      [r = std::move(r)](Owner& self, std::chrono::steady_clock::time_point deadline, ReplyCallback&& sent) {
        r.sendAsync(*self.client_, deadline, std::move(sent));
      },
      std::move(mapError), std::move(parse), std::move(byPolicy), std::move(done));
}

/// One operation of a script, made by its checks before anything is sent, as both faces send it
/// (runOp waiting, runOpAsync without): the protocol's parameters, its name for the I/O-thread
/// guard, the request, how its reply reads (`self` null: the handle is gone), the failure
/// policy's answer (a deciding call's) and what is done with a result before the caller has it
/// (counting), if anything. `Owner` as for runScript.
template <class Owner, class Out>
struct ScriptOp {
  ScriptOp() = default;
  ScriptOp(LimiterCall::Params p, std::string_view w, ScriptRequest r, std::function<Out(Owner*, const Reply&)> read,
           std::function<Out(Owner&, bool)> policy = noPolicy, std::function<void(Out&)> after = {})
      : params(p),
        what(w),
        request(std::move(r)),
        parse(std::move(read)),
        byPolicy(std::move(policy)),
        then(std::move(after)) {}
  static Out noPolicy(Owner&, bool) { return Out{}; }  // a Plain call's: never asked

  LimiterCall::Params params;
  std::string_view what;
  ScriptRequest request;
  std::function<Out(Owner*, const Reply&)> parse;
  std::function<Out(Owner&, bool)> byPolicy = noPolicy;
  std::function<void(Out&)> then;
};

/// `op` through the protocol, waiting; `mapError` as for runScript.
template <class Owner, class Out, class MapError>
Out runOp(Owner& owner, const ScriptOp<Owner, Out>& op, MapError&& mapError) {
  Out out = runScript(
      owner, op.params, op.what, op.request, mapError, [&](const Reply& r) { return op.parse(&owner, r); },
      [&](bool allowed) { return op.byPolicy(owner, allowed); });
  if (op.then) op.then(out);
  return out;
}

/// The operation `make()` makes, without waiting: `done` is isolated (a callback that throws is
/// reported once, naming `limiter`, and runs no second time) and gets the checks' error at once,
/// else the outcome on the I/O thread.
template <class Out, class Owner, class Make, class MapError>
void runOpAsync(const std::shared_ptr<Owner>& owner, const std::string& limiter, Make&& make, MapError mapError,
                std::function<void(Out, std::exception_ptr)> done) {
  ScriptOp<Owner, Out> op;
  if (!isolateThenCheck(done, owner->gate_.monitor(), limiter, [&] { op = make(); })) return;
  if (op.then) {
    done = [then = std::move(op.then), done = std::move(done)](Out out, std::exception_ptr error) {
      if (!error) then(out);
      done(std::move(out), std::move(error));
    };
  }
  runScriptAsync<Out>(owner, op.params, std::move(op.request), std::move(mapError), std::move(op.parse),
                      std::move(op.byPolicy), std::move(done));
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

/// integerCommand without waiting: `done` gets the integer or the error (runAsync).
template <class Owner>
void integerCommandAsync(const std::shared_ptr<Owner>& owner, std::vector<std::string> argv, LimiterCall::Resend resend,
                         std::function<void(std::int64_t, std::exception_ptr)> done) {
  runAsync<std::int64_t>(
      owner, LimiterCall::plain(owner->callBound_, resend),
      [argv = std::move(argv)](Owner& self, std::chrono::steady_clock::time_point deadline, ReplyCallback&& sent) {
        const std::vector<std::string_view> a(argv.begin(), argv.end());
        commandAsync(*self.client_, a, std::move(sent), deadline);
      },
      [](std::exception_ptr error) { return error; }, [](Owner*, const Reply& r) { return r.asInteger(); },
      [](Owner&, bool) { return std::int64_t{0}; }, std::move(done));
}

/// DEL of `key`: true if it existed. Not sent again: a second DEL after a first that went through
/// answers 0.
template <class Owner>
bool deleteKey(Owner& owner, const std::string& key) {
  return integerCommand(owner, "deleteKey", {"DEL", key}, LimiterCall::Resend::Never) > 0;
}

/// deleteKey without waiting.
template <class Owner>
void deleteKeyAsync(const std::shared_ptr<Owner>& owner, const std::string& key,
                    std::function<void(bool, std::exception_ptr)> done) {
  integerCommandAsync(
      owner, {"DEL", key}, LimiterCall::Resend::Never,
      [done = std::move(done)](std::int64_t n, std::exception_ptr error) { done(n > 0, std::move(error)); });
}

/// EXISTS of `key`: true if it exists. Sent again after a closed connection (it changes nothing).
template <class Owner>
bool keyExists(Owner& owner, const std::string& key) {
  return integerCommand(owner, "exists", {"EXISTS", key}, LimiterCall::Resend::IfClosed) == 1;
}

/// keyExists without waiting.
template <class Owner>
void keyExistsAsync(const std::shared_ptr<Owner>& owner, const std::string& key,
                    std::function<void(bool, std::exception_ptr)> done) {
  integerCommandAsync(
      owner, {"EXISTS", key}, LimiterCall::Resend::IfClosed,
      [done = std::move(done)](std::int64_t n, std::exception_ptr error) { done(n == 1, std::move(error)); });
}

}  // namespace redlimit::detail
