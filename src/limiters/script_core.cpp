#include "limiters/script_core.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/key_layout.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"
#include "topology/key_slot.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// A settle reply: {status, reserved, actual, returned, charged, unpaid, remaining}.
constexpr std::size_t kSettleReplySize = 7;

void checkPermitRange(std::int64_t permits) {
  if (permits < 1 || permits > kMaxPermits) {
    throw InvalidArgument(fmt::format("redlimit: permits must be in 1..{}, got {}", kMaxPermits, permits));
  }
}

const char* labelOf(char kind) {
  switch (kind) {
    case 'T':
      return "token bucket limiter";
    case 'G':
      return "GCRA limiter";
    case 'W':
      return "fixed window limiter";
    case 'S':
      return "smooth limiter";
    case 'C':
      return "concurrency limit";
    default:
      return "limiter";
  }
}

// limiterError(), and a WRONGTYPE raised by a Redis command inside the limiter's script (its
// fast path reads the one key with redis.call, not pcall: cheaper) -> ScriptError (InvalidConfig) naming
// that key, as the script's own check words it. The script touches no other key, and a read is
// its first command on it, so nothing was written.
std::exception_ptr scriptError(std::exception_ptr error, const std::string& name, char kind) {
  // Looked at in place (errorIn), not rethrown: a mass failure runs this once per request.
  const auto* e = dynamic_cast<const ScriptError*>(errorIn(error));
  if (e != nullptr && e->code() == "WRONGTYPE") {
    return std::make_exception_ptr(
        ScriptError(ErrorKind::InvalidConfig, "REDLIMIT_INVALID_CONFIG",
                    fmt::format("key {} holds another Redis type, not a {} (another program wrote it); "
                                "delete it or use another limiter name",
                                name, labelOf(kind))));
  }
  return limiterError(std::move(error));
}

}  // namespace

std::exception_ptr oneKeyScriptError(std::exception_ptr error, const std::string& key, char kind) {
  return scriptError(std::move(error), key, kind);
}

void checkReservationTtl(milliseconds recordTtl) {
  if (recordTtl.count() < 1 || recordTtl > kMaxReservationTtl) {
    throw InvalidArgument(fmt::format("redlimit: a reservation record's TTL must be in 1..{} ms, got {} ms",
                                      kMaxReservationTtl.count(), recordTtl.count()));
  }
}

void checkActualPermits(std::int64_t actual) {
  if (actual < 0 || actual > kMaxPermits) {
    throw InvalidArgument(fmt::format("redlimit: actual permits must be in 0..{}, got {}", kMaxPermits, actual));
  }
}

bool parseReserveRepeated(const std::string& name, const Reply& r) {
  if (r.type != Reply::Type::Array || r.elements.size() != kReserveReplySize) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: limiter {}: expected an array of {} from reserve, got {}", name,
                                 kReserveReplySize, r.describe()));
  }
  return r.elements[kReserveReplySize - 1].asInteger() == 1;
}

Settlement parseSettlement(const std::string& name, const Reply& r, const LimiterMonitor& monitor) {
  if (r.type != Reply::Type::Array || r.elements.size() != kSettleReplySize) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: limiter {}: expected an array of {} from settle, got {}", name,
                                 kSettleReplySize, r.describe()));
  }
  Settlement out;
  out.status = settleStatusOf(r.elements[0].asInteger(), fmt::format("limiter {}", name));
  if (out.status == Settlement::Status::Unknown) return out;
  out.reserved = r.elements[1].asInteger();
  out.actual = r.elements[2].asInteger();
  out.returned = r.elements[3].asInteger();
  out.charged = r.elements[4].asInteger();
  out.unpaid = r.elements[5].asInteger();
  out.remaining = r.elements[6].asInteger();
  if (out.status == Settlement::Status::Settled) {
    monitor.reservationSettled();
    if (out.returned > 0) monitor.refunded(out.returned);
  }
  return out;
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
                       const LimiterMonitor::Options& monitor, const Script& script, char kind,
                       std::shared_ptr<const KeyedPolicy> policy)
    : client_(std::move(client)),
      name_(std::move(name)),
      script_(script),
      kind_(1, kind),
      gate_(name_, std::move(failure), ClockView{}, checkedMonitor(client_, name_, monitor)),
      policy_(std::move(policy)) {
  if (policy_) remember(policy_->limit, policy_->localRate, policy_->localIntervalMs);
  const ClientOptions& o = client_->options();
  callBound_ = saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
  if (kind == 'T' || kind == 'G' || kind == 'W') batcher_ = OneKeyBatcher::of(client_);
}

