// The transport's byte streams (src/transport/stream.hpp) against real servers: plain TCP, unix socket and
// TLS (certificates made at test time with the openssl command), the errors a TLS set-up can
// fail with, connect and handshake deadlines, SIGPIPE, and the TLS-port probe. Loopback only.
#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit_test/no_free_descriptors.hpp"
#include "redlimit_test/redis_server.hpp"
#include "redlimit_test/tls_certs.hpp"
#include "transport/connector.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using detail::Stream;
using std::chrono::milliseconds;

namespace {

constexpr char kPing[] = "*1\r\n$4\r\nPING\r\n";
constexpr milliseconds kGenerous{5000};  // for steps that should take a few ms

Clock::time_point after(milliseconds ms) { return Clock::now() + ms; }

// Reads until the buffer holds a whole line (a RESP simple reply).
std::string readLine(Stream& s, Clock::time_point deadline) {
  std::string got;
  char buf[256];
  while (!contains(got, "\r\n")) got.append(buf, detail::readSome(s, buf, sizeof buf, deadline));
  return got;
}

std::string ping(Stream& s) {
  const auto deadline = after(kGenerous);
  detail::writeAll(s, kPing, sizeof kPing - 1, deadline);
  return readLine(s, deadline);
}

// What `command` prints on stdout (its first line), for reading a certificate with the openssl CLI.
std::string commandOutput(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
  if (!pipe) return "popen failed";
  char buf[256] = {};
  if (std::fgets(buf, sizeof buf, pipe.get()) == nullptr) return "no output from " + command;
  return buf;
}

// Runs `f`, expects it to throw exactly E (or a subclass), and returns the message.
template <class E>
std::string messageOfCall(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << ": " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

std::vector<std::string> tlsArgs(const TlsCerts& c, bool authClients) {
  return {"--tls-port",         "auto",
          "--tls-cert-file",    c.serverCert,
          "--tls-key-file",     c.serverKey,
          "--tls-ca-cert-file", c.caFile,
          "--tls-auth-clients", authClients ? "yes" : "no"};
}

ClientOptions::Connection plainOptions(const RedisServer& server) {
  ClientOptions::Connection o;
  o.host = server.host();
  o.port = server.port();
  return o;
}

ClientOptions::Connection tlsOptions(const RedisServer& server, const TlsCerts& c) {
  ClientOptions::Connection o;
  o.host = "127.0.0.1";
  o.port = server.tlsPort();
  o.tls.enabled = true;
  o.tls.caFile = c.caFile;
  return o;
}

void expectNonBlockingCloexec(int fd) {
  EXPECT_NE(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
}

/// A loopback listener that never accepts: connects complete (the kernel queues them), but
/// nothing is ever sent back, so a TLS handshake waits forever.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("cannot listen on loopback");
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// ----- plain ---------------------------------------------------------------------------------

TEST(Stream, PlainTcpPing) {
  RedisServer server;
  auto s = detail::connectStream(plainOptions(server), after(kGenerous));
  EXPECT_FALSE(s->isTls());
  EXPECT_EQ(s->endpoint(), "127.0.0.1:" + std::to_string(server.port()));
  expectNonBlockingCloexec(s->fd());
  EXPECT_EQ(s->buffered(), 0u);
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, LocalhostTriesEachAddress) {
  // The server listens on 127.0.0.1 only; "localhost" may resolve to ::1 first, which refuses.
  RedisServer server;
  ClientOptions::Connection o = plainOptions(server);
  o.host = "localhost";
  auto s = detail::connectStream(o, after(kGenerous));
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, UnixSocketPing) {
  RedisServer server;
  ClientOptions::Connection o;
  o.unixSocket = server.unixSocket();
  auto s = detail::connectStream(o, after(kGenerous));
  EXPECT_FALSE(s->isTls());
  EXPECT_EQ(s->endpoint(), "unix:" + server.unixSocket());
  expectNonBlockingCloexec(s->fd());
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, ReadWithNothingThereReturnsZero) {
  RedisServer server;
  auto s = detail::connectStream(plainOptions(server), after(kGenerous));
  char buf[16];
  EXPECT_EQ(s->read(buf, sizeof buf), 0u);
  EXPECT_EQ(s->wantAfterRead(), detail::IoWant::Read);
  const auto start = Clock::now();
  EXPECT_THROW((void)detail::readSome(*s, buf, sizeof buf, after(milliseconds(200))), TimeoutError);
  EXPECT_GE(msSince(start), 150);
}

TEST(Stream, RefusedPortIsIoErrorWithinTheDeadline) {
  const int port = freeLoopbackPort();
  ClientOptions::Connection o;
  o.port = port;
  const auto start = Clock::now();
  const std::string message = messageOfCall<IoError>([&] { (void)detail::connectStream(o, after(kGenerous)); });
  EXPECT_LT(msSince(start), kGenerous.count());
  EXPECT_TRUE(contains(message, "connect to 127.0.0.1:" + std::to_string(port))) << message;
  EXPECT_TRUE(contains(message, "Connection refused")) << message;
  EXPECT_THROW((void)detail::connectStream(o, after(kGenerous)), IoError);
  try {
    (void)detail::connectStream(o, after(kGenerous));
  } catch (const TimeoutError&) {
    ADD_FAILURE() << "a refused connect is not a timeout";
  } catch (const ClosedError&) {
    ADD_FAILURE() << "a refused connect is not a closed connection";
  } catch (const IoError&) {
  }
}

TEST(Stream, MissingUnixSocketIsIoError) {
  ClientOptions::Connection o;
  o.unixSocket = "/nonexistent/redlimit.sock";
  const std::string message = messageOfCall<IoError>([&] { (void)detail::connectStream(o, after(kGenerous)); });
  EXPECT_TRUE(contains(message, "connect to unix:/nonexistent/redlimit.sock")) << message;
  EXPECT_TRUE(contains(message, "No such file or directory")) << message;
}

// Connects with a 300 ms deadline that must end in TimeoutError, not before it (and not much
// later); returns the error's message.
std::string timesOutAtTheDeadline(const ClientOptions::Connection& o) {
  const auto start = Clock::now();
  std::string message = messageOfCall<TimeoutError>([&] { (void)detail::connectStream(o, after(milliseconds(300))); });
  const auto took = msSince(start);
  EXPECT_GE(took, 250) << "returned before the deadline";
  EXPECT_LT(took, 3000) << "generous slack for a loaded machine";
  return message;
}

TEST(Stream, ConnectDeadlineOnAFullBacklog) {
  FullBacklog blackhole;
  ClientOptions::Connection o;
  o.port = blackhole.port();
  const std::string message = timesOutAtTheDeadline(o);
  EXPECT_TRUE(contains(message, "connect to 127.0.0.1:" + std::to_string(blackhole.port()))) << message;
}

TEST(Stream, WriteToAClosedConnectionRaisesNoSigpipe) {
  // SIGPIPE's default action ends the process: this test passing is the check.
  RedisServer server;
  auto s = detail::connectStream(plainOptions(server), after(kGenerous));
  server.kill();
  const std::string message = messageOfCall<ClosedError>([&] {
    for (int i = 0; i < 100; ++i) {
      detail::writeAll(*s, kPing, sizeof kPing - 1, after(kGenerous));
      sleepMs(10);
    }
  });
  EXPECT_TRUE(contains(message, "write to 127.0.0.1:")) << message;
}

TEST(Stream, OutOfDescriptorsIsAResourceLimitError) {
  const TlsCerts certs = makeTlsCerts();
  ClientOptions::Connection plain;
  plain.port = freeLoopbackPort();
  ClientOptions::Connection tls = plain;
  tls.tls.enabled = true;
  tls.tls.caFile = certs.caFile;
  // UBSan (asan preset) checks an object's type through a pipe(2) the first time it meets the
  // type: meet the exception types and fmt's buffer while descriptors are still free.
  EXPECT_THROW((void)detail::connectStream(plain, after(kGenerous)), IoError);
  const ConfigurationError sample(ErrorKind::ResourceLimit, "EMFILE", "warm-up");
  EXPECT_NE(static_cast<const std::exception&>(sample).what(), nullptr);
  EXPECT_EQ(static_cast<const ConfigurationError&>(sample).code(), "EMFILE");
  EXPECT_NE(static_cast<const std::runtime_error&>(sample).what(), nullptr);
  EXPECT_NE(static_cast<const Error&>(sample).what(), nullptr);
  EXPECT_EQ(ConfigurationError(sample).code(),
            "EMFILE");  // NOLINT(performance-unnecessary-copy-initialization): the copy is the test
  std::string plainCode, tlsCode, tlsMessage;
  {
    NoFreeDescriptors exhausted;
    try {
      (void)detail::connectStream(plain, after(kGenerous));
    } catch (const ConfigurationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ResourceLimit) << e.what();
      plainCode = e.code();
    }
    try {
      (void)detail::connectStream(tls, after(kGenerous));  // the CA file cannot be opened
    } catch (const ConfigurationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ResourceLimit) << e.what();
      tlsCode = e.code();
      tlsMessage = e.what();
    }
  }
  EXPECT_EQ(plainCode, "EMFILE");
  EXPECT_EQ(tlsCode, "EMFILE");
  EXPECT_TRUE(contains(tlsMessage, "ClientOptions::Tls::caFile")) << tlsMessage;
}

// ----- TLS -----------------------------------------------------------------------------------

TEST(Stream, TlsPing) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  auto s = detail::connectStream(tlsOptions(server, certs), after(kGenerous));
  EXPECT_TRUE(s->isTls());
  expectNonBlockingCloexec(s->fd());
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, TlsToLocalhostChecksTheDnsName) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.host = "localhost";
  auto s = detail::connectStream(o, after(kGenerous));
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, TlsLargeRequestAndReply) {
  // Several records each way: partial writes, and reads that leave decrypted bytes buffered.
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  auto s = detail::connectStream(tlsOptions(server, certs), after(kGenerous));
  std::string value(3 << 20, 'x');
  for (std::size_t i = 0; i < value.size(); i += 4093) value[i] = static_cast<char>('a' + i % 26);
  const std::string set = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
  const auto deadline = after(milliseconds(20000));
  detail::writeAll(*s, set.data(), set.size(), deadline);
  EXPECT_EQ(readLine(*s, deadline), "+OK\r\n");
  const std::string get = "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
  detail::writeAll(*s, get.data(), get.size(), deadline);
  const std::string expected = "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
  std::string got;
  std::vector<char> buf(1000);
  bool sawBuffered = false;
  while (got.size() < expected.size()) {
    got.append(buf.data(), detail::readSome(*s, buf.data(), buf.size(), deadline));
    sawBuffered = sawBuffered || s->buffered() > 0;
  }
  EXPECT_TRUE(got == expected) << "reply of " << got.size() << " bytes differs";
  EXPECT_TRUE(sawBuffered) << "1000-byte reads of 16 KiB records leave the rest buffered";
}

