// Integration-test fixture: one throwaway redis-server per test process (ctest runs each test in
// its own process), a Client on it, unique limiter names, and raw access for checking the layout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/client.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/redis_server.hpp"

namespace redlimit::test {

// The Redis layer is not public API; tests use it to look at and set up Redis.
using detail::Reply;
using detail::Script;

/// The process-wide server, started on first use and stopped at exit.
RedisServer& sharedServer();

/// Reads `INFO commandstats` and returns the `calls` of one command ("evalsha", "eval", ...).
std::int64_t commandCalls(Client& client, const std::string& command);

/// Parses one "field:value" line of an INFO section; returns "" if absent.
std::string infoField(Client& client, const std::string& section, const std::string& field);

/// A Client of `server` whose connects and commands give up after `timeout`: for tests that kill
/// the server and watch the failure policy decide.
std::shared_ptr<Client> shortTimeoutClient(const RedisServer& server,
                                           std::chrono::milliseconds timeout = std::chrono::milliseconds(200));

/// Base fixture: client() talks to sharedServer(); name() is unique per test; raw() runs plain
/// commands on a separate client so that assertions never share the code under test's pool.
class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  std::shared_ptr<Client> client() { return client_; }
  /// A Client like client() whose connects and commands give up after 10 s, not 500 ms: for a
  /// limiter under FailurePolicy::Allow whose test checks Redis's answers, where a reply slowed by
  /// a loaded machine would otherwise come back as the policy's silent grant.
  std::shared_ptr<Client> patientClient();
  /// A new Client on the same server (another "process" for PER_CLIENT and id tests).
  std::shared_ptr<Client> newClient(ClientOptions options = {});
  /// A limiter name unique to this test; `suffix` tells several apart.
  std::string name(const std::string& suffix = "l");
  /// Script calls (EVALSHA and EVAL) the server has run so far: a refusal before sending leaves it.
  std::int64_t scriptCalls() { return commandCalls(*admin_, "evalsha") + commandCalls(*admin_, "eval"); }
  /// The same for a Limiter, whose name may not hold ':' ('.' instead); cleaned up as name()'s.
  std::string limiterName(const std::string& suffix = "l");
  Reply raw(std::initializer_list<std::string_view> argv) { return detail::command(*admin_, argv); }
  Client& admin() { return *admin_; }
  RedisServer& server() { return sharedServer(); }

 private:
  std::shared_ptr<Client> client_;
  std::shared_ptr<Client> admin_;
  std::string prefix_;
  std::string dottedPrefix_;  // prefix_ with '.' for ':'
};

/// Sleeps for d. Integration tests use short intervals and sleep only to let a window pass.
inline void sleepMs(std::int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

/// The clock the tests measure elapsed time with, under the two names the test files use.
using Clock = std::chrono::steady_clock;
using SteadyTime = std::chrono::steady_clock;

/// Whole milliseconds of std::chrono::steady_clock since `start`.
inline std::int64_t msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace redlimit::test
