// Every RateLimiter operation against a real redis-server, in both modes (OVERALL, PER_CLIENT)
// and with both time sources.
#include <thread>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

class Operations : public RedisTest {};
class PerClient : public RedisTest {
 protected:
  std::shared_ptr<Client> clientWithId(const std::string& id) {
    ClientOptions options;
    options.clientId = id;
    return newClient(options);
  }
};
class ClientTime : public RedisTest {};

}  // namespace

TEST_F(Operations, TrySetRateWritesOnlyWhenAbsent) {
  RateLimiter rl(client(), name());
  EXPECT_TRUE(rl.trySetRate(RateType::Overall, 3, milliseconds(1000), milliseconds(4000)));
  EXPECT_FALSE(rl.trySetRate(RateType::PerClient, 7, milliseconds(2000)));
  EXPECT_EQ(rl.getConfig(), (RateLimiterConfig{RateType::Overall, 3, milliseconds(1000), milliseconds(4000)}));
  const std::int64_t ttl = rl.remainTimeToLive().count();
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 4000);
  // Another handle, another Client: the same limiter.
  RateLimiter other(newClient(), name());
  EXPECT_FALSE(other.trySetRate(RateType::Overall, 99, milliseconds(1000)));
  EXPECT_TRUE(other.tryAcquire(3));
  EXPECT_FALSE(rl.tryAcquire());
}

TEST_F(Operations, SetRateResetsState) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::Overall, 5, milliseconds(5000));
  ASSERT_TRUE(rl.tryAcquire(5));
  EXPECT_FALSE(rl.tryAcquire());
  rl.setRate(RateType::Overall, 5, milliseconds(5000));
  EXPECT_FALSE(exists(admin(), rl.keys()[1]));
  EXPECT_FALSE(exists(admin(), rl.keys()[3]));
  EXPECT_EQ(rl.availablePermits(), 5);
  EXPECT_TRUE(rl.tryAcquire(5));
}

TEST_F(Operations, SetRateKeepStateWithAShorterIntervalDropsOlderPermits) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::Overall, 10, milliseconds(5000));
  ASSERT_TRUE(rl.tryAcquire(3));
  sleepMs(300);
  ASSERT_TRUE(rl.tryAcquire(2));
  // New interval 200 ms: the 3 taken 300 ms ago no longer count; the 2 just taken still do.
  rl.setRate(RateType::Overall, 10, milliseconds(200), milliseconds(0), true);
  EXPECT_EQ(raw({"GET", rl.keys()[1]}).str, "8");
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 1);
  EXPECT_EQ(rl.availablePermits(), 8);
  EXPECT_EQ(rl.getConfig().rateInterval, milliseconds(200));
}

TEST_F(Operations, UpdateRateKeepsStateAndReturnsTrueWhenTheLimiterExists) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire(4));
  EXPECT_TRUE(rl.updateRate(RateType::Overall, 20, milliseconds(5000), milliseconds(10000)));
  EXPECT_EQ(rl.getConfig(), (RateLimiterConfig{RateType::Overall, 20, milliseconds(5000), milliseconds(10000)}));
  EXPECT_EQ(rl.availablePermits(), 16);
  EXPECT_TRUE(rl.tryAcquire(16));
  EXPECT_FALSE(rl.tryAcquire());
  EXPECT_GT(raw({"PTTL", rl.keys()[1]}).integer, 0) << "the new keepAliveTime applies to the state";
}

// keepAliveTime 0 means "no idle TTL": a new configuration without one must not leave the old
// keepAliveTime's TTL behind (the limiter would vanish while in use), but an expire() set by the
// caller on a limiter without keepAliveTime is the caller's and stays.
TEST_F(Operations, DroppingKeepAliveRemovesItsTtl) {
  for (bool keepState : {false, true}) {
    SCOPED_TRACE(keepState ? "keepState" : "reset");
    const std::string n = name(keepState ? "keep" : "reset");
    RateLimiter rl(client(), n);
    rl.setRate(RateType::Overall, 5, milliseconds(100), milliseconds(200));
    ASSERT_TRUE(rl.tryAcquire());
    rl.setRate(RateType::Overall, 5, milliseconds(100), milliseconds(0), keepState);
    EXPECT_EQ(rl.getConfig().keepAliveTime, milliseconds(0));
    EXPECT_EQ(rl.remainTimeToLive(), milliseconds(-1));
    ASSERT_TRUE(rl.tryAcquire());
    for (int k : {0, 1, 3}) EXPECT_EQ(raw({"PTTL", rl.keys()[static_cast<std::size_t>(k)]}).integer, -1) << k;
    sleepMs(250);
    EXPECT_TRUE(rl.isExists());
    EXPECT_TRUE(rl.tryAcquire());
  }
  RateLimiter updated(client(), name("update"));
  updated.setRate(RateType::Overall, 5, milliseconds(100), milliseconds(200));
  EXPECT_TRUE(updated.updateRate(RateType::Overall, 6, milliseconds(100)));
  EXPECT_EQ(updated.remainTimeToLive(), milliseconds(-1));

  RateLimiter expiring(client(), name("expire"));
  expiring.setRate(RateType::Overall, 5, milliseconds(100));
  ASSERT_TRUE(expiring.expire(milliseconds(60000)));
  expiring.setRate(RateType::Overall, 6, milliseconds(100), milliseconds(0), true);
  EXPECT_GT(expiring.remainTimeToLive().count(), 0) << "the caller's expire() was dropped";
}

