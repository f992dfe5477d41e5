#include "redlimit/client.hpp"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "topology/cluster.hpp"
#include "base/fork_guard.hpp"
#include "topology/key_slot.hpp"
#include "base/random.hpp"
#include "topology/sentinel.hpp"
#include "transport/stream.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "transport/transport.hpp"

namespace redlimit {

using detail::Reply;
using detail::ReplyCallback;
using detail::Script;
namespace {

FailureOptions reachabilityOptions(std::chrono::milliseconds bestEffortRetry) {
  if (bestEffortRetry.count() <= 0) {
    throw InvalidArgument(
        fmt::format("redlimit: ClientOptions::bestEffortRetry must be > 0 ms, got {} ms", bestEffortRetry.count()));
  }
  FailureOptions o;
  o.probeInterval = bestEffortRetry;
  return o;
}

// The runner for the topology the options name.
std::shared_ptr<detail::Runner> startRunner(const ClientOptions& options) {
  switch (options.topology) {
    case ClientOptions::Topology::Cluster:
      return detail::ClusterRunner::start(options);
    case ClientOptions::Topology::Sentinel:
      return detail::SentinelRunner::start(options);
    case ClientOptions::Topology::Standalone:
      break;
  }
  return detail::Transport::start(options.connection, options.pool, nullptr, options.onEvent);
}

// Commands that name no key: any node of a cluster may run them.
bool isKeyless(std::string_view command) {
  static constexpr std::string_view kKeyless[] = {
      "PING",     "TIME",    "INFO",   "CONFIG", "SCRIPT",  "FLUSHALL", "FLUSHDB",   "DBSIZE", "CLUSTER",
      "CLIENT",   "COMMAND", "DEBUG",  "ROLE",   "SLOWLOG", "LATENCY",  "ECHO",      "HELLO",  "ACL",
      "FUNCTION", "MEMORY",  "OBJECT", "WAIT",   "SCAN",    "KEYS",     "RANDOMKEY", "SAVE"};
  for (std::string_view k : kKeyless) {
    if (k.size() == command.size() && std::equal(k.begin(), k.end(), command.begin(), [](char a, char b) {
          return a == (b >= 'a' && b <= 'z' ? static_cast<char>(b - 'a' + 'A') : b);
        })) {
      return true;
    }
  }
  return false;
}

// TLS without verifying the server authenticates nobody: say so once per Client, as an event, so
// that a setting copied from a test set-up does not go unnoticed in production.
void reportInsecureTls(const ClientOptions& o) {
  if (!o.onEvent || !o.connection.tls.enabled || o.connection.tls.verifyPeer) return;
  Event e;
  e.kind = Event::Kind::InsecureTls;
  switch (o.topology) {
    case ClientOptions::Topology::Cluster:
      e.node = o.cluster.seeds.empty() ? std::string() : detail::endpointOf(o.cluster.seeds.front());
      break;
    case ClientOptions::Topology::Sentinel:
      e.node = o.sentinel.primaryName;
      break;
    case ClientOptions::Topology::Standalone:
      e.node = detail::endpointOf(o.connection);
      break;
  }
  e.description = fmt::format(
      "redlimit: TLS to {} with ClientOptions::Tls::verifyPeer = false: the server's certificate is not checked, so "
      "anyone who can intercept the connection can pose as Redis; point caFile or caPath at the CA that signed "
      "the server's certificate and keep verifyPeer on",
      e.node);
  try {
    o.onEvent(e);
  } catch (...) {
    // An event callback must not throw (events.hpp); the constructor has nobody to tell.
  }
}

}  // namespace

Client::Client(ClientOptions options)
    : options_((checkOptions(options), std::move(options))),  // every option checked before anything starts
      clientId_(options_.clientId.empty() ? detail::randomUuidV4() : options_.clientId),
      reachability_(std::make_shared<detail::FailureGate>("client", reachabilityOptions(options_.bestEffortRetry))) {
  owned_ = startRunner(options_);
  forkGeneration_.store(detail::forkGeneration(), std::memory_order_relaxed);
  runner_.store(owned_.get(), std::memory_order_release);
  reportInsecureTls(options_);
}

Client::~Client() {
  if (forkGeneration_.load(std::memory_order_relaxed) != detail::forkGeneration()) {
    // A child that never called: the transport is the parent's. Leave it alone.
    runner_.load()->abandonAfterFork();
    new std::shared_ptr<detail::Runner>(std::move(owned_));  // leaked on purpose: see startAfterFork
    return;
  }
  owned_->shutdown();
}

std::shared_ptr<Client> Client::create(ClientOptions options) { return std::make_shared<Client>(std::move(options)); }

std::shared_ptr<Client> Client::fromUri(const std::string& uri, ClientOptions base) {
  return create(parseClientUri(uri, std::move(base)));
}

detail::Runner& Client::runner() {
  if (forkGeneration_.load(std::memory_order_acquire) != detail::forkGeneration()) startAfterFork();
  return *runner_.load(std::memory_order_acquire);
}

void Client::startAfterFork() {
  // This is a forked child, and the runner is the parent's: its I/O threads do not exist
  // here, its locks may be held by threads that do not exist either, and its sockets carry the
  // parent's request stream. Close this process's copies of the sockets without sending a byte,
  // leak the object (destroying it would take those locks), and start a transport of our own.
  const std::uint64_t now = detail::forkGeneration();
  std::uint64_t seen = forkGeneration_.load(std::memory_order_acquire);
  static std::mutex respawn;  // a child's threads start after the fork: fresh for them
  std::lock_guard<std::mutex> lock(respawn);
  seen = forkGeneration_.load(std::memory_order_acquire);
  if (seen == now) return;
  detail::Runner* inherited = runner_.load(std::memory_order_acquire);
  inherited->abandonAfterFork();
  new std::shared_ptr<detail::Runner>(std::move(owned_));  // leaked on purpose
  owned_ = startRunner(options_);
  runner_.store(owned_.get(), std::memory_order_release);
  forkGeneration_.store(now, std::memory_order_release);
}

PoolStats Client::poolStats() const {
  const detail::TransportCounters c = runner_.load(std::memory_order_acquire)->counters();
  PoolStats s;
  s.open = c.open;
  s.created = c.created;
  s.discarded = c.discarded;
  s.pending = c.pending;
  s.rejected = c.rejected;
  s.writes = c.writes;
  s.requests = c.requests;
  s.direct = c.direct;
  s.callerRead = c.callerRead;
  s.stalls = c.stalls;
  s.stalled = c.stalled;
  s.bestEffortSent = bestEffortSent_.load(std::memory_order_relaxed);
  s.bestEffortSkipped = bestEffortSkipped_.load(std::memory_order_relaxed);
  s.unreachable = reachability_->stats().degraded;
  return s;
}

bool Client::admitBestEffort() noexcept {
  const bool go = reachability_->shouldTry();
  (go ? bestEffortSent_ : bestEffortSkipped_).fetch_add(1, std::memory_order_relaxed);
  return go;
}

bool Client::onIoThread() const noexcept { return runner_.load(std::memory_order_acquire)->onIoThread(); }

namespace {
[[noreturn]] void syncOnIoThread(const std::string& command) {
  throw InvalidArgument(
      fmt::format("redlimit: {}: a sync call from a completion callback would wait for the thread "
                  "that runs it; use the ...Async form there",
                  command));
}
}  // namespace

void Client::setDeadline(detail::Request& request, std::chrono::steady_clock::time_point deadline) const {
  const auto now = detail::Steady::now();
  if (deadline == detail::SteadyTime{}) {
    request.budget = options_.connection.commandTimeout;
    request.deadline = detail::deadlineAfter<detail::Steady>(now, request.budget);
  } else {
    request.deadline = deadline;
    request.budget =
        deadline > now ? std::chrono::ceil<std::chrono::milliseconds>(deadline - now) : std::chrono::milliseconds{0};
  }
}

int Client::slotOf(const std::vector<std::string_view>& keys) const {
  if (options_.topology != ClientOptions::Topology::Cluster || keys.empty()) return detail::kAnySlot;
  const std::uint16_t slot = detail::keySlot(keys.front());
  for (std::size_t i = 1; i < keys.size(); ++i) {
    if (detail::keySlot(keys[i]) != slot) {
      throw InvalidArgument(fmt::format(
          "redlimit: keys \"{}\" (slot {}) and \"{}\" (slot {}) are in different Redis Cluster slots, and one "
          "script call must touch one slot; give them a common hash tag, e.g. \"{{tenant}}:a\" and \"{{tenant}}:b\"",
          keys.front(), slot, keys[i], detail::keySlot(keys[i])));
    }
  }
  return slot;
}

int Client::slotOf(const std::string_view* argv, std::size_t argc) const {
  if (options_.topology != ClientOptions::Topology::Cluster || argc < 2 || isKeyless(argv[0])) return detail::kAnySlot;
  return detail::keySlot(argv[1]);
}

Reply Client::callTracked(detail::Request request, int slot, std::chrono::steady_clock::time_point deadline) {
  if (onIoThread()) syncOnIoThread(request.command);
  setDeadline(request, deadline);
  const std::int64_t started = reachability_->callStart();
  detail::Outcome out = runner().sendAndWait(std::move(request), slot);
  if (!out.error) {
    reachability_->succeeded();
    return std::move(out.reply);
  }
  // Only an outage (an IoError other than congestion, detail::isCongestion) gates best-effort calls.
  reachability_->noteError(out.error, started);
  std::rethrow_exception(out.error);
}

Reply Client::command(std::initializer_list<std::string_view> argv, std::chrono::steady_clock::time_point deadline) {
  return callTracked(detail::makeRequest(argv.begin(), argv.size()), slotOf(argv.begin(), argv.size()), deadline);
}

Reply Client::command(const std::vector<std::string_view>& argv, std::chrono::steady_clock::time_point deadline) {
  return callTracked(detail::makeRequest(argv.data(), argv.size()), slotOf(argv.data(), argv.size()), deadline);
}

Reply Client::eval(const Script& script, const std::vector<std::string_view>& keys,
                   const std::vector<std::string_view>& args, std::chrono::steady_clock::time_point deadline) {
  const int slot = slotOf(keys);
  return callTracked(detail::makeScriptRequest(script, keys, args), slot, deadline);
}

void Client::evalAsync(const Script& script, const std::vector<std::string_view>& keys,
                       const std::vector<std::string_view>& args, ReplyCallback done,
                       std::chrono::steady_clock::time_point deadline) {
  const int slot = slotOf(keys);
  sendTracked(detail::makeScriptRequest(script, keys, args), slot, std::move(done), deadline);
}

void Client::commandAsync(const std::vector<std::string_view>& argv, ReplyCallback done,
                          std::chrono::steady_clock::time_point deadline) {
  sendTracked(detail::makeRequest(argv.data(), argv.size()), slotOf(argv.data(), argv.size()), std::move(done),
              deadline);
}

void Client::sendTracked(detail::Request request, int slot, ReplyCallback done,
                         std::chrono::steady_clock::time_point deadline) {
  setDeadline(request, deadline);
  const std::int64_t started = reachability_->callStart();
  request.done = [gate = reachability_, started, done = std::move(done)](detail::Outcome out) {
    if (!out.error) {
      gate->succeeded();
    } else {
      gate->noteError(out.error, started);
    }
    done(std::move(out.reply), std::move(out.error));
  };
  runner().send(std::move(request), slot);
}

}  // namespace redlimit
