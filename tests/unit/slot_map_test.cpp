// parseClusterShards, parseClusterSlots and parseRedirect on replies built by hand. The shapes are
// those redis-server 7.0.15 sent (RESP2, as redis-cli --no-raw shows them) from a three-node
// cluster (two primaries, one replica) with cluster-announce-hostname set, under each
// cluster-preferred-endpoint-type, with its replica loading and then killed, and from one-node
// clusters with tls-cluster yes (with and without a plain port).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "topology/slot_map.hpp"
#include "redlimit_test/expect_error.hpp"

using redlimit::detail::parseClusterShards;
using redlimit::detail::parseClusterSlots;
using redlimit::detail::parseRedirect;
using redlimit::detail::Reply;
using redlimit::detail::SlotRange;

namespace {

Reply str(std::string s) {
  Reply r;
  r.type = Reply::Type::String;
  r.str = std::move(s);
  return r;
}

Reply num(std::int64_t v) {
  Reply r;
  r.type = Reply::Type::Integer;
  r.integer = v;
  return r;
}

Reply nil() { return Reply{}; }

Reply arr(std::vector<Reply> elements) {
  Reply r;
  r.type = Reply::Type::Array;
  r.elements = std::move(elements);
  return r;
}

// A node of CLUSTER SHARDS, in the server's field order: id, port, tls-port, ip, endpoint,
// hostname, role, replication-offset, health. A field whose value is nil here is left out.
struct ShardNode {
  std::string id;
  Reply port;
  Reply tlsPort;
  std::string ip;
  std::string endpoint;
  Reply hostname;
  std::string role = "master";
  std::string health = "online";
};

Reply shardNode(const ShardNode& n) {
  std::vector<Reply> kv{str("id"), str(n.id)};
  if (!n.port.isNil()) kv.insert(kv.end(), {str("port"), n.port});
  if (!n.tlsPort.isNil()) kv.insert(kv.end(), {str("tls-port"), n.tlsPort});
  kv.insert(kv.end(), {str("ip"), str(n.ip), str("endpoint"), str(n.endpoint)});
  if (!n.hostname.isNil()) kv.insert(kv.end(), {str("hostname"), n.hostname});
  kv.insert(kv.end(), {str("role"), str(n.role), str("replication-offset"), num(14), str("health"), str(n.health)});
  return arr(std::move(kv));
}

Reply shard(std::vector<Reply> slots, std::vector<Reply> nodes) {
  return arr({str("slots"), arr(std::move(slots)), str("nodes"), arr(std::move(nodes))});
}

const std::string kIdA = "09fff00866d45b5c9a169568d8b5cea4bd001a0c";  // 17321, primary of 0-8191
const std::string kIdB = "e283f39d252f3def232311937b646009b76089d1";  // 17322, primary of 8192-16383
const std::string kIdC = "7d0587ca040098a22cf4e1087a97a68c4b35ab51";  // 17323, replica of A

// The three-node cluster: `endpoint(port)` is each node's endpoint, `health` the replica's.
Reply threeNodeShards(std::string (*endpoint)(int), const std::string& replicaHealth = "online") {
  auto node = [&](const std::string& id, int port, const char* role, const std::string& health) {
    return shardNode({id, num(port), nil(), "127.0.0.1", endpoint(port),
                      str("node-" + std::to_string(port) + ".example"), role, health});
  };
  return arr({shard({num(8192), num(16383)}, {node(kIdB, 17322, "master", "online")}),
              shard({num(0), num(8191)},
                    {node(kIdA, 17321, "master", "online"), node(kIdC, 17323, "replica", replicaHealth)})});
}

std::string ipEndpoint(int) { return "127.0.0.1"; }
std::string hostnameEndpoint(int port) { return "node-" + std::to_string(port) + ".example"; }
std::string unknownEndpoint(int) { return ""; }

void expectNode(const redlimit::ClientOptions::Node& n, const std::string& host, int port) {
  EXPECT_EQ(n.host, host);
  EXPECT_EQ(n.port, port);
}

void expectRange(const SlotRange& r, int first, int last, const std::string& host, int port) {
  EXPECT_EQ(r.first, first);
  EXPECT_EQ(r.last, last);
  expectNode(r.primary, host, port);
}

template <typename Error, typename F>
std::string thrown(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return {};
}

// --- CLUSTER SHARDS ---------------------------------------------------------------------------

TEST(ClusterShards, ThreeNodeClusterSortedBySlot) {
  const std::vector<SlotRange> map = parseClusterShards(threeNodeShards(ipEndpoint), false, "seed.example");
  ASSERT_EQ(map.size(), 2u);
  expectRange(map[0], 0, 8191, "127.0.0.1", 17321);
  EXPECT_EQ(map[0].primaryId, kIdA);
  ASSERT_EQ(map[0].replicas.size(), 1u);
  expectNode(map[0].replicas[0], "127.0.0.1", 17323);
  expectRange(map[1], 8192, 16383, "127.0.0.1", 17322);
  EXPECT_EQ(map[1].primaryId, kIdB);
  EXPECT_TRUE(map[1].replicas.empty());
}

TEST(ClusterShards, PreferredEndpointIsTheAddress) {
  std::vector<SlotRange> map = parseClusterShards(threeNodeShards(hostnameEndpoint), false, "seed.example");
  ASSERT_EQ(map.size(), 2u);
  expectRange(map[0], 0, 8191, "node-17321.example", 17321);
  expectNode(map[0].replicas.at(0), "node-17323.example", 17323);
  // unknown-endpoint: "" is where the command went, with the node's port
  map = parseClusterShards(threeNodeShards(unknownEndpoint), false, "lb.example");
  expectRange(map[0], 0, 8191, "lb.example", 17321);
  expectNode(map[0].replicas.at(0), "lb.example", 17323);
  expectRange(map[1], 8192, 16383, "lb.example", 17322);
}

TEST(ClusterShards, OneNodeClusterWithTwoSlotRanges) {
  // A node alone knows neither its IP nor an endpoint: both "".
  const Reply reply = arr({shard({num(0), num(100), num(200), num(16383)},
                                 {shardNode({"b06f445778caa42115d4b5260624c5a4767221a0", num(17311), nil(), "", "",
                                             nil(), "master", "online"})})});
  const std::vector<SlotRange> map = parseClusterShards(reply, false, "10.1.2.3");
  ASSERT_EQ(map.size(), 2u);
  expectRange(map[0], 0, 100, "10.1.2.3", 17311);
  expectRange(map[1], 200, 16383, "10.1.2.3", 17311);
  EXPECT_EQ(map[1].primaryId, "b06f445778caa42115d4b5260624c5a4767221a0");
}

TEST(ClusterShards, ReplicasCountOnlyOnline) {
  for (const char* health : {"loading", "fail", "failed"}) {
    const std::vector<SlotRange> map = parseClusterShards(threeNodeShards(ipEndpoint, health), false, "s");
    EXPECT_TRUE(map.at(0).replicas.empty()) << health;
    expectRange(map[0], 0, 8191, "127.0.0.1", 17321);
  }
}

TEST(ClusterShards, AFailedPrimaryKeepsItsSlots) {
  const Reply reply =
      arr({shard({num(0), num(16383)},
                 {shardNode({kIdA, num(7000), nil(), "10.0.0.1", "10.0.0.1", nil(), "master", "fail"}),
                  shardNode({kIdC, num(7001), nil(), "10.0.0.2", "10.0.0.2", nil(), "replica", "online"})})});
  const std::vector<SlotRange> map = parseClusterShards(reply, false, "s");
  ASSERT_EQ(map.size(), 1u);
  expectRange(map[0], 0, 16383, "10.0.0.1", 7000);
  EXPECT_EQ(map[0].primaryId, kIdA);
  ASSERT_EQ(map[0].replicas.size(), 1u);
}

TEST(ClusterShards, AnOnlinePrimaryWinsOverAFailedOne) {
  const Reply reply = arr({shard(
      {num(0), num(16383)}, {shardNode({kIdA, num(7000), nil(), "10.0.0.1", "10.0.0.1", nil(), "master", "fail"}),
                             shardNode({kIdB, num(7001), nil(), "10.0.0.2", "10.0.0.2", nil(), "master", "online"})})});
  const std::vector<SlotRange> map = parseClusterShards(reply, false, "s");
  expectRange(map.at(0), 0, 16383, "10.0.0.2", 7001);
  EXPECT_EQ(map[0].primaryId, kIdB);
  EXPECT_TRUE(map[0].replicas.empty());
}

TEST(ClusterShards, ShardsWithoutSlotsAreLeftOut) {
  const Reply reply =
      arr({shard({}, {shardNode({kIdB, num(7001), nil(), "10.0.0.2", "10.0.0.2", nil(), "master", "online"})}),
           shard({num(5), num(5)},
                 {shardNode({kIdA, num(7000), nil(), "10.0.0.1", "10.0.0.1", nil(), "master", "online"})})});
  const std::vector<SlotRange> map = parseClusterShards(reply, false, "s");
  ASSERT_EQ(map.size(), 1u);
  expectRange(map[0], 5, 5, "10.0.0.1", 7000);
  EXPECT_TRUE(parseClusterShards(arr({}), false, "s").empty());
}

TEST(ClusterShards, QuestionMarkEndpointFallsBackToTheIp) {
  // cluster-preferred-endpoint-type hostname on a node without cluster-announce-hostname.
  Reply reply = arr({shard({num(8192), num(16383)},
                           {shardNode({kIdB, num(17322), nil(), "127.0.0.1", "?", nil(), "master", "online"}),
                            shardNode({kIdC, num(17323), nil(), "", "?", nil(), "replica", "online"})})});
  const std::vector<SlotRange> map = parseClusterShards(reply, false, "seed");
  expectRange(map.at(0), 8192, 16383, "127.0.0.1", 17322);
  EXPECT_TRUE(map[0].replicas.empty()) << "a replica with no address is left out";
  // a primary with neither: a set-up that cannot work
  reply.elements[0].elements[3].elements[0] = shardNode({kIdB, num(17322), nil(), "", "?", nil(), "master", "online"});
  const std::string message =
      thrown<redlimit::ConfigurationError>([&] { (void)parseClusterShards(reply, false, "seed"); });
  EXPECT_NE(message.find("cluster-announce-hostname"), std::string::npos) << message;
  EXPECT_NE(message.find(kIdB), std::string::npos) << message;
}

TEST(ClusterShards, TlsPorts) {
  // tls-cluster yes with a plain port: both ports; without one (port 0): only "tls-port".
  const Reply both = arr(
      {shard({num(0), num(16383)}, {shardNode({kIdA, num(17331), num(17332), "", "", nil(), "master", "online"})})});
  expectRange(parseClusterShards(both, false, "h").at(0), 0, 16383, "h", 17331);
  expectRange(parseClusterShards(both, true, "h").at(0), 0, 16383, "h", 17332);
  const Reply tlsOnly =
      arr({shard({num(0), num(16383)}, {shardNode({kIdA, nil(), num(17334), "", "", nil(), "master", "online"})})});
  expectRange(parseClusterShards(tlsOnly, true, "h").at(0), 0, 16383, "h", 17334);
  const std::string message = redlimit::test::messageOfError<redlimit::ConfigurationError>(
      redlimit::ErrorKind::TlsPort, [&] { (void)parseClusterShards(tlsOnly, false, "h"); });
  EXPECT_NE(message.find("only a TLS port (17334)"), std::string::npos) << message;
  // TLS towards a cluster that reports no tls-port (TLS terminated in front of it): "port"
  const Reply plainOnly = arr({shard(
      {num(0), num(16383)}, {shardNode({kIdA, num(7000), nil(), "10.0.0.1", "10.0.0.1", nil(), "master", "online"})})});
  expectRange(parseClusterShards(plainOnly, true, "h").at(0), 0, 16383, "10.0.0.1", 7000);
}

TEST(ClusterShards, UnknownFieldsAndRolesAreIgnored) {
  Reply node = shardNode({kIdA, num(7000), nil(), "10.0.0.1", "10.0.0.1", nil(), "master", "online"});
  node.elements.insert(node.elements.end(), {str("shard-id"), str("abc"), str("future"), arr({num(1)})});
  Reply observer = shardNode({kIdC, num(7001), nil(), "10.0.0.2", "10.0.0.2", nil(), "observer", "online"});
  Reply s = shard({num(0), num(16383)}, {node, observer});
  s.elements.insert(s.elements.begin(), {str("id"), str("shard-1")});
  const std::vector<SlotRange> map = parseClusterShards(arr({s}), false, "h");
  expectRange(map.at(0), 0, 16383, "10.0.0.1", 7000);
  EXPECT_TRUE(map[0].replicas.empty());
}

Reply goodNode() { return shardNode({kIdA, num(7000), nil(), "10.0.0.1", "10.0.0.1", nil(), "master", "online"}); }

TEST(ClusterShards, MalformedRepliesAreUnexpectedReplyErrors) {
  const std::vector<std::pair<const char*, Reply>> cases = {
      {"not an array", str("OK")},
      {"shard not an array", arr({num(1)})},
      {"odd shard", arr({arr({str("slots"), arr({num(0), num(1)}), str("nodes")})})},
      {"key not a string", arr({arr({num(1), arr({}), str("nodes"), arr({})})})},
      {"no slots", arr({arr({str("nodes"), arr({goodNode()})})})},
      {"no nodes", arr({arr({str("slots"), arr({num(0), num(1)})})})},
      {"slots not an array", arr({arr({str("slots"), num(0), str("nodes"), arr({goodNode()})})})},
      {"odd slots", arr({shard({num(0), num(1), num(5)}, {goodNode()})})},
      {"slot 16384", arr({shard({num(0), num(16384)}, {goodNode()})})},
      {"slot -1", arr({shard({num(-1), num(5)}, {goodNode()})})},
      {"slot as a string", arr({shard({str("0"), num(5)}, {goodNode()})})},
      {"ends before it starts", arr({shard({num(10), num(9)}, {goodNode()})})},
      {"overlap within a shard", arr({shard({num(0), num(10), num(10), num(20)}, {goodNode()})})},
      {"overlap between shards",
       arr({shard({num(0), num(100)}, {goodNode()}), shard({num(50), num(200)}, {goodNode()})})},
      {"no master",
       arr({shard({num(0), num(1)}, {shardNode({kIdC, num(7001), nil(), "h", "h", nil(), "replica", "online"})})})},
      {"no nodes at all", arr({shard({num(0), num(1)}, {})})},
      {"node not a map", arr({shard({num(0), num(1)}, {str("node")})})},
      {"port as a string",
       arr({shard({num(0), num(1)}, {shardNode({kIdA, str("7000"), nil(), "h", "h", nil(), "master", "online"})})})},
      {"port 65536",
       arr({shard({num(0), num(1)}, {shardNode({kIdA, num(65536), nil(), "h", "h", nil(), "master", "online"})})})},
      {"no port",
       arr({shard({num(0), num(1)}, {shardNode({kIdA, nil(), nil(), "h", "h", nil(), "master", "online"})})})},
      {"endpoint an integer",
       arr({shard({num(0), num(1)}, {arr({str("id"), str(kIdA), str("port"), num(7000), str("endpoint"), num(1),
                                          str("role"), str("master")})})})},
      {"no endpoint nor ip", arr({shard({num(0), num(1)}, {arr({str("id"), str(kIdA), str("port"), num(7000),
                                                                str("role"), str("master")})})})},
  };
  for (const auto& [name, reply] : cases) {
    const std::string message = redlimit::test::messageOfError<redlimit::ReplyError>(
        redlimit::ErrorKind::UnexpectedReply, [&, r = &reply] { (void)parseClusterShards(*r, false, "h"); });
    EXPECT_NE(message.find("unexpected CLUSTER SHARDS reply"), std::string::npos) << name << ": " << message;
  }
  const std::string overlap = redlimit::test::messageOfError<redlimit::ReplyError>(
      redlimit::ErrorKind::UnexpectedReply, [&] { (void)parseClusterShards(cases[13].second, false, "h"); });
  EXPECT_NE(overlap.find("slots 0-100"), std::string::npos) << overlap;
  EXPECT_NE(overlap.find("50-200"), std::string::npos) << overlap;
}

// --- CLUSTER SLOTS ----------------------------------------------------------------------------

Reply slotsNode(Reply host, int port, const std::string& id, std::vector<Reply> metadata) {
  return arr({std::move(host), num(port), str(id), arr(std::move(metadata))});
}

TEST(ClusterSlots, ThreeNodeClusterIpEndpoints) {
  const Reply reply = arr(
      {arr({num(0), num(8191), slotsNode(str("127.0.0.1"), 17321, kIdA, {str("hostname"), str("node-17321.example")}),
            slotsNode(str("127.0.0.1"), 17323, kIdC, {str("hostname"), str("node-17323.example")})}),
       arr({num(8192), num(16383),
            slotsNode(str("127.0.0.1"), 17322, kIdB, {str("hostname"), str("node-17322.example")})})});
  const std::vector<SlotRange> map = parseClusterSlots(reply, "seed");
  ASSERT_EQ(map.size(), 2u);
  expectRange(map[0], 0, 8191, "127.0.0.1", 17321);
  EXPECT_EQ(map[0].primaryId, kIdA);
  ASSERT_EQ(map[0].replicas.size(), 1u);
  expectNode(map[0].replicas[0], "127.0.0.1", 17323);
  expectRange(map[1], 8192, 16383, "127.0.0.1", 17322);
  EXPECT_EQ(map[1].primaryId, kIdB);
}

TEST(ClusterSlots, HostnameUnknownAndQuestionMarkEndpoints) {
  const Reply reply = arr({
      arr({num(8192), num(16383), slotsNode(str("?"), 17322, kIdB, {str("ip"), str("127.0.0.1")})}),
      arr({num(0), num(8191),
           slotsNode(nil(), 17321, kIdA, {str("ip"), str("127.0.0.1"), str("hostname"), str("node-17321.example")}),
           arr({nil(), num(17323), str(kIdC)}),  // no metadata (the server left the empty map out)
           slotsNode(str("?"), 17324, "d", {})}),
  });
  const std::vector<SlotRange> map = parseClusterSlots(reply, "lb.example");
  ASSERT_EQ(map.size(), 2u);
  expectRange(map[0], 0, 8191, "lb.example", 17321);
  ASSERT_EQ(map[0].replicas.size(), 1u) << "the \"?\" replica without an ip is left out";
  expectNode(map[0].replicas[0], "lb.example", 17323);
  expectRange(map[1], 8192, 16383, "127.0.0.1", 17322);

  const Reply hostnames = arr(
      {arr({num(0), num(16383), slotsNode(str("node-17321.example"), 17321, kIdA, {str("ip"), str("127.0.0.1")})})});
  expectRange(parseClusterSlots(hostnames, "s").at(0), 0, 16383, "node-17321.example", 17321);

  const Reply unreachable = arr({arr({num(0), num(16383), slotsNode(str("?"), 17321, kIdA, {})})});
  EXPECT_THROW((void)parseClusterSlots(unreachable, "s"), redlimit::ConfigurationError);
}

TEST(ClusterSlots, OneNodeClusterAndOldServers) {
  // 7.0, alone: "" host and an empty metadata array.
  Reply reply = arr({arr({num(0), num(100), slotsNode(str(""), 17311, "b06f", {})}),
                     arr({num(200), num(16383), slotsNode(str(""), 17311, "b06f", {})})});
  std::vector<SlotRange> map = parseClusterSlots(reply, "10.1.2.3");
  ASSERT_EQ(map.size(), 2u);
  expectRange(map[0], 0, 100, "10.1.2.3", 17311);
  expectRange(map[1], 200, 16383, "10.1.2.3", 17311);
  // Redis 3.x: [host, port] without an id
  reply = arr({arr({num(0), num(16383), arr({str("10.0.0.1"), num(7000)}), arr({str("10.0.0.2"), num(7001)})})});
  map = parseClusterSlots(reply, "s");
  expectRange(map.at(0), 0, 16383, "10.0.0.1", 7000);
  EXPECT_EQ(map[0].primaryId, "");
  expectNode(map[0].replicas.at(0), "10.0.0.2", 7001);
  // port 0: no port for this connection's kind (a TLS-only node asked over plain text)
  reply = arr({arr({num(0), num(16383), arr({str("10.0.0.1"), num(0), str(kIdA)})})});
  EXPECT_THROW((void)parseClusterSlots(reply, "s"), redlimit::ConfigurationError);
}

TEST(ClusterSlots, MalformedRepliesAreUnexpectedReplyErrors) {
  const Reply good = slotsNode(str("h"), 7000, kIdA, {});
  const std::vector<std::pair<const char*, Reply>> cases = {
      {"not an array", nil()},
      {"range too short", arr({arr({num(0), num(1)})})},
      {"range not an array", arr({num(0)})},
      {"slot 16384", arr({arr({num(0), num(16384), good})})},
      {"slot as a string", arr({arr({str("0"), num(1), good})})},
      {"ends before it starts", arr({arr({num(2), num(1), good})})},
      {"overlap", arr({arr({num(100), num(200), good}), arr({num(0), num(100), good})})},
      {"node not an array", arr({arr({num(0), num(1), str("h:7000")})})},
      {"node without a port", arr({arr({num(0), num(1), arr({str("h")})})})},
      {"port as a string", arr({arr({num(0), num(1), arr({str("h"), str("7000")})})})},
      {"port negative", arr({arr({num(0), num(1), arr({str("h"), num(-1)})})})},
      {"host an integer", arr({arr({num(0), num(1), arr({num(1), num(7000)})})})},
      {"id an integer", arr({arr({num(0), num(1), arr({str("h"), num(7000), num(5)})})})},
      {"odd metadata", arr({arr({num(0), num(1), slotsNode(str("h"), 7000, kIdA, {str("ip")})})})},
      {"bad replica", arr({arr({num(0), num(1), good, arr({str("h")})})})},
  };
  for (const auto& [name, reply] : cases) {
    const std::string message = redlimit::test::messageOfError<redlimit::ReplyError>(
        redlimit::ErrorKind::UnexpectedReply, [&, r = &reply] { (void)parseClusterSlots(*r, "h"); });
    EXPECT_NE(message.find("unexpected CLUSTER SLOTS reply"), std::string::npos) << name << ": " << message;
  }
}

// --- MOVED / ASK ------------------------------------------------------------------------------

TEST(Redirect, MovedAndAsk) {
  auto r = parseRedirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ask);
  EXPECT_EQ(r->slot, 3999);
  expectNode(r->node, "127.0.0.1", 6381);
  r = parseRedirect("ASK 3999 127.0.0.1:6381");
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->ask);
  EXPECT_EQ(r->slot, 3999);
  expectNode(r->node, "127.0.0.1", 6381);
  r = parseRedirect("MOVED 15495 node-17322.example:17322");  // cluster-preferred-endpoint-type hostname
  ASSERT_TRUE(r);
  expectNode(r->node, "node-17322.example", 17322);
  r = parseRedirect("MOVED 0 h:1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->slot, 0);
  r = parseRedirect("ASK 16383 h:65535");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->slot, 16383);
  EXPECT_EQ(r->node.port, 65535);
}

