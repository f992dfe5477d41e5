// The redis layer against real servers: connect errors and timeouts, command timeouts, the pool
// (exhaustion, broken and idle connections), AUTH and ACL users, unix sockets, SELECT, and the
// script cache (NOSCRIPT after SCRIPT FLUSH or a restart). Only loopback addresses are used.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/connection.hpp"
#include "redlimit/connection_pool.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"
#include "redlimit_test/redis_server.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;
using SteadyTime = std::chrono::steady_clock;

namespace {

class ConnectionLayer : public RedisTest {
 protected:
  ConnectionOptions options() { return parseUri(server().uri()); }
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
  /// `threads` threads each take one permit at the same moment; returns how many succeeded.
  int acquireTogether(const std::shared_ptr<Client>& c, int threads) {
    std::atomic<int> ready{0}, granted{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        RateLimiter rl(c, name());
        ++ready;
        while (ready.load() < threads) std::this_thread::yield();
        try {
          if (rl.tryAcquire()) ++granted;
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      });
    }
    for (auto& th : pool) th.join();
    return granted.load();
  }
};

}  // namespace

TEST_F(ConnectionLayer, ClosedPortFailsFastWithIoErrorNotTimeout) {
  ConnectionOptions o = options();
  o.port = freeLoopbackPort();
  o.connectTimeout = milliseconds(800);
  const auto start = SteadyTime::now();
  try {
    Connection c(o);
    ADD_FAILURE() << "connected to a closed port";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "refused connection reported as a timeout: " << e.what();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(o.port)), std::string::npos) << e.what();
  }
  EXPECT_LT(msSince(start), 800);

  // Through a Client and a limiter: the same error, no retry loop.
  ClientOptions co;
  co.connection = o;
  auto c = Client::create(co);
  RateLimiter rl(c, name());
  EXPECT_THROW((void)rl.tryAcquire(), IoError);
  EXPECT_THROW((void)c->command({"PING"}), IoError);
  EXPECT_EQ(c->poolStats().open, 0u) << "a failed connect must not keep a pool slot";
}

TEST_F(ConnectionLayer, ConnectTimeoutOnAListenerThatNeverAccepts) {
  FullBacklog blackhole;
  ConnectionOptions o = options();
  o.port = blackhole.port();
  o.connectTimeout = milliseconds(200);
  const auto start = SteadyTime::now();
  EXPECT_THROW(Connection c(o), TimeoutError);
  const std::int64_t took = msSince(start);
  EXPECT_GE(took, 190);
  EXPECT_LT(took, 1000);
}

TEST_F(ConnectionLayer, CommandTimeoutThenTheNextCallGetsItsOwnReply) {
  ClientOptions co;
  co.connection.commandTimeout = milliseconds(100);
  auto c = newClient(co);
  ASSERT_EQ(c->command({"ECHO", "warm"}).str, "warm");

  ClientOptions patient;
  patient.connection.commandTimeout = milliseconds(3000);
  auto sleeper = newClient(patient);
  std::atomic<bool> slept{false};
  std::thread blocker([&] {
    (void)sleeper->command({"DEBUG", "SLEEP", "0.3"});
    slept = true;
  });
  sleepMs(50);  // DEBUG SLEEP is running: the server answers nobody for ~250 ms more
  const auto start = SteadyTime::now();
  EXPECT_THROW((void)c->command({"ECHO", "first"}), TimeoutError);
  const std::int64_t took = msSince(start);
  EXPECT_GE(took, 90);
  EXPECT_LT(took, 1000);
  blocker.join();
  ASSERT_TRUE(slept.load());
  // The late reply to "first" must not be read as the reply to "second".
  EXPECT_EQ(c->command({"ECHO", "second"}).str, "second");
  EXPECT_EQ(c->poolStats().discarded, 1u);
  EXPECT_EQ(c->poolStats().open, 1u);
}

TEST_F(ConnectionLayer, PoolTimeoutWhenEveryConnectionIsLeased) {
  ConnectionPool pool(options(), PoolOptions{2, milliseconds(100), milliseconds(30000)});
  auto first = pool.acquire();
  auto second = pool.acquire();
  const auto start = SteadyTime::now();
  try {
    auto third = pool.acquire();
    ADD_FAILURE() << "a third lease from a pool of two";
  } catch (const TimeoutError& e) {  // PoolTimeoutError is a TimeoutError
    EXPECT_NE(dynamic_cast<const PoolTimeoutError*>(&e), nullptr) << e.what();
  }
  const std::int64_t took = msSince(start);
  EXPECT_GE(took, 95);
  EXPECT_LT(took, 1000);
  EXPECT_EQ(pool.stats().waitTimeouts, 1u);
  EXPECT_EQ(pool.stats().open, 2u);

  // A waiter gets a connection as soon as one comes back.
  std::thread giver([lease = std::move(first)]() mutable {
    std::this_thread::sleep_for(milliseconds(30));
    (void)lease;  // returned when the thread ends
  });
  auto third = pool.acquire();
  giver.join();
  EXPECT_EQ(third->command({"PING"}).str, "PONG");
  EXPECT_EQ(pool.stats().created, 2u);
}

