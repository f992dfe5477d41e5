#include "limiters/script_core.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/lease_id.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

std::exception_ptr limiterError(std::exception_ptr error) {
  // Looked at in place (errorIn), not rethrown: a mass failure runs this once per request.
  if (const auto* e = dynamic_cast<const ScriptError*>(errorIn(error))) {
    const std::string& code = e->code();
    if (code.rfind("REDLIMIT_", 0) != 0) return error;
    // The script's own words, prefixed as every message of the library is.
    const std::string text = "redlimit: " + std::string(e->what());
    if (code == "REDLIMIT_NOT_INITIALIZED") return std::make_exception_ptr(NotInitializedError(code, text));
    if (code == "REDLIMIT_INVALID_CONFIG")
      return std::make_exception_ptr(ScriptError(ErrorKind::InvalidConfig, code, text));
    if (code == "REDLIMIT_INVALID_STATE")
      return std::make_exception_ptr(ScriptError(ErrorKind::InvalidState, code, text));
    if (code == "REDLIMIT_INVALID_ARGUMENT") return std::make_exception_ptr(InvalidArgument(text));
  }
  return error;
}

namespace {

// A settle reply: {status, reserved, actual, returned, charged, unpaid, remaining}.
constexpr std::size_t kSettleReplySize = 7;

// `r`, checked to be an array of `size` (ReplyError (UnexpectedReply) naming `key` and `what`).
const Reply& arrayOf(const std::string& key, const Reply& r, std::size_t size, std::string_view what) {
  return arrayReply("limiter ", key, r, size, what);
}

std::int64_t at(const Reply& r, std::size_t i) { return r.elements.at(i).asInteger(); }

const char* labelOf(char kind) {
  switch (kind) {
    case 'T':
      return "token bucket limiter";
    case 'G':
      return "GCRA limiter";
    case 'W':
      return "fixed window limiter";
    case 'V':
      return "sliding window counter";
    case 'S':
      return "smooth limiter";
    case 'C':
      return "concurrency limit";
    default:
      return "limiter";
  }
}

}  // namespace

// limiterError(), and a WRONGTYPE raised by a Redis command inside the limiter's script (its
// fast path reads the one key with redis.call, not pcall: cheaper) -> ScriptError (InvalidConfig) naming
// that key, as the script's own check words it. The script touches no other key, and a read is
// its first command on it, so nothing was written.
std::exception_ptr oneKeyScriptError(std::exception_ptr error, const std::string& key, char kind) {
  // Looked at in place (errorIn), not rethrown: a mass failure runs this once per request.
  const auto* e = dynamic_cast<const ScriptError*>(errorIn(error));
  if (e != nullptr && e->code() == "WRONGTYPE") {
    return std::make_exception_ptr(
        ScriptError(ErrorKind::InvalidConfig, "REDLIMIT_INVALID_CONFIG",
                    fmt::format("key {} holds another Redis type, not a {} (another program wrote it); "
                                "delete it or use another limiter name",
                                key, labelOf(kind))));
  }
  return limiterError(std::move(error));
}

void checkPermitsUpTo(std::int64_t permits, std::int64_t most, std::string_view kind, std::string_view name,
                      std::string_view why) {
  checkPermitRange(permits);
  if (permits > most) {
    throw InvalidArgument(
        fmt::format("redlimit: {}{}: permits must be in 1..{} ({}), got {}", kind, name, most, why, permits));
  }
}

void checkMaxWait(microseconds maxWait) {
  if (maxWait.count() < 0) {
    throw InvalidArgument(fmt::format("redlimit: maxWait must be >= 0, got {} us", maxWait.count()));
  }
}

void checkReservationTtl(milliseconds recordTtl) {
  if (recordTtl.count() < 1 || recordTtl > kMaxReservationTtl) {
    throw InvalidArgument(fmt::format("redlimit: a reservation record's TTL must be in 1..{} ms, got {} ms",
                                      kMaxReservationTtl.count(), recordTtl.count()));
  }
}

const Reply& arrayReply(std::string_view kind, std::string_view name, const Reply& r, std::size_t size,
                        std::string_view what) {
  if (r.type != Reply::Type::Array || r.elements.size() != size) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: {}{}: expected an array of {} from {}, got {}", kind, name, size, what, r.describe()));
  }
  return r;
}

Decision policyDecision(std::int64_t permits, bool allowed, std::int64_t limit) {
  Decision d;
  d.allowed = allowed;
  d.permits = permits;
  d.limit = limit;
  d.byPolicy = true;
  return d;
}