TEST(Stream, TlsMutualAuthWithClientCertificate) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, true));
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.tls.certFile = certs.clientCert;
  o.tls.keyFile = certs.clientKey;
  auto s = detail::connectStream(o, after(kGenerous));
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, TlsMutualAuthWithoutClientCertificate) {
  // TLS 1.3: the client's handshake ends before the server checks the client's (empty)
  // certificate; the server then sends an alert and closes. The PING's write or read meets it,
  // whichever comes first, and reads the alert.
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, true));
  for (int i = 0; i < 3; ++i) {
    const std::string message = messageOfError<ConfigurationError>(ErrorKind::Tls, [&] {
      auto s = detail::connectStream(tlsOptions(server, certs), after(kGenerous));
      (void)ping(*s);
    });
    EXPECT_TRUE(contains(message, "127.0.0.1:" + std::to_string(server.tlsPort()))) << message;
    EXPECT_TRUE(contains(message, "client certificate")) << message;
    EXPECT_TRUE(contains(message, "set ClientOptions::Tls::certFile and ::keyFile")) << message;
    EXPECT_TRUE(contains(message, "certificate required")) << message;
  }
}

TEST(Stream, TlsMutualAuthWithARefusedClientCertificate) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, true));
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.tls.certFile = certs.serverCert;  // signed by the right CA, but for serverAuth only
  o.tls.keyFile = certs.serverKey;
  const std::string message = messageOfError<ConfigurationError>(ErrorKind::Tls, [&] {
    auto s = detail::connectStream(o, after(kGenerous));
    (void)ping(*s);
  });
  EXPECT_TRUE(contains(message, "rejected the client certificate \"" + certs.serverCert + "\"")) << message;
  EXPECT_TRUE(contains(message, "unsupported certificate")) << message;
}

