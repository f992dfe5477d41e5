// Redis Cluster: limiters on a real 3-primary cluster (tests/support/redis_cluster.cpp) routed by
// their slot, across a live resharding, and with names that must share a slot.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error_mapping.hpp"
#include "topology/cluster.hpp"
#include "helpers.hpp"
#include "topology_counters.hpp"
#include "topology/key_slot.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/raw_command.hpp"
#include "redlimit_test/redis_cluster.hpp"
#include "redlimit_test/tls_certs.hpp"

namespace redlimit::test {
namespace {

using detail::Reply;
using std::chrono::milliseconds;

std::shared_ptr<Client> clusterClient(const RedisCluster& cluster, ClientOptions base = {}) {
  return Client::fromUri(cluster.seeds(), std::move(base));
}

std::int64_t zcard(Client& c, const std::string& key) { return detail::command(c, {"ZCARD", key}).asInteger(); }

// `n` RateLimiters named prefix0, prefix1, ..., each set to `rate` per 10 minutes; every
// `sampleEvery`-th name is looked up, and the names looked up must reach all three primaries.
std::vector<RateLimiter> limitersOnEveryPrimary(const RedisCluster& cluster, const std::shared_ptr<Client>& client,
                                                const std::string& prefix, int n, std::int64_t rate, int sampleEvery) {
  std::vector<RateLimiter> limiters;
  std::vector<int> perPrimary(3, 0);
  limiters.reserve(static_cast<std::size_t>(n));
  // Their own registry: a thousand names in the global one would fill its cap (1000 limiters) for
  // every test after this one in the same process.
  RateLimiter::Options options;
  options.monitor.registry = std::make_shared<MetricsRegistry>();
  for (int i = 0; i < n; ++i) {
    limiters.emplace_back(client, prefix + std::to_string(i), options);
    if (i % sampleEvery == 0) {
      perPrimary[static_cast<std::size_t>(cluster.primaryOfSlot(detail::keySlot(limiters.back().getName())))]++;
    }
    if (!limiters.back().trySetRate(RateType::Overall, rate, std::chrono::minutes(10))) {
      throw std::runtime_error("trySetRate found " + limiters.back().getName() + " configured already");
    }
  }
  for (int count : perPrimary) EXPECT_GT(count, 0) << "the names should spread over all three primaries";
  return limiters;
}

// Exceptions that reached callers on several threads: how many, and the first one's message.
struct CallerErrors {
  std::atomic<int> count{0};
  std::mutex mutex;
  std::string first;
  void note(const std::exception& e) {
    if (count.fetch_add(1) != 0) return;
    std::lock_guard<std::mutex> lock(mutex);
    first = e.what();
  }
};

// Members of a limiter's permits log (one per grant of 1 permit), read through the cluster client.
std::int64_t grantsInRedis(Client& c, const RateLimiter& rl) { return zcard(c, rl.keys()[3]); }

TEST(Cluster, ThousandLimitersOverEverySlotHoldTheirRateWithNoRedirectReachingACaller) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  constexpr int kLimiters = 1000;
  constexpr std::int64_t kRate = 3;
  std::vector<RateLimiter> limiters = limitersOnEveryPrimary(cluster, client, "cl:", kLimiters, kRate, 50);

