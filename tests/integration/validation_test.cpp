// Bad input gives its typed error, leaves the keys unchanged, and — when the client can tell on
// its own — sends nothing to Redis. A configuration hash written wrongly by someone else gives
// ScriptError (InvalidConfig); a missing one NotInitializedError.
#include <functional>
#include <limits>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();

class BadInput : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    limiter_ = std::make_unique<RateLimiter>(client(), name());
    limiter_->setRate(RateType::Overall, 10, milliseconds(5000));
    ASSERT_TRUE(limiter_->tryAcquire(3));
    (void)limiter_->getConfig();  // the handle knows the rate
  }
  RateLimiter& rl() { return *limiter_; }

  /// Runs `bad` and checks that it threw InvalidArgument, that no command reached Redis, and that
  /// the limiter's keys are unchanged.
  void expectRejectedLocally(const std::string& what, const std::function<void()>& bad) {
    SCOPED_TRACE(what);
    const auto keysBefore = keyStates(admin(), rl().keys());
    const std::int64_t calibrate = totalCommandCalls(admin());
    const std::int64_t overhead = totalCommandCalls(admin()) - calibrate;  // the INFO itself
    const std::int64_t before = totalCommandCalls(admin());
    EXPECT_THROW(bad(), InvalidArgument);
    EXPECT_EQ(totalCommandCalls(admin()) - before, overhead) << "a command reached Redis";
    EXPECT_EQ(keyStates(admin(), rl().keys()), keysBefore);
  }

 private:
  std::unique_ptr<RateLimiter> limiter_;
};

class CorruptConfig : public RedisTest {
 protected:
  /// Every operation that reads the configuration, each expected to throw an E of kind `kind` and
  /// change nothing.
  template <class E>
  void expectEveryReadFails(ErrorKind kind, RateLimiter& rl) {
    const auto keysBefore = keyStates(admin(), rl.keys());
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { (void)rl.tryAcquire(); }));
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { (void)rl.tryAcquire(2); }));
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { (void)rl.tryAcquire(1, milliseconds(50)); }));
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { rl.acquire(); }));  // must not wait forever either
    EXPECT_TRUE(test::throwsError<E>(
        kind, [&] { (void)redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl, {}, 1, 5); }));
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { (void)rl.availablePermits(); }));
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { rl.release(1); }));
    EXPECT_TRUE(test::throwsError<E>(kind, [&] { (void)rl.getConfig(); }));
    EXPECT_EQ(keyStates(admin(), rl.keys()), keysBefore) << "a failed call changed a key";
  }
};

}  // namespace

TEST_F(BadInput, EmptyNameOrNoClient) {
  const std::int64_t calibrate = totalCommandCalls(admin());
  const std::int64_t overhead = totalCommandCalls(admin()) - calibrate;
  const std::int64_t before = totalCommandCalls(admin());
  EXPECT_THROW(RateLimiter(client(), ""), InvalidArgument);
  EXPECT_THROW(RateLimiter(nullptr, name()), InvalidArgument);
  EXPECT_EQ(totalCommandCalls(admin()) - before, overhead);
}

TEST_F(BadInput, RateOutOfRange) {
  for (std::int64_t rate : {std::int64_t{0}, std::int64_t{-1}, RateLimiter::kMaxRate + 1, kMin64}) {
    const std::string r = std::to_string(rate);
    expectRejectedLocally("trySetRate " + r,
                          [&] { (void)rl().trySetRate(RateType::Overall, rate, milliseconds(1000)); });
    expectRejectedLocally("setRate " + r, [&] { rl().setRate(RateType::Overall, rate, milliseconds(1000)); });
    expectRejectedLocally("setRate keepState " + r,
                          [&] { rl().setRate(RateType::Overall, rate, milliseconds(1000), milliseconds(0), true); });
    expectRejectedLocally("updateRate " + r,
                          [&] { (void)rl().updateRate(RateType::Overall, rate, milliseconds(1000)); });
  }
  // The bounds themselves are accepted.
  RateLimiter big(client(), name("max"));
  EXPECT_TRUE(big.trySetRate(RateType::Overall, RateLimiter::kMaxRate, milliseconds(1000)));
  EXPECT_TRUE(big.tryAcquire(RateLimiter::kMaxRate));
  EXPECT_EQ(unpackMember(entries(admin(), big.keys()[3]).at(0).member).permits, 4294967295u);
  RateLimiter one(client(), name("one"));
  EXPECT_TRUE(one.trySetRate(RateType::Overall, 1, milliseconds(1000)));
}

