// MultiLimit against a real redis-server: all or nothing (also under 8 threads on overlapping
// sets), each limit exactly as its own script (twin keys at chosen server times), the combined
// retryAfter to the microsecond, deniedBy, one-slot refusal, typed errors with nothing written,
// and the failure policy on a server that is gone.
#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

#include "helpers.hpp"
#include "limiters/keyed_policy.hpp"
#include "topology/key_slot.hpp"
#include "one_key_support.hpp"
#include "redlimit/events.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

class MultiLimitTest : public RedisTest {
 protected:
  /// A key of this test in its one hash tag.
  std::string key(const std::string& suffix) { return "{" + name("multi") + "}:" + suffix; }
};

TEST_F(MultiLimitTest, DecidesAllOrNothingAndSaysWhichLimitDenied) {
  Limiter user(client(), limiterName("user"), bucket(5, 5, milliseconds(100000)));
  Limiter tenant(client(), limiterName("tenant"), gcra(3, 3, milliseconds(100000)));
  Limiter global(client(), limiterName("global"), window(4, milliseconds(4294967295)));
  MultiLimit all = MultiLimit({user, tenant, global}).on({"k", "k", "k"});
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(all.names(), (std::vector<std::string>{user.redisKey("k"), tenant.redisKey("k"), global.redisKey("k")}));

  const std::int64_t before = serverTimeUs(admin());
  const MultiDecision d = all.decide(2);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.permits, 2);
  EXPECT_EQ(d.deniedBy, Decision::kNone);
  EXPECT_EQ(d.remaining, 1) << "the least of 3, 1, 2";
  EXPECT_EQ(d.limit, 3) << "the least of the limits";
  EXPECT_EQ(d.retryAfter.count(), 0);
  EXPECT_GE(d.time.count(), before);
  ASSERT_EQ(d.limits.size(), 3u);
  EXPECT_EQ(d.limits[0].remaining, 3);
  EXPECT_EQ(d.limits[1].remaining, 1);
  EXPECT_EQ(d.limits[2].remaining, 2);
  EXPECT_EQ(d.limits[0].limit, 5);
  EXPECT_EQ(d.limits[2].limit, 4);
  std::int64_t longestReset = 0;
  for (const Decision& one : d.limits) {
    EXPECT_TRUE(one.allowed);
    EXPECT_EQ(one.time, d.time);
    longestReset = std::max<std::int64_t>(longestReset, one.resetAfter.count());
  }
  EXPECT_EQ(d.resetAfter.count(), longestReset);

  // The tenant has 1 left: a call for 2 is denied by it, and nobody is charged.
  const MultiDecision denied = all.decide(2);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.deniedBy, 1u);
  EXPECT_TRUE(denied.limits[0].allowed);
  EXPECT_FALSE(denied.limits[1].allowed);
  EXPECT_TRUE(denied.limits[2].allowed);
  EXPECT_EQ(denied.retryAfter, denied.limits[1].retryAfter);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_EQ(user.peek("k").remaining, 3);
  EXPECT_EQ(tenant.peek("k").remaining, 1);
  EXPECT_EQ(global.peek("k").remaining, 2);

  // peek takes nothing; a call that fits goes through; then the window is the tightest.
  EXPECT_TRUE(all.peek(1).allowed);
  EXPECT_EQ(tenant.peek("k").remaining, 1);
  EXPECT_TRUE(all.tryAcquire(1));
  EXPECT_EQ(global.peek("k").remaining, 1);
  EXPECT_FALSE(all.tryAcquire(1)) << "the tenant is empty";
  EXPECT_EQ(global.peek("k").remaining, 1) << "the window was not charged for the denial";

  // refund goes to every limit.
  all.refund(1);
  EXPECT_EQ(user.peek("k").remaining, 3);
  EXPECT_EQ(tenant.peek("k").remaining, 1);
  EXPECT_EQ(global.peek("k").remaining, 2);
}

TEST_F(MultiLimitTest, DeniedByIsTheLimitWithTheLongestWait) {
  Limiter fast(client(), limiterName("fast"), gcra(1, 1, milliseconds(1000)));
  Limiter slow(client(), limiterName("slow"), gcra(1, 1, milliseconds(100000)));
  ASSERT_TRUE(fast.tryAcquire("k"));
  ASSERT_TRUE(slow.tryAcquire("k"));
  MultiLimit both = MultiLimit({fast, slow}).on({"k", "k"});
  const MultiDecision d = both.decide();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.deniedBy, 1u);
  EXPECT_FALSE(d.limits[0].allowed);
  EXPECT_FALSE(d.limits[1].allowed);
  EXPECT_EQ(d.retryAfter, d.limits[1].retryAfter) << "the largest of the denying limits' retryAfter";
  EXPECT_LT(d.limits[0].retryAfter, d.limits[1].retryAfter);
  MultiLimit reversed = MultiLimit({slow, fast}).on({"k", "k"});
  EXPECT_EQ(reversed.decide().deniedBy, 0u);
}

// --- Concurrency: no partial consumption ------------------------------------------------------------

