// redlimit — the Asio front: every asynchronous operation of Limiter, MultiLimit and RateLimiter as
// an Asio initiating function that takes any completion token (a callback, use_future,
// use_awaitable, deferred, ...) and completes on the token's executor, never on redlimit's I/O
// thread. Header-only; the target redlimit::asio (docs/asio.md).
//
// Boost.Asio by default (Boost 1.74 or later); standalone Asio (1.18 or later) when
// REDLIMIT_ASIO_STANDALONE is defined before this header (the target redlimit::asio defines it
// when it was configured so). The library itself never includes this header and needs neither.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#if defined(REDLIMIT_ASIO_STANDALONE)
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/error.hpp>
#include <asio/execution.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/system_error.hpp>
#include <asio/system_executor.hpp>
#include <asio/version.hpp>
// Per-operation cancellation (cancellation slots) came with Asio 1.19.
#if ASIO_VERSION >= 101900
#include <asio/associated_cancellation_slot.hpp>
#include <asio/cancellation_type.hpp>
#define REDLIMIT_ASIO_HAS_CANCELLATION 1
#endif
#else
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/execution.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/version.hpp>
#include <boost/system/system_error.hpp>
// Per-operation cancellation came with Boost 1.77 (its Asio is 1.19); Debian 12's 1.74 has none.
#if BOOST_ASIO_VERSION >= 101900
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/cancellation_type.hpp>
#define REDLIMIT_ASIO_HAS_CANCELLATION 1
#endif
#endif

#include "redlimit/decision.hpp"
#include "redlimit/lease.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/settlement.hpp"

