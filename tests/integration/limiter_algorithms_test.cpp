// Limiter under the GCRA, token bucket and fixed window policies against a real redis-server: what
// they share, as typed tests over the three, on keys whose configuration is stored in them
// (Policy::stored, as the 0.1 one-key handles kept it). Exactness against a model, the
// multi-process bounds and reservations are in one_key_bounds_test.cpp.
#include <atomic>
#include <future>
#include <map>
#include <thread>
#include <type_traits>

#include "one_key_support.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

template <class Traits>
class LimiterAlgorithms : public RedisTest {
 protected:
  /// The interval of slowPolicy: 10 s, and 49.7 days for the fixed window, whose windows are
  /// aligned to the epoch: a 10 s window starts inside a 5 ms test once in 2 000 runs.
  static milliseconds slowInterval() {
    return std::is_same_v<Traits, FixedWindowTraits> ? milliseconds(4294967295) : milliseconds(10000);
  }
  /// `limit` at once, `limit` more per slowInterval(), stored in the key: nothing comes back during
  /// a test.
  static Policy slowPolicy(std::int64_t limit) { return Traits::policy(limit, limit, slowInterval()).stored(); }
  /// A Limiter of `policy` kept in its keys (written by trySetPolicy / setPolicy), named `suffix`.
  Limiter storedLimiter(const Policy& policy, const std::string& suffix = "l") {
    return Limiter(this->client(), this->limiterName(suffix), policy.stored());
  }

  Reply takeAt(const std::string& redisKey, std::int64_t nowUs, std::int64_t permits) {
    return runOneKey(admin(), Traits::script(), redisKey,
                     {"take", std::to_string(nowUs), Traits::kKind, std::to_string(permits), "0"});
  }
  Reply peekAt(const std::string& redisKey, std::int64_t nowUs, std::int64_t permits) {
    return runOneKey(admin(), Traits::script(), redisKey,
                     {"peek", std::to_string(nowUs), Traits::kKind, std::to_string(permits)});
  }
};

TYPED_TEST_SUITE(LimiterAlgorithms, AlgorithmTypes, AlgorithmNames);

TYPED_TEST(LimiterAlgorithms, StartsFullAndDecidesWithTheWholeAnswer) {
  Limiter rl = this->storedLimiter(this->slowPolicy(5));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const std::int64_t before = serverTimeUs(this->admin());
  const Decision d = rl.decide("k", 2);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.permits, 2);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.retryAfter.count(), 0);
  EXPECT_GT(d.resetAfter.count(), 0);
  EXPECT_FALSE(d.byPolicy);
  EXPECT_EQ(d.deniedBy, Decision::kNone);
  EXPECT_GE(d.time.count(), before);
  EXPECT_LE(d.time.count(), serverTimeUs(this->admin()));

  const Decision denied = rl.decide("k", 4);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 3);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_LE(denied.retryAfter.count(), std::chrono::microseconds(this->slowInterval()).count());

  const Decision look = rl.peek("k", 3);
  EXPECT_TRUE(look.allowed);
  EXPECT_EQ(look.remaining, 3) << "peek takes nothing";
  EXPECT_FALSE(rl.peek("k", 4).allowed);
  EXPECT_TRUE(rl.tryAcquire("k", 3));
  EXPECT_FALSE(rl.tryAcquire("k"));
  EXPECT_EQ(rl.peek("k").remaining, 0);
}

TYPED_TEST(LimiterAlgorithms, TrySetPolicyWritesOnlyWhenAbsentAndSetPolicyKeepsTheState) {
  const Policy first = this->slowPolicy(4);
  const Policy second = TypeParam::policy(9, 3, milliseconds(20000)).stored();
  Limiter rl = this->storedLimiter(first);
  Limiter secondWriter = this->storedLimiter(second);
  EXPECT_FALSE(rl.exists("k"));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  EXPECT_TRUE(rl.exists("k"));
  EXPECT_FALSE(secondWriter.trySetPolicy("k")) << "another writer's policy never overwrites the stored one";
  EXPECT_EQ(secondWriter.peek("k").limit, 4) << "every handle decides with the stored policy";
  ASSERT_TRUE(rl.tryAcquire("k", 4));
  EXPECT_FALSE(rl.tryAcquire("k"));
  EXPECT_FALSE(rl.trySetPolicy("k"));
  EXPECT_FALSE(rl.tryAcquire("k")) << "trySetPolicy on an existing key leaves its state alone";

  rl.setPolicy("k", second);
  EXPECT_FALSE(rl.decide("k", 9).allowed) << "setPolicy keeps the 4 permits in use";
  const Decision d = rl.decide("k", 5);
  EXPECT_TRUE(d.allowed) << "9 - 4 in use";
  EXPECT_EQ(d.limit, 9);

  // Another client's limiter sees the stored configuration, whatever policy it was made with.
  Limiter other(this->newClient(), rl.name(), first);
  EXPECT_EQ(other.peek("k").limit, 9);
}

