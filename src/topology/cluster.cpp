#include "topology/cluster.hpp"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "topology/slot_map.hpp"
#include "transport/connector.hpp"

namespace redlimit::detail {
namespace {

using std::chrono::milliseconds;

// What an error outcome asks of the router.
struct Verdict {
  enum Kind { Deliver, Redirect, Retry, NodeDown, Answered } kind = Deliver;
  std::string text;  // the error's message (for redirects: where to)
  std::string code;  // NodeDown: the code of the fast failures that follow ("NODEDOWN", "CLUSTERDOWN")
};

Verdict classify(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const IoError& e) {
    if (isCongestion(e)) return {Verdict::Deliver, {}, {}};  // congestion in this process, not the node's outage
    // Slow or gone: the map may have changed (a failover).
    if (e.kind() != ErrorKind::Unavailable) return {Verdict::NodeDown, e.what(), "NODEDOWN"};
    if (e.code() == "TRYAGAIN") return {Verdict::Retry, e.what(), {}};
    // CLUSTERDOWN lasts at least the cluster's node timeout: never retried within a deadline.
    // "The cluster is down" is the node's own view of the cluster: an outage of what it serves.
    // Another CLUSTERDOWN ("Hash slot not served") is about one slot: the node is not down.
    if (e.code() == "CLUSTERDOWN") {
      const std::string text = e.what();
      if (text.find("cluster is down") != std::string::npos) return {Verdict::NodeDown, text, "CLUSTERDOWN"};
      return {Verdict::Deliver, text, {}};
    }
    if (e.code() == "MOVED" || e.code() == "ASK") return {Verdict::Deliver, {}, {}};  // out of redirects
    return {Verdict::NodeDown, e.what(), "NODEDOWN"};  // LOADING, BUSY, max clients: up, but not serving
  } catch (const ConfigurationError& e) {
    // error_mapping's words for a redirect, meant for a Client set up for one server.
    if (e.code() == "MOVED" || e.code() == "ASK") return {Verdict::Redirect, e.what(), {}};
    return {Verdict::Answered, {}, {}};
  } catch (const Error&) {
    return {Verdict::Answered, {}, {}};  // the node answered (a reply or script error)
  } catch (...) {
    return {Verdict::Deliver, {}, {}};
  }
}

// "ERR This instance has cluster support disabled": the answer of a server without cluster mode.
bool saysClusterDisabled(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const ReplyError& e) {
    return std::string_view(e.what()).find("cluster support disabled") != std::string_view::npos;
  } catch (...) {
    return false;
  }
}

std::int64_t nowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch()).count();
}

}  // namespace

struct ClusterRunner::Attempt {
  Request proto;    // the caller's request without its completion (bytes kept for resends)
  Completion done;  // the caller's completion
  int slot = kAnySlot;
  int redirects = 0;
  int retries = 0;
  std::vector<std::string> unreachable;  // endpoints that failed it before the map knew its slot
};

std::shared_ptr<ClusterRunner> ClusterRunner::start(const ClientOptions& options) {
  checkOptions(options);
  std::shared_ptr<ClusterRunner> r(new ClusterRunner(options));
  if (options.connection.tls.enabled) {
    // One TLS context for every node, read here on the caller's thread: nodes are added on I/O
    // threads (MOVED) too, which must not read files. A failure is left to each node's connects.
    try {
      r->tls_ = makeTlsContext(options.connection.tls, endpointOf(options.connection));
    } catch (const Error&) {
    }
  }
  for (const ClientOptions::Node& seed : options.cluster.seeds) {
    NodePtr n = r->nodeAt(seed);
    const WriteLock lock(r->mapMutex_);
    if (r->fallback_ == nullptr) r->fallback_ = n;
  }
  r->thread_ = std::thread([self = r.get()] { self->maintain(); });
  return r;
}

ClusterRunner::ClusterRunner(const ClientOptions& options)
    : options_(options),
      minRefresh_(options.cluster.minRefreshInterval),
      refreshPeriod_(options.cluster.refreshPeriod),
      probeNanos_(saturatingCast<std::chrono::nanoseconds>(options.bestEffortRetry).count()),
      seeds_(options.cluster.seeds) {}

