#include "topology/sentinel.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "codec/resp.hpp"
#include "transport/connector.hpp"

namespace redlimit::detail {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kMinDiscoveryInterval{200};
constexpr milliseconds kResubscribePause{250};

// A blocking connection for a few commands: the sentinels' questions and ROLE on a candidate.
// `toSentinel`: the server is a sentinel, whose login is ClientOptions::Sentinel' (for the messages).
class Conversation {
 public:
  Conversation(const ClientOptions::Connection& options, SteadyTime deadline, bool toSentinel)
      : stream_(connectStream(options, deadline)),
        parser_(options.replyLimits),
        deadline_(deadline),
        user_(options.user),
        toSentinel_(toSentinel) {
    if (!options.password.empty()) {
      if (options.user.empty()) {
        (void)ask({"AUTH", options.password});
      } else {
        (void)ask({"AUTH", options.user, options.password});
      }
    }
  }
  // The reply to argv; an error reply is thrown as error_mapping classifies it.
  WireReply ask(std::initializer_list<std::string_view> argv) {
    std::string out;
    appendCommand(out, argv.begin(), argv.size());
    writeAll(*stream_, out.data(), out.size(), deadline_);
    WireReply r = next(deadline_);
    if (r.isError) {
      ReplyContext context;
      context.command = *argv.begin();
      context.user = user_;
      context.toSentinel = toSentinel_;
      throwReplyError(r.error, context);
    }
    return r;
  }
  // The next reply (a pushed message on a subscribed connection), waiting until `deadline`.
  WireReply next(SteadyTime deadline) {
    for (;;) {
      if (auto r = parser_.next()) return std::move(*r);
      char buf[4096];
      const std::size_t n = readSome(*stream_, buf, sizeof buf, deadline);
      parser_.feed(buf, n);
    }
  }

 private:
  std::unique_ptr<Stream> stream_;
  ReplyParser parser_;
  SteadyTime deadline_;
  std::string user_;
  bool toSentinel_;
};

std::optional<int> portOf(const std::string& text) {
  int port = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (ec != std::errc() || ptr != text.data() + text.size() || port < 1 || port > 65535) return std::nullopt;
  return port;
}

}  // namespace

std::shared_ptr<SentinelRunner> SentinelRunner::start(const ClientOptions& options) {
  checkOptions(options);
  std::shared_ptr<SentinelRunner> r(new SentinelRunner(options));
  r->maintainer_ = std::thread([self = r.get()] { self->maintain(); });
  r->subscriber_ = std::thread([self = r.get()] { self->subscribe(); });
  return r;
}

SentinelRunner::SentinelRunner(const ClientOptions& options) : options_(options) {
  sentinelConnection_ = options.connection;
  sentinelConnection_.user = options.sentinel.user;
  sentinelConnection_.password = options.sentinel.password;
  sentinelConnection_.db = 0;
  sentinelConnection_.unixSocket.clear();
  sentinelConnection_.tls.enabled = options.sentinel.tls;
}

SentinelRunner::~SentinelRunner() {
  shutdown();
  if (maintainer_.joinable()) maintainer_.detach();  // only after abandonAfterFork, which never frees
  if (subscriber_.joinable()) subscriber_.detach();
}

void SentinelRunner::send(Request request, int /*slot*/) {
  std::shared_ptr<Transport> primary;
  std::uint64_t generation = 0;
  bool full = false;
  std::exception_ptr refused;
  {
    const LockGuard lock(mutex_);
    primary = primary_;
    generation = generation_;
    if (!stopping_ && !primary) {
      // The last discovery was refused a login: this fails at once too (the maintainer keeps
      // looking, every 200 ms, so a fixed login is found).
      refused = loginRefused_;
      full = !refused && parked_.size() >= options_.pool.maxPending;
      if (!refused && !full) {
        parked_.push_back(std::move(request));
        discoveryWanted_ = true;
        wake_.notify_one();
        return;
      }
    }
  }
  if (refused) {
    request.done(Outcome{Reply{}, cloneError(refused)});
    return;
  }
  if (full) {
    request.done(Outcome{
        Reply{},
        errorOf<TimeoutError>(ErrorKind::PoolTimeout,
                              fmt::format("redlimit: {}: {} requests already wait for the primary of \"{}\" "
                                          "(ClientOptions::Pool::maxPending); not sent",
                                          request.command, options_.pool.maxPending, options_.sentinel.primaryName))});
    return;
  }
  if (!primary) {
    request.done(Outcome{Reply{}, errorOf<ClosedError>(fmt::format("redlimit: {}: the Client is shut down; not sent",
                                                                   request.command))});
    return;
  }
  submitTo(primary, generation, std::move(request));
}