TYPED_TEST(LimiterAlgorithms, APolicyRaceBetweenTwoWritersLeavesExactlyOne) {
  expectOneStoredPolicyWriterWins(this->newClient(), this->newClient(),
                                  TypeParam::policy(7, 7, milliseconds(1000)).stored(),
                                  TypeParam::policy(11, 5, milliseconds(3000)).stored(),
                                  [&](int round) { return this->limiterName("race" + std::to_string(round)); });
}

TYPED_TEST(LimiterAlgorithms, MissingConfigurationIsNotInitializedNamingTheKey) {
  Limiter rl = this->storedLimiter(this->slowPolicy(5));
  const std::string key = rl.redisKey("k");
  for (int call = 0; call < 3; ++call) {
    try {
      switch (call) {
        case 0:
          (void)rl.decide("k");
          break;
        case 1:
          (void)rl.peek("k");
          break;
        default:
          rl.refund("k", 1);
          break;
      }
      ADD_FAILURE() << "call " << call << " succeeded without a configuration";
    } catch (const NotInitializedError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(exists(this->admin(), key)) << "nothing written";
  EXPECT_FALSE(rl.deleteKey("k"));
}

TYPED_TEST(LimiterAlgorithms, KeyOfAnotherTypeIsATypedErrorAndNothingIsWritten) {
  Limiter rl = this->storedLimiter(this->slowPolicy(3));
  const std::string key = rl.redisKey("k");
  (void)this->raw({"HSET", key, "rate", "10"});
  const std::string before = keyState(this->admin(), key);
  auto expectConfigError = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " succeeded on a hash";
    } catch (const ScriptError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidConfig) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expectConfigError([&] { (void)rl.decide("k"); }, "decide");
  // The fast path of take reads the key with redis.call: Redis's WRONGTYPE, named by the limiter.
  try {
    (void)rl.decide("k");
  } catch (const ScriptError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidConfig) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds another Redis type"), std::string::npos) << e.what();
  }
  expectConfigError([&] { (void)rl.decideAsync("k", 1).get(); }, "decideAsync");
  expectConfigError([&] { (void)rl.tryAcquire("k", 1, std::chrono::milliseconds{50}); }, "tryAcquire with a timeout");
  expectConfigError([&] { (void)rl.peek("k"); }, "peek");
  expectConfigError([&] { (void)rl.trySetPolicy("k"); }, "trySetPolicy");
  expectConfigError([&] { rl.setPolicy("k", this->slowPolicy(3)); }, "setPolicy");
  expectConfigError([&] { rl.refund("k", 1); }, "refund");
  EXPECT_EQ(keyState(this->admin(), key), before);

  (void)this->raw({"DEL", key});
  (void)this->raw({"SET", key, "hello"});
  expectConfigError([&] { (void)rl.decide("k"); }, "decide on a foreign string");
  expectConfigError([&] { rl.setPolicy("k", this->slowPolicy(3)); }, "setPolicy on a foreign string");
  EXPECT_EQ(this->raw({"GET", key}).str, "hello");
}

TYPED_TEST(LimiterAlgorithms, AKeyOfAnotherAlgorithmIsATypedError) {
  // A key written under one algorithm is refused by the others: their fields mean other things.
  const std::string n = this->limiterName();
  const Policy other = std::is_same_v<TypeParam, FixedWindowTraits>
                           ? GcraTraits::policy(5, 5, milliseconds(1000)).stored()
                           : FixedWindowTraits::policy(5, 5, milliseconds(1000)).stored();
  Limiter writer(this->client(), n, other);
  ASSERT_TRUE(writer.trySetPolicy("k"));
  const std::string before = keyState(this->admin(), writer.redisKey("k"));
  Limiter rl(this->client(), n, this->slowPolicy(3));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)rl.decide("k"); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)rl.trySetPolicy("k"); }));
  EXPECT_TRUE(
      test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { rl.setPolicy("k", this->slowPolicy(3)); }));
  EXPECT_EQ(keyState(this->admin(), writer.redisKey("k")), before);
}

