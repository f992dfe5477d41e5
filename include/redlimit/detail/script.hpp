// redlimit — a Lua script the Client runs with EVALSHA.
#pragma once

#include <string_view>

namespace redlimit::detail {

/// A Lua script and its SHA1 (lowercase hex), as EVALSHA wants it. The strings are not owned:
/// they must outlive every use (redlimit's own scripts are embedded as static constants).
struct Script {
  std::string_view name;    // for error messages
  std::string_view sha1;    // SHA1 of source, 40 lowercase hex digits
  std::string_view source;  // sent with SCRIPT LOAD when the server answers NOSCRIPT
};

}  // namespace redlimit::detail
