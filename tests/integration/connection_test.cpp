// The redis layer against real servers: connect errors and timeouts, command timeouts, the pool
// (exhaustion, broken and idle connections), AUTH and ACL users, unix sockets, SELECT, and the
// script cache (NOSCRIPT after SCRIPT FLUSH or a restart). Only loopback addresses are used.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"
#include "redlimit_test/redis_server.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

class ConnectionLayer : public RedisTest {
 protected:
  ClientOptions::Connection options() { return parseUri(server().uri()); }
  /// Runs CLIENT KILL TYPE normal from the admin client (which skips itself): every other
  /// client's connection is closed by the server.
  std::int64_t killOtherClients() { return raw({"CLIENT", "KILL", "TYPE", "normal"}).integer; }
};

class Auth : public RedisTest {};
class Uri : public RedisTest {};
class ScriptCache : public RedisTest {
 protected:
  bool scriptLoaded() {
    const Reply r = raw({"SCRIPT", "EXISTS", detail::lua::acquire.sha1});
    return r.elements.at(0).integer == 1;
  }
};

}  // namespace

TEST_F(ConnectionLayer, ClosedPortFailsFastWithIoErrorNotTimeout) {
  ClientOptions::Connection o = options();
  o.port = freeLoopbackPort();
  o.connectTimeout = milliseconds(10000);  // a refusal must not wait for it: far below, under any load
  const auto start = SteadyTime::now();
  try {
    ClientOptions direct;
    direct.connection = o;
    (void)detail::command(*Client::create(direct), {"PING"});
    ADD_FAILURE() << "connected to a closed port";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "refused connection reported as a timeout: " << e.what();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(o.port)), std::string::npos) << e.what();
  }
  EXPECT_LT(msSince(start), 5000);

  // Through a Client and a limiter: the same error, no retry loop.
  ClientOptions co;
  co.connection = o;
  auto c = Client::create(co);
  RateLimiter rl(c, name());
  EXPECT_THROW((void)rl.tryAcquire(), IoError);
  EXPECT_THROW((void)detail::command(*c, {"PING"}), IoError);
  EXPECT_EQ(c->poolStats().open, 0u) << "a failed connect must not keep a pool slot";
}

TEST_F(ConnectionLayer, ConnectTimeoutOnAListenerThatNeverAccepts) {
  FullBacklog blackhole;
  ClientOptions::Connection o = options();
  o.port = blackhole.port();
  o.connectTimeout = milliseconds(200);
  ClientOptions co;
  co.connection = o;
  auto c = Client::create(co);
  const auto start = SteadyTime::now();
  EXPECT_THROW((void)detail::command(*c, {"PING"}), TimeoutError);
  const std::int64_t took = msSince(start);
  EXPECT_GE(took, 190);
  EXPECT_LT(took, 1000);
}

TEST_F(ConnectionLayer, CommandTimeoutThenTheNextCallGetsItsOwnReply) {
  ClientOptions co;
  co.pool.size = 1;
  co.connection.commandTimeout = milliseconds(100);
  auto c = newClient(co);
  ASSERT_EQ(detail::command(*c, {"ECHO", "warm"}).str, "warm");

  ClientOptions patient;
  patient.connection.commandTimeout = milliseconds(3000);
  auto sleeper = newClient(patient);
  std::atomic<bool> slept{false};
  std::thread blocker([&] {
    (void)detail::command(*sleeper, {"DEBUG", "SLEEP", "0.3"});
    slept = true;
  });
  sleepMs(50);  // DEBUG SLEEP is running: the server answers nobody for ~250 ms more
  const auto start = SteadyTime::now();
  EXPECT_THROW((void)detail::command(*c, {"ECHO", "first"}), TimeoutError);
  const std::int64_t took = msSince(start);
  EXPECT_GE(took, 90);
  EXPECT_LT(took, 1000);
  blocker.join();
  ASSERT_TRUE(slept.load());
  // The late reply to "first" must not be read as the reply to "second".
  EXPECT_EQ(detail::command(*c, {"ECHO", "second"}).str, "second");
  EXPECT_EQ(c->poolStats().discarded, 1u);
  EXPECT_EQ(c->poolStats().open, 1u);
}

