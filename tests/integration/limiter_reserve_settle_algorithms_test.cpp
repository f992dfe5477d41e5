// Reserve, then settle on a Limiter against a real redis-server, as typed tests over the token
// bucket, GCRA and fixed window policies, on one key of each: reserveFor records
// a grant under an id, settle gives back (or charges) the difference exactly once however often it
// is retried, and bad input, corrupted records and a killed server are handled as documented.
#include <atomic>
#include <future>
#include <random>
#include <thread>
#include <utility>

#include "one_key_support.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit_test/fixture.hpp"
#include "topology/key_slot.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

template <class Traits>
class LimiterReserveSettleAlgorithms : public RedisTest {
 protected:
  /// `limit` at once, nothing back for a day (the fixed window: one window of 46 days), so the
  /// permits in use are exactly what the test took while it runs.
  static Policy frozenPolicy(std::int64_t limit) {
    if (std::is_same_v<Traits, FixedWindowTraits>) return Traits::policy(limit, 1, milliseconds(4000000000));
    return Traits::policy(limit, 1, milliseconds(86400000));
  }
  /// A Limiter of `policy` with its own metrics registry, so counts are this test's.
  Limiter limiter(const Policy& policy, const std::shared_ptr<MetricsRegistry>& registry = nullptr) {
    Limiter::Options options;
    options.monitor.registry = registry;
    return Limiter(this->client(), this->limiterName(), policy, options);
  }
};

TYPED_TEST_SUITE(LimiterReserveSettleAlgorithms, AlgorithmTypes, AlgorithmNames);

// (1) The settle of one reservation sent 10 times, every connection of the limiter's Client killed
// between tries: the permits come back once.
TYPED_TEST(LimiterReserveSettleAlgorithms, SettleRetriedAfterClientKillGivesBackOnce) {
  auto registry = std::make_shared<MetricsRegistry>();
  auto rl = this->limiter(this->frozenPolicy(100), registry);
  const Decision held = rl.reserveFor("k", 40, "req-1");
  ASSERT_TRUE(held.allowed);
  EXPECT_FALSE(held.repeated);
  EXPECT_EQ(held.remaining, 60);
  EXPECT_TRUE(exists(this->admin(), rl.recordKey("k", "req-1")));

  int settled = 0, again = 0, failed = 0;
  for (int i = 0; i < 10; ++i) {
    (void)this->raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
    try {
      const Settlement s = rl.settle("k", "req-1", 10);
      EXPECT_EQ(s.reserved, 40);
      EXPECT_EQ(s.actual, 10);
      EXPECT_EQ(s.returned, 30);
      EXPECT_EQ(s.charged, 0);
      EXPECT_EQ(s.unpaid, 0);
      EXPECT_EQ(s.remaining, 90) << "the first settle's answer, every time";
      (s.status == Settlement::Status::Settled ? settled : again)++;
    } catch (const IoError&) {
      ++failed;  // the kill can still be in flight: a retry follows
    }
  }
  EXPECT_EQ(settled, 1);
  EXPECT_EQ(settled + again + failed, 10);
  EXPECT_GE(again, 5);
  EXPECT_EQ(rl.peek("k").remaining, 90) << "30 came back, once";
  const LimiterMetrics::Snapshot m = registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.reservationsSettled, 1u);
  EXPECT_EQ(m.permitsRefunded, 30u);
  EXPECT_EQ(m.granted, 1u);
  EXPECT_EQ(m.permitsGranted, 40u);
}

// (2) 8 threads reserving and settling random actuals (seeded), some above the reservation: the
// permits in use are exactly the sum of the actuals.
TYPED_TEST(LimiterReserveSettleAlgorithms, ParallelReserveAndSettleKeepUsedEqualToTheActuals) {
  constexpr std::int64_t kLimit = 10000;
  auto rl = this->limiter(this->frozenPolicy(kLimit));
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
        if (!rl.reserveFor("k", reserved, id).allowed) ++problems;
        const Settlement s = rl.settle("k", id, actual);
        const bool exact = s.status == Settlement::Status::Settled && s.unpaid == 0 &&
                           s.returned == std::max<std::int64_t>(0, reserved - actual) &&
                           s.charged == std::max<std::int64_t>(0, actual - reserved);
        if (!exact) ++problems;
        sum += actual;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(problems.load(), 0);
  EXPECT_EQ(kLimit - rl.peek("k").remaining, sum.load()) << "used == sum of the actuals";
}

