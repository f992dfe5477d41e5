// CalendarRateLimiter and lua/calendar_quota.lua against a real redis-server. Time comes only from
// the server's clock: the limiter's calls read TIME, and the script-level tests pass the time and
// the calendar table themselves, so a window's end is reached without waiting.
#include <atomic>
#include <future>
#include <memory>
#include <utility>
#include <cstring>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "one_key_support.hpp"
#include "redlimit/calendar_rate_limiter.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/http.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

constexpr std::int64_t kDayUs = 86400000000;
constexpr std::int64_t kHourUs = 3600000000;

CalendarQuota berlinDay(std::int64_t limit) { return berlinQuota(limit, CalendarUnit::Day); }

std::int64_t getLe(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t u = 0;
  for (int i = bytes - 1; i >= 0; --i) u = (u << 8U) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return static_cast<std::int64_t>(u);
}

// Consecutive windows of `len` µs labelled from `label`, the first starting at `start`.
std::string table(std::int64_t label, std::int64_t start, std::int64_t len, int count = 4) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    putLe(out, label + i, 8);
    putLe(out, start + i * len, 8);
    putLe(out, start + (i + 1) * len, 8);
  }
  return out;
}

// The key's 28 bytes: 'Q', unit, limit, label, start, end, count.
struct Stored {
  std::int64_t label, start, end, count;
};

}  // namespace

class CalendarQuotaTest : public RedisTest {
 protected:
  Reply run(const std::string& op, const std::string& key, const std::string& nowUs, std::int64_t permits,
            std::int64_t limit, const std::string& tbl) {
    return runOneKey(admin(), detail::lua::calendar_quota, key,
                     {op, nowUs, "Q", std::to_string(permits), std::to_string(limit), "D", "1000", tbl});
  }
  Reply takeAt(const std::string& key, std::int64_t nowUs, std::int64_t permits, const std::string& tbl) {
    return run("take", key, std::to_string(nowUs), permits, 3, tbl);
  }
  Stored stored(const std::string& key) {
    const std::string v = raw({"GET", key}).str;
    EXPECT_EQ(v.size(), 28u);
    if (v.size() != 28) return {};
    EXPECT_EQ(v[0], 'Q');
    return {getLe(v, 6, 4), getLe(v, 10, 7), getLe(v, 17, 7), getLe(v, 24, 4)};
  }
};

TEST_F(CalendarQuotaTest, DeniesAtTheLimitWithRetryAfterExactToTheWindowEnd) {
  CalendarRateLimiter rl(client(), name(), berlinDay(3));
  const Decision empty = rl.peek();
  EXPECT_TRUE(empty.allowed);
  EXPECT_EQ(empty.remaining, 3);
  EXPECT_FALSE(exists(admin(), name())) << "peek writes nothing";
  const std::int64_t before = serverTimeUs(admin());
  for (int i = 0; i < 3; ++i) {
    const Decision d = rl.decide();
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.remaining, 2 - i);
  }
  const Decision denied = rl.decide();
  const std::int64_t after = serverTimeUs(admin());
  ASSERT_FALSE(denied.allowed);
  EXPECT_FALSE(denied.byPolicy);
  EXPECT_EQ(denied.limit, 3);
  EXPECT_EQ(denied.remaining, 0);
  EXPECT_GE(denied.time.count(), before);
  EXPECT_LE(denied.time.count(), after);
  // Exact: the window's end (by the server's time the decision was made at) minus that time.
  const CalendarWindow w = rl.windowAt(denied.time);
  EXPECT_EQ(stored(name()).end, w.end.count());
  EXPECT_EQ(stored(name()).label, w.label);
  EXPECT_EQ(denied.retryAfter, w.end - denied.time);
  EXPECT_EQ(denied.resetAfter, w.end - denied.time);
  const Decision peeked = rl.peek();
  EXPECT_FALSE(peeked.allowed);
  EXPECT_EQ(peeked.retryAfter, peeked.resetAfter);
  // The key lives until the window's end plus keepAlive (1 s), no longer.
  const std::int64_t pttl = raw({"PTTL", name()}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, (w.end.count() - before) / 1000 + 1001);
  // The HTTP headers follow the decision: Retry-After is the seconds to the window's end, rounded up.
  const auto retry = http::retryAfterHeader(denied);
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(*retry, std::to_string((denied.retryAfter.count() + 999999) / 1000000));
}

