// The transport end to end, through the public API (Client, RateLimiter): every misbehaviour of a
// fake peer ends in a typed error within the request's deadline; TLS set-ups that work and the
// errors of those that cannot; a fork()ed child that shares its parent's limiter; pipelining while
// the server kills connections and flushes scripts; thousands of asynchronous acquires from one
// thread; shutdown with requests in flight; sync calls from completions; and a whole-request
// deadline that a slowly trickling reply cannot stretch. Loopback only.
#include <dirent.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/client.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fake_peer.hpp"
#include "redlimit_test/fd_io.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/redis_server.hpp"
#include "redlimit_test/scripted_resolver.hpp"
#include "redlimit_test/tls_certs.hpp"
#include "transport/connector.hpp"
#include "transport/pipeline.hpp"
#include "transport/transport.hpp"
#include "redlimit_test/expect_error.hpp"
#include "redlimit_test/sanitizers.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Behaviour = FakePeer::Behaviour;

namespace {

constexpr milliseconds kPeerTimeout{300};  // commandTimeout of the clients of fake peers
// A plain command is one request: its deadline plus generous slack for a loaded 2-core machine.
constexpr std::int64_t kCommandBoundMs = 1500;
// A limiter's acquire may be sent up to three times (on ClosedError): three deadlines plus slack.
constexpr std::int64_t kAcquireBoundMs = 3 * kPeerTimeout.count() + 1500;

// The redlimit type of an error by name, with its kind when it is not the type's plain one
// ("IoError/Protocol", "ConfigurationError/Tls"), so that an assertion says what came.
std::string kindOf(const std::exception_ptr& e) {
  if (!e) return "none";
  auto named = [](const char* type, ErrorKind plain, const Error& error) {
    return error.kind() == plain ? std::string(type) : std::string(type) + "/" + test::kindName(error.kind());
  };
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& t) {
    return named("TimeoutError", ErrorKind::Timeout, t);
  } catch (const ClosedError&) {
    return "ClosedError";
  } catch (const IoError& io) {
    return named("IoError", ErrorKind::Io, io);
  } catch (const ConfigurationError& c) {
    return named("ConfigurationError", ErrorKind::Configuration, c);
  } catch (const InvalidArgument&) {
    return "InvalidArgument";
  } catch (const ReplyError& r) {
    return "ReplyError(" + r.code() + ")";
  } catch (const Error&) {
    return "Error";
  } catch (const std::exception& x) {
    return std::string("std::exception: ") + x.what();
  } catch (...) {
    return "unknown";
  }
}

// What a call ended with and how long it took.
struct Caught {
  std::string kind;     // kindOf the exception, "none" if it returned
  std::string message;  // its what()
  std::int64_t ms = 0;  // elapsed, ms
};

template <class F>
Caught run(F&& f) {
  const auto start = Clock::now();
  Caught c;
  try {
    f();
    c.kind = "none";
  } catch (...) {
    c.kind = kindOf(std::current_exception());
    c.message = messageOf(std::current_exception());
  }
  c.ms = msSince(start);
  return c;
}

// Requests queued or awaiting replies drop to 0 once every completion has run (the counter is
// decremented just after the completions of one batch, so a caller may briefly see its own).
bool nothingPending(const Client& c) {
  return waitFor([&] { return c.poolStats().pending == 0; }, milliseconds(1000));
}

ClientOptions peerClient(const FakePeer& peer, milliseconds commandTimeout) {
  ClientOptions o;
  o.connection = parseUri(peer.uri());
  o.connection.commandTimeout = commandTimeout;
  o.pool.size = 1;
  return o;
}

FakePeer::Options peerOptions(Behaviour b) {
  FakePeer::Options o;
  o.behaviour = b;
  return o;
}

// Counts the outcomes of many calls made from many threads (and completions).
struct Tally {
  std::atomic<std::int64_t> granted{0}, denied{0}, errors{0};
  std::mutex m;
  std::map<std::string, std::int64_t> errorKinds;
  std::vector<std::string> firstMessages;

  void error(const std::exception_ptr& e) {
    errors.fetch_add(1);
    std::lock_guard<std::mutex> lock(m);
    ++errorKinds[kindOf(e)];
    if (firstMessages.size() < 5) firstMessages.push_back(kindOf(e) + ": " + messageOf(e));
  }
  void outcome(bool wasGranted) { (wasGranted ? granted : denied).fetch_add(1); }
  std::int64_t total() const { return granted.load() + denied.load() + errors.load(); }
  std::string describe() {
    std::lock_guard<std::mutex> lock(m);
    std::string out = "granted " + std::to_string(granted.load()) + ", denied " + std::to_string(denied.load()) +
                      ", errors " + std::to_string(errors.load());
    for (const auto& [kind, n] : errorKinds) out += "; " + kind + " x" + std::to_string(n);
    for (const auto& text : firstMessages) out += "\n  " + text;
    return out;
  }
};

// ----- 1. fake peers: a typed error within the deadline, whatever the peer does -----------------

// For one behaviour: two plain commands and two limiter acquires, each ending with `kind` within
// its bound (and before the deadline when `atTheHeader`: the reply's first line says it all), and
// nothing left pending after each.
void expectTypedFailures(Behaviour behaviour, const std::string& kind, bool atTheHeader) {
  FakePeer peer(peerOptions(behaviour));
  auto client = Client::create(peerClient(peer, kPeerTimeout));
  for (int i = 1; i <= 2; ++i) {
    SCOPED_TRACE("command #" + std::to_string(i));
    const Caught c = run([&] { (void)redlimit::detail::command(*client, {"ECHO", "x"}); });
    EXPECT_EQ(c.kind, kind) << c.message;
    EXPECT_LT(c.ms, kCommandBoundMs);
    if (atTheHeader) {
      EXPECT_LT(c.ms, kPeerTimeout.count()) << "a broken header must not wait for the deadline";
    }
    EXPECT_TRUE(nothingPending(*client)) << client->poolStats().pending << " requests still pending";
  }
  for (int i = 1; i <= 2; ++i) {
    SCOPED_TRACE("tryAcquire #" + std::to_string(i));
    // A handle of its own each time: a handle that just failed decides its next call without
    // asking the peer until its probe interval has passed (FailureOptions::probeInterval).
    RateLimiter limiter(client, "transport-peer");
    const Caught c = run([&] { (void)limiter.tryAcquire(); });
    EXPECT_EQ(c.kind, kind) << c.message;
    EXPECT_LT(c.ms, kAcquireBoundMs);
    if (atTheHeader) {
      EXPECT_LT(c.ms, kPeerTimeout.count()) << "a broken header must not wait for the deadline";
    }
    EXPECT_TRUE(nothingPending(*client)) << client->poolStats().pending << " requests still pending";
  }
  EXPECT_GE(peer.connectionsAccepted(), 2u) << "each failure closes its connection; the next call opens another";
}

