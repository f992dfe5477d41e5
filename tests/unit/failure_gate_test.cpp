// The failure gate's state machine and the Local policy's bucket, on a manual clock.
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/clock.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit_test/raise_counter.hpp"

using namespace redlimit;
using detail::FailureGate;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

ManualClock clock_{microseconds(1000000)};
std::int64_t manualNow() { return clock_.now().count(); }

struct Recorder {
  std::vector<HealthEvent> events;
  FailureOptions options(FailurePolicy policy, double share = 1.0) {
    FailureOptions o;
    o.policy = policy;
    o.localShare = share;
    o.probeInterval = milliseconds(100);
    o.onHealthChange = [this](const HealthEvent& e) { events.push_back(e); };
    return o;
  }
};

}  // namespace

TEST(FailureGate, HealthyGateAlwaysTries) {
  Recorder r;
  FailureGate gate("g", r.options(FailurePolicy::Throw), ClockView(clock_));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(gate.shouldTry());
  gate.succeeded();
  EXPECT_TRUE(r.events.empty());
  EXPECT_FALSE(gate.stats().degraded);
}

TEST(FailureGate, OneProbePerIntervalWhileDegradedAndEventsFireOnce) {
  Recorder r;
  FailureGate gate("g", r.options(FailurePolicy::Deny), ClockView(clock_));
  gate.failed(IoError("refused"), manualNow());
  gate.failed(IoError("refused again"), manualNow());
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].kind, HealthEvent::Kind::Degraded);
  EXPECT_EQ(r.events[0].error, "refused");
  EXPECT_FALSE(gate.shouldTry());
  clock_.advance(milliseconds(99));
  EXPECT_FALSE(gate.shouldTry());
  clock_.advance(milliseconds(1));
  EXPECT_TRUE(gate.shouldTry());   // the probe
  EXPECT_FALSE(gate.shouldTry());  // everyone else waits for the next interval
  clock_.advance(milliseconds(100));
  EXPECT_TRUE(gate.shouldTry());
  clock_.advance(milliseconds(30));
  gate.succeeded();
  gate.succeeded();
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[1].kind, HealthEvent::Kind::Recovered);
  EXPECT_EQ(r.events[1].outage, milliseconds(230));
  EXPECT_TRUE(gate.shouldTry());
  EXPECT_EQ(gate.stats().outages, 1u);
}

TEST(FailureGate, AFailureOfACallSentBeforeTheRecoveryIsStale) {
  Recorder r;
  FailureGate gate("g", r.options(FailurePolicy::Deny), ClockView(clock_));
  const std::int64_t early = manualNow();
  gate.failed(IoError("refused"), early);
  clock_.advance(milliseconds(150));
  const std::int64_t sentWhileLoading = manualNow();
  clock_.advance(milliseconds(10));
  ASSERT_TRUE(gate.shouldTry());
  gate.succeeded();  // the probe got through
  clock_.advance(milliseconds(5));
  // The call sent before the recovery now reports LOADING: old news, no new outage.
  gate.failed(IoError(ErrorKind::Unavailable, "LOADING", "loading"), sentWhileLoading);
  EXPECT_FALSE(gate.stats().degraded);
  EXPECT_EQ(r.events.size(), 2u);
  // A call sent after the recovery that fails is a new outage.
  gate.failed(IoError("refused"), manualNow());
  EXPECT_TRUE(gate.stats().degraded);
  EXPECT_EQ(gate.stats().outages, 2u);
}

// A callback that causes a transition (here: a Degraded handler whose retry succeeds) must not
// deadlock, and its event comes after the one being delivered, not inside it.
TEST(FailureGate, ATransitionCausedByACallbackIsReportedAfterTheEventBeingDelivered) {
  std::vector<std::string> trace;
  FailureGate* self = nullptr;
  FailureOptions o;
  o.policy = FailurePolicy::Deny;
  o.onHealthChange = [&](const HealthEvent& e) {
    const std::string kind = e.kind == HealthEvent::Kind::Degraded ? "degraded" : "recovered";
    trace.push_back("enter " + kind);
    if (e.kind == HealthEvent::Kind::Degraded) self->succeeded();
    trace.push_back("leave " + kind);
  };
  FailureGate gate("g", o, ClockView(clock_));
  self = &gate;
  gate.failed(IoError("refused"), manualNow());
  EXPECT_EQ(trace,
            (std::vector<std::string>{"enter degraded", "leave degraded", "enter recovered", "leave recovered"}));
  EXPECT_FALSE(gate.stats().degraded);
}

