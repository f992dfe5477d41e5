// The error model against real redis-servers: durations that would overflow,
// unix socket paths over the OS limit, error classification (script errors, ACL permissions, a
// missing password, replies of the wrong shape), and configuration errors that are not outages
// (a replica, a TLS port, no file descriptors left, a request over the server's limits).
#include <cxxabi.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/policy.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/no_free_descriptors.hpp"
#include "transport/runner.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

std::string typeName(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : typeid(e).name();
  std::free(name);
  return out;
}

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

/// The same, and the E's kind() is `kind`.
template <class E, class Call>
void expectThrow(ErrorKind kind, Call&& call, const std::function<void(const E&)>& check = {}) {
  expectThrow<E>(std::forward<Call>(call), [&](const E& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    if (check) check(e);
  });
}

/// Records health events (thread-safe).
struct Events {
  std::mutex mutex;
  std::vector<HealthEvent> seen;
  FailureOptions failure(FailurePolicy policy) {
    FailureOptions f;
    f.policy = policy;
    f.probeInterval = milliseconds(50);
    f.onHealthChange = [this](const HealthEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(e);
    };
    return f;
  }
  RateLimiter::Options options(FailurePolicy policy) {
    RateLimiter::Options o;
    o.failure = failure(policy);
    return o;
  }
  std::vector<HealthEvent> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return seen;
  }
};

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

/// Lowers this process's RLIMIT_NOFILE so that the next descriptor cannot be opened (EMFILE);
/// restores it on destruction.
/// UBSan (the asan preset) checks the dynamic type of an object on each member call; for a type
/// it has not cached yet it probes memory through a pipe(2), which fails while no descriptor is
/// left and reports a false "invalid vptr". The calls the library makes on the error while
/// descriptors are exhausted (what() through std::runtime_error and Error, typeid(e).name()) are
/// made once here first, so their checks hit the cache.
void warmVptrChecks(const std::shared_ptr<Client>& client) {
  // The library formats its messages with fmt, whose buffer is polymorphic: have UBSan check that
  // type once while descriptors are still free (its check needs one).
  EXPECT_THROW(RateLimiter(client, std::string(RateLimiter::kMaxNameLength + 1, 'n')), InvalidArgument);
  const ConfigurationError sample(ErrorKind::ResourceLimit, "EMFILE", "warm-up");
  const std::runtime_error& asRuntime = sample;
  const Error& asError = sample;
  const std::exception& asException = sample;
  EXPECT_NE(asRuntime.what(), nullptr);
  EXPECT_NE(asError.what(), nullptr);
  EXPECT_NE(typeid(asException).name(), nullptr);
  // The transport gives each caller its own copy of an error (copy constructors through every
  // base) and passes it as an exception_ptr: the same checks, once, here.
  const ConfigurationError& asConfiguration = sample;
  EXPECT_EQ(asConfiguration.code(), "EMFILE");
  const ConfigurationError copy(sample);  // NOLINT(performance-unnecessary-copy-initialization): the copy is the test
  EXPECT_EQ(copy.code(), "EMFILE");
  EXPECT_EQ(copy.kind(), ErrorKind::ResourceLimit);
  try {
    std::rethrow_exception(std::make_exception_ptr(sample));
  } catch (const ConfigurationError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ResourceLimit) << e.what();
    const std::exception_ptr again = std::make_exception_ptr(e);
    EXPECT_TRUE(again != nullptr);
  }
}

std::shared_ptr<Client> clientOn(const std::string& uri, ClientOptions base = {}) {
  base.connection = parseUri(uri, base.connection);
  return Client::create(base);
}

std::int64_t errorCount(Client& c, const std::string& code) {
  // errorstat_READONLY:count=3
  const std::string field = infoField(c, "errorstats", "errorstat_" + code);
  return field.empty() ? 0 : std::stoll(field.substr(field.find('=') + 1));
}

/// What a server did with the commands that run a script: EVALSHA, SCRIPT LOAD and EVAL it ran
/// (INFO commandstats; a NOSCRIPT answer counts as run), and the commands it refused, to the ACL
/// (errorstat_NOPERM) or as unknown (errorstat_ERR: renamed away; nothing else here fails so).
struct ScriptTraffic {
  std::int64_t evalsha = 0;
  std::int64_t scriptLoad = 0;
  std::int64_t eval = 0;
  std::int64_t refused = 0;
  bool operator==(const ScriptTraffic& o) const {
    return evalsha == o.evalsha && scriptLoad == o.scriptLoad && eval == o.eval && refused == o.refused;
  }
  ScriptTraffic operator-(const ScriptTraffic& o) const {
    return {evalsha - o.evalsha, scriptLoad - o.scriptLoad, eval - o.eval, refused - o.refused};
  }
  [[nodiscard]] ScriptTraffic times(std::int64_t n) const {
    return {evalsha * n, scriptLoad * n, eval * n, refused * n};
  }
};

std::ostream& operator<<(std::ostream& out, const ScriptTraffic& t) {
  return out << "{evalsha " << t.evalsha << ", script|load " << t.scriptLoad << ", eval " << t.eval << ", refused "
             << t.refused << "}";
}

ScriptTraffic scriptTraffic(Client& c) {
  return {commandCalls(c, "evalsha"), commandCalls(c, "script|load"), commandCalls(c, "eval"),
          errorCount(c, "NOPERM") + errorCount(c, "ERR")};
}

/// Script requests the transport(s) of `c` sent to a server remembered to run no scripts, as the
/// re-check of their interval (NoScriptsMemo).
std::uint64_t noScriptsRechecks(Client& c) { return detail::ClientAccess::runner(c).counters().noScriptsRechecks; }

class ErrorModel : public RedisTest {};

}  // namespace

// ---- Durations saturate or are refused; nothing overflows -------------------------------------

