#include "transport/transport.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <optional>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

// A completion callback that runs this long has blocked the I/O thread (a decision's own work on
// it takes microseconds; a thread descheduled on a loaded machine comes back well within this).
constexpr std::chrono::milliseconds kBlockedCallback{100};
// Completions run this many at a time, the deadlines of every connection checked between (a
// decision's completion takes microseconds: a slice, well under a millisecond).
constexpr std::size_t kCompletionSlice = 32;

using std::chrono::milliseconds;

// epoll_wait's timeout for `deadline`: ms, rounded up (a deadline is never checked early), capped.
constexpr std::uint64_t kWakeEvent = UINT64_MAX;
constexpr std::uint64_t kTimerEvent = UINT64_MAX - 1;
// A connection's descriptors in the epoll: its stream is tagged with its index alone, its
// Connector and its TLS-port probe with the index and one of these bits.
constexpr std::uint64_t kConnectorBit = std::uint64_t{1} << 32;
constexpr std::uint64_t kProbeBit = std::uint64_t{1} << 33;
constexpr std::uint64_t kIndexMask = kConnectorBit - 1;

int waitMs(SteadyTime now, SteadyTime deadline) {
  if (deadline <= now) return 0;
  if (deadline == SteadyTime::max()) return -1;
  const auto left = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<std::int64_t>(left, 60000));
}

thread_local const Runner* tlsIoRunner = nullptr;

// A sync wait on this thread (SyncWait) is about to wait for the request it submits: the request
// an idle connection took from this thread (`transport`, its connection `conn`), whose reply this
// thread reads in awaitCallerRead().
struct CallerRead {
  bool expected = false;
  std::shared_ptr<Transport> transport;
  std::size_t conn = 0;
  SteadyTime deadline;
};
thread_local CallerRead tlsCallerRead;

}  // namespace

void expectCallerRead() noexcept { tlsCallerRead.expected = true; }

void awaitCallerRead() noexcept {
  CallerRead claim = std::move(tlsCallerRead);
  tlsCallerRead = CallerRead{};
  if (claim.transport) claim.transport->readClaimed(claim.conn, claim.deadline);
}

void dropCallerRead() noexcept {
  CallerRead claim = std::move(tlsCallerRead);
  tlsCallerRead = CallerRead{};
  if (claim.transport) claim.transport->releaseClaimed(claim.conn);
}

const Runner* currentIoRunner() noexcept { return tlsIoRunner; }
void setCurrentIoRunner(const Runner* runner) noexcept { tlsIoRunner = runner; }

std::shared_ptr<Transport> Transport::start(const ClientOptions::Connection& connection,
                                            const ClientOptions::Pool& pool, const Runner* owner, EventCallback events,
                                            TlsContext tls, NameResolver resolver) {
  checkOptions(connection);
  checkOptions(pool);
  if (connection.tls.enabled && !tls && connection.unixSocket.empty()) {
    // Here, on the caller's thread: reading the trust store can take a while. A failure is left
    // to the first connect, which tries again and fails its requests with it.
    try {
      tls = makeTlsContext(connection.tls, endpointOf(connection));
    } catch (const Error&) {
    }
  }
  std::shared_ptr<Transport> t(new Transport(connection, pool, std::move(events), std::move(tls), std::move(resolver)));
  if (owner != nullptr) t->owner_ = owner;
  // The thread keeps the transport alive until it returns: shutdown() from a completion (the
  // last Client reference dropped on the I/O thread) must not free the loop under itself.
  t->thread_ = std::thread([self = t] { self->run(); });
  t->ioThreadId_ = t->thread_.get_id();
  return t;
}

Transport::Transport(const ClientOptions::Connection& connection, const ClientOptions::Pool& pool, EventCallback events,
                     TlsContext tls, NameResolver resolver)
    : connection_(connection),
      pool_(pool),
      endpoint_(endpointOf(connection)),
      events_(std::move(events)),
      tls_(std::move(tls)),
      resolver_(std::move(resolver)) {
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timerFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epollFd_ < 0 || wakeFd_ < 0 || timerFd_ < 0) {
    const int e = errno;
    if (epollFd_ >= 0) ::close(epollFd_);
    if (wakeFd_ >= 0) ::close(wakeFd_);
    if (timerFd_ >= 0) ::close(timerFd_);
    if (e == EMFILE || e == ENFILE) {
      throw ConfigurationError(ErrorKind::ResourceLimit, e == EMFILE ? "EMFILE" : "ENFILE",
                               fmt::format("redlimit: cannot start the I/O thread's poller: {}", std::strerror(e)));
    }
    throw IoError(fmt::format("redlimit: cannot start the I/O thread's poller: {}", std::strerror(e)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeEvent;
  ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev);
  ev.data.u64 = kTimerEvent;
  ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, timerFd_, &ev);
  conns_.reserve(pool.size);
  for (std::size_t i = 0; i < pool.size; ++i) {
    conns_.push_back(std::make_unique<Conn>());
    conns_.back()->index = i;
  }
}

Transport::~Transport() {
  if (thread_.joinable()) thread_.detach();  // only after abandonAfterFork, which never frees
  if (epollFd_ >= 0) ::close(epollFd_);
  if (wakeFd_ >= 0) ::close(wakeFd_);
  if (timerFd_ >= 0) ::close(timerFd_);
}

void Transport::wakeIoThread() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wakeFd_, &one, sizeof one);
}

