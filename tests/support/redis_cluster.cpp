#include "redlimit_test/redis_cluster.hpp"

#include <algorithm>
#include <stdexcept>

#include "harness_util.hpp"

namespace redlimit::test {
namespace {

using harness::ask;
using harness::call;
using harness::Clock;
using harness::msText;
using harness::nodeName;
using harness::pollUntil;

constexpr int kSlots = 16384;  // hash slots of a Redis Cluster
constexpr std::chrono::milliseconds kFormTimeout{20000};

// One entry of CLUSTER SLOTS: [first, last, [ip, port, id, ...], replica [ip, port, id, ...]...].
struct SlotRange {
  int first = 0;
  int last = 0;
  int primaryPort = 0;
  std::vector<int> replicaPorts;  // sorted: nodes may list replicas in different orders

  bool operator==(const SlotRange& o) const {
    return first == o.first && last == o.last && primaryPort == o.primaryPort && replicaPorts == o.replicaPorts;
  }
};

std::vector<SlotRange> clusterSlots(const RedisServer& s) {
  const RawReply r = call(s, {"CLUSTER", "SLOTS"});
  std::vector<SlotRange> ranges;
  for (const RawReply& e : r.elements) {
    if (e.elements.size() < 3) throw std::runtime_error(nodeName(s) + ": malformed CLUSTER SLOTS entry");
    SlotRange range;
    range.first = static_cast<int>(e.elements[0].integer);
    range.last = static_cast<int>(e.elements[1].integer);
    range.primaryPort = static_cast<int>(e.elements[2].elements.at(1).integer);
    for (std::size_t k = 3; k < e.elements.size(); ++k) {
      range.replicaPorts.push_back(static_cast<int>(e.elements[k].elements.at(1).integer));
    }
    std::sort(range.replicaPorts.begin(), range.replicaPorts.end());
    ranges.push_back(std::move(range));
  }
  std::sort(ranges.begin(), ranges.end(), [](const SlotRange& a, const SlotRange& b) { return a.first < b.first; });
  return ranges;
}

}  // namespace

RedisCluster::RedisCluster(int primaries, int replicasPerPrimary, std::chrono::milliseconds nodeTimeout,
                           std::vector<std::string> extraArgs) {
  if (primaries < 1 || replicasPerPrimary < 0 || nodeTimeout.count() < 1) {
    throw std::invalid_argument("RedisCluster: needs primaries >= 1, replicasPerPrimary >= 0, nodeTimeout >= 1 ms");
  }
  std::vector<std::string> args = {"--cluster-enabled",
                                   "yes",
                                   "--cluster-port",
                                   "auto",
                                   "--cluster-config-file",
                                   "nodes.conf",  // in the node's --dir
                                   "--cluster-node-timeout",
                                   std::to_string(nodeTimeout.count()),
                                   "--cluster-replica-validity-factor",
                                   "0",
                                   "--cluster-require-full-coverage",
                                   "no",
                                   "--cluster-allow-replica-migration",
                                   "no",
                                   "--repl-diskless-sync-delay",
                                   "0",
                                   "--repl-ping-replica-period",
                                   "1"};
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  const int total = primaries * (1 + replicasPerPrimary);
  for (int i = 0; i < total; ++i) nodes_.push_back(std::make_unique<RedisServer>(args));
  const auto deadline = Clock::now() + kFormTimeout;

  for (const auto& n : nodes_) ids_.push_back(call(*n, {"CLUSTER", "MYID"}).str);
  for (int p = 0; p < primaries; ++p) {
    // Distinct config epochs up front spare the cluster its epoch collision resolution; the
    // command only works on a node that knows no other node yet.
    (void)call(*nodes_[static_cast<std::size_t>(p)], {"CLUSTER", "SET-CONFIG-EPOCH", std::to_string(p + 1)});
    const int first = p * kSlots / primaries;
    const int last = (p + 1) * kSlots / primaries - 1;
    (void)call(*nodes_[static_cast<std::size_t>(p)],
               {"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)});
  }
  // Every node meets node 0 (ip, port, bus port); gossip then introduces the others.
  const RedisServer& hub = *nodes_[0];
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    (void)call(*nodes_[i],
               {"CLUSTER", "MEET", hub.host(), std::to_string(hub.port()), std::to_string(hub.clusterPort())});
  }
  // CLUSTER REPLICATE answers "ERR Unknown node" until the replica has heard of its primary.
  for (int p = 0; p < primaries; ++p) {
    for (int k = 0; k < replicasPerPrimary; ++k) {
      const int index = primaries + p * replicasPerPrimary + k;
      const RedisServer& replica = *nodes_[static_cast<std::size_t>(index)];
      const std::string why = pollUntil(deadline, [&] {
        const RawReply r = ask(replica, {"CLUSTER", "REPLICATE", ids_[static_cast<std::size_t>(p)]});
        return r.isError() ? r.str : std::string();
      });
      if (!why.empty()) {
        throw std::runtime_error("RedisCluster: " + nodeName(replica) + " did not become a replica of node " +
                                 std::to_string(p) + " in time: " + why);
      }
    }
  }
  const std::string why = pollUntil(deadline, [&]() -> std::string {
    std::string generic = unsettled();
    if (!generic.empty()) return generic;
    // And the layout asked for: each replica under its own primary.
    for (int r = primaries; r < total; ++r) {
      const RedisServer& replica = *nodes_[static_cast<std::size_t>(r)];
      const RedisServer& primary = *nodes_[static_cast<std::size_t>((r - primaries) / replicasPerPrimary)];
      const std::string info = call(replica, {"INFO", "replication"}).str;
      if (infoValue(info, "master_port") != std::to_string(primary.port())) {
        return nodeName(replica) + " replicates port " + infoValue(info, "master_port");
      }
    }
    return "";
  });
  if (!why.empty())
    throw std::runtime_error("RedisCluster: the cluster did not form in " + msText(kFormTimeout) + ": " + why);
  knownOwner_ = slotOwners(0);
}

RedisCluster::~RedisCluster() = default;

void RedisCluster::checkIndex(int i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("RedisCluster: no node " + std::to_string(i) + " (size " + std::to_string(size()) + ")");
  }
}

RedisServer& RedisCluster::node(int i) {
  checkIndex(i);
  return *nodes_[static_cast<std::size_t>(i)];
}

const std::string& RedisCluster::nodeId(int i) const {
  checkIndex(i);
  return ids_[static_cast<std::size_t>(i)];
}

std::string RedisCluster::seeds() const {
  std::string out = "redis-cluster://";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    out += (i == 0 ? "" : ",") + nodes_[i]->host() + ":" + std::to_string(nodes_[i]->port());
  }
  return out;
}