// Two threads moving the gate back and forth: the events alternate, starting with Degraded, in
// the order the state changed (reported each on its own thread, a Recovered could overtake the
// Degraded before it).
TEST(FailureGate, EventsFromConcurrentTransitionsComeInTheOrderOfTheTransitions) {
  ManualClock clock{microseconds(1000000)};  // never advanced: no failure is stale
  std::mutex m;
  std::vector<HealthEvent::Kind> kinds;
  FailureOptions o;
  o.policy = FailurePolicy::Deny;
  o.onHealthChange = [&](const HealthEvent& e) {
    const std::lock_guard<std::mutex> lock(m);
    kinds.push_back(e.kind);
  };
  FailureGate gate("g", o, ClockView(clock));
  constexpr int kRounds = 20000;
  std::thread failing([&] {
    for (int i = 0; i < kRounds; ++i) gate.failed(IoError("refused"), clock.now().count());
  });
  std::thread succeeding([&] {
    for (int i = 0; i < kRounds; ++i) gate.succeeded();
  });
  failing.join();
  succeeding.join();
  ASSERT_FALSE(kinds.empty());
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    ASSERT_EQ(kinds[i], i % 2 == 0 ? HealthEvent::Kind::Degraded : HealthEvent::Kind::Recovered) << "event " << i;
  }
  EXPECT_EQ(gate.stats().degraded, kinds.size() % 2 == 1);
}

TEST(FailureGate, PoliciesDecideAndCount) {
  Recorder r;
  FailureGate allow("a", r.options(FailurePolicy::Allow), ClockView(clock_));
  FailureGate deny("d", r.options(FailurePolicy::Deny), ClockView(clock_));
  FailureGate thrower("t", r.options(FailurePolicy::Throw), ClockView(clock_));
  EXPECT_EQ(allow.decide(1, 10, milliseconds(1000)), std::optional<bool>(true));
  EXPECT_EQ(deny.decide(1, 10, milliseconds(1000)), std::optional<bool>(false));
  EXPECT_EQ(thrower.decide(1, 10, milliseconds(1000)), std::nullopt);
  EXPECT_EQ(allow.stats().allowed, 1u);
  EXPECT_EQ(deny.stats().denied, 1u);
  EXPECT_EQ(thrower.stats().thrown, 1u);
  thrower.failed(IoError("connection refused"), manualNow());
  try {
    thrower.throwUnavailable();
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("connection refused"), std::string::npos);
  }
}

TEST(FailureGate, LocalBucketHoldsRateTimesShareAndRefillsPerInterval) {
  Recorder r;
  FailureGate gate("l", r.options(FailurePolicy::Local, 0.25), ClockView(clock_));
  // rate 40 per 1 s at share 0.25: 10 at once, then 10 more per second.
  int granted = 0;
  for (int i = 0; i < 30; ++i) granted += *gate.decide(1, 40, milliseconds(1000)) ? 1 : 0;
  EXPECT_EQ(granted, 10);
  clock_.advance(milliseconds(500));
  granted = 0;
  for (int i = 0; i < 30; ++i) granted += *gate.decide(1, 40, milliseconds(1000)) ? 1 : 0;
  EXPECT_EQ(granted, 5);
  clock_.advance(milliseconds(5000));  // never more than the bucket
  granted = 0;
  for (int i = 0; i < 30; ++i) granted += *gate.decide(1, 40, milliseconds(1000)) ? 1 : 0;
  EXPECT_EQ(granted, 10);
  EXPECT_EQ(gate.stats().allowed, 25u);
  EXPECT_EQ(gate.stats().denied, 65u);
}

// The Local bucket is LocalTokenBucket: exact at rates that do not divide the interval (3 per 10
// ms: one permit every 3333.3 µs), and a change of the configuration seen keeps what it holds, up
// to the new capacity.
TEST(FailureGate, LocalBucketIsExactAndKeepsItsPermitsAcrossAConfigChange) {
  Recorder r;
  FailureGate gate("l", r.options(FailurePolicy::Local), ClockView(clock_));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(gate.decide(1, 3, milliseconds(10)), std::optional<bool>(true));
  EXPECT_EQ(gate.decide(1, 3, milliseconds(10)), std::optional<bool>(false));
  clock_.advance(microseconds(3333));
  EXPECT_EQ(gate.decide(1, 3, milliseconds(10)), std::optional<bool>(false)) << "a third of a µs short";
  clock_.advance(microseconds(1));
  EXPECT_EQ(gate.decide(1, 3, milliseconds(10)), std::optional<bool>(true));
  clock_.advance(milliseconds(10));  // full again: 3
  EXPECT_EQ(gate.decide(1, 2, milliseconds(10)), std::optional<bool>(true)) << "kept 3, capped at the new 2";
  EXPECT_EQ(gate.decide(1, 2, milliseconds(10)), std::optional<bool>(true));
  EXPECT_EQ(gate.decide(1, 2, milliseconds(10)), std::optional<bool>(false));
  EXPECT_EQ(gate.decide(3, 100, milliseconds(10)), std::optional<bool>(false)) << "held 0 across the change";
  EXPECT_EQ(gate.decide(101, 100, milliseconds(10)), std::optional<bool>(false)) << "more than the bucket";
}

