#include "transport/connector.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// hiredis 0.14's redisEnableKeepAlive: probes after 15 s idle, every 5 s, 3 of them.
constexpr int kKeepAliveIdleSeconds = 15;
constexpr int kKeepAliveIntervalSeconds = kKeepAliveIdleSeconds / 3;
constexpr int kKeepAliveProbes = 3;

// What a descriptor in a connector's epoll is.
constexpr std::uint64_t kLookupTag = 1;
constexpr std::uint64_t kSocketTag = 2;
constexpr std::uint64_t kProbeTag = 3;

// A unix socket whose listen backlog is full refuses a non-blocking connect at once and offers
// nothing to wait for: it is tried again after this, doubling up to kMaxUnixBackoff.
constexpr milliseconds kMaxUnixBackoff{20};

// A TLS 1.2 ClientHello with one cipher suite: any TLS server answers it with a TLS record (a
// ServerHello, or an alert if it dislikes the offer), whose first byte is 0x16 or 0x15 and second
// the major version 3. A Redis server reads it as an unfinished inline command and waits (it holds
// no '\n').
constexpr unsigned char kTlsHello[] = {
    0x16, 0x03, 0x01, 0x00, 0x2d,  // record: handshake, TLS 1.0 framing, 45 bytes
    0x01, 0x00, 0x00, 0x29,        // ClientHello, 41 bytes
    0x03, 0x03,                    // TLS 1.2
    0x72, 0x65, 0x64, 0x6c, 0x69, 0x6d, 0x69, 0x74, 0x72, 0x65, 0x64, 0x6c, 0x69, 0x6d, 0x69, 0x74,  // random
    0x72, 0x65, 0x64, 0x6c, 0x69, 0x6d, 0x69, 0x74, 0x72, 0x65, 0x64, 0x6c, 0x69, 0x6d, 0x69, 0x74,
    0x00,                    // no session id
    0x00, 0x02, 0xc0, 0x2f,  // one cipher suite: ECDHE-RSA-AES128-GCM-SHA256
    0x01, 0x00,              // compression: none
};

constexpr std::string_view kPlainPing = "PING\r\n";

// "a, b, c".
std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += ", ";
    out += p;
  }
  return out;
}

void setOption(int fd, int level, int name, int value, const std::string& what) {
  if (::setsockopt(fd, level, name, &value, sizeof value) != 0) throwErrnoError(errno, what);
}

void closeFd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Milliseconds to `t` for poll(): rounded up (a poll that ends a little early would spin), at
// most INT_MAX, -1 for no time at all; 0 once it has passed.
int pollTimeout(SteadyTime t) {
  if (t == SteadyTime::max()) return -1;
  const auto left = t - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
}

// Whole ms from `from` to `to`, rounded: a budget computed a few µs after its deadline still
// reads as the timeout that was configured.
std::int64_t msBetween(SteadyTime from, SteadyTime to) { return std::chrono::round<milliseconds>(to - from).count(); }

struct AddrinfoDeleter {
  void operator()(addrinfo* a) const noexcept { ::freeaddrinfo(a); }
};

// getaddrinfo for host:port. `numericOnly`: no lookup at all (AI_NUMERICHOST); a name then gives
// nullopt. Throws as resolveName documents.
std::optional<std::vector<SocketAddress>> lookUp(const std::string& host, int port, bool numericOnly) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (numericOnly ? AI_NUMERICHOST : 0);
  addrinfo* found = nullptr;
  const std::string service = fmt::to_string(port);
  const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  const std::string what = fmt::format("connect to {}", endpointOf(ClientOptions::Node{host, port}));
  if (numericOnly && gai == EAI_NONAME) return std::nullopt;
  if (gai == EAI_SYSTEM) throwErrnoError(errno, what);
  if (gai != 0) throw IoError(fmt::format("redlimit: {}: cannot resolve \"{}\": {}", what, host, ::gai_strerror(gai)));
  const std::unique_ptr<addrinfo, AddrinfoDeleter> owned(found);
  std::vector<SocketAddress> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress s;
    std::memcpy(&s.storage, a->ai_addr, a->ai_addrlen);
    s.length = a->ai_addrlen;
    s.family = a->ai_family;
    out.push_back(s);
  }
  if (out.empty()) throw IoError(fmt::format("redlimit: {}: \"{}\" resolves to no address", what, host));
  return out;
}

}  // namespace

std::string addressText(const SocketAddress& address) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address.storage), address.length, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return "?";
  }
  return host;
}

