#include "redlimit_test/redis_sentinel_group.hpp"

#include <stdexcept>

#include "harness_util.hpp"

namespace redlimit::test {
namespace {

using harness::call;
using harness::Clock;
using harness::msText;
using harness::nodeName;
using harness::pollUntil;

constexpr std::chrono::milliseconds kSettleTimeout{20000};
constexpr int kSentinels = 3;
constexpr int kFailoverTimeoutMs = 2000;  // sentinel failover-timeout

// A field of one SENTINEL REPLICAS / SENTINELS entry (a flat array: name, value, name, value...).
std::string field(const RawReply& entry, const std::string& name) {
  for (std::size_t i = 0; i + 1 < entry.elements.size(); i += 2) {
    if (entry.elements[i].str == name) return entry.elements[i + 1].str;
  }
  return "";
}

// SENTINEL GET-MASTER-ADDR-BY-NAME <name>: [ip, port], or nil before the sentinel knows it.
int namedPrimaryPort(const RedisServer& sentinel, const std::string& name, const std::string& password) {
  const RawReply r = call(sentinel, {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", name}, password);
  if (r.elements.size() != 2) throw std::runtime_error(nodeName(sentinel) + " does not name a primary");
  return std::stoi(r.elements[1].str);
}

}  // namespace

RedisSentinelGroup::RedisSentinelGroup(std::chrono::milliseconds downAfter, std::string primaryName,
                                       SentinelGroupPasswords passwords)
    : name_(std::move(primaryName)), passwords_(std::move(passwords)) {
  if (downAfter.count() < 1 || name_.empty()) {
    throw std::invalid_argument("RedisSentinelGroup: needs downAfter >= 1 ms and a primary name");
  }
  std::vector<std::string> dataArgs{"--repl-diskless-sync-delay", "0"};
  const std::string& pp = passwords_.primary;
  const std::string& sp = passwords_.sentinel;
  if (!pp.empty()) dataArgs.insert(dataArgs.end(), {"--requirepass", pp, "--masterauth", pp});
  primary_ = std::make_unique<RedisServer>(dataArgs);
  replica_ = std::make_unique<RedisServer>(dataArgs);
  const auto deadline = Clock::now() + kSettleTimeout;
  (void)call(*replica_, {"REPLICAOF", primary_->host(), std::to_string(primary_->port())}, pp);
  // Attached before the sentinels start: they learn the replica from the primary's first INFO
  // (later INFO polls come every 10 s).
  std::string why = pollUntil(deadline, [&]() -> std::string {
    const std::string info = call(*replica_, {"INFO", "replication"}, pp).str;
    if (infoValue(info, "master_link_status") != "up") return "the replica's link is not up";
    if (infoValue(call(*primary_, {"INFO", "replication"}, pp).str, "connected_slaves") != "1") {
      return "the primary lists no replica";
    }
    return "";
  });
  if (!why.empty()) throw std::runtime_error("RedisSentinelGroup: the replica did not attach: " + why);

  std::string config = "sentinel monitor " + name_ + " " + primary_->host() + " " + std::to_string(primary_->port()) +
                       " 2\n" + "sentinel down-after-milliseconds " + name_ + " " + std::to_string(downAfter.count()) +
                       "\n" + "sentinel failover-timeout " + name_ + " " + std::to_string(kFailoverTimeoutMs) + "\n";
  if (!pp.empty()) config += "sentinel auth-pass " + name_ + " " + pp + "\n";
  if (!sp.empty()) config += "requirepass " + sp + "\nsentinel sentinel-pass " + sp + "\n";
  for (int i = 0; i < kSentinels; ++i) {
    sentinels_.push_back(std::make_unique<RedisServer>(std::vector<std::string>{"--sentinel"}, config));
  }
  // Sentinels find each other through hello messages on the primary, every 2 s.
  why = pollUntil(deadline, [&]() -> std::string {
    for (const auto& s : sentinels_) {
      if (namedPrimaryPort(*s, name_, sp) != primary_->port()) return nodeName(*s) + " names another primary";
      bool replicaUp = false;
      for (const RawReply& r : call(*s, {"SENTINEL", "REPLICAS", name_}, sp).elements) {
        replicaUp = replicaUp || (field(r, "port") == std::to_string(replica_->port()) &&
                                  field(r, "flags") == "slave" && field(r, "master-link-status") == "ok");
      }
      if (!replicaUp) return nodeName(*s) + " does not list the replica as up";
      const std::size_t others = call(*s, {"SENTINEL", "SENTINELS", name_}, sp).elements.size();
      if (others != kSentinels - 1) return nodeName(*s) + " knows " + std::to_string(others) + " other sentinels";
    }
    return "";
  });
  if (!why.empty()) {
    throw std::runtime_error("RedisSentinelGroup: the sentinels did not settle in " + msText(kSettleTimeout) + ": " +
                             why);
  }
}

RedisSentinelGroup::~RedisSentinelGroup() = default;  // sentinels stop first (members in reverse)

RedisServer& RedisSentinelGroup::sentinel(int i) {
  if (i < 0 || i >= kSentinels) throw std::out_of_range("RedisSentinelGroup: no sentinel " + std::to_string(i));
  return *sentinels_[static_cast<std::size_t>(i)];
}

std::vector<int> RedisSentinelGroup::sentinelPorts() const {
  std::vector<int> ports;
  for (const auto& s : sentinels_) ports.push_back(s->port());
  return ports;
}

std::string RedisSentinelGroup::uri() const {
  std::string out = "redis-sentinel://";
  if (!passwords_.primary.empty()) out += ":" + passwords_.primary + "@";
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    out += (i == 0 ? "" : ",") + sentinels_[i]->host() + ":" + std::to_string(sentinels_[i]->port());
  }
  out += "/" + name_;
  if (!passwords_.sentinel.empty()) out += "?sentinel_password=" + passwords_.sentinel;
  return out;
}

int RedisSentinelGroup::currentPrimaryPort() const {
  std::string last = "no sentinel is running";
  for (const auto& s : sentinels_) {
    if (!s->running()) continue;
    try {
      return namedPrimaryPort(*s, name_, passwords_.sentinel);
    } catch (const std::runtime_error& e) {
      last = e.what();
    }
  }
  throw std::runtime_error("RedisSentinelGroup: no sentinel names the primary: " + last);
}

int RedisSentinelGroup::waitForFailover(int oldPort, std::chrono::milliseconds timeout) {
  int named = -1;
  const std::string why = pollUntil(Clock::now() + timeout, [&]() -> std::string {
    named = -1;
    for (const auto& s : sentinels_) {
      if (!s->running()) continue;
      const int port = namedPrimaryPort(*s, name_, passwords_.sentinel);
      if (port == oldPort) return nodeName(*s) + " still names port " + std::to_string(oldPort);
      if (named >= 0 && port != named)
        return "sentinels name ports " + std::to_string(named) + " and " + std::to_string(port);
      named = port;
    }
    if (named < 0) return "no sentinel is running";
    const RawReply info = rawCommand(primary_->host(), named, {"INFO", "replication"}, std::chrono::milliseconds(2000),
                                     passwords_.primary);
    if (infoValue(info.str, "role") != "master") return "port " + std::to_string(named) + " is not a master yet";
    return "";
  });
  if (!why.empty()) {
    throw std::runtime_error("RedisSentinelGroup: no failover from port " + std::to_string(oldPort) + " in " +
                             msText(timeout) + ": " + why);
  }
  return named;
}

}  // namespace redlimit::test