TEST_F(BadInput, IntervalOutOfRange) {
  for (milliseconds interval :
       {milliseconds(0), milliseconds(-1), RateLimiter::kMaxInterval + milliseconds(1), milliseconds(kMin64)}) {
    const std::string i = std::to_string(interval.count());
    expectRejectedLocally("trySetRate " + i, [&] { (void)rl().trySetRate(RateType::Overall, 5, interval); });
    expectRejectedLocally("setRate " + i, [&] { rl().setRate(RateType::Overall, 5, interval); });
    expectRejectedLocally("updateRate " + i, [&] { (void)rl().updateRate(RateType::PerClient, 5, interval); });
  }
  RateLimiter longest(client(), name("max"));
  EXPECT_TRUE(longest.trySetRate(RateType::Overall, 5, RateLimiter::kMaxInterval));
  EXPECT_EQ(longest.getConfig().rateInterval, RateLimiter::kMaxInterval);
  EXPECT_TRUE(longest.tryAcquire());
}

TEST_F(BadInput, KeepAliveShorterThanIntervalOrTooLong) {
  for (milliseconds keep : {milliseconds(1), milliseconds(4999), milliseconds(-1), milliseconds(kMin64),
                            RateLimiter::kMaxInterval + milliseconds(1)}) {
    const std::string k = std::to_string(keep.count());
    expectRejectedLocally("trySetRate " + k,
                          [&] { (void)rl().trySetRate(RateType::Overall, 5, milliseconds(5000), keep); });
    expectRejectedLocally("setRate " + k, [&] { rl().setRate(RateType::Overall, 5, milliseconds(5000), keep); });
    expectRejectedLocally("updateRate " + k,
                          [&] { (void)rl().updateRate(RateType::Overall, 5, milliseconds(5000), keep); });
  }
}

TEST_F(BadInput, PermitsOutOfRange) {
  // 11 > rate 10 is not among them: the rate may have been raised elsewhere, so the script decides
  // (RateLimiterVsRedisson.PermitsAboveTheRateAreRejected).
  for (std::int64_t permits : {std::int64_t{0}, std::int64_t{-3}, RateLimiter::kMaxRate + 1, kMin64}) {
    const std::string p = std::to_string(permits);
    expectRejectedLocally("tryAcquire " + p, [&] { (void)rl().tryAcquire(permits); });
    expectRejectedLocally("tryAcquire timeout " + p, [&] { (void)rl().tryAcquire(permits, milliseconds(100)); });
    expectRejectedLocally("acquire " + p, [&] { rl().acquire(permits); });
    expectRejectedLocally("tryAcquireUpTo " + p, [&] {
      (void)redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl(), {}, permits, permits);
    });
  }
  expectRejectedLocally("tryAcquireUpTo atMost < atLeast",
                        [&] { (void)redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl(), {}, 3, 2); });
  expectRejectedLocally("release -1", [&] { rl().release(-1); });
  expectRejectedLocally("releaseGrant without member",
                        [&] { (void)redlimit::detail::SegmentAccess<RateLimiter>::releaseGrant(rl(), "", 1); });
}

TEST_F(BadInput, TtlAndTypeOutOfRange) {
  expectRejectedLocally("expire 0", [&] { (void)rl().expire(milliseconds(0)); });
  expectRejectedLocally("expire -5", [&] { (void)rl().expire(milliseconds(-5)); });
  expectRejectedLocally("expireAt epoch", [&] { (void)rl().expireAt(std::chrono::system_clock::time_point{}); });
  expectRejectedLocally("unknown RateType", [&] { rl().setRate(static_cast<RateType>(7), 5, milliseconds(1000)); });
}

TEST_F(CorruptConfig, TypeIsNotZeroOrOne) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::Overall, 10, milliseconds(5000));
  ASSERT_TRUE(rl.tryAcquire(2));
  (void)raw({"HSET", name(), "type", "x"});
  expectEveryReadFails<ScriptError>(ErrorKind::InvalidConfig, rl);
  (void)raw({"HSET", name(), "type", "2"});
  expectEveryReadFails<ScriptError>(ErrorKind::InvalidConfig, rl);
  // Writing a new configuration repairs it.
  rl.setRate(RateType::Overall, 10, milliseconds(5000));
  EXPECT_TRUE(rl.tryAcquire());
}

TEST_F(CorruptConfig, RateIsNotAUsableNumber) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::Overall, 10, milliseconds(5000));
  ASSERT_TRUE(rl.tryAcquire(2));
  for (const char* rate : {"abc", "0", "-5", "1.5", "4294967296", "", "1e14", "nan"}) {
    SCOPED_TRACE(std::string("rate=\"") + rate + "\"");
    (void)raw({"HSET", name(), "rate", rate});
    expectEveryReadFails<ScriptError>(ErrorKind::InvalidConfig, rl);
  }
}

