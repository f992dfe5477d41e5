// redlimit — what one server taught the connections to it: it runs no scripts for this client
// (scripting switched off, or an ACL user not granted the script commands), so that later script
// requests end at once with the same ConfigurationError instead of asking again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>

#include "redlimit/detail/thread_annotations.hpp"
#include "transport/pipeline.hpp"

namespace redlimit::detail {

/// "This server runs no scripts", remembered for a Transport's connections (one server): learnt
/// from the refusal of a script request (error_mapping's runsNoScripts), forgotten when the server
/// runs or answers a script, and when a connection to it closes (the one that replaces it may
/// reach another server, or one fixed meanwhile). While it is remembered, one script request per
/// kRecheckInterval still goes to the server, so that a fix there (ACL SETUSER, which Redis applies
/// to open connections; a module loaded) serves calls again within the interval; the others end
/// with a copy of the refusal, unsent.
/// Thread-safe. Memory ordering: the error is written under the lock before `known_` is set
/// (release); a reader that sees it set (acquire) takes the error under the lock, and one that
/// sees it clear sends its request, which is never wrong (the server answers it).
class NoScriptsMemo {
 public:
  /// How often a script request still goes to a server remembered to run none: the re-check.
  static constexpr std::chrono::milliseconds kRecheckInterval{1000};

  /// True while a refusal is remembered (one relaxed load: the hot path's test).
  [[nodiscard]] bool known() const noexcept { return known_.load(std::memory_order_relaxed); }
  /// For a script request about to be sent at `now`: null to send it (nothing remembered, or it
  /// is the one re-check of this interval), else a copy of the remembered refusal to end it with.
  [[nodiscard]] std::exception_ptr refusal(SteadyTime now);
  /// A script request sent at or after `now`'s interval began was refused so (`error`, the
  /// ConfigurationError throwReplyError made of the reply): remembered, re-checked from `now` on
  /// after kRecheckInterval.
  void learn(const std::exception_ptr& error, SteadyTime now);
  /// The server answered a script request otherwise (it ran it, or refused it for another
  /// reason), or a connection to it closed: nothing is remembered any more.
  void forget() noexcept;

  /// Script requests ended by refusal() without being sent, since start.
  [[nodiscard]] std::uint64_t refused() const noexcept { return refused_.load(std::memory_order_relaxed); }
  /// Script requests refusal() let go to the server as its re-check, since start.
  [[nodiscard]] std::uint64_t rechecks() const noexcept { return rechecks_.load(std::memory_order_relaxed); }

 private:
  static std::int64_t nanos(SteadyTime t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }

  std::atomic<bool> known_{false};
  std::atomic<std::int64_t> nextCheck_{0};  // ns on the steady clock: the next re-check may go then
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> rechecks_{0};
  Mutex mutex_;
  std::exception_ptr error_ REDLIMIT_GUARDED_BY(mutex_);  // the refusal; null while none is known
};

}  // namespace redlimit::detail