TEST_F(MultiLimitTest, EightThreadsOnOverlappingSetsNeverChargeAPart) {
  // Nothing refills during the test: one permit per hour, a window of 49 days.
  constexpr std::int64_t kCapA = 300, kCapB = 250, kCapC = 280;
  Limiter a(client(), limiterName("a"), bucket(kCapA, 1, milliseconds(3600000)));
  Limiter b(client(), limiterName("b"), gcra(kCapB, 1, milliseconds(3600000)));
  Limiter c(client(), limiterName("c"), window(kCapC, milliseconds(4294967295)));
  std::vector<MultiLimit> sets{MultiLimit({a, b}).on({"k", "k"}), MultiLimit({b, c}).on({"k", "k"}),
                               MultiLimit({a, c}).on({"k", "k"}), MultiLimit({a, b, c}).on({"k", "k", "k"})};
  const std::vector<std::vector<int>> members{{0, 1}, {1, 2}, {0, 2}, {0, 1, 2}};
  std::atomic<std::int64_t> taken[3] = {0, 0, 0};
  std::atomic<std::int64_t> grants{0}, denials{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919U + 1U);
      std::uniform_int_distribution<int> permits(1, 4);
      for (int i = 0; i < 150; ++i) {
        const std::size_t set = static_cast<std::size_t>((t + i) % 4);
        const std::int64_t n = permits(rng);
        const MultiDecision d = sets[set].decide(n);
        if (!d.allowed) {
          ++denials;
          continue;
        }
        ++grants;
        for (int m : members[set]) taken[m] += n;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(grants.load(), 50);
  EXPECT_GT(denials.load(), 50) << "the limits ran out: the test reached the edge where a partial charge could happen";
  EXPECT_EQ(a.peek("k").remaining, kCapA - taken[0].load());
  EXPECT_EQ(b.peek("k").remaining, kCapB - taken[1].load());
  EXPECT_EQ(c.peek("k").remaining, kCapC - taken[2].load());
}

// --- Each limit exactly as its own script -------------------------------------------------------

TEST_F(MultiLimitTest, EachLimitIsComputedExactlyAsItsOwnScript) {
  // Twin keys at chosen server times: the multi-limit on (A, B, C), each limiter's own script on
  // (A', B', C'), the latter taking only when the former granted. The stored bytes must agree
  // after every step, a grant must be a grant of every own script, and a denial a denial of one.
  std::mt19937_64 rng(20240611);
  const std::vector<std::string> kinds{"T", "G", "W"};
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    const std::int64_t windowMs = 1 + static_cast<std::int64_t>(rng() % 3000);
    const auto windowUs = static_cast<std::uint64_t>(windowMs * 1000);
    std::int64_t now = windowTime(windowMs, static_cast<std::int64_t>(rng() % windowUs));
    const std::vector<std::string> multi{key(str(round) + ":a"), key(str(round) + ":b"), key(str(round) + ":c")};
    const std::vector<std::string> twins{key(str(round) + ":a2"), key(str(round) + ":b2"), key(str(round) + ":c2")};
    const std::int64_t capA = 1 + static_cast<std::int64_t>(rng() % 20);
    const std::int64_t capB = 1 + static_cast<std::int64_t>(rng() % 20);
    const std::int64_t limitC = 1 + static_cast<std::int64_t>(rng() % 20);
    const std::int64_t permitsA = 1 + static_cast<std::int64_t>(rng() % 7);
    const std::int64_t intervalA = 1 + static_cast<std::int64_t>(rng() % 2000);
    const std::int64_t permitsB = 1 + static_cast<std::int64_t>(rng() % 7);
    const std::int64_t intervalB = 1 + static_cast<std::int64_t>(rng() % 2000);
    for (int twin = 0; twin < 2; ++twin) {
      const auto& k = twin == 0 ? multi : twins;
      (void)runOneKey(admin(), detail::lua::gcra, k[0],
                      {"set", str(now), "T", "try", str(capA), str(permitsA), str(intervalA), "0", str(capA)});
      (void)runOneKey(admin(), detail::lua::gcra, k[1],
                      {"set", str(now), "G", "try", str(capB), str(permitsB), str(intervalB), "0", str(capB)});
      (void)runOneKey(admin(), detail::lua::fixed_window, k[2],
                      {"set", str(now), "W", "try", str(limitC), str(windowMs), "0"});
    }
    const auto single = [&](std::size_t i, const std::string& op, std::int64_t at, std::int64_t n) {
      std::vector<std::string> args{op, str(at), kinds[i], str(n)};
      if (op == "take") args.emplace_back("0");
      return takeReply(runOneKey(admin(), i == 2 ? detail::lua::fixed_window : detail::lua::gcra, twins[i], args));
    };
    for (int step = 0; step < 60; ++step) {
      now += static_cast<std::int64_t>(rng() % 400000);
      const auto most = static_cast<std::uint64_t>(std::min({capA, capB, limitC}));
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % most);
      const Reply r = runMulti(admin(), multi, {"take", str(now), "TGW", str(n), "0"});
      ASSERT_EQ(r.elements.size(), 8u + 7u * 3u);
      const bool allowed = r.elements[0].asInteger() == 1;
      bool allAlone = true;
      std::int64_t latest = 0;
      for (std::size_t i = 0; i < 3; ++i) {
        const TakeReply own = single(i, "peek", now, n);
        const std::size_t base = 8 + 7 * i;
        EXPECT_EQ(r.elements[base].asInteger() == 1, own.allowed) << "limit " << i << " step " << step;
        EXPECT_EQ(r.elements[base + 2].asInteger(), own.retryAfterUs) << "limit " << i;
        allAlone = allAlone && own.allowed;
        latest = std::max(latest, own.retryAfterUs);
      }
      EXPECT_EQ(allowed, allAlone) << "step " << step;
      if (allowed) {
        for (std::size_t i = 0; i < 3; ++i) {
          const TakeReply own = single(i, "take", now, n);
          EXPECT_TRUE(own.allowed);
          const std::size_t base = 8 + 7 * i;
          EXPECT_EQ(r.elements[base + 1].asInteger(), own.remaining) << "limit " << i;
          EXPECT_EQ(r.elements[base + 3].asInteger(), own.resetAfterUs) << "limit " << i;
        }
      } else {
        EXPECT_GE(r.elements[2].asInteger(), latest) << "no sooner than the slowest limit alone";
      }
      for (std::size_t i = 0; i < 3; ++i) {
        ASSERT_EQ(raw({"GET", multi[i]}).str, raw({"GET", twins[i]}).str) << "limit " << i << " step " << step;
      }
      if (step % 10 == 9) {  // refunds too
        (void)runMulti(admin(), multi, {"refund", str(now), "TGW", "1"});
        for (std::size_t i = 0; i < 3; ++i) {
          (void)runOneKey(admin(), i == 2 ? detail::lua::fixed_window : detail::lua::gcra, twins[i],
                          {"refund", str(now), kinds[i], "1"});
          ASSERT_EQ(raw({"GET", multi[i]}).str, raw({"GET", twins[i]}).str) << "refund, limit " << i;
        }
      }
    }
  }
}

