// The one place that classifies failures (src/base/error_mapping.cpp).
#include <cerrno>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "base/error_mapping.hpp"
#include "limiters/completion.hpp"
#include "transport/pipeline.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit_test/raise_counter.hpp"

using namespace redlimit;
using detail::Reply;
using detail::throwContextError;
using detail::throwReplyError;

TEST(ErrorMapping, ReadTimeoutOnHiredis014IsTimeout) {
  // hiredis 0.14 reports SO_RCVTIMEO expiry as REDIS_ERR_IO with errno EAGAIN.
  EXPECT_THROW(throwContextError(REDIS_ERR_IO, EAGAIN, "Resource temporarily unavailable", "GET"), TimeoutError);
  EXPECT_THROW(throwContextError(REDIS_ERR_IO, 0, "Resource temporarily unavailable", "GET"), TimeoutError);
  EXPECT_THROW(throwContextError(REDIS_ERR_IO, ETIMEDOUT, "Connection timed out", "connect"), TimeoutError);
}

TEST(ErrorMapping, ClosedAndRefused) {
  EXPECT_THROW(throwContextError(REDIS_ERR_EOF, 0, "Server closed the connection", "GET"), ClosedError);
  EXPECT_THROW(throwContextError(REDIS_ERR_IO, ECONNRESET, "Connection reset by peer", "GET"), ClosedError);
  try {
    throwContextError(REDIS_ERR_IO, ECONNREFUSED, "Connection refused", "connect to 127.0.0.1:1");
    FAIL();
  } catch (const TimeoutError&) {
    FAIL() << "refused is not a timeout";
  } catch (const ClosedError&) {
    FAIL() << "refused is not closed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("connect to 127.0.0.1:1"), std::string::npos);
  }
}

TEST(ErrorMapping, EveryErrorTypeHasItsPlainKindAndACode) {
  EXPECT_EQ(Error("x").kind(), ErrorKind::Other);
  EXPECT_EQ(Error("x").code(), "");
  EXPECT_EQ(InvalidArgument("x").kind(), ErrorKind::InvalidArgument);
  EXPECT_EQ(IoError("x").kind(), ErrorKind::Io);
  EXPECT_EQ(ClosedError("x").kind(), ErrorKind::Closed);
  EXPECT_EQ(TimeoutError("x").kind(), ErrorKind::Timeout);
  const ConfigurationError configuration("EMFILE", "x");
  EXPECT_EQ(configuration.kind(), ErrorKind::Configuration);
  EXPECT_EQ(configuration.code(), "EMFILE");
  EXPECT_EQ(ReplyError("OOM", "x").kind(), ErrorKind::Reply);
  EXPECT_EQ(AuthError("WRONGPASS", "x").kind(), ErrorKind::Auth);
  EXPECT_EQ(ScriptError("ERR", "x").kind(), ErrorKind::Script);
  const NotInitializedError notInitialized("REDLIMIT_NOT_INITIALIZED", "x");
  EXPECT_EQ(notInitialized.kind(), ErrorKind::NotInitialized);
  EXPECT_EQ(static_cast<const Error&>(notInitialized).code(), "REDLIMIT_NOT_INITIALIZED");
}

