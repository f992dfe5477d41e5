// Calendar quotas against a real redis-server: a Limiter under Policy::calendar (each key its own
// window, no set-up; decisions exact to the window's end; reserve, then settle; the failure policy;
// refusals before sending), and lua/calendar_quota.lua itself. Time comes only from the server's
// clock: a Limiter's calls read TIME (in a month of Berlin, or retried on fresh keys should a day
// end inside the run), and the script-level tests pass the time and the calendar table themselves,
// so a window's end is reached without waiting.
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "helpers.hpp"
#include "limiters/calendar_tables.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/script_call.hpp"
#include "one_key_support.hpp"
#include "redlimit/calendar.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/http.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

constexpr std::int64_t kDayUs = 86400000000;
constexpr std::int64_t kHourUs = 3600000000;

std::int64_t getLe(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t u = 0;
  for (int i = bytes - 1; i >= 0; --i) u = (u << 8U) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return static_cast<std::int64_t>(u);
}

std::string table(std::int64_t label, std::int64_t start, std::int64_t len, int count = 4) {
  return calendarTable(label, start, len, count);
}

// The key's 28 bytes: 'Q', unit, limit, label, start, end, count.
struct Stored {
  std::int64_t label, start, end, count;
};

void expectSettlement(const Settlement& s, Settlement::Status status, std::int64_t reserved, std::int64_t actual,
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
  const LimiterMetrics::Snapshot m = registry.snapshot(name);
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

// Whether `reply` is a packed decision that grants (65 bytes, the first 0xA1).
bool grants(const std::string& reply) { return reply.size() == 65 && static_cast<unsigned char>(reply[0]) == 0xA1; }

// Options whose metrics go to `registry`.
Limiter::Options countedIn(const std::shared_ptr<MetricsRegistry>& registry) {
  Limiter::Options o;
  o.monitor.registry = registry;
  return o;
}

}  // namespace

// A key's stored window, read raw.
class CalendarQuotaStore : public RedisTest {
 protected:
  Stored stored(const std::string& key) {
    const std::string v = raw({"GET", key}).str;
    EXPECT_EQ(v.size(), 28u);
    if (v.size() != 28) return {};
    EXPECT_EQ(v[0], 'Q');
    return {getLe(v, 6, 4), getLe(v, 10, 7), getLe(v, 17, 7), getLe(v, 24, 4)};
  }
};

// --- A Limiter under Policy::calendar ------------------------------------------------------------

class LimiterCalendar : public CalendarQuotaStore {
 protected:
  // `limit` per month of Berlin: a window's end falls inside a test about once in 20 million runs.
  Limiter monthly(std::int64_t limit, const std::shared_ptr<MetricsRegistry>& registry = nullptr,
                  const std::string& suffix = "l") {
    return Limiter(client(), limiterName(suffix), berlinCalendar(limit, CalendarUnit::Month), countedIn(registry));
  }
};

// A day of Berlin on Redis's clock: should its midnight fall inside a run, the run is made again
// on a fresh key (a second midnight cannot follow within the same seconds).
TEST_F(LimiterCalendar, DeniesAtTheLimitWithRetryAfterExactToTheWindowEnd) {
  Limiter rl(client(), limiterName(), berlinCalendar(3, CalendarUnit::Day));
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 2) << "two Berlin midnights within one test";
    const std::string key = "k" + std::to_string(attempt);
    const Decision empty = rl.peek(key);
    EXPECT_TRUE(empty.allowed);
    EXPECT_EQ(empty.remaining, 3);
    EXPECT_FALSE(rl.exists(key)) << "peek writes nothing";
    const std::int64_t before = serverTimeUs(admin());
    std::vector<Decision> granted;
    for (int i = 0; i < 3; ++i) granted.push_back(rl.decide(key));
    const Decision denied = rl.decide(key);
    const std::int64_t after = serverTimeUs(admin());
    const CalendarWindow w = rl.policy().windowAt(denied.time);
    if (rl.policy().windowAt(granted.front().time).label != w.label) continue;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(granted[static_cast<std::size_t>(i)].allowed) << i;
      EXPECT_EQ(granted[static_cast<std::size_t>(i)].remaining, 2 - i);
    }
    ASSERT_FALSE(denied.allowed);
    EXPECT_FALSE(denied.byPolicy);
    EXPECT_EQ(denied.limit, 3);
    EXPECT_EQ(denied.remaining, 0);
    EXPECT_GE(denied.time.count(), before);
    EXPECT_LE(denied.time.count(), after);
    // Exact: the window's end (by the server's time the decision was made at) minus that time.
    EXPECT_TRUE(rl.exists(key));
    EXPECT_EQ(stored(rl.redisKey(key)).end, w.end.count());
    EXPECT_EQ(stored(rl.redisKey(key)).label, w.label);
    EXPECT_EQ(denied.retryAfter, w.end - denied.time);
    EXPECT_EQ(denied.resetAfter, w.end - denied.time);
    const Decision peeked = rl.peek(key);
    EXPECT_FALSE(peeked.allowed);
    EXPECT_EQ(peeked.retryAfter, peeked.resetAfter);
    // The key lives until the window's end plus keepAlive (1 s), no longer.
    const std::int64_t pttl = raw({"PTTL", rl.redisKey(key)}).integer;
    EXPECT_GT(pttl, 0);
    EXPECT_LE(pttl, (w.end.count() - before) / 1000 + 1001);
    // The HTTP headers follow the decision: Retry-After is the seconds to the window's end, rounded up.
    const auto retry = http::retryAfterHeader(denied);
    ASSERT_TRUE(retry.has_value());
    EXPECT_EQ(*retry, std::to_string((denied.retryAfter.count() + 999999) / 1000000));
    return;
  }
}

