// Helpers shared by the bench_*.cpp programs: a throwaway redis-server that never outlives the
// program, a raw hiredis connection for baselines, INFO parsing, percentiles, the machine
// description and the results directory. Header-only, so every bench_*.cpp can include it.
// Not thread-safe unless a function says so.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include "redlimit_test/redis_server.hpp"

namespace redlimit::bench {

// --- A redis-server that is stopped even when the program dies of a signal ------------------

namespace detail {

// What a signal handler needs to remove one server: its pid and the files it leaves behind.
// Written before the handler can see it (pid last, with release ordering).
struct ServerSlot {
  std::atomic<pid_t> pid{0};
  std::array<char, 256> dir{};
  std::array<char, 256> sock{};
  std::array<char, 256> log{};
};

inline std::array<ServerSlot, 4> gSlots;

inline void copyPath(std::array<char, 256>& to, const std::string& from) {
  to[from.copy(to.data(), to.size() - 1)] = '\0';  // truncated to fit, NUL-terminated
}

// Async-signal-safe: kill, waitpid, unlink, rmdir only.
inline void killServersAndReraise(int sig) {
  for (ServerSlot& s : gSlots) {
    const pid_t pid = s.pid.exchange(0);
    if (pid <= 0) continue;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::unlink(s.sock.data());
    ::unlink(s.log.data());
    ::rmdir(s.dir.data());
  }
  // SA_RESETHAND restored the default action: the program ends as the signal asked.
  ::raise(sig);
}

inline void installSignalHandlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa {};
  sa.sa_handler = killServersAndReraise;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = static_cast<int>(SA_RESETHAND);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace detail

/// A raw hiredis connection: the baseline the library is compared with, and the admin channel
/// (INFO, MEMORY USAGE, pipelined set-up). Throws std::runtime_error on any failure.
/// Not thread-safe.
class RawRedis {
 public:
  struct Free {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
  };
  using ReplyPtr = std::unique_ptr<redisReply, Free>;

  RawRedis(const std::string& host, int port) {
    ctx_ = redisConnectWithTimeout(host.c_str(), port, timeval{5, 0});
    if (ctx_ == nullptr || ctx_->err != 0) {
      const std::string why = ctx_ != nullptr ? ctx_->errstr : "out of memory";
      if (ctx_ != nullptr) redisFree(ctx_);
      throw std::runtime_error("bench: cannot connect to redis: " + why);
    }
    redisSetTimeout(ctx_, timeval{30, 0});
  }
  ~RawRedis() { redisFree(ctx_); }
  RawRedis(const RawRedis&) = delete;
  RawRedis& operator=(const RawRedis&) = delete;

  [[nodiscard]] redisContext* get() const noexcept { return ctx_; }

  /// Sends one command, waits for the reply; error replies throw.
  ReplyPtr command(const std::vector<std::string_view>& argv) {
    append(argv);
    return reply();
  }
  ReplyPtr command(std::initializer_list<std::string_view> argv) {
    return command(std::vector<std::string_view>(argv));
  }

  /// Queues one command (pipelining); read its reply later with reply().
  void append(const std::vector<std::string_view>& argv) {
    std::vector<const char*> ptr(argv.size());
    std::vector<std::size_t> len(argv.size());
    for (std::size_t i = 0; i < argv.size(); ++i) {
      ptr[i] = argv[i].data();
      len[i] = argv[i].size();
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), ptr.data(), len.data()) != REDIS_OK) {
      throw std::runtime_error(std::string("bench: redis append failed: ") + ctx_->errstr);
    }
  }

  /// The next reply of the pipeline; error replies throw.
  ReplyPtr reply() {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      throw std::runtime_error(std::string("bench: redis transport error: ") + ctx_->errstr);
    }
    ReplyPtr r(static_cast<redisReply*>(raw));
    if (r->type == REDIS_REPLY_ERROR) {
      throw std::runtime_error("bench: redis error reply: " + std::string(r->str, r->len));
    }
    return r;
  }

  /// The text of INFO for the given sections (Redis 7 takes several).
  std::string info(std::initializer_list<std::string_view> sections) {
    std::vector<std::string_view> argv{"INFO"};
    argv.insert(argv.end(), sections.begin(), sections.end());
    ReplyPtr r = command(argv);
    return std::string(r->str, r->len);
  }

 private:
  redisContext* ctx_ = nullptr;
};

/// A summary table's cell: `v` with `precision` decimals, or "n/a" when it was not measured (NaN).
inline std::string cell(double v, int precision = 1) {
  return std::isnan(v) ? std::string("n/a") : fmt::format("{:.{}f}", v, precision);
}

/// 1 or 0 if `r` is the packed decision of a one-key script's take (gcra.lua, fixed_window.lua:
/// 65 bytes, byte 0 = 0xA0 + allowed; lua/lib/onekey.lua), -1 for any other reply.
inline int packedDecisionAllowed(const redisReply* r) {
  if (r->type != REDIS_REPLY_STRING || r->len != 65) return -1;
  const auto first = static_cast<unsigned char>(r->str[0]);
  if ((first & 0xFEu) != 0xA0u) return -1;
  return first & 1;
}

