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
//   Error                        kind(): the ErrorKind, code(): the server's or errno's code, if any
//   ├── InvalidArgument          bad input, rejected on the client; nothing was sent
//   ├── IoError                  no decision was made: Io (refused, reset), Unavailable (LOADING,
//   │   │                        BUSY...), Protocol (bytes that are not RESP, a reply over ClientOptions::ReplyLimits)
//   │   ├── ClosedError          the server closed the connection (kind Closed)
//   │   └── TimeoutError         Timeout (connect or whole-request deadline), PoolTimeout
//   │                            (ClientOptions::Pool::maxPending), CallbackBlocked (a callback held the I/O thread)
//   ├── ConfigurationError       the set-up is wrong; retrying will not help (not an outage): Replica,
//   │                            TlsPort, Tls, ResourceLimit, RequestLimit, Configuration
//   └── ReplyError               the server answered with an error reply (code(): "ERR", "OOM"...):
//       │                        Reply, UnexpectedReply (another shape than the command answers)
//       ├── AuthError            Auth (WRONGPASS, NOAUTH...), NoPermission (an ACL permission, NOPERM)
//       └── ScriptError          a script failed: Script, InvalidConfig (unusable configuration
//           │                    hash), InvalidState (unusable state key)
//           └── NotInitializedError  the limiter has no configuration (call trySetRate first)
//
// A type is what a caller acts on (catch IoError to retry, ClosedError to ask whether a refund went
// through, NotInitializedError to initialise); kind() tells the finer cause for logs, metrics and
// the rarer caller that needs it (e.kind() == ErrorKind::Tls).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace redlimit {

/// What went wrong, finer than the exception's type. The first ten kinds are also the metrics'
/// error labels (errorKindName in redlimit/metrics.hpp); each later kind is counted under one of
/// them (errorLabelKind: Tls under Configuration, NoPermission under Auth, ...).
enum class ErrorKind : std::uint8_t {
  // The metrics' labels, in their order.
  Timeout,          // TimeoutError: no reply within the request's deadline, or connecting took too long
  Closed,           // ClosedError: the connection closed under the request
  PoolTimeout,      // TimeoutError: ClientOptions::Pool::maxPending requests already in flight (congestion here)
  Unavailable,      // IoError: the server cannot serve now (LOADING, BUSY, CLUSTERDOWN, ...); code() says which
  Io,               // IoError: connect refused, reset, a name that does not resolve
  Configuration,    // ConfigurationError: another set-up error (a Cluster node, no scripts run for this user)
  Auth,             // AuthError: wrong password, unknown user, no password given or none configured
  Reply,            // ReplyError: another error reply (OOM, ERR ...)
  InvalidArgument,  // InvalidArgument: refused before anything was sent
  Other,            // an Error of no finer kind, or (in the metrics) not a redlimit::Error
  // Finer kinds (counted under the label in brackets).
  CallbackBlocked,  // TimeoutError: a completion callback held the I/O thread past the deadline [PoolTimeout]
  Protocol,         // IoError: the peer's bytes are not RESP, or a reply exceeded ClientOptions::ReplyLimits [Io]
  Replica,          // ConfigurationError: the server is a read-only replica (READONLY, MASTERDOWN) [Configuration]
  TlsPort,          // ConfigurationError: the port speaks TLS, the client plain text [Configuration]
  Tls,              // ConfigurationError: TLS set-up failed (trust, name, files) [Configuration]
  ResourceLimit,    // ConfigurationError: no file descriptor left (EMFILE, ENFILE) [Configuration]
  RequestLimit,     // ConfigurationError: a request over the server's limits [Configuration]
  UnexpectedReply,  // ReplyError: a reply of another shape than the command answers [Reply]
  NoPermission,     // AuthError: the ACL user lacks a command or key permission (NOPERM) [Auth]
  Script,           // ScriptError: a script failed (also WRONGTYPE etc. raised by its commands) [Reply]
  InvalidConfig,    // ScriptError: the configuration hash holds values redlimit cannot use [Reply]
  InvalidState,     // ScriptError: a state key holds data redlimit cannot use [Reply]
  NotInitialized,   // NotInitializedError: no configuration (call trySetRate first) [Reply]
};

/// Base of every exception redlimit throws. kind() says what went wrong; code() is the server's
/// error code ("READONLY", "LOADING"), the errno name of a local cause ("EMFILE"), or empty.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : Error(ErrorKind::Other, std::string(), message) {}
  explicit Error(const char* message) : Error(std::string(message)) {}

  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }
  [[nodiscard]] const std::string& code() const noexcept { return code_; }

 protected:
  Error(ErrorKind kind, std::string code, const std::string& message)
      : std::runtime_error(message), kind_(kind), code_(std::move(code)) {}

  /// `kind` if it is one of `allowed` (the kinds of the type being built), else `allowed`'s first:
  /// an error never carries a kind of another type.
  static constexpr ErrorKind oneOf(ErrorKind kind, std::initializer_list<ErrorKind> allowed) noexcept {
    for (const ErrorKind k : allowed) {
      if (k == kind) return kind;
    }
    return *allowed.begin();
  }

 private:
  ErrorKind kind_;
  std::string code_;
};

