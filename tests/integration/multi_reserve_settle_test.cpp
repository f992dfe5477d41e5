// Reserve, then settle on a MultiLimit against a real redis-server: one script call
// grants every limit (all or nothing) and writes ONE record naming them; one settle gives back (or
// charges) the difference to every limit exactly once however often it is retried; a denial
// records and charges nothing; bad input, corrupted records and a killed server are handled as
// documented; the MultiLimit's metrics count it.
#include <atomic>
#include <future>
#include <random>
#include <thread>

#include "one_key_support.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

// `limit` at once, nothing back for a day.
Policy frozenGcra(std::int64_t limit) { return GcraTraits::policy(limit, 1, milliseconds(86400000)); }
Policy frozenBucket(std::int64_t limit) { return TokenBucketTraits::policy(limit, 1, milliseconds(86400000)); }
// One window of 46 days.
Policy frozenWindow(std::int64_t limit) { return FixedWindowTraits::policy(limit, 1, milliseconds(4000000000)); }

}  // namespace

class MultiReserveSettle : public RedisTest {
 protected:
  /// A key of this test in its one hash tag.
  std::string key(const std::string& suffix) { return "{" + name("mrs") + "}:" + suffix; }
  MultiLimit::Options options(const std::shared_ptr<MetricsRegistry>& registry) {
    MultiLimit::Options o;
    o.monitor.registry = registry;
    o.name = "multi";
    return o;
  }
};

// (1) The settle of one reservation sent 10 times, every connection of the Client killed between
// tries: the permits come back once, to every limit; metrics counted on the MultiLimit's monitor.
TEST_F(MultiReserveSettle, SettleRetriedAfterClientKillGivesBackOnceToEveryLimit) {
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(100));
  Limiter window(client(), limiterName("window"), frozenWindow(100));
  Limiter bucket(client(), limiterName("bucket"), frozenBucket(50));
  auto registry = std::make_shared<MetricsRegistry>();
  MultiLimit all = MultiLimit({gcra, window, bucket}, options(registry)).on({"k", "k", "k"});
  EXPECT_EQ(all.reservationKey("req-1").rfind("rl::mrsv:req-1:", 0), 0u) << all.reservationKey("req-1");

  const MultiDecision held = all.reserveFor(40, "req-1");
  ASSERT_TRUE(held.allowed);
  EXPECT_FALSE(held.repeated);
  EXPECT_EQ(held.remaining, 10);
  ASSERT_EQ(held.limits.size(), 3u);
  EXPECT_EQ(held.limits[0].remaining, 60);
  EXPECT_EQ(held.limits[1].remaining, 60);
  EXPECT_EQ(held.limits[2].remaining, 10);
  EXPECT_TRUE(exists(admin(), all.reservationKey("req-1")));
  EXPECT_FALSE(exists(admin(), gcra.recordKey("k", "req-1"))) << "one record, the MultiLimit's";

  int settled = 0, again = 0, failed = 0;
  for (int i = 0; i < 10; ++i) {
    (void)raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
    try {
      const MultiSettlement s = all.settle("req-1", 10);
      EXPECT_EQ(s.reserved, 40);
      EXPECT_EQ(s.actual, 10);
      EXPECT_EQ(s.returned, 30);
      EXPECT_EQ(s.charged, 0);
      EXPECT_EQ(s.unpaid, 0);
      EXPECT_EQ(s.remaining, 40) << "the least of the limits'";
      ASSERT_EQ(s.limits.size(), 3u);
      EXPECT_EQ(s.limits[0].remaining, 90);
      EXPECT_EQ(s.limits[1].remaining, 90);
      EXPECT_EQ(s.limits[2].remaining, 40);
      for (const Settlement& one : s.limits) EXPECT_EQ(one.returned, 30);
      (s.status == Settlement::Status::Settled ? settled : again)++;
    } catch (const IoError&) {
      ++failed;  // the kill can still be in flight: a retry follows
    }
  }
  EXPECT_EQ(settled, 1);
  EXPECT_EQ(settled + again + failed, 10);
  EXPECT_GE(again, 5);
  EXPECT_EQ(gcra.peek("k").remaining, 90) << "30 came back, once";
  EXPECT_EQ(window.peek("k").remaining, 90);
  EXPECT_EQ(bucket.peek("k").remaining, 40);
  const LimiterMetrics::Snapshot m = registry->snapshot("multi");
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.reservationsSettled, 1u);
  EXPECT_EQ(m.permitsRefunded, 30u);
  EXPECT_EQ(m.granted, 1u);
  EXPECT_EQ(m.permitsGranted, 40u);
}