  // 8 threads, each over every limiter in its own order, 2 rounds: 16 attempts per limiter.
  std::vector<std::atomic<std::int64_t>> granted(kLimiters);
  CallerErrors errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 2; ++round) {
        for (int k = 0; k < kLimiters; ++k) {
          const std::size_t i = static_cast<std::size_t>((k * 7 + t * 131) % kLimiters);
          try {
            if (limiters[i].tryAcquire()) granted[i].fetch_add(1);
          } catch (const std::exception& e) {
            errors.note(e);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.count.load(), 0) << errors.first;
  for (std::size_t i = 0; i < limiters.size(); ++i) {
    EXPECT_EQ(granted[i].load(), kRate) << limiters[i].getName();
    EXPECT_EQ(grantsInRedis(*client, limiters[i]), granted[i].load()) << limiters[i].getName();
  }
  const detail::ClusterCounters c = clusterCountersOf(*client);
  EXPECT_GE(c.refreshes, 1u);
  EXPECT_EQ(c.nodes, 3u);
  std::printf("[ cluster  ] 1000 limiters x 16 attempts over 8 threads: %llu MOVED followed, %llu refreshes\n",
              static_cast<unsigned long long>(c.moved), static_cast<unsigned long long>(c.refreshes));
}

TEST(Cluster, ALiveReshardingOfAHotLimiterLosesNoCallAndKeepsItsRate) {
  RedisCluster cluster(3);
  EventLog events;
  ClientOptions co;
  co.onEvent = events.callback();
  auto client = clusterClient(cluster, co);
  RateLimiter hot(client, "hot");
  constexpr std::int64_t kRate = 1500;
  ASSERT_TRUE(hot.trySetRate(RateType::Overall, kRate, std::chrono::minutes(10)));
  const int slot = detail::keySlot("hot");
  const int from = cluster.primaryOfSlot(slot);
  const int to = (from + 1) % 3;

  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> granted{0}, denied{0};
  CallerErrors errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        try {
          (hot.tryAcquire() ? granted : denied).fetch_add(1);
        } catch (const std::exception& e) {
          errors.note(e);
        }
      }
    });
  }
  // Traffic before, during and after the move, which goes in steps while the 8 threads acquire;
  // then on until the rate is used up and well past it.
  while (granted.load() < 200) std::this_thread::yield();
  cluster.beginMigration(slot, from, to);
  std::this_thread::sleep_for(milliseconds(20));
  cluster.migrateKeys(slot, from, to);
  std::this_thread::sleep_for(milliseconds(20));
  cluster.finishMigration(slot, from, to);
  const std::int64_t grantedAtTheMove = granted.load();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (granted.load() < kRate && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  const std::int64_t deniedAtTheEnd = denied.load();
  while (denied.load() < deniedAtTheEnd + 500 && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  stop = true;
  for (auto& th : threads) th.join();

  EXPECT_EQ(errors.count.load(), 0) << errors.first;
  EXPECT_EQ(cluster.primaryOfSlot(slot), to);
  EXPECT_LT(grantedAtTheMove, kRate) << "the move should happen while permits are left";
  EXPECT_EQ(granted.load(), kRate) << "every permit granted once, none more, across the move";
  EXPECT_EQ(grantsInRedis(*client, hot), granted.load());
  const detail::ClusterCounters c = clusterCountersOf(*client);
  EXPECT_GE(c.moved + c.asked, 1u) << "the move should have been seen by redirects";
  // The move as the Client's events tell it: the slot's new owner (from the MOVED or the next map,
  // whichever came first); learning the map at start is no event.
  const auto topology = events.of(Event::Kind::Topology);
  ASSERT_GE(topology.size(), 1u);  // one, unless a refresh that read the map before the move wrote it after
  const std::string& said = topology.front().description;
  EXPECT_TRUE(said.find("slot " + std::to_string(slot) + " moved") != std::string::npos ||
              said.find("1 of 16384 slots moved") != std::string::npos)
      << said;
  std::printf(
      "[ cluster  ] %lld granted before the move ended, %lld in all, %lld denied; %llu ASK, %llu MOVED, "
      "%llu retried (TRYAGAIN)\n",
      static_cast<long long>(grantedAtTheMove), static_cast<long long>(granted.load()),
      static_cast<long long>(denied.load()), static_cast<unsigned long long>(c.asked),
      static_cast<unsigned long long>(c.moved), static_cast<unsigned long long>(c.retried));
}

TEST(Cluster, AFailoverIsCoveredByThePolicyAndCallsReachTheNewPrimaryWithinOneRefreshAndASecond) {
  constexpr milliseconds kNodeTimeout{1000};
  RedisCluster cluster(3, 1, kNodeTimeout);
  auto client = clusterClient(cluster, failoverClientOptions());
  RateLimiter rl(client, "failover:limiter", denyDuringOutages());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1000000, std::chrono::hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  const int primary = cluster.primaryOfSlot(detail::keySlot("failover:limiter"));
  ASSERT_GE(primary, 0);
  ASSERT_LT(primary, 3);

  std::atomic<bool> killed{false};
  Clock::time_point killedAt;
  UntilGranted seen;
  std::thread caller([&] {
    while (!killed.load()) std::this_thread::sleep_for(milliseconds(1));
    seen = callUntilGranted(rl, killedAt, std::chrono::seconds(30));
  });
  killedAt = Clock::now();
  cluster.killNode(primary);
  killed = true;
  const int promoted = cluster.waitForFailover(primary);
  const auto promotedAt = Clock::now();
  caller.join();
  ASSERT_EQ(seen.error, "");
  ASSERT_NE(seen.grantedAt, Clock::time_point{}) << "no call granted within 30 s of the kill";
  EXPECT_GT(seen.deniedByPolicy, 0);
  EXPECT_GT(rl.failureStats().denied, 0u);
  EXPECT_EQ(cluster.primaryOfSlot(detail::keySlot("failover:limiter")), promoted);
  const auto ms = [&](Clock::time_point t) { return std::chrono::duration_cast<milliseconds>(t - killedAt).count(); };
  // The harness sees the promotion by polling, so the client may be first; it must not be later
  // than one map refresh and a second after it.
  EXPECT_LE(ms(seen.grantedAt), ms(promotedAt) + 200 + 1000);
  EXPECT_LE(ms(seen.grantedAt), kNodeTimeout.count() + 200 + 1000 + 1500)
      << "node timeout + one refresh + 1 s, and the replica's election delay (0.5-1 s) and gossip";
  std::printf(
      "[ cluster  ] SIGKILL of the primary: replica promoted (as the harness saw it) after %lld ms, first "
      "granted call after %lld ms (node timeout %lld ms); %lld calls denied by the policy meanwhile\n",
      static_cast<long long>(ms(promotedAt)), static_cast<long long>(ms(seen.grantedAt)),
      static_cast<long long>(kNodeTimeout.count()), static_cast<long long>(seen.deniedByPolicy));
}

TEST(Cluster, NamesWithOneHashTagShareASlotAndANameThatWouldStraddleSlotsIsRefusedBeforeSending) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  RateLimiter a(client, "{t}a");
  RateLimiter b(client, "{t}b");
  for (const std::string& key : a.keys()) EXPECT_EQ(detail::keySlot(key), detail::keySlot("t")) << key;
  for (const std::string& key : b.keys()) EXPECT_EQ(detail::keySlot(key), detail::keySlot("t")) << key;
  ASSERT_TRUE(a.trySetRate(RateType::Overall, 2, std::chrono::minutes(1)));
  ASSERT_TRUE(b.trySetRate(RateType::Overall, 1, std::chrono::minutes(1)));
  EXPECT_TRUE(a.tryAcquire());
  EXPECT_TRUE(b.tryAcquire());
  EXPECT_FALSE(b.tryAcquire());

  const auto before = client->poolStats().requests;
  for (const char* straddles : {"a{b", "a{}b", "x{}{y}"}) {
    try {
      RateLimiter bad(client, straddles);
      ADD_FAILURE() << straddles << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("slot"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("{tenant}"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(client->poolStats().requests, before) << "nothing may be sent for a refused name";
  // A script call whose keys are in different slots is refused by the Client, before sending.
  static const detail::Script noop{"noop", "0000000000000000000000000000000000000000", "return 1"};
  EXPECT_THROW(detail::eval(*client, noop, {"{t}x", "{u}x"}, {}), InvalidArgument);
  EXPECT_EQ(client->poolStats().requests, before);
  // Commands without keys go to any node.
  EXPECT_EQ(detail::command(*client, {"PING"}).str, "PONG");
}

TEST(Cluster, RedissonsLayoutIsTheSameOnACluster) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  ClientOptions perClient;
  perClient.clientId = "0123456789abcdef0123456789abcdef0123";
  auto other = clusterClient(cluster, perClient);
  RateLimiter rl(other, "layout:limiter");
  ASSERT_TRUE(rl.trySetRate(RateType::PerClient, 5, std::chrono::seconds(30)));
  ASSERT_TRUE(rl.tryAcquire(2));
  Reply hash = detail::command(*client, {"HGETALL", "layout:limiter"});
  std::map<std::string, std::string> fields;
  for (std::size_t i = 0; i + 1 < hash.elements.size(); i += 2) fields[hash.elements[i].str] = hash.elements[i + 1].str;
  EXPECT_EQ(fields["rate"], "5");
  EXPECT_EQ(fields["interval"], "30000");
  EXPECT_EQ(fields["type"], "1");
  EXPECT_EQ(detail::command(*client, {"GET", "{layout:limiter}:value:" + perClient.clientId}).str, "3");
  EXPECT_EQ(zcard(*client, "{layout:limiter}:permits:" + perClient.clientId), 1);
  EXPECT_EQ(detail::command(*client, {"EXISTS", "{layout:limiter}:value"}).asInteger(), 0);
}

TEST(Cluster, AClientSetUpForOneServerSaysHowToReachTheClusterInsteadOfLettingCallsThrough) {
  RedisCluster cluster(3);
  // A name whose slot node 0 does not serve.
  std::string name;
  for (int i = 0; name.empty(); ++i) {
    const std::string candidate = "elsewhere:" + std::to_string(i);
    if (cluster.primaryOfSlot(detail::keySlot(candidate)) != 0) name = candidate;
  }
  auto single = Client::fromUri("redis://127.0.0.1:" + std::to_string(cluster.node(0).port()));
  RateLimiter::Options allow;
  allow.failure.policy = FailurePolicy::Allow;
  RateLimiter rl(single, name, allow);
  try {
    (void)rl.tryAcquire();
    ADD_FAILURE() << "a MOVED answer was taken for a decision";
  } catch (const ConfigurationError& e) {
    EXPECT_EQ(e.code(), "MOVED");
    EXPECT_NE(std::string(e.what()).find("redis-cluster://"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rl.failureStats().allowed, 0u) << "a set-up error is thrown under every policy, never granted";
}

// The mirror image: redis-cluster:// pointed at a server without cluster mode. Once the first
// refresh hears "cluster support disabled" (a Topology event says so), every call throws a
// ConfigurationError saying to use redis://, under every policy, instead of working as one node.
TEST(Cluster, ASingleServerBehindAClusterUriIsRefusedWithAConfigurationError) {
  RedisServer single;
  EventLog events;
  ClientOptions base;
  base.onEvent = events.callback();
  auto client = Client::fromUri("redis-cluster://127.0.0.1:" + std::to_string(single.port()), base);
  auto saidSo = [&] {
    for (const Event& e : events.of(Event::Kind::Topology)) {
      if (e.description.find("cluster support disabled") != std::string::npos) return true;
    }
    return false;
  };
  for (int i = 0; i < 1000 && !saidSo(); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(saidSo()) << "no Topology event about the missing cluster within 10 s";
  const auto topology = events.of(Event::Kind::Topology);
  ASSERT_EQ(topology.size(), 1u);
  EXPECT_EQ(topology[0].node, "127.0.0.1:" + std::to_string(single.port()));
  for (const FailurePolicy policy : {FailurePolicy::Allow, FailurePolicy::Deny, FailurePolicy::Throw}) {
    RateLimiter::Options options;
    options.failure.policy = policy;
    RateLimiter rl(client, "notacluster", options);
    for (int k = 0; k < 3; ++k) {
      try {
        (void)rl.tryAcquire();
        ADD_FAILURE() << "a single server answered a cluster Client";
      } catch (const ConfigurationError& e) {
        EXPECT_NE(std::string(e.what()).find("cluster support disabled"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("connect with redis://"), std::string::npos) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << detail::errorTypeName(e) << ": " << e.what();
      }
    }
    const FailureStats stats = rl.failureStats();
    EXPECT_EQ(stats.allowed + stats.denied + stats.outages, 0u) << "a set-up error is no outage";
  }
  EXPECT_EQ(events.of(Event::Kind::Topology).size(), 1u) << "reported once";
}

// The local port of every connection in CLIENT LIST ("laddr=127.0.0.1:<port>") other than the one
// asking (cmd=client|list), read over the node's plain port. A connection's laddr is the port the
// server accepted it on, so a client connection to the plain port cannot hide among TLS ones.
std::vector<int> clientLocalPorts(const RedisServer& node) {
  const RawReply r = rawCommand(node.host(), node.port(), {"CLIENT", "LIST"});
  if (r.isError()) throw std::runtime_error("CLIENT LIST: " + r.str);
  std::vector<int> ports;
  std::istringstream lines(r.str);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" cmd=client|list ") != std::string::npos) continue;
    const std::size_t at = line.find(" laddr=");
    if (at == std::string::npos) continue;
    const std::size_t colon = line.find(':', at);
    const std::size_t end = line.find(' ', colon);
    ports.push_back(std::stoi(line.substr(colon + 1, end - colon - 1)));
  }
  return ports;
}

TEST(Cluster, TlsClusterIsReachedOnEveryNodesTlsPort) {
  const TlsCerts certs = makeTlsCerts();
  // --tls-cluster yes: Redis 7.0 lists a node's "tls-port" in CLUSTER SHARDS only then. The bus is
  // TLS too and always asks the connecting node for a certificate: the client one (clientAuth).
  // Clients are asked for none.
  RedisCluster cluster(3, 0, milliseconds(1000),
                       {"--tls-port", "auto", "--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey,
                        "--tls-client-cert-file", certs.clientCert, "--tls-client-key-file", certs.clientKey,
                        "--tls-ca-cert-file", certs.caFile, "--tls-auth-clients", "no", "--tls-cluster", "yes"});
  for (int i = 0; i < 3; ++i) ASSERT_GT(cluster.node(i).tlsPort(), 0);
  auto client = Client::fromUri("rediss-cluster://127.0.0.1:" + std::to_string(cluster.node(0).tlsPort()) +
                                "?cacert=" + certs.caFile);
  constexpr int kLimiters = 30;
  constexpr std::int64_t kRate = 3;
  std::vector<RateLimiter> limiters = limitersOnEveryPrimary(cluster, client, "tls:", kLimiters, kRate, 1);
  for (auto& rl : limiters) {
    std::int64_t granted = 0;
    for (int k = 0; k < 5; ++k) granted += rl.tryAcquire() ? 1 : 0;
    EXPECT_EQ(granted, kRate) << rl.getName();
    EXPECT_EQ(grantsInRedis(*client, rl), kRate) << rl.getName();
  }
  EXPECT_GE(client->poolStats().created, 3u);
  EXPECT_EQ(clusterCountersOf(*client).nodes, 3u);
  // The client's pooled connections are still open: every node has some, all on its TLS port.
  for (int i = 0; i < 3; ++i) {
    const RedisServer& node = cluster.node(i);
    const std::vector<int> ports = clientLocalPorts(node);
    int onTls = 0;
    for (int port : ports) {
      EXPECT_EQ(port, node.tlsPort()) << "node " << i << ": a connection on port " << port << " (plain port "
                                      << node.port() << ")";
      onTls += port == node.tlsPort() ? 1 : 0;
    }
    EXPECT_GT(onTls, 0) << "node " << i << " has no connection on its TLS port";
  }
}

TEST(Cluster, LimiterKeysRouteByTheirSlotUnderAStoredPolicy) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  Limiter buckets(client, "tb", Policy::tokenBucket(2, 1, std::chrono::minutes(1)).stored());
  std::set<std::uint16_t> slots;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "k" + std::to_string(i);
    slots.insert(detail::keySlot(buckets.redisKey(key)));
    ASSERT_TRUE(buckets.trySetPolicy(key));
    EXPECT_TRUE(buckets.tryAcquire(key));
    EXPECT_TRUE(buckets.tryAcquire(key));
    EXPECT_FALSE(buckets.tryAcquire(key));
  }
  EXPECT_GE(slots.size(), 20u) << "the keys spread over the cluster";
}

// --- MultiLimit over keys of several slots: slot by slot ------------------------------------

RawReply onNode(RedisServer& node, const std::vector<std::string>& argv) {
  return rawCommand(node.host(), node.port(), argv);
}

// Script calls (EVALSHA and EVAL) every primary of `cluster` has run.
std::int64_t scriptCallsOnPrimaries(RedisCluster& cluster) {
  std::int64_t calls = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string stats = onNode(cluster.node(i), {"INFO", "commandstats"}).str;
    for (const char* cmd : {"cmdstat_evalsha", "cmdstat_eval"}) {
      const std::string v = infoValue(stats, cmd);  // calls=N,usec=...
      if (!v.empty()) calls += std::stoll(v.substr(v.find('=') + 1));
    }
  }
  return calls;
}

// The clients a node holds postponed (CLIENT PAUSE ... WRITE holds scripts) or blocked.
std::int64_t blockedClients(RedisServer& node) {
  return std::stoll(infoValue(onNode(node, {"INFO", "clients"}).str, "blocked_clients"));
}

// The members of every pending set of `node` (decisions across slots not settled yet).
std::int64_t pendingOn(RedisServer& node) {
  std::int64_t members = 0;
  for (const RawReply& k : onNode(node, {"KEYS", "rl::mxp:*"}).elements)
    members += onNode(node, {"ZCARD", k.str}).integer;
  return members;
}

// Waits until `node` holds at least one blocked (postponed) client: a script sent while its writes
// are paused has arrived. Throws after 20 s.
void waitForPostponedScript(RedisServer& node) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (blockedClients(node) < 1) {
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error("no script reached the paused node");
    std::this_thread::sleep_for(milliseconds(2));
  }
}