void ScriptCore::remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept {
  knownLimit_.store(limit, std::memory_order_relaxed);
  localRate_.store(localRate, std::memory_order_relaxed);
  localIntervalMs_.store(localIntervalMs, std::memory_order_relaxed);
}

void ScriptCore::checkPermits(std::int64_t permits, const KeyedPolicy* policy) const {
  checkPermitRange(permits);
  if (policy != nullptr && permits > policy->maxPermits) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: permits must be in 1..{} (the most one call may take), got {}", name_,
                    policy->maxPermits, permits));
  }
}

ScriptRequest ScriptCore::request(const std::string& key, std::vector<std::string> argv, std::string record,
                                  bool coalesce) {
  ScriptRequest r{&script_, {key}, std::move(argv), coalesce ? batcher_.get() : nullptr, nullptr};
  if (!record.empty()) r.keys.push_back(std::move(record));
  return r;
}

std::vector<std::string> ScriptCore::args(std::string_view op, std::string a, std::string b,
                                          const KeyedPolicy* policy) const {
  std::vector<std::string> argv{std::string(op), "", kind_, std::move(a), std::move(b)};
  if (policy != nullptr) argv.push_back(policy->packed);
  return argv;
}

LimiterCall::Params ScriptCore::decision(std::int64_t permits) const {
  return LimiterCall::decision(callBound_, permits, localRate_.load(std::memory_order_relaxed),
                               milliseconds{localIntervalMs_.load(std::memory_order_relaxed)});
}

Decision ScriptCore::byPolicy(std::int64_t permits, bool allowed) const {
  Decision d;
  d.allowed = allowed;
  d.permits = permits;
  d.limit = knownLimit_.load(std::memory_order_relaxed);
  d.byPolicy = true;
  return d;
}

Decision ScriptCore::parse(ScriptCore* self, const std::string& key, char kind, const Reply& r, std::int64_t permits) {
  const DecisionReply v = parseDecisionReply(r, decisionFormOf(kind), key);
  if (self != nullptr) self->remember(v.limit, v.localRate, v.localIntervalMs);
  return decisionOf(v, permits);
}

Decision ScriptCore::held(ScriptCore* self, const std::string& key, const Reply& r, std::int64_t permits) {
  DecisionReply v;
  Decision out = parseHeld(r, key, permits, v);
  if (self != nullptr) self->remember(v.limit, v.localRate, v.localIntervalMs);
  return out;
}

Decision ScriptCore::take(const std::string& key, std::int64_t permits, microseconds maxWait) {
  const KeyedPolicy* config = policy_.get();
  checkPermits(permits, config);
  const microseconds wait = std::clamp(maxWait, microseconds{0}, kMaxWait);
  return runScript(
      *this, decision(permits), "decide",
      request(key, args("take", fmt::to_string(permits), fmt::to_string(wait.count()), config), {}, true),
      mapError(key), [&](const Reply& r) { return parse(this, key, kind_[0], r, permits); },
      [&](bool allowed) { return byPolicy(permits, allowed); });
}

void ScriptCore::takeAsync(const std::string& key, std::int64_t permits, microseconds maxWait, Done<Decision> done) {
  const KeyedPolicy* config = policy_.get();
  try {
    checkPermits(permits, config);
  } catch (...) {
    done(Decision{}, std::current_exception());
    return;
  }
  const microseconds wait = std::clamp(maxWait, microseconds{0}, kMaxWait);
  runScriptAsync<Decision>(
      shared_from_this(), decision(permits),
      request(key, args("take", fmt::to_string(permits), fmt::to_string(wait.count()), config), {}, true),
      mapError(key),
      [key, kind = kind_[0], permits](ScriptCore* self, const Reply& r) { return parse(self, key, kind, r, permits); },
      [permits](ScriptCore& self, bool allowed) { return self.byPolicy(permits, allowed); }, std::move(done));
}

