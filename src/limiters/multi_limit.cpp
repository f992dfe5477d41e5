// redlimit — MultiLimit: several Limiters decided in one call of lua/multi.lua.
#include "redlimit/multi_limit.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/calendar_core.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "limiters/lease_id.hpp"
#include "limiters/script_call.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/limiter.hpp"
#include "topology/key_slot.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

using detail::Reply;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

using Steady = std::chrono::steady_clock;
using SteadyTime = Steady::time_point;

const detail::Script kMulti{detail::lua::multi.name, detail::lua::multi.sha1, detail::lua::multi.source};

// A take/peek reply: 8 combined elements, then 7 per limit, then the lease's expiry when a limit is
// a concurrency limit (see lua/multi.lua).
constexpr std::size_t kHead = 8;
constexpr std::size_t kPerLimit = 7;
constexpr char kLeaseKind = 'C';

void checkPermits(std::int64_t permits) {
  if (permits < 1 || permits > detail::kMaxPermits) {
    throw InvalidArgument(fmt::format("redlimit: permits must be in 1..{}, got {}", detail::kMaxPermits, permits));
  }
}

// Refuses, before anything is sent, keys that Redis Cluster would not let one script touch. A
// single server (standalone or behind Sentinel) runs one script over any keys: nothing to check.
void checkOneSlot(const Client& client, const std::vector<std::string>& names) {
  if (client.options().topology != ClientOptions::Topology::Cluster) return;
  const std::uint16_t slot = detail::keySlot(names.front());
  for (const std::string& name : names) {
    const std::uint16_t other = detail::keySlot(name);
    if (other == slot) continue;
    throw InvalidArgument(fmt::format(
        "redlimit: MultiLimit: on a Redis Cluster the keys of its limiters must share one hash slot (one script may "
        "only touch keys of one slot), but \"{}\" is in slot {} and \"{}\" in slot {}. Give them one hash tag, the "
        "part between the first '{{' and the next '}}', which is all that Redis Cluster hashes: e.g. "
        "\"{{tenant42}}:user:7\", \"{{tenant42}}:tenant\", \"{{tenant42}}:burst\". A limit shared by every tenant "
        "cannot share a slot with each tenant's keys: give every key one tag (\"{{api}}:global\", "
        "\"{{api}}:tenant:42\": one slot, one Cluster node) or decide the shared limit in a call of its own.",
        names.front(), slot, name, other));
  }
}

}  // namespace

class MultiLimit::Core : public std::enable_shared_from_this<MultiLimit::Core> {
 public:
  // What every key set of one MultiLimit shares: its failure gate (and metrics), and what the
  // replies told of its limits.
  struct State {
    State(const std::string& label, const MultiLimit::Options& options, LimiterMonitor monitor, std::size_t count)
        : gate(label, options.failure, ClockView{}, std::move(monitor)),
          knownLimits(std::make_unique<std::atomic<std::int64_t>[]>(count)) {
      for (std::size_t i = 0; i < count; ++i) knownLimits[i].store(0, std::memory_order_relaxed);
    }
    detail::FailureGate gate;
    std::unique_ptr<std::atomic<std::int64_t>[]> knownLimits;  // per limit, last seen; 0 = unknown
    std::atomic<std::int64_t> localRate{0};  // the Local policy's bucket: the tightest limit's, last seen
    std::atomic<std::int64_t> localIntervalMs{0};
  };

