// redlimit — MultiLimit: several Limiters decided in one call of lua/multi.lua.
#include "redlimit/multi_limit.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/limiter_name.hpp"
#include "limiters/calendar_tables.hpp"
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
  // What every key set of one MultiLimit shares: its limits as made (set by the constructor, then
  // only read), its failure gate (and metrics), and what the replies told of its limits.
  struct State {
    State(std::shared_ptr<Client> c, std::vector<std::string> names, std::string labelText,
          const MultiLimit::Options& options)
        : client(std::move(c)),
          limiterNames(std::move(names)),
          label(std::move(labelText)),
          callBound(detail::LimiterCall::boundOf(*client)),
          gate(label, options.failure, ClockView{},
               LimiterMonitor(metricsName(options, limiterNames), options.monitor, client->options().onEvent)),
          knownLimits(std::make_unique<std::atomic<std::int64_t>[]>(limiterNames.size())) {
      for (std::size_t i = 0; i < limiterNames.size(); ++i) knownLimits[i].store(0, std::memory_order_relaxed);
    }
    // Whether a limit is a concurrency limit.
    bool leases() const noexcept { return !leaseConfigs.empty(); }
    // MultiLimit::Options::name, or the limiters' names joined by '+'.
    static std::string metricsName(const MultiLimit::Options& options, const std::vector<std::string>& names) {
      return options.name.empty() ? fmt::format("{}", fmt::join(names, "+")) : options.name;
    }

    std::shared_ptr<Client> client;
    std::vector<std::string> limiterNames;  // the limiters' names
    std::string label;                      // "MultiLimit(a + b)", for messages and events
    milliseconds callBound{0};              // connect + command timeout, saturated
    std::string kinds;                      // one kind byte per limit
    std::vector<std::string> configs;  // per limit: its configuration sent in the call, or ""; empty if none has one
    std::vector<Policy> leaseConfigs;  // the concurrency limits' policies, in order
    std::shared_ptr<detail::CalendarTables> tables;  // the calendar limits' tables; null: none
    std::int64_t maxPermits = detail::kMaxPermits;   // the most one call may take, as far as the configurations say
    detail::FailureGate gate;
    std::unique_ptr<std::atomic<std::int64_t>[]> knownLimits;  // per limit, last seen; 0 = unknown
    std::atomic<std::int64_t> localRate{0};  // the Local policy's bucket: the tightest limit's, last seen
    std::atomic<std::int64_t> localIntervalMs{0};
  };

  template <class Out>
  using Done = std::function<void(Out, std::exception_ptr)>;
  // One operation of multi.lua, made by its checks before anything is sent (ScriptOp).
  template <class Out>
  using Op = detail::ScriptOp<Core, Out>;

  // The limits of `state` on `names`: the keys of a call, or (`unbound`) the limiters' names of a
  // MultiLimit as made, whose keys come with on(); it sends no call.
  Core(std::shared_ptr<State> state, std::vector<std::string> names, bool unbound)
      : state_(std::move(state)),
        client_(state_->client),
        gate_(state_->gate),
        names_(std::move(names)),
        unbound_(unbound) {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (state_->kinds[i] == kLeaseKind) leaseNames_.push_back(names_[i]);
    }
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The limits' keys, for a call: InvalidArgument for an unbound MultiLimit of Limiters.
  const std::vector<std::string>& keys() const {
    if (unbound_) {
      throw InvalidArgument(fmt::format(
          "redlimit: {}: a MultiLimit of Limiters decides keys: name them with on({{key, ...}}), one per limiter",
          state_->label));
    }
    return names_;
  }

  // `op` waiting, and the operation `make()` makes without waiting (runOp, runOpAsync).
  template <class Out>
  Out run(const Op<Out>& op) {
    return detail::runOp(*this, op, &mapError);
  }
  template <class Out, class Make>
  void runAsync(Make&& make, Done<Out> done) {
    detail::runOpAsync<Out>(shared_from_this(), state_->label, std::forward<Make>(make), &mapError, std::move(done));
  }

  // takeOp, run waiting: the take of tryAcquire and acquire.
  detail::TakeWithin taking(std::int64_t permits) {
    return [this, permits](microseconds maxWait) -> Decision { return run(takeOp(permits, maxWait)); };
  }
  // take of `permits` waiting at most `maxWait`, uncounted; decide: without a wait, counted (and
  // an allowed decision without a lease gets one Redis does not hold: unheldLease).
  Op<MultiDecision> takeOp(std::int64_t permits, microseconds maxWait) const;
  Op<MultiDecision> decideOp(std::int64_t permits) const;
  Op<MultiDecision> peekOp(std::int64_t permits) const;
  // Gives back `permits` (1..): never sent again, counted.
  Op<Reply> refundOp(std::int64_t permits) const;
  // Reserve under the record `recordKey`, counted; then settle it.
  Op<MultiDecision> reserveOp(std::int64_t permits, const std::string& recordKey, milliseconds recordTtl) const;
  Op<MultiSettlement> settleOp(std::int64_t actual, const std::string& recordKey) const;
  // renew (no `ttl`: each limit's leaseTtl) and release of a lease in every concurrency limit.
  Op<std::optional<Lease>> renewOp(const Lease& lease, std::optional<milliseconds> ttl) const;
  Op<bool> releaseOp(const Lease& lease) const;
  // renew, waiting: `lease` gets the new expiry when it was still held.
  bool renew(Lease& lease, std::optional<milliseconds> ttl) {
    return detail::renewedTo(lease, run(renewOp(lease, ttl)));
  }

  // A call of multi.lua on `keys`: ARGV `op`, now, `kinds`, then `args`, with the calendar limits'
  // tables (`tables`: their configurations' places in ARGV are limitsRequest's).
  static detail::ScriptRequest request(std::vector<std::string> keys, std::string_view op, std::string_view kinds,
                                       const std::vector<std::string>& args,
                                       std::shared_ptr<const detail::CalendarTables> tables) {
    std::vector<std::string> argv{std::string(op), "", std::string(kinds)};
    argv.insert(argv.end(), args.begin(), args.end());
    return detail::ScriptRequest{&kMulti, std::move(keys), std::move(argv), nullptr, std::move(tables)};
  }
  // A call of every limit (not a lease call): ARGV[4] `permits`, ARGV[5] `second` (take's maxWait,
  // reserve's record TTL; 0 for the others), the configurations at ARGV[6...] with the calendar
  // tables, then `leaseId` (take's, when a limit is a concurrency limit); `recordKey` (a
  // reservation record), if any, after the limits' keys.
  detail::ScriptRequest limitsRequest(std::string_view op, std::int64_t permits, std::int64_t second,
                                      const std::string& recordKey = {}, const std::string& leaseId = {}) const {
    std::vector<std::string> all = keys();
    if (!recordKey.empty()) all.push_back(recordKey);
    std::vector<std::string> args{fmt::to_string(permits), fmt::to_string(second)};
    args.insert(args.end(), state_->configs.begin(), state_->configs.end());
    if (!leaseId.empty()) args.push_back(leaseId);
    return request(std::move(all), op, state_->kinds, args, state_->tables);
  }
  static std::exception_ptr mapError(std::exception_ptr e) { return detail::limiterError(std::move(e)); }
  detail::LimiterCall::Params decision(std::int64_t permits) const {
    return detail::LimiterCall::decision(callBound(), permits, state_->localRate.load(std::memory_order_relaxed),
                                         milliseconds{state_->localIntervalMs.load(std::memory_order_relaxed)});
  }
  milliseconds callBound() const noexcept { return state_->callBound; }
  // How a take or peek reply of `permits` reads (parse); a granted take's lease gets `leaseId` ("":
  // peek, no lease).
  std::function<MultiDecision(Core*, const Reply&)> reading(std::int64_t permits, std::string leaseId) const {
    return [state = state_, leaseId = std::move(leaseId), permits](Core* self, const Reply& r) {
      return parse(*state, self != nullptr, r, permits, leaseId);
    };
  }
  // The take/peek reply, remembering the limits when `remember`. With a concurrency limit the
  // reply ends with the lease's expiry, and a granted take's lease gets `leaseId`.
  static MultiDecision parse(State& state, bool remember, const Reply& r, std::int64_t permits,
                             const std::string& leaseId);
  MultiDecision byPolicy(std::int64_t permits, bool allowed) const;
  bool hasLeases() const noexcept { return state_->leases(); }
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
  // checkPermits, and the bound the configurations in the call give (before anything is sent).
  void checkPermitsFor(std::int64_t permits) const;
  // A renew or release of `lease` (checked) on the concurrency limits, whose reply `read(label, r)`
  // reads.
  template <class Out, class Read>
  Op<Out> leaseOp(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl, Read read) const;
  // A settle reply, counted when it settled.
  static MultiSettlement parseSettlement(const State& state, const Reply& r);

  std::shared_ptr<State> state_;
  std::shared_ptr<Client>& client_;      // the state's, as the call protocol reads it
  detail::FailureGate& gate_;            // the state's
  std::vector<std::string> names_;       // the keys, or the limiters' names while unbound_
  std::vector<std::string> leaseNames_;  // the concurrency limits' names, in order
  bool unbound_;                         // a MultiLimit of Limiters before on(): no keys
};