TEST(Stream, TlsToAPlainPort) {
  // A plain Redis port reads the ClientHello as an inline command: it waits for a newline (then a
  // plain PING finds it answering in RESP), or answers an error where a TLS record belongs. Either
  // way a ConfigurationError (Tls), never a timeout.
  RedisServer server;
  ClientOptions::Connection o = plainOptions(server);
  o.tls.enabled = true;
  o.tls.verifyPeer = false;
  for (int i = 0; i < 3; ++i) {  // the hello's random bytes hold a '\n' about one time in three
    try {
      (void)detail::connectStream(o, after(milliseconds(300)));
      ADD_FAILURE() << "a TLS handshake with a plain port succeeded";
    } catch (const ConfigurationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Tls) << e.what();
      EXPECT_TRUE(contains(e.what(), "did not answer in TLS") || contains(e.what(), "plain-text port")) << e.what();
    }
  }
}

// Drives a PortProbe to its end with poll(), as an event loop would: the first two bytes the
// port answered `bytes` with, or "" when it failed (refused, closed, the deadline).
std::string probeHead(int port, std::string_view bytes, Clock::time_point deadline) {
  detail::PortProbe probe(detail::resolveName("127.0.0.1", port).front(), bytes, deadline);
  while (probe.step() == detail::PortProbe::State::Working) {
    pollfd p{probe.pollFd(), POLLIN, 0};
    (void)::poll(&p, 1, 20);
  }
  return probe.state() == detail::PortProbe::State::Answered ? std::string(probe.head()) : std::string();
}

