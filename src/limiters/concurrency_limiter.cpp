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

  Steady::time_point callDeadline() const { return detail::deadlineAfter<Steady>(Steady::now(), callBound_); }

  // One run of the script (op, now = server's, kind, args...). ScriptErrors become the limiter's
  // types. `resendIfClosed`: sent once more if the connection closed before the reply (every
  // operation is safe to send twice: acquire by its id, renew and release by theirs).
  detail::Reply call(std::string_view op, const std::vector<std::string>& args, bool resendIfClosed) {
    std::vector<std::string_view> argv{op, "", std::string_view(&kKind, 1)};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::vector<std::string_view> keys{name_};
    const Steady::time_point deadline = callDeadline();
    constexpr int kMaxTries = 2;
    for (int tries = 1;; ++tries) {
      try {
        return detail::eval(*client_, kConcurrency, keys, argv, deadline);
      } catch (const ScriptError&) {
        std::rethrow_exception(detail::oneKeyScriptError(std::current_exception(), name_, kKind));
      } catch (const ClosedError&) {
        if (!resendIfClosed || tries == kMaxTries || Steady::now() >= deadline) throw;
      }
    }
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
    if (client_->onIoThread()) {
      throw InvalidArgument(fmt::format(
          "redlimit: limiter {}: a sync call from a completion callback would wait for the thread that runs it",
          name_));
    }
    // FailurePolicy::Local: limit x localShare leases per leaseTtl.
    const milliseconds interval = config_.leaseTtl;
    if (!gate_.shouldTry()) {
      if (auto d = gate_.decide(1, config_.limit, interval)) return byPolicy(*d);
      gate_.throwUnavailable();
    }
    const std::string id = newLeaseId();
    const std::vector<std::string> args{id, fmt::to_string(config_.limit), fmt::to_string(ttl.count())};
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    try {
      LeaseDecision out = parseAcquire(name_, call("acquire", args, true), id);
      gate_.answered(started);
      return out;
    } catch (const Error&) {
      if (auto d = gate_.settle(std::current_exception(), started, 1, config_.limit, interval)) return byPolicy(*d);
      throw;
    }
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
  // once more with the same lease id (a live lease with that id is granted again, not added).
  void acquireAsync(milliseconds ttl, std::function<void(LeaseDecision, std::exception_ptr)> done) {
    try {
      detail::checkLeaseTtl(ttl);
    } catch (...) {
      done(LeaseDecision{}, std::current_exception());
      return;
    }
    const milliseconds interval = config_.leaseTtl;
    if (gate_.answerWithoutRedis(
            1, config_.limit, interval, [&](bool allowed) { done(byPolicy(allowed), nullptr); },
            [&](const std::exception_ptr& e) { done(LeaseDecision{}, e); })) {
      return;
    }
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    sendAcquire(newLeaseId(), ttl, started, callDeadline(), std::move(done));
  }

  void sendAcquire(const std::string& id, milliseconds ttl, std::int64_t started, Steady::time_point deadline,
                   std::function<void(LeaseDecision, std::exception_ptr)> done) {
    // The completion holds the handle weakly: a request in flight must not keep a dropped limiter
    // (and through it the Client and its I/O thread) alive.
    callAsync(argvOf("acquire", {id, fmt::to_string(config_.limit), fmt::to_string(ttl.count())}), deadline,
              [weak = weak_from_this(), name = name_, id, started, done = std::move(done)](const detail::Reply& r,
                                                                                           std::exception_ptr error) {
                const std::shared_ptr<Core> self = weak.lock();
                LeaseDecision out;
                if (!error) {
                  try {
                    out = parseAcquire(name, r, id);
                  } catch (...) {
                    error = std::current_exception();
                  }
                }
                detail::FailureGate::finish(
                    self ? &self->gate_ : nullptr, error, started, 1, self ? self->config_.limit : 0,
                    self ? self->config_.leaseTtl : milliseconds{0}, [&] { done(std::move(out), nullptr); },
                    [&](bool allowed) { done(self->byPolicy(allowed), nullptr); },
                    [&](const std::exception_ptr& e) { done(LeaseDecision{}, e); });
              });
  }

  // The script's arguments for `op` (the time argument empty: the server's clock).
  static std::shared_ptr<const std::vector<std::string>> argvOf(std::string_view op, std::vector<std::string> rest) {
    std::vector<std::string> argv{std::string(op), "", std::string(1, kKind)};
    argv.insert(argv.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
    return std::make_shared<const std::vector<std::string>>(std::move(argv));
  }

  using ReplyDone = std::function<void(const detail::Reply&, std::exception_ptr)>;

  // call() without waiting: `done` gets the reply or the error (ScriptErrors as the limiter's
  // types) once, on the I/O thread. Sent once more if the connection closed before the reply and
  // the deadline is not reached (every operation is safe to send twice). The completion holds the
  // handle weakly; a dropped handle's request is not sent again.
  void callAsync(std::shared_ptr<const std::vector<std::string>> argv, Steady::time_point deadline, ReplyDone done,
                 int tries = 1) {
    const std::vector<std::string_view> views(argv->begin(), argv->end());
    const std::vector<std::string_view> keys{name_};
    detail::evalAsync(
        *client_, kConcurrency, keys, views,
        [weak = weak_from_this(), name = name_, argv, deadline, tries, done = std::move(done)](
            const detail::Reply& r, std::exception_ptr error) mutable {
          if (!error) {
            done(r, nullptr);
            return;
          }
          if (detail::closedConnection(error) && tries < 2 && Steady::now() < deadline) {
            if (const std::shared_ptr<Core> self = weak.lock()) {
              self->callAsync(std::move(argv), deadline, std::move(done), tries + 1);
              return;
            }
          }
          done(r, detail::oneKeyScriptError(std::move(error), name, kKind));
        },
        deadline);
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
      parseRenew(core_->name_, core_->call("renew", {lease.id, fmt::to_string(leaseTtl.count())}, true));
  if (!expiry) return false;
  lease.expiresAt = *expiry;
  return true;
}

bool ConcurrencyLimiter::release(const Lease& lease) {
  checkLeaseId(lease.id);
  return parseRelease(core_->name_, core_->call("release", {lease.id}, true));
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
  core_->callAsync(
      Core::argvOf("renew", std::move(rest)), core_->callDeadline(),
      [name = core_->name_, lease = std::move(lease), done](const detail::Reply& r, std::exception_ptr error) mutable {
        if (error) {
          done(std::nullopt, std::move(error));
          return;
        }
        std::optional<microseconds> expiry;
        try {
          expiry = parseRenew(name, r);
        } catch (...) {
          done(std::nullopt, std::current_exception());
          return;
        }
        if (!expiry) {
          done(std::nullopt, nullptr);
          return;
        }
        lease.expiresAt = *expiry;
        done(std::move(lease), nullptr);
      });
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
  core_->callAsync(Core::argvOf("release", {lease.id}), core_->callDeadline(),
                   [name = core_->name_, done](const detail::Reply& r, std::exception_ptr error) {
                     if (error) {
                       done(false, std::move(error));
                       return;
                     }
                     bool released = false;
                     try {
                       released = parseRelease(name, r);
                     } catch (...) {
                       done(false, std::current_exception());
                       return;
                     }
                     done(released, nullptr);
                   });
}

std::future<bool> ConcurrencyLimiter::releaseAsync(const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(lease, ReleaseCallback(std::move(done))); });
}

std::int64_t ConcurrencyLimiter::held() {
  const detail::Reply r = core_->call("held", {}, true);
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
