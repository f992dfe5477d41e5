// The one-key limiters (TokenBucketRateLimiter, GcraRateLimiter, FixedWindowRateLimiter) against a
// real redis-server: what they share, as typed tests over the three classes. Exactness against a
// model, the multi-process bounds and reservations are in one_key_bounds_test.cpp.
#include <atomic>
#include <future>
#include <map>
#include <thread>
#include <type_traits>

#include "one_key_support.hpp"
#include "redlimit_test/fixture.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

template <class Traits>
class OneKey : public RedisTest {
 protected:
  using Limiter = typename Traits::Limiter;
  using Config = typename Traits::Config;

  /// The interval of slowConfig: 10 s, and 49.7 days for the fixed window, whose windows are aligned
  /// to the epoch: a 10 s window starts inside a 5 ms test once in 2 000 runs.
  static milliseconds slowInterval() {
    return std::is_same_v<Traits, FixedWindowTraits> ? Limiter::kMaxInterval : milliseconds(10000);
  }
  /// `limit` at once, `limit` more per slowInterval(): nothing comes back during a test.
  static Config slowConfig(std::int64_t limit) { return Traits::config(limit, limit, slowInterval()); }

  Reply takeAt(const std::string& key, std::int64_t nowUs, std::int64_t permits) {
    return runOneKey(admin(), Traits::script(), key,
                     {"take", std::to_string(nowUs), Traits::kKind, std::to_string(permits), "0"});
  }
  Reply peekAt(const std::string& key, std::int64_t nowUs, std::int64_t permits) {
    return runOneKey(admin(), Traits::script(), key,
                     {"peek", std::to_string(nowUs), Traits::kKind, std::to_string(permits)});
  }
};

using OneKeyTypes = ::testing::Types<TokenBucketTraits, GcraTraits, FixedWindowTraits>;

class OneKeyNames {
 public:
  template <class T>
  static std::string GetName(int) {
    if (std::is_same_v<T, TokenBucketTraits>) return "TokenBucket";
    if (std::is_same_v<T, GcraTraits>) return "Gcra";
    return "FixedWindow";
  }
};
TYPED_TEST_SUITE(OneKey, OneKeyTypes, OneKeyNames);

TYPED_TEST(OneKey, StartsFullAndDecidesWithTheWholeAnswer) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(this->slowConfig(5)));
  const std::int64_t before = serverTimeUs(this->admin());
  const Decision d = rl.decide(2);
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

  const Decision denied = rl.decide(4);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 3);
  EXPECT_GT(denied.retryAfter.count(), 0);
  EXPECT_LE(denied.retryAfter.count(), std::chrono::microseconds(this->slowInterval()).count());

  const Decision look = rl.peek(3);
  EXPECT_TRUE(look.allowed);
  EXPECT_EQ(look.remaining, 3) << "peek takes nothing";
  EXPECT_FALSE(rl.peek(4).allowed);
  EXPECT_TRUE(rl.tryAcquire(3));
  EXPECT_FALSE(rl.tryAcquire());
  EXPECT_EQ(rl.peek().remaining, 0);
}

TYPED_TEST(OneKey, TrySetConfigWritesOnlyWhenAbsentAndSetConfigKeepsTheState) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  const auto first = this->slowConfig(4);
  const auto second = TypeParam::config(9, 3, milliseconds(20000), milliseconds(60000));
  EXPECT_FALSE(rl.isExists());
  ASSERT_TRUE(rl.trySetConfig(first));
  EXPECT_TRUE(rl.isExists());
  EXPECT_FALSE(rl.trySetConfig(second)) << "a caller's configuration never overwrites the stored one";
  EXPECT_EQ(rl.getConfig(), first);
  ASSERT_TRUE(rl.tryAcquire(4));
  EXPECT_FALSE(rl.tryAcquire());
  EXPECT_FALSE(rl.trySetConfig(first));
  EXPECT_FALSE(rl.tryAcquire()) << "trySetConfig on an existing limiter leaves its state alone";

  rl.setConfig(second);
  EXPECT_EQ(rl.getConfig(), second);
  EXPECT_FALSE(rl.decide(9).allowed) << "setConfig keeps the 4 permits in use";
  const Decision d = rl.decide(5);
  EXPECT_TRUE(d.allowed) << "9 - 4 in use";
  EXPECT_EQ(d.limit, 9);

  // Another handle sees the stored configuration, whatever it was built for.
  typename TypeParam::Limiter other(this->newClient(), this->name());
  EXPECT_EQ(other.getConfig(), second);
}

