// Tests of the test harness itself (tests/support): RedisCluster forms a cluster, moves slots
// with their keys and fails over; RedisSentinelGroup fails over. Plain commands only (rawCommand).
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

#include "topology/key_slot.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/raw_command.hpp"
#include "redlimit_test/redis_cluster.hpp"
#include "redlimit_test/redis_sentinel_group.hpp"

using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

// Prints a duration and records it in the test's XML output.
void report(const std::string& what, std::int64_t ms) {
  std::cout << "[ harness  ] " << what << ": " << ms << " ms\n";
  ::testing::Test::RecordProperty(what, std::to_string(ms));
}

RawReply on(RedisServer& s, const std::vector<std::string>& argv) { return rawCommand(s.host(), s.port(), argv); }

int slotOf(const std::string& key) { return redlimit::detail::keySlot(key); }

// A key of this test whose slot node `owner` serves now.
std::string keyServedBy(RedisCluster& c, int owner) {
  for (int i = 0;; ++i) {
    std::string key = "harness:{" + std::to_string(i) + "}:k";
    if (c.primaryOfSlot(slotOf(key)) == owner) return key;
  }
}

}  // namespace

TEST(ClusterHarness, ThreePrimariesServeAllSlots) {
  const auto start = Clock::now();
  RedisCluster c;
  report("3 primaries formed", msSince(start));
  ASSERT_EQ(c.size(), 3);
  for (int i = 0; i < c.size(); ++i) {
    const std::string info = on(c.node(i), {"CLUSTER", "INFO"}).str;
    EXPECT_EQ(infoValue(info, "cluster_state"), "ok");
    EXPECT_EQ(infoValue(info, "cluster_slots_assigned"), "16384");
    EXPECT_EQ(infoValue(info, "cluster_slots_ok"), "16384");
    EXPECT_EQ(on(c.node(i), {"CLUSTER", "MYID"}).str, c.nodeId(i));
  }
  EXPECT_EQ(c.primaryOfSlot(0), 0);
  EXPECT_EQ(c.primaryOfSlot(16383), 2);
  EXPECT_EQ(c.replicaOf(0), -1);
  EXPECT_EQ(c.seeds(), "redis-cluster://127.0.0.1:" + std::to_string(c.node(0).port()) + ",127.0.0.1:" +
                           std::to_string(c.node(1).port()) + ",127.0.0.1:" + std::to_string(c.node(2).port()));

  const std::string key = "harness:{setget}";
  const int owner = c.primaryOfSlot(slotOf(key));
  ASSERT_GE(owner, 0);
  EXPECT_EQ(on(c.node(owner), {"SET", key, "v1"}).str, "OK");
  EXPECT_EQ(on(c.node(owner), {"GET", key}).str, "v1");
  // Any other node redirects: -MOVED <slot> <ip>:<port>.
  const RawReply moved = on(c.node((owner + 1) % 3), {"GET", key});
  EXPECT_EQ(moved.str, "MOVED " + std::to_string(slotOf(key)) + " 127.0.0.1:" + std::to_string(c.node(owner).port()));
}

TEST(ClusterHarness, MoveSlotCarriesItsKeysAlsoThoseWrittenDuringTheMigration) {
  RedisCluster c;
  const std::string key = keyServedBy(c, 0);
  const int slot = slotOf(key);
  const std::string sibling = key + ":2";  // same hash tag, same slot
  ASSERT_EQ(on(c.node(0), {"SET", key, "before"}).str, "OK");
  ASSERT_EQ(on(c.node(0), {"SET", sibling, "s"}).str, "OK");

  const auto start = Clock::now();
  c.beginMigration(slot, 0, 1);
  // The source still serves keys it holds, and sends new ones to the target with ASK.
  EXPECT_EQ(on(c.node(0), {"SET", key, "during"}).str, "OK");
  const RawReply newKey = on(c.node(0), {"SET", key + ":new", "x"});
  EXPECT_TRUE(newKey.isError());
  EXPECT_EQ(newKey.str, "ASK " + std::to_string(slot) + " 127.0.0.1:" + std::to_string(c.node(1).port()));
  c.migrateKeys(slot, 0, 1, 1);  // batch of 1: two MIGRATE rounds
  EXPECT_EQ(on(c.node(0), {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}).integer, 0);
  EXPECT_EQ(on(c.node(0), {"GET", key}).str.rfind("ASK ", 0), 0u);  // gone from the source
  c.finishMigration(slot, 0, 1);
  report("slot migrated with 2 keys", msSince(start));

  EXPECT_EQ(c.primaryOfSlot(slot), 1);
  for (int i = 0; i < c.size(); ++i) {
    EXPECT_EQ(on(c.node(i), {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}).integer, i == 1 ? 2 : 0);
  }
  EXPECT_EQ(on(c.node(1), {"GET", key}).str, "during");
  EXPECT_EQ(on(c.node(1), {"GET", sibling}).str, "s");
  EXPECT_EQ(on(c.node(0), {"GET", key}).str.rfind("MOVED ", 0), 0u);

  c.moveSlot(slot, 2);  // all three steps, from wherever the slot is
  EXPECT_EQ(c.primaryOfSlot(slot), 2);
  EXPECT_EQ(on(c.node(2), {"GET", key}).str, "during");
  c.moveSlot(slot, 2);  // already there: nothing to do
  EXPECT_EQ(c.primaryOfSlot(slot), 2);
}

