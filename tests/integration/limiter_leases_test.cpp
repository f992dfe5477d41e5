// Limiter under a concurrency policy against a real redis-server: the limit, leases that are
// renewed, released and that expire, bad input and corrupted keys, the failure policy, a crashed
// holder process, and 3 processes x 4 threads. Waits are for conditions seen on the server's
// clock, never on elapsed time.
#include <algorithm>
#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit_lua.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// A valid lease id that no acquire made.
std::string fakeLeaseId(int i) {
  std::string id = std::to_string(i);
  return std::string(32 - id.size(), 'a') + id;
}

// The expiries (epoch µs) Redis holds for the leases of `redisKey`, ascending.
std::vector<std::int64_t> leaseExpiries(Client& c, const std::string& redisKey) {
  const Reply r = detail::command(c, {"ZRANGE", redisKey, "0", "-1", "WITHSCORES"});
  std::vector<std::int64_t> out;
  for (std::size_t i = 1; i < r.elements.size(); i += 2) out.push_back(std::stoll(r.elements[i].str));
  return out;
}

// The key every test takes leases of.
const std::string kKey = "k";

}  // namespace

class LimiterLeases : public RedisTest {
 protected:
  // A Limiter of this test under Policy::concurrency(limit, leaseTtl).
  Limiter leases(std::int64_t limit, milliseconds leaseTtl, Limiter::Options options = {}) {
    return Limiter(client(), limiterName(), Policy::concurrency(limit, leaseTtl), std::move(options));
  }
  std::int64_t zcard(const std::string& redisKey) { return raw({"ZCARD", redisKey}).integer; }
};

TEST_F(LimiterLeases, AtMostLimitLeasesAreHeldAndADenialSaysWhenOneExpires) {
  Limiter cl = leases(3, milliseconds(10000));
  const std::string key = cl.redisKey(kKey);
  std::vector<Lease> held;
  for (int i = 0; i < 3; ++i) {
    const LeaseDecision d = cl.acquireLease(kKey);
    ASSERT_TRUE(d.decision.allowed);
    ASSERT_TRUE(d.lease.has_value());
    EXPECT_EQ(d.lease->id.size(), 32u);
    EXPECT_EQ(d.lease->expiresAt.count(), d.decision.time.count() + 10000000);
    EXPECT_EQ(d.decision.remaining, 2 - i);
    EXPECT_EQ(d.decision.limit, 3);
    EXPECT_FALSE(d.decision.byPolicy);
    held.push_back(*d.lease);
  }
  const LeaseDecision denied = cl.acquireLease(kKey);
  EXPECT_FALSE(denied.decision.allowed);
  EXPECT_FALSE(denied.lease.has_value());
  EXPECT_EQ(denied.decision.remaining, 0);
  // Until the soonest lease expires, exactly.
  EXPECT_EQ(denied.decision.retryAfter.count(), held[0].expiresAt.count() - denied.decision.time.count());
  EXPECT_EQ(denied.decision.resetAfter.count(), held[2].expiresAt.count() - denied.decision.time.count());
  EXPECT_FALSE(cl.acquireLease(kKey).lease.has_value());
  EXPECT_EQ(cl.held(kKey), 3);
  EXPECT_EQ(zcard(key), 3);
  // The key expires with the last lease, not before it.
  const std::int64_t pttl = raw({"PTTL", key}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 10000);
  // A release frees a place for someone else.
  EXPECT_TRUE(cl.release(kKey, held[1]));
  EXPECT_EQ(cl.held(kKey), 2);
  EXPECT_TRUE(cl.acquireLease(kKey).lease.has_value());
  EXPECT_FALSE(cl.acquireLease(kKey).lease.has_value());
  // Another handle on the same name shares the leases.
  Limiter other(newClient(), limiterName(), Policy::concurrency(3, milliseconds(10000)));
  EXPECT_FALSE(other.acquireLease(kKey).lease.has_value());
  EXPECT_EQ(other.held(kKey), 3);
  // Metrics (one series per name): 4 granted, 4 denied (one of them `other`'s), one round trip each.
  ASSERT_NE(cl.monitor().metrics(), nullptr);
  const LimiterMetrics::Snapshot m = cl.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 4u);
  EXPECT_EQ(m.denied, 4u);
  EXPECT_EQ(m.roundTrips, 8u);
}

