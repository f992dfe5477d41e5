// redlimit — the fork generation of this process, header-only (the redlimit::local target uses it
// and links no compiled library). src/base/fork_guard.cpp's forkGeneration() reads the same counter.
#pragma once

#include <atomic>
#include <cstdint>

#include <pthread.h>

namespace redlimit::detail {

/// The number of fork()s since the counter's handler was registered (registerForkCounter()): 0 in
/// the process that registered it, 1 in its children, and so on. Meaningful only after
/// registerForkCounter() returned true; a reader then costs one relaxed load.
///
/// Memory ordering: relaxed. The handler runs in the child's only thread before fork() returns
/// there, and the child's later threads see the value through thread creation.
inline std::atomic<std::uint64_t> gForkCounter{0};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the fork handler must not take a lock");

/// The pthread_atfork child handler: async-signal-safe (a lock-free atomic increment).
inline void bumpForkCounter() noexcept { gForkCounter.fetch_add(1, std::memory_order_relaxed); }

/// Registers bumpForkCounter() as a pthread_atfork child handler, once per process image (a
/// function-local static; children inherit the registration). True if registered: pthread_atfork
/// fails only on ENOMEM. Thread-safe, never throws.
inline bool registerForkCounter() noexcept {
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &bumpForkCounter) == 0;
  return registered;
}

/// gForkCounter's value now (valid only after registerForkCounter() returned true).
[[nodiscard]] inline std::uint64_t forkCounter() noexcept { return gForkCounter.load(std::memory_order_relaxed); }

}  // namespace redlimit::detail
