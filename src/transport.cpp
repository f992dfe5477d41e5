#include "transport.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <optional>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <fmt/format.h>

#include "error_mapping.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

using std::chrono::milliseconds;

// epoll_wait's timeout for `deadline`: ms, rounded up (a deadline is never checked early), capped.
constexpr std::uint64_t kWakeEvent = UINT64_MAX;
constexpr std::uint64_t kTimerEvent = UINT64_MAX - 1;

int waitMs(SteadyTime now, SteadyTime deadline) {
  if (deadline <= now) return 0;
  if (deadline == SteadyTime::max()) return -1;
  const auto left = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<std::int64_t>(left, 60000));
}

thread_local const Runner* tlsIoRunner = nullptr;

}  // namespace

const Runner* currentIoRunner() noexcept { return tlsIoRunner; }
void setCurrentIoRunner(const Runner* runner) noexcept { tlsIoRunner = runner; }

std::shared_ptr<Transport> Transport::start(const ConnectionOptions& connection, const PoolOptions& pool,
                                            const Runner* owner, EventCallback events) {
  checkOptions(connection);
  checkOptions(pool);
  std::shared_ptr<Transport> t(new Transport(connection, pool, std::move(events)));
  if (owner != nullptr) t->owner_ = owner;
  // The thread keeps the transport alive until it returns: shutdown() from a completion (the
  // last Client reference dropped on the I/O thread) must not free the loop under itself.
  t->thread_ = std::thread([self = t] { self->run(); });
  t->ioThreadId_ = t->thread_.get_id();
  return t;
}

