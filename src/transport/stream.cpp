#include "transport/stream.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string_view>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "base/error_mapping.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

using Clock = std::chrono::steady_clock;

// ----- file descriptors and poll() ---------------------------------------------------------

// Milliseconds to `deadline` for poll(): rounded up (a poll that ends a little early would spin),
// at most INT_MAX; 0 once it has passed.
int pollTimeout(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
}

// Waits until `fd` is ready for `want` (or in error: the next call reports it). False once
// `deadline` passes. A failing poll() itself (ENOMEM) is thrown with `what`.
bool waitFor(int fd, IoWant want, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    const int timeout = pollTimeout(deadline);
    if (timeout == 0) return false;
    pollfd p{fd, static_cast<short>(want == IoWant::Read ? POLLIN : POLLOUT), 0};
    const int rc = ::poll(&p, 1, timeout);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throwErrnoError(errno, what);
  }
}

// "a, b, c".
std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += ", ";
    out += p;
  }
  return out;
}

bool isIpv6Literal(std::string_view host) { return host.find(':') != std::string_view::npos; }

// True for "127.0.0.1", "::1", "fe80::1%eth0": names that are addresses, which get no SNI and
// are checked against the certificate's IP entries.
bool isIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  if (::inet_pton(AF_INET, host.c_str(), buf) == 1) return true;
  const std::string bare = host.substr(0, host.find('%'));
  return ::inet_pton(AF_INET6, bare.c_str(), buf) == 1;
}

// ----- plain sockets -------------------------------------------------------------------------

class PlainStream final : public Stream {
 public:
  PlainStream(int fd, std::string endpoint) noexcept : Stream(fd, false, std::move(endpoint)) {}

  std::size_t read(char* buf, std::size_t size) override {
    if (size == 0) return 0;
    for (;;) {
      const ssize_t n = ::recv(fd(), buf, size, 0);
      if (n > 0) return static_cast<std::size_t>(n);
      if (n == 0) {
        throw ClosedError(fmt::format("redlimit: read from {}: the server closed the connection", endpoint()));
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno != EINTR) throwErrnoError(errno, fmt::format("read from {}", endpoint()));
    }
  }

  std::size_t write(const char* data, std::size_t size) override {
    if (size == 0) return 0;
    for (;;) {
      // MSG_NOSIGNAL: a write to a connection the server closed is EPIPE, not SIGPIPE.
      const ssize_t n = ::send(fd(), data, size, MSG_NOSIGNAL);
      if (n >= 0) return static_cast<std::size_t>(n);
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno != EINTR) throwErrnoError(errno, fmt::format("write to {}", endpoint()));
    }
  }
};

// ----- OpenSSL -------------------------------------------------------------------------------

// The thread's OpenSSL error queue, taken (and so cleared) at once.
class SslErrors {
 public:
  static SslErrors take() {
    SslErrors out;
    for (unsigned long e = ::ERR_get_error(); e != 0; e = ::ERR_get_error()) out.codes_.push_back(e);
    return out;
  }
  [[nodiscard]] bool has(int lib, int reason) const noexcept {
    return std::any_of(codes_.begin(), codes_.end(),
                       [&](unsigned long e) { return ERR_GET_LIB(e) == lib && ERR_GET_REASON(e) == reason; });
  }
  // The reason of the first TLS alert the peer sent (SSL_R_SSLV3_ALERT_*, SSL_R_TLSV1*_ALERT_*), or 0.
  [[nodiscard]] int alertReason() const noexcept {
    for (unsigned long e : codes_) {
      if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) >= SSL_AD_REASON_OFFSET) return ERR_GET_REASON(e);
    }
    return 0;
  }
  // "certificate required" for an alert reason (OpenSSL's reason text without its prefix).
  [[nodiscard]] static std::string alertText(int reason) {
    const char* text = ::ERR_reason_error_string(ERR_PACK(ERR_LIB_SSL, 0, reason));
    std::string_view out = text != nullptr ? text : "unknown";
    for (std::string_view prefix : {"sslv3 alert ", "tlsv13 alert ", "tlsv1 alert "}) {
      if (out.substr(0, prefix.size()) == prefix) out.remove_prefix(prefix.size());
    }
    return std::string(out);
  }
  // errno of a failed system call OpenSSL made (reading a file), or 0.
  [[nodiscard]] int systemErrno() const noexcept {
    for (unsigned long e : codes_) {
      if (ERR_GET_LIB(e) == ERR_LIB_SYS) return ERR_GET_REASON(e);
    }
    return 0;
  }
  // "error:0A000086:SSL routines::certificate verify failed; ..." (ERR_error_string_n), or
  // "no OpenSSL error reported".
  [[nodiscard]] std::string text() const {
    if (codes_.empty()) return "no OpenSSL error reported";
    std::string out;
    for (unsigned long e : codes_) {
      char buf[256];
      ::ERR_error_string_n(e, buf, sizeof buf);
      if (!out.empty()) out += "; ";
      out += buf;
    }
    return out;
  }

 private:
  std::vector<unsigned long> codes_;
};