TEST(ClusterHarness, KilledPrimaryFailsOverToItsReplica) {
  auto start = Clock::now();
  RedisCluster c(3, 1, milliseconds(500));
  report("3 primaries + 3 replicas formed", msSince(start));
  ASSERT_EQ(c.size(), 6);
  const int replica = c.replicaOf(0);
  ASSERT_EQ(replica, 3);  // the layout: replicas of 0, 1, 2 are 3, 4, 5
  EXPECT_EQ(c.replicaOf(1), 4);
  const std::string key = keyServedBy(c, 0);
  ASSERT_EQ(on(c.node(0), {"SET", key, "kept"}).str, "OK");
  ASSERT_EQ(on(c.node(0), {"WAIT", "1", "5000"}).integer, 1);  // the replica has it

  c.killNode(0);
  start = Clock::now();
  const int promoted = c.waitForFailover(0, milliseconds(15000));
  report("failover after SIGKILL (node timeout 500 ms)", msSince(start));
  EXPECT_EQ(promoted, replica);
  EXPECT_EQ(c.primaryOfSlot(slotOf(key)), replica);
  EXPECT_EQ(on(c.node(replica), {"GET", key}).str, "kept");
  EXPECT_EQ(c.replicaOf(replica), -1);

  // The old primary comes back as a replica of the promoted one (nodes.conf kept its identity).
  start = Clock::now();
  c.node(0).restart();
  c.waitUntilSettled(milliseconds(20000));
  report("restarted node rejoined as replica", msSince(start));
  EXPECT_EQ(c.replicaOf(replica), 0);
  EXPECT_EQ(on(c.node(0), {"CLUSTER", "MYID"}).str, c.nodeId(0));
}

TEST(SentinelHarness, KilledPrimaryFailsOverToTheReplica) {
  auto start = Clock::now();
  RedisSentinelGroup g(milliseconds(500));
  report("primary, replica and 3 sentinels settled", msSince(start));
  const int oldPort = g.primary().port();
  EXPECT_EQ(g.currentPrimaryPort(), oldPort);
  const std::vector<int> ports = g.sentinelPorts();
  ASSERT_EQ(ports.size(), 3u);
  EXPECT_EQ(g.uri(), "redis-sentinel://127.0.0.1:" + std::to_string(ports[0]) + ",127.0.0.1:" +
                         std::to_string(ports[1]) + ",127.0.0.1:" + std::to_string(ports[2]) + "/mymaster");
  ASSERT_EQ(on(g.primary(), {"SET", "harness:sentinel", "kept"}).str, "OK");
  ASSERT_EQ(on(g.primary(), {"WAIT", "1", "5000"}).integer, 1);

  g.primary().kill();
  start = Clock::now();
  const int newPort = g.waitForFailover(oldPort, milliseconds(20000));
  report("sentinel failover after SIGKILL (down-after 500 ms)", msSince(start));
  EXPECT_EQ(newPort, g.replica().port());
  EXPECT_EQ(g.currentPrimaryPort(), newPort);
  EXPECT_EQ(on(g.replica(), {"GET", "harness:sentinel"}).str, "kept");
  EXPECT_EQ(on(g.replica(), {"SET", "harness:sentinel", "written"}).str, "OK");  // writable now
}
