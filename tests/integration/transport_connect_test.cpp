// The transport's connects under hostile peers: connecting never blocks the I/O thread, a request
// waiting for a connection ends at its own deadline, rediss:// to a plain port and verifyPeer are
// configuration errors, and a blocking callback is not taken for an outage. Loopback only: real
// redis-servers, fake peers that never answer, and listeners whose accept queue is full (a connect
// that never completes).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "transport/connector.hpp"
#include "transport/pipeline.hpp"
#include "redlimit/client.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fake_peer.hpp"
#include "redlimit_test/redis_server.hpp"
#include "redlimit_test/scripted_resolver.hpp"
#include "redlimit_test/stall_peers.hpp"
#include "redlimit_test/tls_certs.hpp"
#include "transport/transport.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

// A PING with its deadline `budget` from now.
detail::Request ping(milliseconds budget) {
  const std::string_view argv[] = {"PING"};
  detail::Request r = detail::makeRequest(argv, 1);
  r.deadline = Clock::now() + budget;
  r.budget = budget;
  return r;
}

}  // namespace

// Waits until `ready()` holds, checking every few ms; false if it still does not after `limit`
// (a bound for a hung test, never a measure).
template <class F>
bool eventually(F ready, milliseconds limit = milliseconds(10000)) {
  const auto giveUp = Clock::now() + limit;
  while (!ready()) {
    if (Clock::now() > giveUp) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// An async PING whose completion is kept until the test reads it.
struct Pending {
  std::mutex m;
  bool done = false;
  detail::Outcome outcome;
  [[nodiscard]] bool finished() {
    const std::lock_guard<std::mutex> lock(m);
    return done;
  }
  [[nodiscard]] std::exception_ptr error() {
    const std::lock_guard<std::mutex> lock(m);
    return outcome.error;
  }
};

std::shared_ptr<Pending> submitPing(detail::Transport& t, milliseconds budget) {
  auto p = std::make_shared<Pending>();
  detail::Request r = ping(budget);
  r.done = [p](detail::Outcome o) {
    const std::lock_guard<std::mutex> lock(p->m);
    p->outcome = std::move(o);
    p->done = true;
  };
  t.submit(std::move(r));
  return p;
}

// ----- Connecting never blocks the I/O thread ---------------------------------------------------

// Pool of 2: connection 0 reaches Redis through the peer, which then stops accepting, so
// connection 1's TCP connect hangs (30 s timeout). A PING on connection 0 must be answered while
// it hangs. The old transport connected on the I/O thread: the PING was written (by its caller)
// but its reply was not read until the connect gave up, so it timed out. The PING dealt to
// connection 1 is answered too: a request waits on a connect only when no connection is ready.
TEST(TransportConnect, AHungConnectDelaysNoRequestOnAnotherConnection) {
  RedisServer server;
  ForwardThenBlackhole gate(server.port(), 1);
  ClientOptions::Connection o;
  o.host = "127.0.0.1";
  o.port = gate.port();
  o.connectTimeout = milliseconds(30000);
  ClientOptions::Pool pool;
  pool.size = 2;
  auto t = detail::Transport::start(o, pool);
  const detail::Outcome first = t->call(ping(milliseconds(5000)));  // connection 0
  ASSERT_FALSE(first.error) << messageOf(first.error);
  ASSERT_TRUE(eventually([&] { return gate.blackholed(); }));
  const std::size_t waitingBefore = connectsWaitingFor(gate.port());
  auto second = submitPing(*t, milliseconds(60000));  // connection 1: its connect hangs
  ASSERT_TRUE(eventually([&] { return connectsWaitingFor(gate.port()) > waitingBefore; }));
  const detail::Outcome third = t->call(ping(milliseconds(5000)));  // connection 0 again
  EXPECT_FALSE(third.error) << messageOf(third.error);
  ASSERT_TRUE(eventually([&] { return second->finished(); }));
  EXPECT_FALSE(second->error()) << "connection 0 is ready: " << messageOf(second->error());
  EXPECT_GT(connectsWaitingFor(gate.port()), waitingBefore) << "connection 1 goes on connecting";
  t->shutdown();
}

// Pool of 4 towards a listener whose accept queue is full: the four connects run side by side
// (four sockets in SYN_SENT at once), and each request ends with a TimeoutError naming the
// connect. The old transport connected one after another: never more than one at a time.
TEST(TransportConnect, APoolConnectsToABlackholeSideBySide) {
  FullBacklog blackhole;
  ClientOptions::Connection o;
  o.host = "127.0.0.1";
  o.port = blackhole.port();
  o.connectTimeout = milliseconds(3000);
  ClientOptions::Pool pool;
  pool.size = 4;
  auto t = detail::Transport::start(o, pool);
  const std::size_t waitingBefore = connectsWaitingFor(blackhole.port());
  std::vector<std::shared_ptr<Pending>> pings;
  for (int i = 0; i < 4; ++i) pings.push_back(submitPing(*t, milliseconds(60000)));
  EXPECT_TRUE(eventually([&] { return connectsWaitingFor(blackhole.port()) >= waitingBefore + 4; }))
      << "connects in SYN_SENT: " << connectsWaitingFor(blackhole.port()) - waitingBefore << " of 4";
  for (auto& p : pings) {
    ASSERT_TRUE(eventually([&] { return p->finished(); }, milliseconds(30000)));
    const std::string message = messageOf(p->error());
    EXPECT_TRUE(detail::holds<TimeoutError>(p->error())) << message;
    EXPECT_TRUE(contains(message, "connect to 127.0.0.1:" + std::to_string(blackhole.port()))) << message;
    EXPECT_TRUE(contains(message, "timed out")) << message;
  }
  t->shutdown();
}

// A name lookup that never returns holds up only its own connection (what was dealt to it goes to
// the other, ready, one), and a request that waits on it (none is ready) ends at the connect
// timeout with an error that names the lookup (the old one blamed the I/O thread).
TEST(TransportConnect, AStalledNameLookupDelaysNoOtherConnectionAndIsNamed) {
  RedisServer server;
  ScriptedResolver names({server.port(), 0});  // connection 0 resolves, connection 1 stalls
  ClientOptions::Connection o;
  o.host = "redis.test";
  o.port = 6379;
  o.connectTimeout = milliseconds(300);
  ClientOptions::Pool pool;
  pool.size = 2;
  auto t = detail::Transport::start(o, pool, nullptr, {}, {}, names.resolver());
  const detail::Outcome first = t->call(ping(milliseconds(5000)));
  ASSERT_FALSE(first.error) << messageOf(first.error);
  auto second = submitPing(*t, milliseconds(60000));
  ASSERT_TRUE(eventually([&] { return names.inFlight() == 1; }));
  const detail::Outcome third = t->call(ping(milliseconds(5000)));
  EXPECT_FALSE(third.error) << messageOf(third.error);
  ASSERT_TRUE(eventually([&] { return second->finished(); }));
  EXPECT_FALSE(second->error()) << "connection 0 is ready: " << messageOf(second->error());

  ScriptedResolver stalled({0});
  pool.size = 1;
  auto alone = detail::Transport::start(o, pool, nullptr, {}, {}, stalled.resolver());
  const detail::Outcome waited = alone->call(ping(milliseconds(60000)));
  const std::string message = messageOf(waited.error);
  EXPECT_TRUE(detail::holds<TimeoutError>(waited.error)) << message;
  EXPECT_TRUE(contains(message, "name lookup of \"redis.test\"")) << message;
  EXPECT_TRUE(contains(message, "connect timeout (300 ms)")) << message;
  names.release();
  stalled.release();
  alone->shutdown();
  t->shutdown();
}

// A lookup that fails names the host; the next connect looks it up again.
TEST(TransportConnect, AFailedNameLookupIsAnIoErrorNamingTheHost) {
  ClientOptions::Connection o;
  o.host = "no-such-host.invalid";
  o.port = 6379;
  o.connectTimeout = milliseconds(5000);
  ClientOptions::Pool pool;
  pool.size = 1;
  ScriptedResolver names({0});
  names.release();  // every lookup ends at once without an answer
  auto t = detail::Transport::start(o, pool, nullptr, {}, {}, names.resolver());
  for (int i = 0; i < 2; ++i) {
    const detail::Outcome out = t->call(ping(milliseconds(5000)));
    const std::string message = messageOf(out.error);
    EXPECT_TRUE(detail::holds<IoError>(out.error) && !detail::holds<TimeoutError>(out.error)) << message;
    EXPECT_TRUE(contains(message, "no-such-host.invalid")) << message;
  }
  t->shutdown();
}

// A TLS peer that accepts and never sends a byte holds its connection in the handshake (and its
// plain-text probe, unanswered too); another connection of the pool goes on, and answers what
// was dealt to the one in its handshake.
TEST(TransportConnect, ASilentTlsHandshakeDelaysNoOtherConnection) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server({"--tls-port", "auto", "--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
                      "--tls-ca-cert-file", certs.caFile, "--tls-auth-clients", "no"});
  FakePeer::Options po;
  po.answerGreeting = false;
  FakePeer silent(po);
  ScriptedResolver names({server.tlsPort(), silent.port()});
  ClientOptions::Connection o;
  o.host = "redis.test";
  o.port = 6379;
  o.tls.enabled = true;
  o.tls.caFile = certs.caFile;
  o.tls.serverName = "localhost";
  o.connectTimeout = milliseconds(30000);
  ClientOptions::Pool pool;
  pool.size = 2;
  auto t = detail::Transport::start(o, pool, nullptr, {}, {}, names.resolver());
  const detail::Outcome first = t->call(ping(milliseconds(5000)));
  ASSERT_FALSE(first.error) << messageOf(first.error);
  auto second = submitPing(*t, milliseconds(60000));
  ASSERT_TRUE(eventually([&] { return silent.connectionsAccepted() >= 1; }));
  const detail::Outcome third = t->call(ping(milliseconds(5000)));
  EXPECT_FALSE(third.error) << messageOf(third.error);
  ASSERT_TRUE(eventually([&] { return second->finished(); }));
  EXPECT_FALSE(second->error()) << "connection 0 is ready: " << messageOf(second->error());
  t->shutdown();
}

// A peer that resets the first connection before any reply is asked whether it speaks TLS; it
// accepts the probe and stays silent. The probe runs beside the loop: connection 1 goes on (and
// takes what is dealt to connection 0 meanwhile), and the request that waited on the reset
// connection ends at its own deadline with the reset (ClosedError), not when the probe gives up
// (the old probe blocked the I/O thread until then).
TEST(TransportConnect, AResetThenSilentPortIsProbedWithoutBlocking) {
  RedisServer server;
  CloseThenSilent peer(1);
  ScriptedResolver names({peer.port(), server.port()});
  ClientOptions::Connection o;
  o.host = "redis.test";
  o.port = 6379;
  o.connectTimeout = milliseconds(30000);
  ClientOptions::Pool pool;
  pool.size = 2;
  auto t = detail::Transport::start(o, pool, nullptr, {}, {}, names.resolver());
  auto second = submitPing(*t, milliseconds(300));  // connection 0, to the peer: no connection is ready yet
  ASSERT_TRUE(eventually([&] { return peer.accepted() >= 2; })) << "the TLS-port probe connected";
  const detail::Outcome first = t->call(ping(milliseconds(5000)));  // connection 1, to Redis
  ASSERT_FALSE(first.error) << messageOf(first.error);
  const detail::Outcome third = t->call(ping(milliseconds(5000)));  // dealt to connection 0, probing
  EXPECT_FALSE(third.error) << messageOf(third.error);
  ASSERT_TRUE(eventually([&] { return second->finished(); }));
  EXPECT_TRUE(detail::holds<ClosedError>(second->error())) << messageOf(second->error());
  t->shutdown();
}

// ----- A request waiting for a connection ends at its own deadline -----------------------------

// The peer accepts and reads the greeting but never answers it: the connection stays in its
// greeting for the whole connect timeout (10 s). A request queued behind it has 100 ms: it must
// end then, naming the wait, and not when the greeting times out (the old code ended it only with
// the connection, so call() gave up first with "the I/O thread did not end the request").
TEST(TransportDeadline, AQueuedRequestEndsAtItsDeadlineWhileItsConnectionGreets) {
  FakePeer::Options po;
  po.answerGreeting = false;
  FakePeer peer(po);
  ClientOptions::Connection o;
  o.host = "127.0.0.1";
  o.port = peer.port();
  o.connectTimeout = milliseconds(10000);
  ClientOptions::Pool pool;
  pool.size = 1;
  auto t = detail::Transport::start(o, pool);
  for (int i = 0; i < 3; ++i) {
    const detail::Outcome out = t->call(ping(milliseconds(100)));
    ASSERT_TRUE(out.error != nullptr) << "the peer never answers";
    const std::string message = messageOf(out.error);
    EXPECT_TRUE(detail::holds<TimeoutError>(out.error)) << message;
    EXPECT_TRUE(contains(message, "waited for a connection")) << message;
    EXPECT_TRUE(contains(message, "greeting not answered")) << message;
  }
  EXPECT_LE(peer.connectionsAccepted(), 1u) << "one connection, still greeting, served all three waits";
  EXPECT_EQ(t->counters().pending, 0u);
  t->shutdown();
}

// ----- rediss:// to a plain-text port is a configuration error ---------------------------------

// A real redis-server's plain port with a rediss:// URI: the server reads the ClientHello as an
// unfinished inline command and never answers (or, when the hello's random bytes hold a '\n',
// answers an error). The old code ended the silent case with TimeoutError, an outage that Allow
// decided (fail open, for ever). Now the TLS client asks the port in plain text when nothing came
// back, finds RESP, and throws ConfigurationError (Tls) under every policy.
TEST(TransportTls, RedissToAPlainPortIsATlsErrorUnderEveryPolicy) {
  RedisServer server;
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Local}) {
    ClientOptions co;
    co.connection = parseUri("rediss://127.0.0.1:" + std::to_string(server.port()));
    // Long enough for the plain-text probe on a machine loaded by a sanitizer build (400 ms was
    // not, once, under ASan with three tests at a time): the test is about what is thrown.
    co.connection.connectTimeout = milliseconds(3000);
    co.connection.commandTimeout = milliseconds(3000);
    auto client = Client::create(co);
    RateLimiter::Options ro;
    ro.failure.policy = policy;
    RateLimiter rl(client, "rediss-to-plain", ro);
    for (int i = 0; i < 3; ++i) {  // new connections each time: both ways a plain port can answer
      try {
        (void)rl.tryAcquire();
        ADD_FAILURE() << "a call over TLS to a plain port was decided (policy " << static_cast<int>(policy) << ")";
      } catch (const ConfigurationError& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Tls) << e.what();
        EXPECT_TRUE(contains(e.what(), "plain-text port") || contains(e.what(), "did not answer in TLS")) << e.what();
      }
    }
    EXPECT_EQ(rl.failureStats().allowed, 0u);
    EXPECT_EQ(rl.failureStats().denied, 0u);
  }
}

