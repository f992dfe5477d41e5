// redlimit — a Redis reply as a plain value, so that code above the redis layer never sees
// hiredis types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace redlimit::detail {

/// One RESP2 reply. Error replies never reach callers as a Reply: they are thrown as ReplyError.
/// A value type; not synchronised.
struct Reply {
  enum class Type { Nil, Integer, String, Status, Array };

  Type type = Type::Nil;
  std::int64_t integer = 0;     // Type::Integer
  std::string str;              // Type::String (bulk) and Type::Status
  std::vector<Reply> elements;  // Type::Array

  [[nodiscard]] bool isNil() const noexcept { return type == Type::Nil; }
  /// The reply as an integer: an Integer, or a String/Status holding a decimal integer
  /// (Redisson's scripts answer either). Throws ReplyError (UnexpectedReply) if it is neither.
  [[nodiscard]] std::int64_t asInteger() const;
  /// The reply as an integer, or nullopt for Nil. Throws ReplyError (UnexpectedReply) otherwise.
  [[nodiscard]] std::optional<std::int64_t> asOptionalInteger() const;
  /// A short description for error messages: `nil`, `the integer 3`, `the string "abc"` (cut
  /// after 64 bytes), `the status "OK"`, `an array of 2`.
  [[nodiscard]] std::string describe() const;
};

}  // namespace redlimit::detail
