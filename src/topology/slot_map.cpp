// redlimit — Redis Cluster slot maps and redirects (see slot_map.hpp).
#include "topology/slot_map.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <utility>

#include <fmt/format.h>

#include "topology/key_slot.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

constexpr std::string_view kShards = "CLUSTER SHARDS";
constexpr std::string_view kSlots = "CLUSTER SLOTS";

[[noreturn]] void malformed(std::string_view command, std::string_view where, std::string_view why) {
  throw ReplyError(ErrorKind::UnexpectedReply, "",
                   fmt::format("redlimit: unexpected {} reply: {}: {}", command, where, why));
}

bool isText(const Reply& r) { return r.type == Reply::Type::String || r.type == Reply::Type::Status; }

// RESP2 carries a map as a flat array: key, value, key, value...
void checkFlatMap(const Reply& r, std::string_view command, std::string_view where) {
  if (r.type != Reply::Type::Array) malformed(command, where, fmt::format("expected an array, got {}", r.describe()));
  if (r.elements.size() % 2 != 0) {
    malformed(command, where, fmt::format("a key/value array of {} elements (odd)", r.elements.size()));
  }
  for (std::size_t i = 0; i < r.elements.size(); i += 2) {
    if (!isText(r.elements[i])) {
      malformed(command, where, fmt::format("expected a key at {}, got {}", i, r.elements[i].describe()));
    }
  }
}

// The value of `key` in a flat map checkFlatMap accepted; nullptr if it has none.
const Reply* field(const Reply& map, std::string_view key) {
  for (std::size_t i = 0; i + 1 < map.elements.size(); i += 2) {
    if (map.elements[i].str == key) return &map.elements[i + 1];
  }
  return nullptr;
}

// A text field; nullopt if absent.
std::optional<std::string> textField(const Reply& map, std::string_view key, std::string_view command,
                                     std::string_view where) {
  const Reply* value = field(map, key);
  if (value == nullptr) return std::nullopt;
  if (!isText(*value))
    malformed(command, where, fmt::format("\"{}\" is {}, expected a string", key, value->describe()));
  return value->str;
}

std::uint16_t slotNumber(const Reply& r, std::string_view command, std::string_view where) {
  if (r.type != Reply::Type::Integer || r.integer < 0 || r.integer >= kClusterSlots) {
    malformed(command, where, fmt::format("expected a slot in 0..{}, got {}", kClusterSlots - 1, r.describe()));
  }
  return static_cast<std::uint16_t>(r.integer);
}

// A port in 1..65535; 0 (no such port) is nullopt.
std::optional<int> portNumber(const Reply& r, std::string_view what, std::string_view command, std::string_view where) {
  if (r.type != Reply::Type::Integer || r.integer < 0 || r.integer > 65535) {
    malformed(command, where, fmt::format("expected {} in 0..65535, got {}", what, r.describe()));
  }
  if (r.integer == 0) return std::nullopt;
  return static_cast<int>(r.integer);
}

// A node as a reply names it, before the caller decides whether it needs it.
struct NodeEntry {
  std::string id;
  std::optional<ClientOptions::Node> address;  // nullopt: not reachable, for the reason below
  std::string unreachable;                     // why, for the message
  bool tlsOnly = false;                        // unreachable because it has only a TLS port
};

// The host to connect to: the preferred endpoint (nullopt: nil), else per slot_map.hpp.
std::optional<std::string> chooseHost(const std::optional<std::string>& endpoint, const std::optional<std::string>& ip,
                                      const std::string& seedHost) {
  if (!endpoint || endpoint->empty()) return seedHost;
  if (*endpoint != "?") return endpoint;
  if (ip && !ip->empty()) return ip;
  return std::nullopt;
}

void setAddress(NodeEntry& node, const std::optional<std::string>& host, int port) {
  if (host) {
    node.address = ClientOptions::Node{*host, port};
  } else {
    node.unreachable = fmt::format(
        "has the endpoint \"?\" (port {}) and no ip: it is set to "
        "cluster-preferred-endpoint-type hostname without a cluster-announce-hostname",
        port);
  }
}

// A primary must be reachable; a replica that is not is left out.
ClientOptions::Node primaryAddress(const NodeEntry& node) {
  if (node.address) return *node.address;
  const std::string message = fmt::format("redlimit: the Redis Cluster primary {} {}", node.id, node.unreachable);
  if (node.tlsOnly) throw ConfigurationError(ErrorKind::TlsPort, "", message);
  throw ConfigurationError("", message);
}

