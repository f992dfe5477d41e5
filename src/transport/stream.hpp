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

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

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
  /// writability (TLS may need to write first). Throws ClosedError on EOF or a reset, ConfigurationError (Tls) if
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

/// A TLS stream whose handshake is not done yet: call handshakeStep() whenever the socket is ready
/// for what it asked, until it returns true; the stream is then ready for read() and write().
/// Not thread-safe.
class HandshakingStream : public Stream {
 public:
  /// One step of the handshake, never blocking: true once it is done; false while it waits for
  /// the socket (`want` says for what). Throws ConfigurationError (Tls) (certificate not trusted, name mismatch, a
  /// server alert, bytes that are not TLS), ClosedError (the peer closed or reset without an
  /// alert) or IoError, with messages that say what to fix.
  [[nodiscard]] virtual bool handshakeStep(IoWant& want) = 0;
  /// Bytes the peer has sent so far: 0 means it has answered nothing at all.
  [[nodiscard]] virtual std::size_t bytesReceived() const noexcept = 0;

 protected:
  using Stream::Stream;
};

/// How messages name a server: "127.0.0.1:6379", "[::1]:6379" (an IPv6 literal), "unix:/path".
[[nodiscard]] std::string endpointOf(const ClientOptions::Connection& options);
[[nodiscard]] std::string endpointOf(const ClientOptions::Node& address);

/// A stream over `fd`, a connected non-blocking socket whose ownership it takes.
[[nodiscard]] std::unique_ptr<Stream> adoptPlainStream(int fd, std::string endpoint);

/// A TLS client session over `fd` (connected, non-blocking; ownership taken) with `ctx`: the SNI
/// and the name to verify come from options.tls.serverName or options.host. Throws ConfigurationError (Tls) if the
/// session cannot be set up; the handshake itself is the caller's to step.
[[nodiscard]] std::unique_ptr<HandshakingStream> startTlsStream(int fd, std::string endpoint, ssl_ctx_st* ctx,
                                                                const ClientOptions::Connection& options);

/// Reads the files ClientOptions::Tls names and builds an OpenSSL client context (TLS 1.2+, the CA or the
/// system's trust store when verifyPeer, the client certificate). Throws ConfigurationError (Tls) naming the field
/// and the file that cannot be used; ConfigurationError (ResourceLimit) when no descriptor is left to read it.
[[nodiscard]] std::shared_ptr<ssl_ctx_st> makeTlsContext(const ClientOptions::Tls& tls, const std::string& endpoint);

/// Writes all of `data`, waiting with poll() while the stream would block. Throws TimeoutError
/// once `deadline` passes, or what Stream::write throws.
void writeAll(Stream& s, const char* data, std::size_t size, std::chrono::steady_clock::time_point deadline);

/// Reads at least one byte (at most `size`; 0 only if size is 0), waiting with poll() while
/// nothing is there. Throws TimeoutError once `deadline` passes, or what Stream::read throws.
[[nodiscard]] std::size_t readSome(Stream& s, char* buf, std::size_t size,
                                   std::chrono::steady_clock::time_point deadline);

}  // namespace redlimit::detail