// ----- verifyPeer = false is no advice, and does not silently drop a CA -------------------------

// A CA named together with verifyPeer = false would never be used: refused before connecting.
TEST(TransportTls, VerifyPeerOffWithACaIsRefusedBeforeConnecting) {
  FakePeer peer(FakePeer::Options{});
  for (const std::string query : {"cacert=/etc/ssl/ca.pem&verify=0", "capath=/etc/ssl/certs&verify=0"}) {
    SCOPED_TRACE(query);
    ClientOptions co;
    co.connection = parseUri("rediss://127.0.0.1:" + std::to_string(peer.port()) + "?" + query);
    try {
      (void)Client::create(co);
      ADD_FAILURE() << "a CA with verify=0 was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "verifyPeer is false")) << e.what();
      EXPECT_TRUE(contains(e.what(), "man in the middle")) << e.what();
    }
  }
  EXPECT_EQ(peer.connectionsAccepted(), 0u);
  ClientOptions plain;  // verify=0 alone, or a CA with verification, are accepted
  plain.connection = parseUri("rediss://127.0.0.1:" + std::to_string(peer.port()) + "?verify=0");
  EXPECT_NO_THROW((void)Client::create(plain));
  plain.connection = parseUri("rediss://127.0.0.1:" + std::to_string(peer.port()) + "?cacert=/etc/ssl/ca.pem");
  EXPECT_NO_THROW((void)Client::create(plain));
}