TEST(Stream, PlainRedisAnswersAPlainPing) {
  RedisServer server;
  EXPECT_TRUE(detail::isPlainRedisAnswer(probeHead(server.port(), "PING\r\n", after(kGenerous))));
  SilentListener silent;  // accepts (the kernel does) and never answers: nothing by the deadline
  EXPECT_EQ(probeHead(silent.port(), "PING\r\n", after(milliseconds(100))), "");
}

TEST(Stream, TlsPeerClosesDuringTheHandshake) {
  SilentListener listener;
  std::thread closer([&] {
    const int fd = ::accept(listener.fd(), nullptr, nullptr);
    char buf[4096];
    (void)::read(fd, buf, sizeof buf);  // the ClientHello: closing with it read sends a FIN, not a reset
    ::close(fd);
  });
  ClientOptions::Connection o;
  o.port = listener.port();
  o.tls.enabled = true;
  o.tls.verifyPeer = false;
  const std::string message = messageOfCall<ClosedError>([&] { (void)detail::connectStream(o, after(kGenerous)); });
  closer.join();
  EXPECT_TRUE(contains(message, "TLS handshake with 127.0.0.1:" + std::to_string(listener.port()))) << message;
  EXPECT_TRUE(contains(message, "closed the connection before the handshake finished")) << message;
}

