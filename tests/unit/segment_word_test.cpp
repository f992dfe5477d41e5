// detail::SegmentWord (segment_word.hpp), alone: the packed word's pure operations, the hot
// path's checks, and that concurrent takers never take a permit twice.
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/detail/segment_word.hpp"

namespace {

using redlimit::detail::SegmentWord;

static_assert(sizeof(SegmentWord) == redlimit::detail::kCacheLine &&
                  alignof(SegmentWord) == redlimit::detail::kCacheLine,
              "the word and its deadline fill one cache line of their own");
static_assert(SegmentWord::leftOf(SegmentWord::pack(7, 42)) == 42 && SegmentWord::genOf(SegmentWord::pack(7, 42)) == 7);
static_assert(SegmentWord::nextGen(0) == 1 && SegmentWord::nextGen(1) == 2);
static_assert(SegmentWord::nextGen(SegmentWord::kClosedGen - 1) == 1, "the generation skips the closed marker");
static_assert(SegmentWord::nextGen(SegmentWord::kClosedGen) == 1);
static_assert(noexcept(std::declval<SegmentWord&>().takeAll()) && noexcept(std::declval<SegmentWord&>().putBack(1)));

TEST(SegmentWord, AnEmptyWordGrantsNothingAndDoesNotReadTheClock) {
  SegmentWord w;
  int reads = 0;
  EXPECT_FALSE(w.tryTake(1, [&] { return ++reads, std::int64_t{0}; }));
  EXPECT_EQ(reads, 0);
  EXPECT_EQ(w.left(), 0);
  EXPECT_FALSE(w.closed());
}

TEST(SegmentWord, TakesWhileItHoldsEnoughAndBeforeTheDeadline) {
  SegmentWord w;
  w.install(w.takeAll(), 5, 1000);
  EXPECT_EQ(SegmentWord::genOf(w.load()), 1u);
  EXPECT_EQ(w.deadline(), 1000);
  EXPECT_TRUE(w.tryTake(3, [] { return std::int64_t{999}; }));
  EXPECT_FALSE(w.tryTake(3, [] { return std::int64_t{0}; })) << "2 left";
  EXPECT_FALSE(w.tryTake(1, [] { return std::int64_t{1000}; })) << "the deadline itself is expired";
  EXPECT_TRUE(w.expiredAt(1000));
  EXPECT_FALSE(w.expiredAt(999));
  EXPECT_TRUE(w.tryTake(2, [] { return std::int64_t{10}; }));
  EXPECT_EQ(w.left(), 0);
}

TEST(SegmentWord, TakeAllKeepsTheGenerationAndPutBackRestores) {
  SegmentWord w;
  w.install(w.takeAll(), 9, 50);
  const std::uint64_t old = w.takeAll();
  EXPECT_EQ(SegmentWord::leftOf(old), 9);
  EXPECT_EQ(w.load(), SegmentWord::pack(1, 0));
  w.putBack(4);
  EXPECT_EQ(w.load(), SegmentWord::pack(1, 4));
  w.putBack(0);
  w.putBack(-3);
  EXPECT_EQ(w.left(), 4) << "nothing or a negative count puts nothing back";
  w.install(w.takeAll(), SegmentWord::kMaxLeft, 60);
  EXPECT_EQ(w.load(), SegmentWord::pack(2, 0xFFFFFFFFu));
}

TEST(SegmentWord, CloseEmptiesTheWordForGood) {
  SegmentWord w;
  w.install(w.takeAll(), 3, 100);
  EXPECT_EQ(SegmentWord::leftOf(w.close()), 3);
  EXPECT_TRUE(w.closed());
  EXPECT_EQ(w.left(), 0);
  EXPECT_FALSE(w.tryTake(1, [] { return std::int64_t{0}; }));
}

// Four threads take single permits from one word while the leader empties and refills it: the
// permits taken plus those the leader took back equal those installed (run under TSan too).
TEST(SegmentWord, ConcurrentTakersNeverTakeAPermitTwice) {
  SegmentWord w;
  constexpr std::int64_t kSegment = 1000;
  constexpr int kRefills = 200;
  std::atomic<std::int64_t> taken{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> takers;
  for (int t = 0; t < 4; ++t) {
    takers.emplace_back([&] {
      std::int64_t mine = 0;
      while (!done.load(std::memory_order_relaxed)) mine += w.tryTake(1, [] { return std::int64_t{0}; }) ? 1 : 0;
      taken += mine;
    });
  }
  std::int64_t installed = 0, takenBack = 0;
  for (int i = 0; i < kRefills; ++i) {
    const std::uint64_t old = w.takeAll();
    takenBack += SegmentWord::leftOf(old);
    w.install(old, kSegment, 1);
    installed += kSegment;
    std::this_thread::yield();
  }
  done = true;
  for (auto& t : takers) t.join();
  takenBack += SegmentWord::leftOf(w.takeAll());
  EXPECT_EQ(taken.load() + takenBack, installed);
  EXPECT_EQ(SegmentWord::genOf(w.load()), static_cast<std::uint32_t>(kRefills));
}

}  // namespace