  // `names` are the limiters' names: the MultiLimit as made, whose keys come with on(); it sends
  // no call.
  Core(std::shared_ptr<Client> client, std::vector<std::string> names, std::string kinds,
       std::vector<std::string> configs, std::vector<Policy> leaseConfigs,
       std::shared_ptr<detail::CalendarTables> tables, std::int64_t maxPermits, std::string label,
       const MultiLimit::Options& options)
      : client_(std::move(client)),
        names_(std::move(names)),
        kinds_(std::move(kinds)),
        configs_(std::move(configs)),
        leaseConfigs_(std::move(leaseConfigs)),
        tables_(std::move(tables)),
        maxPermits_(maxPermits),
        label_(std::move(label)),
        unbound_(true),
        limiterNames_(names_),
        state_(std::make_shared<State>(
            label_, options, LimiterMonitor(metricsName(options), options.monitor, client_->options().onEvent),
            names_.size())),
        gate_(state_->gate),
        knownLimits_(state_->knownLimits.get()),
        localRate_(state_->localRate),
        localIntervalMs_(state_->localIntervalMs) {
    const ClientOptions& o = client_->options();
    callBound_ = detail::saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (kinds_[i] == kLeaseKind) leaseNames_.push_back(names_[i]);
    }
  }
  // The limits of `proto` (unbound) on the keys `keys`, sharing its state.
  Core(const Core& proto, std::vector<std::string> keys)
      : client_(proto.client_),
        names_(std::move(keys)),
        kinds_(proto.kinds_),
        configs_(proto.configs_),
        leaseConfigs_(proto.leaseConfigs_),
        tables_(proto.tables_),
        maxPermits_(proto.maxPermits_),
        label_(proto.label_),
        unbound_(false),
        limiterNames_(proto.limiterNames_),
        state_(proto.state_),
        gate_(state_->gate),
        callBound_(proto.callBound_),
        knownLimits_(state_->knownLimits.get()),
        localRate_(state_->localRate),
        localIntervalMs_(state_->localIntervalMs) {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (kinds_[i] == kLeaseKind) leaseNames_.push_back(names_[i]);
    }
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The limits' keys, for a call: InvalidArgument for an unbound MultiLimit of Limiters.
  const std::vector<std::string>& keys() const {
    if (unbound_) {
      throw InvalidArgument(fmt::format(
          "redlimit: {}: a MultiLimit of Limiters decides keys: name them with on({{key, ...}}), one per limiter",
          label_));
    }
    return names_;
  }

  MultiDecision take(std::int64_t permits, microseconds maxWait);
  void takeAsync(std::int64_t permits, microseconds maxWait, DecisionCallback done);
  // An unguarded call of the script (`op` and its arguments after now and the kinds), through the
  // call protocol. With `recordKey`, it is the last key, after the limits' (a reservation record).
  Reply call(std::string_view op, const std::vector<std::string>& args, detail::LimiterCall::Resend resend,
             const std::string* recordKey = nullptr);
  // A call of multi.lua on `keys`: ARGV `op`, now, `kinds`, then `args`, with the calendar limits'
  // tables (`tables`: their configurations' places in ARGV are those of take, reserve and opArgs).
  static detail::ScriptRequest request(std::vector<std::string> keys, std::string_view op, std::string_view kinds,
                                       const std::vector<std::string>& args,
                                       std::shared_ptr<const detail::CalendarTables> tables) {
    std::vector<std::string> argv{std::string(op), "", std::string(kinds)};
    argv.insert(argv.end(), args.begin(), args.end());
    return detail::ScriptRequest{&kMulti, std::move(keys), std::move(argv), nullptr, std::move(tables)};
  }
  // A call of every limit (not a lease call): with the calendar tables.
  detail::ScriptRequest limitsRequest(std::vector<std::string> keys, std::string_view op,
                                      const std::vector<std::string>& args) const {
    return request(std::move(keys), op, kinds_, args, tables_);
  }
  static std::exception_ptr mapError(std::exception_ptr e) { return detail::limiterError(std::move(e)); }
  detail::LimiterCall::Params decision(std::int64_t permits) const {
    return detail::LimiterCall::decision(callBound_, permits, localRate_.load(std::memory_order_relaxed),
                                         milliseconds{localIntervalMs_.load(std::memory_order_relaxed)});
  }
  // renew or release of a lease in every concurrency limit; no `ttl`: each limit's leaseTtl.
  Reply leaseCall(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl, std::size_t replySize);
  using ReplyDone = std::function<void(Reply, std::exception_ptr)>;
  // leaseCall without waiting: `done` gets the reply (of replySize elements) or the error, once, on
  // the I/O thread (at once here when the arguments are refused).
  void leaseCallAsync(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl, std::size_t replySize,
                      ReplyDone done);
  // The checks of a lease call (InvalidArgument) and its arguments after the kinds.
  std::vector<std::string> leaseArgs(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl) const;
  // A lease call on the concurrency limits.
  detail::ScriptRequest leaseRequest(std::string_view op, const std::vector<std::string>& args) const {
    (void)keys();
    return request(leaseNames_, op, std::string(leaseNames_.size(), kLeaseKind), args, nullptr);
  }
  // The take/peek reply; `self` (may be null: the handle is gone) remembers the limits. With
  // `leases` the reply ends with the lease's expiry; a granted take's lease gets `leaseId` (empty
  // for peek: no lease).
  static MultiDecision parse(Core* self, const std::string& label, std::size_t count, const Reply& r,
                             std::int64_t permits, bool leases, const std::string& leaseId);
  MultiDecision byPolicy(std::int64_t permits, bool allowed) const;
  std::vector<std::string> takeArgs(std::int64_t permits, microseconds maxWait, const std::string& leaseId) const;
  bool hasLeases() const noexcept { return !leaseNames_.empty(); }
  // A new lease id when a limit is a concurrency limit, else "".
  std::string newLeaseIdIfAny() const { return hasLeases() ? detail::newLeaseId() : std::string(); }
  // Throws InvalidArgument for `what`, a call that waits or answers without the lease, when a
  // limit is a concurrency limit.
  void refuseWithLeases(std::string_view what) const;
  // Throws InvalidArgument for `what`, a call that takes permits ahead of time, when a limit is a
  // calendar quota (as Limiter's: its next window opens at the zone's next midnight).
  void refuseWithCalendars(std::string_view what) const;
  // With `leases`, an allowed decision without a lease (the failure policy's grant, or a denial
  // shadow mode let through) gets one Redis does not hold, marked as the decision is, as
  // Limiter::acquireLease's.
  static void unheldLease(bool leases, MultiDecision& d);
  // The arguments of peek and refund: the permits, and the configurations if any.
  std::vector<std::string> opArgs(std::int64_t permits) const;
  // checkPermits, and the bound the configurations in the call give (before anything is sent).
  void checkPermitsFor(std::int64_t permits) const;
  // Reserve, then settle: the calls (checked before anything is sent) and their answers.
  detail::ScriptRequest holdRequest(std::int64_t permits, const std::string& recordKey, milliseconds recordTtl) const;
  // A reserve's reply: take's head, then repeated; `self` (may be null) remembers the limits.
  static MultiDecision parseHeld(Core* self, const std::string& label, std::size_t count, const Reply& reply,
                                 std::int64_t permits);
  detail::ScriptRequest settleRequest(std::int64_t actual, const std::string& recordKey) const;
  static MultiSettlement parseSettlement(const std::string& label, std::size_t count, const Reply& r,
                                         const LimiterMonitor& monitor);
  // MultiLimit::Options::name, or the limits' names joined by '+'.
  std::string metricsName(const MultiLimit::Options& options) const {
    if (!options.name.empty()) return options.name;
    std::string joined;
    for (const std::string& n : names_) joined += (joined.empty() ? "" : "+") + n;
    return joined;
  }

  std::shared_ptr<Client> client_;
  std::vector<std::string> names_;
  std::string kinds_;                    // one kind byte per limit
  std::vector<std::string> configs_;     // per limit: its configuration sent in the call, or ""; empty if none has one
  std::vector<Policy> leaseConfigs_;     // the concurrency limits' policies, in order
  std::vector<std::string> leaseNames_;  // the concurrency limits' names, in order
  std::shared_ptr<detail::CalendarTables> tables_;  // the calendar limits' tables; null: none
  std::int64_t maxPermits_;                         // the most one call may take, as far as the configurations say
  std::string label_;                               // "MultiLimit(a + b)", for messages and events
  bool unbound_;                                    // a MultiLimit of Limiters before on(): no keys
  std::vector<std::string> limiterNames_;           // the limiters' names
  std::shared_ptr<State> state_;
  detail::FailureGate& gate_;
  milliseconds callBound_{0};  // connect + command timeout, saturated
  std::atomic<std::int64_t>* knownLimits_;
  std::atomic<std::int64_t>& localRate_;
  std::atomic<std::int64_t>& localIntervalMs_;
};

