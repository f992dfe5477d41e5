// Test fixture: loopback peers that make a client's connect stall in one chosen step, for tests of
// a transport whose connects must not delay each other (TransportConnect.*): a listener whose
// accept queue is full (the TCP connect never completes), one that serves its first connections
// through to a real server and then stops accepting, and one that resets its first connections
// once they send something (as a TLS port does to a plain request) and leaves later ones silent.
// A silent TLS handshake is FakePeer with answerGreeting off.
#pragma once

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include <netinet/in.h>

namespace redlimit::test {

/// A loopback listener with backlog 0 whose accept queue is already full, so that a further
/// connect() hangs in SYN_SENT until the caller's connect timeout: a connect timeout without
/// sending anything off this host. Throws std::runtime_error if the queue cannot be filled.
class FullBacklog {
 public:
  FullBacklog();
  ~FullBacklog();
  FullBacklog(const FullBacklog&) = delete;
  FullBacklog& operator=(const FullBacklog&) = delete;
  [[nodiscard]] int port() const noexcept { return ntohs(addr_.sin_port); }

 private:
  int listener_ = -1;
  sockaddr_in addr_{};
  std::vector<int> fillers_;
};

/// Sockets of this process's network namespace in SYN_SENT towards 127.0.0.1:`port` now (read
/// from /proc/net/tcp): connects that wait for a listener that does not take them.
[[nodiscard]] std::size_t connectsWaitingFor(int port);

/// A loopback listener that relays its first `forwarded` connections to 127.0.0.1:`target` (a
/// real redis-server) byte for byte, and then fills its own accept queue: every later connect()
/// hangs in SYN_SENT. Runs a thread; stops and joins in the destructor. Thread-safe to query.
class ForwardThenBlackhole {
 public:
  ForwardThenBlackhole(int target, std::size_t forwarded);
  ~ForwardThenBlackhole();
  ForwardThenBlackhole(const ForwardThenBlackhole&) = delete;
  ForwardThenBlackhole& operator=(const ForwardThenBlackhole&) = delete;
  [[nodiscard]] int port() const noexcept { return port_; }
  /// True once the forwarded connections are taken and the accept queue is full.
  [[nodiscard]] bool blackholed() const noexcept { return blackholed_.load(); }

 private:
  void run();
  int target_;
  std::size_t forwarded_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> blackholed_{false};
  std::thread thread_;
};

/// A loopback listener that accepts every connection, resets the first `closed` of them (SO_LINGER
/// 0) as soon as they send something, as a TLS port does with plain text, and keeps the later ones
/// open without ever sending a byte. Runs a
/// thread; stops and joins in the destructor. Thread-safe to query.
class CloseThenSilent {
 public:
  explicit CloseThenSilent(std::size_t closed);
  ~CloseThenSilent();
  CloseThenSilent(const CloseThenSilent&) = delete;
  CloseThenSilent& operator=(const CloseThenSilent&) = delete;
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] std::size_t accepted() const noexcept { return accepted_.load(); }

 private:
  void run();
  std::size_t closed_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> accepted_{0};
  std::thread thread_;
};

}  // namespace redlimit::test
