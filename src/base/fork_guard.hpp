// Detecting that this process is a fork() child of the one that set up some per-process state.
#pragma once

#include <cstdint>

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

}  // namespace redlimit::detail