TEST(FailureGate, LocalRefusesWithoutAKnownConfig) {
  Recorder r;
  FailureGate gate("l", r.options(FailurePolicy::Local), ClockView(clock_));
  EXPECT_EQ(gate.decide(1, 0, milliseconds(0)), std::optional<bool>(false));
}

// A Local gate can be seeded, so a limiter that has not seen a configuration yet (say a
// service that starts while Redis is down) decides with the seed; the configuration seen later
// replaces it.
TEST(FailureGate, LocalUsesItsSeedUntilAConfigIsKnown) {
  Recorder r;
  FailureOptions o = r.options(FailurePolicy::Local, 0.5);
  o.localSeedRate = 8;
  o.localSeedInterval = milliseconds(1000);
  FailureGate gate("l", o, ClockView(clock_));
  int granted = 0;
  for (int i = 0; i < 10; ++i) granted += *gate.decide(1, 0, milliseconds(0)) ? 1 : 0;
  EXPECT_EQ(granted, 4) << "the seed's rate x share";
  // Seen: the bucket becomes 100 per second at share 0.5, keeping what it held (nothing), and
  // refills 5 in 100 ms, where the seed's 4 per second would give 0.4.
  EXPECT_EQ(gate.decide(1, 100, milliseconds(1000)), std::optional<bool>(false));
  clock_.advance(milliseconds(100));
  EXPECT_EQ(gate.decide(5, 100, milliseconds(1000)), std::optional<bool>(true)) << "the configuration seen wins";
  EXPECT_EQ(gate.decide(1, 100, milliseconds(1000)), std::optional<bool>(false));
}

TEST(FailureGate, RejectsBadSeeds) {
  Recorder r;
  FailureOptions o = r.options(FailurePolicy::Local);
  o.localSeedRate = 5;  // without an interval
  EXPECT_THROW(FailureGate("x", o), InvalidArgument);
  o.localSeedRate = 0;
  o.localSeedInterval = milliseconds(1000);  // without a rate
  EXPECT_THROW(FailureGate("x", o), InvalidArgument);
  o.localSeedRate = -1;
  EXPECT_THROW(FailureGate("x", o), InvalidArgument);
  o.localSeedRate = 5;
  o.localSeedInterval = milliseconds(-1);
  EXPECT_THROW(FailureGate("x", o), InvalidArgument);
  o.localSeedInterval = milliseconds(1000);
  o.localSeedRate = 4294967296;  // above a local bucket's capacity
  EXPECT_THROW(FailureGate("x", o), InvalidArgument);
  o.localSeedRate = 4294967295;
  EXPECT_NO_THROW(FailureGate("x", o));
  o.localSeedRate = 0;
  o.localSeedInterval = milliseconds(0);
  EXPECT_NO_THROW(FailureGate("x", o)) << "no seed";
}

TEST(FailureGate, RejectsBadOptions) {
  Recorder r;
  EXPECT_THROW(FailureGate("x", r.options(FailurePolicy::Local, 0.0)), InvalidArgument);
  EXPECT_THROW(FailureGate("x", r.options(FailurePolicy::Local, 1.5)), InvalidArgument);
  FailureOptions o;
  o.probeInterval = milliseconds(0);
  EXPECT_THROW(FailureGate("x", o), InvalidArgument);
}

// A probe interval of milliseconds::max() means "probe as rarely as the clock
// allows", not an overflow into the past (a probe on every call).
TEST(FailureGate, HugeProbeIntervalSaturates) {
  FailureOptions o;
  o.policy = FailurePolicy::Deny;
  o.probeInterval = milliseconds::max();
  FailureGate gate("g", o, ClockView(clock_));
  gate.failed(IoError("refused"), manualNow());
  EXPECT_FALSE(gate.shouldTry());
  clock_.advance(std::chrono::hours(24 * 365));
  EXPECT_FALSE(gate.shouldTry()) << "a year later, still within the interval";
}

