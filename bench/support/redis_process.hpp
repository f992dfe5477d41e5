// A throwaway redis-server for the benchmarks: a free loopback port, a fresh temporary directory,
// no persistence; stopped and its directory removed on destruction. The benchmarks must not depend
// on tests/, so this is their own (the test suite has its fixture in tests/support). Header-only,
// Linux only. Not thread-safe: drive it from one thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace redlimit::bench {

namespace detail {

// An IPv4 loopback TCP socket connected to `port`, or -1. SO_RCVTIMEO 200 ms.
inline int connectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A loopback port that nothing listens on now (the kernel's pick for port 0).
inline int freeLoopbackPort() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("bench: socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                       ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    if (!bound) continue;
    const int port = ntohs(addr.sin_port);
    const int probe = connectLoopback(port);
    if (probe < 0) return port;
    ::close(probe);
  }
  throw std::runtime_error("bench: no free loopback port found");
}

// True if the server on `port` answers PING with +PONG.
inline bool answersPing(int port) {
  const int fd = connectLoopback(port);
  if (fd < 0) return false;
  bool ok = false;
  const char ping[] = "PING\r\n";
  if (::write(fd, ping, sizeof ping - 1) == static_cast<ssize_t>(sizeof ping - 1)) {
    char buf[16] = {};
    ok = ::read(fd, buf, sizeof buf - 1) >= 5 && std::strncmp(buf, "+PONG", 5) == 0;
  }
  ::close(fd);
  return ok;
}

}  // namespace detail

/// redis-server (from PATH) on 127.0.0.1 with a free port and a unix socket in a fresh temporary
/// directory, `--save ''`, no AOF. Not copyable.
class RedisProcess {
 public:
  /// Starts the server and waits until it answers PING. `extraArgs` go on its command line;
  /// `"--tls-port", "auto"` gets a free port (tlsPort()). Throws std::runtime_error (with the
  /// server's log) if it does not start.
  explicit RedisProcess(std::vector<std::string> extraArgs = {}) : extraArgs_(std::move(extraArgs)) {
    char tmpl[] = "/tmp/redlimit-bench-redis-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("bench: mkdtemp failed");
    dir_ = tmpl;
    for (int attempt = 0;; ++attempt) {  // a port taken between the pick and the bind: pick again
      try {
        launch();
        waitReady(std::chrono::seconds(10));
        return;
      } catch (const std::exception&) {
        stop();
        if (attempt == 4) {
          std::error_code ec;
          std::filesystem::remove_all(dir_, ec);
          throw;
        }
      }
    }
  }
  ~RedisProcess() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  [[nodiscard]] int port() const noexcept { return port_; }
  /// The TLS port given as `--tls-port auto`, else 0.
  [[nodiscard]] int tlsPort() const noexcept { return tlsPort_; }
  [[nodiscard]] std::string uri() const { return "redis://" + host_ + ":" + std::to_string(port_); }
  [[nodiscard]] std::string unixSocket() const { return dir_ + "/redis.sock"; }
  [[nodiscard]] std::string logFile() const { return dir_ + "/redis.log"; }

 private:
  void launch() {
    port_ = detail::freeLoopbackPort();
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     host_,
                                     "--dir",
                                     dir_,
                                     "--unixsocket",
                                     unixSocket(),
                                     "--unixsocketperm",
                                     "700",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     logFile()};
    for (std::size_t i = 0; i < extraArgs_.size(); ++i) {
      args.push_back(extraArgs_[i]);
      if (extraArgs_[i] == "--tls-port" && i + 1 < extraArgs_.size() && extraArgs_[i + 1] == "auto") {
        do {
          tlsPort_ = detail::freeLoopbackPort();
        } while (tlsPort_ == port_);
        args.push_back(std::to_string(tlsPort_));
        ++i;
      }
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    if (rc != 0) throw std::runtime_error(std::string("bench: cannot start redis-server: ") + std::strerror(rc));
    pid_ = pid;
  }

  void waitReady(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        std::ifstream log(logFile());
        throw std::runtime_error("bench: redis-server exited at start-up: " +
                                 std::string((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>()));
      }
      if (detail::answersPing(port_)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw std::runtime_error("bench: redis-server did not answer PING in time on port " + std::to_string(port_));
  }

  // SIGTERM, then SIGKILL after 5 s.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  std::vector<std::string> extraArgs_;
  std::string host_ = "127.0.0.1";
  std::string dir_;
  int port_ = 0;
  int tlsPort_ = 0;
  pid_t pid_ = -1;
};

}  // namespace redlimit::bench