TEST_F(CalendarQuotaTest, TheWindowEndsExactlyAtItsEnd) {
  const std::int64_t t0 = serverTimeUs(admin()) / kDayUs * kDayUs;
  const std::string tbl = table(100, t0 - kDayUs, kDayUs);  // labels 100..103, 101 holding t0
  const std::string key = name();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(takeReply(takeAt(key, t0 + 10, 1, tbl)).allowed);
  const TakeReply last = takeReply(takeAt(key, t0 + kDayUs - 1, 1, tbl));
  EXPECT_FALSE(last.allowed);
  EXPECT_EQ(last.retryAfterUs, 1);
  const TakeReply next = takeReply(takeAt(key, t0 + kDayUs, 1, tbl));
  EXPECT_TRUE(next.allowed);
  EXPECT_EQ(next.remaining, 2);
  EXPECT_EQ(next.resetAfterUs, kDayUs);
  EXPECT_EQ(stored(key).label, 102);
  EXPECT_EQ(stored(key).start, t0 + kDayUs);
}

TEST_F(CalendarQuotaTest, TablesThatDisagreeNeverOpenTwoWindowsForOneLabel) {
  // Client A's database puts the days at t0 + k days, client B's an hour later (another version).
  const std::int64_t t0 = serverTimeUs(admin()) / kDayUs * kDayUs;
  const std::string a = table(100, t0, kDayUs), b = table(100, t0 + kHourUs, kDayUs);
  const std::int64_t halfPast = t0 + kDayUs + kHourUs / 2;  // A: day 101; B: still day 100
  // A opens 101; B, at the same time, counts in it (the stored window is in force until its end).
  const std::string k1 = name("a-first");
  ASSERT_TRUE(takeReply(takeAt(k1, halfPast, 1, a)).allowed);
  ASSERT_TRUE(takeReply(takeAt(k1, halfPast, 1, b)).allowed);
  EXPECT_EQ(stored(k1).label, 101);
  EXPECT_EQ(stored(k1).count, 2);
  // B opens 100 (ending an hour late by A's database); A counts in it. When it ends, A opens 101
  // from its end, not from A's midnight: no overlap, no second day 100.
  const std::string k2 = name("b-first");
  ASSERT_TRUE(takeReply(takeAt(k2, halfPast, 2, b)).allowed);
  const TakeReply full = takeReply(takeAt(k2, halfPast, 2, a));
  EXPECT_FALSE(full.allowed) << "A counts in B's day 100";
  EXPECT_EQ(full.retryAfterUs, t0 + kDayUs + kHourUs - halfPast);
  ASSERT_TRUE(takeReply(takeAt(k2, t0 + kDayUs + kHourUs, 3, a)).allowed);
  EXPECT_EQ(stored(k2).label, 101);
  EXPECT_EQ(stored(k2).start, t0 + kDayUs + kHourUs);
  EXPECT_EQ(stored(k2).end, t0 + 2 * kDayUs);
  // A's day 100 ended; B, whose day 100 has not, gets day 101 from the stored end: day 100 is never
  // reopened.
  const std::string k3 = name("reopen");
  ASSERT_TRUE(takeReply(takeAt(k3, t0 + 10, 3, a)).allowed);
  const TakeReply late = takeReply(takeAt(k3, t0 + kDayUs + 10, 3, b));
  EXPECT_TRUE(late.allowed) << "a new window, not day 100 again (which is full)";
  EXPECT_EQ(stored(k3).label, 101);
  EXPECT_EQ(stored(k3).start, t0 + kDayUs);
  EXPECT_EQ(stored(k3).end, t0 + 2 * kDayUs + kHourUs);
  EXPECT_EQ(stored(k3).count, 3);
}

TEST_F(CalendarQuotaTest, ATimeOutsideTheTableIsAnsweredWithTheServersTime) {
  const std::int64_t before = serverTimeUs(admin());
  const Reply r = run("take", name(), "", 1, 3, table(10, 0, kDayUs));  // January 1970
  ASSERT_EQ(r.type, Reply::Type::Integer);
  EXPECT_GE(r.integer, before);
  EXPECT_LE(r.integer, serverTimeUs(admin()));
  EXPECT_FALSE(exists(admin(), name())) << "nothing written";
  // A table that is not consecutive is refused.
  std::string gap = table(10, 0, kDayUs, 1) + table(12, 2 * kDayUs, kDayUs, 1);
  EXPECT_THROW((void)run("take", name(), "", 1, 3, gap), InvalidArgument);
}