TEST_F(LimiterCalendar, EachKeyHasItsOwnWindowWithNoSetUp) {
  Limiter rl = monthly(3);
  for (int i = 0; i < 3; ++i) {
    const Decision d = rl.decide("alice");
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.remaining, 2 - i);
    EXPECT_EQ(d.limit, 3);
  }
  const Decision denied = rl.decide("alice");
  EXPECT_FALSE(denied.allowed);
  const CalendarWindow w = rl.policy().windowAt(denied.time);
  EXPECT_EQ(denied.retryAfter, w.end - denied.time) << "exact to the window's end";
  EXPECT_TRUE(rl.decideAsync("bob", 2).get().allowed) << "another key: its own window";
  EXPECT_TRUE(rl.tryAcquire("bob", 1));
  EXPECT_FALSE(rl.peek("bob").allowed);
  EXPECT_EQ(rl.peek("carol").remaining, 3);
  EXPECT_FALSE(exists(admin(), rl.redisKey("carol"))) << "peek writes nothing";
  // The key expires keepAlive (1 s) after its window's end.
  const std::int64_t pttl = raw({"PTTL", rl.redisKey("alice")}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, (w.end - denied.time).count() / 1000 + 1001);
  // Another Limiter of the same name and policy: the same keys, the same count.
  Limiter same = monthly(3);
  EXPECT_EQ(same.peek("alice").remaining, 0);
  EXPECT_TRUE(rl.deleteKey("alice"));
  EXPECT_FALSE(rl.deleteKey("alice"));
  EXPECT_EQ(same.peek("alice").remaining, 3) << "deleted: a new window";
  // A caller with another limit decides the same key with its own: the count is kept.
  Limiter larger(client(), rl.name(), berlinCalendar(5, CalendarUnit::Month));
  const Decision more = larger.decide("bob");
  EXPECT_TRUE(more.allowed);
  EXPECT_EQ(more.remaining, 1) << "3 counted of 5, then 1";
}

TEST_F(LimiterCalendar, KeysOfOtherKindsOrGarbageAreRefusedAndLeftUnchanged) {
  Limiter rl = monthly(3);
  const std::string key = rl.redisKey("k");
  auto refused = [&](const char* what, ErrorKind expected) {
    const std::string before = keyState(admin(), key);
    try {
      (void)rl.decide("k");
      ADD_FAILURE() << what << ": decided";
    } catch (const ScriptError& e) {
      EXPECT_EQ(e.kind(), expected) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
    EXPECT_TRUE(test::throwsError<ScriptError>(expected, [&] { (void)rl.peek("k"); })) << what;
    EXPECT_TRUE(test::throwsError<ScriptError>(expected, [&] { (void)rl.decideAsync("k").get(); })) << what;
    EXPECT_EQ(keyState(admin(), key), before) << what;
    (void)raw({"DEL", key});
  };
  (void)raw({"HSET", key, "rate", "10"});
  try {
    (void)rl.decide("k");
    ADD_FAILURE() << "decided on a hash";
  } catch (const ScriptError& e) {
    EXPECT_NE(std::string(e.what()).find("holds another Redis type, not a calendar quota"), std::string::npos)
        << e.what();
  }
  refused("a hash", ErrorKind::InvalidConfig);
  (void)raw({"SET", key, "hello"});
  refused("a foreign string", ErrorKind::InvalidConfig);
  Limiter other(client(), rl.name(), Policy::fixedWindow(5, milliseconds(60000)));
  ASSERT_TRUE(other.tryAcquire("k"));
  refused("a fixed window", ErrorKind::InvalidConfig);
  // A calendar window of its own kind whose end is not after its start.
  ASSERT_TRUE(rl.tryAcquire("k"));
  std::string v = raw({"GET", key}).str;
  ASSERT_EQ(v.size(), 28u);
  std::memcpy(&v[17], &v[10], 7);  // end = start
  (void)detail::command(admin(), {"SET", key, v});
  refused("an empty window", ErrorKind::InvalidState);
}

TEST_F(LimiterCalendar, BadInputIsRefusedBeforeAnythingIsSent) {
  Limiter rl = monthly(3);
  (void)rl.peek("warm");  // the script is loaded
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)Policy::calendar(3, CalendarUnit::Day, "Europe/Berlinn"), InvalidArgument);
  EXPECT_THROW((void)Policy::calendar(3, CalendarUnit::Day, ""), InvalidArgument);
  EXPECT_THROW((void)Policy::calendar(3, CalendarUnit::Week, "Europe/Berlin", static_cast<Weekday>(7)),
               InvalidArgument);
  EXPECT_THROW((void)Policy::calendar(3, static_cast<CalendarUnit>(9), "Europe/Berlin"), InvalidArgument);
  EXPECT_THROW((void)berlinCalendar(0, CalendarUnit::Day), InvalidArgument);
  EXPECT_THROW((void)berlinCalendar(4294967296, CalendarUnit::Day), InvalidArgument);
  EXPECT_THROW((void)rl.decide("k", 0), InvalidArgument);
  EXPECT_THROW((void)rl.decide("k", 4), InvalidArgument) << "more than the limit can ever grant";
  EXPECT_THROW((void)rl.peek("k", -1), InvalidArgument);
  EXPECT_THROW((void)rl.decide(""), InvalidArgument);
  EXPECT_THROW((void)rl.decide(std::string(1025, 'k')), InvalidArgument);
  EXPECT_THROW((void)rl.peek(""), InvalidArgument);
  EXPECT_THROW((void)rl.deleteKey(""), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync("").get(), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync("k", 0).get(), InvalidArgument);
  std::promise<std::exception_ptr> refused;
  rl.decideAsync("", 1, [&](Decision, std::exception_ptr e) { refused.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refused.get_future().get()), InvalidArgument);
  EXPECT_THROW(Limiter(nullptr, limiterName("p"), berlinCalendar(3, CalendarUnit::Day)), InvalidArgument);
  EXPECT_THROW(Limiter(client(), "", berlinCalendar(3, CalendarUnit::Day)), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
}

