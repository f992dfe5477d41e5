#include "redlimit_test/raise_counter.hpp"

#include <dlfcn.h>
#include <unwind.h>

#include <cstdint>

namespace {

using RaiseFn = _Unwind_Reason_Code (*)(_Unwind_Exception*);

thread_local std::uint64_t raised = 0;

RaiseFn next() {
  static const auto fn = reinterpret_cast<RaiseFn>(dlsym(RTLD_NEXT, "_Unwind_RaiseException"));
  return fn;
}

}  // namespace

// Every throw and rethrow (libstdc++'s __cxa_throw, __cxa_rethrow, std::rethrow_exception) calls
// the unwinder's _Unwind_RaiseException; the executable's definition comes first in the dynamic
// linker's search, so the shared C++ runtime calls this one, which counts and calls the real one.
extern "C" _Unwind_Reason_Code _Unwind_RaiseException(_Unwind_Exception* exception) {
  ++raised;
  return next()(exception);
}

namespace redlimit::test {

bool canCountRaises() {
  if (next() == nullptr) return false;
  const std::uint64_t before = raised;
  try {
    throw 1;
  } catch (int) {
  }
  return raised == before + 1;
}

std::uint64_t raisedExceptions() { return raised; }

}  // namespace redlimit::test
