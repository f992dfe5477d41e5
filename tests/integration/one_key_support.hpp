// Shared by the tests of the one-key scripts (lua/gcra.lua, fixed_window.lua, smooth.lua) under a
// Limiter: a traits type per algorithm (for typed tests) and running the scripts directly with an
// explicit time, as a Limiter runs them with the server's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/policy.hpp"
#include "helpers.hpp"
#include "limiters/decision_reply.hpp"
#include "redlimit_lua.hpp"
#include "redlimit_test/fixture.hpp"

namespace redlimit::test {

/// Runs the script `s` on `keys` with `args`, mapping REDLIMIT_* codes as the limiters do.
inline Reply runScript(Client& c, const detail::lua::EmbeddedScript& s, const std::vector<std::string>& keys,
                       const std::vector<std::string>& args) {
  const Script script{s.name, s.sha1, s.source};
  const std::vector<std::string_view> k(keys.begin(), keys.end());
  const std::vector<std::string_view> a(args.begin(), args.end());
  try {
    return detail::eval(c, script, k, a);
  } catch (const ScriptError&) {
    std::rethrow_exception(detail::limiterError(std::current_exception()));
  }
}

/// Runs a one-key limiter script on `key`: `args` are the operation, now in epoch µs ('' = the
/// server's clock), the kind byte, then the operation's arguments.
inline Reply runOneKey(Client& c, const detail::lua::EmbeddedScript& s, const std::string& key,
                       const std::vector<std::string>& args) {
  return runScript(c, s, {key}, args);
}

/// Runs lua/multi.lua on `keys` (args: the operation, now in epoch µs or '', the kinds, ...).
inline Reply runMulti(Client& c, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  return runScript(c, detail::lua::multi, keys, args);
}

/// A take/peek reply: {allowed, remaining, retryAfterUs, resetAfterUs, limit, nowUs, delayUs, ...}.
using TakeReply = detail::DecisionReply;

/// The values of a take/peek reply, parsed as the limiters parse it: the packed string of
/// gcra.lua, fixed_window.lua and batch.lua's decisions, or smooth.lua's array of 9. Throws
/// ReplyError (UnexpectedReply) for anything else.
inline TakeReply takeReply(const Reply& r) {
  const detail::DecisionForm form =
      r.type == Reply::Type::Array ? detail::DecisionForm::Array : detail::DecisionForm::Packed;
  return detail::parseDecisionReply(r, form, "(test)");
}

/// A one-key script's configuration, as its `set` and the configuration in the call take it.
struct LimiterConfig {
  char kind = 'T';              // 'T' token bucket, 'G' GCRA, 'W' fixed window
  std::int64_t limit = 1;       // burst (T, G) or permits per window (W)
  std::int64_t permits = 1;     // permits per interval (T, G); not used by W
  std::int64_t intervalMs = 1;  // refill interval (T, G) or window (W), ms
  std::int64_t keepAliveMs = 0;
};

/// The key's header: what gcra.lua (17 bytes), fixed_window.lua (13 bytes), batch.lua and
/// multi.lua take as the configuration in the call.
inline std::string header(const LimiterConfig& c) {
  std::string out(1, c.kind);
  putLe(out, c.limit, 4);
  if (c.kind != 'W') putLe(out, c.permits, 4);
  putLe(out, c.intervalMs, 4);
  putLe(out, c.keepAliveMs, 4);
  return out;
}

/// A GCRA or token bucket key's value (lua/lib/gcra_core.lua): kind, B, P, I ms, keepAlive 0, TAT µs,
/// remainder 0.
inline std::string gcraValue(char kind, std::int64_t b, std::int64_t p, std::int64_t intervalMs, std::int64_t tatUs) {
  std::string v(1, kind);
  for (const std::int64_t f : {b, p, intervalMs, std::int64_t{0}}) putLe(v, f, 4);
  putLe(v, tatUs, 7);
  putLe(v, 0, 4);
  return v;
}

/// The script of the kind "T", "G" or "W".
inline const detail::lua::EmbeddedScript& scriptOf(const std::string& kind) {
  return kind == "W" ? detail::lua::fixed_window : detail::lua::gcra;
}

/// `set try` with `initial` permits (T, G) or an empty window (W), at nowUs: writes a key that
/// does not exist.
inline std::vector<std::string> setArgs(const LimiterConfig& c, std::int64_t nowUs, std::int64_t initial) {
  if (c.kind == 'W') return {"set", str(nowUs), "W", "try", str(c.limit), str(c.intervalMs), str(c.keepAliveMs)};
  return {"set",          str(nowUs),        std::string(1, c.kind), "try",       str(c.limit),
          str(c.permits), str(c.intervalMs), str(c.keepAliveMs),     str(initial)};
}

/// A time in epoch µs this far into an aligned window of `windowMs`, a few days from now.
inline std::int64_t windowTime(std::int64_t windowMs, std::int64_t intoUs) {
  const std::int64_t base = 1'900'000'000'000'000;  // 2030: later than any server clock in a test
  return base - base % (windowMs * 1000) + intoUs;
}

// A traits type per algorithm of the one-key scripts, for typed tests: its kind byte, its script,
// the name one_key_worker knows it by, and its Policy.
struct TokenBucketTraits {
  static constexpr const char* kKind = "T";
  static constexpr const char* kWorkerKind = "token_bucket";
  static const detail::lua::EmbeddedScript& script() { return detail::lua::gcra; }
  /// `limit` permits at once, `permits` more per `interval`.
  static Policy policy(std::int64_t limit, std::int64_t permits, std::chrono::milliseconds interval) {
    return Policy::tokenBucket(limit, permits, interval);
  }
};

struct GcraTraits {
  static constexpr const char* kKind = "G";
  static constexpr const char* kWorkerKind = "gcra";
  static const detail::lua::EmbeddedScript& script() { return detail::lua::gcra; }
  /// A burst of `limit`, `permits` per `interval`.
  static Policy policy(std::int64_t limit, std::int64_t permits, std::chrono::milliseconds interval) {
    return Policy::gcra(permits, interval, limit);
  }
};

struct FixedWindowTraits {
  static constexpr const char* kKind = "W";
  static constexpr const char* kWorkerKind = "fixed_window";
  static const detail::lua::EmbeddedScript& script() { return detail::lua::fixed_window; }
  /// `limit` per window of `interval` (`permits` is not used: the window refills all at once).
  static Policy policy(std::int64_t limit, std::int64_t /*permits*/, std::chrono::milliseconds interval) {
    return Policy::fixedWindow(limit, interval);
  }
};

/// The typed tests over the three algorithms of the one-key scripts, and their names.
using AlgorithmTypes = ::testing::Types<TokenBucketTraits, GcraTraits, FixedWindowTraits>;
class AlgorithmNames {
 public:
  template <class T>
  static std::string GetName(int) {
    if (std::is_same_v<T, TokenBucketTraits>) return "TokenBucket";
    if (std::is_same_v<T, GcraTraits>) return "Gcra";
    return "FixedWindow";
  }
};

/// Calls `read` (a read of the server, e.g. an EXISTS through a limiter) until the server answers
/// it without an IoError: a restarted server, whose pooled connections still went to the old
/// process. True once it did (at most 100 tries, 10 ms apart).
inline bool untilAnswered(const std::function<void()>& read) {
  for (int i = 0; i < 100; ++i) {
    try {
      read();
      return true;
    } catch (const IoError&) {
      sleepMs(10);
    }
  }
  return false;
}

/// Two limiters of one name on two Clients, with stored policies `a` and `b`, race trySetPolicy
/// on one key, 25 rounds (a fresh name each, from `nameOf(round)`): exactly one writer wins each
/// round, and both limiters then decide under the winner's limit.
template <class NameOf>
void expectOneStoredPolicyWriterWins(const std::shared_ptr<Client>& c1, const std::shared_ptr<Client>& c2,
                                     const Policy& a, const Policy& b, NameOf&& nameOf) {
  for (int round = 0; round < 25; ++round) {
    const std::string n = nameOf(round);
    Limiter l1(c1, n, a), l2(c2, n, b);
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    auto f1 = std::async(std::launch::async, [&] {
      start.wait();
      return l1.trySetPolicy("k");
    });
    auto f2 = std::async(std::launch::async, [&] {
      start.wait();
      return l2.trySetPolicy("k");
    });
    go.set_value();
    const bool won1 = f1.get(), won2 = f2.get();
    ASSERT_NE(won1, won2) << "exactly one writer wins, round " << round;
    const std::int64_t limit = (won1 ? a : b).limit();
    EXPECT_EQ(l1.peek("k").limit, limit);
    EXPECT_EQ(l2.peek("k").limit, limit);
    EXPECT_EQ(l1.decide("k").limit, limit);
  }
}

}  // namespace redlimit::test
