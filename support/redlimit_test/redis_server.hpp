// Test fixture: a throwaway redis-server on a free loopback port in a temporary directory.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <sys/types.h>

namespace redlimit::test {

/// Starts redis-server (from PATH) on 127.0.0.1 with a free port, no persistence, in a fresh
/// temporary directory; stops it and removes the directory on destruction.
/// Not thread-safe: drive it from the test's main thread. A fork() child's copy (one destroyed by
/// the child's exit()) leaves the server and its directory alone: they are the parent's.
class RedisServer {
 public:
  /// Starts the server and waits until it answers PING on its plain port. extraArgs go on the
  /// command line (for example {"--requirepass", "secret"}); `"--tls-port", "auto"` and
  /// `"--cluster-port", "auto"` have the harness pick a free port (see tlsPort(), clusterPort()).
  /// A non-empty configText is written to <dir>/redis.conf and given as the config file (a
  /// sentinel needs a writable one; the server may rewrite it, and restart() keeps it).
  /// Throws std::runtime_error if it does not start.
  explicit RedisServer(std::vector<std::string> extraArgs = {}, const std::string& configText = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  [[nodiscard]] int port() const noexcept { return port_; }
  /// The TLS port: the harness's pick for `--tls-port auto`, the number given, or 0 without one.
  [[nodiscard]] int tlsPort() const noexcept { return tlsPort_; }
  /// The cluster bus port: the harness's pick for `--cluster-port auto`, the number given, or 0
  /// without one (redis then uses port() + 10000).
  [[nodiscard]] int clusterPort() const noexcept { return clusterPort_; }
  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  /// redis://127.0.0.1:<port>
  [[nodiscard]] std::string uri() const;
  /// Path of the unix socket the server also listens on.
  [[nodiscard]] std::string unixSocket() const { return dir_ + "/redis.sock"; }

  /// Sends SIGKILL and reaps the process (simulates a crash).
  void kill();
  /// Starts the server again on the same port (after kill() or stop()).
  void restart();
  /// SIGTERM, then SIGKILL after 5 s.
  void stop();
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }

 private:
  void pickPorts();
  void launch();
  void waitReady(std::chrono::milliseconds limit);

  std::vector<std::string> extraArgs_;
  std::string host_ = "127.0.0.1";
  std::string dir_;
  std::string configFile_;  // empty: no config file
  int port_ = 0;
  int tlsPort_ = 0;
  int clusterPort_ = 0;
  // The Unix socket this server listens on: unixSocket(), or the --unixsocket extraArgs give.
  [[nodiscard]] std::string ownUnixSocket() const;
  std::vector<std::size_t> autoPorts_;  // indexes in extraArgs_ of `auto` port values to pick
  pid_t pid_ = -1;
  pid_t owner_ = -1;  // the process that started the server: only it stops it
};

/// Returns a loopback TCP port that nothing listens on at the moment of the call.
int freeLoopbackPort();

}  // namespace redlimit::test
