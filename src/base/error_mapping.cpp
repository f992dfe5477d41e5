#include "base/error_mapping.hpp"

#include <cerrno>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <typeinfo>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define REDLIMIT_HAVE_CXXABI 1
#endif

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

bool isTimeoutErrno(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == ETIMEDOUT || e == EINPROGRESS; }

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

bool startsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

// Redis 7 appends " script: <sha>, on @user_script:<line>." to an error raised while a script
// ran (by a command it called, or by error()); a compile error names user_script.
bool raisedByScript(std::string_view message) {
  return contains(message, " script: ") || contains(message, "user_script");
}

// The error codes Redis itself answers with (7.x); a script may raise any other.
bool isServerCode(std::string_view code) {
  static constexpr std::string_view kCodes[] = {
      "ERR",       "WRONGTYPE", "OOM",        "NOSCRIPT",   "BUSY",        "LOADING",    "NOAUTH",
      "WRONGPASS", "NOPERM",    "READONLY",   "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",   "MOVED",
      "ASK",       "EXECABORT", "NOREPLICAS", "MISCONF",    "BUSYKEY",     "UNKILLABLE", "NOTBUSY",
      "NOPROTO",   "CROSSSLOT", "BUSYGROUP",  "NOGROUP",    "UNBLOCKED",   "NOTREADONLY"};
  return std::find(std::begin(kCodes), std::end(kCodes), code) != std::end(kCodes);
}

// Where the login a server refused is configured, for the advice of an AuthError.
struct LoginOptions {
  std::string_view check;       // what to check after WRONGPASS
  std::string_view set;         // what to set after NOAUTH
  std::string_view leaveEmpty;  // what to leave empty for a server without a password
};

constexpr LoginOptions kServerLogin{
    "ClientOptions::Connection::user and ::password",
    "set ClientOptions::Connection::password (and ::user for an ACL user), or redis://[user]:password@host",
    "ClientOptions::Connection::password"};
constexpr LoginOptions kSentinelLogin{
    "the sentinels' own login: ClientOptions::Sentinel::user and ::password, or sentinel_user= and sentinel_password= "
    "in "
    "the URI",
    "set the sentinels' own ClientOptions::Sentinel::password (and ::user for an ACL user), or sentinel_password= in "
    "the URI",
    "ClientOptions::Sentinel::password (sentinel_password= in the URI)"};

std::string userName(const ReplyContext& c) { return c.user.empty() ? "default" : std::string(c.user); }

// "NOPERM this user has no permissions to run the 'evalsha' command" -> "evalsha".
std::string quotedCommand(std::string_view message) {
  const auto open = message.find("run the '");
  if (open == std::string_view::npos) return {};
  const auto start = open + 9;
  const auto close = message.find('\'', start);
  return close == std::string_view::npos ? std::string() : std::string(message.substr(start, close - start));
}

// What redlimit sends to run a script, for the messages: EVALSHA always; after a NOSCRIPT, SCRIPT
// LOAD and the EVALSHA again; after a second NOSCRIPT, EVAL with the source (transport/pipeline.cpp).
constexpr std::string_view kScriptCommands =
    "redlimit decides every call in a Lua script: it sends EVALSHA, and SCRIPT LOAD then EVAL when the server "
    "does not hold the script";

// The server cannot run redlimit's scripts (`cause` says why, `remedy` what to change): a
// configuration error, whether it is the server's (scripting off) or the ACL user's (no permission
// to run them). No retry or failure policy changes it.
[[noreturn]] void throwNoScripts(std::string_view code, const std::string& text, std::string_view cause,
                                 std::string_view remedy) {
  throw ConfigurationError(std::string(code),
                           fmt::format("redlimit: the server runs no scripts{}: {} ({}; {}; a configuration error, "
                                       "thrown under every failure policy)",
                                       cause, text, kScriptCommands, remedy));
}

// True for a NOPERM that refuses one of the commands that run a script: "NOPERM this user has no
// permissions to run the 'evalsha' command" (Redis 7.0; 7.2 says "User <name> has no ..."), 'eval',
// 'script|load' (Redis 6.2 names the parent: "the 'script' command or its subcommand").
bool aclRefusesScripts(std::string_view message) {
  if (!startsWith(message, "NOPERM ")) return false;
  const std::string command = quotedCommand(message);
  return command == "evalsha" || command == "eval" || command == "script|load" || command == "script";
}

