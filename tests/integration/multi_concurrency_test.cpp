// Concurrency limits inside a MultiLimit ("10 per second AND at most 3 at once, per tenant")
// against a real redis-server: all or nothing across rate and concurrency limits, the lease of a
// decision renewed and released in every concurrency limit, a lease that is no longer live in one
// limit ending in all, threads that never hold more than the limit (checked in Redis), the calls
// a MultiLimit with leases refuses, corrupted lease sets, the failure policy and shadow mode.
// Waits are for conditions seen on the server's clock, never on elapsed time.
#include <algorithm>
#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// A lease's expiry in the lease set `key` (epoch µs), or -1 if the set does not hold it.
std::int64_t leaseScore(Client& c, const std::string& key, const std::string& id) {
  const Reply r = detail::command(c, {"ZSCORE", key, id});
  return r.isNil() ? -1 : std::stoll(r.str);
}

// Waits (polling the server's clock) until the server's time is past `epochUs`.
void untilServerTimePasses(Client& c, std::int64_t epochUs) {
  while (serverTimeUs(c) <= epochUs) std::this_thread::sleep_for(milliseconds(5));
}

}  // namespace

class MultiConcurrencyTest : public RedisTest {
 protected:
  static constexpr const char* kTenant = "t";  // the key every limit of a test is decided on
  /// A Limiter of this test under `policy`, named after `suffix`.
  Limiter limiter(const std::string& suffix, const Policy& policy) {
    return Limiter(client(), limiterName(suffix), policy);
  }
  /// `limits` on kTenant each.
  static MultiLimit onTenant(const std::vector<Limiter>& limits, const MultiLimit::Options& options = {}) {
    return MultiLimit(limits, options).on(std::vector<std::string_view>(limits.size(), kTenant));
  }
  /// The Redis key of kTenant under `l`.
  static std::string key(const Limiter& l) { return l.redisKey(kTenant); }
  std::int64_t zcard(const std::string& k) { return raw({"ZCARD", k}).integer; }
};

TEST_F(MultiConcurrencyTest, TenPerSecondAndThreeAtOnceDecideTogether) {
  Limiter perSecond = limiter("rate", Policy::gcra(10, milliseconds(1000), 10));
  Limiter inFlight = limiter("inflight", Policy::concurrency(3, milliseconds(10000)));
  MultiLimit both = onTenant({perSecond, inFlight});
  std::vector<Lease> leases;
  for (int i = 0; i < 3; ++i) {
    const MultiDecision d = both.decide();
    ASSERT_TRUE(d.allowed) << i;
    ASSERT_TRUE(d.lease.has_value());
    EXPECT_EQ(d.lease->id.size(), 32u);
    EXPECT_FALSE(d.lease->byPolicy);
    EXPECT_EQ(d.lease->expiresAt.count(), d.time.count() + 10'000'000);
    EXPECT_EQ(leaseScore(admin(), key(inFlight), d.lease->id), d.lease->expiresAt.count());
    ASSERT_EQ(d.limits.size(), 2u);
    EXPECT_EQ(d.limits[1].remaining, 2 - i) << "places free after it";
    EXPECT_EQ(d.limits[1].limit, 3);
    EXPECT_EQ(d.limit, 3) << "the least limit: 3 places";
    EXPECT_EQ(d.remaining, 2 - i);
    leases.push_back(*d.lease);
  }
  // The fourth: the rate alone would grant it, the places deny it; nothing is taken from either.
  const std::string rateBefore = keyState(admin(), key(perSecond));
  const MultiDecision denied = both.decide();
  EXPECT_EQ(keyState(admin(), key(perSecond)), rateBefore) << "the rate limit is not charged for the denial";
  EXPECT_FALSE(denied.allowed);
  EXPECT_FALSE(denied.lease.has_value());
  EXPECT_EQ(denied.deniedBy, 1u);
  EXPECT_TRUE(denied.limits[0].allowed);
  EXPECT_FALSE(denied.limits[1].allowed);
  EXPECT_EQ(denied.retryAfter.count(), leases[0].expiresAt.count() - denied.time.count())
      << "until the soonest lease expires, exactly";
  EXPECT_EQ(denied.limits[1].resetAfter.count(), leases[2].expiresAt.count() - denied.time.count());
  EXPECT_EQ(zcard(key(inFlight)), 3);
  // A release frees a place at once, once.
  EXPECT_TRUE(both.release(leases[0]));
  EXPECT_FALSE(both.release(leases[0]));
  EXPECT_EQ(zcard(key(inFlight)), 2);
  const MultiDecision again = both.decide();
  ASSERT_TRUE(again.allowed);
  ASSERT_TRUE(again.lease.has_value());
  EXPECT_NE(again.lease->id, leases[0].id);
  for (const Lease& l : {leases[1], leases[2], *again.lease}) EXPECT_TRUE(both.release(l));
  EXPECT_EQ(raw({"EXISTS", key(inFlight)}).integer, 0) << "the last release deletes the lease set";
  // The MultiLimit's leases are the Limiter's: its own calls see and free them.
  const MultiDecision shared = both.decide();
  ASSERT_TRUE(shared.lease.has_value());
  EXPECT_EQ(inFlight.held(kTenant), 1);
  EXPECT_TRUE(inFlight.release(kTenant, *shared.lease));
}