TEST(ErrorMapping, AKindOfAnotherTypeIsTakenAsTheTypesPlainKind) {
  // A type never carries a kind its family does not have: a handler that catches the type and
  // switches on the kind sees only the kinds errors.hpp lists for it.
  EXPECT_EQ(IoError(ErrorKind::Tls, "", "x").kind(), ErrorKind::Io);
  EXPECT_EQ(IoError(ErrorKind::Closed, "", "x").kind(), ErrorKind::Io);
  EXPECT_EQ(TimeoutError(ErrorKind::Unavailable, "x").kind(), ErrorKind::Timeout);
  EXPECT_EQ(ConfigurationError(ErrorKind::Auth, "", "x").kind(), ErrorKind::Configuration);
  EXPECT_EQ(ReplyError(ErrorKind::Script, "", "x").kind(), ErrorKind::Reply);
  EXPECT_EQ(AuthError(ErrorKind::Replica, "", "x").kind(), ErrorKind::Auth);
  EXPECT_EQ(ScriptError(ErrorKind::NotInitialized, "", "x").kind(), ErrorKind::Script);
  // And its own kinds are kept.
  EXPECT_EQ(IoError(ErrorKind::Unavailable, "LOADING", "x").kind(), ErrorKind::Unavailable);
  EXPECT_EQ(TimeoutError(ErrorKind::CallbackBlocked, "x").kind(), ErrorKind::CallbackBlocked);
  EXPECT_EQ(ConfigurationError(ErrorKind::RequestLimit, "ERR", "x").kind(), ErrorKind::RequestLimit);
  EXPECT_EQ(ReplyError(ErrorKind::UnexpectedReply, "", "x").kind(), ErrorKind::UnexpectedReply);
  EXPECT_EQ(AuthError(ErrorKind::NoPermission, "NOPERM", "x").kind(), ErrorKind::NoPermission);
  EXPECT_EQ(ScriptError(ErrorKind::InvalidState, "REDLIMIT_INVALID_STATE", "x").kind(), ErrorKind::InvalidState);
}

TEST(ErrorMapping, PoolTimeoutIsATimeoutAndAnIoError) {
  try {
    throw TimeoutError(ErrorKind::PoolTimeout, "x");
  } catch (const TimeoutError&) {
    SUCCEED();
  }
  try {
    throw TimeoutError(ErrorKind::PoolTimeout, "x");
  } catch (const IoError&) {
    SUCCEED();
  }
}

TEST(ErrorMapping, ReplyErrors) {
  EXPECT_THROW(throwReplyError("WRONGPASS invalid username-password pair", false), AuthError);
  EXPECT_THROW(throwReplyError("NOAUTH Authentication required.", false), AuthError);
  // A script's own codes are ScriptErrors here; RateLimiter maps REDLIMIT_* to its types.
  EXPECT_THROW(throwReplyError("REDLIMIT_INVALID_CONFIG field rate", true), ScriptError);
  EXPECT_THROW(throwReplyError("MYAPP_LIMIT over", true), ScriptError);
  EXPECT_THROW(throwReplyError("MYAPP_LIMIT over", false), ReplyError) << "only a script's reply is a script error";
  EXPECT_THROW(throwReplyError("ERR user_script:1: oops script: abc", true), ScriptError);
  try {
    throwReplyError("OOM command not allowed when used memory > 'maxmemory'.", true);
    FAIL();
  } catch (const ScriptError&) {
    FAIL() << "OOM is the server refusing, not the script failing";
  } catch (const ReplyError& e) {
    EXPECT_EQ(e.code(), "OOM");
    EXPECT_NE(std::string(e.what()).find("maxmemory"), std::string::npos);
  }
  try {
    throwReplyError("NOSCRIPT No matching script.", true);
    FAIL();
  } catch (const ReplyError& e) {
    EXPECT_EQ(e.code(), "NOSCRIPT");
  }
}

TEST(ErrorMapping, ServerThatCannotServeNowIsUnavailableNotAReplyError) {
  // READONLY and MASTERDOWN are not here: they say the address names a replica, a configuration
  // error (see ErrorMapping.ConfigurationErrorsAreNotIoErrors).
  for (const char* reply :
       {"LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script.",
        "CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys request during rehashing of slot",
        "ERR max number of clients reached", "NOREPLICAS Not enough good replicas to write."}) {
    try {
      throwReplyError(reply, true);
      FAIL() << reply;
    } catch (const IoError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unavailable) << e.what();
      EXPECT_EQ(e.code(), std::string(reply).substr(0, std::string(reply).find(' ')));
      EXPECT_NE(std::string(e.what()).find(reply), std::string::npos);
    }
  }
}

