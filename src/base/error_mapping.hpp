// One place that turns hiredis failures and Redis error replies into redlimit exceptions.
//
// The classification (see README "Error model"):
//   outage, left to the failure policy (IoError): refused, reset, closed, timeouts, protocol
//     garbage; LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, "max number of clients reached"
//     (kind Unavailable)
//   configuration, thrown under every policy (ConfigurationError): READONLY, MASTERDOWN
//     (kind Replica); TLS bytes as a reply (TlsPort); EMFILE, ENFILE (ResourceLimit);
//     "ERR Protocol error: ..." other than unauthenticated (RequestLimit); the server runs no
//     scripts (kind Configuration): "ERR unknown command" or "ERR Could not find scripting
//     engine" to EVALSHA / EVAL (scripting switched off), NOPERM for EVALSHA, EVAL or SCRIPT
//     LOAD (the ACL user may not run scripts)
//   credentials, thrown under every policy (AuthError): WRONGPASS, NOAUTH, "Protocol error:
//     unauthenticated ...", AUTH without a configured password; NOPERM for another command or
//     for keys, and a script's "can't run this command" (kind NoPermission)
//   an error raised while a script ran (" script: <sha>" trailer, user_script): ScriptError, or
//     redlimit's own REDLIMIT_* codes
//   anything else: ReplyError (OOM with its cause spelled out)
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace redlimit {
class Error;
}  // namespace redlimit

namespace redlimit::detail {

/// What was being done when a reply error arrived, for the messages.
struct ReplyContext {
  std::string_view command;  // argv[0] ("EVALSHA", "AUTH", ...); "" if unknown
  std::string_view user;     // the ACL user the connection authenticates as; "" = default
  bool fromScript = false;   // the reply answered EVAL/EVALSHA
  bool toSentinel = false;   // the server is a Sentinel: a refused login names ClientOptions::Sentinel
};

/// Throws the exception for a failed hiredis context: `err` is redisContext::err, `savedErrno`
/// the errno captured right after the failing call, `errstr` redisContext::errstr, `what` says
/// what was being done ("connect to 127.0.0.1:6379", "EVALSHA acquire").
///   errno EMFILE / ENFILE (any err)                                  -> ConfigurationError, ResourceLimit
///   REDIS_ERR_PROTOCOL on a TLS record byte (0x15 alert, 0x16 hello) -> ConfigurationError, TlsPort
///   REDIS_ERR_IO + EAGAIN/EWOULDBLOCK/ETIMEDOUT/EINPROGRESS, REDIS_ERR_TIMEOUT -> TimeoutError
///   (hiredis 0.14 reports a read timeout as REDIS_ERR_IO with errno EAGAIN)
///   REDIS_ERR_EOF, EPIPE, ECONNRESET                                 -> ClosedError
///   anything else                                                    -> IoError
[[noreturn]] void throwContextError(int err, int savedErrno, std::string_view errstr, std::string_view what);

/// Throws the exception for a failed system call on a socket (connect, recv, send, ...): the
/// same classification as throwContextError for REDIS_ERR_IO, with strerror(savedErrno) as the
/// text: EMFILE / ENFILE -> ConfigurationError (ResourceLimit), EAGAIN / ETIMEDOUT -> TimeoutError, EPIPE /
/// ECONNRESET -> ClosedError, anything else -> IoError. `what`: "connect to 127.0.0.1:6379".
[[noreturn]] void throwErrnoError(int savedErrno, std::string_view what);

/// Throws the exception for an error reply `message` ("CODE text"); see the table above.
[[noreturn]] void throwReplyError(std::string_view message, const ReplyContext& context);
/// The same, without a command name or user: `fromScript` is true when the reply answered
/// EVAL/EVALSHA.
[[noreturn]] void throwReplyError(std::string_view message, bool fromScript);

/// True if the error reply `message` says that the server runs no scripts for this client, the
/// ConfigurationError of kind Configuration that throwReplyError throws for it (see the table
/// above): scripting switched off (`fromScript`: the reply answered EVAL/EVALSHA), or NOPERM for
/// EVALSHA, EVAL or SCRIPT LOAD.
[[nodiscard]] bool runsNoScripts(std::string_view message, bool fromScript);

/// True if the server closes the connection after this error reply (protocol errors, "max number
/// of clients reached"), or redlimit should not use the connection again (READONLY, MASTERDOWN:
/// the next connection may reach a new primary behind the same address).
[[nodiscard]] bool replyEndsConnection(std::string_view message);

/// The redlimit::Error `error` holds, or null (no error, or an exception of another type). The
/// object belongs to `error`: valid while it (or a copy of it) is alive. With libstdc++ it is
/// found without rethrowing (the exception_ptr's type and object, matched as a catch clause
/// matches them, std::type_info::__do_catch): a rethrow unwinds, about 2 µs each, and a timed-out
/// pipeline fails every request it held at once, on the I/O thread. Elsewhere it rethrows.
[[nodiscard]] const Error* errorIn(const std::exception_ptr& error) noexcept;

/// A new exception object of the dynamic type and contents of `error` (the most derived type
/// errors.hpp declares, for a subclass of one of them). Allocates, never throws an exception
/// to copy it (std::make_exception_ptr of the concrete type does not unwind in libstdc++).
[[nodiscard]] std::exception_ptr copyError(const Error& error);

/// A new exception object of the same type and contents as the one `error` holds (a redlimit
/// error, copied with copyError; anything else is returned as is). Each party that gets an error
/// from another thread gets its own object: libstdc++ counts exception_ptr references inside its
/// uninstrumented library, so ThreadSanitizer cannot see that a shared exception is destroyed
/// only after every thread is done with it, and one object per recipient leaves nothing to see.
[[nodiscard]] std::exception_ptr cloneError(const std::exception_ptr& error);

/// The demangled type of `e` ("redlimit::ConfigurationError"), for HealthEvent::errorType and messages.
[[nodiscard]] std::string errorTypeName(const std::exception& e);

/// True for congestion in this process, not an outage of Redis: a TimeoutError of kind PoolTimeout
/// (ClientOptions::Pool::maxPending reached) or CallbackBlocked (a callback held the I/O thread). A limiter
/// does not degrade on it, a Cluster node is not marked down, a Sentinel does not look for another
/// primary.
[[nodiscard]] bool isCongestion(const Error& error) noexcept;

}  // namespace redlimit::detail