TEST(TransportFakePeer, NeverAnswerTimesOut) { expectTypedFailures(Behaviour::NeverAnswer, "TimeoutError", false); }

// A request its caller wrote itself (the connection was idle: PoolStats::direct) to a peer that
// never answers, while the I/O thread sleeps with nothing else to wait for: the timer its caller
// armed wakes that thread at the deadline, which closes the connection. Without the timer, only
// the sync wait's own fallback (a second after the deadline) would end the call.
TEST(TransportFakePeer, ARequestWrittenByItsCallerStillEndsAtItsDeadline) {
  FakePeer peer(peerOptions(Behaviour::NeverAnswer));
  auto client = Client::create(peerClient(peer, kPeerTimeout));
  // CLIENT SETNAME is part of a greeting for the peer: answered, so the connection is open,
  // greeted and idle afterwards.
  const Reply named = redlimit::detail::command(*client, {"CLIENT", "SETNAME", "direct"});
  EXPECT_EQ(named.str, "OK");
  EXPECT_EQ(client->poolStats().direct, 0u) << "the first request waits for the connection: the I/O thread writes it";
  const Caught c = run([&] { (void)redlimit::detail::command(*client, {"ECHO", "x"}); });
  EXPECT_EQ(client->poolStats().direct, 1u) << "the idle connection took the request from its caller";
  EXPECT_EQ(c.kind, "TimeoutError") << c.message;
  EXPECT_EQ(c.message.find("did not end the request"), std::string::npos) << c.message;
  EXPECT_LT(c.ms, kPeerTimeout.count() + 600) << "ended by the I/O thread at the deadline, not by the wait's fallback";
  EXPECT_EQ(client->poolStats().discarded, 1u) << "a written request that timed out closes its connection";
  EXPECT_TRUE(nothingPending(*client));
}

TEST(TransportFakePeer, TrickleLongerThanTheDeadlineTimesOut) {
  expectTypedFailures(Behaviour::Trickle, "TimeoutError", false);
}

TEST(TransportFakePeer, HugeArrayHeaderIsAProtocolErrorAtTheHeader) {
  expectTypedFailures(Behaviour::HugeArrayHeader, "IoError/Protocol", true);
}

TEST(TransportFakePeer, HugeBulkHeaderIsAProtocolErrorAtTheHeader) {
  expectTypedFailures(Behaviour::HugeBulkHeader, "IoError/Protocol", true);
}

TEST(TransportFakePeer, GarbageIsAProtocolError) { expectTypedFailures(Behaviour::Garbage, "IoError/Protocol", true); }

TEST(TransportFakePeer, DeepNestingIsAProtocolError) {
  expectTypedFailures(Behaviour::DeepNesting, "IoError/Protocol", true);
}

TEST(TransportFakePeer, CloseMidReplyIsClosed) { expectTypedFailures(Behaviour::CloseMidReply, "ClosedError", false); }

TEST(TransportFakePeer, AllowPolicyDecidesAnOutageWithinTheBound) {
  FakePeer peer(peerOptions(Behaviour::NeverAnswer));
  auto client = Client::create(peerClient(peer, kPeerTimeout));
  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Allow;
  RateLimiter limiter(client, "transport-allow", lo);
  bool granted = false;
  const Caught c = run([&] { granted = limiter.tryAcquire(); });
  EXPECT_EQ(c.kind, "none") << c.message;
  EXPECT_TRUE(granted);
  EXPECT_LT(c.ms, kAcquireBoundMs);
  EXPECT_GE(c.ms, kPeerTimeout.count() - 50) << "the peer never answers: the policy can only decide at the deadline";
  EXPECT_EQ(limiter.failureStats().allowed, 1u);
  EXPECT_TRUE(limiter.failureStats().degraded);
  EXPECT_TRUE(nothingPending(*client));
}

// ----- 2. TLS through the Client ---------------------------------------------------------------

std::vector<std::string> tlsServerArgs(const TlsCerts& c, bool authClients) {
  return {"--tls-port",         "auto",
          "--tls-cert-file",    c.serverCert,
          "--tls-key-file",     c.serverKey,
          "--tls-ca-cert-file", c.caFile,
          "--tls-auth-clients", authClients ? "yes" : "no"};
}

std::string tlsUri(const RedisServer& server, const std::string& query) {
  return "rediss://127.0.0.1:" + std::to_string(server.tlsPort()) + "?" + query;
}

TEST(TransportTls, PingAndALimiterOverTlsShareStateWithThePlainPort) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, false));
  auto tls = Client::fromUri(tlsUri(server, "cacert=" + certs.caFile));
  EXPECT_EQ(redlimit::detail::command(*tls, {"PING"}).str, "PONG");

  RateLimiter overTls(tls, "transport-tls");
  ASSERT_TRUE(overTls.trySetRate(RateType::Overall, 10, seconds(60)));
  EXPECT_TRUE(overTls.tryAcquire());
  EXPECT_TRUE(overTls.tryAcquire(2));
  EXPECT_EQ(overTls.availablePermits(), 7);

  auto plain = Client::fromUri(server.uri());
  RateLimiter overPlain(plain, "transport-tls");
  EXPECT_EQ(overPlain.availablePermits(), 7);
  const RateLimiterConfig expected{RateType::Overall, 10, seconds(60), milliseconds(0)};
  EXPECT_EQ(overPlain.getConfig(), expected);
  EXPECT_EQ(getInt(*plain, overTls.keys()[1]), 7);
  EXPECT_EQ(redlimit::detail::command(*plain, {"ZCARD", overTls.keys()[3]}).integer, 2) << "one member per grant";
  EXPECT_TRUE(overPlain.tryAcquire(7));
  EXPECT_EQ(overTls.availablePermits(), 0) << "a grant over the plain port is seen over TLS";
  EXPECT_EQ(tls->poolStats().discarded, 0u);
}