TEST_F(LimiterLeases, ReleaseIsIdempotentAndTheLastReleaseDeletesTheKey) {
  Limiter cl = leases(2, milliseconds(10000));
  const std::string key = cl.redisKey(kKey);
  const std::optional<Lease> a = cl.acquireLease(kKey).lease;
  const std::optional<Lease> b = cl.acquireLease(kKey).lease;
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(cl.release(kKey, *a));
  EXPECT_FALSE(cl.release(kKey, *a)) << "a second release is a no-op";
  EXPECT_FALSE(cl.release(kKey, *a));
  EXPECT_EQ(cl.held(kKey), 1);
  EXPECT_TRUE(cl.release(kKey, *b));
  EXPECT_FALSE(exists(admin(), key)) << "no lease live: no key";
  EXPECT_FALSE(cl.release(kKey, *b));
  EXPECT_EQ(cl.held(kKey), 0);
  Lease never;
  never.id = fakeLeaseId(1);
  EXPECT_FALSE(cl.release(kKey, never));
  EXPECT_FALSE(exists(admin(), key)) << "a release of an unknown lease writes nothing";
}

TEST_F(LimiterLeases, RenewExtendsALiveLeaseOnly) {
  Limiter cl = leases(1, milliseconds(100));
  const std::string key = cl.redisKey(kKey);
  std::optional<Lease> lease = cl.acquireLease(kKey).lease;
  ASSERT_TRUE(lease);
  const microseconds first = lease->expiresAt;
  ASSERT_TRUE(cl.renew(kKey, *lease, milliseconds(60000)));
  EXPECT_GT(lease->expiresAt, first);
  EXPECT_EQ(leaseExpiries(admin(), key), std::vector<std::int64_t>{lease->expiresAt.count()});
  EXPECT_GT(raw({"PTTL", key}).integer, 1000) << "the key lives as long as the renewed lease";
  // Past the first expiry on the server's clock, the renewed lease still holds its place.
  while (serverTimeUs(admin()) <= first.count()) sleepMs(5);
  EXPECT_FALSE(cl.acquireLease(kKey).lease.has_value());
  EXPECT_EQ(cl.held(kKey), 1);
  // Renewed with the policy's TTL: now + 100 ms (shorter), and the key's TTL follows.
  ASSERT_TRUE(cl.renew(kKey, *lease));
  EXPECT_LE(raw({"PTTL", key}).integer, 100);
  // An expired lease cannot be renewed, and is gone.
  const microseconds expiry = lease->expiresAt;
  while (serverTimeUs(admin()) <= expiry.count()) sleepMs(5);
  EXPECT_FALSE(cl.renew(kKey, *lease));
  EXPECT_EQ(lease->expiresAt, expiry) << "unchanged when not renewed";
  EXPECT_FALSE(exists(admin(), key));
  EXPECT_FALSE(cl.release(kKey, *lease));
  // A released lease cannot be renewed either.
  std::optional<Lease> again = cl.acquireLease(kKey).lease;
  ASSERT_TRUE(again);
  EXPECT_TRUE(cl.release(kKey, *again));
  EXPECT_FALSE(cl.renew(kKey, *again));
  EXPECT_FALSE(exists(admin(), key));
}

TEST_F(LimiterLeases, AnExpiredLeaseFreesItsPlaceAtItsExpiryAndNeverBefore) {
  Limiter cl = leases(2, milliseconds(10000));
  std::optional<Lease> a = cl.acquireLease(kKey, milliseconds(150)).lease;
  const std::optional<Lease> b = cl.acquireLease(kKey, milliseconds(300)).lease;
  ASSERT_TRUE(a && b);
  // Each decision is made at d.time on the server's clock: a place is free exactly when one of
  // the two leases has expired by then.
  std::vector<Lease> mine;
  for (int i = 0; i < 2000 && mine.size() < 2; ++i) {
    const LeaseDecision d = cl.acquireLease(kKey);
    const std::int64_t t = d.decision.time.count();
    const std::size_t expired = (t >= a->expiresAt.count() ? 1u : 0u) + (t >= b->expiresAt.count() ? 1u : 0u);
    ASSERT_EQ(d.decision.allowed, mine.size() < expired) << "at " << t;
    if (d.decision.allowed) {
      mine.push_back(*d.lease);
    } else {
      const std::int64_t next = t < a->expiresAt.count() ? a->expiresAt.count() : b->expiresAt.count();
      EXPECT_EQ(d.decision.retryAfter.count(), next - t);
      sleepMs(5);
    }
  }
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_FALSE(cl.renew(kKey, *a)) << "expired";
  EXPECT_EQ(cl.held(kKey), 2);
  EXPECT_EQ(zcard(cl.redisKey(kKey)), 2) << "the expired leases were reclaimed";
}