// A key of `limiter` (prefix + a number) whose Redis key is in a slot of [low, high) served by a
// primary other than `notOn` (-1: any).
std::string keyInSlots(const RedisCluster& cluster, const Limiter& limiter, const std::string& prefix, int low,
                       int high, int notOn = -1) {
  for (int i = 0; i < 100000; ++i) {
    const std::string key = prefix + std::to_string(i);
    const int slot = detail::keySlot(limiter.redisKey(key));
    if (slot >= low && slot < high && cluster.primaryOfSlot(slot) != notOn) return key;
  }
  throw std::runtime_error("no key of " + prefix + " in the slots asked");
}

// Permits a token bucket that refills one a day has given out: its capacity less what is left
// (exact over a test: no permit refills meanwhile).
std::int64_t usedOf(Limiter& limiter, const std::string& key, std::int64_t capacity) {
  return capacity - limiter.peek(key).remaining;
}

// Two limits whose keys are in different slots, on different primaries: the earlier slot's limit
// is reserved first and given back when the later one denies. Their counts are read through a
// Client of their own (`usedEarly`, `usedLate`): the callers' may hold a node in outage.
struct TwoSlots {
  static constexpr std::int64_t kEarly = 5;
  static constexpr std::int64_t kLate = 3;
  static Policy earlyPolicy() { return Policy::tokenBucket(kEarly, 1, std::chrono::hours(24)); }
  static Policy latePolicy() { return Policy::tokenBucket(kLate, 1, std::chrono::hours(24)); }
  TwoSlots(const RedisCluster& c, const std::shared_ptr<Client>& client)
      : checker(clusterClient(c)),
        early(client, "xs.early", earlyPolicy()),
        late(client, "xs.late", latePolicy()),
        earlyCheck(checker, "xs.early", earlyPolicy()),
        lateCheck(checker, "xs.late", latePolicy()),
        lateKey(keyInSlots(c, late, "all", 8192, 16384)),
        lateSlot(detail::keySlot(late.redisKey(lateKey))),
        latePrimary(c.primaryOfSlot(lateSlot)),
        earlyKey(keyInSlots(c, early, "u", 0, lateSlot, latePrimary)),
        earlyPrimary(c.primaryOfSlot(detail::keySlot(early.redisKey(earlyKey)))),
        both(MultiLimit({early, late}).on({earlyKey, lateKey})) {}
  // Takes every permit of the late limit, through its own Limiter.
  void exhaustLate() { ASSERT_TRUE(lateCheck.tryAcquire(lateKey, kLate)); }
  std::int64_t usedEarly() { return usedOf(earlyCheck, earlyKey, kEarly); }
  std::int64_t usedLate() { return usedOf(lateCheck, lateKey, kLate); }

