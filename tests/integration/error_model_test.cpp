// Issue 9, items 10 and 12, against real redis-servers: durations that would overflow, and unix
// socket paths over the OS limit.
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