TEST(TransportTls, MutualTlsWithAClientCertificate) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, true));
  auto client = Client::fromUri(
      tlsUri(server, "cacert=" + certs.caFile + "&cert=" + certs.clientCert + "&key=" + certs.clientKey));
  EXPECT_EQ(redlimit::detail::command(*client, {"PING"}).str, "PONG");
  RateLimiter limiter(client, "transport-mtls");
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 5, seconds(60)));
  EXPECT_TRUE(limiter.tryAcquire());
  EXPECT_EQ(limiter.availablePermits(), 4);
  EXPECT_EQ(client->poolStats().discarded, 0u);
}

// Fails at 66de88c: when the greeting's write meets the refusal first, Transport::flush reads
// before closing and the read's ClosedError ("the server closed the TLS session") replaces the
// write's ConfigurationError (Tls); the Allow limiter then grants.
TEST(TransportTls, MissingClientCertificateIsATlsErrorEveryTimeAndNeverAllowed) {
  // A TLS 1.3 server refuses a missing client certificate after the client's handshake is done:
  // the greeting's write or its read meets the refusal, whichever comes first. Either way it is a
  // set-up error (ConfigurationError (Tls)), never an outage that a failure policy could decide. Fresh clients,
  // so that each try is a new connection and a new race.
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, true));
  const std::string uri = tlsUri(server, "cacert=" + certs.caFile);
  std::map<std::string, int> commandKinds, acquireKinds;
  std::string otherMessage;
  for (int i = 0; i < 20; ++i) {
    auto client = Client::fromUri(uri);
    const Caught c = run([&] { (void)redlimit::detail::command(*client, {"PING"}); });
    ++commandKinds[c.kind];
    if (c.kind != "ConfigurationError/Tls") otherMessage = c.message;
    RateLimiter::Options lo;
    lo.failure.policy = FailurePolicy::Allow;
    RateLimiter limiter(Client::fromUri(uri), "transport-mtls-allow", lo);
    bool granted = false;
    const Caught a = run([&] { granted = limiter.tryAcquire(); });
    ++acquireKinds[granted ? "granted by the Allow policy" : a.kind];
  }
  auto describe = [](const std::map<std::string, int>& kinds) {
    std::string out;
    for (const auto& [kind, n] : kinds) out += " " + kind + " x" + std::to_string(n);
    return out;
  };
  EXPECT_EQ(commandKinds["ConfigurationError/Tls"], 20) << describe(commandKinds) << "; e.g. " << otherMessage;
  EXPECT_EQ(acquireKinds["ConfigurationError/Tls"], 20) << describe(acquireKinds);
}

TEST(TransportTls, WrongCaIsATlsErrorThatNoFailurePolicyDecides) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, false));
  auto client = Client::fromUri(tlsUri(server, "cacert=" + certs.otherCaFile));
  const Caught c = run([&] { (void)redlimit::detail::command(*client, {"PING"}); });
  EXPECT_EQ(c.kind, "ConfigurationError/Tls") << c.message;
  EXPECT_TRUE(contains(c.message, "certificate verification failed")) << c.message;
  EXPECT_THROW((void)redlimit::detail::command(*client, {"PING"}), ConfigurationError);

  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Allow;
  RateLimiter limiter(client, "transport-wrong-ca", lo);
  for (int i = 0; i < 2; ++i) {
    const Caught a = run([&] { (void)limiter.tryAcquire(); });
    EXPECT_EQ(a.kind, "ConfigurationError/Tls") << "Allow must not decide a configuration error: " << a.message;
  }
  EXPECT_EQ(limiter.failureStats().allowed, 0u);
  EXPECT_TRUE(limiter.failureStats().misconfigured);
  EXPECT_TRUE(nothingPending(*client));
}

TEST(TransportTls, WrongHostnameIsATlsErrorNamingTheExpectedName) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, false));
  auto client = Client::fromUri(tlsUri(server, "cacert=" + certs.caFile + "&sni=wrong.example"));
  const Caught c = run([&] { (void)redlimit::detail::command(*client, {"PING"}); });
  EXPECT_EQ(c.kind, "ConfigurationError/Tls") << c.message;
  EXPECT_TRUE(contains(c.message, "wrong.example")) << c.message;
}

TEST(TransportTls, PlainClientOnTheTlsPortIsATlsPortErrorSayingRediss) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, false));
  auto client = Client::fromUri("redis://127.0.0.1:" + std::to_string(server.tlsPort()));
  const Caught c = run([&] { (void)redlimit::detail::command(*client, {"PING"}); });
  EXPECT_EQ(c.kind, "ConfigurationError/TlsPort") << c.message;
  EXPECT_TRUE(contains(c.message, "rediss://")) << c.message;

  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Deny;
  RateLimiter limiter(client, "transport-tls-port", lo);
  const Caught a = run([&] { (void)limiter.tryAcquire(); });
  EXPECT_EQ(a.kind, "ConfigurationError/TlsPort") << "Deny must not decide a configuration error: " << a.message;
}

