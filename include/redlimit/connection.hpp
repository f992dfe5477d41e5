// redlimit — one connection to Redis (one hiredis context).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit/options.hpp"
#include "redlimit/reply.hpp"

struct redisContext;  // hiredis; only src/ sees its definition

namespace redlimit {

/// A blocking connection to one Redis server: connects with a finite connect timeout, applies
/// the command timeout and TCP keep-alive, sends AUTH and SELECT as the options say, or PING if
/// neither: every new connection has one exchange with the server before it is used, so a missing
/// password, a TLS port or a server that cannot serve is found when connecting.
///
/// After any transport failure the connection is broken() for good; the pool throws it away and
/// opens a new one (hiredis 0.14's redisReconnect drops the command timeout, so redlimit never
/// reconnects a context in place).
/// Not thread-safe: one thread at a time, which the pool guarantees.
class Connection {
 public:
  /// Connects. Throws InvalidArgument (options, see checkOptions), IoError (refused,
  /// unreachable), TimeoutError (connect timeout), AuthError (bad, missing or unneeded password),
  /// ConfigurationError (TlsPortError: the port speaks TLS; ResourceLimitError: no file
  /// descriptor left), UnavailableError (LOADING, too many clients), ReplyError (SELECT failed).
  explicit Connection(const ConnectionOptions& options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Sends one command and waits for its reply. Throws TimeoutError, ClosedError, IoError
  /// (connection now broken), RequestLimitError (the server refused a request over its limits
  /// and closed the connection), or an error reply's exception (see error_mapping.hpp; the
  /// connection stays usable unless the server closes it after that reply). Never raises SIGPIPE.
  Reply command(const std::string_view* argv, std::size_t argc);
  Reply command(std::initializer_list<std::string_view> argv) {
    return command(argv.begin(), argv.size());
  }
  Reply command(const std::vector<std::string_view>& argv) {
    return command(argv.data(), argv.size());
  }

  /// True once a transport error happened; the connection must not be reused.
  [[nodiscard]] bool broken() const noexcept { return broken_; }
  /// When the last command finished (or the connection was opened).
  [[nodiscard]] std::chrono::steady_clock::time_point lastUsed() const noexcept { return lastUsed_; }

 private:
  [[noreturn]] void failTransport(const char* what);
  // The request could not be written: classifies by the server's reply if it left one before
  // closing, else by errno (and the request's size).
  [[noreturn]] void failSend(const char* what, int savedErrno, std::size_t requestBytes);
  void sendAll(const char* data, std::size_t size, const char* what);
  // The first exchange (AUTH, SELECT or PING), each command within timeLeft() of the connect timeout.
  void greet(const ConnectionOptions& options, const std::function<std::chrono::milliseconds()>& timeLeft);

  redisContext* ctx_ = nullptr;
  std::string user_;                 // the ACL user AUTH named; "" = default
  bool broken_ = false;
  std::chrono::steady_clock::time_point lastUsed_;
};

}  // namespace redlimit
