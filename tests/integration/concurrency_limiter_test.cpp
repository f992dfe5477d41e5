// ConcurrencyLimiter against a real redis-server: the limit, leases that are renewed, released and
// that expire, bad input and corrupted keys, the failure policy, a crashed holder process, and
// 3 processes x 4 threads. Waits are for conditions seen on the server's clock, never on elapsed
// time.
#include <algorithm>
#include <atomic>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/concurrency_limiter.hpp"
#include "redlimit_lua.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

template <class E>
struct Tag {
  using type = E;
};

// A valid lease id that no acquire made.
std::string fakeId(int i) {
  std::string id = std::to_string(i);
  return std::string(32 - id.size(), 'a') + id;
}

// The expiries (epoch µs) Redis holds for the limiter's leases, ascending.
std::vector<std::int64_t> expiries(Client& c, const std::string& key) {
  const Reply r = detail::command(c, {"ZRANGE", key, "0", "-1", "WITHSCORES"});
  std::vector<std::int64_t> out;
  for (std::size_t i = 1; i < r.elements.size(); i += 2) out.push_back(std::stoll(r.elements[i].str));
  return out;
}

}  // namespace

class ConcurrencyLimiterTest : public RedisTest {
 protected:
  std::int64_t zcard(const std::string& key) { return raw({"ZCARD", key}).integer; }
};

TEST_F(ConcurrencyLimiterTest, AtMostLimitLeasesAreHeldAndADenialSaysWhenOneExpires) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(3, milliseconds(10000)));
  std::vector<Lease> leases;
  for (int i = 0; i < 3; ++i) {
    const LeaseDecision d = cl.decide();
    ASSERT_TRUE(d.decision.allowed);
    ASSERT_TRUE(d.lease.has_value());
    EXPECT_EQ(d.lease->id.size(), 32u);
    EXPECT_EQ(d.lease->expiresAt.count(), d.decision.time.count() + 10000000);
    EXPECT_EQ(d.decision.remaining, 2 - i);
    EXPECT_EQ(d.decision.limit, 3);
    EXPECT_FALSE(d.decision.byPolicy);
    leases.push_back(*d.lease);
  }
  const LeaseDecision denied = cl.decide();
  EXPECT_FALSE(denied.decision.allowed);
  EXPECT_FALSE(denied.lease.has_value());
  EXPECT_EQ(denied.decision.remaining, 0);
  // Until the soonest lease expires, exactly.
  EXPECT_EQ(denied.decision.retryAfter.count(), leases[0].expiresAt.count() - denied.decision.time.count());
  EXPECT_EQ(denied.decision.resetAfter.count(), leases[2].expiresAt.count() - denied.decision.time.count());
  EXPECT_FALSE(cl.tryAcquire().has_value());
  EXPECT_EQ(cl.held(), 3);
  EXPECT_EQ(cl.available(), 0);
  EXPECT_EQ(zcard(name()), 3);
  // The key expires with the last lease, not before it.
  const std::int64_t pttl = raw({"PTTL", name()}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 10000);
  // A release frees a place for someone else.
  EXPECT_TRUE(cl.release(leases[1]));
  EXPECT_EQ(cl.available(), 1);
  EXPECT_TRUE(cl.tryAcquire().has_value());
  EXPECT_FALSE(cl.tryAcquire().has_value());
  // Another handle on the same name shares the leases.
  ConcurrencyLimiter other(newClient(), name(), leaseConfig(3, milliseconds(10000)));
  EXPECT_FALSE(other.tryAcquire().has_value());
  EXPECT_EQ(other.held(), 3);
  // Metrics (one series per name): 4 granted, 4 denied (one of them `other`'s), one round trip each.
  ASSERT_NE(cl.monitor().metrics(), nullptr);
  const LimiterMetricsSnapshot m = cl.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 4u);
  EXPECT_EQ(m.denied, 4u);
  EXPECT_EQ(m.roundTrips, 8u);
}

TEST_F(ConcurrencyLimiterTest, ReleaseIsIdempotentAndTheLastReleaseDeletesTheKey) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(2, milliseconds(10000)));
  const std::optional<Lease> a = cl.tryAcquire();
  const std::optional<Lease> b = cl.tryAcquire();
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(cl.release(*a));
  EXPECT_FALSE(cl.release(*a)) << "a second release is a no-op";
  EXPECT_FALSE(cl.release(*a));
  EXPECT_EQ(cl.held(), 1);
  EXPECT_TRUE(cl.release(*b));
  EXPECT_FALSE(exists(admin(), name())) << "no lease live: no key";
  EXPECT_FALSE(cl.release(*b));
  EXPECT_EQ(cl.held(), 0);
  EXPECT_EQ(cl.available(), 2);
  Lease never;
  never.id = fakeId(1);
  EXPECT_FALSE(cl.release(never));
  EXPECT_FALSE(exists(admin(), name())) << "a release of an unknown lease writes nothing";
}