// A script's own code is the script's to interpret (the limiters map REDLIMIT_*): the Redis layer
// reports it as a ScriptError with that code and the script's text, without Redis's trailer.
TEST(ErrorMapping, OwnCodesDropRedisTrailer) {
  try {
    throwReplyError("REDLIMIT_NOT_INITIALIZED RateLimiter is not initialized script: 28f, on @user_script:40.", true);
    ADD_FAILURE() << "returned";
  } catch (const NotInitializedError& e) {
    ADD_FAILURE() << "the Redis layer knows the limiters' codes: " << e.what();
  } catch (const ScriptError& e) {
    EXPECT_EQ(e.code(), "REDLIMIT_NOT_INITIALIZED");
    EXPECT_EQ(std::string(e.what()), "RateLimiter is not initialized");
  }
}

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Runs `call`, expecting exactly the exception type E (not a subclass of it: `exact`) or E or a
/// subclass; runs `check` on it. Reports the type it threw instead.
template <class E>
void expectThrow(const std::function<void()>& call, const std::function<void(const E&)>& check = {}) {
  try {
    call();
    ADD_FAILURE() << "returned";
  } catch (const E& e) {
    if (check) check(e);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << ": " << e.what();
  }
}

/// The same, and the E's kind() is `kind`.
template <class E>
void expectThrow(ErrorKind kind, const std::function<void()>& call, const std::function<void(const E&)>& check = {}) {
  expectThrow<E>(call, [&](const E& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    if (check) check(e);
  });
}

template <class NotE>
void expectNot(const std::function<void()>& call, const char* why) {
  try {
    call();
  } catch (const NotE& e) {
    ADD_FAILURE() << why << ": " << e.what();
  } catch (const std::exception&) {
  }
}

}  // namespace

// An error reply that comes from the script's own execution (Redis appends
// " script: <sha>, on @user_script:<line>.", or the message names user_script) is a ScriptError,
// whatever its code; the server refusing to run the script keeps its own type.
TEST(ErrorMapping, ErrorsRaisedInsideAScriptAreScriptErrors) {
  const std::string trailer = " script: f793247de6e1e3c553cd42d39c812df499e679e4, on @user_script:1.";
  expectThrow<ScriptError>(
      [&] { throwReplyError("WRONGTYPE Operation against a key holding the wrong kind of value" + trailer, true); },
      [](const ScriptError& e) {
        EXPECT_EQ(e.code(), "WRONGTYPE");
        EXPECT_TRUE(contains(e.what(), "wrong kind of value")) << e.what();
      });
  for (const std::string& reply :
       {"ERR value is not an integer or out of range" + trailer,
        "ERR Unknown Redis command called from script" + trailer, "ERR user_script:1: boom" + trailer,
        std::string("ERR Error compiling script (new function): user_script:1: unexpected symbol")}) {
    SCOPED_TRACE(reply);
    expectThrow<ScriptError>([&] { throwReplyError(reply, true); });
  }
  // Not from a script: a plain reply error.
  expectNot<ScriptError>(
      [] { throwReplyError("WRONGTYPE Operation against a key holding the wrong kind of value", false); },
      "WRONGTYPE outside a script");
  // Server refusals keep their types, with or without the trailer.
  expectNot<ScriptError>(
      [&] { throwReplyError("OOM command not allowed when used memory > 'maxmemory'." + trailer, true); },
      "OOM is the server refusing");
  expectThrow<ReplyError>(
      [&] { throwReplyError("OOM command not allowed when used memory > 'maxmemory'." + trailer, true); },
      [](const ReplyError& e) { EXPECT_EQ(e.code(), "OOM"); });
  expectThrow<IoError>(ErrorKind::Unavailable, [] {
    throwReplyError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", true);
  });
  expectThrow<IoError>(ErrorKind::Unavailable,
                       [&] { throwReplyError("LOADING Redis is loading the dataset in memory" + trailer, true); });
  expectNot<ScriptError>([] { throwReplyError("NOSCRIPT No matching script. Please use EVAL.", true); }, "NOSCRIPT");
  expectThrow<ConfigurationError>(ErrorKind::Replica, [&] {
    throwReplyError("READONLY You can't write against a read only replica." + trailer, true);
  });
  expectThrow<AuthError>(ErrorKind::NoPermission, [] {
    throwReplyError("NOPERM this user has no permissions to access one of the keys used as arguments", true);
  });
}

