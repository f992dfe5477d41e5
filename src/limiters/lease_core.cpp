#include "limiters/lease_core.hpp"

#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "limiters/completion.hpp"
#include "limiters/lease_id.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

const detail::Script kConcurrency{detail::lua::concurrency.name, detail::lua::concurrency.sha1,
                                  detail::lua::concurrency.source};
constexpr char kKind = 'C';
constexpr std::size_t kAcquireReplySize = 8;  // {granted, expiryUs, remaining, limit, nowUs, retryUs, resetUs, held}

std::int64_t at(const detail::Reply& r, std::size_t i) { return r.elements.at(i).asInteger(); }

// renew's reply {renewed, expiryUs, nowUs}: the new expiry, or nullopt when the lease was not live.
std::optional<microseconds> parseRenew(const std::string& name, const detail::Reply& r) {
  if (r.type != detail::Reply::Type::Array || r.elements.size() != 3) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: limiter {}: expected an array of 3 from renew, got {}", name, r.describe()));
  }
  if (at(r, 0) != 1) return std::nullopt;
  return microseconds{at(r, 1)};
}

// release's reply {released, nowUs}.
bool parseRelease(const std::string& name, const detail::Reply& r) {
  if (r.type != detail::Reply::Type::Array || r.elements.size() != 2) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: limiter {}: expected an array of 2 from release, got {}", name, r.describe()));
  }
  return at(r, 0) == 1;
}

// held's reply: {leases live, ...}.
std::int64_t parseHeld(const std::string& key, const Reply& r) {
  if (r.type != Reply::Type::Array || r.elements.size() != 2) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: limiter {}: expected an array of 2 from held, got {}", key, r.describe()));
  }
  return at(r, 0);
}

// The acquire script's reply, for the lease `id`.
LeaseDecision parseAcquire(const std::string& name, const detail::Reply& r, const std::string& id) {
  if (r.type != detail::Reply::Type::Array || r.elements.size() != kAcquireReplySize) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: limiter {}: expected an array of {} from the script, got {}", name,
                                 kAcquireReplySize, r.describe()));
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

LeaseCore::LeaseCore(std::shared_ptr<Client> client, std::string name, const Policy& policy, FailureOptions failure,
                     const LimiterMonitor::Options& monitor)
    : client_(std::move(client)),
      name_(std::move(name)),
      limit_(policy.limit()),
      leaseTtl_(policy.leaseTtl()),
      gate_(name_, std::move(failure), ClockView{}, checkedMonitor(client_, name_, monitor)) {
  const ClientOptions& o = client_->options();
  callBound_ = saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
}

// A run of the script on `key`: op, now (empty: the server's clock), kind, `rest`. Every operation
// is safe to send again after a closed connection: acquire by its lease id, renew and release by
// theirs.
ScriptRequest LeaseCore::request(const std::string& key, std::string_view op, std::vector<std::string> rest) const {
  std::vector<std::string> argv{std::string(op), "", std::string(1, kKind)};
  argv.insert(argv.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return ScriptRequest{&kConcurrency, {key}, std::move(argv), nullptr, nullptr};
}

// FailurePolicy::Local: limit leases per leaseTtl.
LimiterCall::Params LeaseCore::decision() const { return LimiterCall::decision(callBound_, 1, limit_, leaseTtl_); }

Reply LeaseCore::call(const std::string& key, std::string_view op, std::vector<std::string> rest) {
  return runScript(
      *this, LimiterCall::plain(callBound_), op, request(key, op, std::move(rest)), OneKeyErrors{key, kKind},
      [](const Reply& r) { return r; }, [](bool) { return Reply{}; });
}

template <class Out, class Parse>
void LeaseCore::callAsync(const std::string& key, std::string_view op, std::vector<std::string> rest, Parse parse,
                          std::function<void(Out, std::exception_ptr)> done) {
  runScriptAsync<Out>(
      shared_from_this(), LimiterCall::plain(callBound_), request(key, op, std::move(rest)), OneKeyErrors{key, kKind},
      [parse = std::move(parse)](LeaseCore*, const Reply& r) { return parse(r); },
      [](LeaseCore&, bool) { return Out{}; }, std::move(done));
}

LeaseDecision LeaseCore::byPolicy(bool allowed) const {
  LeaseDecision out;
  out.decision.allowed = allowed;
  out.decision.permits = 1;
  out.decision.limit = limit_;
  out.decision.byPolicy = true;
  if (allowed) {
    Lease lease;
    lease.id = newLeaseId();
    lease.byPolicy = true;
    out.lease = std::move(lease);
  }
  return out;
}

LeaseDecision LeaseCore::acquire(const std::string& key, milliseconds ttl) {
  checkLeaseTtl(ttl);
  const std::string id = newLeaseId();
  return admitted(
      gate_.monitor(),
      runScript(
          *this, decision(), "acquire",
          request(key, "acquire", {id, fmt::to_string(limit_), fmt::to_string(ttl.count())}), OneKeyErrors{key, kKind},
          [&](const Reply& r) { return parseAcquire(key, r, id); }, [&](bool allowed) { return byPolicy(allowed); }));
}

void LeaseCore::acquireAsync(const std::string& key, milliseconds ttl, LeaseDone done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { checkLeaseTtl(ttl); })) return;
  const std::string id = newLeaseId();
  runScriptAsync<LeaseDecision>(
      shared_from_this(), decision(),
      request(key, "acquire", {id, fmt::to_string(limit_), fmt::to_string(ttl.count())}), OneKeyErrors{key, kKind},
      [key, id](LeaseCore*, const Reply& r) { return parseAcquire(key, r, id); },
      [](LeaseCore& self, bool allowed) { return self.byPolicy(allowed); },
      [monitor = gate_.monitor(), done = std::move(done)](LeaseDecision d, std::exception_ptr e) {
        if (e) {
          done(LeaseDecision{}, std::move(e));
          return;
        }
        done(admitted(monitor, std::move(d)), nullptr);
      });
}