void SentinelRunner::submitTo(const std::shared_ptr<Transport>& primary, std::uint64_t generation, Request request) {
  // A failure that may mean a failover sends the maintainer to the sentinels; a demoted primary's
  // READONLY is an outage here (the policy decides), not the configuration error it is for a
  // fixed address.
  request.done = [self = shared_from_this(), generation, command = request.command,
                  done = std::move(request.done)](Outcome out) {
    if (out.error && holdsKind(out.error, ErrorKind::Replica)) {
      self->wantDiscovery();
      out.error = self->demotedError(out.error);
    } else if (out.error && holds<ClosedError>(out.error)) {
      self->wantDiscovery();
      if (std::exception_ptr moved = self->retiredError(generation, command, out.error)) out.error = moved;
    } else if (out.error && holds<IoError>(out.error) && !isCongestion(*errorIn(out.error))) {
      self->wantDiscovery();
    }
    done(std::move(out));
  };
  primary->submit(std::move(request));
}

std::exception_ptr SentinelRunner::demotedError(const std::exception_ptr& error) const {
  std::string text;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    text = e.what();
  }
  // error_mapping's words are for a fixed address ("point ClientOptions::Connection at the primary; a
  // configuration error"): here the address came from the sentinels, so only the server's own
  // answer is kept.
  constexpr std::string_view kServerSaid = "not the primary: ";
  if (const auto at = text.find(kServerSaid); at != std::string::npos) text = text.substr(at + kServerSaid.size());
  if (const auto advice = text.find(" (point ClientOptions::Connection"); advice != std::string::npos)
    text.resize(advice);
  return std::make_exception_ptr(
      IoError(ErrorKind::Unavailable, "READONLY",
              fmt::format("redlimit: the primary the sentinels named for \"{}\" was demoted to a replica (a "
                          "failover): {}; an outage, decided by the failure policy: the sentinels are asked "
                          "for the new primary, and a retry goes there",
                          options_.sentinel.primaryName, text)));
}

std::exception_ptr SentinelRunner::retiredError(std::uint64_t generation, const std::string& command,
                                                const std::exception_ptr& error) const {
  ClientOptions::Node now;
  {
    const LockGuard lock(mutex_);
    if (stopping_ || generation == generation_) return nullptr;  // shut down, or still the primary
    now = primaryAddress_;
  }
  std::string text;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    text = e.what();
  }
  return std::make_exception_ptr(ClosedError(fmt::format(
      "redlimit: {}: the primary of \"{}\" moved to {} (a failover) while this request was on the old primary's "
      "connection, which was retired; it may not have run: retry (it goes to the new primary) ({})",
      command, options_.sentinel.primaryName, endpointOf(now), text)));
}

Outcome SentinelRunner::sendAndWait(Request request, int slot) {
  return waitForOutcome(std::move(request), [this, slot](Request r) { send(std::move(r), slot); });
}

void SentinelRunner::wantDiscovery() {
  {
    const LockGuard lock(mutex_);
    if (discoveryWanted_) return;
    discoveryWanted_ = true;
  }
  wake_.notify_one();
}

void SentinelRunner::expireParked(std::vector<Request>& expired) {
  const SteadyTime now = Steady::now();
  auto late = std::stable_partition(parked_.begin(), parked_.end(), [&](const Request& r) { return r.deadline > now; });
  std::move(late, parked_.end(), std::back_inserter(expired));
  parked_.erase(late, parked_.end());
}