namespace redlimit::asio {

// The backend is part of the names (an inline namespace), so a program whose files use both
// Boost.Asio and standalone Asio gets two sets of templates, not one name with two bodies.
#if defined(REDLIMIT_ASIO_STANDALONE)
inline namespace standalone {
namespace net = ::asio;
using SystemError = ::asio::system_error;
#else
inline namespace boost_asio {
namespace net = ::boost::asio;
using SystemError = ::boost::system::system_error;
#endif

namespace detail {

// Keeps the handler's executor from running out of work while a call is in flight (io_context::run
// does not return): a standard executor is preferred with outstanding_work.tracked, a Networking
// TS executor gets an executor_work_guard (Asio's own composed operations do the same).
template <class Executor>
auto trackWork(const Executor& ex) {
  if constexpr (net::execution::is_executor<Executor>::value) {
    return net::prefer(ex, net::execution::outstanding_work.tracked);
  } else {
    return net::make_work_guard(ex);
  }
}
template <class Executor>
Executor executorOf(const Executor& tracked) {
  return tracked;
}
template <class Executor>
Executor executorOf(const net::executor_work_guard<Executor>& guard) {
  return guard.get_executor();
}

// One call in flight: the handler, the work it holds, and who completes it first (redlimit's
// answer or a cancellation). Shared by redlimit's callback (a std::function, so copyable) and,
// with cancellation, by the handler installed in the cancellation slot.
template <class T, class Handler>
class Operation : public std::enable_shared_from_this<Operation<T, Handler>> {
 public:
  using Executor = net::associated_executor_t<Handler, net::system_executor>;

  explicit Operation(Handler handler)
      : handler_(std::move(handler)),
        work_(trackWork(net::get_associated_executor(handler_, net::system_executor()))) {}

  // Posts the completion to the handler's executor, unless the operation completed already
  // (cancelled): then the answer is dropped. Called on redlimit's I/O thread, on the calling
  // thread (answered without Redis), or inside a cancellation signal's emit.
  void complete(std::exception_ptr error, T result) {
    if (completed_.exchange(true)) return;
    const auto ex = executorOf(*work_);
    net::post(ex, [self = this->shared_from_this(), error, result = std::move(result)]() mutable {
      self->invoke(error, std::move(result));
    });
  }

#if defined(REDLIMIT_ASIO_HAS_CANCELLATION)
  // Terminal cancellation only: the script may have run in Redis already (or will), so the
  // operation cannot promise that nothing happened (partial or total cancellation).
  void connectCancellation() {
    auto slot = net::get_associated_cancellation_slot(handler_);
    if (!slot.is_connected()) return;
    slot.template emplace<CancelHandler>(this->shared_from_this());
  }
#else
  void connectCancellation() {}
#endif

 private:
  // On the handler's executor: the handler once, then the work is released.
  void invoke(std::exception_ptr error, T result) {
#if defined(REDLIMIT_ASIO_HAS_CANCELLATION)
    net::get_associated_cancellation_slot(handler_).clear();
#endif
    [[maybe_unused]] const auto work = std::move(work_);  // released once the handler returns
    work_.reset();
    std::move(handler_)(error, std::move(result));
  }

#if defined(REDLIMIT_ASIO_HAS_CANCELLATION)
  struct CancelHandler {
    explicit CancelHandler(std::shared_ptr<Operation> operation) : op(std::move(operation)) {}
    std::shared_ptr<Operation> op;
    void operator()(net::cancellation_type type) const {
      if ((type & net::cancellation_type::terminal) == net::cancellation_type::none) return;
      op->complete(std::make_exception_ptr(SystemError(net::error::operation_aborted)), T{});
    }
  };
#endif

  Handler handler_;
  std::optional<decltype(trackWork(std::declval<Executor>()))> work_;
  std::atomic<bool> completed_{false};
};

// The one adaptation: `call(callback)` starts a callback-taking ...Async member with a callback
// that hands its answer to the handler of `token`, as the completion void(exception_ptr, T).
// `call` must own what it passes (copies of keys and ids): a deferred token starts it later.
template <class T, class Token, class Call>
auto initiate(Token&& token, Call&& call) {
  return net::async_initiate<Token, void(std::exception_ptr, T)>(
      [](auto handler, auto start) {
        auto op = std::make_shared<Operation<T, decltype(handler)>>(std::move(handler));
        op->connectCancellation();
        start([op](T result, std::exception_ptr error) { op->complete(error, std::move(result)); });
      },
      token, std::forward<Call>(call));
}

}  // namespace detail

// --- Limiter ------------------------------------------------------------------------------------

/// Limiter::decideAsync: completes with void(std::exception_ptr, Decision).
template <class Token>
auto async_decide(Limiter& limiter, std::string_view key, std::int64_t permits, Token&& token) {
  return detail::initiate<Decision>(std::forward<Token>(token), [&limiter, k = std::string(key), permits](auto done) {
    limiter.decideAsync(k, permits, std::move(done));
  });
}
/// Limiter::reserveAsync: void(std::exception_ptr, Decision).
template <class Token>
auto async_reserve(Limiter& limiter, std::string_view key, std::int64_t permits, std::chrono::microseconds maxWait,
                   Token&& token) {
  return detail::initiate<Decision>(std::forward<Token>(token),
                                    [&limiter, k = std::string(key), permits, maxWait](auto done) {
                                      limiter.reserveAsync(k, permits, maxWait, std::move(done));
                                    });
}
/// Limiter::reserveForAsync: void(std::exception_ptr, Decision).
template <class Token>
auto async_reserve_for(Limiter& limiter, std::string_view key, std::int64_t permits, std::string id,
                       std::chrono::milliseconds recordTtl, Token&& token) {
  return detail::initiate<Decision>(
      std::forward<Token>(token), [&limiter, k = std::string(key), permits, id = std::move(id), recordTtl](auto done) {
        limiter.reserveForAsync(k, permits, id, recordTtl, std::move(done));
      });
}
/// As above with the record kept Limiter::kDefaultRecordTtl.
template <class Token>
auto async_reserve_for(Limiter& limiter, std::string_view key, std::int64_t permits, std::string id, Token&& token) {
  return async_reserve_for(limiter, key, permits, std::move(id), Limiter::kDefaultRecordTtl,
                           std::forward<Token>(token));
}
/// Limiter::settleAsync: void(std::exception_ptr, Settlement).
template <class Token>
auto async_settle(Limiter& limiter, std::string_view key, std::string id, std::int64_t actual, Token&& token) {
  return detail::initiate<Settlement>(std::forward<Token>(token),
                                      [&limiter, k = std::string(key), id = std::move(id), actual](auto done) {
                                        limiter.settleAsync(k, id, actual, std::move(done));
                                      });
}
/// Limiter::peekAsync: void(std::exception_ptr, Decision).
template <class Token>
auto async_peek(Limiter& limiter, std::string_view key, std::int64_t permits, Token&& token) {
  return detail::initiate<Decision>(std::forward<Token>(token), [&limiter, k = std::string(key), permits](auto done) {
    limiter.peekAsync(k, permits, std::move(done));
  });
}
/// Limiter::refundAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_refund(Limiter& limiter, std::string_view key, std::int64_t permits, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token), [&limiter, k = std::string(key), permits](auto done) {
    limiter.refundAsync(k, permits, std::move(done));
  });
}
/// Limiter::deleteKeyAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_delete_key(Limiter& limiter, std::string_view key, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token), [&limiter, k = std::string(key)](auto done) {
    limiter.deleteKeyAsync(k, std::move(done));
  });
}
/// Limiter::existsAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_exists(Limiter& limiter, std::string_view key, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token), [&limiter, k = std::string(key)](auto done) {
    limiter.existsAsync(k, std::move(done));
  });
}
/// Limiter::heldAsync: void(std::exception_ptr, std::int64_t).
template <class Token>
auto async_held(Limiter& limiter, std::string_view key, Token&& token) {
  return detail::initiate<std::int64_t>(std::forward<Token>(token), [&limiter, k = std::string(key)](auto done) {
    limiter.heldAsync(k, std::move(done));
  });
}
/// Limiter::acquireLeaseAsync: void(std::exception_ptr, LeaseDecision).
template <class Token>
auto async_acquire_lease(Limiter& limiter, std::string_view key, Token&& token) {
  return detail::initiate<LeaseDecision>(std::forward<Token>(token), [&limiter, k = std::string(key)](auto done) {
    limiter.acquireLeaseAsync(k, std::move(done));
  });
}
/// As above for `leaseTtl`.
template <class Token>
auto async_acquire_lease(Limiter& limiter, std::string_view key, std::chrono::milliseconds leaseTtl, Token&& token) {
  return detail::initiate<LeaseDecision>(std::forward<Token>(token),
                                         [&limiter, k = std::string(key), leaseTtl](auto done) {
                                           limiter.acquireLeaseAsync(k, leaseTtl, std::move(done));
                                         });
}
/// Limiter::renewAsync: void(std::exception_ptr, std::optional<Lease>).
template <class Token>
auto async_renew(Limiter& limiter, std::string_view key, Lease lease, Token&& token) {
  return detail::initiate<std::optional<Lease>>(std::forward<Token>(token),
                                                [&limiter, k = std::string(key), lease = std::move(lease)](auto done) {
                                                  limiter.renewAsync(k, lease, std::move(done));
                                                });
}
/// As above for `leaseTtl`.
template <class Token>
auto async_renew(Limiter& limiter, std::string_view key, Lease lease, std::chrono::milliseconds leaseTtl,
                 Token&& token) {
  return detail::initiate<std::optional<Lease>>(
      std::forward<Token>(token), [&limiter, k = std::string(key), lease = std::move(lease), leaseTtl](auto done) {
        limiter.renewAsync(k, lease, leaseTtl, std::move(done));
      });
}
/// Limiter::releaseAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_release(Limiter& limiter, std::string_view key, Lease lease, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token),
                                [&limiter, k = std::string(key), lease = std::move(lease)](auto done) {
                                  limiter.releaseAsync(k, lease, std::move(done));
                                });
}

