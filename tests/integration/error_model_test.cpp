// Issue 9, items 10, 12 and 14, against real redis-servers: durations that would overflow, unix
// socket paths over the OS limit, and error classification (script errors, ACL permissions, a
// missing password, replies of the wrong shape).
#include <cxxabi.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/connection.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;
using SteadyTime = std::chrono::steady_clock;

namespace {

std::int64_t msSince(SteadyTime::time_point t) {
  return std::chrono::duration_cast<milliseconds>(SteadyTime::now() - t).count();
}

std::string typeName(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : typeid(e).name();
  std::free(name);
  return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Runs `call`, expecting it to throw E; then runs `check` on it. Reports what happened otherwise
/// (returned, or the type and text of the exception it threw instead).
template <class E, class Call>
void expectThrow(Call&& call, const std::function<void(const E&)>& check = {}) {
  try {
    call();
    ADD_FAILURE() << "returned instead of throwing " << typeid(E).name();
  } catch (const E& e) {
    if (check) check(e);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeName(e) << ": " << e.what();
  }
}

/// Records health events (thread-safe).
struct Events {
  std::mutex mutex;
  std::vector<HealthEvent> seen;
  RateLimiterOptions options(FailurePolicy policy) {
    RateLimiterOptions o;
    o.failure.policy = policy;
    o.failure.probeInterval = milliseconds(50);
    o.failure.onHealthChange = [this](const HealthEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(e);
    };
    return o;
  }
  std::vector<HealthEvent> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return seen;
  }
};

const char* policyName(FailurePolicy p) {
  switch (p) {
    case FailurePolicy::Throw: return "Throw";
    case FailurePolicy::Allow: return "Allow";
    case FailurePolicy::Deny: return "Deny";
    case FailurePolicy::Local: return "Local";
  }
  return "?";
}

constexpr FailurePolicy kPolicies[] = {FailurePolicy::Throw, FailurePolicy::Allow, FailurePolicy::Deny,
                                       FailurePolicy::Local};

/// A temporary directory, removed with its content on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/redlimit-errors-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::shared_ptr<Client> clientOn(const std::string& uri, ClientOptions base = {}) {
  base.connection = parseUri(uri, base.connection);
  return Client::create(base);
}

class ErrorModel : public RedisTest {};

}  // namespace

// ---- Item 10: durations saturate or are refused; nothing overflows ----------------------------

TEST_F(ErrorModel, Item10_TryAcquireWithMaxTimeoutWaitsForThePermit) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, milliseconds(300)));
  ASSERT_TRUE(rl.tryAcquire());
  const auto start = SteadyTime::now();
  EXPECT_TRUE(rl.tryAcquire(1, milliseconds::max())) << "returned after " << msSince(start) << " ms";
  EXPECT_GE(msSince(start), 150) << "it had to wait for the window to pass";
  // The most negative timeout is one attempt, not an overflow.
  EXPECT_FALSE(rl.tryAcquire(1, milliseconds::min()));
}

TEST_F(ErrorModel, Item10_PoolWaitTimeoutMaxWaitsForAFreeConnection) {
  ClientOptions co;
  co.pool.size = 1;
  co.pool.waitTimeout = milliseconds::max();
  co.connection.commandTimeout = milliseconds(3000);
  auto c = newClient(co);
  ASSERT_EQ(c->command({"PING"}).str, "PONG");
  std::thread holder([&] { (void)c->command({"BLPOP", name("never"), "0.4"}); });  // holds the only connection
  const auto waitStart = SteadyTime::now();
  while (c->poolStats().idle != 0 && msSince(waitStart) < 2000) std::this_thread::yield();
  const auto start = SteadyTime::now();
  try {
    EXPECT_EQ(c->command({"ECHO", "after"}).str, "after");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "after " << msSince(start) << " ms: " << typeName(e) << ": " << e.what();
  }
  holder.join();
  EXPECT_EQ(c->poolStats().waitTimeouts, 0u);
}