TEST_F(ConcurrencyLimiterTest, RenewExtendsALiveLeaseOnly) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(1, milliseconds(100)));
  std::optional<Lease> lease = cl.tryAcquire();
  ASSERT_TRUE(lease);
  const microseconds first = lease->expiresAt;
  ASSERT_TRUE(cl.renew(*lease, milliseconds(60000)));
  EXPECT_GT(lease->expiresAt, first);
  EXPECT_EQ(expiries(admin(), name()), std::vector<std::int64_t>{lease->expiresAt.count()});
  EXPECT_GT(raw({"PTTL", name()}).integer, 1000) << "the key lives as long as the renewed lease";
  // Past the first expiry on the server's clock, the renewed lease still holds its place.
  while (serverTimeUs(admin()) <= first.count()) sleepMs(5);
  EXPECT_FALSE(cl.tryAcquire().has_value());
  EXPECT_EQ(cl.held(), 1);
  // Renewed with the configuration's TTL: now + 100 ms (shorter), and the key's TTL follows.
  ASSERT_TRUE(cl.renew(*lease));
  EXPECT_LE(raw({"PTTL", name()}).integer, 100);
  // An expired lease cannot be renewed, and is gone.
  const microseconds expiry = lease->expiresAt;
  while (serverTimeUs(admin()) <= expiry.count()) sleepMs(5);
  EXPECT_FALSE(cl.renew(*lease));
  EXPECT_EQ(lease->expiresAt, expiry) << "unchanged when not renewed";
  EXPECT_FALSE(exists(admin(), name()));
  EXPECT_FALSE(cl.release(*lease));
  // A released lease cannot be renewed either.
  std::optional<Lease> again = cl.tryAcquire();
  ASSERT_TRUE(again);
  EXPECT_TRUE(cl.release(*again));
  EXPECT_FALSE(cl.renew(*again));
  EXPECT_FALSE(exists(admin(), name()));
}

TEST_F(ConcurrencyLimiterTest, AnExpiredLeaseFreesItsPlaceAtItsExpiryAndNeverBefore) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(2, milliseconds(10000)));
  std::optional<Lease> a = cl.tryAcquire(milliseconds(150));
  const std::optional<Lease> b = cl.tryAcquire(milliseconds(300));
  ASSERT_TRUE(a && b);
  // Each decision is made at d.time on the server's clock: a place is free exactly when one of
  // the two leases has expired by then.
  std::vector<Lease> mine;
  for (int i = 0; i < 2000 && mine.size() < 2; ++i) {
    const LeaseDecision d = cl.decide();
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
  EXPECT_FALSE(cl.renew(*a)) << "expired";
  EXPECT_EQ(cl.held(), 2);
  EXPECT_EQ(zcard(name()), 2) << "the expired leases were reclaimed";
}

TEST_F(ConcurrencyLimiterTest, ExpiredLeasesAreReclaimedAtMost100PerCall) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(5, milliseconds(10000)));
  // 250 expired leases, as crashed holders leave them.
  const std::int64_t past = serverTimeUs(admin()) - 1000000;
  for (int i = 0; i < 250; ++i) {
    (void)raw({"ZADD", name(), std::to_string(past + i), fakeId(i)});
  }
  EXPECT_EQ(cl.held(), 0) << "expired leases are not held";
  std::optional<Lease> lease = cl.tryAcquire();
  ASSERT_TRUE(lease);
  EXPECT_EQ(zcard(name()), 151);
  ASSERT_TRUE(cl.renew(*lease));
  EXPECT_EQ(zcard(name()), 51);
  EXPECT_TRUE(cl.release(*lease));
  EXPECT_FALSE(exists(admin(), name())) << "no live lease left: the key goes at once";
}