  std::shared_ptr<Client> checker;
  Limiter early;
  Limiter late;
  Limiter earlyCheck;
  Limiter lateCheck;
  std::string lateKey;
  int lateSlot;
  int latePrimary;
  std::string earlyKey;
  int earlyPrimary;
  MultiLimit both;
};

// On a Cluster, a per-user limit and a global limit in other slots (on other primaries) are decided
// slot by slot: 8 threads (half of them through decideAsync) never get more than either bound,
// and afterwards every limit holds exactly the permits granted: a denial by a later slot gave back
// what the earlier slot had reserved, once. Every record left has a TTL.
TEST(MultiLimitCluster, CrossSlotLimitsHoldUnderEightThreads) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  constexpr std::int64_t kPerUser = 40;
  constexpr std::int64_t kGlobal = 100;
  Limiter user(client, "xs.user", Policy::tokenBucket(kPerUser, 1, std::chrono::hours(24)));
  Limiter global(client, "xs.global", Policy::tokenBucket(kGlobal, 1, std::chrono::hours(24)));
  const MultiLimit both({user, global});
  // The global's slot on primary 1: users before it on primary 0, after it on primary 2.
  const std::string all = keyInSlots(cluster, global, "all", 6000, 10000);
  const int globalSlot = detail::keySlot(global.redisKey(all));
  const int globalPrimary = cluster.primaryOfSlot(globalSlot);
  // Two users before the global's slot (reserved first, the global taken last), two after it (the
  // global reserved first), none on the global's primary.
  const std::vector<std::string> users{keyInSlots(cluster, user, "a", 0, globalSlot, globalPrimary),
                                       keyInSlots(cluster, user, "b", 0, globalSlot, globalPrimary),
                                       keyInSlots(cluster, user, "c", globalSlot + 1, 16384, globalPrimary),
                                       keyInSlots(cluster, user, "d", globalSlot + 1, 16384, globalPrimary)};
  const auto userFirst = [&](std::size_t u) { return detail::keySlot(user.redisKey(users[u])) < globalSlot; };

  constexpr int kThreads = 8;
  constexpr int kPerThread = 50;
  std::vector<std::atomic<std::int64_t>> granted(users.size());
  std::atomic<std::int64_t> deniedByGlobal{0}, deniedByUser{0}, givenBack{0};
  std::mutex heldMutex;
  std::vector<std::int64_t> heldUs;  // denied after a reservation: the whole call, µs
  CallerErrors errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Half the calls are user 0's (its own limit binds), the rest spread over the others.
        const std::size_t u = i % 2 == 0 ? 0 : 1 + static_cast<std::size_t>(t + i) % (users.size() - 1);
        try {
          MultiLimit call = both.on({users[u], all});
          const auto start = std::chrono::steady_clock::now();
          const MultiDecision d = t % 2 == 0 ? call.decide() : call.decideAsync().get();
          const auto took = std::chrono::steady_clock::now() - start;
          if (d.allowed) {
            granted[u].fetch_add(1);
            continue;
          }
          (d.deniedBy == 1 ? deniedByGlobal : deniedByUser).fetch_add(1);
          // The later slot denied: the earlier one had reserved, and gave back.
          if ((d.deniedBy == 1) == userFirst(u)) {
            givenBack.fetch_add(1);
            const std::lock_guard<std::mutex> lock(heldMutex);
            heldUs.push_back(std::chrono::duration_cast<std::chrono::microseconds>(took).count());
          }
        } catch (const std::exception& e) {
          errors.note(e);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.count.load(), 0) << errors.first;

  std::int64_t total = 0;
  for (std::size_t u = 0; u < users.size(); ++u) {
    SCOPED_TRACE(users[u]);
    EXPECT_LE(granted[u].load(), kPerUser);
    EXPECT_EQ(usedOf(user, users[u], kPerUser), granted[u].load());
    total += granted[u].load();
  }
  EXPECT_LE(total, kGlobal);
  EXPECT_GT(total, kGlobal / 2);
  EXPECT_EQ(usedOf(global, all, kGlobal), total);
  EXPECT_GT(deniedByGlobal.load(), 0);
  EXPECT_GT(deniedByUser.load(), 0);
  EXPECT_GT(givenBack.load(), 0);
  // A peek across slots takes nothing.
  const MultiDecision look = both.on({users[0], all}).peek();
  EXPECT_EQ(look.limits.size(), 2u);
  EXPECT_EQ(usedOf(global, all, kGlobal), total);

  // The records: each in a slot of its group, each with a TTL. A grant's are settled as kept in the
  // background (the earlier slots' first, leaving their pending sets, then the last slot's); once
  // they are, every record keeps at most the hold, 2 groups x 2 x (500 + 500) ms + 1 s.
  std::int64_t records = 0;
  std::int64_t longer = 0;   // records with more TTL than the hold
  std::int64_t pending = 0;  // members of the pending sets
  std::int64_t untimed = 0;  // records without a TTL
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (bool first = true; first || ((longer > 0 || pending > 0) && std::chrono::steady_clock::now() < until);
       first = false) {
    if (!first) std::this_thread::sleep_for(milliseconds(5));
    records = longer = pending = untimed = 0;
    for (int i = 0; i < 3; ++i) {
      pending += pendingOn(cluster.node(i));
      for (const RawReply& k : onNode(cluster.node(i), {"KEYS", "rl::mxs:*"}).elements) {
        ++records;
        const std::int64_t ttl = onNode(cluster.node(i), {"PTTL", k.str}).integer;
        if (ttl <= 0) ++untimed;
        if (ttl > 5000) ++longer;
      }
    }
  }
  EXPECT_EQ(pending, 0);
  EXPECT_EQ(longer, 0);
  EXPECT_EQ(untimed, 0);
  EXPECT_GT(records, 0);

  std::sort(heldUs.begin(), heldUs.end());
  const auto at = [&](double q) -> std::int64_t {
    return heldUs.empty() ? -1 : heldUs[static_cast<std::size_t>(q * static_cast<double>(heldUs.size() - 1))];
  };
  std::printf(
      "[ cross-slot ] %d threads x %d: %lld granted (global %lld), %lld denied by the global, %lld by a "
      "user; %zu given back, held at most the call: p50 %lld us, p99 %lld us; %lld records\n",
      kThreads, kPerThread, static_cast<long long>(total), static_cast<long long>(kGlobal),
      static_cast<long long>(deniedByGlobal.load()), static_cast<long long>(deniedByUser.load()), heldUs.size(),
      static_cast<long long>(at(0.5)), static_cast<long long>(at(0.99)), static_cast<long long>(records));
}