TEST_F(MultiConcurrencyTest, ADenialByTheRateTakesNoPlace) {
  Limiter slow = limiter("rate", Policy::gcra(2, milliseconds(60000), 2));
  Limiter inFlight = limiter("inflight", Policy::concurrency(5, milliseconds(10000)));
  MultiLimit both = onTenant({inFlight, slow});
  ASSERT_TRUE(both.decide().allowed);
  ASSERT_TRUE(both.decide().allowed);
  const std::string before = keyState(admin(), key(inFlight));
  const MultiDecision d = both.decide();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.deniedBy, 1u) << "the rate limit, second in the list";
  EXPECT_TRUE(d.limits[0].allowed) << "places were free";
  EXPECT_EQ(d.limits[0].remaining, 3);
  EXPECT_FALSE(d.lease.has_value());
  EXPECT_EQ(keyState(admin(), key(inFlight)), before) << "no place taken, nothing written";
  EXPECT_EQ(zcard(key(inFlight)), 2);
  // Permits above one still take one place: a concurrency limit counts calls in flight.
  Limiter wideRate = limiter("wide", Policy::gcra(100, milliseconds(60000), 100));
  MultiLimit wide = onTenant({inFlight, wideRate});
  const MultiDecision many = wide.decide(40);
  ASSERT_TRUE(many.allowed);
  EXPECT_EQ(many.limits[0].remaining, 2);
  EXPECT_EQ(many.limits[1].remaining, 60);
  EXPECT_EQ(zcard(key(inFlight)), 3);
}

