// A calendar quota in a MultiLimit against a real redis-server: an LLM token budget per tenant per
// Berlin day AND a per-minute token rate, reserved and settled in one script call each, all or
// nothing; a settle resent after its connection was killed is applied once; lua/multi.lua answers
// a time outside a calendar table with the server's time and writes nothing.
// Time comes only from the server's clock: the MultiLimit's calls read TIME (should Berlin's
// midnight fall inside a run, the run is made again on fresh keys), and the script-level test
// passes the time and the table itself, so a window's end is reached without waiting.
#include <chrono>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "limiters/calendar_tables.hpp"
#include "limiters/keyed_policy.hpp"
#include "one_key_support.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;
using std::chrono::minutes;

namespace {

constexpr std::int64_t kDayUs = 86400000000;

// A per-minute token rate: 20 000 tokens at once, 100 more a minute. Slow enough that what it
// refills between two calls of a test (one token per 0.6 s) never reaches what a test asserts.
Policy tokenRate() { return Policy::gcra(100, minutes(1), 20000); }

}  // namespace

class MultiLimitCalendar : public RedisTest {
 protected:
  // The LLM budget's limits, on fresh names for each `attempt` (a run a Berlin midnight cut short
  // is made again on fresh keys): 50 000 tokens per Berlin day, and the token rate.
  Limiter perDay(int attempt) {
    return Limiter(client(), limiterName("llm-day-" + std::to_string(attempt)),
                   berlinCalendar(50000, CalendarUnit::Day));
  }
  Limiter rate(int attempt) {
    return Limiter(client(), limiterName("llm-rate-" + std::to_string(attempt)), tokenRate());
  }
};

// The must-show: reserve an estimate of 1 000 tokens, settle the 234 used, in both limits at once;
// a denial by either limit charges neither.
TEST_F(MultiLimitCalendar, AnLlmBudgetPerBerlinDayAndATokenRateAreChargedTheActualsInOneCall) {
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 2) << "two Berlin midnights within one test";
    Limiter daily = perDay(attempt), perMinute = rate(attempt);
    const MultiLimit budget({daily, perMinute});
    MultiLimit tenant = budget.on({"tenant:7", "tenant:7"});

    const MultiDecision held = tenant.reserveFor(1000, "req-1");
    ASSERT_TRUE(held.allowed);
    EXPECT_FALSE(held.repeated);
    const MultiSettlement settled = tenant.settle("req-1", 234);
    const Decision day = daily.peek("tenant:7");

    // A denial by the day: the token rate is not charged.
    ASSERT_TRUE(daily.decide("tenant:8", 50000).allowed);
    MultiLimit spent = budget.on({"tenant:8", "tenant:8"});
    const MultiDecision byDay = spent.reserveFor(1000, "req-2");
    // A denial by the token rate: the day is not charged.
    ASSERT_TRUE(perMinute.decide("tenant:9", 20000).allowed);
    MultiLimit hurried = budget.on({"tenant:9", "tenant:9"});
    const MultiDecision byRate = hurried.reserveFor(1000, "req-3");
    const Decision last = daily.peek("tenant:9");
    if (daily.policy().windowAt(held.time).label != daily.policy().windowAt(last.time).label) continue;

    EXPECT_EQ(held.limits.at(0).remaining, 49000);
    EXPECT_EQ(held.limits.at(1).remaining, 19000);
    EXPECT_EQ(settled.status, Settlement::Status::Settled);
    ASSERT_EQ(settled.limits.size(), 2u);
    for (const Settlement& one : settled.limits) {
      EXPECT_EQ(one.returned, 766) << "both limits charged the 234 used";
      EXPECT_EQ(one.charged, 0);
    }
    EXPECT_EQ(settled.limits[0].remaining, 50000 - 234);
    EXPECT_EQ(day.remaining, 50000 - 234) << "the day: the limit minus the actuals";
    EXPECT_GE(perMinute.peek("tenant:7").remaining, 20000 - 234);

    EXPECT_FALSE(byDay.allowed);
    EXPECT_EQ(byDay.deniedBy, 0u);
    EXPECT_FALSE(perMinute.exists("tenant:8")) << "denied by the day: the token rate untouched";
    EXPECT_EQ(spent.settle("req-2", 0).status, Settlement::Status::Unknown) << "a denial records nothing";

    EXPECT_FALSE(byRate.allowed);
    EXPECT_EQ(byRate.deniedBy, 1u);
    EXPECT_FALSE(daily.exists("tenant:9")) << "denied by the token rate: the day untouched";
    EXPECT_EQ(last.remaining, 50000);
    return;
  }
}

// The settle sent again after every connection of the Client was killed: Settled once,
// AlreadySettled after, and the day's count exact.
TEST_F(MultiLimitCalendar, ASettleResentAfterAKilledConnectionIsAppliedOnce) {
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 2) << "two Berlin midnights within one test";
    Limiter daily = perDay(attempt), perMinute = rate(attempt);
    MultiLimit tenant = MultiLimit({daily, perMinute}).on({"tenant:7", "tenant:7"});
    const MultiDecision held = tenant.reserveFor(1000, "req-1");
    ASSERT_TRUE(held.allowed);
    int settled = 0, again = 0, failed = 0;
    for (int i = 0; i < 10; ++i) {
      (void)raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
      try {
        const MultiSettlement s = i % 2 == 0 ? tenant.settle("req-1", 234) : tenant.settleAsync("req-1", 234).get();
        EXPECT_EQ(s.limits.at(0).returned, 766);
        EXPECT_EQ(s.limits.at(0).remaining, 50000 - 234) << "the first settle's answer, every time";
        (s.status == Settlement::Status::Settled ? settled : again)++;
      } catch (const IoError&) {
        ++failed;  // the kill can still be in flight: a retry follows
      }
    }
    const Decision day = daily.peek("tenant:7");
    if (daily.policy().windowAt(held.time).label != daily.policy().windowAt(day.time).label) continue;
    EXPECT_EQ(settled, 1);
    EXPECT_GE(again, 5);
    EXPECT_EQ(settled + again + failed, 10);
    EXPECT_EQ(day.remaining, 50000 - 234) << "1 000 taken once, 766 back once";
    EXPECT_EQ(tenant.failureStats().outages, 0u) << "a closed connection is no outage";
    return;
  }
}