TEST_F(MultiLimitTest, ASlidingWindowCounterIsComputedExactlyAsItsOwnScript) {
  // A GCRA (stored) and a sliding window counter (its configuration in the call) on twin keys at
  // chosen server times, as above: both estimates only fall with time, so the combined retryAfter
  // is the later of the two own ones, to the microsecond.
  std::mt19937_64 rng(20261207);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    const std::int64_t windowMs = 1 + static_cast<std::int64_t>(rng() % 3000);
    const std::int64_t limit = 1 + static_cast<std::int64_t>(rng() % 20);
    std::string cfg(1, 'V');
    for (const std::int64_t v : {limit, windowMs, std::int64_t{0}}) putLe(cfg, v, 4);
    const std::int64_t cap = 1 + static_cast<std::int64_t>(rng() % 20);
    const std::int64_t intervalMs = 1 + static_cast<std::int64_t>(rng() % 2000);
    std::int64_t now =
        windowTime(windowMs, static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(windowMs * 1000)));
    const std::vector<std::string> multi{key(str(round) + ":g"), key(str(round) + ":v")};
    const std::vector<std::string> twins{key(str(round) + ":g2"), key(str(round) + ":v2")};
    for (const std::string& g : {multi[0], twins[0]}) {
      (void)runOneKey(admin(), detail::lua::gcra, g,
                      {"set", str(now), "G", "try", str(cap), "3", str(intervalMs), "0", str(cap)});
    }
    const auto own = [&](std::size_t i, const std::string& op, std::int64_t at, std::int64_t n) {
      if (i == 0) return takeReply(runOneKey(admin(), detail::lua::gcra, twins[0], {op, str(at), "G", str(n), "0"}));
      return takeReply(runOneKey(admin(), detail::lua::sliding_window, twins[1], {op, str(at), "V", str(n), "0", cfg}));
    };
    for (int step = 0; step < 60; ++step) {
      SCOPED_TRACE(step);
      now += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(windowMs * 400));
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(std::min(cap, limit)));
      const Reply r = runMulti(admin(), multi, {"take", str(now), "GV", str(n), "0", "", cfg});
      ASSERT_EQ(r.elements.size(), 8u + 7u * 2u);
      std::int64_t latest = 0;
      bool allAlone = true;
      for (std::size_t i = 0; i < 2; ++i) {
        const TakeReply alone = own(i, "peek", now, n);
        EXPECT_EQ(r.elements[8 + 7 * i].asInteger() == 1, alone.allowed) << "limit " << i;
        EXPECT_EQ(r.elements[8 + 7 * i + 2].asInteger(), alone.retryAfterUs) << "limit " << i;
        allAlone = allAlone && alone.allowed;
        latest = std::max(latest, alone.retryAfterUs);
      }
      EXPECT_EQ(r.elements[0].asInteger() == 1, allAlone);
      EXPECT_EQ(r.elements[2].asInteger(), latest);
      if (allAlone) {
        for (std::size_t i = 0; i < 2; ++i) {
          const TakeReply took = own(i, "take", now, n);
          EXPECT_TRUE(took.allowed);
          EXPECT_EQ(r.elements[8 + 7 * i + 1].asInteger(), took.remaining) << "limit " << i;
          EXPECT_EQ(r.elements[8 + 7 * i + 3].asInteger(), took.resetAfterUs) << "limit " << i;
        }
      }
      for (std::size_t i = 0; i < 2; ++i) ASSERT_EQ(raw({"GET", multi[i]}).str, raw({"GET", twins[i]}).str) << i;
      if (step % 10 == 9) {
        (void)runMulti(admin(), multi, {"refund", str(now), "GV", "1", "0", "", cfg});
        (void)runOneKey(admin(), detail::lua::gcra, twins[0], {"refund", str(now), "G", "1"});
        (void)runOneKey(admin(), detail::lua::sliding_window, twins[1], {"refund", str(now), "V", "1", "0", cfg});
        for (std::size_t i = 0; i < 2; ++i) ASSERT_EQ(raw({"GET", multi[i]}).str, raw({"GET", twins[i]}).str) << i;
      }
    }
  }
}

TEST_F(MultiLimitTest, ASlidingWindowCounterTakesNowOrNotAtAll) {
  Limiter perUser(client(), limiterName("user"), Policy::slidingWindow(2, milliseconds(4294967295)));
  Limiter global(client(), limiterName("global"), Policy::perSecond(100));
  MultiLimit both = MultiLimit({perUser, global}).on({"u", "all"});
  EXPECT_TRUE(both.decide(2).allowed);
  const MultiDecision denied = both.decide();
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.deniedBy, 0) << "the sliding window counter, the first limit";
  EXPECT_GT(denied.retryAfter.count(), 0);
  both.refund(1);
  EXPECT_TRUE(both.tryAcquire());
  const std::int64_t before = scriptCalls();
  const auto refusal = [](auto&& statement) {
    return messageOfError<InvalidArgument>(ErrorKind::InvalidArgument, statement);
  };
  EXPECT_NE(refusal([&] { (void)both.tryAcquire(1, milliseconds(10)); }).find("now or not at all"), std::string::npos);
  EXPECT_NE(refusal([&] { (void)both.reserve(1, microseconds(10)); }).find("now or not at all"), std::string::npos);
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
  // A reservation counts its permits now; its settle gives back what was not used.
  both.refund(1);
  ASSERT_TRUE(both.reserveFor(1, "r1").allowed);
  EXPECT_EQ(perUser.peek("u").remaining, 0);
  EXPECT_EQ(both.settle("r1", 0).limits.at(0).returned, 1);
  EXPECT_EQ(perUser.peek("u").remaining, 1);
}

