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
#include "redlimit/http.hpp"
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
