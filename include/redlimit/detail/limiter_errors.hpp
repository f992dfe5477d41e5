// redlimit — the limiters' own error codes. The Redis layer reports an error a script raised with
// a code of its own as ScriptError(code, text); the limiters' scripts (lua/lib/base.lua's fail())
// use REDLIMIT_* codes, which this maps to the limiter error types.
#pragma once

#include <exception>

namespace redlimit::detail {

/// `error` with a REDLIMIT_* ScriptError replaced by its type: REDLIMIT_NOT_INITIALIZED ->
/// NotInitializedError, REDLIMIT_INVALID_CONFIG -> ScriptError (InvalidConfig), REDLIMIT_INVALID_STATE ->
/// ScriptError (InvalidState), REDLIMIT_INVALID_ARGUMENT -> InvalidArgument; anything else unchanged.
[[nodiscard]] std::exception_ptr limiterError(std::exception_ptr error);

}  // namespace redlimit::detail
