// How many exceptions this process has raised (thrown or rethrown), for tests that pin a path
// that must not unwind: a rethrow costs microseconds, and a timed-out pipeline fails thousands
// of requests at once on the I/O thread.
#pragma once

#include <cstdint>

namespace redlimit::test {

/// True if raisedExceptions() counts (a dynamically linked libgcc_s unwinder that this process's
/// definition of _Unwind_RaiseException interposes); the tests that use it fail otherwise (they could not tell a rethrow from none).
[[nodiscard]] bool canCountRaises();
/// The exceptions raised so far by this thread (each throw, std::rethrow_exception and `throw;`
/// goes through _Unwind_RaiseException once).
[[nodiscard]] std::uint64_t raisedExceptions();

}  // namespace redlimit::test