TEST_F(ErrorModel, TryAcquireWithMaxTimeoutWaitsForThePermit) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1, milliseconds(300)));
  ASSERT_TRUE(rl.tryAcquire());
  const auto start = SteadyTime::now();
  EXPECT_TRUE(rl.tryAcquire(1, milliseconds::max())) << "returned after " << msSince(start) << " ms";
  EXPECT_GE(msSince(start), 150) << "it had to wait for the window to pass";
  // The most negative timeout is one attempt, not an overflow.
  EXPECT_FALSE(rl.tryAcquire(1, milliseconds::min()));
}

// One multiplexed connection: a request queued behind a slow one waits for it (Redis answers a
// connection's requests in order) and still gets its own reply within its own deadline.
TEST_F(ErrorModel, ARequestBehindASlowOneOnTheSameConnectionGetsItsOwnReply) {
  ClientOptions co;
  co.pool.size = 1;
  co.connection.commandTimeout = milliseconds(3000);
  auto c = newClient(co);
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  std::thread holder([&] { EXPECT_TRUE(detail::command(*c, {"BLPOP", name("never"), "0.4"}).isNil()); });
  sleepMs(50);
  const auto start = SteadyTime::now();
  try {
    EXPECT_EQ(detail::command(*c, {"ECHO", "after"}).str, "after");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "after " << msSince(start) << " ms: " << typeName(e) << ": " << e.what();
  }
  holder.join();
  EXPECT_EQ(c->poolStats().rejected, 0u);
  EXPECT_EQ(c->poolStats().created, 1u);
}

TEST_F(ErrorModel, ConnectionTimeoutsAboveWhatPollTakesAreRefusedAtConstruction) {
  const milliseconds overLimit = kMaxConnectionTimeout + milliseconds(1);
  for (milliseconds huge : {overLimit, milliseconds::max()}) {
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(std::to_string(huge.count()) + (which == 0 ? " connectTimeout" : " commandTimeout"));
      ClientOptions co;
      co.connection = parseUri(server().uri());
      (which == 0 ? co.connection.connectTimeout : co.connection.commandTimeout) = huge;
      auto namesTheLimit = [](const InvalidArgument& e) { EXPECT_TRUE(contains(e.what(), "2147483647")) << e.what(); };
      expectThrow<InvalidArgument>([&] { (void)Client::create(co); }, namesTheLimit);
    }
  }
  ClientOptions longest;
  longest.connection = parseUri(server().uri());
  longest.connection.connectTimeout = kMaxConnectionTimeout;
  longest.connection.commandTimeout = kMaxConnectionTimeout;
  EXPECT_EQ(detail::command(*Client::create(longest), {"PING"}).str, "PONG");
}

TEST_F(ErrorModel, ResendAfterAKilledConnectionWithTheLongestTimeouts) {
  ClientOptions co;
  co.connection.connectTimeout = kMaxConnectionTimeout;
  co.connection.commandTimeout = kMaxConnectionTimeout;
  auto c = newClient(co);
  RateLimiter rl(c, name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  ASSERT_GE(raw({"CLIENT", "KILL", "TYPE", "normal"}).integer, 1);
  // The resend budget is connect + command timeout: it must not wrap.
  try {
    EXPECT_TRUE(rl.tryAcquire());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not resent: " << typeName(e) << ": " << e.what();
  }
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 2);
}

TEST_F(ErrorModel, ExpireWithATtlRedisCannotHoldIsInvalidArgument) {
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

// The first exchange of a new connection (PING here) is part of connecting: a stalled server
// costs the connect timeout, not the connect timeout and then the command timeout.
TEST_F(ErrorModel, ConnectTimeoutCoversTheFirstExchange) {
  ClientOptions patient;
  patient.connection.commandTimeout = milliseconds(3000);
  auto sleeper = newClient(patient);
  ASSERT_EQ(detail::command(*sleeper, {"PING"}).str, "PONG");
  std::thread blocker([&] { (void)detail::command(*sleeper, {"DEBUG", "SLEEP", "0.6"}); });
  sleepMs(50);  // the server answers nobody for ~550 ms more
  ClientOptions co;
  co.connection = parseUri(server().uri());
  co.connection.connectTimeout = milliseconds(150);
  co.connection.commandTimeout = milliseconds(3000);
  auto fresh = Client::create(co);
  const auto start = SteadyTime::now();
  expectThrow<TimeoutError>([&] { (void)detail::command(*fresh, {"ECHO", "x"}); });
  const std::int64_t took = msSince(start);
  blocker.join();
  EXPECT_GE(took, 140);
  EXPECT_LT(took, 450) << "the PING waited for the command timeout";
}

// ---- A unix socket path over the OS limit is refused, not truncated ----------------------------

TEST_F(ErrorModel, UnixSocketPathOverTheOsLimitIsRefused) {
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
  ClientOptions exact;
  exact.connection.unixSocket = longest;
  EXPECT_EQ(detail::command(*Client::create(exact), {"PING"}).str, "PONG");

  // 107 and 108 bytes are refused: kMaxUnixSocketPath keeps one byte of sun_path spare.
  auto namesTheLimit = [](const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), std::to_string(kMaxUnixSocketPath))) << e.what();
  };
  for (const std::string& tooLong : {osLongest, osLongest + "2"}) {
    SCOPED_TRACE(tooLong.size());
    ClientOptions::Connection o;
    o.unixSocket = tooLong;
    ClientOptions co;
    co.connection = o;
    expectThrow<InvalidArgument>([&] { (void)Client::create(co); }, namesTheLimit);
    expectThrow<InvalidArgument>([&] { (void)Client::fromUri("unix://" + tooLong); }, namesTheLimit);
  }
}

// ---- Each error gets its type and a message that says what to do ------------------------------