TEST_F(LimiterLeases, ExpiredLeasesAreReclaimedAtMost100PerCall) {
  Limiter cl = leases(5, milliseconds(10000));
  const std::string key = cl.redisKey(kKey);
  // 250 expired leases, as crashed holders leave them.
  const std::int64_t past = serverTimeUs(admin()) - 1000000;
  for (int i = 0; i < 250; ++i) {
    (void)raw({"ZADD", key, std::to_string(past + i), fakeLeaseId(i)});
  }
  EXPECT_EQ(cl.held(kKey), 0) << "expired leases are not held";
  std::optional<Lease> lease = cl.acquireLease(kKey).lease;
  ASSERT_TRUE(lease);
  EXPECT_EQ(zcard(key), 151);
  ASSERT_TRUE(cl.renew(kKey, *lease));
  EXPECT_EQ(zcard(key), 51);
  EXPECT_TRUE(cl.release(kKey, *lease));
  EXPECT_FALSE(exists(admin(), key)) << "no live lease left: the key goes at once";
}

TEST_F(LimiterLeases, AnAcquireSentTwiceTakesOnePlace) {
  Limiter cl = leases(2, milliseconds(10000));
  const std::string id = fakeLeaseId(7);
  const std::vector<std::string> args{"acquire", "", "C", id, "2", "10000"};
  const Reply first = runOneKey(admin(), detail::lua::concurrency, cl.redisKey(kKey), args);
  const Reply second = runOneKey(admin(), detail::lua::concurrency, cl.redisKey(kKey), args);
  EXPECT_EQ(first.elements.at(0).integer, 1);
  EXPECT_EQ(second.elements.at(0).integer, 1);
  EXPECT_EQ(second.elements.at(1).integer, first.elements.at(1).integer) << "the same lease";
  EXPECT_EQ(cl.held(kKey), 1);
  EXPECT_TRUE(cl.acquireLease(kKey).lease.has_value());
  EXPECT_FALSE(cl.acquireLease(kKey).lease.has_value());
}

TEST_F(LimiterLeases, BadInputIsRefusedBeforeAnythingIsSent) {
  constexpr std::int64_t kMostPlaces = 4294967295;
  constexpr milliseconds kLongestTtl{4294967295};  // 49.7 days
  EXPECT_THROW((void)Policy::concurrency(0, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)Policy::concurrency(-1, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)Policy::concurrency(kMostPlaces + 1, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)Policy::concurrency(1, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)Policy::concurrency(1, milliseconds(-5)), InvalidArgument);
  EXPECT_THROW((void)Policy::concurrency(1, kLongestTtl + milliseconds(1)), InvalidArgument);
  EXPECT_EQ(Policy::concurrency(kMostPlaces, kLongestTtl).limit(), kMostPlaces) << "the bounds themselves are fine";
  const Policy one = Policy::concurrency(1, milliseconds(1000));
  EXPECT_THROW([&] { Limiter cl(nullptr, limiterName(), one); }(), InvalidArgument);
  EXPECT_THROW([&] { Limiter cl(client(), "", one); }(), InvalidArgument);
  EXPECT_THROW([&] { Limiter cl(client(), std::string(1025, 'x'), one); }(), InvalidArgument);

  Limiter cl = leases(2, milliseconds(1000));
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)cl.acquireLease(kKey, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)cl.acquireLease(kKey, kLongestTtl + milliseconds(1)), InvalidArgument);
  Lease bogus;
  for (const std::string& id : {std::string(), std::string("abc"), std::string(32, 'A'), std::string(32, 'g'),
                                std::string(33, 'a'), fakeLeaseId(1) + "\n"}) {
    bogus.id = id;
    EXPECT_THROW((void)cl.renew(kKey, bogus), InvalidArgument) << id;
    EXPECT_THROW((void)cl.release(kKey, bogus), InvalidArgument) << id;
  }
  bogus.id = fakeLeaseId(1);
  EXPECT_THROW((void)cl.renew(kKey, bogus, milliseconds(0)), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
  const std::string key = cl.redisKey(kKey);
  EXPECT_FALSE(exists(admin(), key));
  // The script checks its arguments too (another client, or a hand-made call).
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::concurrency, key, {"acquire", "", "C", "xyz", "2", "10"}),
               InvalidArgument);
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::concurrency, key, {"acquire", "", "C", fakeLeaseId(1), "0", "10"}),
               InvalidArgument);
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::concurrency, key, {"renew", "", "C", fakeLeaseId(1), "0"}),
               InvalidArgument);
  EXPECT_FALSE(exists(admin(), key));
}