[[noreturn]] void tlsError(const std::string& message) { throw ConfigurationError(ErrorKind::Tls, "TLS", message); }

struct CtxDeleter {
  void operator()(SSL_CTX* c) const noexcept { ::SSL_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxDeleter>;

// Refuses an encrypted key instead of letting OpenSSL prompt for its passphrase on the terminal.
int noPassphrase(char*, int, int, void*) { return 0; }

// A file (or directory) named by a ClientOptions::Tls field must be readable; says which one if not.
void checkReadable(const std::string& path, const char* field, bool directory, const std::string& endpoint) {
  struct stat st {};
  int e = 0;
  if (::stat(path.c_str(), &st) != 0) {
    e = errno;
  } else if (directory != S_ISDIR(st.st_mode)) {
    e = directory ? ENOTDIR : EISDIR;
  } else if (::access(path.c_str(), directory ? (R_OK | X_OK) : R_OK) != 0) {
    e = errno;
  }
  if (e != 0) {
    tlsError(fmt::format("redlimit: TLS to {}: ClientOptions::Tls::{} \"{}\" cannot be read: {}", endpoint, field, path,
                         std::strerror(e)));
  }
}

// An OpenSSL call that loads `path` failed: out of descriptors is a ConfigurationError (ResourceLimit), anything
// else says which file and what OpenSSL thought of it.
[[noreturn]] void loadFailed(const char* field, const std::string& path, const char* expected,
                             const std::string& endpoint) {
  const SslErrors errors = SslErrors::take();
  const int sys = errors.systemErrno();
  const std::string what = fmt::format("TLS to {}: load ClientOptions::Tls::{} \"{}\"", endpoint, field, path);
  if (sys == EMFILE || sys == ENFILE) throwErrnoError(sys, what);
  tlsError(fmt::format("redlimit: {}: not {} OpenSSL can load ({})", what, expected, errors.text()));
}

CtxPtr makeContext(const ClientOptions::Tls& tls, const std::string& endpoint) {
  if (tls.certFile.empty() != tls.keyFile.empty()) {
    tlsError(fmt::format(
        "redlimit: TLS to {}: ClientOptions::Tls::{} is set but ::{} is empty: a client certificate needs "
        "both the certificate (certFile) and its private key (keyFile)",
        endpoint, tls.certFile.empty() ? "keyFile" : "certFile", tls.certFile.empty() ? "certFile" : "keyFile"));
  }
  ::ERR_clear_error();
  CtxPtr ctx(::SSL_CTX_new(::TLS_client_method()));
  if (!ctx) tlsError(fmt::format("redlimit: TLS to {}: SSL_CTX_new failed: {}", endpoint, SslErrors::take().text()));
  ::ERR_clear_error();
  if (::SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1) {
    tlsError(fmt::format("redlimit: TLS to {}: cannot require TLS 1.2+: {}", endpoint, SslErrors::take().text()));
  }
  // Partial writes: write() returns what one record took, like send(). Moving buffer: the
  // caller's buffer may move between a write that would block and its retry.
  ::SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  ::SSL_CTX_set_default_passwd_cb(ctx.get(), &noPassphrase);

  if (!tls.caFile.empty()) {
    checkReadable(tls.caFile, "caFile", false, endpoint);
    ::ERR_clear_error();
    if (::SSL_CTX_load_verify_file(ctx.get(), tls.caFile.c_str()) != 1) {
      loadFailed("caFile", tls.caFile, "a PEM file of CA certificates", endpoint);
    }
  }
  if (!tls.caPath.empty()) {
    // OpenSSL reads the directory lazily, during verification: check it now.
    checkReadable(tls.caPath, "caPath", true, endpoint);
    ::ERR_clear_error();
    if (::SSL_CTX_load_verify_dir(ctx.get(), tls.caPath.c_str()) != 1) {
      loadFailed("caPath", tls.caPath, "a directory of hashed CA certificates", endpoint);
    }
  }
  // The system's trust store, when no CA is named and the peer is verified: without verification
  // nothing reads it, and loading the bundle parses every certificate in it (a sanitizer build
  // spent a 300 ms connect deadline on it before sending anything).
  if (tls.verifyPeer && tls.caFile.empty() && tls.caPath.empty()) {
    ::ERR_clear_error();
    if (::SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      tlsError(fmt::format("redlimit: TLS to {}: cannot load the system's trust store: {}", endpoint,
                           SslErrors::take().text()));
    }
  }
  if (!tls.certFile.empty()) {
    checkReadable(tls.certFile, "certFile", false, endpoint);
    checkReadable(tls.keyFile, "keyFile", false, endpoint);
    ::ERR_clear_error();
    if (::SSL_CTX_use_certificate_chain_file(ctx.get(), tls.certFile.c_str()) != 1) {
      loadFailed("certFile", tls.certFile, "a PEM certificate (chain)", endpoint);
    }
    ::ERR_clear_error();
    if (::SSL_CTX_use_PrivateKey_file(ctx.get(), tls.keyFile.c_str(), SSL_FILETYPE_PEM) != 1) {
      const SslErrors errors = SslErrors::take();
      if (errors.has(ERR_LIB_X509, X509_R_KEY_VALUES_MISMATCH) || errors.has(ERR_LIB_X509, X509_R_KEY_TYPE_MISMATCH)) {
        tlsError(fmt::format(
            "redlimit: TLS to {}: ClientOptions::Tls::keyFile \"{}\" is not the private key of the certificate in "
            "ClientOptions::Tls::certFile \"{}\" ({})",
            endpoint, tls.keyFile, tls.certFile, errors.text()));
      }
      const int sys = errors.systemErrno();
      if (sys == EMFILE || sys == ENFILE) {
        throwErrnoError(sys, fmt::format("TLS to {}: load ClientOptions::Tls::keyFile \"{}\"", endpoint, tls.keyFile));
      }
      tlsError(fmt::format(
          "redlimit: TLS to {}: load ClientOptions::Tls::keyFile \"{}\": not an unencrypted PEM private key "
          "OpenSSL can load ({})",
          endpoint, tls.keyFile, errors.text()));
    }
    ::ERR_clear_error();
    if (::SSL_CTX_check_private_key(ctx.get()) != 1) {
      tlsError(fmt::format(
          "redlimit: TLS to {}: ClientOptions::Tls::keyFile \"{}\" is not the private key of the certificate in "
          "ClientOptions::Tls::certFile \"{}\" ({})",
          endpoint, tls.keyFile, tls.certFile, SslErrors::take().text()));
    }
  }
  ::SSL_CTX_set_verify(ctx.get(), tls.verifyPeer ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);
  return ctx;
}

// What the socket BIO needs, and what it saw: the errno of the last failed recv/send (OpenSSL's
// own errno may be overwritten by then) and whether the peer closed.
struct SocketState {
  int fd = -1;
  int lastErrno = 0;
  bool eof = false;
  std::size_t bytesIn = 0;            // read from the socket so far (the handshake: did the peer answer at all?)
  bool certificateRequested = false;  // the server sent a CertificateRequest
};

SocketState* stateOf(BIO* b) { return static_cast<SocketState*>(::BIO_get_data(b)); }

// Our own socket BIO instead of BIO_s_socket, which writes with write(2): send() with
// MSG_NOSIGNAL makes a write to a closed connection EPIPE instead of SIGPIPE, with no signal
// mask juggling (per-thread, two extra syscalls per write, and a pending SIGPIPE to reap) and
// no process-wide SIG_IGN imposed on the application.
int bioWrite(BIO* b, const char* data, std::size_t size, std::size_t* written) {
  SocketState* s = stateOf(b);
  ::BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t n = ::send(s->fd, data, size, MSG_NOSIGNAL);
    if (n >= 0) {
      *written = static_cast<std::size_t>(n);
      return 1;
    }
    if (errno == EINTR) continue;
    s->lastErrno = errno;
    if (errno == EAGAIN || errno == EWOULDBLOCK) ::BIO_set_retry_write(b);
    *written = 0;
    return 0;
  }
}

int bioRead(BIO* b, char* buf, std::size_t size, std::size_t* got) {
  SocketState* s = stateOf(b);
  ::BIO_clear_retry_flags(b);
  *got = 0;
  for (;;) {
    const ssize_t n = ::recv(s->fd, buf, size, 0);
    if (n > 0) {
      *got = static_cast<std::size_t>(n);
      s->bytesIn += *got;
      return 1;
    }
    if (n == 0) {
      if (size > 0) s->eof = true;
      return 0;
    }
    if (errno == EINTR) continue;
    s->lastErrno = errno;
    if (errno == EAGAIN || errno == EWOULDBLOCK) ::BIO_set_retry_read(b);
    return 0;
  }
}

long bioCtrl(BIO* b, int cmd, long, void* ptr) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;  // nothing is buffered here
    case BIO_CTRL_EOF:
      return stateOf(b)->eof ? 1 : 0;  // lets OpenSSL report "unexpected eof while reading"
    case BIO_C_GET_FD:
      if (ptr != nullptr) *static_cast<int*>(ptr) = stateOf(b)->fd;
      return stateOf(b)->fd;
    default:
      return 0;
  }
}