// An untrusted certificate names the CA to fix; it no longer recommends turning verification off.
TEST(TransportTls, CertificateErrorsDoNotRecommendVerifyPeerOff) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server({"--tls-port", "auto", "--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
                      "--tls-ca-cert-file", certs.caFile, "--tls-auth-clients", "no"});
  ClientOptions co;
  co.connection = parseUri("rediss://127.0.0.1:" + std::to_string(server.tlsPort()));
  co.connection.tls.caFile = certs.otherCaFile;
  co.connection.connectTimeout = milliseconds(2000);
  co.connection.commandTimeout = milliseconds(2000);
  RateLimiter::Options ro;
  ro.failure.policy = FailurePolicy::Allow;
  RateLimiter rl(Client::create(co), "untrusted-certificate", ro);
  try {
    (void)rl.tryAcquire();
    ADD_FAILURE() << "an untrusted certificate was accepted";
  } catch (const ConfigurationError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Tls) << e.what();
    EXPECT_TRUE(contains(e.what(), "certificate verification failed")) << e.what();
    EXPECT_TRUE(contains(e.what(), "point caFile/caPath at the CA that signed it")) << e.what();
    EXPECT_FALSE(contains(e.what(), "verifyPeer")) << e.what();
  }
}

// ----- A callback that blocks is its own cause, not a Redis outage ------------------------------

