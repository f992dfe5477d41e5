// Redis Sentinel: a limiter on the primary three sentinels name, followed across a failover
// (tests/support/redis_sentinel_group.cpp starts the primary, its replica and the sentinels).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "topology_counters.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/raw_command.hpp"
#include "redlimit_test/redis_sentinel_group.hpp"
#include "base/error_mapping.hpp"
#include "topology/sentinel.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

TEST(Sentinel, TheClientFindsThePrimaryAndFollowsAFailoverWhileThePolicyCoversTheGap) {
  constexpr milliseconds kDownAfter{500};
  RedisSentinelGroup group(kDownAfter);
  EventLog events;
  ClientOptions co = failoverClientOptions();
  co.onEvent = events.callback();
  auto client = Client::fromUri(group.uri(), co);
  RateLimiter rl(client, "sentinel:limiter", denyDuringOutages());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1000000, std::chrono::hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  const int before = group.currentPrimaryPort();
  EXPECT_EQ(sentinelCountersOf(*client).primary.port, before);

  group.primary().kill();
  const auto killed = Clock::now();
  const UntilGranted seen = callUntilGranted(rl, killed, std::chrono::seconds(20));
  const auto tookMs = std::chrono::duration_cast<milliseconds>(seen.grantedAt - killed).count();
  EXPECT_EQ(seen.error, "");
  ASSERT_NE(seen.grantedAt, Clock::time_point{}) << "no call granted within 20 s of the kill";
  EXPECT_GT(seen.deniedByPolicy, 0);
  EXPECT_GT(rl.failureStats().denied, 0u);
  const detail::SentinelCounters c = sentinelCountersOf(*client);
  EXPECT_NE(c.primary.port, before);
  // The client follows the sentinel it asked; the others learn of the failover from it within a
  // few hello periods, so compare with the primary they all name once they agree (the first
  // sentinel alone may still name the old one: seen in CI).
  EXPECT_EQ(c.primary.port, group.waitForFailover(before, std::chrono::seconds(10)));
  EXPECT_GE(c.switches, 1u);
  // The failover as the Client's events tell it: the outage, the new primary, the recovery.
  const auto topology = events.of(Event::Kind::Topology);
  ASSERT_GE(topology.size(), 1u);
  EXPECT_EQ(topology.back().node, c.primary.host + ":" + std::to_string(c.primary.port)) << topology.back().description;
  EXPECT_NE(topology.back().description.find("failover"), std::string::npos) << topology.back().description;
  const auto health = events.of(Event::Kind::Health);
  ASSERT_GE(health.size(), 2u);
  EXPECT_EQ(health.front().health.kind, HealthEvent::Kind::Degraded);
  EXPECT_EQ(health.front().health.cause, HealthEvent::Cause::Outage);
  EXPECT_EQ(health.back().health.kind, HealthEvent::Kind::Recovered);
  std::printf(
      "[ sentinel ] first granted call %lld ms after SIGKILL of the primary (down-after %lld ms); "
      "%lld calls denied by the policy meanwhile; %llu +switch-master seen\n",
      static_cast<long long>(tookMs), static_cast<long long>(kDownAfter.count()),
      static_cast<long long>(seen.deniedByPolicy), static_cast<unsigned long long>(c.announcements));
}