MultiDecision MultiLimit::Core::byPolicy(std::int64_t permits, bool allowed) const {
  MultiDecision d;
  std::int64_t least = 0;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    const std::int64_t limit = state_->knownLimits[i].load(std::memory_order_relaxed);
    d.limits.push_back(detail::policyDecision(permits, allowed, limit));
    least = i == 0 ? limit : std::min(least, limit);
  }
  static_cast<Decision&>(d) = detail::policyDecision(permits, allowed, least);
  unheldLease(hasLeases(), d);
  return d;
}

void MultiLimit::Core::refuseWithLeases(std::string_view what) const {
  if (!hasLeases()) return;
  throw InvalidArgument(fmt::format(
      "redlimit: {}: {} cannot be used when a limit is a concurrency limit: a place cannot be taken ahead of time, "
      "and the lease must come back to be released. Use decide() or decideAsync(): MultiDecision::lease",
      state_->label, what));
}

void MultiLimit::Core::refuseWithCalendars(std::string_view what) const {
  if (!state_->tables) return;
  throw InvalidArgument(fmt::format(
      "redlimit: {}: {} cannot be used when a limit is a calendar quota: it takes no permits ahead of time (its next "
      "window opens at the zone's next midnight). Use decide() and its retryAfter",
      state_->label, what));
}

