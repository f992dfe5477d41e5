// redlimit — the client the limiters talk through: a connection pool plus script execution.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit/connection_pool.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit/reply.hpp"
#include "redlimit/script.hpp"

namespace redlimit {

/// Counters of a Client's best-effort calls (see Client::admitBestEffort).
struct BestEffortStats {
  std::uint64_t sent = 0;     // best-effort calls let through (calls)
  std::uint64_t skipped = 0;  // best-effort calls skipped because Redis was found unreachable (calls)
  bool unreachable = false;   // the last transport failure has not been followed by a success yet
};

/// A handle on one Redis deployment (standalone today; Redis Cluster will plug in behind the same
/// interface). Runs plain commands and Lua scripts on pooled connections. Limiters hold it by
/// shared_ptr, so one Client can serve many limiters. It remembers whether its last calls reached
/// Redis, so that best-effort calls of everything that uses it stop waiting on an unreachable
/// server (admitBestEffort).
/// Errors: every call throws the redlimit::Error hierarchy as classified in errors.hpp: IoError
/// and subclasses when Redis cannot be asked, ConfigurationError and AuthError when the set-up
/// cannot work, ReplyError and subclasses for Redis's answers.
/// Thread-safe.
class Client {
 public:
  /// Throws InvalidArgument for bad options (bestEffortRetry <= 0, and what the pool refuses).
  /// Connects lazily, on the first command.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// A shared Client built from options.
  [[nodiscard]] static std::shared_ptr<Client> create(ClientOptions options = {});
  /// A shared Client for `redis://[[user]:password@]host[:port][/db]`, the same over TLS as
  /// `rediss://...[?cacert=...&capath=...&cert=...&key=...&sni=...&verify=0|1]`, or
  /// `unix:///path[?db=N]` (see parseUri); the rest of the options come from `base`.
  /// Throws InvalidArgument.
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

  /// Whether a best-effort call should be sent now: one nobody waits for, whose loss costs only
  /// capacity that comes back by itself (SegmentedRateLimiter's give-backs on close, when idle and
  /// on reconfigure). True while Redis is reachable. After a transport failure of any call on this
  /// Client (an IoError other than PoolTimeoutError, which is congestion in this process), false
  /// until a call reaches Redis again or ClientOptions::bestEffortRetry has passed; from then on
  /// true for one caller per bestEffortRetry (a probe). So closing many limiters while Redis does
  /// not answer costs one command timeout in total, not one per limiter. Counted in
  /// bestEffortStats(). Never blocks, sends nothing.
  [[nodiscard]] bool admitBestEffort() noexcept;
  [[nodiscard]] BestEffortStats bestEffortStats() const noexcept;

 private:
  // Runs one call, recording in reachability_ whether it reached Redis.
  template <class Call>
  Reply tracked(Call&& call);
  Reply evalUntracked(const Script& script, const std::vector<std::string_view>& keys,
                      const std::vector<std::string_view>& args);

  ClientOptions options_;
  std::string clientId_;
  ConnectionPool pool_;
  // Whether this client's calls reach Redis: the same circuit a limiter's acquires pass through
  // (probe interval = bestEffortRetry), used here only to gate best-effort calls.
  detail::FailureGate reachability_;
  std::atomic<std::uint64_t> bestEffortSent_{0}, bestEffortSkipped_{0};
};

}  // namespace redlimit
