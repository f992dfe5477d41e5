// Plain Redis commands for the test harnesses (cluster, sentinel): one hiredis connection per
// call, so that setting up and checking a topology never goes through the library under test.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace redlimit::test {

/// One RESP2 reply, error replies included (as Type::Error). A value type.
struct RawReply {
  enum class Type { Nil, Integer, String, Status, Error, Array };

  Type type = Type::Nil;
  long long integer = 0;           // Type::Integer
  std::string str;                 // Type::String, Type::Status and Type::Error
  std::vector<RawReply> elements;  // Type::Array

  [[nodiscard]] bool isError() const noexcept { return type == Type::Error; }
};

/// Connects to host:port, sends argv, reads one reply and closes. `timeout` bounds the connect
/// and the reply, each. A non-empty `password` is sent first (AUTH <password>); its error reply
/// is returned in place of argv's. Thread-safe. Throws std::runtime_error if it cannot connect,
/// on an I/O error or on a timeout; an error reply is returned, not thrown.
[[nodiscard]] RawReply rawCommand(const std::string& host, int port, const std::vector<std::string>& argv,
                                  std::chrono::milliseconds timeout = std::chrono::milliseconds(2000),
                                  const std::string& password = {});

/// The value of `field` in an INFO-style text ("field:value" lines, as INFO and CLUSTER INFO
/// answer), or "" if absent. Thread-safe; does not throw.
[[nodiscard]] std::string infoValue(std::string_view text, std::string_view field);

}  // namespace redlimit::test