std::vector<SocketAddress> resolveName(const std::string& host, int port) { return *lookUp(host, port, false); }

bool isPlainRedisAnswer(std::string_view head) {
  if (head.size() < 2) return false;
  // "+PONG", "-NOAUTH ...", "-ERR ...": a simple string or an error, as RESP2 and RESP3 answer PING.
  return (head[0] == '+' || head[0] == '-') && head[1] >= 'A' && head[1] <= 'Z';
}

bool isTlsAnswer(std::string_view head) {
  return head.size() >= 2 && (head[0] == '\x15' || head[0] == '\x16') && head[1] == '\x03';
}

std::string_view tlsHello() noexcept { return {reinterpret_cast<const char*>(kTlsHello), sizeof kTlsHello}; }

// ----- PortProbe -----------------------------------------------------------------------------

PortProbe::PortProbe(const SocketAddress& address, std::string_view bytes, SteadyTime deadline)
    : bytes_(bytes), deadline_(deadline) {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  fd_ = ::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (epoll_ < 0 || fd_ < 0) {
    close();
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLOUT;
  ev.data.u64 = 0;
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd_, &ev) != 0) {
    close();
    return;
  }
  watching_ = EPOLLOUT;
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&address.storage), address.length) == 0) {
    connected_ = true;
  } else if (errno != EINPROGRESS && errno != EINTR) {
    close();
  }
}

PortProbe::~PortProbe() { close(); }

void PortProbe::close() noexcept {
  closeFd(fd_);
  closeFd(epoll_);
  if (state_ == State::Working) state_ = State::Failed;
}

void PortProbe::abandonAfterFork() noexcept { close(); }

void PortProbe::want(std::uint32_t events) noexcept {
  if (watching_ == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = 0;
  ::epoll_ctl(epoll_, EPOLL_CTL_MOD, fd_, &ev);
  watching_ = events;
}

PortProbe::State PortProbe::step() noexcept {
  if (state_ != State::Working) return state_;
  if (Clock::now() >= deadline_) {
    close();
    return state_;
  }
  epoll_event ev{};
  const int n = ::epoll_wait(epoll_, &ev, 1, 0);
  if (!connected_) {
    if (n <= 0) return state_;
    int soError = 0;
    socklen_t len = sizeof soError;
    if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &soError, &len) != 0 || soError != 0) {
      close();
      return state_;
    }
    connected_ = true;
  }
  while (sent_ < bytes_.size()) {
    const ssize_t w = ::send(fd_, bytes_.data() + sent_, bytes_.size() - sent_, MSG_NOSIGNAL);
    if (w > 0) {
      sent_ += static_cast<std::size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      want(EPOLLOUT);
      return state_;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      close();
      return state_;
    }
  }
  want(EPOLLIN);
  while (got_ < sizeof head_) {
    const ssize_t r = ::recv(fd_, head_ + got_, sizeof head_ - got_, 0);
    if (r > 0) {
      got_ += static_cast<std::size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return state_;
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      close();  // closed or reset before two bytes came
      return state_;
    }
  }
  state_ = State::Answered;
  close();
  return state_;
}

// ----- Connector -----------------------------------------------------------------------------

// A name lookup on a thread of its own. The thread and the connector share it; whichever lets go
// last frees it (a connector that gave up does not wait for the thread).
struct Connector::Lookup {
  std::mutex m;
  bool done = false;                 // guarded by m
  std::vector<SocketAddress> found;  // guarded by m
  std::exception_ptr error;          // guarded by m
  int event = -1;                    // an eventfd, written once when done
  ~Lookup() { closeFd(event); }
};

Connector::Connector(const ClientOptions::Connection& options, SteadyTime deadline, TlsContext tls,
                     NameResolver resolver)
    : options_(options),
      endpoint_(endpointOf(options)),
      started_(Clock::now()),
      deadline_(deadline),
      tls_(std::move(tls)),
      resolver_(resolver ? std::move(resolver) : NameResolver(&resolveName)) {
  // A TLS peer that has not answered the hello by half the budget is asked in plain text then.
  probeAt_ = deadline_ > started_ ? started_ + (deadline_ - started_) / 2 : deadline_;
  try {
    if (options_.tls.enabled) {
      if (!options_.unixSocket.empty()) {
        throw InvalidArgument(
            fmt::format("redlimit: connect to {}: TLS needs a TCP connection, not a unix socket", endpoint_));
      }
      // Before anything else: a file that cannot be read fails at once, without a server.
      if (!tls_) tls_ = makeTlsContext(options_.tls, endpoint_);
    }
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) throwErrnoError(errno, fmt::format("connect to {}", endpoint_));
    if (!options_.unixSocket.empty()) {
      step_ = Step::Connect;
    } else if (auto numeric = lookUp(options_.host, options_.port, true)) {
      addresses_ = std::move(*numeric);
      step_ = Step::Connect;
    } else {
      startLookup();
    }
    advance(started_);
  } catch (...) {
    fail(std::current_exception());
  }
}