void Transport::submit(Request request) { submitFrom(std::move(request), false); }

void Transport::submitFrom(Request request, bool callerReads) {
  // The request may hold the last owner of this transport (a Cluster node's, in its completion):
  // once it is written, its reply may come and its completion run on the I/O thread before this
  // thread is done here (armTimer, the counters, the caller's own read), so this call holds one.
  const std::shared_ptr<Transport> self = onIoThread() ? nullptr : weak_from_this().lock();
  if (request.script != nullptr && noScripts_.known()) {
    if (std::exception_ptr refused = noScripts_.refusal(Steady::now())) {
      request.done(Outcome{Reply{}, std::move(refused)});
      return;
    }
  }
  if (pending_.fetch_add(1, std::memory_order_relaxed) >= pool_.maxPending) {
    pending_.fetch_sub(1, std::memory_order_relaxed);
    rejected_.fetch_add(1, std::memory_order_relaxed);
    request.done(Outcome{
        Reply{}, errorOf<TimeoutError>(
                     ErrorKind::PoolTimeout,
                     fmt::format("redlimit: {}: {} requests already wait for {} (ClientOptions::Pool::maxPending); "
                                 "not sent",
                                 request.command, pool_.maxPending, endpoint_))});
    return;
  }
  const std::size_t conn = nextConn_.fetch_add(1, std::memory_order_relaxed) % conns_.size();
  // The caller's own round trip: a sync call (callerReads), or a request a sync wait follows on
  // this thread (SyncWait), whose reply that wait reads if this thread writes it. The latter not for
  // a Cluster's or a Sentinel's transport, whose completions their runner's logic wraps.
  const bool syncWaitFollows = !callerReads && tlsCallerRead.expected && !tlsCallerRead.transport && owner_ == this;
  if ((callerReads || syncWaitFollows) && !onIoThread() && !connection_.tls.enabled) {
    const SteadyTime deadline = request.deadline;
    if (Conn* c = ownIdle(conn, request)) {
      if (callerReads) {
        callerRoundTrip(*c, deadline);
      } else if (callerWrite(*c)) {
        tlsCallerRead = CallerRead{true, shared_from_this(), c->index, deadline};
      }
      return;
    }
  } else if (!onIoThread() && writeNow(*conns_[conn], request)) {
    return;
  }
  bool wake = false;
  std::optional<Request> refused;  // completed below, outside the lock
  {
    const LockGuard lock(mutex_);
    if (stopping_) {
      pending_.fetch_sub(1, std::memory_order_relaxed);
      refused.emplace(std::move(request));
    } else {
      ++conns_[conn]->queued;
      incoming_.emplace_back(conn, std::move(request));
      wake = !wakePending_ && !onIoThread();
      wakePending_ = true;
    }
  }
  if (refused) {
    refused->done(Outcome{Reply{}, errorOf<ClosedError>(fmt::format("redlimit: {}: the Client is shut down; not sent",
                                                                    refused->command))});
    return;
  }
  if (wake) {
    wakeIoThread();
  }
}

// An idle connection (open, greeted, nothing queued, written or waiting for it) takes a request
// from the submitting thread at once: it is written here instead of being handed to the I/O
// thread, which saves waking that thread and switching to it (a sync call's latency). The I/O
// thread still reads the reply and runs the completion. Only over plain TCP and unix sockets: a
// TLS session may need to read while it writes, which is the I/O thread's business. Returns false
// (and leaves `request` alone) when the connection is busy or its lock is held.
bool Transport::writeNow(Conn& c, Request& request) {
  if (connection_.tls.enabled) return false;
  if (!c.m.try_lock()) return false;
  UniqueLock lock(c.m, std::adopt_lock);
  if (!takeable(c)) return false;
  const SteadyTime deadline = request.deadline;
  request.counted = true;
  c.pipe->push(std::move(request));
  direct_.fetch_add(1, std::memory_order_relaxed);
  c.ioFailed = writeOut(c);
  const bool failed = c.ioFailed != nullptr;
  lock.unlock();
  if (failed) {
    wakeIoThread();  // it closes the connection and ends its requests
  } else {
    armTimer(deadline);
  }
  return true;
}

bool Transport::idle(const Conn& c) {
  return !c.owned && c.stream && c.greeted && c.pipe->size() == 0 && c.carry.empty() && !c.ioFailed &&
         !c.pipe->broken();
}

bool Transport::takeable(const Conn& c) {
  if (!idle(c)) return false;
  // Requests submitted before this one for the same connection go first (one thread's requests
  // leave in the order it made them); after shutdown() the I/O thread ends everything.
  const LockGuard guard(mutex_);
  return c.queued == 0 && !stopping_;
}

Transport::Take Transport::own(Conn& c, Request& request) {
  if (!c.m.try_lock()) return Take::Busy;
  const UniqueLock lock(c.m, std::adopt_lock);
  if (!c.stream || !c.greeted || c.ioFailed || c.pipe->broken()) return Take::NotReady;
  if (!takeable(c)) return Take::Busy;
  request.counted = true;
  c.pipe->push(std::move(request));
  c.owned = true;
  // The I/O thread must not wake for the reply the caller reads: the fd is watched only for the
  // peer's close (EPOLLRDHUP), edge-triggered, so that it, a hang-up or an error (which epoll always
  // reports) wakes that thread once at most. It stays so after a plain round trip (the next one
  // needs no epoll_ctl) until the I/O thread writes on it again (watch()).
  if (!c.quiet) {
    epoll_event ev{};
    ev.events = EPOLLRDHUP | EPOLLET;
    ev.data.u64 = c.index;
    ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, c.stream->fd(), &ev);
    c.quiet = true;
    c.watchingOut = false;
  }
  return Take::Taken;
}