MultiDecision MultiLimit::Core::byPolicy(std::int64_t permits, bool allowed) const {
  MultiDecision d;
  d.allowed = allowed;
  d.permits = permits;
  d.byPolicy = true;
  d.limits.resize(names_.size());
  for (std::size_t i = 0; i < names_.size(); ++i) {
    Decision& one = d.limits[i];
    one.allowed = allowed;
    one.permits = permits;
    one.byPolicy = true;
    one.limit = knownLimits_[i].load(std::memory_order_relaxed);
    d.limit = i == 0 ? one.limit : std::min(d.limit, one.limit);
  }
  unheldLease(hasLeases(), d);
  return d;
}

void MultiLimit::Core::refuseWithLeases(std::string_view what) const {
  if (!hasLeases()) return;
  throw InvalidArgument(fmt::format(
      "redlimit: {}: {} cannot be used when a limit is a concurrency limit: a place cannot be taken ahead of time, "
      "and the lease must come back to be released. Use decide() or decideAsync(): MultiDecision::lease",
      label_, what));
}

void MultiLimit::Core::refuseWithCalendars(std::string_view what) const {
  if (!tables_) return;
  throw InvalidArgument(fmt::format(
      "redlimit: {}: {} cannot be used when a limit is a calendar quota: it takes no permits ahead of time (its next "
      "window opens at the zone's next midnight). Use decide() and its retryAfter",
      label_, what));
}

void MultiLimit::Core::unheldLease(bool leases, MultiDecision& d) {
  if (!leases || !d.allowed || d.lease) return;
  Lease lease;
  lease.id = detail::newLeaseId();
  lease.byPolicy = d.byPolicy;
  lease.shadowDenied = d.shadowDenied;
  d.lease = std::move(lease);
}

MultiDecision MultiLimit::Core::parse(Core* self, const std::string& label, std::size_t count, const Reply& r,
                                      std::int64_t permits, bool leases, const std::string& leaseId) {
  const std::size_t expected = kHead + kPerLimit * count + (leases ? 1 : 0);
  if (r.type != Reply::Type::Array || r.elements.size() != expected) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: {}: expected an array of {} from the script, got {}", label, expected, r.describe()));
  }
  const auto at = [&](std::size_t i) { return r.elements[i].asInteger(); };
  MultiDecision d;
  d.allowed = at(0) == 1;
  d.permits = permits;
  d.remaining = std::max<std::int64_t>(0, at(1));
  d.retryAfter = microseconds{at(2)};
  d.resetAfter = microseconds{at(3)};
  d.limit = at(4);
  d.time = microseconds{at(5)};
  d.delay = microseconds{at(6)};
  const std::int64_t deniedBy = at(7);
  if (deniedBy < 0 || static_cast<std::size_t>(deniedBy) > count) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: {}: the script named limit {} of {}", label, deniedBy, count));
  }
  d.deniedBy = deniedBy == 0 ? Decision::kNone : static_cast<std::size_t>(deniedBy - 1);
  d.limits.resize(count);
  // The Local policy's bucket: the limit that gives the fewest permits per time (rate / interval;
  // doubles are exact enough to compare an emergency estimate).
  std::int64_t tightRate = 0;
  std::int64_t tightMs = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t base = kHead + kPerLimit * i;
    Decision& one = d.limits[i];
    one.allowed = at(base) == 1;
    one.permits = permits;
    one.remaining = std::max<std::int64_t>(0, at(base + 1));
    one.retryAfter = microseconds{at(base + 2)};
    one.resetAfter = microseconds{at(base + 3)};
    one.limit = at(base + 4);
    one.time = d.time;
    const std::int64_t rate = at(base + 5);
    const std::int64_t ms = at(base + 6);
    if (rate > 0 && ms > 0 &&
        (tightRate == 0 || static_cast<double>(rate) * static_cast<double>(tightMs) <
                               static_cast<double>(tightRate) * static_cast<double>(ms))) {
      tightRate = rate;
      tightMs = ms;
    }
    if (self != nullptr) self->knownLimits_[i].store(one.limit, std::memory_order_relaxed);
  }
  if (self != nullptr) {
    if (self->tables_) self->tables_->sawServerNow(d.time);
    self->localRate_.store(tightRate, std::memory_order_relaxed);
    self->localIntervalMs_.store(tightMs, std::memory_order_relaxed);
  }
  if (leases && d.allowed && !leaseId.empty()) {
    Lease lease;
    lease.id = leaseId;
    lease.expiresAt = microseconds{at(expected - 1)};
    d.lease = std::move(lease);
  }
  return d;
}