// Built once, kept for the life of the process (a stream may outlive static destruction).
const BIO_METHOD* socketBioMethod() {
  static const BIO_METHOD* const method = [] {
    BIO_METHOD* m = ::BIO_meth_new(::BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "redlimit socket");
    if (m == nullptr || ::BIO_meth_set_write_ex(m, &bioWrite) != 1 || ::BIO_meth_set_read_ex(m, &bioRead) != 1 ||
        ::BIO_meth_set_ctrl(m, &bioCtrl) != 1) {
      ::BIO_meth_free(m);
      return static_cast<BIO_METHOD*>(nullptr);
    }
    return m;
  }();
  return method;
}

// "DNS:localhost, IP:127.0.0.1" (subjectAltName), or "CN=localhost" without one.
std::string certificateNames(X509* cert) {
  if (cert == nullptr) return "(no certificate)";
  std::vector<std::string> names;
  auto* sans = static_cast<GENERAL_NAMES*>(::X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* n = sk_GENERAL_NAME_value(sans, i);
      if (n->type == GEN_DNS) {
        const auto* s = n->d.dNSName;
        names.push_back(
            fmt::format("DNS:{}", std::string_view(reinterpret_cast<const char*>(::ASN1_STRING_get0_data(s)),
                                                   static_cast<std::size_t>(::ASN1_STRING_length(s)))));
      } else if (n->type == GEN_IPADD) {
        const auto* s = n->d.iPAddress;
        const int len = ::ASN1_STRING_length(s);
        char text[INET6_ADDRSTRLEN] = {};
        if ((len == 4 || len == 16) &&
            ::inet_ntop(len == 4 ? AF_INET : AF_INET6, ::ASN1_STRING_get0_data(s), text, sizeof text) != nullptr) {
          names.push_back(fmt::format("IP:{}", text));
        }
      }
    }
    GENERAL_NAMES_free(sans);
  }
  if (names.empty()) {
    const X509_NAME* subject = ::X509_get_subject_name(cert);
    const int at = ::X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
    if (at >= 0) {
      const ASN1_STRING* cn = ::X509_NAME_ENTRY_get_data(::X509_NAME_get_entry(subject, at));
      names.push_back(fmt::format("CN={}", std::string_view(reinterpret_cast<const char*>(::ASN1_STRING_get0_data(cn)),
                                                            static_cast<std::size_t>(::ASN1_STRING_length(cn)))));
    }
  }
  return names.empty() ? std::string("no names") : joined(names);
}