// CLIENT KILL of the caller's connection to the later slot's primary while its reserve waits there
// (the primary's writes paused, after the earlier slot reserved): the take never runs, the caller
// gets the IoError (a Cluster node whose connection closed is in an outage until a probe answers),
// and the earlier slot's permit is given back before that. The caller's retry, once the node
// answers again, is decided as any call: the counts stay exact.
TEST(MultiLimitCluster, AConnectionKilledBetweenSlotsGivesTheEarlierSlotsPermitBack) {
  RedisCluster cluster(3);
  ClientOptions patient;  // only the kill may fail a try, never a slow reply
  patient.connection.connectTimeout = std::chrono::seconds(10);
  patient.connection.commandTimeout = std::chrono::seconds(10);
  auto client = clusterClient(cluster, patient);
  TwoSlots two(cluster, client);
  RedisServer& late = cluster.node(two.latePrimary);
  ASSERT_EQ(onNode(late, {"CLIENT", "PAUSE", "30000", "WRITE"}).str, "OK");
  std::future<MultiDecision> pending = two.both.decideAsync(1);
  waitForPostponedScript(late);
  EXPECT_EQ(two.usedEarly(), 1) << "the earlier slot holds the permit meanwhile";
  EXPECT_GE(onNode(late, {"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}).integer, 1);
  EXPECT_THROW((void)pending.get(), IoError);
  EXPECT_EQ(two.usedEarly(), 0) << "given back";
  (void)onNode(late, {"CLIENT", "UNPAUSE"});
  EXPECT_EQ(two.usedLate(), 0) << "the killed reserve never ran";
  // The caller retries until the node answers again (its probe: one call per 250 ms).
  std::optional<MultiDecision> retried;
  for (int i = 0; i < 400 && !retried; ++i) {
    try {
      retried = two.both.decide();
    } catch (const IoError&) {
      std::this_thread::sleep_for(milliseconds(25));
    }
  }
  ASSERT_TRUE(retried.has_value());
  EXPECT_TRUE(retried->allowed);
  EXPECT_EQ(two.usedEarly(), 1);
  EXPECT_EQ(two.usedLate(), 1);
}

// The later slot's primary cannot answer within the call's bound: the caller gets the TimeoutError
// (the failure policy: Throw) and the earlier slot's permit is given back first.
TEST(MultiLimitCluster, ALaterSlotThatCannotAnswerGivesTheEarlierSlotsPermitBack) {
  RedisCluster cluster(3);
  ClientOptions quick;
  quick.connection.commandTimeout = milliseconds(300);
  auto client = clusterClient(cluster, quick);
  TwoSlots two(cluster, client);
  two.exhaustLate();
  RedisServer& late = cluster.node(two.latePrimary);
  ASSERT_EQ(onNode(late, {"CLIENT", "PAUSE", "30000", "WRITE"}).str, "OK");
  EXPECT_THROW((void)two.both.decide(), TimeoutError);
  EXPECT_EQ(two.usedEarly(), 0);
  (void)onNode(late, {"CLIENT", "UNPAUSE"});
  // The take that timed out may run once the primary resumes: it denies, the late limit is spent.
  EXPECT_EQ(two.usedLate(), TwoSlots::kLate);
  EXPECT_EQ(two.usedEarly(), 0);
}

// A caller in a process of its own: a fork() child that decides once across TwoSlots (without
// waiting for the answer) and then waits to be killed (kill(), or when this ends). Made once
// `pausedAt`'s writes are paused, it returns when the child's reserve waits there.
class CallerProcess {
 public:
  CallerProcess(const RedisCluster& cluster, RedisServer& pausedAt) {
    EXPECT_EQ(onNode(pausedAt, {"CLIENT", "PAUSE", "60000", "WRITE"}).str, "OK");
    (void)waitUntilOtherThreadsSleep();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Its call's bound (1.25 s) is long enough to be killed waiting, and makes its hold 6 s.
      ClientOptions patient;
      patient.connection.connectTimeout = milliseconds(250);
      patient.connection.commandTimeout = std::chrono::seconds(1);
      auto client = clusterClient(cluster, patient);
      TwoSlots two(cluster, client);
      (void)two.both.decideAsync(1);
      std::this_thread::sleep_for(std::chrono::minutes(1));
      ::_exit(0);
    }
    if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    waitForPostponedScript(pausedAt);
  }
  CallerProcess(const CallerProcess&) = delete;
  CallerProcess& operator=(const CallerProcess&) = delete;
  ~CallerProcess() { kill(); }
  // SIGKILL, and the child reaped.
  void kill() {
    if (pid_ <= 0) return;
    (void)::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    EXPECT_TRUE(WIFSIGNALED(status)) << describeWaitStatus(status);
  }

 private:
  pid_t pid_ = -1;
};

// Calls `decide` (each a denial by the later slot, whose reserve in the earlier slot sweeps) until
// `done()`, for at most 60 s: the hold of the dead caller's decision ends meanwhile.
bool sweptBy(const std::function<void()>& decide, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    decide();
    std::this_thread::sleep_for(milliseconds(50));
  }
  return true;
}

// A caller process killed after the earlier slot reserved, while its later slot's reserve waits
// (paused): the earlier slot holds the permit until the hold ends; then the next decision over the
// same limits finds it, learns from the later slot's record that the decision never took there
// (fencing it, so that a late reserve would deny) and gives the permit back.
TEST(MultiLimitCluster, APermitHeldByACallerKilledBetweenSlotsComesBackWhenItsHoldEnds) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  TwoSlots two(cluster, client);
  RedisServer& late = cluster.node(two.latePrimary);
  RedisServer& early = cluster.node(two.earlyPrimary);
  CallerProcess caller(cluster, late);
  caller.kill();
  (void)onNode(late, {"CLIENT", "UNPAUSE"});
  EXPECT_EQ(two.usedEarly(), 1) << "the dead caller's reserve holds the permit";
  EXPECT_EQ(pendingOn(early), 1);
  EXPECT_EQ(two.usedLate(), 0) << "its later reserve never ran";
  two.exhaustLate();
  std::int64_t denials = 0;
  ASSERT_TRUE(sweptBy(
      [&] {
        const MultiDecision d = two.both.decide();
        EXPECT_FALSE(d.allowed);
        ++denials;
      },
      [&] { return pendingOn(early) == 0; }));
  EXPECT_GT(denials, 0);
  EXPECT_EQ(two.usedEarly(), 0) << "given back";
  EXPECT_EQ(two.usedLate(), TwoSlots::kLate);
  // The later slot's record of the dead decision is a fence.
  std::int64_t fences = 0;
  for (const RawReply& k : onNode(late, {"KEYS", "rl::mxs:*"}).elements) {
    const std::string v = onNode(late, {"GET", k.str}).str;
    if (v.size() > 2 && v[2] == 'A') ++fences;
  }
  EXPECT_EQ(fences, 1);
}

