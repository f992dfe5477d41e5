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
// detail::GroupSender sends the groups, the same way for every owner: RateLimiter queues the
// acquisitions of one handle (acquire_batch.lua decides a group); OneKeyBatcher queues the takes of
// every one-key limiter of a Client (batch.lua decides a group, whatever their keys). The owner
// says what "send" means: its own script for a call alone, its batch script for a group.
//
// Fork: a child gets a fresh queue on its first call. The groups in flight are the parent's and
// never finish in the child, its queued calls belong to the parent's callers, and its lock may be
// held by a parent thread that does not exist in the child; the inherited queue is leaked, never
// touched again.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "base/error_mapping.hpp"
#include "base/fork_guard.hpp"
#include "limiters/completion.hpp"
#include "redlimit/client.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "transport/sync_wait.hpp"

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
    if (claimLocked(q)) return true;
    q.waiting.push_back(std::move(item));
    return false;
  }

  /// True: fewer than maxInFlight groups were in flight, and the caller's call is one more, sent now
  /// as a group of one (the caller calls next() once its reply has been handled). False: every place
  /// is taken, and nothing changed.
  bool tryClaim() {
    Queue& q = queue();
    const LockGuard lock(q.mutex);
    return claimLocked(q);
  }

  /// A group in flight has been handled: the next group (oldest first, at most maxGroup), which
  /// takes its place in flight and which the caller sends at once and answers with next() in turn;
  /// empty when nothing waits (one group fewer is in flight).
  std::vector<Item> next() {
    Queue& q = queue();
    const LockGuard lock(q.mutex);
    if (q.waiting.empty() && q.inFlight > 0) --q.inFlight;
    const auto end = q.waiting.begin() + static_cast<std::ptrdiff_t>(std::min(maxGroup_, q.waiting.size()));
    std::vector<Item> group(std::make_move_iterator(q.waiting.begin()), std::make_move_iterator(end));
    q.waiting.erase(q.waiting.begin(), end);
    return group;
  }

  /// What is still queued, taken out (for the owner's destructor to end). Nothing in a fork child
  /// that has not used its queue yet: the inherited calls are the parent's.
  std::deque<Item> drain() {
    Queue* q = queue_.load(std::memory_order_acquire);
    if (q->generation != forkGeneration()) return {};
    const LockGuard lock(q->mutex);
    return std::exchange(q->waiting, {});
  }

 private:
  struct Queue {
    explicit Queue(std::uint64_t g) : generation(g) {}
    const std::uint64_t generation;  // forkGeneration() of the process it serves
    Mutex mutex;
    std::size_t inFlight REDLIMIT_GUARDED_BY(mutex) = 0;  // groups sent and not yet handled
    std::deque<Item> waiting REDLIMIT_GUARDED_BY(mutex);
  };

  // One more group in flight, if a place is free (then the queue is empty: calls queue only while
  // maxInFlight groups are in flight).
  bool claimLocked(Queue& q) REDLIMIT_REQUIRES(q.mutex) {
    if (q.inFlight == maxInFlight_) return false;
    ++q.inFlight;
    return true;
  }

  // This process's queue (made anew after a fork; the inherited one is leaked: see the top).
  Queue& queue() {
    return ofThisProcess(queue_, &Queue::generation, [](Queue*) { return std::make_unique<Queue>(forkGeneration()); });
  }

  const std::size_t maxGroup_;
  const std::size_t maxInFlight_;
  std::atomic<Queue*> queue_{nullptr};
};

/// Sends the groups of a Batcher<std::shared_ptr<Call>> for its owner, written once: a call that
/// finds a place free goes at once, alone, with its own script; a group of queued calls goes as one
/// call of the owner's batch script, with the soonest of their deadlines; the next group leaves as
/// soon as a reply has arrived, before any callback of the group answered runs; a queued call whose
/// deadline passed ends with TimeoutError rather than cut its group's deadline; a send that throws
/// ends its group with that error and lets the next group go. Requests in flight hold the owner
/// weakly: a dropped owner's calls are answered with a null owner, and no next group leaves.
///
/// A Call has `std::chrono::steady_clock::time_point deadline` (a default one: none). The Owner
/// (std::enable_shared_from_this) has:
///   void sendAlone(const std::shared_ptr<Call>&, ReplyCallback)              its own script; may throw
///   void sendTogether(const std::vector<std::shared_ptr<Call>>&, time_point deadline, ReplyCallback)
///                                                                            the batch script; may throw
///   static void answerAlone(Owner*, Call&, const Reply&, std::exception_ptr) noexcept
///       the call's reply, or the error it ends with (then with an empty Reply)
///   static void answerTogether(Owner*, const std::vector<std::shared_ptr<Call>>&, const Reply&)
///       the batch reply to each call, each on its own (one whose callback throws stops no other);
///       throws, before answering any, a reply it cannot read
template <class Owner, class Call>
class GroupSender {
 public:
  using Item = std::shared_ptr<Call>;
  using Queue = Batcher<Item>;