TEST_F(LimiterLeases, CorruptedKeysAreTypedErrorsAndNothingIsWritten) {
  Limiter cl = leases(3, milliseconds(10000));
  const std::string key = cl.redisKey(kKey);
  Lease lease;
  lease.id = fakeLeaseId(3);
  auto expectRefused = [&](const char* what, ErrorKind kind) {
    SCOPED_TRACE(what);
    const std::string before = keyState(admin(), key);
    EXPECT_TRUE(test::throwsError<ScriptError>(kind, [&] { (void)cl.acquireLease(kKey); }));
    EXPECT_TRUE(test::throwsError<ScriptError>(kind, [&] { (void)cl.acquireLeaseAsync(kKey).get(); }));
    EXPECT_TRUE(test::throwsError<ScriptError>(kind, [&] { (void)cl.renew(kKey, lease); }));
    EXPECT_TRUE(test::throwsError<ScriptError>(kind, [&] { (void)cl.release(kKey, lease); }));
    EXPECT_EQ(keyState(admin(), key), before) << "nothing written";
    (void)raw({"DEL", key});
  };
  // Another Redis type; a string (another policy's state of the same key): ScriptError (InvalidConfig)
  // naming the key.
  (void)raw({"HSET", key, "limit", "3"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)cl.held(kKey); }));
  try {
    (void)cl.acquireLease(kKey);
    ADD_FAILURE() << "acquireLease succeeded on a hash";
  } catch (const ScriptError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidConfig) << e.what();
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
  expectRefused("hash", ErrorKind::InvalidConfig);
  Limiter gcra(client(), limiterName(), Policy::gcra(5, milliseconds(1000), 5));
  ASSERT_TRUE(gcra.tryAcquire(kKey));
  ASSERT_TRUE(exists(admin(), key)) << "the GCRA state is in the key the leases would use";
  expectRefused("gcra", ErrorKind::InvalidConfig);
  // A member that is not a lease id (expired: read by the reclaim), and one among the latest.
  (void)raw({"ZADD", key, "1", "hello"});
  expectRefused("expired member", ErrorKind::InvalidState);
  (void)raw({"ZADD", key, std::to_string(serverTimeUs(admin()) + 5000000), "not-a-lease"});
  expectRefused("latest member", ErrorKind::InvalidState);
  // Scores that are not expiries: fractional, infinite, or further ahead than any TTL.
  (void)raw({"ZADD", key, "1.5", fakeLeaseId(1)});
  expectRefused("fractional score", ErrorKind::InvalidState);
  (void)raw({"ZADD", key, "+inf", fakeLeaseId(1)});
  expectRefused("infinite score", ErrorKind::InvalidState);
  (void)raw({"ZADD", key, "8000000000000000", fakeLeaseId(1)});
  expectRefused("far future score", ErrorKind::InvalidState);
  // A healthy key again works.
  EXPECT_TRUE(cl.acquireLease(kKey).lease.has_value());
}

TEST_F(LimiterLeases, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    std::atomic<int> degraded{0};
    options.failure.onHealthChange = [&](const HealthEvent& e) {
      if (e.kind == HealthEvent::Kind::Degraded) degraded.fetch_add(1);
    };
    Limiter cl(c, "policy", Policy::concurrency(3, milliseconds(60000)), options);
    std::optional<Lease> held = cl.acquireLease(kKey).lease;
    ASSERT_TRUE(held);
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const LeaseDecision d = cl.acquireLease(kKey);
        EXPECT_TRUE(d.decision.byPolicy);
        EXPECT_EQ(d.decision.limit, 3);
        EXPECT_EQ(d.decision.allowed, d.lease.has_value());
        if (d.lease) {
          EXPECT_TRUE(d.lease->byPolicy);
          EXPECT_EQ(d.lease->expiresAt.count(), 0);
        }
        (d.decision.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    switch (policy) {
      case FailurePolicy::Allow:
        EXPECT_EQ(allowed, 6);
        break;
      case FailurePolicy::Deny:
        EXPECT_EQ(denied, 6);
        break;
      case FailurePolicy::Throw:
        EXPECT_EQ(thrown, 6);
        break;
      case FailurePolicy::Local:
        EXPECT_EQ(allowed, 3) << "limit leases per leaseTtl";
        EXPECT_EQ(denied, 3);
        break;
    }
    // renew, release and held are not decisions: they report the outage.
    EXPECT_THROW((void)cl.renew(kKey, *held), IoError);
    EXPECT_THROW((void)cl.release(kKey, *held), IoError);
    EXPECT_THROW((void)cl.held(kKey), IoError);
    EXPECT_TRUE(cl.failureStats().degraded);
    EXPECT_EQ(cl.failureStats().outages, 1u);
    EXPECT_EQ(degraded.load(), 1);
    // Back again (empty: no persistence): the limiter recovers on the next probe.
    server.restart();
    bool recovered = false;
    for (int i = 0; i < 200 && !recovered; ++i) {
      try {
        recovered = !cl.acquireLease(kKey).decision.byPolicy;
      } catch (const IoError&) {
      }
      if (!recovered) sleepMs(10);
    }
    EXPECT_TRUE(recovered);
    EXPECT_FALSE(cl.failureStats().degraded);
  }
}