std::string nameLine(const X509_NAME* name) {
  char buf[256] = {};
  ::X509_NAME_oneline(name, buf, sizeof buf);
  return buf;
}

// A certificate's notBefore / notAfter as "2026-12-05 06:00:33 UTC".
std::string timeText(const ASN1_TIME* t) {
  std::tm tm{};
  if (t == nullptr || ::ASN1_TIME_to_tm(t, &tm) != 1) return "(an unreadable time)";
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec);
}

// The message for a certificate outside its validity period (X509_V_ERR_CERT_HAS_EXPIRED, or
// ..._NOT_YET_VALID when `expired` is false): which certificate, and since or until when. The
// peer's chain is searched leaf first; a certificate outside it is a CA from `trust`.
std::string validityMessage(const std::string& what, bool expired, STACK_OF(X509) * chain, const std::string& trust) {
  const int count = chain == nullptr ? 0 : sk_X509_num(chain);
  for (int i = 0; i < count; ++i) {
    X509* cert = sk_X509_value(chain, i);
    const ASN1_TIME* bound = expired ? ::X509_get0_notAfter(cert) : ::X509_get0_notBefore(cert);
    const int cmp = ::X509_cmp_current_time(bound);
    if (expired ? cmp >= 0 : cmp <= 0) continue;  // this one is inside its period (or unreadable)
    const std::string whose = i == 0 ? std::string("the server's certificate") : "a CA certificate the server sent";
    const std::string names = fmt::format("subject {}, issuer {}", nameLine(::X509_get_subject_name(cert)),
                                          nameLine(::X509_get_issuer_name(cert)));
    if (expired) {
      return fmt::format(
          "redlimit: {}: certificate verification failed: {} ({}) expired at {} (its notAfter); it is trusted "
          "otherwise: renew it (the server's tls-cert-file), or, if that time is still to come, set this host's "
          "clock right",
          what, whose, names, timeText(bound));
    }
    return fmt::format(
        "redlimit: {}: certificate verification failed: {} ({}) is not valid before {} (its notBefore); set this "
        "host's clock right, or have the server use a certificate that is valid now",
        what, whose, names, timeText(bound));
  }
  return fmt::format(
      "redlimit: {}: certificate verification failed: a CA certificate from {} {}; renew the CA certificate (or set "
      "this host's clock right)",
      what, trust, expired ? "has expired" : "is not valid yet");
}