TEST(Stream, TlsWrongCa) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.tls.caFile = certs.otherCaFile;
  const std::string message =
      messageOfError<ConfigurationError>(ErrorKind::Tls, [&] { (void)detail::connectStream(o, after(kGenerous)); });
  EXPECT_TRUE(contains(message, "certificate verification failed")) << message;
  // redis-server sends its CA after the leaf (OpenSSL builds the chain from tls-ca-cert-file):
  // the unknown root is "self-signed"; a server sending the leaf alone gets "unable to get
  // local issuer certificate".
  EXPECT_TRUE(contains(message, "self-signed certificate in certificate chain") ||
              contains(message, "unable to get local issuer certificate"))
      << message;
  EXPECT_TRUE(contains(message, "issuer /CN=redlimit-test-ca")) << message;
  EXPECT_TRUE(contains(message, "ClientOptions::Tls::caFile \"" + certs.otherCaFile + "\"")) << message;
}

// The right CA signed it, but it expired: the message says so, and when, not to change the CA.
TEST(Stream, TlsExpiredCertificateSaysWhenItExpired) {
  const TlsCerts certs = makeTlsCerts();
  std::vector<std::string> args = tlsArgs(certs, false);
  *(std::find(args.begin(), args.end(), certs.serverCert)) = certs.expiredServerCert;
  RedisServer server(args);
  const std::string message = messageOfError<ConfigurationError>(
      ErrorKind::Tls, [&] { (void)detail::connectStream(tlsOptions(server, certs), after(kGenerous)); });
  // "notAfter=2026-12-05 06:00:33Z"
  const std::string line =
      commandOutput("openssl x509 -noout -enddate -dateopt iso_8601 -in '" + certs.expiredServerCert + "'");
  ASSERT_EQ(line.rfind("notAfter=", 0), 0u) << line;
  const std::string notAfter = line.substr(9, 19);
  EXPECT_TRUE(contains(message, "the server's certificate (subject /CN=localhost")) << message;
  EXPECT_TRUE(contains(message, "expired at " + notAfter + " UTC (its notAfter)")) << message;
  EXPECT_TRUE(contains(message, "renew it")) << message;
  EXPECT_FALSE(contains(message, "point caFile")) << "the CA given did sign it: " << message;
}

TEST(Stream, TlsWrongHostname) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.tls.serverName = "wrong.example";
  const std::string message =
      messageOfError<ConfigurationError>(ErrorKind::Tls, [&] { (void)detail::connectStream(o, after(kGenerous)); });
  EXPECT_TRUE(contains(message, "does not name \"wrong.example\"")) << message;
  EXPECT_TRUE(contains(message, "DNS:localhost, IP:127.0.0.1")) << message;
}

TEST(Stream, TlsWrongIpAddress) {
  // The name checked is the host's IP address when no serverName is set.
  const TlsCerts certs = makeTlsCerts();
  std::vector<std::string> args = tlsArgs(certs, false);
  args.insert(args.end(), {"--bind", "127.0.0.1 127.0.0.2"});
  RedisServer server(args);
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.host = "127.0.0.2";  // loopback too, but not in the certificate
  const std::string message =
      messageOfError<ConfigurationError>(ErrorKind::Tls, [&] { (void)detail::connectStream(o, after(kGenerous)); });
  EXPECT_TRUE(contains(message, "does not name \"127.0.0.2\" (expected from the host)")) << message;
}

TEST(Stream, TlsVerifyPeerOffConnectsDespiteAnUnknownCa) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  ClientOptions::Connection o = tlsOptions(server, certs);
  o.tls.caFile.clear();  // a CA with verifyPeer = false is refused by checkOptions (it would be ignored)
  o.tls.serverName = "wrong.example";
  o.tls.verifyPeer = false;
  auto s = detail::connectStream(o, after(kGenerous));
  EXPECT_EQ(ping(*s), "+PONG\r\n");
}

