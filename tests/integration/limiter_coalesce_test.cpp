// Coalesced one-key decisions: takes of Limiters under the token bucket, GCRA and fixed-window
// policies of one Client that queue up while a call is in flight go to Redis together as one
// lua/batch.lua call, whatever their keys, and get what one-by-one calls would have got, in order.
//
// The server is held with CLIENT PAUSE ... WRITE while the takes are issued, so that every take
// after the first is queued before the first is answered: the grouping is then known exactly.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "limiters/batcher.hpp"
#include "redlimit_lua.hpp"

#include "helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

class LimiterCoalesce : public RedisTest {
 protected:
  // Write commands (scripts included) wait until resume(); reads and CLIENT UNPAUSE do not.
  void pauseWrites() { ASSERT_EQ(raw({"CLIENT", "PAUSE", "20000", "WRITE"}).str, "OK"); }
  void resume() { (void)raw({"CLIENT", "UNPAUSE"}); }
  // Takes on a throwaway limiter of `c` that go as one batch, so that batch.lua is loaded (and
  // the connection open) before anything is counted.
  void warmBatch(const std::shared_ptr<Client>& c);
  void TearDown() override {
    resume();
    RedisTest::TearDown();
  }
};

// A burst of `burst`, refilled one an hour: nothing comes back during a test.
Policy gcra(std::int64_t burst) { return Policy::gcra(1, milliseconds(3600000), burst); }

// Groups of takes a connection keeps in flight before takes queue (detail::kGroupsPerConnection).
constexpr std::size_t kInFlightOnOne = detail::kGroupsPerConnection;

void LimiterCoalesce::warmBatch(const std::shared_ptr<Client>& c) {
  Limiter warm(c, limiterName("warm"), Policy::gcra(1, milliseconds(1000), 10));
  pauseWrites();
  std::vector<std::future<Decision>> all;
  // batch.lua in the server's script cache before a test counts requests (a NOSCRIPT would add a
  // load and a resend); then every place in flight taken, and a group.
  (void)raw({"SCRIPT", "LOAD", detail::lua::batch.source});
  const std::size_t calls = kInFlightOnOne * c->options().pool.size + 2;
  for (std::size_t i = 0; i < calls; ++i) all.push_back(warm.decideAsync("k", 1));
  resume();
  for (auto& f : all) (void)f.get();
}

std::uint64_t requestsOf(const std::shared_ptr<Client>& c) { return c->poolStats().requests; }

// One connection: its requests are the script calls alone (a second connection would add its
// handshake).
ClientOptions coalescing() {
  ClientOptions o;
  o.coalesce = true;
  return o;
}

ClientOptions oneConnection(bool coalesce = true) {
  ClientOptions o;
  o.pool.size = 1;
  o.coalesce = coalesce;
  return o;
}

TEST_F(LimiterCoalesce, QueuedTakesOfOneLimiterGetWhatOneByOneCallsGetInTheSameOrder) {
  constexpr int kCalls = 200;
  constexpr std::int64_t kBurst = 50;
  auto together = newClient(oneConnection());
  auto alone = newClient(oneConnection(false));
  Limiter a(together, limiterName("a"), gcra(kBurst));
  Limiter b(alone, limiterName("b"), gcra(kBurst));
  warmBatch(together);
  (void)a.decide("k", 1);  // one permit used on both
  (void)b.decide("k", 1);

  pauseWrites();
  const std::uint64_t before = requestsOf(together);
  std::vector<std::future<Decision>> coalesced;
  for (int i = 0; i < kCalls; ++i) coalesced.push_back(a.decideAsync("k", 1 + i % 3));
  resume();
  std::vector<Decision> got;
  for (auto& f : coalesced) got.push_back(f.get());
  const std::uint64_t calls = requestsOf(together) - before;

  for (int i = 0; i < kCalls; ++i) {
    SCOPED_TRACE(i);
    const Decision one = b.decide("k", 1 + i % 3);
    const Decision& d = got[static_cast<std::size_t>(i)];
    EXPECT_EQ(d.allowed, one.allowed);
    EXPECT_EQ(d.remaining, one.remaining);
    EXPECT_EQ(d.limit, one.limit);
    EXPECT_FALSE(d.byPolicy);
  }
  // The first kInFlightOnOne alone, then groups of at most 64: 196 = 64 + 64 + 64 + 4.
  std::printf("[ coalesce ] %d takes in %llu script calls\n", kCalls, static_cast<unsigned long long>(calls));
  EXPECT_EQ(calls, kInFlightOnOne + 4);
}

