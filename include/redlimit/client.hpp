// redlimit — the client the limiters talk through: a connection pool plus script execution.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

namespace redlimit {

namespace detail {
class Runner;
struct Request;
struct ClientAccess;

/// How an asynchronous call ends: with a reply (error == nullptr), or with the exception that
/// says why there is none. Called exactly once, on the Client's I/O thread, or on the calling
/// thread before the call returns if the request was refused before it was queued. Must not
/// throw and must not block: every other request of the Client waits while it runs.
using ReplyCallback = std::function<void(Reply reply, std::exception_ptr error)>;
}  // namespace detail

/// Counters of a Client's connections and requests, for tests and metrics.
struct PoolStats {
  std::size_t open = 0;          // connections open now
  std::uint64_t created = 0;     // connections opened since start
  std::uint64_t discarded = 0;   // connections closed after a failure since start
  std::size_t pending = 0;       // requests queued or waiting for their replies now
  std::uint64_t rejected = 0;    // requests refused with TimeoutError, kind PoolTimeout (maxPending reached)
  std::uint64_t writes = 0;      // writes that carried requests since start
  std::uint64_t requests = 0;    // requests written since start (requests / writes: how
                                 // many left together, the effect of automatic pipelining)
  std::uint64_t direct = 0;      // of them, written at once by the calling thread because
                                 // their connection was idle (no hand-off to the I/O thread)
  std::uint64_t callerRead = 0;  // of them, sync calls whose reply their thread read too (the
                                 // I/O thread never touched them: no thread switch at all)
  std::uint64_t stalls = 0;      // completion callbacks that held the I/O thread 100 ms or more
                                 // (they blocked: Event::Kind::CallbackBlocked)
  std::uint64_t stalled = 0;     // requests whose deadline passed meanwhile (TimeoutError, kind CallbackBlocked)
  // Best-effort calls (Client::admitBestEffort):
  std::uint64_t bestEffortSent = 0;     // let through (calls)
  std::uint64_t bestEffortSkipped = 0;  // skipped because Redis was found unreachable (calls)
  bool unreachable = false;             // the last transport failure has not been followed by a success yet
};

/// A handle on one Redis deployment: a server, a Redis Cluster (a pool and an I/O thread per
/// primary, routed by the keys' hash slot, redirects followed within each request's deadline), or
/// the primary a group of Sentinels names (followed across failovers); see ClientOptions::topology.
/// Runs the limiters' Lua scripts over a few multiplexed connections
/// (ClientOptions::Pool::size) and one I/O thread: any number of threads share them, and requests queued
/// while a write is in flight leave together (automatic pipelining). Every request has one
/// deadline, ClientOptions::Connection::commandTimeout, for queueing, writing and its reply, whatever
/// the server does; a request that times out after it was written closes its connection. In a
/// forked child, the first call drops the inherited connections unused and starts afresh.
/// Destroying the Client completes every pending request (ClosedError) and joins its thread.
/// Limiters hold it by
/// shared_ptr, so one Client can serve many limiters. It remembers whether its last calls reached
/// Redis, so that best-effort calls of everything that uses it stop waiting on an unreachable
/// server (admitBestEffort).
/// Errors: every call throws the redlimit::Error hierarchy as classified in errors.hpp: IoError
/// and subclasses when Redis cannot be asked, ConfigurationError and AuthError when the set-up
/// cannot work, ReplyError and subclasses for Redis's answers.
/// Thread-safe.
class Client {
 public:
  /// Throws InvalidArgument for bad options (what checkOptions(const ClientOptions&) refuses, and
  /// bestEffortRetry <= 0). Connects lazily, on the first command.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// A shared Client built from options.
  [[nodiscard]] static std::shared_ptr<Client> create(ClientOptions options = {});
  /// A shared Client for `redis://[[user]:password@]host[:port][/db]`, the same over TLS as
  /// `rediss://...[?cacert=...&capath=...&cert=...&key=...&sni=...&verify=0|1]`, or
  /// `unix:///path[?db=N]` (see parseUri); for a Redis Cluster
  /// `redis-cluster://[[user]:password@]host:port[,host:port...]` (the seeds; `rediss-cluster://`
  /// over TLS); for the primary Redis Sentinel names
  /// `redis-sentinel://[[user]:password@]host:port[,host:port...]/primaryName[/db]` (user and
  /// password are the primary's; `?sentinel_user=...&sentinel_password=...` the sentinels' own;
  /// `rediss-sentinel://` over TLS). See parseClientUri. The rest of the options come from `base`.
  /// Throws InvalidArgument.
  [[nodiscard]] static std::shared_ptr<Client> fromUri(const std::string& uri, ClientOptions base = {});