TEST(TransportTls, ManyThreadsOverTwoTlsConnections) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server(tlsServerArgs(certs, false));
  ClientOptions base;
  base.pool.size = 2;
  base.connection.commandTimeout = milliseconds(2000);
  auto client = Client::fromUri(tlsUri(server, "cacert=" + certs.caFile), base);
  RateLimiter::Options oneByOne;  // this test is about the transport's pipelining, not coalescing
  oneByOne.coalesce = false;
  RateLimiter limiter(client, "transport-tls-threads", oneByOne);
  constexpr std::int64_t kRate = 1000;
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kRate, seconds(60)));
  Tally tally;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        try {
          tally.outcome(limiter.tryAcquire());
        } catch (...) {
          tally.error(std::current_exception());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(tally.total(), 1600);
  EXPECT_EQ(tally.errors.load(), 0) << tally.describe();
  EXPECT_EQ(tally.granted.load(), kRate) << tally.describe();
  auto plain = Client::fromUri(server.uri());
  EXPECT_EQ(redlimit::detail::command(*plain, {"ZCARD", limiter.keys()[3]}).integer, tally.granted.load());
  EXPECT_EQ(kRate - getInt(*plain, limiter.keys()[1]), tally.granted.load());
  const PoolStats s = client->poolStats();
  EXPECT_EQ(s.created, 2u) << "two TLS connections, never replaced";
  EXPECT_GT(s.requests, s.writes) << "requests of several threads left together";
  EXPECT_TRUE(nothingPending(*client));
}

// ----- tests on the shared redis-server ---------------------------------------------------------

class TransportTest : public RedisTest {};

// ----- 3. fork ----------------------------------------------------------------------------------

struct ForkReport {
  std::int64_t granted = 0;
  std::int64_t errors = 0;
  std::int64_t configOk = 0;  // 1 right, 0 wrong, -1 threw
};

TEST_F(TransportTest, ForkedChildNeverUsesItsParentsConnections) {
#if REDLIMIT_TEST_TSAN
  // ThreadSanitizer kills a child of a multi-threaded process that starts a thread (its
  // die_after_fork flag), and the child's Client must start its own I/O thread.
  // The tsan preset sets it (CMakePresets.json); this test is never skipped.
  const char* tsanOptions = std::getenv("TSAN_OPTIONS");
  ASSERT_TRUE(tsanOptions != nullptr && contains(tsanOptions, "die_after_fork=0"))
      << "under ThreadSanitizer, run with TSAN_OPTIONS=die_after_fork=0 (the tsan preset does)";
#endif
  ClientOptions o;
  o.pool.size = 2;
  auto client = newClient(o);
  RateLimiter limiter(client, name());
  constexpr std::int64_t kRate = 100000;
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kRate, seconds(60)));
  const RateLimiterConfig expected{RateType::Overall, kRate, seconds(60), milliseconds(0)};
  std::int64_t parentGranted = 0;
  for (int i = 0; i < 4; ++i) parentGranted += limiter.tryAcquire() ? 1 : 0;
  ASSERT_EQ(client->poolStats().open, 2u) << "both connections are open when the process forks";

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0) << std::strerror(errno);
  // The parent's other threads asleep first: see waitUntilOtherThreadsSleep (ThreadSanitizer).
  (void)waitUntilOtherThreadsSleep();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: redlimit calls only, no gtest; the report goes through the pipe.
    ::close(fds[0]);
    ForkReport r;
    for (int i = 0; i < 500; ++i) {
      try {
        r.granted += limiter.tryAcquire() ? 1 : 0;
      } catch (...) {
        ++r.errors;
      }
    }
    try {
      r.configOk = limiter.getConfig() == expected ? 1 : 0;
    } catch (...) {
      r.configOk = -1;
    }
    ::_exit(writeAll(fds[1], &r, sizeof r) ? 0 : 3);
  }
  ::close(fds[1]);
  ASSERT_GT(pid, 0) << std::strerror(errno);

  std::int64_t parentErrors = 0;
  for (int i = 0; i < 500; ++i) {
    try {
      parentGranted += limiter.tryAcquire() ? 1 : 0;
    } catch (const std::exception& e) {
      ++parentErrors;
      ADD_FAILURE() << "parent: " << e.what();
    }
  }
  const std::string bytes = readToEnd(fds[0]);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_EQ(bytes.size(), sizeof(ForkReport));
  ForkReport child;
  std::memcpy(&child, bytes.data(), sizeof child);

  EXPECT_EQ(child.errors, 0);
  EXPECT_EQ(child.configOk, 1) << "the child's getConfig got another request's reply, or threw";
  EXPECT_EQ(child.granted, 500);
  EXPECT_EQ(parentErrors, 0);
  EXPECT_EQ(parentGranted, 504);
  const std::int64_t members = raw({"ZCARD", limiter.keys()[3]}).integer;
  EXPECT_EQ(members, parentGranted + child.granted);
  EXPECT_EQ(kRate - getInt(admin(), limiter.keys()[1]), parentGranted + child.granted);
  // The parent's connections were left alone: no reconnect, nothing discarded, replies in step.
  EXPECT_EQ(limiter.getConfig(), expected);
  const PoolStats s = client->poolStats();
  EXPECT_EQ(s.created, 2u);
  EXPECT_EQ(s.discarded, 0u);
  EXPECT_EQ(s.open, 2u);
}

// ----- 4. pipelining while the server kills connections and flushes scripts ---------------------