Transport::Conn* Transport::ownIdle(std::size_t first, Request& request) {
  for (std::size_t i = 0; i < conns_.size(); ++i) {
    Conn& c = *conns_[(first + i) % conns_.size()];
    const Take took = own(c, request);
    if (took == Take::Taken) return &c;
    if (i == 0 && took == Take::NotReady) return nullptr;
  }
  return nullptr;
}

// Only the plain case is done here: the request written in full, and the bytes read end it. Then
// the connection goes back as it came (idle). Otherwise the I/O thread takes over where this
// left, with what it already knows: output still to write (EPOLLOUT, a NOSCRIPT's SCRIPT LOAD and
// resend), a broken pipeline (closed), ioFailed (a failed write or read: closed, as after
// writeNow), a written request past its deadline (expired: TimeoutError, the connection closed).
void Transport::callerRoundTrip(Conn& c, SteadyTime deadline) {
  if (callerWrite(c)) callerRead(c, deadline);
}

bool Transport::callerWrite(Conn& c) {
  // Owned: this thread alone uses the stream and the pipeline until release().
  direct_.fetch_add(1, std::memory_order_relaxed);
  std::exception_ptr why;
  try {
    if (writePipe(*c.stream, *c.pipe)) return true;
  } catch (...) {
    why = std::current_exception();
  }
  release(c, why, false);
  return false;
}

void Transport::readClaimed(std::size_t conn, SteadyTime deadline) { callerRead(*conns_[conn], deadline); }

void Transport::releaseClaimed(std::size_t conn) { release(*conns_[conn], nullptr, false); }

