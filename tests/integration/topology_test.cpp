// Cluster and Sentinel topologies under outages and changes: a hung Cluster node learnt once per
// Client, a dead first cluster seed, the transports of retired nodes and primaries released, and
// Sentinel's READONLY message.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <csignal>
#include <sys/types.h>

#include <gtest/gtest.h>

#include "topology/cluster.hpp"
#include "base/error_mapping.hpp"
#include "helpers.hpp"
#include "topology_counters.hpp"
#include "topology/key_slot.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/no_free_descriptors.hpp"
#include "redlimit_test/raw_command.hpp"
#include "redlimit_test/redis_cluster.hpp"
#include "redlimit_test/redis_sentinel_group.hpp"
#include "topology/sentinel.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

pid_t pidOf(RedisServer& s) {
  const RawReply info = rawCommand(s.host(), s.port(), {"INFO", "server"});
  return static_cast<pid_t>(std::stol(infoValue(info.str, "process_id")));
}

// EVALSHA calls node `s` has run (INFO commandstats), or -1 if it does not answer.
long long evalshaCalls(RedisServer& s) {
  try {
    const RawReply info = rawCommand(s.host(), s.port(), {"INFO", "commandstats"});
    const std::string stats = infoValue(info.str, "cmdstat_evalsha");  // calls=N,usec=...
    if (stats.empty()) return 0;
    return std::stoll(stats.substr(stats.find('=') + 1));
  } catch (const std::exception&) {
    return -1;
  }
}

// The number `sub` in the "k=v,k=v" value of `field` in INFO `section` of node `s`
// ("cmdstat_evalsha", "rejected_calls"), 0 if absent. Throws std::runtime_error if the node does
// not answer.
long long infoCount(RedisServer& s, const std::string& section, const std::string& field, const std::string& sub) {
  const RawReply info = rawCommand(s.host(), s.port(), {"INFO", section});
  const std::string value = "," + infoValue(info.str, field) + ",";
  const auto at = value.find("," + sub + "=");
  if (at == std::string::npos) return 0;
  return std::stoll(value.substr(at + sub.size() + 2));
}

// The cluster_state node `s` reports ("ok", "fail"), or "" if it does not answer.
std::string clusterState(RedisServer& s) {
  try {
    return infoValue(rawCommand(s.host(), s.port(), {"CLUSTER", "INFO"}).str, "cluster_state");
  } catch (const std::exception&) {
    return "";
  }
}

// Polls until every node in `nodes` reports cluster_state `state`; false if not within `timeout`.
bool waitForClusterState(const std::vector<RedisServer*>& nodes, const std::string& state, milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (std::all_of(nodes.begin(), nodes.end(), [&](RedisServer* n) { return clusterState(*n) == state; })) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

}  // namespace