TEST_F(ConcurrencyLimiterTest, AnAcquireSentTwiceTakesOnePlace) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(2, milliseconds(10000)));
  const std::string id = fakeId(7);
  const std::vector<std::string> args{"acquire", "", "C", id, "2", "10000"};
  const Reply first = runOneKey(admin(), detail::lua::concurrency, name(), args);
  const Reply second = runOneKey(admin(), detail::lua::concurrency, name(), args);
  EXPECT_EQ(first.elements.at(0).integer, 1);
  EXPECT_EQ(second.elements.at(0).integer, 1);
  EXPECT_EQ(second.elements.at(1).integer, first.elements.at(1).integer) << "the same lease";
  EXPECT_EQ(cl.held(), 1);
  EXPECT_TRUE(cl.tryAcquire().has_value());
  EXPECT_FALSE(cl.tryAcquire().has_value());
}

TEST_F(ConcurrencyLimiterTest, BadInputIsRefusedBeforeAnythingIsSent) {
  const ConcurrencyConfig bad[] = {
      leaseConfig(0, milliseconds(1000)),
      leaseConfig(-1, milliseconds(1000)),
      leaseConfig(ConcurrencyLimiter::kMaxLimit + 1, milliseconds(1000)),
      leaseConfig(1, milliseconds(0)),
      leaseConfig(1, milliseconds(-5)),
      leaseConfig(1, ConcurrencyLimiter::kMaxLeaseTtl + milliseconds(1)),
  };
  for (const ConcurrencyConfig& c : bad) {
    EXPECT_THROW([&] { ConcurrencyLimiter cl(client(), name(), c); }(), InvalidArgument);
    EXPECT_THROW(ConcurrencyLimiter::validateConfig(c), InvalidArgument);
  }
  EXPECT_THROW([&] { ConcurrencyLimiter cl(nullptr, name(), leaseConfig(1, milliseconds(1000))); }(), InvalidArgument);
  EXPECT_THROW([&] { ConcurrencyLimiter cl(client(), "", leaseConfig(1, milliseconds(1000))); }(), InvalidArgument);
  EXPECT_THROW([&] { ConcurrencyLimiter cl(client(), std::string(1025, 'x'), leaseConfig(1, milliseconds(1000))); }(),
               InvalidArgument);

  ConcurrencyLimiter cl(client(), name(), leaseConfig(2, milliseconds(1000)));
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)cl.tryAcquire(milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)cl.decide(ConcurrencyLimiter::kMaxLeaseTtl + milliseconds(1)), InvalidArgument);
  Lease bogus;
  for (const std::string& id : {std::string(), std::string("abc"), std::string(32, 'A'), std::string(32, 'g'),
                                std::string(33, 'a'), fakeId(1) + "\n"}) {
    bogus.id = id;
    EXPECT_THROW((void)cl.renew(bogus), InvalidArgument) << id;
    EXPECT_THROW((void)cl.release(bogus), InvalidArgument) << id;
  }
  bogus.id = fakeId(1);
  EXPECT_THROW((void)cl.renew(bogus, milliseconds(0)), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
  EXPECT_FALSE(exists(admin(), name()));
  // The script checks its arguments too (another client, or a hand-made call).
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::concurrency, name(), {"acquire", "", "C", "xyz", "2", "10"}),
               InvalidArgument);
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::concurrency, name(), {"acquire", "", "C", fakeId(1), "0", "10"}),
               InvalidArgument);
  EXPECT_THROW((void)runOneKey(admin(), detail::lua::concurrency, name(), {"renew", "", "C", fakeId(1), "0"}),
               InvalidArgument);
  EXPECT_FALSE(exists(admin(), name()));
}

