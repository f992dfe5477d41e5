#include "redlimit/detail/script_limiter.hpp"

#include <algorithm>
#include <atomic>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "limiters/limiter_call.hpp"
#include "limiters/script_call.hpp"
#include "limiters/one_key_batcher.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/errors.hpp"
#include "topology/key_slot.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

using Steady = std::chrono::steady_clock;
using SteadyTime = Steady::time_point;

// A settle reply: {status, reserved, actual, returned, charged, unpaid, remaining}.
constexpr std::size_t kSettleReplySize = 7;

bool reservationIdByte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == ':';
}

void checkReservationId(const std::string& id) {
  if (id.empty() || id.size() > ScriptLimiter::kMaxReservationIdLength) {
    throw InvalidArgument(fmt::format("redlimit: a reservation id must be 1..{} bytes, got {}",
                                      ScriptLimiter::kMaxReservationIdLength, id.size()));
  }
  for (const char c : id) {
    if (!reservationIdByte(c)) {
      throw InvalidArgument(
          fmt::format("redlimit: reservation id \"{}\" holds byte 0x{:02x}; allowed are "
                      "A-Z a-z 0-9 and - _ . :",
                      id, static_cast<unsigned>(static_cast<unsigned char>(c))));
    }
  }
}

void checkPermits(std::int64_t permits) {
  if (permits < 1 || permits > ScriptLimiter::kMaxPermits) {
    throw InvalidArgument(
        fmt::format("redlimit: permits must be in 1..{}, got {}", ScriptLimiter::kMaxPermits, permits));
  }
}

const char* labelOf(char kind) {
  switch (kind) {
    case 'T':
      return "TokenBucketRateLimiter";
    case 'G':
      return "GcraRateLimiter";
    case 'W':
      return "FixedWindowRateLimiter";
    case 'S':
      return "DistributedSmoothRateLimiter";
    case 'C':
      return "ConcurrencyLimiter";
    default:
      return "limiter";
  }
}

// limiterError(), and a WRONGTYPE raised by a Redis command inside the limiter's script (its
// fast path reads the one key with redis.call, not pcall: cheaper) -> InvalidConfigError naming
// that key, as the script's own check words it. The script touches no other key, and a read is
// its first command on it, so nothing was written.
std::exception_ptr scriptError(std::exception_ptr error, const std::string& name, char kind) {
  // Looked at in place (errorIn), not rethrown: a mass failure runs this once per request.
  const auto* e = dynamic_cast<const ScriptError*>(errorIn(error));
  if (e != nullptr && e->code() == "WRONGTYPE") {
    return std::make_exception_ptr(InvalidConfigError(
        "REDLIMIT_INVALID_CONFIG", fmt::format("key {} holds another Redis type, not a {} (another program wrote it); "
                                               "delete it or use another limiter name",
                                               name, labelOf(kind))));
  }
  return limiterError(std::move(error));
}

}  // namespace

std::exception_ptr oneKeyScriptError(std::exception_ptr error, const std::string& key, char kind) {
  return scriptError(std::move(error), key, kind);
}

std::string reservationRecordKey(const std::string& name, const std::string& id, std::string_view infix) {
  checkReservationId(id);
  // A name with a hash tag hashes the tag, and a key that starts with the name has the same one.
  if (hashedPart(name).size() != name.size()) return fmt::format("{}:{}:{}", name, infix, id);
  // Otherwise the name is hashed whole: the record makes the whole name its tag, which is only that
  // name if no '}' ends the tag early.
  if (name.find('}') != std::string::npos) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: its name holds a '}}' but no hash tag, so no reservation record can "
                    "share its hash slot; give the name a hash tag (\"{{tenant}}:tokens\")",
                    name));
  }
  return fmt::format("{{{}}}:{}:{}", name, infix, id);
}

void checkReservationTtl(milliseconds recordTtl) {
  if (recordTtl.count() < 1 || recordTtl > ScriptLimiter::kMaxReservationTtl) {
    throw InvalidArgument(fmt::format("redlimit: a reservation record's TTL must be in 1..{} ms, got {} ms",
                                      ScriptLimiter::kMaxReservationTtl.count(), recordTtl.count()));
  }
}