TYPED_TEST(OneKey, ConfigRaceBetweenTwoWritersLeavesExactlyOne) {
  auto c1 = this->newClient();
  auto c2 = this->newClient();
  const auto a = TypeParam::config(7, 7, milliseconds(1000));
  const auto b = TypeParam::config(11, 5, milliseconds(3000), milliseconds(5000));
  for (int round = 0; round < 25; ++round) {
    const std::string n = this->name("race" + std::to_string(round));
    typename TypeParam::Limiter l1(c1, n), l2(c2, n);
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    auto f1 = std::async(std::launch::async, [&] {
      start.wait();
      return l1.trySetConfig(a);
    });
    auto f2 = std::async(std::launch::async, [&] {
      start.wait();
      return l2.trySetConfig(b);
    });
    go.set_value();
    const bool won1 = f1.get(), won2 = f2.get();
    ASSERT_NE(won1, won2) << "exactly one writer wins, round " << round;
    const auto stored = l1.getConfig();
    EXPECT_EQ(stored, won1 ? a : b);
    EXPECT_EQ(l2.getConfig(), stored);
    EXPECT_EQ(l1.decide().limit, TypeParam::limitOf(stored));
  }
}

TYPED_TEST(OneKey, MissingConfigurationIsNotInitializedNamingTheKey) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  for (int call = 0; call < 4; ++call) {
    try {
      switch (call) {
        case 0:
          (void)rl.decide();
          break;
        case 1:
          (void)rl.peek();
          break;
        case 2:
          (void)rl.getConfig();
          break;
        default:
          rl.refund(1);
          break;
      }
      ADD_FAILURE() << "call " << call << " succeeded without a configuration";
    } catch (const NotInitializedError& e) {
      EXPECT_NE(std::string(e.what()).find(this->name()), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(exists(this->admin(), this->name())) << "nothing written";
  EXPECT_FALSE(rl.deleteLimiter());
}

TYPED_TEST(OneKey, KeyOfAnotherTypeIsATypedErrorAndNothingIsWritten) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  (void)this->raw({"HSET", this->name(), "rate", "10"});
  const std::string before = keyState(this->admin(), this->name());
  auto expectConfigError = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " succeeded on a hash";
    } catch (const InvalidConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(this->name()), std::string::npos) << e.what();
    }
  };
  expectConfigError([&] { (void)rl.decide(); }, "decide");
  // The fast path of take reads the key with redis.call: Redis's WRONGTYPE, named by the limiter.
  try {
    (void)rl.decide();
  } catch (const InvalidConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds another Redis type"), std::string::npos) << e.what();
  }
  expectConfigError([&] { (void)rl.decideAsync(1).get(); }, "decideAsync");
  expectConfigError([&] { (void)rl.tryAcquire(1, std::chrono::milliseconds{50}); }, "tryAcquire with a timeout");
  expectConfigError([&] { (void)rl.peek(); }, "peek");
  expectConfigError([&] { (void)rl.trySetConfig(this->slowConfig(3)); }, "trySetConfig");
  expectConfigError([&] { rl.setConfig(this->slowConfig(3)); }, "setConfig");
  expectConfigError([&] { rl.refund(1); }, "refund");
  EXPECT_EQ(keyState(this->admin(), this->name()), before);

  (void)this->raw({"DEL", this->name()});
  (void)this->raw({"SET", this->name(), "hello"});
  expectConfigError([&] { (void)rl.decide(); }, "decide on a foreign string");
  expectConfigError([&] { rl.setConfig(this->slowConfig(3)); }, "setConfig on a foreign string");
  EXPECT_EQ(this->raw({"GET", this->name()}).str, "hello");
}

TYPED_TEST(OneKey, LimiterOfAnotherKindIsATypedError) {
  // A key written by one kind of limiter is refused by the others: their fields mean other things.
  const std::string n = this->name();
  if (std::is_same_v<TypeParam, FixedWindowTraits>) {
    GcraRateLimiter other(this->client(), n);
    ASSERT_TRUE(other.trySetConfig(GcraTraits::config(5, 5, milliseconds(1000))));
  } else {
    FixedWindowRateLimiter other(this->client(), n);
    ASSERT_TRUE(other.trySetConfig(FixedWindowTraits::config(5, 5, milliseconds(1000))));
  }
  const std::string before = keyState(this->admin(), n);
  typename TypeParam::Limiter rl(this->client(), n);
  EXPECT_THROW((void)rl.decide(), InvalidConfigError);
  EXPECT_THROW((void)rl.trySetConfig(this->slowConfig(3)), InvalidConfigError);
  EXPECT_THROW(rl.setConfig(this->slowConfig(3)), InvalidConfigError);
  EXPECT_EQ(keyState(this->admin(), n), before);
}