void Transport::callerRead(Conn& c, SteadyTime deadline) {
  // Owned: this thread alone uses the stream and the pipeline until release().
  Stream& stream = *c.stream;
  Pipeline& pipe = *c.pipe;
  std::vector<Finished> done;
  std::exception_ptr why;
  bool plain = false;
  try {
    char buf[16384];
    pollfd pfd{stream.fd(), POLLIN, 0};
    for (;;) {
      const SteadyTime now = Steady::now();
      if (now >= deadline) break;  // the I/O thread expires it (TimeoutError) and closes the connection
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
      const timespec wait{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
      const int ready = ::ppoll(&pfd, 1, deadline == SteadyTime::max() ? nullptr : &wait, nullptr);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      const std::size_t n = stream.read(buf, sizeof buf);
      if (n == 0) continue;
      pipe.received(buf, n, done);
      if (pipe.broken() || pipe.hasOutput()) break;
      if (pipe.awaiting() == 0) {
        plain = true;
        break;
      }
    }
  } catch (...) {
    why = std::current_exception();
  }
  if (plain) callerRead_.fetch_add(1, std::memory_order_relaxed);
  release(c, why, plain);
  completeHere(done);
}

void Transport::release(Conn& c, std::exception_ptr why, bool plain) {  // NOLINT(performance-unnecessary-value-param)
  std::vector<Finished> done;
  bool wake = false;
  {
    const LockGuard lock(c.m);
    c.owned = false;
    // The server closed it after the caller's reply came (QUIT, CLIENT KILL between calls): the
    // I/O thread closes it now, rather than a later request finding out.
    if (std::exchange(c.closedWhileOwned, false) && !why) {
      why = errorOf<ClosedError>(fmt::format("redlimit: {}: the server closed the connection", endpoint_));
      plain = false;
    }
    c.ioFailed = std::move(why);
    if (!plain) watch(c, false);  // the I/O thread reads what is left
    wake = !plain;
    // Requests the I/O thread could not send elsewhere while this thread owned the connection.
    if (!c.carry.empty()) wake = true;
    // Requests of a connection still connecting, which found every ready connection taken.
    if (rerouteAfterRelease_.exchange(false, std::memory_order_relaxed)) wake = true;
    bool stopping = false;
    {
      const LockGuard guard(mutex_);
      stopping = stopping_;
    }
    // shutdown(): the I/O thread ends everything else (and may have returned already) while this
    // thread owns the connection, so this thread closes it (the one that comes second finds it closed).
    if (stopping) {
      failConn(c, errorOf<ClosedError>("redlimit: the Client was shut down before the request got its reply"), done);
      wake = false;
    }
  }
  completeHere(done);
  if (wake) {
    wakeIoThread();
  }
}

void Transport::completeHere(std::vector<Finished>& done) {
  if (done.empty()) return;
  std::vector<Finished> others;
  for (auto& f : done) {
    if (!f.counted) {
      others.push_back(std::move(f));
      continue;
    }
    pending_.fetch_sub(1, std::memory_order_relaxed);
    try {
      if (f.done) f.done(std::move(f.outcome));
    } catch (...) {  // a completion must not throw (documented)
    }
  }
  done.clear();
  if (others.empty()) return;
  bool wake = false;
  {
    const LockGuard lock(mutex_);
    if (!stopped_) {
      for (auto& f : others) handedOver_.push_back(std::move(f));
      others.clear();
      wake = !wakePending_;
      wakePending_ = true;
    }
  }
  for (auto& f : others) {  // no I/O thread left to run them
    try {
      if (f.done) f.done(std::move(f.outcome));
    } catch (...) {  // an event callback must not throw (documented)
    }
  }
  if (wake) {
    wakeIoThread();
  }
}

// The I/O thread sleeps until the earliest deadline it knew of; a request written by its caller
// may end earlier, so the timer wakes the thread then (without waking it now).
void Transport::armTimer(SteadyTime deadline) {
  if (deadline == SteadyTime::max()) return;
  const LockGuard lock(timerMutex_);
  if (deadline >= armedAt_) return;
  armedAt_ = deadline;
  itimerspec spec{};
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
  spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;  // 0 would disarm
  ::timerfd_settime(timerFd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

Outcome waitForOutcome(Request request, const std::function<void(Request)>& send) {
  struct Waiter {
    std::mutex m;
    std::condition_variable cv;
    bool ready = false;
    Outcome out;
  };
  auto w = std::make_shared<Waiter>();
  request.done = [w](Outcome o) {
    {
      std::lock_guard<std::mutex> lock(w->m);
      w->out = std::move(o);
      w->ready = true;
    }
    w->cv.notify_one();
  };
  const SteadyTime giveUp = deadlineAfter<Steady>(request.deadline, std::chrono::seconds(1));
  const std::string command = request.command;
  send(std::move(request));
  std::unique_lock<std::mutex> lock(w->m);
  if (!w->cv.wait_until(lock, giveUp, [&] { return w->ready; })) {
    return Outcome{Reply{}, errorOf<TimeoutError>(fmt::format(
                                "redlimit: {}: the I/O thread did not end the request by its deadline", command))};
  }
  return std::move(w->out);
}

Outcome Transport::call(Request request) {
  return waitForOutcome(std::move(request), [this](Request r) { submitFrom(std::move(r), true); });
}

void Transport::shutdown() noexcept {
  {
    const LockGuard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wakeIoThread();
  if (onIoThread()) {
    thread_.detach();  // the loop returns after this completion and frees the transport
  } else if (thread_.joinable()) {
    thread_.join();
  }
}

void Transport::abandonAfterFork() noexcept {
  for (auto& c : conns_) {
    if (c->stream) {
      Stream* leaked = c->stream.release();  // its destructor could take locks; only the fd goes
      ::close(leaked->fd());
    }
    if (c->connector) c->connector.release()->abandonAfterFork();  // leaked, as the stream
    if (c->tlsPortProbe) c->tlsPortProbe.release()->abandonAfterFork();
  }
  ::close(epollFd_);
  ::close(wakeFd_);
  ::close(timerFd_);
  epollFd_ = wakeFd_ = timerFd_ = -1;
}

TransportCounters Transport::counters() const {
  TransportCounters c;
  c.open = open_.load(std::memory_order_relaxed);
  c.created = created_.load(std::memory_order_relaxed);
  c.discarded = discarded_.load(std::memory_order_relaxed);
  c.pending = pending_.load(std::memory_order_relaxed);
  c.rejected = rejected_.load(std::memory_order_relaxed);
  c.writes = writes_.load(std::memory_order_relaxed);
  c.requests = requests_.load(std::memory_order_relaxed);
  c.direct = direct_.load(std::memory_order_relaxed);
  c.callerRead = callerRead_.load(std::memory_order_relaxed);
  c.stalls = stalls_.load(std::memory_order_relaxed);
  c.stalled = stalled_.load(std::memory_order_relaxed);
  c.noScriptsRefused = noScripts_.refused();
  c.noScriptsRechecks = noScripts_.rechecks();
  return c;
}

void Transport::watch(Conn& c, bool out) {
  if (!c.stream || (!c.quiet && c.watchingOut == out)) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
  ev.data.u64 = c.index;
  ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, c.stream->fd(), &ev);
  c.watchingOut = out;
  c.quiet = false;
}

void Transport::unregister(int fd) {
  if (fd >= 0) ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
}

void Transport::failCarry(Conn& c, std::size_t count, const std::exception_ptr& why, std::vector<Finished>& done) {
  count = std::min(count, c.carry.size());
  for (std::size_t i = 0; i < count; ++i) {
    done.push_back(failed(c.carry[i], cloneError(why)));
  }
  c.carry.erase(c.carry.begin(), c.carry.begin() + static_cast<std::ptrdiff_t>(count));
  c.held -= std::min(c.held, count);
}

void Transport::connect(Conn& c, std::vector<Finished>& done) {
  c.connectStarted = Steady::now();
  const SteadyTime deadline = deadlineAfter<Steady>(c.connectStarted, connection_.connectTimeout);
  if (connection_.tls.enabled && !tls_ && connection_.unixSocket.empty()) {
    try {
      tls_ = makeTlsContext(connection_.tls, endpoint_);
    } catch (...) {
      failCarry(c, c.carry.size(), std::current_exception(), done);
      return;
    }
  }
  c.connector = std::make_unique<Connector>(connection_, deadline, tls_, resolver_);
  if (c.connector->state() == Connector::State::Working) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c.index | kConnectorBit;
    ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, c.connector->pollFd(), &ev);
  }
  stepConnector(c, done);
}

void Transport::stepConnector(Conn& c, std::vector<Finished>& done) {
  if (!c.connector) return;
  const Connector::State state = c.connector->step();
  if (state == Connector::State::Working) return;
  unregister(c.connector->pollFd());
  if (state == Connector::State::Failed) {
    const std::exception_ptr why = c.connector->error();
    c.connector.reset();
    failCarry(c, c.carry.size(), why, done);
    return;
  }
  c.stream = c.connector->take();
  c.peer = c.connector->peer();
  c.connector.reset();
  connected(c, done);
}

void Transport::connected(Conn& c, std::vector<Finished>& done) {
  created_.fetch_add(1, std::memory_order_relaxed);
  open_.fetch_add(1, std::memory_order_relaxed);
  c.pipe = std::make_unique<Pipeline>(connection_.replyLimits, connection_.user, endpoint_, events_, &scriptsSeen_,
                                      &scriptsSeenMutex_, &noScripts_);
  c.watchingOut = false;
  c.quiet = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = c.index;
  ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, c.stream->fd(), &ev);

  // The greeting goes first, in the same write as the requests that waited: AUTH and SELECT as
  // configured, or a PING, so that a server that wants a password says so before a script runs.
  auto greet = [&](std::initializer_list<std::string_view> argv) {
    c.m.assertHeld();  // called below, in connected()
    Request r = makeRequest(argv.begin(), argv.size());
    r.deadline = deadlineAfter<Steady>(Steady::now(), connection_.connectTimeout);
    r.budget = connection_.connectTimeout;
    r.internal = true;
    r.counted = false;
    r.done = [](const Outcome&) {};  // an error ends the connection (Request::internal)
    c.pipe->push(std::move(r));
  };
  if (!connection_.password.empty()) {
    if (connection_.user.empty()) {
      greet({"AUTH", connection_.password});
    } else {
      greet({"AUTH", connection_.user, connection_.password});
    }
  }
  if (connection_.db != 0) {
    const fmt::format_int db(connection_.db);
    greet({"SELECT", std::string_view(db.data(), db.size())});
  }
  if (connection_.password.empty() && connection_.db == 0) greet({"PING"});

  // The requests wait in `carry` until the greeting is answered (greeted()): pipelined behind it,
  // a slow command of theirs would hold the greeting's reply back (Redis writes a connection's
  // replies after it ran everything it read), and a connect timeout would hit them all.
  c.greeted = false;
  c.connectStarted = Steady::now();
  flush(c, done);
}

