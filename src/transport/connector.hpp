// redlimit — opening a Stream without blocking: the name lookup (on a short-lived thread of its
// own, the one step the kernel offers no non-blocking call for), a non-blocking TCP or unix
// connect trying each address in turn, the TLS handshake, and the plain-text probe of a TLS peer
// that stays silent, all under one deadline. A caller's event loop drives it: it waits for one
// descriptor and one time, and calls step(). The Transport's I/O thread runs one per connection
// that connects, so a connection that hangs in any of these steps delays no other connection.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>

#include "redlimit/options.hpp"
#include "transport/stream.hpp"

namespace redlimit::detail {

using SteadyTime = std::chrono::steady_clock::time_point;

/// One address a name resolves to, as getaddrinfo gives it.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

/// "127.0.0.1", "::1": the numeric text of an address, for messages ("?" if it has none).
[[nodiscard]] std::string addressText(const SocketAddress& address);

/// Resolves host:port to the addresses to try, in order (getaddrinfo: AF_UNSPEC, SOCK_STREAM).
/// Called on a lookup thread of its own, so it may block. Throws IoError naming the host when the
/// name does not resolve, or ConfigurationError (ResourceLimit).
using NameResolver = std::function<std::vector<SocketAddress>(const std::string& host, int port)>;
/// The system's resolver (getaddrinfo).
[[nodiscard]] std::vector<SocketAddress> resolveName(const std::string& host, int port);

/// A TLS client context (makeTlsContext), shared by every connection made with it. Thread-safe to
/// share.
using TlsContext = std::shared_ptr<ssl_ctx_st>;

/// A one-shot question to a port: connect to `address`, send `bytes`, read the first two bytes of
/// the answer, all before `deadline`. Used to tell a plain-text Redis port from a TLS one. Never
/// blocks; never throws from step(). Not thread-safe.
class PortProbe {
 public:
  enum class State { Working, Answered, Failed };
  PortProbe(const SocketAddress& address, std::string_view bytes, SteadyTime deadline);
  ~PortProbe();
  PortProbe(const PortProbe&) = delete;
  PortProbe& operator=(const PortProbe&) = delete;

  /// Readable when step() can make progress (an epoll instance of the probe's own).
  [[nodiscard]] int pollFd() const noexcept { return epoll_; }
  /// When step() must run at the latest (the deadline).
  [[nodiscard]] SteadyTime wakeAt() const noexcept { return deadline_; }
  /// Makes what progress it can. Answered: head() holds the first two bytes. Failed: anything
  /// else (refused, reset, closed, the deadline passed).
  State step() noexcept;
  [[nodiscard]] State state() const noexcept { return state_; }
  [[nodiscard]] std::string_view head() const noexcept { return {head_, got_}; }
  /// In a forked child: closes the descriptors and nothing else.
  void abandonAfterFork() noexcept;

 private:
  void close() noexcept;
  void want(std::uint32_t events) noexcept;

  std::string bytes_;
  SteadyTime deadline_;
  int epoll_ = -1;
  int fd_ = -1;
  std::uint32_t watching_ = 0;
  std::size_t sent_ = 0;
  bool connected_ = false;
  char head_[2] = {};
  std::size_t got_ = 0;
  State state_ = State::Working;
};

/// Opens one Stream to ClientOptions::Connection (see connectStream for what it does and throws), without
/// ever blocking the thread that drives it. Each step has the connection's deadline: the lookup
/// (which runs on a thread of its own: a lookup that outlives the deadline is left to finish there
/// and its answer dropped), the connect of each address, the TLS handshake, and the plain-text
/// probe of a TLS peer that has answered nothing by half the time. Not thread-safe.
class Connector {
 public:
  enum class State { Working, Done, Failed };

  /// Starts at once: a numeric host connects now, a name starts its lookup. `tls` is the context
  /// for options.tls.enabled (built here when empty); `resolver` replaces getaddrinfo (tests).
  /// Never throws for a failure to connect: step() reports it.
  Connector(const ClientOptions::Connection& options, SteadyTime deadline, TlsContext tls = {},
            NameResolver resolver = {});
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  /// Readable when step() can make progress (an epoll instance of the connector's own).
  [[nodiscard]] int pollFd() const noexcept { return epoll_; }
  /// When step() must run at the latest: the deadline, the time to probe a silent TLS peer, or
  /// the retry of a unix socket whose listen backlog is full.
  [[nodiscard]] SteadyTime wakeAt() const noexcept;
  /// Makes what progress it can without blocking. Done: take() the stream. Failed: error().
  State step() noexcept;
  [[nodiscard]] State state() const noexcept { return state_; }
  /// The connected stream (once Done), with the address it reached.
  [[nodiscard]] std::unique_ptr<Stream> take() noexcept { return std::move(stream_); }
  [[nodiscard]] const SocketAddress& peer() const noexcept { return peer_; }
  /// Why it failed: TimeoutError naming the step that did not finish (lookup, connect, TLS
  /// handshake), or what connectStream documents.
  [[nodiscard]] std::exception_ptr error() const noexcept { return error_; }
  /// What it is doing, for messages: "looking up \"redis.internal\"", "connecting to 10.0.0.7",
  /// "in the TLS handshake".
  [[nodiscard]] std::string doing() const;
  /// In a forked child: closes the descriptors and nothing else (no TLS, no lock).
  void abandonAfterFork() noexcept;