TEST_F(ErrorModel, WrongTypeInsideScriptIsScriptError) {
  const std::string key = name("list");
  (void)raw({"RPUSH", key, "a"});
  const std::string source = "return redis.call('INCR', KEYS[1])";
  const std::string sha = raw({"SCRIPT", "LOAD", source}).str;
  const Script incr{"incr", sha, source};
  expectThrow<ScriptError>([&] { (void)detail::eval(*client(), incr, {key}, {}); },
                           [](const ScriptError& e) {
                             EXPECT_EQ(e.code(), "WRONGTYPE");
                             EXPECT_TRUE(contains(e.what(), "WRONGTYPE")) << e.what();
                           });
  EXPECT_EQ(detail::command(*client(), {"PING"}).str, "PONG");

  // The server refusing to run the script keeps its own type, even when it says so from inside it.
  (void)raw({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
  (void)raw({"CONFIG", "SET", "maxmemory", "1"});
  const std::string writer = "return redis.call('SET', KEYS[1], 'x')";
  const std::string writerSha = raw({"SCRIPT", "LOAD", writer}).str;
  const Script set{"set", writerSha, writer};
  try {
    (void)detail::eval(*client(), set, {name("k")}, {});
    ADD_FAILURE() << "wrote over maxmemory";
  } catch (const ScriptError& e) {
    ADD_FAILURE() << "OOM is not a script failure: " << e.what();
  } catch (const ReplyError& e) {
    EXPECT_EQ(e.code(), "OOM");
  }
  (void)raw({"CONFIG", "SET", "maxmemory", "0"});
}

// A user that may run scripts but not a command inside them, or not on the limiter's keys: an
// AuthError (NoPermission) naming what to grant. (One that may not run scripts at all: see
// AnAclUserThatMayNotRunScriptsGetsAConfigurationErrorUnderEveryPolicy.)
TEST_F(ErrorModel, NoPermIsAPermissionErrorThatSaysWhatToGrant) {
  RedisServer secured({"--requirepass", "pw"});
  const std::string at = "@127.0.0.1:" + std::to_string(secured.port());
  auto root = Client::fromUri("redis://:pw" + at);
  RateLimiter setup(root, "perm");
  ASSERT_TRUE(setup.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  (void)detail::command(*root, {"ACL", "SETUSER", "carol", "on", ">pw3", "~*", "+@all", "-time", "-zadd"});
  (void)detail::command(*root, {"ACL", "SETUSER", "dave", "on", ">pw4", "~other*", "+@all"});

  auto notAPasswordProblem = [](const AuthError& e) {
    EXPECT_FALSE(contains(e.what(), "authentication failed")) << e.what();
    EXPECT_TRUE(contains(e.what(), "ACL SETUSER")) << "says what to grant: " << e.what();
  };
  // A command the script calls is not allowed: Redis says so from inside the script.
  RateLimiter carol(Client::fromUri("redis://carol:pw3" + at), "perm");
  expectThrow<AuthError>(
      ErrorKind::NoPermission, [&] { (void)carol.tryAcquire(); },
      [&](const AuthError& e) {
        notAPasswordProblem(e);
        EXPECT_TRUE(contains(e.what(), "carol")) << "names the user: " << e.what();
      });
  // The limiter's keys are outside the user's key patterns.
  RateLimiter dave(Client::fromUri("redis://dave:pw4" + at), "perm");
  expectThrow<AuthError>(
      ErrorKind::NoPermission, [&] { (void)dave.tryAcquire(); },
      [&](const AuthError& e) {
        notAPasswordProblem(e);
        EXPECT_EQ(e.code(), "NOPERM");
        EXPECT_TRUE(contains(e.what(), "keys")) << e.what();
      });
  // Under every policy: a missing permission is not an outage.
  for (FailurePolicy policy : kPolicies) {
    SCOPED_TRACE(failurePolicyName(policy));
    Events events;
    RateLimiter carolAllowed(Client::fromUri("redis://carol:pw3" + at), "perm", events.options(policy));
    expectThrow<AuthError>(ErrorKind::NoPermission, [&] { (void)carolAllowed.tryAcquire(); });
    RateLimiter daveAllowed(Client::fromUri("redis://dave:pw4" + at), "perm", events.options(policy));
    expectThrow<AuthError>(ErrorKind::NoPermission, [&] { (void)daveAllowed.tryAcquireAsync().get(); });
    EXPECT_EQ(carolAllowed.failureStats().allowed + carolAllowed.failureStats().denied, 0u);
    EXPECT_EQ(daveAllowed.failureStats().allowed + daveAllowed.failureStats().denied, 0u);
  }
}

TEST_F(ErrorModel, NoPasswordForARequirepassServerIsAnAuthErrorThatSaysToSetIt) {
  RedisServer secured({"--requirepass", "pw"});
  auto says = [](const AuthError& e) {
    EXPECT_TRUE(contains(e.what(), "ClientOptions::Connection::password")) << e.what();
  };
  // A limiter's EVALSHA has 13 arguments: Redis answers "Protocol error: unauthenticated
  // multibulk length" to more than 10 from an unauthenticated client, and closes the connection.
  for (FailurePolicy policy : kPolicies) {
    SCOPED_TRACE(failurePolicyName(policy));
    Events events;
    auto c = clientOn(secured.uri());
    RateLimiter rl(c, "nopass", events.options(policy));
    expectThrow<AuthError>([&] { (void)rl.tryAcquire(); }, says);
    EXPECT_EQ(c->poolStats().open, 0u) << "no unauthenticated connection stays in the pool";
  }
  // On a connection that was authenticated and is no longer (RESET): the server's protocol error
  // is an AuthError, and the connection it closes is not used again.
  ClientOptions authed;
  authed.connection = parseUri("redis://:pw@127.0.0.1:" + std::to_string(secured.port()));
  authed.pool.size = 1;
  auto c = Client::create(authed);
  ASSERT_EQ(detail::command(*c, {"RESET"}).str, "RESET");
  const std::vector<std::string_view> many = {
      "EVALSHA", "0123456789012345678901234567890123456789", "5", "a", "b", "c", "d", "e", "1", "2", "3"};
  expectThrow<AuthError>([&] { (void)detail::command(*c, many); }, says);
  EXPECT_EQ(detail::command(*c, {"PING"}).str, "PONG") << "a new connection authenticates again";
  EXPECT_EQ(c->poolStats().discarded, 1u) << "the closed connection is not used again";
}

// A request handed to the I/O thread just after its connection broke (the server refused a call
// and closes the connection) waits for the next connection: it never gets the refused call's
// error. The I/O thread is held in a completion callback meanwhile, so the request reaches it
// before it closes the broken connection.
TEST_F(ErrorModel, ARequestThatComesWhileItsConnectionBreaksGoesOnTheNextConnection) {
  RedisServer secured({"--requirepass", "pw"});
  ClientOptions authed;
  authed.connection = parseUri("redis://:pw@127.0.0.1:" + std::to_string(secured.port()));
  authed.connection.connectTimeout = authed.connection.commandTimeout = std::chrono::seconds(10);
  authed.pool.size = 1;
  auto c = Client::create(authed);
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");  // open: the calls below are their callers' round trips
  std::promise<void> entered, release;
  const std::shared_future<void> go = release.get_future().share();
  detail::commandAsync(*c, {"PING"}, [&entered, go](const Reply&, const std::exception_ptr&) {
    entered.set_value();
    go.wait();  // holds the I/O thread
  });
  entered.get_future().wait();
  ASSERT_EQ(detail::command(*c, {"RESET"}).str, "RESET");  // authenticated no longer
  const std::vector<std::string_view> many = {
      "EVALSHA", "0123456789012345678901234567890123456789", "5", "a", "b", "c", "d", "e", "1", "2", "3"};
  EXPECT_THROW((void)detail::command(*c, many), AuthError);  // refused: the server closes the connection
  std::future<std::string> next = std::async(std::launch::async, [&] {
    try {
      return detail::command(*c, {"PING"}).str;
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  });
  const bool handedOff = waitFor([&] { return c->poolStats().pending == 1; }, milliseconds(10000));
  release.set_value();
  ASSERT_TRUE(handedOff);
  EXPECT_EQ(next.get(), "PONG") << "sent on a new connection, which authenticates again";
  EXPECT_EQ(c->poolStats().discarded, 1u);
}

TEST_F(ErrorModel, ReplyOfTheWrongShapeIsUnexpectedReplyError) {
  const std::string key = name("list");
  (void)raw({"RPUSH", key, "a", "b"});
  expectThrow<ReplyError>(
      ErrorKind::UnexpectedReply,
      [&] {
        (void)detail::command(*client(), {"LRANGE", key, "0", "-1"}).asInteger();
      },
      [](const ReplyError& e) {
        EXPECT_TRUE(contains(e.what(), "expected an integer")) << e.what();
        EXPECT_TRUE(contains(e.what(), "array of 2")) << e.what();
      });
  expectThrow<ReplyError>(
      ErrorKind::UnexpectedReply,
      [&] {
        (void)detail::command(*client(), {"ECHO", "abc"}).asInteger();
      },
      [](const ReplyError& e) { EXPECT_TRUE(contains(e.what(), "\"abc\"")) << e.what(); });
}

// ---- Configuration errors are thrown under every policy and reported as such -------------------

TEST_F(ErrorModel, ReplicaIsAConfigurationErrorUnderEveryPolicyAndReportedOnce) {
  RedisServer primary;
  RedisServer replica({"--replicaof", "127.0.0.1", std::to_string(primary.port())});
  // WAIT blocks up to its own 5 s, and a loaded machine may answer slowly: the replica's refusal,
  // not a command timeout, is what this test is about.
  ClientOptions patient;
  patient.connection.commandTimeout = std::chrono::seconds(10);
  auto onPrimary = clientOn(primary.uri(), patient);
  auto onReplica = clientOn(replica.uri(), patient);
  const auto syncStart = SteadyTime::now();
  while (infoField(*onReplica, "replication", "master_link_status") != "up" && msSince(syncStart) < 10000) sleepMs(20);
  ASSERT_EQ(infoField(*onReplica, "replication", "master_link_status"), "up");
  RateLimiter setup(onPrimary, "replicated");
  ASSERT_TRUE(setup.trySetRate(RateType::Overall, 100, milliseconds(60000)));
  ASSERT_EQ(detail::command(*onPrimary, {"WAIT", "1", "5000"}).integer, 1);

  for (FailurePolicy policy : kPolicies) {
    SCOPED_TRACE(failurePolicyName(policy));
    Events events;
    RateLimiter rl(onReplica, "replicated", events.options(policy));
    const std::int64_t before = errorCount(*onReplica, "READONLY");
    // Back to back, within one probe interval: an outage gate would let only one call through.
    for (int i = 0; i < 4; ++i) {
      expectThrow<ConfigurationError>(
          ErrorKind::Replica, [&] { (void)rl.tryAcquire(); },
          [](const ConfigurationError& e) {
            EXPECT_EQ(e.code(), "READONLY");
            EXPECT_TRUE(contains(e.what(), "replica")) << e.what();
          });
    }
    EXPECT_EQ(errorCount(*onReplica, "READONLY"), before + 4) << "every call asked Redis: no probe gating";
    const FailureStats stats = rl.failureStats();
    EXPECT_EQ(stats.allowed + stats.denied, 0u) << "no decision by the policy";
    EXPECT_EQ(stats.outages, 0u);
    EXPECT_EQ(stats.misconfigurations, 1u);
    EXPECT_TRUE(stats.misconfigured);
    const std::vector<HealthEvent> seen = events.get();
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].kind, HealthEvent::Kind::Degraded);
    EXPECT_EQ(seen[0].cause, HealthEvent::Cause::Configuration);
    EXPECT_EQ(seen[0].errorType, "redlimit::ConfigurationError");
    EXPECT_EQ(seen[0].errorKind, ErrorKind::Replica);
    EXPECT_TRUE(contains(seen[0].error, "READONLY")) << seen[0].error;
    ASSERT_TRUE(seen[0].exception);
    expectThrow<ConfigurationError>(ErrorKind::Replica, [&] { std::rethrow_exception(seen[0].exception); });
  }

  // Promoted: the next call works and reports the recovery, with its cause.
  Events events;
  RateLimiter rl(onReplica, "replicated", events.options(FailurePolicy::Allow));
  expectThrow<ConfigurationError>(ErrorKind::Replica, [&] { (void)rl.tryAcquire(); });
  (void)detail::command(*onReplica, {"REPLICAOF", "NO", "ONE"});
  EXPECT_TRUE(rl.tryAcquire());
  const std::vector<HealthEvent> seen = events.get();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].kind, HealthEvent::Kind::Recovered);
  EXPECT_EQ(seen[1].cause, HealthEvent::Cause::Configuration);
  EXPECT_FALSE(rl.failureStats().misconfigured);
}