TYPED_TEST(OneKey, CorruptedFieldsAreTypedErrorsAndNothingIsWritten) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(this->slowConfig(5)));
  ASSERT_TRUE(rl.tryAcquire(2));
  const std::string good = this->raw({"GET", this->name()}).str;
  ASSERT_EQ(good.size(), 28u);
  auto withBytes = [&](std::size_t at, std::size_t n, unsigned char byte) {
    std::string v = good;
    for (std::size_t i = 0; i < n; ++i) v[at + i] = static_cast<char>(byte);
    (void)detail::command(this->admin(), {"SET", this->name(), v});
    return keyState(this->admin(), this->name());
  };
  // The limit (bytes 1..4) of 0: an unusable configuration.
  std::string before = withBytes(1, 4, 0);
  EXPECT_THROW((void)rl.decide(), InvalidConfigError);
  EXPECT_THROW((void)rl.getConfig(), InvalidConfigError);
  EXPECT_THROW(rl.refund(1), InvalidConfigError);
  EXPECT_EQ(keyState(this->admin(), this->name()), before);
  // The last field (bytes 24..27): for the bucket, a remainder of 2^32-1 units (never below P');
  // for the window, a reserved count of 2^32-1 (above the limit).
  before = withBytes(24, 4, 0xFF);
  EXPECT_THROW((void)rl.decide(), InvalidStateError);
  EXPECT_THROW((void)rl.peek(), InvalidStateError);
  EXPECT_EQ(keyState(this->admin(), this->name()), before);
  // A value of another size.
  (void)detail::command(this->admin(), {"SET", this->name(), good.substr(0, 27)});
  EXPECT_THROW((void)rl.decide(), InvalidConfigError);
  // setConfig repairs a limiter of its own kind.
  (void)detail::command(this->admin(), {"SET", this->name(), good});
  (void)withBytes(24, 4, 0xFF);
  rl.setConfig(this->slowConfig(5));
  EXPECT_TRUE(rl.tryAcquire(5));
}

TYPED_TEST(OneKey, InvalidArgumentsAreRefusedBeforeAnythingIsSent) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(this->slowConfig(5)));
  const std::int64_t calls = commandCalls(this->admin(), "evalsha") + commandCalls(this->admin(), "eval");
  using BadConfig = typename TypeParam::Config;
  const BadConfig bad[] = {
      TypeParam::config(0, 1, milliseconds(1000)),
      TypeParam::config(TypeParam::Limiter::kMaxPermits + 1, 1, milliseconds(1000)),
      TypeParam::config(5, 5, milliseconds(0)),
      TypeParam::config(5, 5, TypeParam::Limiter::kMaxInterval + milliseconds(1)),
      TypeParam::config(5, 5, milliseconds(1000), milliseconds(-1)),
  };
  for (const BadConfig& c : bad) {
    EXPECT_THROW((void)rl.trySetConfig(c), InvalidArgument);
    EXPECT_THROW(rl.setConfig(c), InvalidArgument);
  }
  EXPECT_THROW((void)rl.decide(0), InvalidArgument);
  EXPECT_THROW((void)rl.decide(-1), InvalidArgument);
  EXPECT_THROW((void)rl.tryAcquire(TypeParam::Limiter::kMaxPermits + 1), InvalidArgument);
  EXPECT_THROW((void)rl.peek(0), InvalidArgument);
  EXPECT_THROW(rl.refund(-1), InvalidArgument);
  EXPECT_THROW((void)rl.reserve(1, microseconds(-1)), InvalidArgument);
  EXPECT_THROW((void)rl.decideAsync(0).get(), InvalidArgument);
  EXPECT_EQ(commandCalls(this->admin(), "evalsha") + commandCalls(this->admin(), "eval"), calls) << "nothing sent";
  // More than the limit can ever grant: the script says so (the limit lives in Redis).
  EXPECT_THROW((void)rl.decide(6), InvalidArgument);
  EXPECT_EQ(rl.peek().remaining, 5);
  using L = typename TypeParam::Limiter;
  EXPECT_THROW([&] { L unnamed(this->client(), ""); }(), InvalidArgument);
  EXPECT_THROW([&] { L clientless(nullptr, this->name()); }(), InvalidArgument);
}

