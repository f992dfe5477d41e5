// detail::Batcher, the coalescing queue of every limiter (src/limiters/batcher.hpp): who sends,
// who waits, how groups are cut, and what is left to end; and detail::GroupSender, which sends the
// groups for RateLimiter and the one-key limiters alike, driven here by an owner that keeps what
// it was asked to send and answers when the test says so.
#include <chrono>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "limiters/batcher.hpp"
#include "redlimit/errors.hpp"

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

// ----- GroupSender --------------------------------------------------------------------------------

namespace group_sender {  // its own names in the unity build

using Time = std::chrono::steady_clock::time_point;

// A call and what it was answered.
struct TestCall {
  int id = 0;
  Time deadline;
  int answers = 0;
  std::int64_t value = -1;  // the reply's integer
  std::exception_ptr error;
  std::size_t sentBefore = 0;  // the sends its owner had made when it was answered
};
using Call = std::shared_ptr<TestCall>;

// An owner whose sends are kept for the test to answer: a call alone is answered an integer, a
// group an array of one integer per call.
class TestOwner : public std::enable_shared_from_this<TestOwner> {
 public:
  using Sender = GroupSender<TestOwner, TestCall>;
  struct Sent {
    std::vector<int> ids;
    Time deadline;
    ReplyCallback done;
  };

  explicit TestOwner(std::size_t maxInFlight) : queue_(64, maxInFlight) {}
  ~TestOwner() { Sender::close(*this, queue_, std::make_exception_ptr(ClosedError("the owner is gone"))); }
  TestOwner(const TestOwner&) = delete;
  TestOwner& operator=(const TestOwner&) = delete;

  Call submit(int id, Time deadline = Time::max()) {
    auto c = std::make_shared<TestCall>();
    c->id = id;
    c->deadline = deadline;
    Sender::submit(*this, queue_, c);
    return c;
  }
  // Answers the i-th send.
  void answer(std::size_t i, const Reply& reply, std::exception_ptr error = nullptr) {
    ReplyCallback done = std::move(sent.at(i).done);
    done(reply, std::move(error));
  }

  void sendAlone(const Call& c, ReplyCallback done) { sendTogether({c}, c->deadline, std::move(done)); }
  void sendTogether(const std::vector<Call>& group, Time deadline, ReplyCallback done) {
    if (throwOnSend) throw IoError("the send throws");
    Sent s{{}, deadline, std::move(done)};
    for (const Call& c : group) s.ids.push_back(c->id);
    sent.push_back(std::move(s));
  }
  static void answerAlone(TestOwner* self, TestCall& c, const Reply& r, std::exception_ptr error) noexcept {
    ++c.answers;
    c.value = error ? -1 : r.integer;
    c.error = std::move(error);
    c.sentBefore = self != nullptr ? self->sent.size() : 0;
  }
  static void answerTogether(TestOwner* self, const std::vector<Call>& group, const Reply& r) {
    if (r.type != Reply::Type::Array || r.elements.size() != group.size())
      throw ReplyError(ErrorKind::UnexpectedReply, "", "unreadable");
    for (std::size_t i = 0; i < group.size(); ++i) answerAlone(self, *group[i], r.elements[i], nullptr);
  }

  bool throwOnSend = false;
  std::vector<Sent> sent;