TEST_F(ConnectionLayer, MaxPendingRefusesMoreRequestsAtOnceWithPoolTimeoutError) {
  ClientOptions co;
  co.pool.size = 1;
  co.pool.maxPending = 2;
  co.connection.commandTimeout = milliseconds(2000);
  auto c = newClient(co);
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) holders.emplace_back([&] { (void)detail::command(*c, {"BLPOP", name("never"), "0.4"}); });
  const auto waitStart = SteadyTime::now();
  while (c->poolStats().pending < 2 && msSince(waitStart) < 2000) std::this_thread::yield();
  try {
    (void)detail::command(*c, {"PING"});
    ADD_FAILURE() << "a third request with maxPending 2";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PoolTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("maxPending"), std::string::npos) << e.what();
  }
  // Not after a wait: a request that waited for a free slot would have got PONG once a BLPOP ended.
  EXPECT_EQ(c->poolStats().rejected, 1u);

  // Through a limiter: the same error, and no degraded state (congestion in this process).
  RateLimiter rl(c, name());
  EXPECT_TRUE(test::throwsError<TimeoutError>(ErrorKind::PoolTimeout,
                                              [&] { (void)rl.trySetRate(RateType::Overall, 1, milliseconds(1000)); }));
  EXPECT_THROW((void)rl.tryAcquire(), TimeoutError);
  EXPECT_FALSE(rl.failureStats().degraded);
  for (auto& th : holders) th.join();
  EXPECT_TRUE(rl.trySetRate(RateType::Overall, 1, milliseconds(1000)));
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_EQ(c->poolStats().rejected, 3u);
  EXPECT_EQ(c->poolStats().pending, 0u);
}

TEST_F(ConnectionLayer, KilledConnectionIsReplaced) {
  ClientOptions co;
  co.pool.size = 1;
  auto c = newClient(co);
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  ASSERT_GE(killOtherClients(), 1);
  // A plain command is not retried: if it went out on the killed connection before the I/O thread
  // saw the close, it reports ClosedError; either way the next one works on a new connection.
  try {
    EXPECT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  } catch (const ClosedError&) {
  }
  EXPECT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  EXPECT_EQ(c->poolStats().discarded, 1u);
  EXPECT_EQ(c->poolStats().open, 1u);
}

// The I/O thread reads every open connection: one the server closes while idle is dropped at
// once, so no request is ever written to it.
TEST_F(ConnectionLayer, AnIdleConnectionTheServerClosesIsDroppedBeforeAnyRequestUsesIt) {
  ClientOptions co;
  co.pool.size = 1;
  auto c = newClient(co);
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  ASSERT_GE(killOtherClients(), 1);
  const auto start = SteadyTime::now();
  while (c->poolStats().open != 0 && msSince(start) < 2000) sleepMs(1);
  EXPECT_EQ(c->poolStats().open, 0u);
  EXPECT_EQ(detail::command(*c, {"ECHO", "x"}).str, "x");
  EXPECT_EQ(c->poolStats().created, 2u);
}

TEST_F(ConnectionLayer, LimiterRetriesOnceAfterTheServerClosedTheConnection) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());

  ASSERT_GE(killOtherClients(), 1);
  EXPECT_TRUE(rl.tryAcquire(2)) << "the acquire is resent on a new connection";
  EXPECT_EQ(raw({"GET", rl.keys()[1]}).str, "7") << "and takes its permits once";
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 2);

  ASSERT_GE(killOtherClients(), 1);
  EXPECT_EQ(rl.availablePermits(), 7);
  ASSERT_GE(killOtherClients(), 1);
  EXPECT_EQ(rl.getConfig().rate, 10);
  ASSERT_GE(killOtherClients(), 1);
  EXPECT_TRUE(rl.isExists());
  EXPECT_GE(client()->poolStats().discarded, 4u);
}