// A field that Lua's tonumber reads as an integer (what Redisson's scripts read too) is that
// integer, for every script and for getConfig().
TEST_F(CorruptConfig, FieldsAreReadAsLuaReadsThem) {
  RateLimiter::Options o;
  o.denyCacheKeys = 0;  // the state is reset by hand below: every call must reach Redis
  RateLimiter rl(client(), name(), o);
  rl.setRate(RateType::Overall, 10, milliseconds(5000));
  for (const char* rate : {" 3", "3 ", "3e0", "0x3", "+3", "03", "3.0"}) {
    SCOPED_TRACE(std::string("rate=\"") + rate + "\"");
    (void)raw({"DEL", rl.keys()[1], rl.keys()[3]});
    (void)raw({"HSET", name(), "rate", rate});
    EXPECT_EQ(rl.getConfig().rate, 3);
    EXPECT_EQ(rl.availablePermits(), 3);
    EXPECT_TRUE(rl.tryAcquire(3));
    EXPECT_FALSE(rl.tryAcquire());
    EXPECT_THROW((void)rl.tryAcquire(4), InvalidArgument);
  }
}

TEST_F(CorruptConfig, IntervalMissingOrUnusable) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::PerClient, 10, milliseconds(5000));
  ASSERT_TRUE(rl.tryAcquire(2));
  (void)raw({"HDEL", name(), "interval"});
  expectEveryReadFails<ScriptError>(ErrorKind::InvalidConfig, rl);
  for (const char* interval : {"0", "soon", "1000000000001"}) {
    SCOPED_TRACE(std::string("interval=\"") + interval + "\"");
    (void)raw({"HSET", name(), "interval", interval});
    expectEveryReadFails<ScriptError>(ErrorKind::InvalidConfig, rl);
  }
}

TEST_F(CorruptConfig, KeepAliveTimeNotANumber) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::Overall, 10, milliseconds(5000));
  (void)raw({"HSET", name(), "keepAliveTime", "forever"});
  expectEveryReadFails<ScriptError>(ErrorKind::InvalidConfig, rl);
}

TEST_F(CorruptConfig, NoHashMeansNotInitialized) {
  RateLimiter rl(client(), name());
  expectEveryReadFails<NotInitializedError>(ErrorKind::NotInitialized, rl);
  EXPECT_TRUE(raw({"KEYS", "*" + name() + "*"}).elements.empty()) << "a failed call created a key";
  // State keys without a hash (the hash expired or was deleted by hand): still not initialized.
  (void)raw({"SET", rl.keys()[1], "3"});
  expectEveryReadFails<NotInitializedError>(ErrorKind::NotInitialized, rl);
  EXPECT_FALSE(rl.isExists());
  EXPECT_EQ(rl.remainTimeToLive(), milliseconds(-2));
}

TEST_F(CorruptConfig, NotInitializedSaysWhichCallInitialisesTheLimiter) {
  RateLimiter rl(client(), name());
  const auto says = [](const std::string& message) {
    EXPECT_EQ(message.rfind("redlimit: RateLimiter ", 0), 0U) << message;
    EXPECT_NE(message.find("call trySetRate() or setRate() first"), std::string::npos) << message;
  };
  says(test::messageOfError<NotInitializedError>(ErrorKind::NotInitialized, [&] { (void)rl.tryAcquire(); }));
  says(test::messageOfError<NotInitializedError>(ErrorKind::NotInitialized, [&] { (void)rl.availablePermits(); }));
  says(test::messageOfError<NotInitializedError>(ErrorKind::NotInitialized, [&] { (void)rl.getConfig(); }));
  // A Limiter's stored policy says its own call, with the same prefix.
  Limiter stored(client(), limiterName("stored"), Policy::perSecond(5).stored());
  const std::string message =
      test::messageOfError<NotInitializedError>(ErrorKind::NotInitialized, [&] { (void)stored.decide("k"); });
  EXPECT_EQ(message.rfind("redlimit: ", 0), 0U) << message;
  EXPECT_NE(message.find("trySetPolicy"), std::string::npos) << message;
}

TEST_F(CorruptConfig, ConfigKeyOfTheWrongTypeIsAReplyError) {
  RateLimiter rl(client(), name());
  (void)raw({"SET", name(), "not a hash"});
  EXPECT_THROW((void)rl.tryAcquire(), ReplyError);
  EXPECT_THROW((void)rl.getConfig(), ReplyError);
  EXPECT_EQ(raw({"GET", name()}).str, "not a hash");
}