 private:
  Sender::Queue queue_;
};

Reply integer(std::int64_t v) {
  Reply r;
  r.type = Reply::Type::Integer;
  r.integer = v;
  return r;
}

Reply integers(std::initializer_list<std::int64_t> values) {
  Reply r;
  r.type = Reply::Type::Array;
  for (std::int64_t v : values) r.elements.push_back(integer(v));
  return r;
}

template <class E>
bool endedWith(const Call& c) {
  if (c->answers != 1 || !c->error) return false;
  try {
    std::rethrow_exception(c->error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

TEST(GroupSender, ALoneCallGoesAloneAndTheQueuedOnesLeaveTogetherBeforeItsCallbackRuns) {
  auto owner = std::make_shared<TestOwner>(1);
  const Call first = owner->submit(1);
  ASSERT_EQ(owner->sent.size(), 1u) << "nothing in flight: sent at once";
  std::vector<Call> queued;
  for (int id = 2; id <= 4; ++id) queued.push_back(owner->submit(id));
  ASSERT_EQ(owner->sent.size(), 1u) << "queued behind the call in flight";
  owner->answer(0, integer(10));
  ASSERT_EQ(owner->sent.size(), 2u);
  EXPECT_EQ(owner->sent[1].ids, (std::vector<int>{2, 3, 4})) << "one group, in order";
  EXPECT_EQ(first->answers, 1);
  EXPECT_EQ(first->value, 10);
  EXPECT_EQ(first->sentBefore, 2u) << "the next group left before the callback ran";
  owner->answer(1, integers({20, 30, 40}));
  for (std::size_t i = 0; i < queued.size(); ++i) {
    EXPECT_EQ(queued[i]->answers, 1) << i;
    EXPECT_EQ(queued[i]->value, static_cast<std::int64_t>(i + 2) * 10) << i;
  }
  (void)owner->submit(5);
  EXPECT_EQ(owner->sent.size(), 3u) << "the place is free again: sent at once";
}

TEST(GroupSender, AQueuedCallWhoseDeadlinePassedEndsAloneAndDoesNotCutItsGroupsDeadline) {
  auto owner = std::make_shared<TestOwner>(1);
  const Time later = std::chrono::steady_clock::now() + std::chrono::hours(1);
  (void)owner->submit(1, later);
  const Call expired = owner->submit(2, Time{} + std::chrono::nanoseconds(1));  // long past
  (void)owner->submit(3, later + std::chrono::seconds(2));
  (void)owner->submit(4, later + std::chrono::seconds(1));
  owner->answer(0, integer(1));
  ASSERT_EQ(owner->sent.size(), 2u);
  EXPECT_EQ(owner->sent[1].ids, (std::vector<int>{3, 4}));
  EXPECT_EQ(owner->sent[1].deadline, later + std::chrono::seconds(1)) << "the soonest deadline of the calls sent";
  EXPECT_TRUE(endedWith<TimeoutError>(expired));
}

TEST(GroupSender, AGroupWhoseCallsAreAllLateIsNotSentAndItsPlaceIsFree) {
  auto owner = std::make_shared<TestOwner>(1);
  (void)owner->submit(1);
  const Call late = owner->submit(2, Time{} + std::chrono::nanoseconds(1));  // long past
  owner->answer(0, integer(1));
  EXPECT_TRUE(endedWith<TimeoutError>(late));
  ASSERT_EQ(owner->sent.size(), 1u) << "nothing left to send";
  (void)owner->submit(3);
  EXPECT_EQ(owner->sent.size(), 2u) << "sent at once: the place is free";
}

TEST(GroupSender, ASendThatThrowsEndsItsGroupAndTheNextGroupGoes) {
  auto owner = std::make_shared<TestOwner>(1);
  (void)owner->submit(1);
  const Call second = owner->submit(2);
  const Call third = owner->submit(3);
  owner->throwOnSend = true;
  owner->answer(0, integer(1));  // [2, 3] leaves and its send throws
  EXPECT_TRUE(endedWith<IoError>(second));
  EXPECT_TRUE(endedWith<IoError>(third));
  owner->throwOnSend = false;
  (void)owner->submit(4);
  ASSERT_EQ(owner->sent.size(), 2u) << "the place of the group that could not be sent is free";
  EXPECT_EQ(owner->sent[1].ids, (std::vector<int>{4}));
}

TEST(GroupSender, AnUnreadableReplyOrAnErrorEndsEveryCallOfItsGroup) {
  auto owner = std::make_shared<TestOwner>(1);
  (void)owner->submit(1);
  const std::vector<Call> unread{owner->submit(2), owner->submit(3)};
  owner->answer(0, integer(1));
  const std::vector<Call> failed{owner->submit(4), owner->submit(5)};
  owner->answer(1, integer(7));  // not an array of two
  for (const Call& c : unread) EXPECT_TRUE(endedWith<ReplyError>(c)) << c->id;
  owner->answer(2, Reply{}, std::make_exception_ptr(IoError("lost")));
  for (const Call& c : failed) EXPECT_TRUE(endedWith<IoError>(c)) << c->id;
}

TEST(GroupSender, CallsStillQueuedWhenTheOwnerGoesEndWithItsErrorAndTheOneInFlightWithItsReply) {
  auto owner = std::make_shared<TestOwner>(1);
  const Call inFlight = owner->submit(1);
  const Call queued = owner->submit(2);
  ReplyCallback reply = std::move(owner->sent[0].done);
  owner.reset();
  EXPECT_TRUE(endedWith<ClosedError>(queued));
  EXPECT_EQ(inFlight->answers, 0);
  reply(integer(5), nullptr);  // no owner: answered with a null owner, nothing else leaves
  EXPECT_EQ(inFlight->answers, 1);
  EXPECT_EQ(inFlight->value, 5);
}

}  // namespace group_sender
}  // namespace
}  // namespace redlimit::detail