void checkActualPermits(std::int64_t actual) {
  if (actual < 0 || actual > ScriptLimiter::kMaxPermits) {
    throw InvalidArgument(
        fmt::format("redlimit: actual permits must be in 0..{}, got {}", ScriptLimiter::kMaxPermits, actual));
  }
}

bool parseReserveRepeated(const std::string& name, const Reply& r) {
  if (r.type != Reply::Type::Array || r.elements.size() != kReserveReplySize) {
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: expected an array of {} from reserve, got {}", name,
                                           kReserveReplySize, r.describe()));
  }
  return r.elements[kReserveReplySize - 1].asInteger() == 1;
}

Settlement parseSettlement(const std::string& name, const Reply& r, const LimiterMonitor& monitor) {
  if (r.type != Reply::Type::Array || r.elements.size() != kSettleReplySize) {
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: expected an array of {} from settle, got {}", name,
                                           kSettleReplySize, r.describe()));
  }
  Settlement out;
  out.status = settleStatusOf(r.elements[0].asInteger(), fmt::format("limiter {}", name));
  if (out.status == SettleStatus::Unknown) return out;
  out.reserved = r.elements[1].asInteger();
  out.actual = r.elements[2].asInteger();
  out.returned = r.elements[3].asInteger();
  out.charged = r.elements[4].asInteger();
  out.unpaid = r.elements[5].asInteger();
  out.remaining = r.elements[6].asInteger();
  if (out.status == SettleStatus::Settled) {
    monitor.reservationSettled();
    if (out.returned > 0) monitor.refunded(out.returned);
  }
  return out;
}

// The monitor of a handle whose client and name pass the checks (made only then: a refused name
// must not take a place in the metrics registry).
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const MonitorOptions& monitor) {
  if (!client) throw InvalidArgument("redlimit: a limiter needs a Client");
  checkLimiterName(name, ScriptLimiter::kMaxNameLength);
  return LimiterMonitor(name, monitor, client->options().onEvent);
}

class ScriptLimiter::Core : public std::enable_shared_from_this<ScriptLimiter::Core> {
 public:
  using ReservationCallback = std::function<void(Reservation, std::exception_ptr)>;

  Core(std::shared_ptr<Client> client, std::string name, FailureOptions failure, const MonitorOptions& monitor,
       const Script& script, char kind)
      : client_(std::move(client)),
        name_(std::move(name)),
        script_(script),
        kind_(1, kind),
        gate_(name_, std::move(failure), ClockView{}, checkedMonitor(client_, name_, monitor)) {
    const ClientOptions& o = client_->options();
    callBound_ = saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
    if (kind == 'T' || kind == 'G' || kind == 'W') batcher_ = OneKeyBatcher::of(client_);
  }

  // A call of the script: `argv` (op, now, kind and the operation's arguments) on the key, and
  // on `recordKey` (KEYS[2], a reservation record) unless it is empty; a take through the
  // Client's coalescing when `coalesce`. Every call goes through the call protocol.
  ScriptRequest request(std::vector<std::string> argv, std::string recordKey = {}, bool coalesce = false) {
    ScriptRequest r{&script_, {name_}, std::move(argv), coalesce ? batcher_.get() : nullptr};
    if (!recordKey.empty()) r.keys.push_back(std::move(recordKey));
    return r;
  }
  LimiterCall::Params decision(std::int64_t permits) const {
    return LimiterCall::decision(callBound_, permits, localRate_.load(std::memory_order_relaxed),
                                 milliseconds{localIntervalMs_.load(std::memory_order_relaxed)});
  }
  OneKeyErrors mapError() const { return OneKeyErrors{name_, kind_[0]}; }
  template <class Parse, class ByPolicy>
  auto run(const LimiterCall::Params& p, std::string_view what, const ScriptRequest& r, Parse&& parse,
           ByPolicy&& byPolicy) {
    return runScript(*this, p, what, r, mapError(), parse, byPolicy);
  }
  template <class Out, class Parse, class ByPolicy>
  void runAsync(const LimiterCall::Params& p, ScriptRequest r, Parse parse, ByPolicy byPolicy,
                std::function<void(Out, std::exception_ptr)> done) {
    runScriptAsync<Out>(shared_from_this(), p, std::move(r), mapError(), std::move(parse), std::move(byPolicy),
                        std::move(done));
  }