/// An argument was out of range or malformed. Thrown before any command is sent. Kind InvalidArgument.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message) : Error(ErrorKind::InvalidArgument, std::string(), message) {}
};

/// No decision was made: the connection to Redis failed (kind Io: refused, reset), the server is up
/// but cannot serve now (kind Unavailable, code() "LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN",
/// "NOREPLICAS", "ERR" for "max number of clients reached", "NODEDOWN" for a Cluster node marked
/// down), or the peer's bytes are not a RESP reply or a reply exceeded
/// ClientOptions::Connection::replyLimits (kind Protocol: the connection is closed, every request waiting
/// on it fails). The failure policy decides. A replica is not this: see ConfigurationError.
class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : IoError(ErrorKind::Io, std::string(), message) {}
  /// `kind`: Io, Unavailable or Protocol (another is taken as Io).
  IoError(ErrorKind kind, std::string code, const std::string& message)
      : Error(oneOf(kind, {ErrorKind::Io, ErrorKind::Unavailable, ErrorKind::Protocol}), std::move(code), message) {}

 protected:
  struct Exact {};
  IoError(Exact /*tag*/, ErrorKind kind, const std::string& message) : Error(kind, std::string(), message) {}
};

/// The server closed the connection (kind Closed). A request that was written may have run.
class ClosedError : public IoError {
 public:
  explicit ClosedError(const std::string& message) : IoError(Exact{}, ErrorKind::Closed, message) {}
};

/// kind Timeout: connecting took longer than ClientOptions::Connection::connectTimeout, or a request's whole
/// deadline (queueing, writing and waiting for the reply) passed; a request that timed out after it
/// was written leaves its connection closed, so that no later reply can be matched to it.
/// kind PoolTimeout: the Client already has ClientOptions::Pool::maxPending requests waiting for replies.
/// kind CallbackBlocked: the deadline passed while a completion callback held the Client's I/O
/// thread (one callback ran for 100 ms or more); counted in PoolStats::stalled, reported as
/// Event::Kind::CallbackBlocked. PoolTimeout and CallbackBlocked are congestion in this process,
/// not an outage: the failure policy decides the call, but a limiter does not degrade on them and a
/// Cluster node is not marked down.
class TimeoutError : public IoError {
 public:
  explicit TimeoutError(const std::string& message) : TimeoutError(ErrorKind::Timeout, message) {}
  /// `kind`: Timeout, PoolTimeout or CallbackBlocked (another is taken as Timeout).
  TimeoutError(ErrorKind kind, const std::string& message)
      : IoError(Exact{}, oneOf(kind, {ErrorKind::Timeout, ErrorKind::PoolTimeout, ErrorKind::CallbackBlocked}),
                message) {}
};

/// The set-up cannot work, and trying again will not change that. Not an IoError: a limiter throws
/// it under every FailurePolicy (it never fails open or closed on it), and reports it to
/// FailureOptions::onHealthChange as HealthEvent::Cause::Configuration. Kinds:
///   Replica        READONLY to a write, or MASTERDOWN: point the client at the primary. The
///                  connection is dropped, so a primary that a failover moves behind the same
///                  address is found by the next call.
///   TlsPort        the port speaks TLS and the client was set up for plain text: use rediss://
///                  (ClientOptions::Tls::enabled) or the server's plain port.
///   Tls            TLS could not be set up (code "TLS"): the server's certificate is not trusted by
///                  the configured CA or does not name the host (or ClientOptions::Tls::serverName), a
///                  certificate or key file cannot be read, or the server refused the client
///                  certificate. The message says which.
///   ResourceLimit  no file descriptor left: in this process (code "EMFILE": raise RLIMIT_NOFILE /
///                  `ulimit -n`, or look for leaked descriptors) or on the host ("ENFILE": fs.file-max).
///   RequestLimit   the server refused a request over its limits ("ERR Protocol error" such as
///                  "invalid bulk length", or the connection closed while a request of more than
///                  1 MiB was being sent). The server ran nothing; the same request would fail again.
///   Configuration  anything else: a Cluster node answering MOVED to a one-server Client, or a
///                  server that runs no scripts (code "ERR": EVALSHA or EVAL renamed away, a Valkey
///                  without its Lua module; code "NOPERM": the ACL user may not run EVALSHA, SCRIPT
///                  LOAD or EVAL). The message names the cause and the commands redlimit sends.
/// code() is the server's error code when the server said so ("READONLY", "MASTERDOWN", "ERR", "NOPERM"),
/// the errno name for a local cause ("EMFILE", "ENFILE"), "TLS", else empty.
class ConfigurationError : public Error {
 public:
  ConfigurationError(std::string code, const std::string& message)
      : ConfigurationError(ErrorKind::Configuration, std::move(code), message) {}
  /// `kind`: Configuration, Replica, TlsPort, Tls, ResourceLimit or RequestLimit (another is taken
  /// as Configuration).
  ConfigurationError(ErrorKind kind, std::string code, const std::string& message)
      : Error(oneOf(kind, {ErrorKind::Configuration, ErrorKind::Replica, ErrorKind::TlsPort, ErrorKind::Tls,
                           ErrorKind::ResourceLimit, ErrorKind::RequestLimit}),
              std::move(code), message) {}
};