template <class End>
bool SentinelRunner::endCallbacks(std::vector<Request>& requests, End&& end) {
  // A callback, or the destruction of its request, may drop the last other reference to this
  // runner: hold one meanwhile, and if it turns out to be the last, the runner ends with this
  // thread (its destructor detaches it) and nothing of it may be touched afterwards.
  std::shared_ptr<SentinelRunner> keep = weak_from_this().lock();
  for (Request& r : requests) end(r);
  requests.clear();
  const std::weak_ptr<SentinelRunner> alive = keep;
  keep.reset();
  return !alive.expired();
}

void SentinelRunner::maintain() {
  setCurrentIoRunner(this);
  UniqueLock lock(mutex_);
  while (!stopping_) {
    if (loginRefused_ && !parked_.empty()) {
      std::vector<Request> refused;
      refused.swap(parked_);
      const std::exception_ptr why = loginRefused_;
      lock.unlock();
      if (!endCallbacks(refused, [&](Request& r) { r.done(Outcome{Reply{}, cloneError(why)}); })) return;
      lock.lock();
      continue;
    }
    std::vector<Request> expired;
    expireParked(expired);
    if (!expired.empty()) {
      const std::string why = lastFailure_.empty() ? std::string("no sentinel has answered yet") : lastFailure_;
      lock.unlock();
      const std::string& primaryName = options_.sentinel.primaryName;
      if (!endCallbacks(expired, [&](Request& r) {
            r.done(Outcome{Reply{}, errorOf<TimeoutError>(fmt::format(
                                        "redlimit: {}: no primary for \"{}\" was found within the request's {} ms "
                                        "deadline ({})",
                                        r.command, primaryName, r.budget.count(), why))});
          })) {
        return;
      }
      lock.lock();
      continue;
    }
    const SteadyTime now = Steady::now();
    const SteadyTime discoverAt = discoveryWanted_ ? lastDiscovery_ + kMinDiscoveryInterval : SteadyTime::max();
    if (discoverAt <= now) {
      discoveryWanted_ = false;
      lastDiscovery_ = now;
      lock.unlock();
      const bool found = discover();
      lock.lock();
      if (!found) discoveryWanted_ = true;
      continue;
    }
    SteadyTime next = discoverAt;
    for (const Request& r : parked_) next = std::min(next, r.deadline);
    if (next == SteadyTime::max()) {
      wake_.wait(lock.native());
    } else {
      wake_.wait_until(lock.native(), next);
    }
  }
}

