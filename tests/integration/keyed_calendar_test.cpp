// KeyedCalendarRateLimiter against a real redis-server: one calendar quota over many keys, the quota
// in every call (no set-up), CalendarRateLimiter's keys, bad keys refused before sending, keys of
// other kinds refused with nothing written, one metrics series and one failure gate per policy.
#include <future>
#include <memory>
#include <string>

#include "helpers.hpp"
#include "redlimit/calendar_rate_limiter.hpp"
#include "redlimit/keyed_calendar_rate_limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

// A month in Berlin: a window's end falls inside a test about once in 20 million runs.
CalendarQuota berlinMonth(std::int64_t limit) { return berlinQuota(limit, CalendarUnit::Month); }

}  // namespace

class KeyedCalendarTest : public RedisTest {
 protected:
  std::int64_t scriptCalls() { return commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"); }
};

TEST_F(KeyedCalendarTest, EachKeyHasItsOwnWindowWithNoSetUp) {
  KeyedCalendarRateLimiter monthly(client(), "monthly", berlinMonth(3));
  const std::string alice = name("alice"), bob = name("bob");
  for (int i = 0; i < 3; ++i) {
    const Decision d = monthly.decide(alice);
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.remaining, 2 - i);
    EXPECT_EQ(d.limit, 3);
  }
  const Decision denied = monthly.decide(alice);
  EXPECT_FALSE(denied.allowed);
  const CalendarWindow w = monthly.windowAt(denied.time);
  EXPECT_EQ(denied.retryAfter, w.end - denied.time) << "exact to the window's end";
  EXPECT_TRUE(monthly.decideAsync(bob, 2).get().allowed) << "another key: its own window";
  EXPECT_TRUE(monthly.tryAcquire(bob, 1));
  EXPECT_FALSE(monthly.peek(bob).allowed);
  EXPECT_EQ(monthly.peek(name("carol")).remaining, 3);
  EXPECT_FALSE(exists(admin(), name("carol"))) << "peek writes nothing";
  // The key expires keepAlive (1 s) after its window's end.
  const std::int64_t pttl = raw({"PTTL", alice}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, (w.end - denied.time).count() / 1000 + 1001);
  // CalendarRateLimiter's key: a handle on it sees the same count.
  CalendarRateLimiter one(client(), alice, berlinMonth(3));
  EXPECT_EQ(one.peek().remaining, 0);
  EXPECT_TRUE(monthly.deleteKey(alice));
  EXPECT_FALSE(monthly.deleteKey(alice));
  EXPECT_EQ(one.peek().remaining, 3) << "deleted: a new window";
  // A caller with another limit decides the same key with its own: the count is kept.
  KeyedCalendarRateLimiter larger(client(), "larger", berlinMonth(5));
  const Decision more = larger.decide(bob);
  EXPECT_TRUE(more.allowed);
  EXPECT_EQ(more.remaining, 1) << "3 counted of 5, then 1";
}

TEST_F(KeyedCalendarTest, BadKeysAndPermitsAreRefusedBeforeSendingAndOtherKindsWithNothingWritten) {
  KeyedCalendarRateLimiter monthly(client(), "monthly", berlinMonth(3));
  (void)monthly.peek(name("warm"));  // the script is loaded
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)monthly.decide(""), InvalidArgument);
  EXPECT_THROW((void)monthly.decide(std::string(KeyedCalendarRateLimiter::kMaxKeyLength + 1, 'k')), InvalidArgument);
  EXPECT_THROW((void)monthly.peek(""), InvalidArgument);
  EXPECT_THROW((void)monthly.deleteKey(""), InvalidArgument);
  EXPECT_THROW((void)monthly.decide(name("k"), 0), InvalidArgument);
  EXPECT_THROW((void)monthly.decide(name("k"), 4), InvalidArgument) << "more than the limit";
  EXPECT_THROW((void)monthly.decideAsync("").get(), InvalidArgument);
  EXPECT_THROW((void)monthly.decideAsync(name("k"), 0).get(), InvalidArgument);
  std::promise<std::exception_ptr> refused;
  monthly.decideAsync("", 1, [&](Decision, std::exception_ptr e) { refused.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refused.get_future().get()), InvalidArgument);
  EXPECT_THROW(KeyedCalendarRateLimiter(nullptr, "p", berlinMonth(3)), InvalidArgument);
  CalendarQuota badZone = berlinMonth(3);
  badZone.zone = "Mars/Olympus";
  EXPECT_THROW(KeyedCalendarRateLimiter(client(), "p", badZone), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";

  const std::string hashed = name("hashed"), foreign = name("foreign");
  (void)raw({"HSET", hashed, "rate", "10"});
  (void)raw({"SET", foreign, "hello"});
  for (const std::string& key : {hashed, foreign}) {
    const std::string before = keyState(admin(), key);
    try {
      (void)monthly.decide(key);
      ADD_FAILURE() << key << ": decided";
    } catch (const InvalidConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << "names the key: " << e.what();
    }
    EXPECT_EQ(keyState(admin(), key), before);
  }
}