std::vector<std::string> MultiLimit::Core::takeArgs(std::int64_t permits, microseconds maxWait,
                                                    const std::string& leaseId) const {
  const microseconds wait = std::clamp(maxWait, microseconds{0}, detail::kMaxWait);
  std::vector<std::string> args{fmt::to_string(permits), fmt::to_string(wait.count())};
  args.insert(args.end(), configs_.begin(), configs_.end());
  if (hasLeases()) args.push_back(leaseId);
  return args;
}

void MultiLimit::Core::checkPermitsFor(std::int64_t permits) const {
  checkPermits(permits);
  if (permits > maxPermits_) {
    throw InvalidArgument(
        fmt::format("redlimit: {}: permits must be in 1..{} (the least burst or limit of its limiters' "
                    "policies), got {}",
                    label_, maxPermits_, permits));
  }
}

std::vector<std::string> MultiLimit::Core::opArgs(std::int64_t permits) const {
  std::vector<std::string> args{fmt::to_string(permits)};
  if (!configs_.empty()) {
    args.emplace_back("0");  // the configurations at ARGV[6...], as take's
    args.insert(args.end(), configs_.begin(), configs_.end());
  }
  return args;
}

MultiDecision MultiLimit::Core::take(std::int64_t permits, microseconds maxWait) {
  checkPermitsFor(permits);
  // A resent take may count twice, never grant twice (docs/failure-modes.md); its lease id is the
  // same in every try, so a resend holds one place.
  const std::string leaseId = newLeaseIdIfAny();
  return detail::runScript(
      *this, decision(permits), "decide", limitsRequest(keys(), "take", takeArgs(permits, maxWait, leaseId)), &mapError,
      [&](const Reply& r) { return parse(this, label_, names_.size(), r, permits, hasLeases(), leaseId); },
      [&](bool allowed) { return byPolicy(permits, allowed); });
}

void MultiLimit::Core::takeAsync(std::int64_t permits, microseconds maxWait, DecisionCallback done) {
  try {
    checkPermitsFor(permits);
    (void)keys();
  } catch (...) {
    done(MultiDecision{}, std::current_exception());
    return;
  }
  std::string leaseId = newLeaseIdIfAny();
  detail::ScriptRequest call = limitsRequest(names_, "take", takeArgs(permits, maxWait, leaseId));
  detail::runScriptAsync<MultiDecision>(
      shared_from_this(), decision(permits), std::move(call), &mapError,
      [label = label_, count = names_.size(), leases = hasLeases(), leaseId = std::move(leaseId), permits](
          Core* self, const Reply& r) { return parse(self, label, count, r, permits, leases, leaseId); },
      [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); }, std::move(done));
}

Reply MultiLimit::Core::call(std::string_view op, const std::vector<std::string>& args,
                             detail::LimiterCall::Resend resend, const std::string* recordKey) {
  std::vector<std::string> all = keys();
  if (recordKey != nullptr) all.push_back(*recordKey);
  return detail::runScript(
      *this, detail::LimiterCall::plain(callBound_, resend), op, limitsRequest(std::move(all), op, args), &mapError,
      [](const Reply& r) { return r; }, [](bool) { return Reply{}; });
}

std::vector<std::string> MultiLimit::Core::leaseArgs(std::string_view op, const Lease& lease,
                                                     std::optional<milliseconds> ttl) const {
  if (!hasLeases()) {
    throw InvalidArgument(fmt::format("redlimit: {}: {} needs a concurrency limit in the MultiLimit", label_, op));
  }
  detail::checkLeaseId(lease.id);
  if (ttl) detail::checkLeaseTtl(*ttl);
  std::vector<std::string> args{lease.id, "0"};
  for (const Policy& c : leaseConfigs_) {
    args.push_back(fmt::format("{}:{}", c.limit(), ttl.value_or(c.leaseTtl()).count()));
  }
  return args;
}

namespace {
void checkLeaseReply(const std::string& label, std::string_view op, const Reply& r, std::size_t replySize) {
  if (r.type != Reply::Type::Array || r.elements.size() != replySize) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: {}: expected an array of {} from {}, got {}", label, replySize, op, r.describe()));
  }
}
}  // namespace

