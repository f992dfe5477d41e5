// Coalesced decisions: acquisitions of one handle that queue up while its call is in flight go to
// Redis as one script call (acquire_batch.lua) and get what one-by-one calls would have got.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "limiters/batcher.hpp"

#include "helpers.hpp"
#include "redlimit_lua.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/rate_limiter.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

class Coalesce : public RedisTest {
 protected:
  // Write commands (scripts included) wait until resume(); reads and CLIENT UNPAUSE do not. What a
  // Client has pending meanwhile is what it sent.
  void pauseWrites() { ASSERT_EQ(raw({"CLIENT", "PAUSE", "20000", "WRITE"}).str, "OK"); }
  void resume() { (void)raw({"CLIENT", "UNPAUSE"}); }
  void TearDown() override {
    resume();
    RedisTest::TearDown();
  }
  // A Client of two connections whose command timeout a paused server does not reach during a
  // test, and a limiter of rate 1000 on it, both connections open and both acquire scripts loaded:
  // its requests are then script calls alone.
  std::shared_ptr<Client> twoConnections(std::unique_ptr<RateLimiter>& limiter) {
    ClientOptions o;
    o.pool.size = 2;
    o.connection.commandTimeout = std::chrono::seconds(30);
    auto c = newClient(o);
    (void)raw({"SCRIPT", "LOAD", detail::lua::acquire_batch.source});
    limiter = std::make_unique<RateLimiter>(c, name());
    EXPECT_TRUE(limiter->trySetRate(RateType::Overall, 1000, milliseconds(60000)));
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(limiter->tryAcquire());  // round-robin: both connections
    return c;
  }
};

struct AcquireOutcome {
  std::int64_t granted = -1;
  std::int64_t remaining = -1;
  bool invalid = false;
};

// The permits of the i-th acquisition: a mix, with one over the rate now and then.
std::int64_t permitsOf(int i, std::int64_t rate) { return i % 17 == 16 ? rate + 1 : 1 + (i * 7) % 5; }

TEST_F(Coalesce, QueuedAcquisitionsGetWhatOneByOneCallsGetInTheSameOrder) {
  constexpr int kCalls = 300;
  constexpr std::int64_t kRate = 200;
  ClientOptions co;
  co.pool.size = 1;
  // Order is the point, not deadlines: with the default 500 ms, a loaded machine (a sanitizer)
  // could time a queued call out, close the connection under the others and resend them behind
  // later calls.
  co.connection.commandTimeout = std::chrono::seconds(30);
  auto together = newClient(co);
  auto alone = newClient(co);
  RateLimiter::Options on;
  RateLimiter::Options off;
  off.coalesce = false;
  RateLimiter a(together, name("a"), on);
  RateLimiter b(alone, name("b"), off);
  ASSERT_TRUE(a.trySetRate(RateType::Overall, kRate, milliseconds(60000)));
  ASSERT_TRUE(b.trySetRate(RateType::Overall, kRate, milliseconds(60000)));
  // Both scripts loaded first: four calls go alone at once (the groups in flight on one connection),
  // and a NOSCRIPT for one of them is resent behind the calls written after the SCRIPT LOAD,
  // which would then be decided before it.
  (void)raw({"SCRIPT", "LOAD", detail::lua::acquire.source});
  (void)raw({"SCRIPT", "LOAD", detail::lua::acquire_batch.source});

  // Coalesced: all issued at once from one thread; each callback fills its own slot.
  std::vector<AcquireOutcome> coalesced(kCalls);
  std::atomic<int> finished{0};
  const PoolStats before = together->poolStats();
  for (int i = 0; i < kCalls; ++i) {
    redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpToAsync(
        a, permitsOf(i, kRate), permitsOf(i, kRate),
        [&, i](const detail::AcquireResult& r, const std::exception_ptr& e) {
          AcquireOutcome& d = coalesced[static_cast<std::size_t>(i)];
          if (e) {
            try {
              std::rethrow_exception(e);
            } catch (const InvalidArgument&) {
              d.invalid = true;
            } catch (...) {
            }
          } else {
            d.granted = r.granted;
            d.remaining = r.remaining;
          }
          finished.fetch_add(1);
        });
  }
  const auto start = SteadyTime::now();
  while (finished.load() < kCalls && msSince(start) < 10000) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_EQ(finished.load(), kCalls);
  const PoolStats after = together->poolStats();

  // One by one, in the same order.
  for (int i = 0; i < kCalls; ++i) {
    SCOPED_TRACE(i);
    const std::int64_t p = permitsOf(i, kRate);
    const AcquireOutcome& d = coalesced[static_cast<std::size_t>(i)];
    try {
      const detail::AcquireResult r = redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(b, {}, p, p);
      EXPECT_FALSE(d.invalid);
      EXPECT_EQ(d.granted, r.granted);
      EXPECT_EQ(d.remaining, r.remaining);
    } catch (const InvalidArgument&) {
      EXPECT_TRUE(d.invalid) << "permits over the rate refuse that acquisition only";
    }
  }
  EXPECT_EQ(raw({"GET", a.keys()[1]}).str, raw({"GET", b.keys()[1]}).str);
  EXPECT_EQ(raw({"ZCARD", a.keys()[3]}).integer, raw({"ZCARD", b.keys()[3]}).integer);
  // And they did go together: far fewer script calls than acquisitions.
  const std::uint64_t calls = after.requests - before.requests;
  std::printf("[ coalesce ] %d acquisitions in %llu script calls\n", kCalls, static_cast<unsigned long long>(calls));
  EXPECT_LT(calls, static_cast<std::uint64_t>(kCalls / 4));
}

