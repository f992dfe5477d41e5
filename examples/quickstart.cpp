// quickstart: two processes with four threads each share one distributed limiter, and the grants
// per interval are printed next to the configured rate.
//
//   quickstart [redis://host:port]       (default: $REDLIMIT_URI, else redis://127.0.0.1:6379)
//
// `make demo` runs it against a throwaway redis-server.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <cstdio>
#include <exception>
#include <vector>

#include <fmt/format.h>

#include "redlimit/redlimit.hpp"

extern char** environ;

namespace {

using namespace std::chrono;

constexpr std::int64_t kRate = 25;      // permits ...
constexpr milliseconds kInterval{500};  // ... per interval
constexpr milliseconds kRunFor{3000};   // how long the workers hammer the limiter
constexpr int kProcesses = 2;
constexpr int kThreadsPerProcess = 4;

std::int64_t epochMs() { return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count(); }

// One worker process: kThreadsPerProcess threads call acquire() until the run ends and print the
// wall-clock time of every grant, one per line.
int worker(const std::string& uri, const std::string& name) {
  redlimit::ClientOptions options;
  options.pool.size = kThreadsPerProcess;
  auto client = redlimit::Client::fromUri(uri, options);
  redlimit::RateLimiter limiter(client, name);
  std::mutex mutex;
  std::vector<std::int64_t> grants;
  const auto end = steady_clock::now() + kRunFor;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreadsPerProcess; ++t) {
    threads.emplace_back([&] {
      while (steady_clock::now() < end) {
        // Wait at most until the run ends; false means the run is over.
        auto left = duration_cast<milliseconds>(end - steady_clock::now());
        if (!limiter.tryAcquire(1, left)) continue;
        std::lock_guard<std::mutex> lock(mutex);
        grants.push_back(epochMs());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto g : grants) fmt::print("{}\n", g);
  return 0;
}

int coordinator(const std::string& uri, const char* self) {
  auto client = redlimit::Client::fromUri(uri);
  const std::string name = "quickstart:" + std::to_string(::getpid());
  redlimit::RateLimiter limiter(client, name);
  limiter.setRate(redlimit::RateType::Overall, kRate, kInterval);
  fmt::print("limiter {}: {} permits per {} ms, shared by {} processes x {} threads\n", name, kRate, kInterval.count(),
             kProcesses, kThreadsPerProcess);

  std::vector<std::pair<pid_t, int>> children;
  for (int p = 0; p < kProcesses; ++p) {
    int fds[2];
    if (::pipe(fds) != 0) return 1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::string a0 = self, a1 = "--worker", a2 = uri, a3 = name;
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
    pid_t pid = -1;
    if (::posix_spawn(&pid, self, &actions, nullptr, argv, environ) != 0) return 1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  std::vector<std::int64_t> grants;
  std::vector<std::size_t> perProcess;
  for (auto& [pid, fd] : children) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fmt::print(stderr, "quickstart: worker {} failed\n", pid);
      return 1;
    }
    std::istringstream in(out);
    std::size_t before = grants.size();
    for (std::int64_t t; in >> t;) grants.push_back(t);
    perProcess.push_back(grants.size() - before);
  }
  std::sort(grants.begin(), grants.end());
  if (grants.empty()) {
    fmt::print(stderr, "quickstart: no grants at all\n");
    return 1;
  }
  // Grants come in bursts one interval apart; windows are centred on them.
  std::map<std::int64_t, std::int64_t> perWindow;
  for (auto g : grants) perWindow[(g - grants.front() + kInterval.count() / 2) / kInterval.count()]++;
  fmt::print("\n  window   granted   configured rate\n");
  std::int64_t worst = 0;
  for (auto [window, count] : perWindow) {
    fmt::print("  {:6}   {:7}   {}\n", window, count, kRate);
    worst = std::max(worst, count);
  }
  fmt::print("\n  total {} grants (", grants.size());
  for (std::size_t i = 0; i < perProcess.size(); ++i)
    fmt::print("{}process {}: {}", i ? ", " : "", i + 1, perProcess[i]);
  fmt::print("); most in one window: {} of {} allowed\n", worst, kRate);
  (void)limiter.deleteLimiter();
  return worst <= kRate ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  try {
    if (argc == 4 && std::string(argv[1]) == "--worker") return worker(argv[2], argv[3]);
    std::string uri = "redis://127.0.0.1:6379";
    if (const char* env = std::getenv("REDLIMIT_URI")) uri = env;
    if (argc == 2) uri = argv[1];
    return coordinator(uri, "/proc/self/exe");
  } catch (const redlimit::Error& e) {
    fmt::print(stderr, "quickstart: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "quickstart", e.what());
  return 1;
}
