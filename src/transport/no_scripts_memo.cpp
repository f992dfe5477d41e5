#include "transport/no_scripts_memo.hpp"

#include "base/error_mapping.hpp"

namespace redlimit::detail {
namespace {
constexpr std::int64_t kRecheckNanos =
    std::chrono::duration_cast<std::chrono::nanoseconds>(NoScriptsMemo::kRecheckInterval).count();
}  // namespace

std::exception_ptr NoScriptsMemo::refusal(SteadyTime now) {
  if (!known_.load(std::memory_order_acquire)) return nullptr;
  const std::int64_t at = nanos(now);
  std::int64_t next = nextCheck_.load(std::memory_order_relaxed);
  // One caller per interval wins the re-check, as ClusterRunner's probe of a node in an outage.
  if (at >= next && nextCheck_.compare_exchange_strong(next, at + kRecheckNanos, std::memory_order_relaxed)) {
    rechecks_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  std::exception_ptr copy;
  {
    const LockGuard lock(mutex_);
    // Each caller its own object (cloneError): the callers are on many threads.
    if (error_) copy = cloneError(error_);
  }
  if (copy) refused_.fetch_add(1, std::memory_order_relaxed);
  return copy;
}

void NoScriptsMemo::learn(const std::exception_ptr& error, SteadyTime now) {
  std::exception_ptr own = cloneError(error);  // the callers' copy is theirs to destroy on their thread
  const LockGuard lock(mutex_);
  error_ = std::move(own);
  nextCheck_.store(nanos(now) + kRecheckNanos, std::memory_order_relaxed);
  known_.store(true, std::memory_order_release);
}

void NoScriptsMemo::forget() noexcept {
  if (!known_.load(std::memory_order_relaxed)) return;
  std::exception_ptr old;
  {
    const LockGuard lock(mutex_);
    known_.store(false, std::memory_order_relaxed);
    old = std::move(error_);
    error_ = nullptr;
  }
}

}  // namespace redlimit::detail