TEST_F(LimiterCalendar, DecisionsAreCountedInOneMetricsSeriesForAllKeys) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(3, registry);
  ASSERT_TRUE(rl.tryAcquire("k", 2));
  ASSERT_TRUE(rl.tryAcquire("k", 1));
  ASSERT_FALSE(rl.tryAcquire("k", 1));
  ASSERT_FALSE(rl.tryAcquire("k", 2));
  auto s = registry->snapshot(rl.name());
  EXPECT_EQ(s.granted, 2u);
  EXPECT_EQ(s.denied, 2u);
  EXPECT_EQ(s.localDenials, 1u) << "the second denial: the deny cache's (2 permits, after 1 was denied)";
  EXPECT_EQ(s.permitsGranted, 3u);
  EXPECT_EQ(s.roundTrips, 3u);
  Limiter one = monthly(1, registry, "one");
  for (int k = 0; k < 10; ++k) {
    ASSERT_TRUE(one.tryAcquire("k" + std::to_string(k)));
    ASSERT_FALSE(one.tryAcquire("k" + std::to_string(k)));
  }
  s = registry->snapshot(one.name());
  EXPECT_EQ(s.granted, 10u);
  EXPECT_EQ(s.denied, 10u);
}

TEST_F(LimiterCalendar, UnreachableRedisIsDecidedByThePolicyForEveryKey) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    Limiter rl(c, "policy", berlinCalendar(3, CalendarUnit::Day), options);
    ASSERT_TRUE(rl.decide("a").allowed);
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const Decision d = rl.decide(i % 2 == 0 ? "a" : "b");
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
        EXPECT_EQ(allowed, 3) << "one local bucket of the limit, for all keys";
        EXPECT_EQ(denied, 3);
        break;
    }
    EXPECT_THROW((void)rl.peek("a"), IoError) << "a query is no decision: it reports the outage";
    EXPECT_THROW((void)rl.exists("a"), IoError);
    EXPECT_TRUE(rl.failureStats().degraded) << "one gate for every key";
    EXPECT_EQ(rl.failureStats().outages, 1u);
    server.restart();
    bool recovered = false;
    for (int i = 0; i < 100 && !recovered; ++i) {
      try {
        recovered = !rl.decide("a").byPolicy;
      } catch (const IoError&) {
      }
      if (!recovered) sleepMs(10);
    }
    EXPECT_TRUE(recovered);
    EXPECT_FALSE(rl.failureStats().degraded);
  }
}

TEST_F(LimiterCalendar, AsyncDecisionsDecideLikeTheSyncOnes) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(3, registry);
  const Decision first = rl.decideAsync("k", 2).get();
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 1);
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.decideAsync("k", 1, [&](Decision d, std::exception_ptr e) { got.set_value({d, std::move(e)}); });
  const auto [second, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_TRUE(second.allowed);
  EXPECT_EQ(second.remaining, 0);
  const Decision denied = rl.decideAsync("k").get();
  EXPECT_FALSE(denied.allowed);
  const CalendarWindow w = rl.policy().windowAt(denied.time);
  EXPECT_EQ(denied.retryAfter, w.end - denied.time) << "exact to the window's end";
  const auto s = registry->snapshot(rl.name());
  EXPECT_EQ(s.granted, 2u);
  EXPECT_EQ(s.denied, 1u);
  EXPECT_EQ(s.permitsGranted, 3u);

  // Bad permits: InvalidArgument through the future, nothing sent.
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)rl.decideAsync("k", 0).get(), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync("k", 4).get(), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";

  // 60 in flight at once on a quota of 20: exactly 20 granted.
  Limiter many = monthly(20, nullptr, "many");
  std::vector<std::future<Decision>> inFlight;
  for (int i = 0; i < 60; ++i) inFlight.push_back(many.decideAsync("k"));
  int granted = 0;
  for (auto& f : inFlight) granted += f.get().allowed ? 1 : 0;
  EXPECT_EQ(granted, 20);
}