TEST(ErrorMapping, NoPermIsAMissingPermissionNotAFailedAuthentication) {
  expectThrow<AuthError>(
      ErrorKind::NoPermission,
      [] { throwReplyError("NOPERM this user has no permissions to run the 'hgetall' command", false); },
      [](const AuthError& e) {
        EXPECT_EQ(e.code(), "NOPERM");
        EXPECT_FALSE(contains(e.what(), "authentication failed")) << e.what();
        EXPECT_TRUE(contains(e.what(), "ACL SETUSER default +hgetall")) << e.what();
      });
  expectThrow<AuthError>(
      ErrorKind::NoPermission,
      [] { throwReplyError("NOPERM this user has no permissions to access one of the keys used as arguments", false); },
      [](const AuthError& e) { EXPECT_TRUE(contains(e.what(), "~")) << "says how to grant keys: " << e.what(); });
  // A command inside the script: Redis 7 words it as an ERR from the script.
  expectThrow<AuthError>(
      ErrorKind::NoPermission,
      [] {
        throwReplyError(
            "ERR The user executing the script can't run this command or subcommand script: "
            "61636018f4e6b5817b89791bbed242f93fa089e3, on @user_script:1.",
            true);
      },
      [](const AuthError& e) { EXPECT_TRUE(contains(e.what(), "ACL SETUSER")) << e.what(); });
  // Still an AuthError for code that catches those.
  expectThrow<AuthError>(
      [] { throwReplyError("NOPERM this user has no permissions to run the 'get' command", false); });
}

// Scripting switched off on the server, or refused to the ACL user: the replies of Redis 7.0 (6.2
// and 7.2 wordings of NOPERM too) and of a Valkey without its Lua module.
TEST(ErrorMapping, AServerThatRunsNoScriptsIsAConfigurationError) {
  for (const char* reply : {"ERR unknown command 'EVALSHA', with args beginning with: "
                            "'0123456789012345678901234567890123456789' '1' ",
                            "ERR unknown command 'EVAL', with args beginning with: 'local x' '1' ",
                            "ERR Could not find scripting engine 'lua'"}) {
    SCOPED_TRACE(reply);
    expectThrow<ConfigurationError>(
        ErrorKind::Configuration, [&] { throwReplyError(reply, true); },
        [&](const ConfigurationError& e) {
          EXPECT_EQ(e.code(), "ERR");
          EXPECT_TRUE(contains(e.what(), "runs no scripts")) << e.what();
          EXPECT_TRUE(contains(e.what(), reply)) << "keeps the server's words: " << e.what();
          EXPECT_TRUE(contains(e.what(), "it sends EVALSHA, and SCRIPT LOAD then EVAL")) << e.what();
          EXPECT_TRUE(contains(e.what(), "rename-command")) << e.what();
        });
  }
  // Not in answer to a script: the server does not know some other command.
  expectNot<ConfigurationError>([] { throwReplyError("ERR unknown command 'FOO', with args beginning with: ", false); },
                                "an unknown command outside a script");
  detail::ReplyContext bob;
  bob.command = "EVALSHA";
  bob.user = "bob";
  bob.fromScript = true;
  for (const char* reply : {"NOPERM this user has no permissions to run the 'evalsha' command",
                            "NOPERM User bob has no permissions to run the 'evalsha' command",
                            "NOPERM this user has no permissions to run the 'eval' command",
                            "NOPERM this user has no permissions to run the 'script|load' command",
                            "NOPERM this user has no permissions to run the 'script' command or its subcommand"}) {
    SCOPED_TRACE(reply);
    expectThrow<ConfigurationError>(
        ErrorKind::Configuration, [&] { throwReplyError(reply, bob); },
        [&](const ConfigurationError& e) {
          EXPECT_EQ(e.code(), "NOPERM");
          EXPECT_TRUE(contains(e.what(), "runs no scripts for ACL user 'bob'")) << e.what();
          EXPECT_TRUE(contains(e.what(), "ACL SETUSER bob +evalsha +script|load +eval")) << e.what();
          EXPECT_FALSE(contains(e.what(), "authentication failed")) << e.what();
        });
  }
  // The user may run scripts but not on these keys, or not a command inside them: a permission.
  for (const char* reply : {"NOPERM this user has no permissions to access one of the keys used as arguments",
                            "NOPERM this user has no permissions to run the 'script|flush' command"}) {
    SCOPED_TRACE(reply);
    expectThrow<AuthError>(ErrorKind::NoPermission, [&] { throwReplyError(reply, bob); });
  }
}