TEST_F(ConnectionLayer, PoolTimeoutThroughTheClient) {
  ClientOptions co;
  co.pool.size = 1;
  co.pool.waitTimeout = milliseconds(100);
  co.connection.commandTimeout = milliseconds(2000);
  auto c = newClient(co);
  std::thread holder([&] { (void)c->command({"BLPOP", name("never"), "0.4"}); });  // holds the only connection
  sleepMs(100);
  RateLimiter rl(c, name());
  EXPECT_THROW((void)rl.trySetRate(RateType::Overall, 1, milliseconds(1000)), PoolTimeoutError);
  EXPECT_THROW((void)rl.tryAcquire(), TimeoutError);
  holder.join();
  EXPECT_TRUE(rl.trySetRate(RateType::Overall, 1, milliseconds(1000)));
  EXPECT_TRUE(rl.tryAcquire());
  EXPECT_EQ(c->poolStats().waitTimeouts, 2u);
}

TEST_F(ConnectionLayer, KilledConnectionIsReplaced) {
  auto c = client();
  ASSERT_EQ(c->command({"PING"}).str, "PONG");
  ASSERT_GE(killOtherClients(), 1);
  // A plain command is not retried: it reports the closed connection, and the next one works.
  EXPECT_THROW((void)c->command({"PING"}), IoError);
  EXPECT_EQ(c->command({"PING"}).str, "PONG");
  EXPECT_EQ(c->poolStats().discarded, 1u);
  EXPECT_EQ(c->poolStats().open, 1u);
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
  EXPECT_EQ(client()->poolStats().discarded, 4u);
}

TEST_F(ConnectionLayer, IdleConnectionIsPingedOnCheckout) {
  ClientOptions co;
  co.pool.idlePingAfter = milliseconds(50);
  auto c = newClient(co);
  ASSERT_EQ(c->command({"ECHO", "a"}).str, "a");
  const std::int64_t pings = commandCalls(admin(), "ping");
  ASSERT_EQ(c->command({"ECHO", "b"}).str, "b");
  EXPECT_EQ(commandCalls(admin(), "ping"), pings) << "a connection used just now is not pinged";
  sleepMs(100);
  ASSERT_EQ(c->command({"ECHO", "c"}).str, "c");
  EXPECT_EQ(commandCalls(admin(), "ping"), pings + 1) << "an idle connection is pinged first";

  // Idle and closed by the server meanwhile: the PING finds out, and the call still succeeds.
  sleepMs(100);
  ASSERT_GE(killOtherClients(), 1);
  EXPECT_EQ(c->command({"ECHO", "d"}).str, "d");
  EXPECT_EQ(c->poolStats().discarded, 1u);
  EXPECT_EQ(c->poolStats().created, 2u);
}

TEST_F(ConnectionLayer, ServerRestartIsAnIoErrorThenWorksAgain) {
  RateLimiterOptions options;
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
  EXPECT_EQ(c->command({"PING"}).str, "PONG");
  RateLimiter rl(c, "auth-limiter");
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(5000)));
  EXPECT_TRUE(rl.tryAcquire(2));

  ClientOptions bad = good;
  bad.connection.password = "wrong";
  auto start = SteadyTime::now();
  EXPECT_THROW((void)Client::create(bad)->command({"PING"}), AuthError);
  EXPECT_LT(msSince(start), 1000);

  ClientOptions none = good;
  none.connection.password.clear();
  EXPECT_THROW((void)Client::create(none)->command({"PING"}), AuthError);  // NOAUTH

  (void)c->command({"ACL", "SETUSER", "alice", "on", ">secret", "~*", "&*", "+@all"});
  auto alice = Client::fromUri("redis://alice:secret@127.0.0.1:" + std::to_string(secured.port()));
  EXPECT_EQ(alice->command({"ACL", "WHOAMI"}).str, "alice");
  RateLimiter asAlice(alice, "auth-limiter");
  EXPECT_FALSE(asAlice.tryAcquire());
  EXPECT_EQ(asAlice.availablePermits(), 0);

  start = SteadyTime::now();
  EXPECT_THROW((void)Client::fromUri("redis://alice:nope@127.0.0.1:" + std::to_string(secured.port()))
                   ->command({"PING"}),
               AuthError);
  EXPECT_LT(msSince(start), 1000);

  // A user without the right to run scripts: NOPERM is an AuthError too.
  (void)c->command({"ACL", "SETUSER", "bob", "on", ">pw2", "~*", "+ping"});
  auto bob = Client::fromUri("redis://bob:pw2@127.0.0.1:" + std::to_string(secured.port()));
  EXPECT_EQ(bob->command({"PING"}).str, "PONG");
  EXPECT_THROW((void)RateLimiter(bob, "auth-limiter").tryAcquire(), AuthError);
}