 private:
  enum class Step { Lookup, Connect, Handshake, End };
  struct Lookup;
  void advance(SteadyTime now);
  void startLookup();
  bool lookupDone();
  void nextAddress(SteadyTime now);
  void connected();
  void handshake(SteadyTime now);
  void fail(std::exception_ptr error) noexcept;
  void watch(int fd, std::uint32_t events, std::uint64_t tag) noexcept;
  void unwatch(int fd) noexcept;
  [[noreturn]] void timedOut() const;

  ClientOptions::Connection options_;
  std::string endpoint_;
  SteadyTime started_;
  SteadyTime deadline_;
  SteadyTime probeAt_;
  TlsContext tls_;
  NameResolver resolver_;
  int epoll_ = -1;
  Step step_ = Step::Lookup;
  State state_ = State::Working;
  std::shared_ptr<Lookup> lookup_;
  std::vector<SocketAddress> addresses_;
  std::size_t nextAddress_ = 0;
  std::vector<std::string> tried_;
  int lastErrno_ = ECONNREFUSED;
  int fd_ = -1;  // the socket being connected (owned until it becomes the stream)
  std::uint32_t fdEvents_ = 0;
  SteadyTime retryAt_ = SteadyTime::max();  // a unix socket whose backlog was full
  std::chrono::milliseconds backoff_{1};
  bool backlogFull_ = false;
  std::unique_ptr<HandshakingStream> handshaking_;
  std::unique_ptr<PortProbe> probe_;
  bool probed_ = false;
  SocketAddress peer_;
  std::unique_ptr<Stream> stream_;
  std::exception_ptr error_;
};

/// Connects to `options` and returns the stream, blocking the calling thread until it is done
/// (a Connector driven with poll()): the unix socket if unixSocket is set, else host:port (the
/// name looked up on a thread of its own), trying each address in turn; TCP_NODELAY; SO_KEEPALIVE
/// (idle 15 s, as hiredis) when keepAlive; then the TLS handshake when tls.enabled. All of it,
/// the name lookup included, before `deadline`.
/// Throws:
///   TimeoutError        the deadline passed; the message names the step (lookup, connect, TLS
///                       handshake)
///   ClosedError         reset, or the peer closed during the TLS handshake without an alert
///   IoError             refused, unreachable, unknown host ("connect to 127.0.0.1:6379: Connection refused")
///   ConfigurationError (ResourceLimit)  no file descriptor left (code "EMFILE" / "ENFILE")
///   ConfigurationError (Tls)            (code "TLS") certificate chain not trusted (with OpenSSL's reason), name
///                       mismatch (naming the expected name), unreadable caFile / caPath / certFile
///                       / keyFile, key not matching certificate, certFile without keyFile (or the
///                       reverse), a server alert refusing the client certificate, a port that
///                       does not answer in TLS: it answers the hello with bytes that are not TLS,
///                       or stays silent and answers a plain PING in RESP (asked once, when nothing
///                       came back by half the time left at the start, within the same deadline)
///   InvalidArgument     TLS with a unix socket, a unix socket path longer than sun_path holds
[[nodiscard]] std::unique_ptr<Stream> connectStream(const ClientOptions::Connection& options, SteadyTime deadline);

/// True if `head`, the first bytes a peer answered a plain-text PING with, is a RESP simple string
/// or error ("+PONG", "-NOAUTH ..."): the peer is a plain-text Redis port. Pure; thread-safe.
[[nodiscard]] bool isPlainRedisAnswer(std::string_view head);
/// True if `head`, the first bytes a peer answered a TLS ClientHello with, is a TLS record (a
/// handshake or an alert). Pure; thread-safe.
[[nodiscard]] bool isTlsAnswer(std::string_view head);
/// A TLS 1.2 ClientHello that any TLS server answers with a record (isTlsAnswer), and that a
/// plain-text Redis port reads as an unfinished inline command (it holds no newline).
[[nodiscard]] std::string_view tlsHello() noexcept;

}  // namespace redlimit::detail