  // One guarded take: the script unless the gate says not to; an outage is decided by the policy.
  Reservation take(std::int64_t permits, microseconds maxWait);
  void takeAsync(std::int64_t permits, microseconds maxWait, ReservationCallback done);
  // An unguarded call of the script (`op` and its arguments after now and kind), sent again after
  // a closed connection unless `resend` says Never. With `recordKey`, it is the script's KEYS[2].
  Reply call(std::string_view op, const std::vector<std::string>& args, LimiterCall::Resend resend,
             const std::string* recordKey = nullptr);
  // The take/peek reply of a script of `kind`; `self` (may be null: the handle is gone) remembers
  // the configuration.
  static Reservation parse(Core* self, const std::string& name, char kind, const Reply& r, std::int64_t permits);
  // A decoded reply (a take/peek's or reserve's first nine values).
  static Reservation fromReply(Core* self, const DecisionReply& v, std::int64_t permits);
  // A reserve's reply.
  static HeldPermits held(Core* self, const std::string& name, const Reply& r, std::int64_t permits);
  // reserveFor: a guarded reserve (the failure policy decides an outage), not coalesced.
  HeldPermits hold(std::int64_t permits, const std::string& recordKey, milliseconds recordTtl);
  // hold() without waiting; `done` runs once, on the I/O thread (or here, when the arguments are
  // refused or the failure policy decides without Redis).
  void holdAsync(std::int64_t permits, std::string recordKey, milliseconds recordTtl,
                 std::function<void(HeldPermits, std::exception_ptr)> done);
  Reservation byPolicy(std::int64_t permits, bool allowed) const;
  HeldPermits heldByPolicy(std::int64_t permits, bool allowed) const {
    HeldPermits out;
    out.decision = byPolicy(permits, allowed).decision;
    return out;
  }
  ScriptRequest reserveRequest(std::int64_t permits, std::string recordKey, milliseconds recordTtl,
                               const KeyedPolicy* config);
  void remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept;
  std::vector<std::string> takeArgs(std::int64_t permits, microseconds maxWait,
                                    const std::shared_ptr<const KeyedPolicy>& policy) const;
  // The handle's configuration, or null when it has none (one lock, only for handles with one).
  std::shared_ptr<const KeyedPolicy> policy() const {
    if (!hasPolicy_.load(std::memory_order_acquire)) return nullptr;
    LockGuard lock(policyMutex_);
    return policy_;
  }
  void setPolicy(KeyedPolicy policy) {
    auto shared = std::make_shared<const KeyedPolicy>(std::move(policy));
    remember(shared->limit, shared->localRate, shared->localIntervalMs);
    LockGuard lock(policyMutex_);
    policy_ = std::move(shared);
    hasPolicy_.store(true, std::memory_order_release);
  }
  // checkPermits, and for a handle with a configuration its own bound (before anything is sent).
  void checkPermitsFor(std::int64_t permits, const KeyedPolicy* policy) const {
    checkPermits(permits);
    if (policy != nullptr && permits > policy->maxPermits) {
      throw InvalidArgument(
          fmt::format("redlimit: limiter {}: permits must be in 1..{} (the most one call may take), got {}", name_,
                      policy->maxPermits, permits));
    }
  }

  std::shared_ptr<Client> client_;
  std::string name_;
  Script script_;
  std::string kind_;
  FailureGate gate_;
  milliseconds callBound_{0};                // connect + command timeout, saturated
  std::atomic<std::int64_t> knownLimit_{0};  // the limit last seen from Redis; 0 = unknown
  std::atomic<std::int64_t> localRate_{0};   // the Local policy's bucket, last seen
  std::atomic<std::int64_t> localIntervalMs_{0};
  std::atomic<bool> hasPolicy_{false};
  mutable Mutex policyMutex_;
  std::shared_ptr<const KeyedPolicy> policy_ REDLIMIT_GUARDED_BY(policyMutex_);
  // The Client's coalescing of takes (token bucket, GCRA, fixed window; null: one call each).
  std::shared_ptr<OneKeyBatcher> batcher_;
};

