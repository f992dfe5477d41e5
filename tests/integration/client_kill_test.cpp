// The one resend rule (src/limiters/limiter_call.hpp): a connection closed under a call is not an
// outage. CLIENT KILL TYPE normal, five times, under 8 threads deciding: no caller sees an error,
// no limiter changes health, and no window grants more than its limit (a resent take may count
// twice, never grant twice).
#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "redlimit/calendar.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

class ClientKill : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    patient_ = patientClient();
  }
  // The limiters' Client: 10 s to connect and to answer, not 500 ms, so that on a machine loaded
  // by a sanitizer only the kills can fail a call, never a slow reconnect or reply.
  std::shared_ptr<Client> patient() { return patient_; }
  static constexpr std::int64_t kLimit = 1000;
  static constexpr int kThreads = 8;
  static constexpr int kPerThread = 300;  // 2 400 decisions on a limit of 1 000: grants and denials
  static constexpr int kKills = 5;

  // A bucket of `capacity` that refills one permit a day: no window boundary to race, so at
  // most `capacity` are ever granted during a test.
  static Policy full(std::int64_t capacity) { return Policy::tokenBucket(capacity, 1, std::chrono::hours(24)); }

  struct Outcome {
    std::int64_t granted = 0;
    std::int64_t errors = 0;
    int kills = 0;
    std::string firstError;  // what the first error a caller saw said
  };

  // Runs `decide` kThreads x kPerThread times while the connections are killed kKills times, each
  // kill after the callers made progress since the last (no sleeps: the kills land among calls):
  // 40 calls in all, and every caller one call at least, so that a call resent after one kill (a
  // caller's call in flight then) has ended before the next kill, which would close it again.
  Outcome underKills(const std::function<bool()>& decide) {
    std::atomic<std::int64_t> granted{0}, errors{0}, done{0};
    std::vector<std::atomic<std::int64_t>> doneBy(kThreads);  // calls ended, per caller
    std::mutex firstErrorMutex;
    std::string firstError;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          try {
            if (decide()) granted.fetch_add(1);
          } catch (const std::exception& e) {
            if (errors.fetch_add(1) == 0) {
              const std::lock_guard<std::mutex> lock(firstErrorMutex);
              firstError = e.what();
            }
          }
          doneBy[static_cast<std::size_t>(t)].fetch_add(1);
          done.fetch_add(1);
        }
      });
    }
    Outcome out;
    const std::int64_t total = std::int64_t{kThreads} * kPerThread;
    std::vector<std::int64_t> seenBy(kThreads, 0);
    const auto everyCallerMoved = [&] {
      for (std::size_t t = 0; t < seenBy.size(); ++t) {
        const std::int64_t now = doneBy[t].load();
        if (now == seenBy[t] && now < kPerThread) return false;
      }
      return true;
    };
    for (std::int64_t seen = 0; out.kills < kKills && done.load() < total; ++out.kills) {
      while ((done.load() < seen + 40 || !everyCallerMoved()) && done.load() < total) std::this_thread::yield();
      (void)raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
      seen = done.load();
      for (std::size_t t = 0; t < seenBy.size(); ++t) seenBy[t] = doneBy[t].load();
    }
    for (std::thread& t : threads) t.join();
    out.granted = granted.load();
    out.errors = errors.load();
    out.firstError = firstError;
    return out;
  }

  // No caller saw an error, the limiter did not change health (nothing counted as an outage,
  // nothing decided by the failure policy), and no more than `limit` were granted.
  static void expectResent(const Outcome& o, const FailureStats& s, std::int64_t limit) {
    EXPECT_GE(o.kills, 1);
    EXPECT_EQ(o.errors, 0) << "the first: " << o.firstError;
    EXPECT_EQ(s.outages, 0u) << "the first error a caller saw: " << o.firstError;
    EXPECT_FALSE(s.degraded);
    EXPECT_EQ(s.allowed + s.denied + s.thrown, 0u) << "nothing decided by the failure policy";
    EXPECT_LE(o.granted, limit);
    EXPECT_GT(o.granted, 0);
  }

 private:
  std::shared_ptr<Client> patient_;
};

}  // namespace

TEST_F(ClientKill, MultiLimitTakesAreResentSoNoCallerSeesAnErrorAndTheLimiterStaysHealthy) {
  Limiter perUser(patient(), limiterName("user"), full(kLimit));
  Limiter global(patient(), limiterName("all"), full(2 * kLimit));
  MultiLimit both = MultiLimit({perUser, global}).on({"u", "all"});
  const ClientKill::Outcome o = underKills([&] { return both.tryAcquire(); });
  expectResent(o, both.failureStats(), kLimit);
}

TEST_F(ClientKill, AsyncTakesAreResentSoNoCallerSeesAnErrorAndTheLimitersStayHealthy) {
  Limiter one(patient(), limiterName("one"), full(kLimit));
  Limiter perUser(patient(), limiterName("user"), full(kLimit));
  MultiLimit both = MultiLimit({perUser}).on({"u"});
  const ClientKill::Outcome o = underKills([&] {
    std::future<Decision> a = one.decideAsync("k");
    std::future<MultiDecision> b = both.decideAsync();
    const bool first = a.get().allowed;
    return b.get().allowed && first;
  });
  expectResent(o, one.failureStats(), kLimit);
  expectResent(o, both.failureStats(), kLimit);
}