ClusterRunner::~ClusterRunner() {
  shutdown();
  if (thread_.joinable()) thread_.detach();  // only after abandonAfterFork, which never frees
}

ClusterRunner::NodePtr ClusterRunner::route(int slot) const {
  const ReadLock lock(mapMutex_);
  if (slot >= 0 && slot < 16384) {
    if (const NodePtr& n = slots_[static_cast<std::size_t>(slot)]) return n;
  }
  // Any node may take it (a keyless request, or a slot whose owner's MOVED will tell): not one
  // in an outage while another is up.
  if (fallback_ == nullptr || !fallback_->down.load(std::memory_order_acquire)) return fallback_;
  for (const auto& [endpoint, node] : nodes_) {
    if (!node->down.load(std::memory_order_acquire)) return node;
  }
  return fallback_;
}

bool ClusterRunner::mapped(int slot) const {
  if (slot < 0 || slot >= 16384) return false;
  const ReadLock lock(mapMutex_);
  return slots_[static_cast<std::size_t>(slot)] != nullptr;
}

ClusterRunner::NodePtr ClusterRunner::anotherNode(const Attempt& a) const {
  const ReadLock lock(mapMutex_);
  auto untried = [&](const Node& n) {
    return std::find(a.unreachable.begin(), a.unreachable.end(), n.endpoint) == a.unreachable.end() &&
           !n.down.load(std::memory_order_acquire);
  };
  // The seeds in the order given, then any other node known.
  for (const ClientOptions::Node& seed : seeds_) {
    auto it = nodes_.find(endpointOf(seed));
    if (it != nodes_.end() && untried(*it->second)) return it->second;
  }
  for (const auto& [endpoint, node] : nodes_) {
    if (untried(*node)) return node;
  }
  return nullptr;
}

ClusterRunner::NodePtr ClusterRunner::nodeAt(const ClientOptions::Node& address) {
  const std::string endpoint = endpointOf(address);
  {
    const ReadLock lock(mapMutex_);
    auto it = nodes_.find(endpoint);
    if (it != nodes_.end()) return it->second;
  }
  const WriteLock lock(mapMutex_);
  auto it = nodes_.find(endpoint);
  if (it != nodes_.end()) return it->second;
  if (stopped_.load(std::memory_order_acquire)) return nullptr;
  ClientOptions::Connection connection = options_.connection;
  connection.host = address.host;
  connection.port = address.port;
  connection.unixSocket.clear();
  auto node = std::make_shared<Node>();
  node->address = address;
  node->endpoint = endpoint;
  node->transport = Transport::start(connection, options_.pool, this, options_.onEvent, tls_);
  nodes_.emplace(endpoint, node);
  return node;
}

void ClusterRunner::send(Request request, int slot) {
  used_.store(true, std::memory_order_relaxed);
  if (notCluster_.load(std::memory_order_acquire)) {
    std::string why;
    {
      const LockGuard lock(mutex_);
      why = notClusterWhy_;
    }
    request.done(Outcome{Reply{}, std::make_exception_ptr(ConfigurationError(
                                      "ERR", fmt::format("redlimit: {}: {}; not sent", request.command, why)))});
    return;
  }
  auto a = std::make_shared<Attempt>();
  a->done = std::move(request.done);
  a->proto = std::move(request);
  a->slot = slot;
  dispatch(a, route(slot), false);
}

Outcome ClusterRunner::sendAndWait(Request request, int slot) {
  return waitForOutcome(std::move(request), [this, slot](Request r) { send(std::move(r), slot); });
}

