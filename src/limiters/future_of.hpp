// redlimit — the std::future form of a callback API: one promise per call, completed by the
// callback with the value or the error.
#pragma once

#include <exception>
#include <future>
#include <memory>
#include <utility>

namespace redlimit::detail {

/// Calls start(callback), where callback(T value, std::exception_ptr error) completes the returned
/// future: with the error if there is one, else with the value.
template <class T, class Start>
std::future<T> futureOf(Start&& start) {
  auto promise = std::make_shared<std::promise<T>>();
  std::future<T> future = promise->get_future();
  std::forward<Start>(start)([promise](T value, std::exception_ptr error) {
    if (error) {
      promise->set_exception(std::move(error));
    } else {
      promise->set_value(std::move(value));
    }
  });
  return future;
}

}  // namespace redlimit::detail
