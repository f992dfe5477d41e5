// redlimit — the I/O shell around Pipeline: a few multiplexed connections to one server, driven
// by one I/O thread (epoll), shared by any number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transport/connector.hpp"
#include "transport/no_scripts_memo.hpp"
#include "transport/pipeline.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/options.hpp"
#include "transport/runner.hpp"
#include "transport/stream.hpp"

namespace redlimit::detail {

/// ClientOptions::Pool::size connections to the server of ClientOptions::Connection, opened when first needed,
/// and one I/O thread that writes, reads and enforces every request's deadline. Requests queued
/// while a write is in flight leave together in the next write; replies are matched in order.
/// Connecting never blocks the I/O thread: each connection's connect (name lookup on a thread of its
/// own, non-blocking connect, TLS handshake, the probe of a silent TLS peer) is a Connector stepped
/// by the loop within connectTimeout, so a connection that hangs delays no other one. A request's deadline is absolute
/// from submit(): time spent waiting for a connection (connecting, greeting) comes out of it, and
/// a request still waiting at its deadline ends then with TimeoutError, whatever the connection
/// is doing.
/// A synchronous call (call()) that finds a connection with nothing on it does its own I/O: the
/// calling thread takes the connection from the I/O thread for one round trip ("owned by a
/// caller"), writes its request, waits for the reply with poll() and feeds it to the connection's
/// Pipeline, as the I/O thread would (the same matching, NOSCRIPT and error handling). Meanwhile
/// the I/O thread leaves that connection alone (its fd is watched for the peer's close only,
/// requests of other threads go to another connection or wait in its carry). It stays watched so
/// after a plain round trip, so that the next one needs no epoll_ctl, until the I/O thread writes
/// on it. Anything but a plain round trip (a write that
/// would block, a NOSCRIPT to answer, an error or EOF, the deadline, shutdown) hands the
/// connection back to the I/O thread in a state it knows (the request still on the pipeline, or
/// ioFailed set) and the caller waits for the completion as an async caller would. This saves the
/// two context switches of a hand-off per call. Over TLS every call is handed off (a session may
/// need to read while it writes). Cluster and Sentinel runners use submit(): handed off too.
/// A server found to run no scripts for this client (NoScriptsMemo, learnt on any connection) is
/// not asked again: a script request ends at submit() with the same ConfigurationError, unsent,
/// but for one per NoScriptsMemo::kRecheckInterval, and the first after a connection closed.
/// Thread-safe. Completions run on the I/O thread, except for requests refused at submit()
/// (shut down, maxPending reached, a server that runs no scripts), whose completion runs at once
/// on the submitting thread, and a synchronous call's own, which may run on its caller's thread.
class Transport final : public Runner, public std::enable_shared_from_this<Transport> {
 public:
  /// Checks the options (InvalidArgument) and starts the I/O thread. `owner` is the runner its
  /// I/O thread works for (currentIoRunner()): a ClusterRunner for its nodes, else the transport.
  /// `events` hears of script reloads on its connections (Event::Kind::ScriptReload), on the I/O
  /// thread, outside every lock. `tls`: the TLS context to connect with (built here, on the
  /// calling thread, when empty and connection.tls.enabled; should that fail, each connect tries
  /// again and fails its requests with the error). `resolver` replaces getaddrinfo (tests).
  static std::shared_ptr<Transport> start(const ClientOptions::Connection& connection, const ClientOptions::Pool& pool,
                                          const Runner* owner = nullptr, EventCallback events = {}, TlsContext tls = {},
                                          NameResolver resolver = {});
  ~Transport() override;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// Queues a request (its deadline already set). Never blocks on the network.
  void submit(Request request);
  /// submit() and wait for the outcome, doing the I/O on the calling thread when a connection is
  /// idle (see the class comment). The request ends by its deadline; should the I/O thread not end
  /// it (it stopped), this gives up one second later with TimeoutError.
  [[nodiscard]] Outcome call(Request request);