void ClusterRunner::dispatch(const std::shared_ptr<Attempt>& a, NodePtr node, bool asking) {
  if (node == nullptr || stopped_.load(std::memory_order_acquire)) {
    a->done(Outcome{Reply{}, errorOf<ClosedError>(
                                 fmt::format("redlimit: {}: the Client is shut down; not sent", a->proto.command))});
    return;
  }
  const std::int64_t now = nowNanos();
  if (node->down.load(std::memory_order_acquire)) {
    if (!takeProbe(*node, now)) {
      failFast(a, *node, now);
      return;
    }
    probes_.fetch_add(1, std::memory_order_relaxed);
  }
  Request r;
  r.bytes = a->proto.bytes;
  r.command = a->proto.command;
  r.deadline = a->proto.deadline;
  r.budget = a->proto.budget;
  r.script = a->proto.script;
  r.asking = asking;
  // The request holds the runner: its completion may come after the Client let go of it (the
  // transports end every request by its deadline, so the cycle ends too). It holds its node too:
  // a retired node's transport is shut down only once no request holds the node.
  Transport& transport = *node->transport;
  r.done = [self = shared_from_this(), a, node = std::move(node), now](Outcome out) {
    self->finished(a, node, now, std::move(out));
  };
  transport.submit(std::move(r));
}

bool ClusterRunner::takeProbe(Node& node, std::int64_t now) {
  std::int64_t probe = node.nextProbe.load(std::memory_order_relaxed);
  // One caller per interval wins the probe.
  return now >= probe &&
         node.nextProbe.compare_exchange_strong(probe, saturatingAdd(now, probeNanos_), std::memory_order_relaxed);
}

void ClusterRunner::failFast(const std::shared_ptr<Attempt>& a, Node& node, std::int64_t now) {
  failedFast_.fetch_add(1, std::memory_order_relaxed);
  std::string why;
  std::string code;
  {
    const LockGuard lock(node.whyMutex);
    why = node.why;
    code = node.whyCode;
  }
  const std::int64_t next = node.nextProbe.load(std::memory_order_relaxed);
  const auto inMs = next > now ? (next - now + 999999) / 1000000 : 0;
  a->done(Outcome{
      Reply{}, std::make_exception_ptr(IoError(
                   ErrorKind::Unavailable, code,
                   fmt::format("redlimit: {}: Redis Cluster node {} is in an outage ({}); not sent: its requests fail "
                               "at once and one per {} ms goes to it as a probe (the next in {} ms)",
                               a->proto.command, node.endpoint, why, options_.bestEffortRetry.count(), inMs)))});
}

void ClusterRunner::nodeFailed(Node& node, std::int64_t sentAt, const std::string& code, const std::string& why) {
  if (stopped_.load(std::memory_order_acquire)) return;
  // Sent before the node came back (it was still hung, or loading): old news.
  if (sentAt < node.restoredAt.load(std::memory_order_acquire)) return;
  {
    const LockGuard lock(node.whyMutex);
    node.why = why;
    node.whyCode = code;
  }
  node.nextProbe.store(saturatingAdd(nowNanos(), probeNanos_), std::memory_order_relaxed);
  if (node.down.exchange(true, std::memory_order_acq_rel)) return;
  outages_.fetch_add(1, std::memory_order_relaxed);
  if (options_.onEvent) {
    Event e;
    e.kind = Event::Kind::Topology;
    e.node = node.endpoint;
    e.description =
        fmt::format("Redis Cluster node {} is in an outage ({}): its requests fail at once, one probe per {} ms",
                    node.endpoint, why, options_.bestEffortRetry.count());
    options_.onEvent(e);
  }
}

void ClusterRunner::nodeAnswered(Node& node) {
  if (!node.down.load(std::memory_order_relaxed)) return;
  node.restoredAt.store(nowNanos(), std::memory_order_release);
  if (!node.down.exchange(false, std::memory_order_acq_rel)) return;
  if (options_.onEvent) {
    Event e;
    e.kind = Event::Kind::Topology;
    e.node = node.endpoint;
    e.description = fmt::format("Redis Cluster node {} answers again: its outage ended", node.endpoint);
    options_.onEvent(e);
  }
}

