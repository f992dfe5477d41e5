// redlimit — the client the limiters talk through: a connection pool plus script execution.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit/connection_pool.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit/reply.hpp"
#include "redlimit/script.hpp"

namespace redlimit {

/// A handle on one Redis deployment (standalone today; Redis Cluster will plug in behind the same
/// interface). Runs plain commands and Lua scripts on pooled connections. Limiters hold it by
/// shared_ptr, so one Client can serve many limiters.
/// Thread-safe.
class Client {
 public:
  /// Throws InvalidArgument for bad options. Connects lazily, on the first command.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// A shared Client built from options.
  [[nodiscard]] static std::shared_ptr<Client> create(ClientOptions options = {});
  /// A shared Client for `redis://[[user]:password@]host[:port][/db]` or
  /// `unix:///path[?db=N]`; the rest of the options come from `base`. Throws InvalidArgument.
  [[nodiscard]] static std::shared_ptr<Client> fromUri(const std::string& uri, ClientOptions base = {});

  /// Runs one command on a pooled connection. Throws what Connection::command and
  /// ConnectionPool::acquire throw.
  Reply command(std::initializer_list<std::string_view> argv);
  Reply command(const std::vector<std::string_view>& argv);

  /// Runs `script` with EVALSHA; if the server answers NOSCRIPT, loads it with SCRIPT LOAD on the
  /// same connection and retries once (and if the script was flushed again in between, sends it
  /// with EVAL). Error replies raised by the script are thrown as
  /// ScriptError (or NotInitializedError / InvalidConfigError / InvalidArgument when the script
  /// says so, see lua/common.lua).
  Reply eval(const Script& script, const std::vector<std::string_view>& keys,
             const std::vector<std::string_view>& args);

  /// The id this client uses for PER_CLIENT limiters: ClientOptions::clientId, or a random
  /// UUID v4 (36 lowercase characters) chosen when the Client was made.
  [[nodiscard]] const std::string& clientId() const noexcept { return clientId_; }
  [[nodiscard]] const ClientOptions& options() const noexcept { return options_; }
  [[nodiscard]] PoolStats poolStats() const { return pool_.stats(); }

 private:
  ClientOptions options_;
  std::string clientId_;
  ConnectionPool pool_;
};

}  // namespace redlimit
