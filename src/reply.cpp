#include "redlimit/reply.hpp"

#include <charconv>

#include "redlimit/errors.hpp"

namespace redlimit {

std::int64_t Reply::asInteger() const {
  if (type == Type::Integer) return integer;
  if (type == Type::String || type == Type::Status) {
    std::int64_t v = 0;
    const char* end = str.data() + str.size();
    auto [ptr, ec] = std::from_chars(str.data(), end, v);
    if (ec == std::errc() && ptr == end && !str.empty()) return v;
  }
  throw UnexpectedReplyError("redlimit: expected an integer reply, got " + describe());
}

std::optional<std::int64_t> Reply::asOptionalInteger() const {
  if (type == Type::Nil) return std::nullopt;
  return asInteger();
}

std::string Reply::describe() const {
  constexpr std::size_t kShown = 64;
  auto quoted = [&] {
    std::string out = "\"" + str.substr(0, kShown) + "\"";
    if (str.size() > kShown) out += "... (" + std::to_string(str.size()) + " bytes)";
    return out;
  };
  switch (type) {
    case Type::Nil:
      return "nil";
    case Type::Integer:
      return "the integer " + std::to_string(integer);
    case Type::String:
      return "the string " + quoted();
    case Type::Status:
      return "the status " + quoted();
    case Type::Array:
      return "an array of " + std::to_string(elements.size());
  }
  return "a reply of unknown type";
}

}  // namespace redlimit