TEST_F(CalendarQuotaTest, KeysOfOtherKindsOrGarbageAreRefusedAndLeftUnchanged) {
  CalendarRateLimiter rl(client(), name(), berlinDay(3));
  auto refused = [&](const char* what, auto expected) {
    const std::string before = keyState(admin(), name());
    try {
      (void)rl.decide();
      ADD_FAILURE() << what << ": decided";
    } catch (const decltype(expected)& e) {
      EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)rl.peek(), decltype(expected)) << what;
    EXPECT_EQ(keyState(admin(), name()), before) << what;
    (void)raw({"DEL", name()});
  };
  (void)raw({"HSET", name(), "rate", "10"});
  refused("a hash", InvalidConfigError("", ""));
  (void)raw({"SET", name(), "hello"});
  refused("a foreign string", InvalidConfigError("", ""));
  FixedWindowRateLimiter other(client(), name());
  ASSERT_TRUE(other.trySetConfig(FixedWindowTraits::config(5, 5, milliseconds(1000))));
  refused("a fixed window", InvalidConfigError("", ""));
  // A calendar window of its own kind whose end is not after its start.
  ASSERT_TRUE(rl.tryAcquire());
  std::string v = raw({"GET", name()}).str;
  ASSERT_EQ(v.size(), 28u);
  std::memcpy(&v[17], &v[10], 7);  // end = start
  (void)detail::command(admin(), {"SET", name(), v});
  refused("an empty window", InvalidStateError("", ""));
}

TEST_F(CalendarQuotaTest, BadInputIsRefusedBeforeAnythingIsSent) {
  CalendarRateLimiter rl(client(), name(), berlinDay(3));
  (void)rl.peek();  // the script is loaded
  const std::int64_t calls = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  auto make = [&](CalendarQuota q) { CalendarRateLimiter bad(client(), name(), std::move(q)); };
  CalendarQuota q = berlinDay(3);
  q.zone = "Europe/Berlinn";
  EXPECT_THROW(make(q), InvalidArgument);
  q = berlinDay(3);
  q.unit = CalendarUnit::Week;
  q.weekStart = static_cast<Weekday>(7);
  EXPECT_THROW(make(q), InvalidArgument);
  EXPECT_THROW(make(berlinDay(0)), InvalidArgument);
  EXPECT_THROW(make(berlinDay(CalendarRateLimiter::kMaxPermits + 1)), InvalidArgument);
  EXPECT_THROW((void)rl.decide(0), InvalidArgument);
  EXPECT_THROW((void)rl.decide(4), InvalidArgument) << "more than the limit can ever grant";
  EXPECT_THROW((void)rl.peek(-1), InvalidArgument);
  EXPECT_THROW(CalendarRateLimiter(nullptr, name(), berlinDay(3)), InvalidArgument);
  EXPECT_THROW(CalendarRateLimiter(client(), "", berlinDay(3)), InvalidArgument);
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"), calls) << "nothing sent";
}

TEST_F(CalendarQuotaTest, DecisionsAreCountedInTheMetrics) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiterOptions o;
  o.monitor.registry = registry;
  CalendarQuota q = berlinDay(3);
  q.unit = CalendarUnit::Month;
  CalendarRateLimiter rl(client(), name(), q, o);
  ASSERT_TRUE(rl.tryAcquire(2));
  ASSERT_TRUE(rl.tryAcquire(1));
  ASSERT_FALSE(rl.tryAcquire(1));
  ASSERT_FALSE(rl.tryAcquire(2));
  const auto s = registry->snapshot(name());
  EXPECT_EQ(s.granted, 2u);
  EXPECT_EQ(s.denied, 2u);
  EXPECT_EQ(s.permitsGranted, 3u);
  EXPECT_EQ(s.roundTrips, 4u);
}

