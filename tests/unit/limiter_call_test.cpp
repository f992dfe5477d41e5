// One limiter call's protocol (the gate, the deadline, the resend rule, the policy's decision), on
// a manual clock, without a server: the events a driver would feed it and the actions it answers.
#include <chrono>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "limiters/limiter_call.hpp"
#include "redlimit/clock.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/monitor.hpp"

using namespace redlimit;
using detail::FailureGate;
using detail::LimiterCall;
using Kind = LimiterCall::Action::Kind;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

struct Fixture {
  ManualClock clock{microseconds(5000000)};
  std::vector<HealthEvent> events;
  FailureGate gate;

  explicit Fixture(FailurePolicy policy) : gate("calls", options(policy), ClockView(clock)) {}
  FailureOptions options(FailurePolicy policy) {
    FailureOptions o;
    o.policy = policy;
    o.probeInterval = milliseconds(100);
    o.onHealthChange = [this](const HealthEvent& e) { events.push_back(e); };
    return o;
  }
  static LimiterCall::Params decision(LimiterCall::Resend resend = LimiterCall::Resend::IfClosed) {
    LimiterCall::Params p;
    p.guard = LimiterCall::Guard::Decision;
    p.resend = resend;
    p.bound = milliseconds(300);
    return p;
  }
};

// A call of `params` on `f`'s gate, started: its first action was Send.
LimiterCall sent(Fixture& f, const LimiterCall::Params& params = Fixture::decision()) {
  LimiterCall call(f.gate, params);
  EXPECT_EQ(call.start().kind, Kind::Send);
  return call;
}

std::exception_ptr closed() { return std::make_exception_ptr(ClosedError("connection closed")); }

// A limiter's core as runAsync sees it: the gate, and a Client (its pool sets the tries; nothing is sent on it).
struct GateOwner {
  FailureGate& gate_;
  std::shared_ptr<Client> client_ = Client::create();
};

// What the callback of an async call had.
struct Answers {
  int count = 0;
  std::exception_ptr error;
};

// An async Decision on `f`'s gate whose tries `send(completion)` sends.
template <class Send>
Answers runAsyncCall(Fixture& f, Send send) {
  Answers answers;
  const auto owner = std::make_shared<GateOwner>(GateOwner{f.gate});
  detail::runAsync<int>(
      owner, Fixture::decision(),
      [send](GateOwner&, std::chrono::steady_clock::time_point, auto&& sent) { send(sent); },
      [](std::exception_ptr error) { return error; }, [](GateOwner*, const detail::Reply&) { return 1; },
      [](GateOwner&, bool allowed) { return allowed ? 2 : 3; },
      [&answers](int, std::exception_ptr error) {
        ++answers.count;
        answers.error = std::move(error);
      });
  return answers;
}

}  // namespace

TEST(LimiterCall, AnsweredCallIsSentOnceAndLeavesTheGateHealthy) {
  Fixture f(FailurePolicy::Throw);
  LimiterCall call(f.gate, Fixture::decision());
  const LimiterCall::Action a = call.start();
  ASSERT_EQ(a.kind, Kind::Send);
  EXPECT_EQ(a.budget, milliseconds(300));
  EXPECT_EQ(call.replied().kind, Kind::Answer);
  EXPECT_EQ(call.tries(), 1);
  EXPECT_TRUE(f.events.empty());
}

TEST(LimiterCall, ClosedConnectionIsResentWithinTheDeadline) {
  Fixture f(FailurePolicy::Allow);
  LimiterCall call = sent(f);
  f.clock.advance(milliseconds(100));
  const LimiterCall::Action again = call.failed(closed());
  ASSERT_EQ(again.kind, Kind::Send);
  EXPECT_EQ(again.budget, milliseconds(200));  // what is left of the call's deadline
  EXPECT_EQ(call.replied().kind, Kind::Answer);
  EXPECT_EQ(call.tries(), 2);
  // Not an outage: nothing decided by the policy, no health event, the gate still sends.
  EXPECT_TRUE(f.events.empty());
  EXPECT_EQ(f.gate.stats().outages, 0u);
  EXPECT_EQ(f.gate.stats().allowed, 0u);
  EXPECT_TRUE(f.gate.shouldTry());
}

// A sender that takes it learns which tries are resends (a take resent under its id must find a
// grant already made, not take again): the first is not, every later one is.
TEST(LimiterCall, EveryTryButTheFirstIsMarkedAResend) {
  Fixture f(FailurePolicy::Throw);
  LimiterCall call(f.gate, Fixture::decision());
  const LimiterCall::Action first = call.start();
  ASSERT_EQ(first.kind, Kind::Send);
  EXPECT_FALSE(first.resend);
  for (int i = 1; i < LimiterCall::kMinTries; ++i) {
    const LimiterCall::Action again = call.failed(closed());
    ASSERT_EQ(again.kind, Kind::Send);
    EXPECT_TRUE(again.resend) << "try " << i + 1;
  }
}