TEST_F(ConnectionLayer, ServerRestartIsAnIoErrorThenWorksAgain) {
  RateLimiter::Options options;
  options.failure.probeInterval = milliseconds(50);
  RateLimiter rl(client(), name(), options);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 3, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  server().kill();
  const auto start = SteadyTime::now();
  EXPECT_THROW((void)rl.tryAcquire(), IoError);
  EXPECT_LT(msSince(start), 1500);
  server().restart();
  try {
    (void)raw({"PING"});  // the admin client's connection died with the server
  } catch (const IoError&) {
  }
  // The failed call put the limiter in degraded mode: the next probe goes to Redis.
  sleepMs(60);
  // No persistence: the server came back empty, without our scripts.
  EXPECT_THROW((void)rl.tryAcquire(), NotInitializedError);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 3, milliseconds(5000)));
  EXPECT_TRUE(rl.tryAcquire(3));
  EXPECT_FALSE(rl.tryAcquire());
}

TEST_F(Auth, PasswordAndAclUser) {
  RedisServer secured({"--requirepass", "pw"});
  ClientOptions good;
  good.connection = parseUri(secured.uri());
  good.connection.password = "pw";
  auto c = Client::create(good);
  EXPECT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  RateLimiter rl(c, "auth-limiter");
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(5000)));
  EXPECT_TRUE(rl.tryAcquire(2));

  // Refused at once, not after a timeout: the timeouts are long, the bounds half of them.
  ClientOptions bad = good;
  bad.connection.password = "wrong";
  bad.connection.connectTimeout = bad.connection.commandTimeout = milliseconds(10000);
  auto start = SteadyTime::now();
  EXPECT_THROW((void)detail::command(*Client::create(bad), {"PING"}), AuthError);
  EXPECT_LT(msSince(start), 5000);

  ClientOptions none = good;
  none.connection.password.clear();
  EXPECT_THROW((void)detail::command(*Client::create(none), {"PING"}), AuthError);  // NOAUTH

  (void)detail::command(*c, {"ACL", "SETUSER", "alice", "on", ">secret", "~*", "&*", "+@all"});
  auto alice = Client::fromUri("redis://alice:secret@127.0.0.1:" + std::to_string(secured.port()));
  EXPECT_EQ(detail::command(*alice, {"ACL", "WHOAMI"}).str, "alice");
  RateLimiter asAlice(alice, "auth-limiter");
  EXPECT_FALSE(asAlice.tryAcquire());
  EXPECT_EQ(asAlice.availablePermits(), 0);

  start = SteadyTime::now();
  EXPECT_THROW((void)detail::command(
                   *Client::fromUri("redis://alice:nope@127.0.0.1:" + std::to_string(secured.port()), bad), {"PING"}),
               AuthError);
  EXPECT_LT(msSince(start), 5000);

  // A user that logs in but may not run scripts: the server runs no scripts for it, a
  // ConfigurationError, not a failed login (ErrorModel tests it under every policy).
  (void)detail::command(*c, {"ACL", "SETUSER", "bob", "on", ">pw2", "~*", "+ping"});
  auto bob = Client::fromUri("redis://bob:pw2@127.0.0.1:" + std::to_string(secured.port()));
  EXPECT_EQ(detail::command(*bob, {"PING"}).str, "PONG");
  EXPECT_THROW((void)RateLimiter(bob, "auth-limiter").tryAcquire(), ConfigurationError);
}

TEST_F(Uri, UnixSocket) {
  auto c = Client::fromUri("unix://" + server().unixSocket());
  EXPECT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  const std::string info = detail::command(*c, {"CLIENT", "INFO"}).str;
  EXPECT_NE(info.find("flags=U"), std::string::npos) << info;
  // The same limiter as over TCP.
  RateLimiter overUnix(c, name());
  RateLimiter overTcp(client(), name());
  ASSERT_TRUE(overUnix.trySetRate(RateType::Overall, 3, milliseconds(5000)));
  EXPECT_TRUE(overUnix.tryAcquire(2));
  EXPECT_EQ(overTcp.availablePermits(), 1);

  auto db2 = Client::fromUri("unix://" + server().unixSocket() + "?db=2");
  RateLimiter inDb2(db2, name("db2"));
  ASSERT_TRUE(inDb2.trySetRate(RateType::Overall, 3, milliseconds(5000)));
  EXPECT_FALSE(exists(admin(), name("db2")));
  EXPECT_EQ(detail::command(*db2, {"EXISTS", name("db2")}).integer, 1);
  (void)detail::command(*db2, {"DEL", name("db2")});
}

