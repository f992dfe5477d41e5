// Runs helper processes for the multi-process tests and collects their output.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace redlimit::test {

/// A child process whose stdout is captured. Not thread-safe.
class ChildProcess {
 public:
  /// Starts argv[0] (a path) with the given arguments. Throws std::runtime_error on failure.
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// Waits for the child; returns its exit status (128 + signal if killed) and fills `out`.
  int wait(std::string& out);

 private:
  pid_t pid_ = -1;
  int stdoutFd_ = -1;
};

/// Waits until every other thread of this process is asleep (state S in /proc/self/task, seen on
/// two scans in a row), for at most `maxScans` scans a millisecond apart; returns whether they
/// settled. Call it just before a fork() that the child survives by starting threads of its own:
/// under ThreadSanitizer, a thread that holds the runtime's allocator lock at the fork leaves the
/// child's first allocation waiting for it forever (gcc 12's libtsan does not take those locks
/// around fork(); LLVM's runtime does since llvm-project PR 96600, 2024). A sleeping thread holds
/// none. Harmless without a sanitizer: the fork waits for threads that were about to sleep anyway.
bool waitUntilOtherThreadsSleep(int maxScans = 5000);

/// How a fork() child of statusOfForkedChild ends.
enum class ChildExit {
  /// std::exit: static destructors and atexit handlers run, as in a worker that returns from main
  /// (the harness's RedisServer copies leave the parent's servers alone). LeakSanitizer's check
  /// is off in the child: the parent's threads' memory would read as leaked there.
  Normally,
  /// _exit: nothing more runs.
  Immediately,
};

/// Runs `child` in a fork() child that then ends with its result as exit code, as `how` says.
/// The child must not use gtest's assertions: it reports through its exit code. Flushes stdio
/// and waits for the other threads to sleep (waitUntilOtherThreadsSleep) before forking. Returns
/// the child's wait status (see waitpid), or -1 if fork() failed. With `result`, also what
/// `child` returned, sent through a pipe before the child ends (-1 if it never came): a sanitizer
/// may replace the exit code of a child that ran to its end (see LeaseHeartbeatTest).
int statusOfForkedChild(const std::function<int()>& child, ChildExit how, int* result = nullptr);

/// A wait status in words ("exited with 3", "killed by signal 6 (Aborted)"), for failure messages.
std::string describeWaitStatus(int status);

}  // namespace redlimit::test