TEST_F(MultiLimitTest, OneLimitAnswersAsItsOwnScriptWithReservations) {
  // A set of one limit is its own limiter, reservations included: same reply, same bytes.
  std::mt19937_64 rng(7);
  const std::vector<std::pair<std::string, const detail::lua::EmbeddedScript*>> kinds{
      {"T", &detail::lua::gcra}, {"G", &detail::lua::gcra}, {"W", &detail::lua::fixed_window}};
  for (const auto& kind : kinds) {
    const std::string& kb = kind.first;
    const auto& script = *kind.second;
    const std::string mk = key(kb + ":m");
    const std::string tk = key(kb + ":t");
    const std::int64_t limit = 1 + static_cast<std::int64_t>(rng() % 10);
    const std::int64_t intervalMs = 1 + static_cast<std::int64_t>(rng() % 1000);
    std::int64_t now = windowTime(intervalMs, 12345);
    for (const std::string& k : {mk, tk}) {
      if (kb == "W") {
        (void)runOneKey(admin(), script, k, {"set", str(now), kb, "try", str(limit), str(intervalMs), "0"});
      } else {
        (void)runOneKey(admin(), script, k,
                        {"set", str(now), kb, "try", str(limit), "3", str(intervalMs), "0", str(limit)});
      }
    }
    for (int step = 0; step < 80; ++step) {
      SCOPED_TRACE(kb + " step " + str(step));
      now += static_cast<std::int64_t>(rng() % 200000);
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(limit));
      const std::int64_t maxWait = rng() % 2 == 0 ? 0 : static_cast<std::int64_t>(rng() % 3000000);
      const Reply m = runMulti(admin(), {mk}, {"take", str(now), kb, str(n), str(maxWait)});
      const TakeReply own = takeReply(runOneKey(admin(), script, tk, {"take", str(now), kb, str(n), str(maxWait)}));
      EXPECT_EQ(m.elements[0].asInteger() == 1, own.allowed);
      EXPECT_EQ(m.elements[1].asInteger(), own.remaining);
      EXPECT_EQ(m.elements[2].asInteger(), own.retryAfterUs);
      EXPECT_EQ(m.elements[3].asInteger(), own.resetAfterUs);
      EXPECT_EQ(m.elements[4].asInteger(), own.limit);
      EXPECT_EQ(m.elements[6].asInteger(), own.delayUs);
      EXPECT_EQ(m.elements[7].asInteger(), own.allowed ? 0 : 1) << "deniedBy";
      ASSERT_EQ(raw({"GET", mk}).str, raw({"GET", tk}).str);
    }
  }
}

// --- retryAfter of the combined decision --------------------------------------------------------------

TEST_F(MultiLimitTest, CombinedRetryAfterIsExactToTheMicrosecond) {
  // Token bucket A: 2 per 700 ms; GCRA B: 1 per 1300 ms; both emptied at t0. The call succeeds
  // when both can give a permit: at the later of their own retries, and not a µs before.
  const std::vector<std::string> keys{key("a"), key("b")};
  const std::int64_t t0 = windowTime(1000, 0);
  (void)runOneKey(admin(), detail::lua::gcra, keys[0], {"set", str(t0), "T", "try", "2", "2", "700", "0", "2"});
  (void)runOneKey(admin(), detail::lua::gcra, keys[1], {"set", str(t0), "G", "try", "1", "1", "1300", "0", "1"});
  ASSERT_EQ(runMulti(admin(), keys, {"take", str(t0), "TG", "1", "0"}).elements[0].asInteger(), 1);
  ASSERT_EQ(runMulti(admin(), keys, {"take", str(t0 + 10), "TG", "1", "0"}).elements[0].asInteger(), 0);
  ASSERT_TRUE(takeReply(runOneKey(admin(), detail::lua::gcra, keys[0], {"take", str(t0 + 20), "T", "1", "0"})).allowed);
  const std::int64_t t1 = t0 + 12345;
  const Reply denied = runMulti(admin(), keys, {"peek", str(t1), "TG", "1"});
  const std::int64_t retry = denied.elements[2].asInteger();
  EXPECT_EQ(denied.elements[7].asInteger(), 2) << "B waits longer";
  EXPECT_EQ(retry, std::max(denied.elements[8 + 2].asInteger(), denied.elements[15 + 2].asInteger()));
  EXPECT_EQ(retry, t0 + 1300000 - t1);
  EXPECT_EQ(runMulti(admin(), keys, {"take", str(t1 + retry - 1), "TG", "1", "0"}).elements[0].asInteger(), 0);
  EXPECT_EQ(runMulti(admin(), keys, {"take", str(t1 + retry), "TG", "1", "0"}).elements[0].asInteger(), 1);
}

TEST_F(MultiLimitTest, AFullNextWindowPushesTheRetryToTheWindowAfter) {
  // Window W: 2 per aligned second, the current window holds 1, the next one is full (reserved).
  // GCRA G: 1 per 1500 ms, emptied. Alone, W allows now and G in 1.5 s; together they can only
  // meet in the window after next, 1.9 s from now (t0 is 100 ms into a window).
  const std::vector<std::string> keys{key("w"), key("g")};
  const std::int64_t t0 = windowTime(1000, 100000);
  (void)runOneKey(admin(), detail::lua::fixed_window, keys[0], {"set", str(t0), "W", "try", "2", "1000", "0"});
  (void)runOneKey(admin(), detail::lua::gcra, keys[1], {"set", str(t0), "G", "try", "1", "1", "1500", "0", "1"});
  ASSERT_TRUE(
      takeReply(runOneKey(admin(), detail::lua::fixed_window, keys[0], {"take", str(t0), "W", "2", "0"})).allowed);
  ASSERT_TRUE(takeReply(runOneKey(admin(), detail::lua::fixed_window, keys[0], {"take", str(t0), "W", "2", "1000000"}))
                  .allowed);
  (void)runOneKey(admin(), detail::lua::fixed_window, keys[0], {"refund", str(t0), "W", "1"});
  ASSERT_TRUE(takeReply(runOneKey(admin(), detail::lua::gcra, keys[1], {"take", str(t0), "G", "1", "0"})).allowed);

  const Reply d = runMulti(admin(), keys, {"take", str(t0), "WG", "1", "0"});
  EXPECT_EQ(d.elements[0].asInteger(), 0);
  EXPECT_EQ(d.elements[7].asInteger(), 2) << "G needs the longest wait alone";
  EXPECT_EQ(d.elements[8].asInteger(), 1) << "W alone allows";
  EXPECT_EQ(d.elements[15 + 2].asInteger(), 1500000) << "G alone: 1.5 s";
  EXPECT_EQ(d.elements[2].asInteger(), 1900000) << "together: the window after next";
  EXPECT_EQ(runMulti(admin(), keys, {"take", str(t0 + 1899999), "WG", "1", "0"}).elements[0].asInteger(), 0);
  EXPECT_EQ(runMulti(admin(), keys, {"take", str(t0 + 1900000), "WG", "1", "0"}).elements[0].asInteger(), 1);
}