// --- MultiLimit ---------------------------------------------------------------------------------

/// MultiLimit::decideAsync: void(std::exception_ptr, MultiDecision).
template <class Token>
auto async_decide(MultiLimit& limits, std::int64_t permits, Token&& token) {
  return detail::initiate<MultiDecision>(
      std::forward<Token>(token), [&limits, permits](auto done) { limits.decideAsync(permits, std::move(done)); });
}
/// MultiLimit::tryAcquireAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_try_acquire(MultiLimit& limits, std::int64_t permits, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token),
                                [&limits, permits](auto done) { limits.tryAcquireAsync(permits, std::move(done)); });
}
/// MultiLimit::reserveForAsync: void(std::exception_ptr, MultiDecision).
template <class Token>
auto async_reserve_for(MultiLimit& limits, std::int64_t permits, std::string id, std::chrono::milliseconds recordTtl,
                       Token&& token) {
  return detail::initiate<MultiDecision>(std::forward<Token>(token),
                                         [&limits, permits, id = std::move(id), recordTtl](auto done) {
                                           limits.reserveForAsync(permits, id, recordTtl, std::move(done));
                                         });
}
/// As above with the record kept the default reservation TTL (MultiLimit::reserveFor's).
template <class Token>
auto async_reserve_for(MultiLimit& limits, std::int64_t permits, std::string id, Token&& token) {
  return async_reserve_for(limits, permits, std::move(id), redlimit::detail::kDefaultReservationTtl,
                           std::forward<Token>(token));
}
/// MultiLimit::settleAsync: void(std::exception_ptr, MultiSettlement).
template <class Token>
auto async_settle(MultiLimit& limits, std::string id, std::int64_t actual, Token&& token) {
  return detail::initiate<MultiSettlement>(
      std::forward<Token>(token),
      [&limits, id = std::move(id), actual](auto done) { limits.settleAsync(id, actual, std::move(done)); });
}
/// MultiLimit::renewAsync: void(std::exception_ptr, std::optional<Lease>).
template <class Token>
auto async_renew(MultiLimit& limits, Lease lease, Token&& token) {
  return detail::initiate<std::optional<Lease>>(
      std::forward<Token>(token),
      [&limits, lease = std::move(lease)](auto done) { limits.renewAsync(lease, std::move(done)); });
}
/// As above for `leaseTtl`.
template <class Token>
auto async_renew(MultiLimit& limits, Lease lease, std::chrono::milliseconds leaseTtl, Token&& token) {
  return detail::initiate<std::optional<Lease>>(std::forward<Token>(token),
                                                [&limits, lease = std::move(lease), leaseTtl](auto done) {
                                                  limits.renewAsync(lease, leaseTtl, std::move(done));
                                                });
}
/// MultiLimit::releaseAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_release(MultiLimit& limits, Lease lease, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token), [&limits, lease = std::move(lease)](auto done) {
    limits.releaseAsync(lease, std::move(done));
  });
}

// --- RateLimiter --------------------------------------------------------------------------------

/// RateLimiter::decideAsync: void(std::exception_ptr, Decision).
template <class Token>
auto async_decide(RateLimiter& limiter, std::int64_t permits, Token&& token) {
  return detail::initiate<Decision>(std::forward<Token>(token),
                                    [&limiter, permits](auto done) { limiter.decideAsync(permits, std::move(done)); });
}
/// RateLimiter::tryAcquireAsync: void(std::exception_ptr, bool).
template <class Token>
auto async_try_acquire(RateLimiter& limiter, std::int64_t permits, Token&& token) {
  return detail::initiate<bool>(std::forward<Token>(token),
                                [&limiter, permits](auto done) { limiter.tryAcquireAsync(permits, std::move(done)); });
}

}  // namespace boost_asio or standalone
}  // namespace redlimit::asio
