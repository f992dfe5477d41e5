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
    throw Error("redlimit: expected an integer reply, got \"" + str + "\"");
  }
  throw Error("redlimit: expected an integer reply, got a reply of another type");
}

std::optional<std::int64_t> Reply::asOptionalInteger() const {
  if (type == Type::Nil) return std::nullopt;
  return asInteger();
}

}  // namespace redlimit
