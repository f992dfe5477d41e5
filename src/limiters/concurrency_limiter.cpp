#include "redlimit/concurrency_limiter.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <exception>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "limiters/completion.hpp"
#include "limiters/future_of.hpp"
#include "limiters/lease_id.hpp"
#include "limiters/script_call.hpp"
#include "config/config_checks.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

using detail::checkLeaseId;
using detail::newLeaseId;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

using Steady = std::chrono::steady_clock;

const detail::Script kConcurrency{detail::lua::concurrency.name, detail::lua::concurrency.sha1,
                                  detail::lua::concurrency.source};
constexpr char kKind = 'C';
constexpr std::size_t kAcquireReplySize = 8;  // {granted, expiryUs, remaining, limit, nowUs, retryUs, resetUs, held}

std::int64_t at(const detail::Reply& r, std::size_t i) { return r.elements.at(i).asInteger(); }

// renew's reply {renewed, expiryUs, nowUs}: the new expiry, or nullopt when the lease was not live.
std::optional<microseconds> parseRenew(const std::string& name, const detail::Reply& r) {
  if (r.type != detail::Reply::Type::Array || r.elements.size() != 3) {
    throw UnexpectedReplyError(
        fmt::format("redlimit: limiter {}: expected an array of 3 from renew, got {}", name, r.describe()));
  }
  if (at(r, 0) != 1) return std::nullopt;
  return microseconds{at(r, 1)};
}

// release's reply {released, nowUs}.
bool parseRelease(const std::string& name, const detail::Reply& r) {
  if (r.type != detail::Reply::Type::Array || r.elements.size() != 2) {
    throw UnexpectedReplyError(
        fmt::format("redlimit: limiter {}: expected an array of 2 from release, got {}", name, r.describe()));
  }
  return at(r, 0) == 1;
}

}  // namespace

class ConcurrencyLimiter::Core : public std::enable_shared_from_this<ConcurrencyLimiter::Core> {
 public:
  Core(std::shared_ptr<Client> client, std::string name, const ConcurrencyConfig& config,
       ConcurrencyLimiterOptions options)
      : client_(std::move(client)),
        name_(std::move(name)),
        config_((validateConfig(config), config)),
        gate_(name_, std::move(options.failure), ClockView{}, detail::checkedMonitor(client_, name_, options.monitor)) {
    const ClientOptions& o = client_->options();
    callBound_ = detail::saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
  }