// A node of CLUSTER SHARDS: id, port, tls-port, ip, endpoint, hostname, role, replication-offset, health.
NodeEntry shardNode(const Reply& r, bool tls, const std::string& seedHost, std::string_view where) {
  checkFlatMap(r, kShards, where);
  NodeEntry node;
  node.id = textField(r, "id", kShards, where).value_or("");
  const Reply* plainReply = field(r, "port");
  const Reply* tlsReply = field(r, "tls-port");
  const std::optional<int> plain = plainReply ? portNumber(*plainReply, "a port", kShards, where) : std::nullopt;
  const std::optional<int> tlsPort = tlsReply ? portNumber(*tlsReply, "a tls-port", kShards, where) : std::nullopt;
  std::optional<int> port = tls && tlsPort ? tlsPort : plain;  // TLS without a tls-port: Redis < 7 or TLS in front
  const std::optional<std::string> ip = textField(r, "ip", kShards, where);
  std::optional<std::string> endpoint = textField(r, "endpoint", kShards, where);
  if (!endpoint && !ip) malformed(kShards, where, "neither \"endpoint\" nor \"ip\"");
  if (!endpoint) endpoint = ip;
  if (!port) {
    if (!tlsPort) malformed(kShards, where, "no \"port\" (nor \"tls-port\")");
    node.tlsOnly = true;
    node.unreachable = fmt::format(
        "at {} has only a TLS port ({}): connect with TLS (rediss-cluster://, "
        "ClientOptions::Tls::enabled)",
        chooseHost(endpoint, ip, seedHost).value_or("?"), *tlsPort);
    return node;
  }
  setAddress(node, chooseHost(endpoint, ip, seedHost), *port);
  return node;
}

// A node of CLUSTER SLOTS: [host, port, id, metadata].
NodeEntry slotsNode(const Reply& r, const std::string& seedHost, std::string_view where) {
  if (r.type != Reply::Type::Array || r.elements.size() < 2) {
    malformed(kSlots, where, fmt::format("expected a node [host, port, ...], got {}", r.describe()));
  }
  const Reply& hostReply = r.elements[0];
  std::optional<std::string> endpoint;
  if (isText(hostReply)) {
    endpoint = hostReply.str;
  } else if (!hostReply.isNil()) {
    malformed(kSlots, where, fmt::format("expected a host, got {}", hostReply.describe()));
  }
  NodeEntry node;
  if (r.elements.size() > 2) {
    if (!isText(r.elements[2]))
      malformed(kSlots, where, fmt::format("expected a node id, got {}", r.elements[2].describe()));
    node.id = r.elements[2].str;
  }
  std::optional<std::string> ip;
  if (r.elements.size() > 3) {
    checkFlatMap(r.elements[3], kSlots, fmt::format("{}, metadata", where));
    ip = textField(r.elements[3], "ip", kSlots, where);
  }
  const std::optional<int> port = portNumber(r.elements[1], "a port", kSlots, where);
  if (!port) {
    node.unreachable =
        fmt::format("at {} has port 0 in CLUSTER SLOTS: no port for this kind of connection (plain or TLS)",
                    endpoint.value_or(seedHost));
    return node;
  }
  setAddress(node, chooseHost(endpoint, ip, seedHost), *port);
  return node;
}

std::vector<SlotRange> sortedAndChecked(std::vector<SlotRange> ranges, std::string_view command) {
  std::sort(ranges.begin(), ranges.end(), [](const SlotRange& a, const SlotRange& b) {
    return a.first != b.first ? a.first < b.first : a.last < b.last;
  });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first <= ranges[i - 1].last) {
      malformed(
          command, "the slot map",
          fmt::format("slots {}-{} (node {}) and {}-{} (node {}) overlap", ranges[i - 1].first, ranges[i - 1].last,
                      ranges[i - 1].primaryId, ranges[i].first, ranges[i].last, ranges[i].primaryId));
    }
  }
  return ranges;
}

SlotRange makeRange(const Reply& first, const Reply& last, std::string_view command, std::string_view where) {
  SlotRange range;
  range.first = slotNumber(first, command, where);
  range.last = slotNumber(last, command, where);
  if (range.first > range.last) {
    malformed(command, where, fmt::format("slots {}-{} end before they start", range.first, range.last));
  }
  return range;
}

// The text after "MOVED " or "ASK ": "<slot> <host>:<port>", ending at whitespace or the end.
std::optional<Redirect> redirectAfter(std::string_view text, bool ask) {
  unsigned slot = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), slot);
  const auto digits = static_cast<std::size_t>(end - text.data());
  if (ec != std::errc() || digits == 0 || slot >= kClusterSlots || digits >= text.size() || text[digits] != ' ') {
    return std::nullopt;
  }
  std::string_view endpoint = text.substr(digits + 1);
  endpoint = endpoint.substr(0, endpoint.find_first_of(" \t\r\n"));
  const auto colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view portText = endpoint.substr(colon + 1);
  int port = 0;
  auto [portEnd, portEc] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
  if (portEc != std::errc() || portEnd != portText.data() + portText.size() || port < 1 || port > 65535) {
    return std::nullopt;
  }
  std::string_view host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return Redirect{ask, static_cast<std::uint16_t>(slot), ClientOptions::Node{std::string(host), port}};
}

}  // namespace

