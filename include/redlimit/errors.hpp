// redlimit — error hierarchy.
//
// Every failure the library reports is a redlimit::Error. Outages (the decision could not be made
// because Redis was unreachable, slow, not serving yet, or the pool was exhausted) are IoError and
// its subclasses: only they are left to a limiter's FailurePolicy. A set-up that cannot work
// (a replica, a TLS port, no file descriptors left, a request over the server's limits) is a
// ConfigurationError; answers Redis gave are ReplyError and its subclasses; bad input is
// InvalidArgument, thrown before anything is sent. ConfigurationError and AuthError are thrown
// under every failure policy. src/base/error_mapping.cpp is the one place that classifies.
//
//   Error
//   ├── InvalidArgument          bad input, rejected on the client; nothing was sent
//   ├── IoError                  connect refused, reset, protocol error: no decision was made
//   │   ├── ClosedError          the server closed the connection
//   │   ├── UnavailableError     the server answered that it cannot serve now (LOADING, BUSY...)
//   │   ├── ProtocolError        the peer sent bytes that are not RESP, or a reply over ReplyLimits
//   │   └── TimeoutError         connect timeout, or a request's whole deadline passed
//   │       └── PoolTimeoutError too many requests already queued on this Client (PoolOptions::maxPending)
//   ├── ConfigurationError       the set-up is wrong; retrying will not help (not an outage)
//   │   ├── ReplicaError         the address names a read-only replica (READONLY, MASTERDOWN)
//   │   ├── TlsPortError         the port speaks TLS and the client was told to connect in plain text
//   │   ├── TlsError             TLS set-up failed: certificate not trusted, wrong name, unreadable files
//   │   ├── ResourceLimitError   this process or host ran out of file descriptors (EMFILE, ENFILE)
//   │   └── RequestLimitError    the server refused a request over its limits (proto-max-bulk-len...)
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
/// running a script (BUSY), has no room for another client ("max number of clients reached"), or
/// the cluster is down (CLUSTERDOWN, TRYAGAIN), or a primary lacks the replicas its
/// min-replicas-to-write asks for (NOREPLICAS). Like an unreachable server, no decision was made;
/// the failure policy applies. A replica is not this: see ReplicaError.
class UnavailableError : public IoError {
 public:
  UnavailableError(std::string code, const std::string& message) : IoError(message), code_(std::move(code)) {}
  [[nodiscard]] const std::string& code() const noexcept { return code_; }

 private:
  std::string code_;
};

/// The peer's bytes are not a RESP reply (garbage, a reply to nothing), or a reply exceeded
/// ConnectionOptions::replyLimits. The connection is closed; every request waiting on it fails.
class ProtocolError : public IoError {
 public:
  using IoError::IoError;
};

/// Connecting took longer than ConnectionOptions::connectTimeout, or a request's whole deadline
/// (queueing, writing and waiting for the reply) passed. A request that timed out after it was
/// written leaves its connection closed, so that no later reply can be matched to it.
class TimeoutError : public IoError {
 public:
  using IoError::IoError;
};

/// The Client already has PoolOptions::maxPending requests waiting for replies: congestion in this
/// process, not an outage (a limiter does not degrade on it).
class PoolTimeoutError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

/// A request's deadline passed while a completion callback held the Client's I/O thread (one
/// callback ran for 100 ms or more: it blocked). The cause is in this process, not in Redis: as for
/// PoolTimeoutError, the failure policy decides the call, the limiter does not degrade, and a
/// Cluster node is not marked down. Counted in PoolStats::stalled; the Client reports each such
/// callback as Event::Kind::CallbackBlocked.
class CallbackBlockedError : public PoolTimeoutError {
 public:
  using PoolTimeoutError::PoolTimeoutError;
};

/// The set-up cannot work, and trying again will not change that: the address names a replica, the
/// port speaks TLS, the process has no file descriptors left, or a request exceeds the server's
/// limits. Not an IoError: a limiter throws it under every FailurePolicy (it never fails open or
/// closed on it), and reports it to FailureOptions::onHealthChange as HealthEvent::Cause::Configuration.
/// code() is the server's error code when the server said so ("READONLY", "MASTERDOWN", "ERR"),
/// the errno name for a local cause ("EMFILE", "ENFILE"), else empty.
class ConfigurationError : public Error {
 public:
  ConfigurationError(std::string code, const std::string& message) : Error(message), code_(std::move(code)) {}
  [[nodiscard]] const std::string& code() const noexcept { return code_; }

 private:
  std::string code_;
};

/// The server is a read-only replica: it answered READONLY to a write, or MASTERDOWN (a replica
/// whose link to its master is down). Point the client at the primary. The connection is dropped,
/// so if a failover moves the primary behind the same address, the next call finds it.
class ReplicaError : public ConfigurationError {
 public:
  using ConfigurationError::ConfigurationError;
};

/// The port speaks TLS (the server reset the plain-text connection and answered a TLS hello with
/// a TLS record), and the client was set up for plain text: use rediss:// (TlsOptions::enabled) or
/// the server's plain port.
class TlsPortError : public ConfigurationError {
 public:
  using ConfigurationError::ConfigurationError;
};

/// TLS could not be set up: the server's certificate is not trusted by the configured CA, does not
/// name the host (or TlsOptions::serverName), a certificate or key file cannot be read, or the
/// server refused the client certificate. The message says which.
class TlsError : public ConfigurationError {
 public:
  using ConfigurationError::ConfigurationError;
};

/// A socket could not be created because this process (EMFILE: raise RLIMIT_NOFILE / `ulimit -n`,
/// or look for leaked descriptors) or the whole host (ENFILE: fs.file-max) has no file
/// descriptors left.
class ResourceLimitError : public ConfigurationError {
 public:
  using ConfigurationError::ConfigurationError;
};

/// The server refused a request that exceeds one of its limits (an "ERR Protocol error" reply such
/// as "invalid bulk length", or the connection closed while a request of more than 1 MiB was being
/// sent: proto-max-bulk-len and client-query-buffer-limit are at least 1 MiB). The server ran
/// nothing and closed the connection; the same request would fail again.
class RequestLimitError : public ConfigurationError {
 public:
  using ConfigurationError::ConfigurationError;
};

/// Redis answered with an error reply. code() is its first word ("ERR", "OOM", "NOSCRIPT", ...).
class ReplyError : public Error {
 public:
  ReplyError(std::string code, const std::string& message) : Error(message), code_(std::move(code)) {}
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
/// data redlimit cannot use: a value that is not an integer (as Lua's tonumber reads it, below
/// 10^14 in magnitude: `2.5`, `nan`, `abc`; ` 3` and `3e0` are 3), a key of the wrong type, or a sorted-set member that is not a packed permit entry (for example written by another
/// program). The script checked this before writing anything: the keys are unchanged.
class InvalidStateError : public ScriptError {
 public:
  using ScriptError::ScriptError;
};

}  // namespace redlimit
