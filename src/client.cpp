#include "redlimit/client.hpp"

#include <thread>

#include <fmt/format.h>

#include "fork_guard.hpp"
#include "random.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "transport.hpp"

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

}  // namespace

Client::Client(ClientOptions options)
    : options_((checkOptions(options), std::move(options))),  // every option checked before anything starts
      clientId_(options_.clientId.empty() ? detail::randomUuidV4() : options_.clientId),
      reachability_(std::make_shared<detail::FailureGate>("client", reachabilityOptions(options_.bestEffortRetry))) {
  owned_ = detail::Transport::start(options_.connection, options_.pool);
  forkGeneration_.store(detail::forkGeneration(), std::memory_order_relaxed);
  transport_.store(owned_.get(), std::memory_order_release);
}

Client::~Client() {
  if (forkGeneration_.load(std::memory_order_relaxed) != detail::forkGeneration()) {
    // A child that never called: the transport is the parent's. Leave it alone.
    transport_.load()->abandonAfterFork();
    new std::shared_ptr<detail::Transport>(std::move(owned_));  // leaked on purpose: see startAfterFork
    return;
  }
  owned_->shutdown();
}

std::shared_ptr<Client> Client::create(ClientOptions options) {
  return std::make_shared<Client>(std::move(options));
}

std::shared_ptr<Client> Client::fromUri(const std::string& uri, ClientOptions base) {
  return create(parseClientUri(uri, std::move(base)));
}

detail::Transport& Client::transport() {
  if (forkGeneration_.load(std::memory_order_acquire) != detail::forkGeneration()) startAfterFork();
  return *transport_.load(std::memory_order_acquire);
}

void Client::startAfterFork() {
  // This is a forked child, and the transport is the parent's: its I/O thread does not exist
  // here, its locks may be held by threads that do not exist either, and its sockets carry the
  // parent's request stream. Close this process's copies of the sockets without sending a byte,
  // leak the object (destroying it would take those locks), and start a transport of our own.
  const std::uint64_t now = detail::forkGeneration();
  std::uint64_t seen = forkGeneration_.load(std::memory_order_acquire);
  static std::mutex respawn;  // a child's threads start after the fork: fresh for them
  std::lock_guard<std::mutex> lock(respawn);
  seen = forkGeneration_.load(std::memory_order_acquire);
  if (seen == now) return;
  detail::Transport* inherited = transport_.load(std::memory_order_acquire);
  inherited->abandonAfterFork();
  new std::shared_ptr<detail::Transport>(std::move(owned_));  // leaked on purpose
  owned_ = detail::Transport::start(options_.connection, options_.pool);
  transport_.store(owned_.get(), std::memory_order_release);
  forkGeneration_.store(now, std::memory_order_release);
}

PoolStats Client::poolStats() const {
  const detail::TransportCounters c = transport_.load(std::memory_order_acquire)->counters();
  PoolStats s;
  s.open = c.open;
  s.created = c.created;
  s.discarded = c.discarded;
  s.pending = c.pending;
  s.rejected = c.rejected;
  s.writes = c.writes;
  s.requests = c.requests;
  s.direct = c.direct;
  return s;
}

bool Client::admitBestEffort() noexcept {
  const bool go = reachability_->shouldTry();
  (go ? bestEffortSent_ : bestEffortSkipped_).fetch_add(1, std::memory_order_relaxed);
  return go;
}

BestEffortStats Client::bestEffortStats() const noexcept {
  return BestEffortStats{bestEffortSent_.load(std::memory_order_relaxed),
                         bestEffortSkipped_.load(std::memory_order_relaxed), reachability_->stats().degraded};
}

bool Client::onIoThread() const noexcept { return transport_.load(std::memory_order_acquire)->onIoThread(); }

namespace {
[[noreturn]] void syncOnIoThread(const std::string& command) {
  throw InvalidArgument(fmt::format("redlimit: {}: a sync call from a completion callback would wait for the thread "
                                    "that runs it; use the ...Async form there",
                                    command));
}
}  // namespace

void Client::setDeadline(detail::Request& request, std::chrono::steady_clock::time_point deadline) const {
  const auto now = detail::SteadyClock::now();
  if (deadline == detail::SteadyTime{}) {
    request.budget = options_.connection.commandTimeout;
    request.deadline = detail::deadlineAfter<detail::SteadyClock>(now, request.budget);
  } else {
    request.deadline = deadline;
    request.budget = deadline > now ? std::chrono::ceil<std::chrono::milliseconds>(deadline - now)
                                    : std::chrono::milliseconds{0};
  }
}

Reply Client::callTracked(detail::Request request, std::chrono::steady_clock::time_point deadline) {
  if (onIoThread()) syncOnIoThread(request.command);
  setDeadline(request, deadline);
  const std::int64_t started = reachability_->callStart();
  detail::Outcome out = transport().call(std::move(request));
  if (!out.error) {
    reachability_->succeeded();
    return std::move(out.reply);
  }
  try {
    std::rethrow_exception(out.error);
  } catch (const Error&) {
    reachability_->noteError(started);  // only an outage (an IoError but PoolTimeoutError) gates best-effort calls
    throw;
  }
}

Reply Client::command(std::initializer_list<std::string_view> argv, std::chrono::steady_clock::time_point deadline) {
  return callTracked(detail::makeRequest(argv.begin(), argv.size()), deadline);
}

Reply Client::command(const std::vector<std::string_view>& argv, std::chrono::steady_clock::time_point deadline) {
  return callTracked(detail::makeRequest(argv.data(), argv.size()), deadline);
}

Reply Client::eval(const Script& script, const std::vector<std::string_view>& keys,
                   const std::vector<std::string_view>& args, std::chrono::steady_clock::time_point deadline) {
  return callTracked(detail::makeScriptRequest(script, keys, args), deadline);
}

void Client::evalAsync(const Script& script, const std::vector<std::string_view>& keys,
                       const std::vector<std::string_view>& args, ReplyCallback done,
                       std::chrono::steady_clock::time_point deadline) {
  detail::Request request = detail::makeScriptRequest(script, keys, args);
  setDeadline(request, deadline);
  const std::int64_t started = reachability_->callStart();
  request.done = [gate = reachability_, started, done = std::move(done)](detail::Outcome out) {
    if (!out.error) {
      gate->succeeded();
    } else {
      try {
        std::rethrow_exception(out.error);
      } catch (const Error&) {
        gate->noteError(started);
      } catch (...) {
      }
    }
    done(std::move(out.reply), std::move(out.error));
  };
  transport().submit(std::move(request));
}

}  // namespace redlimit