void Transport::greeted(Conn& c) {
  c.greeted = true;
  // A request's deadline is absolute from submit(): waiting for the connection took from it.
  for (auto& r : c.carry) c.pipe->push(std::move(r));
  c.carry.clear();
}

void Transport::expireCarry(Conn& c, SteadyTime now, std::vector<Finished>& done) {
  if (carryDeadline(c) > now) return;
  const auto waited = std::chrono::duration_cast<milliseconds>(now - c.connectStarted).count();
  std::string state;
  if (c.stream) {
    state = fmt::format("connected {} ms ago, the greeting not answered yet", waited);
  } else if (c.connector) {
    state = fmt::format("{} for {} ms", c.connector->doing(), waited);
  } else if (c.tlsPortProbe) {
    state = "asking whether the port speaks TLS";
  } else {
    state = "not connected";
  }
  std::vector<Request> kept;
  std::size_t held = 0;
  for (std::size_t i = 0; i < c.carry.size(); ++i) {
    Request& r = c.carry[i];
    const bool wasHeld = i < c.held;
    if (r.deadline > now) {
      held += wasHeld ? 1 : 0;
      kept.push_back(std::move(r));
      continue;
    }
    if (stall_.covers(r.deadline)) {
      done.push_back(failed(r, stall_.error(r.command, r.budget)));
      continue;
    }
    if (wasHeld) {
      // Its connection was reset before any reply: that is its error, whatever the probe says later.
      done.push_back(failed(r, cloneError(c.heldError)));
      continue;
    }
    done.push_back(failed(r, errorOf<TimeoutError>(fmt::format("redlimit: {}: not sent within its {} ms deadline: it "
                                                               "waited for a connection to {} ({})",
                                                               r.command, r.budget.count(), endpoint_, state))));
  }
  c.carry = std::move(kept);
  c.held = held;
}

bool Transport::ready(const Conn& c) { return !c.owned && c.stream && c.greeted && !c.ioFailed && !c.pipe->broken(); }

void Transport::routeToReady(std::vector<Finished>& done) {
  readyConns_.clear();
  for (auto& c : conns_) {
    const LockGuard lock(c->m);
    if (ready(*c)) readyConns_.push_back(c.get());
  }
  if (readyConns_.empty() || readyConns_.size() == conns_.size()) return;
  std::size_t next = 0;
  std::vector<Request> moving;
  for (auto& c : conns_) {
    {
      const LockGuard lock(c->m);
      // The first `held` wait for the TLS-port probe's verdict on their own connection.
      if (ready(*c) || c->carry.size() <= c->held) continue;
      const auto from = c->carry.begin() + static_cast<std::ptrdiff_t>(c->held);
      moving.assign(std::make_move_iterator(from), std::make_move_iterator(c->carry.end()));
      c->carry.erase(from, c->carry.end());
    }
    // A connection found ready above may have been taken by a calling thread since (owned: its
    // pipeline is that thread's until it hands it back): a request goes to the next one still
    // ready, or back to where it waited when none is (routed again once a caller hands back).
    const auto pushToReady = [&](Request& request) {
      for (std::size_t tried = 0; tried < readyConns_.size(); ++tried) {
        Conn& to = *readyConns_[next++ % readyConns_.size()];
        const LockGuard lock(to.m);
        if (!ready(to)) continue;
        to.pipe->push(std::move(request));
        return true;
      }
      return false;
    };
    for (auto& r : moving) {
      if (!pushToReady(r)) {
        const LockGuard lock(c->m);
        c->carry.push_back(std::move(r));
        rerouteAfterRelease_.store(true, std::memory_order_relaxed);
      }
    }
    moving.clear();
  }
  for (Conn* c : readyConns_) {
    const LockGuard lock(c->m);
    flush(*c, done);
  }
}