TEST(LimiterCall, ResendFlagReachesOnlyASenderThatTakesIt) {
  int plain = 0;
  bool seen = false;
  auto withoutFlag = [&](int deadline) { plain = deadline; };
  auto withFlag = [&](int deadline, bool resend) {
    plain = deadline;
    seen = resend;
  };
  detail::callMaybeWith(withoutFlag, true, 7);
  EXPECT_EQ(plain, 7);
  detail::callMaybeWith(withFlag, true, 8);
  EXPECT_EQ(plain, 8);
  EXPECT_TRUE(seen);
  detail::callMaybeWith(withFlag, false, 9);
  EXPECT_FALSE(seen);
}

TEST(LimiterCall, ClosedConnectionIsNotResentPastTheDeadline) {
  Fixture f(FailurePolicy::Deny);
  LimiterCall call = sent(f);
  f.clock.advance(milliseconds(300));
  const LimiterCall::Action a = call.failed(closed());
  ASSERT_EQ(a.kind, Kind::Decide);  // now it is an outage, decided by the policy
  EXPECT_FALSE(a.allowed);
  EXPECT_EQ(call.tries(), 1);
  EXPECT_TRUE(f.gate.stats().degraded);
}

TEST(LimiterCall, ClosedConnectionIsSentAtMostTheTriesTheCallWasGiven) {
  for (const int tries : {LimiterCall::kMinTries, 9}) {
    SCOPED_TRACE(tries);
    Fixture f(FailurePolicy::Throw);
    LimiterCall call(f.gate, Fixture::decision(), tries);
    ASSERT_EQ(call.start().kind, Kind::Send);
    for (int i = 1; i < tries; ++i) ASSERT_EQ(call.failed(closed()).kind, Kind::Send);
    const LimiterCall::Action a = call.failed(closed());
    ASSERT_EQ(a.kind, Kind::Fail);
    EXPECT_EQ(call.tries(), tries);
    EXPECT_THROW(std::rethrow_exception(a.error), ClosedError);
    ASSERT_EQ(f.events.size(), 1u);
    EXPECT_EQ(f.events[0].kind, HealthEvent::Kind::Degraded);
  }
}

// Every connection of the pool may close under one call (a CLIENT KILL walks them), so a call is
// given one try per connection and one more; a small pool keeps the floor.
TEST(LimiterCall, ACallIsGivenATryPerConnectionOfItsPoolAndOneMore) {
  for (const auto& [size, tries] : std::vector<std::pair<std::size_t, int>>{{1, 5}, {4, 5}, {8, 9}, {64, 65}}) {
    ClientOptions o;
    o.pool.size = size;
    EXPECT_EQ(LimiterCall::triesOf(*Client::create(o)), tries) << "pool of " << size;
  }
}

TEST(LimiterCall, NeverResentCallFailsAtTheFirstClosedConnection) {
  Fixture f(FailurePolicy::Throw);
  LimiterCall::Params p;
  p.resend = LimiterCall::Resend::Never;
  p.bound = milliseconds(300);
  LimiterCall call = sent(f, p);
  const LimiterCall::Action a = call.failed(closed());
  ASSERT_EQ(a.kind, Kind::Fail);
  EXPECT_THROW(std::rethrow_exception(a.error), ClosedError);
  EXPECT_TRUE(f.events.empty());  // a plain call does not report to the gate
}

TEST(LimiterCall, OtherErrorsAreNotResent) {
  Fixture f(FailurePolicy::Allow);
  LimiterCall call = sent(f);
  const LimiterCall::Action a = call.failed(std::make_exception_ptr(TimeoutError("no reply in time")));
  ASSERT_EQ(a.kind, Kind::Decide);
  EXPECT_TRUE(a.allowed);
  EXPECT_EQ(call.tries(), 1);
}

TEST(LimiterCall, OutageUnderAllowIsDecidedByThePolicy) {
  Fixture f(FailurePolicy::Allow);
  {
    LimiterCall call = sent(f);
    const LimiterCall::Action a = call.failed(std::make_exception_ptr(IoError("refused")));
    ASSERT_EQ(a.kind, Kind::Decide);
    EXPECT_TRUE(a.allowed);
  }
  // Degraded: the next call is decided without sending, until the probe interval passed.
  LimiterCall held(f.gate, Fixture::decision());
  const LimiterCall::Action a = held.start();
  ASSERT_EQ(a.kind, Kind::Decide);
  EXPECT_TRUE(a.allowed);
  EXPECT_EQ(held.tries(), 0);
  EXPECT_EQ(f.gate.stats().allowed, 2u);
  f.clock.advance(milliseconds(100));
  LimiterCall probe = sent(f);
  EXPECT_EQ(probe.replied().kind, Kind::Answer);
  ASSERT_EQ(f.events.size(), 2u);
  EXPECT_EQ(f.events[1].kind, HealthEvent::Kind::Recovered);
}