TEST_F(LimiterCalendar, AsyncDecisionsOfAnUnreachableRedisAreDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto c = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    Limiter rl(c, "policy", berlinCalendar(3, CalendarUnit::Day), options);
    ASSERT_TRUE(rl.decideAsync("k").get().allowed);
    server.kill();
    for (int i = 0; i < 3; ++i) {
      std::future<Decision> f = rl.decideAsync("k");
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
// limiter's calls decide with the server's clock, in a month of Berlin; a window's end is reached
// by the script-level test (CalendarQuotaScript), which passes the time itself.

TEST_F(LimiterCalendar, ReserveThenSettleGivesBackTheUnusedOnceInTheSameWindow) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(100, registry);
  const Decision held = rl.reserveFor("k", 40, "req-1");
  ASSERT_TRUE(held.allowed);
  EXPECT_FALSE(held.repeated);
  EXPECT_EQ(held.remaining, 60);
  EXPECT_EQ(held.limit, 100);
  const CalendarWindow w = rl.policy().windowAt(held.time);
  EXPECT_EQ(held.resetAfter, w.end - held.time) << "exact to the window's end";
  EXPECT_EQ(rl.recordKey("k", "req-1").rfind("rl::rsv:req-1:", 0), 0u) << rl.recordKey("k", "req-1");
  EXPECT_TRUE(exists(admin(), rl.recordKey("k", "req-1")));
  const std::int64_t pttl = raw({"PTTL", rl.recordKey("k", "req-1")}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 3600000) << "the default record TTL: 1 hour";

  expectSettlement(rl.settle("k", "req-1", 10), Settlement::Status::Settled, 40, 10, 30, 0, 0, 90);
  // A retry (another actual too) answers the first settle and changes nothing.
  expectSettlement(rl.settle("k", "req-1", 25), Settlement::Status::AlreadySettled, 40, 10, 30, 0, 0, 90);
  EXPECT_EQ(rl.peek("k").remaining, 90);
  // Used beyond the reservation: charged in the window, up to the limit; the rest is unpaid.
  ASSERT_TRUE(rl.reserveFor("k", 10, "req-2").allowed);
  expectSettlement(rl.settle("k", "req-2", 25), Settlement::Status::Settled, 10, 25, 0, 15, 0, 65);
  ASSERT_TRUE(rl.reserveFor("k", 60, "req-3").allowed);
  expectSettlement(rl.settle("k", "req-3", 70), Settlement::Status::Settled, 60, 70, 0, 5, 5, 0);
  EXPECT_EQ(rl.peek("k").remaining, 0);
  // No record: Unknown, nothing changes.
  expectSettlement(rl.settle("k", "never", 3), Settlement::Status::Unknown, 0, 0, 0, 0, 0, 0);
  EXPECT_FALSE(exists(admin(), rl.recordKey("k", "never")));

  expectCounted(*registry, rl.name(), 3, 3, 30, 3, 110);
}

TEST_F(LimiterCalendar, AReserveRepeatedWithItsIdTakesNothingMoreAndADenialRecordsNothing) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(10, registry);
  ASSERT_TRUE(rl.reserveFor("k", 3, "a").allowed);
  const Decision again = rl.reserveFor("k", 3, "a");
  EXPECT_TRUE(again.allowed);
  EXPECT_TRUE(again.repeated);
  EXPECT_EQ(again.remaining, 7) << "nothing more taken";
  EXPECT_THROW((void)rl.reserveFor("k", 4, "a"), InvalidArgument) << "an id names one reservation";
  expectSettlement(rl.settle("k", "a", 1), Settlement::Status::Settled, 3, 1, 2, 0, 0, 9);
  const Decision settled = rl.reserveFor("k", 3, "a");
  EXPECT_TRUE(settled.repeated) << "also once settled, while the record lives";
  EXPECT_EQ(settled.remaining, 9);
  // A denial records nothing: the id may be tried again.
  const Decision denied = rl.reserveFor("k", 10, "b");
  EXPECT_FALSE(denied.allowed);
  EXPECT_FALSE(denied.repeated);
  EXPECT_EQ(denied.retryAfter, rl.policy().windowAt(denied.time).end - denied.time);
  EXPECT_FALSE(exists(admin(), rl.recordKey("k", "b")));
  EXPECT_EQ(rl.settle("k", "b", 0).status, Settlement::Status::Unknown);
  const LimiterMetrics::Snapshot m = registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.granted, 1u) << "repeats count nothing";
  EXPECT_EQ(m.denied, 1u);
}

TEST_F(LimiterCalendar, CancelGivesTheReservationBackAndRefundNeverGoesBelowNothingUsed) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(10, registry);
  ASSERT_TRUE(rl.reserveFor("k", 5, "c").allowed);
  expectSettlement(rl.cancel("k", "c"), Settlement::Status::Settled, 5, 0, 5, 0, 0, 10);
  ASSERT_TRUE(rl.tryAcquire("k", 3));
  rl.refund("k", 2);
  EXPECT_EQ(rl.peek("k").remaining, 9);
  rl.refund("k", 10);
  EXPECT_EQ(rl.peek("k").remaining, 10) << "never below 0 used";
  rl.refund("k", 0);
  EXPECT_EQ(registry->snapshot(rl.name()).permitsRefunded, 17u);
  // A refund on a key with nothing counted writes nothing.
  rl.refund("fresh", 4);
  EXPECT_FALSE(rl.exists("fresh"));
}

TEST_F(LimiterCalendar, PeekRefundAndDeleteKeyAsyncAnswerAsTheSyncForms) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(10, registry);
  ASSERT_TRUE(rl.tryAcquire("k", 3));
  EXPECT_EQ(rl.peekAsync("k").get().remaining, 7);
  EXPECT_TRUE(rl.refundAsync("k", 2).get());
  EXPECT_EQ(rl.peek("k").remaining, 9);
  EXPECT_TRUE(rl.refundAsync("k", 0).get()) << "nothing to give back: nothing sent";
  EXPECT_EQ(registry->snapshot(rl.name()).permitsRefunded, 2u);
  EXPECT_THROW((void)rl.refundAsync("k", 11).get(), InvalidArgument) << "above the limit";
  EXPECT_TRUE(rl.existsAsync("k").get());
  EXPECT_TRUE(rl.deleteKeyAsync("k").get());
  EXPECT_FALSE(rl.existsAsync("k").get());
  EXPECT_FALSE(rl.deleteKeyAsync("k").get());
}

TEST_F(LimiterCalendar, AsyncReserveAndSettleAnswerAsTheSyncForms) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(100, registry);
  const Decision first = rl.reserveForAsync("k", 40, "f").get();
  EXPECT_TRUE(first.allowed);
  EXPECT_FALSE(first.repeated);
  EXPECT_EQ(first.remaining, 60);
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.reserveForAsync("k", 40, "f", Limiter::kDefaultRecordTtl, [&](Decision h, std::exception_ptr e) {
    got.set_value({h, std::move(e)});
  });
  const auto [repeat, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_TRUE(repeat.repeated);
  std::promise<std::pair<Decision, std::exception_ptr>> got2;
  rl.reserveForAsync("k", 20, "g", milliseconds(5000), [&](Decision h, std::exception_ptr e) {
    got2.set_value({h, std::move(e)});
  });
  EXPECT_EQ(got2.get_future().get().first.remaining, 40);
  EXPECT_LE(raw({"PTTL", rl.recordKey("k", "g")}).integer, 5000);

  expectSettlement(rl.settleAsync("k", "f", 30).get(), Settlement::Status::Settled, 40, 30, 10, 0, 0, 50);
  std::promise<std::pair<Settlement, std::exception_ptr>> settled;
  rl.settleAsync("k", "f", 30, [&](Settlement s, std::exception_ptr e) { settled.set_value({s, std::move(e)}); });
  const auto [again, settleError] = settled.get_future().get();
  EXPECT_FALSE(settleError);
  expectSettlement(again, Settlement::Status::AlreadySettled, 40, 30, 10, 0, 0, 50);
  expectCounted(*registry, rl.name(), 2, 1, 10, 2, 60);
}