// RateLimiter's takes carry an id: a resent take whose first try was applied finds that grant, so
// the permits left are exactly the limit less what callers were granted.
TEST_F(ClientKill, RateLimiterTakesAreResentOnceEachSoNoCallerSeesAnErrorAndAccountingIsExact) {
  RateLimiter limiter(patient(), name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kLimit, std::chrono::hours(24)));
  const ClientKill::Outcome o = underKills([&] { return limiter.tryAcquire(); });
  expectResent(o, limiter.failureStats(), kLimit);
  EXPECT_EQ(limiter.availablePermits(), kLimit - o.granted);
}

TEST_F(ClientKill, RateLimiterAsyncTakesAreResentOnceEachSoNoCallerSeesAnErrorAndAccountingIsExact) {
  RateLimiter limiter(patient(), name());
  ASSERT_TRUE(limiter.trySetRate(RateType::Overall, kLimit, std::chrono::hours(24)));
  const ClientKill::Outcome o = underKills([&] { return limiter.tryAcquireAsync().get(); });
  expectResent(o, limiter.failureStats(), kLimit);
  EXPECT_EQ(limiter.availablePermits(), kLimit - o.granted);
}

// A Limiter under every policy: the same rule. Its policies hold kLimit and refill about nothing
// during a test, so at most kLimit (the smooth limiter: one more, lent ahead) are granted.
TEST_F(ClientKill, LimiterTakesAreResentUnderEveryPolicySoNoCallerSeesAnError) {
  using std::chrono::hours;
  const std::vector<std::pair<std::string, Policy>> policies = {
      {"gcra", Policy::gcra(1, hours(24), kLimit)},
      {"bucket", Policy::tokenBucket(kLimit, 1, hours(24))},
      {"window", Policy::fixedWindow(kLimit, hours(24))},
      {"smooth", Policy::smoothBursty(1, hours(1), hours(kLimit))},
      {"calendar", Policy::calendar(kLimit, CalendarUnit::Month, "UTC")},
  };
  for (const auto& [label, policy] : policies) {
    SCOPED_TRACE(label);
    Limiter limiter(patient(), limiterName(label), policy);
    const ClientKill::Outcome o = underKills([&] { return limiter.tryAcquire("user"); });
    expectResent(o, limiter.failureStats(), policy.kind() == Policy::Kind::Smooth ? kLimit + 1 : kLimit);
  }
}