TEST(Sentinel, AnUnknownPrimaryNameEndsCallsByTheirDeadlineWithAnErrorThatSaysSo) {
  RedisSentinelGroup group;
  ClientOptions base;
  base.connection.commandTimeout = milliseconds(300);
  std::string uri = group.uri();
  uri.replace(uri.rfind('/') + 1, std::string::npos, "nosuchprimary");
  auto client = Client::fromUri(uri, base);
  const auto start = Clock::now();
  try {
    detail::command(*client, {"PING"});
    ADD_FAILURE() << "PING answered without a primary";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("nosuchprimary"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

TEST(Sentinel, SentinelsWithTheirOwnPasswordAndAPrimaryWithAnother) {
  RedisSentinelGroup group(milliseconds(500), "mymaster", SentinelGroupPasswords{"s-pass", "p-pass"});
  for (RedisServer* s : {&group.primary(), &group.sentinel(0)}) {
    const RawReply r = rawCommand(s->host(), s->port(), {"PING"});
    EXPECT_EQ(r.str.rfind("NOAUTH", 0), 0u) << "port " << s->port() << " should want a password: " << r.str;
  }
  ClientOptions base;
  base.connection.commandTimeout = milliseconds(300);
  const std::string uri = group.uri();
  ASSERT_EQ(uri, "redis-sentinel://:p-pass@127.0.0.1:" + std::to_string(group.sentinel(0).port()) +
                     ",127.0.0.1:" + std::to_string(group.sentinel(1).port()) +
                     ",127.0.0.1:" + std::to_string(group.sentinel(2).port()) + "/mymaster?sentinel_password=s-pass");
  auto client = Client::fromUri(uri, base);
  RateLimiter rl(client, "sentinel:auth");
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 3, std::chrono::minutes(10)));
  int granted = 0;
  for (int k = 0; k < 5; ++k) granted += rl.tryAcquire() ? 1 : 0;
  EXPECT_EQ(granted, 3);
  EXPECT_EQ(sentinelCountersOf(*client).primary.port, group.primary().port());
}

// The message of the AuthError that `call` throws ("" and a failure if it throws anything else).
template <typename Call>
std::string authErrorOf(Call call) {
  try {
    call();
    ADD_FAILURE() << "answered";
  } catch (const AuthError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << detail::errorTypeName(e) << ": " << e.what();
  }
  return {};
}

// Each limiter call under Allow, Deny and Throw throws AuthError saying `says`, and no password.
void expectRefusedUnderEveryPolicy(const std::string& uri, const std::string& says,
                                   const std::vector<std::string>& secrets) {
  auto client = Client::fromUri(uri);
  for (const FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    RateLimiter::Options options;
    options.failure.policy = policy;
    RateLimiter rl(client, "sentinel:refused", options);
    for (int k = 0; k < 3; ++k) {
      const std::string message = authErrorOf([&] { (void)rl.tryAcquire(); });
      EXPECT_NE(message.find(says), std::string::npos) << uri << ": " << message;
      EXPECT_NE(message.find("configuration error"), std::string::npos) << message;
      for (const std::string& secret : secrets) EXPECT_EQ(message.find(secret), std::string::npos) << message;
    }
    const FailureStats stats = rl.failureStats();
    EXPECT_EQ(stats.allowed + stats.denied + stats.thrown + stats.outages, 0u) << "the policy decided a refused login";
    EXPECT_TRUE(stats.misconfigured);
  }
}

TEST(Sentinel, RefusedLoginIsAnAuthErrorAtOnceUnderEveryPolicy) {
  RedisSentinelGroup group(milliseconds(500), "mymaster", SentinelGroupPasswords{"s-pass", "p-pass"});
  const std::string uri = group.uri();
  const std::vector<std::string> secrets{"s-pass", "p-pass", "wrong-pass"};
  auto withQuery = [&](const std::string& query) { return uri.substr(0, uri.find('?')) + query; };
  // The primary's password offered to the sentinels.
  expectRefusedUnderEveryPolicy(withQuery("?sentinel_password=p-pass"), "authentication failed: WRONGPASS", secrets);
  expectRefusedUnderEveryPolicy(withQuery("?sentinel_password=p-pass"),
                                "check the sentinels' own login: ClientOptions::Sentinel::user and ::password",
                                secrets);
  // None offered to sentinels that want one.
  expectRefusedUnderEveryPolicy(withQuery(""), "set the sentinels' own ClientOptions::Sentinel::password", secrets);
  // The sentinels take their login; the primary they name refuses its own.
  std::string wrongPrimary = uri;
  wrongPrimary.replace(wrongPrimary.find(":p-pass@"), 8, ":wrong-pass@");
  expectRefusedUnderEveryPolicy(wrongPrimary, "check ClientOptions::Connection::user and ::password", secrets);
}

TEST(Sentinel, APasswordForSentinelsThatHaveNoneIsAnAuthErrorAtOnceUnderEveryPolicy) {
  RedisSentinelGroup group;
  expectRefusedUnderEveryPolicy(group.uri() + "?sentinel_password=unneeded",
                                "leave ClientOptions::Sentinel::password (sentinel_password= in the URI) empty",
                                {"unneeded"});
}

}  // namespace
}  // namespace redlimit::test