// A caller process killed after its later slot granted but before the earlier slot's record was
// settled as kept: the decision took, so the sweep keeps the earlier slot's permit (given back, it
// would be a grant over the bound).
TEST(MultiLimitCluster, APermitOfACallerKilledAfterItsLastSlotGrantedStaysTaken) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  TwoSlots two(cluster, client);
  RedisServer& late = cluster.node(two.latePrimary);
  RedisServer& early = cluster.node(two.earlyPrimary);
  // The child waits at the later slot; the earlier slot's writes are paused before the later slot
  // lets the child's reserve run, so that its settle of the earlier record waits there: killed then.
  CallerProcess caller(cluster, late);
  ASSERT_EQ(onNode(early, {"CLIENT", "PAUSE", "60000", "WRITE"}).str, "OK");
  (void)onNode(late, {"CLIENT", "UNPAUSE"});
  waitForPostponedScript(early);
  caller.kill();
  (void)onNode(early, {"CLIENT", "UNPAUSE"});
  EXPECT_EQ(two.usedEarly(), 1);
  EXPECT_EQ(two.usedLate(), 1) << "the later slot granted";
  EXPECT_EQ(pendingOn(early), 1) << "the earlier record was never settled";
  ASSERT_TRUE(two.lateCheck.tryAcquire(two.lateKey, TwoSlots::kLate - 1));
  ASSERT_TRUE(sweptBy([&] { EXPECT_FALSE(two.both.decide().allowed); }, [&] { return pendingOn(early) == 0; }));
  EXPECT_EQ(two.usedEarly(), 1) << "the dead caller's granted permit stays counted";
  EXPECT_EQ(two.usedLate(), TwoSlots::kLate);
}