int RedisCluster::firstRunning() const {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->running()) return static_cast<int>(i);
  }
  throw std::runtime_error("RedisCluster: no node is running");
}

int RedisCluster::indexOfPort(int port) const {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->port() == port) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> RedisCluster::slotOwners(int i) const {
  std::vector<int> owners(kSlots, -1);
  for (const SlotRange& r : clusterSlots(*nodes_[static_cast<std::size_t>(i)])) {
    std::fill(owners.begin() + r.first, owners.begin() + r.last + 1, indexOfPort(r.primaryPort));
  }
  return owners;
}

int RedisCluster::primaryOfSlot(int slot) const {
  if (slot < 0 || slot >= kSlots) throw std::out_of_range("RedisCluster: no slot " + std::to_string(slot));
  return slotOwners(firstRunning())[static_cast<std::size_t>(slot)];
}

int RedisCluster::replicaOf(int primaryIndex) const {
  checkIndex(primaryIndex);
  const int asked = nodes_[static_cast<std::size_t>(primaryIndex)]->running() ? primaryIndex : firstRunning();
  // CLUSTER REPLICAS <id>: one CLUSTER NODES line per replica,
  // "<id> <ip:port@bus> <flags> <primary-id> <ping> <pong> <epoch> <link>".
  const RawReply r = ask(*nodes_[static_cast<std::size_t>(asked)],
                         {"CLUSTER", "REPLICAS", ids_[static_cast<std::size_t>(primaryIndex)]});
  if (r.isError()) return -1;  // "ERR The specified node is not a master"
  int best = -1;
  for (const RawReply& line : r.elements) {
    const std::string& text = line.str;
    const std::size_t addr = text.find(' ');
    const std::size_t flags = text.find(' ', addr + 1);
    if (addr == std::string::npos || flags == std::string::npos) continue;
    const std::string flagText = text.substr(flags + 1, text.find(' ', flags + 1) - flags - 1);
    if (flagText.find("fail") != std::string::npos) continue;  // "fail" and "fail?"
    const std::size_t colon = text.find(':', addr + 1);
    const int index = indexOfPort(std::stoi(text.substr(colon + 1)));
    if (index >= 0 && (best < 0 || index < best)) best = index;
  }
  return best;
}