TEST(LimiterCall, OutageUnderThrowFailsWithTheGatesErrorWithoutSending) {
  Fixture f(FailurePolicy::Throw);
  f.gate.failed(IoError("refused"), f.clock.now().count());
  LimiterCall call(f.gate, Fixture::decision());
  const LimiterCall::Action a = call.start();
  ASSERT_EQ(a.kind, Kind::Fail);
  EXPECT_EQ(call.tries(), 0);
  EXPECT_THROW(std::rethrow_exception(a.error), IoError);
}

TEST(LimiterCall, AnswerFromRedisThatIsAnErrorReachesTheCallerUnderEveryPolicy) {
  Fixture f(FailurePolicy::Allow);
  LimiterCall call = sent(f);
  const LimiterCall::Action a = call.failed(std::make_exception_ptr(InvalidArgument("permits above the burst")));
  ASSERT_EQ(a.kind, Kind::Fail);
  EXPECT_THROW(std::rethrow_exception(a.error), InvalidArgument);
  EXPECT_FALSE(f.gate.stats().degraded);
}

TEST(LimiterCall, PlainCallIgnoresTheGate) {
  Fixture f(FailurePolicy::Deny);
  f.gate.failed(IoError("refused"), f.clock.now().count());
  LimiterCall::Params p;
  p.bound = milliseconds(300);
  LimiterCall call = sent(f, p);  // sent although the gate holds decisions back
  const LimiterCall::Action a = call.failed(std::make_exception_ptr(IoError("refused")));
  ASSERT_EQ(a.kind, Kind::Fail);  // not decided by the policy
  EXPECT_EQ(f.gate.stats().denied, 0u);
}

TEST(LimiterCall, AsyncCallWhoseResendCannotBeQueuedAnswersOnceWithThatError) {
  Fixture f(FailurePolicy::Allow);
  int tries = 0;
  const Answers answers = runAsyncCall(f, [&](auto& sent) {
    if (++tries == 1) return sent(detail::Reply{}, closed());  // the connection closed under the first try
    throw ClosedError("the resend could not be queued");
  });
  EXPECT_EQ(tries, 2);
  ASSERT_EQ(answers.count, 1);
  EXPECT_THROW(std::rethrow_exception(answers.error), ClosedError);
}

TEST(LimiterCall, AsyncCallWhoseFirstTryCannotBeQueuedAnswersWithThatErrorNotAThrow) {
  Fixture f(FailurePolicy::Allow);
  Answers answers;
  EXPECT_NO_THROW(answers = runAsyncCall(f, [](auto&) -> void { throw InvalidArgument("could not be queued"); }));
  ASSERT_EQ(answers.count, 1);
  EXPECT_THROW(std::rethrow_exception(answers.error), InvalidArgument);
}

// The reader of an async call may take the owner's monitor (to count its result): it is the
// owner's even when the reply comes after the owner was dropped (the reader's owner is null).
TEST(LimiterCall, AsyncReaderThatTakesTheMonitorGetsTheOwnersAfterTheOwnerIsGone) {
  LimiterMonitor::Options o;
  o.registry = std::make_shared<MetricsRegistry>();
  FailureGate gate("calls", FailureOptions{}, ClockView{}, LimiterMonitor("calls", o));
  auto owner = std::make_shared<GateOwner>(GateOwner{gate});
  detail::ReplyCallback reply;
  bool readWithOwner = true;
  const LimiterMetrics* readWith = nullptr;
  int answers = 0;
  detail::runAsync<int>(
      owner, LimiterCall::plain(milliseconds(300)),
      [&reply](GateOwner&, std::chrono::steady_clock::time_point, auto&& sent) { reply = std::move(sent); },
      [](std::exception_ptr error) { return error; },
      [&](GateOwner* self, const detail::Reply&, const LimiterMonitor& monitor) {
        readWithOwner = self != nullptr;
        readWith = monitor.metrics();
        return 1;
      },
      [](GateOwner&, bool) { return 0; }, [&answers](int, const std::exception_ptr&) { ++answers; });
  owner.reset();
  reply(detail::Reply{}, nullptr);
  EXPECT_FALSE(readWithOwner);
  ASSERT_NE(readWith, nullptr);
  EXPECT_EQ(readWith, gate.monitor().metrics());
  EXPECT_EQ(answers, 1);
}