TEST_F(CalendarQuotaTest, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    CalendarRateLimiterOptions options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    CalendarRateLimiter rl(c, "policy", berlinDay(3), options);
    ASSERT_TRUE(rl.decide().allowed);
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const Decision d = rl.decide();
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.limit, 3);
        (d.allowed ? allowed : denied)++;
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
        EXPECT_EQ(allowed, 3) << "the local bucket holds the limit";
        EXPECT_EQ(denied, 3);
        break;
    }
    EXPECT_THROW((void)rl.peek(), IoError) << "a query is no decision: it reports the outage";
    EXPECT_TRUE(rl.failureStats().degraded);
    EXPECT_EQ(rl.failureStats().outages, 1u);
    server.restart();
    bool recovered = false;
    for (int i = 0; i < 100 && !recovered; ++i) {
      try {
        recovered = !rl.decide().byPolicy;
      } catch (const IoError&) {
      }
      if (!recovered) sleepMs(10);
    }
    EXPECT_TRUE(recovered);
    EXPECT_FALSE(rl.failureStats().degraded);
  }
}

TEST_F(CalendarQuotaTest, AsyncDecisionsDecideLikeTheSyncOnes) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiterOptions o;
  o.monitor.registry = registry;
  CalendarRateLimiter rl(client(), name(), berlinQuota(3, CalendarUnit::Month), o);
  const Decision first = rl.decideAsync(2).get();
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 1);
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.decideAsync(1, [&](Decision d, std::exception_ptr e) { got.set_value({d, std::move(e)}); });
  const auto [second, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_TRUE(second.allowed);
  EXPECT_EQ(second.remaining, 0);
  const Decision denied = rl.decideAsync(1).get();
  EXPECT_FALSE(denied.allowed);
  const CalendarWindow w = rl.windowAt(denied.time);
  EXPECT_EQ(denied.retryAfter, w.end - denied.time) << "exact to the window's end";
  const auto s = registry->snapshot(name());
  EXPECT_EQ(s.granted, 2u);
  EXPECT_EQ(s.denied, 1u);
  EXPECT_EQ(s.permitsGranted, 3u);

  // Bad permits: InvalidArgument through the future, nothing sent.
  const std::int64_t calls = commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval");
  EXPECT_THROW((void)rl.decideAsync(0).get(), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync(4).get(), InvalidArgument);
  EXPECT_EQ(commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"), calls) << "nothing sent";

  // 60 in flight at once on a quota of 20: exactly 20 granted.
  CalendarRateLimiter many(client(), name("many"), berlinQuota(20, CalendarUnit::Month));
  std::vector<std::future<Decision>> inFlight;
  for (int i = 0; i < 60; ++i) inFlight.push_back(many.decideAsync());
  int granted = 0;
  for (auto& f : inFlight) granted += f.get().allowed ? 1 : 0;
  EXPECT_EQ(granted, 20);
}

TEST_F(CalendarQuotaTest, AsyncDecisionsOfAnUnreachableRedisAreDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    CalendarRateLimiterOptions options;
    options.failure.policy = policy;
    CalendarRateLimiter rl(c, "policy", berlinDay(3), options);
    ASSERT_TRUE(rl.decideAsync().get().allowed);
    server.kill();
    for (int i = 0; i < 3; ++i) {
      std::future<Decision> f = rl.decideAsync();
      if (policy == FailurePolicy::Allow) {
        const Decision d = f.get();
        EXPECT_TRUE(d.allowed);
        EXPECT_TRUE(d.byPolicy);
      } else {
        EXPECT_THROW((void)f.get(), IoError);
      }
    }
  }
}

// Reserve, then settle on a calendar quota (docs/algorithms.md "Reserve, then settle"). The
// limiter's calls decide with the server's clock, in a month of Berlin (a window's end falls inside
// a test about once in 20 million runs); the window's end is reached by the script-level test,
// which passes the time itself.
class CalendarRateLimiterTest : public CalendarQuotaTest {
 protected:
  std::int64_t scriptCalls() { return commandCalls(admin(), "evalsha") + commandCalls(admin(), "eval"); }
  CalendarRateLimiter monthly(std::int64_t limit, const std::shared_ptr<MetricsRegistry>& registry = nullptr) {
    CalendarRateLimiterOptions o;
    o.monitor.registry = registry;
    return CalendarRateLimiter(client(), name(), berlinQuota(limit, CalendarUnit::Month), o);
  }
  // The script's reserve/settle/refund of `key` at `nowUs` with the record of `id` (none for refund).
  Reply hold(const std::string& op, const std::string& key, const std::string& id, std::int64_t nowUs,
             std::int64_t count, const std::string& tbl) {
    std::vector<std::string> keys{key};
    if (!id.empty()) keys.push_back(detail::reservationRecordKey(key, id));
    std::vector<std::string> args{op, std::to_string(nowUs), "Q", std::to_string(count), "3", "D", "1000", tbl};
    if (op == "reserve") args.emplace_back("60000");
    return runScript(admin(), detail::lua::calendar_quota, keys, args);
  }
};