TEST_F(Uri, SelectDatabase) {
  auto db3 = Client::fromUri(server().uri() + "/3");
  RateLimiter rl(db3, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 4, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_TRUE(raw({"KEYS", "*" + name() + "*"}).elements.empty()) << "keys landed in db 0";
  EXPECT_EQ(detail::command(*db3, {"KEYS", "*" + name() + "*"}).elements.size(), 3u);
  EXPECT_EQ(infoField(admin(), "keyspace", "db3").rfind("keys=3,", 0), 0u) << infoField(admin(), "keyspace", "db3");
  // Every pooled connection selects the db, not only the first.
  std::vector<std::thread> threads;
  std::atomic<int> inDb3{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      if (detail::command(*db3, {"EXISTS", name()}).integer == 1) ++inDb3;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(inDb3.load(), 4);
  (void)detail::command(*db3, {"DEL", rl.keys()[0], rl.keys()[1], rl.keys()[3]});
}

TEST_F(ScriptCache, ScriptFlushBetweenTwoAcquisitionsPoolOfOne) {
  ClientOptions co;
  co.pool.size = 1;
  auto c = newClient(co);
  RateLimiter rl(c, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_TRUE(scriptLoaded());
  (void)raw({"SCRIPT", "FLUSH"});
  ASSERT_FALSE(scriptLoaded());
  const std::int64_t loads = commandCalls(admin(), "script|load");
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_EQ(commandCalls(admin(), "script|load"), loads + 1);
  EXPECT_TRUE(scriptLoaded());
  EXPECT_EQ(rl.availablePermits(), 3);
  EXPECT_EQ(c->poolStats().created, 1u) << "NOSCRIPT is handled on the same connection";
}

TEST_F(ScriptCache, ScriptFlushWithManyAcquiresInFlightLoadsOnceAndResendsThem) {
  ClientOptions co;
  co.pool.size = 2;
  co.connection.commandTimeout = milliseconds(5000);
  auto c = newClient(co);
  RateLimiter rl(c, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1000, milliseconds(60000)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_EQ(c->poolStats().created, 2u) << "trySetRate and tryAcquire went out on both connections";
  std::int64_t granted = 1;
  for (int flush = 0; flush < 3; ++flush) {
    SCOPED_TRACE(flush);
    (void)raw({"SCRIPT", "FLUSH"});
    ASSERT_FALSE(scriptLoaded());
    const std::int64_t loads = commandCalls(admin(), "script|load");
    const std::string before = infoField(admin(), "errorstats", "errorstat_NOSCRIPT");
    // 64 acquires in flight at once from one thread: they leave in a few writes, most meet NOSCRIPT.
    std::vector<std::future<bool>> inFlight;
    for (int i = 0; i < 64; ++i) inFlight.push_back(rl.tryAcquireAsync(1));
    for (auto& f : inFlight) granted += f.get() ? 1 : 0;
    EXPECT_TRUE(scriptLoaded());
    EXPECT_NE(infoField(admin(), "errorstats", "errorstat_NOSCRIPT"), before) << "no NOSCRIPT was seen";
    // Two scripts meet NOSCRIPT: acquire.lua (the first acquire on each connection goes alone) and
    // acquire_batch.lua (the others, coalesced).
    EXPECT_LE(commandCalls(admin(), "script|load"), loads + 4) << "at most one load per connection and script";
  }
  EXPECT_EQ(granted, 1 + 3 * 64);
  EXPECT_EQ(c->poolStats().created, 2u) << "NOSCRIPT did not cost a connection";
  EXPECT_EQ(c->poolStats().discarded, 0u);
  EXPECT_EQ(rl.availablePermits(), 1000 - granted);
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, granted) << "every grant recorded once";
}