TYPED_TEST(LimiterAlgorithms, CorruptedFieldsAreTypedErrorsAndNothingIsWritten) {
  Limiter rl = this->storedLimiter(this->slowPolicy(5));
  const std::string key = rl.redisKey("k");
  ASSERT_TRUE(rl.trySetPolicy("k"));
  ASSERT_TRUE(rl.tryAcquire("k", 2));
  const std::string good = this->raw({"GET", key}).str;
  ASSERT_EQ(good.size(), 28u);
  auto withBytes = [&](std::size_t at, std::size_t n, unsigned char byte) {
    std::string v = good;
    for (std::size_t i = 0; i < n; ++i) v[at + i] = static_cast<char>(byte);
    (void)detail::command(this->admin(), {"SET", key, v});
    return keyState(this->admin(), key);
  };
  // The limit (bytes 1..4) of 0: an unusable configuration.
  std::string before = withBytes(1, 4, 0);
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)rl.decide("k"); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { rl.refund("k", 1); }));
  EXPECT_EQ(keyState(this->admin(), key), before);
  // The last field (bytes 24..27): for the bucket, a remainder of 2^32-1 units (never below P');
  // for the window, a reserved count of 2^32-1 (above the limit).
  before = withBytes(24, 4, 0xFF);
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { (void)rl.decide("k"); }));
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidState, [&] { (void)rl.peek("k"); }));
  EXPECT_EQ(keyState(this->admin(), key), before);
  // A value of another size.
  (void)detail::command(this->admin(), {"SET", key, good.substr(0, 27)});
  EXPECT_TRUE(test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)rl.decide("k"); }));
  // setPolicy repairs a key of its own algorithm.
  (void)detail::command(this->admin(), {"SET", key, good});
  (void)withBytes(24, 4, 0xFF);
  rl.setPolicy("k", this->slowPolicy(5));
  EXPECT_TRUE(rl.tryAcquire("k", 5));
}

