// Limiter: reserve, then settle, per key, against a real redis-server, as typed tests over the
// policies that hold (GCRA, token bucket, fixed window): a record per key and id, a settle retried
// after CLIENT KILL gives back once, the async forms answer as the sync ones, bad input is refused
// before sending, a caller's key spelled like a record is a key of its own, and a killed server is
// the failure policy's. One-key handles' reserve and settle: reserve_settle_test.cpp.
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/policy.hpp"
#include "redlimit_test/fixture.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

// 10 at once, nothing back for a day (the fixed window: one window of 46 days), so the permits in
// use are exactly what the test took while it runs.
struct HoldingGcra {
  static Policy make() { return Policy::gcra(1, milliseconds(86400000), 10); }
};
struct HoldingTokenBucket {
  static Policy make() { return Policy::tokenBucket(10, 1, milliseconds(86400000)); }
};
struct HoldingFixedWindow {
  static Policy make() { return Policy::fixedWindow(10, milliseconds(4000000000)); }
};

template <class P>
class LimiterReserveSettle : public RedisTest {
 protected:
  // The policy's limiter named `suffix`, with its own metrics registry (so counts are this test's).
  Limiter limiter(const std::string& suffix, const std::shared_ptr<MetricsRegistry>& registry) {
    Limiter::Options options;
    options.monitor.registry = registry;
    return Limiter(this->client(), limiterName(suffix), P::make(), options);
  }
};

class HoldingNames {
 public:
  template <class T>
  static std::string GetName(int) {
    if (std::is_same_v<T, HoldingTokenBucket>) return "TokenBucket";
    if (std::is_same_v<T, HoldingGcra>) return "Gcra";
    return "FixedWindow";
  }
};
using HoldingPolicies = ::testing::Types<HoldingTokenBucket, HoldingGcra, HoldingFixedWindow>;
TYPED_TEST_SUITE(LimiterReserveSettle, HoldingPolicies, HoldingNames);