// A peek across slots asks every slot and takes nothing: the denial names the limit that denied,
// and the earlier slot's limit, which would grant, says so in its view.
TEST(MultiLimitCluster, PeekAcrossSlotsTakesNothing) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  TwoSlots two(cluster, client);
  two.exhaustLate();
  const MultiDecision look = two.both.peek(2);
  EXPECT_FALSE(look.allowed);
  EXPECT_EQ(look.deniedBy, 1u);
  EXPECT_GT(look.retryAfter.count(), 0);
  ASSERT_EQ(look.limits.size(), 2u);
  EXPECT_TRUE(look.limits[0].allowed);
  EXPECT_EQ(look.limits[0].remaining, TwoSlots::kEarly);
  EXPECT_FALSE(look.limits[1].allowed);
  EXPECT_EQ(look.limit, TwoSlots::kLate);
  EXPECT_EQ(two.usedEarly(), 0);
  EXPECT_EQ(two.usedLate(), TwoSlots::kLate);
}

// What cannot be decided slot by slot is refused before anything is sent, saying to use one hash
// tag; one tag makes it one script call again.
TEST(MultiLimitCluster, RefusesWhatCannotBeDecidedSlotBySlotBeforeSending) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  TwoSlots two(cluster, client);
  const std::int64_t before = scriptCallsOnPrimaries(cluster);
  const auto refused = [&](const std::string& what, const std::function<void()>& call) {
    try {
      call();
      ADD_FAILURE() << what << " was accepted across slots";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("one hash tag"), std::string::npos) << e.what();
    }
  };
  MultiLimit& both = two.both;
  refused("reserve", [&] { (void)both.reserve(1, std::chrono::milliseconds(10)); });
  refused("tryAcquire with a timeout", [&] { (void)both.tryAcquire(1, milliseconds(10)); });
  refused("acquire", [&] { both.acquire(1); });
  refused("refund", [&] { both.refund(1); });
  refused("reserveFor", [&] { (void)both.reserveFor(1, "r1"); });
  refused("settle", [&] { (void)both.settle("r1", 0); });
  refused("reserveForAsync", [&] { (void)both.reserveForAsync(1, "r1").get(); });
  Limiter inFlight(client, "xs.inflight", Policy::concurrency(3, std::chrono::seconds(30)));
  ASSERT_NE(detail::keySlot(inFlight.redisKey(two.lateKey)), detail::keySlot(two.early.redisKey(two.earlyKey)));
  refused("a concurrency limit", [&] { (void)MultiLimit({two.early, inFlight}).on({two.earlyKey, two.lateKey}); });
  EXPECT_EQ(scriptCallsOnPrimaries(cluster), before);
  // One hash tag: one slot, one call, as on a single server.
  MultiLimit tagged = MultiLimit({two.early, two.late}).on({"{t7}:u7", "{t7}:all"});
  EXPECT_TRUE(tagged.tryAcquire(3));
  EXPECT_FALSE(tagged.tryAcquire());
  EXPECT_GT(scriptCallsOnPrimaries(cluster), before);
}

// A sliding window counter in the earlier slot is reserved and given back as the others are.
TEST(MultiLimitCluster, ASlidingWindowCounterInAnEarlierSlotGetsItsPermitsBack) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  TwoSlots two(cluster, client);
  Limiter sliding(client, "xs.sliding", Policy::slidingWindow(10, std::chrono::hours(24)));
  const std::string key = keyInSlots(cluster, sliding, "s", 0, two.lateSlot, two.latePrimary);
  ASSERT_LT(detail::keySlot(sliding.redisKey(key)), two.lateSlot) << "the counter's slot is asked first";
  MultiLimit both = MultiLimit({sliding, two.late}).on({key, two.lateKey});
  ASSERT_TRUE(both.tryAcquire(2));
  EXPECT_EQ(sliding.peek(key).remaining, 8);
  ASSERT_TRUE(two.lateCheck.tryAcquire(two.lateKey, TwoSlots::kLate - 2)) << "the later slot's limit used up";
  const MultiDecision denied = both.decide(3);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.deniedBy, 1) << "the later slot's limit";
  EXPECT_EQ(sliding.peek(key).remaining, 8) << "the 3 reserved in the earlier slot came back";
}