SteadyTime Transport::carryDeadline(const Conn& c) {
  SteadyTime next = SteadyTime::max();
  for (const auto& r : c.carry) next = std::min(next, r.deadline);
  return next;
}

bool Transport::writePipe(Stream& stream, Pipeline& pipe) {
  for (;;) {
    const std::size_t before = pipe.awaiting();
    const std::string_view out = pipe.output();
    requests_.fetch_add(pipe.awaiting() - before, std::memory_order_relaxed);
    if (out.empty()) return true;
    const std::size_t n = stream.write(out.data(), out.size());
    if (n == 0) return false;
    writes_.fetch_add(1, std::memory_order_relaxed);
    pipe.wrote(n);
    if (!pipe.hasOutput()) return true;
  }
}

std::exception_ptr Transport::writeOut(Conn& c) {
  try {
    watch(c, !writePipe(*c.stream, *c.pipe));
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

void Transport::flush(Conn& c, std::vector<Finished>& done) {
  if (c.owned) return;
  std::exception_ptr why = std::move(c.ioFailed);
  c.ioFailed = nullptr;
  if (!why) {
    if (!c.stream || !c.pipe->hasOutput()) return;
    why = writeOut(c);
    if (!why) return;
  }
  // A server that refuses a request answers first and then closes (with a reset, as it leaves
  // the rest unread): its answer is usually still readable, and says more than the reset. A
  // write that failed with more than an IoError (ConfigurationError (Tls): the stream read the server's alert
  // already) keeps its error; a read could only report the closed session.
  if (holds<IoError>(why)) readFrom(c, done);
  closeConn(c, why, done);
}

void Transport::readFrom(Conn& c, std::vector<Finished>& done) {
  char buf[16384];
  try {
    while (c.stream && !c.pipe->broken()) {
      const std::size_t n = c.stream->read(buf, sizeof buf);
      if (n == 0) {
        if (c.stream->wantAfterRead() == IoWant::Write) watch(c, true);
        break;
      }
      c.pipe->received(buf, n, done);
    }
  } catch (...) {
    closeConn(c, std::current_exception(), done);
    return;
  }
  if (c.pipe && c.pipe->broken()) closeConn(c, c.pipe->brokenBy(), done);
}

bool Transport::mayBeTlsPort(const std::exception_ptr& why) const {
  return holds<ClosedError>(why) && connection_.unixSocket.empty() && !connection_.tls.enabled;
}

std::exception_ptr Transport::tlsPortError(const std::exception_ptr& why) const {
  std::string text;
  try {
    std::rethrow_exception(why);
  } catch (const std::exception& e) {
    text = e.what();
  }
  return std::make_exception_ptr(ConfigurationError(
      ErrorKind::TlsPort, "",
      fmt::format(
          "redlimit: connect to {}: port {} speaks TLS (it reset the plain-text connection and answered "
          "a TLS hello); use rediss:// or ClientOptions::Connection::tls.enabled, or the server's plain port ({})",
          endpoint_, connection_.port, text)));
}

void Transport::stepTlsPortProbe(Conn& c, std::vector<Finished>& done) {
  if (!c.tlsPortProbe) return;
  const PortProbe::State state = c.tlsPortProbe->step();
  if (state == PortProbe::State::Working) return;
  const bool tls = state == PortProbe::State::Answered && isTlsAnswer(c.tlsPortProbe->head());
  unregister(c.tlsPortProbe->pollFd());
  c.tlsPortProbe.reset();
  const std::exception_ptr why = std::exchange(c.heldError, nullptr);
  // A TLS port fails every request that waits for this connection: a new one would meet it too.
  if (tls) {
    failCarry(c, c.carry.size(), tlsPortError(why), done);
  } else {
    failCarry(c, c.held, why, done);
  }
  c.held = 0;
}

// `why` by value: callers pass c.pipe->brokenBy(), a reference into the pipeline this function
// destroys (c.pipe.reset()), so a const reference would dangle.
void Transport::closeConn(Conn& c, std::exception_ptr why,  // NOLINT(performance-unnecessary-value-param)
                          std::vector<Finished>& done, bool byPeer) {
  if (!c.stream) return;
  // A TLS port resets a plain-text connection before its first reply: it is asked in TLS (a
  // PortProbe the loop steps), so that the caller learns the set-up is wrong rather than that
  // Redis is down. Meanwhile what waited for this connection waits for the answer.
  const bool probe = byPeer && c.pipe->replies() == 0 && mayBeTlsPort(why) && !c.tlsPortProbe;
  ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, c.stream->fd(), nullptr);
  std::vector<Request> rest = c.pipe->close(why, done);
  c.stream.reset();
  c.pipe.reset();
  c.watchingOut = false;
  c.quiet = false;
  c.ioFailed = nullptr;
  c.closedWhileOwned = false;
  noScripts_.forget();  // the next connection may reach another server, or one fixed meanwhile
  open_.fetch_sub(1, std::memory_order_relaxed);
  discarded_.fetch_add(1, std::memory_order_relaxed);
  // Never written, so safe to send again on a new connection, unless the failure is one a new
  // connection would meet too (a password, a replica, a TLS port) or connecting itself failed
  // (the greeting got no answer): those fail now, with everything that waited for this connection.
  const bool carry = holds<IoError>(why) && c.greeted;
  if (probe) {
    std::vector<Request> held;
    for (auto& r : rest) {
      if (!r.internal && r.counted) held.push_back(std::move(r));
    }
    held.insert(held.end(), std::make_move_iterator(c.carry.begin()), std::make_move_iterator(c.carry.end()));
    c.carry = std::move(held);
    c.held = c.carry.size();
    c.heldError = why;
    c.tlsPortProbe = std::make_unique<PortProbe>(c.peer, tlsHello(),
                                                 deadlineAfter<Steady>(Steady::now(), connection_.connectTimeout));
    if (c.tlsPortProbe->state() == PortProbe::State::Working) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = c.index | kProbeBit;
      ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, c.tlsPortProbe->pollFd(), &ev);
    }
    stepTlsPortProbe(c, done);
    return;
  }
  if (!c.greeted) {
    for (auto& r : c.carry) done.push_back(failed(r, cloneError(why)));
    c.carry.clear();
  }
  for (auto& r : rest) {
    if (r.internal || !r.counted) continue;  // a new connection greets and loads afresh
    if (carry) {
      c.carry.push_back(std::move(r));
    } else {
      done.push_back(failed(r, cloneError(why)));
    }
  }
}

