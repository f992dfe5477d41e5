// KeyedCalendarRateLimiter against a real redis-server: one calendar quota over many keys, the quota
// in every call (no set-up), CalendarRateLimiter's keys, bad keys refused before sending, keys of
// other kinds refused with nothing written, one metrics series and one failure gate per policy.
#include <future>
#include <memory>
#include <string>

#include "helpers.hpp"
#include "redlimit/calendar_rate_limiter.hpp"
#include "redlimit/keyed_calendar_rate_limiter.hpp"
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