Connector::~Connector() {
  closeFd(fd_);
  closeFd(epoll_);
}

void Connector::abandonAfterFork() noexcept {
  closeFd(fd_);
  closeFd(epoll_);
  if (handshaking_) ::close(handshaking_.release()->fd());  // its destructor would free TLS state
  if (stream_) ::close(stream_.release()->fd());
  if (probe_) probe_.release()->abandonAfterFork();
  if (lookup_) {
    closeFd(lookup_->event);                          // the lookup thread does not exist here; nothing else touches it
    new std::shared_ptr<Lookup>(std::move(lookup_));  // leaked: its mutex may be held by the parent's thread
  }
}

SteadyTime Connector::wakeAt() const noexcept {
  if (state_ != State::Working) return SteadyTime::max();
  SteadyTime t = std::min(deadline_, retryAt_);
  if (step_ == Step::Handshake && !probed_) t = std::min(t, probeAt_);
  return t;
}

std::string Connector::doing() const {
  switch (step_) {
    case Step::Lookup:
      return fmt::format("looking up \"{}\"", options_.host);
    case Step::Connect:
      return tried_.empty() ? std::string("connecting") : fmt::format("connecting to {}", tried_.back());
    case Step::Handshake:
      return "in the TLS handshake";
    case Step::End:
      break;
  }
  return state_ == State::Failed ? "failed to connect" : "connected";
}

void Connector::watch(int fd, std::uint32_t events, std::uint64_t tag) noexcept {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  if (::epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev) != 0) ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
}

void Connector::unwatch(int fd) noexcept {
  if (epoll_ >= 0 && fd >= 0) ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
}

void Connector::fail(std::exception_ptr error) noexcept {
  error_ = std::move(error);
  state_ = State::Failed;
  probe_.reset();
  handshaking_.reset();
  closeFd(fd_);
  lookup_.reset();
}

Connector::State Connector::step() noexcept {
  if (state_ != State::Working) return state_;
  try {
    epoll_event events[4];
    const int n = ::epoll_wait(epoll_, events, 4, 0);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kSocketTag) fdEvents_ |= events[i].events;
    }
    advance(Clock::now());
  } catch (...) {
    fail(std::current_exception());
  }
  return state_;
}

void Connector::startLookup() {
  step_ = Step::Lookup;
  lookup_ = std::make_shared<Lookup>();
  lookup_->event = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (lookup_->event < 0) throwErrnoError(errno, fmt::format("connect to {}: start the name lookup", endpoint_));
  watch(lookup_->event, EPOLLIN, kLookupTag);
  try {
    std::thread([job = lookup_, resolver = resolver_, host = options_.host, port = options_.port] {
      std::vector<SocketAddress> found;
      std::exception_ptr error;
      try {
        found = resolver(host, port);
      } catch (...) {
        error = std::current_exception();
      }
      {
        const std::lock_guard<std::mutex> lock(job->m);
        job->found = std::move(found);
        job->error = std::move(error);  // this thread keeps no reference to it
        job->done = true;
      }
      const std::uint64_t one = 1;
      [[maybe_unused]] const auto w = ::write(job->event, &one, sizeof one);
    }).detach();
  } catch (const std::system_error& e) {
    throw IoError(fmt::format("redlimit: connect to {}: cannot start a thread to look up \"{}\": {}", endpoint_,
                              options_.host, e.what()));
  }
}

bool Connector::lookupDone() {
  std::vector<SocketAddress> found;
  std::exception_ptr error;
  {
    const std::lock_guard<std::mutex> lock(lookup_->m);
    if (!lookup_->done) return false;
    found = std::move(lookup_->found);
    error = std::move(lookup_->error);
  }
  unwatch(lookup_->event);
  lookup_.reset();
  if (error) std::rethrow_exception(error);
  addresses_ = std::move(found);
  return true;
}