TEST_F(MultiLimitTest, ReservationsWaitForTheEarliestTimeAllCanGive) {
  // G: 1 per 1500 ms (emptied), W: 2 per aligned second with the next window full. A reservation
  // within 2 s is made for the window after next, 1.9 s from now... which a fixed window cannot
  // count (it keeps the current and the next window only): refused until that window is the
  // next one, 0.9 s from now; a reservation then succeeds with a delay of 1 s.
  const std::vector<std::string> keys{key("w"), key("g")};
  const std::int64_t t0 = windowTime(1000, 100000);
  (void)runOneKey(admin(), detail::lua::fixed_window, keys[0], {"set", str(t0), "W", "try", "2", "1000", "0"});
  (void)runOneKey(admin(), detail::lua::gcra, keys[1], {"set", str(t0), "G", "try", "1", "1", "1500", "0", "1"});
  (void)runOneKey(admin(), detail::lua::fixed_window, keys[0], {"take", str(t0), "W", "2", "0"});
  (void)runOneKey(admin(), detail::lua::fixed_window, keys[0], {"take", str(t0), "W", "2", "1000000"});
  (void)runOneKey(admin(), detail::lua::gcra, keys[1], {"take", str(t0), "G", "1", "0"});
  const Reply refused = runMulti(admin(), keys, {"take", str(t0), "WG", "1", "2000000"});
  EXPECT_EQ(refused.elements[0].asInteger(), 0);
  EXPECT_EQ(refused.elements[2].asInteger(), 900000);
  EXPECT_EQ(runMulti(admin(), keys, {"take", str(t0 + 899999), "WG", "1", "2000000"}).elements[0].asInteger(), 0);
  const Reply granted = runMulti(admin(), keys, {"take", str(t0 + 900000), "WG", "1", "2000000"});
  EXPECT_EQ(granted.elements[0].asInteger(), 1);
  EXPECT_EQ(granted.elements[6].asInteger(), 1000000) << "delay: until the window after starts";

  // Through the API on the server's clock: a reservation is granted with the wait of the slowest
  // (1 per 2 s), and every limit takes the permit as of then: the bucket (5 per minute, one
  // permit per 12 s), full now, holds the permit and the 2 s it cannot bank: 3 whole permits left.
  Limiter slow(client(), limiterName("slow"), gcra(1, 1, milliseconds(2000)));
  Limiter quick(client(), limiterName("quick"), bucket(5, 5, milliseconds(60000)));
  ASSERT_TRUE(slow.tryAcquire("k"));
  MultiLimit both = MultiLimit({quick, slow}).on({"k", "k"});
  const Decision r = both.reserve(1, microseconds(10000000));
  EXPECT_TRUE(r.allowed);
  EXPECT_GT(r.delay.count(), 1000000);
  EXPECT_LE(r.delay.count(), 2000000);
  EXPECT_EQ(quick.peek("k").remaining, 3);
  EXPECT_FALSE(both.tryAcquire(1, milliseconds(1000))) << "the next one is 4 s away: nothing taken, no wait";
  EXPECT_EQ(quick.peek("k").remaining, 3);
}

TEST_F(MultiLimitTest, WaitingTheReturnedRetryAfterSucceeds) {
  Limiter a(client(), limiterName("a"), bucket(2, 2, milliseconds(300)));
  Limiter b(client(), limiterName("b"), gcra(1, 1, milliseconds(300)));
  // a's reservation horizon, max(2 x 150 ms, 300 ms), lets a wait for b's next permit.
  MultiLimit both = MultiLimit({a, b}).on({"k", "k"});
  ASSERT_TRUE(both.tryAcquire());
  const MultiDecision d = both.decide();
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.deniedBy, 1u);
  ASSERT_GT(d.retryAfter.count(), 0);
  // The script at the server times the decision names, instead of a sleep on the wall clock: still
  // denied a microsecond before retryAfter has passed, granted once it has.
  const std::int64_t at = d.time.count() + d.retryAfter.count();
  EXPECT_EQ(runMulti(admin(), both.names(), {"peek", str(at - 1), "TG", "1"}).elements[0].asInteger(), 0);
  EXPECT_EQ(runMulti(admin(), both.names(), {"peek", str(at), "TG", "1"}).elements[0].asInteger(), 1);
  EXPECT_TRUE(both.tryAcquire(1, milliseconds(2000))) << "reserves the next permit and waits for it";
}

// Shadow mode never waits: tryAcquire with a timeout and acquire make one attempt without a wait,
// a denial let through and counted, and reserve nothing ahead (a's next permit is 10 s away).
TEST_F(MultiLimitTest, ShadowModeTryAcquireWithATimeoutAndAcquireReserveNothingAhead) {
  Limiter a(client(), limiterName("a"), bucket(1, 1, milliseconds(10000)));
  Limiter b(client(), limiterName("b"), bucket(5, 5, std::chrono::hours(24)));
  MultiLimit::Options options;
  options.monitor.shadow = true;
  MultiLimit both = MultiLimit({a, b}, options).on({"k", "k"});
  ASSERT_TRUE(both.tryAcquire());
  EXPECT_TRUE(both.tryAcquire(1, milliseconds(60000))) << "denied by a, let through";
  both.acquire(1);
  EXPECT_EQ(both.monitor().metrics()->snapshot().shadowDenied, 2u);
  EXPECT_EQ(b.peek("k").remaining, 4) << "no permit reserved ahead";
}

// --- Refusals before sending, typed errors with nothing written ---------------------------------------

// One server runs one script over any keys: a per-key and a global limit whose keys hash to
// different slots are decided together, all or nothing (on a Cluster: slot by slot, MultiLimitCluster).
TEST_F(MultiLimitTest, KeysOfDifferentSlotsAreDecidedTogetherOnOneServer) {
  Limiter user(client(), limiterName("user"), bucket(5, 1, std::chrono::hours(24)));  // no hash tag: slots of their own
  Limiter global(client(), limiterName("global-x"), bucket(2, 1, std::chrono::hours(24)));
  ASSERT_NE(detail::keySlot(user.redisKey("k")), detail::keySlot(global.redisKey("k")));
  MultiLimit both = MultiLimit({user, global}).on({"k", "k"});
  EXPECT_TRUE(both.tryAcquire());
  EXPECT_TRUE(both.tryAcquire());
  const MultiDecision d = both.decide();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.deniedBy, 1u) << "the global limit denies";
  EXPECT_EQ(user.peek("k").remaining, 3) << "the per-key permit of the denied call was not taken";
  EXPECT_EQ(global.peek("k").remaining, 0);
}