Lease unheldLease(bool byPolicy, bool shadowDenied) {
  Lease lease;
  lease.id = newLeaseId();
  lease.byPolicy = byPolicy;
  lease.shadowDenied = shadowDenied;
  return lease;
}

bool parseReserveRepeated(const std::string& name, const Reply& r) {
  return at(arrayOf(name, r, kReserveReplySize, "reserve"), kReserveReplySize - 1) == 1;
}

Settlement parseSettlement(const std::string& name, const Reply& r, const LimiterMonitor& monitor) {
  (void)arrayOf(name, r, kSettleReplySize, "settle");
  const Settlement::Status status = settleStatusOf(at(r, 0), fmt::format("limiter {}", name));
  if (status == Settlement::Status::Unknown) return Settlement{};  // Unknown, nothing more
  Settlement out{status, at(r, 1), at(r, 2), at(r, 3), at(r, 4), at(r, 5), at(r, 6)};
  countSettled(monitor, out);
  return out;
}

void countSettled(const LimiterMonitor& monitor, const Settlement& s) {
  if (s.status != Settlement::Status::Settled) return;
  monitor.reservationSettled();
  if (s.returned > 0) monitor.refunded(s.returned);  // what came back (to every limit of a MultiLimit)
}

// The monitor of a handle whose client and name pass the checks (made only then: a refused name
// must not take a place in the metrics registry).
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const LimiterMonitor::Options& monitor) {
  if (!client) throw InvalidArgument("redlimit: a limiter needs a Client");
  checkLimiterName(name, kMaxNameLength);
  return LimiterMonitor(name, monitor, client->options().onEvent);
}

ScriptCore::ScriptCore(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
                       const LimiterMonitor::Options& monitor, const Script* script, char kind,
                       std::shared_ptr<const KeyedPolicy> policy, std::size_t denyCacheKeys)
    : client_(std::move(client)),
      name_(std::move(name)),
      script_(script),
      kind_(kind),
      gate_(name_, std::move(failure), ClockView{}, checkedMonitor(client_, name_, monitor)),
      denials_(std::make_shared<LimiterDenyCache>(denyCacheKeys)),
      policy_(std::move(policy)) {
  if (policy_) remember(policy_->limit, policy_->localRate, policy_->localIntervalMs);
  if (policy_ && policy_->calendar) {
    calendarArgs_ = calendarArgs(*policy_->calendar, milliseconds{policy_->fields.back()});
    tables_ = std::make_shared<CalendarTables>("limiter " + name_);
    tables_->add(4 + calendarArgs_.size() - 1, *policy_->calendar, {});  // after op, now, kind and the count
  }
  callBound_ = LimiterCall::boundOf(*client_);
  if (kind == 'T' || kind == 'G' || kind == 'W') batcher_ = OneKeyBatcher::of(client_);
}

void ScriptCore::remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept {
  knownLimit_.store(limit, std::memory_order_relaxed);
  localRate_.store(localRate, std::memory_order_relaxed);
  localIntervalMs_.store(localIntervalMs, std::memory_order_relaxed);
}

ScriptRequest ScriptCore::request(const std::string& key, std::vector<std::string> argv, std::string record,
                                  bool coalesce) const {
  ScriptRequest r{script_, {}, std::move(argv), coalesce ? batcher_.get() : nullptr, tables_};
  r.keys.reserve(record.empty() ? 1 : 2);
  r.keys.push_back(key);
  if (!record.empty()) r.keys.push_back(std::move(record));
  return r;
}

std::vector<std::string> ScriptCore::argvOf(std::string_view op, std::initializer_list<std::string_view> rest,
                                            std::size_t more) const {
  std::vector<std::string> argv;
  argv.reserve(3 + rest.size() + more);
  argv.emplace_back(op);
  argv.emplace_back();
  argv.emplace_back(1, kind_);
  for (std::string_view arg : rest) argv.emplace_back(arg);
  return argv;
}

std::vector<std::string> ScriptCore::args(std::string_view op, std::int64_t a, std::int64_t b) const {
  std::vector<std::string> argv = argvOf(op, {fmt::to_string(a)}, calendarArgs_.size() + 2);
  if (tables_) {
    argv.insert(argv.end(), calendarArgs_.begin(), calendarArgs_.end());
    if (op == "reserve") argv.push_back(fmt::to_string(b));
    return argv;
  }
  argv.push_back(fmt::to_string(b));
  if (policy_) argv.push_back(policy_->packed);
  return argv;
}

LimiterCall::Params ScriptCore::decision(std::int64_t permits) const {
  return LimiterCall::decision(callBound_, permits, localRate_.load(std::memory_order_relaxed),
                               milliseconds{localIntervalMs_.load(std::memory_order_relaxed)});
}