TEST_F(MultiConcurrencyTest, ALeaseIsRenewedInEveryLimitAndEndsWhenOnePartExpires) {
  Limiter perUser = limiter("user", Policy::concurrency(2, milliseconds(10000)));
  Limiter perTenant = limiter("tenant", Policy::concurrency(5, milliseconds(150)));
  MultiLimit both = onTenant({perUser, perTenant});
  MultiDecision d = both.decide();
  ASSERT_TRUE(d.lease.has_value());
  Lease lease = *d.lease;
  EXPECT_EQ(lease.expiresAt.count(), d.time.count() + 150'000) << "the soonest of the limits' expiries";
  EXPECT_EQ(leaseScore(admin(), key(perUser), lease.id), d.time.count() + 10'000'000);
  // renew(lease): each limit's own TTL, from one server time.
  ASSERT_TRUE(both.renew(lease));
  const std::int64_t user = leaseScore(admin(), key(perUser), lease.id);
  const std::int64_t tenant = leaseScore(admin(), key(perTenant), lease.id);
  EXPECT_EQ(lease.expiresAt.count(), tenant);
  EXPECT_EQ(user - tenant, 10'000'000 - 150'000);
  EXPECT_GE(tenant, d.lease->expiresAt.count());
  // renew(lease, ttl): one TTL in all.
  ASSERT_TRUE(both.renew(lease, milliseconds(5000)));
  EXPECT_EQ(leaseScore(admin(), key(perUser), lease.id), leaseScore(admin(), key(perTenant), lease.id));
  EXPECT_EQ(lease.expiresAt.count(), leaseScore(admin(), key(perUser), lease.id));
  // Back to the limits' own TTLs, then the tenant's part runs out: the lease is over in both.
  ASSERT_TRUE(both.renew(lease));
  untilServerTimePasses(admin(), lease.expiresAt.count());
  EXPECT_EQ(perUser.held(kTenant), 1) << "still live in the user's limit alone";
  Lease copy = lease;
  EXPECT_FALSE(both.renew(copy));
  EXPECT_EQ(copy.expiresAt, lease.expiresAt) << "unchanged when not renewed";
  EXPECT_EQ(leaseScore(admin(), key(perUser), lease.id), -1) << "removed from every limit, for good";
  EXPECT_EQ(perUser.held(kTenant), 0);
  EXPECT_FALSE(both.release(lease));
  // A release of a live lease frees both places; a second is a no-op.
  d = both.decide();
  ASSERT_TRUE(d.lease.has_value());
  EXPECT_EQ(perUser.held(kTenant), 1);
  EXPECT_EQ(perTenant.held(kTenant), 1);
  EXPECT_TRUE(both.release(*d.lease));
  EXPECT_FALSE(both.release(*d.lease));
  EXPECT_EQ(perUser.held(kTenant), 0);
  EXPECT_EQ(perTenant.held(kTenant), 0);
}

TEST_F(MultiConcurrencyTest, ALowerLimitWaitsUntilEnoughLeasesExpire) {
  // Three leases held under a limit of 3: a handle with a limit of 1 can take a place once none of
  // them is live (when the latest expires), one with a limit of 2 once one is left (the second).
  Limiter three = limiter("jobs", Policy::concurrency(3, milliseconds(60000)));
  std::vector<Lease> held;
  for (int ttl : {10000, 20000, 30000}) {
    const LeaseDecision d = three.acquireLease(kTenant, milliseconds(ttl));
    ASSERT_TRUE(d.lease.has_value());
    held.push_back(*d.lease);
  }
  Limiter one = limiter("jobs", Policy::concurrency(1, milliseconds(60000)));
  const LeaseDecision alone = one.acquireLease(kTenant);
  ASSERT_FALSE(alone.decision.allowed);
  EXPECT_EQ(alone.decision.retryAfter.count(), held[2].expiresAt.count() - alone.decision.time.count());
  MultiLimit multi = onTenant({one});
  const MultiDecision m = multi.decide();
  ASSERT_FALSE(m.allowed);
  EXPECT_EQ(m.retryAfter.count(), held[2].expiresAt.count() - m.time.count());
  Limiter two = limiter("jobs", Policy::concurrency(2, milliseconds(60000)));
  const LeaseDecision second = two.acquireLease(kTenant);
  EXPECT_EQ(second.decision.retryAfter.count(), held[1].expiresAt.count() - second.decision.time.count());
}

TEST_F(MultiConcurrencyTest, ThreadsNeverHoldMoreThanTheLimitCheckedInRedis) {
  constexpr int kThreads = 6;
  constexpr int kRounds = 25;
  Limiter budget = limiter("rate", Policy::gcra(1000, milliseconds(360'000'000), 1000));
  Limiter inFlight = limiter("inflight", Policy::concurrency(3, milliseconds(60000)));
  MultiLimit both = onTenant({budget, inFlight});
  std::atomic<int> granted{0}, denied{0}, over{0}, errors{0};
  std::atomic<std::int64_t> most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        try {
          const MultiDecision d = both.decide();
          if (!d.allowed) {
            denied.fetch_add(1);
            continue;
          }
          granted.fetch_add(1);
          // Held now, as Redis counts them (every lease is live for a minute).
          const std::int64_t n = detail::command(admin(), {"ZCARD", key(inFlight)}).integer;
          if (n > 3) over.fetch_add(1);
          std::int64_t seen = most.load();
          while (n > seen && !most.compare_exchange_weak(seen, n)) {
          }
          if (!both.release(*d.lease)) errors.fetch_add(1);
        } catch (const Error&) {
          errors.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(over.load(), 0) << "Redis held more than 3 leases at once";
  EXPECT_GE(most.load(), 1);
  EXPECT_EQ(granted.load() + denied.load(), kThreads * kRounds);
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(zcard(key(inFlight)), 0);
  EXPECT_EQ(budget.peek(kTenant).remaining, 1000 - granted.load()) << "the rate limit was charged for grants only";
}

TEST_F(MultiConcurrencyTest, CallsThatWaitOrLoseTheLeaseAreRefusedBeforeAnythingIsSent) {
  Limiter rate = limiter("rate", Policy::gcra(10, milliseconds(1000), 10));
  Limiter inFlight = limiter("inflight", Policy::concurrency(3, milliseconds(10000)));
  MultiLimit both = onTenant({rate, inFlight});
  MultiLimit rateOnly = onTenant({rate});
  Lease bad;
  bad.id = "not-a-lease-id";
  Lease upper;
  upper.id = std::string(32, 'A');
  Lease fine;
  fine.id = std::string(32, 'a');
  const std::int64_t before = scriptCalls();
  EXPECT_THROW((void)both.tryAcquire(), InvalidArgument);
  EXPECT_THROW((void)both.tryAcquire(1, milliseconds(100)), InvalidArgument);
  EXPECT_THROW(both.acquire(), InvalidArgument);
  EXPECT_THROW((void)both.reserve(1, microseconds(0)), InvalidArgument);
  EXPECT_THROW((void)both.reserveFor(1, "order-1"), InvalidArgument);
  EXPECT_THROW((void)both.settle("order-1", 1), InvalidArgument);
  EXPECT_THROW((void)both.reservationKey("order-1"), InvalidArgument);
  EXPECT_THROW((void)both.tryAcquireAsync(1).get(), InvalidArgument);
  EXPECT_THROW((void)both.decide(0), InvalidArgument);
  EXPECT_THROW((void)both.renew(bad), InvalidArgument);
  EXPECT_THROW((void)both.renew(upper), InvalidArgument);
  EXPECT_THROW((void)both.renew(fine, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)both.release(bad), InvalidArgument);
  EXPECT_THROW((void)rateOnly.renew(fine), InvalidArgument);
  EXPECT_THROW((void)rateOnly.release(fine), InvalidArgument);
  // Made of twice the same name, or two Clients (limits in two slots are fine on one server).
  EXPECT_NO_THROW((void)MultiLimit({rate, inFlight}).on({"{one-tag}:t", "{another-tag}:t"}));
  EXPECT_THROW(MultiLimit({inFlight, inFlight}), InvalidArgument);
  Limiter otherClient(newClient(), limiterName("other"), Policy::concurrency(3, milliseconds(10000)));
  EXPECT_THROW(MultiLimit({rate, otherClient}), InvalidArgument);
  try {
    (void)both.tryAcquire();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "concurrency limit")) << e.what();
    EXPECT_TRUE(contains(e.what(), "decide")) << e.what();
  }
  EXPECT_EQ(scriptCalls(), before) << "nothing was sent";
  EXPECT_EQ(raw({"EXISTS", key(rate), key(inFlight)}).integer, 0);
}

TEST_F(MultiConcurrencyTest, CorruptedLeaseSetsAreTypedErrorsAndNothingIsWritten) {
  Limiter rate = limiter("rate", Policy::gcra(10, milliseconds(1000), 10));
  Limiter inFlight = limiter("inflight", Policy::concurrency(3, milliseconds(10000)));
  MultiLimit both = onTenant({rate, inFlight});
  ASSERT_TRUE(both.decide().allowed);  // the rate key holds state
  (void)raw({"DEL", key(inFlight)});
  Lease lease;
  lease.id = std::string(32, 'b');
  const auto expectRefused = [&](const char* what, bool config) {
    SCOPED_TRACE(what);
    const std::vector<std::string> before = keyStates(admin(), {key(rate), key(inFlight)});
    for (int call = 0; call < 4; ++call) {
      try {
        switch (call) {
          case 0:
            (void)both.decide();
            break;
          case 1:
            (void)both.peek();
            break;
          case 2:
            (void)both.renew(lease);
            break;
          default:
            (void)both.release(lease);
            break;
        }
        ADD_FAILURE() << "call " << call << " succeeded";
      } catch (const ScriptError& e) {
        EXPECT_EQ(e.kind(), config ? ErrorKind::InvalidConfig : ErrorKind::InvalidState) << e.what();
        EXPECT_TRUE(contains(e.what(), key(inFlight))) << e.what();
      }
    }
    EXPECT_EQ(keyStates(admin(), {key(rate), key(inFlight)}), before) << "nothing written";
    (void)raw({"DEL", key(inFlight)});
  };
  (void)raw({"SET", key(inFlight), "3"});
  expectRefused("a string", true);
  (void)raw({"ZADD", key(inFlight), "1", "hello"});
  expectRefused("an expired member that is not a lease id", false);
  (void)raw({"ZADD", key(inFlight), std::to_string(serverTimeUs(admin()) + 5'000'000), "not-a-lease"});
  expectRefused("a live member that is not a lease id", false);
  (void)raw({"ZADD", key(inFlight), "+inf", std::string(32, 'c')});
  expectRefused("an infinite score", false);
  // Healthy again.
  const MultiDecision d = both.decide();
  ASSERT_TRUE(d.allowed);
  EXPECT_TRUE(both.release(*d.lease));
}

TEST_F(MultiConcurrencyTest, AsyncDecisionsCarryTheirLeasesAndAreCounted) {
  Limiter rate = limiter("rate", Policy::gcra(100, milliseconds(60000), 100));
  Limiter inFlight = limiter("inflight", Policy::concurrency(3, milliseconds(10000)));
  MultiLimit both = onTenant({rate, inFlight});
  std::vector<std::future<MultiDecision>> all;
  for (int i = 0; i < 8; ++i) all.push_back(both.decideAsync(1));
  std::vector<Lease> leases;
  int denied = 0;
  for (auto& f : all) {
    const MultiDecision d = f.get();
    EXPECT_EQ(d.allowed, d.lease.has_value());
    if (d.lease) {
      EXPECT_EQ(leaseScore(admin(), key(inFlight), d.lease->id), d.lease->expiresAt.count());
      leases.push_back(*d.lease);
    } else {
      ++denied;
      EXPECT_EQ(d.deniedBy, 1u);
    }
  }
  EXPECT_EQ(leases.size(), 3u);
  EXPECT_EQ(denied, 5);
  for (const Lease& l : leases) EXPECT_TRUE(both.release(l));
  std::promise<MultiDecision> got;
  both.decideAsync(1, [&](MultiDecision d, const std::exception_ptr& e) {
    if (e) {
      got.set_exception(e);
    } else {
      got.set_value(std::move(d));
    }
  });
  const MultiDecision d = got.get_future().get();
  ASSERT_TRUE(d.lease.has_value());
  EXPECT_TRUE(both.release(*d.lease));
  const LimiterMetrics::Snapshot m = both.monitor().metrics()->snapshot();
  EXPECT_EQ(m.granted, 4u);
  EXPECT_EQ(m.denied, 5u);
}

TEST_F(MultiConcurrencyTest, ShadowModeLetsADenialThroughWithALeaseRedisDoesNotHold) {
  Limiter rate = limiter("rate", Policy::gcra(10, milliseconds(60000), 10));
  Limiter inFlight = limiter("inflight", Policy::concurrency(1, milliseconds(10000)));
  MultiLimit::Options options;
  options.monitor.shadow = true;
  MultiLimit both = onTenant({rate, inFlight}, options);
  const MultiDecision first = both.decide();
  ASSERT_TRUE(first.lease.has_value());
  EXPECT_FALSE(first.lease->shadowDenied);
  const MultiDecision second = both.decide();
  EXPECT_TRUE(second.allowed);
  EXPECT_TRUE(second.shadowDenied);
  ASSERT_TRUE(second.lease.has_value());
  EXPECT_TRUE(second.lease->shadowDenied);
  EXPECT_EQ(second.lease->expiresAt.count(), 0);
  EXPECT_EQ(zcard(key(inFlight)), 1) << "the denial took no place";
  EXPECT_FALSE(both.release(*second.lease));
  EXPECT_TRUE(both.release(*first.lease));
  EXPECT_EQ(both.monitor().metrics()->snapshot().shadowDenied, 1u);
}

TEST_F(MultiConcurrencyTest, UnreachableRedisIsDecidedByThePolicyWithLeases) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    Limiter rate(c, "rate", Policy::gcra(10, milliseconds(60000), 10));
    Limiter inFlight(c, "inflight", Policy::concurrency(3, milliseconds(60000)));
    MultiLimit::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    MultiLimit both = onTenant({rate, inFlight}, options);
    const MultiDecision live = both.decide();
    ASSERT_TRUE(live.lease.has_value());
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 4; ++i) {
      try {
        const MultiDecision d = i % 2 == 0 ? both.decide() : both.decideAsync(1).get();
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.allowed, d.lease.has_value());
        if (d.lease) {
          EXPECT_TRUE(d.lease->byPolicy);
          EXPECT_EQ(d.lease->expiresAt.count(), 0);
          EXPECT_EQ(d.lease->id.size(), 32u);
        }
        (d.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    EXPECT_EQ(allowed, policy == FailurePolicy::Allow ? 4 : 0);
    EXPECT_EQ(denied, policy == FailurePolicy::Deny ? 4 : 0);
    EXPECT_EQ(thrown, policy == FailurePolicy::Throw ? 4 : 0);
    Lease l = *live.lease;
    EXPECT_THROW((void)both.renew(l), IoError);
    EXPECT_THROW((void)both.release(l), IoError);
  }
}