TEST_F(MultiLimitTest, BadLimitListsAndPermitsAreRefusedBeforeSending) {
  const std::int64_t calls = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  Limiter tagged(client(), limiterName("t"), bucket(5, 5, milliseconds(100000)));
  EXPECT_THROW((void)MultiLimit({tagged, tagged}).on({"k", "k"}), InvalidArgument) << "the same key twice";
  EXPECT_THROW(MultiLimit(std::vector<Limiter>{}), InvalidArgument);
  Limiter elsewhere(newClient(), limiterName("u"), bucket(5, 5, milliseconds(100000)));
  EXPECT_THROW((void)MultiLimit({tagged, elsewhere}).on({"k", "k"}), InvalidArgument) << "another Client";
  std::vector<Limiter> many;
  for (int i = 0; i <= static_cast<int>(MultiLimit::kMaxLimits); ++i) {
    many.emplace_back(client(), limiterName("m" + str(i)), bucket(5, 5, milliseconds(100000)));
  }
  EXPECT_THROW(MultiLimit{many}, InvalidArgument);
  many.pop_back();
  EXPECT_NO_THROW(MultiLimit{many});
  // Bad permits.
  MultiLimit one = MultiLimit({tagged}).on({"k"});
  EXPECT_THROW((void)one.decide(0), InvalidArgument);
  EXPECT_THROW((void)one.peek(4294967295 + 1), InvalidArgument);
  EXPECT_THROW(one.refund(-1), InvalidArgument);
  EXPECT_THROW((void)one.reserve(1, microseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)one.decideAsync(0).get(), InvalidArgument);
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"), calls) << "nothing sent";
}

TEST_F(MultiLimitTest, OneBadKeyAmongThreeIsATypedErrorAndNothingIsWritten) {
  Limiter a(client(), limiterName("a"), bucket(5, 5, milliseconds(100000)));
  Limiter b(client(), limiterName("b"), gcra(5, 5, milliseconds(100000)));
  Limiter c(client(), limiterName("c"), window(5, milliseconds(100000)));
  ASSERT_TRUE(a.tryAcquire("k", 2));
  MultiLimit all = MultiLimit({a, b, c}).on({"k", "k", "k"});
  const auto states = [&] { return keyStates(admin(), {a.redisKey("k"), b.redisKey("k"), c.redisKey("k")}); };
  const auto expectNamed = [&](auto&& call, const std::string& culprit, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
    }
  };

  // Permits above the limits' bursts: InvalidArgument before sending, saying the bound.
  const auto before = states();
  EXPECT_THROW((void)all.decide(6), InvalidArgument);
  expectNamed([&] { (void)all.decide(6); }, "1..5", "six permits");
  EXPECT_EQ(states(), before);

  // The last key corrupted: the first two are untouched.
  (void)raw({"SET", c.redisKey("k"), "garbage"});
  const auto corrupted = states();
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)all.decide(1); }));
  expectNamed([&] { (void)all.decide(1); }, c.redisKey("k"), "decide");
  expectNamed([&] { (void)all.peek(1); }, c.redisKey("k"), "peek");
  expectNamed([&] { all.refund(1); }, c.redisKey("k"), "refund");
  EXPECT_EQ(states(), corrupted);

  // Another Redis type in the middle.
  (void)raw({"DEL", c.redisKey("k")});  // decided full again with the policy in the call
  (void)raw({"DEL", b.redisKey("k")});
  (void)raw({"HSET", b.redisKey("k"), "rate", "10"});
  const auto hashed = states();
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)all.decide(1); }));
  EXPECT_EQ(states(), hashed);

  // A limiter of another kind under the name; a missing key is decided full, with the policy in the
  // call.
  (void)raw({"DEL", b.redisKey("k")});
  Limiter impostor(client(), b.name(), bucket(5, 5, milliseconds(100000)));
  ASSERT_TRUE(impostor.tryAcquire("k"));
  const auto wrongKind = states();
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)all.decide(1); }));
  EXPECT_EQ(states(), wrongKind);
  EXPECT_EQ(a.peek("k").remaining, 3) << "nothing taken by the refusals";
  (void)raw({"DEL", b.redisKey("k")});
  EXPECT_TRUE(all.decide(1).allowed);
  EXPECT_EQ(a.peek("k").remaining, 2);
}

TEST_F(MultiLimitTest, AsyncFormsDecideLikeTheSyncOnes) {
  Limiter a(client(), limiterName("a"), bucket(3, 3, milliseconds(100000)));
  Limiter b(client(), limiterName("b"), window(2, milliseconds(4294967295)));
  MultiLimit both = MultiLimit({a, b}).on({"k", "k"});
  const MultiDecision d = both.decideAsync(1).get();
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limits.size(), 2u);
  EXPECT_TRUE(both.tryAcquireAsync(1).get());
  const MultiDecision denied = both.decideAsync(1).get();
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.deniedBy, 1u);
  std::promise<bool> failed;
  both.tryAcquireAsync(1, [&](bool allowed, const std::exception_ptr& error) { failed.set_value(allowed || error); });
  EXPECT_FALSE(failed.get_future().get());
  (void)raw({"SET", b.redisKey("k"), "garbage"});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)both.decideAsync(1).get(); }));
  EXPECT_EQ(a.peek("k").remaining, 1);
}