void Transport::complete(std::vector<Finished>& done) {
  if (done.empty()) return;
  completions_.add(done);
  // Earliest deadline first, kCompletionSlice at a time, every connection's deadlines checked
  // between slices: a connection that timed out with thousands of requests on it fails them all
  // at once, and another connection's request whose deadline passes meanwhile must not wait for
  // every one of their callbacks.
  runCompletions(
      completions_, kCompletionSlice, [this](std::vector<Finished>& due) { expireDue(Steady::now(), due); },
      [this](std::vector<Finished>& slice) {
        // Counted out before the callbacks run: a caller woken by one sees its request gone.
        std::size_t counted = 0;
        for (const auto& f : slice) counted += f.counted ? 1 : 0;
        if (counted > 0) pending_.fetch_sub(counted, std::memory_order_relaxed);
        // Each callback is timed (one clock read each): one that holds the thread for
        // kBlockedCallback or more is a stall, and requests whose deadline falls within it end
        // with TimeoutError (CallbackBlocked).
        SteadyTime before = Steady::now();
        for (auto& f : slice) {
          if (!f.done) continue;
          if (sawStall_ && f.outcome.error && holdsKind(f.outcome.error, ErrorKind::CallbackBlocked)) {
            stalled_.fetch_add(1, std::memory_order_relaxed);
          }
          try {
            f.done(std::move(f.outcome));
          } catch (...) {
            // A completion must not throw (documented); the loop cannot report it to anyone.
          }
          const SteadyTime after = Steady::now();
          if (after - before >= kBlockedCallback) noteStall(before, after);
          before = after;
        }
      });
}

void Transport::expireDue(SteadyTime now, std::vector<Finished>& done) {
  for (auto& c : conns_) {
    const LockGuard lock(c->m);
    if (c->connector && c->connector->wakeAt() <= now) stepConnector(*c, done);
    if (c->tlsPortProbe && c->tlsPortProbe->wakeAt() <= now) stepTlsPortProbe(*c, done);
    expireCarry(*c, now, done);
    if (!c->pipe || c->owned) continue;
    if (c->pipe->nextDeadline() <= now) c->pipe->expire(now, done, stall_);
    if (c->pipe->broken()) closeConn(*c, c->pipe->brokenBy(), done);
  }
}

void Transport::noteStall(SteadyTime from, SteadyTime to) {
  stall_ = Stall{from, to};
  sawStall_ = true;
  stalls_.fetch_add(1, std::memory_order_relaxed);
  if (!events_) return;
  Event e;
  e.kind = Event::Kind::CallbackBlocked;
  e.node = endpoint_;
  e.description = fmt::format(
      "a completion callback held the I/O thread of the Client's connections to {} for {} ms: nothing was read or "
      "written meanwhile, and requests whose deadline passed end with a TimeoutError of kind CallbackBlocked "
      "(callbacks must not "
      "block: hand slow work to a thread of your own)",
      endpoint_, std::chrono::duration_cast<milliseconds>(to - from).count());
  try {
    events_(e);
  } catch (...) {  // an event callback must not throw (documented)
  }
}

void Transport::failEverything(std::vector<Finished>& done) {
  const auto why = errorOf<ClosedError>("redlimit: the Client was shut down before the request got its reply");
  for (auto& c : conns_) {
    const LockGuard lock(c->m);
    failConn(*c, why, done);
  }
}