/// The permits granted by acquire.lua's packed reply (six little-endian int64, the first the
/// permits granted, 0 when denied; lua/acquire.lua), -1 for any other reply.
inline std::int64_t packedAcquireGranted(const redisReply* r) {
  if (r->type != REDIS_REPLY_STRING || r->len != 48) return -1;
  std::uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(r->str[b]);
  return static_cast<std::int64_t>(v);
}

/// `key:value` lines of an INFO reply.
inline std::map<std::string, std::string> parseInfo(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    out[line.substr(0, colon)] = line.substr(colon + 1);
  }
  return out;
}

/// A throwaway redis-server (RedisServer of redlimit_harness, support/ at the root, shared with the
/// tests) whose process is killed and whose
/// temporary files are removed if this program dies of a signal (Ctrl-C, crash, abort).
/// The normal path is RedisServer's destructor. Not thread-safe.
class BenchServer {
 public:
  /// `extraArgs` go on redis-server's command line (RedisServer's: `"--tls-port", "auto"` picks a
  /// free TLS port).
  explicit BenchServer(std::vector<std::string> extraArgs = {})
      : server_(std::make_unique<redlimit::test::RedisServer>(std::move(extraArgs))) {
    detail::installSignalHandlers();
    RawRedis admin(server_->host(), server_->port());
    const auto fields = parseInfo(admin.info({"server"}));
    const auto pid = fields.find("process_id");
    if (pid == fields.end()) throw std::runtime_error("bench: INFO server has no process_id");
    version_ = fields.count("redis_version") ? fields.at("redis_version") : "?";
    pid_ = static_cast<pid_t>(std::stol(pid->second));
    const std::string sock = server_->unixSocket();
    const std::string dir = sock.substr(0, sock.rfind('/'));
    for (detail::ServerSlot& s : detail::gSlots) {
      if (s.pid.load() != 0) continue;
      detail::copyPath(s.dir, dir);
      detail::copyPath(s.sock, sock);
      detail::copyPath(s.log, dir + "/redis.log");
      s.pid.store(pid_, std::memory_order_release);
      slot_ = &s;
      break;
    }
  }
  ~BenchServer() {
    if (slot_ != nullptr) slot_->pid.store(0);  // the destructor below stops it
  }
  BenchServer(const BenchServer&) = delete;
  BenchServer& operator=(const BenchServer&) = delete;

  [[nodiscard]] const std::string& host() const noexcept { return server_->host(); }
  [[nodiscard]] int port() const noexcept { return server_->port(); }
  [[nodiscard]] std::string uri() const { return server_->uri(); }
  /// The TLS port (started with `--tls-port`), else 0.
  [[nodiscard]] int tlsPort() const noexcept { return server_->tlsPort(); }
  /// The server's process id (INFO server).
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  /// redis_version from INFO server.
  [[nodiscard]] const std::string& version() const noexcept { return version_; }

 private:
  std::unique_ptr<redlimit::test::RedisServer> server_;
  detail::ServerSlot* slot_ = nullptr;
  std::string version_;
  pid_t pid_ = 0;
};

// --- Server cost from INFO -------------------------------------------------------------------

/// Server-side counters at one moment: process CPU and the command statistics.
// Adds `count` members of one permit each, stamped `scoreMs`, to the sorted set `key`: 16 random
// id bytes from a generator seeded with `seed` (distinct seeds give distinct members), pipelined
// in ZADDs of 1000. The state a limiter's permits log has after that many grants.
inline void addOnePermitMembers(RawRedis& r, const std::string& key, std::int64_t count, std::int64_t scoreMs,
                                std::uint64_t seed) {
  const std::string score = std::to_string(scoreMs);
  std::uint64_t state = 0x9E3779B97F4A7C15ULL ^ seed;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  std::int64_t pending = 0;
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t batch = std::min<std::int64_t>(1000, count - done);
    std::vector<std::string> members(static_cast<std::size_t>(batch), std::string(21, '\0'));
    std::vector<std::string_view> argv{"ZADD", key};
    for (std::string& m : members) {
      m[0] = 16;
      for (std::size_t i = 0; i < 16; i += 8) {
        const std::uint64_t v = next();
        for (std::size_t j = 0; j < 8; ++j) m[1 + i + j] = static_cast<char>((v >> (8 * j)) & 0xFF);
      }
      m[17] = 1;  // permits = 1, little-endian uint32
      argv.push_back(score);
      argv.push_back(m);
    }
    r.append(argv);
    ++pending;
    done += batch;
    if (pending == 20) {
      for (; pending > 0; --pending) (void)r.reply();
    }
  }
  for (; pending > 0; --pending) (void)r.reply();
}

