#include "redlimit_test/fake_peer.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <optional>
#include <poll.h>
#include <stdexcept>
#include <string_view>
#include <sys/socket.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace redlimit::test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long the loop sleeps in poll() when nothing is due: the destructor waits at most this long.
constexpr milliseconds kPollInterval{20};
// Redis's own limits on a request (PROTO_INLINE_MAX_SIZE, proto-max-bulk-len); beyond them the
// request is a protocol error.
constexpr std::size_t kMaxLine = std::size_t{64} * 1024;
constexpr std::int64_t kMaxArguments = std::int64_t{1024} * 1024;
constexpr std::int64_t kMaxBulk = std::int64_t{512} * 1024 * 1024;

// A decimal integer with an optional '-', nothing else; false if empty, malformed or too long.
bool parseInteger(std::string_view text, std::int64_t& out) {
  bool negative = false;
  if (!text.empty() && text.front() == '-') {
    negative = true;
    text.remove_prefix(1);
  }
  if (text.empty() || text.size() > 18) return false;
  std::int64_t value = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    value = value * 10 + (ch - '0');
  }
  out = negative ? -value : value;
  return true;
}

std::string lowercase(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

std::string bulk(std::string_view text) {
  return "$" + std::to_string(text.size()) + "\r\n" + std::string(text) + "\r\n";
}

/// Splits a byte stream into requests: RESP multi-bulk arrays and inline commands, fed in any
/// pieces. No I/O. Not thread-safe.
class RequestReader {
 public:
  enum class Result { Request, NeedMore, Error };

  void feed(const char* data, std::size_t size) { buffer_.append(data, size); }

  /// The next complete request into `argv`; NeedMore if the bytes so far end inside one; Error if
  /// the stream is not a valid request stream (the reader is then of no further use).
  Result next(std::vector<std::string>& argv) {
    for (;;) {
      if (!inRequest_) {
        if (pos_ == buffer_.size()) return needMore();
        if (buffer_[pos_] != '*') {
          const Result inlined = readInline(argv);
          if (inlined == Result::Request && argv.empty()) continue;  // a blank line: skipped, as Redis does
          return inlined;
        }
        std::string_view line;
        const Result header = readLine(line);
        if (header != Result::Request) return header;
        std::int64_t count = 0;
        if (!parseInteger(line.substr(1), count) || count > kMaxArguments) return Result::Error;
        if (count <= 0) continue;  // "*0" and "*-1": empty requests, skipped as Redis does
        inRequest_ = true;
        argumentsLeft_ = count;
        bulkSize_ = -1;
        arguments_.clear();
      }
      while (argumentsLeft_ > 0) {
        if (bulkSize_ < 0) {
          std::string_view line;
          const Result header = readLine(line);
          if (header != Result::Request) return header;
          if (line.front() != '$' || !parseInteger(line.substr(1), bulkSize_) || bulkSize_ < 0 ||
              bulkSize_ > kMaxBulk) {
            return Result::Error;
          }
        }
        const auto size = static_cast<std::size_t>(bulkSize_);
        if (buffer_.size() - pos_ < size + 2) return needMore();
        if (buffer_[pos_ + size] != '\r' || buffer_[pos_ + size + 1] != '\n') return Result::Error;
        arguments_.emplace_back(buffer_, pos_, size);
        pos_ += size + 2;
        bulkSize_ = -1;
        --argumentsLeft_;
      }
      inRequest_ = false;
      argv = std::move(arguments_);
      arguments_.clear();
      return Result::Request;
    }
  }

 private:
  Result needMore() {
    buffer_.erase(0, pos_);
    pos_ = 0;
    return Result::NeedMore;
  }

  // The line at pos_ without its "\r\n" (never empty); consumes it.
  Result readLine(std::string_view& line) {
    const auto end = buffer_.find("\r\n", pos_);
    if (end == std::string::npos) return buffer_.size() - pos_ > kMaxLine ? Result::Error : needMore();
    if (end == pos_ || end - pos_ > kMaxLine) return Result::Error;
    line = std::string_view(buffer_).substr(pos_, end - pos_);
    pos_ = end + 2;
    return Result::Request;
  }

  // An inline command: words separated by spaces up to "\n" (a "\r" before it is dropped).
  Result readInline(std::vector<std::string>& argv) {
    const auto end = buffer_.find('\n', pos_);
    if (end == std::string::npos) return buffer_.size() - pos_ > kMaxLine ? Result::Error : needMore();
    if (end - pos_ > kMaxLine) return Result::Error;
    std::string_view line = std::string_view(buffer_).substr(pos_, end - pos_);
    pos_ = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    argv.clear();
    while (!line.empty()) {
      const auto start = line.find_first_not_of(" \t");
      if (start == std::string_view::npos) break;
      line.remove_prefix(start);
      const auto stop = std::min(line.find_first_of(" \t"), line.size());
      argv.emplace_back(line.substr(0, stop));
      line.remove_prefix(stop);
    }
    return Result::Request;
  }

  std::string buffer_;
  std::size_t pos_ = 0;             // first byte not yet consumed
  bool inRequest_ = false;          // inside a multi-bulk request whose header has been read
  std::int64_t argumentsLeft_ = 0;  // its bulk arguments still to read
  std::int64_t bulkSize_ = -1;      // size of the bulk being read; -1 = its "$" header comes next
  std::vector<std::string> arguments_;
};

/// What the peer does about one request.
struct Response {
  std::string now;      // bytes to send at once
  std::string trickle;  // bytes to send one at a time, trickleEvery apart
  bool close = false;   // close the connection after sending `now`
};

/// The answers of one connection: the greeting, then the behaviour. No I/O. Not thread-safe.
class Session {
 public:
  Session(const FakePeer::Options& options, std::size_t id)
      : options_(options), id_(id), greeting_(options.answerGreeting) {}

  Response answer(const std::vector<std::string>& argv) {
    if (greeting_) {
      if (auto reply = greetingReply(argv)) return Response{std::move(*reply), {}, false};
      greeting_ = false;
    }
    using B = FakePeer::Behaviour;
    switch (options_.behaviour) {
      case B::NeverAnswer:
        return {};
      case B::Trickle:
        return Response{{}, options_.trickleReply, false};
      case B::HugeArrayHeader:
        return once("*2147483647\r\n");
      case B::HugeBulkHeader:
        return once("$2147483647\r\n");
      case B::Garbage:
        return Response{"!garbage\r\n", {}, false};
      case B::CloseMidReply:
        return Response{"$10\r\nabcde", {}, true};
      case B::DeepNesting: {
        std::string nested;
        for (int level = 0; level < 9; ++level) nested += "*1\r\n";
        return Response{nested + ":1\r\n", {}, false};
      }
    }
    return {};
  }

 private:
  // The answer of a server without a password to a greeting request; nullopt if the request
  // ends the greeting (not a greeting command, or one this connection has sent before).
  std::optional<std::string> greetingReply(std::vector<std::string> argv) {
    argv.front() = lowercase(argv.front());
    const std::string& name = argv.front();
    if (name != "ping" && name != "auth" && name != "select" && name != "hello" && name != "client") {
      return std::nullopt;
    }
    if (std::find(greeted_.begin(), greeted_.end(), argv) != greeted_.end()) return std::nullopt;
    greeted_.push_back(argv);
    if (name == "ping") return argv.size() > 1 ? bulk(argv[1]) : "+PONG\r\n";
    if (name != "hello") return "+OK\r\n";
    if (argv.size() > 1 && argv[1] != "2") return "-NOPROTO sorry, this protocol version is not supported.\r\n";
    return "*14\r\n" + bulk("server") + bulk("redis") + bulk("version") + bulk("7.2.0") + bulk("proto") + ":2\r\n" +
           bulk("id") + ":" + std::to_string(id_) + "\r\n" + bulk("mode") + bulk("standalone") + bulk("role") +
           bulk("master") + bulk("modules") + "*0\r\n";
  }

  // The header-only behaviours answer the first request; later bytes would only be read as part
  // of the impossible reply, so they get nothing.
  Response once(const char* header) {
    if (headerSent_) return {};
    headerSent_ = true;
    return Response{header, {}, false};
  }

  const FakePeer::Options& options_;
  std::size_t id_;
  bool greeting_;
  bool headerSent_ = false;
  std::vector<std::vector<std::string>> greeted_;  // greeting requests so far, name lowercased
};

/// One accepted connection: its socket and what it still has to send.
struct Connection {
  Connection(int socket, const FakePeer::Options& options, std::size_t id) : fd(socket), session(options, id) {}
  ~Connection() { ::close(fd); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd;
  RequestReader reader;
  Session session;
  std::string trickle;             // bytes still to trickle out
  Clock::time_point nextByteAt{};  // when the next trickled byte is due
  bool readClosed = false;         // the client sent EOF
  bool closed = false;             // to be closed and dropped
};

// Sends what the socket takes without blocking; the rest is dropped. Marks the connection closed
// if the client has gone.
void sendNow(Connection& c, std::string_view bytes) {
  if (bytes.empty() || c.closed) return;
  const ssize_t sent = ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
}

// Reads what has arrived and answers every request it completes.
void receive(Connection& c, std::atomic<std::size_t>& requests) {
  char buf[16 * 1024];
  const ssize_t got = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
  if (got == 0) {
    c.readClosed = true;
    if (c.trickle.empty()) c.closed = true;
    return;
  }
  if (got < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
    return;
  }
  c.reader.feed(buf, static_cast<std::size_t>(got));
  std::vector<std::string> argv;
  for (;;) {
    const auto result = c.reader.next(argv);
    if (result == RequestReader::Result::NeedMore) return;
    if (result == RequestReader::Result::Error) {
      c.closed = true;
      return;
    }
    requests.fetch_add(1);
    Response response = c.session.answer(argv);
    sendNow(c, response.now);
    c.trickle += response.trickle;
    if (response.close) {
      // FIN after the bytes; close() follows when the loop drops the connection.
      ::shutdown(c.fd, SHUT_WR);
      c.closed = true;
    }
    if (c.closed) return;
  }
}

// Sends the next trickled byte if it is due.
void trickle(Connection& c, milliseconds every) {
  if (c.trickle.empty() || c.closed) return;
  const auto now = Clock::now();
  if (now < c.nextByteAt) return;
  sendNow(c, std::string_view(c.trickle).substr(0, 1));
  c.trickle.erase(0, 1);
  c.nextByteAt = now + every;
  if (c.trickle.empty() && c.readClosed) c.closed = true;
}

[[noreturn]] void fail(const char* what) {
  throw std::runtime_error(std::string("FakePeer: ") + what + ": " + std::strerror(errno));
}

}  // namespace

FakePeer::FakePeer(Options options) : options_(std::move(options)) {
  listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listenFd_ < 0) fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listenFd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listenFd_, 128) != 0 ||
      ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int saved = errno;
    ::close(listenFd_);
    errno = saved;
    fail("listen on 127.0.0.1");
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { run(); });
}