// Fails at 66de88c: RateLimiter resends an acquire on ClosedError only while "spent + retryCost_
// <= callBound_", and callBound_ == retryCost_, so only closes noticed within 1 ms are resent.
TEST_F(TransportTest, PipeliningUnderClientKillAndScriptFlushLosesNothing) {
  ClientOptions o;
  o.pool.size = 2;
  // 16 threads' requests in flight through reconnects on a machine loaded by a sanitizer and other
  // tests: deadlines far from the 500 ms default, as this test checks that nothing is lost, not
  // timeouts (a resend on ClosedError needs another try to fit in the call's time bound).
  o.connection.connectTimeout = o.connection.commandTimeout = milliseconds(10000);
  auto client = newClient(o);
  RateLimiter limiter(client, name());
  constexpr std::int64_t kRate = 1000000;
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kRate, seconds(60)));

  std::atomic<bool> stop{false};
  std::atomic<int> kills{0}, flushes{0}, killed{0};
  std::string chaosError;
  std::thread chaos([&] {
    while (!stop.load()) {
      try {
        killed += static_cast<int>(
            redlimit::detail::command(admin(), {"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}).integer);
        ++kills;
        (void)redlimit::detail::command(admin(), {"SCRIPT", "FLUSH"});
        ++flushes;
      } catch (const std::exception& e) {
        chaosError = e.what();
        return;
      }
      std::this_thread::sleep_for(milliseconds(30));  // the pace of the faults, not a wait for them
    }
  });
  Tally tally;
  // How long the calls that ended with ClosedError had run: the limiter resends an acquire on
  // ClosedError only while another try fits in its time bound.
  std::mutex closedMutex;
  std::vector<std::int64_t> closedAfterUs;
  std::vector<std::thread> workers;
  const auto start = Clock::now();
  for (int t = 0; t < 16; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        const auto callStart = Clock::now();
        try {
          tally.outcome(limiter.tryAcquire());
        } catch (const ClosedError&) {
          tally.error(std::current_exception());
          const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - callStart).count();
          std::lock_guard<std::mutex> lock(closedMutex);
          closedAfterUs.push_back(us);
        } catch (...) {
          tally.error(std::current_exception());
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  const auto took = msSince(start);
  stop = true;
  chaos.join();
  std::printf("PIPELINE 16000 acquires in %lld ms, %d kills (%d connections), %d flushes: %s\n",
              static_cast<long long>(took), kills.load(), killed.load(), flushes.load(), tally.describe().c_str());

  EXPECT_EQ(chaosError, "") << "the admin connection must survive CLIENT KILL ... SKIPME yes";
  EXPECT_GT(kills.load(), 0);
  EXPECT_GT(killed.load(), 0) << "the faults must hit something";
  EXPECT_EQ(tally.total(), 16000);
  std::string closedTimes;
  for (const std::int64_t us : closedAfterUs) closedTimes += " " + std::to_string(us);
  EXPECT_EQ(tally.errors.load(), 0) << tally.describe()
                                    << "\nthe calls that ended with ClosedError ran for (us):" << closedTimes;
  const std::int64_t members = raw({"ZCARD", limiter.keys()[3]}).integer;
  EXPECT_EQ(members, tally.granted.load()) << "grants the callers saw vs members in Redis; " << tally.describe();
  EXPECT_EQ(kRate - getInt(admin(), limiter.keys()[1]), tally.granted.load());
  EXPECT_TRUE(nothingPending(*client)) << client->poolStats().pending;
  const PoolStats s = client->poolStats();
  EXPECT_GT(s.discarded, 0u) << "connections were killed under the limiter";
  EXPECT_GT(static_cast<double>(s.requests) / static_cast<double>(s.writes), 1.0)
      << s.requests << " requests in " << s.writes << " writes";
  EXPECT_EQ(admin().poolStats().discarded, 0u) << "the admin connection was never lost";
}

// ----- 5. asynchronous acquires ---------------------------------------------------------------

TEST_F(TransportTest, FiveThousandAsyncAcquiresFromOneThread) {
  // Deadlines far from the 500 ms default: 5000 requests in flight on a machine loaded by
  // ThreadSanitizer and other tests took one past it (a TimeoutError in CI's tsan suite, 3 tests
  // at a time). What this test checks is pipelining and the count, not timeouts.
  ClientOptions patient;
  patient.connection.connectTimeout = patient.connection.commandTimeout = milliseconds(10000);
  // Two connections, so that requests queue behind each other: on a connection found idle the
  // caller writes its request at once, alone, and with the default 8 connections one often is
  // (1.27 requests per write seen under load).
  patient.pool.size = 2;
  auto client = newClient(patient);
  // Every acquisition its own request: the transport pipelines them. Without the deny cache, which
  // answers locally the calls made after the first denial came back (how many depends on how fast
  // replies arrive while the loop still submits).
  RateLimiter::Options oneByOne;
  oneByOne.coalesce = false;
  oneByOne.denyCacheKeys = 0;
  RateLimiter limiter(client, name(), oneByOne);
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 3000, seconds(60)));
  const PoolStats before = client->poolStats();
  auto tally = std::make_shared<Tally>();
  for (int i = 0; i < 5000; ++i) {
    limiter.tryAcquireAsync(1, [tally](bool granted, const std::exception_ptr& error) {
      if (error) {
        tally->error(error);
      } else {
        tally->outcome(granted);
      }
    });
  }
  ASSERT_TRUE(waitFor([&] { return tally->total() == 5000; }, milliseconds(30000))) << tally->describe();
  EXPECT_EQ(tally->granted.load(), 3000) << tally->describe();
  EXPECT_EQ(tally->denied.load(), 2000) << tally->describe();
  EXPECT_EQ(tally->errors.load(), 0) << tally->describe();
  EXPECT_EQ(raw({"ZCARD", limiter.keys()[3]}).integer, 3000);
  EXPECT_TRUE(nothingPending(*client));
  const PoolStats after = client->poolStats();
  const std::uint64_t writes = after.writes - before.writes, requests = after.requests - before.requests;
  EXPECT_GE(requests, 5000u);
  // Pipelined: requests leave together. How many per write depends on how the caller and the I/O
  // thread are scheduled (about 4 on an idle machine, 3.97 seen under CI's load), so the bound is
  // two per write on average, which one-write-per-request would never meet.
  EXPECT_LT(writes, requests / 2) << requests << " requests in " << writes << " writes";
  std::printf("ASYNC 5000 acquires: %llu requests in %llu writes\n", static_cast<unsigned long long>(requests),
              static_cast<unsigned long long>(writes));
}

// A sync call on an idle connection is written by its caller (PoolStats::direct), but never past
// requests the same thread submitted before it for the same connection: over one connection, one
// thread alternating an async script call and a sync command leaves them in Redis in that order.
TEST_F(TransportTest, CallsOfOneThreadReachRedisInOrderWhetherWrittenByTheCallerOrTheIoThread) {
  ClientOptions one;
  one.pool.size = 1;
  const auto c = newClient(one);
  const std::string key = name("order");
  const std::string source = "return redis.call('RPUSH', KEYS[1], ARGV[1])";
  const std::string sha = raw({"SCRIPT", "LOAD", source}).str;
  const Script push{"push", sha, source};
  constexpr int kRounds = 300;
  std::atomic<int> failed{0};
  for (int i = 0; i < kRounds; ++i) {
    const std::string a = "a" + std::to_string(i), b = "s" + std::to_string(i);
    detail::evalAsync(*c, push, {key}, {a}, [&](const Reply&, const std::exception_ptr& e) {
      if (e) failed.fetch_add(1);
    });
    (void)detail::command(*c, {"RPUSH", key, b});
  }
  const Reply list = raw({"LRANGE", key, "0", "-1"});
  ASSERT_EQ(list.elements.size(), 2u * kRounds);
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(list.elements[2 * static_cast<std::size_t>(i)].str, "a" + std::to_string(i));
    ASSERT_EQ(list.elements[2 * static_cast<std::size_t>(i) + 1].str, "s" + std::to_string(i));
  }
  EXPECT_EQ(failed.load(), 0);
  // Sync calls alone, one after another: each finds its connection idle and writes itself.
  const auto before = c->poolStats();
  for (int i = 0; i < 50; ++i) (void)detail::command(*c, {"PING"});
  EXPECT_GE(c->poolStats().direct - before.direct, 40u);
}