TEST_F(ConcurrencyLimiterTest, CorruptedKeysAreTypedErrorsAndNothingIsWritten) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(3, milliseconds(10000)));
  Lease lease;
  lease.id = fakeId(3);
  auto expectRefused = [&](const char* what, auto tag) {
    SCOPED_TRACE(what);
    using E = typename decltype(tag)::type;
    const std::string before = keyState(admin(), name());
    EXPECT_THROW((void)cl.decide(), E);
    EXPECT_THROW((void)cl.tryAcquire(), E);
    EXPECT_THROW((void)cl.renew(lease), E);
    EXPECT_THROW((void)cl.release(lease), E);
    EXPECT_EQ(keyState(admin(), name()), before) << "nothing written";
    (void)raw({"DEL", name()});
  };
  // Another Redis type; a string (another kind of limiter): InvalidConfigError naming the key.
  (void)raw({"HSET", name(), "limit", "3"});
  EXPECT_THROW((void)cl.held(), InvalidConfigError);
  try {
    (void)cl.decide();
    ADD_FAILURE() << "decide succeeded on a hash";
  } catch (const InvalidConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
  }
  expectRefused("hash", Tag<InvalidConfigError>{});
  (void)raw({"SET", name(), gcraValue('G', 5, 5, 1000, 0)});  // a GCRA key
  expectRefused("gcra", Tag<InvalidConfigError>{});
  // A member that is not a lease id (expired: read by the reclaim), and one among the latest.
  (void)raw({"ZADD", name(), "1", "hello"});
  expectRefused("expired member", Tag<InvalidStateError>{});
  (void)raw({"ZADD", name(), std::to_string(serverTimeUs(admin()) + 5000000), "not-a-lease"});
  expectRefused("latest member", Tag<InvalidStateError>{});
  // Scores that are not expiries: fractional, infinite, or further ahead than any TTL.
  (void)raw({"ZADD", name(), "1.5", fakeId(1)});
  expectRefused("fractional score", Tag<InvalidStateError>{});
  (void)raw({"ZADD", name(), "+inf", fakeId(1)});
  expectRefused("infinite score", Tag<InvalidStateError>{});
  (void)raw({"ZADD", name(), "8000000000000000", fakeId(1)});
  expectRefused("far future score", Tag<InvalidStateError>{});
  // A healthy key again works.
  EXPECT_TRUE(cl.tryAcquire().has_value());
}

TEST_F(ConcurrencyLimiterTest, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    ConcurrencyLimiterOptions options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    std::atomic<int> degraded{0};
    options.failure.onHealthChange = [&](const HealthEvent& e) {
      if (e.kind == HealthEvent::Kind::Degraded) degraded.fetch_add(1);
    };
    ConcurrencyLimiter cl(c, "policy", leaseConfig(3, milliseconds(60000)), options);
    std::optional<Lease> held = cl.tryAcquire();
    ASSERT_TRUE(held);
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const LeaseDecision d = cl.decide();
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
    EXPECT_THROW((void)cl.renew(*held), IoError);
    EXPECT_THROW((void)cl.release(*held), IoError);
    EXPECT_THROW((void)cl.held(), IoError);
    EXPECT_TRUE(cl.failureStats().degraded);
    EXPECT_EQ(cl.failureStats().outages, 1u);
    EXPECT_EQ(degraded.load(), 1);
    // Back again (empty: no persistence): the limiter recovers on the next probe.
    server.restart();
    bool recovered = false;
    for (int i = 0; i < 200 && !recovered; ++i) {
      try {
        recovered = !cl.decide().decision.byPolicy;
      } catch (const IoError&) {
      }
      if (!recovered) sleepMs(10);
    }
    EXPECT_TRUE(recovered);
    EXPECT_FALSE(cl.failureStats().degraded);
  }
}

TEST_F(ConcurrencyLimiterTest, AsyncAcquisitionsHoldTheLimitAndGetTheirLeases) {
  ConcurrencyLimiter cl(client(), name(), leaseConfig(3, milliseconds(60000)));
  std::vector<std::future<LeaseDecision>> all;
  for (int i = 0; i < 10; ++i) all.push_back(cl.decideAsync());
  std::vector<Lease> leases;
  int denied = 0;
  for (auto& f : all) {
    const LeaseDecision d = f.get();
    EXPECT_FALSE(d.decision.byPolicy);
    EXPECT_EQ(d.decision.allowed, d.lease.has_value());
    if (d.lease) {
      EXPECT_GT(d.lease->expiresAt.count(), d.decision.time.count());
      leases.push_back(*d.lease);
    } else {
      ++denied;
      EXPECT_GT(d.decision.retryAfter.count(), 0);
    }
  }
  EXPECT_EQ(leases.size(), 3u);
  EXPECT_EQ(denied, 7);
  EXPECT_EQ(cl.held(), 3);
  for (const Lease& l : leases) EXPECT_TRUE(cl.release(l)) << "each lease the reply named is the one Redis holds";
  EXPECT_EQ(cl.held(), 0);
  // The callback form, with a TTL of its own; and a refused TTL comes back through the callback.
  std::promise<LeaseDecision> got;
  cl.decideAsync(milliseconds(5000), [&](LeaseDecision d, const std::exception_ptr& e) {
    if (e) {
      got.set_exception(e);
    } else {
      got.set_value(std::move(d));
    }
  });
  const LeaseDecision d = got.get_future().get();
  ASSERT_TRUE(d.lease.has_value());
  EXPECT_EQ(d.lease->expiresAt.count(), d.decision.time.count() + 5000000);
  EXPECT_THROW((void)cl.decideAsync(milliseconds(0)).get(), InvalidArgument);
  const LimiterMetricsSnapshot m = cl.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 4u);
  EXPECT_EQ(m.denied, 7u);
}

