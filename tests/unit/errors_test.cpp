// The one place that classifies failures (src/error_mapping.cpp).
#include <cerrno>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "error_mapping.hpp"
#include "redlimit/errors.hpp"

using namespace redlimit;
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

TEST(ErrorMapping, PoolTimeoutIsATimeoutAndAnIoError) {
  try {
    throw PoolTimeoutError("x");
  } catch (const TimeoutError&) {
    SUCCEED();
  }
  try {
    throw PoolTimeoutError("x");
  } catch (const IoError&) {
    SUCCEED();
  }
}

TEST(ErrorMapping, ReplyErrors) {
  EXPECT_THROW(throwReplyError("WRONGPASS invalid username-password pair", false), AuthError);
  EXPECT_THROW(throwReplyError("NOAUTH Authentication required.", false), AuthError);
  EXPECT_THROW(throwReplyError("REDLIMIT_NOT_INITIALIZED RateLimiter is not initialized script: x", true),
               NotInitializedError);
  EXPECT_THROW(throwReplyError("REDLIMIT_INVALID_CONFIG field rate", true), InvalidConfigError);
  EXPECT_THROW(throwReplyError("REDLIMIT_INVALID_ARGUMENT too many", true), InvalidArgument);
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
  for (const char* reply : {"LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script.",
                            "MASTERDOWN Link with MASTER is down", "READONLY You can't write against a read only replica.",
                            "CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys request during rehashing of slot"}) {
    try {
      throwReplyError(reply, true);
      FAIL() << reply;
    } catch (const UnavailableError& e) {
      EXPECT_EQ(e.code(), std::string(reply).substr(0, std::string(reply).find(' ')));
      EXPECT_NE(std::string(e.what()).find(reply), std::string::npos);
    }
  }
}

TEST(ErrorMapping, OwnCodesDropRedisTrailer) {
  try {
    throwReplyError("REDLIMIT_NOT_INITIALIZED RateLimiter is not initialized script: 28f, on @user_script:40.", true);
  } catch (const NotInitializedError& e) {
    EXPECT_EQ(std::string(e.what()), "RateLimiter is not initialized");
  }
}