Reply MultiLimit::Core::leaseCall(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl,
                                  std::size_t replySize) {
  // Safe to send again: a renew sent twice extends twice from about the same instant, a release
  // sent twice answers what the first did not see.
  return detail::runScript(
      *this, detail::LimiterCall::plain(callBound_), op, leaseRequest(op, leaseArgs(op, lease, ttl)), &mapError,
      [&](const Reply& r) {
        checkLeaseReply(label_, op, r, replySize);
        return r;
      },
      [](bool) { return Reply{}; });
}

void MultiLimit::Core::leaseCallAsync(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl,
                                      std::size_t replySize, ReplyDone done) {
  std::vector<std::string> args;
  try {
    args = leaseArgs(op, lease, ttl);
    (void)keys();
  } catch (...) {
    done(Reply{}, std::current_exception());
    return;
  }
  detail::runScriptAsync<Reply>(
      shared_from_this(), detail::LimiterCall::plain(callBound_), leaseRequest(op, args), &mapError,
      [label = label_, op = std::string(op), replySize](Core*, const Reply& r) {
        checkLeaseReply(label, op, r, replySize);
        return r;
      },
      [](Core&, bool) { return Reply{}; }, std::move(done));
}

// --- The handle -------------------------------------------------------------------------------

MultiLimit::MultiLimit(const std::vector<Limiter>& limits, const MultiLimit::Options& options) {
  if (limits.empty() || limits.size() > kMaxLimits) {
    throw InvalidArgument(
        fmt::format("redlimit: a MultiLimit decides 1..{} limiters, got {}", kMaxLimits, limits.size()));
  }
  if (!options.name.empty()) detail::checkLimiterName(options.name, detail::kMaxNameLength);
  const std::shared_ptr<Client>& client = limits.front().client();
  std::vector<std::string> names;
  std::string kinds;
  std::vector<std::string> configs;
  std::vector<Policy> leaseConfigs;
  std::vector<std::pair<std::size_t, detail::CalendarQuota>> calendars;  // limit index, quota
  bool anyConfig = false;
  std::int64_t maxPermits = detail::kMaxPermits;
  std::unordered_set<std::string_view> seen;
  for (const Limiter& limiter : limits) {
    const std::string& name = limiter.name();
    if (limiter.client() != client) {
      throw InvalidArgument(
          fmt::format("redlimit: MultiLimit: limiter {} uses another Client than {}; one script "
                      "call runs on one Client",
                      name, limits.front().name()));
    }
    if (!seen.insert(name).second) {
      throw InvalidArgument(fmt::format("redlimit: MultiLimit: limiter {} appears twice", name));
    }
    names.push_back(name);
    const Policy& policy = limiter.policy();
    if (policy.kind() == Policy::Kind::Smooth) {
      throw InvalidArgument(fmt::format(
          "redlimit: MultiLimit: limiter {} has a smooth policy, which lends the next permit ahead and makes the "
          "following caller pay: all-or-nothing across limits cannot give that back; use GCRA or a token bucket",
          name));
    }
    const detail::KeyedPolicy& packed = policy.packedPolicy();
    if (policy.kind() == Policy::Kind::Calendar) {  // its quota and, per call, its table (tables)
      const detail::CalendarQuota quota = policy.calendarQuota("a calendar limit");
      kinds.push_back('Q');
      configs.push_back(detail::calendarConfig(quota, milliseconds{policy.keepAliveMs_}));
      calendars.emplace_back(configs.size() - 1, quota);
      anyConfig = true;
      maxPermits = std::min(maxPermits, quota.limit);
      continue;
    }
    if (policy.givesLeases()) {  // a concurrency limit: its limit and lease TTL
      kinds.push_back(kLeaseKind);
      configs.push_back(packed.packed);
      leaseConfigs.push_back(policy);
      anyConfig = true;
      continue;
    }
    kinds.push_back(packed.packed.front());
    if (policy.isStored()) {  // the key's own configuration
      configs.emplace_back();
      continue;
    }
    configs.push_back(packed.packed);
    anyConfig = true;
    maxPermits = std::min(maxPermits, packed.maxPermits);
  }
  if (!anyConfig) configs.clear();  // nothing in the call: the stored configurations
  std::string label = "MultiLimit(";
  for (std::size_t i = 0; i < names.size(); ++i)
    fmt::format_to(std::back_inserter(label), "{}{}", i ? " + " : "", names[i]);
  label += ")";
  std::shared_ptr<detail::CalendarTables> tables;
  if (!calendars.empty()) {
    tables = std::make_shared<detail::CalendarTables>(label);
    // A limit's configuration is ARGV[6 + i] of every call of the limits (take, reserve, opArgs).
    for (const auto& [index, quota] : calendars) tables->add(5 + index, quota, configs[index]);
  }
  core_ = std::make_shared<Core>(client, std::move(names), std::move(kinds), std::move(configs),
                                 std::move(leaseConfigs), std::move(tables), maxPermits, std::move(label), options);
}

MultiLimit::MultiLimit(std::shared_ptr<Core> core) noexcept : core_(std::move(core)) {}

