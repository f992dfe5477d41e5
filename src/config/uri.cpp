// parseUri and parseClientUri. Every scheme goes through the same pieces: the scheme table, the
// split into authority, path and query, the userinfo, the host:port (or host list) and the query
// parameters; each scheme only says what its path means and which query parameters it adds.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

namespace redlimit {
namespace {

constexpr std::string_view kMask = "***";

// A query parameter whose value messages may show: the known ones that hold no secret. The values
// of password=, sentinel_password=, of every unknown parameter (a misspelt "pasword=") and a
// parameter without '=' are not shown.
bool showsValue(std::string_view key) {
  static constexpr std::string_view kShown[] = {"db",   "user", "sentinel_user", "cacert", "capath",
                                                "cert", "key",  "sni",           "verify"};
  return std::find(std::begin(kShown), std::end(kShown), key) != std::end(kShown);
}

// `uri` as messages show it: the password of the userinfo and the values of the query parameters
// that may hold one replaced by "***" (the user name is kept). The userinfo is taken to end at
// the last '@' of the URI, which is more than the parser takes when a password holds an unescaped
// '/' or '?' (then the URI is bad, and its message must not show the password either): masking too
// much only hides part of the host, masking too little would show a secret.
std::string redacted(std::string_view uri) {
  std::string out;
  const auto schemeEnd = uri.find("://");
  const std::size_t start = schemeEnd == std::string_view::npos ? 0 : schemeEnd + 3;
  out.append(uri.substr(0, start));
  std::string_view rest = uri.substr(start);
  const auto at = uri.substr(0, 7) == "unix://" ? std::string_view::npos : rest.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    const auto colon = userinfo.find(':');
    if (colon != std::string_view::npos) out.append(userinfo.substr(0, colon + 1));
    out.append(kMask);
    out.push_back('@');
    rest.remove_prefix(at + 1);
  }
  const auto q = rest.find('?');
  out.append(rest.substr(0, q));
  if (q == std::string_view::npos) return out;
  std::string_view query = rest.substr(q + 1);
  out.push_back('?');
  for (;;) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const auto eq = pair.find('=');
    if (eq == std::string_view::npos) {
      out.append(kMask);  // not a parameter: perhaps a password pasted without its name
    } else if (!showsValue(pair.substr(0, eq))) {
      out.append(pair.substr(0, eq + 1));
      out.append(kMask);
    } else {
      out.append(pair);
    }
    if (amp == std::string_view::npos) break;
    out.push_back('&');
    query.remove_prefix(amp + 1);
  }
  return out;
}

// Every message about a URI goes through here: none may show a password.
[[noreturn]] void bad(const std::string& uri, const std::string& why) {
  throw InvalidArgument(fmt::format("redlimit: bad Redis URI \"{}\": {}", redacted(uri), why));
}

int toInt(const std::string& uri, std::string_view text, const char* what, int lo, int hi) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi) {
    bad(uri, fmt::format("{} must be a number in {}..{}", what, lo, hi));
  }
  return v;
}

int toDb(const std::string& uri, std::string_view text) { return toInt(uri, text, "db", 0, 1 << 30); }

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

enum class Kind { Server, Unix, Cluster, Sentinel };

struct Scheme {
  std::string_view prefix;  // "redis://"
  Kind kind;
  bool tls;                    // the scheme turns TLS on
  std::string_view tlsPrefix;  // the scheme to name when a TLS parameter comes without TLS
};

constexpr Scheme kSchemes[] = {
    {"redis://", Kind::Server, false, "rediss://"},
    {"rediss://", Kind::Server, true, "rediss://"},
    {"unix://", Kind::Unix, false, "rediss://"},
    {"redis-cluster://", Kind::Cluster, false, "rediss-cluster://"},
    {"rediss-cluster://", Kind::Cluster, true, "rediss-cluster://"},
    {"redis-sentinel://", Kind::Sentinel, false, "rediss-sentinel://"},
    {"rediss-sentinel://", Kind::Sentinel, true, "rediss-sentinel://"},
};

// Scheme names are matched exactly (lowercase), as redis-cli and hiredis do.
const Scheme* findScheme(std::string_view uri) {
  for (const Scheme& s : kSchemes) {
    if (uri.substr(0, s.prefix.size()) == s.prefix) return &s;
  }
  return nullptr;
}

// What follows `scheme://`: `authority[/path][?query]`. The authority ends at the first '/'.
struct UriParts {
  std::string_view authority;            // [[user]:password@]host[:port][,host[:port]...]
  std::optional<std::string_view> path;  // after the first '/' (without it), if there is one
  std::string_view query;                // after the first '?'; empty if none
};

UriParts splitUri(std::string_view rest) {
  UriParts parts;
  auto q = rest.find('?');
  if (q != std::string_view::npos) parts.query = rest.substr(q + 1);
  rest = rest.substr(0, q);
  auto slash = rest.find('/');
  parts.authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) parts.path = rest.substr(slash + 1);
  return parts;
}