TYPED_TEST(LimiterAlgorithms, InvalidArgumentsAreRefusedBeforeAnythingIsSent) {
  Limiter rl = this->storedLimiter(this->slowPolicy(5));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const std::int64_t calls = commandCalls(this->admin(), "evalsha") + commandCalls(this->admin(), "eval");
  EXPECT_THROW((void)TypeParam::policy(0, 1, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)TypeParam::policy(4294967296, 1, milliseconds(1000)), InvalidArgument);
  EXPECT_THROW((void)TypeParam::policy(5, 5, milliseconds(0)), InvalidArgument);
  EXPECT_THROW((void)TypeParam::policy(5, 5, milliseconds(4294967296)), InvalidArgument);
  EXPECT_THROW((void)TypeParam::policy(5, 5, milliseconds(1000)).keepAlive(milliseconds(-1)), InvalidArgument);
  EXPECT_THROW(rl.setPolicy("k", TypeParam::policy(5, 5, milliseconds(1000))), InvalidArgument)
      << "not stored: it travels in the call";
  EXPECT_THROW((void)rl.decide("k", 0), InvalidArgument);
  EXPECT_THROW((void)rl.decide("k", -1), InvalidArgument);
  EXPECT_THROW((void)rl.tryAcquire("k", 4294967296), InvalidArgument);
  EXPECT_THROW((void)rl.peek("k", 0), InvalidArgument);
  EXPECT_THROW(rl.refund("k", -1), InvalidArgument);
  EXPECT_THROW((void)rl.reserve("k", 1, microseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync("k", 0).get(), InvalidArgument);
  EXPECT_EQ(commandCalls(this->admin(), "evalsha") + commandCalls(this->admin(), "eval"), calls) << "nothing sent";
  // More than the limit can ever grant: the script says so (the limit lives in Redis).
  EXPECT_THROW((void)rl.decide("k", 6), InvalidArgument);
  EXPECT_EQ(rl.peek("k").remaining, 5);
  EXPECT_THROW([&] { Limiter unnamed(this->client(), "", this->slowPolicy(5)); }(), InvalidArgument);
  EXPECT_THROW([&] { Limiter clientless(nullptr, this->limiterName(), this->slowPolicy(5)); }(), InvalidArgument);
}

TYPED_TEST(LimiterAlgorithms, MemoryUsageIsAtMost100BytesPerKey) {
  // A Redis key of 14 bytes, as a short one might be ("rl:m:{T123456}"); longer keys cost their
  // length.
  const std::string user = std::string("{") + TypeParam::kKind[0] + "123456}";
  for (const auto keepAlive : {milliseconds(0), milliseconds(60000)}) {
    const Policy policy = TypeParam::policy(4294967295, 1000, milliseconds(1000));
    Limiter rl(this->client(), "m", keepAlive.count() == 0 ? policy.permanent() : policy.keepAlive(keepAlive));
    const std::string key = rl.redisKey(user);
    ASSERT_EQ(key.size(), 14u);
    ASSERT_TRUE(rl.tryAcquire(user, 123456));
    (void)rl.reserve(user, 4294967295, microseconds(10000000));
    const std::int64_t bytes = this->raw({"MEMORY", "USAGE", key}).asInteger();
    std::printf("MEMORY %s keepAlive=%lld bytes=%lld\n", TypeParam::kWorkerKind,
                static_cast<long long>(keepAlive.count()), static_cast<long long>(bytes));
    EXPECT_LE(bytes, 100);
    EXPECT_TRUE(rl.deleteKey(user));
  }
}

TYPED_TEST(LimiterAlgorithms, AGrantIsOneGetAndOneWritePlusTimeAndRepliesOnePackedString) {
  // The fast path with a TTL to keep (SET ... PX, not SET then PEXPIRE; the fixed window's count in
  // the key's window: SETRANGE, keeping the TTL), counted by the server (INFO commandstats counts
  // the commands scripts call). TIME only when no time is given.
  Limiter rl(this->client(), this->limiterName(),
             TypeParam::policy(1000000, 1000000, milliseconds(10000)).keepAlive(milliseconds(60000)));
  const std::string key = rl.redisKey("k");
  ASSERT_TRUE(rl.tryAcquire("k"));  // the key holds the policy
  const auto calls = [&] {
    std::map<std::string, std::int64_t> out;
    for (const char* command : {"get", "set", "setrange", "time", "pexpire", "pttl", "expire"}) {
      out[command] = commandCalls(this->admin(), command);
    }
    return out;
  };
  const std::int64_t now = serverTimeUs(this->admin());
  ASSERT_TRUE(takeReply(this->takeAt(key, now, 1)).allowed);  // the script is loaded
  constexpr int kTakes = 10;
  for (const bool serverClock : {false, true}) {
    const auto before = calls();
    for (int i = 0; i < kTakes; ++i) {
      const Reply r = runOneKey(this->admin(), TypeParam::script(), key,
                                {"take", serverClock ? "" : std::to_string(now), TypeParam::kKind, "1", "0"});
      ASSERT_TRUE(detail::isPackedDecision(r)) << r.describe();
      ASSERT_TRUE(takeReply(r).allowed);
    }
    const auto after = calls();
    EXPECT_EQ(after.at("get") - before.at("get"), kTakes) << "server clock: " << serverClock;
    EXPECT_EQ(after.at("set") + after.at("setrange") - before.at("set") - before.at("setrange"), kTakes)
        << "server clock: " << serverClock;
    EXPECT_EQ(after.at("time") - before.at("time"), serverClock ? kTakes : 0);
    for (const char* other : {"pexpire", "pttl", "expire"}) EXPECT_EQ(after.at(other), before.at(other)) << other;
  }
}

TYPED_TEST(LimiterAlgorithms, KeepAliveExpiresTheKeyOnlyAfterItIsFullAgain) {
  Limiter plain(this->client(), this->limiterName("plain"), this->slowPolicy(5));
  ASSERT_TRUE(plain.trySetPolicy("k"));
  ASSERT_TRUE(plain.tryAcquire("k"));
  EXPECT_EQ(this->raw({"PTTL", plain.redisKey("k")}).asInteger(), -1) << "a stored policy's key is permanent";

  Limiter kept(this->client(), this->limiterName("kept"),
               TypeParam::policy(5, 5, milliseconds(10000)).keepAlive(milliseconds(30000)));
  const Decision d = kept.decide("k", 3);
  ASSERT_TRUE(d.allowed);
  const std::int64_t ttl = this->raw({"PTTL", kept.redisKey("k")}).asInteger();
  const std::int64_t resetMs = (d.resetAfter.count() + 999) / 1000;
  EXPECT_GT(ttl, 30000 + resetMs - 1000);
  EXPECT_LE(ttl, 30000 + resetMs);

  // A short keepAlive: the idle key vanishes, and decides again as a full one.
  Limiter brief(this->client(), this->limiterName("brief"),
                TypeParam::policy(2, 2, milliseconds(20)).keepAlive(milliseconds(30)));
  ASSERT_TRUE(brief.tryAcquire("k"));
  for (int i = 0; i < 100 && brief.exists("k"); ++i) sleepMs(10);
  EXPECT_FALSE(brief.exists("k"));
  EXPECT_EQ(brief.peek("k").remaining, 2);
}

TYPED_TEST(LimiterAlgorithms, RefundGivesPermitsBackUpToFull) {
  Limiter rl = this->storedLimiter(this->slowPolicy(5));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  ASSERT_TRUE(rl.tryAcquire("k", 4));
  EXPECT_EQ(rl.peek("k").remaining, 1);
  rl.refund("k", 2);
  EXPECT_EQ(rl.peek("k").remaining, 3);
  rl.refund("k", 0);
  EXPECT_EQ(rl.peek("k").remaining, 3);
  rl.refund("k", 4294967295);
  EXPECT_EQ(rl.peek("k").remaining, 5) << "never more than full";
  EXPECT_TRUE(rl.tryAcquire("k", 5));
  EXPECT_FALSE(rl.tryAcquire("k"));
}

TYPED_TEST(LimiterAlgorithms, DeleteKeyRemovesConfigurationAndState) {
  Limiter rl = this->storedLimiter(this->slowPolicy(5));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  EXPECT_TRUE(rl.deleteKey("k"));
  EXPECT_FALSE(rl.deleteKey("k"));
  EXPECT_THROW((void)rl.decide("k"), NotInitializedError);
  EXPECT_TRUE(rl.trySetPolicy("k"));
}

TYPED_TEST(LimiterAlgorithms, AsyncFormsDecideLikeTheSyncOnes) {
  Limiter rl = this->storedLimiter(this->slowPolicy(4));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const Decision first = rl.decideAsync("k", 2).get();
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 2);
  EXPECT_GT(first.time.count(), 0);
  EXPECT_TRUE(rl.decideAsync("k", 1).get().allowed);
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.decideAsync("k", 2, [&](Decision d, const std::exception_ptr& error) { got.set_value({d, error}); });
  const auto [denied, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 1);
  EXPECT_GT(denied.retryAfter.count(), 0);
  std::promise<std::exception_ptr> bad;
  rl.decideAsync("k", 0, [&](Decision, const std::exception_ptr& e) { bad.set_value(e); });
  EXPECT_THROW(std::rethrow_exception(bad.get_future().get()), InvalidArgument);
  // Many in flight from one thread.
  std::vector<std::future<Decision>> many;
  for (int i = 0; i < 50; ++i) many.push_back(rl.decideAsync("k", 1));
  int granted = 0;
  for (auto& f : many) granted += f.get().allowed ? 1 : 0;
  EXPECT_EQ(granted, 1);
}