TEST_F(KeyedCalendarTest, OneMetricsSeriesAndOneFailureGateForThePolicy) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiterOptions o;
  o.monitor.registry = registry;
  KeyedCalendarRateLimiter monthly(client(), name("policy"), berlinMonth(1), o);
  for (int k = 0; k < 10; ++k) {
    ASSERT_TRUE(monthly.tryAcquire(name("k" + std::to_string(k))));
    ASSERT_FALSE(monthly.tryAcquire(name("k" + std::to_string(k))));
  }
  const auto s = registry->snapshot(name("policy"));
  EXPECT_EQ(s.granted, 10u);
  EXPECT_EQ(s.denied, 10u);

  RedisServer server;
  auto c = shortTimeoutClient(server);
  CalendarRateLimiterOptions allow;
  allow.failure.policy = FailurePolicy::Allow;
  KeyedCalendarRateLimiter gone(c, "gone", berlinMonth(2), allow);
  ASSERT_TRUE(gone.decide("a").allowed);
  server.kill();
  for (const char* key : {"a", "b", "c"}) {
    const Decision d = gone.decide(key);
    EXPECT_TRUE(d.allowed);
    EXPECT_TRUE(d.byPolicy) << key;
  }
  EXPECT_TRUE(gone.failureStats().degraded) << "one gate for every key";
  EXPECT_THROW((void)gone.peek("a"), IoError) << "peek is not a decision";
}

// Reserve, then settle per key (docs/algorithms.md "Reserve, then settle").
class KeyedCalendarRateLimiterTest : public KeyedCalendarTest {};