// (3) A reserve sent again with the same id takes nothing more and answers the first grant.
TYPED_TEST(LimiterReserveSettleAlgorithms, ReserveIsIdempotent) {
  auto registry = std::make_shared<MetricsRegistry>();
  auto rl = this->limiter(this->frozenPolicy(10), registry);
  const Decision first = rl.reserveFor("k", 3, "a");
  ASSERT_TRUE(first.allowed);
  EXPECT_FALSE(first.repeated);
  EXPECT_EQ(first.remaining, 7);
  for (int i = 0; i < 3; ++i) {
    const Decision again = rl.reserveFor("k", 3, "a");
    EXPECT_TRUE(again.allowed);
    EXPECT_TRUE(again.repeated);
    EXPECT_EQ(again.remaining, 7);
  }
  EXPECT_EQ(rl.peek("k").remaining, 7);
  EXPECT_THROW((void)rl.reserveFor("k", 4, "a"), InvalidArgument) << "an id names one reservation";
  EXPECT_EQ(rl.peek("k").remaining, 7);

  // A denial records nothing: the same id may be reserved again once permits are there.
  const Decision denied = rl.reserveFor("k", 8, "b");
  EXPECT_FALSE(denied.allowed);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_FALSE(exists(this->admin(), rl.recordKey("k", "b")));
  EXPECT_EQ(rl.cancel("k", "a").returned, 3);
  EXPECT_TRUE(rl.reserveFor("k", 8, "b").allowed);
  EXPECT_EQ(rl.peek("k").remaining, 2);

  // Settled, the id still answers the first grant and takes nothing.
  EXPECT_TRUE(rl.reserveFor("k", 3, "a").repeated);
  EXPECT_EQ(rl.peek("k").remaining, 2);
  const LimiterMetrics::Snapshot m = registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 2u);
  EXPECT_EQ(m.granted, 2u) << "repeats are not decisions";
  EXPECT_EQ(m.denied, 1u);

  // The record lives for the TTL it was given.
  ASSERT_TRUE(rl.reserveFor("k", 1, "short", milliseconds(60000)).allowed);
  const std::int64_t ttl = this->raw({"PTTL", rl.recordKey("k", "short")}).integer;
  EXPECT_GT(ttl, 50000);
  EXPECT_LE(ttl, 60000);
}

// (4) A settle of an id that was never reserved (or whose record expired) changes nothing.
TYPED_TEST(LimiterReserveSettleAlgorithms, SettleOfAnUnknownIdChangesNothing) {
  auto rl = this->limiter(this->frozenPolicy(10));
  ASSERT_TRUE(rl.tryAcquire("k", 4));
  const std::string before = keyState(this->admin(), rl.redisKey("k"));
  const Settlement s = rl.settle("k", "never", 0);
  EXPECT_EQ(s.status, Settlement::Status::Unknown);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(s.returned, 0);
  EXPECT_EQ(rl.cancel("k", "never").status, Settlement::Status::Unknown);
  EXPECT_EQ(keyState(this->admin(), rl.redisKey("k")), before);
  EXPECT_FALSE(exists(this->admin(), rl.recordKey("k", "never")));

  // An expired record: the reservation stays counted as fully used.
  ASSERT_TRUE(rl.reserveFor("k", 2, "brief", milliseconds(1)).allowed);
  for (int i = 0; i < 200 && exists(this->admin(), rl.recordKey("k", "brief")); ++i) sleepMs(2);
  EXPECT_EQ(rl.settle("k", "brief", 0).status, Settlement::Status::Unknown);
  EXPECT_EQ(rl.peek("k").remaining, 4);
}