MultiLimit MultiLimit::on(const std::vector<std::string_view>& keys) const {
  const Core& c = *core_;
  if (keys.size() != c.limiterNames_.size()) {
    throw InvalidArgument(fmt::format("redlimit: {}: on() needs one key per limiter ({}), got {}", c.label_,
                                      c.limiterNames_.size(), keys.size()));
  }
  std::vector<std::string> stateKeys;
  stateKeys.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) stateKeys.push_back(detail::namespacedKey(c.limiterNames_[i], keys[i]));
  checkOneSlot(*c.client_, stateKeys);
  return MultiLimit(std::make_shared<Core>(c, std::move(stateKeys)));
}

MultiDecision MultiLimit::decide(std::int64_t permits) {
  MultiDecision d = core_->take(permits, microseconds{0});
  monitor().admit(d);
  Core::unheldLease(core_->hasLeases(), d);
  return d;
}

bool MultiLimit::tryAcquire(std::int64_t permits) {
  core_->refuseWithLeases("tryAcquire");
  return decide(permits).allowed;
}

bool MultiLimit::tryAcquire(std::int64_t permits, milliseconds timeout) {
  core_->refuseWithLeases("tryAcquire");
  core_->refuseWithCalendars("tryAcquire with a timeout");
  if (monitor().shadow()) return decide(permits).allowed;  // shadow mode never waits
  const microseconds maxWait = timeout.count() <= 0 ? microseconds{0} : detail::saturatingCast<microseconds>(timeout);
  const MultiDecision r = core_->take(permits, maxWait);
  if (!monitor().admit(r.allowed, permits, r.retryAfter, r.byPolicy)) return false;
  if (r.delay.count() > 0) core_->gate_.clock().sleepFor(r.delay);
  return true;
}

void MultiLimit::acquire(std::int64_t permits) {
  core_->refuseWithLeases("acquire");
  core_->refuseWithCalendars("acquire");
  if (monitor().shadow()) {  // shadow mode never waits: one attempt, a denial let through
    (void)decide(permits);
    return;
  }
  for (;;) {
    const MultiDecision r = core_->take(permits, detail::kMaxWait);
    if (r.allowed) {
      (void)monitor().admit(true, permits);
      if (r.delay.count() > 0) core_->gate_.clock().sleepFor(r.delay);
      return;
    }
    // Denied by the failure policy (no wait known): ask again after a probe interval. Denied by
    // the script: the wait was longer than a reservation may be; sleep until it fits.
    core_->gate_.clock().sleepFor(
        r.byPolicy ? detail::saturatingCast<microseconds>(core_->gate_.options().probeInterval) : r.retryAfter);
  }
}

Decision MultiLimit::reserve(std::int64_t permits, microseconds maxWait) {
  core_->refuseWithLeases("reserve");
  core_->refuseWithCalendars("reserve");
  if (maxWait.count() < 0) {
    throw InvalidArgument(fmt::format("redlimit: maxWait must be >= 0, got {} us", maxWait.count()));
  }
  // The combined decision: a reservation answers no per-limit views.
  Decision out = static_cast<const Decision&>(core_->take(permits, maxWait));
  monitor().admit(out);  // shadow mode: a refused reservation comes back allowed, without delay
  return out;
}

MultiDecision MultiLimit::peek(std::int64_t permits) {
  core_->checkPermitsFor(permits);
  const Reply r = core_->call("peek", core_->opArgs(permits), detail::LimiterCall::Resend::IfClosed);
  return Core::parse(core_.get(), core_->label_, core_->names_.size(), r, permits, core_->hasLeases(), "");
}

void MultiLimit::refund(std::int64_t permits) {
  if (permits < 0 || permits > detail::kMaxPermits) {
    throw InvalidArgument(
        fmt::format("redlimit: permits to refund must be in 0..{}, got {}", detail::kMaxPermits, permits));
  }
  if (permits == 0) return;
  // Never resent: a refund that went through and was sent again would give the permits back twice.
  (void)core_->call("refund", core_->opArgs(permits), detail::LimiterCall::Resend::Never);
  monitor().refunded(permits);
}

namespace {
bool renewed(const Reply& r, Lease& lease) {
  if (r.elements[0].asInteger() != 1) return false;
  lease.expiresAt = microseconds{r.elements[1].asInteger()};
  return true;
}
}  // namespace

bool MultiLimit::renew(Lease& lease) { return renewed(core_->leaseCall("renew", lease, std::nullopt, 3), lease); }

bool MultiLimit::renew(Lease& lease, milliseconds leaseTtl) {
  return renewed(core_->leaseCall("renew", lease, leaseTtl, 3), lease);
}

bool MultiLimit::release(const Lease& lease) {
  return core_->leaseCall("release", lease, std::nullopt, 2).elements[0].asInteger() == 1;
}

void MultiLimit::renewAsync(Lease lease, RenewCallback done) {
  renewAsyncWith(std::move(lease), std::nullopt, std::move(done));
}

void MultiLimit::renewAsync(Lease lease, milliseconds leaseTtl, RenewCallback done) {
  renewAsyncWith(std::move(lease), leaseTtl, std::move(done));
}

