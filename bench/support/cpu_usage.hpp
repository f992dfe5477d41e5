// CPU placement and CPU time for the benchmarks: pinning a process (every thread) or the calling
// thread to one CPU, the threads of this process, a thread's CPU time, and this process's
// getrusage figures. Header-only, Linux only. Not thread-safe unless a function says so.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <sched.h>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>
#include <vector>

namespace redlimit::bench {

/// The ids of every thread of process `pid` (/proc/<pid>/task), sorted. Empty if it is gone.
inline std::vector<pid_t> threadIds(pid_t pid) {
  std::vector<pid_t> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    out.push_back(static_cast<pid_t>(std::stol(e->d_name)));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

/// How many CPUs this thread may run on (its affinity mask); 0 if the kernel does not say.
inline int allowedCpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 0;
  return CPU_COUNT(&allowed);
}

/// Whether this process may run on both CPU 0 and CPU 1 and the machine has at least two online:
/// the condition for putting the server on one and the client on the other.
inline bool canPinTwoCpus() {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) return false;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  return CPU_ISSET(0, &allowed) && CPU_ISSET(1, &allowed);
}

/// Pins thread `tid` (0 = the calling thread) to `cpu`. Threads it starts afterwards inherit the
/// mask. Returns false with errno set if the kernel refuses.
inline bool pinThread(pid_t tid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::sched_setaffinity(tid, sizeof set, &set) == 0;
}

/// Pins every thread process `pid` has now to `cpu`, and checks it by reading the masks back.
/// Returns the number of threads pinned, or -1 if one could not be (errno set).
inline int pinProcess(pid_t pid, int cpu) {
  int pinned = 0;
  for (pid_t tid : threadIds(pid)) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (!pinThread(tid, cpu) || ::sched_getaffinity(tid, sizeof set, &set) != 0) return -1;
    if (CPU_COUNT(&set) != 1 || !CPU_ISSET(cpu, &set)) {
      errno = EINVAL;
      return -1;
    }
    ++pinned;
  }
  return pinned;
}

/// CPU time thread `tid` of this process has used, seconds: the scheduler's nanosecond count
/// (/proc/self/task/<tid>/schedstat), else utime + stime in clock ticks (/proc/.../stat); -1 if
/// the thread is gone. Thread-safe.
inline double threadCpuSeconds(pid_t tid) {
  const std::string base = "/proc/self/task/" + std::to_string(tid);
  {
    std::ifstream in(base + "/schedstat");
    std::uint64_t ns = 0;
    if (in >> ns) return static_cast<double>(ns) / 1e9;
  }
  std::ifstream in(base + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  std::uint64_t utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {  // field 3 is the state; utime is 14, stime 15
    if (i == 14) utime = std::stoull(field);
    if (i == 15) {
      stime = std::stoull(field);
      return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    }
  }
  return -1;
}

/// Time one CPU spent, in seconds, from /proc/stat (whoever ran on it).
struct CpuTimes {
  double busy = 0;  // everything but idle and iowait (user, system, interrupts, steal)
  double total = 0;

  /// CPU `cpu`'s counters now; zeros if /proc/stat does not list it.
  static CpuTimes of(int cpu) {
    std::ifstream in("/proc/stat");
    const std::string tag = "cpu" + std::to_string(cpu);
    std::string line;
    CpuTimes t;
    while (std::getline(in, line)) {
      if (line.compare(0, tag.size() + 1, tag + " ") != 0) continue;
      std::istringstream fields(line.substr(tag.size()));
      std::uint64_t v = 0, idle = 0, all = 0;
      // user nice system idle iowait irq softirq steal (guest time is already in user)
      for (int i = 0; i < 8 && fields >> v; ++i) {
        all += v;
        if (i == 3 || i == 4) idle += v;
      }
      const auto hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
      t.total = static_cast<double>(all) / hz;
      t.busy = static_cast<double>(all - idle) / hz;
      break;
    }
    return t;
  }
};

/// getrusage(RUSAGE_SELF): every thread of this process together.
struct ProcessUsage {
  double userSeconds = 0;
  double systemSeconds = 0;
  std::int64_t voluntarySwitches = 0;    // the thread gave the CPU up (blocked)
  std::int64_t involuntarySwitches = 0;  // the scheduler took it away

  static ProcessUsage now() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    ProcessUsage p;
    p.userSeconds = static_cast<double>(u.ru_utime.tv_sec) + static_cast<double>(u.ru_utime.tv_usec) / 1e6;
    p.systemSeconds = static_cast<double>(u.ru_stime.tv_sec) + static_cast<double>(u.ru_stime.tv_usec) / 1e6;
    p.voluntarySwitches = u.ru_nvcsw;
    p.involuntarySwitches = u.ru_nivcsw;
    return p;
  }
};

}  // namespace redlimit::bench