  // A run of the script: op, now (empty: the server's clock), kind, `rest`. Every operation is
  // safe to send again after a closed connection: acquire by its lease id, renew and release by
  // theirs.
  detail::ScriptRequest request(std::string_view op, std::vector<std::string> rest) const {
    std::vector<std::string> argv{std::string(op), "", std::string(1, kKind)};
    argv.insert(argv.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
    return detail::ScriptRequest{&kConcurrency, {name_}, std::move(argv), nullptr};
  }
  detail::OneKeyErrors errors() const { return detail::OneKeyErrors{name_, kKind}; }
  // FailurePolicy::Local: limit x localShare leases per leaseTtl.
  detail::LimiterCall::Params decision() const {
    return detail::LimiterCall::decision(callBound_, 1, config_.limit, config_.leaseTtl);
  }

  // A call that is not a decision (renew, release, held): its errors reach the caller.
  detail::Reply call(std::string_view op, std::vector<std::string> rest) {
    return detail::runScript(
        *this, detail::LimiterCall::plain(callBound_), op, request(op, std::move(rest)), errors(),
        [](const detail::Reply& r) { return r; }, [](bool) { return detail::Reply{}; });
  }
  // call() without waiting: `done` gets parse(reply) or the error, once.
  template <class Out, class Parse>
  void callAsync(std::string_view op, std::vector<std::string> rest, Parse parse,
                 std::function<void(Out, std::exception_ptr)> done) {
    detail::runScriptAsync<Out>(
        shared_from_this(), detail::LimiterCall::plain(callBound_), request(op, std::move(rest)), errors(),
        [parse = std::move(parse)](Core*, const detail::Reply& r) { return parse(r); },
        [](Core&, bool) { return Out{}; }, std::move(done));
  }

  LeaseDecision byPolicy(bool allowed) const {
    LeaseDecision out;
    out.decision.allowed = allowed;
    out.decision.permits = 1;
    out.decision.limit = config_.limit;
    out.decision.byPolicy = true;
    if (allowed) {
      Lease lease;
      lease.id = newLeaseId();
      lease.byPolicy = true;
      out.lease = std::move(lease);
    }
    return out;
  }

  LeaseDecision acquire(milliseconds ttl) {
    detail::checkLeaseTtl(ttl);
    const std::string id = newLeaseId();
    return detail::runScript(
        *this, decision(), "acquire",
        request("acquire", {id, fmt::to_string(config_.limit), fmt::to_string(ttl.count())}), errors(),
        [&](const detail::Reply& r) { return parseAcquire(name_, r, id); },
        [&](bool allowed) { return byPolicy(allowed); });
  }

  // The acquire script's reply, for the lease `id`.
  static LeaseDecision parseAcquire(const std::string& name, const detail::Reply& r, const std::string& id) {
    if (r.type != detail::Reply::Type::Array || r.elements.size() != kAcquireReplySize) {
      throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: expected an array of {} from the script, got {}",
                                             name, kAcquireReplySize, r.describe()));
    }
    LeaseDecision out;
    Decision& d = out.decision;
    d.allowed = at(r, 0) == 1;
    d.permits = 1;
    d.remaining = at(r, 2);
    d.limit = at(r, 3);
    d.time = microseconds{at(r, 4)};
    d.retryAfter = microseconds{at(r, 5)};
    d.resetAfter = microseconds{at(r, 6)};
    if (d.allowed) {
      Lease lease;
      lease.id = id;
      lease.expiresAt = microseconds{at(r, 1)};
      out.lease = std::move(lease);
    }
    return out;
  }

  // acquire() without waiting; `done` runs once, on the I/O thread (or here, when the failure
  // policy decides or the arguments are refused). A connection closed under the request is sent
  // again with the same lease id (a live lease with that id is granted again, not added).
  void acquireAsync(milliseconds ttl, std::function<void(LeaseDecision, std::exception_ptr)> done) {
    try {
      detail::checkLeaseTtl(ttl);
    } catch (...) {
      done(LeaseDecision{}, std::current_exception());
      return;
    }
    const std::string id = newLeaseId();
    detail::runScriptAsync<LeaseDecision>(
        shared_from_this(), decision(),
        request("acquire", {id, fmt::to_string(config_.limit), fmt::to_string(ttl.count())}), errors(),
        [name = name_, id](Core*, const detail::Reply& r) { return parseAcquire(name, r, id); },
        [](Core& self, bool allowed) { return self.byPolicy(allowed); }, std::move(done));
  }

  std::shared_ptr<Client> client_;
  std::string name_;
  ConcurrencyConfig config_;
  detail::FailureGate gate_;
  milliseconds callBound_{0};
};

ConcurrencyLimiter::ConcurrencyLimiter(std::shared_ptr<Client> client, std::string name,
                                       const ConcurrencyConfig& config, ConcurrencyLimiterOptions options)
    : core_(std::make_shared<Core>(std::move(client), std::move(name), config, std::move(options))) {}

void ConcurrencyLimiter::validateConfig(const ConcurrencyConfig& config) {
  detail::checkCount("limit", config.limit, 1, kMaxLimit);
  detail::checkLeaseTtl(config.leaseTtl);
}

LeaseDecision ConcurrencyLimiter::decide() { return decide(core_->config_.leaseTtl); }

namespace {
// Counts the decision and returns what the caller gets (shadow mode: a denial let through, with
// a lease Redis does not hold).
LeaseDecision admitted(const LimiterMonitor& monitor, LeaseDecision out) {
  Decision& d = out.decision;
  if (d.allowed) {
    (void)monitor.admit(true, 1);
    return out;
  }
  if (monitor.admit(false, 1, d.retryAfter, d.byPolicy)) {
    d.allowed = true;
    d.shadowDenied = true;
    Lease lease;
    lease.id = newLeaseId();
    lease.byPolicy = d.byPolicy;
    lease.shadowDenied = true;
    out.lease = std::move(lease);
  }
  return out;
}
}  // namespace

LeaseDecision ConcurrencyLimiter::decide(milliseconds leaseTtl) {
  return admitted(monitor(), core_->acquire(leaseTtl));
}

void ConcurrencyLimiter::decideAsync(LeaseCallback done) { decideAsync(core_->config_.leaseTtl, std::move(done)); }

void ConcurrencyLimiter::decideAsync(milliseconds leaseTtl, LeaseCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = detail::isolated(std::move(done), monitor(), core_->name_);
  core_->acquireAsync(leaseTtl, [monitor = monitor(), done = std::move(done)](LeaseDecision d, std::exception_ptr e) {
    if (e) {
      done(LeaseDecision{}, std::move(e));
      return;
    }
    done(admitted(monitor, std::move(d)), nullptr);
  });
}