TEST(Redirect, InsideALongerMessage) {
  auto r = parseRedirect("redlimit: Redis replied with an error: MOVED 3999 10.0.0.2:6381");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ask);
  expectNode(r->node, "10.0.0.2", 6381);
  r = parseRedirect("redlimit: EVALSHA: ASK 12 10.0.0.3:7002 (while running acquire)");
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->ask);
  EXPECT_EQ(r->slot, 12);
  expectNode(r->node, "10.0.0.3", 7002);
  r = parseRedirect("-MOVED 7 h:7000\r\n");  // the raw RESP line
  ASSERT_TRUE(r);
  expectNode(r->node, "h", 7000);
  r = parseRedirect("MOVED x y: MOVED 9 h:7000");  // the first well-formed one
  ASSERT_TRUE(r);
  EXPECT_EQ(r->slot, 9);
}

TEST(Redirect, Ipv6AndUnknownEndpoints) {
  auto r = parseRedirect("MOVED 1 ::1:7000");
  ASSERT_TRUE(r);
  expectNode(r->node, "::1", 7000);
  r = parseRedirect("MOVED 1 [fe80::1]:7001");
  ASSERT_TRUE(r);
  expectNode(r->node, "fe80::1", 7001);
  r = parseRedirect("MOVED 15495 :17322");  // cluster-preferred-endpoint-type unknown-endpoint
  ASSERT_TRUE(r);
  expectNode(r->node, "", 17322);
  r = parseRedirect("MOVED 15495 ?:17322");  // hostname preferred, none set
  ASSERT_TRUE(r);
  expectNode(r->node, "?", 17322);
}

TEST(Redirect, NoneInOtherErrors) {
  for (const char* text : {"",
                           "ERR unknown command",
                           "MOVED",
                           "MOVED ",
                           "MOVED 1",
                           "MOVED 1 ",
                           "MOVED 3999",
                           "MOVED 16384 h:1",
                           "MOVED -1 h:1",
                           "MOVED x h:1",
                           "MOVED 1 h",
                           "MOVED 1 h:",
                           "MOVED 1 h:0",
                           "MOVED 1 h:65536",
                           "MOVED 1 h:1x",
                           "MOVED 1  h:1",
                           "MOVED 99999999999999999999 h:1",
                           "REMOVED 1 h:1",
                           "TASK 1 h:1",
                           "moved 1 h:1",
                           "ASK1 h:1",
                           "CLUSTERDOWN Hash slot not served",
                           "TRYAGAIN Multiple keys request during rehashing of slot"}) {
    EXPECT_FALSE(parseRedirect(text)) << text;
  }
}

}  // namespace