void Transport::failConn(Conn& c, const std::exception_ptr& why, std::vector<Finished>& done) {
  // An owned connection is its caller's to close (release(), once this thread stopped).
  if (c.stream && !c.owned) closeConn(c, why, done, false);  // no TLS-port probe: the server did nothing
  if (c.connector) unregister(c.connector->pollFd());
  c.connector.reset();
  if (c.tlsPortProbe) unregister(c.tlsPortProbe->pollFd());
  c.tlsPortProbe.reset();
  c.held = 0;
  c.heldError = nullptr;
  for (auto& r : c.carry) done.push_back(failed(r, cloneError(why)));
  c.carry.clear();
}

void Transport::run() {
  setCurrentIoRunner(owner_);
  std::vector<std::pair<std::size_t, Request>> batch;
  std::vector<std::size_t> moved(conns_.size(), 0);
  std::vector<Finished> done;
  epoll_event events[64];
  for (;;) {
    bool stop = false;
    {
      const LockGuard lock(mutex_);
      batch.swap(incoming_);
      wakePending_ = false;
      stop = stopping_;
      for (auto& f : handedOver_) done.push_back(std::move(f));
      handedOver_.clear();
    }
    // Into each connection's carry, in order; Conn::queued falls only once they are there, so a
    // submitting thread never writes past them (writeNow).
    for (std::size_t i = 0; i < batch.size();) {
      const std::size_t index = batch[i].first;
      const LockGuard lock(conns_[index]->m);
      for (; i < batch.size() && batch[i].first == index; ++i) {
        batch[i].second.counted = true;
        conns_[index]->carry.push_back(std::move(batch[i].second));
        ++moved[index];
      }
    }
    batch.clear();
    {
      const LockGuard lock(mutex_);
      for (std::size_t i = 0; i < moved.size(); ++i) {
        conns_[i]->queued -= moved[i];
        moved[i] = 0;
      }
    }
    if (stop) {
      failEverything(done);
      complete(done);
      const LockGuard lock(mutex_);
      for (auto& [index, request] : incoming_) {
        done.push_back(failed(request, errorOf<ClosedError>("redlimit: the Client was shut down; not sent")));
      }
      incoming_.clear();
      for (auto& f : handedOver_) done.push_back(std::move(f));
      handedOver_.clear();
      stopped_ = true;
      break;
    }
    const SteadyTime start = Steady::now();
    for (auto& c : conns_) {
      const LockGuard lock(c->m);
      // A request whose deadline passed while it was queued (a completion callback held this
      // thread) is not sent: Redis would run it for nobody.
      expireCarry(*c, start, done);
      if (!c->carry.empty()) {
        if (!c->stream && !c->connector && !c->tlsPortProbe) {
          connect(*c, done);
        } else if (ready(*c)) {  // not onto a broken pipeline: they wait for the next connection
          for (auto& r : c->carry) c->pipe->push(std::move(r));
          c->carry.clear();
        }
      }
      flush(*c, done);
    }
    if (conns_.size() > 1) routeToReady(done);
    complete(done);

    SteadyTime now = Steady::now();
    SteadyTime next = SteadyTime::max();
    bool again = false;
    for (auto& c : conns_) {
      const LockGuard lock(c->m);
      if (c->pipe && !c->owned) next = std::min(next, c->pipe->nextDeadline());
      next = std::min(next, carryDeadline(*c));
      if (c->connector) next = std::min(next, c->connector->wakeAt());
      if (c->tlsPortProbe) next = std::min(next, c->tlsPortProbe->wakeAt());
      const bool idle = !c->stream && !c->connector && !c->tlsPortProbe;
      if (!c->carry.empty() && (idle || (c->stream && c->greeted && !c->owned))) again = true;
      if (c->ioFailed) again = true;
    }
    {
      const LockGuard lock(mutex_);
      if (wakePending_ || stopping_) again = true;  // completions queued more
    }
    const int n = ::epoll_wait(epollFd_, events, 64, again ? 0 : waitMs(now, next));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kTimerEvent) {
        std::uint64_t fired = 0;
        [[maybe_unused]] const auto r = ::read(timerFd_, &fired, sizeof fired);
        const LockGuard lock(timerMutex_);
        if (armedAt_ <= Steady::now()) armedAt_ = SteadyTime::max();  // the deadlines below see to the rest
        continue;
      }
      if (events[i].data.u64 == kWakeEvent) {
        std::uint64_t drained = 0;
        [[maybe_unused]] const auto r = ::read(wakeFd_, &drained, sizeof drained);
        continue;
      }
      const std::uint64_t tag = events[i].data.u64;
      Conn& c = *conns_[static_cast<std::size_t>(tag & kIndexMask)];
      const LockGuard lock(c.m);
      if ((tag & kConnectorBit) != 0) {
        stepConnector(c, done);
        continue;
      }
      if ((tag & kProbeBit) != 0) {
        stepTlsPortProbe(c, done);
        continue;
      }
      if (!c.stream) continue;
      if (c.owned) {  // a calling thread reads it (an event from before it took it), or the peer closed it
        if ((events[i].events & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) != 0) c.closedWhileOwned = true;
        continue;
      }
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) readFrom(c, done);
      if (c.stream && !c.greeted && c.pipe->size() == 0) greeted(c);
      if (c.stream && (events[i].events & EPOLLOUT)) flush(c, done);
    }
    expireDue(Steady::now(), done);
    complete(done);
  }
  complete(done);
}

}  // namespace redlimit::detail