struct ServerSample {
  double cpuSeconds = 0;         // used_cpu_user + used_cpu_sys
  std::int64_t scriptCalls = 0;  // EVALSHA + EVAL + FCALL
  std::int64_t scriptUsec = 0;   // time spent executing them, the commands they call included
  std::int64_t innerUsec = 0;    // time spent in every other command but INFO (in a window where
                                 // only scripts run: the commands the scripts called)
};

inline ServerSample sampleServer(RawRedis& admin) {
  ServerSample s;
  const auto info = parseInfo(admin.info({"cpu", "commandstats"}));
  s.cpuSeconds = std::stod(info.at("used_cpu_user")) + std::stod(info.at("used_cpu_sys"));
  for (const auto& [key, value] : info) {
    if (key.rfind("cmdstat_", 0) != 0) continue;
    // cmdstat_<name>:calls=N,usec=N,usec_per_call=F,...
    std::int64_t calls = 0, usec = 0;
    std::istringstream in(value);
    std::string field;
    while (std::getline(in, field, ',')) {
      const auto eq = field.find('=');
      if (eq == std::string::npos) continue;
      if (field.compare(0, eq, "calls") == 0) calls = std::stoll(field.substr(eq + 1));
      if (field.compare(0, eq, "usec") == 0) usec = std::stoll(field.substr(eq + 1));
    }
    const std::string name = key.substr(8);
    if (name == "evalsha" || name == "eval" || name == "fcall") {
      s.scriptCalls += calls;
      s.scriptUsec += usec;
    } else if (name != "info") {
      s.innerUsec += usec;
    }
  }
  return s;
}

/// Server cost of the scripts run between two samples.
struct ServerCost {
  std::int64_t calls = 0;
  double usecPerCall = 0;   // INFO commandstats: execution time of the script, per call, µs
  double cpuUsPerCall = 0;  // INFO cpu: whole-process CPU (I/O and parsing too), per call, µs
  double innerPerCall = 0;  // of usecPerCall: the Redis commands the script called, µs

  static ServerCost between(const ServerSample& a, const ServerSample& b) {
    ServerCost c;
    c.calls = b.scriptCalls - a.scriptCalls;
    if (c.calls > 0) {
      const auto n = static_cast<double>(c.calls);
      c.usecPerCall = static_cast<double>(b.scriptUsec - a.scriptUsec) / n;
      c.cpuUsPerCall = (b.cpuSeconds - a.cpuSeconds) * 1e6 / n;
      c.innerPerCall = static_cast<double>(b.innerUsec - a.innerUsec) / n;
    }
    return c;
  }

  /// Adds another window's totals (per-call figures weighted by calls).
  void add(const ServerCost& o) {
    const auto n = static_cast<double>(calls + o.calls);
    if (n <= 0) return;
    auto mix = [&](double a, double b) {
      return (a * static_cast<double>(calls) + b * static_cast<double>(o.calls)) / n;
    };
    usecPerCall = mix(usecPerCall, o.usecPerCall);
    cpuUsPerCall = mix(cpuUsPerCall, o.cpuUsPerCall);
    innerPerCall = mix(innerPerCall, o.innerPerCall);
    calls += o.calls;
  }
};

// --- Latencies -------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

/// Nearest-rank percentile (p in 0..100) of `v`; sorts it. 0 for an empty vector.
inline double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  const auto idx = static_cast<std::size_t>(std::max(1.0, rank)) - 1;
  return v[std::min(idx, v.size() - 1)];
}

/// p50 and p99 of a set of latencies (µs).
struct LatencySummary {
  double p50 = 0;
  double p99 = 0;
  std::size_t samples = 0;
};

inline LatencySummary summarize(std::vector<double>& us) {
  LatencySummary s;
  s.samples = us.size();
  s.p50 = percentile(us, 50);
  s.p99 = percentile(us, 99);
  return s;
}

/// Microseconds between two time points.
inline double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// --- Where results go, and what machine produced them ---------------------------------------

/// The results directory: $REDLIMIT_BENCH_RESULTS, else bench/results of the source tree.
inline std::string resultsDir() {
  const char* env = std::getenv("REDLIMIT_BENCH_RESULTS");
  if (env != nullptr && *env != '\0') return env;
  return REDLIMIT_BENCH_SOURCE_DIR "/results";
}

inline std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

/// One line: cores, CPU model, kernel, Redis and hiredis versions, compiler.
inline std::string machineDescription(const std::string& redisVersion) {
  utsname u{};
  ::uname(&u);
  std::ostringstream out;
  out << ::sysconf(_SC_NPROCESSORS_ONLN) << " cores (" << cpuModel() << "), Linux " << u.release << ", redis-server "
      << redisVersion << ", hiredis " << HIREDIS_MAJOR << '.' << HIREDIS_MINOR << '.' << HIREDIS_PATCH << ", "
      <<
#if defined(__clang__)
      "clang "
#else
      "g++ "
#endif
      << __VERSION__;
  return out.str();
}

/// Local time as YYYY-MM-DD HH:MM.
inline std::string nowText() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

}  // namespace redlimit::bench