void ScriptLimiter::Core::remember(std::int64_t limit, std::int64_t localRate, std::int64_t localIntervalMs) noexcept {
  knownLimit_.store(limit, std::memory_order_relaxed);
  localRate_.store(localRate, std::memory_order_relaxed);
  localIntervalMs_.store(localIntervalMs, std::memory_order_relaxed);
}

Reservation ScriptLimiter::Core::byPolicy(std::int64_t permits, bool allowed) const {
  Reservation r;
  r.decision.allowed = allowed;
  r.decision.permits = permits;
  r.decision.limit = knownLimit_.load(std::memory_order_relaxed);
  r.decision.byPolicy = true;
  return r;
}

Reservation ScriptLimiter::Core::parse(Core* self, const std::string& name, char kind, const Reply& r,
                                       std::int64_t permits) {
  return fromReply(self, parseDecisionReply(r, decisionFormOf(kind), name), permits);
}

Reservation ScriptLimiter::Core::fromReply(Core* self, const DecisionReply& v, std::int64_t permits) {
  Reservation out;
  out.decision = decisionOf(v, permits);
  out.delay = microseconds{v.delayUs};
  if (self != nullptr) self->remember(v.limit, v.localRate, v.localIntervalMs);
  return out;
}

std::vector<std::string> ScriptLimiter::Core::takeArgs(std::int64_t permits, microseconds maxWait,
                                                       const std::shared_ptr<const KeyedPolicy>& policy) const {
  const microseconds wait = std::clamp(maxWait, microseconds{0}, kMaxWait);
  std::vector<std::string> args{"take", "", kind_, fmt::to_string(permits), fmt::to_string(wait.count())};
  if (policy) args.push_back(policy->packed);
  return args;
}

Reservation ScriptLimiter::Core::take(std::int64_t permits, microseconds maxWait) {
  const std::shared_ptr<const KeyedPolicy> config = policy();
  checkPermitsFor(permits, config.get());
  // A resent take may count twice, never grant twice (docs/failure-modes.md).
  return run(
      decision(permits), "decide", request(takeArgs(permits, maxWait, config), {}, true),
      [&](const Reply& r) { return parse(this, name_, kind_[0], r, permits); },
      [&](bool allowed) { return byPolicy(permits, allowed); });
}

void ScriptLimiter::Core::takeAsync(std::int64_t permits, microseconds maxWait, ReservationCallback done) {
  const std::shared_ptr<const KeyedPolicy> config = policy();
  try {
    checkPermitsFor(permits, config.get());
  } catch (...) {
    done(Reservation{}, std::current_exception());
    return;
  }
  runAsync<Reservation>(
      decision(permits), request(takeArgs(permits, maxWait, config), {}, true),
      [name = name_, kind = kind_[0], permits](Core* self, const Reply& r) {
        return parse(self, name, kind, r, permits);
      },
      [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); }, std::move(done));
}

