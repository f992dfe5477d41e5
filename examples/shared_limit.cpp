// shared_limit: two processes with four threads each share one distributed RateLimiter, and the
// example checks the limit it promises: at most kRate grants in any kInterval, whoever asks.
// It prints what it checked (attempts, grants and denials per window, against the bound) and a
// PASS or FAIL line; it exits non-zero on FAIL.
//
//   shared_limit [redis://host:port]       (default: $REDLIMIT_URI, else redis://127.0.0.1:6379)
//
// `make demo` runs it against a throwaway redis-server; so does the test suite (example.shared_limit).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "redlimit/redlimit.hpp"

extern char** environ;

namespace {

using namespace std::chrono;

constexpr std::int64_t kRate = 25;      // permits ...
constexpr milliseconds kInterval{500};  // ... per interval
constexpr int kWindows = 6;             // intervals checked
constexpr int kProcesses = 2;
constexpr int kThreadsPerProcess = 4;
// Time for the workers to start and connect before the common start.
constexpr milliseconds kStartDelay{500};

std::int64_t epochMs() { return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count(); }

// One worker process: from the epoch ms `startMs` to `endMs`, kThreadsPerProcess threads call
// decide(1) as fast as they are allowed to: a denied thread sleeps for the retryAfter it got.
// Prints one line per attempt: its wall-clock time in ms and G (granted) or D (denied).
int worker(const std::string& uri, const std::string& name, std::int64_t startMs, std::int64_t endMs) {
  redlimit::ClientOptions options;
  options.pool.size = kThreadsPerProcess;
  auto client = redlimit::Client::fromUri(uri, options);
  redlimit::RateLimiter limiter(client, name);
  std::mutex mutex;
  std::vector<std::pair<std::int64_t, char>> attempts;
  std::this_thread::sleep_for(milliseconds(std::max<std::int64_t>(0, startMs - epochMs())));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreadsPerProcess; ++t) {
    threads.emplace_back([&] {
      for (std::int64_t now = epochMs(); now < endMs; now = epochMs()) {
        const redlimit::Decision d = limiter.decide(1);
        {
          const std::lock_guard<std::mutex> lock(mutex);
          attempts.emplace_back(epochMs(), d.allowed ? 'G' : 'D');
        }
        if (!d.allowed) {
          const auto wait = std::max(milliseconds(1), ceil<milliseconds>(d.retryAfter));
          std::this_thread::sleep_for(std::min(wait, milliseconds(std::max<std::int64_t>(1, endMs - epochMs()))));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& [ms, what] : attempts) fmt::print("{} {}\n", ms, what);
  return 0;
}

struct Window {
  std::int64_t attempts = 0, granted = 0, denied = 0;
};

int coordinator(const std::string& uri, const char* self) {
  auto client = redlimit::Client::fromUri(uri);
  const std::string name = "shared_limit:" + std::to_string(::getpid());
  redlimit::RateLimiter limiter(client, name);
  limiter.setRate(redlimit::RateType::Overall, kRate, kInterval);

  // A permit comes back kInterval after it was taken, so the grants come in bursts kInterval
  // apart, starting at startMs. Window k is centred on burst k: [start + (k - 1/2) x interval,
  // start + (k + 1/2) x interval). The run ends half an interval after the last burst, between two
  // bursts, so the last window is as complete as the others.
  const std::int64_t startMs = epochMs() + kStartDelay.count();
  const std::int64_t half = kInterval.count() / 2;
  const std::int64_t endMs = startMs + (kWindows - 1) * kInterval.count() + half;
  fmt::print("RateLimiter {}: {} permits per {} ms, shared by {} processes x {} threads.\n", name, kRate,
             kInterval.count(), kProcesses, kThreadsPerProcess);
  fmt::print("Each thread calls decide(1) for {} ms; a denied thread sleeps for the retryAfter it got.\n",
             endMs - startMs);
  fmt::print("Checked: at most {} grants in each {} ms window. Permits come back {} ms after they were\n", kRate,
             kInterval.count(), kInterval.count());
  fmt::print("taken, so grants come in bursts; each window is centred on one, and the run ends between two.\n");

  std::vector<std::pair<pid_t, int>> children;
  for (int p = 0; p < kProcesses; ++p) {
    int fds[2];
    if (::pipe(fds) != 0) return 1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::string a0 = self, a1 = "--worker", a2 = uri, a3 = name, a4 = std::to_string(startMs),
                a5 = std::to_string(endMs);
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), a5.data(), nullptr};
    pid_t pid = -1;
    const int spawned = ::posix_spawn(&pid, self, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (spawned != 0) return 1;
    children.emplace_back(pid, fds[0]);
  }
  std::map<std::int64_t, Window> windows;
  for (int k = 0; k < kWindows; ++k) windows[k];
  std::vector<std::int64_t> perProcess;
  std::int64_t outside = 0;  // attempts in no window (none expected)
  for (auto& [pid, fd] : children) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fmt::print(stderr, "shared_limit: worker {} failed\n", pid);
      return 1;
    }
    std::istringstream in(out);
    std::int64_t granted = 0;
    std::int64_t ms = 0;
    char what = 0;
    while (in >> ms >> what) {
      const std::int64_t k = (ms - startMs + half) / kInterval.count();
      if (ms - startMs + half < 0 || k >= kWindows) {
        ++outside;
        continue;
      }
      Window& w = windows[k];
      ++w.attempts;
      (what == 'G' ? w.granted : w.denied)++;
      granted += what == 'G';
    }
    perProcess.push_back(granted);
  }
  (void)limiter.deleteLimiter();

  fmt::print("\n  window (ms from start)   attempts   granted   denied   bound\n");
  Window total;
  std::int64_t most = 0;
  int full = 0;
  for (const auto& [k, w] : windows) {
    const std::int64_t from = k * kInterval.count() - half;
    fmt::print("  {:>9} .. {:<9}   {:8}   {:7}   {:6}   <= {} {}\n", from, from + kInterval.count(), w.attempts,
               w.granted, w.denied, kRate, w.granted <= kRate ? "ok" : "EXCEEDED");
    total.attempts += w.attempts;
    total.granted += w.granted;
    total.denied += w.denied;
    most = std::max(most, w.granted);
    full += w.granted == kRate;
  }
  fmt::print("  total: {} attempts, {} granted (", total.attempts, total.granted);
  for (std::size_t i = 0; i < perProcess.size(); ++i)
    fmt::print("{}process {}: {}", i ? ", " : "", i + 1, perProcess[i]);
  fmt::print("), {} denied\n\n", total.denied);
  if (outside != 0) fmt::print("  ({} attempts fell outside the windows)\n", outside);

  if (total.granted == 0 || most > kRate) {
    fmt::print("FAIL: {}\n", total.granted == 0
                                 ? "no permit was granted at all"
                                 : fmt::format("a window had {} grants, over the bound of {}", most, kRate));
    return 1;
  }
  fmt::print("PASS: at most {} grants in every {} ms window (most: {}); {} of {} windows used the whole limit{}.\n",
             kRate, kInterval.count(), most, full, kWindows,
             full == kWindows ? "" : " (a busy machine can leave a window short: that is no failure)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  try {
    if (argc == 6 && std::string(argv[1]) == "--worker") {
      return worker(argv[2], argv[3], std::stoll(argv[4]), std::stoll(argv[5]));
    }
    std::string uri = "redis://127.0.0.1:6379";
    if (const char* env = std::getenv("REDLIMIT_URI")) uri = env;
    if (argc == 2) uri = argv[1];
    return coordinator(uri, "/proc/self/exe");
  } catch (const redlimit::Error& e) {
    fmt::print(stderr, "shared_limit: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "shared_limit", e.what());
  return 1;
}
