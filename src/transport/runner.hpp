// redlimit — what a Client sends its requests through: one server (Transport), or a Redis
// Cluster (ClusterRunner), or the primary a group of Sentinels names (SentinelRunner). The Client
// routes nothing itself; it names the hash slot of a request's keys and lets the runner decide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "transport/pipeline.hpp"

namespace redlimit::detail {

/// Counters of a runner, summed over its connections (Client::poolStats).
struct TransportCounters {
  std::size_t open = 0;          // connections open now
  std::uint64_t created = 0;     // connections opened since start
  std::uint64_t discarded = 0;   // connections closed after a failure since start
  std::size_t pending = 0;       // requests queued or waiting for replies now
  std::uint64_t rejected = 0;    // requests refused with TimeoutError, kind PoolTimeout (maxPending reached)
  std::uint64_t writes = 0;      // write calls that sent requests (requests / writes = pipelining)
  std::uint64_t requests = 0;    // requests sent, resends included
  std::uint64_t direct = 0;      // of them, written by the submitting thread (idle connection)
  std::uint64_t callerRead = 0;  // of them, sync calls whose reply their caller read too
  std::uint64_t stalls = 0;      // completion callbacks that held the I/O thread 100 ms or more
  std::uint64_t stalled = 0;     // requests ended with TimeoutError, kind CallbackBlocked
  // A server that runs no scripts for this client (NoScriptsMemo):
  std::uint64_t noScriptsRefused = 0;   // script requests ended at submit, unsent
  std::uint64_t noScriptsRechecks = 0;  // script requests sent to it as the re-check of their interval

  TransportCounters& operator+=(const TransportCounters& o) noexcept {
    open += o.open;
    created += o.created;
    discarded += o.discarded;
    pending += o.pending;
    rejected += o.rejected;
    writes += o.writes;
    requests += o.requests;
    direct += o.direct;
    callerRead += o.callerRead;
    stalls += o.stalls;
    stalled += o.stalled;
    noScriptsRefused += o.noScriptsRefused;
    noScriptsRechecks += o.noScriptsRechecks;
    return *this;
  }
};

/// The slot of a request without keys (PING, SCRIPT ..., INFO): any node may run it.
inline constexpr int kAnySlot = -1;

/// Sends requests to the right server and ends each one by its deadline. Thread-safe.
class Runner {
 public:
  virtual ~Runner() = default;
  /// Queues a request (its deadline already set) for the server that serves `slot` (0..16383, or
  /// kAnySlot). Never blocks on the network. Its completion runs on an I/O thread of the runner,
  /// or at once on the calling thread if the request is refused before it is queued.
  virtual void send(Request request, int slot) = 0;
  /// send() and wait for the outcome (the runner ends every request by its deadline; should it
  /// not, this gives up one second later with TimeoutError).
  [[nodiscard]] virtual Outcome sendAndWait(Request request, int slot) = 0;
  /// Fails whatever is still pending with ClosedError and stops the runner's threads. Idempotent.
  virtual void shutdown() noexcept = 0;
  /// In a forked child: see Transport::abandonAfterFork. The object must then be leaked.
  virtual void abandonAfterFork() noexcept = 0;
  [[nodiscard]] virtual TransportCounters counters() const = 0;
  /// True on a thread that runs this runner's completions.
  [[nodiscard]] virtual bool onIoThread() const noexcept = 0;
};

/// Sets request.done, calls send(request) and waits for that completion (at most one second past
/// the request's deadline: then TimeoutError, should the runner not have ended it).
[[nodiscard]] Outcome waitForOutcome(Request request, const std::function<void(Request)>& send);

/// The runner whose I/O thread the calling thread is (nullptr on other threads).
[[nodiscard]] const Runner* currentIoRunner() noexcept;
/// Marks the calling thread as one of `runner`'s I/O threads (for its whole life).
void setCurrentIoRunner(const Runner* runner) noexcept;

}  // namespace redlimit::detail