void MultiLimit::Core::unheldLease(bool leases, MultiDecision& d) {
  if (!leases || !d.allowed || d.lease) return;
  d.lease = detail::unheldLease(d.byPolicy, d.shadowDenied);
}

MultiDecision MultiLimit::Core::parse(State& state, bool remember, const Reply& r, std::int64_t permits,
                                      const std::string& leaseId) {
  const std::size_t count = state.limiterNames.size();
  const bool leases = state.leases();
  const std::size_t expected = kHead + kPerLimit * count + (leases ? 1 : 0);
  (void)detail::arrayReply("", state.label, r, expected, "the script");
  const auto at = [&](std::size_t i) { return r.elements[i].asInteger(); };
  MultiDecision d;
  static_cast<Decision&>(d) =
      detail::decisionOf(detail::DecisionReply{at(0) == 1, at(1), at(2), at(3), at(4), at(5), at(6), 0, 0}, permits);
  const std::int64_t deniedBy = at(7);
  if (deniedBy < 0 || static_cast<std::size_t>(deniedBy) > count) {
    throw ReplyError(ErrorKind::UnexpectedReply, "",
                     fmt::format("redlimit: {}: the script named limit {} of {}", state.label, deniedBy, count));
  }
  d.deniedBy = deniedBy == 0 ? Decision::kNone : static_cast<std::size_t>(deniedBy - 1);
  d.limits.resize(count);
  // The Local policy's bucket: the limit that gives the fewest permits per time (rate / interval;
  // doubles are exact enough to compare an emergency estimate).
  std::int64_t tightRate = 0;
  std::int64_t tightMs = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t base = kHead + kPerLimit * i;
    // A limit's view: no delay of its own, the combined decision's time.
    d.limits[i] = detail::decisionOf(detail::DecisionReply{at(base) == 1, at(base + 1), at(base + 2), at(base + 3),
                                                           at(base + 4), d.time.count(), 0, 0, 0},
                                     permits);
    const std::int64_t rate = at(base + 5);
    const std::int64_t ms = at(base + 6);
    if (rate > 0 && ms > 0 &&
        (tightRate == 0 || static_cast<double>(rate) * static_cast<double>(tightMs) <
                               static_cast<double>(tightRate) * static_cast<double>(ms))) {
      tightRate = rate;
      tightMs = ms;
    }
    if (remember) state.knownLimits[i].store(d.limits[i].limit, std::memory_order_relaxed);
  }
  if (remember) {
    if (state.tables) state.tables->sawServerNow(d.time);
    state.localRate.store(tightRate, std::memory_order_relaxed);
    state.localIntervalMs.store(tightMs, std::memory_order_relaxed);
  }
  if (leases && d.allowed && !leaseId.empty()) {
    Lease lease;
    lease.id = leaseId;
    lease.expiresAt = microseconds{at(expected - 1)};
    d.lease = std::move(lease);
  }
  return d;
}

