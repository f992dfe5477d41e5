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

/// One completion `void(T, std::exception_ptr)` to wait for. The state is shared with the
/// callback, so a completion that comes late never touches a gone waiter. Not reusable.
template <class T>
class SyncWait {
 public:
  SyncWait() : state_(std::make_shared<State>()) {}

  /// The callback to hand to the async call (once).
  [[nodiscard]] std::function<void(T, std::exception_ptr)> callback() {
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
