// The Asio front (redlimit/asio.hpp) against a real Redis: each completion token (a callback, one
// bound to an io_context, use_future, use_awaitable, deferred), the thread each completion runs
// on, errors as the completion's exception, MultiLimit and RateLimiter, cancellation. Compiled once
// per Asio found (Boost.Asio, and standalone Asio with REDLIMIT_ASIO_STANDALONE), as C++20.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/asio.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"

#if defined(REDLIMIT_ASIO_STANDALONE)
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#if !defined(ASIO_HAS_CO_AWAIT)
#error "the Asio front's tests need co_await (C++20)"
#endif
#if ASIO_VERSION >= 102400  // deferred left experimental in Asio 1.24
#include <asio/deferred.hpp>
#define REDLIMIT_TEST_DEFERRED ::asio::deferred
#elif ASIO_VERSION >= 101900  // Debian 12's libasio-dev is 1.22
#include <asio/experimental/deferred.hpp>
#define REDLIMIT_TEST_DEFERRED ::asio::experimental::deferred
#endif
#if defined(REDLIMIT_ASIO_HAS_CANCELLATION)
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#endif
#else
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#if !defined(BOOST_ASIO_HAS_CO_AWAIT)
#error "the Asio front's tests need co_await (C++20)"
#endif
#if BOOST_ASIO_VERSION >= 102400  // Boost 1.80
#include <boost/asio/deferred.hpp>
#define REDLIMIT_TEST_DEFERRED ::boost::asio::deferred
#elif BOOST_ASIO_VERSION >= 101900  // Boost 1.77..1.79; Debian 12's 1.74 has no deferred
#include <boost/asio/experimental/deferred.hpp>
#define REDLIMIT_TEST_DEFERRED ::boost::asio::experimental::deferred
#endif
#if defined(REDLIMIT_ASIO_HAS_CANCELLATION)
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#endif
#endif

namespace redlimit::test {
namespace {

namespace net = redlimit::asio::net;
using std::chrono::milliseconds;

class AsioFront : public RedisTest {
 protected:
  // The thread redlimit's callbacks run on: the Client's I/O thread (a raw callback of a call
  // that Redis answers).
  std::thread::id ioThread(Limiter& limiter) {
    std::promise<std::thread::id> id;
    limiter.peekAsync("io-thread", 1,
                      [&](const Decision&, const std::exception_ptr&) { id.set_value(std::this_thread::get_id()); });
    return id.get_future().get();
  }
  Limiter limiter(std::int64_t burst = 2) {
    return Limiter(client(), limiterName(), Policy::tokenBucket(burst, 1, milliseconds(3600000)));
  }
};

TEST_F(AsioFront, CallbackRunsOnTheHandlersExecutor) {
  Limiter l = limiter();
  const std::thread::id io = ioThread(l);
  net::io_context ioc;
  std::optional<std::thread::id> ranOn;
  Decision decision;
  redlimit::asio::async_decide(l, "u", 1, net::bind_executor(ioc, [&](const std::exception_ptr& error, Decision d) {
                                 EXPECT_FALSE(error);
                                 ranOn = std::this_thread::get_id();
                                 decision = d;
                               }));
  // run() returns once the handler has run: the call in flight counts as the io_context's work.
  ioc.run();
  ASSERT_TRUE(ranOn.has_value());
  EXPECT_EQ(*ranOn, std::this_thread::get_id());
  EXPECT_NE(*ranOn, io);
  EXPECT_TRUE(decision.allowed);
  EXPECT_EQ(decision.remaining, 1);
}

TEST_F(AsioFront, UnboundCallbackRunsOnTheSystemExecutorNotTheIoThread) {
  Limiter l = limiter();
  const std::thread::id io = ioThread(l);
  std::promise<std::thread::id> ranOn;
  redlimit::asio::async_decide(
      l, "u", 1, [&](const std::exception_ptr&, Decision) { ranOn.set_value(std::this_thread::get_id()); });
  const std::thread::id id = ranOn.get_future().get();
  EXPECT_NE(id, io);
  EXPECT_NE(id, std::this_thread::get_id());
}

TEST_F(AsioFront, UseFutureGetsEachDecision) {
  Limiter l = limiter(2);
  EXPECT_TRUE(redlimit::asio::async_decide(l, "u", 1, net::use_future).get().allowed);
  EXPECT_TRUE(redlimit::asio::async_decide(l, "u", 1, net::use_future).get().allowed);
  const Decision third = redlimit::asio::async_decide(l, "u", 1, net::use_future).get();
  EXPECT_FALSE(third.allowed);
  EXPECT_GT(third.retryAfter.count(), 0);
}

TEST_F(AsioFront, BadArgumentArrivesAsTheFuturesException) {
  Limiter l = limiter();
  const std::int64_t before = scriptCalls();
  auto badKey = redlimit::asio::async_decide(l, "", 1, net::use_future);
  EXPECT_THROW((void)badKey.get(), InvalidArgument);
  auto badPermits = redlimit::asio::async_reserve(l, "u", 0, std::chrono::microseconds(0), net::use_future);
  EXPECT_THROW((void)badPermits.get(), InvalidArgument);
  EXPECT_EQ(scriptCalls(), before);
}

// A coroutine resumes on its io_context's thread, not on redlimit's I/O thread, so it may make a
// sync call on the same limiter after co_await (on the I/O thread that call would wait for its own
// thread: it throws InvalidArgument there).
TEST_F(AsioFront, CoroutineAwaitsADecisionThenDecidesSynchronously) {
  Limiter l = limiter(3);
  const std::thread::id io = ioThread(l);
  net::io_context ioc;
  std::optional<std::thread::id> resumedOn;
  Decision awaited;
  Decision sync;
  std::exception_ptr failure;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        awaited = co_await redlimit::asio::async_decide(l, "u", 1, net::use_awaitable);
        resumedOn = std::this_thread::get_id();
        sync = l.decide("u", 1);
      },
      [&](std::exception_ptr e) { failure = std::move(e); });
  ioc.run();
  ASSERT_FALSE(failure) << "the coroutine threw";
  ASSERT_TRUE(resumedOn.has_value());
  EXPECT_EQ(*resumedOn, std::this_thread::get_id());
  EXPECT_NE(*resumedOn, io);
  EXPECT_TRUE(awaited.allowed);
  EXPECT_EQ(awaited.remaining, 2);
  EXPECT_TRUE(sync.allowed);
  EXPECT_EQ(sync.remaining, 1);
}