TEST_F(ErrorModel, TlsPortIsAConfigurationError) {
  TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const std::string make = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " + key +
                           " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const int tlsPort = freeLoopbackPort();
  RedisServer tls({"--tls-port", std::to_string(tlsPort), "--tls-cert-file", cert, "--tls-key-file", key,
                   "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"});
  for (FailurePolicy policy : kPolicies) {
    SCOPED_TRACE(failurePolicyName(policy));
    Events events;
    auto c = clientOn("redis://127.0.0.1:" + std::to_string(tlsPort));
    RateLimiter rl(c, "tls", events.options(policy));
    for (int i = 0; i < 2; ++i) {
      expectThrow<ConfigurationError>(
          ErrorKind::TlsPort, [&] { (void)rl.tryAcquire(); },
          [&](const ConfigurationError& e) {
            EXPECT_TRUE(contains(e.what(), "TLS")) << e.what();
            EXPECT_TRUE(contains(e.what(), std::to_string(tlsPort))) << e.what();
          });
    }
    const std::vector<HealthEvent> seen = events.get();
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].cause, HealthEvent::Cause::Configuration);
    EXPECT_EQ(seen[0].errorType, "redlimit::ConfigurationError");
    EXPECT_EQ(seen[0].errorKind, ErrorKind::TlsPort);
  }
  // The plain port of the same server works.
  RateLimiter plain(clientOn(tls.uri()), "tls");
  EXPECT_TRUE(plain.trySetRate(RateType::Overall, 1, milliseconds(1000)));
}