// One thread's sync calls on idle connections: each is written and read by its caller
// (PoolStats::callerRead), the I/O thread never touching it, and each gets its own reply.
TEST_F(TransportTest, ASyncCallOnAnIdleConnectionIsWrittenAndReadByItsCaller) {
  const auto c = newClient();
  (void)detail::command(*c, {"PING"});  // opens a connection: that one waits for the I/O thread
  const PoolStats before = c->poolStats();
  const std::size_t pool = c->options().pool.size;
  constexpr std::size_t kCalls = 200;
  for (std::size_t i = 0; i < kCalls; ++i) {
    const std::string text = "echo-" + std::to_string(i);
    ASSERT_EQ(detail::command(*c, {"ECHO", text}).str, text);
  }
  const PoolStats after = c->poolStats();
  // Each other connection of the pool opens on its first turn: that call is handed to the I/O thread.
  EXPECT_GE(after.callerRead - before.callerRead, kCalls - (pool - 1));
  EXPECT_EQ(after.callerRead - before.callerRead, after.direct - before.direct)
      << "every call its caller wrote, its caller read";
  EXPECT_EQ(after.discarded, 0u);
  EXPECT_TRUE(nothingPending(*c));
}

// A connection the server closes just after answering its caller (QUIT: the reply, then the close)
// is closed by the I/O thread at once, though the close may reach this host while the caller still
// owns the connection: no later request is written on it to learn that.
TEST_F(TransportTest, AConnectionClosedByTheServerWhileItsCallerReadsIsDiscardedWithoutAnotherRequest) {
  ClientOptions o;
  o.pool.size = 1;
  o.connection.connectTimeout = o.connection.commandTimeout = seconds(10);
  const auto c = newClient(o);
  constexpr int kRounds = 100;
  std::uint64_t callerRead = 0;
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");  // open and idle: QUIT is its caller's round trip
    const PoolStats before = c->poolStats();
    ASSERT_EQ(detail::command(*c, {"QUIT"}).str, "OK");
    callerRead += c->poolStats().callerRead - before.callerRead;
    ASSERT_TRUE(waitFor([&] { return c->poolStats().discarded > before.discarded; }, milliseconds(5000)))
        << "round " << i << ": the closed connection was left open, for the next request to find";
  }
  EXPECT_GE(callerRead, std::uint64_t{kRounds} / 2) << "most QUITs were read by their caller";
  EXPECT_TRUE(nothingPending(*c));
}

// A RateLimiter's sync tryAcquire waits for an async request (SyncWait): on an idle connection its
// thread writes that request and reads the reply too, coalescing on or off.
TEST_F(TransportTest, ALimiterSyncCallWaitingForItsAsyncRequestReadsTheReplyItself) {
  const auto c = newClient();
  for (const bool coalesce : {false, true}) {
    SCOPED_TRACE(coalesce ? "coalesced" : "one by one");
    RateLimiter::Options options;
    options.coalesce = coalesce;
    RateLimiter limiter(c, name(coalesce ? "c" : "o"), options);
    ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 1000, seconds(60)));
    const auto pool = static_cast<std::int64_t>(c->options().pool.size);
    for (std::int64_t i = 0; i < pool; ++i) (void)limiter.tryAcquire();  // every connection open
    const PoolStats before = c->poolStats();
    constexpr int kCalls = 100;
    int granted = 0;
    for (int i = 0; i < kCalls; ++i) granted += limiter.tryAcquire() ? 1 : 0;
    const PoolStats after = c->poolStats();
    EXPECT_EQ(granted, kCalls);
    EXPECT_EQ(after.callerRead - before.callerRead, static_cast<std::uint64_t>(kCalls));
    EXPECT_EQ(raw({"ZCARD", limiter.keys()[3]}).integer, kCalls + pool);
  }
  EXPECT_TRUE(nothingPending(*c));
}