// A hung primary (SIGSTOP, no replica) was learnt per limiter: with 300 limiters almost
// every call was a probe that waited for its command timeout. Now the node's outage is learnt
// once per Client: its limiters are decided by the policy at once, one probe per
// bestEffortRetry reaches the node, and the limiters on the healthy primaries go on deciding
// through Redis.
TEST(Cluster, AHungNodeIsLearntOncePerClientAndHealthyNodesGoOn) {
  RedisCluster cluster(3, 0, milliseconds(1000));
  ClientOptions co;
  co.connection.connectTimeout = milliseconds(1000);  // healthy nodes answer in time on a loaded machine
  co.connection.commandTimeout = milliseconds(1000);  // (each probe of the hung node waits this long)
  co.bestEffortRetry = milliseconds(250);
  auto client = Client::fromUri(cluster.seeds(), co);
  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Allow;
  lo.failure.probeInterval = milliseconds(50);  // each limiter asks often: the node-level gate must absorb it
  constexpr int kLimiters = 300;
  std::vector<RateLimiter> limiters;
  std::vector<int> owner;
  limiters.reserve(kLimiters);
  for (int i = 0; i < kLimiters; ++i) {
    limiters.emplace_back(client, "d29:hung:" + std::to_string(i), lo);
    ASSERT_TRUE(limiters.back().trySetRate(RateType::Overall, 1000000, std::chrono::hours(1)));
    owner.push_back(cluster.primaryOfSlot(detail::keySlot(limiters.back().getName())));
  }
  ASSERT_GT(std::count(owner.begin(), owner.end(), 0), 10);
  ASSERT_GT(std::count(owner.begin(), owner.end(), 1), 10);
  for (auto& rl : limiters) ASSERT_TRUE(rl.tryAcquire());  // scripts loaded everywhere

  RedisServer& hung = cluster.node(0);
  const pid_t pid = pidOf(hung);
  const long long evalBefore = evalshaCalls(hung);
  ASSERT_GE(evalBefore, kLimiters / 10);
  ::kill(pid, SIGSTOP);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{pid};
  for (int i = 0; i < 1000 && processState(pid) != 'T'; ++i) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_EQ(processState(pid), 'T');

  // The outage is learnt from the first call that times out on the node.
  for (int i = 0; i < kLimiters && clusterCountersOf(*client).outages == 0; ++i) {
    if (owner[static_cast<std::size_t>(i)] == 0) {
      EXPECT_TRUE(limiters[static_cast<std::size_t>(i)].tryAcquire());
    }
  }
  ASSERT_EQ(clusterCountersOf(*client).outages, 1u);

  const detail::ClusterCounters before = clusterCountersOf(*client);
  const auto started = Clock::now();
  constexpr int kCalls = 3000;
  int onHung = 0;
  for (int n = 0; n < kCalls; ++n) {
    const auto i = static_cast<std::size_t>(n % kLimiters);
    ASSERT_TRUE(limiters[i].tryAcquire()) << "Allow grants during the outage, Redis grants elsewhere";
    if (owner[i] == 0) ++onHung;
  }
  const auto elapsedMs = std::chrono::duration_cast<milliseconds>(Clock::now() - started).count();
  const detail::ClusterCounters after = clusterCountersOf(*client);
  const auto probes = after.probes - before.probes;
  const auto failedFast = after.failedFast - before.failedFast;

  // One probe per 250 ms for the node (each waits its command timeout), not one per limiter per
  // 50 ms; the rest of the hung node's calls ended at once.
  const auto probeBound = static_cast<std::uint64_t>(elapsedMs / 250 + 2);
  EXPECT_LE(probes, probeBound) << "in " << elapsedMs << " ms";
  EXPECT_GT(failedFast, 0u) << "the limiters' own probes ended at once";
  std::uint64_t allowedOnHealthy = 0;
  std::uint64_t allowedOnHung = 0;
  for (int i = 0; i < kLimiters; ++i) {
    const FailureStats s = limiters[static_cast<std::size_t>(i)].failureStats();
    (owner[static_cast<std::size_t>(i)] == 0 ? allowedOnHung : allowedOnHealthy) += s.allowed;
  }
  // The healthy primaries' limiters were decided by Redis (a stray timeout on a loaded machine aside).
  EXPECT_LE(allowedOnHealthy * 100, static_cast<std::uint64_t>(kCalls - onHung)) << allowedOnHealthy;
  EXPECT_GE(allowedOnHung, static_cast<std::uint64_t>(onHung) - probes);
  EXPECT_EQ(after.outages, 1u) << "one outage, learnt once for the Client";

  // What the node itself saw: the learning calls and the probes, nothing per limiter.
  ::kill(pid, SIGCONT);
  long long evalAfter = -1;
  for (int i = 0; i < 100; ++i) {  // the queued requests are read and run once it runs again
    std::this_thread::sleep_for(milliseconds(50));
    const long long now = evalshaCalls(hung);
    if (now >= 0 && now == evalAfter) break;
    evalAfter = now;
  }
  ASSERT_GE(evalAfter, evalBefore);
  EXPECT_LE(evalAfter - evalBefore, static_cast<long long>(after.probes + 20))
      << "EVALSHA calls the hung node saw while stopped (" << elapsedMs << " ms, " << onHung << " calls to it)";
  std::printf(
      "[ cluster  ] hung node: %d calls in %lld ms, %d on the hung node: %llu probes, %llu failed fast; "
      "the node saw %lld EVALSHA\n",
      kCalls, static_cast<long long>(elapsedMs), onHung, static_cast<unsigned long long>(probes),
      static_cast<unsigned long long>(failedFast), evalAfter - evalBefore);

  // Back: a probe restores the node and its limiters reach Redis again.
  std::size_t firstOnHung = 0;
  while (owner[firstOnHung] != 0) ++firstOnHung;
  RateLimiter& again = limiters[firstOnHung];
  bool back = false;
  for (int i = 0; i < 500 && !back; ++i) {
    (void)again.tryAcquire();
    back = !again.failureStats().degraded;
    if (!back) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(back);
}

// The cluster's own outage: with cluster-require-full-coverage yes, a primary without a
// replica that hangs (SIGSTOP) puts the whole cluster in cluster_state:fail and the healthy
// primaries answer every keyed command with "CLUSTERDOWN The cluster is down". That was retried
// until each call's deadline, per limiter. Now each node's outage is learnt once per Client: all
// limiters are decided by their policy at once, one probe per bestEffortRetry goes to each node,
// and once the cluster is ok again the calls are decided by Redis.
TEST(Cluster, ClusterDownIsLearntOnceAndThePolicyDecides) {
  RedisCluster cluster(3, 0, milliseconds(1000), {"--cluster-require-full-coverage", "yes"});
  for (int i = 0; i < cluster.size(); ++i) {
    const RawReply conf =
        rawCommand(cluster.node(i).host(), cluster.node(i).port(), {"CONFIG", "GET", "cluster-require-full-coverage"});
    ASSERT_EQ(conf.elements.size(), 2u);
    ASSERT_EQ(conf.elements[1].str, "yes") << "node " << i;
  }
  ClientOptions co;
  co.connection.connectTimeout = milliseconds(1000);
  co.connection.commandTimeout = milliseconds(1000);  // each probe of the hung node waits this long
  co.bestEffortRetry = milliseconds(250);
  auto client = Client::fromUri(cluster.seeds(), co);
  RateLimiter::Options lo;
  lo.failure.policy = FailurePolicy::Allow;
  lo.failure.probeInterval = milliseconds(50);  // each limiter asks often: the node-level gate must absorb it
  constexpr int kLimiters = 300;
  std::vector<RateLimiter> limiters;
  std::vector<int> owner;
  limiters.reserve(kLimiters);
  for (int i = 0; i < kLimiters; ++i) {
    limiters.emplace_back(client, "d29:down:" + std::to_string(i), lo);
    ASSERT_TRUE(limiters.back().trySetRate(RateType::Overall, 1000000, std::chrono::hours(1)));
    owner.push_back(cluster.primaryOfSlot(detail::keySlot(limiters.back().getName())));
  }
  for (int p = 0; p < 3; ++p) ASSERT_GT(std::count(owner.begin(), owner.end(), p), 10) << "primary " << p;
  for (auto& rl : limiters) ASSERT_TRUE(rl.tryAcquire());  // scripts loaded everywhere
  // One limiter of rate 1 per primary, for after the outage: Redis grants it once, then denies
  // (the Allow policy never denies).
  std::vector<std::unique_ptr<RateLimiter>> single(3);
  for (int i = 0; std::any_of(single.begin(), single.end(), [](const auto& rl) { return rl == nullptr; }); ++i) {
    ASSERT_LT(i, 1000);
    const std::string name = "d29:down:single:" + std::to_string(i);
    const int p = cluster.primaryOfSlot(detail::keySlot(name));
    if (p < 0 || p > 2 || single[static_cast<std::size_t>(p)] != nullptr) continue;
    single[static_cast<std::size_t>(p)] = std::make_unique<RateLimiter>(client, name, lo);
    ASSERT_TRUE(single[static_cast<std::size_t>(p)]->trySetRate(RateType::Overall, 1, std::chrono::hours(1)));
  }

  RedisServer& hung = cluster.node(0);
  const std::vector<RedisServer*> healthy = {&cluster.node(1), &cluster.node(2)};
  const pid_t pid = pidOf(hung);
  ::kill(pid, SIGSTOP);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{pid};
  ASSERT_TRUE(waitForClusterState(healthy, "fail", milliseconds(20000)))
      << "the healthy primaries did not mark the cluster failed";

  // What the healthy nodes have answered so far (the stopped node cannot be asked).
  auto downAnswers = [&] {
    long long n = 0;
    for (RedisServer* s : healthy) n += infoCount(*s, "errorstats", "errorstat_CLUSTERDOWN", "count");
    return n;
  };
  auto evalshaSeen = [&] {
    long long n = 0;
    for (RedisServer* s : healthy) {
      n += infoCount(*s, "commandstats", "cmdstat_evalsha", "calls") +
           infoCount(*s, "commandstats", "cmdstat_evalsha", "rejected_calls");
    }
    return n;
  };
  const long long downBefore = downAnswers();
  const long long evalshaBefore = evalshaSeen();
  const detail::ClusterCounters before = clusterCountersOf(*client);
  std::uint64_t allowedBefore = 0;
  for (const auto& rl : limiters) allowedBefore += rl.failureStats().allowed;

  // kCalls calls at least, and on until a few node probes went out (each hung-node probe waits
  // its command timeout). The old code spent each call's whole deadline on CLUSTERDOWN retries:
  // the cap ends that far-too-long run (3000 calls of up to 1 s each).
  const auto started = Clock::now();
  const auto cap = started + std::chrono::seconds(60);
  constexpr int kCalls = 3000;
  constexpr std::uint64_t kProbes = 6;
  int calls = 0;
  while ((calls < kCalls || clusterCountersOf(*client).probes - before.probes < kProbes) && Clock::now() < cap) {
    ASSERT_TRUE(limiters[static_cast<std::size_t>(calls % kLimiters)].tryAcquire()) << "Allow grants during the outage";
    ++calls;
  }
  const auto elapsedMs = std::chrono::duration_cast<milliseconds>(Clock::now() - started).count();
  const detail::ClusterCounters after = clusterCountersOf(*client);
  const long long downSeen = downAnswers() - downBefore;
  const long long evalshaCount = evalshaSeen() - evalshaBefore;
  std::uint64_t allowed = 0;
  for (const auto& rl : limiters) allowed += rl.failureStats().allowed;
  allowed -= allowedBefore;
  const auto probes = after.probes - before.probes;
  const auto failedFast = after.failedFast - before.failedFast;

  ASSERT_GE(calls, kCalls) << "in " << elapsedMs << " ms";
  EXPECT_GE(probes, kProbes) << calls << " calls in " << elapsedMs << " ms";
  // Every call was the policy's: no node could decide one.
  EXPECT_EQ(allowed, static_cast<std::uint64_t>(calls));
  // Each node's outage was learnt once (the hung one by a timeout, the others by CLUSTERDOWN).
  EXPECT_EQ(after.outages - before.outages, 3u);
  // At most one probe per 250 ms per node, not one per limiter per 50 ms.
  const auto probeBound = 3 * static_cast<std::uint64_t>(elapsedMs / 250 + 2);
  EXPECT_LE(probes, probeBound) << "in " << elapsedMs << " ms";
  EXPECT_GT(failedFast, 0u);
  // What the healthy nodes saw: the call that taught the Client each one's outage and the probes.
  EXPECT_GE(downSeen, 2);
  EXPECT_LE(downSeen, static_cast<long long>(probes) + 2 + 2) << calls << " calls";
  EXPECT_LE(evalshaCount, static_cast<long long>(probes) + 2 + 2) << calls << " calls";
  std::printf(
      "[ cluster  ] cluster down: %d calls in %lld ms: %llu probes, %llu failed fast; the healthy nodes answered "
      "%lld CLUSTERDOWN, saw %lld EVALSHA\n",
      calls, static_cast<long long>(elapsedMs), static_cast<unsigned long long>(probes),
      static_cast<unsigned long long>(failedFast), downSeen, evalshaCount);

  // Back: once the cluster is ok, a probe restores each node and Redis decides again.
  ::kill(pid, SIGCONT);
  ASSERT_NO_THROW(cluster.waitUntilSettled());
  for (int p = 0; p < 3; ++p) {
    RateLimiter& rl = *single[static_cast<std::size_t>(p)];
    int granted = 0;
    bool denied = false;
    for (int i = 0; i < 500 && !denied; ++i) {
      if (rl.tryAcquire()) {
        ++granted;
        std::this_thread::sleep_for(milliseconds(20));
      } else {
        denied = true;  // only Redis denies: the policy is Allow
      }
    }
    EXPECT_TRUE(denied) << "primary " << p << ": Redis never decided";
    const FailureStats s = rl.failureStats();
    EXPECT_FALSE(s.degraded) << "primary " << p;
    EXPECT_EQ(static_cast<std::uint64_t>(granted) - s.allowed, 1u) << "primary " << p << ": Redis grants rate 1 once";
    EXPECT_EQ(s.denied, 0u) << "primary " << p << ": the denial was Redis's, not the policy's";
  }
}

// A dead first seed failed the first call with "connection refused" although a later seed
// was up; now a request sent before the first slot map goes on to the next seed.
TEST(Cluster, ADeadFirstSeedDoesNotFailTheFirstCall) {
  RedisCluster cluster(3, 0, milliseconds(1000));
  const std::string live = cluster.seeds().substr(std::string("redis-cluster://").size());
  for (int round = 0; round < 3; ++round) {
    const std::string uri = "redis-cluster://127.0.0.1:" + std::to_string(freeLoopbackPort()) + "," + live;
    auto client = Client::fromUri(uri, failoverClientOptions());
    RateLimiter rl(client, "d29:seed:" + std::to_string(round));  // FailurePolicy::Throw
    EXPECT_NO_THROW({ EXPECT_TRUE(rl.trySetRate(RateType::Overall, 10, std::chrono::minutes(1))); }) << uri;
    EXPECT_NO_THROW({ EXPECT_TRUE(rl.tryAcquire()); }) << uri;
    auto keyless = Client::fromUri(uri, failoverClientOptions());
    EXPECT_NO_THROW({ EXPECT_EQ(detail::command(*keyless, {"PING"}).str, "PONG"); }) << uri;
    EXPECT_GE(clusterCountersOf(*keyless).seedsSkipped + clusterCountersOf(*client).seedsSkipped +
                  clusterCountersOf(*client).refreshes,
              1u);
  }
}

// A primary that left the slot map (all its slots given to another)
// kept its transport (connections, I/O thread, epoll, eventfd and timerfd) until the Client went.
// Now it is retired by the refresh that no longer names it and released once no request holds it.
TEST(Cluster, ANodeThatServesNoSlotReleasesItsTransport) {
  RedisCluster cluster(3, 0, milliseconds(1000));
  // Seeds 0 and 1 only: a seed is kept (it is asked for the map), node 2 is learnt from the map.
  const std::string uri = "redis-cluster://127.0.0.1:" + std::to_string(cluster.node(0).port()) +
                          ",127.0.0.1:" + std::to_string(cluster.node(1).port());
  ClientOptions co;
  co.connection.connectTimeout = milliseconds(1000);
  co.connection.commandTimeout = milliseconds(1000);
  auto client = Client::fromUri(uri, co);
  std::string onTwo;
  for (int i = 0; onTwo.empty(); ++i) {
    ASSERT_LT(i, 1000);
    const std::string key = "d29:retire:" + std::to_string(i);
    if (cluster.primaryOfSlot(detail::keySlot(key)) == 2) onTwo = key;
  }
  // Reads only: node 2 holds no key, and its transport is open (a MOVED, or the map, led there).
  for (int i = 0; i < 500 && clusterCountersOf(*client).nodes < 3; ++i) {
    ASSERT_TRUE(detail::command(*client, {"GET", onTwo}).isNil());
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(detail::command(*client, {"GET", onTwo}).isNil());
  ASSERT_EQ(clusterCountersOf(*client).nodes, 3u);
  const std::size_t threadsWith = threadCount();
  const std::size_t fdsWith = openDescriptors();
  const int twoPort = cluster.node(2).port();
  ASSERT_GT(connectionsTo(twoPort), 0U) << "node 2's transport holds a connection";

  cluster.giveAllSlots(2, 1);
  // Calls go on (a MOVED to node 1, then the refresh that retires node 2); wait for the release.
  for (int i = 0; i < 1000 && clusterCountersOf(*client).released == 0; ++i) {
    EXPECT_NO_THROW({ (void)detail::command(*client, {"GET", onTwo}); });
    std::this_thread::sleep_for(milliseconds(20));
  }
  const detail::ClusterCounters c = clusterCountersOf(*client);
  EXPECT_EQ(c.retired, 1u);
  EXPECT_EQ(c.released, 1u);
  EXPECT_EQ(c.nodes, 2u);
  EXPECT_TRUE(detail::command(*client, {"GET", onTwo}).isNil()) << "now served by node 1";
  const std::size_t threadsAfter = threadCount();
  const std::size_t fdsAfter = openDescriptors();
  EXPECT_LT(threadsAfter, threadsWith) << "its I/O thread ended";
  // Its connections are closed. (The count of all descriptors may not fall: node 1 may open one
  // more connection for the calls MOVED to it meanwhile.)
  EXPECT_EQ(connectionsTo(twoPort), 0U) << fdsWith << " descriptors with node 2's transport, " << fdsAfter << " after";
  std::printf("[ cluster  ] cluster node retired: %zu threads -> %zu, %zu descriptors -> %zu\n", threadsWith,
              threadsAfter, fdsWith, fdsAfter);
}

// Every primary switch kept the old primary's transport (its epoll, eventfd and timerfd,
// and its I/O thread) until the Client went; now it is released once shut down.
TEST(Sentinel, SwitchesReleaseTheOldPrimarysTransport) {
  RedisSentinelGroup group(milliseconds(500));
  auto client = Client::fromUri(group.uri(), failoverClientOptions());
  RateLimiter rl(client, "d29:sentinel:fds", denyDuringOutages());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 1000000, std::chrono::hours(1)));
  ASSERT_TRUE(rl.tryAcquire());
  const std::size_t fdsBefore = openDescriptors();
  constexpr int kSwitches = 3;
  for (int k = 0; k < kSwitches; ++k) {
    const int oldPort = group.currentPrimaryPort();
    const auto switches = sentinelCountersOf(*client).switches;
    // Right after a failover the old primary is still syncing as a replica: NOGOODSLAVE until then.
    RawReply r;
    for (int i = 0; i < 200; ++i) {
      r = rawCommand("127.0.0.1", group.sentinelPorts()[0], {"SENTINEL", "FAILOVER", group.primaryName()});
      if (!r.isError()) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_FALSE(r.isError()) << r.str;
    (void)group.waitForFailover(oldPort);
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < until && sentinelCountersOf(*client).switches == switches) {
      (void)rl.tryAcquire();
      std::this_thread::sleep_for(milliseconds(20));
    }
    ASSERT_GT(sentinelCountersOf(*client).switches, switches) << "switch " << k;
    // Calls reach the new primary (its connection opened).
    const auto grantUntil = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < grantUntil && rl.failureStats().degraded) {
      (void)rl.tryAcquire();
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  const std::size_t fdsAfter = openDescriptors();
  EXPECT_LE(fdsAfter, fdsBefore + 2) << kSwitches << " switches: " << fdsBefore << " descriptors before, " << fdsAfter
                                     << " after (3 per retired transport leaked)";
}

// Callers whose request was on the retired transport read "the Client was shut down", and a
// demoted primary's READONLY said "a configuration error, thrown under every failure
// policy" while the Sentinel runner handles it as an outage. Both now say what happened and that a
// retry goes to the new primary.
TEST(Sentinel, ReadonlyOfADemotedPrimaryIsAnOutageAndSaysSo) {
  RedisSentinelGroup group(milliseconds(500));
  auto client = Client::fromUri(group.uri(), failoverClientOptions());
  ASSERT_EQ(detail::command(*client, {"SET", "d29:ro", "1"}).str, "OK");
  // Demote the primary behind the sentinels' back: it answers writes with READONLY.
  const RawReply r = rawCommand(group.primary().host(), group.primary().port(),
                                {"REPLICAOF", group.replica().host(), std::to_string(group.replica().port())});
  ASSERT_FALSE(r.isError()) << r.str;
  try {
    (void)detail::command(*client, {"SET", "d29:ro", "2"});
    ADD_FAILURE() << "a write on a replica succeeded";
  } catch (const IoError& e) {
    const std::string text = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Unavailable) << text;
    EXPECT_EQ(e.code(), "READONLY");
    EXPECT_EQ(text.find("configuration error"), std::string::npos) << text;
    EXPECT_EQ(text.find("every failure policy"), std::string::npos) << text;
    EXPECT_NE(text.find("failure policy"), std::string::npos) << text;
    EXPECT_NE(text.find("READONLY"), std::string::npos) << text;
    EXPECT_NE(text.find("retry"), std::string::npos) << text;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an IoError of kind Unavailable, got " << detail::errorTypeName(e) << ": " << e.what();
  }
}

}  // namespace redlimit::test
