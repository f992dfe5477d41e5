// Regressions of issue 29, "Defects found by trying to break the transport": one test (or a few)
// per item, named after it. Loopback only: real redis-servers, fake peers that never answer, and
// listeners whose accept queue is full (a connect that never completes).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "pipeline.hpp"
#include "redlimit/client.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fake_peer.hpp"
#include "redlimit_test/redis_server.hpp"
#include "redlimit_test/tls_certs.hpp"
#include "transport.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

std::string messageOf(const std::exception_ptr& e) {
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

// A PING with its deadline `budget` from now.
detail::Request ping(milliseconds budget) {
  const std::string_view argv[] = {"PING"};
  detail::Request r = detail::makeRequest(argv, 1);
  r.deadline = Clock::now() + budget;
  r.budget = budget;
  return r;
}

}  // namespace

// ----- 5. A request waiting for a connection ends at its own deadline --------------------------

// The peer accepts and reads the greeting but never answers it: the connection stays in its
// greeting for the whole connect timeout (10 s). A request queued behind it has 100 ms: it must
// end then, naming the wait, and not when the greeting times out (the old code ended it only with
// the connection, so call() gave up first with "the I/O thread did not end the request").
TEST(Defects29, Item5_QueuedRequestEndsAtItsDeadlineWhileItsConnectionGreets) {
  FakePeer::Options po;
  po.answerGreeting = false;
  FakePeer peer(po);
  ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = peer.port();
  o.connectTimeout = milliseconds(10000);
  PoolOptions pool;
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

// ----- 1. rediss:// to a plain-text port is a configuration error ------------------------------

// A real redis-server's plain port with a rediss:// URI: the server reads the ClientHello as an
// unfinished inline command and never answers (or, when the hello's random bytes hold a '\n',
// answers an error). The old code ended the silent case with TimeoutError, an outage that Allow
// decided (fail open, for ever). Now the TLS client asks the port in plain text when nothing came
// back, finds RESP, and throws TlsError under every policy.
TEST(Defects29, Item1_RedissToAPlainPortThrowsTlsErrorUnderAllow) {
  RedisServer server;
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Local}) {
    ClientOptions co;
    co.connection = parseUri("rediss://127.0.0.1:" + std::to_string(server.port()));
    co.connection.connectTimeout = milliseconds(400);
    co.connection.commandTimeout = milliseconds(400);
    auto client = Client::create(co);
    RateLimiterOptions ro;
    ro.failure.policy = policy;
    RateLimiter rl(client, "defects29:item1", ro);
    for (int i = 0; i < 3; ++i) {  // new connections each time: both ways a plain port can answer
      try {
        (void)rl.tryAcquire();
        ADD_FAILURE() << "a call over TLS to a plain port was decided (policy " << static_cast<int>(policy) << ")";
      } catch (const TlsError& e) {
        EXPECT_TRUE(contains(e.what(), "plain-text port") || contains(e.what(), "did not answer in TLS")) << e.what();
      }
    }
    EXPECT_EQ(rl.failureStats().allowed, 0u);
    EXPECT_EQ(rl.failureStats().denied, 0u);
  }
}

// ----- 10 (TLS). verifyPeer = false is no advice, and does not silently drop a CA -------------

// A CA named together with verifyPeer = false would never be used: refused before connecting.
TEST(Defects29, Item10_VerifyPeerOffWithACaIsRefusedBeforeConnecting) {
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
TEST(Defects29, Item10_CertificateErrorsDoNotRecommendVerifyPeerOff) {
  const TlsCerts certs = makeTlsCerts();
  RedisServer server({"--tls-port", "auto", "--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
                      "--tls-ca-cert-file", certs.caFile, "--tls-auth-clients", "no"});
  ClientOptions co;
  co.connection = parseUri("rediss://127.0.0.1:" + std::to_string(server.tlsPort()));
  co.connection.tls.caFile = certs.otherCaFile;
  co.connection.connectTimeout = milliseconds(2000);
  co.connection.commandTimeout = milliseconds(2000);
  RateLimiterOptions ro;
  ro.failure.policy = FailurePolicy::Allow;
  RateLimiter rl(Client::create(co), "defects29:item10", ro);
  try {
    (void)rl.tryAcquire();
    ADD_FAILURE() << "an untrusted certificate was accepted";
  } catch (const TlsError& e) {
    EXPECT_TRUE(contains(e.what(), "certificate verification failed")) << e.what();
    EXPECT_TRUE(contains(e.what(), "point caFile/caPath at the CA that signed it")) << e.what();
    EXPECT_FALSE(contains(e.what(), "verifyPeer")) << e.what();
  }
}