// An LLM token budget: 50 000 tokens per tenant per day in Europe/Berlin. Each call reserves an
// estimate and settles what the answer used: the day's remaining is the limit minus the actuals,
// exactly (a reservation that was never settled would leave its estimate counted).
// The calls run on Redis's clock: should Berlin's midnight fall between the first reserve and the
// last peek, the day's count is gone and the run is made again on fresh keys (a second midnight
// cannot follow within the same seconds), so every assertion holds for one calendar day.
TEST_F(KeyedCalendarRateLimiterTest, AnLlmTokenBudgetPerTenantPerBerlinDayIsChargedTheActuals) {
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 2) << "two Berlin midnights within one test";
    auto registry = std::make_shared<MetricsRegistry>();
    CalendarRateLimiterOptions o;
    o.monitor.registry = registry;
    const std::string run = std::to_string(attempt);
    KeyedCalendarRateLimiter daily(client(), name("llm-tokens-" + run), berlinQuota(50000, CalendarUnit::Day), o);
    const std::string tenant = name("{tenant:7}:tokens:" + run), other = name("{tenant:8}:tokens:" + run);
    const HeldPermits first = daily.reserveFor(tenant, 1000, "req-1");
    ASSERT_TRUE(first.decision.allowed);
    const Settlement s1 = daily.settle(tenant, "req-1", 234);
    const HeldPermits second = daily.reserveFor(tenant, 1000, "req-2");
    ASSERT_TRUE(second.decision.allowed);
    const Settlement s2 = daily.settle(tenant, "req-2", 532);
    const Decision now = daily.peek(tenant);
    if (daily.windowAt(first.decision.time).label != daily.windowAt(now.time).label) continue;
    EXPECT_EQ(first.decision.remaining, 49000);
    EXPECT_EQ(daily.reservationKey(tenant, "req-1"), tenant + ":rsv:req-1");
    EXPECT_EQ(s1.status, SettleStatus::Settled);
    EXPECT_EQ(s1.returned, 766);
    EXPECT_EQ(s1.remaining, 50000 - 234);
    EXPECT_EQ(s2.returned, 468);
    EXPECT_EQ(s2.remaining, 50000 - 234 - 532);
    EXPECT_EQ(now.remaining, 50000 - 234 - 532) << "the limit minus the actuals";
    EXPECT_EQ(daily.settle(tenant, "req-2", 532).status, SettleStatus::AlreadySettled);
    EXPECT_EQ(daily.peek(tenant).remaining, 50000 - 234 - 532) << "a retried settle changes nothing";
    // The same id on another tenant is another reservation; CalendarRateLimiter on a key sees its count.
    EXPECT_FALSE(daily.reserveFor(other, 1000, "req-1").repeated);
    EXPECT_EQ(daily.cancel(other, "req-1").returned, 1000);
    CalendarRateLimiter one(client(), tenant, berlinQuota(50000, CalendarUnit::Day));
    EXPECT_EQ(one.peek().remaining, 50000 - 234 - 532);
    const LimiterMetricsSnapshot m = registry->snapshot(name("llm-tokens-" + run));
    EXPECT_EQ(m.reservationsOpened, 3u);
    EXPECT_EQ(m.reservationsSettled, 3u);
    EXPECT_EQ(m.permitsRefunded, 766u + 468u + 1000u);
    return;
  }
}

TEST_F(KeyedCalendarRateLimiterTest, AsyncFormsRefundAndBadKeysRefusedBeforeSending) {
  KeyedCalendarRateLimiter monthly(client(), "monthly", berlinMonth(10));
  const std::string key = name("k");
  const HeldPermits held = monthly.reserveForAsync(key, 6, "a").get();
  ASSERT_TRUE(held.decision.allowed);
  EXPECT_EQ(held.decision.remaining, 4);
  std::promise<HeldPermits> again;
  monthly.reserveForAsync(key, 6, "a", milliseconds(60000),
                          [&](HeldPermits h, std::exception_ptr) { again.set_value(h); });
  EXPECT_TRUE(again.get_future().get().repeated);
  const Settlement s = monthly.settleAsync(key, "a", 2).get();
  EXPECT_EQ(s.returned, 4);
  EXPECT_EQ(s.remaining, 8);
  std::promise<Settlement> retried;
  monthly.settleAsync(key, "a", 2, [&](Settlement r, std::exception_ptr) { retried.set_value(r); });
  EXPECT_EQ(retried.get_future().get().status, SettleStatus::AlreadySettled);
  monthly.refund(key, 1);
  EXPECT_EQ(monthly.peek(key).remaining, 9);

  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)monthly.reserveFor("", 1, "a"), InvalidArgument);
  EXPECT_THROW((void)monthly.reserveFor(key, 11, "a"), InvalidArgument);
  EXPECT_THROW((void)monthly.reserveFor(name("x:rsv:a"), 1, "a"), InvalidArgument) << "a record's key";
  EXPECT_THROW((void)monthly.settle("", "a", 1), InvalidArgument);
  EXPECT_THROW((void)monthly.cancel(key, ""), InvalidArgument);
  EXPECT_THROW(monthly.refund("", 1), InvalidArgument);
  EXPECT_THROW(monthly.refund(key, -1), InvalidArgument);
  EXPECT_THROW((void)monthly.reservationKey("", "a"), InvalidArgument);
  EXPECT_THROW((void)monthly.reserveForAsync("", 1, "a").get(), InvalidArgument);
  EXPECT_THROW((void)monthly.settleAsync("", "a", 1).get(), InvalidArgument);
  std::promise<std::exception_ptr> refused;
  monthly.settleAsync("", "a", 1, [&](Settlement, std::exception_ptr e) { refused.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refused.get_future().get()), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
}