// A call whose deadline passes while its caller waits for the reply (the server runs a script
// longer than the deadline) ends with TimeoutError, not with the sync wait's fallback; the
// connection is closed, so the late reply is matched to nothing, and the next call gets its own.
TEST_F(TransportTest, ACallerWhoseDeadlinePassesWhileItReadsGetsTimeoutErrorAndTheNextCallItsOwnReply) {
  ClientOptions o;
  o.pool.size = 1;
  o.connection.commandTimeout = milliseconds(100);
  o.connection.connectTimeout = seconds(10);  // the next call's connection greets after the script
  const auto c = newClient(o);
  // Busy for 600 ms on the server's clock: longer than the deadline, whatever the machine's load.
  const std::string source =
      "local s = redis.call('TIME') local n = 0 repeat local t = redis.call('TIME') "
      "n = (t[1] - s[1]) * 1000000 + (t[2] - s[2]) until n >= 600000 return 'slow'";
  const std::string sha = raw({"SCRIPT", "LOAD", source}).str;
  const Script slow{"slow", sha, source};
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  const PoolStats before = c->poolStats();
  const Caught late = run([&] { (void)detail::eval(*c, slow, {}, {}); });
  const PoolStats after = c->poolStats();
  EXPECT_EQ(late.kind, "TimeoutError") << late.message;
  EXPECT_TRUE(contains(late.message, "no reply")) << late.message;
  EXPECT_FALSE(contains(late.message, "did not end the request")) << late.message;
  EXPECT_EQ(after.direct - before.direct, 1u) << "the caller wrote the script call itself";
  EXPECT_EQ(after.callerRead, before.callerRead) << "its reply never came to the caller";
  EXPECT_EQ(after.discarded - before.discarded, 1u) << "a written request that timed out closes its connection";
  // The next call waits for the script and for a new connection: a patient deadline.
  const auto next = detail::command(*c, {"ECHO", "next"}, Clock::now() + seconds(10));
  EXPECT_EQ(next.str, "next");
  EXPECT_EQ(detail::command(*c, {"ECHO", "again"}).str, "again");
  EXPECT_TRUE(nothingPending(*c));
}

TEST_F(TransportTest, HundredFuturesAllResolve) {
  RateLimiter limiter(client(), name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 50, seconds(60)));
  std::vector<std::future<bool>> futures;
  for (int i = 0; i < 100; ++i) futures.push_back(limiter.tryAcquireAsync());
  int granted = 0, resolved = 0;
  const auto end = Clock::now() + seconds(3);
  for (auto& f : futures) {
    if (f.wait_until(end) != std::future_status::ready) continue;
    ++resolved;
    granted += f.get() ? 1 : 0;
  }
  EXPECT_EQ(resolved, 100);
  EXPECT_EQ(granted, 50);
}

// ----- 6. shutdown with requests in flight ------------------------------------------------------

// Fails at 66de88c: each acquire in flight holds RateLimiter::Impl (shared_from_this), which holds
// the Client, so dropping the user's references destroys nothing until the requests end.
TEST(TransportShutdown, DroppingTheLastReferenceFailsEveryRequestInFlightAndJoins) {
  FakePeer peer(peerOptions(Behaviour::NeverAnswer));
  const std::size_t threadsBefore = threadCount();
  auto client = Client::create(peerClient(peer, milliseconds(10000)));
  std::weak_ptr<Client> weak = client;
  RateLimiter::Options oneByOne;  // all 1000 in flight on the connection (coalesced ones wait in the handle)
  oneByOne.coalesce = false;
  auto limiter = std::make_unique<RateLimiter>(client, "transport-shutdown", oneByOne);
  auto tally = std::make_shared<Tally>();
  for (int i = 0; i < 1000; ++i) {
    limiter->tryAcquireAsync(1, [tally](bool granted, const std::exception_ptr& error) {
      if (error) {
        tally->error(error);
      } else {
        tally->outcome(granted);
      }
    });
  }
  // Every request written and waiting for the peer, none answered.
  ASSERT_TRUE(waitFor([&] { return peer.requestsSeen() >= 1001; }, milliseconds(3000)))
      << peer.requestsSeen() << " requests reached the peer";
  ASSERT_EQ(tally->total(), 0) << tally->describe();

  const auto start = Clock::now();
  limiter.reset();
  client.reset();
  const auto destroyMs = msSince(start);
  EXPECT_LT(destroyMs, 2000);
  EXPECT_TRUE(weak.expired()) << "the Client outlived its last user reference (held by the requests in flight?)";
  const bool allDone = waitFor([&] { return tally->total() == 1000; }, milliseconds(2000));
  EXPECT_TRUE(allDone) << msSince(start) << " ms after the last reference was dropped: " << tally->describe();
  EXPECT_EQ(tally->errors.load(), tally->total()) << tally->describe();
  {
    std::lock_guard<std::mutex> lock(tally->m);
    EXPECT_EQ(tally->errorKinds["ClosedError"], 1000) << "every request fails with ClosedError";
  }
  EXPECT_TRUE(waitFor([&] { return threadCount() <= threadsBefore; }, milliseconds(weak.expired() ? 2000 : 200)))
      << threadCount() << " threads, " << threadsBefore << " before the Client: its I/O thread is still running";
  std::printf("SHUTDOWN destructor %lld ms, callbacks done after %lld ms: %s\n", static_cast<long long>(destroyMs),
              static_cast<long long>(msSince(start)), tally->describe().c_str());
}

TEST(TransportShutdown, DroppingTheClientFailsEveryEvalInFlightAndJoins) {
  // The same through Client::evalAsync alone: no limiter between the caller and the transport.
  FakePeer peer(peerOptions(Behaviour::NeverAnswer));
  const std::size_t threadsBefore = threadCount();
  auto client = Client::create(peerClient(peer, milliseconds(10000)));
  std::weak_ptr<Client> weak = client;
  static const Script kReturnOne{"transport-one", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "return 1"};
  auto tally = std::make_shared<Tally>();
  for (int i = 0; i < 1000; ++i) {
    redlimit::detail::evalAsync(*client, kReturnOne, {}, {}, [tally](const Reply&, const std::exception_ptr& error) {
      if (error) {
        tally->error(error);
      } else {
        tally->outcome(true);
      }
    });
  }
  ASSERT_TRUE(waitFor([&] { return peer.requestsSeen() >= 1001; }, milliseconds(3000)))
      << peer.requestsSeen() << " requests reached the peer";
  ASSERT_EQ(tally->total(), 0) << tally->describe();

  const auto start = Clock::now();
  client.reset();
  const auto destroyMs = msSince(start);
  EXPECT_LT(destroyMs, 2000);
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(tally->total(), 1000) << "the destructor returns after every completion ran: " << tally->describe();
  {
    std::lock_guard<std::mutex> lock(tally->m);
    EXPECT_EQ(tally->errorKinds["ClosedError"], 1000) << "every request fails with ClosedError";
  }
  EXPECT_TRUE(waitFor([&] { return threadCount() <= threadsBefore; }, milliseconds(2000)))
      << threadCount() << " threads, " << threadsBefore << " before the Client: its I/O thread is still running";
}