TEST_F(Operations, TryAcquireWithTimeoutWaitsForAPermit) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(300)));
  const auto start = SteadyTime::now();
  ASSERT_TRUE(rl.tryAcquire(2));
  EXPECT_TRUE(rl.tryAcquire(milliseconds(1000)));  // one permit, after the first two expire
  EXPECT_GE(msSince(start), 299) << "granted before the window passed";
  EXPECT_TRUE(rl.tryAcquire(1, milliseconds(0)));
  const auto second = SteadyTime::now();
  EXPECT_TRUE(rl.tryAcquire(2, milliseconds(1000)));  // two permits, waits again
  EXPECT_GE(msSince(second), 250);
  EXPECT_FALSE(rl.tryAcquire(milliseconds(0)));
}

TEST_F(Operations, AcquireBlocksUntilPermitsExpire) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 3, milliseconds(250)));
  const auto start = SteadyTime::now();
  rl.acquire();
  rl.acquire(2);
  EXPECT_EQ(rl.availablePermits(), 0);
  rl.acquire(3);
  EXPECT_GE(msSince(start), 249);
  EXPECT_EQ(rl.availablePermits(), 0);
  rl.acquire();
  EXPECT_GE(msSince(start), 499);
}

TEST_F(Operations, TryAcquireUpToTakesWhatIsFreeAndReleaseGrantGivesItBack) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire(7));
  const detail::AcquireResult partial = redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl, {}, 2, 5);
  EXPECT_EQ(partial.granted, 3);
  EXPECT_EQ(partial.remaining, 0);
  EXPECT_EQ(partial.rate, 10);
  ASSERT_EQ(partial.member.size(), 21u);
  EXPECT_GT(raw({"ZSCORE", rl.keys()[3], partial.member}).str.size(), 0u) << "member() names the stored member";
  EXPECT_EQ(std::llround(std::stod(raw({"ZSCORE", rl.keys()[3], partial.member}).str) * 1000.0),
            partial.grantTime.count())
      << "the score is the grant time in epoch ms with µs precision";
  const detail::AcquireResult denied = redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl, {}, 1, 5);
  EXPECT_EQ(denied.granted, 0);
  EXPECT_GT(denied.wait, milliseconds(4000));
  EXPECT_LE(denied.wait, milliseconds(5000));
  EXPECT_EQ(redlimit::detail::SegmentAccess<RateLimiter>::releaseGrant(rl, partial.member, 5), 3)
      << "at most what the grant holds";
  EXPECT_EQ(rl.availablePermits(), 3);
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 1) << "the emptied grant is removed";
  EXPECT_EQ(redlimit::detail::SegmentAccess<RateLimiter>::releaseGrant(rl, partial.member, 5), 0)
      << "nothing left in that grant";

  const detail::AcquireResult whole = redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl, {}, 1, 50);
  EXPECT_EQ(whole.granted, 3) << "atMost is capped by what is free";
  EXPECT_EQ(redlimit::detail::SegmentAccess<RateLimiter>::releaseGrant(rl, whole.member, 1), 1);
  EXPECT_EQ(rl.availablePermits(), 1);
}