bool SentinelRunner::discover() {
  const std::string& name = options_.sentinel.primaryName;
  std::string failures;
  // A refused login is configuration, not an outage: once no primary is found, the first one
  // ends the requests at once, under every policy (see loginRefused_).
  std::exception_ptr sentinelRefused;   // a sentinel refused our login
  std::exception_ptr candidateRefused;  // a primary the sentinels named refused the primary's login
  bool sentinelAnswered = false;        // a sentinel took our login and answered
  for (const ClientOptions::Node& sentinel : options_.sentinel.sentinels) {
    if (stopped_.load(std::memory_order_acquire)) return true;
    ClientOptions::Node candidate;
    try {
      ClientOptions::Connection o = sentinelConnection_;
      o.host = sentinel.host;
      o.port = sentinel.port;
      Conversation c(o, deadlineAfter<Steady>(Steady::now(), o.connectTimeout), true);
      const WireReply r = c.ask({"SENTINEL", "get-master-addr-by-name", name});
      sentinelAnswered = true;
      if (r.value.type != Reply::Type::Array || r.value.elements.size() != 2) {
        failures += fmt::format("; {} does not know \"{}\"", endpointOf(sentinel), name);
        continue;
      }
      candidate.host = r.value.elements[0].str;
      const auto port = portOf(r.value.elements[1].str);
      if (!port)
        throw ReplyError(ErrorKind::UnexpectedReply, "",
                         fmt::format("redlimit: sentinel {} named the port \"{}\" for \"{}\"", endpointOf(sentinel),
                                     r.value.elements[1].str, name));
      candidate.port = *port;
    } catch (const Error& e) {
      failures += fmt::format("; sentinel {}: {}", endpointOf(sentinel), e.what());
      if (!sentinelRefused && dynamic_cast<const AuthError*>(&e) != nullptr) sentinelRefused = std::current_exception();
      continue;
    }
    // The sentinels may not have noticed a failure yet: believe the server itself.
    try {
      ClientOptions::Connection o = options_.connection;
      o.host = candidate.host;
      o.port = candidate.port;
      o.unixSocket.clear();
      Conversation c(o, deadlineAfter<Steady>(Steady::now(), o.connectTimeout), false);
      const WireReply role = c.ask({"ROLE"});
      if (role.value.type != Reply::Type::Array || role.value.elements.empty() ||
          role.value.elements[0].str != "master") {
        failures +=
            fmt::format("; {} (named by {}) is not a primary (ROLE)", endpointOf(candidate), endpointOf(sentinel));
        continue;
      }
    } catch (const Error& e) {
      failures += fmt::format("; {} (named by {}): {}", endpointOf(candidate), endpointOf(sentinel), e.what());
      if (!candidateRefused && dynamic_cast<const AuthError*>(&e) != nullptr) {
        candidateRefused = std::current_exception();
      }
      continue;
    }
    std::shared_ptr<Transport> fresh;
    std::shared_ptr<Transport> old;
    ClientOptions::Node previous;
    std::vector<Request> parked;
    std::uint64_t generation = 0;
    {
      const LockGuard lock(mutex_);
      if (stopping_) return true;
      if (primary_ && primaryAddress_.host == candidate.host && primaryAddress_.port == candidate.port) {
        lastFailure_.clear();
        loginRefused_ = nullptr;
        return true;  // no change
      }
    }
    ClientOptions::Connection o = options_.connection;
    o.host = candidate.host;
    o.port = candidate.port;
    o.unixSocket.clear();
    fresh = Transport::start(o, options_.pool, this, options_.onEvent);
    {
      const LockGuard lock(mutex_);
      if (stopping_) {
        fresh->shutdown();
        return true;
      }
      if (primary_) switches_.fetch_add(1, std::memory_order_relaxed);
      previous = primaryAddress_;
      old = std::move(primary_);
      if (old) retiring_ = old;  // for counters() and a fork, until it is released below
      primary_ = fresh;
      generation = ++generation_;
      primaryAddress_ = candidate;
      lastFailure_.clear();
      loginRefused_ = nullptr;
      parked.swap(parked_);
    }
    discoveries_.fetch_add(1, std::memory_order_relaxed);
    for (Request& r : parked) submitTo(fresh, generation, std::move(r));
    const bool switched = old != nullptr;
    if (old) {
      // What was still on it ends (ClosedError saying the primary moved: the policy decides, a
      // retry goes to the new one). Then it is released: its connections, I/O thread and
      // descriptors (epoll, eventfd, timerfd) go now, not when the Client does; its counts stay.
      old->shutdown();
      const TransportCounters last = old->counters();
      const LockGuard lock(mutex_);
      retiredCounts_.created += last.created;
      retiredCounts_.discarded += last.discarded;
      retiredCounts_.rejected += last.rejected;
      retiredCounts_.writes += last.writes;
      retiredCounts_.requests += last.requests;
      retiredCounts_.direct += last.direct;
      retiring_.reset();
    }
    old.reset();                         // the last owner, unless a caller still holds it for a moment
    if (switched && options_.onEvent) {  // a failover (the first primary found is none); no lock held
      Event e;
      e.kind = Event::Kind::Topology;
      e.node = endpointOf(candidate);
      e.description = fmt::format("Sentinel failover: primary {} is now {} (was {})", options_.sentinel.primaryName,
                                  e.node, endpointOf(previous));
      options_.onEvent(e);
    }
    return true;
  }
  // A sentinel that refused our login while none took it, or a primary that refused its own.
  const std::exception_ptr refused = candidateRefused ? candidateRefused : sentinelAnswered ? nullptr : sentinelRefused;
  const LockGuard lock(mutex_);
  lastFailure_ = failures.empty() ? std::string("no sentinel configured") : failures.substr(2);
  loginRefused_ = refused ? refusedLoginError(refused, lastFailure_) : nullptr;
  return false;
}

std::exception_ptr SentinelRunner::refusedLoginError(const std::exception_ptr& error, const std::string& why) const {
  const std::string message = fmt::format(
      "redlimit: no primary for \"{}\" can be found: a login was refused ({}); a configuration error, "
      "thrown under every failure policy",
      options_.sentinel.primaryName, why);
  try {
    std::rethrow_exception(error);
  } catch (const AuthError& e) {
    return std::make_exception_ptr(AuthError(e.kind(), e.code(), message));
  } catch (...) {
    return error;
  }
}