TEST_F(ErrorModel, OutOfFileDescriptorsIsAConfigurationError) {
  for (FailurePolicy policy : kPolicies) {
    SCOPED_TRACE(failurePolicyName(policy));
    Events events;
    auto c = newClient();
    RateLimiter rl(c, name(), events.options(policy));
    warmVptrChecks(c);
    {
      // The whole acquire path once (its shared states, callbacks and the transport's objects),
      // and a failed connect, so that UBSan's first check of each of their types has a descriptor.
      RateLimiter warm(newClient(), name("warm"));  // another client: `c` must still have to connect
      (void)warm.trySetRate(RateType::Overall, 5, milliseconds(5000));
      EXPECT_TRUE(warm.tryAcquire());
      ClientOptions closed;
      closed.connection.port = freeLoopbackPort();
      EXPECT_THROW((void)RateLimiter(Client::create(closed), name("closed")).tryAcquire(), IoError);
      (void)raw({"DEL", warm.keys()[0], warm.keys()[1], warm.keys()[3]});
    }
    std::exception_ptr thrown;
    bool returned = false;
    {
      // Nothing but the call while no descriptor is left: the checks come after.
      NoFreeDescriptors exhausted;
      try {
        (void)rl.tryAcquire();
        returned = true;
      } catch (...) {
        thrown = std::current_exception();
      }
    }
    EXPECT_FALSE(returned) << "decided by the policy";
    expectThrow<ConfigurationError>(
        ErrorKind::ResourceLimit, [&] { std::rethrow_exception(thrown); },
        [](const ConfigurationError& e) {
          EXPECT_EQ(e.code(), "EMFILE");
          EXPECT_TRUE(contains(e.what(), "RLIMIT_NOFILE")) << e.what();
        });
    EXPECT_EQ(rl.failureStats().allowed + rl.failureStats().denied, 0u);
    // Descriptors free again: the next call works and the recovery is reported.
    EXPECT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000)));
    EXPECT_TRUE(rl.tryAcquire());
    const std::vector<HealthEvent> seen = events.get();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0].cause, HealthEvent::Cause::Configuration);
    EXPECT_EQ(seen[0].errorType, "redlimit::ConfigurationError");
    EXPECT_EQ(seen[0].errorKind, ErrorKind::ResourceLimit);
    EXPECT_EQ(seen[1].kind, HealthEvent::Kind::Recovered);
    (void)raw({"DEL", rl.keys()[0], rl.keys()[1], rl.keys()[3]});
  }
}