std::future<LeaseDecision> ConcurrencyLimiter::decideAsync(milliseconds leaseTtl) {
  return detail::futureOf<LeaseDecision>([&](auto done) { decideAsync(leaseTtl, std::move(done)); });
}

std::future<LeaseDecision> ConcurrencyLimiter::decideAsync() { return decideAsync(core_->config_.leaseTtl); }

std::optional<Lease> ConcurrencyLimiter::tryAcquire() { return decide().lease; }

std::optional<Lease> ConcurrencyLimiter::tryAcquire(milliseconds leaseTtl) { return decide(leaseTtl).lease; }

bool ConcurrencyLimiter::renew(Lease& lease) { return renew(lease, core_->config_.leaseTtl); }

bool ConcurrencyLimiter::renew(Lease& lease, milliseconds leaseTtl) {
  checkLeaseId(lease.id);
  detail::checkLeaseTtl(leaseTtl);
  const std::optional<microseconds> expiry =
      parseRenew(core_->name_, core_->call("renew", {lease.id, fmt::to_string(leaseTtl.count())}));
  if (!expiry) return false;
  lease.expiresAt = *expiry;
  return true;
}

bool ConcurrencyLimiter::release(const Lease& lease) {
  checkLeaseId(lease.id);
  return parseRelease(core_->name_, core_->call("release", {lease.id}));
}

void ConcurrencyLimiter::renewAsync(Lease lease, RenewCallback done) {
  renewAsync(std::move(lease), core_->config_.leaseTtl, std::move(done));
}

void ConcurrencyLimiter::renewAsync(Lease lease, milliseconds leaseTtl, RenewCallback done) {
  done = detail::isolated(std::move(done), monitor(), core_->name_);
  try {
    checkLeaseId(lease.id);
    detail::checkLeaseTtl(leaseTtl);
  } catch (...) {
    done(std::nullopt, std::current_exception());
    return;
  }
  std::vector<std::string> rest{lease.id, fmt::to_string(leaseTtl.count())};
  core_->callAsync<std::optional<Lease>>(
      "renew", std::move(rest),
      [name = core_->name_, lease = std::move(lease)](const detail::Reply& r) -> std::optional<Lease> {
        const std::optional<microseconds> expiry = parseRenew(name, r);
        if (!expiry) return std::nullopt;
        Lease renewed = lease;
        renewed.expiresAt = *expiry;
        return renewed;
      },
      std::move(done));
}

std::future<std::optional<Lease>> ConcurrencyLimiter::renewAsync(Lease lease) {
  return renewAsync(std::move(lease), core_->config_.leaseTtl);
}

std::future<std::optional<Lease>> ConcurrencyLimiter::renewAsync(Lease lease, milliseconds leaseTtl) {
  return detail::futureOf<std::optional<Lease>>(
      [&](auto done) { renewAsync(std::move(lease), leaseTtl, RenewCallback(std::move(done))); });
}

void ConcurrencyLimiter::releaseAsync(const Lease& lease, ReleaseCallback done) {
  done = detail::isolated(std::move(done), monitor(), core_->name_);
  try {
    checkLeaseId(lease.id);
  } catch (...) {
    done(false, std::current_exception());
    return;
  }
  core_->callAsync<bool>(
      "release", {lease.id}, [name = core_->name_](const detail::Reply& r) { return parseRelease(name, r); },
      std::move(done));
}

std::future<bool> ConcurrencyLimiter::releaseAsync(const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(lease, ReleaseCallback(std::move(done))); });
}

std::int64_t ConcurrencyLimiter::held() {
  const detail::Reply r = core_->call("held", {});
  if (r.type != detail::Reply::Type::Array || r.elements.size() != 2) {
    throw UnexpectedReplyError(
        fmt::format("redlimit: limiter {}: expected an array of 2 from held, got {}", core_->name_, r.describe()));
  }
  return at(r, 0);
}

std::int64_t ConcurrencyLimiter::available() { return std::max<std::int64_t>(0, core_->config_.limit - held()); }

bool ConcurrencyLimiter::deleteLimiter() {
  return detail::command(*core_->client_, {"DEL", core_->name_}).asInteger() > 0;
}

const std::string& ConcurrencyLimiter::getName() const noexcept { return core_->name_; }
const ConcurrencyConfig& ConcurrencyLimiter::config() const noexcept { return core_->config_; }
const std::shared_ptr<Client>& ConcurrencyLimiter::client() const noexcept { return core_->client_; }
FailureStats ConcurrencyLimiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& ConcurrencyLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