// One CLIENT KILL closes the connections one after another, and a call resent to the next one
// still open can be closed there too. Here every try of one call waits behind CLIENT PAUSE WRITE
// and is killed in turn, on as many connections as the pool has: the call is still resent, and
// the try after them answers.
TEST_F(ClientKill, ACallClosedOnEveryConnectionOfThePoolInTurnIsStillResent) {
  Limiter limiter(patient(), limiterName("walk"), full(kLimit));
  const std::size_t pool = patient()->options().pool.size;
  for (std::size_t i = 0; i < 2 * pool; ++i) ASSERT_TRUE(limiter.tryAcquire("user"));  // script loaded
  // The ids of the connections whose call waits behind the pause.
  const auto waiting = [&] {
    std::vector<std::string> ids;
    std::istringstream lines(raw({"CLIENT", "LIST"}).str);
    for (std::string line; std::getline(lines, line);) {
      if (contains(line, " flags=b ") && contains(line, " cmd=evalsha "))
        ids.push_back(line.substr(3, line.find(' ') - 3));
    }
    return ids;
  };
  (void)raw({"CLIENT", "PAUSE", "60000", "WRITE"});
  std::future<bool> call = std::async(std::launch::async, [&] { return limiter.tryAcquire("user"); });
  const auto ended = [&] { return call.wait_for(milliseconds(0)) == std::future_status::ready; };
  std::vector<std::string> ids, killed;
  for (std::size_t kill = 0; kill <= pool; ++kill) {  // one kill per connection, then the last try
    ASSERT_TRUE(waitFor([&] { return (ids = waiting()).size() == 1 || ended(); }, milliseconds(10000)))
        << "try " << kill + 1 << " never came";
    if (ids.size() != 1 || kill == pool) break;  // the call ended (the checks below say how), or its last try waits
    ASSERT_EQ(raw({"CLIENT", "KILL", "ID", ids[0]}).integer, 1);
    killed.push_back(ids[0]);
  }
  (void)raw({"CLIENT", "UNPAUSE"});
  std::string error;
  bool granted = false;
  try {
    granted = call.get();
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_EQ(killed.size(), pool);
  EXPECT_TRUE(granted) << error;
  EXPECT_EQ(limiter.failureStats().outages, 0u) << error;
}

// Leases: acquire and release are resent with their lease id, so no place is held twice or lost:
// never more than the limit at once, and none left held after the run.
TEST_F(ClientKill, LimiterLeasesAreResentSoNoCallerSeesAnErrorAndNoPlaceIsLeftHeld) {
  Limiter inFlight(patient(), limiterName("leases"), Policy::concurrency(4, std::chrono::seconds(60)));
  const ClientKill::Outcome o = underKills([&] {
    const LeaseDecision d = inFlight.acquireLease("user");
    if (!d.lease) return false;
    const bool released = inFlight.release("user", *d.lease);
    return released;
  });
  expectResent(o, inFlight.failureStats(), std::int64_t{kThreads} * kPerThread);
  EXPECT_EQ(inFlight.held("user"), 0) << "every place taken was given back";
}

// Sync calls of a script, 8 threads on 8 connections (most doing their own round trip on an idle
// connection, PoolStats::callerRead, the others handed to the I/O thread), while the
// connections are killed: each call ends once, with its own reply or a ClosedError, never with a
// TimeoutError; a call that failed is sent again with the same id, and the script applies an id
// once, so Redis counts exactly one application per call and each call saw its id applied once.
TEST_F(ClientKill, SyncCallsEndOnceWithTheirOwnReplyOrAClosedErrorAndAResentCallIsAppliedOnce) {
  const std::string source =
      "if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then redis.call('INCR', KEYS[2]) return ARGV[1] end "
      "return 'again:' .. ARGV[1]";
  const std::string sha = raw({"SCRIPT", "LOAD", source}).str;
  const Script once{"once", sha, source};
  const std::string ids = name("ids"), applied = name("applied");
  // A connection per thread, so that most calls find one idle and do their own round trip.
  ClientOptions options;
  options.pool.size = kThreads;
  options.connection.connectTimeout = options.connection.commandTimeout = milliseconds(10000);
  auto client = newClient(options);
  // Replies: the id on the first try, the id on a resend (the first try never ran), "again:" on a
  // resend (it had run).
  std::atomic<std::int64_t> calls{0}, firstTries{0}, ranOnResend{0}, resent{0}, closed{0}, wrong{0}, others{0};
  std::mutex otherMutex;
  std::string other;
  // A call whose connection closed under it may or may not have run: sent again with its id
  // until it gets a reply, which is then its id (first run) or "again:" and its id (it had run).
  auto call = [&](const std::string& id) {
    for (bool first = true;; first = false) {
      try {
        const Reply r = detail::eval(*client, once, {ids, applied}, {id});
        if (r.str == id) {
          (first ? firstTries : ranOnResend).fetch_add(1);
        } else if (r.str == "again:" + id && !first) {
          resent.fetch_add(1);
        } else {
          wrong.fetch_add(1);  // another call's reply, or a first try that found its id applied
        }
        break;
      } catch (const ClosedError&) {
        if (first) closed.fetch_add(1);
      } catch (const std::exception& e) {
        if (others.fetch_add(1) == 0) {
          const std::lock_guard<std::mutex> lock(otherMutex);
          other = e.what();
        }
        break;
      }
    }
    calls.fetch_add(1);
    return true;
  };
  std::atomic<int> next{0};
  const PoolStats before = client->poolStats();
  const ClientKill::Outcome o = underKills([&] { return call("id" + std::to_string(next.fetch_add(1))); });
  const PoolStats after = client->poolStats();
  const std::int64_t total = std::int64_t{kThreads} * kPerThread;
  EXPECT_GE(o.kills, 1);
  EXPECT_EQ(o.errors, 0) << o.firstError;
  EXPECT_EQ(calls.load(), total);
  EXPECT_EQ(others.load(), 0) << "no TimeoutError or other error: " << other;
  EXPECT_EQ(wrong.load(), 0) << "a call got a reply that was not its own";
  EXPECT_EQ(raw({"SCARD", ids}).integer, total) << "every call ran";
  EXPECT_EQ(getInt(admin(), applied), total) << "and none ran twice";
  EXPECT_EQ(firstTries.load() + ranOnResend.load() + resent.load(), total);
  EXPECT_EQ(closed.load(), ranOnResend.load() + resent.load())
      << "each call closed under was sent again until it ended";
  EXPECT_GT(after.callerRead - before.callerRead, 0u)
      << "some calls did their own round trip; direct " << after.direct - before.direct << ", requests "
      << after.requests - before.requests << ", writes " << after.writes - before.writes;
  EXPECT_GT(after.discarded - before.discarded, 0u) << "the kills closed connections under the calls";
  EXPECT_EQ(client->poolStats().pending, 0u);
}

// A MultiLimit of Limiters: the per-key and the global limit in one call, resent as one.
TEST_F(ClientKill, MultiLimitOfLimitersTakesAreResentSoNoCallerSeesAnError) {
  const std::string base = limiterName("gateway");
  Limiter perKey(patient(), base + ".key", Policy::tokenBucket(kLimit, 1, std::chrono::hours(24)));
  Limiter global(patient(), base + ".all", Policy::tokenBucket(2 * kLimit, 1, std::chrono::hours(24)));
  const MultiLimit gateway({perKey, global});
  const ClientKill::Outcome o = underKills([&] { return gateway.on({"user", "all"}).decide().allowed; });
  expectResent(o, gateway.failureStats(), kLimit);
}