Reply ScriptLimiter::Core::call(std::string_view op, const std::vector<std::string>& args, LimiterCall::Resend resend,
                                const std::string* recordKey) {
  std::vector<std::string> argv{std::string(op), "", kind_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(
      LimiterCall::plain(callBound_, resend), op, request(std::move(argv), recordKey != nullptr ? *recordKey : ""),
      [](const Reply& reply) { return reply; }, [](bool) { return Reply{}; });
}

HeldPermits ScriptLimiter::Core::held(Core* self, const std::string& name, const Reply& r, std::int64_t permits) {
  HeldPermits out;
  out.repeated = parseReserveRepeated(name, r);
  out.decision = fromReply(self, parseDecisionReply(r, DecisionForm::Array, name, kReserveReplySize), permits).decision;
  return out;
}

ScriptRequest ScriptLimiter::Core::reserveRequest(std::int64_t permits, std::string recordKey, milliseconds recordTtl,
                                                  const KeyedPolicy* config) {
  // Sent again if the connection closed under it: the record makes a resend take nothing twice.
  std::vector<std::string> argv{"reserve", "", kind_, fmt::to_string(permits), fmt::to_string(recordTtl.count())};
  if (config != nullptr) argv.push_back(config->packed);
  return request(std::move(argv), std::move(recordKey));
}

void ScriptLimiter::Core::holdAsync(std::int64_t permits, std::string recordKey, milliseconds recordTtl,
                                    std::function<void(HeldPermits, std::exception_ptr)> done) {
  const std::shared_ptr<const KeyedPolicy> config = policy();
  try {
    checkPermitsFor(permits, config.get());
  } catch (...) {
    done(HeldPermits{}, std::current_exception());
    return;
  }
  runAsync<HeldPermits>(
      decision(permits), reserveRequest(permits, std::move(recordKey), recordTtl, config.get()),
      [name = name_, permits](Core* self, const Reply& r) { return held(self, name, r, permits); },
      [permits](Core& self, bool allowed) { return self.heldByPolicy(permits, allowed); }, std::move(done));
}

HeldPermits ScriptLimiter::Core::hold(std::int64_t permits, const std::string& recordKey, milliseconds recordTtl) {
  const std::shared_ptr<const KeyedPolicy> config = policy();
  checkPermitsFor(permits, config.get());
  return run(
      decision(permits), "reserveFor", reserveRequest(permits, recordKey, recordTtl, config.get()),
      [&](const Reply& r) { return held(this, name_, r, permits); },
      [&](bool allowed) { return heldByPolicy(permits, allowed); });
}

// --- The handle -------------------------------------------------------------------------------

ScriptLimiter::ScriptLimiter(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
                             const MonitorOptions& monitor, const Script& script, char kind)
    : core_(std::make_shared<Core>(std::move(client), std::move(name), std::move(failure), monitor, script, kind)) {}

void ScriptLimiter::sleepFor(microseconds d) const { core_->gate_.clock().sleepFor(d); }

Decision ScriptLimiter::decide(std::int64_t permits) {
  Decision d = core_->take(permits, microseconds{0}).decision;
  monitor().admit(d);
  return d;
}

bool ScriptLimiter::tryAcquire(std::int64_t permits) { return decide(permits).allowed; }

bool ScriptLimiter::tryAcquire(std::int64_t permits, milliseconds timeout) {
  if (monitor().shadow()) return decide(permits).allowed;  // shadow mode never waits
  const microseconds maxWait = timeout.count() <= 0 ? microseconds{0} : saturatingCast<microseconds>(timeout);
  const Reservation r = core_->take(permits, maxWait);
  if (!monitor().admit(r.decision.allowed, permits, r.decision.retryAfter, r.decision.byPolicy)) return false;
  if (r.delay.count() > 0) sleepFor(r.delay);
  return true;
}

void ScriptLimiter::acquire(std::int64_t permits) {
  if (monitor().shadow()) {  // shadow mode never waits: one attempt, a denial let through
    (void)decide(permits);
    return;
  }
  for (;;) {
    const Reservation r = core_->take(permits, kMaxWait);
    if (r.decision.allowed) {
      (void)monitor().admit(true, permits);
      if (r.delay.count() > 0) sleepFor(r.delay);
      return;
    }
    // Denied by the failure policy (no wait known): ask again after a probe interval. Denied by
    // the script: the wait was longer than a reservation may be; sleep until it fits.
    sleepFor(r.decision.byPolicy ? saturatingCast<microseconds>(core_->gate_.options().probeInterval)
                                 : r.decision.retryAfter);
  }
}

Reservation ScriptLimiter::reserve(std::int64_t permits, microseconds maxWait) {
  if (maxWait.count() < 0) {
    throw InvalidArgument(fmt::format("redlimit: maxWait must be >= 0, got {} us", maxWait.count()));
  }
  Reservation r = core_->take(permits, maxWait);
  monitor().admit(r.decision);  // shadow mode: a refused reservation comes back allowed, without delay
  return r;
}

Decision ScriptLimiter::peek(std::int64_t permits) {
  const std::shared_ptr<const KeyedPolicy> config = core_->policy();
  core_->checkPermitsFor(permits, config.get());
  std::vector<std::string> args{fmt::to_string(permits)};
  if (config) args.insert(args.end(), {"0", config->packed});  // the configuration at ARGV[6], as take's
  return Core::parse(core_.get(), core_->name_, core_->kind_[0],
                     core_->call("peek", args, LimiterCall::Resend::IfClosed), permits)
      .decision;
}

void ScriptLimiter::refund(std::int64_t permits) {
  giveBack(permits);
  core_->gate_.monitor().refunded(permits);  // a caller's refund: counted (a segment's give-back is not)
}

void ScriptLimiter::giveBack(std::int64_t permits) {
  if (permits < 0 || permits > kMaxPermits) {
    throw InvalidArgument(fmt::format("redlimit: permits to refund must be in 0..{}, got {}", kMaxPermits, permits));
  }
  if (permits == 0) return;
  std::vector<std::string> args{fmt::to_string(permits)};
  if (const std::shared_ptr<const KeyedPolicy> config = core_->policy()) args.insert(args.end(), {"0", config->packed});
  // Never resent: a refund that went through and was sent again would give the permits back twice.
  (void)core_->call("refund", args, LimiterCall::Resend::Never);
}

std::string ScriptLimiter::reservationKey(const std::string& id) const {
  return reservationRecordKey(core_->name_, id);
}

HeldPermits ScriptLimiter::reserveFor(std::int64_t permits, const std::string& id, milliseconds recordTtl) {
  const std::string recordKey = reservationKey(id);
  checkReservationTtl(recordTtl);
  HeldPermits out = core_->hold(permits, recordKey, recordTtl);
  if (out.repeated) return out;  // counted when it was granted
  monitor().admit(out.decision);
  if (out.decision.allowed && !out.decision.byPolicy && !out.decision.shadowDenied) {
    monitor().reservationOpened();
  }
  return out;
}

Settlement ScriptLimiter::settle(const std::string& id, std::int64_t actual) {
  const std::string recordKey = reservationKey(id);
  checkActualPermits(actual);
  std::vector<std::string> args{fmt::to_string(actual), "0"};
  if (const std::shared_ptr<const KeyedPolicy> config = core_->policy()) args.push_back(config->packed);
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  return parseSettlement(core_->name_, core_->call("settle", args, LimiterCall::Resend::IfClosed, &recordKey),
                         monitor());
}

void ScriptLimiter::reserveForAsync(std::int64_t permits, const std::string& id, milliseconds recordTtl,
                                    HeldCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = isolated(std::move(done), monitor(), core_->name_);
  std::string recordKey;
  try {
    recordKey = reservationKey(id);
    checkReservationTtl(recordTtl);
  } catch (...) {
    done(HeldPermits{}, std::current_exception());
    return;
  }
  core_->holdAsync(permits, std::move(recordKey), recordTtl,
                   [monitor = monitor(), done = std::move(done)](HeldPermits out, std::exception_ptr error) {
                     if (!error && !out.repeated) {  // a repeat was counted when it was granted
                       monitor.admit(out.decision);
                       if (out.decision.allowed && !out.decision.byPolicy && !out.decision.shadowDenied) {
                         monitor.reservationOpened();
                       }
                     }
                     done(out, std::move(error));
                   });
}

void ScriptLimiter::reserveForAsync(std::int64_t permits, const std::string& id, HeldCallback done) {
  reserveForAsync(permits, id, kDefaultReservationTtl, std::move(done));
}

std::future<HeldPermits> ScriptLimiter::reserveForAsync(std::int64_t permits, const std::string& id,
                                                        milliseconds recordTtl) {
  return futureOf<HeldPermits>([&](auto done) { reserveForAsync(permits, id, recordTtl, std::move(done)); });
}

void ScriptLimiter::settleAsync(const std::string& id, std::int64_t actual, SettleCallback done) {
  done = isolated(std::move(done), monitor(), core_->name_);
  std::string recordKey;
  try {
    recordKey = reservationKey(id);
    checkActualPermits(actual);
  } catch (...) {
    done(Settlement{}, std::current_exception());
    return;
  }
  std::vector<std::string> args{fmt::to_string(actual), "0"};
  if (const std::shared_ptr<const KeyedPolicy> config = core_->policy()) args.push_back(config->packed);
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  std::vector<std::string> argv{"settle", "", core_->kind_, fmt::to_string(actual), "0"};
  if (const std::shared_ptr<const KeyedPolicy> config = core_->policy()) argv.push_back(config->packed);
  // Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
  core_->runAsync<Settlement>(
      LimiterCall::plain(core_->callBound_), core_->request(std::move(argv), std::move(recordKey)),
      [name = core_->name_, monitor = monitor()](Core*, const Reply& reply) {
        return parseSettlement(name, reply, monitor);
      },
      [](Core&, bool) { return Settlement{}; }, std::move(done));
}

std::future<Settlement> ScriptLimiter::settleAsync(const std::string& id, std::int64_t actual) {
  return futureOf<Settlement>([&](auto done) { settleAsync(id, actual, std::move(done)); });
}

Settlement ScriptLimiter::cancel(const std::string& id) { return settle(id, 0); }

AcquireResult ScriptLimiter::tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
  checkPermits(atLeast);
  if (atMost < atLeast) {
    throw InvalidArgument(fmt::format("redlimit: atMost ({}) < atLeast ({})", atMost, atLeast));
  }
  // Until a reply told the limit, ask for atLeast only: more could exceed it (InvalidArgument).
  const std::int64_t limit = core_->knownLimit_.load(std::memory_order_relaxed);
  const std::int64_t ask = limit > 0 ? std::max(atLeast, std::min(atMost, limit)) : atLeast;
  Decision d = core_->take(ask, microseconds{0}).decision;
  if (!d.allowed && !d.byPolicy && ask > atLeast) {
    d = core_->take(d.remaining >= atLeast ? std::min(d.remaining, ask) : atLeast, microseconds{0}).decision;
  }
  AcquireResult r;
  r.byPolicy = d.byPolicy;
  r.remaining = d.remaining;
  r.grantTime = d.time;
  if (!d.allowed) {
    r.wait = std::chrono::ceil<milliseconds>(d.retryAfter);
    return r;
  }
  r.granted = d.permits;
  const std::int64_t localRate = core_->localRate_.load(std::memory_order_relaxed);
  const std::int64_t localMs = core_->localIntervalMs_.load(std::memory_order_relaxed);
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

std::int64_t ScriptLimiter::releaseGrant(const std::string& /*member*/, std::int64_t permits) {
  giveBack(permits);
  return permits;
}

bool ScriptLimiter::decideUnanswered(std::int64_t permits, const std::string& reason) {
  checkPermits(permits);
  const milliseconds interval{core_->localIntervalMs_.load(std::memory_order_relaxed)};
  if (auto d = core_->gate_.decide(permits, core_->localRate_.load(std::memory_order_relaxed), interval)) return *d;
  throw TimeoutError(fmt::format("redlimit: limiter {}: {}", core_->name_, reason));
}

bool ScriptLimiter::deleteLimiter() { return command(*core_->client_, {"DEL", core_->name_}).asInteger() > 0; }

bool ScriptLimiter::isExists() { return command(*core_->client_, {"EXISTS", core_->name_}).asInteger() == 1; }

void ScriptLimiter::decideAsync(std::int64_t permits, DecisionCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = isolated(std::move(done), monitor(), core_->name_);
  core_->takeAsync(permits, microseconds{0},
                   [monitor = monitor(), done = std::move(done)](Reservation r, std::exception_ptr error) {
                     if (!error) monitor.admit(r.decision);
                     done(r.decision, std::move(error));
                   });
}

std::future<Decision> ScriptLimiter::decideAsync(std::int64_t permits) {
  return futureOf<Decision>([&](auto done) { decideAsync(permits, std::move(done)); });
}

void ScriptLimiter::tryAcquireAsync(std::int64_t permits, std::function<void(bool, std::exception_ptr)> done) {
  done = isolated(std::move(done), monitor(), core_->name_);
  decideAsync(permits, [done = std::move(done)](Decision d, std::exception_ptr error) {
    const bool allowed = !error && d.allowed;
    done(allowed, std::move(error));
  });
}

std::future<bool> ScriptLimiter::tryAcquireAsync(std::int64_t permits) {
  return futureOf<bool>([&](auto done) { tryAcquireAsync(permits, std::move(done)); });
}

bool ScriptLimiter::writeConfig(bool onlyIfAbsent, const std::vector<std::string>& config) {
  std::vector<std::string> args{onlyIfAbsent ? "try" : "reset"};
  args.insert(args.end(), config.begin(), config.end());
  // 'reset' is safe to send twice; 'try' is not (a resend of a write that went through says false).
  const Reply r = core_->call("set", args, onlyIfAbsent ? LimiterCall::Resend::Never : LimiterCall::Resend::IfClosed);
  if (r.type != Reply::Type::Array || r.elements.size() != 4) {
    throw UnexpectedReplyError(fmt::format(
        "redlimit: limiter {}: expected an array of 4 from the set operation, got {}", core_->name_, r.describe()));
  }
  const bool written = r.elements[0].asInteger() == 1;
  if (written) core_->remember(r.elements[1].asInteger(), r.elements[2].asInteger(), r.elements[3].asInteger());
  return written;
}

void ScriptLimiter::writeConfigKeepingState(const std::vector<std::string>& config) {
  std::vector<std::string> args{"keep"};
  args.insert(args.end(), config.begin(), config.end());
  const Reply r =
      core_->call("set", args, LimiterCall::Resend::IfClosed);  // safe to send twice: the second changes nothing
  if (r.type != Reply::Type::Array || r.elements.size() != 4) {
    throw UnexpectedReplyError(fmt::format(
        "redlimit: limiter {}: expected an array of 4 from the set operation, got {}", core_->name_, r.describe()));
  }
  core_->remember(r.elements[1].asInteger(), r.elements[2].asInteger(), r.elements[3].asInteger());
}

std::vector<std::int64_t> ScriptLimiter::readConfig() {
  Reply r;
  if (const std::shared_ptr<const KeyedPolicy> config = core_->policy()) {
    try {
      r = core_->call("config", {}, LimiterCall::Resend::IfClosed);
    } catch (const NotInitializedError&) {
      return config->fields;  // the key expired (or was never written): this handle's configuration
    }
  } else {
    r = core_->call("config", {}, LimiterCall::Resend::IfClosed);
  }
  if (r.type != Reply::Type::Array || r.elements.size() < 3) {
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: expected an array from the config operation, got {}",
                                           core_->name_, r.describe()));
  }
  // A handle with a configuration decides with its own, whatever the key holds now.
  if (!configured()) core_->remember(r.elements[0].asInteger(), r.elements[1].asInteger(), r.elements[2].asInteger());
  std::vector<std::int64_t> out;
  for (std::size_t i = 3; i < r.elements.size(); ++i) out.push_back(r.elements[i].asInteger());
  return out;
}

void ScriptLimiter::configure(KeyedPolicy policy) { core_->setPolicy(std::move(policy)); }

bool ScriptLimiter::configured() const noexcept { return core_->hasPolicy_.load(std::memory_order_acquire); }

std::vector<std::int64_t> ScriptLimiter::ownConfigFields() const {
  const std::shared_ptr<const KeyedPolicy> config = core_->policy();
  return config ? config->fields : std::vector<std::int64_t>{};
}

std::shared_ptr<const KeyedPolicy> ScriptLimiter::policySnapshot() const { return core_->policy(); }

const std::string& ScriptLimiter::getName() const noexcept { return core_->name_; }
char ScriptLimiter::kind() const noexcept { return core_->kind_[0]; }
const std::shared_ptr<Client>& ScriptLimiter::client() const noexcept { return core_->client_; }
FailureStats ScriptLimiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& ScriptLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit::detail