TEST_F(LimiterLeases, AsyncAcquisitionsHoldTheLimitAndGetTheirLeases) {
  Limiter cl = leases(3, milliseconds(60000));
  std::vector<std::future<LeaseDecision>> all;
  for (int i = 0; i < 10; ++i) all.push_back(cl.acquireLeaseAsync(kKey));
  std::vector<Lease> granted;
  int denied = 0;
  for (auto& f : all) {
    const LeaseDecision d = f.get();
    EXPECT_FALSE(d.decision.byPolicy);
    EXPECT_EQ(d.decision.allowed, d.lease.has_value());
    if (d.lease) {
      EXPECT_GT(d.lease->expiresAt.count(), d.decision.time.count());
      granted.push_back(*d.lease);
    } else {
      ++denied;
      EXPECT_GT(d.decision.retryAfter.count(), 0);
    }
  }
  EXPECT_EQ(granted.size(), 3u);
  EXPECT_EQ(denied, 7);
  EXPECT_EQ(cl.held(kKey), 3);
  for (const Lease& l : granted)
    EXPECT_TRUE(cl.release(kKey, l)) << "each lease the reply named is the one Redis holds";
  EXPECT_EQ(cl.held(kKey), 0);
  // The callback form, with a TTL of its own; and a refused TTL comes back through the future.
  std::promise<LeaseDecision> got;
  cl.acquireLeaseAsync(kKey, milliseconds(5000), [&](LeaseDecision d, const std::exception_ptr& e) {
    if (e) {
      got.set_exception(e);
    } else {
      got.set_value(std::move(d));
    }
  });
  const LeaseDecision d = got.get_future().get();
  ASSERT_TRUE(d.lease.has_value());
  EXPECT_EQ(d.lease->expiresAt.count(), d.decision.time.count() + 5000000);
  EXPECT_THROW((void)cl.acquireLeaseAsync(kKey, milliseconds(0)).get(), InvalidArgument);
  const LimiterMetrics::Snapshot m = cl.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 4u);
  EXPECT_EQ(m.denied, 7u);
}