TEST_F(ErrorModel, RequestOverTheServersLimitsIsAConfigurationError) {
  RedisServer limited({"--proto-max-bulk-len", "1mb"});
  auto c = clientOn(limited.uri());
  ASSERT_EQ(detail::command(*c, {"PING"}).str, "PONG");
  // 2 MiB fit in the socket buffers: the server reads the header, answers "invalid bulk length" and
  // closes. 16 MiB do not: the write fails with a reset, and the answer is read from the socket.
  for (std::size_t size : {std::size_t{2} << 20, std::size_t{16} << 20}) {
    SCOPED_TRACE(size);
    const std::string big(size, 'x');
    expectThrow<ConfigurationError>(
        ErrorKind::RequestLimit,
        [&] {
          (void)detail::command(*c, {"SET", "big", big});
        },
        [](const ConfigurationError& e) {
          EXPECT_TRUE(contains(e.what(), "invalid bulk length")) << e.what();
          EXPECT_TRUE(contains(e.what(), "proto-max-bulk-len")) << e.what();
        });
    // The server closed that connection: it must not be handed out again.
    try {
      EXPECT_EQ(detail::command(*c, {"PING"}).str, "PONG");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the closed connection was reused: " << typeName(e) << ": " << e.what();
    }
  }

  // A request the server closes the connection on without an answer (client-query-buffer-limit).
  RedisServer small({"--client-query-buffer-limit", "1mb"});
  auto d = clientOn(small.uri());
  expectThrow<ConfigurationError>(
      ErrorKind::RequestLimit,
      [&] {
        (void)detail::command(*d, {"SET", "big", std::string(std::size_t{4} << 20, 'x')});
      },
      [](const ConfigurationError& e) { EXPECT_TRUE(contains(e.what(), "client-query-buffer-limit")) << e.what(); });
  EXPECT_EQ(detail::command(*d, {"PING"}).str, "PONG");

  // Through a limiter under Allow: thrown, never granted. (A limiter name long enough to break the
  // server's limit may also be refused before sending; either way it is no outage.)
  Events events;
  try {
    RateLimiter huge(c, std::string(std::size_t{2} << 20, 'n'), events.options(FailurePolicy::Allow));
    const bool granted = huge.tryAcquire();
    ADD_FAILURE() << "decided by the policy: " << granted;
  } catch (const IoError& e) {
    ADD_FAILURE() << "an over-limit request is no outage: " << typeName(e) << ": " << e.what();
  } catch (const Error&) {
  }
}

// ---- A server that runs no scripts: a configuration error under every policy, no retry loop ----

namespace {

/// `call` throws the "runs no scripts" ConfigurationError (kind Configuration, `code`) whose text
/// names the cause (`cause`) and the commands redlimit sends.
void expectNoScripts(const std::function<void()>& call, const std::string& code, const std::string& cause) {
  expectThrow<ConfigurationError>(ErrorKind::Configuration, call, [&](const ConfigurationError& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_TRUE(contains(e.what(), "runs no scripts")) << e.what();
    EXPECT_TRUE(contains(e.what(), cause)) << "names the cause: " << e.what();
    EXPECT_TRUE(contains(e.what(), "it sends EVALSHA, and SCRIPT LOAD then EVAL"))
        << "what redlimit needs: " << e.what();
    EXPECT_TRUE(contains(e.what(), "thrown under every failure policy")) << e.what();
  });
}

/// Every face of a limiter on `client` under `policy` (a RateLimiter, a Limiter, a MultiLimit; a
/// sync and an async decision of each) throws the no-scripts error twice, and none is decided by
/// the policy: each handle reports the misconfiguration once.
void expectEveryCallRefused(const std::shared_ptr<Client>& client, FailurePolicy policy, const std::string& code,
                            const std::string& cause) {
  SCOPED_TRACE(failurePolicyName(policy));
  Events events;
  RateLimiter rate(client, "noscripts.rate", events.options(policy));
  Limiter::Options limiterOptions;
  limiterOptions.failure = events.failure(policy);
  Limiter keyed(client, "noscripts.keyed", Policy::perSecond(10), limiterOptions);
  MultiLimit::Options multiOptions;
  multiOptions.failure = events.failure(policy);
  MultiLimit multi = MultiLimit({Limiter(client, "noscripts.a", Policy::perSecond(10)),
                                 Limiter(client, "noscripts.b", Policy::perMinute(100))},
                                multiOptions)
                         .on({"k", "k"});
  for (int i = 0; i < 2; ++i) {
    expectNoScripts([&] { (void)rate.tryAcquire(); }, code, cause);
    expectNoScripts([&] { (void)rate.tryAcquireAsync().get(); }, code, cause);
    expectNoScripts([&] { (void)keyed.decide("k"); }, code, cause);
    expectNoScripts([&] { (void)keyed.decideAsync("k").get(); }, code, cause);
    expectNoScripts([&] { (void)multi.decide(); }, code, cause);
    expectNoScripts([&] { (void)multi.decideAsync().get(); }, code, cause);
  }
  for (const FailureStats& stats : {rate.failureStats(), keyed.failureStats(), multi.failureStats()}) {
    EXPECT_EQ(stats.allowed + stats.denied + stats.thrown, 0u) << "no decision by the policy";
    EXPECT_EQ(stats.outages, 0u);
    EXPECT_EQ(stats.misconfigurations, 1u);
    EXPECT_TRUE(stats.misconfigured);
  }
  const std::vector<HealthEvent> seen = events.get();
  ASSERT_EQ(seen.size(), 3u) << "one Degraded per handle";
  for (const HealthEvent& e : seen) {
    EXPECT_EQ(e.kind, HealthEvent::Kind::Degraded);
    EXPECT_EQ(e.cause, HealthEvent::Cause::Configuration);
    EXPECT_EQ(e.errorType, "redlimit::ConfigurationError");
  }
}

/// A server that requires a password, with ACL users that may not run redlimit's scripts:
/// `nolua` is denied the three commands, `plain` has what the scripts call but was never granted
/// them, `shaonly` may run EVALSHA but neither load a script nor send one with EVAL.
class NoScriptUsers {
 public:
  NoScriptUsers() : server_({"--requirepass", "pw"}), root_(Client::fromUri(uri("", "pw"))) {
    (void)detail::command(*root_,
                          {"ACL", "SETUSER", "nolua", "on", ">pw1", "~*", "+@all", "-evalsha", "-eval", "-script"});
    (void)detail::command(*root_, {"ACL", "SETUSER", "plain", "on", ">pw2", "~*", "+@read", "+@write", "+time"});
    (void)detail::command(*root_,
                          {"ACL", "SETUSER", "shaonly", "on", ">pw3", "~*", "+@read", "+@write", "+time", "+evalsha"});
  }
  [[nodiscard]] std::string uri(const std::string& user, const std::string& password) const {
    return "redis://" + user + ":" + password + "@127.0.0.1:" + std::to_string(server_.port());
  }
  [[nodiscard]] Client& root() { return *root_; }