void Connector::advance(SteadyTime now) {
  for (;;) {
    switch (step_) {
      case Step::Lookup:
        if (!lookupDone()) {
          if (now >= deadline_) timedOut();
          return;
        }
        step_ = Step::Connect;
        continue;
      case Step::Connect:
        if (fd_ >= 0 && retryAt_ == SteadyTime::max()) {
          // A connect in progress: its socket becomes writable when it ends, either way.
          if ((fdEvents_ & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) {
            if (now >= deadline_) timedOut();
            return;
          }
          int soError = 0;
          socklen_t len = sizeof soError;
          if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &soError, &len) != 0) soError = errno;
          if (soError == 0) {
            connected();
            continue;
          }
          lastErrno_ = soError;
          unwatch(fd_);
          closeFd(fd_);
          if (!options_.unixSocket.empty()) throwErrnoError(soError, fmt::format("connect to {}", endpoint_));
        }
        nextAddress(now);
        if (step_ == Step::Connect) return;  // in progress, or waiting to retry
        continue;
      case Step::Handshake:
        handshake(now);
        return;
      case Step::End:
        return;
    }
  }
}

void Connector::nextAddress(SteadyTime now) {
  const std::string what = fmt::format("connect to {}", endpoint_);
  fdEvents_ = 0;
  if (!options_.unixSocket.empty()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (options_.unixSocket.size() >= sizeof addr.sun_path) {
      throw InvalidArgument(fmt::format("redlimit: {}: the path is {} bytes, a unix socket path holds at most {}", what,
                                        options_.unixSocket.size(), sizeof addr.sun_path - 1));
    }
    if (retryAt_ != SteadyTime::max()) {
      if (now < retryAt_) {
        if (now >= deadline_) timedOut();
        return;
      }
      retryAt_ = SteadyTime::max();
    }
    std::memcpy(addr.sun_path, options_.unixSocket.data(), options_.unixSocket.size());
    if (fd_ < 0) {
      fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd_ < 0) throwErrnoError(errno, what);
    }
    if (tried_.empty()) tried_.push_back(endpoint_);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      std::memcpy(&peer_.storage, &addr, sizeof addr);
      peer_.length = sizeof addr;
      peer_.family = AF_UNIX;
      connected();
      return;
    }
    const int e = errno;
    if (e == EAGAIN) {
      // The server's backlog is full: Linux refuses a non-blocking unix connect at once and
      // offers nothing to wait for, so try again shortly.
      backlogFull_ = true;
      if (now >= deadline_) timedOut();
      retryAt_ = std::min(now + backoff_, deadline_);
      backoff_ = std::min(backoff_ * 2, kMaxUnixBackoff);
      return;
    }
    if (e == EINPROGRESS || e == EINTR) {
      watch(fd_, EPOLLOUT, kSocketTag);
      return;
    }
    throwErrnoError(e, what);
  }
  while (nextAddress_ < addresses_.size()) {
    const SocketAddress& a = addresses_[nextAddress_++];
    tried_.push_back(addressText(a));
    fd_ = ::socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      lastErrno_ = errno;
      if (lastErrno_ == EMFILE || lastErrno_ == ENFILE || lastErrno_ == ENOBUFS || lastErrno_ == ENOMEM) {
        throwErrnoError(lastErrno_, what);
      }
      continue;  // EAFNOSUPPORT (no IPv6 here): try the next address
    }
    peer_ = a;
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&a.storage), a.length) == 0) {
      connected();
      return;
    }
    const int e = errno;
    if (e == EINPROGRESS || e == EINTR) {
      watch(fd_, EPOLLOUT, kSocketTag);
      return;
    }
    lastErrno_ = e;
    closeFd(fd_);
  }
  if (tried_.size() > 1) throwErrnoError(lastErrno_, fmt::format("{} (tried {})", what, joined(tried_)));
  throwErrnoError(lastErrno_, what);
}