TEST_F(ErrorModel, Item10_ConnectionTimeoutsAboveWhatPollTakesAreRefusedAtConstruction) {
  const milliseconds overLimit = kMaxConnectionTimeout + milliseconds(1);
  for (milliseconds huge : {overLimit, milliseconds::max()}) {
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(std::to_string(huge.count()) + (which == 0 ? " connectTimeout" : " commandTimeout"));
      ClientOptions co;
      co.connection = parseUri(server().uri());
      (which == 0 ? co.connection.connectTimeout : co.connection.commandTimeout) = huge;
      auto namesTheLimit = [](const InvalidArgument& e) {
        EXPECT_TRUE(contains(e.what(), "2147483647")) << e.what();
      };
      expectThrow<InvalidArgument>([&] { (void)Client::create(co); }, namesTheLimit);
      expectThrow<InvalidArgument>([&] { Connection conn(co.connection); }, namesTheLimit);
    }
  }
  ClientOptions longest;
  longest.connection = parseUri(server().uri());
  longest.connection.connectTimeout = kMaxConnectionTimeout;
  longest.connection.commandTimeout = kMaxConnectionTimeout;
  EXPECT_EQ(Client::create(longest)->command({"PING"}).str, "PONG");
}

TEST_F(ErrorModel, Item10_IdlePingAfterMaxNeverPings) {
  ClientOptions co;
  co.pool.idlePingAfter = milliseconds::max();
  auto c = newClient(co);
  ASSERT_EQ(c->command({"ECHO", "open"}).str, "open");
  const std::int64_t pings = commandCalls(admin(), "ping");
  sleepMs(20);
  ASSERT_EQ(c->command({"ECHO", "a"}).str, "a");
  ASSERT_EQ(c->command({"ECHO", "b"}).str, "b");
  EXPECT_EQ(commandCalls(admin(), "ping"), pings) << "idlePingAfter = max means never";
}

TEST_F(ErrorModel, Item10_ResendAfterAKilledConnectionWithMaxPoolWait) {
  ClientOptions co;
  co.pool.waitTimeout = milliseconds::max();
  auto c = newClient(co);
  RateLimiter rl(c, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_GE(raw({"CLIENT", "KILL", "TYPE", "normal"}).integer, 1);
  // The resend budget is pool wait + connect + command timeout: it must saturate, not wrap.
  try {
    EXPECT_TRUE(rl.tryAcquire());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not resent: " << typeName(e) << ": " << e.what();
  }
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 2);
}

TEST_F(ErrorModel, Item10_ExpireWithATtlRedisCannotHoldIsInvalidArgument) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  expectThrow<InvalidArgument>([&] { (void)rl.expire(milliseconds::max()); },
                               [](const InvalidArgument& e) { EXPECT_TRUE(contains(e.what(), "TTL")) << e.what(); });
  EXPECT_EQ(raw({"PTTL", name()}).integer, -1) << "nothing was sent";
  EXPECT_TRUE(rl.expire(RateLimiter::kMaxInterval));
  EXPECT_GT(raw({"PTTL", name()}).integer, 0);
  EXPECT_TRUE(rl.expireAt(std::chrono::system_clock::time_point::max()));
  EXPECT_GT(raw({"PTTL", name()}).integer, 0);
}

// ---- Item 12: a unix socket path over the OS limit is refused, not truncated -------------------

