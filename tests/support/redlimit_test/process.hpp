// Runs helper processes for the multi-process tests and collects their output.
#pragma once

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

}  // namespace redlimit::test
