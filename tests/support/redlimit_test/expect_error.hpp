// An error of a type and a kind: what EXPECT_THROW checks for a type, with the kind too.
//   EXPECT_TRUE(throwsError<ConfigurationError>(ErrorKind::Tls, [&] { (void)client.ping(); }));
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"

namespace redlimit::test {

/// The enumerator's name ("Tls", "PoolTimeout"), for messages.
inline const char* kindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Timeout:
      return "Timeout";
    case ErrorKind::Closed:
      return "Closed";
    case ErrorKind::PoolTimeout:
      return "PoolTimeout";
    case ErrorKind::Unavailable:
      return "Unavailable";
    case ErrorKind::Io:
      return "Io";
    case ErrorKind::Configuration:
      return "Configuration";
    case ErrorKind::Auth:
      return "Auth";
    case ErrorKind::Reply:
      return "Reply";
    case ErrorKind::InvalidArgument:
      return "InvalidArgument";
    case ErrorKind::Other:
      return "Other";
    case ErrorKind::CallbackBlocked:
      return "CallbackBlocked";
    case ErrorKind::Protocol:
      return "Protocol";
    case ErrorKind::Replica:
      return "Replica";
    case ErrorKind::TlsPort:
      return "TlsPort";
    case ErrorKind::Tls:
      return "Tls";
    case ErrorKind::ResourceLimit:
      return "ResourceLimit";
    case ErrorKind::RequestLimit:
      return "RequestLimit";
    case ErrorKind::UnexpectedReply:
      return "UnexpectedReply";
    case ErrorKind::NoPermission:
      return "NoPermission";
    case ErrorKind::Script:
      return "Script";
    case ErrorKind::InvalidConfig:
      return "InvalidConfig";
    case ErrorKind::InvalidState:
      return "InvalidState";
    case ErrorKind::NotInitialized:
      return "NotInitialized";
  }
  return "?";
}

/// Success if `statement()` throws an E whose kind() is `kind`; else a failure that says what was
/// thrown instead (type, kind and message), or that nothing was.
template <class E, class F>
::testing::AssertionResult throwsError(ErrorKind kind, F&& statement) {
  try {
    std::forward<F>(statement)();
  } catch (const E& e) {
    if (e.kind() == kind) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "threw the expected type with kind " << kindName(e.kind()) << ", not "
                                         << kindName(kind) << ": " << e.what();
  } catch (const Error& e) {
    return ::testing::AssertionFailure() << "threw another redlimit::Error, of kind " << kindName(e.kind()) << ": "
                                         << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a std::exception that is no redlimit::Error: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something that is no std::exception";
  }
  return ::testing::AssertionFailure() << "threw nothing";
}

/// The message of the E of kind `kind` that `statement()` throws; else a test failure that says
/// what came instead, and "".
template <class E, class F>
std::string messageOfError(ErrorKind kind, F&& statement) {
  std::string message;
  const ::testing::AssertionResult thrown = throwsError<E>(kind, [&] {
    try {
      std::forward<F>(statement)();
    } catch (const E& e) {
      message = e.what();
      throw;
    }
  });
  if (!thrown) ADD_FAILURE() << thrown.message();
  return thrown ? message : std::string();
}

/// Success if `error` holds an E whose kind() is `kind` (for futures' and events' exception_ptr).
template <class E>
::testing::AssertionResult holdsError(ErrorKind kind, const std::exception_ptr& error) {
  if (!error) return ::testing::AssertionFailure() << "no error";
  return throwsError<E>(kind, [&] { std::rethrow_exception(error); });
}

}  // namespace redlimit::test