// Scripting switched off: rename-command EVALSHA "" (or EVAL and SCRIPT: the NOSCRIPT resend as
// EVAL meets it), or a Valkey without its Lua module, whose EVAL and SCRIPT LOAD answer
// "ERR Could not find scripting engine 'lua'" (valkey src/eval.c) and EVALSHA NOSCRIPT.
bool scriptingSwitchedOff(std::string_view message, bool fromScript) {
  return fromScript &&
         (startsWith(message, "ERR unknown command") || startsWith(message, "ERR Could not find scripting engine"));
}

[[noreturn]] void throwPermission(std::string_view code, const std::string& text, const ReplyContext& c) {
  const std::string user = userName(c);
  std::string grant;
  if (contains(text, "access one of the keys") || contains(text, "can't access")) {
    grant = fmt::format(
        "grant the user the limiter's keys, e.g. ACL SETUSER {} ~* (or a pattern matching the limiter's name and its "
        "{{name}}:* keys)",
        user);
  } else if (contains(text, "The user executing the script")) {
    grant = fmt::format("grant the commands redlimit's scripts call, e.g. ACL SETUSER {} +@read +@write +time", user);
  } else {
    std::string command = quotedCommand(text);
    if (command.empty()) command = c.command.empty() ? std::string("<command>") : std::string(c.command);
    std::transform(command.begin(), command.end(), command.begin(),
                   [](char ch) { return static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); });
    grant = fmt::format("grant it, e.g. ACL SETUSER {} +{}", user, command);
  }
  throw AuthError(ErrorKind::NoPermission, std::string(code),
                  fmt::format("redlimit: ACL user '{}' lacks a permission (not a password problem): {}; {} "
                              "(redlimit needs +evalsha +eval +script|load, and inside its scripts +@read "
                              "+@write +time, on the limiter's keys)",
                              user, text, grant));
}

}  // namespace

void throwContextError(int err, int savedErrno, std::string_view errstr, std::string_view what) {
  const std::string message = fmt::format("redlimit: {}: {}", what, errstr);
  // No descriptor left: not an outage of Redis, and no retry fixes it. hiredis 0.14 reports it as
  // REDIS_ERR_IO (unix socket), REDIS_ERR_OTHER "Can't create socket" (TCP) or "System error"
  // (getaddrinfo), each with errno set.
  if (savedErrno == EMFILE ||
      (savedErrno == 0 && contains(errstr, "Too many open files") && !contains(errstr, "in system"))) {
    throw ConfigurationError(ErrorKind::ResourceLimit, "EMFILE",
                             fmt::format("{} (no file descriptor left in this process, EMFILE: raise "
                                         "RLIMIT_NOFILE / ulimit -n, or look for leaked descriptors)",
                                         message));
  }
  if (savedErrno == ENFILE || contains(errstr, "Too many open files in system")) {
    throw ConfigurationError(ErrorKind::ResourceLimit, "ENFILE",
                             fmt::format("{} (no file descriptor left on this host, ENFILE: raise "
                                         "fs.file-max, or find the process that holds them)",
                                         message));
  }
  // A TLS record where a RESP reply was expected: 0x15 is an alert, 0x16 a handshake.
  if (err == REDIS_ERR_PROTOCOL && (contains(errstr, "got \"\\x15\"") || contains(errstr, "got \"\\x16\""))) {
    throw ConfigurationError(ErrorKind::TlsPort, "",
                             fmt::format("{} (the server answered with TLS bytes: this port speaks TLS, and redlimit "
                                         "connects in plain text; use the server's plain port)",
                                         message));
  }
#ifdef REDIS_ERR_TIMEOUT
  if (err == REDIS_ERR_TIMEOUT) throw TimeoutError(message);
#endif
  if (err == REDIS_ERR_EOF) throw ClosedError(message);
  if (err == REDIS_ERR_IO) {
    // errno is the reliable signal; the text is a fallback for code paths that clobber errno.
    if (isTimeoutErrno(savedErrno) || contains(errstr, std::strerror(EAGAIN)) || contains(errstr, "timed out") ||
        contains(errstr, "timeout")) {
      throw TimeoutError(message);
    }
    if (savedErrno == ECONNRESET || savedErrno == EPIPE || contains(errstr, "reset by peer") ||
        contains(errstr, "Broken pipe")) {
      throw ClosedError(message);
    }
  }
  throw IoError(message);
}

void throwErrnoError(int savedErrno, std::string_view what) {
  throwContextError(REDIS_ERR_IO, savedErrno, std::strerror(savedErrno), what);
}