Transport::Transport(const ConnectionOptions& connection, const PoolOptions& pool, EventCallback events)
    : connection_(connection), pool_(pool), endpoint_(endpointOf(connection)), events_(std::move(events)) {
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timerFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epollFd_ < 0 || wakeFd_ < 0 || timerFd_ < 0) {
    const int e = errno;
    if (epollFd_ >= 0) ::close(epollFd_);
    if (wakeFd_ >= 0) ::close(wakeFd_);
    if (timerFd_ >= 0) ::close(timerFd_);
    if (e == EMFILE || e == ENFILE) {
      throw ResourceLimitError(e == EMFILE ? "EMFILE" : "ENFILE",
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

void Transport::submit(Request request) {
  if (pending_.fetch_add(1, std::memory_order_relaxed) >= pool_.maxPending) {
    pending_.fetch_sub(1, std::memory_order_relaxed);
    rejected_.fetch_add(1, std::memory_order_relaxed);
    request.done(Outcome{Reply{}, errorOf<PoolTimeoutError>(fmt::format(
                                      "redlimit: {}: {} requests already wait for {} (PoolOptions::maxPending); "
                                      "not sent",
                                      request.command, pool_.maxPending, endpoint_))});
    return;
  }
  const std::size_t conn = nextConn_.fetch_add(1, std::memory_order_relaxed) % conns_.size();
  if (!onIoThread() && writeNow(*conns_[conn], request)) return;
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
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wakeFd_, &one, sizeof one);
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
  if (!c.stream || !c.greeted || c.pipe->size() > 0 || !c.carry.empty() || c.writeFailed || c.pipe->broken()) {
    return false;
  }
  {
    // Requests submitted before this one for the same connection go first (one thread's requests
    // leave in the order it made them); after shutdown() the I/O thread ends everything.
    const LockGuard guard(mutex_);
    if (c.queued > 0 || stopping_) return false;
  }
  const SteadyTime deadline = request.deadline;
  request.counted = true;
  c.pipe->push(std::move(request));
  direct_.fetch_add(1, std::memory_order_relaxed);
  c.writeFailed = writeOut(c);
  const bool failed = c.writeFailed != nullptr;
  lock.unlock();
  if (failed) {
    const std::uint64_t one = 1;  // the I/O thread closes the connection and ends its requests
    [[maybe_unused]] const auto n = ::write(wakeFd_, &one, sizeof one);
  } else {
    armTimer(deadline);
  }
  return true;
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
  return waitForOutcome(std::move(request), [this](Request r) { submit(std::move(r)); });
}

void Transport::shutdown() noexcept {
  {
    const LockGuard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wakeFd_, &one, sizeof one);
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
  return c;
}

void Transport::watch(Conn& c, bool out) {
  if (!c.stream || c.watchingOut == out) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
  ev.data.u64 = c.index;
  ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, c.stream->fd(), &ev);
  c.watchingOut = out;
}

void Transport::connect(Conn& c, std::vector<Finished>& done) {
  const SteadyTime started = Steady::now();
  const SteadyTime deadline = deadlineAfter<Steady>(started, connection_.connectTimeout);
  try {
    c.stream = connectStream(connection_, deadline);
  } catch (...) {
    const auto why = std::current_exception();
    for (auto& r : c.carry) done.push_back(Finished{std::move(r.done), Outcome{Reply{}, cloneError(why)}, true});
    c.carry.clear();
    return;
  }
  created_.fetch_add(1, std::memory_order_relaxed);
  open_.fetch_add(1, std::memory_order_relaxed);
  c.pipe = std::make_unique<Pipeline>(connection_.replyLimits, connection_.user, endpoint_, events_, &scriptsSeen_);
  c.watchingOut = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = c.index;
  ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, c.stream->fd(), &ev);

  // The greeting goes first, in the same write as the requests that waited: AUTH and SELECT as
  // configured, or a PING, so that a server that wants a password says so before a script runs.
  auto greet = [&](std::initializer_list<std::string_view> argv) {
    c.m.assertHeld();  // called below, in connect()
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
  c.connectStarted = started;
}

void Transport::greeted(Conn& c) {
  c.greeted = true;
  // A request's deadline is absolute from submit(): waiting for the connection took from it.
  for (auto& r : c.carry) c.pipe->push(std::move(r));
  c.carry.clear();
}

void Transport::expireCarry(Conn& c, SteadyTime now, std::vector<Finished>& done) {
  auto late = std::stable_partition(c.carry.begin(), c.carry.end(), [&](const Request& r) { return r.deadline > now; });
  if (late == c.carry.end()) return;
  const std::string state = c.stream
                                ? fmt::format("connected {} ms ago, the greeting not answered yet",
                                              std::chrono::duration_cast<milliseconds>(now - c.connectStarted).count())
                                : std::string("not connected");
  for (auto it = late; it != c.carry.end(); ++it) {
    done.push_back(Finished{
        std::move(it->done),
        Outcome{Reply{}, errorOf<TimeoutError>(fmt::format("redlimit: {}: not sent within its {} ms deadline: it "
                                                           "waited for a connection to {} ({})",
                                                           it->command, it->budget.count(), endpoint_, state))},
        it->counted});
  }
  c.carry.erase(late, c.carry.end());
}

SteadyTime Transport::carryDeadline(const Conn& c) {
  SteadyTime next = SteadyTime::max();
  for (const auto& r : c.carry) next = std::min(next, r.deadline);
  return next;
}

std::exception_ptr Transport::writeOut(Conn& c) {
  try {
    for (;;) {
      const std::size_t before = c.pipe->awaiting();
      const std::string_view out = c.pipe->output();
      requests_.fetch_add(c.pipe->awaiting() - before, std::memory_order_relaxed);
      if (out.empty()) break;
      const std::size_t n = c.stream->write(out.data(), out.size());
      if (n == 0) {
        watch(c, true);
        return nullptr;
      }
      writes_.fetch_add(1, std::memory_order_relaxed);
      c.pipe->wrote(n);
      if (!c.pipe->hasOutput()) break;
    }
    watch(c, false);
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

void Transport::flush(Conn& c, std::vector<Finished>& done) {
  std::exception_ptr why = std::move(c.writeFailed);
  c.writeFailed = nullptr;
  if (!why) {
    if (!c.stream || !c.pipe->hasOutput()) return;
    why = writeOut(c);
    if (!why) return;
  }
  // A server that refuses a request answers first and then closes (with a reset, as it leaves
  // the rest unread): its answer is usually still readable, and says more than the reset. A
  // write that failed with more than an IoError (TlsError: the stream read the server's alert
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

std::exception_ptr Transport::closedBeforeAnyReply(const std::exception_ptr& why) {
  // A TLS port resets a plain-text connection before its first reply: ask it in TLS, so that the
  // caller learns the set-up is wrong rather than that Redis is down.
  if (!holds<ClosedError>(why) || !connection_.unixSocket.empty() || connection_.tls.enabled) return why;
  const SteadyTime deadline = deadlineAfter<Steady>(Steady::now(), connection_.connectTimeout);
  if (!speaksTls(connection_.host, connection_.port, deadline)) return why;
  std::string text;
  try {
    std::rethrow_exception(why);
  } catch (const std::exception& e) {
    text = e.what();
  }
  return std::make_exception_ptr(TlsPortError(
      "", fmt::format("redlimit: connect to {}: port {} speaks TLS (it reset the plain-text connection and answered "
                      "a TLS hello); use rediss:// or ConnectionOptions::tls.enabled, or the server's plain port ({})",
                      endpoint_, connection_.port, text)));
}

void Transport::closeConn(Conn& c, std::exception_ptr why, std::vector<Finished>& done, bool byPeer) {
  if (!c.stream) return;
  if (byPeer && c.pipe->replies() == 0) why = closedBeforeAnyReply(why);
  ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, c.stream->fd(), nullptr);
  std::vector<Request> rest = c.pipe->close(why, done);
  c.stream.reset();
  c.pipe.reset();
  c.watchingOut = false;
  c.writeFailed = nullptr;
  open_.fetch_sub(1, std::memory_order_relaxed);
  discarded_.fetch_add(1, std::memory_order_relaxed);
  // Never written, so safe to send again on a new connection, unless the failure is one a new
  // connection would meet too (a password, a replica, a TLS port) or connecting itself failed
  // (the greeting got no answer): those fail now, with everything that waited for this connection.
  const bool carry = holds<IoError>(why) && c.greeted;
  if (!c.greeted) {
    for (auto& r : c.carry) done.push_back(Finished{std::move(r.done), Outcome{Reply{}, cloneError(why)}, true});
    c.carry.clear();
  }
  for (auto& r : rest) {
    if (r.internal || !r.counted) continue;  // a new connection greets and loads afresh
    if (carry) {
      c.carry.push_back(std::move(r));
    } else {
      done.push_back(Finished{std::move(r.done), Outcome{Reply{}, cloneError(why)}, true});
    }
  }
}

void Transport::complete(std::vector<Finished>& done) {
  // Counted out before the callbacks run: a caller woken by one sees its request gone.
  std::size_t counted = 0;
  for (const auto& f : done) counted += f.counted ? 1 : 0;
  if (counted > 0) pending_.fetch_sub(counted, std::memory_order_relaxed);
  for (auto& f : done) {
    if (!f.done) continue;
    try {
      f.done(std::move(f.outcome));
    } catch (...) {
      // A completion must not throw (documented); the loop cannot report it to anyone.
    }
  }
  done.clear();
}

void Transport::failEverything(std::vector<Finished>& done) {
  const auto why = errorOf<ClosedError>("redlimit: the Client was shut down before the request got its reply");
  for (auto& c : conns_) {
    const LockGuard lock(c->m);
    if (c->stream) closeConn(*c, why, done, false);  // no TLS-port probe: the server did nothing
    for (auto& r : c->carry) done.push_back(Finished{std::move(r.done), Outcome{Reply{}, cloneError(why)}, true});
    c->carry.clear();
  }
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
        done.push_back(Finished{std::move(request.done),
                                Outcome{Reply{}, errorOf<ClosedError>("redlimit: the Client was shut down; not sent")},
                                true});
      }
      incoming_.clear();
      stopped_ = true;
      break;
    }
    for (auto& c : conns_) {
      const LockGuard lock(c->m);
      if (!c->carry.empty()) {
        if (!c->stream) {
          connect(*c, done);
        } else if (c->greeted) {
          for (auto& r : c->carry) c->pipe->push(std::move(r));
          c->carry.clear();
        }
      }
      flush(*c, done);
    }
    complete(done);

    SteadyTime now = Steady::now();
    SteadyTime next = SteadyTime::max();
    bool again = false;
    for (auto& c : conns_) {
      const LockGuard lock(c->m);
      if (c->pipe) next = std::min(next, c->pipe->nextDeadline());
      next = std::min(next, carryDeadline(*c));
      if (!c->carry.empty() && (!c->stream || c->greeted)) again = true;
      if (c->writeFailed) again = true;
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
      Conn& c = *conns_[static_cast<std::size_t>(events[i].data.u64)];
      const LockGuard lock(c.m);
      if (!c.stream) continue;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) readFrom(c, done);
      if (c.stream && !c.greeted && c.pipe->size() == 0) greeted(c);
      if (c.stream && (events[i].events & EPOLLOUT)) flush(c, done);
    }
    now = Steady::now();
    for (auto& c : conns_) {
      const LockGuard lock(c->m);
      expireCarry(*c, now, done);
      if (!c->pipe) continue;
      if (c->pipe->nextDeadline() <= now) c->pipe->expire(now, done);
      if (c->pipe->broken()) closeConn(*c, c->pipe->brokenBy(), done);
    }
    complete(done);
  }
  complete(done);
}

}  // namespace redlimit::detail