  /// Sends `call` now, alone, or queues it behind the groups in flight on `queue` (the owner's).
  static void submit(Owner& owner, Queue& queue, Item call) {
    if (queue.claimOrQueue(call)) send(owner, queue, {std::move(call)});
  }

  /// submit's form for a caller that waits: when a place is free, `sendHere()` runs on this thread
  /// (it sends the call alone and waits for its reply, as a call without coalescing does: a sync
  /// caller that finds a place pays nothing for the queue), and the next group leaves in its place
  /// once it has returned or thrown; when every place is taken, `queued()` (which submits the call
  /// and waits for its callback). Returns what the one that ran returns.
  template <class SendHere, class Queued>
  static auto submitWaiting(Owner& owner, Queue& queue, SendHere&& sendHere, Queued&& queued) {
    if (!queue.tryClaim()) return std::forward<Queued>(queued)();
    try {
      auto out = std::forward<SendHere>(sendHere)();
      groupDone(owner, queue);
      return out;
    } catch (...) {
      groupDone(owner, queue);
      throw;
    }
  }

  /// Ends the calls still queued on `queue` with `error` (the owner's destructor).
  static void close(Owner& owner, Queue& queue, const std::exception_ptr& error) {
    endAll(&owner, queue.drain(), error);
  }

 private:
  using Time = std::chrono::steady_clock::time_point;

  // A group in flight has been handled: the next one leaves in its place, or the place is freed.
  static void groupDone(Owner& owner, Queue& queue) {
    std::vector<Item> next = queue.next();
    if (!next.empty()) send(owner, queue, std::move(next));
  }

  // Ends each of `calls` with its own copy of `error`.
  template <class Calls>
  static void endAll(Owner* owner, const Calls& calls, const std::exception_ptr& error) {
    for (const Item& c : calls) Owner::answerAlone(owner, *c, Reply{}, cloneError(error));
  }

  static void send(Owner& owner, Queue& queue, std::vector<Item> group) {
    const Time now = std::chrono::steady_clock::now();
    auto live = std::make_shared<std::vector<Item>>(std::move(group));  // the calls still in time, kept in place
    std::size_t kept = 0;
    Time deadline = Time::max();
    for (Item& c : *live) {
      if (c->deadline != Time{} && c->deadline <= now) {
        Owner::answerAlone(
            &owner, *c, Reply{},
            std::make_exception_ptr(TimeoutError(
                "redlimit: a decision waited for the calls queued before it until its deadline passed; give "
                "the calls more time (ClientOptions::Connection::commandTimeout) or send fewer at once")));
        continue;
      }
      if (c->deadline != Time{}) deadline = std::min(deadline, c->deadline);
      std::swap((*live)[kept++], c);
    }
    live->resize(kept);
    if (live->empty()) return groupDone(owner, queue);
    auto done = [weak = owner.weak_from_this(), q = &queue, live](const Reply& reply, std::exception_ptr error) {
      const std::shared_ptr<Owner> self = weak.lock();
      if (self) groupDone(*self, *q);  // the next group leaves before any callback of this one runs
      if (live->size() == 1) return Owner::answerAlone(self.get(), *live->front(), reply, std::move(error));
      // answerTogether throws before it answers any call
      if (!error) error = thrownBy([&] { Owner::answerTogether(self.get(), *live, reply); });
      if (error) endAll(self.get(), *live, error);
    };
    try {
      if (live->size() == 1) {
        owner.sendAlone(live->front(), std::move(done));
      } else {
        owner.sendTogether(*live, deadline == Time::max() ? Time{} : deadline, std::move(done));
      }
    } catch (...) {
      // The request could not even be queued: each call of the group ends with that error, and the
      // next group goes, as after a reply.
      const std::exception_ptr error = std::current_exception();
      groupDone(owner, queue);
      endAll(&owner, *live, error);
    }
  }
};

/// A sync call whose try may queue: `start(callback)` sends it (or queues it), and this waits for
/// the callback. The try ends by `deadline` (one waiting for a connection gets the connect time on
/// top); a second later the wait gives up with TimeoutError rather than hang.
template <class T, class Start>
T awaitTry(const ClientOptions& options, std::chrono::steady_clock::time_point deadline, Start&& start) {
  SyncWait<T> wait;
  std::forward<Start>(start)(wait.callback());
  return wait.get(deadlineAfter<std::chrono::steady_clock>(
      deadline, saturatingAdd(options.connection.connectTimeout, std::chrono::milliseconds{1000})));
}

}  // namespace redlimit::detail