void MultiLimit::renewAsyncWith(Lease lease, std::optional<milliseconds> leaseTtl, RenewCallback done) {
  done = detail::isolated(std::move(done), monitor(), core_->label_);
  const std::string id = lease.id;
  core_->leaseCallAsync("renew", Lease{id}, leaseTtl, 3,
                        [lease = std::move(lease), done](const Reply& r, std::exception_ptr error) mutable {
                          if (error) {
                            done(std::nullopt, std::move(error));
                          } else if (renewed(r, lease)) {
                            done(std::move(lease), nullptr);
                          } else {
                            done(std::nullopt, nullptr);
                          }
                        });
}

std::future<std::optional<Lease>> MultiLimit::renewAsync(Lease lease) {
  return detail::futureOf<std::optional<Lease>>(
      [&](auto done) { renewAsyncWith(std::move(lease), std::nullopt, RenewCallback(std::move(done))); });
}

std::future<std::optional<Lease>> MultiLimit::renewAsync(Lease lease, milliseconds leaseTtl) {
  return detail::futureOf<std::optional<Lease>>(
      [&](auto done) { renewAsyncWith(std::move(lease), leaseTtl, RenewCallback(std::move(done))); });
}

void MultiLimit::releaseAsync(const Lease& lease, ReleaseCallback done) {
  done = detail::isolated(std::move(done), monitor(), core_->label_);
  core_->leaseCallAsync("release", lease, std::nullopt, 2, [done](const Reply& r, std::exception_ptr error) {
    if (error) {
      done(false, std::move(error));
    } else {
      done(r.elements[0].asInteger() == 1, nullptr);
    }
  });
}

std::future<bool> MultiLimit::releaseAsync(const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(lease, ReleaseCallback(std::move(done))); });
}

milliseconds MultiLimit::leaseTtl() const noexcept {
  milliseconds shortest{0};
  for (const Policy& c : core_->leaseConfigs_) {
    if (shortest.count() == 0 || c.leaseTtl() < shortest) shortest = c.leaseTtl();
  }
  return shortest;
}

void MultiLimit::decideAsync(std::int64_t permits, DecisionCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = detail::isolated(std::move(done), monitor(), core_->label_);
  core_->takeAsync(permits, microseconds{0},
                   [monitor = monitor(), leases = core_->hasLeases(), done = std::move(done)](
                       MultiDecision r, std::exception_ptr error) {
                     if (!error) {
                       monitor.admit(r);
                       Core::unheldLease(leases, r);
                     }
                     done(std::move(r), std::move(error));
                   });
}

std::future<MultiDecision> MultiLimit::decideAsync(std::int64_t permits) {
  return detail::futureOf<MultiDecision>([&](auto done) { decideAsync(permits, std::move(done)); });
}

void MultiLimit::tryAcquireAsync(std::int64_t permits, std::function<void(bool, std::exception_ptr)> done) {
  if (!detail::isolateThenCheck(done, monitor(), core_->label_, [&] { core_->refuseWithLeases("tryAcquireAsync"); })) {
    return;
  }
  decideAsync(permits, [done = std::move(done)](const MultiDecision& d, std::exception_ptr error) {
    const bool allowed = !error && d.allowed;
    done(allowed, std::move(error));
  });
}

std::future<bool> MultiLimit::tryAcquireAsync(std::int64_t permits) {
  return detail::futureOf<bool>([&](auto done) { tryAcquireAsync(permits, std::move(done)); });
}

// --- Reserve, then settle ------------------------------------------------------------------

std::string MultiLimit::reservationKey(const std::string& id) const {
  // The record says what each limit gives back: token bucket, GCRA and fixed window only.
  core_->refuseWithLeases("reserveFor or settle");
  return detail::namespacedRecordKey(core_->keys().front(), id, "mrsv");
}

// The reserve call of `permits` under the record `recordKey` (checked before anything is sent).
detail::ScriptRequest MultiLimit::Core::holdRequest(std::int64_t permits, const std::string& recordKey,
                                                    milliseconds recordTtl) const {
  detail::checkReservationTtl(recordTtl);
  checkPermitsFor(permits);
  std::vector<std::string> args{fmt::to_string(permits), fmt::to_string(recordTtl.count())};
  args.insert(args.end(), configs_.begin(), configs_.end());
  std::vector<std::string> all = keys();
  all.push_back(recordKey);
  return limitsRequest(std::move(all), "reserve", args);
}

// The settle call of the record `recordKey` (checked before anything is sent). Safe to send
// again: a settle that went through answers AlreadySettled and changes nothing.
detail::ScriptRequest MultiLimit::Core::settleRequest(std::int64_t actual, const std::string& recordKey) const {
  detail::checkActualPermits(actual);
  std::vector<std::string> all = keys();
  all.push_back(recordKey);
  return limitsRequest(std::move(all), "settle", opArgs(actual));
}