TEST_F(Operations, ExpireExpireAtClearExpireAndRemainTimeToLive) {
  RateLimiter rl(client(), name());
  EXPECT_EQ(rl.remainTimeToLive(), milliseconds(-2));
  EXPECT_FALSE(rl.isExists());
  EXPECT_FALSE(rl.expire(milliseconds(1000))) << "no key to expire";
  EXPECT_FALSE(rl.clearExpire());

  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_TRUE(rl.isExists());
  EXPECT_EQ(rl.remainTimeToLive(), milliseconds(-1));

  EXPECT_TRUE(rl.expire(milliseconds(10000)));
  for (int k : {0, 1, 3}) {
    const std::int64_t ttl = raw({"PTTL", rl.keys()[static_cast<std::size_t>(k)]}).integer;
    EXPECT_GT(ttl, 9000);
    EXPECT_LE(ttl, 10000);
  }
  EXPECT_GT(rl.remainTimeToLive().count(), 9000);

  EXPECT_TRUE(rl.clearExpire());
  EXPECT_FALSE(rl.clearExpire()) << "nothing left to clear";
  for (int k : {0, 1, 3}) EXPECT_EQ(raw({"PTTL", rl.keys()[static_cast<std::size_t>(k)]}).integer, -1);
  EXPECT_EQ(rl.remainTimeToLive(), milliseconds(-1));

  const auto when = std::chrono::system_clock::now() + milliseconds(250);
  EXPECT_TRUE(rl.expireAt(when));
  const std::int64_t whenMs = std::chrono::duration_cast<milliseconds>(when.time_since_epoch()).count();
  for (int k : {0, 1, 3}) {
    EXPECT_EQ(raw({"PEXPIRETIME", rl.keys()[static_cast<std::size_t>(k)]}).integer, whenMs);
  }
  EXPECT_LE(rl.remainTimeToLive().count(), 250);
  sleepMs(300);
  EXPECT_FALSE(rl.isExists());
  EXPECT_TRUE(raw({"KEYS", "*" + name() + "*"}).elements.empty());

  // expireAt in the past removes the limiter at once.
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  EXPECT_TRUE(rl.expireAt(std::chrono::system_clock::now() - milliseconds(1000)));
  EXPECT_FALSE(rl.isExists());
}

TEST_F(Operations, DeleteLimiterRemovesConfigAndOwnState) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000), milliseconds(60000)));
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_TRUE(rl.deleteLimiter());
  EXPECT_FALSE(rl.isExists());
  EXPECT_TRUE(raw({"KEYS", "*" + name() + "*"}).elements.empty());
  EXPECT_THROW((void)rl.tryAcquire(), NotInitializedError);
  // The handle stays usable: a new configuration, a new (full) limiter.
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(5000)));
  EXPECT_TRUE(rl.tryAcquire(2));
}

