// detail::Batcher: the coalescing queue of every limiter. While one group of calls is in flight,
// the calls that arrive queue up behind it; when its reply has been handled, the owner takes the
// next group (the oldest queued calls, at most maxGroup) and sends it as one request. A call that
// finds nothing in flight goes alone at once, so a lone caller waits for nobody.
//
// RateLimiter queues the acquisitions of one handle (acquire_batch.lua decides a group);
// OneKeyBatcher queues the takes of every one-key limiter of a Client (batch.lua decides a group,
// whatever their keys). The owner decides what "send" means; the Batcher only keeps the queue.
//
// Fork: a child gets a fresh queue on its first call. The inherited group in flight is the
// parent's and never finishes in the child, its queued calls belong to the parent's callers, and
// its lock may be held by a parent thread that does not exist in the child; the inherited queue is
// leaked, never touched again.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/fork_guard.hpp"
#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

template <class Item>
class Batcher {
 public:
  explicit Batcher(std::size_t maxGroup) : maxGroup_(maxGroup) {
    queue_.store(new Queue(forkGeneration()), std::memory_order_release);
  }
  ~Batcher() {
    Queue* q = queue_.load(std::memory_order_acquire);
    if (q->generation == forkGeneration()) delete q;  // else: a fork child's copy, leaked (see above)
  }
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// True: nothing was in flight; the caller sends `item` now and calls next() once its reply has
  /// been handled. False: `item` was moved into the queue behind the group in flight.
  bool claimOrQueue(Item& item) {
    Queue& q = queue();
    const LockGuard lock(q.mutex);
    if (q.inFlight) {
      q.waiting.push_back(std::move(item));
      return false;
    }
    q.inFlight = true;
    return true;
  }

  /// The group in flight has been handled: the next group (oldest first, at most maxGroup), which
  /// the caller sends at once and answers with next() in turn; empty when nothing waits (nothing is
  /// in flight any more).
  std::vector<Item> next() {
    std::vector<Item> group;
    Queue& q = queue();
    const LockGuard lock(q.mutex);
    if (q.waiting.empty()) {
      q.inFlight = false;
      return group;
    }
    group.reserve(std::min(maxGroup_, q.waiting.size()));
    while (!q.waiting.empty() && group.size() < maxGroup_) {
      group.push_back(std::move(q.waiting.front()));
      q.waiting.pop_front();
    }
    return group;
  }

  /// What is still queued, taken out (for the owner's destructor to end). Nothing in a fork child
  /// that has not used its queue yet: the inherited calls are the parent's.
  std::deque<Item> drain() {
    std::deque<Item> left;
    Queue* q = queue_.load(std::memory_order_acquire);
    if (q->generation != forkGeneration()) return left;
    const LockGuard lock(q->mutex);
    left.swap(q->waiting);
    return left;
  }

  [[nodiscard]] std::size_t maxGroup() const noexcept { return maxGroup_; }

 private:
  struct Queue {
    explicit Queue(std::uint64_t g) : generation(g) {}
    const std::uint64_t generation;  // forkGeneration() of the process it serves
    Mutex mutex;
    bool inFlight REDLIMIT_GUARDED_BY(mutex) = false;
    std::deque<Item> waiting REDLIMIT_GUARDED_BY(mutex);
  };

  // This process's queue (made anew after a fork).
  Queue& queue() {
    Queue* q = queue_.load(std::memory_order_acquire);
    const std::uint64_t generation = forkGeneration();
    if (q->generation == generation) return *q;
    static std::mutex renew;  // as Client::startAfterFork's: a child's threads start after the fork
    const std::lock_guard<std::mutex> lock(renew);
    q = queue_.load(std::memory_order_acquire);
    if (q->generation != generation) {
      q = new Queue(generation);  // the inherited one is leaked: see the top of this file
      queue_.store(q, std::memory_order_release);
    }
    return *q;
  }

  const std::size_t maxGroup_;
  std::atomic<Queue*> queue_{nullptr};
};

}  // namespace redlimit::detail