TEST(ErrorMapping, UnauthenticatedProtocolErrorIsAnAuthErrorThatSaysToSetThePassword) {
  for (const char* reply : {"ERR Protocol error: unauthenticated multibulk length",
                            "ERR Protocol error: unauthenticated bulk length", "NOAUTH Authentication required."}) {
    SCOPED_TRACE(reply);
    expectThrow<AuthError>(
        [&] { throwReplyError(reply, true); },
        [](const AuthError& e) { EXPECT_TRUE(contains(e.what(), "ClientOptions::Connection::password")) << e.what(); });
  }
}

TEST(ErrorMapping, ReplyOfTheWrongShapeIsUnexpectedReplyError) {
  Reply array;
  array.type = Reply::Type::Array;
  array.elements.resize(2);
  expectThrow<ReplyError>(
      ErrorKind::UnexpectedReply, [&] { (void)array.asInteger(); },
      [](const ReplyError& e) {
        EXPECT_TRUE(contains(e.what(), "expected an integer")) << e.what();
        EXPECT_TRUE(contains(e.what(), "array of 2")) << e.what();
        EXPECT_EQ(e.code(), "");
      });
  Reply text;
  text.type = Reply::Type::String;
  text.str = "abc";
  expectThrow<ReplyError>(
      ErrorKind::UnexpectedReply, [&] { (void)text.asInteger(); },
      [](const ReplyError& e) { EXPECT_TRUE(contains(e.what(), "\"abc\"")) << e.what(); });
  Reply nil;
  expectThrow<ReplyError>(
      ErrorKind::UnexpectedReply, [&] { (void)nil.asInteger(); },
      [](const ReplyError& e) { EXPECT_TRUE(contains(e.what(), "nil")) << e.what(); });
  EXPECT_EQ(nil.asOptionalInteger(), std::nullopt);
}

