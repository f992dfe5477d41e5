// redlimit — waiting for an asynchronous call's completion: how the sync calls are a thin wait on
// the async ones.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "redlimit/errors.hpp"

namespace redlimit::detail {

/// The calling thread waits for the request it submits next (SyncWait::callback): a Transport that
/// finds an idle connection for it then writes it on this thread and leaves the reply to this
/// thread's awaitCallerRead(), as Transport::call does for its own request (no hand-off to the I/O
/// thread, no wake-up from it).
void expectCallerRead() noexcept;
/// Reads the reply of the request taken since expectCallerRead(), if any, on this thread (its
/// completion runs here); then the thread expects nothing.
void awaitCallerRead() noexcept;
/// Gives a connection taken since expectCallerRead() back to the I/O thread unread, if any.
void dropCallerRead() noexcept;

/// One completion `void(T, std::exception_ptr)` to wait for. The state is shared with the
/// callback, so a completion that comes late never touches a gone waiter. Not reusable.
template <class T>
class SyncWait {
 public:
  SyncWait() : state_(std::make_shared<State>()) {}
  ~SyncWait() { dropCallerRead(); }
  SyncWait(const SyncWait&) = delete;
  SyncWait& operator=(const SyncWait&) = delete;

  /// The callback to hand to the async call (once), which is made on this thread right after.
  [[nodiscard]] std::function<void(T, std::exception_ptr)> callback() {
    expectCallerRead();
    // `error` by value and moved: once the waiter is woken, the calling (I/O) thread holds no
    // reference to the exception, so the waiter's copy is the last one.
    return [state = state_](T value, std::exception_ptr error) {  // NOLINT(performance-unnecessary-value-param)
      {
        std::lock_guard<std::mutex> lock(state->m);
        state->value = std::move(value);
        state->error = std::move(error);
        state->ready = true;
      }
      state->cv.notify_one();
    };
  }

  /// Waits for the completion; returns its value or rethrows its error. The transport ends every
  /// request by its deadline; should the completion still not have come at `giveUp` (the I/O
  /// thread is gone), throws TimeoutError rather than wait forever.
  T get(std::chrono::steady_clock::time_point giveUp) {
    awaitCallerRead();
    std::unique_lock<std::mutex> lock(state_->m);
    if (!state_->cv.wait_until(lock, giveUp, [&] { return state_->ready; })) {
      throw TimeoutError("redlimit: the I/O thread did not complete the request by its deadline");
    }
    // Moved out, so that the state (which the callback may free later, on the I/O thread) holds no
    // reference to the exception: its last reference is this thread's.
    if (std::exception_ptr error = std::move(state_->error)) std::rethrow_exception(error);
    return std::move(state_->value);
  }

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv;
    bool ready = false;
    T value{};
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
};

}  // namespace redlimit::detail