  /// Fails every request still queued or waiting with ClosedError, closes the connections and
  /// stops the I/O thread (joined, or detached when called on it). Idempotent.
  void shutdown() noexcept override;
  /// In a forked child: closes this process's copies of the sockets without sending anything and
  /// touches no lock or thread (the parent's I/O thread does not exist here). The object must
  /// then be leaked, never destroyed.
  void abandonAfterFork() noexcept REDLIMIT_NO_THREAD_SAFETY_ANALYSIS override;  // a forked child: no lock is taken

  // Runner: one server serves every slot.
  void send(Request request, int /*slot*/) override { submit(std::move(request)); }
  [[nodiscard]] Outcome sendAndWait(Request request, int /*slot*/) override { return call(std::move(request)); }

  [[nodiscard]] TransportCounters counters() const override;

  /// The request this thread wrote on connection `conn` for a sync wait (expectCallerRead()):
  /// reads its reply here (callerRead), or gives the connection back to the I/O thread unread.
  /// Called by awaitCallerRead() and dropCallerRead() only.
  void readClaimed(std::size_t conn, SteadyTime deadline);
  void releaseClaimed(std::size_t conn);
  [[nodiscard]] const ClientOptions::Connection& connectionOptions() const noexcept { return connection_; }
  /// True on this transport's own I/O thread.
  [[nodiscard]] bool onIoThread() const noexcept override { return std::this_thread::get_id() == ioThreadId_; }