bool isClientCertificateAlert(int reason) {
  switch (reason) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
      return true;
    default:
      return false;
  }
}

struct SslDeleter {
  void operator()(SSL* s) const noexcept { ::SSL_free(s); }
};

// ----- TLS streams ---------------------------------------------------------------------------

class TlsStream final : public HandshakingStream {
 public:
  TlsStream(int fd, std::string endpoint) noexcept : HandshakingStream(fd, true, std::move(endpoint)) {
    state_.fd = fd;
  }

  // Creates the session on the connected socket: SNI, the name to verify, the socket BIO.
  void start(SSL_CTX* ctx, const ClientOptions::Connection& o) {
    tls_ = o.tls;
    expectedName_ = o.tls.serverName.empty() ? o.host : o.tls.serverName;
    ::ERR_clear_error();
    ssl_.reset(::SSL_new(ctx));
    if (!ssl_) tlsError(fmt::format("redlimit: TLS to {}: SSL_new failed: {}", endpoint(), SslErrors::take().text()));
    const BIO_METHOD* method = socketBioMethod();
    if (method == nullptr) {
      tlsError(
          fmt::format("redlimit: TLS to {}: cannot create the socket BIO: {}", endpoint(), SslErrors::take().text()));
    }
    BIO* bio = ::BIO_new(method);
    if (bio == nullptr) {
      tlsError(fmt::format("redlimit: TLS to {}: BIO_new failed: {}", endpoint(), SslErrors::take().text()));
    }
    ::BIO_set_data(bio, &state_);
    ::BIO_set_init(bio, 1);
    ::SSL_set_bio(ssl_.get(), bio, bio);  // the session owns the BIO now (one reference for both)
    ::SSL_set_cert_cb(ssl_.get(), &noteCertificateRequest, &state_);
    const bool ip = isIpLiteral(expectedName_);
    if (!ip) {
      ::ERR_clear_error();
      if (::SSL_set_tlsext_host_name(ssl_.get(), expectedName_.c_str()) != 1) {
        tlsError(fmt::format("redlimit: TLS to {}: cannot send \"{}\" as the server name (SNI): {}", endpoint(),
                             expectedName_, SslErrors::take().text()));
      }
    }
    if (o.tls.verifyPeer) {
      ::ERR_clear_error();
      const int ok = ip ? ::X509_VERIFY_PARAM_set1_ip_asc(::SSL_get0_param(ssl_.get()),
                                                          expectedName_.substr(0, expectedName_.find('%')).c_str())
                        : ::SSL_set1_host(ssl_.get(), expectedName_.c_str());
      if (ok != 1) {
        tlsError(fmt::format("redlimit: TLS to {}: cannot verify the certificate against \"{}\": {}", endpoint(),
                             expectedName_, SslErrors::take().text()));
      }
      ::SSL_set_hostflags(ssl_.get(), X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    }
    ::SSL_set_connect_state(ssl_.get());
  }

  // One step of the handshake (HandshakingStream::handshakeStep).
  bool handshakeStep(IoWant& want) override {
    clear();
    const int rc = ::SSL_do_handshake(ssl_.get());
    if (rc == 1) return true;
    const int err = ::SSL_get_error(ssl_.get(), rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      want = err == SSL_ERROR_WANT_READ ? IoWant::Read : IoWant::Write;
      return false;
    }
    failHandshake(err, fmt::format("TLS handshake with {}", endpoint()));
  }

  std::size_t bytesReceived() const noexcept override { return state_.bytesIn; }

  std::size_t read(char* buf, std::size_t size) override {
    if (size == 0) return 0;
    clear();
    std::size_t got = 0;
    const int rc = ::SSL_read_ex(ssl_.get(), buf, size, &got);
    if (rc == 1) {
      received_ = true;
      return got;
    }
    return blocked(rc, "read from", wantAfterRead_);
  }

  std::size_t write(const char* data, std::size_t size) override {
    if (size == 0) return 0;
    clear();
    std::size_t put = 0;
    const int rc = ::SSL_write_ex(ssl_.get(), data, size, &put);
    if (rc == 1) return put;
    return blocked(rc, "write to", wantAfterWrite_);
  }

  IoWant wantAfterRead() const noexcept override { return wantAfterRead_; }
  IoWant wantAfterWrite() const noexcept override { return wantAfterWrite_; }
  // Bytes of a record OpenSSL has decrypted but not handed out yet. With read-ahead off (the
  // default, never changed here) OpenSSL reads no further than the record it needs, so nothing
  // else waits inside the stream.
  std::size_t buffered() const noexcept override {
    const int n = ::SSL_pending(ssl_.get());
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }

 private:
  static int noteCertificateRequest(SSL*, void* arg) {
    static_cast<SocketState*>(arg)->certificateRequested = true;
    return 1;
  }

  void clear() noexcept {
    ::ERR_clear_error();
    state_.lastErrno = 0;
    errno = 0;
  }

  // An SSL_read/SSL_write that did not move data: 0 if it waits for the fd (noting for what),
  // else throws.
  std::size_t blocked(int rc, const char* verb, IoWant& want) {
    const std::string what = fmt::format("{} {}", verb, endpoint());
    switch (::SSL_get_error(ssl_.get(), rc)) {
      case SSL_ERROR_WANT_READ:
        want = IoWant::Read;
        return 0;
      case SSL_ERROR_WANT_WRITE:
        want = IoWant::Write;
        return 0;
      case SSL_ERROR_ZERO_RETURN:
        throw ClosedError(fmt::format("redlimit: {}: the server closed the TLS session", what));
      case SSL_ERROR_SYSCALL:
        ::ERR_clear_error();
        closedOrSystem(what);
      case SSL_ERROR_SSL: {
        const SslErrors errors = SslErrors::take();
        if (const int alert = errors.alertReason(); isClientCertificateAlert(alert)) {
          clientCertificateRefused(alert, what);
        }
        if (errors.has(ERR_LIB_SSL, SSL_R_UNEXPECTED_EOF_WHILE_READING)) closedOrSystem(what);
        if (state_.lastErrno != 0) throwErrnoError(state_.lastErrno, what);
        throw IoError(fmt::format("redlimit: {}: TLS error: {}", what, errors.text()));
      }
      default: {
        const SslErrors errors = SslErrors::take();
        throw IoError(fmt::format("redlimit: {}: TLS error: {}", what, errors.text()));
      }
    }
  }

  // The peer closed or reset the connection, or a system call failed: throws. A server that asked
  // for a client certificate, got none and then dropped the connection before answering anything
  // most likely requires one (it may also have sent an alert that a reset discarded).
  [[noreturn]] void closedOrSystem(const std::string& what) {
    const bool closed =
        state_.eof || state_.lastErrno == ECONNRESET || state_.lastErrno == EPIPE || state_.lastErrno == 0;
    if (closed && !received_ && state_.certificateRequested) {
      // A TLS 1.3 server checks the client certificate after the client's handshake is done,
      // and refuses it with an alert and a close. A write that finds the connection closed
      // leaves that alert unread: read it, so the error says why.
      surfaceClientCertificateAlert(what);
    }
    if (closed && !received_ && state_.certificateRequested && tls_.certFile.empty()) {
      tlsError(
          fmt::format("redlimit: {}: the server closed the connection after asking for a client certificate, and "
                      "none is configured: it most likely requires one (tls-auth-clients yes); set "
                      "ClientOptions::Tls::certFile and ::keyFile (rediss://...?cert=...&key=...)",
                      what));
    }
    if (state_.eof || state_.lastErrno == 0) {
      throw ClosedError(fmt::format("redlimit: {}: the server closed the connection", what));
    }
    throwErrnoError(state_.lastErrno, what);
  }

  // Throws ConfigurationError (Tls) if the server's next record is an alert refusing the client certificate;
  // returns otherwise (whatever else the read finds is dropped: the stream is broken already).
  void surfaceClientCertificateAlert(const std::string& what) {
    if (state_.eof) return;
    const SocketState saved = state_;
    char scratch[512];
    std::size_t got = 0;
    ::ERR_clear_error();
    if (::SSL_read_ex(ssl_.get(), scratch, sizeof scratch, &got) != 1) {
      const SslErrors errors = SslErrors::take();
      if (const int alert = errors.alertReason(); isClientCertificateAlert(alert)) {
        clientCertificateRefused(alert, what);
      }
    }
    state_ = saved;
  }

  [[noreturn]] void clientCertificateRefused(int alert, const std::string& what) const {
    const std::string alertName = SslErrors::alertText(alert);
    if (tls_.certFile.empty()) {
      tlsError(fmt::format(
          "redlimit: {}: the server refused the connection with TLS alert \"{}\": it requires a client "
          "certificate (tls-auth-clients yes), and none is configured; set ClientOptions::Tls::certFile and "
          "::keyFile (rediss://...?cert=...&key=...)",
          what, alertName));
    }
    tlsError(
        fmt::format("redlimit: {}: the server rejected the client certificate \"{}\" with TLS alert \"{}\": is it "
                    "signed by a CA the server trusts (tls-ca-cert-file), valid now, and meant for client "
                    "authentication?",
                    what, tls_.certFile, alertName));
  }

  [[noreturn]] void failHandshake(int err, const std::string& what) {
    const SslErrors errors = SslErrors::take();
    if (err == SSL_ERROR_SSL) {
      if (errors.has(ERR_LIB_SSL, SSL_R_CERTIFICATE_VERIFY_FAILED)) verifyFailed(what);
      if (const int alert = errors.alertReason(); isClientCertificateAlert(alert)) {
        clientCertificateRefused(alert, what);
      }
      if (errors.has(ERR_LIB_SSL, SSL_R_UNEXPECTED_EOF_WHILE_READING)) closedDuringHandshake(what);
      if (errors.has(ERR_LIB_SSL, SSL_R_WRONG_VERSION_NUMBER) ||
          errors.has(ERR_LIB_SSL, SSL_R_PACKET_LENGTH_TOO_LONG)) {
        tlsError(
            fmt::format("redlimit: {}: the server did not answer in TLS (is this the plain-text port? connect to "
                        "the server's tls-port) ({})",
                        what, errors.text()));
      }
      if (const int alert = errors.alertReason(); alert != 0) {
        tlsError(fmt::format("redlimit: {}: the server refused the handshake with TLS alert \"{}\" ({})", what,
                             SslErrors::alertText(alert), errors.text()));
      }
      if (state_.lastErrno != 0) throwErrnoError(state_.lastErrno, what);
      tlsError(fmt::format("redlimit: {}: failed: {}", what, errors.text()));
    }
    if (err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN) {
      if (state_.eof || state_.lastErrno == 0 || state_.lastErrno == ECONNRESET) closedDuringHandshake(what);
      throwErrnoError(state_.lastErrno, what);
    }
    tlsError(fmt::format("redlimit: {}: failed (SSL_get_error {}): {}", what, err, errors.text()));
  }

  [[noreturn]] void closedDuringHandshake(const std::string& what) {
    if (state_.certificateRequested && tls_.certFile.empty()) {
      tlsError(
          fmt::format("redlimit: {}: the server closed the connection after asking for a client certificate, and "
                      "none is configured: it most likely requires one (tls-auth-clients yes); set "
                      "ClientOptions::Tls::certFile and ::keyFile",
                      what));
    }
    const std::string how = state_.lastErrno == ECONNRESET ? "reset the connection" : "closed the connection";
    throw ClosedError(
        fmt::format("redlimit: {}: the server {} before the handshake finished, without a TLS alert "
                    "(is it a TLS port? does it accept TLS 1.2 or newer?)",
                    what, how));
  }

  [[noreturn]] void verifyFailed(const std::string& what) const {
    const long result = ::SSL_get_verify_result(ssl_.get());
    X509* cert = ::SSL_get0_peer_certificate(ssl_.get());
    if (cert == nullptr) {
      // On a failed verification the chain is kept, its leaf first, but not yet the peer.
      STACK_OF(X509)* chain = ::SSL_get_peer_cert_chain(ssl_.get());
      if (chain != nullptr && sk_X509_num(chain) > 0) cert = sk_X509_value(chain, 0);
    }
    const std::string names = certificateNames(cert);
    if (result == X509_V_ERR_HOSTNAME_MISMATCH || result == X509_V_ERR_IP_ADDRESS_MISMATCH) {
      tlsError(fmt::format(
          "redlimit: {}: the server's certificate does not name \"{}\" (expected from {}); it names {} "
          "(set ClientOptions::Tls::serverName, or sni= in the URI, to a name it carries)",
          what, expectedName_, tls_.serverName.empty() ? "the host" : "ClientOptions::Tls::serverName", names));
    }
    std::string trust;
    if (!tls_.caFile.empty()) trust = fmt::format("ClientOptions::Tls::caFile \"{}\"", tls_.caFile);
    if (!tls_.caPath.empty()) {
      trust += fmt::format("{}ClientOptions::Tls::caPath \"{}\"", trust.empty() ? "" : " and ", tls_.caPath);
    }
    if (trust.empty()) trust = "the system's trust store (no ClientOptions::Tls::caFile or ::caPath)";
    // The right CA, a certificate outside its validity period: pointing caFile elsewhere is no fix.
    if (result == X509_V_ERR_CERT_HAS_EXPIRED || result == X509_V_ERR_CERT_NOT_YET_VALID) {
      tlsError(
          validityMessage(what, result == X509_V_ERR_CERT_HAS_EXPIRED, ::SSL_get_peer_cert_chain(ssl_.get()), trust));
    }
    const std::string who = cert == nullptr
                                ? std::string("(no certificate)")
                                : fmt::format("subject {}, issuer {}", nameLine(::X509_get_subject_name(cert)),
                                              nameLine(::X509_get_issuer_name(cert)));
    tlsError(
        fmt::format("redlimit: {}: certificate verification failed: {} (the server's certificate, {}, is not "
                    "trusted by {}; point caFile/caPath at the CA that signed it, or have the server use a "
                    "certificate that CA signed)",
                    what, ::X509_verify_cert_error_string(result), who, trust));
  }

  std::unique_ptr<SSL, SslDeleter> ssl_;  // frees the BIO; sends nothing
  SocketState state_;
  ClientOptions::Tls tls_;
  std::string expectedName_;
  IoWant wantAfterRead_ = IoWant::Read;
  IoWant wantAfterWrite_ = IoWant::Write;
  bool received_ = false;  // some application data arrived
};

}  // namespace

