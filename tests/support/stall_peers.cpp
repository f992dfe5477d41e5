#include "redlimit_test/stall_peers.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace redlimit::test {
namespace {

// A loopback listener on a free port; returns its fd and sets `addr`.
int listenOnLoopback(int backlog, sockaddr_in& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  addr = sockaddr_in{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot listen on loopback");
  }
  return fd;
}

// Connects to `addr` without accepting anything until a connect no longer completes: the
// listener's accept queue is then full. Returns the sockets, which must stay open.
std::vector<int> fillAcceptQueue(const sockaddr_in& addr) {
  std::vector<int> fillers;
  for (int i = 0; i < 16; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    fillers.push_back(fd);
    (void)::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 100) == 0) return fillers;  // this one hangs: the queue is full
  }
  for (int fd : fillers) ::close(fd);
  throw std::runtime_error("the accept queue never filled up");
}

bool writeAllBlocking(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

FullBacklog::FullBacklog() {
  listener_ = listenOnLoopback(0, addr_);
  try {
    fillers_ = fillAcceptQueue(addr_);
  } catch (...) {
    ::close(listener_);
    throw;
  }
}

FullBacklog::~FullBacklog() {
  for (int fd : fillers_) ::close(fd);
  ::close(listener_);
}

std::size_t connectsWaitingFor(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  std::size_t count = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const auto colon = remote.find(':');
    if (colon == std::string::npos) continue;
    const int remotePort = std::stoi(remote.substr(colon + 1), nullptr, 16);
    if (remotePort == port && state == "02") ++count;  // TCP_SYN_SENT
  }
  return count;
}

ForwardThenBlackhole::ForwardThenBlackhole(int target, std::size_t forwarded) : target_(target), forwarded_(forwarded) {
  sockaddr_in addr{};
  listener_ = listenOnLoopback(0, addr);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { run(); });
}

ForwardThenBlackhole::~ForwardThenBlackhole() {
  stop_ = true;
  thread_.join();
  ::close(listener_);
}

void ForwardThenBlackhole::run() {
  std::vector<std::pair<int, int>> relays;  // (client, server)
  std::vector<int> fillers;
  std::size_t accepted = 0;
  sockaddr_in self{};
  self.sin_family = AF_INET;
  self.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  self.sin_port = htons(static_cast<std::uint16_t>(port_));
  while (!stop_) {
    if (accepted == forwarded_ && !blackholed_) {
      fillers = fillAcceptQueue(self);
      blackholed_ = true;
    }
    std::vector<pollfd> fds;
    if (accepted < forwarded_) fds.push_back(pollfd{listener_, POLLIN, 0});
    for (const auto& [client, server] : relays) {
      fds.push_back(pollfd{client, POLLIN, 0});
      fds.push_back(pollfd{server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
    std::size_t at = 0;
    if (accepted < forwarded_) {
      if (fds[0].revents != 0) {
        const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client >= 0) {
          ++accepted;
          const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in to = self;
          to.sin_port = htons(static_cast<std::uint16_t>(target_));
          if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
            ::close(client);
            if (server >= 0) ::close(server);
          } else {
            relays.emplace_back(client, server);
          }
        }
      }
      at = 1;
    }
    std::vector<std::pair<int, int>> open;
    for (const auto& [client, server] : relays) {
      bool alive = true;
      for (int side = 0; side < 2 && alive && at < fds.size(); ++side, ++at) {
        if (fds[at].revents == 0) continue;
        char buf[16384];
        const ssize_t n = ::recv(fds[at].fd, buf, sizeof buf, 0);
        alive = n > 0 && writeAllBlocking(side == 0 ? server : client, buf, static_cast<std::size_t>(n));
      }
      if (alive) {
        open.emplace_back(client, server);
      } else {
        ::close(client);
        ::close(server);
      }
    }
    relays = std::move(open);
  }
  for (const auto& [client, server] : relays) {
    ::close(client);
    ::close(server);
  }
  for (int fd : fillers) ::close(fd);
}

CloseThenSilent::CloseThenSilent(std::size_t closed) : closed_(closed) {
  sockaddr_in addr{};
  listener_ = listenOnLoopback(16, addr);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { run(); });
}

CloseThenSilent::~CloseThenSilent() {
  stop_ = true;
  thread_.join();
  ::close(listener_);
}

void CloseThenSilent::run() {
  std::vector<int> silent;
  std::vector<int> toReset;  // accepted, to be reset once they sent something
  while (!stop_) {
    std::vector<pollfd> fds{pollfd{listener_, POLLIN, 0}};
    for (int fd : toReset) fds.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
    std::vector<int> waiting;
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) {
        waiting.push_back(fds[i].fd);
        continue;
      }
      // As a TLS port does with plain text: read what came, then reset.
      char buf[4096];
      (void)::recv(fds[i].fd, buf, sizeof buf, 0);
      const linger reset{1, 0};
      ::setsockopt(fds[i].fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      ::close(fds[i].fd);
    }
    toReset = std::move(waiting);
    if (fds[0].revents == 0) continue;
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (accepted_.fetch_add(1) < closed_) {
      toReset.push_back(fd);
    } else {
      silent.push_back(fd);
    }
  }
  for (int fd : toReset) ::close(fd);
  for (int fd : silent) ::close(fd);
}

}  // namespace redlimit::test