// A configuration error is reported once with its cause, gates nothing (every
// call still goes to Redis and throws), and the first success reports the recovery.
TEST(FailureGate, ConfigurationErrorIsReportedOnceWithoutProbeGating) {
  Recorder r;
  FailureGate gate("g", r.options(FailurePolicy::Allow), ClockView(clock_));
  try {
    throw ConfigurationError(ErrorKind::Replica, "READONLY", "READONLY You can't write against a read only replica.");
  } catch (const ConfigurationError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Replica) << e.what();
    gate.misconfigured(e, manualNow());
  }
  gate.misconfigured(ConfigurationError(ErrorKind::Replica, "READONLY", "again"), manualNow());
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].kind, HealthEvent::Kind::Degraded);
  EXPECT_EQ(r.events[0].cause, HealthEvent::Cause::Configuration);
  EXPECT_EQ(r.events[0].errorType, "redlimit::ConfigurationError");
  EXPECT_EQ(r.events[0].errorKind, ErrorKind::Replica);
  ASSERT_TRUE(r.events[0].exception);
  try {
    std::rethrow_exception(r.events[0].exception);
  } catch (const ConfigurationError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Replica) << e.what();
    EXPECT_EQ(e.code(), "READONLY") << "the event carries the error itself, with its type";
  } catch (...) {
    ADD_FAILURE() << "the event's exception lost its type";
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(gate.shouldTry()) << "no probe gating for a configuration error";
  EXPECT_FALSE(gate.stats().degraded);
  EXPECT_TRUE(gate.stats().misconfigured);
  EXPECT_EQ(gate.stats().misconfigurations, 1u);
  EXPECT_EQ(gate.stats().outages, 0u);

  // The cause changes: an outage now (Redis went away): reported again, and gated.
  clock_.advance(milliseconds(10));
  gate.failed(IoError("refused"), manualNow());
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[1].cause, HealthEvent::Cause::Outage);
  EXPECT_EQ(r.events[1].errorType, "redlimit::IoError");
  EXPECT_EQ(r.events[1].errorKind, ErrorKind::Io);
  EXPECT_FALSE(gate.shouldTry());
  // And back to the configuration error on the next probe.
  clock_.advance(milliseconds(100));
  ASSERT_TRUE(gate.shouldTry());
  gate.misconfigured(AuthError("WRONGPASS", "wrong"), manualNow());
  ASSERT_EQ(r.events.size(), 3u);
  EXPECT_EQ(r.events[2].cause, HealthEvent::Cause::Configuration);
  EXPECT_TRUE(gate.shouldTry());

  clock_.advance(milliseconds(20));
  gate.succeeded();
  gate.succeeded();
  ASSERT_EQ(r.events.size(), 4u);
  EXPECT_EQ(r.events[3].kind, HealthEvent::Kind::Recovered);
  EXPECT_EQ(r.events[3].cause, HealthEvent::Cause::Configuration);
  EXPECT_EQ(r.events[3].outage, milliseconds(130)) << "measured from the first Degraded";
  EXPECT_FALSE(gate.stats().misconfigured);
  EXPECT_EQ(gate.stats().allowed + gate.stats().denied, 0u) << "nothing was decided by the policy";
}

// noteError is the one place that says what an error means for health: an exhausted pool nothing,
// another IoError an outage, a configuration or auth error a misconfiguration, any other answer
// from Redis a recovery.
TEST(FailureGate, NoteErrorClassifiesTheError) {
  Recorder r;
  FailureGate gate("g", r.options(FailurePolicy::Deny), ClockView(clock_));
  auto note = [&](auto error) { gate.noteError(std::make_exception_ptr(error), manualNow()); };
  note(TimeoutError(ErrorKind::PoolTimeout, "pool"));
  EXPECT_FALSE(gate.stats().degraded);
  EXPECT_TRUE(r.events.empty());
  note(ClosedError("closed"));
  EXPECT_TRUE(gate.stats().degraded);
  note(ReplyError("ERR", "answered"));
  EXPECT_FALSE(gate.stats().degraded);
  note(AuthError("WRONGPASS", "bad password"));
  EXPECT_TRUE(gate.stats().misconfigured);
  note(ScriptError("ERR", "answered"));
  EXPECT_FALSE(gate.stats().misconfigured);
  note(ConfigurationError(ErrorKind::Replica, "READONLY", "a replica"));
  EXPECT_TRUE(gate.stats().misconfigured);
  ASSERT_EQ(r.events.size(), 5u);  // Degraded, Recovered, Degraded, Recovered, Degraded
  EXPECT_EQ(r.events[0].cause, HealthEvent::Cause::Outage);
  EXPECT_EQ(r.events[2].cause, HealthEvent::Cause::Configuration);
  EXPECT_EQ(r.events[4].cause, HealthEvent::Cause::Configuration);
  EXPECT_EQ(r.events[3].kind, HealthEvent::Kind::Recovered);
}