// ----- 7. sync calls from a completion --------------------------------------------------------

TEST_F(TransportTest, SyncCallFromACompletionThrowsInvalidArgument) {
  auto c = client();
  RateLimiter limiter(c, name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, 10, seconds(60)));
  struct Seen {
    bool granted = false;
    std::string acquireKind, acquireMessage, configKind, commandKind;
    bool onIoThread = false;
  };
  auto promise = std::make_shared<std::promise<Seen>>();
  RateLimiter* self = &limiter;
  limiter.tryAcquireAsync(1, [promise, self, c](bool granted, const std::exception_ptr& error) {
    Seen s;
    s.granted = granted && !error;
    s.onIoThread = c->onIoThread();
    const Caught a = run([&] { (void)self->tryAcquire(); });
    s.acquireKind = a.kind;
    s.acquireMessage = a.message;
    s.configKind = run([&] { (void)self->getConfig(); }).kind;
    s.commandKind = run([&] { (void)redlimit::detail::command(*c, {"PING"}); }).kind;
    promise->set_value(s);
  });
  auto future = promise->get_future();
  ASSERT_EQ(future.wait_for(seconds(3)), std::future_status::ready);
  const Seen s = future.get();
  EXPECT_TRUE(s.granted);
  EXPECT_TRUE(s.onIoThread);
  EXPECT_EQ(s.acquireKind, "InvalidArgument") << s.acquireMessage;
  EXPECT_TRUE(contains(s.acquireMessage, "tryAcquireAsync")) << s.acquireMessage;
  EXPECT_EQ(s.configKind, "InvalidArgument");
  EXPECT_EQ(s.commandKind, "InvalidArgument");
  EXPECT_EQ(limiter.availablePermits(), 9) << "only the async acquire took a permit";
}

// ----- 8. a whole-request deadline ------------------------------------------------------------

TEST(TransportDeadline, ATrickledReplyCannotStretchTheDeadline) {
  FakePeer::Options po = peerOptions(Behaviour::Trickle);
  po.trickleEvery = milliseconds(50);
  po.trickleReply = "$33\r\n" + std::string(33, 'r') + "\r\n";  // 40 bytes: about 2 s at one byte per 50 ms
  ASSERT_EQ(po.trickleReply.size(), 40u);
  FakePeer peer(po);
  constexpr milliseconds kTimeout{500};
  auto client = Client::create(peerClient(peer, kTimeout));

  const Caught first = run([&] { (void)redlimit::detail::command(*client, {"ECHO", "x"}); });
  EXPECT_EQ(first.kind, "TimeoutError") << first.message;
  EXPECT_GE(first.ms, kTimeout.count() - 20) << "ended before its deadline";
  EXPECT_LT(first.ms, kTimeout.count() + 1000) << "the reply kept trickling in, but the deadline is the request's";
  const std::size_t accepted = peer.connectionsAccepted();
  EXPECT_EQ(accepted, 1u);

  // The connection that was still receiving the old reply is gone: the next request goes on a new
  // one (and meets the trickle again), never taking the old reply for its own.
  const Caught second = run([&] { (void)redlimit::detail::command(*client, {"ECHO", "y"}); });
  EXPECT_EQ(second.kind, "TimeoutError") << second.message;
  EXPECT_LT(second.ms, kTimeout.count() + 1000);
  EXPECT_GT(peer.connectionsAccepted(), accepted);
  EXPECT_GE(client->poolStats().discarded, 2u);
  EXPECT_TRUE(nothingPending(*client));
}

}  // namespace

// ----- 9. a pool with connections still connecting --------------------------------------------

// Pool of 4: one connection reaches Redis, the name lookups of the other three hang (they connect
// until the connect timeout). Every request goes to the ready connection, and none fails. The old
// transport dealt the requests to the connections in turn and left them there: three in four
// waited for a connect that never finished and failed with it.
TEST(TransportPool, RequestsGoToAReadyConnectionWhileOthersAreStillConnecting) {
  RedisServer server;
  ScriptedResolver names({server.port(), 0});  // the first lookup answers, every later one hangs
  ClientOptions::Connection o;
  o.host = "redis.test";
  o.port = 6379;
  o.connectTimeout = seconds(5);
  ClientOptions::Pool pool;
  pool.size = 4;
  auto t = detail::Transport::start(o, pool, nullptr, {}, {}, names.resolver());
  constexpr int kCalls = 400;
  std::mutex m;
  std::condition_variable cv;
  int left = kCalls;
  std::vector<std::string> failures;
  for (int i = 0; i < kCalls; ++i) {
    const std::string_view argv[] = {"PING"};
    detail::Request r = detail::makeRequest(argv, 1);
    r.budget = seconds(60);
    r.deadline = Clock::now() + r.budget;
    r.done = [&](detail::Outcome out) {
      const std::lock_guard<std::mutex> lock(m);
      if (out.error) failures.push_back(messageOf(out.error));
      if (--left == 0) cv.notify_all();
    };
    t->submit(std::move(r));
  }
  {
    std::unique_lock<std::mutex> lock(m);
    // A bound for a hung test, never a measure: the requests' deadline is 60 s.
    ASSERT_TRUE(cv.wait_for(lock, seconds(90), [&] { return left == 0; })) << left << " of " << kCalls << " unanswered";
    EXPECT_TRUE(failures.empty()) << failures.size() << " of " << kCalls
                                  << " failed, the first with: " << failures.front();
  }
  t->shutdown();
}