void ClusterRunner::finished(const std::shared_ptr<Attempt>& a, const NodePtr& node, std::int64_t sentAt, Outcome out) {
  if (!out.error) {
    nodeAnswered(*node);
    a->done(std::move(out));
    return;
  }
  const Verdict v = classify(out.error);
  if (v.kind == Verdict::Answered || v.kind == Verdict::Redirect || v.kind == Verdict::Retry) nodeAnswered(*node);
  if (v.kind == Verdict::NodeDown) {
    nodeFailed(*node, sentAt, v.code, v.text);
    wantRefresh();  // a failover, perhaps: the caller's policy decides meanwhile
    // A node the map does not name for the slot was only a guess (a seed, sent before the map was
    // known): try the slot's owner if the map learnt it meanwhile (a refresh may have finished
    // while this request was failing), else the next seed. The owner itself down is a failover:
    // the caller's policy decides.
    const NodePtr owner = mapped(a->slot) ? route(a->slot) : nullptr;
    if (!stopped_.load(std::memory_order_acquire) && Steady::now() < a->proto.deadline && owner != node) {
      a->unreachable.push_back(node->endpoint);
      const bool ownerUntried = owner != nullptr && std::find(a->unreachable.begin(), a->unreachable.end(),
                                                              owner->endpoint) == a->unreachable.end();
      if (NodePtr next = ownerUntried ? owner : anotherNode(*a)) {
        seedsSkipped_.fetch_add(1, std::memory_order_relaxed);
        dispatch(a, next, false);
        return;
      }
    }
  }
  if (v.kind == Verdict::Redirect) {
    std::optional<Redirect> to = parseRedirect(v.text);
    if (to && to->node.host != "?") {
      if (to->node.host.empty()) to->node.host = node->address.host;  // "MOVED 1 :7001": the same host
      redirect(a, *to);
      return;
    }
    // "MOVED 1 ?:7001": the node knows the owner but not its address yet. Learn the map, try again.
    if (to) wantRefresh();
  }
  if (v.kind == Verdict::Deliver && v.text.find("CLUSTERDOWN") != std::string::npos) wantRefresh();
  if ((v.kind == Verdict::Retry || v.kind == Verdict::Redirect) && retryLater(a)) return;
  a->done(std::move(out));
}

void ClusterRunner::redirect(const std::shared_ptr<Attempt>& a, const Redirect& to) {
  if (++a->redirects > options_.cluster.maxRedirects || Steady::now() >= a->proto.deadline) {
    a->done(Outcome{Reply{},
                    std::make_exception_ptr(IoError(
                        ErrorKind::Unavailable, to.ask ? "ASK" : "MOVED",
                        fmt::format("redlimit: {}: the cluster redirected it {} times (last to {}) within "
                                    "its {} ms deadline: the slot map is changing; not run",
                                    a->proto.command, a->redirects, endpointOf(to.node), a->proto.budget.count())))});
    return;
  }
  NodePtr target = nodeAt(to.node);
  if (to.ask) {
    asked_.fetch_add(1, std::memory_order_relaxed);
  } else {
    moved_.fetch_add(1, std::memory_order_relaxed);
    NodePtr from;
    if (target != nullptr) {
      const WriteLock lock(mapMutex_);
      // Not a node a refresh retired meanwhile: the map names only nodes in nodes_.
      auto known = nodes_.find(target->endpoint);
      if (known != nodes_.end() && known->second == target) {
        if (slots_[to.slot] != target) from = slots_[to.slot];  // one caller sees each change
        slots_[to.slot] = target;
      }
    }
    if (from != nullptr && options_.onEvent) {  // a known owner changed (not a first sight); no lock held
      Event e;
      e.kind = Event::Kind::Topology;
      e.node = target->endpoint;
      e.description = fmt::format("Redis Cluster slot {} moved from {} to {} (MOVED)", to.slot, from->endpoint, e.node);
      options_.onEvent(e);
    }
    wantRefresh();  // one moved slot often means more (a resharding, a failover)
  }
  dispatch(a, std::move(target), to.ask);
}

bool ClusterRunner::retryLater(const std::shared_ptr<Attempt>& a) {
  const SteadyTime now = Steady::now();
  const auto pause = std::min<milliseconds>(milliseconds(5) * (1 << std::min(a->retries, 5)), milliseconds(100));
  if (now + pause >= a->proto.deadline || stopped_.load(std::memory_order_acquire)) return false;
  ++a->retries;
  a->redirects = 0;  // an ASK, then TRYAGAIN on the importing node, then ASK again: one round each
  retried_.fetch_add(1, std::memory_order_relaxed);
  later(now + pause, [self = shared_from_this(), a] { self->dispatch(a, self->route(a->slot), false); });
  return true;
}