Decision ScriptCore::decide(const std::string& key, std::int64_t permits) {
  Decision d = take(key, permits, microseconds{0});
  gate_.monitor().admit(d);
  return d;
}

void ScriptCore::decideAsync(const std::string& key, std::int64_t permits, Done<Decision> done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = isolated(std::move(done), gate_.monitor(), name_);
  takeAsync(key, permits, microseconds{0},
            [monitor = gate_.monitor(), done = std::move(done)](Decision d, std::exception_ptr error) {
              if (!error) monitor.admit(d);
              done(d, std::move(error));
            });
}

Decision ScriptCore::reserveFor(const std::string& key, std::int64_t permits, const std::string& id,
                                milliseconds recordTtl) {
  const std::string record = recordKey(key, id);
  checkReservationTtl(recordTtl);
  const KeyedPolicy* config = policy_.get();
  checkPermits(permits, config);
  Decision out = runScript(
      *this, decision(permits), "reserveFor",
      request(key, args("reserve", fmt::to_string(permits), fmt::to_string(recordTtl.count()), config), record),
      mapError(key), [&](const Reply& r) { return held(this, key, r, permits); },
      [&](bool allowed) { return byPolicy(permits, allowed); });
  admitHeld(gate_.monitor(), out);
  return out;
}

void ScriptCore::reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id,
                                 milliseconds recordTtl, Done<Decision> done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  const KeyedPolicy* config = policy_.get();
  std::string record;
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] {
        record = recordKey(key, id);
        checkReservationTtl(recordTtl);
        checkPermits(permits, config);
      })) {
    return;
  }
  runScriptAsync<Decision>(
      shared_from_this(), decision(permits),
      request(key, args("reserve", fmt::to_string(permits), fmt::to_string(recordTtl.count()), config),
              std::move(record)),
      mapError(key), [key, permits](ScriptCore* self, const Reply& r) { return held(self, key, r, permits); },
      [permits](ScriptCore& self, bool allowed) { return self.byPolicy(permits, allowed); },
      [monitor = gate_.monitor(), done = std::move(done)](Decision out, std::exception_ptr error) {
        if (!error) admitHeld(monitor, out);
        done(out, std::move(error));
      });
}

bool ScriptCore::tryAcquire(const std::string& key, std::int64_t permits, milliseconds timeout) {
  const LimiterMonitor& monitor = gate_.monitor();
  if (monitor.shadow()) return decide(key, permits).allowed;  // shadow mode never waits
  const microseconds maxWait = timeout.count() <= 0 ? microseconds{0} : saturatingCast<microseconds>(timeout);
  const Decision r = take(key, permits, maxWait);
  if (!monitor.admit(r.allowed, permits, r.retryAfter, r.byPolicy)) return false;
  if (r.delay.count() > 0) sleepFor(r.delay);
  return true;
}

microseconds ScriptCore::acquire(const std::string& key, std::int64_t permits) {
  const LimiterMonitor& monitor = gate_.monitor();
  if (monitor.shadow()) {  // shadow mode never waits: one attempt, a denial let through
    (void)decide(key, permits);
    return microseconds{0};
  }
  microseconds waited{0};
  for (;;) {
    const Decision r = take(key, permits, kMaxWait);
    if (r.allowed) {
      (void)monitor.admit(true, permits);
      if (r.delay.count() > 0) sleepFor(r.delay);
      return microseconds{saturatingAdd(waited.count(), r.delay.count())};
    }
    // Denied by the failure policy (no wait known): ask again after a probe interval. Denied by
    // the script: the wait was longer than a reservation may be; sleep until it fits.
    const microseconds pause = r.byPolicy ? saturatingCast<microseconds>(gate_.options().probeInterval) : r.retryAfter;
    sleepFor(pause);
    waited = microseconds{saturatingAdd(waited.count(), pause.count())};
  }
}

namespace {
void checkMaxWait(microseconds maxWait) {
  if (maxWait.count() < 0) {
    throw InvalidArgument(fmt::format("redlimit: maxWait must be >= 0, got {} us", maxWait.count()));
  }
}
}  // namespace