TEST_F(AsioFront, CoroutineCatchesTheErrorOfABadKey) {
  Limiter l = limiter();
  net::io_context ioc;
  bool caught = false;
  std::exception_ptr failure;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        try {
          (void)co_await redlimit::asio::async_peek(l, std::string(1025, 'k'), 1, net::use_awaitable);
        } catch (const InvalidArgument&) {
          caught = true;
        }
      },
      [&](std::exception_ptr e) { failure = std::move(e); });
  ioc.run();
  ASSERT_FALSE(failure);
  EXPECT_TRUE(caught);
}

// Every other Limiter operation through one coroutine: reserve, reserveFor and settle, refund,
// exists, deleteKey; then the lease operations of a concurrency policy.
TEST_F(AsioFront, CoroutineRunsEveryLimiterOperation) {
  Limiter l = limiter(4);
  Limiter leases(client(), limiterName("leases"), Policy::concurrency(2, milliseconds(60000)));
  net::io_context ioc;
  std::exception_ptr failure;
  std::vector<std::string> checked;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        namespace ra = redlimit::asio;
        const Decision reserved =
            co_await ra::async_reserve(l, "u", 1, std::chrono::microseconds(0), net::use_awaitable);
        EXPECT_TRUE(reserved.allowed);
        const Decision forId = co_await ra::async_reserve_for(l, "u", 2, "job-1", net::use_awaitable);
        EXPECT_TRUE(forId.allowed);
        EXPECT_EQ(forId.remaining, 1);
        const Settlement settled = co_await ra::async_settle(l, "u", "job-1", 1, net::use_awaitable);
        EXPECT_EQ(settled.status, Settlement::Status::Settled);
        EXPECT_TRUE(co_await ra::async_refund(l, "u", 1, net::use_awaitable));
        const Decision peeked = co_await ra::async_peek(l, "u", 1, net::use_awaitable);
        EXPECT_EQ(peeked.remaining, 3);
        EXPECT_TRUE(co_await ra::async_exists(l, "u", net::use_awaitable));
        EXPECT_TRUE(co_await ra::async_delete_key(l, "u", net::use_awaitable));
        EXPECT_FALSE(co_await ra::async_exists(l, "u", net::use_awaitable));
        checked.emplace_back("permits");

        const LeaseDecision first = co_await ra::async_acquire_lease(leases, "job", net::use_awaitable);
        const LeaseDecision second =
            co_await ra::async_acquire_lease(leases, "job", milliseconds(30000), net::use_awaitable);
        EXPECT_TRUE(first.decision.allowed);
        EXPECT_TRUE(second.decision.allowed);
        if (!first.lease || !second.lease) co_return;
        EXPECT_EQ(co_await ra::async_held(leases, "job", net::use_awaitable), 2);
        const std::optional<Lease> renewed = co_await ra::async_renew(leases, "job", *first.lease, net::use_awaitable);
        EXPECT_TRUE(renewed.has_value());
        EXPECT_TRUE((co_await ra::async_renew(leases, "job", *second.lease, milliseconds(20000), net::use_awaitable))
                        .has_value());
        EXPECT_TRUE(co_await ra::async_release(leases, "job", *first.lease, net::use_awaitable));
        EXPECT_FALSE(co_await ra::async_release(leases, "job", *first.lease, net::use_awaitable));
        EXPECT_EQ(co_await ra::async_held(leases, "job", net::use_awaitable), 1);
        checked.emplace_back("leases");
      },
      [&](std::exception_ptr e) { failure = std::move(e); });
  ioc.run();
  ASSERT_FALSE(failure);
  EXPECT_EQ(checked, (std::vector<std::string>{"permits", "leases"}));
}