Decision ScriptCore::byPolicy(std::int64_t permits, bool allowed) const {
  return policyDecision(permits, allowed, knownLimit_.load(std::memory_order_relaxed));
}

// The kind is ARGV[3].
ScriptCore::Read<Decision> ScriptCore::reading(std::int64_t permits) {
  return [permits](ScriptCore* self, const ScriptRequest& q, const Reply& r) {
    return decisionOf(saw(self, parseDecisionReply(r, decisionFormOf(q.argv[2][0]), q.keys[0])), permits);
  };
}

const DecisionReply& ScriptCore::saw(ScriptCore* self, const DecisionReply& v) {
  if (self == nullptr) return v;
  self->remember(v.limit, v.localRate, v.localIntervalMs);
  if (self->tables_) self->tables_->sawServerNow(microseconds{v.nowUs});
  return v;
}

// A resent take may count twice, never grant twice (docs/failure-modes.md). Counted: shadow mode
// makes a refused decision allowed, without delay.
ScriptCore::Op<Decision> ScriptCore::takeOp(const std::string& key, std::int64_t permits, microseconds maxWait,
                                            bool counted) const {
  if (counted) checkMaxWait(maxWait);
  checkPermits(permits);
  const microseconds wait = std::clamp(maxWait, microseconds{0}, kMaxWait);
  Op<Decision> op{decision(permits), "decide", request(key, args("take", permits, wait.count()), {}, true),
                  reading(permits),
                  [permits](ScriptCore& self, bool allowed) { return self.byPolicy(permits, allowed); }};
  if (counted) op.then = [](const LimiterMonitor& monitor, Decision& d) { monitor.admit(d); };
  return op;
}

// Sent again after a closed connection: the record makes a resend take nothing twice.
ScriptCore::Op<Decision> ScriptCore::reserveForOp(const std::string& key, std::int64_t permits, const std::string& id,
                                                  milliseconds recordTtl) const {
  std::string record = namespacedRecordKey(key, id);
  checkReservationTtl(recordTtl);
  checkPermits(permits);
  return {decision(permits),
          "reserveFor",
          request(key, args("reserve", permits, recordTtl.count()), std::move(record)),
          [permits](ScriptCore* self, const ScriptRequest& q, const Reply& r) {  // take's values, then repeated
            DecisionReply v;
            Decision out = parseHeld(r, q.keys[0], permits, v);
            (void)saw(self, v);
            return out;
          },
          [permits](ScriptCore& self, bool allowed) { return self.byPolicy(permits, allowed); },
          [](const LimiterMonitor& monitor, Decision& out) { admitHeld(monitor, out); }};
}

bool tryAcquireWithin(const FailureGate& gate, std::int64_t permits, milliseconds timeout, const TakeWithin& take) {
  const LimiterMonitor& monitor = gate.monitor();
  if (monitor.shadow()) {  // shadow mode never waits
    Decision d = take(microseconds{0});
    monitor.admit(d);
    return d.allowed;
  }
  const microseconds maxWait = timeout.count() <= 0 ? microseconds{0} : saturatingCast<microseconds>(timeout);
  const Decision r = take(maxWait);
  if (!monitor.admit(r.allowed, permits, r.retryAfter, r.byPolicy)) return false;
  if (r.delay.count() > 0) gate.clock().sleepFor(r.delay);
  return true;
}

microseconds acquireWaiting(const FailureGate& gate, std::int64_t permits, const TakeWithin& take) {
  const LimiterMonitor& monitor = gate.monitor();
  if (monitor.shadow()) {  // shadow mode never waits: tryAcquire's one attempt, a denial let through
    (void)tryAcquireWithin(gate, permits, milliseconds{0}, take);
    return microseconds{0};
  }
  microseconds waited{0};
  for (;;) {
    const Decision r = take(kMaxWait);
    if (r.allowed) {
      (void)monitor.admit(true, permits);
      if (r.delay.count() > 0) gate.clock().sleepFor(r.delay);
      return microseconds{saturatingAdd(waited.count(), r.delay.count())};
    }
    // Denied by the failure policy (no wait known): ask again after a probe interval. Denied by
    // the script: the wait was longer than a reservation may be; sleep until it fits.
    const microseconds pause = r.byPolicy ? saturatingCast<microseconds>(gate.options().probeInterval) : r.retryAfter;
    gate.clock().sleepFor(pause);
    waited = microseconds{saturatingAdd(waited.count(), pause.count())};
  }
}