TEST_F(LimiterCalendar, BadReserveSettleAndRefundAreRefusedBeforeSending) {
  Limiter rl = monthly(10);
  (void)rl.peek("k");  // the script is loaded
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW((void)rl.reserveFor("k", 0, "a"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("k", 11, "a"), InvalidArgument) << "more than the limit";
  EXPECT_THROW((void)rl.reserveFor("k", 1, ""), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("k", 1, "a b"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("k", 1, "a:b"), InvalidArgument) << "':' in an id";
  EXPECT_THROW((void)rl.reserveFor("k", 1, std::string(129, 'a')), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("k", 1, "a", milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("k", 1, "a", milliseconds(604800001)), InvalidArgument);
  EXPECT_THROW((void)rl.reserveFor("", 1, "a"), InvalidArgument);
  EXPECT_THROW((void)rl.settle("k", "", 1), InvalidArgument);
  EXPECT_THROW((void)rl.settle("k", "a", -1), InvalidArgument);
  EXPECT_THROW((void)rl.settle("k", "a", 4294967296), InvalidArgument);
  EXPECT_THROW((void)rl.settle("", "a", 1), InvalidArgument);
  EXPECT_THROW((void)rl.cancel("k", "a/b"), InvalidArgument);
  EXPECT_THROW(rl.refund("k", -1), InvalidArgument);
  EXPECT_THROW(rl.refund("k", 11), InvalidArgument) << "more than the limit";
  EXPECT_THROW(rl.refund("", 1), InvalidArgument);
  EXPECT_THROW((void)rl.recordKey("k", ""), InvalidArgument);
  EXPECT_THROW((void)rl.recordKey("", "a"), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync("k", 0, "a").get(), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync("k", 1, "", milliseconds(10)).get(), InvalidArgument);
  EXPECT_THROW((void)rl.reserveForAsync("", 1, "a").get(), InvalidArgument);
  EXPECT_THROW((void)rl.settleAsync("k", "a", -1).get(), InvalidArgument);
  EXPECT_THROW((void)rl.settleAsync("", "a", 1).get(), InvalidArgument);
  std::promise<std::exception_ptr> refused;
  rl.settleAsync("k", "", 1, [&](Settlement, std::exception_ptr e) { refused.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refused.get_future().get()), InvalidArgument);
  std::promise<std::exception_ptr> refusedHold;
  rl.reserveForAsync("k", 0, "a", Limiter::kDefaultRecordTtl,
                     [&](Decision, std::exception_ptr e) { refusedHold.set_value(std::move(e)); });
  EXPECT_THROW(std::rethrow_exception(refusedHold.get_future().get()), InvalidArgument);
  // A key without a hash tag that holds a '}': no record key can share its slot.
  EXPECT_THROW((void)rl.reserveFor("a}b", 1, "a"), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
}

// CLIENT KILL TYPE normal before each call (client_kill_test.cpp's kill): the closed connection
// makes reserve and settle be sent again, and their record applies them once.
TEST_F(LimiterCalendar, AReserveResentAfterAKilledConnectionIsAppliedOnce) {
  auto registry = std::make_shared<MetricsRegistry>();
  Limiter rl = monthly(100, registry);
  int reserved = 0, repeated = 0, settled = 0, again = 0, failed = 0;
  for (int i = 0; i < 10; ++i) {
    (void)raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
    try {
      const Decision h = i % 2 == 0 ? rl.reserveFor("k", 40, "req-1") : rl.reserveForAsync("k", 40, "req-1").get();
      EXPECT_TRUE(h.allowed);
      EXPECT_EQ(h.remaining, 60);
      (h.repeated ? repeated : reserved)++;
    } catch (const IoError&) {
      ++failed;  // the kill can still be in flight: a retry follows
    }
  }
  EXPECT_EQ(reserved, 1);
  EXPECT_EQ(reserved + repeated + failed, 10);
  EXPECT_EQ(rl.peek("k").remaining, 60) << "40 taken once";
  for (int i = 0; i < 10; ++i) {
    (void)raw({"CLIENT", "KILL", "TYPE", "normal"});
    try {
      const Settlement s = i % 2 == 0 ? rl.settle("k", "req-1", 10) : rl.settleAsync("k", "req-1", 10).get();
      EXPECT_EQ(s.returned, 30);
      EXPECT_EQ(s.remaining, 90) << "the first settle's answer, every time";
      (s.status == Settlement::Status::Settled ? settled : again)++;
    } catch (const IoError&) {
      ++failed;
    }
  }
  EXPECT_EQ(settled, 1);
  EXPECT_GE(again, 5);
  EXPECT_EQ(rl.peek("k").remaining, 90) << "40 taken once, 30 back once";
  expectCounted(*registry, rl.name(), 1, 1, 30, 1, 40);
  EXPECT_EQ(rl.failureStats().outages, 0u) << "a closed connection is no outage";
}

// An LLM token budget: 50 000 tokens per tenant per day in Europe/Berlin. Each call reserves an
// estimate and settles what the answer used: the day's remaining is the limit minus the actuals,
// exactly (a reservation that was never settled would leave its estimate counted).
// The calls run on Redis's clock: should Berlin's midnight fall between the first reserve and the
// last peek, the day's count is gone and the run is made again on fresh keys (a second midnight
// cannot follow within the same seconds), so every assertion holds for one calendar day.
TEST_F(LimiterCalendar, AnLlmTokenBudgetPerTenantPerBerlinDayIsChargedTheActuals) {
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 2) << "two Berlin midnights within one test";
    auto registry = std::make_shared<MetricsRegistry>();
    const std::string run = std::to_string(attempt);
    Limiter daily(client(), limiterName("llm-tokens-" + run), berlinCalendar(50000, CalendarUnit::Day),
                  countedIn(registry));
    const std::string tenant = "{tenant:7}:tokens", other = "{tenant:8}:tokens";
    const Decision first = daily.reserveFor(tenant, 1000, "req-1");
    ASSERT_TRUE(first.allowed);
    const Settlement s1 = daily.settle(tenant, "req-1", 234);
    const Decision second = daily.reserveFor(tenant, 1000, "req-2");
    ASSERT_TRUE(second.allowed);
    const Settlement s2 = daily.settle(tenant, "req-2", 532);
    const Decision now = daily.peek(tenant);
    if (daily.policy().windowAt(first.time).label != daily.policy().windowAt(now.time).label) continue;
    EXPECT_EQ(first.remaining, 49000);
    EXPECT_EQ(s1.status, Settlement::Status::Settled);
    EXPECT_EQ(s1.returned, 766);
    EXPECT_EQ(s1.remaining, 50000 - 234);
    EXPECT_EQ(s2.returned, 468);
    EXPECT_EQ(s2.remaining, 50000 - 234 - 532);
    EXPECT_EQ(now.remaining, 50000 - 234 - 532) << "the limit minus the actuals";
    EXPECT_EQ(daily.settle(tenant, "req-2", 532).status, Settlement::Status::AlreadySettled);
    EXPECT_EQ(daily.peek(tenant).remaining, 50000 - 234 - 532) << "a retried settle changes nothing";
    // The same id on another tenant is another reservation; another Limiter of the name sees the count.
    EXPECT_NE(daily.recordKey(tenant, "req-1"), daily.recordKey(other, "req-1"));
    EXPECT_FALSE(daily.reserveFor(other, 1000, "req-1").repeated);
    EXPECT_EQ(daily.cancel(other, "req-1").returned, 1000);
    Limiter same(client(), daily.name(), berlinCalendar(50000, CalendarUnit::Day));
    EXPECT_EQ(same.peek(tenant).remaining, 50000 - 234 - 532);
    const LimiterMetrics::Snapshot m = registry->snapshot(daily.name());
    EXPECT_EQ(m.reservationsOpened, 3u);
    EXPECT_EQ(m.reservationsSettled, 3u);
    EXPECT_EQ(m.permitsRefunded, 766u + 468u + 1000u);
    return;
  }
}

// --- lua/calendar_quota.lua, the time and the table passed by the test ---------------------------

class CalendarQuotaScript : public CalendarQuotaStore {
 protected:
  Reply run(const std::string& op, const std::string& key, const std::string& nowUs, std::int64_t permits,
            std::int64_t limit, const std::string& tbl) {
    return runOneKey(admin(), detail::lua::calendar_quota, key,
                     {op, nowUs, "Q", std::to_string(permits), std::to_string(limit), "D", "1000", tbl});
  }
  Reply takeAt(const std::string& key, std::int64_t nowUs, std::int64_t permits, const std::string& tbl) {
    return run("take", key, std::to_string(nowUs), permits, 3, tbl);
  }
  // The script's reserve/settle/refund of `key` at `nowUs` with the record of `id` (none for refund).
  Reply hold(const std::string& op, const std::string& key, const std::string& id, std::int64_t nowUs,
             std::int64_t count, const std::string& tbl) {
    std::vector<std::string> keys{key};
    if (!id.empty()) keys.push_back(detail::namespacedRecordKey(key, id));
    std::vector<std::string> args{op, std::to_string(nowUs), "Q", std::to_string(count), "3", "D", "1000", tbl};
    if (op == "reserve") args.emplace_back("60000");
    return runScript(admin(), detail::lua::calendar_quota, keys, args);
  }

  // What one call left: the reply (the packed decision's bytes, "integer N", or "error: " and the
  // error's text), the key's bytes ("" if none) and expiry (PEXPIRETIME), and the server's time (ms)
  // read before and after the call.
  struct Outcome {
    std::string reply, value;
    std::int64_t expireAtMs = 0, fromMs = 0, toMs = 0;
  };

  // lua/calendar_quota.lua with its fast path switched off (the path's `if` made `if false`): every
  // call goes to the full code.
  const detail::lua::EmbeddedScript& fullCode() {
    if (fullSha_.empty()) {
      const std::string fastPath = "if ARGV[1] == 'take' and ARGV[3] == 'Q' and type(ARGV[8]) == 'string' then\n";
      fullSource_ = detail::lua::calendar_quota.source;
      const std::size_t at = fullSource_.find("\n" + fastPath);
      EXPECT_NE(at, std::string::npos) << "the fast path's first line";
      if (at != std::string::npos) fullSource_.replace(at + 1, fastPath.size(), "if false then\n");
      fullSha_ = raw({"SCRIPT", "LOAD", fullSource_}).str;
      full_ = detail::lua::EmbeddedScript{"calendar_quota.lua (full code)", fullSha_.c_str(), fullSource_.c_str()};
    }
    return full_;
  }

  Outcome call(const detail::lua::EmbeddedScript& script, const std::string& key,
               const std::vector<std::string>& args) {
    Outcome o;
    o.fromMs = serverTimeMs(admin());
    try {
      const Reply r = runOneKey(admin(), script, key, args);
      if (r.type == Reply::Type::String) {
        o.reply = r.str;
      } else if (r.type == Reply::Type::Integer) {
        o.reply = "integer " + std::to_string(r.integer);
      } else {
        o.reply = "unexpected " + r.describe();
      }
    } catch (const std::exception& e) {
      o.reply = std::string("error: ") + e.what();
    }
    o.toMs = serverTimeMs(admin());
    o.value = raw({"GET", key}).str;
    o.expireAtMs = raw({"PEXPIRETIME", key}).integer;
    return o;
  }

  // `args` (take's: now, 'Q', n, L, unit, keepAlive ms, table) run on `key` by the whole script,
  // then on the same key as it was before by the full code alone: the same reply bytes and key bytes.
  // What grants writes the key with PX = the time to the window's end (ms, rounded up) + keepAlive,
  // set between the server times read around the call; anything else leaves the key as it was.
  // Returns the whole script's reply.
  std::string expectAsTheFullCode(const std::string& key, const std::vector<std::string>& args) {
    const std::string before = raw({"GET", key}).str;
    const std::int64_t beforeExpireAt = raw({"PEXPIRETIME", key}).integer;
    std::vector<std::string> all{"take"};
    all.insert(all.end(), args.begin(), args.end());
    const Outcome fast = call(detail::lua::calendar_quota, key, all);
    if (before.empty()) {
      (void)raw({"DEL", key});
    } else if (beforeExpireAt < 0) {
      (void)raw({"SET", key, before});
    } else {
      (void)raw({"SET", key, before, "PXAT", std::to_string(beforeExpireAt)});
    }
    const Outcome full = call(fullCode(), key, all);
    const std::string what = "take " + args[0] + " " + args[2] + " " + args[3] + " " + args[4];
    EXPECT_EQ(fast.reply, full.reply) << what;
    EXPECT_EQ(fast.value, full.value) << what;
    for (const Outcome& o : {fast, full}) {
      if (grants(o.reply)) {
        const std::int64_t end = getLe(o.value, 17, 7), now = std::stoll(args[0]);
        const std::int64_t px = (end - now + 999) / 1000 + std::stoll(args[5]);
        EXPECT_GE(o.expireAtMs, o.fromMs + px) << what;
        EXPECT_LE(o.expireAtMs, o.toMs + px) << what;
      } else {
        EXPECT_EQ(o.value, before) << what << ": nothing written";
        EXPECT_EQ(o.expireAtMs, beforeExpireAt) << what << ": nothing written";
      }
    }
    return fast.reply;
  }

 private:
  std::string fullSource_, fullSha_;
  detail::lua::EmbeddedScript full_{};
};

TEST_F(CalendarQuotaScript, TheWindowEndsExactlyAtItsEnd) {
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

TEST_F(CalendarQuotaScript, TablesThatDisagreeNeverOpenTwoWindowsForOneLabel) {
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

TEST_F(CalendarQuotaScript, ATimeOutsideTheTableIsAnsweredWithTheServersTime) {
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

TEST_F(CalendarQuotaScript, ASettleAfterTheWindowEndedGivesNothingBackAndChargesTheNewWindow) {
  const std::int64_t t0 = serverTimeUs(admin()) / kDayUs * kDayUs;
  const std::string tbl = table(100, t0 - kDayUs, kDayUs);  // labels 100..103, 101 holding t0
  const std::string key = name();
  const std::string tbl2 = table(101, t0, kDayUs);  // a client a day later: 102 holds t0 + 1 day
  // Made in day 101, settled in it: given back.
  ASSERT_TRUE(reserveReply(hold("reserve", key, "same", t0 + 10, 2, tbl)).allowed);
  EXPECT_EQ(stored(key).count, 2);
  const Settlement same = settlementOf(hold("settle", key, "same", t0 + kDayUs - 1, 0, tbl));
  expectSettlement(same, Settlement::Status::Settled, 2, 0, 2, 0, 0, 3);
  EXPECT_EQ(stored(key).count, 0);
  // Made in day 101, settled in day 102: day 101's count is gone, nothing is given back.
  ASSERT_TRUE(reserveReply(hold("reserve", key, "late", t0 + 20, 3, tbl)).allowed);
  const Settlement late = settlementOf(hold("settle", key, "late", t0 + kDayUs + 10, 1, tbl2));
  expectSettlement(late, Settlement::Status::Settled, 3, 1, 0, 0, 0, 3);
  EXPECT_EQ(stored(key).label, 101) << "nothing changed: nothing written";
  // Used beyond it, settled in day 102: the extra is counted in day 102.
  const std::string key2 = name("charged");
  ASSERT_TRUE(reserveReply(hold("reserve", key2, "over", t0 + 20, 1, tbl)).allowed);
  const Settlement over = settlementOf(hold("settle", key2, "over", t0 + kDayUs + 10, 3, tbl2));
  expectSettlement(over, Settlement::Status::Settled, 1, 3, 0, 2, 0, 1);
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

TEST_F(CalendarQuotaScript, TakesOnAWindowInForceAnswerAsTheFullCodeByteForByte) {
  // The fast path above the `-- include:` line decides a take on a window in force; the full code
  // below it decides everything. Each call runs both ways from the same key: grants, denials, the
  // limit changed under a stored count, numbers written otherwise, and what the fast path leaves
  // to the full code (another unit, now before the window's start, its last µs and the next
  // window, bad input, a time outside the table).
  const std::int64_t t0 = serverTimeUs(admin()) / kDayUs * kDayUs;
  const std::string tbl = table(100, t0 - kDayUs, kDayUs);  // labels 100..103, 101 holding t0
  const std::string key = name();
  const std::string keep = "86400000";  // a day: no key expires while the test runs
  const auto at = [t0](std::int64_t us) { return std::to_string(t0 + us); };
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(10), "Q", "1", "3", "D", keep, tbl})));  // opens day 101
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(20), "Q", "1", "3", "D", keep, tbl})));
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(1000001), "Q", "1", "3", "D", keep, tbl})));  // PX rounded up
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(40), "Q", "1", "3", "D", keep, tbl})));
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(50), "Q", "2", "3", "D", keep, tbl})));
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(60), "Q", "1", "5", "D", "0", tbl})));    // count 4 of 5
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(70), "Q", "1", "2", "D", keep, tbl})));  // remaining -2
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(80), "Q", "1e0", " 6", "D", keep, tbl})));
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(90), "Q", "1", "7", "W", keep, tbl})));  // the stored unit kept
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(-5), "Q", "1", "7", "D", keep, tbl})));  // before its start
  // Bad input on a window in force: the full code's error, nothing written.
  const std::string gap = table(10, 0, kDayUs, 1) + table(12, 2 * kDayUs, kDayUs, 1);
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(100), "Q", "1", "7", "D", keep, gap})));
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(100), "Q", "8", "7", "D", keep, tbl})));
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(100), "Q", "0", "7", "D", keep, tbl})));
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(100), "Q", "1", "7", "X", keep, tbl})));
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {"-1", "Q", "1", "7", "D", keep, tbl})));
  // The window's last µs, then the next window (opened by the full code), then takes in it.
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(kDayUs - 1), "Q", "1", "8", "D", keep, tbl})));
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(kDayUs), "Q", "1", "3", "D", keep, tbl})));
  EXPECT_FALSE(grants(expectAsTheFullCode(key, {at(kDayUs + 5), "Q", "3", "3", "D", keep, tbl})));
  EXPECT_TRUE(grants(expectAsTheFullCode(key, {at(kDayUs + 6), "Q", "2", "3", "D", keep, tbl})));
  EXPECT_EQ(stored(key).label, 102);
  EXPECT_EQ(stored(key).count, 3);
  EXPECT_EQ(expectAsTheFullCode(key, {at(10 * kDayUs), "Q", "1", "3", "D", keep, tbl}),
            "integer " + at(10 * kDayUs));  // outside the table
  // A key whose stored window cannot be: refused by both.
  const std::string bad = name("bad");
  std::string broken = "QX";
  broken.resize(28, '\0');
  (void)raw({"SET", bad, broken});
  EXPECT_FALSE(grants(expectAsTheFullCode(bad, {at(10), "Q", "1", "3", "D", keep, tbl})));
}