// (2) 8 threads reserving and settling random actuals (seeded, some above the reservation) on a
// MultiLimit of a GCRA and a fixed window: the permits in use in each are the sum of the actuals.
TEST_F(MultiReserveSettle, ParallelReserveAndSettleKeepUsedEqualToTheActualsInEveryLimit) {
  constexpr std::int64_t kLimit = 10000;
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(kLimit));
  Limiter window(client(), limiterName("window"), frozenWindow(kLimit));
  MultiLimit both = MultiLimit({gcra, window}).on({"k", "k"});
  constexpr int kThreads = 8, kRounds = 12;
  std::atomic<std::int64_t> sum{0};
  std::atomic<int> problems{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::mt19937::result_type>(2027 + t));
      for (int i = 0; i < kRounds; ++i) {
        const std::int64_t reserved = std::uniform_int_distribution<std::int64_t>(1, 50)(rng);
        const std::int64_t actual = std::uniform_int_distribution<std::int64_t>(0, 2 * reserved)(rng);
        const std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (!both.reserveFor(reserved, id).allowed) ++problems;
        const MultiSettlement s = both.settle(id, actual);
        bool exact = s.status == Settlement::Status::Settled && s.limits.size() == 2;
        for (const Settlement& one : s.limits) {
          exact = exact && one.unpaid == 0 && one.returned == std::max<std::int64_t>(0, reserved - actual) &&
                  one.charged == std::max<std::int64_t>(0, actual - reserved);
        }
        if (!exact) ++problems;
        sum += actual;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(problems.load(), 0);
  EXPECT_EQ(kLimit - gcra.peek("k").remaining, sum.load()) << "used == sum of the actuals";
  EXPECT_EQ(kLimit - window.peek("k").remaining, sum.load()) << "used == sum of the actuals";
}

// (3) A denial by one limit records nothing and charges nothing; a repeated reserve takes nothing
// more; an unknown id changes nothing; actual above the reservation is charged in every limit.
TEST_F(MultiReserveSettle, DenialRecordsNothingAndRepeatsTakeNothing) {
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(10));
  Limiter window(client(), limiterName("window"), frozenWindow(4));
  auto registry = std::make_shared<MetricsRegistry>();
  MultiLimit both = MultiLimit({gcra, window}, options(registry)).on({"k", "k"});
  const std::vector<std::string> keys{gcra.redisKey("k"), window.redisKey("k"), both.reservationKey("d")};

  const MultiDecision first = both.reserveFor(3, "a");
  ASSERT_TRUE(first.allowed);
  for (int i = 0; i < 3; ++i) {
    const MultiDecision again = both.reserveFor(3, "a");
    EXPECT_TRUE(again.allowed);
    EXPECT_TRUE(again.repeated);
    EXPECT_EQ(again.remaining, 1);
    EXPECT_EQ(again.limits[0].remaining, 7);
    EXPECT_EQ(again.limits[1].remaining, 1);
  }
  const auto before = keyStates(admin(), keys);
  const MultiDecision denied = both.reserveFor(2, "d");
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.deniedBy, 1u) << "the fixed window";
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_EQ(keyStates(admin(), keys), before) << "nothing recorded, nothing charged";
  EXPECT_FALSE(exists(admin(), both.reservationKey("d")));

  EXPECT_THROW((void)both.reserveFor(2, "a"), InvalidArgument) << "an id names one reservation";
  EXPECT_EQ(gcra.peek("k").remaining, 7);
  EXPECT_EQ(window.peek("k").remaining, 1);

  const auto known = keyStates(admin(), {gcra.redisKey("k"), window.redisKey("k")});
  const MultiSettlement unknown = both.settle("never", 0);
  EXPECT_EQ(unknown.status, Settlement::Status::Unknown);
  EXPECT_EQ(unknown.limits.size(), 2u);
  EXPECT_EQ(unknown.returned, 0);
  EXPECT_EQ(keyStates(admin(), {gcra.redisKey("k"), window.redisKey("k")}), known);
  EXPECT_FALSE(exists(admin(), both.reservationKey("never")));

  // 3 reserved, 6 used: 3 more charged in every limit (the window: its last 1 now, 2 in the next).
  const MultiSettlement s = both.settle("a", 6);
  EXPECT_EQ(s.status, Settlement::Status::Settled);
  EXPECT_EQ(s.limits[0].charged, 3);
  EXPECT_EQ(s.limits[1].charged, 3);
  EXPECT_EQ(s.charged, 3);
  EXPECT_EQ(s.unpaid, 0);
  EXPECT_EQ(gcra.peek("k").remaining, 4);
  EXPECT_EQ(window.peek("k").remaining, 0);
  EXPECT_EQ(both.settle("a", 0).status, Settlement::Status::AlreadySettled);
  EXPECT_EQ(both.settle("a", 0).actual, 6) << "the first settle's answer";
  EXPECT_TRUE(both.reserveFor(3, "a").repeated) << "settled, the id still answers the grant";
  EXPECT_EQ(gcra.peek("k").remaining, 4);

  const LimiterMetrics::Snapshot m = registry->snapshot("multi");
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.reservationsSettled, 1u);
  EXPECT_EQ(m.granted, 1u) << "repeats are not decisions";
  EXPECT_EQ(m.denied, 1u);
}

