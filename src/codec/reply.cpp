#include "redlimit/detail/reply.hpp"

#include <charconv>

#include <fmt/format.h>

#include "redlimit/errors.hpp"

namespace redlimit::detail {

std::int64_t Reply::asInteger() const {
  if (type == Type::Integer) return integer;
  if (type == Type::String || type == Type::Status) {
    std::int64_t v = 0;
    const char* end = str.data() + str.size();
    auto [ptr, ec] = std::from_chars(str.data(), end, v);
    if (ec == std::errc() && ptr == end && !str.empty()) return v;
  }
  throw ReplyError(ErrorKind::UnexpectedReply, "",
                   fmt::format("redlimit: expected an integer reply, got {}", describe()));
}

std::optional<std::int64_t> Reply::asOptionalInteger() const {
  if (type == Type::Nil) return std::nullopt;
  return asInteger();
}

std::string Reply::describe() const {
  constexpr std::size_t kShown = 64;
  auto quoted = [&] {
    // substr, not a precision: fmt counts a string's precision in code points, and replies are bytes.
    if (str.size() <= kShown) return fmt::format("\"{}\"", str);
    return fmt::format("\"{}\"... ({} bytes)", str.substr(0, kShown), str.size());
  };
  switch (type) {
    case Type::Nil:
      return "nil";
    case Type::Integer:
      return fmt::format("the integer {}", integer);
    case Type::String:
      return fmt::format("the string {}", quoted());
    case Type::Status:
      return fmt::format("the status {}", quoted());
    case Type::Array:
      return fmt::format("an array of {}", elements.size());
  }
  return "a reply of unknown type";
}

}  // namespace redlimit::detail