 private:
  RedisServer server_;
  std::shared_ptr<Client> root_;
};

}  // namespace

// Scripting switched off: rename-command EVALSHA "" (as a Valkey without its Lua module looks to
// EVALSHA), or EVAL and SCRIPT renamed, where the NOSCRIPT resend as EVAL meets it.
TEST_F(ErrorModel, ScriptingSwitchedOffIsAConfigurationErrorUnderEveryPolicy) {
  RedisServer noEvalsha({}, "rename-command EVALSHA \"\"\n");
  RedisServer noEval({}, "rename-command EVAL \"\"\nrename-command SCRIPT \"\"\n");
  for (RedisServer* server : {&noEvalsha, &noEval}) {
    auto client = clientOn(server->uri());
    for (FailurePolicy policy : kPolicies) expectEveryCallRefused(client, policy, "ERR", "unknown command");
  }
}

TEST_F(ErrorModel, AnAclUserThatMayNotRunScriptsGetsAConfigurationErrorUnderEveryPolicy) {
  NoScriptUsers users;
  const struct {
    const char* user;
    const char* password;
    const char* refused;  // the command whose refusal ends the call
  } cases[] = {{"nolua", "pw1", "'evalsha'"}, {"plain", "pw2", "'evalsha'"}, {"shaonly", "pw3", "'eval'"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.user);
    auto client = Client::fromUri(users.uri(c.user, c.password));
    for (FailurePolicy policy : kPolicies) {
      expectEveryCallRefused(client, policy, "NOPERM", fmt::format("for ACL user '{}'", c.user));
    }
    expectNoScripts([&] { (void)RateLimiter(client, "noscripts.rate").tryAcquire(); }, "NOPERM",
                    fmt::format("ACL SETUSER {} +evalsha +script|load +eval", c.user));
    expectNoScripts([&] { (void)RateLimiter(client, "noscripts.rate").tryAcquire(); }, "NOPERM", c.refused);
  }
}