// Options::name is what the events carry, as the metrics do; without it, the events carry
// "MultiLimit(a + b)".
TEST_F(MultiLimitTest, ANamedMultiLimitsEventsCarryItsName) {
  Limiter a(client(), limiterName("a"), bucket(3, 3, milliseconds(100000)));
  Limiter b(client(), limiterName("b"), window(2, milliseconds(100000)));
  const auto throwerOf = [&](const std::string& name) {
    auto named = std::make_shared<std::promise<std::string>>();
    MultiLimit::Options mo;
    mo.name = name;
    mo.monitor.registry = std::make_shared<MetricsRegistry>();
    mo.monitor.onEvent = [named](const Event& e) {
      if (e.kind == Event::Kind::CallbackThrew) named->set_value(e.limiter);
    };
    MultiLimit both = MultiLimit({a, b}, mo).on({"k", "k"});
    both.decideAsync(
        1, [](const MultiDecision&, const std::exception_ptr&) { throw std::runtime_error("this callback throws"); });
    const std::string carried = named->get_future().get();
    EXPECT_EQ(mo.monitor.registry->snapshot(name.empty() ? a.name() + "+" + b.name() : name).granted, 1u);
    return carried;
  };
  EXPECT_EQ(throwerOf("checkout"), "checkout");
  EXPECT_EQ(throwerOf(""), "MultiLimit(" + a.name() + " + " + b.name() + ")");
}

// --- Failure policy ---------------------------------------------------------------------------------

TEST_F(MultiLimitTest, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    Limiter wide(c, "wide", bucket(10, 10, milliseconds(60000)));
    Limiter tight(c, "tight", gcra(3, 3, milliseconds(60000)));
    MultiLimit::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    std::atomic<int> degraded{0};
    options.failure.onHealthChange = [&](const HealthEvent& e) {
      if (e.kind == HealthEvent::Kind::Degraded) degraded.fetch_add(1);
    };
    MultiLimit both = MultiLimit({wide, tight}, options).on({"k", "k"});
    ASSERT_TRUE(both.decide().allowed);  // learns the limits and the tightest rate
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const MultiDecision d = both.decide();
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.limit, 3);
        EXPECT_EQ(d.deniedBy, Decision::kNone);
        ASSERT_EQ(d.limits.size(), 2u);
        EXPECT_EQ(d.limits[0].limit, 10);
        EXPECT_TRUE(d.limits[1].byPolicy);
        (d.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    // Local: its bucket runs the tightest limit, 3 per minute.
    expectDecidedByPolicy(policy, allowed, denied, thrown, 6, 3);
    if (policy == FailurePolicy::Allow) {
      EXPECT_TRUE(both.decideAsync(1).get().byPolicy);
    }
    if (policy == FailurePolicy::Deny) {
      EXPECT_FALSE(both.tryAcquireAsync(1).get());
    }
    EXPECT_THROW((void)both.peek(), IoError);
    EXPECT_THROW(both.refund(1), IoError);
    EXPECT_TRUE(both.failureStats().degraded);
    EXPECT_EQ(degraded.load(), 1);
  }
}

// --- A MultiLimit of Limiters: keys per call -------------------------------------------------------