MultiSettlement MultiLimit::Core::parseSettlement(const std::string& label, std::size_t count, const Reply& r,
                                                  const LimiterMonitor& monitor) {
  const std::size_t expected = 3 + 4 * count;
  if (r.type != Reply::Type::Array || r.elements.size() != expected) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: {}: expected an array of {} from settle, got {}", label, expected, r.describe()));
  }
  MultiSettlement out;
  out.status = detail::settleStatusOf(r.elements[0].asInteger(), label);
  out.reserved = r.elements[1].asInteger();
  out.actual = r.elements[2].asInteger();
  out.limits.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    Settlement& one = out.limits[i];
    const std::size_t base = 3 + 4 * i;
    one.status = out.status;
    one.reserved = out.reserved;
    one.actual = out.actual;
    one.returned = r.elements[base].asInteger();
    one.charged = r.elements[base + 1].asInteger();
    one.unpaid = r.elements[base + 2].asInteger();
    one.remaining = r.elements[base + 3].asInteger();
    out.returned = i == 0 ? one.returned : std::min(out.returned, one.returned);
    out.charged = i == 0 ? one.charged : std::min(out.charged, one.charged);
    out.unpaid = std::max(out.unpaid, one.unpaid);
    out.remaining = i == 0 ? one.remaining : std::min(out.remaining, one.remaining);
  }
  if (out.status == Settlement::Status::Settled) {
    monitor.reservationSettled();
    if (out.returned > 0) monitor.refunded(out.returned);  // what came back to every limit
  }
  return out;
}

MultiDecision MultiLimit::Core::parseHeld(Core* self, const std::string& label, std::size_t count, const Reply& reply,
                                          std::int64_t permits) {
  const std::size_t expected = kHead + kPerLimit * count + 1;
  if (reply.type != Reply::Type::Array || reply.elements.size() != expected) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: {}: expected an array of {} from reserve, got {}", label, expected, reply.describe()));
  }
  Reply head = reply;
  head.elements.pop_back();
  MultiDecision held = parse(self, label, count, head, permits, false, "");
  held.repeated = reply.elements.back().asInteger() == 1;
  return held;
}

MultiDecision MultiLimit::reserveFor(std::int64_t permits, const std::string& id, milliseconds recordTtl) {
  Core& c = *core_;
  // Sent again if the connection closed under it: the record makes a resend take nothing twice.
  MultiDecision out = detail::runScript(
      c, c.decision(permits), "reserveFor", c.holdRequest(permits, reservationKey(id), recordTtl), &Core::mapError,
      [&](const Reply& reply) { return Core::parseHeld(&c, c.label_, c.names_.size(), reply, permits); },
      [&](bool allowed) { return c.byPolicy(permits, allowed); });
  detail::admitHeld(monitor(), out);
  return out;
}

void MultiLimit::reserveForAsync(std::int64_t permits, const std::string& id, milliseconds recordTtl,
                                 DecisionCallback done) {
  detail::ScriptRequest call;
  if (!detail::isolateThenCheck(done, monitor(), core_->label_,
                                [&] { call = core_->holdRequest(permits, reservationKey(id), recordTtl); })) {
    return;
  }
  detail::runScriptAsync<MultiDecision>(
      core_, core_->decision(permits), std::move(call), &Core::mapError,
      [label = core_->label_, count = core_->names_.size(), permits](Core* self, const Reply& reply) {
        return Core::parseHeld(self, label, count, reply, permits);
      },
      [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); },
      [monitor = monitor(), done = std::move(done)](MultiDecision out, std::exception_ptr error) {
        if (!error) detail::admitHeld(monitor, out);
        done(std::move(out), std::move(error));
      });
}

std::future<MultiDecision> MultiLimit::reserveForAsync(std::int64_t permits, const std::string& id,
                                                       milliseconds recordTtl) {
  return detail::futureOf<MultiDecision>(
      [&](auto done) { reserveForAsync(permits, id, recordTtl, DecisionCallback(std::move(done))); });
}

MultiSettlement MultiLimit::settle(const std::string& id, std::int64_t actual) {
  Core& c = *core_;
  return detail::runScript(
      c, detail::LimiterCall::plain(c.callBound_), "settle", c.settleRequest(actual, reservationKey(id)),
      &Core::mapError, [&](const Reply& r) { return Core::parseSettlement(c.label_, c.names_.size(), r, monitor()); },
      [](bool) { return MultiSettlement{}; });
}

void MultiLimit::settleAsync(const std::string& id, std::int64_t actual, SettleCallback done) {
  detail::ScriptRequest call;
  if (!detail::isolateThenCheck(done, monitor(), core_->label_,
                                [&] { call = core_->settleRequest(actual, reservationKey(id)); })) {
    return;
  }
  detail::runScriptAsync<MultiSettlement>(
      core_, detail::LimiterCall::plain(core_->callBound_), std::move(call), &Core::mapError,
      [label = core_->label_, count = core_->names_.size(), monitor = monitor()](Core*, const Reply& r) {
        return Core::parseSettlement(label, count, r, monitor);
      },
      [](Core&, bool) { return MultiSettlement{}; }, std::move(done));
}

std::future<MultiSettlement> MultiLimit::settleAsync(const std::string& id, std::int64_t actual) {
  return detail::futureOf<MultiSettlement>(
      [&](auto done) { settleAsync(id, actual, SettleCallback(std::move(done))); });
}

MultiSettlement MultiLimit::cancel(const std::string& id) { return settle(id, 0); }

const std::vector<std::string>& MultiLimit::names() const noexcept { return core_->names_; }
std::size_t MultiLimit::size() const noexcept { return core_->names_.size(); }
const std::shared_ptr<Client>& MultiLimit::client() const noexcept { return core_->client_; }
FailureStats MultiLimit::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& MultiLimit::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