TEST_F(Operations, OverallLimitIsSharedBetweenClients) {
  RateLimiter a(client(), name());
  RateLimiter b(newClient(), name());
  ASSERT_TRUE(a.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  EXPECT_TRUE(a.tryAcquire(3));
  EXPECT_EQ(b.availablePermits(), 2);
  EXPECT_FALSE(b.tryAcquire(3));
  EXPECT_TRUE(b.tryAcquire(2));
  EXPECT_FALSE(a.tryAcquire());
}

TEST_F(PerClient, EachClientGetsTheFullRateUnderItsOwnKeys) {
  RateLimiter a(clientWithId("host-a"), name());
  // b's denials are not remembered: a's deleteLimiter below is a change b would not see.
  RateLimiter::Options uncached;
  uncached.denyCacheKeys = 0;
  RateLimiter b(clientWithId("host-b"), name(), uncached);
  ASSERT_TRUE(a.trySetRate(RateType::PerClient, 3, milliseconds(5000)));
  EXPECT_FALSE(b.trySetRate(RateType::PerClient, 3, milliseconds(5000)));
  EXPECT_TRUE(a.tryAcquire(3));
  EXPECT_FALSE(a.tryAcquire());
  EXPECT_EQ(b.availablePermits(), 3);
  EXPECT_TRUE(b.tryAcquire(2));
  EXPECT_TRUE(b.tryAcquire());
  EXPECT_FALSE(b.tryAcquire());
  EXPECT_EQ(raw({"GET", "{" + name() + "}:value:host-a"}).str, "0");
  EXPECT_EQ(raw({"GET", "{" + name() + "}:value:host-b"}).str, "0");
  EXPECT_EQ(raw({"ZCARD", "{" + name() + "}:permits:host-a"}).integer, 1);
  EXPECT_EQ(raw({"ZCARD", "{" + name() + "}:permits:host-b"}).integer, 2);
  EXPECT_FALSE(exists(admin(), "{" + name() + "}:value"));
  EXPECT_FALSE(exists(admin(), "{" + name() + "}:permits"));

  // Same id, another Client object: the same share.
  RateLimiter a2(clientWithId("host-a"), name());
  EXPECT_EQ(a2.availablePermits(), 0);
  a2.release(1);
  EXPECT_EQ(a.availablePermits(), 1);
  EXPECT_EQ(b.availablePermits(), 0);

  // deleteLimiter removes the config and its own state; the other client's state stays.
  EXPECT_TRUE(a.deleteLimiter());
  EXPECT_FALSE(exists(admin(), "{" + name() + "}:value:host-a"));
  EXPECT_TRUE(exists(admin(), "{" + name() + "}:value:host-b"));
  EXPECT_THROW((void)b.tryAcquire(), NotInitializedError);
}

TEST_F(PerClient, TtlOperationsCoverTheClientKeys) {
  RateLimiter a(clientWithId("host-a"), name());
  ASSERT_TRUE(a.trySetRate(RateType::PerClient, 3, milliseconds(5000), milliseconds(8000)));
  ASSERT_TRUE(a.tryAcquire());
  for (int k : {0, 2, 4}) {
    const std::int64_t ttl = raw({"PTTL", a.keys()[static_cast<std::size_t>(k)]}).integer;
    EXPECT_GT(ttl, 7000) << a.keys()[static_cast<std::size_t>(k)];
  }
  EXPECT_TRUE(a.clearExpire());
  for (int k : {0, 2, 4}) EXPECT_EQ(raw({"PTTL", a.keys()[static_cast<std::size_t>(k)]}).integer, -1);
  EXPECT_TRUE(a.expire(milliseconds(200)));
  sleepMs(250);
  EXPECT_TRUE(raw({"KEYS", "*" + name() + "*"}).elements.empty());
}

// TimeSource::Client sends this host's clock to the scripts, which then never call TIME; the
// default server clock calls TIME once per script.
TEST_F(ClientTime, EveryOperationUsesTheClientClock) {
  RateLimiter rl(client(), name(), timeSourceOptions(TimeSource::Client));
  const std::int64_t timeBefore = commandCalls(admin(), "time");
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 4, milliseconds(250)));
  const std::int64_t before = wallUs();
  EXPECT_TRUE(rl.tryAcquire(2));
  const std::int64_t after = wallUs();
  const std::vector<Entry> first = entries(admin(), rl.keys()[3]);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_GE(first[0].scoreUs, before);
  EXPECT_LE(first[0].scoreUs, after);
  EXPECT_TRUE(rl.tryAcquire(milliseconds(100)));
  EXPECT_EQ(rl.availablePermits(), 1);
  rl.release(1);
  EXPECT_EQ(rl.availablePermits(), 2);
  rl.setRate(RateType::Overall, 5, milliseconds(250), milliseconds(0), true);
  EXPECT_EQ(rl.availablePermits(), 3);
  EXPECT_TRUE(rl.updateRate(RateType::Overall, 4, milliseconds(250)));
  EXPECT_EQ(rl.availablePermits(), 2);
  EXPECT_FALSE(rl.tryAcquire(3, milliseconds(0)));
  rl.acquire(3);  // waits for the first grant (2 permits) to expire
  EXPECT_EQ(commandCalls(admin(), "time"), timeBefore) << "a script read the server clock";
  const std::vector<Entry> last = entries(admin(), rl.keys()[3]);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(unpackMember(last[0].member).permits, 3u);
  EXPECT_GE(last[0].score - first[0].score, 250) << "granted while the first grant was live";

  RateLimiter server(client(), name("server"));
  ASSERT_TRUE(server.trySetRate(RateType::Overall, 4, milliseconds(250)));
  EXPECT_TRUE(server.tryAcquire());
  EXPECT_EQ(commandCalls(admin(), "time"), timeBefore + 1);
}

// Both time sources on one limiter: the same clock on one host, so they agree.
TEST_F(ClientTime, MixesWithServerTimeHandles) {
  RateLimiter byClient(client(), name(), timeSourceOptions(TimeSource::Client));
  RateLimiter byServer(newClient(), name(), timeSourceOptions(TimeSource::Server));
  ASSERT_TRUE(byClient.trySetRate(RateType::Overall, 4, milliseconds(300)));
  EXPECT_TRUE(byClient.tryAcquire(2));
  EXPECT_TRUE(byServer.tryAcquire(2));
  EXPECT_FALSE(byClient.tryAcquire());
  EXPECT_FALSE(byServer.tryAcquire());
  sleepMs(340);
  EXPECT_EQ(byServer.availablePermits(), 4);
  EXPECT_EQ(byClient.availablePermits(), 4);
}
