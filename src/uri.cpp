#include <cctype>
#include <charconv>
#include <string>

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

namespace redlimit {
namespace {

[[noreturn]] void bad(const std::string& uri, const std::string& why) {
  throw InvalidArgument(fmt::format("redlimit: bad Redis URI \"{}\": {}", uri, why));
}

int toInt(const std::string& uri, std::string_view text, const char* what, int lo, int hi) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi) {
    bad(uri, fmt::format("{} must be a number in {}..{}", what, lo, hi));
  }
  return v;
}

std::string percentDecode(const std::string& uri, std::string_view in) {
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(in[i + 2]))) {
      bad(uri, "broken percent-escape");
    }
    out.push_back(static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16)));
    i += 2;
  }
  return out;
}

bool isTlsParameter(std::string_view key) {
  return key == "cacert" || key == "capath" || key == "cert" || key == "key" || key == "sni" || key == "verify";
}

// Applies "a=1&b=2" query parameters: db, password, user; on a rediss:// URI (`tls`) also the
// TLS ones (cacert, capath, cert, key, sni, verify=0|1).
void applyQuery(const std::string& uri, std::string_view query, ConnectionOptions& o, bool tls) {
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    auto eq = pair.find('=');
    if (eq == std::string_view::npos) bad(uri, "query parameter without '='");
    std::string_view key = pair.substr(0, eq);
    std::string_view value = pair.substr(eq + 1);
    if (key == "db") {
      o.db = toInt(uri, value, "db", 0, 1 << 30);
    } else if (key == "password") {
      o.password = percentDecode(uri, value);
    } else if (key == "user") {
      o.user = percentDecode(uri, value);
    } else if (isTlsParameter(key) && !tls) {
      bad(uri, fmt::format("query parameter \"{}\" is for TLS: use a rediss:// URI", key));
    } else if (key == "cacert") {
      o.tls.caFile = percentDecode(uri, value);
    } else if (key == "capath") {
      o.tls.caPath = percentDecode(uri, value);
    } else if (key == "cert") {
      o.tls.certFile = percentDecode(uri, value);
    } else if (key == "key") {
      o.tls.keyFile = percentDecode(uri, value);
    } else if (key == "sni") {
      o.tls.serverName = percentDecode(uri, value);
    } else if (key == "verify") {
      if (value != "0" && value != "1") bad(uri, "verify must be 0 or 1");
      o.tls.verifyPeer = value == "1";
    } else {
      bad(uri, fmt::format("unknown query parameter \"{}\"", key));
    }
  }
}

}  // namespace

ConnectionOptions parseUri(const std::string& uri, ConnectionOptions o) {
  std::string_view rest(uri);
  if (rest.rfind("unix://", 0) == 0) {
    rest.remove_prefix(7);
    auto q = rest.find('?');
    std::string_view path = rest.substr(0, q);
    if (path.empty() || path.front() != '/') bad(uri, "unix socket path must be absolute");
    if (path.size() > kMaxUnixSocketPath) {
      bad(uri, fmt::format("unix socket path of {} bytes is longer than hiredis hands to the OS intact ({} bytes, "
                           "kMaxUnixSocketPath): it would be cut short and name another socket",
                           path.size(), kMaxUnixSocketPath));
    }
    o.unixSocket = std::string(path);
    o.tls.enabled = false;
    if (q != std::string_view::npos) applyQuery(uri, rest.substr(q + 1), o, false);
    return o;
  }
  bool tls = false;
  if (rest.rfind("rediss://", 0) == 0) {
    tls = true;
    rest.remove_prefix(9);
  } else if (rest.rfind("redis://", 0) == 0) {
    rest.remove_prefix(8);
  } else {
    bad(uri, "scheme must be redis://, rediss:// or unix://");
  }
  auto q = rest.find('?');
  std::string_view query = q == std::string_view::npos ? std::string_view{} : rest.substr(q + 1);
  rest = rest.substr(0, q);
  auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) o.db = toInt(uri, db, "db", 0, 1 << 30);
  }
  auto at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      o.password = percentDecode(uri, userinfo);  // redis://secret@host, as redis-cli accepts
    } else {
      o.user = percentDecode(uri, userinfo.substr(0, colon));
      o.password = percentDecode(uri, userinfo.substr(colon + 1));
    }
  }
  std::string_view host = authority;
  if (!authority.empty() && authority.front() == '[') {  // [::1]:6379
    auto close = authority.find(']');
    if (close == std::string_view::npos) bad(uri, "unclosed '[' in host");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad(uri, "expected ':' after ']'");
      o.port = toInt(uri, after.substr(1), "port", 1, 65535);
    }
  } else {
    auto colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      host = authority.substr(0, colon);
      o.port = toInt(uri, authority.substr(colon + 1), "port", 1, 65535);
    }
  }
  if (host.empty()) bad(uri, "missing host");
  o.host = std::string(host);
  o.unixSocket.clear();
  o.tls.enabled = tls;
  if (!query.empty()) applyQuery(uri, query, o, tls);
  return o;
}

}  // namespace redlimit