TYPED_TEST(OneKey, MemoryUsageIsAtMost100BytesPerKey) {
  // A name of 14 bytes, as a real one might be ("{u:12345678}:x"); longer names cost their length.
  const std::string key = "{o1:" + std::string(1, TypeParam::kKind[0]) + "123456}:m";
  ASSERT_EQ(key.size(), 14u);
  for (const auto keepAlive : {milliseconds(0), milliseconds(60000)}) {
    typename TypeParam::Limiter rl(this->client(), key);
    rl.setConfig(TypeParam::config(TypeParam::Limiter::kMaxPermits, 1000, milliseconds(1000), keepAlive));
    ASSERT_TRUE(rl.tryAcquire(123456));
    (void)rl.reserve(TypeParam::Limiter::kMaxPermits, microseconds(10000000));
    const std::int64_t bytes = this->raw({"MEMORY", "USAGE", key}).asInteger();
    std::printf("MEMORY %s keepAlive=%lld bytes=%lld\n", TypeParam::kWorkerKind,
                static_cast<long long>(keepAlive.count()), static_cast<long long>(bytes));
    EXPECT_LE(bytes, 100);
    EXPECT_TRUE(rl.deleteLimiter());
  }
}

TYPED_TEST(OneKey, AGrantIsOneGetAndOneSetPlusTimeAndRepliesOnePackedString) {
  // The fast path with a TTL to keep (SET ... PX, not SET then PEXPIRE), counted by the server
  // (INFO commandstats counts the commands scripts call). TIME only when no time is given.
  typename TypeParam::Limiter rl(this->client(), this->name());
  rl.setConfig(TypeParam::config(1000000, 1000000, milliseconds(10000), milliseconds(60000)));
  const auto calls = [&] {
    const std::string info = this->raw({"INFO", "commandstats"}).str;
    std::map<std::string, std::int64_t> out;
    for (const char* command : {"get", "set", "time", "pexpire", "pttl", "expire"}) {
      const std::string field = std::string("cmdstat_") + command + ":calls=";
      const auto at = info.find(field);
      out[command] = at == std::string::npos ? 0 : std::stoll(info.substr(at + field.size()));
    }
    return out;
  };
  const std::int64_t now = serverTimeUs(this->admin());
  ASSERT_TRUE(takeReply(this->takeAt(this->name(), now, 1)).allowed);  // the script is loaded
  constexpr int kTakes = 10;
  for (const bool serverClock : {false, true}) {
    const auto before = calls();
    for (int i = 0; i < kTakes; ++i) {
      const Reply r = runOneKey(this->admin(), TypeParam::script(), this->name(),
                                {"take", serverClock ? "" : std::to_string(now), TypeParam::kKind, "1", "0"});
      ASSERT_TRUE(detail::isPackedDecision(r)) << r.describe();
      ASSERT_TRUE(takeReply(r).allowed);
    }
    const auto after = calls();
    EXPECT_EQ(after.at("get") - before.at("get"), kTakes) << "server clock: " << serverClock;
    EXPECT_EQ(after.at("set") - before.at("set"), kTakes) << "server clock: " << serverClock;
    EXPECT_EQ(after.at("time") - before.at("time"), serverClock ? kTakes : 0);
    for (const char* other : {"pexpire", "pttl", "expire"}) EXPECT_EQ(after.at(other), before.at(other)) << other;
  }
}

TYPED_TEST(OneKey, KeepAliveExpiresTheKeyOnlyAfterItIsFullAgain) {
  typename TypeParam::Limiter plain(this->client(), this->name("plain"));
  ASSERT_TRUE(plain.trySetConfig(this->slowConfig(5)));
  ASSERT_TRUE(plain.tryAcquire());
  EXPECT_EQ(this->raw({"PTTL", this->name("plain")}).asInteger(), -1) << "no TTL without keepAlive";

  typename TypeParam::Limiter kept(this->client(), this->name("kept"));
  ASSERT_TRUE(kept.trySetConfig(TypeParam::config(5, 5, milliseconds(10000), milliseconds(30000))));
  const std::int64_t fresh = this->raw({"PTTL", this->name("kept")}).asInteger();
  EXPECT_GT(fresh, 29000);
  EXPECT_LE(fresh, 30000);
  const Decision d = kept.decide(3);
  ASSERT_TRUE(d.allowed);
  const std::int64_t ttl = this->raw({"PTTL", this->name("kept")}).asInteger();
  const std::int64_t resetMs = (d.resetAfter.count() + 999) / 1000;
  EXPECT_GT(ttl, 30000 + resetMs - 1000);
  EXPECT_LE(ttl, 30000 + resetMs);

  // A short keepAlive: the idle limiter vanishes, configuration included.
  typename TypeParam::Limiter brief(this->client(), this->name("brief"));
  ASSERT_TRUE(brief.trySetConfig(TypeParam::config(2, 2, milliseconds(20), milliseconds(30))));
  ASSERT_TRUE(brief.tryAcquire());
  for (int i = 0; i < 100 && brief.isExists(); ++i) sleepMs(10);
  EXPECT_FALSE(brief.isExists());
  EXPECT_THROW((void)brief.decide(), NotInitializedError);
}