TEST(FailureGate, SettlingAFailedCompletionRaisesNoException) {
  ASSERT_TRUE(test::canCountRaises()) << "this unwinder's raises cannot be counted: the test cannot see a rethrow";
  // A completion's error is looked at in place: a timed-out pipeline settles thousands of them
  // at once on the I/O thread, where a rethrow each cost more than the rest of the completion.
  Recorder r;
  auto registry = std::make_shared<MetricsRegistry>();
  LimiterMonitor::Options m;
  m.registry = registry;
  FailureGate gate("g", r.options(FailurePolicy::Deny), ClockView(clock_), LimiterMonitor("g", m));
  const auto timeout = std::make_exception_ptr(TimeoutError("redlimit: timed out"));
  const auto pool = std::make_exception_ptr(TimeoutError(ErrorKind::PoolTimeout, "redlimit: pool"));
  const auto replica =
      std::make_exception_ptr(ConfigurationError(ErrorKind::Replica, "READONLY", "redlimit: a replica"));
  const std::uint64_t before = test::raisedExceptions();
  const std::optional<bool> poolDecision = gate.settle(pool, manualNow(), 1, 10, milliseconds(1000));
  const bool degradedByPool = gate.stats().degraded;
  const std::optional<bool> decision = gate.settle(timeout, manualNow(), 1, 10, milliseconds(1000));
  const bool degraded = gate.stats().degraded;
  gate.noteError(replica, manualNow());
  const bool misconfigured = gate.stats().misconfigured;
  const std::optional<bool> replicaDecision = gate.settle(replica, manualNow(), 1, 10, milliseconds(1000));
  EXPECT_EQ(test::raisedExceptions(), before);
  EXPECT_EQ(poolDecision, std::optional<bool>(false));  // an IoError: the policy decides
  EXPECT_FALSE(degradedByPool);                         // but congestion in this process is no outage
  EXPECT_EQ(decision, std::optional<bool>(false));
  EXPECT_TRUE(degraded);
  EXPECT_TRUE(misconfigured);
  EXPECT_FALSE(replicaDecision);  // not an outage: the caller throws it
  const auto s = registry->snapshot("g");
  EXPECT_EQ(s.errorCount(ErrorKind::PoolTimeout), 1u);
  EXPECT_EQ(s.errorCount(ErrorKind::Timeout), 1u);
  EXPECT_EQ(s.errorCount(ErrorKind::Configuration), 1u);
  ASSERT_EQ(r.events.size(), 2u);  // Degraded by the outage, then by the configuration error
  EXPECT_EQ(r.events[0].errorType, "redlimit::TimeoutError");
  EXPECT_EQ(r.events[1].errorType, "redlimit::ConfigurationError");
  EXPECT_EQ(r.events[0].errorKind, ErrorKind::Timeout);
  EXPECT_EQ(r.events[1].errorKind, ErrorKind::Replica);
}

TEST(FailureGate, ADegradedEventCarriesItsOwnCopyOfTheErrorOfItsOwnType) {
  Recorder r;
  FailureGate gate("g", r.options(FailurePolicy::Deny), ClockView(clock_));
  // Called outside a catch block, as a completion does: the event's exception is still a
  // ClosedError (it was a copy sliced to redlimit::Error), and not the caller's object.
  const ClosedError closed("redlimit: closed");
  gate.failed(closed, manualNow());
  ASSERT_EQ(r.events.size(), 1u);
  const std::exception_ptr copy = r.events[0].exception;
  ASSERT_TRUE(copy);
  try {
    std::rethrow_exception(copy);
  } catch (const ClosedError& e) {
    EXPECT_NE(&e, &closed);
    EXPECT_STREQ(e.what(), "redlimit: closed");
  } catch (...) {
    ADD_FAILURE() << "the event's exception is not a ClosedError";
  }
}
