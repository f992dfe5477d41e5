// redlimit — Redis Cluster slot maps and redirects, read from replies without any I/O: which node
// serves which slots (CLUSTER SHARDS, Redis 7.0+, or CLUSTER SLOTS on older servers), and where a
// MOVED or ASK error sends a request.
//
// Node addresses follow the servers' cluster-preferred-endpoint-type (Redis docs, CLUSTER SLOTS):
//   - the endpoint the server prefers (its "endpoint": ip, hostname or nothing);
//   - an empty endpoint (or nil in CLUSTER SLOTS) means "where you asked": the server's endpoint
//     is unknown (unknown-endpoint, behind a load balancer) or it does not know its own IP (a
//     cluster of one node); the caller's `seedHost` takes its place;
//   - "?" means the node is set to announce a hostname and has none: an unknown node, not the one
//     asked. Its "ip" (a CLUSTER SHARDS field; in CLUSTER SLOTS the node's metadata) takes its
//     place; a replica with neither is left out, a primary with neither is a ConfigurationError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit/detail/reply.hpp"
#include "redlimit/options.hpp"

namespace redlimit::detail {

/// Slots first..last (inclusive, within 0..16383) and the nodes that serve them.
struct SlotRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  ClientOptions::Node primary;                // where writes go
  std::vector<ClientOptions::Node> replicas;  // the shard's replicas that are online (may be empty)
  std::string primaryId;                      // the primary's 40-character node id ("" if the reply had none)
};

/// The slot map in a CLUSTER SHARDS reply (RESP2: every shard and node a flat key/value array).
/// `tls`: the client speaks TLS, so nodes are reached at their "tls-port" (their "port" if they
/// give none). `seedHost`: the host the command was sent to, for nodes without a known endpoint.
/// Each shard's "master" is its primary, whatever its "health": a failed primary stays in the map
/// until the cluster fails over, and the caller learns of that from failures, MOVED or a refresh.
/// Replicas count only while their health is "online". Shards without slots are left out.
/// Returns the ranges sorted by first slot; slots no shard serves are in no range.
/// Throws ReplyError (UnexpectedReply) (code "") for a reply of another shape: a missing or non-integer
/// port, slots outside 0..16383, a range that ends before it starts, ranges that overlap, a shard
/// with slots and no "master". Throws ConfigurationError (TlsPort) when `tls` is false and a node has only a TLS
/// port, ConfigurationError for a primary whose endpoint is "?" and that has no ip.
/// Thread-safe (a pure function).
[[nodiscard]] std::vector<SlotRange> parseClusterShards(const Reply& reply, bool tls, const std::string& seedHost);

/// The slot map in a CLUSTER SLOTS reply: an array of [first, last, primary, replicas...], each
/// node [host, port, id, metadata] (the id since Redis 4.0, the metadata, a flat key/value array
/// with "ip" or "hostname", since 7.0). The server lists the replicas that have not failed; the
/// port is the one for the connection the command came on (plain or TLS). A nil or empty host is
/// `seedHost`. Sorted, checked and thrown as parseClusterShards. Thread-safe.
[[nodiscard]] std::vector<SlotRange> parseClusterSlots(const Reply& reply, const std::string& seedHost);

/// Where a MOVED or ASK error sends a request.
struct Redirect {
  bool ask = false;          // ASK: this one request goes to `node`, after ASKING; MOVED: the slot moved
  std::uint16_t slot = 0;    // 0..16383
  ClientOptions::Node node;  // host "" = the node that answered (its endpoint is unknown: the error
                             // read "MOVED 3999 :6381"); host "?" = a node without a known endpoint
                             // (refresh the slot map)
};

/// The redirect in an error text: "MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381", also
/// inside a longer message ("redlimit: Redis replied with an error: MOVED 3999 10.0.0.2:6381").
/// The port is what follows the last ':' (so "MOVED 1 ::1:7000" is host "::1"; "[::1]:7000" is
/// taken as well). nullopt if the text holds no well-formed MOVED or ASK (a slot in 0..16383 and
/// a port in 1..65535). Thread-safe; does not throw (but std::bad_alloc).
[[nodiscard]] std::optional<Redirect> parseRedirect(std::string_view errorText);

}  // namespace redlimit::detail
