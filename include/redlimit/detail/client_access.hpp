// redlimit — the Redis layer under the limiters: raw commands and scripts on a Client. Not public
// API (no stability promise): the limiters use it, and tests and benchmarks use it to look at and
// set up Redis. Script calls are routed by their keys, which must share one hash slot (Redisson's
// {name} rule), and NOSCRIPT is handled underneath, on every node of a Redis Cluster.
#pragma once

#include <chrono>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "redlimit/client.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/script.hpp"

namespace redlimit::detail {

/// The Client's Redis layer (see the Client's private members for what each call does and throws).
struct ClientAccess {
  /// What the Client sends its requests through (src/transport/runner.hpp: a Transport, a ClusterRunner).
  static Runner& runner(Client& c) { return c.runner(); }
  static Reply command(Client& c, std::initializer_list<std::string_view> argv,
                       std::chrono::steady_clock::time_point deadline = {}) {
    return c.command(argv, deadline);
  }
  static Reply command(Client& c, const std::vector<std::string_view>& argv,
                       std::chrono::steady_clock::time_point deadline = {}) {
    return c.command(argv, deadline);
  }
  static Reply eval(Client& c, const Script& script, const std::vector<std::string_view>& keys,
                    const std::vector<std::string_view>& args, std::chrono::steady_clock::time_point deadline = {}) {
    return c.eval(script, keys, args, deadline);
  }
  static void evalAsync(Client& c, const Script& script, const std::vector<std::string_view>& keys,
                        const std::vector<std::string_view>& args, ReplyCallback done,
                        std::chrono::steady_clock::time_point deadline = {}) {
    c.evalAsync(script, keys, args, std::move(done), deadline);
  }
  static void commandAsync(Client& c, const std::vector<std::string_view>& argv, ReplyCallback done,
                           std::chrono::steady_clock::time_point deadline = {}) {
    c.commandAsync(argv, std::move(done), deadline);
  }
};

/// Runs one command and waits for its reply (Client's request deadline).
inline Reply command(Client& c, std::initializer_list<std::string_view> argv,
                     std::chrono::steady_clock::time_point deadline = {}) {
  return ClientAccess::command(c, argv, deadline);
}
inline Reply command(Client& c, const std::vector<std::string_view>& argv,
                     std::chrono::steady_clock::time_point deadline = {}) {
  return ClientAccess::command(c, argv, deadline);
}
/// command without waiting: `done` gets the outcome (see ReplyCallback).
inline void commandAsync(Client& c, const std::vector<std::string_view>& argv, ReplyCallback done,
                         std::chrono::steady_clock::time_point deadline = {}) {
  ClientAccess::commandAsync(c, argv, std::move(done), deadline);
}
/// Runs a script with EVALSHA (NOSCRIPT handled) and waits for its reply.
inline Reply eval(Client& c, const Script& script, const std::vector<std::string_view>& keys,
                  const std::vector<std::string_view>& args, std::chrono::steady_clock::time_point deadline = {}) {
  return ClientAccess::eval(c, script, keys, args, deadline);
}
/// eval without waiting: `done` gets the outcome (see ReplyCallback).
inline void evalAsync(Client& c, const Script& script, const std::vector<std::string_view>& keys,
                      const std::vector<std::string_view>& args, ReplyCallback done,
                      std::chrono::steady_clock::time_point deadline = {}) {
  ClientAccess::evalAsync(c, script, keys, args, std::move(done), deadline);
}

}  // namespace redlimit::detail