// The debt rule: actual above the reservation is charged as far as the limiter may owe (token
// bucket, GCRA: burst x T + the horizon, here 2 x 10; fixed window: the rest of this window and the
// next one); the rest is reported unpaid. A give-back never fills the limiter past full.
TYPED_TEST(LimiterReserveSettleAlgorithms, ActualAboveTheReservationIsChargedUpToTheDebtBound) {
  // 10 at once, 10 more per hour: the horizon is one hour, 10 permits of debt.
  const Policy config = std::is_same_v<TypeParam, FixedWindowTraits> ? this->frozenPolicy(10)
                                                                     : TypeParam::policy(10, 10, milliseconds(3600000));
  auto rl = this->limiter(config);
  ASSERT_TRUE(rl.reserveFor("k", 4, "big").allowed);
  const Settlement s = rl.settle("k", "big", 30);
  EXPECT_EQ(s.status, Settlement::Status::Settled);
  EXPECT_EQ(s.returned, 0);
  EXPECT_EQ(s.charged, 16);
  EXPECT_EQ(s.unpaid, 10);
  EXPECT_EQ(s.remaining, 0);
  const Decision d = rl.decide("k", 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_GT(d.retryAfter.count(), 0);

  // A give-back beyond full is cut: the limiter was refilled by a refund meanwhile.
  ASSERT_TRUE(rl.deleteKey("k"));  // start again, full
  ASSERT_TRUE(rl.reserveFor("k", 4, "small").allowed);
  rl.refund("k", 4);
  const Settlement back = rl.cancel("k", "small");
  EXPECT_EQ(back.status, Settlement::Status::Settled);
  EXPECT_EQ(back.returned, 0);
  EXPECT_EQ(back.remaining, 10);
}

// (5) Bad input is refused before anything is sent.
TYPED_TEST(LimiterReserveSettleAlgorithms, BadInputIsRefusedBeforeSending) {
  auto rl = this->limiter(this->frozenPolicy(10));
  ASSERT_TRUE(rl.reserveFor("k", 2, "ok").allowed);
  const std::vector<std::string> keys{rl.redisKey("k"), rl.recordKey("k", "ok")};
  const auto statesBefore = keyStates(this->admin(), keys);
  const std::int64_t calibrate = totalCommandCalls(this->admin());
  const std::int64_t overhead = totalCommandCalls(this->admin()) - calibrate;
  const std::int64_t before = totalCommandCalls(this->admin());
  const std::string tooLong(detail::kMaxReservationIdLength + 1, 'x');
  for (const std::string& id : {std::string(), tooLong, std::string("a b"), std::string("{tag}"), std::string("x\n"),
                                std::string("caf\xc3\xa9"), std::string("a*")}) {
    EXPECT_THROW((void)rl.reserveFor("k", 1, id), InvalidArgument) << id;
    EXPECT_THROW((void)rl.settle("k", id, 1), InvalidArgument) << id;
    EXPECT_THROW((void)rl.cancel("k", id), InvalidArgument) << id;
  }
  EXPECT_NO_THROW((void)rl.recordKey("k", std::string(detail::kMaxReservationIdLength, 'x')));
  for (std::int64_t permits : {std::int64_t{0}, std::int64_t{-1}, detail::kMaxPermits + 1}) {
    EXPECT_THROW((void)rl.reserveFor("k", permits, "p"), InvalidArgument) << permits;
  }
  for (std::int64_t actual : {std::int64_t{-1}, detail::kMaxPermits + 1}) {
    EXPECT_THROW((void)rl.settle("k", "ok", actual), InvalidArgument) << actual;
  }
  for (milliseconds ttl : {milliseconds(0), milliseconds(-5), detail::kMaxReservationTtl + milliseconds(1)}) {
    EXPECT_THROW((void)rl.reserveFor("k", 1, "t", ttl), InvalidArgument) << ttl.count();
  }
  EXPECT_EQ(totalCommandCalls(this->admin()) - before, overhead) << "a command reached Redis";
  EXPECT_EQ(keyStates(this->admin(), keys), statesBefore);
}

// (6) A corrupted record is refused naming its key, with nothing written.
TYPED_TEST(LimiterReserveSettleAlgorithms, CorruptedRecordIsRefusedWithNothingWritten) {
  auto rl = this->limiter(this->frozenPolicy(10));
  ASSERT_TRUE(rl.reserveFor("k", 2, "c").allowed);
  const std::string record = rl.recordKey("k", "c");
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    (void)this->raw({"DEL", record});
    if (variant == 0) (void)this->raw({"SET", record, "not a record"});
    if (variant == 1) (void)this->raw({"RPUSH", record, "x"});
    if (variant == 2) {  // a well-formed record of another kind of limiter
      std::string other = "R" + std::string(std::is_same_v<TypeParam, FixedWindowTraits> ? "T" : "W") + "O";
      other += std::string("\x02\x00\x00\x00", 4) + std::string(27, '\0');
      (void)this->raw({"SET", record, other});
    }
    const std::vector<std::string> keys{rl.redisKey("k"), record};
    const auto before = keyStates(this->admin(), keys);
    try {
      (void)rl.settle("k", "c", 0);
      ADD_FAILURE() << "settle of a corrupted record";
    } catch (const ScriptError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidState) << e.what();
      EXPECT_NE(std::string(e.what()).find(record), std::string::npos) << e.what();
    }
    EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { (void)rl.reserveFor("k", 2, "c"); }));
    EXPECT_EQ(keyStates(this->admin(), keys), before);
  }
  EXPECT_EQ(rl.peek("k").remaining, 8);
}