  /// The id this client uses for PER_CLIENT limiters: ClientOptions::clientId, or a random
  /// UUID v4 (36 lowercase characters) chosen when the Client was made.
  [[nodiscard]] const std::string& clientId() const noexcept { return clientId_; }
  [[nodiscard]] const ClientOptions& options() const noexcept { return options_; }
  [[nodiscard]] PoolStats poolStats() const;
  /// True on the thread that runs this Client's completions (callbacks of the ...Async calls).
  /// Sync calls made there would wait for that very thread: they throw InvalidArgument instead.
  [[nodiscard]] bool onIoThread() const noexcept;

  /// Whether a best-effort call should be sent now: one nobody waits for, whose loss costs only
  /// capacity that comes back by itself (SegmentedRateLimiter's give-backs on close, when idle and
  /// on reconfigure). True while Redis is reachable. After a transport failure of any call on this
  /// Client (an IoError other than TimeoutError (PoolTimeout), which is congestion in this process), false
  /// until a call reaches Redis again or ClientOptions::bestEffortRetry has passed; from then on
  /// true for one caller per bestEffortRetry (a probe). So closing many limiters while Redis does
  /// not answer costs one command timeout in total, not one per limiter. Counted in
  /// poolStats() (bestEffortSent, bestEffortSkipped, unreachable). Never blocks, sends nothing.
  [[nodiscard]] bool admitBestEffort() noexcept;

 private:
  // The Redis layer, reached from the limiters (and tests) through detail::ClientAccess
  // (redlimit/detail/client_access.hpp): not part of the public API.
  friend struct detail::ClientAccess;
  /// Runs one command and waits for its reply (at most the request deadline). Throws IoError and
  /// subclasses (TimeoutError, ClosedError; kinds Io, Unavailable, Protocol, Timeout, PoolTimeout...), ConfigurationError,
  /// AuthError, or the exception for an error reply (see errors.hpp).
  /// `deadline`, if given (not the epoch), ends the request instead of now + commandTimeout.
  detail::Reply command(std::initializer_list<std::string_view> argv,
                        std::chrono::steady_clock::time_point deadline = {});
  detail::Reply command(const std::vector<std::string_view>& argv, std::chrono::steady_clock::time_point deadline = {});

  /// Runs `script` with EVALSHA; if the server answers NOSCRIPT, one SCRIPT LOAD goes out on that
  /// connection and every request that failed is sent again (and if the script was flushed again
  /// in between, with EVAL and the source). Error replies raised by the script are thrown as
  /// ScriptError (or NotInitializedError / ScriptError of kind InvalidConfig / InvalidArgument when the script
  /// says so, see lua/lib/base.lua). The sync form of evalAsync.
  detail::Reply eval(const detail::Script& script, const std::vector<std::string_view>& keys,
                     const std::vector<std::string_view>& args, std::chrono::steady_clock::time_point deadline = {});
  /// eval without waiting: `keys` and `args` are copied before it returns; `done` gets the
  /// outcome (see ReplyCallback). `script` must outlive the call (redlimit's are static).
  void evalAsync(const detail::Script& script, const std::vector<std::string_view>& keys,
                 const std::vector<std::string_view>& args, detail::ReplyCallback done,
                 std::chrono::steady_clock::time_point deadline = {});
  /// command without waiting: `argv` is copied before it returns; `done` gets the outcome.
  void commandAsync(const std::vector<std::string_view>& argv, detail::ReplyCallback done,
                    std::chrono::steady_clock::time_point deadline = {});

  // The runner of this process: after fork(), a new one for the child (the parent's is left
  // unused, its sockets closed without a byte sent).
  detail::Runner& runner();
  void startAfterFork();
  // The cluster slot of a script's keys (kAnySlot unless ClientOptions::Topology::Cluster); InvalidArgument if
  // they are in different slots. For a command: the slot of argv[1], unless it names no key.
  int slotOf(const std::vector<std::string_view>& keys) const;
  int slotOf(const std::string_view* argv, std::size_t argc) const;
  // Sends a request and waits for it, recording in reachability_ whether it reached Redis.
  detail::Reply callTracked(detail::Request request, int slot, std::chrono::steady_clock::time_point deadline);
  // Sends a request without waiting; `done` gets its outcome, recorded in reachability_ first.
  void sendTracked(detail::Request request, int slot, detail::ReplyCallback done,
                   std::chrono::steady_clock::time_point deadline);
  // Sets the request's deadline: `deadline`, or now + commandTimeout for the epoch.
  void setDeadline(detail::Request& request, std::chrono::steady_clock::time_point deadline) const;

  ClientOptions options_;
  std::string clientId_;
  std::shared_ptr<detail::Runner> owned_;
  std::atomic<detail::Runner*> runner_{nullptr};
  std::atomic<std::uint64_t> forkGeneration_{0};
  // Whether this client's calls reach Redis: the same circuit a limiter's acquires pass through
  // (probe interval = bestEffortRetry), used here only to gate best-effort calls. Shared with the
  // completions of asynchronous calls, which may run after the Client is gone.
  std::shared_ptr<detail::FailureGate> reachability_;
  std::atomic<std::uint64_t> bestEffortSent_{0}, bestEffortSkipped_{0};
};

}  // namespace redlimit