Decision ScriptCore::reserve(const std::string& key, std::int64_t permits, microseconds maxWait) {
  checkMaxWait(maxWait);
  Decision r = take(key, permits, maxWait);
  gate_.monitor().admit(r);  // shadow mode: a refused reservation comes back allowed, without delay
  return r;
}

void ScriptCore::reserveAsync(const std::string& key, std::int64_t permits, microseconds maxWait, Done<Decision> done) {
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { checkMaxWait(maxWait); })) return;
  takeAsync(key, permits, maxWait,
            [monitor = gate_.monitor(), done = std::move(done)](Decision r, std::exception_ptr error) {
              if (!error) monitor.admit(r);
              done(r, std::move(error));
            });
}

std::string ScriptCore::recordKey(const std::string& key, const std::string& id) const {
  return namespacedRecordKey(key, id);
}

ScriptRequest ScriptCore::peekRequest(const std::string& key, std::int64_t permits) {
  const KeyedPolicy* config = policy_.get();
  checkPermits(permits, config);
  // peek ignores the wait: the same positions keep the configuration at ARGV[6] for both.
  return request(key, args("peek", fmt::to_string(permits), "0", config));
}

Decision ScriptCore::peek(const std::string& key, std::int64_t permits) {
  return runScript(
      *this, LimiterCall::plain(callBound_), "peek", peekRequest(key, permits), mapError(key),
      [&](const Reply& r) { return parse(this, key, kind_[0], r, permits); }, [](bool) { return Decision{}; });
}

void ScriptCore::peekAsync(const std::string& key, std::int64_t permits, Done<Decision> done) {
  ScriptRequest call;
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { call = peekRequest(key, permits); })) return;
  runScriptAsync<Decision>(
      shared_from_this(), LimiterCall::plain(callBound_), std::move(call), mapError(key),
      [key, kind = kind_[0], permits](ScriptCore* self, const Reply& r) { return parse(self, key, kind, r, permits); },
      [](ScriptCore&, bool) { return Decision{}; }, std::move(done));
}

std::optional<ScriptRequest> ScriptCore::refundRequest(const std::string& key, std::int64_t permits) {
  if (permits < 0 || permits > kMaxPermits) {
    throw InvalidArgument(fmt::format("redlimit: permits to refund must be in 0..{}, got {}", kMaxPermits, permits));
  }
  if (permits == 0) return std::nullopt;
  const KeyedPolicy* config = policy_.get();
  return request(key, args("refund", fmt::to_string(permits), "0", config));
}

void ScriptCore::refund(const std::string& key, std::int64_t permits) {
  giveBack(key, permits);
  gate_.monitor().refunded(permits);
}

void ScriptCore::refundAsync(const std::string& key, std::int64_t permits, Done<bool> done) {
  giveBackAsync(key, permits, [monitor = gate_.monitor(), permits, done = std::move(done)](bool, std::exception_ptr e) {
    const bool given = !e;
    if (given) monitor.refunded(permits);
    done(given, std::move(e));
  });
}

// Never resent: a refund that went through and was sent again would give the permits back twice.
void ScriptCore::giveBack(const std::string& key, std::int64_t permits) {
  const std::optional<ScriptRequest> call = refundRequest(key, permits);
  if (!call) return;
  (void)runScript(
      *this, LimiterCall::plain(callBound_, LimiterCall::Resend::Never), "refund", *call, mapError(key),
      [](const Reply& r) { return r; }, [](bool) { return Reply{}; });
}

void ScriptCore::giveBackAsync(const std::string& key, std::int64_t permits,
                               std::function<void(bool, std::exception_ptr)> done) {
  std::optional<ScriptRequest> call;
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { call = refundRequest(key, permits); })) return;
  if (!call) {
    done(true, nullptr);
    return;
  }
  runScriptAsync<bool>(
      shared_from_this(), LimiterCall::plain(callBound_, LimiterCall::Resend::Never), std::move(*call), mapError(key),
      [](ScriptCore*, const Reply&) { return true; }, [](ScriptCore&, bool) { return false; }, std::move(done));
}

Settlement ScriptCore::settle(const std::string& key, const std::string& id, std::int64_t actual) {
  const std::string record = recordKey(key, id);
  checkActualPermits(actual);
  const KeyedPolicy* config = policy_.get();
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  return runScript(
      *this, LimiterCall::plain(callBound_), "settle",
      request(key, args("settle", fmt::to_string(actual), "0", config), record), mapError(key),
      [&](const Reply& r) { return parseSettlement(key, r, gate_.monitor()); }, [](bool) { return Settlement{}; });
}