// What an ...Async call with a callback hands its callback, waited for here; `ranBeforeReturn`
// says whether the callback had run when the call returned (decided without Redis).
template <class T, class Start>
std::pair<T, std::exception_ptr> viaCallback(Start&& start, bool* ranBeforeReturn = nullptr) {
  // Shared with the callback: it may still be finishing on the I/O thread when get() returns.
  auto promise = std::make_shared<std::promise<std::pair<T, std::exception_ptr>>>();
  std::future<std::pair<T, std::exception_ptr>> result = promise->get_future();
  std::forward<Start>(start)([promise](T value, std::exception_ptr error) {
    promise->set_value({std::move(value), std::move(error)});
  });
  if (ranBeforeReturn != nullptr) {
    *ranBeforeReturn = result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  return result.get();
}

void expectSameHeld(const Decision& async, const Decision& sync) {
  EXPECT_EQ(async.allowed, sync.allowed);
  EXPECT_EQ(async.permits, sync.permits);
  EXPECT_EQ(async.remaining, sync.remaining);
  EXPECT_EQ(async.limit, sync.limit);
  EXPECT_EQ(async.byPolicy, sync.byPolicy);
  EXPECT_EQ(async.retryAfter.count() > 0, sync.retryAfter.count() > 0);
  EXPECT_EQ(async.repeated, sync.repeated);
}

void expectSameSettlement(const Settlement& async, const Settlement& sync) {
  EXPECT_EQ(async.status, sync.status);
  EXPECT_EQ(async.reserved, sync.reserved);
  EXPECT_EQ(async.actual, sync.actual);
  EXPECT_EQ(async.returned, sync.returned);
  EXPECT_EQ(async.charged, sync.charged);
  EXPECT_EQ(async.unpaid, sync.unpaid);
  EXPECT_EQ(async.remaining, sync.remaining);
}

// (8) reserveForAsync and settleAsync (callback and future forms) give the answers, state and
// metrics of the sync forms: two limiters configured alike, one driven sync, one async.
TYPED_TEST(LimiterReserveSettleAlgorithms, AsyncReserveAndSettleAnswerAsTheSyncForms) {
  auto syncRegistry = std::make_shared<MetricsRegistry>(), asyncRegistry = std::make_shared<MetricsRegistry>();
  auto sync = this->limiter(this->frozenPolicy(10), syncRegistry);
  Limiter::Options options;
  options.monitor.registry = asyncRegistry;
  Limiter async(this->client(), this->limiterName("async"), this->frozenPolicy(10), options);

  // reserve 4 (granted), the same id again (repeated), 8 more (denied), 2 with a TTL of its own.
  const struct {
    std::int64_t permits;
    const char* id;
    bool future;
  } reserves[] = {{4, "a", false}, {4, "a", true}, {8, "b", false}, {2, "c", true}};
  for (const auto& r : reserves) {
    SCOPED_TRACE(r.id);
    const Decision expected = sync.reserveFor("k", r.permits, r.id, milliseconds(60000));
    Decision got;
    if (r.future) {
      got = async.reserveForAsync("k", r.permits, r.id, milliseconds(60000)).get();
    } else {
      auto [held, error] = viaCallback<Decision>(
          [&](auto done) { async.reserveForAsync("k", r.permits, r.id, milliseconds(60000), std::move(done)); });
      ASSERT_FALSE(error);
      got = held;
    }
    expectSameHeld(got, expected);
  }
  EXPECT_TRUE(exists(this->admin(), async.recordKey("k", "a")));
  EXPECT_FALSE(exists(this->admin(), async.recordKey("k", "b")));
  const std::int64_t ttl = this->raw({"PTTL", async.recordKey("k", "c")}).integer;
  EXPECT_GT(ttl, 50000);
  EXPECT_LE(ttl, 60000);
  // The default TTL (the callback form without one).
  auto [held, heldError] = viaCallback<Decision>(
      [&](auto done) { async.reserveForAsync("k", 1, "d", Limiter::kDefaultRecordTtl, std::move(done)); });
  ASSERT_FALSE(heldError);
  expectSameHeld(held, sync.reserveFor("k", 1, "d"));

  // settle 1 of 4 (3 back), the same again (AlreadySettled), an unknown id, 5 of 2 (3 charged).
  const struct {
    const char* id;
    std::int64_t actual;
    bool future;
  } settles[] = {{"a", 1, false}, {"a", 1, true}, {"zz", 0, false}, {"c", 5, true}};
  for (const auto& st : settles) {
    SCOPED_TRACE(st.id);
    const Settlement expected = sync.settle("k", st.id, st.actual);
    Settlement got;
    if (st.future) {
      got = async.settleAsync("k", st.id, st.actual).get();
    } else {
      auto [settled, error] =
          viaCallback<Settlement>([&](auto done) { async.settleAsync("k", st.id, st.actual, std::move(done)); });
      ASSERT_FALSE(error);
      got = settled;
    }
    expectSameSettlement(got, expected);
  }
  EXPECT_EQ(async.peek("k").remaining, sync.peek("k").remaining);
  const LimiterMetrics::Snapshot a = asyncRegistry->snapshot(async.name());
  const LimiterMetrics::Snapshot b = syncRegistry->snapshot(sync.name());
  EXPECT_EQ(a.granted, b.granted);
  EXPECT_EQ(a.denied, b.denied);
  EXPECT_EQ(a.permitsGranted, b.permitsGranted);
  EXPECT_EQ(a.reservationsOpened, b.reservationsOpened);
  EXPECT_EQ(a.reservationsSettled, b.reservationsSettled);
  EXPECT_EQ(a.permitsRefunded, b.permitsRefunded);
  EXPECT_EQ(a.roundTrips, b.roundTrips);
  EXPECT_EQ(a.reservationsOpened, 3u);
  EXPECT_EQ(a.reservationsSettled, 2u);
  EXPECT_EQ(a.permitsRefunded, 3u);
}

// (8b) reserveForAsync and settleAsync with every connection of the limiter's Client killed before
// each: a reservation is taken once and its permits come back once.
TYPED_TEST(LimiterReserveSettleAlgorithms, AsyncCallsAfterClientKillTakeAndGiveBackOnce) {
  auto registry = std::make_shared<MetricsRegistry>();
  auto rl = this->limiter(this->frozenPolicy(100), registry);
  int reserved = 0, repeated = 0, settled = 0, again = 0, failed = 0;
  for (int i = 0; i < 10; ++i) {
    (void)this->raw({"CLIENT", "KILL", "TYPE", "normal"});  // every connection but the admin's own
    try {
      const Decision h = rl.reserveForAsync("k", 40, "req-1").get();
      EXPECT_TRUE(h.allowed);
      EXPECT_EQ(h.remaining, 60);
      (h.repeated ? repeated : reserved)++;
    } catch (const IoError&) {
      ++failed;  // the kill can still be in flight: a retry follows
    }
  }
  EXPECT_EQ(reserved, 1);
  EXPECT_EQ(reserved + repeated + failed, 10);
  for (int i = 0; i < 10; ++i) {
    (void)this->raw({"CLIENT", "KILL", "TYPE", "normal"});
    try {
      const Settlement s = rl.settleAsync("k", "req-1", 10).get();
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
  const LimiterMetrics::Snapshot m = registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.reservationsSettled, 1u);
  EXPECT_EQ(m.permitsRefunded, 30u);
  EXPECT_EQ(m.permitsGranted, 40u);
}

// (9) Bad input reaches the callback (and the future) as InvalidArgument before the call returns,
// with nothing sent.
TYPED_TEST(LimiterReserveSettleAlgorithms, AsyncBadInputIsRefusedBeforeSending) {
  auto rl = this->limiter(this->frozenPolicy(10));
  ASSERT_TRUE(rl.reserveFor("k", 2, "ok").allowed);
  const std::vector<std::string> keys{rl.redisKey("k"), rl.recordKey("k", "ok")};
  const auto statesBefore = keyStates(this->admin(), keys);
  const std::int64_t calibrate = totalCommandCalls(this->admin());
  const std::int64_t overhead = totalCommandCalls(this->admin()) - calibrate;
  const std::int64_t before = totalCommandCalls(this->admin());
  auto refused = [](const std::exception_ptr& error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const InvalidArgument&) {
      return true;
    } catch (...) {
    }
    return false;
  };
  const auto reserve = [&](std::int64_t permits, const std::string& id, milliseconds ttl) {
    bool atOnce = false;
    auto [held, error] =
        viaCallback<Decision>([&](auto done) { rl.reserveForAsync("k", permits, id, ttl, std::move(done)); }, &atOnce);
    EXPECT_TRUE(atOnce) << id;
    EXPECT_FALSE(held.allowed);
    return refused(error);
  };
  const auto settle = [&](const std::string& id, std::int64_t actual) {
    bool atOnce = false;
    auto [settled, error] =
        viaCallback<Settlement>([&](auto done) { rl.settleAsync("k", id, actual, std::move(done)); }, &atOnce);
    EXPECT_TRUE(atOnce) << id;
    return refused(error);
  };
  for (const std::string& id : {std::string(), std::string("a b"), std::string("{tag}"),
                                std::string(detail::kMaxReservationIdLength + 1, 'x')}) {
    EXPECT_TRUE(reserve(1, id, milliseconds(1000))) << id;
    EXPECT_TRUE(settle(id, 1)) << id;
    EXPECT_THROW((void)rl.reserveForAsync("k", 1, id).get(), InvalidArgument) << id;
    EXPECT_THROW((void)rl.settleAsync("k", id, 0).get(), InvalidArgument) << id;
  }
  EXPECT_TRUE(reserve(0, "p", milliseconds(1000)));
  EXPECT_TRUE(reserve(detail::kMaxPermits + 1, "p", milliseconds(1000)));
  EXPECT_TRUE(reserve(1, "t", milliseconds(0)));
  EXPECT_TRUE(reserve(1, "t", detail::kMaxReservationTtl + milliseconds(1)));
  EXPECT_TRUE(settle("ok", -1));
  EXPECT_TRUE(settle("ok", detail::kMaxPermits + 1));
  EXPECT_EQ(totalCommandCalls(this->admin()) - before, overhead) << "a command reached Redis";
  EXPECT_EQ(keyStates(this->admin(), keys), statesBefore);
}

// (10) Shadow mode: a refused reserveForAsync comes back allowed (shadowDenied), records nothing,
// and counts as the sync form does.
TYPED_TEST(LimiterReserveSettleAlgorithms, AsyncReserveInShadowModeLetsADenialThrough) {
  Limiter::Options options;
  options.monitor.registry = std::make_shared<MetricsRegistry>();
  options.monitor.shadow = true;
  Limiter rl(this->client(), this->limiterName(), this->frozenPolicy(3), options);
  const Decision granted = rl.reserveForAsync("k", 2, "g").get();
  EXPECT_TRUE(granted.allowed);
  EXPECT_FALSE(granted.shadowDenied);
  const Decision over = rl.reserveForAsync("k", 2, "over").get();
  EXPECT_TRUE(over.allowed);
  EXPECT_TRUE(over.shadowDenied);
  EXPECT_FALSE(exists(this->admin(), rl.recordKey("k", "over")));
  EXPECT_EQ(rl.settleAsync("k", "over", 0).get().status, Settlement::Status::Unknown);
  const LimiterMetrics::Snapshot m = options.monitor.registry->snapshot(rl.name());
  EXPECT_EQ(m.reservationsOpened, 1u);
  EXPECT_EQ(m.granted, 1u);
  EXPECT_EQ(m.denied, 1u);
  EXPECT_EQ(m.shadowDenied, 1u);
}

// (11) On a killed server reserveForAsync's callback gets what the failure policy decides (nothing
// recorded) or the IoError under Throw; settleAsync's gets the IoError; the metrics count it.
TEST(ReserveSettlePolicy, AsyncKilledServerFollowsThePolicyThroughTheCallback) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    options.monitor.registry = std::make_shared<MetricsRegistry>();
    Limiter rl(client, "policy", GcraTraits::policy(5, 5, milliseconds(60000)), options);
    ASSERT_TRUE(rl.reserveForAsync("k", 2, "before").get().allowed);
    server.kill();
    constexpr int kTries = 3;
    int byPolicy = 0, thrown = 0;
    for (int i = 0; i < kTries; ++i) {
      auto [held, error] = viaCallback<Decision>(
          [&](auto done) { rl.reserveForAsync("k", 1, "during", Limiter::kDefaultRecordTtl, std::move(done)); });
      if (error) {
        EXPECT_THROW(std::rethrow_exception(error), IoError);
        ++thrown;
        continue;
      }
      EXPECT_TRUE(held.byPolicy);
      EXPECT_FALSE(held.repeated);
      EXPECT_EQ(held.allowed, policy == FailurePolicy::Allow);
      ++byPolicy;
    }
    EXPECT_EQ(thrown, policy == FailurePolicy::Throw ? kTries : 0);
    EXPECT_EQ(byPolicy, policy == FailurePolicy::Throw ? 0 : kTries);
    auto [settled, settleError] =
        viaCallback<Settlement>([&](auto done) { rl.settleAsync("k", "before", 0, std::move(done)); });
    EXPECT_EQ(settled.status, Settlement::Status::Unknown);
    EXPECT_THROW(std::rethrow_exception(settleError), IoError);
    EXPECT_THROW((void)rl.settleAsync("k", "before", 0).get(), IoError);
    const LimiterMetrics::Snapshot m = options.monitor.registry->snapshot("policy");
    EXPECT_EQ(m.reservationsOpened, 1u) << "a policy grant records nothing";
    if (policy == FailurePolicy::Allow) {
      EXPECT_EQ(m.policyDecisions(policy, LimiterMetrics::PolicyOutcome::Granted), static_cast<std::uint64_t>(kTries));
    } else if (policy == FailurePolicy::Deny) {
      EXPECT_EQ(m.policyDecisions(policy, LimiterMetrics::PolicyOutcome::Denied), static_cast<std::uint64_t>(kTries));
    } else {
      EXPECT_EQ(m.policyDecisions(policy, LimiterMetrics::PolicyOutcome::Thrown), static_cast<std::uint64_t>(kTries));
    }
    server.restart();  // no persistence: it comes back empty
    ASSERT_TRUE(untilAnswered([&] { EXPECT_FALSE(rl.exists("k")) << "the restarted server is empty"; }));
    EXPECT_EQ(rl.settleAsync("k", "during", 0).get().status, Settlement::Status::Unknown);
  }
}