void RedisCluster::killNode(int i) {
  checkIndex(i);
  RedisServer& victim = *nodes_[static_cast<std::size_t>(i)];
  if (!victim.running()) return;
  knownOwner_ = slotOwners(i);
  victim.kill();
}

int RedisCluster::waitForFailover(int primaryIndex, std::chrono::milliseconds timeout) {
  checkIndex(primaryIndex);
  std::vector<std::size_t> slots;
  for (std::size_t s = 0; s < knownOwner_.size(); ++s) {
    if (knownOwner_[s] == primaryIndex) slots.push_back(s);
  }
  if (slots.empty()) {
    throw std::invalid_argument("RedisCluster::waitForFailover: node " + std::to_string(primaryIndex) +
                                " owned no slots when last seen");
  }
  int promoted = -1;
  const std::string why = pollUntil(Clock::now() + timeout, [&]() -> std::string {
    promoted = -1;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (!nodes_[i]->running()) continue;
      const std::string state = infoValue(call(*nodes_[i], {"CLUSTER", "INFO"}).str, "cluster_state");
      if (state != "ok") return nodeName(*nodes_[i]) + " says cluster_state:" + state;
      const std::vector<int> owners = slotOwners(static_cast<int>(i));
      for (std::size_t s : slots) {
        const int owner = owners[s];
        if (owner < 0 || owner == primaryIndex) {
          return nodeName(*nodes_[i]) + " has slot " + std::to_string(s) + " on node " + std::to_string(owner);
        }
        if (promoted >= 0 && owner != promoted) {
          return "nodes disagree on slot " + std::to_string(s) + ": node " + std::to_string(promoted) + " or " +
                 std::to_string(owner);
        }
        promoted = owner;
      }
    }
    if (promoted < 0 || !nodes_[static_cast<std::size_t>(promoted)]->running()) return "no running node took the slots";
    return "";
  });
  if (!why.empty()) {
    throw std::runtime_error("RedisCluster: no failover of node " + std::to_string(primaryIndex) + " in " +
                             msText(timeout) + ": " + why);
  }
  for (std::size_t s : slots) knownOwner_[s] = promoted;
  return promoted;
}