namespace {

void expectSettlement(const Settlement& s, SettleStatus status, std::int64_t reserved, std::int64_t actual,
                      std::int64_t returned, std::int64_t charged, std::int64_t unpaid, std::int64_t remaining) {
  EXPECT_EQ(s.status, status);
  EXPECT_EQ(s.reserved, reserved);
  EXPECT_EQ(s.actual, actual);
  EXPECT_EQ(s.returned, returned);
  EXPECT_EQ(s.charged, charged);
  EXPECT_EQ(s.unpaid, unpaid);
  EXPECT_EQ(s.remaining, remaining);
}

// The reservation counts of `name` in `registry`: opened, settled, permits refunded, granted
// decisions and their permits.
void expectCounted(const MetricsRegistry& registry, const std::string& name, std::uint64_t opened,
                   std::uint64_t settled, std::uint64_t refunded, std::uint64_t granted, std::uint64_t permits) {
  const LimiterMetricsSnapshot m = registry.snapshot(name);
  EXPECT_EQ(m.reservationsOpened, opened);
  EXPECT_EQ(m.reservationsSettled, settled);
  EXPECT_EQ(m.permitsRefunded, refunded);
  EXPECT_EQ(m.granted, granted);
  EXPECT_EQ(m.permitsGranted, permits);
}

// A reserve reply of the script: take's nine values, then repeated.
TakeReply reserveReply(const Reply& r) {
  return detail::parseDecisionReply(r, detail::DecisionForm::Array, "(test)", detail::kReserveReplySize);
}

// A settle reply of the script.
Settlement settlementOf(const Reply& r) {
  EXPECT_EQ(r.type, Reply::Type::Array);
  EXPECT_EQ(r.elements.size(), 7u);
  if (r.elements.size() != 7) return {};
  Settlement s;
  s.status = detail::settleStatusOf(r.elements[0].integer, "(test)");
  s.reserved = r.elements[1].integer;
  s.actual = r.elements[2].integer;
  s.returned = r.elements[3].integer;
  s.charged = r.elements[4].integer;
  s.unpaid = r.elements[5].integer;
  s.remaining = r.elements[6].integer;
  return s;
}

}  // namespace

TEST_F(CalendarRateLimiterTest, ReserveThenSettleGivesBackTheUnusedOnceInTheSameWindow) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiter rl = monthly(100, registry);
  const HeldPermits held = rl.reserveFor(40, "req-1");
  ASSERT_TRUE(held.decision.allowed);
  EXPECT_FALSE(held.repeated);
  EXPECT_EQ(held.decision.remaining, 60);
  EXPECT_EQ(held.decision.limit, 100);
  const CalendarWindow w = rl.windowAt(held.decision.time);
  EXPECT_EQ(held.decision.resetAfter, w.end - held.decision.time) << "exact to the window's end";
  EXPECT_EQ(rl.reservationKey("req-1"), "{" + name() + "}:rsv:req-1");
  EXPECT_TRUE(exists(admin(), rl.reservationKey("req-1")));
  const std::int64_t pttl = raw({"PTTL", rl.reservationKey("req-1")}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 3600000) << "the default record TTL: 1 hour";

  expectSettlement(rl.settle("req-1", 10), SettleStatus::Settled, 40, 10, 30, 0, 0, 90);
  // A retry (another actual too) answers the first settle and changes nothing.
  expectSettlement(rl.settle("req-1", 25), SettleStatus::AlreadySettled, 40, 10, 30, 0, 0, 90);
  EXPECT_EQ(rl.peek().remaining, 90);
  // Used beyond the reservation: charged in the window, up to the limit; the rest is unpaid.
  ASSERT_TRUE(rl.reserveFor(10, "req-2").decision.allowed);
  expectSettlement(rl.settle("req-2", 25), SettleStatus::Settled, 10, 25, 0, 15, 0, 65);
  ASSERT_TRUE(rl.reserveFor(60, "req-3").decision.allowed);
  expectSettlement(rl.settle("req-3", 70), SettleStatus::Settled, 60, 70, 0, 5, 5, 0);
  EXPECT_EQ(rl.peek().remaining, 0);
  // No record: Unknown, nothing changes.
  expectSettlement(rl.settle("never", 3), SettleStatus::Unknown, 0, 0, 0, 0, 0, 0);
  EXPECT_FALSE(exists(admin(), rl.reservationKey("never")));

  expectCounted(*registry, name(), 3, 3, 30, 3, 110);
}