TEST_F(ErrorModel, Item12_UnixSocketPathOverTheOsLimitIsRefused) {
  TempDir dir;
  // A server on a path of 107 bytes, the longest the OS takes (sun_path holds 108 with the NUL)...
  std::string osLongest = dir.path() + "/";
  osLongest += std::string(sizeof(sockaddr_un::sun_path) - 1 - osLongest.size() - 5, 's') + ".sock";
  ASSERT_EQ(osLongest.size(), 107u);
  RedisServer other({"--unixsocket", osLongest, "--unixsocketperm", "700"});
  // ...reached through a link whose path has redlimit's limit, 106 bytes: that works.
  const std::string longest = dir.path() + "/" + std::string(kMaxUnixSocketPath - dir.path().size() - 1, 'l');
  ASSERT_EQ(longest.size(), kMaxUnixSocketPath);
  std::filesystem::create_symlink(osLongest, longest);
  ConnectionOptions exact;
  exact.unixSocket = longest;
  Connection conn(exact);
  EXPECT_EQ(conn.command({"PING"}).str, "PONG");

  // 107 bytes: hiredis copies them without a NUL into memory it does not clear, so the OS may read
  // a stray byte after them. 108: hiredis cuts it to the 107-byte path of the other server.
  auto namesTheLimit = [](const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), std::to_string(kMaxUnixSocketPath))) << e.what();
  };
  for (const std::string& tooLong : {osLongest, osLongest + "2"}) {
    SCOPED_TRACE(tooLong.size());
    ConnectionOptions o;
    o.unixSocket = tooLong;
    expectThrow<InvalidArgument>([&] { Connection c(o); }, namesTheLimit);
    ClientOptions co;
    co.connection = o;
    expectThrow<InvalidArgument>([&] { (void)Client::create(co); }, namesTheLimit);
    expectThrow<InvalidArgument>([&] { (void)Client::fromUri("unix://" + tooLong); }, namesTheLimit);
  }
}

// ---- Item 14: each error gets its type and a message that says what to do ---------------------

