// Redis Cluster: limiters on a real 3-primary cluster (tests/support/redis_cluster.cpp) routed by
// their slot, across a live resharding, and with names that must share a slot.
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cluster.hpp"
#include "key_slot.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"
#include "redlimit_test/redis_cluster.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;
using detail::Reply;

std::shared_ptr<Client> clusterClient(const RedisCluster& cluster, ClientOptions base = {}) {
  return Client::fromUri(cluster.seeds(), std::move(base));
}

detail::ClusterCounters clusterCountersOf(Client& c) {
  auto* runner = dynamic_cast<detail::ClusterRunner*>(&detail::ClientAccess::runner(c));
  if (runner == nullptr) throw std::runtime_error("not a cluster client");
  return runner->clusterCounters();
}

std::int64_t zcard(Client& c, const std::string& key) { return detail::command(c, {"ZCARD", key}).asInteger(); }

// Members of a limiter's permits log (one per grant of 1 permit), read through the cluster client.
std::int64_t grantsInRedis(Client& c, const RateLimiter& rl) { return zcard(c, rl.keys()[3]); }

TEST(Cluster, ThousandLimitersOverEverySlotHoldTheirRateWithNoRedirectReachingACaller) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  constexpr int kLimiters = 1000;
  constexpr std::int64_t kRate = 3;
  std::vector<RateLimiter> limiters;
  std::vector<int> slotsUsed(3, 0);
  limiters.reserve(kLimiters);
  for (int i = 0; i < kLimiters; ++i) {
    limiters.emplace_back(client, "cl:" + std::to_string(i));
    ASSERT_TRUE(limiters.back().trySetRate(RateType::Overall, kRate, std::chrono::minutes(10)));
  }
  for (int i = 0; i < kLimiters; i += 50) {
    slotsUsed[static_cast<std::size_t>(cluster.primaryOfSlot(detail::keySlot(limiters[static_cast<std::size_t>(i)].getName())))]++;
  }
  for (int n : slotsUsed) EXPECT_GT(n, 0) << "the names should spread over all three primaries";

  // 8 threads, each over every limiter in its own order, 2 rounds: 16 attempts per limiter.
  std::vector<std::atomic<std::int64_t>> granted(kLimiters);
  std::atomic<int> errors{0};
  std::string firstError;
  std::mutex errorMutex;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 2; ++round) {
        for (int k = 0; k < kLimiters; ++k) {
          const std::size_t i = static_cast<std::size_t>((k * 7 + t * 131) % kLimiters);
          try {
            if (limiters[i].tryAcquire()) granted[i].fetch_add(1);
          } catch (const std::exception& e) {
            if (errors.fetch_add(1) == 0) {
              std::lock_guard<std::mutex> lock(errorMutex);
              firstError = e.what();
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0) << firstError;
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
  auto client = clusterClient(cluster);
  RateLimiter hot(client, "hot");
  constexpr std::int64_t kRate = 400;
  ASSERT_TRUE(hot.trySetRate(RateType::Overall, kRate, std::chrono::minutes(10)));
  const int slot = detail::keySlot("hot");
  const int from = cluster.primaryOfSlot(slot);
  const int to = (from + 1) % 3;

  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> granted{0}, denied{0};
  std::atomic<int> errors{0};
  std::string firstError;
  std::mutex errorMutex;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        try {
          (hot.tryAcquire() ? granted : denied).fetch_add(1);
        } catch (const std::exception& e) {
          if (errors.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> lock(errorMutex);
            firstError = e.what();
          }
        }
      }
    });
  }
  // Let traffic run, move the slot in steps while it runs, and let it run on the new owner.
  while (granted.load() < kRate / 4) std::this_thread::yield();
  cluster.beginMigration(slot, from, to);
  std::this_thread::sleep_for(milliseconds(20));
  cluster.migrateKeys(slot, from, to);
  std::this_thread::sleep_for(milliseconds(20));
  cluster.finishMigration(slot, from, to);
  const std::int64_t grantedBeforeEnd = granted.load();
  while (granted.load() + denied.load() < grantedBeforeEnd + 2000 && granted.load() < kRate) {
    std::this_thread::yield();
  }
  std::this_thread::sleep_for(milliseconds(50));
  stop = true;
  for (auto& th : threads) th.join();

  EXPECT_EQ(errors.load(), 0) << firstError;
  EXPECT_EQ(cluster.primaryOfSlot(slot), to);
  EXPECT_LE(granted.load(), kRate);
  EXPECT_EQ(grantsInRedis(*client, hot), granted.load());
  const detail::ClusterCounters c = clusterCountersOf(*client);
  EXPECT_GE(c.moved + c.asked, 1u) << "the move should have been seen by redirects";
  std::printf("[ cluster  ] during the move: %lld granted, %lld denied, %llu ASK, %llu MOVED, %llu retried\n",
              static_cast<long long>(granted.load()), static_cast<long long>(denied.load()),
              static_cast<unsigned long long>(c.asked), static_cast<unsigned long long>(c.moved),
              static_cast<unsigned long long>(c.retried));
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

TEST(Cluster, OneKeyLimitersRouteByTheirKey) {
  RedisCluster cluster(3);
  auto client = clusterClient(cluster);
  std::vector<TokenBucketRateLimiter> buckets;
  for (int i = 0; i < 30; ++i) {
    buckets.emplace_back(client, "tb:" + std::to_string(i));
  }
  TokenBucketConfig config;
  config.capacity = 2;
  config.refillPermits = 1;
  config.refillInterval = std::chrono::minutes(1);
  for (auto& b : buckets) {
    ASSERT_TRUE(b.trySetConfig(config));
    EXPECT_TRUE(b.tryAcquire());
    EXPECT_TRUE(b.tryAcquire());
    EXPECT_FALSE(b.tryAcquire());
  }
}

}  // namespace
}  // namespace redlimit::test