TEST(Stream, TlsHandshakeDeadline) {
  SilentListener silent;
  ClientOptions::Connection o;
  o.port = silent.port();
  o.tls.enabled = true;
  o.tls.verifyPeer = false;
  const std::string message = timesOutAtTheDeadline(o);
  EXPECT_TRUE(contains(message, "TLS handshake with 127.0.0.1:" + std::to_string(silent.port()))) << message;
}

TEST(Stream, TlsWriteToAClosedConnectionRaisesNoSigpipe) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  auto s = detail::connectStream(tlsOptions(server, certs), after(kGenerous));
  EXPECT_EQ(ping(*s), "+PONG\r\n");
  server.kill();
  (void)messageOfCall<ClosedError>([&] {
    for (int i = 0; i < 100; ++i) {
      detail::writeAll(*s, kPing, sizeof kPing - 1, after(kGenerous));
      sleepMs(10);
    }
  });
}

TEST(Stream, TlsFileErrors) {
  // The context is built before connecting: none of these needs a server.
  const TlsCerts certs = makeTlsCerts();
  ClientOptions::Connection base;
  base.port = freeLoopbackPort();
  base.tls.enabled = true;
  auto fails = [&](const std::function<void(ClientOptions::Tls&)>& change) {
    ClientOptions::Connection o = base;
    change(o.tls);
    std::string message;
    try {
      (void)detail::connectStream(o, after(kGenerous));
      ADD_FAILURE() << "connected";
    } catch (const ConfigurationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Tls) << e.what();
      EXPECT_EQ(e.code(), "TLS");
      message = e.what();
    }
    return message;
  };
  const std::string missing = certs.dir + "/missing.pem";
  std::string m = fails([&](ClientOptions::Tls& t) { t.caFile = missing; });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::caFile \"" + missing + "\"") && contains(m, "No such file")) << m;
  m = fails([&](ClientOptions::Tls& t) { t.caFile = certs.serverKey; });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::caFile \"" + certs.serverKey + "\"")) << m;
  m = fails([&](ClientOptions::Tls& t) { t.caPath = certs.caFile; });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::caPath \"" + certs.caFile + "\"") && contains(m, "Not a directory"))
      << m;
  m = fails([&](ClientOptions::Tls& t) { t.certFile = certs.clientCert; });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::certFile is set but ::keyFile is empty")) << m;
  m = fails([&](ClientOptions::Tls& t) { t.keyFile = certs.clientKey; });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::keyFile is set but ::certFile is empty")) << m;
  m = fails([&](ClientOptions::Tls& t) {
    t.certFile = certs.clientCert;
    t.keyFile = missing;
  });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::keyFile \"" + missing + "\"")) << m;
  m = fails([&](ClientOptions::Tls& t) {
    t.certFile = certs.clientCert;
    t.keyFile = certs.serverKey;
  });
  EXPECT_TRUE(contains(m, "is not the private key of the certificate")) << m;
  m = fails([&](ClientOptions::Tls& t) {
    t.certFile = certs.caFile + ".nope";
    t.keyFile = certs.clientKey;
  });
  EXPECT_TRUE(contains(m, "ClientOptions::Tls::certFile")) << m;
}

TEST(Stream, TlsOverAUnixSocketIsInvalid) {
  ClientOptions::Connection o;
  o.unixSocket = "/tmp/redlimit-none.sock";
  o.tls.enabled = true;
  EXPECT_THROW((void)detail::connectStream(o, after(kGenerous)), InvalidArgument);
}

TEST(Stream, SpeaksTls) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsArgs(certs, false));
  EXPECT_TRUE(detail::isTlsAnswer(probeHead(server.tlsPort(), detail::tlsHello(), after(kGenerous))));
  // A plain port waits for the rest of the "command": nothing by the deadline.
  EXPECT_EQ(probeHead(server.port(), detail::tlsHello(), after(milliseconds(300))), "");
}

}  // namespace