// (7) reserveFor follows the failure policy on a killed server, recording nothing; settle throws
// the IoError; once the server is back, a policy grant's id settles as Unknown.
TEST(ReserveSettlePolicy, KilledServerIsDecidedByThePolicyAndSettleThrows) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    options.monitor.registry = std::make_shared<MetricsRegistry>();
    Limiter rl(client, "policy", TokenBucketTraits::policy(5, 5, milliseconds(60000)), options);
    ASSERT_TRUE(rl.reserveFor("k", 2, "before").allowed);
    server.kill();
    for (int i = 0; i < 3; ++i) {
      try {
        const Decision h = rl.reserveFor("k", 1, "during");
        EXPECT_TRUE(h.byPolicy);
        EXPECT_FALSE(h.repeated);
        EXPECT_EQ(h.allowed, policy == FailurePolicy::Allow);
        EXPECT_NE(policy, FailurePolicy::Throw);
      } catch (const IoError&) {
        EXPECT_EQ(policy, FailurePolicy::Throw);
      }
    }
    EXPECT_THROW((void)rl.settle("k", "before", 0), IoError);
    EXPECT_EQ(options.monitor.registry->snapshot("policy").reservationsOpened, 1u) << "a policy grant records nothing";
    server.restart();  // no persistence: it comes back empty
    ASSERT_TRUE(untilAnswered([&] { EXPECT_FALSE(rl.exists("k")) << "the restarted server is empty"; }));
    EXPECT_EQ(rl.settle("k", "during", 0).status, Settlement::Status::Unknown);
  }
}
