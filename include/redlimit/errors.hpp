// redlimit — error hierarchy.
//
// Every failure the library reports is a redlimit::Error. Transport failures (the decision could
// not be made because Redis was unreachable, slow or the pool was exhausted) are IoError and its
// subclasses; answers Redis gave are ReplyError and its subclasses; bad input is InvalidArgument,
// thrown before anything is sent. src/error_mapping.cpp is the one place that classifies.
//
//   Error
//   ├── InvalidArgument          bad input, rejected on the client; nothing was sent
//   ├── IoError                  connect refused, reset, protocol error: no decision was made
//   │   ├── ClosedError          the server closed the connection
//   │   ├── UnavailableError     the server answered that it cannot serve now (LOADING, BUSY...)
//   │   └── TimeoutError         connect or command timeout
//   │       └── PoolTimeoutError no free connection within PoolOptions::waitTimeout
//   └── ReplyError               the server answered with an error reply (code(): "ERR", "OOM"...)
//       ├── UnexpectedReplyError the reply had another shape than the command answers
//       ├── AuthError            WRONGPASS / NOAUTH / no password given to a requirepass server
//       │   └── NoPermissionError    the ACL user lacks a command or key permission (NOPERM)
//       └── ScriptError          a script failed (also WRONGTYPE etc. raised by a script's commands)
//           ├── NotInitializedError  the limiter has no configuration (call trySetRate first)
//           ├── InvalidConfigError   the configuration hash holds values redlimit cannot use
//           └── InvalidStateError    a state key (value, permits) holds data redlimit cannot use
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace redlimit {

/// Base of every exception redlimit throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An argument was out of range or malformed. Thrown before any command is sent.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The connection to Redis failed (refused, reset, protocol error). No decision was made.
class IoError : public Error {
 public:
  using Error::Error;
};

/// The server closed the connection.
class ClosedError : public IoError {
 public:
  using IoError::IoError;
};

/// The server is up but cannot serve this command now: it is loading its data set (LOADING), busy
/// running a script (BUSY), a replica without its master (MASTERDOWN), read-only after a
/// failover (READONLY), or the cluster is down (CLUSTERDOWN, TRYAGAIN). Like an unreachable
/// server, no decision was made; the failure policy applies. The connection stays usable.
class UnavailableError : public IoError {
 public:
  UnavailableError(std::string code, const std::string& message) : IoError(message), code_(std::move(code)) {}
  [[nodiscard]] const std::string& code() const noexcept { return code_; }

 private:
  std::string code_;
};

/// Connecting or waiting for a reply took longer than the configured timeout.
class TimeoutError : public IoError {
 public:
  using IoError::IoError;
};

/// No pooled connection became free within PoolOptions::waitTimeout.
class PoolTimeoutError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

/// Redis answered with an error reply. code() is its first word ("ERR", "OOM", "NOSCRIPT", ...).
class ReplyError : public Error {
 public:
  ReplyError(std::string code, const std::string& message)
      : Error(message), code_(std::move(code)) {}
  [[nodiscard]] const std::string& code() const noexcept { return code_; }

 private:
  std::string code_;
};

/// The server answered, but not with the shape the command answers (for example an array where an
/// integer was expected). The message says what was expected and what came. code() is empty.
class UnexpectedReplyError : public ReplyError {
 public:
  explicit UnexpectedReplyError(const std::string& message) : ReplyError(std::string(), message) {}
};

/// Authentication failed: a wrong password or unknown ACL user (WRONGPASS), no password given to a
/// server that requires one (NOAUTH, or the connection closed as unauthenticated), or a password
/// given to a server that has none. Thrown under every FailurePolicy.
class AuthError : public ReplyError {
 public:
  using ReplyError::ReplyError;
};

/// The ACL user is authenticated but lacks a permission: to run a command (NOPERM ... 'evalsha'),
/// a command inside a script, or to access the limiter's keys. The message names what to grant.
class NoPermissionError : public AuthError {
 public:
  using AuthError::AuthError;
};

/// A Lua script raised an error, or a command it called failed (WRONGTYPE, "not an integer", ...).
/// Server refusals to run a script (NOSCRIPT, BUSY, LOADING, OOM, READONLY, NOPERM) keep their own
/// types even when the server reports them from inside the script.
class ScriptError : public ReplyError {
 public:
  using ReplyError::ReplyError;
};

/// The limiter's configuration hash does not exist: call trySetRate() or setRate() first.
class NotInitializedError : public ScriptError {
 public:
  using ScriptError::ScriptError;
};

/// The limiter's configuration hash holds values that are missing, not numbers or out of range
/// (for example written by another program).
class InvalidConfigError : public ScriptError {
 public:
  using ScriptError::ScriptError;
};

/// A state key of the limiter (`{name}:value`, `{name}:permits` or their per-client forms) holds
/// data redlimit cannot use: a value that is not a canonical decimal integer, a key of the wrong
/// type, or a sorted-set member that is not a packed permit entry (for example written by another
/// program). The script checked this before writing anything: the keys are unchanged.
class InvalidStateError : public ScriptError {
 public:
  using ScriptError::ScriptError;
};

}  // namespace redlimit
