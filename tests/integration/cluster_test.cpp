// Redis Cluster: limiters on a real 3-primary cluster (tests/support/redis_cluster.cpp) routed by
// their slot, across a live resharding, and with names that must share a slot.
#include <atomic>
#include <chrono>
#include <future>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

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

// One script may only touch keys of one slot: a MultiLimit over keys of two slots is refused
// before anything is sent, saying how to co-locate them; one hash tag makes it work.
TEST(Cluster, AMultiLimitOverKeysOfDifferentSlotsIsRefusedBeforeSendingAndOneHashTagMakesItWork) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  // A MultiLimit of Limiters: the keys of each call, refused in two slots, co-located by a tag.
  Limiter perUser(client, "multi.user", Policy::perMinute(2));
  Limiter everyone(client, "multi.global", Policy::perMinute(2));
  const MultiLimit gateway({perUser, everyone});
  ASSERT_NE(detail::keySlot(perUser.redisKey("u7")), detail::keySlot(everyone.redisKey("all")));
  try {
    (void)gateway.on({"u7", "all"});
    ADD_FAILURE() << "keys in two slots were accepted on a cluster";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hash slot"), std::string::npos) << what;
    EXPECT_NE(what.find("{tenant42}:user:7"), std::string::npos) << what;
    EXPECT_NE(what.find(perUser.redisKey("u7")), std::string::npos) << what;
    EXPECT_NE(what.find("shared by every tenant"), std::string::npos) << what;
  }
  EXPECT_TRUE(gateway.on({"{t7}:u7", "{t7}:all"}).tryAcquire(2));
  EXPECT_FALSE(gateway.on({"{t7}:u7", "{t7}:all"}).tryAcquire());
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

}  // namespace
}  // namespace redlimit::test