TEST(Cluster, CoalescedOneKeyTakesGoTogetherOnlyWithinOneSlot) {
  RedisCluster cluster(3);
  ClientOptions coalescing;
  coalescing.coalesce = true;
  auto client = clusterClient(cluster, coalescing);
  Limiter perKey(client, "per-key", Policy::gcra(1, std::chrono::hours(1), 5));
  // 3 hash tags x 10 keys: keys of one tag may share a batch, keys of different tags never can.
  std::vector<std::string> keys;
  for (const char* tag : {"{a}", "{b}", "{c}"}) {
    for (int i = 0; i < 10; ++i) keys.push_back(std::string(tag) + ":k" + std::to_string(i));
  }
  std::vector<std::future<Decision>> all;
  for (int round = 0; round < 8; ++round) {
    for (const auto& k : keys) all.push_back(perKey.decideAsync(k));
  }
  std::map<std::string, int> allowed;
  std::size_t errors = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    try {
      const Decision d = all[i].get();
      // Which rounds are granted is not pinned: groups in flight on different connections of a
      // node may be decided in either order, as calls sent one by one on them would be.
      if (d.allowed) ++allowed[keys[i % keys.size()]];
    } catch (const std::exception& e) {
      if (errors++ == 0) ADD_FAILURE() << e.what();
    }
  }
  EXPECT_EQ(errors, 0u);
  for (const auto& k : keys) EXPECT_EQ(allowed[k], 5) << k;
}

// Reserve, then settle: a record shares its key's slot, whether the key has a hash tag (the record
// keeps it) or not, so no call meets CROSSSLOT.
TEST(Cluster, ReservationRecordsShareTheirKeysSlot) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  Limiter rl(client, "rsv-tb", Policy::tokenBucket(10, 1, std::chrono::hours(24)));
  std::set<std::uint16_t> slots;
  for (int i = 0; i < 12; ++i) {
    const std::string key = i % 2 == 0 ? "tb:" + std::to_string(i) : "{rsv:" + std::to_string(i) + "}:tb";
    SCOPED_TRACE(key);
    const std::string id = "req-" + std::to_string(i);
    EXPECT_EQ(detail::keySlot(rl.recordKey(key, id)), detail::keySlot(rl.redisKey(key)));
    slots.insert(detail::keySlot(rl.redisKey(key)));
    ASSERT_TRUE(rl.reserveFor(key, 6, id).allowed);
    EXPECT_TRUE(rl.reserveFor(key, 6, id).repeated);
    const Settlement s = rl.settle(key, id, 2);
    EXPECT_EQ(s.status, Settlement::Status::Settled);
    EXPECT_EQ(s.returned, 4);
    EXPECT_EQ(rl.settle(key, id, 2).status, Settlement::Status::AlreadySettled);
    EXPECT_EQ(rl.peek(key).remaining, 8);
  }
  EXPECT_GE(slots.size(), 8u);
  Limiter perKey(client, "rsv-keyed", Policy::gcra(1, std::chrono::hours(24), 10));
  for (const std::string key : {"user:1", "user:2", "{org:3}:user:4"}) {
    EXPECT_EQ(detail::keySlot(perKey.recordKey(key, "r")), detail::keySlot(perKey.redisKey(key))) << key;
    ASSERT_TRUE(perKey.reserveFor(key, 3, "r").allowed) << key;
    EXPECT_EQ(perKey.cancel(key, "r").returned, 3) << key;
  }
}

// --- A node that runs no scripts --------------------------------------------------------------

// NOPERM answers node `i` of `cluster` has given (INFO errorstats).
std::int64_t refusalsOn(RedisCluster& cluster, int i) {
  const std::string v = infoValue(onNode(cluster.node(i), {"INFO", "errorstats"}).str, "errorstat_NOPERM");
  return v.empty() ? 0 : std::stoll(v.substr(v.find('=') + 1));  // count=N
}

// A node whose ACL refuses the script commands (ACLs are per node in a Redis Cluster) is found out
// by that node's transport alone: the calls for its keys end unsent after the first (but for one
// re-check per interval, counted by the transports), a configuration error, not an outage; the
// other nodes serve theirs.
TEST(Cluster, ANodeThatRunsNoScriptsIsRememberedForThatNodeAlone) {
  RedisCluster cluster(3);
  ASSERT_EQ(onNode(cluster.node(0), {"ACL", "SETUSER", "default", "-evalsha", "-eval", "-script"}).str, "OK");
  auto client = clusterClient(cluster);
  Limiter limiter(client, "noscripts", Policy::perMinute(1000));
  const std::string refusedKey = keyInSlots(cluster, limiter, "r", 0, 16384 / 3);  // node 0's slots
  const std::string servedKey = keyInSlots(cluster, limiter, "s", 16384 / 3 + 1, 16384, 0);
  const auto rechecks = [&] { return detail::ClientAccess::runner(*client).counters().noScriptsRechecks; };
  const auto refused = [&](const std::function<Decision()>& call) {
    try {
      (void)call();
      ADD_FAILURE() << "served by a node that runs no scripts";
    } catch (const ConfigurationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Configuration) << e.what();
      EXPECT_EQ(e.code(), "NOPERM") << e.what();
    }
  };

  refused([&] { return limiter.decide(refusedKey); });
  const std::int64_t found = refusalsOn(cluster, 0);
  ASSERT_GE(found, 1);
  const std::uint64_t rechecksBefore = rechecks();
  for (int i = 0; i < 20; ++i) {
    refused([&] { return limiter.decide(refusedKey); });
    refused([&] { return limiter.decideAsync(refusedKey).get(); });
    const Decision served = limiter.decide(servedKey);
    EXPECT_TRUE(served.allowed);
    EXPECT_FALSE(served.byPolicy) << "Redis decided";
  }
  EXPECT_EQ(static_cast<std::uint64_t>(refusalsOn(cluster, 0) - found), rechecks() - rechecksBefore)
      << "node 0 was sent nothing but the re-checks";
  EXPECT_EQ(clusterCountersOf(*client).outages, 0u) << "not an outage";
}

}  // namespace
}  // namespace redlimit::test