TEST_F(Uri, UnixSocket) {
  auto c = Client::fromUri("unix://" + server().unixSocket());
  EXPECT_EQ(c->command({"PING"}).str, "PONG");
  const std::string info = c->command({"CLIENT", "INFO"}).str;
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
  EXPECT_EQ(db2->command({"EXISTS", name("db2")}).integer, 1);
  (void)db2->command({"DEL", name("db2")});
}

TEST_F(Uri, SelectDatabase) {
  auto db3 = Client::fromUri(server().uri() + "/3");
  RateLimiter rl(db3, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 4, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_TRUE(raw({"KEYS", "*" + name() + "*"}).elements.empty()) << "keys landed in db 0";
  EXPECT_EQ(db3->command({"KEYS", "*" + name() + "*"}).elements.size(), 3u);
  EXPECT_EQ(infoField(admin(), "keyspace", "db3").rfind("keys=3,", 0), 0u) << infoField(admin(), "keyspace", "db3");
  // Every pooled connection selects the db, not only the first.
  std::vector<std::thread> threads;
  std::atomic<int> inDb3{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      if (db3->command({"EXISTS", name()}).integer == 1) ++inDb3;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(inDb3.load(), 4);
  (void)db3->command({"DEL", rl.keys()[0], rl.keys()[1], rl.keys()[3]});
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

TEST_F(ScriptCache, ScriptFlushBetweenTwoAcquisitionsPoolOfFour) {
  ClientOptions co;
  co.pool.size = 4;
  co.pool.waitTimeout = milliseconds(5000);
  co.connection.commandTimeout = milliseconds(5000);
  auto c = newClient(co);
  RateLimiter rl(c, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 100, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  // Open all four connections: four overlapping BLPOPs need four of them.
  for (int round = 0; round < 20 && c->poolStats().created < 4; ++round) {
    std::vector<std::thread> holders;
    for (int t = 0; t < 4; ++t) holders.emplace_back([&] { (void)c->command({"BLPOP", name("never"), "0.1"}); });
    for (auto& th : holders) th.join();
  }
  ASSERT_EQ(c->poolStats().created, 4u);
  for (int flush = 0; flush < 3; ++flush) {
    SCOPED_TRACE(flush);
    (void)raw({"SCRIPT", "FLUSH"});
    ASSERT_FALSE(scriptLoaded());
    const std::string before = infoField(admin(), "errorstats", "errorstat_NOSCRIPT");
    EXPECT_EQ(acquireTogether(c, 4), 4);
    EXPECT_TRUE(scriptLoaded());
    EXPECT_NE(infoField(admin(), "errorstats", "errorstat_NOSCRIPT"), before) << "no NOSCRIPT was seen";
  }
  EXPECT_EQ(c->poolStats().created, 4u) << "NOSCRIPT did not cost a connection";
  EXPECT_EQ(c->poolStats().discarded, 0u);
  EXPECT_EQ(rl.availablePermits(), 100 - 13);
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 13) << "every grant recorded once";
}

namespace {

// rediss:// parses now, but this connection speaks plain text: it must not send AUTH in clear.
TEST_F(ConnectionLayer, TlsAskedForIsRefusedBeforeAnythingIsSent) {
  ConnectionOptions o = options();
  o.tls.enabled = true;
  o.password = "secret";
  try {
    Connection c(o);
    ADD_FAILURE() << "connected in plain text with TLS asked for";
  } catch (const TlsError& e) {
    EXPECT_EQ(e.code(), "TLS");
    EXPECT_NE(std::string(e.what()).find("nothing was sent"), std::string::npos) << e.what();
  }
}

}  // namespace
