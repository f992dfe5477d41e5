#include "redlimit_test/process.hpp"
#include "redlimit_test/sanitizers.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <spawn.h>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <pthread.h>
#include <unistd.h>

extern char** environ;

namespace redlimit::test {

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  int rc = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw std::runtime_error("cannot start " + argv[0]);
  }
  stdoutFd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdoutFd_ >= 0) ::close(stdoutFd_);
}

int ChildProcess::wait(std::string& out) {
  char buf[4096];
  ssize_t n;
  while ((n = ::read(stdoutFd_, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {

// True if every thread of this process but the caller is asleep (state 'S' in its stat line: the
// field after the parenthesised name, which may itself hold spaces or parentheses).
bool otherThreadsAsleep() {
  const std::string self = std::to_string(::gettid());
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    if (task.path().filename() == self) continue;
    std::ifstream in(task.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;  // the thread ended meanwhile
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) return false;
    if (line[close + 2] != 'S') return false;
  }
  return !ec;
}

}  // namespace

bool waitUntilOtherThreadsSleep(int maxScans) {
  int settled = 0;
  for (int i = 0; i < maxScans; ++i) {
    settled = otherThreadsAsleep() ? settled + 1 : 0;
    if (settled == 2) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

namespace {
// Set in a statusOfForkedChild child: LeakSanitizer's check at its exit is off (see below).
std::atomic<bool> gInForkedChild{false};
}  // namespace

int statusOfForkedChild(const std::function<int()>& child, ChildExit how, int* result) {
  (void)waitUntilOtherThreadsSleep();
  (void)std::fflush(nullptr);  // else the child's exit() writes the parent's buffered output again
  int fds[2] = {-1, -1};
  if (result != nullptr) {
    *result = -1;
    if (::pipe(fds) != 0) return -1;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    gInForkedChild.store(true);
#if REDLIMIT_TEST_TSAN
    // glibc hands the child's first threads the stacks of the parent's threads (cached at fork),
    // and with them their ids, which ThreadSanitizer still holds as running: it reports "dup thread
    // with used id" and halts. A larger default stack than any cached one makes each new thread
    // map its own.
    pthread_attr_t attr;
    if (::pthread_attr_init(&attr) == 0) {
      (void)::pthread_attr_setstacksize(&attr, std::size_t{32} << 20);
      (void)::pthread_setattr_default_np(&attr);
      (void)::pthread_attr_destroy(&attr);
    }
#endif
    int code = 100;
    try {
      code = child();
    } catch (...) {
      code = 101;
    }
    if (fds[1] >= 0) {
      (void)!::write(fds[1], &code, sizeof code);
      ::close(fds[1]);
    }
    if (how == ChildExit::Immediately) ::_exit(code);
    std::exit(code);
  }
  if (fds[1] >= 0) ::close(fds[1]);
  if (pid < 0) {
    if (fds[0] >= 0) ::close(fds[0]);
    return -1;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (fds[0] >= 0) {
    int code = -1;
    if (::read(fds[0], &code, sizeof code) == static_cast<ssize_t>(sizeof code)) *result = code;
    ::close(fds[0]);
  }
  return status;
}

std::string describeWaitStatus(int status) {
  if (status == -1) return "fork() failed";
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  }
  return "wait status " + std::to_string(status);
}

}  // namespace redlimit::test

// LeakSanitizer asks this at exit (a documented hook: disabled when it returns non-zero). In a
// fork() child the parent's threads are gone, and what only their stacks held (the parent's I/O
// threads' buffers) reads as leaked although the child never lost it; the parent, whose memory
// it is, is checked at its own exit. Unused in builds without LeakSanitizer.
extern "C" int __lsan_is_turned_off() {  // NOLINT(bugprone-reserved-identifier,readability-identifier-naming)
  return redlimit::test::gInForkedChild.load() ? 1 : 0;
}