// The gateway: a per-key and a global limit in one call, all or nothing, on one server (their keys
// are in different slots). 8 threads over 4 keys: the global limit grants exactly its capacity, no
// key more than its own, and no per-key permit is taken for a call the global limit denied.
TEST_F(MultiLimitTest, OfLimitersDecidesAPerKeyAndAGlobalLimitInOneCallAndLosesNoPermit) {
  constexpr std::int64_t kPerKey = 5, kGlobal = 12;
  constexpr int kThreads = 8, kCalls = 10, kKeys = 4;
  Limiter perKey(client(), limiterName("perkey"), Policy::tokenBucket(kPerKey, 1, std::chrono::hours(24)));
  Limiter global(client(), limiterName("global"), Policy::tokenBucket(kGlobal, 1, std::chrono::hours(24)));
  const MultiLimit gateway({perKey, global});
  (void)gateway.on({"warm", "all"}).peek();  // the script loaded: one EVALSHA per decision below
  const std::int64_t before = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  std::atomic<std::int64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string k = "key" + std::to_string(t % kKeys);
      for (int i = 0; i < kCalls; ++i) {
        if (gateway.on({k, "all"}).decide().allowed) granted.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(granted.load(), kGlobal) << "the global limit grants exactly its capacity";
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval") - before, kThreads * kCalls)
      << "one script call per decision";
  EXPECT_EQ(global.peek("all").remaining, 0);
  std::int64_t takenPerKey = 0;
  for (int k = 0; k < kKeys; ++k) {
    const std::int64_t left = perKey.peek("key" + std::to_string(k)).remaining;
    EXPECT_GE(left, 0);
    takenPerKey += kPerKey - left;
  }
  EXPECT_EQ(takenPerKey, kGlobal) << "a per-key permit is taken only with a global one";
  const MultiDecision d = gateway.on({"key0", "all"}).decide();
  EXPECT_FALSE(d.allowed);
  EXPECT_NE(d.deniedBy, Decision::kNone);
  EXPECT_EQ(gateway.on({"fresh", "all"}).decide().deniedBy, 1u) << "the global limit denies a fresh key";
}

TEST_F(MultiLimitTest, OfLimitersNeedsOneKeyPerLimiterAndRefusesWhatItCannotCombineBeforeSending) {
  Limiter a(client(), limiterName("a"), Policy::perSecond(10));
  Limiter b(client(), limiterName("b"), Policy::fixedWindow(10, std::chrono::seconds(1)));
  Limiter smooth(client(), limiterName("s"), Policy::smoothBursty(10, std::chrono::seconds(1)));
  const std::int64_t before = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  const MultiLimit both({a, b});
  EXPECT_THROW((void)both.on({"u"}), InvalidArgument) << "one key per limiter";
  EXPECT_THROW((void)both.on({"u", ""}), InvalidArgument) << "an empty key";
  EXPECT_THROW((void)MultiLimit(both).decide(), InvalidArgument) << "no keys named";
  EXPECT_THROW((void)MultiLimit(both).decideAsync().get(), InvalidArgument);
  EXPECT_THROW((void)MultiLimit({a, smooth}).on({"k", "k"}), InvalidArgument) << "a smooth policy";
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"), before) << "nothing sent";
  EXPECT_TRUE(both.on({"u", "u"}).decide().allowed);
  EXPECT_EQ(a.peek("u").remaining, 9);
  EXPECT_EQ(b.peek("u").remaining, 9);
  // Reserve, then settle, on the keys of the call: one record, in redlimit's namespace.
  MultiLimit onU = both.on({"u", "u"});
  EXPECT_EQ(onU.reservationKey("order-1").rfind("rl::mrsv:order-1:", 0), 0u) << onU.reservationKey("order-1");
  ASSERT_TRUE(onU.reserveFor(4, "order-1").allowed);
  EXPECT_EQ(a.peek("u").remaining, 5);
  EXPECT_EQ(onU.settle("order-1", 1).status, Settlement::Status::Settled);
  EXPECT_EQ(a.peek("u").remaining, 8);
  EXPECT_EQ(b.peek("u").remaining, 8);
}

// A concurrency Limiter in a MultiLimit of Limiters: a place and a permit, together or neither.
TEST_F(MultiLimitTest, OfLimitersTakesALeaseAndAPermitTogether) {
  Limiter rate(client(), limiterName("rate"), Policy::tokenBucket(3, 1, std::chrono::hours(24)));
  Limiter inFlight(client(), limiterName("inflight"), Policy::concurrency(1, std::chrono::seconds(30)));
  const MultiLimit both({rate, inFlight});
  MultiLimit onU = both.on({"u", "u"});
  const MultiDecision first = onU.decide();
  ASSERT_TRUE(first.allowed);
  ASSERT_TRUE(first.lease.has_value());
  const MultiDecision second = onU.decide();
  EXPECT_FALSE(second.allowed) << "the one place is held";
  EXPECT_EQ(second.deniedBy, 1u);
  EXPECT_EQ(rate.peek("u").remaining, 2) << "the denied call took no permit";
  EXPECT_TRUE(onU.release(*first.lease));
  EXPECT_TRUE(onU.decide().allowed);
  EXPECT_EQ(inFlight.held("u"), 1);
}

// --- lua/multi.lua's steps of a decision across Cluster slots, on one server ---------------------

// A token bucket of 5 (one a day) in the call, its key `b`; the records and the pending set share
// its hash tag, as MultiLimit's do in their group's slot.
class MultiLimitSlotScript : public RedisTest {
 protected:
  std::string key(const std::string& suffix) { return "{" + name("mls") + "}:" + suffix; }
  std::vector<std::string> argv(const std::string& op, std::int64_t nowUs, std::int64_t n, std::int64_t second) {
    return {op,
            std::to_string(nowUs),
            "T",
            std::to_string(n),
            std::to_string(second),
            detail::gcraPolicy('T', 5, 1, std::chrono::hours(24), milliseconds(1000)).packed};
  }
  // The last group's reserve under `record` (its commit), at `nowUs`.
  Reply commit(const std::string& record, std::int64_t nowUs) {
    return runMulti(admin(), {key("b"), record}, argv("reserve", nowUs, 1, 60000));
  }
  // An earlier group's reserve under `record`, listed as `member` in the pending set for 1 ms.
  Reply hold(const std::string& record, const std::string& member, std::int64_t nowUs) {
    std::vector<std::string> a = argv("reserve", nowUs, 1, 60000);
    a.insert(a.end(), {"1", member});
    return runMulti(admin(), {key("b"), record, key("pending")}, a);
  }
  std::int64_t resolve(const std::string& record) {
    return runMulti(admin(), {record}, {"resolve", "", "", "60000"}).integer;
  }
  std::int64_t remaining(std::int64_t nowUs) {
    return runMulti(admin(), {key("b")}, argv("peek", nowUs, 1, 0)).elements.at(1).integer;
  }
};

// A record there: the decision took (1). None: a fence is written (0), and the decision's reserve,
// arriving after it, denies (`repeated` 2) and takes nothing.
TEST_F(MultiLimitSlotScript, AResolveFindsTheCommitOrFencesItSoThatALateReserveTakesNothing) {
  const std::int64_t t0 = serverTimeUs(admin());
  ASSERT_EQ(commit(key("r1"), t0).elements.at(0).integer, 1);
  EXPECT_EQ(resolve(key("r1")), 1) << "its record: it took";
  EXPECT_EQ(remaining(t0), 4);

  EXPECT_EQ(resolve(key("r2")), 0) << "no record: it did not take";
  const std::string fence = detail::command(admin(), {"GET", key("r2")}).str;
  ASSERT_EQ(fence.size(), 12u) << "a record's head alone";
  EXPECT_EQ(fence.substr(0, 3), "RMA");
  const Reply late = commit(key("r2"), t0);
  EXPECT_EQ(late.elements.at(0).integer, 0) << "denied";
  EXPECT_EQ(late.elements.back().integer, 2) << "given up";
  EXPECT_EQ(remaining(t0), 4) << "nothing taken";
  EXPECT_EQ(resolve(key("r2")), 0) << "still given up";
}

// An earlier group's reserve lists its call in the pending set until its hold ends; a later reserve
// there answers the members whose hold ended; a settle takes its member out and keeps at most
// `keep` of its record's TTL.
TEST_F(MultiLimitSlotScript, APendingMemberIsListedOnceItsHoldEndsAndLeavesWithItsSettle) {
  const std::int64_t t0 = serverTimeUs(admin());
  const Reply first = hold(key("r1"), "a1:1", t0);
  ASSERT_EQ(first.elements.at(0).integer, 1);
  EXPECT_EQ(first.elements.back().type, Reply::Type::Integer) << "nothing ended yet";
  const Reply second = hold(key("r2"), "a2:1", t0 + 5000);
  ASSERT_EQ(second.elements.at(0).integer, 1);
  ASSERT_EQ(second.elements.back().type, Reply::Type::String);
  EXPECT_EQ(second.elements.back().str, "a1:1") << "its hold (1 ms) ended";
  EXPECT_EQ(remaining(t0 + 5000), 3);

  std::vector<std::string> settle = argv("settle", t0 + 6000, 0, 0);
  settle.insert(settle.end(), {"500", "a1:1"});
  const Reply back = runMulti(admin(), {key("b"), key("r1"), key("pending")}, settle);
  EXPECT_EQ(back.elements.at(0).integer, 1) << "settled now";
  EXPECT_EQ(remaining(t0 + 6000), 4) << "given back";
  EXPECT_LE(detail::command(admin(), {"PTTL", key("r1")}).integer, 500) << "a settled record keeps at most `keep`";
  const Reply third = hold(key("r3"), "a3:1", t0 + 10000);
  EXPECT_EQ(third.elements.back().str, "a2:1") << "a1:1 left with its settle";
}