TEST_F(LimiterLeases, AsyncAcquisitionsOfAnUnreachableRedisAreDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    Limiter cl(c, "policy", Policy::concurrency(3, milliseconds(60000)), options);
    ASSERT_TRUE(cl.acquireLeaseAsync(kKey).get().lease.has_value());
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 4; ++i) {
      try {
        const LeaseDecision d = cl.acquireLeaseAsync(kKey).get();
        EXPECT_TRUE(d.decision.byPolicy);
        EXPECT_EQ(d.decision.allowed, d.lease.has_value());
        (d.decision.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    EXPECT_EQ(allowed, policy == FailurePolicy::Allow ? 4 : 0);
    EXPECT_EQ(denied, policy == FailurePolicy::Deny ? 4 : 0);
    EXPECT_EQ(thrown, policy == FailurePolicy::Throw ? 4 : 0);
    EXPECT_TRUE(cl.failureStats().degraded);
  }
}

TEST_F(LimiterLeases, AKilledHolderProcessFreesItsLeasesAfterTheTtlNeverBefore) {
  Limiter cl = leases(3, milliseconds(300));
  const std::string key = cl.redisKey(kKey);
  auto holder = std::make_unique<ChildProcess>(
      std::vector<std::string>{REDLIMIT_CONCURRENCY_WORKER, "hold", server().uri(), cl.name(), kKey, "3", "300", "3"});
  // Wait until the holder has its 3 leases, then SIGKILL it (the destructor kills and reaps).
  for (int i = 0; i < 6000 && zcard(key) < 3; ++i) sleepMs(5);
  ASSERT_EQ(zcard(key), 3);
  holder.reset();
  const std::vector<std::int64_t> theirs = leaseExpiries(admin(), key);
  ASSERT_EQ(theirs.size(), 3u);
  // Each decision at server time t: allowed exactly when more of the dead holder's leases have
  // expired by t than this handle holds already.
  std::vector<Lease> mine;
  for (int i = 0; i < 4000 && mine.size() < 3; ++i) {
    const LeaseDecision d = cl.acquireLease(kKey, milliseconds(60000));
    const std::int64_t t = d.decision.time.count();
    const auto expired =
        static_cast<std::size_t>(std::count_if(theirs.begin(), theirs.end(), [&](std::int64_t e) { return e <= t; }));
    ASSERT_EQ(d.decision.allowed, mine.size() < expired) << "at " << t << ", first expiry " << theirs[0];
    if (d.decision.allowed) {
      mine.push_back(*d.lease);
    } else {
      sleepMs(5);
    }
  }
  ASSERT_EQ(mine.size(), 3u);
  EXPECT_FALSE(cl.acquireLease(kKey).lease.has_value());
  for (const Lease& l : mine) EXPECT_TRUE(cl.release(kKey, l));
  EXPECT_FALSE(exists(admin(), key));
}

TEST_F(LimiterLeases, ThreeProcessesOfFourThreadsNeverHoldMoreThanTheLimit) {
  constexpr int kLimit = 5;
  Limiter cl = leases(kLimit, milliseconds(20000));
  const std::string key = cl.redisKey(kKey);
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{REDLIMIT_CONCURRENCY_WORKER, "churn", server().uri(), cl.name(), kKey,
                                 std::to_string(kLimit), "20000", "4", "1500"}));
  }
  // Watch from Redis while they run: leases in the set (live or not) and live ones.
  std::atomic<bool> done{false};
  std::int64_t most = 0, samples = 0;
  std::thread watcher([&] {
    while (!done.load()) {
      const std::int64_t card = detail::command(admin(), {"ZCARD", key}).integer;
      most = std::max({most, card, cl.held(kKey)});
      ++samples;
    }
  });
  long long grants = 0;
  for (auto& w : workers) {
    std::string out;
    EXPECT_EQ(w->wait(out), 0) << out;
    std::istringstream in(out);
    long long g = -1, denials = -1, errors = -1, maxInProcess = -1;
    in >> g >> denials >> errors >> maxInProcess;
    EXPECT_GT(g, 0) << out;
    EXPECT_EQ(errors, 0) << out;
    EXPECT_LE(maxInProcess, kLimit) << out;
    grants += g;
  }
  done.store(true);
  watcher.join();
  EXPECT_GT(samples, 0);
  EXPECT_LE(most, kLimit);
  EXPECT_GT(most, 0) << "the watcher saw leases held";
  EXPECT_GT(grants, kLimit);
  EXPECT_FALSE(exists(admin(), key)) << "every lease was released";
}

TEST_F(LimiterLeases, ShadowModeLetsADenialThroughWithoutTakingAPlace) {
  Limiter::Options options;
  options.monitor.shadow = true;
  std::atomic<int> reported{0};
  options.monitor.onShadowDenial = [&](const LimiterMonitor::ShadowDenial&) { reported.fetch_add(1); };
  Limiter cl = leases(1, milliseconds(10000), options);
  const LeaseDecision first = cl.acquireLease(kKey);
  ASSERT_TRUE(first.decision.allowed);
  EXPECT_FALSE(first.decision.shadowDenied);
  const LeaseDecision second = cl.acquireLease(kKey);
  EXPECT_TRUE(second.decision.allowed);
  EXPECT_TRUE(second.decision.shadowDenied);
  ASSERT_TRUE(second.lease.has_value());
  EXPECT_TRUE(second.lease->shadowDenied);
  EXPECT_EQ(second.lease->expiresAt.count(), 0);
  EXPECT_EQ(reported.load(), 1);
  EXPECT_EQ(cl.held(kKey), 1) << "the denial took no place";
  EXPECT_FALSE(cl.release(kKey, *second.lease));
  EXPECT_TRUE(cl.release(kKey, *first.lease));
  const LimiterMetrics::Snapshot m = cl.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 1u);
  EXPECT_EQ(m.denied, 1u);
  EXPECT_EQ(m.shadowDenied, 1u);
}
