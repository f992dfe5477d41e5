// redlimit — one thread that runs the idle give-back of every SegmentedRateLimiter in the process
// and times the renewals of every LeaseHeartbeat.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

/// Runs periodic tasks of many owners on one thread, so that the number of threads does not grow
/// with the number of owners: instance() is the sweeper of every SegmentedRateLimiter with
/// returnWhenIdle and of every LeaseHeartbeat. Type-erased (an owner is a `void*` and a function
/// pointer; SegmentedRateLimiter is a template), and it never owns, copies or keeps alive what it
/// runs.
///
/// A task runs when its due time (steady_clock) comes and returns how long until it wants to run
/// again, or a negative value to sleep until its owner calls schedule(). Tasks run one at a time
/// and without the sweeper's lock, so a slow task (a give-back waiting on Redis) delays the others
/// but never blocks add(), schedule() or remove().
///
/// Thread-safe. remove() returns once the task is not running and will not start again — except
/// when called on the sweeper thread itself (a task that destroys an owner), where it cannot wait
/// for the task it is part of: it returns at once, and the sweeper does not touch that owner
/// again after the task returns.
///
/// instance() is one per process: in a fork() child it is a new sweeper, with a thread of its own
/// (started by the child's first add()) and none of the parent's tasks, which stay the parent's;
/// ids are never given out twice across a parent and its children, so a child's remove() of an
/// id it inherited touches no task of its own. instance() is never destroyed, so a limiter closed during static destruction (one held by a
/// global smart pointer) can still leave it; its thread is stopped and joined at exit, so no
/// task runs while the process's statics are being destroyed.
class IdleSweeper {
 public:
  /// One visit to `owner`; returns µs until the next visit, or < 0 to wait for schedule().
  using Task = std::int64_t (*)(void* owner) noexcept;
  /// Starts the sweeper's thread running `body` (a seam for tests; the default makes a
  /// std::thread). May throw std::system_error like std::thread's constructor.
  using StartThread = std::function<std::thread(std::function<void()> body)>;

  /// The process-wide sweeper. Its thread starts with the first add() and is stopped at exit.
  static IdleSweeper& instance();

  explicit IdleSweeper(StartThread start = {});
  /// stop().
  ~IdleSweeper();
  IdleSweeper(const IdleSweeper&) = delete;
  IdleSweeper& operator=(const IdleSweeper&) = delete;

  /// Stops the thread and joins it (after the task that is running, if any). Tasks do not run
  /// any more; add(), schedule() and remove() keep working (remove() waits for nothing).
  void stop();

  /// Registers `task` for `owner`, not scheduled yet, and returns its id (never 0). Starts the
  /// thread if it is not running (and not stopped); throws redlimit::Error if it cannot
  /// (nothing is registered then).
  [[nodiscard]] std::uint64_t add(void* owner, Task task);
  /// Runs the task of `id` after `delay` (at once if <= 0), unless it is already due sooner.
  /// Ignores an id that is not registered. Never waits for a task.
  void schedule(std::uint64_t id, std::chrono::microseconds delay);
  /// Unregisters `id`: afterwards its task does not start again and is not running (unless the
  /// caller is that task, see the class comment). Waits for the task if it is running now.
  void remove(std::uint64_t id);

  /// Registered tasks.
  [[nodiscard]] std::size_t size() const;
  /// Tasks run so far.
  [[nodiscard]] std::uint64_t runs() const;

 private:
  using Time = std::chrono::steady_clock::time_point;
  struct Entry {
    void* owner;
    Task task;
    Time due{};
    bool queued = false;
  };

  void run();
  void scheduleLocked(std::uint64_t id, Entry& e, Time due) REDLIMIT_REQUIRES(mutex_);

  StartThread start_;
  const std::uint64_t generation_;  // detail::forkGeneration() of the process that made it
  // instance() in a fork() child: the parent's sweeper it replaced, never used (its lock may be
  // held by a thread that does not exist here), only kept reachable for leak checkers.
  const IdleSweeper* inherited_ = nullptr;
  mutable Mutex mutex_;
  std::condition_variable wake_;  // a task became due sooner, or stopping
  std::condition_variable done_;  // the running task returned (remove() waits for it)
  std::unordered_map<std::uint64_t, Entry> entries_ REDLIMIT_GUARDED_BY(mutex_);
  std::set<std::pair<Time, std::uint64_t>> queue_ REDLIMIT_GUARDED_BY(mutex_);  // scheduled tasks by due time
  std::uint64_t running_ REDLIMIT_GUARDED_BY(mutex_) = 0;                       // the task running now; 0 = none
  std::uint64_t runs_ REDLIMIT_GUARDED_BY(mutex_) = 0;
  bool stopping_ REDLIMIT_GUARDED_BY(mutex_) = false;
  std::thread thread_ REDLIMIT_GUARDED_BY(mutex_);        // started by the first add(); empty once stopped
  std::thread::id threadId_ REDLIMIT_GUARDED_BY(mutex_);  // the sweeper thread's id (kept after stop())
};

}  // namespace redlimit::detail
