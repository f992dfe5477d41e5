// Test harness: a throwaway Redis Cluster of cluster-enabled redis-servers (RedisServer) on free
// loopback ports, with helpers to crash nodes, wait for failovers and migrate slots step by step.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "redlimit_test/redis_server.hpp"

namespace redlimit::test {

/// A Redis Cluster of `primaries` primaries with `replicasPerPrimary` replicas each. Node indexes:
/// primaries are 0..primaries-1 (primary p serves slots [p*16384/primaries, (p+1)*16384/primaries)),
/// then the replicas of primary 0, of primary 1, ... (replica k of p is
/// primaries + p*replicasPerPrimary + k). The indexes name processes: they keep naming them across
/// failovers (a promoted replica stays a "replica" index).
///
/// Every node runs with (the choices that keep failure tests short and predictable):
///   --cluster-node-timeout <nodeTimeout>          failure detection after this long
///   --cluster-replica-validity-factor 0           a replica may always fail over, however long
///                                                 it was cut off from its primary
///   --cluster-require-full-coverage no            the other slots keep working while a primary
///                                                 without a replica is down
///   --cluster-allow-replica-migration no          replicas never move to another primary on
///                                                 their own: the layout changes only by failover
///   --repl-diskless-sync-delay 0                  replicas sync at once (the default waits 5 s)
///   --repl-ping-replica-period 1                  a primary's replication offset moves within 1 s
///                                                 even without writes (CLUSTER SLOTS in 7.0 leaves
///                                                 out replicas at offset 0; the default is 10 s)
///   --cluster-port <picked>                       the bus on a free port (port+10000 may be taken
///                                                 or above 65535)
/// and no persistence, except nodes.conf in its own directory (so restart() keeps its id and role).
/// extraArgs go on every node's command line after these (for example a TLS port: `"--tls-port",
/// "auto"` with the certificate options; RedisServer picks a port per node). The harness itself
/// always talks to the plain ports.
///
/// Not thread-safe: drive it from the test's main thread (the nodes themselves may be used from
/// any thread). Every call that waits throws std::runtime_error with what it last saw when its
/// time runs out.
class RedisCluster {
 public:
  /// Starts the nodes, assigns the slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER MEET),
  /// attaches the replicas (CLUSTER REPLICATE) and waits up to 20 s until every node says
  /// cluster_state:ok, knows every node and reports the same slot map (CLUSTER SLOTS), with every
  /// replica listed under its primary and its replication link up.
  /// Throws std::invalid_argument for primaries < 1, replicasPerPrimary < 0 or nodeTimeout < 1 ms;
  /// std::runtime_error if a node does not start or the cluster does not form in time.
  explicit RedisCluster(int primaries = 3, int replicasPerPrimary = 0,
                        std::chrono::milliseconds nodeTimeout = std::chrono::milliseconds(1000),
                        std::vector<std::string> extraArgs = {});
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  /// Number of nodes, primaries and replicas.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(nodes_.size()); }
  /// Node i's process: host(), port(), kill(), restart(), running(). Throws std::out_of_range.
  [[nodiscard]] RedisServer& node(int i);
  /// `redis-cluster://127.0.0.1:p0,127.0.0.1:p1,...`, every node in index order.
  [[nodiscard]] std::string seeds() const;
  /// Node i's cluster node id (CLUSTER MYID; kept across restart()). Throws std::out_of_range.
  [[nodiscard]] const std::string& nodeId(int i) const;
  /// The index of the node that owns `slot` as the first running node sees it now, or -1 if no
  /// node serves it. Throws std::runtime_error if no node runs.
  [[nodiscard]] int primaryOfSlot(int slot) const;
  /// The lowest index of a node that replicates node `primaryIndex` now (CLUSTER REPLICAS, asked
  /// of that node or, if it is down, of the first running node), failed replicas left out; -1 if
  /// none. Throws std::runtime_error if no node runs.
  [[nodiscard]] int replicaOf(int primaryIndex) const;

  /// Notes the slots node i owns, then SIGKILLs it (a crash; restart with node(i).restart()).
  void killNode(int i);
  /// Waits until every running node reports one other node as the owner of all the slots node
  /// `primaryIndex` owned when last seen (at killNode(), or the last migration or failover the
  /// harness made), and cluster_state:ok; returns that node's index (the promoted replica).
  /// A replica is elected by a majority of the primaries: with fewer than 3 primaries, one down
  /// leaves no majority and no failover happens.
  /// Throws std::invalid_argument if the harness knows no slots of primaryIndex.
  int waitForFailover(int primaryIndex, std::chrono::milliseconds timeout = std::chrono::milliseconds(15000));
  /// Waits until every running node says cluster_state:ok and reports the same slot map covering
  /// all 16384 slots, and every running replica has its replication link up (after a restart, say).
  void waitUntilSettled(std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));

  /// Slot migration in the steps of the Redis Cluster specification, so that a test can send
  /// traffic in between. beginMigration: CLUSTER SETSLOT <slot> IMPORTING <from-id> on `to`, then
  /// SETSLOT <slot> MIGRATING <to-id> on `from` (`from` then answers ASK for keys it lacks).
  void beginMigration(int slot, int from, int to);
  /// Moves every key of `slot` from `from` to `to`: CLUSTER GETKEYSINSLOT <slot> <batch> on `from`
  /// and MIGRATE <to> "" 0 5000 REPLACE KEYS ..., until `from` holds no key of the slot (keys
  /// written meanwhile included). Needs beginMigration first.
  void migrateKeys(int slot, int from, int to, int batch = 100);
  /// CLUSTER SETSLOT <slot> NODE <to-id> on `to`, `from` and every other running primary, then
  /// waits until every running node reports `to` as the owner. Needs migrateKeys first (a node
  /// refuses to give away a slot it still holds keys of).
  void finishMigration(int slot, int from, int to);
  /// The three steps above from the slot's current owner; nothing if `to` owns it already.
  void moveSlot(int slot, int to);
  /// Gives every slot primary `from` owns (as the harness last saw it) to primary `to` at once,
  /// keys not moved: CLUSTER BUMPEPOCH on `to` (its claim then wins), CLUSTER SETSLOT <slot> NODE
  /// <to-id> on `to` for each slot, then waits until every running node reports `to` as their
  /// owner and cluster_state:ok. `from` stays in the cluster as a primary without slots (keys it
  /// held in them are dropped). Throws std::invalid_argument if from == to or the harness knows no
  /// slot of `from`; std::runtime_error if a command fails or the change does not settle in time.
  void giveAllSlots(int from, int to, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));

 private:
  void checkIndex(int i) const;
  [[nodiscard]] int firstRunning() const;
  [[nodiscard]] int indexOfPort(int port) const;
  // Slot -> owning node index, as node i sees it (-1: unassigned).
  [[nodiscard]] std::vector<int> slotOwners(int i) const;
  // Empty if settled; else what is not (for the timeout message).
  [[nodiscard]] std::string unsettled() const;

  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<std::string> ids_;
  std::vector<int> knownOwner_;  // slot -> node index as the harness last saw it (-1: none)
};

}  // namespace redlimit::test