void ScriptCore::settleAsync(const std::string& key, const std::string& id, std::int64_t actual,
                             Done<Settlement> done) {
  std::string record;
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] {
        record = recordKey(key, id);
        checkActualPermits(actual);
      })) {
    return;
  }
  const KeyedPolicy* config = policy_.get();
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  runScriptAsync<Settlement>(
      shared_from_this(), LimiterCall::plain(callBound_),
      request(key, args("settle", fmt::to_string(actual), "0", config), std::move(record)), mapError(key),
      [key, monitor = gate_.monitor()](ScriptCore*, const Reply& r) { return parseSettlement(key, r, monitor); },
      [](ScriptCore&, bool) { return Settlement{}; }, std::move(done));
}

Reply ScriptCore::call(const std::string& key, std::string_view op, const std::vector<std::string>& args,
                       LimiterCall::Resend resend, const std::string* record) {
  std::vector<std::string> argv{std::string(op), "", kind_};
  argv.insert(argv.end(), args.begin(), args.end());
  return runScript(
      *this, LimiterCall::plain(callBound_, resend), op,
      request(key, std::move(argv), record != nullptr ? *record : ""), mapError(key),
      [](const Reply& reply) { return reply; }, [](bool) { return Reply{}; });
}

bool ScriptCore::writeConfig(const std::string& key, ConfigWrite how, const std::vector<std::string>& config) {
  std::vector<std::string> args{how == ConfigWrite::IfAbsent ? "try" : "keep"};
  args.insert(args.end(), config.begin(), config.end());
  const Reply r =
      call(key, "set", args, how == ConfigWrite::IfAbsent ? LimiterCall::Resend::Never : LimiterCall::Resend::IfClosed);
  if (r.type != Reply::Type::Array || r.elements.size() != 4) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: limiter {}: expected an array of 4 from the set operation, got {}", key, r.describe()));
  }
  const bool written = how == ConfigWrite::KeepState || r.elements[0].asInteger() == 1;
  if (written) remember(r.elements[1].asInteger(), r.elements[2].asInteger(), r.elements[3].asInteger());
  return written;
}

bool ScriptCore::deleteKey(const std::string& key) { return redlimit::detail::deleteKey(*this, key); }

void ScriptCore::deleteKeyAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) {
  redlimit::detail::deleteKeyAsync(shared_from_this(), key, isolated(std::move(done), gate_.monitor(), name_));
}

bool ScriptCore::exists(const std::string& key) { return keyExists(*this, key); }

void ScriptCore::existsAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) {
  keyExistsAsync(shared_from_this(), key, isolated(std::move(done), gate_.monitor(), name_));
}

bool ScriptCore::decideUnanswered(std::int64_t permits, const std::string& reason) {
  checkPermitRange(permits);
  const milliseconds interval{localIntervalMs_.load(std::memory_order_relaxed)};
  if (auto d = gate_.decide(permits, localRate_.load(std::memory_order_relaxed), interval)) return *d;
  throw TimeoutError(fmt::format("redlimit: limiter {}: {}", name_, reason));
}

AcquireResult ScriptCore::takeUpTo(const std::string& key, std::int64_t atLeast, std::int64_t atMost) {
  const KeyedPolicy* config = policy_.get();
  checkPermits(atLeast, config);
  if (atMost < atLeast) {
    throw InvalidArgument(fmt::format("redlimit: atMost ({}) < atLeast ({})", atMost, atLeast));
  }
  // Until a reply told the limit, ask for atLeast only: more could exceed it (InvalidArgument).
  const std::int64_t limit = config ? config->limit : knownLimit_.load(std::memory_order_relaxed);
  const std::int64_t ask = limit > 0 ? std::max(atLeast, std::min(atMost, limit)) : atLeast;
  Decision d = take(key, ask, microseconds{0});
  if (!d.allowed && !d.byPolicy && ask > atLeast) {
    d = take(key, d.remaining >= atLeast ? std::min(d.remaining, ask) : atLeast, microseconds{0});
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
