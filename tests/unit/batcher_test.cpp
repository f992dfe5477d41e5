// detail::Batcher, the coalescing queue of every limiter (src/limiters/batcher.hpp): who sends,
// who waits, how groups are cut, and what is left to end.
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "limiters/batcher.hpp"

namespace redlimit::detail {
namespace {

TEST(Batcher, TheFirstCallSendsTheOthersWaitAndLeaveInGroupsInOrder) {
  Batcher<int> b(3, 1);
  int first = 0;
  EXPECT_TRUE(b.claimOrQueue(first)) << "nothing in flight: the caller sends";
  for (int i = 1; i <= 7; ++i) {
    int item = i;
    EXPECT_FALSE(b.claimOrQueue(item)) << i;
  }
  EXPECT_EQ(b.next(), (std::vector<int>{1, 2, 3}));
  int late = 8;
  EXPECT_FALSE(b.claimOrQueue(late)) << "a group is still in flight";
  EXPECT_EQ(b.next(), (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(b.next(), (std::vector<int>{7, 8}));
  EXPECT_TRUE(b.next().empty()) << "nothing waits: nothing in flight any more";
  int again = 9;
  EXPECT_TRUE(b.claimOrQueue(again)) << "the next call sends at once";
}

TEST(Batcher, CallsQueueOnlyWhileEveryPlaceInFlightIsTaken) {
  Batcher<int> b(4, 2);
  int first = 1, second = 2;
  EXPECT_TRUE(b.claimOrQueue(first)) << "one place of two taken: the caller sends";
  EXPECT_TRUE(b.claimOrQueue(second)) << "the second place: this caller sends too";
  for (int i = 3; i <= 7; ++i) {
    int item = i;
    EXPECT_FALSE(b.claimOrQueue(item)) << i;
  }
  EXPECT_EQ(b.next(), (std::vector<int>{3, 4, 5, 6})) << "a group answered: the queued leave in its place";
  EXPECT_EQ(b.next(), (std::vector<int>{7}));
  EXPECT_TRUE(b.next().empty()) << "one of the two places is free again";
  int late = 8;
  EXPECT_TRUE(b.claimOrQueue(late)) << "a free place: sent at once";
  int queued = 9;
  EXPECT_FALSE(b.claimOrQueue(queued)) << "both places taken again";
}

TEST(Batcher, DrainTakesWhatIsQueuedAndLeavesTheGroupInFlight) {
  Batcher<std::unique_ptr<int>> b(64, 1);
  auto a = std::make_unique<int>(1);
  ASSERT_TRUE(b.claimOrQueue(a));
  for (int i = 2; i <= 4; ++i) {
    auto item = std::make_unique<int>(i);
    ASSERT_FALSE(b.claimOrQueue(item));
    EXPECT_EQ(item, nullptr) << "moved into the queue";
  }
  auto left = b.drain();
  ASSERT_EQ(left.size(), 3u);
  EXPECT_EQ(*left.front(), 2);
  EXPECT_TRUE(b.next().empty());
}

TEST(Batcher, ManyThreadsEachItemLeavesExactlyOnce) {
  Batcher<int> b(5, 2);
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<int> sent;  // by whoever holds the right to send, one at a time
  std::mutex m;
  auto sendAll = [&](std::vector<int> group) {
    while (!group.empty()) {
      {
        std::lock_guard<std::mutex> lock(m);
        sent.insert(sent.end(), group.begin(), group.end());
      }
      group = b.next();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int item = t * kPerThread + i;
        if (b.claimOrQueue(item)) sendAll({item});
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(sent.size(), static_cast<std::size_t>(kThreads * kPerThread));
  std::vector<bool> seen(sent.size(), false);
  for (int v : sent) {
    EXPECT_FALSE(seen[static_cast<std::size_t>(v)]) << v;
    seen[static_cast<std::size_t>(v)] = true;
  }
}

}  // namespace
}  // namespace redlimit::detail