TEST_F(CalendarRateLimiterTest, AReserveRepeatedWithItsIdTakesNothingMoreAndADenialRecordsNothing) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiter rl = monthly(10, registry);
  ASSERT_TRUE(rl.reserveFor(3, "a").decision.allowed);
  const HeldPermits again = rl.reserveFor(3, "a");
  EXPECT_TRUE(again.decision.allowed);
  EXPECT_TRUE(again.repeated);
  EXPECT_EQ(again.decision.remaining, 7) << "nothing more taken";
  EXPECT_THROW((void)rl.reserveFor(4, "a"), InvalidArgument) << "an id names one reservation";
  expectSettlement(rl.settle("a", 1), SettleStatus::Settled, 3, 1, 2, 0, 0, 9);
  const HeldPermits settled = rl.reserveFor(3, "a");
  EXPECT_TRUE(settled.repeated) << "also once settled, while the record lives";
  EXPECT_EQ(settled.decision.remaining, 9);
  // A denial records nothing: the id may be tried again.
  const HeldPermits denied = rl.reserveFor(10, "b");
  EXPECT_FALSE(denied.decision.allowed);
  EXPECT_FALSE(denied.repeated);
  EXPECT_EQ(denied.decision.retryAfter, rl.windowAt(denied.decision.time).end - denied.decision.time);
  EXPECT_FALSE(exists(admin(), rl.reservationKey("b")));
  EXPECT_EQ(rl.settle("b", 0).status, SettleStatus::Unknown);
  const LimiterMetricsSnapshot m = registry->snapshot(name());
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.granted, 1u) << "repeats count nothing";
  EXPECT_EQ(m.denied, 1u);
}

TEST_F(CalendarRateLimiterTest, CancelGivesTheReservationBackAndRefundNeverGoesBelowNothingUsed) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiter rl = monthly(10, registry);
  ASSERT_TRUE(rl.reserveFor(5, "c").decision.allowed);
  expectSettlement(rl.cancel("c"), SettleStatus::Settled, 5, 0, 5, 0, 0, 10);
  ASSERT_TRUE(rl.tryAcquire(3));
  rl.refund(2);
  EXPECT_EQ(rl.peek().remaining, 9);
  rl.refund(100);
  EXPECT_EQ(rl.peek().remaining, 10) << "never below 0 used";
  rl.refund(0);
  EXPECT_EQ(registry->snapshot(name()).permitsRefunded, 107u);
  // A refund on a quota with nothing counted writes nothing.
  CalendarRateLimiter fresh(client(), name("fresh"), berlinQuota(10, CalendarUnit::Month));
  fresh.refund(4);
  EXPECT_FALSE(exists(admin(), name("fresh")));
}

