#include "redlimit_test/redis_server.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <spawn.h>
#include <stdexcept>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace redlimit::test {
namespace {

bool canConnect(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Sends PING over a connected raw socket `fd` and checks for +PONG, or -NOAUTH from a server
// started with --requirepass (it is up, it only wants a password). Closes `fd`. No library code
// under test involved.
bool pingAnswered(int fd, const sockaddr* addr, socklen_t len) {
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  bool ok = false;
  if (::connect(fd, addr, len) == 0) {
    const char ping[] = "PING\r\n";
    if (::write(fd, ping, sizeof ping - 1) == static_cast<ssize_t>(sizeof ping - 1)) {
      char buf[16] = {};
      ssize_t n = ::read(fd, buf, sizeof buf - 1);
      ok = (n >= 5 && std::strncmp(buf, "+PONG", 5) == 0) || (n >= 7 && std::strncmp(buf, "-NOAUTH", 7) == 0);
    }
  }
  ::close(fd);
  return ok;
}

// A server answers PING on host:port.
bool answersPing(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  return pingAnswered(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
}

// The server listening on the Unix socket `path` answers PING. Only the process started with
// that path can: it proves that this server, not another one, is up.
bool answersPingOn(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    ::close(fd);
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return pingAnswered(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
}

}  // namespace

int freeLoopbackPort() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      socklen_t len = sizeof addr;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      ::close(fd);
      int port = ntohs(addr.sin_port);
      if (!canConnect("127.0.0.1", port)) return port;
    } else {
      ::close(fd);
    }
  }
  throw std::runtime_error("no free loopback port found");
}

RedisServer::RedisServer(std::vector<std::string> extraArgs, const std::string& configText)
    : extraArgs_(std::move(extraArgs)), owner_(::getpid()) {
  for (std::size_t i = 0; i + 1 < extraArgs_.size(); ++i) {
    if (extraArgs_[i] != "--tls-port" && extraArgs_[i] != "--cluster-port") continue;
    if (extraArgs_[i + 1] == "auto") autoPorts_.push_back(i + 1);
  }
  char tmpl[] = "/tmp/redlimit-redis-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  if (!configText.empty()) {
    configFile_ = dir_ + "/redis.conf";
    std::ofstream(configFile_) << configText;
  }
  for (int attempt = 0;; ++attempt) {
    pickPorts();
    try {
      launch();
      waitReady(std::chrono::seconds(10));
      return;
    } catch (const std::exception&) {
      stop();
      if (attempt == 4) {
        std::filesystem::remove_all(dir_);
        throw;
      }
    }
  }
}

// A new plain port, and new picks for the `auto` ports, all different; then reads the TLS and
// cluster bus ports back from the arguments.
void RedisServer::pickPorts() {
  port_ = freeLoopbackPort();
  std::vector<int> taken{port_};
  for (std::size_t index : autoPorts_) {
    int picked = 0;
    do {
      picked = freeLoopbackPort();
    } while (std::find(taken.begin(), taken.end(), picked) != taken.end());
    taken.push_back(picked);
    extraArgs_[index] = std::to_string(picked);
  }
  for (std::size_t i = 0; i + 1 < extraArgs_.size(); ++i) {
    if (extraArgs_[i] == "--tls-port") tlsPort_ = std::stoi(extraArgs_[i + 1]);
    if (extraArgs_[i] == "--cluster-port") clusterPort_ = std::stoi(extraArgs_[i + 1]);
  }
}

RedisServer::~RedisServer() {
  if (::getpid() != owner_) return;  // a fork() child's copy: the server is the parent's
  stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string RedisServer::ownUnixSocket() const {
  std::string path = unixSocket();
  for (std::size_t i = 0; i + 1 < extraArgs_.size(); ++i) {
    if (extraArgs_[i] == "--unixsocket") path = extraArgs_[i + 1];  // the last one given counts
  }
  return path;
}

std::string RedisServer::uri() const { return "redis://" + host_ + ":" + std::to_string(port_); }

void RedisServer::launch() {
  std::vector<std::string> args = {REDLIMIT_REDIS_SERVER};
  // The config file must come first (redis-server <file> [--option value ...]).
  if (!configFile_.empty()) args.push_back(configFile_);
  args.insert(args.end(), {"--port",
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
                           dir_ + "/redis.log",
                           "--enable-debug-command",
                           "local"});
  args.insert(args.end(), extraArgs_.begin(), extraArgs_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw std::runtime_error(std::string("cannot start redis-server: ") + std::strerror(rc));
  pid_ = pid;
}

void RedisServer::waitReady(std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::ifstream log(dir_ + "/redis.log");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      throw std::runtime_error("redis-server exited at start-up: " + text);
    }
    // Another test process may have picked the same free port a moment earlier: its server then
    // answers on the port while this one fails to bind it and exits. So the port answering is not
    // enough; this server's own Unix socket must answer too (Redis serves it only once every port
    // is bound: the event loop starts after all of them).
    if (answersPing(host_, port_) && answersPingOn(ownUnixSocket())) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("redis-server did not answer PING in time on port " + std::to_string(port_));
}

void RedisServer::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void RedisServer::restart() {
  stop();
  // The old socket may linger briefly in TIME_WAIT; redis sets SO_REUSEADDR so this is fine.
  for (int attempt = 0; attempt < 50; ++attempt) {
    launch();
    try {
      waitReady(std::chrono::seconds(10));
      return;
    } catch (const std::exception&) {
      stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  throw std::runtime_error("redis-server did not restart on port " + std::to_string(port_));
}

void RedisServer::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
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

}  // namespace redlimit::test