ScriptCore::Op<Decision> ScriptCore::peekOp(const std::string& key, std::int64_t permits) const {
  checkPermits(permits);
  // peek ignores the wait: the same positions keep the configuration at ARGV[6] for both.
  return {LimiterCall::plain(callBound_), "peek", request(key, args("peek", permits, 0)), reading(permits)};
}

// Never resent: a refund that went through and was sent again would give the permits back twice.
ScriptCore::Op<bool> ScriptCore::giveBackOp(const std::string& key, std::int64_t permits, bool counted) const {
  checkRefundPermits(permits);
  Op<bool> op{LimiterCall::plain(callBound_, LimiterCall::Resend::Never), "refund",
              request(key, args("refund", permits, 0)),
              [](ScriptCore*, const ScriptRequest&, const Reply&) { return true; }};
  if (counted) op.then = [permits](const LimiterMonitor& monitor, bool&) { monitor.refunded(permits); };
  return op;
}

// Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
ScriptCore::Op<Settlement> ScriptCore::settleOp(const std::string& key, const std::string& id,
                                                std::int64_t actual) const {
  std::string record = namespacedRecordKey(key, id);
  checkActualPermits(actual);
  return {LimiterCall::plain(callBound_), "settle", request(key, args("settle", actual, 0), std::move(record)),
          [monitor = gate_.monitor()](ScriptCore*, const ScriptRequest& q, const Reply& r) {
            return parseSettlement(q.keys[0], r, monitor);
          }};
}

bool ScriptCore::writeConfig(const std::string& key, ConfigWrite how, const std::vector<std::string>& config) {
  std::vector<std::string> argv = argvOf("set", {how == ConfigWrite::IfAbsent ? "try" : "keep"}, config.size());
  argv.insert(argv.end(), config.begin(), config.end());
  const Reply r =
      run(Op<Reply>{LimiterCall::plain(callBound_, how == ConfigWrite::IfAbsent ? LimiterCall::Resend::Never
                                                                                : LimiterCall::Resend::IfClosed),
                    "set", request(key, std::move(argv)), [](ScriptCore*, const ScriptRequest& q, const Reply& reply) {
                      return arrayOf(q.keys[0], reply, 4, "the set operation");
                    }});
  const bool written = how == ConfigWrite::KeepState || at(r, 0) == 1;
  if (written) remember(at(r, 1), at(r, 2), at(r, 3));
  return written;
}

namespace {

// acquire's reply {granted, expiryUs, remaining, limit, nowUs, retryUs, resetUs, held}, for the
// lease `id`.
LeaseDecision parseAcquire(const std::string& key, const Reply& r, const std::string& id) {
  (void)arrayOf(key, r, 8, "acquire");
  // A decision as a take's (the script's remaining is never below 0).
  LeaseDecision out{decisionOf(DecisionReply{at(r, 0) == 1, at(r, 2), at(r, 5), at(r, 6), at(r, 3), at(r, 4)}, 1),
                    std::nullopt};
  if (out.decision.allowed) out.lease = Lease{id, microseconds{at(r, 1)}};
  return out;
}

// Counts the decision and returns what the caller gets (shadow mode: a denial let through, with
// a lease Redis does not hold).
LeaseDecision admitted(const LimiterMonitor& monitor, LeaseDecision out) {
  Decision& d = out.decision;
  if (d.allowed) {
    (void)monitor.admit(true, 1);
  } else if (monitor.admit(false, 1, d.retryAfter, d.byPolicy)) {
    d.allowed = true;
    d.shadowDenied = true;
    out.lease = unheldLease(d.byPolicy, true);
  }
  return out;
}

}  // namespace

std::optional<Lease> parseRenew(std::string_view kind, std::string_view name, const Reply& r, Lease lease) {
  if (at(arrayReply(kind, name, r, 3, "renew"), 0) != 1) return std::nullopt;
  lease.expiresAt = microseconds{at(r, 1)};
  return lease;
}

std::int64_t firstOfTwo(std::string_view kind, std::string_view name, const Reply& r, std::string_view op) {
  return at(arrayReply(kind, name, r, 2, op), 0);
}

bool renewedTo(Lease& lease, const std::optional<Lease>& renewed) {
  if (renewed) lease.expiresAt = renewed->expiresAt;
  return renewed.has_value();
}

LeaseDecision ScriptCore::leaseByPolicy(bool allowed) const {
  LeaseDecision out{byPolicy(1, allowed), std::nullopt};
  if (allowed) out.lease = unheldLease(true, false);
  return out;
}