// A record per key and id; a settle retried after CLIENT KILL gives back once; bad input is
// refused before anything is sent.
TYPED_TEST(LimiterReserveSettle, ARecordPerKeyAndIdAndASettleRetriedAfterClientKillGivesBackOnce) {
  const auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = this->limiter("policy", registry);
  EXPECT_EQ(rl.recordKey("user:1", "r"), "rl::rsv:r:{" + rl.redisKey("user:1") + "}");
  ASSERT_EQ(rl.reserveFor("user:1", 6, "r").remaining, 4);
  ASSERT_EQ(rl.reserveFor("user:2", 6, "r").remaining, 4) << "one id on another key is another reservation";
  const Decision again = rl.reserveFor("user:1", 6, "r");
  EXPECT_TRUE(again.repeated);
  EXPECT_EQ(again.remaining, 4);
  int settled = 0;
  for (int i = 0; i < 5; ++i) {
    (void)this->raw({"CLIENT", "KILL", "TYPE", "normal"});
    try {
      const Settlement s = rl.settle("user:1", "r", 2);
      EXPECT_EQ(s.returned, 4);
      EXPECT_EQ(s.remaining, 8);
      settled += s.status == Settlement::Status::Settled ? 1 : 0;
    } catch (const IoError&) {
    }
  }
  EXPECT_EQ(settled, 1);
  EXPECT_EQ(rl.peek("user:1").remaining, 8);
  EXPECT_EQ(rl.peek("user:2").remaining, 4);
  EXPECT_EQ(rl.cancel("user:2", "r").returned, 6);
  EXPECT_EQ(rl.peek("user:2").remaining, 10);
  EXPECT_EQ(rl.settle("user:1", "nope", 1).status, Settlement::Status::Unknown);
  const LimiterMetrics::Snapshot m = registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 2u);
  EXPECT_EQ(m.reservationsSettled, 2u);
  EXPECT_EQ(m.permitsRefunded, 10u);

  const std::int64_t start = this->scriptCalls();
  EXPECT_THROW((void)rl.reserveFor("", 1, "x"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("user:1", 1, "bad id"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("user:1", 11, "x"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("user:1", 1, "x", milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)rl.settle("user:1", "r", -1), InvalidArgument);
  EXPECT_THROW((void)rl.settle("odd}key", "r", 1), InvalidArgument) << "no record could share its slot";
  EXPECT_EQ(this->scriptCalls(), start) << "nothing sent";
}

// A caller's key spelled like a reservation record's key is a key of its own: taken before the
// owner reserves, it neither reaches the record nor keeps the reservation from being made.
TYPED_TEST(LimiterReserveSettle, AKeySpelledLikeARecordKeyIsAKeyOfItsOwn) {
  Limiter rl = this->limiter("policy", nullptr);
  const std::string owner = "{bob}";
  const std::string record = rl.recordKey(owner, "req-2");
  for (const std::string& k : {record, owner + ":rsv:req-2", owner + ":mrsv:req-2", owner + ":rsv"}) {
    EXPECT_TRUE(rl.decide(k).allowed) << k;
    EXPECT_NE(rl.redisKey(k), record) << k;
  }
  EXPECT_FALSE(exists(this->admin(), record));
  const Decision held = rl.reserveFor(owner, 6, "req-2");
  EXPECT_TRUE(held.allowed);
  EXPECT_FALSE(held.repeated);
  EXPECT_TRUE(exists(this->admin(), record));
  EXPECT_EQ(rl.settle(owner, "req-2", 6).status, Settlement::Status::Settled);
}

// The async forms: the same answers without waiting; bad input reaches the callback before
// anything is sent; a killed server: the failure policy decides the reservation, a settle reports
// the IoError.
TYPED_TEST(LimiterReserveSettle, AsyncFormsAnswerAsTheSyncOnesAndAKilledServerIsTheFailurePolicys) {
  const auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = this->limiter("policy", registry);
  ASSERT_EQ(rl.reserveForAsync("user:1", 6, "r").get().remaining, 4);
  std::promise<std::pair<Decision, std::exception_ptr>> held;
  rl.reserveForAsync("user:2", 6, "r", milliseconds(60000), [&](Decision h, std::exception_ptr e) {
    held.set_value({h, std::move(e)});
  });
  const auto [second, heldError] = held.get_future().get();
  EXPECT_FALSE(heldError);
  EXPECT_EQ(second.remaining, 4) << "one id on another key is another reservation";
  EXPECT_TRUE(rl.reserveForAsync("user:1", 6, "r").get().repeated);
  int settled = 0;
  for (int i = 0; i < 5; ++i) {
    (void)this->raw({"CLIENT", "KILL", "TYPE", "normal"});
    try {
      const Settlement s = rl.settleAsync("user:1", "r", 2).get();
      EXPECT_EQ(s.returned, 4);
      settled += s.status == Settlement::Status::Settled ? 1 : 0;
    } catch (const IoError&) {
    }
  }
  EXPECT_EQ(settled, 1) << "a settle retried after CLIENT KILL gives back once";
  EXPECT_EQ(rl.peek("user:1").remaining, 8);
  std::promise<Settlement> cancelled;
  rl.settleAsync("user:2", "r", 0, [&](Settlement s, const std::exception_ptr&) { cancelled.set_value(s); });
  EXPECT_EQ(cancelled.get_future().get().returned, 6);
  EXPECT_EQ(rl.peek("user:2").remaining, 10);
  const LimiterMetrics::Snapshot m = registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 2u);
  EXPECT_EQ(m.reservationsSettled, 2u);

  const std::int64_t start = this->scriptCalls();
  EXPECT_THROW((void)rl.reserveForAsync("", 1, "x").get(), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync("user:1", 1, "bad id").get(), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync("user:1", 11, "x").get(), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync("user:1", 1, "x", milliseconds(0)).get(), InvalidArgument);
  EXPECT_THROW((void)rl.settleAsync("user:1", "r", -1).get(), InvalidArgument);
  EXPECT_EQ(this->scriptCalls(), start) << "nothing sent";

  RedisServer server;
  Limiter::Options allow;
  allow.failure.policy = FailurePolicy::Allow;
  Limiter gone(shortTimeoutClient(server), "gone", TypeParam::make(), allow);
  ASSERT_TRUE(gone.reserveForAsync("k", 1, "a").get().allowed);
  server.kill();
  const Decision byPolicy = gone.reserveForAsync("k", 1, "b").get();
  EXPECT_TRUE(byPolicy.allowed);
  EXPECT_TRUE(byPolicy.byPolicy);
  EXPECT_THROW((void)gone.settleAsync("k", "a", 1).get(), IoError);
}

}  // namespace
}  // namespace redlimit::test