// What no retry fixes is a ConfigurationError, never an IoError (the failure
// policy decides IoErrors only).
TEST(ErrorMapping, ConfigurationErrorsAreNotIoErrors) {
  for (const char* reply : {"READONLY You can't write against a read only replica.",
                            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."}) {
    SCOPED_TRACE(reply);
    expectThrow<ConfigurationError>(
        ErrorKind::Replica, [&] { throwReplyError(reply, false); },
        [&](const ConfigurationError& e) {
          EXPECT_EQ(e.code(), std::string(reply).substr(0, std::string(reply).find(' ')));
          EXPECT_TRUE(contains(e.what(), "primary")) << "says what to do: " << e.what();
        });
  }
  for (const char* reply : {"ERR Protocol error: invalid bulk length", "ERR Protocol error: invalid multibulk length",
                            "ERR Protocol error: too big mbulk count string"}) {
    SCOPED_TRACE(reply);
    expectThrow<ConfigurationError>(
        ErrorKind::RequestLimit, [&] { throwReplyError(reply, true); },
        [](const ConfigurationError& e) { EXPECT_TRUE(contains(e.what(), "proto-max-bulk-len")) << e.what(); });
  }
  // Out of descriptors, as hiredis 0.14 reports it for TCP (socket()), a host name
  // (getaddrinfo) and a unix socket.
  for (const auto& failure :
       {std::pair{REDIS_ERR_OTHER, "Can't create socket: Too many open files"},
        std::pair{REDIS_ERR_OTHER, "System error"}, std::pair{REDIS_ERR_IO, "Too many open files"}}) {
    const int err = failure.first;
    const char* text = failure.second;
    SCOPED_TRACE(text);
    expectThrow<ConfigurationError>(
        ErrorKind::ResourceLimit, [&] { throwContextError(err, EMFILE, text, "connect to 127.0.0.1:6379"); },
        [](const ConfigurationError& e) {
          EXPECT_EQ(e.code(), "EMFILE");
          EXPECT_TRUE(contains(e.what(), "RLIMIT_NOFILE")) << e.what();
        });
  }
  expectThrow<ConfigurationError>(
      ErrorKind::ResourceLimit,
      [] { throwContextError(REDIS_ERR_IO, ENFILE, "Too many open files in system", "connect"); },
      [](const ConfigurationError& e) { EXPECT_EQ(e.code(), "ENFILE"); });
  // TLS bytes read as a reply: a TLS alert record starts with 0x15, a handshake with 0x16.
  expectThrow<ConfigurationError>(ErrorKind::TlsPort, [] {
    throwContextError(REDIS_ERR_PROTOCOL, 0, "Protocol error, got \"\\x15\" as reply type byte", "PING");
  });
  expectThrow<ConfigurationError>(ErrorKind::TlsPort, [] {
    throwContextError(REDIS_ERR_PROTOCOL, 0, "Protocol error, got \"\\x16\" as reply type byte", "PING");
  });
  for (const auto& raise : std::initializer_list<std::function<void()>>{
           [] { throwReplyError("READONLY You can't write against a read only replica.", true); },
           [] { throwReplyError("ERR Protocol error: invalid bulk length", false); },
           [] { throwContextError(REDIS_ERR_IO, EMFILE, "Too many open files", "connect"); },
           [] {
             throwContextError(REDIS_ERR_PROTOCOL, 0, "Protocol error, got \"\\x15\" as reply type byte", "PING");
           }}) {
    expectNot<IoError>(raise, "a configuration error must not be left to the failure policy");
  }
  // The server closes the connection after these (or it names a replica): not used again.
  for (const char* reply :
       {"ERR Protocol error: invalid bulk length", "ERR Protocol error: unauthenticated multibulk length",
        "ERR max number of clients reached", "READONLY You can't write against a read only replica.",
        "MASTERDOWN Link with MASTER is down"}) {
    EXPECT_TRUE(detail::replyEndsConnection(reply)) << reply;
  }
  for (const char* reply :
       {"OOM command not allowed", "WRONGTYPE Operation against a key", "NOSCRIPT No matching script",
        "LOADING Redis is loading", "NOPERM this user has no permissions"}) {
    EXPECT_FALSE(detail::replyEndsConnection(reply)) << reply;
  }
  // Outages stay IoErrors.
  expectThrow<ClosedError>([] { throwContextError(REDIS_ERR_IO, ECONNRESET, "Connection reset by peer", "PING"); });
  expectThrow<IoError>(
      [] { throwContextError(REDIS_ERR_PROTOCOL, 0, "Protocol error, got \"H\" as reply type byte", "PING"); });
}

namespace {

// The type of the object `error` holds (it rethrows: call it outside the counted part).
std::string heldType(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return detail::errorTypeName(e);
  }
}

// A subclass errors.hpp does not declare: copied as its nearest declared base, as a chain of
// catch clauses, most derived first, would catch it.
class OwnTimeoutError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

}  // namespace

