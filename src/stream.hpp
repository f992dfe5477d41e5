// redlimit — the byte streams of the transport: TCP (IPv4/IPv6), unix socket, or TLS over TCP
// (OpenSSL 3), connected with a deadline and non-blocking afterwards. The event loop that drives
// them lives elsewhere; this file only opens, reads, writes and classifies failures (through
// error_mapping.hpp, so a reset is a ClosedError here as it is for hiredis).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "redlimit/options.hpp"

namespace redlimit::detail {

/// What a stream waits for before the call that returned 0 can make progress.
enum class IoWant { Read, Write };

/// A connected byte stream: TCP (IPv4/IPv6), unix socket, or TLS over TCP (OpenSSL 3).
/// Non-blocking once connected; the fd is O_NONBLOCK | O_CLOEXEC. Never raises SIGPIPE.
/// After read() or write() threw, the stream is broken: destroy it.
/// Not thread-safe (one thread at a time).
class Stream {
 public:
  /// Closes the fd. Sends nothing (no TLS close_notify): it also runs in a forked child, which
  /// must not touch the parent's TLS session.
  virtual ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] bool isTls() const noexcept { return tls_; }
  /// "127.0.0.1:6379", "[::1]:6379" or "unix:/path", as the error messages name it.
  [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }

  /// Reads up to `size` bytes into `buf`. Returns the count (> 0), or 0 if nothing can be read
  /// now (or size is 0): then wantAfterRead() says whether to wait for readability or
  /// writability (TLS may need to write first). Throws ClosedError on EOF or a reset, TlsError if
  /// the server ended the TLS session with an alert about the client certificate, IoError
  /// otherwise; messages name the endpoint ("read from 127.0.0.1:6379: ...").
  [[nodiscard]] virtual std::size_t read(char* buf, std::size_t size) = 0;
  /// Writes up to `size` bytes of `data`; returns how many (0 = would block, or size is 0: then
  /// wantAfterWrite()). After a 0 from a TLS stream, call again with the same bytes (the buffer
  /// may move, the data and at least that length must stay). Throws ClosedError (EPIPE,
  /// ECONNRESET) or IoError.
  [[nodiscard]] virtual std::size_t write(const char* data, std::size_t size) = 0;
  /// Plain streams: Read. TLS: what the last read() that returned 0 waits for.
  [[nodiscard]] virtual IoWant wantAfterRead() const noexcept;
  /// Plain streams: Write. TLS: what the last write() that returned 0 waits for.
  [[nodiscard]] virtual IoWant wantAfterWrite() const noexcept;
  /// Bytes already decrypted and buffered inside the stream (SSL_pending): read them without
  /// waiting for the fd, which will not signal them. Plain streams: 0.
  [[nodiscard]] virtual std::size_t buffered() const noexcept;

 protected:
  /// Takes ownership of `fd`.
  Stream(int fd, bool tls, std::string endpoint) noexcept;

 private:
  int fd_;
  bool tls_;
  std::string endpoint_;
};

/// How messages name a server: "127.0.0.1:6379", "[::1]:6379" (an IPv6 literal), "unix:/path".
[[nodiscard]] std::string endpointOf(const ConnectionOptions& options);
[[nodiscard]] std::string endpointOf(const NodeAddress& address);

/// Connects to `options`: the unix socket if unixSocket is set, else host:port through
/// getaddrinfo, trying each address in turn; TCP_NODELAY; SO_KEEPALIVE (idle 15 s, as hiredis)
/// when keepAlive; then the TLS handshake when tls.enabled. All of it before `deadline`, waiting
/// with poll() (name resolution is the one blocking step the deadline does not bound).
/// Throws:
///   TimeoutError        the deadline passed (connect or TLS handshake)
///   ClosedError         reset, or the peer closed during the TLS handshake without an alert
///   IoError             refused, unreachable, unknown host ("connect to 127.0.0.1:6379: Connection refused")
///   ResourceLimitError  no file descriptor left (code "EMFILE" / "ENFILE")
///   TlsError            (code "TLS") certificate chain not trusted (with OpenSSL's reason), name
///                       mismatch (naming the expected name), unreadable caFile / caPath / certFile
///                       / keyFile, key not matching certificate, certFile without keyFile (or the
///                       reverse), a server alert refusing the client certificate, a port that
///                       does not answer in TLS: it answers the hello with bytes that are not TLS,
///                       or stays silent and answers a plain PING in RESP (asked once, when nothing
///                       came back by half the time left at the start, within the same deadline)
///   InvalidArgument     TLS with a unix socket, a unix socket path longer than sun_path holds
[[nodiscard]] std::unique_ptr<Stream> connectStream(const ConnectionOptions& options,
                                                    std::chrono::steady_clock::time_point deadline);

/// Writes all of `data`, waiting with poll() while the stream would block. Throws TimeoutError
/// once `deadline` passes, or what Stream::write throws.
void writeAll(Stream& s, const char* data, std::size_t size, std::chrono::steady_clock::time_point deadline);

/// Reads at least one byte (at most `size`; 0 only if size is 0), waiting with poll() while
/// nothing is there. Throws TimeoutError once `deadline` passes, or what Stream::read throws.
[[nodiscard]] std::size_t readSome(Stream& s, char* buf, std::size_t size,
                                   std::chrono::steady_clock::time_point deadline);

/// True if `head`, the first bytes a peer answered a plain-text PING with, is a RESP simple string
/// or error ("+PONG", "-NOAUTH ..."): the peer is a plain-text Redis port. Pure; thread-safe.
[[nodiscard]] bool isPlainRedisAnswer(std::string_view head);

/// True if host:port answers a plain-text PING in RESP (isPlainRedisAnswer) before `deadline`;
/// false on anything else, including errors. Asked when a TLS handshake got no byte back: a plain
/// Redis port reads the ClientHello as an unfinished inline command and stays silent.
[[nodiscard]] bool answersPlainRedis(const std::string& host, int port, std::chrono::steady_clock::time_point deadline);

/// True if host:port answers a TLS ClientHello with a TLS record (alert or handshake) before
/// `deadline`; false on anything else, including errors. Ask it after a plain-text connection was
/// reset before its first reply, to tell a TLS port from an outage. A plain Redis port reads the
/// hello as an unfinished inline command and stays silent, so a false answer takes until the
/// deadline.
[[nodiscard]] bool speaksTls(const std::string& host, int port, std::chrono::steady_clock::time_point deadline);

}  // namespace redlimit::detail