TYPED_TEST(LimiterAlgorithms, RetryAfterIsExactToTheMicrosecond) {
  // A 20 ms interval of 4 permits: after 4 are taken, retryAfter says exactly when the next can
  // be. The script is asked at chosen server times (its `now` argument): 1 ms and 1 µs before the
  // retry time the permit is refused, at it granted.
  Limiter rl = this->storedLimiter(TypeParam::policy(4, 4, milliseconds(20)));
  const std::string n = rl.redisKey("k");
  for (int round = 0; round < 5; ++round) {
    // A fresh key each round: the last round took at a time ahead of the server's clock, and
    // five such rounds in a row would be a clock step back (clamped: lua/lib/gcra_core.lua).
    (void)rl.deleteKey("k");
    ASSERT_TRUE(rl.trySetPolicy("k"));
    Decision d;
    for (int i = 0; i < 1000 && (d = rl.decide("k", round % 2 + 1)).allowed; ++i) {
    }
    ASSERT_FALSE(d.allowed);
    ASSERT_GT(d.retryAfter.count(), 0);
    const std::int64_t at = d.time.count() + d.retryAfter.count();
    const std::int64_t permits = round % 2 + 1;
    EXPECT_FALSE(takeReply(this->peekAt(n, at - 1000, permits)).allowed);
    EXPECT_FALSE(takeReply(this->peekAt(n, at - 1, permits)).allowed);
    const TakeReply exact = takeReply(this->peekAt(n, at, permits));
    EXPECT_TRUE(exact.allowed) << "retryAfter " << d.retryAfter.count() << " us";
    // And taking it then works, while the state is otherwise unchanged.
    EXPECT_TRUE(takeReply(this->takeAt(n, at, permits)).allowed);
  }
}

