// Detecting that this process is a fork() child of the one that set up some per-process state.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace redlimit::detail {

/// The number of fork()s between the process that first called this function and the calling
/// process: 0 in that process, 1 in its children, 2 in their children, and so on. State that must
/// not be shared with a fork()ed copy of itself (a random generator, a connection) remembers the
/// generation it was set up in and treats a different value as "inherited: set up again".
///
/// The first call registers a pthread_atfork child handler that bumps the counter (the handler
/// stays registered in children, which inherit memory that says it is). Forks before that first
/// call are not counted, which is harmless: nothing could remember a generation before it.
/// Later calls cost a load of the function-local static's guard and a relaxed atomic load.
///
/// Thread-safe. Never throws. If the handler cannot be registered (pthread_atfork fails only on
/// ENOMEM), the result is derived from getpid() instead: still different in a child, but each
/// call then costs a system call.
///
/// Memory ordering: relaxed. The handler runs in the child's only thread before fork() returns
/// there, and threads started later see the value through thread creation.
[[nodiscard]] std::uint64_t forkGeneration() noexcept;

/// The object `current` points to if this process made it (its `generation` member, set to
/// forkGeneration() when it was made, is this process's), else a new one from `make(inherited)`
/// (`inherited` the pointer found, null at first) swapped in without a lock: in a fork() child a
/// lock of the inherited object may be held by a parent thread that does not exist there. The first
/// thread to swap its object in wins, the others drop theirs and use the winner's. The inherited
/// object is never touched again (leaked). Thread-safe; throws what `make` throws (bad_alloc).
///
/// Memory ordering: the swap is acq_rel, so the winner's object is seen whole by the threads that
/// load it (acquire).
template <class T, class Make>
T& ofThisProcess(std::atomic<T*>& current, const std::uint64_t T::*generation, Make make) {
  const std::uint64_t mine = forkGeneration();
  T* seen = current.load(std::memory_order_acquire);
  if (seen != nullptr && seen->*generation == mine) return *seen;
  std::unique_ptr<T> fresh = make(seen);
  if (current.compare_exchange_strong(seen, fresh.get(), std::memory_order_acq_rel, std::memory_order_acquire)) {
    return *fresh.release();
  }
  return *seen;  // another thread of this process installed one: of this generation
}

}  // namespace redlimit::detail
