// redlimit — completions that cannot hurt each other: a caller's callback that throws is caught,
// counted and reported once, and every callback runs at most once.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/events.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit::detail {

/// True if `error` is a ClosedError: the connection closed before the reply, and a request that is
/// safe to send twice may be sent again.
inline bool closedConnection(const std::exception_ptr& error) {
  return dynamic_cast<const ClosedError*>(errorIn(error)) != nullptr;  // looked at in place: no rethrow
}

/// Counts a completion callback that threw `thrown` (LimiterMetrics::callbackThrew) and publishes
/// one Event::Kind::CallbackThrew through `monitor`. Never throws: an event callback that throws,
/// or a message that cannot be built, is dropped too (a completion has no one to throw to).
inline void reportCallbackThrew(const LimiterMonitor& monitor, std::string_view limiter,
                                const std::exception_ptr& thrown) noexcept {
  if (LimiterMetrics* m = monitor.metrics()) m->callbackThrew();
  try {
    std::string what = "an exception that is not a std::exception";
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Event e;
    e.kind = Event::Kind::CallbackThrew;
    e.limiter = limiter;
    e.description = fmt::format(
        "limiter {}: a completion callback threw ({}); the exception was dropped and no other call is affected",
        limiter, what);
    monitor.publish(e);
  } catch (...) {
  }
}

/// Runs `done(args...)` at most once and never throws, allocating nothing: `done` is taken out
/// (left empty, so a later call does nothing; an empty one does nothing), and an exception from it
/// is caught and, with a `monitor`, reported (reportCallbackThrew, naming `limiter`). Calls must
/// not overlap: the run-once is the caller's state, not a lock.
template <class F, class... Args>
void callOnce(F& done, const LimiterMonitor* monitor, std::string_view limiter, Args&&... args) noexcept {
  F run = std::exchange(done, nullptr);
  if (!run) return;
  try {
    run(std::forward<Args>(args)...);
  } catch (...) {
    if (monitor != nullptr) reportCallbackThrew(*monitor, limiter, std::current_exception());
  }
}

/// `done` as a copyable callback (copies share it) that runs it through callOnce.
template <class... Args>
std::function<void(Args...)> isolated(std::function<void(Args...)> done, LimiterMonitor monitor, std::string limiter) {
  auto once = std::make_shared<std::function<void(Args...)>>(std::move(done));
  return [once, monitor = std::move(monitor), limiter = std::move(limiter)](Args... args) noexcept {
    callOnce(*once, &monitor, limiter, std::forward<Args>(args)...);
  };
}

/// What `f()` throws, or null when it returns: the error as a value, for a caller that hands it on
/// (a completion, an action) rather than unwinds with it.
template <class F>
std::exception_ptr thrownBy(F&& f) noexcept {
  try {
    std::forward<F>(f)();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

/// The argument checks of an async call (`check()`, made before anything is sent): true when they
/// passed. When they threw, `done` has had the error (with a default result) through callOnce, and
/// false is returned: the call ends there.
template <class T, class Check>
bool checkedOrAnswered(std::function<void(T, std::exception_ptr)>& done, const LimiterMonitor& monitor,
                       std::string_view limiter, Check&& check) {
  std::exception_ptr error = thrownBy(std::forward<Check>(check));
  if (!error) return true;
  callOnce(done, &monitor, limiter, T{}, std::move(error));
  return false;
}
}  // namespace redlimit::detail
