// detail::Batcher: the coalescing queue of every limiter. Up to maxInFlight groups of calls may be
// in flight at once; a call that finds fewer goes alone at once, so a lone caller, and callers no
// more numerous than the groups allowed in flight, wait for nobody. Calls that arrive while
// maxInFlight groups are in flight queue up; when one of those groups has been handled, the owner
// takes the next group (the oldest queued calls, at most maxGroup) and sends it as one request.
// Calls queue only while the bound holds them back: a queue is never left waiting with a place
// free.
//
// maxInFlight is kGroupsPerConnection times the connections the owner's requests spread over.
// Groups in flight together may be decided in either order, as one-by-one calls pipelined on the
// pool would be; each group is still decided in its calls' order, and with maxInFlight 1 the
// groups are decided in the order of their calls.
//
// RateLimiter queues the acquisitions of one handle (acquire_batch.lua decides a group);
// OneKeyBatcher queues the takes of every one-key limiter of a Client (batch.lua decides a group,
// whatever their keys). The owner decides what "send" means; the Batcher only keeps the queue.
//
// Fork: a child gets a fresh queue on its first call. The groups in flight are the parent's and
// never finish in the child, its queued calls belong to the parent's callers, and its lock may be
// held by a parent thread that does not exist in the child; the inherited queue is leaked, never
// touched again.
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
#include "redlimit/options.hpp"

namespace redlimit::detail {

/// Groups a Batcher keeps in flight on each connection of its pool (pipelined behind each other).
/// With one, 8 sync callers on the default pool of 2 made 0.76 of their one-by-one decisions/s
/// (bench_transport row 6); with 4 they wait for nobody, and 256 async calls in flight still
/// leave in groups (row 8: 2.9-3.7x one by one).
inline constexpr std::size_t kGroupsPerConnection = 4;

/// The groups a Batcher of a Client's requests keeps in flight: kGroupsPerConnection per connection
/// of its pool (on a cluster, of the pool of the node that serves the queue's slot).
inline std::size_t groupsInFlight(const ClientOptions& options) { return options.pool.size * kGroupsPerConnection; }

template <class Item>
class Batcher {
 public:
  /// maxGroup, maxInFlight >= 1.
  Batcher(std::size_t maxGroup, std::size_t maxInFlight)
      : maxGroup_(std::max<std::size_t>(1, maxGroup)), maxInFlight_(std::max<std::size_t>(1, maxInFlight)) {
    queue_.store(new Queue(forkGeneration()), std::memory_order_release);
  }
  ~Batcher() {
    Queue* q = queue_.load(std::memory_order_acquire);
    if (q->generation == forkGeneration()) delete q;  // else: a fork child's copy, leaked (see above)
  }
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// True: fewer than maxInFlight groups were in flight (so nothing was queued); the caller sends
  /// `item` now, as a group of one, and calls next() once its reply has been handled. False: `item`
  /// was moved into the queue behind the groups in flight.
  bool claimOrQueue(Item& item) {
    Queue& q = queue();
    const LockGuard lock(q.mutex);
    if (q.inFlight == maxInFlight_) {
      q.waiting.push_back(std::move(item));
      return false;
    }
    ++q.inFlight;  // the queue is empty: calls queue only while maxInFlight groups are in flight
    return true;
  }

  /// A group in flight has been handled: the next group (oldest first, at most maxGroup), which
  /// takes its place in flight and which the caller sends at once and answers with next() in turn;
  /// empty when nothing waits (one group fewer is in flight).
  std::vector<Item> next() {
    std::vector<Item> group;
    Queue& q = queue();
    const LockGuard lock(q.mutex);
    if (q.waiting.empty()) {
      if (q.inFlight > 0) --q.inFlight;
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
    std::size_t inFlight REDLIMIT_GUARDED_BY(mutex) = 0;  // groups sent and not yet handled
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
  const std::size_t maxInFlight_;
  std::atomic<Queue*> queue_{nullptr};
};

}  // namespace redlimit::detail