 private:
  // One connection. `m` guards it: the I/O thread holds it while it works on the connection; a
  // submitting thread only try_locks it (writeNow, own), so it never waits behind a read or a connect.
  // While `owned`, a calling thread does a round trip on it without the lock: then only that
  // thread touches `stream` and `pipe`, and the I/O thread leaves the connection alone.
  struct Conn {
    Mutex m;
    std::size_t index = 0;  // set before the I/O thread starts, then read-only
    std::unique_ptr<Stream> stream REDLIMIT_GUARDED_BY(m);
    std::unique_ptr<Pipeline> pipe REDLIMIT_GUARDED_BY(m);
    std::unique_ptr<Connector> connector REDLIMIT_GUARDED_BY(m);  // connecting: no stream yet
    SocketAddress peer REDLIMIT_GUARDED_BY(m);                    // the address the stream reached
    // A plain-text connection reset before its first reply: is the port a TLS port? While the probe
    // runs, the first `held` requests of carry wait for its answer, to fail with ConfigurationError (TlsPort) or
    // with heldError.
    std::unique_ptr<PortProbe> tlsPortProbe REDLIMIT_GUARDED_BY(m);
    std::exception_ptr heldError REDLIMIT_GUARDED_BY(m);
    std::size_t held REDLIMIT_GUARDED_BY(m) = 0;
    std::vector<Request> carry REDLIMIT_GUARDED_BY(m);  // never written; waits for a (re)connect and its greeting
    bool watchingOut REDLIMIT_GUARDED_BY(m) = false;
    bool greeted REDLIMIT_GUARDED_BY(m) = false;       // the greeting (AUTH/SELECT/PING) was answered: requests may go
    SteadyTime connectStarted REDLIMIT_GUARDED_BY(m);  // the connect began, then: the stream connected
    std::size_t queued = 0;  // requests for this connection in Transport::incoming_ (guarded by Transport::mutex_)
    std::exception_ptr ioFailed
        REDLIMIT_GUARDED_BY(m);                 // a calling thread's write or read failed: the I/O thread closes
    bool quiet REDLIMIT_GUARDED_BY(m) = false;  // watched for the peer's close only (own()), until watch()
    bool owned REDLIMIT_GUARDED_BY(m) = false;  // a calling thread does a round trip on it (callerRoundTrip)
    // The peer's close (or an error) was reported while a calling thread owned the connection: the
    // I/O thread, which let that event go, closes it once the caller hands it back (release()).
    bool closedWhileOwned REDLIMIT_GUARDED_BY(m) = false;
  };
  Transport(const ClientOptions::Connection& connection, const ClientOptions::Pool& pool, EventCallback events,
            TlsContext tls, NameResolver resolver);
  void run();
  // Wakes the I/O thread from epoll_wait (its eventfd).
  void wakeIoThread() noexcept;
  // submit(); `callerReads`: a synchronous call, whose caller does the round trip itself if a
  // connection is idle (callerRoundTrip).
  void submitFrom(Request request, bool callerReads);
  bool writeNow(Conn& c, Request& request);
  // Takes `c` for the calling thread if it is idle (pushing `request`, moved from only then).
  enum class Take { Taken, Busy, NotReady };  // NotReady: not open, or failed
  Take own(Conn& c, Request& request);
  // The first connection own() takes, trying each from `first` on (a busy one is likely with
  // several callers); nullptr if none was idle, or if `first` is not open yet (the request is then
  // handed off, so that it connects: routeToReady sends it on).
  Conn* ownIdle(std::size_t first, Request& request);
  // The round trip of the request own() pushed, on the calling thread; then gives `c` back.
  void callerRoundTrip(Conn& c, SteadyTime deadline);
  // Writes what own() pushed: true if all of it went; else `c` is given back (release()).
  bool callerWrite(Conn& c) REDLIMIT_NO_THREAD_SAFETY_ANALYSIS;  // owned, so unlocked
  // Reads until the request callerWrite() wrote is answered, its deadline passes or anything but
  // the plain case happens; then gives `c` back and runs the completions that ended here.
  void callerRead(Conn& c, SteadyTime deadline) REDLIMIT_NO_THREAD_SAFETY_ANALYSIS;  // owned, so unlocked
  // Gives `c` back to the I/O thread after a round trip; `why`: the write or read failed; `plain`:
  // nothing is left for the I/O thread to do on it.
  void release(Conn& c, std::exception_ptr why, bool plain);
  // Runs completions that ended on a calling thread: its own request's there, the others (events,
  // internal requests) handed to the I/O thread.
  void completeHere(std::vector<Finished>& done);
  // Open, greeted, nothing on it or for it, nothing wrong with it: a calling thread may write.
  static bool idle(const Conn& c) REDLIMIT_REQUIRES(c.m);
  // idle(), and no request submitted before waits for it in incoming_, and not shut down: a calling
  // thread may put its request on `c` now (writeNow, own).
  bool takeable(const Conn& c) REDLIMIT_REQUIRES(c.m) REDLIMIT_EXCLUDES(mutex_);
  void armTimer(SteadyTime deadline) REDLIMIT_EXCLUDES(timerMutex_);
  std::exception_ptr writeOut(Conn& c) REDLIMIT_REQUIRES(c.m);
  // Writes the pipeline's output until it is all out (true) or the stream would block (false).
  // Throws what Stream::write throws.
  bool writePipe(Stream& stream, Pipeline& pipe);
  // Starts c's Connector (it may end at once); stepConnector() moves it on when its fd or time comes.
  void connect(Conn& c, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  void stepConnector(Conn& c, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  // The Connector gave a stream: the pipeline, the greeting, the requests that waited.
  void connected(Conn& c, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  void stepTlsPortProbe(Conn& c, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  // Ends the first `count` requests of c.carry with (a copy of) `why`.
  static void failCarry(Conn& c, std::size_t count, const std::exception_ptr& why, std::vector<Finished>& done)
      REDLIMIT_REQUIRES(c.m);
  void unregister(int fd);
  void greeted(Conn& c) REDLIMIT_REQUIRES(c.m);
  // Ends the requests in c.carry whose deadline passed, whatever the connection is doing.
  void expireCarry(Conn& c, SteadyTime now, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  static SteadyTime carryDeadline(const Conn& c) REDLIMIT_REQUIRES(c.m);
  void flush(Conn& c, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  // Open and greeted, nothing wrong with it: a request pushed to its pipeline is written at once.
  static bool ready(const Conn& c) REDLIMIT_REQUIRES(c.m);
  // The requests that wait for a connection still connecting (or reconnecting) go to the ready
  // ones, if any, in turn: a request waits on a connect only when no connection is ready.
  void routeToReady(std::vector<Finished>& done);
  void readFrom(Conn& c, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);
  // Closes c's stream; requests never written move to c.carry when a new connection may carry them.
  // `byPeer`: the server closed it (a reset before any reply may mean a TLS port: probed).
  void closeConn(Conn& c, std::exception_ptr why, std::vector<Finished>& done, bool byPeer = true)
      REDLIMIT_REQUIRES(c.m);
  void watch(Conn& c, bool out) REDLIMIT_REQUIRES(c.m);
  // Runs the completions in `done` (left empty), earliest deadline first, in slices with
  // expireDue() between them.
  void complete(std::vector<Finished>& done);
  // Steps the connectors and probes whose time came and fails every request whose deadline passed
  // at `now`, on every connection (appended to `done`).
  void expireDue(SteadyTime now, std::vector<Finished>& done);
  // A completion callback held the I/O thread from `from` to `to`: remembered, counted, reported.
  void noteStall(SteadyTime from, SteadyTime to);
  // What a plain-text connection reset before its first reply may mean: a TLS port (asked with a
  // PortProbe, off the loop's back).
  [[nodiscard]] bool mayBeTlsPort(const std::exception_ptr& why) const;
  [[nodiscard]] std::exception_ptr tlsPortError(const std::exception_ptr& why) const;
  void failEverything(std::vector<Finished>& done);
  // Closes `c` and fails everything on it and for it with `why` (shutdown).
  void failConn(Conn& c, const std::exception_ptr& why, std::vector<Finished>& done) REDLIMIT_REQUIRES(c.m);

  const ClientOptions::Connection connection_;
  const ClientOptions::Pool pool_;
  const Runner* owner_ = this;  // what currentIoRunner() says on the I/O thread
  const std::string endpoint_;
  const EventCallback events_;
  TlsContext tls_;               // I/O thread only, once started
  const NameResolver resolver_;  // empty: getaddrinfo
  // The scripts this server was seen to hold, for every connection's pipeline (I/O thread only).
  std::vector<const Script*> scriptsSeen_ REDLIMIT_GUARDED_BY(scriptsSeenMutex_);
  Mutex scriptsSeenMutex_;   // the I/O thread and callers doing their own round trip read replies
  NoScriptsMemo noScripts_;  // the server runs no scripts for this client: learnt by every connection's pipeline
  std::vector<std::unique_ptr<Conn>> conns_;
  int epollFd_ = -1;
  int wakeFd_ = -1;
  int timerFd_ = -1;  // armed by callers that wrote themselves
  std::thread thread_;
  std::thread::id ioThreadId_;
  std::atomic<std::size_t> nextConn_{0};
  std::atomic<std::size_t> pending_{0};
  std::atomic<std::uint64_t> rejected_{0}, created_{0}, discarded_{0}, writes_{0}, requests_{0};
  std::atomic<std::size_t> open_{0};
  std::atomic<std::uint64_t> direct_{0};               // requests their caller wrote (writeNow, own)
  std::atomic<bool> rerouteAfterRelease_{false};       // routeToReady found every ready connection owned
  std::atomic<std::uint64_t> callerRead_{0};           // of them, ended by their caller's own read
  std::atomic<std::uint64_t> stalls_{0}, stalled_{0};  // PoolStats::stalls, ::stalled
  Stall stall_;                                        // the last stall (I/O thread only)
  CompletionQueue completions_;                        // completions waiting to run (I/O thread only)
  std::vector<Conn*> readyConns_;                      // routeToReady's (I/O thread only)
  bool sawStall_ = false;  // any stall yet (I/O thread only): only then are errors looked at
  Mutex timerMutex_;       // and the timer's setting
  SteadyTime armedAt_ REDLIMIT_GUARDED_BY(timerMutex_) = SteadyTime::max();  // when timerFd_ fires; max: disarmed

  Mutex mutex_;
  std::vector<std::pair<std::size_t, Request>> incoming_ REDLIMIT_GUARDED_BY(mutex_);
  std::vector<Finished> handedOver_ REDLIMIT_GUARDED_BY(mutex_);  // completions a caller left to the I/O thread
  bool wakePending_ REDLIMIT_GUARDED_BY(mutex_) = false;
  bool stopping_ REDLIMIT_GUARDED_BY(mutex_) = false;
  bool stopped_ REDLIMIT_GUARDED_BY(mutex_) = false;
};

}  // namespace redlimit::detail