void ClusterRunner::later(SteadyTime at, std::function<void()> run) {
  {
    const LockGuard lock(mutex_);
    if (!stopping_) {
      timers_.push(Timer{at, timerSeq_++, std::move(run)});
      run = nullptr;
    }
  }
  if (run) {
    run();  // shut down meanwhile: dispatch() ends the request with ClosedError
    return;
  }
  wake_.notify_one();
}

void ClusterRunner::wantRefresh() {
  {
    const LockGuard lock(mutex_);
    if (refreshWanted_) return;
    refreshWanted_ = true;
  }
  wake_.notify_one();
}

void ClusterRunner::maintain() {
  setCurrentIoRunner(this);
  UniqueLock lock(mutex_);
  while (!stopping_) {
    if (anyRetired_.load(std::memory_order_acquire)) {
      lock.unlock();
      releaseRetired();
      lock.lock();
      if (stopping_) break;
    }
    const SteadyTime now = Steady::now();
    if (!timers_.empty() && timers_.top().at <= now) {
      std::function<void()> run = timers_.top().run;
      timers_.pop();
      lock.unlock();
      run();
      lock.lock();
      continue;
    }
    SteadyTime refreshAt = SteadyTime::max();
    if (refreshWanted_) {
      refreshAt = lastRefresh_ + minRefresh_;
    } else if (used_.load(std::memory_order_relaxed)) {
      refreshAt = lastRefresh_ + refreshPeriod_;
    }
    if (refreshAt <= now) {
      refreshWanted_ = false;
      used_.store(false, std::memory_order_relaxed);
      lastRefresh_ = now;
      lock.unlock();
      const bool ok = refresh();
      lock.lock();
      if (!ok) refreshWanted_ = true;  // try again after minRefreshInterval
      continue;
    }
    SteadyTime next = refreshAt;
    if (!timers_.empty()) next = std::min(next, timers_.top().at);
    // A retired transport is released soon after its last request ended (they end by deadlines).
    if (anyRetired_.load(std::memory_order_acquire)) next = std::min(next, now + milliseconds(50));
    if (next == SteadyTime::max()) {
      wake_.wait(lock.native());
    } else {
      wake_.wait_until(lock.native(), next);
    }
  }
  // Shut down: the requests waiting for a retry end now.
  while (!timers_.empty()) {
    std::function<void()> run = timers_.top().run;
    timers_.pop();
    lock.unlock();
    run();  // dispatch() sees stopped_ and ends the request with ClosedError
    lock.lock();
  }
}