TEST_F(AsioFront, CoroutineDecidesAMultiLimit) {
  Limiter user(client(), limiterName("user"), Policy::tokenBucket(3, 1, milliseconds(3600000)));
  Limiter tenant(client(), limiterName("tenant"), Policy::tokenBucket(2, 1, milliseconds(3600000)));
  MultiLimit both = MultiLimit({user, tenant}).on({"{t}:u", "{t}"});
  net::io_context ioc;
  std::exception_ptr failure;
  std::vector<bool> answers;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        const MultiDecision first = co_await redlimit::asio::async_decide(both, 1, net::use_awaitable);
        answers.push_back(first.allowed);
        answers.push_back(co_await redlimit::asio::async_try_acquire(both, 1, net::use_awaitable));
        answers.push_back(
            co_await redlimit::asio::async_try_acquire(both, 1, net::use_awaitable));  // tenant: none left
        const MultiDecision denied = co_await redlimit::asio::async_decide(both, 1, net::use_awaitable);
        answers.push_back(denied.allowed);
        answers.push_back(both.tryAcquire(1));  // a sync call on the io_context's thread
      },
      [&](std::exception_ptr e) { failure = std::move(e); });
  ioc.run();
  ASSERT_FALSE(failure);
  EXPECT_EQ(answers, (std::vector<bool>{true, true, false, false, false}));
}

TEST_F(AsioFront, CoroutineRunsMultiLimitReservationsAndLeases) {
  Limiter user(client(), limiterName("user"), Policy::tokenBucket(3, 1, milliseconds(3600000)));
  Limiter places(client(), limiterName("places"), Policy::concurrency(1, milliseconds(60000)));
  MultiLimit rates = MultiLimit({user}).on({"{t}:u"});
  MultiLimit withPlaces = MultiLimit({user, places}).on({"{t}:v", "{t}:v"});
  net::io_context ioc;
  std::exception_ptr failure;
  int steps = 0;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        namespace ra = redlimit::asio;
        const MultiDecision reserved =
            co_await ra::async_reserve_for(rates, 2, "r-1", milliseconds(60000), net::use_awaitable);
        EXPECT_TRUE(reserved.allowed);
        const MultiSettlement settled = co_await ra::async_settle(rates, "r-1", 1, net::use_awaitable);
        EXPECT_EQ(settled.status, Settlement::Status::Settled);
        ++steps;

        const MultiDecision held = co_await ra::async_decide(withPlaces, 1, net::use_awaitable);
        EXPECT_TRUE(held.allowed);
        if (!held.lease) co_return;
        EXPECT_TRUE((co_await ra::async_renew(withPlaces, *held.lease, net::use_awaitable)).has_value());
        EXPECT_TRUE(
            (co_await ra::async_renew(withPlaces, *held.lease, milliseconds(30000), net::use_awaitable)).has_value());
        EXPECT_TRUE(co_await ra::async_release(withPlaces, *held.lease, net::use_awaitable));
        EXPECT_FALSE((co_await ra::async_renew(withPlaces, *held.lease, net::use_awaitable)).has_value());
        ++steps;
      },
      [&](std::exception_ptr e) { failure = std::move(e); });
  ioc.run();
  ASSERT_FALSE(failure);
  EXPECT_EQ(steps, 2);
}