// An expired record: the reservation stays counted as fully used in every limit.
TEST_F(MultiReserveSettle, ExpiredReservationCountsAsFullyUsed) {
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(10));
  Limiter window(client(), limiterName("window"), frozenWindow(10));
  MultiLimit both = MultiLimit({gcra, window}).on({"k", "k"});
  ASSERT_TRUE(both.reserveFor(2, "ttl", milliseconds(60000)).allowed);
  const std::int64_t ttl = raw({"PTTL", both.reservationKey("ttl")}).integer;
  EXPECT_GT(ttl, 50000);
  EXPECT_LE(ttl, 60000);
  ASSERT_TRUE(both.reserveFor(2, "brief", milliseconds(1)).allowed);
  for (int i = 0; i < 200 && exists(admin(), both.reservationKey("brief")); ++i) sleepMs(2);
  EXPECT_EQ(both.settle("brief", 0).status, Settlement::Status::Unknown);
  EXPECT_EQ(gcra.peek("k").remaining, 6);
  EXPECT_EQ(window.peek("k").remaining, 6);
}

// (4) Bad input is refused before anything is sent.
TEST_F(MultiReserveSettle, BadInputIsRefusedBeforeSending) {
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(10));
  Limiter window(client(), limiterName("window"), frozenWindow(10));
  MultiLimit both = MultiLimit({gcra, window}).on({"k", "k"});
  ASSERT_TRUE(both.reserveFor(2, "ok").allowed);
  const std::vector<std::string> keys{gcra.redisKey("k"), window.redisKey("k"), both.reservationKey("ok")};
  const auto statesBefore = keyStates(admin(), keys);
  const std::int64_t calibrate = totalCommandCalls(admin());
  const std::int64_t overhead = totalCommandCalls(admin()) - calibrate;
  const std::int64_t before = totalCommandCalls(admin());
  const std::string tooLong(detail::kMaxReservationIdLength + 1, 'x');
  for (const std::string& id : {std::string(), tooLong, std::string("a b"), std::string("{tag}"), std::string("x\n"),
                                std::string("caf\xc3\xa9"), std::string("a*")}) {
    EXPECT_THROW((void)both.reserveFor(1, id), InvalidArgument) << id;
    EXPECT_THROW((void)both.reserveForAsync(1, id).get(), InvalidArgument) << id;
    EXPECT_THROW((void)both.settle(id, 1), InvalidArgument) << id;
    EXPECT_THROW((void)both.settleAsync(id, 1).get(), InvalidArgument) << id;
    EXPECT_THROW((void)both.cancel(id), InvalidArgument) << id;
  }
  for (std::int64_t permits : {std::int64_t{0}, std::int64_t{-1}, detail::kMaxPermits + 1}) {
    EXPECT_THROW((void)both.reserveFor(permits, "p"), InvalidArgument) << permits;
  }
  for (std::int64_t actual : {std::int64_t{-1}, detail::kMaxPermits + 1}) {
    EXPECT_THROW((void)both.settle("ok", actual), InvalidArgument) << actual;
  }
  for (milliseconds ttl : {milliseconds(0), milliseconds(-5), detail::kMaxReservationTtl + milliseconds(1)}) {
    EXPECT_THROW((void)both.reserveFor(1, "t", ttl), InvalidArgument) << ttl.count();
  }
  EXPECT_EQ(totalCommandCalls(admin()) - before, overhead) << "a command reached Redis";
  EXPECT_EQ(keyStates(admin(), keys), statesBefore);
}