TEST_F(LimiterCoalesce, TakesOfManyLimitersAndKindsGoTogetherAndEachIsDecidedAsAlone) {
  auto together = newClient(oneConnection());
  auto alone = newClient(oneConnection(false));
  const Policy tb = Policy::tokenBucket(3, 1, milliseconds(3600000));
  const Policy fw = Policy::fixedWindow(2, milliseconds(3600000));
  Limiter ga(together, limiterName("ag"), gcra(4)), gb(alone, limiterName("bg"), gcra(4));
  Limiter ta(together, limiterName("at"), tb), tb2(alone, limiterName("bt"), tb);
  Limiter wa(together, limiterName("aw"), fw), wb(alone, limiterName("bw"), fw);
  const std::vector<Limiter*> mine{&ga, &ta, &wa}, theirs{&gb, &tb2, &wb};
  warmBatch(together);
  for (auto* l : mine) (void)l->decide("k", 1);  // each kind's own script loaded for the takes that go alone
  for (auto* l : theirs) (void)l->decide("k", 1);

  pauseWrites();
  const std::uint64_t before = requestsOf(together);
  std::vector<std::future<Decision>> coalesced;
  for (int i = 0; i < 30; ++i) coalesced.push_back(mine[static_cast<std::size_t>(i % 3)]->decideAsync("k", 1));
  resume();
  for (int i = 0; i < 30; ++i) {
    SCOPED_TRACE(i);
    const Decision d = coalesced[static_cast<std::size_t>(i)].get();
    const Decision one = theirs[static_cast<std::size_t>(i % 3)]->decide("k", 1);
    EXPECT_EQ(d.allowed, one.allowed);
    EXPECT_EQ(d.remaining, one.remaining);
    EXPECT_EQ(d.limit, one.limit);
  }
  EXPECT_EQ(requestsOf(together) - before, kInFlightOnOne + 1) << "the first ones alone, the others in one call";
}

TEST_F(LimiterCoalesce, ALimiterSendsTheTakesOfManyKeysTogether) {
  auto together = newClient(oneConnection());
  Limiter perKey(together, limiterName("policy"), Policy::gcra(1, milliseconds(3600000), 2));
  const std::string prefix = "user:";
  warmBatch(together);

  pauseWrites();
  const std::uint64_t before = requestsOf(together);
  std::vector<std::future<Decision>> coalesced;
  for (int i = 0; i < 40; ++i) coalesced.push_back(perKey.decideAsync(prefix + std::to_string(i % 10)));
  resume();
  std::vector<int> allowed(10, 0);
  for (int i = 0; i < 40; ++i) {
    const Decision d = coalesced[static_cast<std::size_t>(i)].get();
    if (d.allowed) ++allowed[static_cast<std::size_t>(i % 10)];
    // Each key's takes in order: its first two are allowed, the others denied.
    EXPECT_EQ(d.allowed, i < 20) << i;
  }
  for (int k = 0; k < 10; ++k) EXPECT_EQ(allowed[static_cast<std::size_t>(k)], 2) << k;
  EXPECT_EQ(requestsOf(together) - before, kInFlightOnOne + 1) << "the first ones alone, the others in one call";
}