TEST_F(ConcurrencyLimiterTest, AsyncAcquisitionsOfAnUnreachableRedisAreDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    ConcurrencyLimiterOptions options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    ConcurrencyLimiter cl(c, "policy", leaseConfig(3, milliseconds(60000)), options);
    ASSERT_TRUE(cl.decideAsync().get().lease.has_value());
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 4; ++i) {
      try {
        const LeaseDecision d = cl.decideAsync().get();
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

TEST_F(ConcurrencyLimiterTest, AKilledHolderProcessFreesItsLeasesAfterTheTtlNeverBefore) {
  const std::string n = name();
  ConcurrencyLimiter cl(client(), n, leaseConfig(3, milliseconds(300)));
  auto holder = std::make_unique<ChildProcess>(
      std::vector<std::string>{REDLIMIT_CONCURRENCY_WORKER, "hold", server().uri(), n, "3", "300", "3"});
  // Wait until the holder has its 3 leases, then SIGKILL it (the destructor kills and reaps).
  for (int i = 0; i < 6000 && zcard(n) < 3; ++i) sleepMs(5);
  ASSERT_EQ(zcard(n), 3);
  holder.reset();
  const std::vector<std::int64_t> theirs = expiries(admin(), n);
  ASSERT_EQ(theirs.size(), 3u);
  // Each decision at server time t: allowed exactly when more of the dead holder's leases have
  // expired by t than this handle holds already.
  std::vector<Lease> mine;
  for (int i = 0; i < 4000 && mine.size() < 3; ++i) {
    const LeaseDecision d = cl.decide(milliseconds(60000));
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
  EXPECT_FALSE(cl.tryAcquire().has_value());
  for (const Lease& l : mine) EXPECT_TRUE(cl.release(l));
  EXPECT_FALSE(exists(admin(), n));
}

TEST_F(ConcurrencyLimiterTest, ThreeProcessesOfFourThreadsNeverHoldMoreThanTheLimit) {
  const std::string n = name();
  constexpr int kLimit = 5;
  ConcurrencyLimiter cl(client(), n, leaseConfig(kLimit, milliseconds(20000)));
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        REDLIMIT_CONCURRENCY_WORKER, "churn", server().uri(), n, std::to_string(kLimit), "20000", "4", "1500"}));
  }
  // Watch from Redis while they run: leases in the set (live or not) and live ones.
  std::atomic<bool> done{false};
  std::int64_t most = 0, samples = 0;
  std::thread watcher([&] {
    while (!done.load()) {
      const std::int64_t card = detail::command(admin(), {"ZCARD", n}).integer;
      most = std::max({most, card, cl.held()});
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
  EXPECT_FALSE(exists(admin(), n)) << "every lease was released";
}

TEST_F(ConcurrencyLimiterTest, ShadowModeLetsADenialThroughWithoutTakingAPlace) {
  ConcurrencyLimiterOptions options;
  options.monitor.shadow = true;
  std::atomic<int> reported{0};
  options.monitor.onShadowDenial = [&](const ShadowDenial&) { reported.fetch_add(1); };
  ConcurrencyLimiter cl(client(), name(), leaseConfig(1, milliseconds(10000)), options);
  const LeaseDecision first = cl.decide();
  ASSERT_TRUE(first.decision.allowed);
  EXPECT_FALSE(first.decision.shadowDenied);
  const LeaseDecision second = cl.decide();
  EXPECT_TRUE(second.decision.allowed);
  EXPECT_TRUE(second.decision.shadowDenied);
  ASSERT_TRUE(second.lease.has_value());
  EXPECT_TRUE(second.lease->shadowDenied);
  EXPECT_EQ(second.lease->expiresAt.count(), 0);
  EXPECT_EQ(reported.load(), 1);
  EXPECT_EQ(cl.held(), 1) << "the denial took no place";
  EXPECT_FALSE(cl.release(*second.lease));
  EXPECT_TRUE(cl.release(*first.lease));
  const LimiterMetricsSnapshot m = cl.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 1u);
  EXPECT_EQ(m.denied, 1u);
  EXPECT_EQ(m.shadowDenied, 1u);
}