// (5) A corrupted record, a one-key limiter's record, or another MultiLimit's record is refused
// naming the key, with nothing written.
TEST_F(MultiReserveSettle, CorruptedOrForeignRecordIsRefusedWithNothingWritten) {
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(10));
  Limiter window(client(), limiterName("window"), frozenWindow(10));
  Limiter bucket(client(), limiterName("bucket"), frozenBucket(10));
  MultiLimit both = MultiLimit({gcra, window}).on({"k", "k"});
  MultiLimit other = MultiLimit({gcra, bucket}).on({"k", "k"});  // the same first limit: the same record key
  ASSERT_EQ(other.reservationKey("c"), both.reservationKey("c"));
  ASSERT_TRUE(both.reserveFor(2, "c").allowed);
  const std::string record = both.reservationKey("c");
  const std::string good = raw({"GET", record}).str;
  const std::vector<std::string> keys{gcra.redisKey("k"), window.redisKey("k"), bucket.redisKey("k"), record};
  for (int variant = 0; variant < 5; ++variant) {
    SCOPED_TRACE(variant);
    (void)raw({"DEL", record});
    if (variant == 0) (void)raw({"SET", record, "not a record"});
    if (variant == 1) (void)raw({"RPUSH", record, "x"});
    if (variant == 2) (void)raw({"SET", record, good.substr(0, good.size() - 1)});  // cut short
    if (variant == 3) {  // a well-formed record of a one-key limiter
      (void)raw({"SET", record, "RGO" + std::string("\x02\x00\x00\x00", 4) + std::string(27, '\0')});
    }
    if (variant == 4) (void)raw({"SET", record, good});  // good, but read through another MultiLimit
    const auto before = keyStates(admin(), keys);
    MultiLimit& through = variant == 4 ? other : both;
    try {
      (void)through.settle("c", 0);
      ADD_FAILURE() << "settle of a corrupted record";
    } catch (const ScriptError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidState) << e.what();
      EXPECT_NE(std::string(e.what()).find(record), std::string::npos) << e.what();
    }
    EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { (void)through.reserveFor(2, "c"); }));
    EXPECT_EQ(keyStates(admin(), keys), before);
  }
  EXPECT_EQ(gcra.peek("k").remaining, 8);
  EXPECT_EQ(window.peek("k").remaining, 8);
  EXPECT_EQ(bucket.peek("k").remaining, 10);
  (void)raw({"SET", record, good});
  EXPECT_EQ(both.cancel("c").returned, 2) << "the record itself was never touched";
}

// (6) reserveFor follows the failure policy on a killed server, recording nothing; settle throws
// the IoError; once the server is back, a policy grant's id settles as Unknown.
TEST(MultiReserveSettlePolicy, KilledServerIsDecidedByThePolicyAndSettleThrows) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    Limiter gcra(client, "gcra", frozenGcra(5));
    Limiter window(client, "window", frozenWindow(5));
    MultiLimit::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    options.monitor.registry = std::make_shared<MetricsRegistry>();
    options.name = "policy";
    MultiLimit both = MultiLimit({gcra, window}, options).on({"k", "k"});
    ASSERT_TRUE(both.reserveFor(2, "before").allowed);
    server.kill();
    for (int i = 0; i < 3; ++i) {
      try {
        const MultiDecision h = both.reserveFor(1, "during");
        EXPECT_TRUE(h.byPolicy);
        EXPECT_FALSE(h.repeated);
        EXPECT_EQ(h.allowed, policy == FailurePolicy::Allow);
        EXPECT_EQ(h.limits.size(), 2u);
        EXPECT_NE(policy, FailurePolicy::Throw);
      } catch (const IoError&) {
        EXPECT_EQ(policy, FailurePolicy::Throw);
      }
    }
    EXPECT_THROW((void)both.settle("before", 0), IoError);
    EXPECT_EQ(options.monitor.registry->snapshot("policy").reservationsOpened, 1u) << "a policy grant records nothing";
    server.restart();  // no persistence: it comes back empty
    ASSERT_TRUE(untilAnswered([&] { EXPECT_FALSE(gcra.exists("k")) << "the restarted server is empty"; }));
    EXPECT_EQ(both.settle("during", 0).status, Settlement::Status::Unknown);
  }
}

TEST_F(MultiReserveSettle, AsyncReserveAndSettleAnswerAsTheSyncForms) {
  Limiter gcra(client(), limiterName("gcra"), frozenGcra(10));
  Limiter window(client(), limiterName("window"), frozenWindow(10));
  auto registry = std::make_shared<MetricsRegistry>();
  MultiLimit both = MultiLimit({gcra, window}, options(registry)).on({"k", "k"});
  const MultiDecision held = both.reserveForAsync(4, "req-1").get();
  ASSERT_TRUE(held.allowed);
  EXPECT_FALSE(held.repeated);
  std::promise<MultiDecision> again;
  both.reserveForAsync(4, "req-1", milliseconds(60000),
                       [&](MultiDecision h, const std::exception_ptr&) { again.set_value(std::move(h)); });
  EXPECT_TRUE(again.get_future().get().repeated) << "the same id answers the first";
  EXPECT_EQ(gcra.peek("k").remaining, 6);
  const MultiSettlement settled = both.settleAsync("req-1", 1).get();
  EXPECT_EQ(settled.status, Settlement::Status::Settled);
  EXPECT_EQ(settled.returned, 3);
  EXPECT_EQ(both.settleAsync("req-1", 1).get().status, Settlement::Status::AlreadySettled);
  EXPECT_EQ(gcra.peek("k").remaining, 9);
  EXPECT_EQ(window.peek("k").remaining, 9);
  const LimiterMetrics::Snapshot m = registry->snapshot("multi");
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.reservationsSettled, 1u);
  EXPECT_EQ(m.permitsRefunded, 3u);
}