TEST_F(Coalesce, ManyThreadsOnOneHotLimiterAreHeldToTheRate) {
  constexpr std::int64_t kRate = 1500;
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, kRate, milliseconds(60000)));
  std::atomic<std::int64_t> granted{0}, denied{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) {
        try {
          (rl.tryAcquire() ? granted : denied).fetch_add(1);
        } catch (const std::exception&) {
          errors.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(granted.load(), kRate);
  EXPECT_EQ(denied.load(), std::int64_t{8} * 250 - kRate);
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, kRate) << "each grant its own member";
  EXPECT_EQ(raw({"GET", rl.keys()[1]}).str, "0");
}

TEST_F(Coalesce, TheScriptRefusesABadBatchBeforeWriting) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(60000)));
  static const Script batch{detail::lua::acquire_batch.name, detail::lua::acquire_batch.sha1,
                            detail::lua::acquire_batch.source};
  const std::vector<std::string> keys = rl.keys();
  const std::vector<std::string_view> views(keys.begin(), keys.end());
  // Two acquisitions announced, one given; a zero permit count; an empty id.
  for (const std::vector<std::string_view>& args :
       {std::vector<std::string_view>{"", "", "2", "1", "id-1", "0"},
        std::vector<std::string_view>{"", "", "2", "1", "id-1", "0", "0", "id-2", "0"},
        std::vector<std::string_view>{"", "", "2", "1", "id-1", "0", "1", "", "0"}}) {
    try {
      (void)detail::eval(*client(), batch, views, args);
      ADD_FAILURE() << "accepted";
    } catch (const ScriptError& e) {
      EXPECT_EQ(e.code(), "REDLIMIT_INVALID_ARGUMENT") << e.what();
    }
  }
  EXPECT_EQ(raw({"EXISTS", rl.keys()[1], rl.keys()[3]}).integer, 0) << "nothing was written";
  // A resend of a granted acquisition is found by its member and takes nothing again.
  const Reply first = detail::eval(*client(), batch, views, {"", "", "2", "3", "id-1", "0", "4", "id-2", "0"});
  ASSERT_EQ(first.elements.size(), 9u);
  EXPECT_EQ(first.elements[3].integer, 3);
  EXPECT_EQ(first.elements[6].integer, 4);
  const Reply again = detail::eval(*client(), batch, views, {"", "", "2", "3", "id-1", "1", "4", "id-2", "1"});
  EXPECT_EQ(again.elements[3].integer, 3);
  EXPECT_LT(again.elements[4].integer, 0) << "the stamp of the first grant, negated";
  EXPECT_EQ(again.elements[6].integer, 4);
  EXPECT_EQ(raw({"GET", rl.keys()[1]}).str, "3");
  EXPECT_EQ(raw({"ZCARD", rl.keys()[3]}).integer, 2);
}

TEST_F(Coalesce, SyncCallersAreNotHeldBehindOneGroup) {
  std::unique_ptr<RateLimiter> rl;
  auto c = twoConnections(rl);
  constexpr int kThreads = 8;
  pauseWrites();
  ASSERT_EQ(c->poolStats().pending, 0u);
  std::atomic<int> granted{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      try {
        (rl->tryAcquire() ? granted : failed).fetch_add(1);
      } catch (const std::exception&) {
        failed.fetch_add(1);
      }
    });
  }
  // The server holds every script call: a second one pending was sent while the first was in
  // flight, rather than queued behind it.
  const auto start = SteadyTime::now();
  while (c->poolStats().pending < static_cast<std::size_t>(kThreads) && msSince(start) < 10000)
    std::this_thread::sleep_for(milliseconds(1));
  const std::size_t inFlight = c->poolStats().pending;
  resume();
  for (auto& th : threads) th.join();
  EXPECT_EQ(inFlight, static_cast<std::size_t>(kThreads))
      << "every sync caller in flight at once: none waits behind a group";
  EXPECT_EQ(granted.load(), kThreads);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(raw({"ZCARD", rl->keys()[3]}).integer, 4 + kThreads) << "each grant its own member";
}

TEST_F(Coalesce, QueuedAcquisitionsLeaveAsOneGroupWhenAGroupInFlightIsAnswered) {
  std::unique_ptr<RateLimiter> rl;
  auto c = twoConnections(rl);
  constexpr int kCalls = 20;
  pauseWrites();
  const PoolStats before = c->poolStats();
  std::atomic<int> granted{0}, finished{0};
  for (int i = 0; i < kCalls; ++i) {
    rl->tryAcquireAsync(1, [&](bool ok, const std::exception_ptr& e) {
      if (ok && !e) granted.fetch_add(1);
      finished.fetch_add(1);
    });
  }
  // 2 x kGroupsPerConnection go at once, spread over the connections; the other 12 wait for a place.
  EXPECT_EQ(c->poolStats().pending, 2 * detail::kGroupsPerConnection);
  resume();
  const auto start = SteadyTime::now();
  while (finished.load() < kCalls && msSince(start) < 10000) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_EQ(finished.load(), kCalls);
  EXPECT_EQ(granted.load(), kCalls);
  // The first answer lets the 12 go as one acquire_batch.lua call; the others find none waiting.
  EXPECT_EQ(c->poolStats().requests - before.requests, 2 * detail::kGroupsPerConnection + 1);
  EXPECT_EQ(raw({"ZCARD", rl->keys()[3]}).integer, 4 + kCalls);
}

}  // namespace
}  // namespace redlimit::test
