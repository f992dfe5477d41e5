// One place that turns hiredis failures and Redis error replies into redlimit exceptions.
#pragma once

#include <string_view>

namespace redlimit::detail {

/// Throws the exception for a failed hiredis context: `err` is redisContext::err, `savedErrno`
/// the errno captured right after the failing call, `errstr` redisContext::errstr, `what` says
/// what was being done ("connect to 127.0.0.1:6379", "EVALSHA acquire").
///   REDIS_ERR_IO + EAGAIN/EWOULDBLOCK/ETIMEDOUT/EINPROGRESS, REDIS_ERR_TIMEOUT -> TimeoutError
///   (hiredis 0.14 reports a read timeout as REDIS_ERR_IO with errno EAGAIN)
///   REDIS_ERR_EOF, EPIPE, ECONNRESET                                 -> ClosedError
///   anything else                                                    -> IoError
[[noreturn]] void throwContextError(int err, int savedErrno, std::string_view errstr,
                                    std::string_view what);

/// Throws the exception for an error reply `message` ("CODE text"). `fromScript` is true when the
/// reply answered EVAL/EVALSHA: then redlimit's own codes (REDLIMIT_NOT_INITIALIZED,
/// REDLIMIT_INVALID_CONFIG, REDLIMIT_INVALID_STATE, REDLIMIT_INVALID_ARGUMENT) and other script failures are typed.
///   LOADING, BUSY, MASTERDOWN, READONLY, CLUSTERDOWN, TRYAGAIN -> UnavailableError (an IoError);
///   WRONGPASS, NOAUTH, NOPERM -> AuthError; everything else ReplyError (or ScriptError).
[[noreturn]] void throwReplyError(std::string_view message, bool fromScript);

}  // namespace redlimit::detail