TYPED_TEST(OneKey, RefundGivesPermitsBackUpToFull) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(this->slowConfig(5)));
  ASSERT_TRUE(rl.tryAcquire(4));
  EXPECT_EQ(rl.peek().remaining, 1);
  rl.refund(2);
  EXPECT_EQ(rl.peek().remaining, 3);
  rl.refund(0);
  EXPECT_EQ(rl.peek().remaining, 3);
  rl.refund(TypeParam::Limiter::kMaxPermits);
  EXPECT_EQ(rl.peek().remaining, 5) << "never more than full";
  EXPECT_TRUE(rl.tryAcquire(5));
  EXPECT_FALSE(rl.tryAcquire());
}

TYPED_TEST(OneKey, DeleteLimiterRemovesConfigurationAndState) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(this->slowConfig(5)));
  EXPECT_TRUE(rl.deleteLimiter());
  EXPECT_FALSE(rl.deleteLimiter());
  EXPECT_THROW((void)rl.decide(), NotInitializedError);
  EXPECT_TRUE(rl.trySetConfig(this->slowConfig(5)));
}

TYPED_TEST(OneKey, AsyncFormsDecideLikeTheSyncOnes) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(this->slowConfig(4)));
  const Decision first = rl.decideAsync(2).get();
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 2);
  EXPECT_GT(first.time.count(), 0);
  EXPECT_TRUE(rl.tryAcquireAsync(1).get());
  std::promise<std::pair<Decision, std::exception_ptr>> got;
  rl.decideAsync(2, [&](Decision d, const std::exception_ptr& error) { got.set_value({d, error}); });
  const auto [denied, error] = got.get_future().get();
  EXPECT_FALSE(error);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 1);
  EXPECT_GT(denied.retryAfter.count(), 0);
  std::promise<std::exception_ptr> bad;
  rl.tryAcquireAsync(0, [&](bool, const std::exception_ptr& e) { bad.set_value(e); });
  EXPECT_THROW(std::rethrow_exception(bad.get_future().get()), InvalidArgument);
  // Many in flight from one thread.
  std::vector<std::future<bool>> many;
  for (int i = 0; i < 50; ++i) many.push_back(rl.tryAcquireAsync(1));
  int granted = 0;
  for (auto& f : many) granted += f.get() ? 1 : 0;
  EXPECT_EQ(granted, 1);
}

