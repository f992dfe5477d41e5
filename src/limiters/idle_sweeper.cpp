#include "redlimit/detail/idle_sweeper.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "base/fork_guard.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

namespace {

// Ids of every sweeper of the process and of its fork() children (inherited with its value), so
// that an id a parent's sweeper gave out is never given out again by the child's.
std::atomic<std::uint64_t> gNextId{1};

}  // namespace

IdleSweeper& IdleSweeper::instance() {
  // Never destroyed: a limiter in a global holder was constructed before this and is destroyed
  // after anything constructed later, so it must still find the registry. The stopper (made
  // after the registry, destroyed before such limiters) ends the thread at exit instead.
  //
  // One per process: a fork() child inherits its parent's sweeper without its thread, and
  // possibly with its lock held by a thread that does not exist there. The child's first call
  // makes a sweeper of its own (no lock: the first thread to swap its fresh one in wins) and
  // leaks the inherited one, never touching it; the stopper stops only this process's sweeper.
  static std::atomic<IdleSweeper*> current{nullptr};
  static const struct Stopper {
    ~Stopper() {
      IdleSweeper* const sweeper = current.load(std::memory_order_acquire);
      if (sweeper != nullptr && sweeper->generation_ == forkGeneration()) sweeper->stop();
    }
  } stopper;
  return ofThisProcess(current, &IdleSweeper::generation_, [](IdleSweeper* inherited) {
    auto fresh = std::make_unique<IdleSweeper>();
    fresh->inherited_ = inherited;  // never used again
    return fresh;
  });
}

IdleSweeper::IdleSweeper(StartThread start) : start_(std::move(start)), generation_(forkGeneration()) {}

IdleSweeper::~IdleSweeper() { stop(); }

void IdleSweeper::stop() {
  std::thread thread;
  {
    const LockGuard lk(mutex_);
    stopping_ = true;
    thread.swap(thread_);
  }
  wake_.notify_all();
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();  // stopped by one of its own tasks (exit() from a task): cannot join itself
  } else {
    thread.join();
  }
}

std::uint64_t IdleSweeper::add(void* owner, Task task) {
  const LockGuard lk(mutex_);
  if (!thread_.joinable() && !stopping_) {
    try {
      thread_ = start_ ? start_([this] { run(); }) : std::thread([this] { run(); });
      threadId_ = thread_.get_id();
    } catch (const std::system_error& e) {
      throw Error(fmt::format("redlimit: cannot start the thread that gives back idle segments and renews leases: {}",
                              e.what()));
    }
  }
  const std::uint64_t id = gNextId.fetch_add(1, std::memory_order_relaxed);
  entries_.emplace(id, Entry{owner, task});
  return id;
}

void IdleSweeper::scheduleLocked(std::uint64_t id, Entry& e, Time due) {
  if (e.queued) {
    if (e.due <= due) return;
    queue_.erase({e.due, id});
  }
  e.due = due;
  e.queued = true;
  queue_.emplace(due, id);
  if (queue_.begin()->second == id) wake_.notify_one();  // the thread may sleep until a later time
}

void IdleSweeper::schedule(std::uint64_t id, std::chrono::microseconds delay) {
  const Time due = std::chrono::steady_clock::now() + std::max(delay, std::chrono::microseconds{0});
  const LockGuard lk(mutex_);
  const auto it = entries_.find(id);
  if (it != entries_.end()) scheduleLocked(id, it->second, due);
}

void IdleSweeper::remove(std::uint64_t id) {
  UniqueLock lk(mutex_);
  const auto it = entries_.find(id);
  if (it != entries_.end()) {
    if (it->second.queued) queue_.erase({it->second.due, id});
    entries_.erase(it);
  }
  if (threadId_ == std::this_thread::get_id()) return;  // from a task: never wait for ourselves
  done_.wait(lk.native(), [&] {
    mutex_.assertHeld();
    return running_ != id;
  });
}

std::size_t IdleSweeper::size() const {
  const LockGuard lk(mutex_);
  return entries_.size();
}

std::uint64_t IdleSweeper::runs() const {
  const LockGuard lk(mutex_);
  return runs_;
}

void IdleSweeper::run() {
  UniqueLock lk(mutex_);
  while (!stopping_) {
    if (queue_.empty()) {
      wake_.wait(lk.native());
      continue;
    }
    const auto [due, id] = *queue_.begin();
    if (std::chrono::steady_clock::now() < due) {
      wake_.wait_until(lk.native(), due);
      continue;
    }
    queue_.erase(queue_.begin());
    Entry& e = entries_.at(id);  // queued entries are registered: remove() unqueues them
    e.queued = false;
    void* const owner = e.owner;
    const Task task = e.task;
    running_ = id;
    lk.unlock();
    const std::int64_t next = task(owner);
    lk.lock();
    running_ = 0;
    ++runs_;
    done_.notify_all();
    const auto again = entries_.find(id);  // gone if removed while it ran
    if (next >= 0 && again != entries_.end()) {
      scheduleLocked(id, again->second, std::chrono::steady_clock::now() + std::chrono::microseconds{next});
    }
  }
}

}  // namespace redlimit::detail