void Connector::connected() {
  const std::string what = fmt::format("connect to {}", endpoint_);
  unwatch(fd_);
  fdEvents_ = 0;
  if (options_.unixSocket.empty()) {
    setOption(fd_, IPPROTO_TCP, TCP_NODELAY, 1, what + ": TCP_NODELAY");
    if (options_.keepAlive) {
      setOption(fd_, SOL_SOCKET, SO_KEEPALIVE, 1, what + ": SO_KEEPALIVE");
      setOption(fd_, IPPROTO_TCP, TCP_KEEPIDLE, kKeepAliveIdleSeconds, what + ": TCP_KEEPIDLE");
      setOption(fd_, IPPROTO_TCP, TCP_KEEPINTVL, kKeepAliveIntervalSeconds, what + ": TCP_KEEPINTVL");
      setOption(fd_, IPPROTO_TCP, TCP_KEEPCNT, kKeepAliveProbes, what + ": TCP_KEEPCNT");
    }
  }
  const int fd = std::exchange(fd_, -1);
  if (!options_.tls.enabled) {
    stream_ = adoptPlainStream(fd, endpoint_);
    step_ = Step::End;
    state_ = State::Done;
    return;
  }
  handshaking_ = startTlsStream(fd, endpoint_, tls_.get(), options_);
  step_ = Step::Handshake;
}

void Connector::handshake(SteadyTime now) {
  const std::string what = fmt::format("TLS handshake with {}", endpoint_);
  if (probe_) {
    const PortProbe::State s = probe_->step();
    if (s != PortProbe::State::Working) {
      unwatch(probe_->pollFd());
      const bool plain = s == PortProbe::State::Answered && isPlainRedisAnswer(probe_->head());
      probe_.reset();
      if (plain && handshaking_->bytesReceived() == 0) {
        throw ConfigurationError(ErrorKind::Tls, "TLS",
                                 fmt::format("redlimit: {}: the server answers in plain text (RESP) and not in TLS: "
                                             "this is its plain-text port; connect with redis:// "
                                             "(ClientOptions::Tls::enabled = false), or to the server's tls-port",
                                             what));
      }
    }
  }
  IoWant want = IoWant::Read;
  if (handshaking_->handshakeStep(want)) {
    unwatch(handshaking_->fd());
    if (probe_) unwatch(probe_->pollFd());
    probe_.reset();
    stream_ = std::move(handshaking_);
    step_ = Step::End;
    state_ = State::Done;
    return;
  }
  watch(handshaking_->fd(), want == IoWant::Read ? EPOLLIN : EPOLLOUT, kSocketTag);
  // A plain Redis port reads the ClientHello as an unfinished inline command and stays silent:
  // that is a set-up error (ConfigurationError (Tls)), not an outage. Asked once, in plain text, when nothing at
  // all came back by half the time.
  if (!probed_ && now >= probeAt_ && handshaking_->bytesReceived() == 0) {
    probed_ = true;
    probe_ = std::make_unique<PortProbe>(peer_, kPlainPing, deadline_);
    if (probe_->state() == PortProbe::State::Working) {
      watch(probe_->pollFd(), EPOLLIN, kProbeTag);
    } else {
      probe_.reset();
    }
  }
  if (now >= deadline_) timedOut();
}

void Connector::timedOut() const {
  const auto budget = msBetween(started_, deadline_);
  switch (step_) {
    case Step::Lookup:
      throw TimeoutError(fmt::format(
          "redlimit: connect to {}: the name lookup of \"{}\" did not finish within the connect timeout ({} ms)",
          endpoint_, options_.host, budget));
    case Step::Handshake:
      throw TimeoutError(
          fmt::format("redlimit: TLS handshake with {}: timed out after {} ms (the server did not finish the "
                      "handshake; is this a TLS port?)",
                      endpoint_, budget));
    case Step::Connect:
    case Step::End:
      break;
  }
  if (!options_.unixSocket.empty()) {
    throw TimeoutError(fmt::format("redlimit: connect to {}: timed out after {} ms{}", endpoint_, budget,
                                   backlogFull_ ? " (the server's listen backlog stayed full)" : ""));
  }
  throw TimeoutError(fmt::format("redlimit: connect to {}: timed out after {} ms (no answer from {})", endpoint_,
                                 budget, tried_.empty() ? std::string("?") : tried_.back()));
}

std::unique_ptr<Stream> connectStream(const ClientOptions::Connection& options, SteadyTime deadline) {
  Connector c(options, deadline);
  for (;;) {
    switch (c.step()) {
      case Connector::State::Done:
        return c.take();
      case Connector::State::Failed:
        std::rethrow_exception(c.error());
      case Connector::State::Working:
        break;
    }
    pollfd p{c.pollFd(), POLLIN, 0};
    if (::poll(&p, 1, pollTimeout(c.wakeAt())) < 0 && errno != EINTR) {
      throwErrnoError(errno, fmt::format("connect to {}", endpointOf(options)));
    }
  }
}

}  // namespace redlimit::detail