void throwReplyError(std::string_view message, bool fromScript) {
  ReplyContext context;
  context.fromScript = fromScript;
  throwReplyError(message, context);
}

void throwReplyError(std::string_view message, const ReplyContext& context) {
  std::string_view code = message.substr(0, message.find(' '));
  std::string text(message);
  std::string codeText(code);

  // Credentials: no retry or policy fixes them.
  const LoginOptions& login = context.toSentinel ? kSentinelLogin : kServerLogin;
  if (code == "WRONGPASS") {
    throw AuthError(codeText, fmt::format("redlimit: authentication failed: {} (check {})", text, login.check));
  }
  if (code == "NOAUTH" || startsWith(message, "ERR Protocol error: unauthenticated")) {
    // More than 10 arguments (or a bulk over 16 KiB) from an unauthenticated client make Redis
    // answer "Protocol error: unauthenticated multibulk length" and close the connection.
    throw AuthError(codeText, fmt::format("redlimit: authentication failed: {} (the server requires a password: {})",
                                          text, login.set));
  }
  if (code == "ERR" && contains(message, "called without any password configured")) {
    throw AuthError(codeText, fmt::format("redlimit: authentication failed: {} (the server has no password for this "
                                          "user: leave {} empty, or set one on the server)",
                                          text, login.leaveEmpty));
  }
  if (aclRefusesScripts(message)) {
    const std::string user = userName(context);
    throwNoScripts(code, text, fmt::format(" for ACL user '{}'", user),
                   fmt::format("grant them, e.g. ACL SETUSER {} +evalsha +script|load +eval", user));
  }
  if (code == "NOPERM" || (code == "ERR" && contains(message, "The user executing the script can't"))) {
    throwPermission(code, text, context);
  }

  // A replica: the address is wrong (or names a primary that was demoted); not an outage.
  if (code == "READONLY" || code == "MASTERDOWN") {
    throw ConfigurationError(ErrorKind::Replica, codeText,
                             fmt::format("redlimit: the server is a replica, not the primary: {} (point "
                                         "ClientOptions::Connection at the primary; this is a configuration error, "
                                         "thrown under every failure policy)",
                                         text));
  }
  // A Redis Cluster node asked for a slot it does not serve: the Client was set up for one server.
  // (A cluster Client follows these redirects itself and never lets one reach a caller.)
  if (code == "MOVED" || code == "ASK") {
    throw ConfigurationError(codeText,
                             fmt::format("redlimit: the server is a Redis Cluster node and another node "
                                         "serves this key's slot: {} (connect with "
                                         "redis-cluster://host:port, or ClientOptions::topology = "
                                         "ClientOptions::Topology::Cluster; thrown under every failure policy)",
                                         text));
  }
  // Up, but cannot serve now: an outage the failure policy decides. NOREPLICAS: a primary with
  // min-replicas-to-write set has lost the replicas it needs to accept writes.
  if (code == "LOADING" || code == "BUSY" || code == "CLUSTERDOWN" || code == "TRYAGAIN" || code == "NOREPLICAS" ||
      startsWith(message, "ERR max number of clients reached")) {
    throw IoError(ErrorKind::Unavailable, codeText, fmt::format("redlimit: Redis cannot serve now: {}", text));
  }
  // The request broke one of the server's limits; it ran nothing and closes the connection.
  if (startsWith(message, "ERR Protocol error:")) {
    throw ConfigurationError(ErrorKind::RequestLimit, codeText,
                             fmt::format("redlimit: the server refused the request and closed the "
                                         "connection: {} (an argument exceeds proto-max-bulk-len, or the "
                                         "request client-query-buffer-limit; nothing was run)",
                                         text));
  }
  if (scriptingSwitchedOff(message, context.fromScript)) {
    throwNoScripts(code, text, "", "enable them: no rename-command of them; on Valkey, load its Lua module");
  }
  if (context.fromScript) {
    // error({err = "REDLIMIT_X message"}) from lua/lib/base.lua's fail() arrives as "REDLIMIT_X message".
    // error() in a script appends " script: <sha>, on @user_script:<line>."; keep our own text.
    auto ownText = [&] {
      std::string_view rest = message.substr(std::min(message.size(), code.size() + 1));
      return std::string(rest.substr(0, rest.find(" script: ")));
    };
    // The script's own error (error_reply or error() with "CODE text"): a code Redis never uses
    // itself. A ScriptError with the script's text (without the trailer Redis appends); the layer
    // that owns the script gives the code its meaning (the limiters map their REDLIMIT_* codes to
    // NotInitializedError, ScriptError of kind InvalidConfig, ...).
    if (!isServerCode(code)) throw ScriptError(codeText, ownText());
    // OOM and NOSCRIPT are the server refusing to run (or go on with) the script, even when it
    // says so from inside it: plain ReplyError, so callers can tell "Redis said no" from "the
    // script failed". Anything else raised while the script ran is the script's failure.
    if (code != "OOM" && code != "NOSCRIPT" &&
        (raisedByScript(message) || (code == "ERR" && (contains(message, "script") || contains(message, "Script"))))) {
      if (code == "WRONGTYPE") {
        throw ScriptError(codeText, fmt::format("redlimit: script failed: {} (a key the script uses holds another type "
                                                "of value: was it written by another program? check the keys the "
                                                "script was given)",
                                                text));
      }
      throw ScriptError(codeText, fmt::format("redlimit: script failed: {}", text));
    }
  }
  if (code == "OOM") {
    throw ReplyError(codeText, fmt::format("redlimit: Redis is out of memory (maxmemory reached, nothing was "
                                           "written): {}",
                                           text));
  }
  throw ReplyError(codeText, fmt::format("redlimit: Redis replied with an error: {}", text));
}