std::string RedisCluster::unsettled() const {
  std::vector<SlotRange> reference;
  int referenceNode = -1;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const RedisServer& n = *nodes_[i];
    if (!n.running()) continue;
    const std::string info = call(n, {"CLUSTER", "INFO"}).str;
    if (infoValue(info, "cluster_state") != "ok")
      return nodeName(n) + " says cluster_state:" + infoValue(info, "cluster_state");
    if (infoValue(info, "cluster_known_nodes") != std::to_string(nodes_.size())) {
      return nodeName(n) + " knows " + infoValue(info, "cluster_known_nodes") + " nodes of " +
             std::to_string(nodes_.size());
    }
    std::vector<SlotRange> ranges = clusterSlots(n);
    if (referenceNode < 0) {
      int covered = 0;
      for (const SlotRange& r : ranges) covered += r.last - r.first + 1;
      if (covered != kSlots) return nodeName(n) + " sees " + std::to_string(covered) + " slots served";
      reference = std::move(ranges);
      referenceNode = static_cast<int>(i);
    } else if (ranges != reference) {
      return nodeName(n) + " and node " + std::to_string(referenceNode) + " differ in CLUSTER SLOTS";
    }
    const std::string repl = call(n, {"INFO", "replication"}).str;
    if (infoValue(repl, "role") != "slave") continue;
    if (infoValue(repl, "master_link_status") != "up" || infoValue(repl, "master_sync_in_progress") != "0") {
      return nodeName(n) + ": replication link " + infoValue(repl, "master_link_status");
    }
    const int primaryPort = std::stoi(infoValue(repl, "master_port"));
    for (const SlotRange& r : reference) {
      if (r.primaryPort == primaryPort &&
          std::find(r.replicaPorts.begin(), r.replicaPorts.end(), n.port()) == r.replicaPorts.end()) {
        return nodeName(n) + " is not yet listed as a replica of port " + std::to_string(primaryPort);
      }
    }
  }
  if (referenceNode < 0) return "no node is running";
  return "";
}

void RedisCluster::waitUntilSettled(std::chrono::milliseconds timeout) {
  const std::string why = pollUntil(Clock::now() + timeout, [&] { return unsettled(); });
  if (!why.empty()) throw std::runtime_error("RedisCluster: not settled in " + msText(timeout) + ": " + why);
  knownOwner_ = slotOwners(firstRunning());
}

void RedisCluster::beginMigration(int slot, int from, int to) {
  checkIndex(from);
  checkIndex(to);
  const std::string s = std::to_string(slot);
  // Importing first: once the source says MIGRATING it sends clients to the target with ASK.
  (void)call(*nodes_[static_cast<std::size_t>(to)], {"CLUSTER", "SETSLOT", s, "IMPORTING", nodeId(from)});
  (void)call(*nodes_[static_cast<std::size_t>(from)], {"CLUSTER", "SETSLOT", s, "MIGRATING", nodeId(to)});
}