TEST_F(AsioFront, CoroutineDecidesARateLimiter) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 2, milliseconds(3600000)));
  net::io_context ioc;
  std::exception_ptr failure;
  std::vector<bool> answers;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        const Decision first = co_await redlimit::asio::async_decide(rl, 1, net::use_awaitable);
        answers.push_back(first.allowed);
        answers.push_back(co_await redlimit::asio::async_try_acquire(rl, 1, net::use_awaitable));
        answers.push_back(co_await redlimit::asio::async_try_acquire(rl, 1, net::use_awaitable));
        answers.push_back(rl.tryAcquire(1));  // a sync call on the io_context's thread
      },
      [&](std::exception_ptr e) { failure = std::move(e); });
  ioc.run();
  ASSERT_FALSE(failure);
  EXPECT_EQ(answers, (std::vector<bool>{true, true, false, false}));
}

#if defined(REDLIMIT_TEST_DEFERRED)
// A deferred operation sends nothing until it is launched, and owns its arguments: the key it was
// made with may be gone by then.
TEST_F(AsioFront, DeferredSendsNothingUntilLaunched) {
  Limiter l = limiter(2);
  (void)l.decide("warm", 1);  // the script loaded: one call is one EVALSHA from here on
  const std::int64_t before = scriptCalls();
  auto op = [&] {
    const std::string key = "u";
    return redlimit::asio::async_decide(l, key, 1, REDLIMIT_TEST_DEFERRED);
  }();
  EXPECT_EQ(scriptCalls(), before);
  const Decision d = std::move(op)(net::use_future).get();
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_EQ(scriptCalls(), before + 1);
  EXPECT_EQ(l.peek("u", 1).remaining, 1);
}
#endif

#if defined(REDLIMIT_ASIO_HAS_CANCELLATION)
// A terminal cancellation completes the wait at once with operation_aborted; the call already
// sent is not withdrawn: Redis still decides it (here once the pause ends), and that answer is
// dropped.
TEST_F(AsioFront, CancelledWaitEndsWithOperationAbortedWhileRedisStillDecides) {
  Limiter l(patientClient(), limiterName(), Policy::tokenBucket(2, 1, milliseconds(3600000)));
  (void)l.peek("u", 1);  // connected, scripts loaded
  // Scripts wait while writes are paused (CLIENT PAUSE WRITE pauses EVAL and EVALSHA); reads do not.
  const Reply paused = raw({"CLIENT", "PAUSE", "60000", "WRITE"});
  net::io_context ioc;
  net::cancellation_signal signal;
  int calls = 0;
  std::exception_ptr error;
  redlimit::asio::async_decide(
      l, "u", 1,
      net::bind_cancellation_slot(signal.slot(), net::bind_executor(ioc, [&](std::exception_ptr e, Decision) {
                                    ++calls;
                                    error = std::move(e);
                                  })));
  net::post(ioc, [&] { signal.emit(net::cancellation_type::terminal); });
  ioc.run();
  (void)raw({"CLIENT", "UNPAUSE"});
  ASSERT_EQ(calls, 1);
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const redlimit::asio::SystemError& e) {
    EXPECT_EQ(e.code(), net::error::operation_aborted);
  }
  // The decision is taken after all: wait until Redis shows the permit taken.
  std::int64_t remaining = 2;
  for (int i = 0; i < 1000 && remaining == 2; ++i) {
    remaining = l.peek("u", 1).remaining;
    if (remaining == 2) sleepMs(10);
  }
  EXPECT_EQ(remaining, 1);
  ioc.restart();
  ioc.poll();
  EXPECT_EQ(calls, 1);
}
#endif

}  // namespace
}  // namespace redlimit::test