bool ClusterRunner::refresh() {
  // Ask the primaries we route to first (they know the newest map), then the seeds.
  std::vector<NodePtr> ask;
  {
    const ReadLock lock(mapMutex_);
    for (const NodePtr& n : slots_) {
      if (n != nullptr && std::find(ask.begin(), ask.end(), n) == ask.end()) ask.push_back(n);
    }
  }
  for (const ClientOptions::Node& seed : seeds_) {
    NodePtr n = nodeAt(seed);
    if (n != nullptr && std::find(ask.begin(), ask.end(), n) == ask.end()) ask.push_back(n);
  }
  // Nodes in an outage last: a hung one costs a whole command timeout, and holds up the retries
  // this thread runs meanwhile.
  std::stable_partition(ask.begin(), ask.end(),
                        [](const NodePtr& n) { return !n->down.load(std::memory_order_acquire); });
  std::vector<std::string> disabled;  // nodes that answered "cluster support disabled"
  for (const NodePtr& n : ask) {
    if (stopped_.load(std::memory_order_acquire)) return true;
    auto askFor = [&](std::initializer_list<std::string_view> argv) {
      Request r = makeRequest(argv.begin(), argv.size());
      r.budget = options_.connection.commandTimeout;
      r.deadline = deadlineAfter<Steady>(Steady::now(), r.budget);
      return n->transport->call(std::move(r));
    };
    std::vector<SlotRange> ranges;
    try {
      Outcome out = askFor({"CLUSTER", "SHARDS"});
      if (out.error && holds<ReplyError>(out.error) && !holdsKind(out.error, ErrorKind::UnexpectedReply)) {
        out = askFor({"CLUSTER", "SLOTS"});  // before Redis 7.0
        if (out.error) {
          if (saysClusterDisabled(out.error)) disabled.push_back(n->endpoint);
          continue;
        }
        ranges = parseClusterSlots(out.reply, n->address.host);
      } else if (out.error) {
        continue;
      } else {
        ranges = parseClusterShards(out.reply, options_.connection.tls.enabled, n->address.host);
      }
    } catch (const Error&) {
      continue;  // a reply we cannot read: ask the next node
    }
    if (ranges.empty()) continue;
    std::vector<NodePtr> table(16384);
    for (const SlotRange& range : ranges) {
      NodePtr primary = nodeAt(range.primary);
      if (primary == nullptr) return true;  // shut down meanwhile
      for (std::size_t s = range.first; s <= range.last; ++s) table[s] = primary;
    }
    std::size_t moved = 0;  // slots whose known owner changed (a slot first learnt is no move)
    std::vector<std::string> retiredNow;
    {
      const WriteLock lock(mapMutex_);
      std::vector<const Node*> before;  // the primaries the old map named
      std::vector<const Node*> after;   // and the new one
      for (std::size_t s = 0; s < table.size(); ++s) {
        if (slots_[s] != nullptr && slots_[s] != table[s]) ++moved;
        if (slots_[s] != nullptr && std::find(before.begin(), before.end(), slots_[s].get()) == before.end()) {
          before.push_back(slots_[s].get());
        }
        if (table[s] != nullptr && std::find(after.begin(), after.end(), table[s].get()) == after.end()) {
          after.push_back(table[s].get());
        }
      }
      slots_.swap(table);
      fallback_ = slots_[ranges.front().first];
      // A primary the map named before and names no more, and not a seed, is retired: nothing
      // routes to it; releaseRetired() shuts its transport down once no request holds it.
      for (auto it = nodes_.begin(); it != nodes_.end();) {
        const Node* candidate = it->second.get();
        const bool seed = std::any_of(seeds_.begin(), seeds_.end(), [&](const ClientOptions::Node& a) {
          return endpointOf(a) == candidate->endpoint;
        });
        if (seed || std::find(before.begin(), before.end(), candidate) == before.end() ||
            std::find(after.begin(), after.end(), candidate) != after.end()) {
          ++it;
          continue;
        }
        retiredNow.push_back(candidate->endpoint);
        retired_.push_back(Retired{it->second, it->second->transport});
        it = nodes_.erase(it);
      }
      if (!retiredNow.empty()) anyRetired_.store(true, std::memory_order_release);
    }
    table.clear();  // the old map's references: a retired node is held by its requests alone
    retiredNodes_.fetch_add(retiredNow.size(), std::memory_order_relaxed);
    for (const std::string& endpoint : retiredNow) {
      if (!options_.onEvent) break;
      Event e;
      e.kind = Event::Kind::Topology;
      e.node = endpoint;
      e.description = fmt::format(
          "Redis Cluster node {} serves no slot any more: retired, its transport is released once its "
          "requests have ended",
          endpoint);
      options_.onEvent(e);
    }
    refreshes_.fetch_add(1, std::memory_order_relaxed);
    notCluster_.store(false, std::memory_order_release);
    if (moved > 0 && options_.onEvent) {  // no lock held
      std::vector<NodePtr> snapshot;
      {
        const ReadLock lock(mapMutex_);
        snapshot = slots_;
      }
      std::vector<const Node*> primaries;
      for (const NodePtr& p : snapshot) {
        if (p != nullptr && std::find(primaries.begin(), primaries.end(), p.get()) == primaries.end()) {
          primaries.push_back(p.get());
        }
      }
      Event e;
      e.kind = Event::Kind::Topology;
      e.description =
          fmt::format("Redis Cluster slot map changed: {} of 16384 slots moved to other nodes; {} primaries now", moved,
                      primaries.size());
      options_.onEvent(e);
    }
    return true;
  }
  if (!disabled.empty()) noteNotACluster(disabled);
  return false;
}