TEST(ErrorMapping, CloneErrorCopiesTypeMessageAndCodeIntoANewObjectWithoutRaisingIt) {
  ASSERT_TRUE(test::canCountRaises()) << "this unwinder's raises cannot be counted: the test cannot see a rethrow";
  // A timed-out pipeline gives each of its requests its own copy of the error, on the I/O thread:
  // an allocation each, not an unwind.
  const std::vector<std::pair<std::exception_ptr, std::string>> cases = {
      {std::make_exception_ptr(TimeoutError("redlimit: timed out")), "redlimit::TimeoutError"},
      {std::make_exception_ptr(ClosedError("redlimit: closed")), "redlimit::ClosedError"},
      {std::make_exception_ptr(TimeoutError(ErrorKind::CallbackBlocked, "redlimit: blocked")),
       "redlimit::TimeoutError"},
      {std::make_exception_ptr(IoError(ErrorKind::Unavailable, "LOADING", "redlimit: loading")), "redlimit::IoError"},
      {std::make_exception_ptr(ConfigurationError(ErrorKind::Replica, "READONLY", "redlimit: a replica")),
       "redlimit::ConfigurationError"},
      {std::make_exception_ptr(NotInitializedError("REDLIMIT_NOT_INITIALIZED", "redlimit: no configuration")),
       "redlimit::NotInitializedError"},
      {std::make_exception_ptr(AuthError(ErrorKind::NoPermission, "NOPERM", "redlimit: no permission")),
       "redlimit::AuthError"},
      {std::make_exception_ptr(Error("redlimit: plain")), "redlimit::Error"},
      {std::make_exception_ptr(OwnTimeoutError("redlimit: own")), "redlimit::TimeoutError"}};
  for (const auto& [error, type] : cases) {
    const std::uint64_t before = test::raisedExceptions();
    const std::exception_ptr copy = detail::cloneError(error);
    EXPECT_EQ(test::raisedExceptions(), before) << type << ": copied by rethrowing it";
    ASSERT_TRUE(copy);
    EXPECT_NE(copy, error) << type << ": the same object, shared between recipients";
    EXPECT_EQ(heldType(copy), type);
    const Error* original = detail::errorIn(error);
    const Error* copied = detail::errorIn(copy);
    ASSERT_NE(original, nullptr);
    ASSERT_NE(copied, nullptr);
    EXPECT_NE(copied, original);
    EXPECT_STREQ(copied->what(), original->what());
    EXPECT_EQ(copied->kind(), original->kind()) << type;
    EXPECT_EQ(copied->code(), original->code()) << type;
    if (const auto* reply = dynamic_cast<const ReplyError*>(original)) {
      EXPECT_EQ(dynamic_cast<const ReplyError&>(*copied).code(), reply->code());
    }
    if (const auto* config = dynamic_cast<const ConfigurationError*>(original)) {
      EXPECT_EQ(dynamic_cast<const ConfigurationError&>(*copied).code(), config->code());
    }
  }
  // Anything else is handed on as it is.
  const auto other = std::make_exception_ptr(std::runtime_error("not ours"));
  EXPECT_EQ(detail::cloneError(other), other);
  EXPECT_FALSE(detail::cloneError(nullptr));
}

TEST(ErrorMapping, ErrorInFindsTheHeldErrorInPlaceWithoutRaisingIt) {
  ASSERT_TRUE(test::canCountRaises()) << "this unwinder's raises cannot be counted: the test cannot see a rethrow";
  const auto closed = std::make_exception_ptr(ClosedError("redlimit: closed"));
  const auto other = std::make_exception_ptr(std::runtime_error("not ours"));
  const auto number = std::make_exception_ptr(42);
  const std::uint64_t before = test::raisedExceptions();
  const Error* found = detail::errorIn(closed);
  const bool closedFound = detail::holds<ClosedError>(closed) && detail::closedConnection(closed);
  const bool timeoutFound = detail::holds<TimeoutError>(closed);
  const Error* none = detail::errorIn(other);
  const Error* notAnObject = detail::errorIn(number);
  const Error* null = detail::errorIn(nullptr);
  EXPECT_EQ(test::raisedExceptions(), before);
  EXPECT_TRUE(closedFound);
  EXPECT_FALSE(timeoutFound);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(notAnObject, nullptr);
  EXPECT_EQ(null, nullptr);
  try {
    std::rethrow_exception(closed);
  } catch (const Error& e) {
    EXPECT_EQ(found, &e);  // the object the exception_ptr holds, not a copy
  }
}