namespace {

// Every type errors.hpp declares below Error, each before its bases (copyAs's order).
template <class... E>
struct ErrorTypes {};
using DerivedErrors = ErrorTypes<TimeoutError, ClosedError, IoError, ConfigurationError, AuthError, NotInitializedError,
                                 ScriptError, ReplyError, InvalidArgument>;

// The copy as the listed type `error` is exactly (one type_info comparison each), else as the
// first listed type it derives from, as a chain of catch clauses, most derived first, would;
// else as an Error.
template <class... E>
std::exception_ptr copyAs(const Error& error, ErrorTypes<E...> /*types*/) {
  std::exception_ptr copy;
  if (((typeid(error) == typeid(E) && (copy = std::make_exception_ptr(static_cast<const E&>(error)))) || ...)) {
    return copy;
  }
  if (((dynamic_cast<const E*>(&error) != nullptr && (copy = std::make_exception_ptr(dynamic_cast<const E&>(error)))) ||
       ...)) {
    return copy;
  }
  return std::make_exception_ptr(error);
}

}  // namespace

const Error* errorIn(const std::exception_ptr& error) noexcept {
  if (!error) return nullptr;
#if defined(__GLIBCXX__) && defined(__cpp_rtti)
  // libstdc++'s exception_ptr is one pointer, to the thrown object (its ABI since GCC 4.4;
  // bits/exception_ptr.h), and tells the object's type. __do_catch is the test a catch clause
  // makes, and adjusts the pointer to the base subobject as the catch would.
  static_assert(sizeof(std::exception_ptr) == sizeof(void*), "libstdc++'s exception_ptr is one pointer");
  const std::type_info* thrown = error.__cxa_exception_type();
  void* object = nullptr;
  std::memcpy(&object, static_cast<const void*>(&error), sizeof object);
  if (thrown == nullptr || object == nullptr || !typeid(Error).__do_catch(thrown, &object, 1)) return nullptr;
  return static_cast<const Error*>(object);
#else
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return &e;  // the object `error` holds: std::rethrow_exception throws it, not a copy
  } catch (...) {
    return nullptr;
  }
#endif
}

std::exception_ptr copyError(const Error& error) { return copyAs(error, DerivedErrors{}); }

std::exception_ptr cloneError(const std::exception_ptr& error) {
  if (const Error* e = errorIn(error)) return copyError(*e);
  return error;
}

bool runsNoScripts(std::string_view message, bool fromScript) {
  return aclRefusesScripts(message) || scriptingSwitchedOff(message, fromScript);
}

bool replyEndsConnection(std::string_view message) {
  return startsWith(message, "ERR Protocol error:") || startsWith(message, "ERR max number of clients reached") ||
         startsWith(message, "READONLY") || startsWith(message, "MASTERDOWN");
}

bool isCongestion(const Error& error) noexcept {
  return error.kind() == ErrorKind::PoolTimeout || error.kind() == ErrorKind::CallbackBlocked;
}

std::string errorTypeName(const std::exception& e) {
  const char* mangled = typeid(e).name();
#ifdef REDLIMIT_HAVE_CXXABI
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  if (status == 0 && name) return name.get();
#endif
  return mangled;
}

}  // namespace redlimit::detail