// A completion callback blocks the Client's I/O thread (it waits for the test). A call
// of another limiter made meanwhile cannot be sent (over TLS only the I/O thread writes) and
// reaches its deadline: it ends with TimeoutError (CallbackBlocked), the Deny policy decides it, and the
// limiter does not degrade (no Redis outage is counted). The Client reports the stall once, counts
// it, and the next call is decided by Redis. Before, the call ended with TimeoutError and the
// limiter degraded by "an outage" although Redis was fine.
TEST(Client, ABlockingCallbackIsItsOwnCauseNotAnOutage) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server({"--tls-port", "auto", "--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
                      "--tls-ca-cert-file", certs.caFile, "--tls-auth-clients", "no"});
  std::mutex m;
  std::vector<Event> events;
  ClientOptions co;
  co.connection = parseUri("rediss://127.0.0.1:" + std::to_string(server.tlsPort()));
  co.connection.tls.caFile = certs.caFile;
  co.connection.connectTimeout = milliseconds(2000);
  co.connection.commandTimeout = milliseconds(100);
  co.pool.size = 1;
  co.onEvent = [&](const Event& e) {
    const std::lock_guard<std::mutex> lock(m);
    events.push_back(e);
  };
  auto client = Client::create(co);
  RateLimiter::Options ro;
  ro.failure.policy = FailurePolicy::Deny;
  RateLimiter blocker(client, "blocking-callback:blocker", ro);
  RateLimiter other(client, "blocking-callback:other", ro);
  ASSERT_TRUE(blocker.trySetRate(RateType::Overall, 1000, std::chrono::seconds(60)));
  ASSERT_TRUE(other.trySetRate(RateType::Overall, 1000, std::chrono::seconds(60)));
  const PoolStats before = client->poolStats();

  std::atomic<bool> entered{false};
  std::atomic<bool> release{false};
  blocker.tryAcquireAsync(1, [&](bool, const std::exception_ptr&) {
    entered = true;
    // What a user's callback must not do: wait on something slow (here, the test).
    const auto giveUp = Clock::now() + milliseconds(10000);
    while (!release && Clock::now() < giveUp) std::this_thread::sleep_for(milliseconds(1));
  });
  ASSERT_TRUE(eventually([&] { return entered.load(); }));
  // This call's request waits in the queue for the blocked loop; the callback is let go only once
  // the call's deadline (a limiter call's bound: connectTimeout + commandTimeout) is well behind.
  auto decided = std::async(std::launch::async, [&] { return other.tryAcquire(); });
  ASSERT_TRUE(eventually([&] { return client->poolStats().pending >= 1; }));
  const auto deadlinePassed =
      Clock::now() + co.connection.connectTimeout + co.connection.commandTimeout + milliseconds(200);
  while (Clock::now() < deadlinePassed) std::this_thread::sleep_for(milliseconds(5));
  release = true;
  EXPECT_FALSE(decided.get()) << "Deny decides the call";
  EXPECT_EQ(other.failureStats().denied, 1u);
  EXPECT_EQ(other.failureStats().outages, 0u) << "a blocked callback is no Redis outage";
  EXPECT_FALSE(other.failureStats().degraded);
  ASSERT_TRUE(eventually([&] { return client->poolStats().stalls > before.stalls; }));
  EXPECT_GE(client->poolStats().stalled, before.stalled + 1);
  {
    const std::lock_guard<std::mutex> lock(m);
    std::size_t blocked = 0;
    for (const Event& e : events) {
      if (e.kind == Event::Kind::CallbackBlocked) {
        ++blocked;
        EXPECT_TRUE(contains(e.description, "completion callback held the I/O thread")) << e.description;
      }
      EXPECT_FALSE(e.kind == Event::Kind::Health && e.health.kind == HealthEvent::Kind::Degraded) << e.description;
    }
    EXPECT_EQ(blocked, 1u);
  }
  EXPECT_TRUE(other.tryAcquire()) << "Redis decides the next call";
}