TYPED_TEST(LimiterAlgorithms, TryAcquireWithTimeoutReservesWhenTheWaitFits) {
  // A timeout shorter than the wait: false at once, nothing taken. An hour-long interval, so that
  // the wait cannot run out between the peek and the call on a loaded machine (a 100 ms one did,
  // under ASan with 4 tests at a time: the permit was due by then, and was rightly granted).
  Limiter slow = this->storedLimiter(TypeParam::policy(2, 2, milliseconds(3'600'000)), "slow");
  ASSERT_TRUE(slow.trySetPolicy("k"));
  ASSERT_TRUE(slow.tryAcquire("k", 2));
  const Decision full = slow.peek("k");
  if (!full.allowed && full.retryAfter > milliseconds(10'000)) {  // a fixed window may be about to end
    EXPECT_FALSE(slow.tryAcquire("k", 1, milliseconds(1)));
    EXPECT_LE(slow.peek("k").retryAfter.count(), full.retryAfter.count()) << "nothing reserved";
  }
  // A timeout the wait fits in: it waits for the permit and takes it.
  Limiter rl = this->storedLimiter(TypeParam::policy(2, 2, milliseconds(100)));
  ASSERT_TRUE(rl.trySetPolicy("k"));
  ASSERT_TRUE(rl.tryAcquire("k", 2));
  const Decision denied = rl.peek("k");  // denied, unless the machine stalled past the wait (then 0)
  EXPECT_TRUE(rl.tryAcquire("k", 1, milliseconds(5000)));
  // It waited for the permit: the call ended no earlier than the permit was due.
  EXPECT_GE(serverTimeUs(this->admin()), denied.time.count() + denied.retryAfter.count());
  // What it reserved is taken: less than 50 ms after the permit was due (less than one refill, the
  // same window), at most the window's second permit is left. Later, a loaded machine may have
  // let more come back: nothing to check then.
  const Decision after = rl.peek("k");
  if (after.time.count() < denied.time.count() + denied.retryAfter.count() + 50'000) {
    EXPECT_LE(after.remaining, 1);
  }
}

// --- Failure policy: a server that is gone ----------------------------------------------------------

TYPED_TEST(LimiterAlgorithms, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    Limiter::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    std::atomic<int> degraded{0};
    options.failure.onHealthChange = [&](const HealthEvent& e) {
      if (e.kind == HealthEvent::Kind::Degraded) degraded.fetch_add(1);
    };
    Limiter rl(client, "policy", TypeParam::policy(3, 3, milliseconds(60000)).stored(), options);
    ASSERT_TRUE(rl.trySetPolicy("k"));
    ASSERT_TRUE(rl.decide("k").allowed);  // the limiter learns its limit
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const Decision d = rl.decide("k");
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.limit, 3);
        EXPECT_EQ(d.time.count(), 0);
        (d.allowed ? allowed : denied)++;
      } catch (const IoError&) {
        ++thrown;
      }
    }
    // Local: its bucket holds the limit.
    expectDecidedByPolicy(policy, allowed, denied, thrown, 6, 3);
    // Async decisions follow the same policy.
    if (policy == FailurePolicy::Allow) {
      EXPECT_TRUE(rl.decideAsync("k", 1).get().byPolicy);
    }
    if (policy == FailurePolicy::Deny) {
      EXPECT_FALSE(rl.decideAsync("k", 1).get().allowed);
    }
    // Queries are not decisions: they report the outage.
    EXPECT_THROW((void)rl.peek("k"), IoError);
    EXPECT_THROW(rl.refund("k", 1), IoError);
    EXPECT_TRUE(rl.failureStats().degraded);
    EXPECT_EQ(rl.failureStats().outages, 1u);
    EXPECT_EQ(degraded.load(), 1);
    // Back again: the limiter recovers on the next probe.
    server.restart();
    bool configured = false;
    for (int i = 0; i < 100 && !configured; ++i) {
      try {
        configured = rl.trySetPolicy("k");
      } catch (const IoError&) {
        sleepMs(10);  // a connection of the pool still went to the killed server
      }
    }
    ASSERT_TRUE(configured);
    bool recovered = false;
    for (int i = 0; i < 100 && !recovered; ++i) {
      try {
        recovered = !rl.decide("k").byPolicy;
      } catch (const IoError&) {
      }
      if (!recovered) sleepMs(10);
    }
    EXPECT_TRUE(recovered);
    EXPECT_FALSE(rl.failureStats().degraded);
  }
}