void MultiLimit::Core::checkPermitsFor(std::int64_t permits) const {
  detail::checkPermitsUpTo(permits, state_->maxPermits, "", state_->label,
                           "the least burst or limit of its limiters' policies");
}

MultiLimit::Core::Op<MultiDecision> MultiLimit::Core::takeOp(std::int64_t permits, microseconds maxWait) const {
  checkPermitsFor(permits);
  // A resent take may count twice, never grant twice (docs/failure-modes.md); its lease id is the
  // same in every try, so a resend holds one place.
  const std::string leaseId = hasLeases() ? detail::newLeaseId() : std::string();
  const microseconds wait = std::clamp(maxWait, microseconds{0}, detail::kMaxWait);
  return {decision(permits), "decide", limitsRequest("take", permits, wait.count(), {}, leaseId),
          reading(permits, leaseId), [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); }};
}

MultiLimit::Core::Op<MultiDecision> MultiLimit::Core::decideOp(std::int64_t permits) const {
  Op<MultiDecision> op = takeOp(permits, microseconds{0});
  op.then = [state = state_](MultiDecision& d) {
    state->gate.monitor().admit(d);
    unheldLease(state->leases(), d);
  };
  return op;
}

MultiLimit::Core::Op<MultiDecision> MultiLimit::Core::peekOp(std::int64_t permits) const {
  checkPermitsFor(permits);
  return {detail::LimiterCall::plain(callBound()), "peek", limitsRequest("peek", permits, 0), reading(permits, "")};
}

MultiLimit::Core::Op<Reply> MultiLimit::Core::refundOp(std::int64_t permits) const {
  // Never resent: a refund that went through and was sent again would give the permits back twice.
  Op<Reply> op{detail::LimiterCall::plain(callBound(), detail::LimiterCall::Resend::Never), "refund",
               limitsRequest("refund", permits, 0), [](Core*, const Reply& r) { return r; }};
  op.then = [monitor = gate_.monitor(), permits](Reply&) { monitor.refunded(permits); };
  return op;
}

// Sent again if the connection closed under it: the record makes a resend take nothing twice.
MultiLimit::Core::Op<MultiDecision> MultiLimit::Core::reserveOp(std::int64_t permits, const std::string& recordKey,
                                                                milliseconds recordTtl) const {
  detail::checkReservationTtl(recordTtl);
  checkPermitsFor(permits);
  // The reply: take's head, then repeated.
  const std::size_t expected = kHead + kPerLimit * names_.size() + 1;
  return {decision(permits),
          "reserveFor",
          limitsRequest("reserve", permits, recordTtl.count(), recordKey),
          [read = reading(permits, ""), state = state_, expected](Core* self, const Reply& reply) {
            (void)detail::arrayReply("", state->label, reply, expected, "reserve");
            Reply head = reply;
            head.elements.pop_back();
            MultiDecision held = read(self, head);
            held.repeated = reply.elements.back().asInteger() == 1;
            return held;
          },
          [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); },
          [monitor = gate_.monitor()](MultiDecision& out) { detail::admitHeld(monitor, out); }};
}

// Safe to send again: a settle that went through answers AlreadySettled and changes nothing.
MultiLimit::Core::Op<MultiSettlement> MultiLimit::Core::settleOp(std::int64_t actual,
                                                                 const std::string& recordKey) const {
  detail::checkActualPermits(actual);
  return {detail::LimiterCall::plain(callBound()), "settle", limitsRequest("settle", actual, 0, recordKey),
          [state = state_](Core*, const Reply& r) { return parseSettlement(*state, r); }};
}