void SentinelRunner::subscribe() {
  // One sentinel at a time, round-robin on failure; a +switch-master for our primary sends the
  // maintainer to the sentinels at once (it checks the new primary with ROLE itself).
  const std::string& name = options_.sentinel.primaryName;
  std::size_t next = 0;
  while (!stopped_.load(std::memory_order_acquire)) {
    const ClientOptions::Node& sentinel = options_.sentinel.sentinels[next++ % options_.sentinel.sentinels.size()];
    try {
      ClientOptions::Connection o = sentinelConnection_;
      o.host = sentinel.host;
      o.port = sentinel.port;
      Conversation c(o, deadlineAfter<Steady>(Steady::now(), o.connectTimeout), true);
      (void)c.ask({"SUBSCRIBE", "+switch-master"});
      // Subscribed: a failover that happened while we were not may have been missed.
      wantDiscovery();
      while (!stopped_.load(std::memory_order_acquire)) {
        WireReply m;
        try {
          m = c.next(Steady::now() + milliseconds(100));
        } catch (const TimeoutError&) {
          continue;  // nothing said; look at stopped_ again
        }
        // ["message", "+switch-master", "<name> <old ip> <old port> <new ip> <new port>"]
        if (m.value.type == Reply::Type::Array && m.value.elements.size() == 3 &&
            m.value.elements[0].str == "message") {
          const std::string& text = m.value.elements[2].str;
          if (text.compare(0, name.size() + 1, name + " ") == 0) {
            announcements_.fetch_add(1, std::memory_order_relaxed);
            {
              const LockGuard lock(mutex_);
              discoveryWanted_ = true;
              lastDiscovery_ = {};  // now, not after the usual pause
            }
            wake_.notify_one();
          }
        }
      }
    } catch (const Error&) {
      // This sentinel is gone or refused us: the next one, after a pause.
      UniqueLock lock(mutex_);
      wake_.wait_for(lock.native(), kResubscribePause, [&] {
        mutex_.assertHeld();
        return stopping_;
      });
    }
  }
}

void SentinelRunner::shutdown() noexcept {
  std::shared_ptr<Transport> primary;
  std::vector<Request> parked;
  {
    const LockGuard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    primary = primary_;
    parked.swap(parked_);
  }
  stopped_.store(true, std::memory_order_release);
  wake_.notify_all();
  for (std::thread* t : {&maintainer_, &subscriber_}) {
    if (!t->joinable()) continue;
    if (std::this_thread::get_id() == t->get_id()) {
      t->detach();
    } else {
      t->join();
    }
  }
  for (Request& r : parked) {
    r.done(Outcome{Reply{},
                   errorOf<ClosedError>(fmt::format("redlimit: {}: the Client is shut down; not sent", r.command))});
  }
  if (primary) primary->shutdown();  // a retiring one was shut down by the maintainer, joined above
}

void SentinelRunner::abandonAfterFork() noexcept {
  if (primary_) primary_->abandonAfterFork();
  if (retiring_) retiring_->abandonAfterFork();
}

TransportCounters SentinelRunner::counters() const {
  std::vector<std::shared_ptr<Transport>> all;
  {
    const LockGuard lock(mutex_);
    if (retiring_) all.push_back(retiring_);
    if (primary_) all.push_back(primary_);
  }
  TransportCounters sum;
  {
    const LockGuard lock(mutex_);
    sum += retiredCounts_;
  }
  for (const auto& t : all) {
    sum += t->counters();
  }
  {
    const LockGuard lock(mutex_);
    sum.pending += parked_.size();
  }
  return sum;
}

SentinelCounters SentinelRunner::sentinelCounters() const {
  SentinelCounters c;
  c.discoveries = discoveries_.load(std::memory_order_relaxed);
  c.switches = switches_.load(std::memory_order_relaxed);
  c.announcements = announcements_.load(std::memory_order_relaxed);
  const LockGuard lock(mutex_);
  c.primary = primaryAddress_;
  return c;
}

}  // namespace redlimit::detail