std::string endpointOf(const ClientOptions::Node& a) {
  return isIpv6Literal(a.host) ? fmt::format("[{}]:{}", a.host, a.port) : fmt::format("{}:{}", a.host, a.port);
}

std::string endpointOf(const ClientOptions::Connection& o) {
  if (!o.unixSocket.empty()) return fmt::format("unix:{}", o.unixSocket);
  return endpointOf(ClientOptions::Node{o.host, o.port});
}

Stream::Stream(int fd, bool tls, std::string endpoint) noexcept : fd_(fd), tls_(tls), endpoint_(std::move(endpoint)) {}

Stream::~Stream() {
  if (fd_ >= 0) ::close(fd_);
}

IoWant Stream::wantAfterRead() const noexcept { return IoWant::Read; }
IoWant Stream::wantAfterWrite() const noexcept { return IoWant::Write; }
std::size_t Stream::buffered() const noexcept { return 0; }

std::unique_ptr<Stream> adoptPlainStream(int fd, std::string endpoint) {
  return std::unique_ptr<Stream>(new PlainStream(fd, std::move(endpoint)));
}

std::unique_ptr<HandshakingStream> startTlsStream(int fd, std::string endpoint, ssl_ctx_st* ctx,
                                                  const ClientOptions::Connection& options) {
  std::unique_ptr<TlsStream> tls(new TlsStream(fd, std::move(endpoint)));
  tls->start(ctx, options);
  return tls;
}

std::shared_ptr<ssl_ctx_st> makeTlsContext(const ClientOptions::Tls& tls, const std::string& endpoint) {
  return std::shared_ptr<SSL_CTX>(makeContext(tls, endpoint).release(), CtxDeleter{});
}

void writeAll(Stream& s, const char* data, std::size_t size, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < size) {
    const std::size_t n = s.write(data + done, size - done);
    if (n > 0) {
      done += n;
      continue;
    }
    const std::string what = fmt::format("write to {}", s.endpoint());
    if (!waitFor(s.fd(), s.wantAfterWrite(), deadline, what)) {
      throw TimeoutError(fmt::format("redlimit: {}: timed out ({} of {} bytes written)", what, done, size));
    }
  }
}

std::size_t readSome(Stream& s, char* buf, std::size_t size, Clock::time_point deadline) {
  if (size == 0) return 0;
  for (;;) {
    const std::size_t n = s.read(buf, size);
    if (n > 0) return n;
    const std::string what = fmt::format("read from {}", s.endpoint());
    if (!waitFor(s.fd(), s.wantAfterRead(), deadline, what)) {
      throw TimeoutError(fmt::format("redlimit: {}: timed out waiting for the server", what));
    }
  }
}

}  // namespace redlimit::detail