// Takes `[[user]:password@]` off `authority` into user and password (percent-decoded) and returns
// the hosts after it. The last '@' ends the userinfo, so that an unescaped '@' in a password works.
std::string_view takeUserinfo(const std::string& uri, std::string_view authority, std::string& user,
                              std::string& password) {
  auto at = authority.rfind('@');
  if (at == std::string_view::npos) return authority;
  std::string_view userinfo = authority.substr(0, at);
  auto colon = userinfo.find(':');
  if (colon == std::string_view::npos) {
    password = percentDecode(uri, userinfo);  // redis://secret@host, as redis-cli accepts
  } else {
    user = percentDecode(uri, userinfo.substr(0, colon));
    password = percentDecode(uri, userinfo.substr(colon + 1));
  }
  return authority.substr(at + 1);
}

// `host`, `host:port` or `[ipv6]:port`; an IPv6 address without brackets takes the part after its
// last ':' as the port.
ClientOptions::Node parseNode(const std::string& uri, std::string_view text, int defaultPort) {
  ClientOptions::Node node;
  node.port = defaultPort;
  std::string_view host = text;
  if (!text.empty() && text.front() == '[') {  // [::1]:6379
    auto close = text.find(']');
    if (close == std::string_view::npos) bad(uri, "unclosed '[' in host");
    host = text.substr(1, close - 1);
    std::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad(uri, "expected ':' after ']'");
      node.port = toInt(uri, after.substr(1), "port", 1, 65535);
    }
  } else {
    auto colon = text.rfind(':');
    if (colon != std::string_view::npos) {
      host = text.substr(0, colon);
      node.port = toInt(uri, text.substr(colon + 1), "port", 1, 65535);
    }
  }
  if (host.empty()) bad(uri, "missing host");
  node.host = std::string(host);
  return node;
}

// `node[,node...]` (each as parseNode takes it).
std::vector<ClientOptions::Node> parseNodes(const std::string& uri, std::string_view list, int defaultPort) {
  if (list.empty()) bad(uri, "missing host");
  std::vector<ClientOptions::Node> nodes;
  while (true) {
    auto comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    if (item.empty()) bad(uri, "empty entry in the list of hosts");
    nodes.push_back(parseNode(uri, item, defaultPort));
    if (comma == std::string_view::npos) return nodes;
    list.remove_prefix(comma + 1);
  }
}

bool isTlsParameter(std::string_view key) {
  return key == "cacert" || key == "capath" || key == "cert" || key == "key" || key == "sni" || key == "verify";
}

// One of the connection's query parameters: db, password, user; with TLS (`scheme.tls`) also
// cacert, capath, cert, key, sni, verify=0|1. False for a parameter that is not one of them.
bool applyConnectionParameter(const std::string& uri, const Scheme& scheme, std::string_view key,
                              std::string_view value, ClientOptions::Connection& o) {
  if (key == "db") {
    o.db = toDb(uri, value);
  } else if (key == "password") {
    o.password = percentDecode(uri, value);
  } else if (key == "user") {
    o.user = percentDecode(uri, value);
  } else if (isTlsParameter(key) && !scheme.tls) {
    bad(uri, fmt::format("query parameter \"{}\" is for TLS: use a {} URI", key, scheme.tlsPrefix));
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
    return false;
  }
  return true;
}

// Applies "a=1&b=2": each parameter goes first to `topology(key, value)` (the scheme's own
// parameters; it returns false for others), then to the connection's.
template <typename TopologyParameter>
void applyQuery(const std::string& uri, const Scheme& scheme, std::string_view query, ClientOptions::Connection& o,
                TopologyParameter topology) {
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    auto eq = pair.find('=');
    if (eq == std::string_view::npos) bad(uri, "query parameter without '='");
    std::string_view key = pair.substr(0, eq);
    std::string_view value = pair.substr(eq + 1);
    if (topology(key, value) || applyConnectionParameter(uri, scheme, key, value, o)) continue;
    if (key.substr(0, 9) == "sentinel_") {
      bad(uri, fmt::format("query parameter \"{}\" is for redis-sentinel:// URIs", key));
    }
    bad(uri, fmt::format("unknown query parameter \"{}\"", key));
  }
}

void applyQuery(const std::string& uri, const Scheme& scheme, std::string_view query, ClientOptions::Connection& o) {
  applyQuery(uri, scheme, query, o, [](std::string_view, std::string_view) { return false; });
}

// unix:///path[?query]
void parseUnix(const std::string& uri, const Scheme& scheme, ClientOptions::Connection& o) {
  std::string_view rest = std::string_view(uri).substr(scheme.prefix.size());
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
  if (q != std::string_view::npos) applyQuery(uri, scheme, rest.substr(q + 1), o);
}

