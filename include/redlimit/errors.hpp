// redlimit — error hierarchy.
//
// Every failure the library reports is a redlimit::Error. Transport failures (the decision could
// not be made because Redis was unreachable, slow or the pool was exhausted) are IoError and its
// subclasses; answers Redis gave are ReplyError and its subclasses; bad input is InvalidArgument,
// thrown before anything is sent.
//
//   Error
//   ├── InvalidArgument          bad input, rejected on the client; nothing was sent
//   ├── IoError                  connect refused, reset, protocol error: no decision was made
//   │   ├── ClosedError          the server closed the connection
//   │   ├── UnavailableError     the server answered that it cannot serve now (LOADING, BUSY...)
//   │   └── TimeoutError         connect or command timeout
//   │       └── PoolTimeoutError no free connection within PoolOptions::waitTimeout
//   └── ReplyError               the server answered with an error reply (code(): "ERR", "OOM"...)
//       ├── AuthError            WRONGPASS / NOAUTH / NOPERM
//       └── ScriptError          a script failed
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

/// Authentication failed or the ACL user lacks a permission (WRONGPASS, NOAUTH, NOPERM).
class AuthError : public ReplyError {
 public:
  using ReplyError::ReplyError;
};

/// A Lua script raised an error.
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