void RedisCluster::migrateKeys(int slot, int from, int to, int batch) {
  checkIndex(from);
  checkIndex(to);
  if (batch < 1) throw std::invalid_argument("RedisCluster::migrateKeys: batch < 1");
  const RedisServer& source = *nodes_[static_cast<std::size_t>(from)];
  const RedisServer& target = *nodes_[static_cast<std::size_t>(to)];
  const auto deadline = Clock::now() + kFormTimeout;
  for (;;) {
    const RawReply keys = call(source, {"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), std::to_string(batch)});
    if (keys.elements.empty()) return;  // while MIGRATING the source creates no new key in the slot
    if (Clock::now() >= deadline) {
      throw std::runtime_error("RedisCluster::migrateKeys: slot " + std::to_string(slot) + " still has keys on " +
                               nodeName(source) + " after " + msText(kFormTimeout));
    }
    // MIGRATE host port "" db timeout-ms REPLACE KEYS k...: atomic per batch; the source's copy is
    // the live one, so REPLACE is right if a timed-out earlier MIGRATE left a copy behind. A key
    // gone meanwhile makes it answer NOKEY.
    std::vector<std::string> argv = {"MIGRATE", target.host(), std::to_string(target.port()), "", "0", "5000",
                                     "REPLACE", "KEYS"};
    for (const RawReply& k : keys.elements) argv.push_back(k.str);
    (void)call(source, argv);
  }
}

void RedisCluster::finishMigration(int slot, int from, int to) {
  checkIndex(from);
  checkIndex(to);
  const std::vector<std::string> assign = {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", nodeId(to)};
  // Target first (it bumps its config epoch, so its claim wins), then the source, then the other
  // primaries (SETSLOT is refused by replicas; they learn from gossip).
  (void)call(*nodes_[static_cast<std::size_t>(to)], assign);
  (void)call(*nodes_[static_cast<std::size_t>(from)], assign);
  for (int i = 0; i < size(); ++i) {
    const RedisServer& n = *nodes_[static_cast<std::size_t>(i)];
    if (i == from || i == to || !n.running()) continue;
    if (call(n, {"ROLE"}).elements.at(0).str == "master") (void)call(n, assign);
  }
  const std::string why = pollUntil(Clock::now() + kFormTimeout, [&]() -> std::string {
    for (int i = 0; i < size(); ++i) {
      if (!nodes_[static_cast<std::size_t>(i)]->running()) continue;
      const int owner = slotOwners(i)[static_cast<std::size_t>(slot)];
      if (owner != to) return "node " + std::to_string(i) + " has it on node " + std::to_string(owner);
    }
    return "";
  });
  if (!why.empty()) {
    throw std::runtime_error("RedisCluster: slot " + std::to_string(slot) + " not on node " + std::to_string(to) +
                             " everywhere after " + msText(kFormTimeout) + ": " + why);
  }
  knownOwner_[static_cast<std::size_t>(slot)] = to;
}

void RedisCluster::moveSlot(int slot, int to) {
  checkIndex(to);
  const int from = primaryOfSlot(slot);
  if (from == to) return;
  if (from < 0) throw std::runtime_error("RedisCluster::moveSlot: no node serves slot " + std::to_string(slot));
  beginMigration(slot, from, to);
  migrateKeys(slot, from, to);
  finishMigration(slot, from, to);
}

void RedisCluster::giveAllSlots(int from, int to, std::chrono::milliseconds timeout) {
  checkIndex(from);
  checkIndex(to);
  if (from == to) throw std::invalid_argument("RedisCluster::giveAllSlots: from == to");
  std::vector<int> slots;
  for (int s = 0; s < kSlots; ++s) {
    if (knownOwner_[static_cast<std::size_t>(s)] == from) slots.push_back(s);
  }
  if (slots.empty()) {
    throw std::invalid_argument("RedisCluster::giveAllSlots: node " + std::to_string(from) + " owns no slot");
  }
  const RedisServer& target = *nodes_[static_cast<std::size_t>(to)];
  // The greatest config epoch first: `to`'s claims then win over `from`'s in the gossip.
  (void)call(target, {"CLUSTER", "BUMPEPOCH"});
  for (int s : slots) (void)call(target, {"CLUSTER", "SETSLOT", std::to_string(s), "NODE", nodeId(to)});
  const std::string why = pollUntil(Clock::now() + timeout, [&]() -> std::string {
    for (int i = 0; i < size(); ++i) {
      const RedisServer& n = *nodes_[static_cast<std::size_t>(i)];
      if (!n.running()) continue;
      const std::vector<int> owners = slotOwners(i);
      for (int s : slots) {
        if (owners[static_cast<std::size_t>(s)] != to) {
          return "node " + std::to_string(i) + " has slot " + std::to_string(s) + " on node " +
                 std::to_string(owners[static_cast<std::size_t>(s)]);
        }
      }
      if (infoValue(call(n, {"CLUSTER", "INFO"}).str, "cluster_state") != "ok") {
        return "node " + std::to_string(i) + " is not cluster_state:ok";
      }
    }
    return "";
  });
  if (!why.empty()) {
    throw std::runtime_error("RedisCluster::giveAllSlots: node " + std::to_string(from) + "'s slots not on node " +
                             std::to_string(to) + " everywhere after " + msText(timeout) + ": " + why);
  }
  for (int s : slots) knownOwner_[static_cast<std::size_t>(s)] = to;
}

}  // namespace redlimit::test