// Sent again after a closed connection with the same lease id (ARGV[4]): a live lease of that id
// is granted again, not added.
ScriptCore::Op<LeaseDecision> ScriptCore::acquireOp(const std::string& key, milliseconds ttl) const {
  checkLeaseTtl(ttl);
  return {decision(1),
          "acquireLease",
          request(key, argvOf("acquire", {newLeaseId(), fmt::to_string(policy_->limit), fmt::to_string(ttl.count())})),
          [](ScriptCore*, const ScriptRequest& q, const Reply& r) { return parseAcquire(q.keys[0], r, q.argv[3]); },
          [](ScriptCore& self, bool allowed) { return self.leaseByPolicy(allowed); },
          [](const LimiterMonitor& monitor, LeaseDecision& d) { d = admitted(monitor, std::move(d)); }};
}

// renew and release are safe to send again: a renew sent twice extends twice from about the same
// instant, a release sent twice answers what the first did not see.
ScriptCore::Op<std::optional<Lease>> ScriptCore::renewOp(const std::string& key, const Lease& lease,
                                                         milliseconds ttl) const {
  checkLeaseId(lease.id);
  checkLeaseTtl(ttl);
  return {LimiterCall::plain(callBound_), "renew",
          request(key, argvOf("renew", {lease.id, fmt::to_string(ttl.count())})),
          [lease](ScriptCore*, const ScriptRequest& q, const Reply& r) {
            return parseRenew("limiter ", q.keys[0], r, lease);
          }};
}

ScriptCore::Op<bool> ScriptCore::releaseOp(const std::string& key, const Lease& lease) const {
  checkLeaseId(lease.id);
  return {LimiterCall::plain(callBound_), "release", request(key, argvOf("release", {lease.id})),
          [](ScriptCore*, const ScriptRequest& q, const Reply& r) {
            return firstOfTwo("limiter ", q.keys[0], r, "release") == 1;
          }};
}

ScriptCore::Op<std::int64_t> ScriptCore::heldOp(const std::string& key) const {
  return {
      LimiterCall::plain(callBound_), "held", request(key, argvOf("held", {})),
      [](ScriptCore*, const ScriptRequest& q, const Reply& r) { return firstOfTwo("limiter ", q.keys[0], r, "held"); }};
}

bool decideUnanswered(FailureGate& gate, std::int64_t permits, std::int64_t rate, milliseconds interval,
                      const std::string& reason) {
  checkPermitRange(permits);
  if (auto d = gate.decide(permits, rate, interval)) return *d;
  throw TimeoutError(fmt::format("redlimit: limiter {}: {}", gate.limiter(), reason));
}

AcquireResult ScriptCore::takeUpTo(const std::string& key, std::int64_t atLeast, std::int64_t atMost) {
  const KeyedPolicy* config = policy_.get();
  checkPermits(atLeast);
  if (atMost < atLeast) {
    throw InvalidArgument(fmt::format("redlimit: atMost ({}) < atLeast ({})", atMost, atLeast));
  }
  // Until a reply told the limit, ask for atLeast only: more could exceed it (InvalidArgument).
  const std::int64_t limit = config ? config->limit : knownLimit_.load(std::memory_order_relaxed);
  const std::int64_t ask = limit > 0 ? std::max(atLeast, std::min(atMost, limit)) : atLeast;
  Decision d = run(takeOp(key, ask, {}));
  if (!d.allowed && !d.byPolicy && ask > atLeast) {
    d = run(takeOp(key, d.remaining >= atLeast ? std::min(d.remaining, ask) : atLeast, {}));
  }
  AcquireResult r;
  r.byPolicy = d.byPolicy;
  r.remaining = d.remaining;
  r.grantTime = d.time;
  if (!d.allowed) {
    r.wait = d.retryAfter;
    return r;
  }
  r.granted = d.permits;
  const std::int64_t localRate = config ? config->localRate : localRate_.load(std::memory_order_relaxed);
  const std::int64_t localMs = config ? config->localIntervalMs : localIntervalMs_.load(std::memory_order_relaxed);
  r.rate = localRate;
  if (!d.byPolicy && localRate > 0) {
    // In double: permits x localMs can pass 2^63. Its rounding (well under a µs here) is lost in
    // the floor to ms below.
    const double backUs =
        static_cast<double>(d.permits) * static_cast<double>(localMs) * 1000.0 / static_cast<double>(localRate);
    const microseconds back{backUs >= static_cast<double>(d.resetAfter.count()) ? d.resetAfter.count()
                                                                                : static_cast<std::int64_t>(backUs)};
    r.interval = std::chrono::floor<milliseconds>(back);
  }
  return r;
}

}  // namespace redlimit::detail