bool LeaseCore::renew(const std::string& key, Lease& lease, milliseconds ttl) {
  checkLeaseId(lease.id);
  checkLeaseTtl(ttl);
  const std::optional<microseconds> expiry =
      parseRenew(key, call(key, "renew", {lease.id, fmt::to_string(ttl.count())}));
  if (!expiry) return false;
  lease.expiresAt = *expiry;
  return true;
}

void LeaseCore::renewAsync(const std::string& key, Lease lease, milliseconds ttl, RenewDone done) {
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] {
        checkLeaseId(lease.id);
        checkLeaseTtl(ttl);
      })) {
    return;
  }
  std::vector<std::string> rest{lease.id, fmt::to_string(ttl.count())};
  callAsync<std::optional<Lease>>(
      key, "renew", std::move(rest),
      [key, lease = std::move(lease)](const Reply& r) -> std::optional<Lease> {
        const std::optional<microseconds> expiry = parseRenew(key, r);
        if (!expiry) return std::nullopt;
        Lease renewed = lease;
        renewed.expiresAt = *expiry;
        return renewed;
      },
      std::move(done));
}

bool LeaseCore::release(const std::string& key, const Lease& lease) {
  checkLeaseId(lease.id);
  return parseRelease(key, call(key, "release", {lease.id}));
}

void LeaseCore::releaseAsync(const std::string& key, const Lease& lease, ReleaseDone done) {
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { checkLeaseId(lease.id); })) return;
  callAsync<bool>(
      key, "release", {lease.id}, [key](const Reply& r) { return parseRelease(key, r); }, std::move(done));
}

std::int64_t LeaseCore::held(const std::string& key) { return parseHeld(key, call(key, "held", {})); }

void LeaseCore::heldAsync(const std::string& key, std::function<void(std::int64_t, std::exception_ptr)> done) {
  callAsync<std::int64_t>(
      key, "held", {}, [key](const Reply& r) { return parseHeld(key, r); },
      isolated(std::move(done), gate_.monitor(), name_));
}

bool LeaseCore::deleteKey(const std::string& key) { return redlimit::detail::deleteKey(*this, key); }

void LeaseCore::deleteKeyAsync(const std::string& key, ReleaseDone done) {
  redlimit::detail::deleteKeyAsync(shared_from_this(), key, isolated(std::move(done), gate_.monitor(), name_));
}

bool LeaseCore::exists(const std::string& key) { return keyExists(*this, key); }

void LeaseCore::existsAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) {
  keyExistsAsync(shared_from_this(), key, isolated(std::move(done), gate_.monitor(), name_));
}

}  // namespace redlimit::detail