TYPED_TEST(OneKey, RetryAfterIsExactToTheMicrosecond) {
  // A 20 ms interval of 4 permits: after 4 are taken, retryAfter says exactly when the next can
  // be. The script is asked at chosen server times (its `now` argument): 1 ms and 1 µs before the
  // retry time the permit is refused, at it granted.
  const std::string n = this->name();
  typename TypeParam::Limiter rl(this->client(), n);
  ASSERT_TRUE(rl.trySetConfig(TypeParam::config(4, 4, milliseconds(20))));
  for (int round = 0; round < 5; ++round) {
    // A fresh limiter each round: the last round took at a time ahead of the server's clock, and
    // five such rounds in a row would be a clock step back (clamped: lua/lib/gcra_core.lua).
    (void)rl.deleteLimiter();
    ASSERT_TRUE(rl.trySetConfig(TypeParam::config(4, 4, milliseconds(20))));
    Decision d;
    for (int i = 0; i < 1000 && (d = rl.decide(round % 2 + 1)).allowed; ++i) {
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

TYPED_TEST(OneKey, WaitingTheReturnedRetryAfterSucceeds) {
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(TypeParam::config(3, 3, milliseconds(60))));
  for (int round = 0; round < 3; ++round) {
    Decision d;
    while ((d = rl.decide()).allowed) {
    }
    std::this_thread::sleep_for(d.retryAfter);
    EXPECT_TRUE(rl.tryAcquire()) << "round " << round << ": waited " << d.retryAfter.count() << " us";
  }
}

TYPED_TEST(OneKey, TryAcquireWithTimeoutReservesWhenTheWaitFits) {
  // A timeout shorter than the wait: false at once, nothing taken. An hour-long interval, so that
  // the wait cannot run out between the peek and the call on a loaded machine (a 100 ms one did,
  // under ASan with 4 tests at a time: the permit was due by then, and was rightly granted).
  typename TypeParam::Limiter slow(this->client(), this->name("slow"));
  ASSERT_TRUE(slow.trySetConfig(TypeParam::config(2, 2, milliseconds(3'600'000))));
  ASSERT_TRUE(slow.tryAcquire(2));
  const Decision full = slow.peek();
  if (!full.allowed && full.retryAfter > milliseconds(10'000)) {  // a fixed window may be about to end
    EXPECT_FALSE(slow.tryAcquire(1, milliseconds(1)));
    EXPECT_LE(slow.peek().retryAfter.count(), full.retryAfter.count()) << "nothing reserved";
  }
  // A timeout the wait fits in: it waits for the permit and takes it.
  typename TypeParam::Limiter rl(this->client(), this->name());
  ASSERT_TRUE(rl.trySetConfig(TypeParam::config(2, 2, milliseconds(100))));
  ASSERT_TRUE(rl.tryAcquire(2));
  const Decision denied = rl.peek();  // denied, unless the machine stalled past the wait (then 0)
  EXPECT_TRUE(rl.tryAcquire(1, milliseconds(5000)));
  // It waited for the permit: the call ended no earlier than the permit was due.
  EXPECT_GE(serverTimeUs(this->admin()), denied.time.count() + denied.retryAfter.count());
  // What it reserved is taken: less than 50 ms after the permit was due (less than one refill, the
  // same window), at most the window's second permit is left. Later, a loaded machine may have
  // let more come back: nothing to check then.
  const Decision after = rl.peek();
  if (after.time.count() < denied.time.count() + denied.retryAfter.count() + 50'000) {
    EXPECT_LE(after.remaining, 1);
  }
}

// --- Failure policy: a server that is gone ----------------------------------------------------------

TYPED_TEST(OneKey, UnreachableRedisIsDecidedByThePolicy) {
  for (FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw, FailurePolicy::Local}) {
    SCOPED_TRACE(static_cast<int>(policy));
    RedisServer server;
    auto client = shortTimeoutClient(server);
    typename TypeParam::Options options;
    options.failure.policy = policy;
    options.failure.probeInterval = milliseconds(50);
    std::atomic<int> degraded{0};
    options.failure.onHealthChange = [&](const HealthEvent& e) {
      if (e.kind == HealthEvent::Kind::Degraded) degraded.fetch_add(1);
    };
    typename TypeParam::Limiter rl(client, "policy", options);
    ASSERT_TRUE(rl.trySetConfig(TypeParam::config(3, 3, milliseconds(60000))));
    ASSERT_TRUE(rl.decide().allowed);  // the limiter learns its limit
    server.kill();
    int allowed = 0, denied = 0, thrown = 0;
    for (int i = 0; i < 6; ++i) {
      try {
        const Decision d = rl.decide();
        EXPECT_TRUE(d.byPolicy);
        EXPECT_EQ(d.limit, 3);
        EXPECT_EQ(d.time.count(), 0);
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
    // Async decisions follow the same policy.
    if (policy == FailurePolicy::Allow) {
      EXPECT_TRUE(rl.decideAsync(1).get().byPolicy);
    }
    if (policy == FailurePolicy::Deny) {
      EXPECT_FALSE(rl.tryAcquireAsync(1).get());
    }
    // Queries are not decisions: they report the outage.
    EXPECT_THROW((void)rl.peek(), IoError);
    EXPECT_THROW(rl.refund(1), IoError);
    EXPECT_TRUE(rl.failureStats().degraded);
    EXPECT_EQ(rl.failureStats().outages, 1u);
    EXPECT_EQ(degraded.load(), 1);
    // Back again: the limiter recovers on the next probe.
    server.restart();
    bool configured = false;
    for (int i = 0; i < 100 && !configured; ++i) {
      try {
        configured = rl.trySetConfig(TypeParam::config(3, 3, milliseconds(60000)));
      } catch (const IoError&) {
        sleepMs(10);  // a connection of the pool still went to the killed server
      }
    }
    ASSERT_TRUE(configured);
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