// --- The calendar tables of a script call (CalendarTables), sent once more around the server's time

// A stand-in for a calendar script: the first try (or every one, with ARGV[2] 'always') answers a
// server time of 1970-01-04 00:00:00.000005 as a bare integer; a later one answers {tries}. Each try
// appends the first label of its table (ARGV[1] after its prefix 'T') to KEYS[2].
class CalendarTables : public RedisTest {};

TEST_F(CalendarTables, AreSentOnceMoreAroundTheServersTimeItAnswered) {
  const std::string source =
      "local tries = redis.call('INCR', KEYS[1])\n"
      "redis.call('RPUSH', KEYS[2], (struct.unpack('<i8', ARGV[1], 2)))\n"
      "if ARGV[2] == 'always' or tries == 1 then return 3 * 86400000000 + 5 end\n"
      "return {tries}\n";
  const std::string sha1 = raw({"SCRIPT", "LOAD", source}).str;
  const detail::Script script{"calendar_tables_test", sha1, source};
  auto tables = std::make_shared<detail::CalendarTables>("calendar tables test");
  detail::CalendarQuota utcDays;
  utcDays.limit = 1;
  tables->add(0, utcDays, "T");
  const std::int64_t today = serverTimeUs(admin()) / kDayUs;
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(30); };
  const auto request = [&](const std::string& suffix, const std::string& mode) {
    return detail::ScriptRequest{
        &script, {name("tries" + suffix), name("labels" + suffix)}, {"", mode}, nullptr, tables};
  };
  const auto labels = [&](const std::string& suffix) {
    std::vector<std::int64_t> out;
    for (const Reply& e : raw({"LRANGE", name("labels" + suffix), "0", "-1"}).elements) out.push_back(e.asInteger());
    return out;
  };

  const Reply once = request("sync", "").send(*client(), deadline());
  ASSERT_EQ(once.type, Reply::Type::Array);
  EXPECT_EQ(once.elements.at(0).integer, 2) << "sent twice";
  EXPECT_EQ(labels("sync"), (std::vector<std::int64_t>{today - 1, 2})) << "the second table around the answer";
  EXPECT_LT(tables->serverNowGuess().count(), 4 * kDayUs) << "the server's time as answered, remembered";
  EXPECT_TRUE(test::throwsError<ReplyError>(ErrorKind::UnexpectedReply,
                                            [&] { (void)request("twice", "always").send(*client(), deadline()); }));
  EXPECT_EQ(labels("twice").size(), 2u) << "sent twice, not more";

  // sendAsync's answer, waited for.
  const auto sendAsync = [&](const detail::ScriptRequest& r) {
    auto answered = std::make_shared<std::promise<Reply>>();
    r.sendAsync(*client(), deadline(), [answered](const Reply& reply, std::exception_ptr e) {
      if (e) {
        answered->set_exception(e);
      } else {
        answered->set_value(reply);
      }
    });
    return answered->get_future().get();
  };
  tables->sawServerNow(std::chrono::microseconds{today * kDayUs});
  const Reply async = sendAsync(request("async", ""));
  ASSERT_EQ(async.type, Reply::Type::Array);
  EXPECT_EQ(async.elements.at(0).integer, 2);
  EXPECT_EQ(labels("async"), (std::vector<std::int64_t>{today - 1, 2}));
  EXPECT_TRUE(test::throwsError<ReplyError>(ErrorKind::UnexpectedReply,
                                            [&] { (void)sendAsync(request("async-twice", "always")); }));
  EXPECT_EQ(labels("async-twice").size(), 2u);
}