TEST_F(ErrorModel, Item14_WrongTypeInsideScriptIsScriptError) {
  const std::string key = name("list");
  (void)raw({"RPUSH", key, "a"});
  const std::string source = "return redis.call('INCR', KEYS[1])";
  const std::string sha = raw({"SCRIPT", "LOAD", source}).str;
  const Script incr{"incr", sha, source};
  expectThrow<ScriptError>([&] { (void)client()->eval(incr, {key}, {}); }, [](const ScriptError& e) {
    EXPECT_EQ(e.code(), "WRONGTYPE");
    EXPECT_TRUE(contains(e.what(), "WRONGTYPE")) << e.what();
  });
  EXPECT_EQ(client()->command({"PING"}).str, "PONG");

  // The server refusing to run the script keeps its own type, even when it says so from inside it.
  (void)raw({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
  (void)raw({"CONFIG", "SET", "maxmemory", "1"});
  const std::string writer = "return redis.call('SET', KEYS[1], 'x')";
  const std::string writerSha = raw({"SCRIPT", "LOAD", writer}).str;
  const Script set{"set", writerSha, writer};
  try {
    (void)client()->eval(set, {name("k")}, {});
    ADD_FAILURE() << "wrote over maxmemory";
  } catch (const ScriptError& e) {
    ADD_FAILURE() << "OOM is not a script failure: " << e.what();
  } catch (const ReplyError& e) {
    EXPECT_EQ(e.code(), "OOM");
  }
  (void)raw({"CONFIG", "SET", "maxmemory", "0"});
}

TEST_F(ErrorModel, Item14_NoPermIsAPermissionErrorThatSaysWhatToGrant) {
  RedisServer secured({"--requirepass", "pw"});
  const std::string at = "@127.0.0.1:" + std::to_string(secured.port());
  auto root = Client::fromUri("redis://:pw" + at);
  RateLimiter setup(root, "perm");
  ASSERT_TRUE(setup.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  (void)root->command({"ACL", "SETUSER", "bob", "on", ">pw2", "~*", "+ping"});
  (void)root->command({"ACL", "SETUSER", "carol", "on", ">pw3", "~*", "+@all", "-time", "-zadd"});
  (void)root->command({"ACL", "SETUSER", "dave", "on", ">pw4", "~other*", "+@all"});

  auto notAPasswordProblem = [](const NoPermissionError& e) {
    EXPECT_FALSE(contains(e.what(), "authentication failed")) << e.what();
    EXPECT_TRUE(contains(e.what(), "ACL SETUSER")) << "says what to grant: " << e.what();
  };
  RateLimiter bob(Client::fromUri("redis://bob:pw2" + at), "perm");
  expectThrow<NoPermissionError>([&] { (void)bob.tryAcquire(); }, [&](const NoPermissionError& e) {
    notAPasswordProblem(e);
    EXPECT_EQ(e.code(), "NOPERM");
    EXPECT_TRUE(contains(e.what(), "evalsha")) << "names the command: " << e.what();
    EXPECT_TRUE(contains(e.what(), "bob")) << "names the user: " << e.what();
  });
  // A command the script calls is not allowed: Redis says so from inside the script.
  RateLimiter carol(Client::fromUri("redis://carol:pw3" + at), "perm");
  expectThrow<NoPermissionError>([&] { (void)carol.tryAcquire(); }, notAPasswordProblem);
  // The limiter's keys are outside the user's key patterns.
  RateLimiter dave(Client::fromUri("redis://dave:pw4" + at), "perm");
  expectThrow<NoPermissionError>([&] { (void)dave.tryAcquire(); }, [&](const NoPermissionError& e) {
    notAPasswordProblem(e);
    EXPECT_TRUE(contains(e.what(), "keys")) << e.what();
  });
  // Under every policy: a missing permission is not an outage.
  Events events;
  RateLimiter bobAllowed(Client::fromUri("redis://bob:pw2" + at), "perm", events.options(FailurePolicy::Allow));
  expectThrow<NoPermissionError>([&] { (void)bobAllowed.tryAcquire(); });
}

TEST_F(ErrorModel, Item14_NoPasswordForARequirepassServerIsAnAuthErrorThatSaysToSetIt) {
  RedisServer secured({"--requirepass", "pw"});
  auto says = [](const AuthError& e) {
    EXPECT_TRUE(contains(e.what(), "ConnectionOptions::password")) << e.what();
  };
  // A limiter's EVALSHA has 13 arguments: Redis answers "Protocol error: unauthenticated
  // multibulk length" to more than 10 from an unauthenticated client, and closes the connection.
  for (FailurePolicy policy : kPolicies) {
    SCOPED_TRACE(policyName(policy));
    Events events;
    auto c = clientOn(secured.uri());
    RateLimiter rl(c, "nopass", events.options(policy));
    expectThrow<AuthError>([&] { (void)rl.tryAcquire(); }, says);
    EXPECT_EQ(c->poolStats().open, 0u) << "no unauthenticated connection stays in the pool";
  }
  // On a connection that was authenticated and is no longer (RESET): the server's protocol error
  // is an AuthError, and the connection it closes is not used again.
  ConnectionOptions o = parseUri("redis://:pw@127.0.0.1:" + std::to_string(secured.port()));
  Connection conn(o);
  ASSERT_EQ(conn.command({"RESET"}).str, "RESET");
  const std::vector<std::string_view> many = {"EVALSHA", "0123456789012345678901234567890123456789", "5", "a", "b",
                                              "c", "d", "e", "1", "2", "3"};
  expectThrow<AuthError>([&] { (void)conn.command(many); }, says);
  EXPECT_TRUE(conn.broken());
}

TEST_F(ErrorModel, Item14_ReplyOfTheWrongShapeIsUnexpectedReplyError) {
  const std::string key = name("list");
  (void)raw({"RPUSH", key, "a", "b"});
  expectThrow<UnexpectedReplyError>([&] { (void)client()->command({"LRANGE", key, "0", "-1"}).asInteger(); },
                                    [](const UnexpectedReplyError& e) {
                                      EXPECT_TRUE(contains(e.what(), "expected an integer")) << e.what();
                                      EXPECT_TRUE(contains(e.what(), "array of 2")) << e.what();
                                    });
  expectThrow<UnexpectedReplyError>([&] { (void)client()->command({"ECHO", "abc"}).asInteger(); },
                                    [](const UnexpectedReplyError& e) {
                                      EXPECT_TRUE(contains(e.what(), "\"abc\"")) << e.what();
                                    });
}