FakePeer::~FakePeer() {
  stop_.store(true);
  thread_.join();
  ::close(listenFd_);
}

std::string FakePeer::uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }

void FakePeer::run() {
  std::vector<std::unique_ptr<Connection>> connections;
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    // Sleep until a socket is ready, a trickled byte is due, or kPollInterval passes.
    milliseconds timeout = kPollInterval;
    const auto now = Clock::now();
    fds.clear();
    fds.push_back(pollfd{listenFd_, POLLIN, 0});
    for (const auto& c : connections) {
      fds.push_back(pollfd{c->fd, static_cast<short>(c->readClosed ? 0 : POLLIN), 0});
      if (!c->trickle.empty()) {
        timeout = std::min(timeout, std::max(milliseconds(0), std::chrono::ceil<milliseconds>(c->nextByteAt - now)));
      }
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) < 0 && errno != EINTR) return;

    for (std::size_t i = 0; i < connections.size(); ++i) {
      Connection& c = *connections[i];
      const short events = fds[i + 1].revents;
      if ((events & (POLLIN | POLLHUP | POLLERR)) != 0) {
        if (c.readClosed) {
          c.closed = true;  // hung up or reset after its EOF: nothing more can be sent
        } else {
          receive(c, requests_);
        }
      }
      trickle(c, options_.trickleEvery);
    }
    connections.erase(std::remove_if(connections.begin(), connections.end(), [](const auto& c) { return c->closed; }),
                      connections.end());

    if ((fds[0].revents & POLLIN) != 0) {
      for (;;) {
        const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        // Trickled bytes leave one by one instead of waiting for the client's delayed ACK.
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        const std::size_t id = connections_.fetch_add(1) + 1;
        connections.push_back(std::make_unique<Connection>(fd, options_, id));
      }
    }
  }
}

}  // namespace redlimit::test