/// Redis answered with an error reply (kind Reply; code() is its first word: "ERR", "OOM",
/// "NOSCRIPT", ...), or a reply of another shape than the command answers (kind UnexpectedReply,
/// for example an array where an integer was expected; the message says what was expected and what
/// came; code() is empty).
class ReplyError : public Error {
 public:
  ReplyError(std::string code, const std::string& message) : ReplyError(ErrorKind::Reply, std::move(code), message) {}
  /// `kind`: Reply or UnexpectedReply (another is taken as Reply).
  ReplyError(ErrorKind kind, std::string code, const std::string& message)
      : Error(oneOf(kind, {ErrorKind::Reply, ErrorKind::UnexpectedReply}), std::move(code), message) {}

 protected:
  struct Exact {};
  ReplyError(Exact /*tag*/, ErrorKind kind, std::string code, const std::string& message)
      : Error(kind, std::move(code), message) {}
};

/// kind Auth: authentication failed: a wrong password or unknown ACL user (WRONGPASS), no password
/// given to a server that requires one (NOAUTH, or the connection closed as unauthenticated), or a
/// password given to a server that has none. kind NoPermission: the ACL user is authenticated but
/// lacks a permission to access the limiter's keys, or to run a command inside a script (or
/// another command redlimit sends directly); the message names what to grant. A user that may not
/// run the scripts themselves (EVALSHA, SCRIPT LOAD, EVAL) gets a ConfigurationError instead: the
/// server runs no scripts for it. Thrown under every FailurePolicy.
class AuthError : public ReplyError {
 public:
  AuthError(std::string code, const std::string& message) : AuthError(ErrorKind::Auth, std::move(code), message) {}
  /// `kind`: Auth or NoPermission (another is taken as Auth).
  AuthError(ErrorKind kind, std::string code, const std::string& message)
      : ReplyError(Exact{}, oneOf(kind, {ErrorKind::Auth, ErrorKind::NoPermission}), std::move(code), message) {}
};

/// A script failed. Kinds:
///   Script         a Lua script raised an error, or a command it called failed (WRONGTYPE, "not
///                  an integer", ...). Server refusals to run a script (NOSCRIPT, BUSY, LOADING, OOM,
///                  READONLY, NOPERM) keep their own types even when reported from inside it.
///   InvalidConfig  the limiter's configuration hash holds values that are missing, not numbers or
///                  out of range, or its key holds another Redis type or another kind of limiter
///                  (for example written by another program).
///   InvalidState   a state key of the limiter (`{name}:value`, `{name}:permits` or their per-client
///                  forms) holds data redlimit cannot use: a value that is not an integer (as Lua's
///                  tonumber reads it, below 10^14 in magnitude: `2.5`, `nan`, `abc`; ` 3` and `3e0`
///                  are 3), a key of the wrong type, or a sorted-set member that is not a packed
///                  permit entry. The script checked this before writing anything: the keys are
///                  unchanged.
class ScriptError : public ReplyError {
 public:
  ScriptError(std::string code, const std::string& message)
      : ScriptError(ErrorKind::Script, std::move(code), message) {}
  /// `kind`: Script, InvalidConfig or InvalidState (another is taken as Script).
  ScriptError(ErrorKind kind, std::string code, const std::string& message)
      : ReplyError(Exact{}, oneOf(kind, {ErrorKind::Script, ErrorKind::InvalidConfig, ErrorKind::InvalidState}),
                   std::move(code), message) {}

 protected:
  using ReplyError::Exact;
  ScriptError(Exact tag, ErrorKind kind, std::string code, const std::string& message)
      : ReplyError(tag, kind, std::move(code), message) {}
};

/// The limiter's configuration hash does not exist: call trySetRate() or setRate() first. Kind
/// NotInitialized.
class NotInitializedError : public ScriptError {
 public:
  NotInitializedError(std::string code, const std::string& message)
      : ScriptError(Exact{}, ErrorKind::NotInitialized, std::move(code), message) {}
};

}  // namespace redlimit