std::vector<SlotRange> parseClusterShards(const Reply& reply, bool tls, const std::string& seedHost) {
  if (reply.type != Reply::Type::Array) {
    malformed(kShards, "the reply", fmt::format("expected an array of shards, got {}", reply.describe()));
  }
  std::vector<SlotRange> ranges;
  for (std::size_t i = 0; i < reply.elements.size(); ++i) {
    const Reply& shard = reply.elements[i];
    const std::string where = fmt::format("shard {}", i);
    checkFlatMap(shard, kShards, where);
    const Reply* slots = field(shard, "slots");
    const Reply* nodes = field(shard, "nodes");
    if (slots == nullptr || slots->type != Reply::Type::Array) malformed(kShards, where, "no \"slots\" array");
    if (nodes == nullptr || nodes->type != Reply::Type::Array) malformed(kShards, where, "no \"nodes\" array");
    if (slots->elements.size() % 2 != 0) {
      malformed(kShards, where, fmt::format("\"slots\" holds {} numbers, not start-end pairs", slots->elements.size()));
    }
    if (slots->elements.empty()) continue;  // a primary without slots (yet): nothing to route to it

    std::optional<std::size_t> primary;  // index into entries
    bool primaryOnline = false;
    std::vector<NodeEntry> entries;
    std::vector<bool> isReplica;
    for (std::size_t j = 0; j < nodes->elements.size(); ++j) {
      const std::string nodeWhere = fmt::format("shard {}, node {}", i, j);
      entries.push_back(shardNode(nodes->elements[j], tls, seedHost, nodeWhere));
      const Reply& node = nodes->elements[j];
      const std::string role = textField(node, "role", kShards, nodeWhere).value_or("");
      const bool online = textField(node, "health", kShards, nodeWhere).value_or("online") == "online";
      // Redis 7.0 lists the primary first; a later Redis may list a failed former primary too.
      if (role == "master" && (!primary || (online && !primaryOnline))) {
        primary = j;
        primaryOnline = online;
      }
      isReplica.push_back((role == "replica" || role == "slave") && online);
    }
    if (!primary) malformed(kShards, where, "slots but no node with the role \"master\"");
    SlotRange shardRange;
    shardRange.primary = primaryAddress(entries[*primary]);
    shardRange.primaryId = entries[*primary].id;
    for (std::size_t j = 0; j < entries.size(); ++j) {
      if (isReplica[j] && entries[j].address) shardRange.replicas.push_back(*entries[j].address);
    }
    for (std::size_t k = 0; k < slots->elements.size(); k += 2) {
      SlotRange range = makeRange(slots->elements[k], slots->elements[k + 1], kShards, where);
      range.primary = shardRange.primary;
      range.replicas = shardRange.replicas;
      range.primaryId = shardRange.primaryId;
      ranges.push_back(std::move(range));
    }
  }
  return sortedAndChecked(std::move(ranges), kShards);
}

std::vector<SlotRange> parseClusterSlots(const Reply& reply, const std::string& seedHost) {
  if (reply.type != Reply::Type::Array) {
    malformed(kSlots, "the reply", fmt::format("expected an array of slot ranges, got {}", reply.describe()));
  }
  std::vector<SlotRange> ranges;
  for (std::size_t i = 0; i < reply.elements.size(); ++i) {
    const Reply& entry = reply.elements[i];
    const std::string where = fmt::format("range {}", i);
    if (entry.type != Reply::Type::Array || entry.elements.size() < 3) {
      malformed(kSlots, where, fmt::format("expected [first, last, primary, replicas...], got {}", entry.describe()));
    }
    SlotRange range = makeRange(entry.elements[0], entry.elements[1], kSlots, where);
    const NodeEntry primary = slotsNode(entry.elements[2], seedHost, fmt::format("{}, primary", where));
    range.primary = primaryAddress(primary);
    range.primaryId = primary.id;
    for (std::size_t j = 3; j < entry.elements.size(); ++j) {
      const NodeEntry replica = slotsNode(entry.elements[j], seedHost, fmt::format("{}, replica {}", where, j - 3));
      if (replica.address) range.replicas.push_back(*replica.address);
    }
    ranges.push_back(std::move(range));
  }
  return sortedAndChecked(std::move(ranges), kSlots);
}

std::optional<Redirect> parseRedirect(std::string_view errorText) {
  for (std::size_t pos = 0; pos < errorText.size(); ++pos) {
    if (pos > 0 && std::isalnum(static_cast<unsigned char>(errorText[pos - 1])) != 0) continue;
    const std::string_view rest = errorText.substr(pos);
    std::optional<Redirect> r;
    if (rest.substr(0, 6) == "MOVED ") {
      r = redirectAfter(rest.substr(6), false);
    } else if (rest.substr(0, 4) == "ASK ") {
      r = redirectAfter(rest.substr(4), true);
    }
    if (r) return r;
  }
  return std::nullopt;
}

}  // namespace redlimit::detail