TEST_F(LimiterCoalesce, AFailingTakeFailsAloneAndItsBatchMatesAreDecided) {
  auto together = newClient(oneConnection());  // the places in flight taken: the second and third go together
  Limiter good(together, limiterName("good"), gcra(4 + kInFlightOnOne));  // 2 left at the end
  Limiter bad(together, limiterName("bad"), gcra(5));
  raw({"RPUSH", bad.redisKey("k"), "not", "a", "limiter"});
  (void)good.decide("k", 1);

  pauseWrites();
  std::vector<std::future<Decision>> alone;
  for (std::size_t i = 1; i < kInFlightOnOne; ++i) alone.push_back(good.decideAsync("k", 1));
  auto first = good.decideAsync("k", 1);
  auto second = bad.decideAsync("k", 1);
  auto third = good.decideAsync("k", 1);
  resume();
  for (auto& f : alone) EXPECT_TRUE(f.get().allowed);
  EXPECT_TRUE(first.get().allowed);
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)second.get(); }));
  const Decision d = third.get();
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(raw({"LLEN", bad.redisKey("k")}).integer, 3) << "nothing written to the key of another type";
}

TEST_F(LimiterCoalesce, TakesLeaveAsOneGroupWhenAGroupInFlightIsAnswered) {
  ClientOptions o = coalescing();
  o.pool.size = 2;
  o.connection.commandTimeout = std::chrono::seconds(30);  // a paused server does not reach it
  auto c = newClient(o);
  Limiter a(c, limiterName(), gcra(100));
  warmBatch(c);
  pauseWrites();
  const std::uint64_t before = requestsOf(c);
  std::vector<std::future<Decision>> all;
  for (int i = 0; i < 20; ++i) all.push_back(a.decideAsync("k", 1));
  // 2 x kInFlightOnOne go at once, spread over the connections; the other 12 wait for a place.
  EXPECT_EQ(c->poolStats().pending, 2 * kInFlightOnOne);
  resume();
  for (auto& f : all) EXPECT_TRUE(f.get().allowed);
  // The first answer lets the 12 go as one batch.lua call; the others find none waiting.
  EXPECT_EQ(requestsOf(c) - before, 2 * kInFlightOnOne + 1);
}

TEST_F(LimiterCoalesce, OffMeansOneCallPerTake) {
  auto c = newClient(oneConnection(false));
  Limiter a(c, limiterName(), gcra(100));
  (void)a.decide("k", 1);
  pauseWrites();
  const std::uint64_t before = requestsOf(c);
  std::vector<std::future<Decision>> all;
  for (int i = 0; i < 20; ++i) all.push_back(a.decideAsync("k", 1));
  resume();
  for (auto& f : all) EXPECT_TRUE(f.get().allowed);
  EXPECT_EQ(requestsOf(c) - before, 20u);
}

TEST_F(LimiterCoalesce, SyncCallersOfEightThreadsAreHeldToTheLimit) {
  auto c = newClient(coalescing());
  Limiter perKey(c, limiterName("policy"), Policy::gcra(1, milliseconds(3600000), 20));
  const std::string prefix = "k:";
  std::atomic<int> granted{0}, denied{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        try {
          (perKey.decide(prefix + std::to_string((t + i) % 10)).allowed ? granted : denied).fetch_add(1);
        } catch (const std::exception&) {
          errors.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(granted.load(), 10 * 20);
  EXPECT_EQ(denied.load(), 8 * 50 - 10 * 20);
}

TEST_F(LimiterCoalesce, TakesStillQueuedWhenTheLastLimiterIsDroppedEndWithClosedError) {
  auto c = newClient(oneConnection());  // kInFlightOnOne groups in flight: the first takes
  std::vector<std::future<Decision>> all;
  {
    Limiter a(c, limiterName(), gcra(100));
    (void)a.decide("k", 1);
    pauseWrites();
    for (std::size_t i = 0; i < kInFlightOnOne + 4; ++i) all.push_back(a.decideAsync("k", 1));
  }
  resume();
  for (std::size_t i = 0; i < kInFlightOnOne; ++i) EXPECT_TRUE(all[i].get().allowed) << "in flight, answered: " << i;
  for (std::size_t i = kInFlightOnOne; i < all.size(); ++i) EXPECT_THROW((void)all[i].get(), ClosedError) << i;
}

}  // namespace
}  // namespace redlimit::test