void ClusterRunner::noteNotACluster(const std::vector<std::string>& disabled) {
  std::string nodes;
  for (const std::string& endpoint : disabled) nodes += (nodes.empty() ? "" : ", ") + endpoint;
  const std::string why = fmt::format(
      "the Client was made for a Redis Cluster (redis-cluster://, ClientOptions::Topology::Cluster), but {} {} cluster "
      "support "
      "disabled (a single server, not a cluster node): connect with redis://host:port "
      "(ClientOptions::Topology::Standalone), or "
      "run the server with cluster-enabled yes; a configuration error, thrown under every failure policy",
      nodes, disabled.size() == 1 ? "has" : "have");
  {
    const LockGuard lock(mutex_);
    notClusterWhy_ = why;
  }
  if (notCluster_.exchange(true, std::memory_order_acq_rel) || !options_.onEvent) return;
  Event e;
  e.kind = Event::Kind::Topology;
  e.node = disabled.front();
  e.description = fmt::format("not a Redis Cluster: {}", why);
  options_.onEvent(e);
}

void ClusterRunner::releaseRetired() {
  // Only this (the maintenance) thread removes entries: the ones picked stay in retired_ (for
  // counters() and a fork) while they shut down.
  std::vector<std::shared_ptr<Transport>> idle;
  {
    const ReadLock lock(mapMutex_);
    for (const Retired& r : retired_) {
      if (r.node.expired()) idle.push_back(r.transport);
    }
  }
  if (idle.empty()) return;
  for (const auto& t : idle) t->shutdown();  // no request on it: nothing ends with ClosedError
  const WriteLock lock(mapMutex_);
  for (const auto& t : idle) {
    auto it = std::find_if(retired_.begin(), retired_.end(), [&](const Retired& r) { return r.transport == t; });
    if (it == retired_.end()) continue;
    const TransportCounters last = t->counters();
    retiredCounts_.created += last.created;
    retiredCounts_.discarded += last.discarded;
    retiredCounts_.rejected += last.rejected;
    retiredCounts_.writes += last.writes;
    retiredCounts_.requests += last.requests;
    retiredCounts_.direct += last.direct;
    retired_.erase(it);
    released_.fetch_add(1, std::memory_order_relaxed);
  }
  if (retired_.empty()) anyRetired_.store(false, std::memory_order_release);
}

void ClusterRunner::shutdown() noexcept {
  {
    const LockGuard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  stopped_.store(true, std::memory_order_release);
  wake_.notify_all();
  if (thread_.joinable()) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  // No node is added once stopped_ is set (nodeAt): the list is final.
  std::vector<std::shared_ptr<Transport>> transports;
  {
    const ReadLock lock(mapMutex_);
    for (auto& [endpoint, node] : nodes_) transports.push_back(node->transport);
    for (const Retired& r : retired_) transports.push_back(r.transport);  // a request on it ends now
  }
  for (const auto& t : transports) t->shutdown();
}

void ClusterRunner::abandonAfterFork() noexcept {
  for (auto& [endpoint, node] : nodes_) node->transport->abandonAfterFork();
  for (const Retired& r : retired_) r.transport->abandonAfterFork();
}

TransportCounters ClusterRunner::counters() const {
  const ReadLock lock(mapMutex_);
  TransportCounters sum = retiredCounts_;
  for (const auto& [endpoint, node] : nodes_) sum += node->transport->counters();
  for (const Retired& r : retired_) sum += r.transport->counters();
  return sum;
}

ClusterCounters ClusterRunner::clusterCounters() const {
  ClusterCounters c;
  c.moved = moved_.load(std::memory_order_relaxed);
  c.asked = asked_.load(std::memory_order_relaxed);
  c.retried = retried_.load(std::memory_order_relaxed);
  c.refreshes = refreshes_.load(std::memory_order_relaxed);
  c.outages = outages_.load(std::memory_order_relaxed);
  c.probes = probes_.load(std::memory_order_relaxed);
  c.failedFast = failedFast_.load(std::memory_order_relaxed);
  c.seedsSkipped = seedsSkipped_.load(std::memory_order_relaxed);
  const ReadLock lock(mapMutex_);
  c.nodes = nodes_.size();
  c.retired = retiredNodes_.load(std::memory_order_relaxed);
  c.released = released_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace redlimit::detail