TEST_F(MultiLimitCalendar, CallsThatWouldTakePermitsAheadOfTimeAreRefusedBeforeSending) {
  Limiter daily(client(), limiterName("day"), berlinCalendar(100, CalendarUnit::Day));
  Limiter perMinute(client(), limiterName("rate"), tokenRate());
  MultiLimit tenant = MultiLimit({daily, perMinute}).on({"t", "t"});
  const std::int64_t before = scriptCalls();
  EXPECT_THROW((void)tenant.reserve(1, std::chrono::microseconds{0}), InvalidArgument);
  EXPECT_THROW((void)tenant.tryAcquire(1, milliseconds(10)), InvalidArgument);
  EXPECT_THROW(tenant.acquire(1), InvalidArgument);
  EXPECT_THROW((void)tenant.decide(101), InvalidArgument) << "above the day's limit";
  EXPECT_EQ(scriptCalls(), before) << "nothing sent";
  Limiter smooth(client(), limiterName("smooth"),
                 Policy::smoothBursty(1, std::chrono::hours(1), std::chrono::hours(5)));
  EXPECT_THROW((void)MultiLimit({daily, smooth}), InvalidArgument) << "a smooth policy still cannot join";
}

// --- lua/multi.lua with a calendar limit, the time and the table passed by the test ---------------

class MultiLimitCalendarScript : public RedisTest {
 protected:
  // multi.lua's `op` on a day of 3 permits (key `day`, table `tbl`) and a GCRA of 100 a minute,
  // burst 20 000 (key `rate`) at `nowUs`, with the record `record` when not empty.
  Reply run(const std::string& op, std::int64_t nowUs, std::int64_t count, const std::string& tbl,
            const std::string& record = {}) {
    detail::CalendarQuota quota;
    quota.limit = 3;
    const std::string day = detail::calendarConfig(quota, milliseconds(1000)) + tbl;
    const std::string rate = detail::gcraPolicy('G', 20000, 100, minutes(1), milliseconds(1000)).packed;
    std::vector<std::string> keys{key("day"), key("rate")};
    if (!record.empty()) keys.push_back(record);
    const std::string second = op == "reserve" ? "60000" : "0";
    return runScript(admin(), detail::lua::multi, keys,
                     {op, std::to_string(nowUs), "QG", std::to_string(count), second, day, rate});
  }
  std::string key(const std::string& suffix) { return "{" + name("mlc") + "}:" + suffix; }
};

TEST_F(MultiLimitCalendarScript, ATimeOutsideACalendarTableIsAnsweredWithTheServersTimeAndNothingWritten) {
  const std::int64_t t0 = serverTimeUs(admin()) / kDayUs * kDayUs;
  const std::string tbl = calendarTable(100, t0 - kDayUs, kDayUs);  // labels 100..103, 101 holding t0
  const std::string record = key("rate") + ":mrsv:r";
  for (const std::string op : {"take", "peek", "reserve", "refund"}) {
    const Reply r = run(op, t0 + 10 * kDayUs, 1, tbl, op == "reserve" ? record : "");
    ASSERT_EQ(r.type, Reply::Type::Integer) << op;
    EXPECT_EQ(r.integer, t0 + 10 * kDayUs) << op;
  }
  EXPECT_FALSE(exists(admin(), key("day"))) << "nothing written";
  EXPECT_FALSE(exists(admin(), key("rate"))) << "nothing written";
  EXPECT_FALSE(exists(admin(), record)) << "nothing written";

  // Inside the table: reserved in day 101, all or nothing at one instant.
  ASSERT_EQ(run("reserve", t0 + 10, 2, tbl, record).elements.at(0).integer, 1);
  const Reply full = run("take", t0 + kDayUs - 1, 2, tbl);
  EXPECT_EQ(full.elements.at(0).integer, 0) << "the day has 1 left";
  EXPECT_EQ(full.elements.at(2).integer, 1) << "retryAfter: to the day's end, exactly";
  EXPECT_EQ(full.elements.at(7).integer, 1) << "denied by the day";
  // A settle outside the table: the server's time, the record still open.
  const Reply outside = run("settle", t0 + 10 * kDayUs, 0, tbl, record);
  ASSERT_EQ(outside.type, Reply::Type::Integer);
  const Reply settled = run("settle", t0 + kDayUs - 1, 0, tbl, record);
  ASSERT_EQ(settled.type, Reply::Type::Array);
  EXPECT_EQ(settled.elements.at(0).integer, 1) << "settled now, not before";
  EXPECT_EQ(settled.elements.at(3).integer, 2) << "the day got its 2 back";
  EXPECT_EQ(settled.elements.at(6).integer, 3);
  // In day 102, granted again: the day's window ended at its end.
  const Reply next = run("take", t0 + kDayUs, 3, tbl);
  EXPECT_EQ(next.elements.at(0).integer, 1);
  EXPECT_EQ(next.elements.at(8 + 1).integer, 0) << "the day's remaining";
}