TEST_F(CalendarRateLimiterTest, ASettleAfterTheWindowEndedGivesNothingBackAndChargesTheNewWindow) {
  const std::int64_t t0 = serverTimeUs(admin()) / kDayUs * kDayUs;
  const std::string tbl = table(100, t0 - kDayUs, kDayUs);  // labels 100..103, 101 holding t0
  const std::string key = name();
  const std::string tbl2 = table(101, t0, kDayUs);  // a client a day later: 102 holds t0 + 1 day
  // Made in day 101, settled in it: given back.
  ASSERT_TRUE(reserveReply(hold("reserve", key, "same", t0 + 10, 2, tbl)).allowed);
  EXPECT_EQ(stored(key).count, 2);
  const Settlement same = settlementOf(hold("settle", key, "same", t0 + kDayUs - 1, 0, tbl));
  expectSettlement(same, SettleStatus::Settled, 2, 0, 2, 0, 0, 3);
  EXPECT_EQ(stored(key).count, 0);
  // Made in day 101, settled in day 102: day 101's count is gone, nothing is given back.
  ASSERT_TRUE(reserveReply(hold("reserve", key, "late", t0 + 20, 3, tbl)).allowed);
  const Settlement late = settlementOf(hold("settle", key, "late", t0 + kDayUs + 10, 1, tbl2));
  expectSettlement(late, SettleStatus::Settled, 3, 1, 0, 0, 0, 3);
  EXPECT_EQ(stored(key).label, 101) << "nothing changed: nothing written";
  // Used beyond it, settled in day 102: the extra is counted in day 102.
  const std::string key2 = name("charged");
  ASSERT_TRUE(reserveReply(hold("reserve", key2, "over", t0 + 20, 1, tbl)).allowed);
  const Settlement over = settlementOf(hold("settle", key2, "over", t0 + kDayUs + 10, 3, tbl2));
  expectSettlement(over, SettleStatus::Settled, 1, 3, 0, 2, 0, 1);
  EXPECT_EQ(stored(key2).label, 102);
  EXPECT_EQ(stored(key2).start, t0 + kDayUs);
  EXPECT_EQ(stored(key2).count, 2);
  // A reserve repeated in day 102 answers as the window is now.
  const Reply repeatedReply = hold("reserve", key2, "over", t0 + kDayUs + 20, 1, tbl2);
  const TakeReply repeated = reserveReply(repeatedReply);
  EXPECT_EQ(repeatedReply.elements.at(9).integer, 1) << "repeated";
  EXPECT_TRUE(repeated.allowed);
  EXPECT_EQ(repeated.remaining, 1);
  // A refund gives back to the window in force only.
  const Reply refunded = hold("refund", key2, "", t0 + kDayUs + 30, 5, tbl2);
  ASSERT_EQ(refunded.type, Reply::Type::Array);
  EXPECT_EQ(refunded.elements.at(0).integer, 3);
  EXPECT_EQ(stored(key2).count, 0);
  // Outside the caller's table: the server's time, nothing read or written but the key.
  const Reply outside = hold("settle", key2, "over", t0 + 10 * kDayUs, 0, tbl);
  ASSERT_EQ(outside.type, Reply::Type::Integer);
  EXPECT_EQ(outside.integer, t0 + 10 * kDayUs);
}

TEST_F(CalendarRateLimiterTest, AsyncReserveAndSettleAnswerAsTheSyncForms) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiter rl = monthly(100, registry);
  const HeldPermits first = rl.reserveForAsync(40, "f").get();
  EXPECT_TRUE(first.decision.allowed);
  EXPECT_FALSE(first.repeated);
  EXPECT_EQ(first.decision.remaining, 60);
  std::promise<std::pair<HeldPermits, std::exception_ptr>> got;
  rl.reserveForAsync(40, "f", [&](HeldPermits h, std::exception_ptr e) { got.set_value({h, std::move(e)}); });
  const auto [repeat, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_TRUE(repeat.repeated);
  std::promise<std::pair<HeldPermits, std::exception_ptr>> got2;
  rl.reserveForAsync(20, "g", milliseconds(5000), [&](HeldPermits h, std::exception_ptr e) {
    got2.set_value({h, std::move(e)});
  });
  EXPECT_EQ(got2.get_future().get().first.decision.remaining, 40);
  EXPECT_LE(raw({"PTTL", rl.reservationKey("g")}).integer, 5000);

  expectSettlement(rl.settleAsync("f", 30).get(), SettleStatus::Settled, 40, 30, 10, 0, 0, 50);
  std::promise<std::pair<Settlement, std::exception_ptr>> settled;
  rl.settleAsync("f", 30, [&](Settlement s, std::exception_ptr e) { settled.set_value({s, std::move(e)}); });
  const auto [again, settleError] = settled.get_future().get();
  EXPECT_FALSE(settleError);
  expectSettlement(again, SettleStatus::AlreadySettled, 40, 30, 10, 0, 0, 50);
  expectCounted(*registry, name(), 2, 1, 10, 2, 60);
}