MultiSettlement MultiLimit::Core::parseSettlement(const State& state, const Reply& r) {
  const std::string& label = state.label;
  const std::size_t count = state.limiterNames.size();
  const std::size_t expected = 3 + 4 * count;
  (void)detail::arrayReply("", label, r, expected, "settle");
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
  detail::countSettled(state.gate.monitor(), out);
  return out;
}

// Safe to send again: a renew sent twice extends twice from about the same instant, a release
// sent twice answers what the first did not see.
template <class Out, class Read>
MultiLimit::Core::Op<Out> MultiLimit::Core::leaseOp(std::string_view op, const Lease& lease,
                                                    std::optional<milliseconds> ttl, Read read) const {
  if (!hasLeases()) {
    throw InvalidArgument(
        fmt::format("redlimit: {}: {} needs a concurrency limit in the MultiLimit", state_->label, op));
  }
  detail::checkLeaseId(lease.id);
  if (ttl) detail::checkLeaseTtl(*ttl);
  std::vector<std::string> args{lease.id, "0"};
  for (const Policy& c : state_->leaseConfigs) {
    args.push_back(fmt::format("{}:{}", c.limit(), ttl.value_or(c.leaseTtl()).count()));
  }
  (void)keys();
  return {detail::LimiterCall::plain(callBound()), op,
          request(leaseNames_, op, std::string(leaseNames_.size(), kLeaseKind), args, nullptr),
          [label = state_->label, read = std::move(read)](Core*, const Reply& r) { return read(label, r); }};
}

MultiLimit::Core::Op<std::optional<Lease>> MultiLimit::Core::renewOp(const Lease& lease,
                                                                     std::optional<milliseconds> ttl) const {
  return leaseOp<std::optional<Lease>>("renew", lease, ttl, [lease](const std::string& label, const Reply& r) {
    return detail::parseRenew("", label, r, lease);
  });
}

MultiLimit::Core::Op<bool> MultiLimit::Core::releaseOp(const Lease& lease) const {
  return leaseOp<bool>("release", lease, std::nullopt, [](const std::string& label, const Reply& r) {
    return detail::firstOfTwo("", label, r, "release") == 1;
  });
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
  std::string label = fmt::format("MultiLimit({})", fmt::join(names, " + "));
  std::shared_ptr<detail::CalendarTables> tables;
  if (!calendars.empty()) {
    tables = std::make_shared<detail::CalendarTables>(label);
    // A limit's configuration is ARGV[6 + i] of every call of the limits (limitsRequest).
    for (const auto& [index, quota] : calendars) tables->add(5 + index, quota, configs[index]);
  }
  auto state = std::make_shared<Core::State>(client, names, std::move(label), options);
  state->kinds = std::move(kinds);
  state->configs = std::move(configs);
  state->leaseConfigs = std::move(leaseConfigs);
  state->tables = std::move(tables);
  state->maxPermits = maxPermits;
  core_ = std::make_shared<Core>(std::move(state), std::move(names), true);
}

MultiLimit::MultiLimit(std::shared_ptr<Core> core) noexcept : core_(std::move(core)) {}

MultiLimit MultiLimit::on(const std::vector<std::string_view>& keys) const {
  const Core::State& s = *core_->state_;
  if (keys.size() != s.limiterNames.size()) {
    throw InvalidArgument(fmt::format("redlimit: {}: on() needs one key per limiter ({}), got {}", s.label,
                                      s.limiterNames.size(), keys.size()));
  }
  std::vector<std::string> stateKeys;
  stateKeys.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) stateKeys.push_back(detail::namespacedKey(s.limiterNames[i], keys[i]));
  checkOneSlot(*s.client, stateKeys);
  return MultiLimit(std::make_shared<Core>(core_->state_, std::move(stateKeys), false));
}

MultiDecision MultiLimit::decide(std::int64_t permits) { return core_->run(core_->decideOp(permits)); }

bool MultiLimit::tryAcquire(std::int64_t permits) {
  core_->refuseWithLeases("tryAcquire");
  return decide(permits).allowed;
}

bool MultiLimit::tryAcquire(std::int64_t permits, milliseconds timeout) {
  core_->refuseWithLeases("tryAcquire");
  core_->refuseWithCalendars("tryAcquire with a timeout");
  return detail::tryAcquireWithin(core_->gate_, permits, timeout, core_->taking(permits));
}