// redis[s]://[[user]:password@]host[:port][/db][?query]
void parseServer(const std::string& uri, const Scheme& scheme, ClientOptions::Connection& o) {
  const UriParts parts = splitUri(std::string_view(uri).substr(scheme.prefix.size()));
  if (parts.path && !parts.path->empty()) o.db = toDb(uri, *parts.path);
  std::string_view host = takeUserinfo(uri, parts.authority, o.user, o.password);
  if (host.find(',') != std::string_view::npos) {
    bad(uri,
        "a list of hosts names a cluster or sentinels: use redis-cluster:// or redis-sentinel:// "
        "(Client::fromUri, parseClientUri)");
  }
  ClientOptions::Node node = parseNode(uri, host, o.port);
  o.host = std::move(node.host);
  o.port = node.port;
  o.unixSocket.clear();
  o.tls.enabled = scheme.tls;
  applyQuery(uri, scheme, parts.query, o);
}

// redis[s]-cluster://[[user]:password@]host[:port][,host[:port]...][/0][?query]
void parseCluster(const std::string& uri, const Scheme& scheme, ClientOptions& o) {
  const UriParts parts = splitUri(std::string_view(uri).substr(scheme.prefix.size()));
  ClientOptions::Connection& c = o.connection;
  auto onlyDb0 = [&](std::string_view text) {
    const int db = toDb(uri, text);
    if (db != 0) bad(uri, fmt::format("db {}: a Redis Cluster has only db 0", db));
    c.db = 0;
  };
  if (parts.path && !parts.path->empty()) onlyDb0(*parts.path);
  std::string_view hosts = takeUserinfo(uri, parts.authority, c.user, c.password);
  o.topology = ClientOptions::Topology::Cluster;
  o.cluster.seeds = parseNodes(uri, hosts, 6379);
  c.unixSocket.clear();
  c.tls.enabled = scheme.tls;
  applyQuery(uri, scheme, parts.query, c, [&](std::string_view key, std::string_view value) {
    if (key != "db") return false;
    onlyDb0(value);
    return true;
  });
}

// redis[s]-sentinel://[[user]:password@]host[:port][,host[:port]...]/primaryName[/db][?query]
void parseSentinel(const std::string& uri, const Scheme& scheme, ClientOptions& o) {
  const UriParts parts = splitUri(std::string_view(uri).substr(scheme.prefix.size()));
  ClientOptions::Connection& c = o.connection;
  ClientOptions::Sentinel& s = o.sentinel;
  std::string_view path = parts.path.value_or(std::string_view{});
  auto slash = path.find('/');
  std::string name = percentDecode(uri, path.substr(0, slash));
  if (name.empty()) {
    bad(uri,
        fmt::format("missing the primary's name after the sentinels, as in {}127.0.0.1:26379/mymaster", scheme.prefix));
  }
  if (slash != std::string_view::npos && slash + 1 < path.size()) c.db = toDb(uri, path.substr(slash + 1));
  std::string_view hosts = takeUserinfo(uri, parts.authority, c.user, c.password);
  o.topology = ClientOptions::Topology::Sentinel;
  s.sentinels = parseNodes(uri, hosts, 26379);
  s.primaryName = std::move(name);
  c.unixSocket.clear();
  c.tls.enabled = scheme.tls;
  s.tls = scheme.tls;
  applyQuery(uri, scheme, parts.query, c, [&](std::string_view key, std::string_view value) {
    if (key == "sentinel_user") {
      s.user = percentDecode(uri, value);
    } else if (key == "sentinel_password") {
      s.password = percentDecode(uri, value);
    } else {
      return false;
    }
    return true;
  });
}

}  // namespace

ClientOptions::Connection parseUri(const std::string& uri, ClientOptions::Connection o) {
  const Scheme* scheme = findScheme(uri);
  if (scheme == nullptr) bad(uri, "scheme must be redis://, rediss:// or unix://");
  switch (scheme->kind) {
    case Kind::Server:
      parseServer(uri, *scheme, o);
      break;
    case Kind::Unix:
      parseUnix(uri, *scheme, o);
      break;
    case Kind::Cluster:
    case Kind::Sentinel:
      bad(uri, fmt::format("{} names more than one server: parse it with parseClientUri (Client::fromUri takes it)",
                           scheme->prefix));
  }
  return o;
}

ClientOptions parseClientUri(const std::string& uri, ClientOptions o) {
  const Scheme* scheme = findScheme(uri);
  if (scheme == nullptr) {
    bad(uri,
        "scheme must be redis://, rediss://, unix://, redis-cluster://, rediss-cluster://, redis-sentinel:// "
        "or rediss-sentinel://");
  }
  switch (scheme->kind) {
    case Kind::Server:
    case Kind::Unix:
      o.topology = ClientOptions::Topology::Standalone;
      o.connection = parseUri(uri, std::move(o.connection));
      break;
    case Kind::Cluster:
      parseCluster(uri, *scheme, o);
      break;
    case Kind::Sentinel:
      parseSentinel(uri, *scheme, o);
      break;
  }
  return o;
}

}  // namespace redlimit