TEST_F(CalendarRateLimiterTest, BadReserveSettleAndRefundAreRefusedBeforeSending) {
  CalendarRateLimiter rl = monthly(10);
  (void)rl.peek();  // the script is loaded
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)rl.reserveFor(0, "a"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor(11, "a"), InvalidArgument) << "more than the limit";
  EXPECT_THROW((void)rl.reserveFor(1, ""), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor(1, "a b"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor(1, std::string(129, 'a')), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor(1, "a", milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor(1, "a", milliseconds(604800001)), InvalidArgument);
  EXPECT_THROW((void)rl.settle("", 1), InvalidArgument);
  EXPECT_THROW((void)rl.settle("a", -1), InvalidArgument);
  EXPECT_THROW((void)rl.settle("a", CalendarRateLimiter::kMaxPermits + 1), InvalidArgument);
  EXPECT_THROW((void)rl.cancel("a/b"), InvalidArgument);
  EXPECT_THROW(rl.refund(-1), InvalidArgument);
  EXPECT_THROW(rl.refund(CalendarRateLimiter::kMaxPermits + 1), InvalidArgument);
  EXPECT_THROW((void)rl.reservationKey(""), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync(0, "a").get(), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync(1, "", milliseconds(10)).get(), InvalidArgument);
  EXPECT_THROW((void)rl.settleAsync("a", -1).get(), InvalidArgument);
  std::promise<std::exception_ptr> refused;
  rl.settleAsync("", 1, [&](Settlement, std::exception_ptr e) { refused.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refused.get_future().get()), InvalidArgument);
  std::promise<std::exception_ptr> refusedHold;
  rl.reserveForAsync(0, "a", [&](HeldPermits, std::exception_ptr e) { refusedHold.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refusedHold.get_future().get()), InvalidArgument);
  // A name without a hash tag that holds a '}': no record key can share its slot.
  CalendarRateLimiter braced(client(), name("a}b"), berlinQuota(10, CalendarUnit::Month));
  EXPECT_THROW((void)braced.reserveFor(1, "a"), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
}

// CLIENT KILL TYPE normal before each call (client_kill_test.cpp's kill): the closed connection
// makes reserve and settle be sent again, and their record applies them once.
TEST_F(CalendarRateLimiterTest, AReserveResentAfterAKilledConnectionIsAppliedOnce) {
  auto registry = std::make_shared<MetricsRegistry>();
  CalendarRateLimiter rl = monthly(100, registry);
  int reserved = 0, repeated = 0, settled = 0, again = 0, failed = 0;
  for (int i = 0; i < 10; ++i) {
    (void)raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
    try {
      const HeldPermits h = i % 2 == 0 ? rl.reserveFor(40, "req-1") : rl.reserveForAsync(40, "req-1").get();
      EXPECT_TRUE(h.decision.allowed);
      EXPECT_EQ(h.decision.remaining, 60);
      (h.repeated ? repeated : reserved)++;
    } catch (const IoError&) {
      ++failed;  // the kill can still be in flight: a retry follows
    }
  }
  EXPECT_EQ(reserved, 1);
  EXPECT_EQ(reserved + repeated + failed, 10);
  EXPECT_EQ(rl.peek().remaining, 60) << "40 taken once";
  for (int i = 0; i < 10; ++i) {
    (void)raw({"CLIENT", "KILL", "TYPE", "normal"});
    try {
      const Settlement s = i % 2 == 0 ? rl.settle("req-1", 10) : rl.settleAsync("req-1", 10).get();
      EXPECT_EQ(s.returned, 30);
      EXPECT_EQ(s.remaining, 90) << "the first settle's answer, every time";
      (s.status == SettleStatus::Settled ? settled : again)++;
    } catch (const IoError&) {
      ++failed;
    }
  }
  EXPECT_EQ(settled, 1);
  EXPECT_GE(again, 5);
  EXPECT_EQ(rl.peek().remaining, 90) << "40 taken once, 30 back once";
  expectCounted(*registry, name(), 1, 1, 30, 1, 40);
  EXPECT_EQ(rl.failureStats().outages, 0u) << "a closed connection is no outage";
}