void MultiLimit::acquire(std::int64_t permits) {
  core_->refuseWithLeases("acquire");
  core_->refuseWithCalendars("acquire");
  (void)detail::acquireWaiting(core_->gate_, permits, core_->taking(permits));
}

Decision MultiLimit::reserve(std::int64_t permits, microseconds maxWait) {
  core_->refuseWithLeases("reserve");
  core_->refuseWithCalendars("reserve");
  detail::checkMaxWait(maxWait);
  // The combined decision: a reservation answers no per-limit views.
  Decision out = static_cast<const Decision&>(core_->run(core_->takeOp(permits, maxWait)));
  monitor().admit(out);  // shadow mode: a refused reservation comes back allowed, without delay
  return out;
}

MultiDecision MultiLimit::peek(std::int64_t permits) { return core_->run(core_->peekOp(permits)); }

void MultiLimit::refund(std::int64_t permits) {
  detail::checkRefundPermits(permits);
  if (permits > 0) (void)core_->run(core_->refundOp(permits));
}

bool MultiLimit::renew(Lease& lease) { return core_->renew(lease, std::nullopt); }

bool MultiLimit::renew(Lease& lease, milliseconds leaseTtl) { return core_->renew(lease, leaseTtl); }

bool MultiLimit::release(const Lease& lease) { return core_->run(core_->releaseOp(lease)); }

void MultiLimit::renewAsync(Lease lease, RenewCallback done) {
  renewAsyncWith(std::move(lease), std::nullopt, std::move(done));
}

void MultiLimit::renewAsync(Lease lease, milliseconds leaseTtl, RenewCallback done) {
  renewAsyncWith(std::move(lease), leaseTtl, std::move(done));
}

void MultiLimit::renewAsyncWith(Lease lease, std::optional<milliseconds> leaseTtl, RenewCallback done) {
  core_->runAsync<std::optional<Lease>>([&] { return core_->renewOp(lease, leaseTtl); }, std::move(done));
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
  core_->runAsync<bool>([&] { return core_->releaseOp(lease); }, std::move(done));
}

std::future<bool> MultiLimit::releaseAsync(const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(lease, ReleaseCallback(std::move(done))); });
}

milliseconds MultiLimit::leaseTtl() const noexcept {
  milliseconds shortest{0};
  for (const Policy& c : core_->state_->leaseConfigs) {
    if (shortest.count() == 0 || c.leaseTtl() < shortest) shortest = c.leaseTtl();
  }
  return shortest;
}

void MultiLimit::decideAsync(std::int64_t permits, DecisionCallback done) {
  core_->runAsync<MultiDecision>([&] { return core_->decideOp(permits); }, std::move(done));
}

std::future<MultiDecision> MultiLimit::decideAsync(std::int64_t permits) {
  return detail::futureOf<MultiDecision>([&](auto done) { decideAsync(permits, std::move(done)); });
}

void MultiLimit::tryAcquireAsync(std::int64_t permits, std::function<void(bool, std::exception_ptr)> done) {
  if (!detail::isolateThenCheck(done, monitor(), core_->state_->label,
                                [&] { core_->refuseWithLeases("tryAcquireAsync"); })) {
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

MultiDecision MultiLimit::reserveFor(std::int64_t permits, const std::string& id, milliseconds recordTtl) {
  return core_->run(core_->reserveOp(permits, reservationKey(id), recordTtl));
}

void MultiLimit::reserveForAsync(std::int64_t permits, const std::string& id, milliseconds recordTtl,
                                 DecisionCallback done) {
  core_->runAsync<MultiDecision>([&] { return core_->reserveOp(permits, reservationKey(id), recordTtl); },
                                 std::move(done));
}

std::future<MultiDecision> MultiLimit::reserveForAsync(std::int64_t permits, const std::string& id,
                                                       milliseconds recordTtl) {
  return detail::futureOf<MultiDecision>(
      [&](auto done) { reserveForAsync(permits, id, recordTtl, DecisionCallback(std::move(done))); });
}

MultiSettlement MultiLimit::settle(const std::string& id, std::int64_t actual) {
  return core_->run(core_->settleOp(actual, reservationKey(id)));
}

void MultiLimit::settleAsync(const std::string& id, std::int64_t actual, SettleCallback done) {
  core_->runAsync<MultiSettlement>([&] { return core_->settleOp(actual, reservationKey(id)); }, std::move(done));
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