// What a server that runs no scripts is sent: the first call finds it out with what one call sends
// (EVALSHA alone when EVALSHA itself is refused; when only loading is, the NOSCRIPT resend once:
// EVALSHA (run: NOSCRIPT), SCRIPT LOAD (refused) and EVALSHA again (NOSCRIPT), then EVAL
// (refused)); the transport remembers it, and the calls after it, sync or async, of every face
// under every policy, send nothing and throw the same error, but for the one call per re-check
// interval that asks again (counted by the transport: how many came depends on the machine's
// speed, what each one sends does not).
TEST_F(ErrorModel, ANoScriptsServerIsAskedByTheFirstCallAndTheRechecksOnly) {
  RedisServer noEvalsha({}, "rename-command EVALSHA \"\"\n");
  RedisServer noEval({}, "rename-command EVAL \"\"\nrename-command SCRIPT \"\"\n");
  NoScriptUsers users;
  auto noEvalshaAdmin = clientOn(noEvalsha.uri());
  auto noEvalAdmin = clientOn(noEval.uri());
  const struct {
    const char* what;
    std::shared_ptr<Client> client;
    Client& admin;
    ScriptTraffic perDetection;
    const char* code;
  } cases[] = {
      {"EVALSHA renamed", clientOn(noEvalsha.uri()), *noEvalshaAdmin, {0, 0, 0, 1}, "ERR"},
      {"EVAL and SCRIPT renamed", clientOn(noEval.uri()), *noEvalAdmin, {2, 0, 0, 2}, "ERR"},
      {"ACL user without the three", Client::fromUri(users.uri("nolua", "pw1")), users.root(), {0, 0, 0, 1}, "NOPERM"},
      {"ACL user with EVALSHA alone",
       Client::fromUri(users.uri("shaonly", "pw3")),
       users.root(),
       {2, 0, 0, 2},
       "NOPERM"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const ScriptTraffic start = scriptTraffic(c.admin);
    std::string text;  // the error the server's last answer made
    expectThrow<ConfigurationError>(
        ErrorKind::Configuration, [&] { (void)RateLimiter(c.client, "noscripts.first").tryAcquire(); },
        [&](const ConfigurationError& e) { text = e.what(); });
    ASSERT_EQ(scriptTraffic(c.admin) - start, c.perDetection) << "one call found it out";

    const ScriptTraffic detected = scriptTraffic(c.admin);
    const std::uint64_t rechecksBefore = noScriptsRechecks(*c.client);
    int calls = 0;
    for (FailurePolicy policy : kPolicies) {
      SCOPED_TRACE(failurePolicyName(policy));
      Events events;
      RateLimiter rate(c.client, "noscripts.rate", events.options(policy));
      Limiter::Options limiterOptions;
      limiterOptions.failure = events.failure(policy);
      Limiter keyed(c.client, "noscripts.keyed", Policy::perSecond(10), limiterOptions);
      MultiLimit::Options multiOptions;
      multiOptions.failure = events.failure(policy);
      MultiLimit multi = MultiLimit({Limiter(c.client, "noscripts.a", Policy::perSecond(10)),
                                     Limiter(c.client, "noscripts.b", Policy::perMinute(100))},
                                    multiOptions)
                             .on({"k", "k"});
      const std::function<void()> faces[] = {
          [&] { (void)rate.tryAcquire(); }, [&] { (void)rate.tryAcquireAsync().get(); },
          [&] { (void)keyed.decide("k"); }, [&] { (void)keyed.decideAsync("k").get(); },
          [&] { (void)multi.decide(); },    [&] { (void)multi.decideAsync().get(); },
      };
      for (int round = 0; round < 3; ++round) {
        for (const auto& call : faces) {
          const std::uint64_t rechecks = noScriptsRechecks(*c.client);
          expectThrow<ConfigurationError>(ErrorKind::Configuration, call, [&](const ConfigurationError& e) {
            EXPECT_EQ(e.code(), c.code);
            // Asked again, the server words its refusal for this call (an unknown command's
            // arguments); else the remembered error, as it was.
            if (noScriptsRechecks(*c.client) == rechecks) {
              EXPECT_EQ(e.what(), text) << "the same error";
            }
            text = e.what();
          });
          ++calls;
        }
      }
      for (const FailureStats& stats : {rate.failureStats(), keyed.failureStats(), multi.failureStats()}) {
        EXPECT_EQ(stats.allowed + stats.denied + stats.thrown, 0u) << "no decision by the policy";
        EXPECT_EQ(stats.outages, 0u);
        EXPECT_EQ(stats.misconfigurations, 1u);
      }
      EXPECT_EQ(events.get().size(), 3u) << "one Degraded per handle";
    }
    const auto rechecks = static_cast<std::int64_t>(noScriptsRechecks(*c.client) - rechecksBefore);
    EXPECT_EQ(scriptTraffic(c.admin) - detected, c.perDetection.times(rechecks))
        << calls << " calls sent nothing but the " << rechecks << " re-checks";
  }
}

// The connection that found it out is replaced (killed, so the transport opens another): the
// next call asks the server again, on the new connection, and the calls after it send nothing.
TEST_F(ErrorModel, ANoScriptsServerIsAskedAgainAfterAReconnect) {
  NoScriptUsers users;
  auto client = Client::fromUri(users.uri("nolua", "pw1"));
  RateLimiter rl(client, "noscripts.reconnect");
  const ScriptTraffic perDetection{0, 0, 0, 1};
  const ScriptTraffic start = scriptTraffic(users.root());
  expectNoScripts([&] { (void)rl.tryAcquire(); }, "NOPERM", "for ACL user 'nolua'");
  ASSERT_EQ(scriptTraffic(users.root()) - start, perDetection);
  const PoolStats found = client->poolStats();

  const auto kills =
      static_cast<std::uint64_t>(detail::command(users.root(), {"CLIENT", "KILL", "USER", "nolua"}).integer);
  ASSERT_EQ(kills, found.open);
  const auto killed = SteadyTime::now();
  while (client->poolStats().discarded < found.discarded + kills && msSince(killed) < 10000) sleepMs(5);
  ASSERT_EQ(client->poolStats().discarded, found.discarded + kills) << "the transport saw its connections close";

  const ScriptTraffic beforeAgain = scriptTraffic(users.root());
  const std::uint64_t rechecks = noScriptsRechecks(*client);
  expectNoScripts([&] { (void)rl.tryAcquireAsync().get(); }, "NOPERM", "for ACL user 'nolua'");
  EXPECT_EQ(scriptTraffic(users.root()) - beforeAgain, perDetection) << "asked again";
  EXPECT_EQ(noScriptsRechecks(*client), rechecks) << "because the connection was replaced, not as a re-check";
  EXPECT_EQ(client->poolStats().created, found.created + 1) << "on a new connection";

  const ScriptTraffic detected = scriptTraffic(users.root());
  const std::uint64_t rechecksBefore = noScriptsRechecks(*client);
  for (int i = 0; i < 5; ++i) {
    expectNoScripts([&] { (void)rl.tryAcquire(); }, "NOPERM", "for ACL user 'nolua'");
    expectNoScripts([&] { (void)rl.tryAcquireAsync().get(); }, "NOPERM", "for ACL user 'nolua'");
  }
  const auto rechecksAfter = static_cast<std::int64_t>(noScriptsRechecks(*client) - rechecksBefore);
  EXPECT_EQ(scriptTraffic(users.root()) - detected, perDetection.times(rechecksAfter));
}

// An ACL user granted the script commands on a live connection (Redis applies ACL SETUSER to
// connections already authenticated as the user) is served again once the transport asks the
// server again (its re-check, one call per interval), on the same connection, without a restart,
// and the limiter reports the recovery.
TEST_F(ErrorModel, ScriptCommandsGrantedToTheAclUserServeCallsFromTheNextRecheck) {
  NoScriptUsers users;
  ClientOptions one;
  one.connection = parseUri(users.uri("nolua", "pw1"));
  one.pool.size = 1;
  auto client = Client::create(one);
  Events events;
  Limiter::Options options;
  options.failure = events.failure(FailurePolicy::Allow);
  Limiter limiter(client, "noscripts.granted", Policy::perMinute(2), options);
  expectNoScripts([&] { (void)limiter.decide("k"); }, "NOPERM", "for ACL user 'nolua'");
  const PoolStats refused = client->poolStats();
  const std::uint64_t rechecks = noScriptsRechecks(*client);

  (void)detail::command(users.root(), {"ACL", "SETUSER", "nolua", "+evalsha", "+script|load", "+eval"});
  std::optional<Decision> first;
  const auto granted = SteadyTime::now();
  while (!first && msSince(granted) < 10000) {
    try {
      first = limiter.decide("k");
    } catch (const ConfigurationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Configuration) << e.what();  // remembered until the re-check
      sleepMs(10);
    }
  }
  ASSERT_TRUE(first) << "served once the re-check came";
  EXPECT_TRUE(first->allowed);
  EXPECT_FALSE(first->byPolicy) << "Redis decided";
  EXPECT_EQ(noScriptsRechecks(*client), rechecks + 1) << "the call that asked again was the re-check";
  const Decision second = limiter.decideAsync("k").get();
  EXPECT_TRUE(second.allowed);
  EXPECT_FALSE(second.byPolicy);
  EXPECT_EQ(client->poolStats().created, refused.created) << "the connection that was refused serves it";
  const FailureStats stats = limiter.failureStats();
  EXPECT_FALSE(stats.misconfigured);
  EXPECT_EQ(stats.allowed, 0u) << "nothing granted by the policy";
  const std::vector<HealthEvent> seen = events.get();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].kind, HealthEvent::Kind::Degraded);
  EXPECT_EQ(seen[1].kind, HealthEvent::Kind::Recovered);
  EXPECT_EQ(seen[1].cause, HealthEvent::Cause::Configuration);
}
