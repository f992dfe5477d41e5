// redlimit — MultiLimit: several Limiters decided in one call of lua/multi.lua.
#include "redlimit/multi_limit.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/limiter_name.hpp"
#include "limiters/calendar_tables.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "limiters/lease_id.hpp"
#include "limiters/script_call.hpp"
#include "limiters/slot_sequence.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/limiter.hpp"
#include "topology/key_slot.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

using detail::Reply;
using MaybeLease = std::optional<Lease>;  // a renewal's answer: the lease, or none when it was not live
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

const detail::Script kMulti{detail::lua::multi.name, detail::lua::multi.sha1, detail::lua::multi.source};

// A take/peek reply: 8 combined elements, then 7 per limit, then the lease's expiry when a limit is
// a concurrency limit (see lua/multi.lua).
constexpr std::size_t kHead = 8;
constexpr std::size_t kPerLimit = 7;
constexpr char kLeaseKind = 'C';

// The limits grouped by the hash slot of their keys (`keys`, one per limit): the groups in slot
// order, each group's limits in construction order. Empty on a single server (standalone or behind
// Sentinel: one script runs over any keys) and when every key is in one slot: one script call.
std::vector<std::vector<std::size_t>> slotGroups(const Client& client, const std::vector<std::string>& keys) {
  if (client.options().topology != ClientOptions::Topology::Cluster) return {};
  std::map<std::uint16_t, std::vector<std::size_t>> bySlot;
  for (std::size_t i = 0; i < keys.size(); ++i) bySlot[detail::keySlot(keys[i])].push_back(i);
  std::vector<std::vector<std::size_t>> groups;
  if (bySlot.size() < 2) return groups;
  for (auto& slot : bySlot) groups.push_back(std::move(slot.second));
  return groups;
}

}  // namespace

class MultiLimit::Core : public std::enable_shared_from_this<MultiLimit::Core> {
 public:
  // The limits as the calls send them, made by the MultiLimit's constructor from its limiters.
  struct Limits {
    std::shared_ptr<Client> client;         // the limiters' Client
    std::vector<std::string> limiterNames;  // the limiters' names
    std::string label;                      // "MultiLimit(a + b)", for messages and events
    std::string kinds;                      // one kind byte per limit
    std::vector<std::string> configs;  // per limit: its configuration sent in the call, or ""; empty if none has one
    std::vector<Policy> leaseConfigs;  // the concurrency limits' policies, in order
    std::shared_ptr<detail::CalendarTables> tables;  // the calendar limits' tables; null: none
    std::int64_t maxPermits = detail::kMaxPermits;   // the most one call may take, as far as the configurations say
    std::string nowOnly;  // "limit NAME: why" for the first limit that takes permits now or not at all; "" if none
  };
  // What every key set of one MultiLimit shares: its limits as made (then only read), its failure
  // gate (and metrics), and what the replies told of its limits.
  struct State : Limits {
    State(Limits made, const MultiLimit::Options& options)
        : Limits(std::move(made)),
          callBound(detail::LimiterCall::boundOf(*client)),
          // Its metrics carry MultiLimit::Options::name, or the limiters' names joined by '+'.
          gate(label, options.failure, ClockView{},
               LimiterMonitor(options.name.empty() ? fmt::format("{}", fmt::join(limiterNames, "+")) : options.name,
                              options.monitor, client->options().onEvent)),
          knownLimits(limiterNames.size()) {}
    // Whether a limit is a concurrency limit.
    bool leases() const noexcept { return !leaseConfigs.empty(); }

    milliseconds callBound{0};  // connect + command timeout, saturated
    detail::FailureGate gate;
    std::vector<std::atomic<std::int64_t>> knownLimits;  // per limit, last seen; 0 (as made) = unknown
    std::atomic<std::int64_t> localRate{0};              // the Local policy's bucket: the tightest limit's, last seen
    std::atomic<std::int64_t> localIntervalMs{0};
  };

  // One operation of multi.lua, made by its checks before anything is sent (ScriptOp). Its reply
  // reads what the call asked (its keys and ARGV) from the request, and its `then` the monitor it is
  // given, not copies in their captures.
  using Request = detail::ScriptRequest;
  template <class Out>
  using Op = detail::ScriptOp<Core, Out, std::function<Out(Core*, const Request&, const Reply&)>,
                              std::function<void(const LimiterMonitor&, Out&)>>;
  using Call = detail::LimiterCall;
  // The limits (indexes, ascending) whose keys share one hash slot.
  using Group = std::vector<std::size_t>;
  using Groups = std::vector<Group>;
  // A call of a decision across slots, beyond the limits and the record: the slot group's pending
  // set ("" if none) and the ARGV after every limit's configuration (lua/multi.lua).
  struct SlotExtras {
    std::string pendingKey;
    std::vector<std::string> argv;
  };

  // The limits of `state` on `names`: the keys of a call, or (`unbound`) the limiters' names of a
  // MultiLimit as made, whose keys come with on(); it sends no call. `groups`: on a Cluster, keys in
  // several hash slots, grouped by slot in slot order (slotGroups); null: one script call.
  Core(std::shared_ptr<State> state, std::vector<std::string> names, bool unbound,
       std::shared_ptr<const Groups> groups = nullptr)
      : state_(std::move(state)),
        client_(state_->client),
        gate_(state_->gate),
        names_(std::move(names)),
        unbound_(unbound),
        groups_(std::move(groups)) {}
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The limits' keys, for a call: InvalidArgument for an unbound MultiLimit of Limiters.
  const std::vector<std::string>& keys() const {
    if (!unbound_) return names_;
    throw InvalidArgument(fmt::format(
        "redlimit: {}: a MultiLimit of Limiters decides keys: name them with on({{key, ...}}), one per limiter",
        state_->label));
  }

  // `op` waiting, and the operation `make()` makes without waiting (runOp, runOpAsync).
  template <class Out>
  Out run(const Op<Out>& op) {
    return detail::runOp(*this, op, &detail::limiterError);
  }
  template <class Out, class Make>
  void runAsync(Make&& make, std::function<void(Out, std::exception_ptr)> done) {
    detail::runOpAsync<Out>(shared_from_this(), state_->label, std::forward<Make>(make), &detail::limiterError,
                            std::move(done));
  }

  // takeOp, run waiting: the take of tryAcquire and acquire.
  detail::TakeWithin taking(std::int64_t permits) {
    return [this, permits](microseconds maxWait) -> Decision { return run(takeOp(permits, maxWait)); };
  }
  // take of `permits` waiting at most `maxWait`, uncounted. A resent take may count twice, never
  // grant twice (docs/failure-modes.md); its lease id is the same in every try, so a resend holds
  // one place.
  Op<MultiDecision> takeOp(std::int64_t permits, microseconds maxWait) const {
    const microseconds wait = std::clamp(maxWait, microseconds{0}, detail::kMaxWait);
    return limitsOp(decision(permits), "decide", "take", permits, wait.count(), {},
                    state_->leases() ? detail::newLeaseId() : std::string());
  }
  // takeOp after checkMaxWait, counted (shadow mode: a refused decision comes back allowed, without
  // delay), and an allowed decision without a lease gets one Redis does not hold (unheldLease).
  Op<MultiDecision> countedTakeOp(std::int64_t permits, microseconds maxWait = microseconds{0}) const {
    detail::checkMaxWait(maxWait);
    Op<MultiDecision> op = takeOp(permits, maxWait);
    op.then = [leases = state_->leases()](const LimiterMonitor& monitor, MultiDecision& d) {
      monitor.admit(d);
      unheldLease(leases, d);
    };
    return op;
  }
  Op<MultiDecision> peekOp(std::int64_t permits) const { return limitsOp(plain(), "peek", "peek", permits); }
  // Gives back `permits` (1..), counted. Never resent: a refund that went through and was sent
  // again would give the permits back twice.
  Op<Reply> refundOp(std::int64_t permits) const {
    Op<Reply> op{plain(Call::Resend::Never), "refund", limitsRequest("refund", permits, 0),
                 [](Core*, const Request&, const Reply& r) { return r; }};
    op.then = [permits](const LimiterMonitor& monitor, Reply&) { monitor.refunded(permits); };
    return op;
  }
  // Reserve under the record `recordKey`, counted. Sent again if the connection closed under it:
  // the record makes a resend take nothing twice.
  Op<MultiDecision> reserveOp(std::int64_t permits, const std::string& recordKey, milliseconds recordTtl) const {
    detail::checkReservationTtl(recordTtl);
    Op<MultiDecision> op = limitsOp(decision(permits), "reserveFor", "reserve", permits, recordTtl.count(), recordKey);
    op.then = [](const LimiterMonitor& monitor, MultiDecision& out) { detail::admitHeld(monitor, out); };
    return op;
  }
  // Then settle it. Safe to send again: a settle that went through answers AlreadySettled and
  // changes nothing.
  Op<MultiSettlement> settleOp(std::int64_t actual, const std::string& recordKey) const {
    detail::checkActualPermits(actual);
    return {plain(), "settle", limitsRequest("settle", actual, 0, recordKey),
            [state = state_](Core*, const Request&, const Reply& r) { return parseSettlement(*state, r); }};
  }
  // renew (no `ttl`: each limit's leaseTtl) and release of a lease in every concurrency limit.
  // Safe to send again: a renew sent twice extends twice from about the same instant, a release
  // sent twice answers what the first did not see.
  Op<MaybeLease> renewOp(const Lease& lease, std::optional<milliseconds> ttl) const {
    return {plain(), "renew", leaseRequest("renew", lease, ttl),
            [state = state_, lease](Core*, const Request&, const Reply& r) {
              return detail::parseRenew("", state->label, r, lease);
            }};
  }
  Op<bool> releaseOp(const Lease& lease) const {
    return {plain(), "release", leaseRequest("release", lease, std::nullopt),
            [state = state_](Core*, const Request&, const Reply& r) {
              return detail::firstOfTwo("", state->label, r, "release") == 1;
            }};
  }
  // renew, waiting: `lease` gets the new expiry when it was still held.
  bool renew(Lease& lease, std::optional<milliseconds> ttl) {
    return detail::renewedTo(lease, run(renewOp(lease, ttl)));
  }

  // A take, peek or reserve (`op`, sent with `params` and named `what`) of `permits` by every limit
  // (limitsRequest), checked before anything is sent (checkPermitsUpTo: at most the bound the
  // configurations in the call give); its reply reads as parse reads it, and when Redis cannot be
  // asked a deciding call has the failure policy's decision.
  // With `group` (one of groups_), that slot group's limits only: its Op may run only while this
  // Core lives (decideAcross, Chain hold it), and a pointer keeps the failure policy's capture in
  // std::function's own buffer on the one-call path.
  Op<MultiDecision> limitsOp(Call::Params params, std::string_view what, std::string_view op, std::int64_t permits,
                             std::int64_t second = 0, const std::string& recordKey = {},
                             const std::string& leaseId = {}, const Group* group = nullptr,
                             const SlotExtras* extras = nullptr) const {
    detail::checkPermitsUpTo(permits, state_->maxPermits, "", state_->label,
                             "the least burst or limit of its limiters' policies");
    return {params, what, limitsRequest(op, permits, second, recordKey, leaseId, group, extras),
            [state = state_, group, permits](Core* self, const Request& q, const Reply& r) {
              return parse(*state, self != nullptr, q, r, permits, group);
            },
            [permits, group](Core& self, bool allowed) { return self.byPolicy(permits, allowed, group); }};
  }
  // A call of every limit (not a lease call) of multi.lua on the keys: ARGV `op`, now, the kinds,
  // `permits`, `second` (take's maxWait, reserve's record TTL; 0 for the others), the
  // configurations at ARGV[6...] with the calendar tables (their places in ARGV are these), then
  // `leaseId` (take's, when a limit is a concurrency limit); `recordKey` (a reservation record), if
  // any, after the limits' keys. With `group`, the limits of that slot group only (no calendar
  // limit and no concurrency limit: on() refuses them across slots), and `extras` if any: the
  // pending set after the record key, its ARGV after every limit's configuration ('' for a stored one).
  Request limitsRequest(std::string_view op, std::int64_t permits, std::int64_t second,
                        const std::string& recordKey = {}, const std::string& leaseId = {},
                        const Group* group = nullptr, const SlotExtras* extras = nullptr) const {
    if (group != nullptr) {
      std::vector<std::string> some;
      std::string kinds;
      std::vector<std::string> configs;
      for (const std::size_t i : *group) {
        some.push_back(names_[i]);
        kinds.push_back(state_->kinds[i]);
        if (!state_->configs.empty() || extras != nullptr) {
          configs.push_back(state_->configs.empty() ? std::string() : state_->configs[i]);
        }
      }
      if (!recordKey.empty()) some.push_back(recordKey);
      std::vector<std::string> argv{std::string(op), "", std::move(kinds), fmt::to_string(permits),
                                    fmt::to_string(second)};
      std::move(configs.begin(), configs.end(), std::back_inserter(argv));
      if (extras != nullptr) {
        if (!extras->pendingKey.empty()) some.push_back(extras->pendingKey);
        argv.insert(argv.end(), extras->argv.begin(), extras->argv.end());
      }
      return {&kMulti, std::move(some), std::move(argv), nullptr, nullptr};
    }
    std::vector<std::string> all = keys();
    if (!recordKey.empty()) all.push_back(recordKey);
    std::vector<std::string> argv{std::string(op), "", state_->kinds, fmt::to_string(permits), fmt::to_string(second)};
    argv.insert(argv.end(), state_->configs.begin(), state_->configs.end());
    if (!leaseId.empty()) argv.push_back(leaseId);
    return {&kMulti, std::move(all), std::move(argv), nullptr, state_->tables};
  }
  // A renew or release (`op`) of `lease` (checked) on the concurrency limits: ARGV `op`, now, their
  // kinds, the lease id, 0, then each one's limit and TTL.
  Request leaseRequest(std::string_view op, const Lease& lease, std::optional<milliseconds> ttl) const {
    if (!state_->leases()) {
      throw InvalidArgument(
          fmt::format("redlimit: {}: {} needs a concurrency limit in the MultiLimit", state_->label, op));
    }
    detail::checkLeaseId(lease.id);
    if (ttl) detail::checkLeaseTtl(*ttl);
    std::vector<std::string> leaseKeys;
    for (std::size_t i = 0; i < keys().size(); ++i) {
      if (state_->kinds[i] == kLeaseKind) leaseKeys.push_back(names_[i]);
    }
    std::vector<std::string> argv{std::string(op), "", std::string(leaseKeys.size(), kLeaseKind), lease.id, "0"};
    for (const Policy& c : state_->leaseConfigs) {
      argv.push_back(fmt::format("{}:{}", c.limit(), ttl.value_or(c.leaseTtl()).count()));
    }
    return {&kMulti, std::move(leaseKeys), std::move(argv), nullptr, nullptr};
  }
  Call::Params decision(std::int64_t permits) const {
    return Call::decision(state_->callBound, permits, state_->localRate.load(std::memory_order_relaxed),
                          milliseconds{state_->localIntervalMs.load(std::memory_order_relaxed)});
  }
  Call::Params plain(Call::Resend resend = Call::Resend::IfClosed) const {
    return Call::plain(state_->callBound, resend);
  }
  // The reply of the take, peek or reserve `q` of `permits` (a reserve's ends with `repeated`),
  // remembering the limits when `remember`. With a concurrency limit the reply ends with the lease's
  // expiry, and a granted take's lease gets the id the take sent (its last ARGV). With `group`, the
  // reply of that slot group's limits (a call across slots): the Local policy's bucket only tightens.
  static MultiDecision parse(State& state, bool remember, const Request& q, const Reply& r, std::int64_t permits,
                             const Group* group = nullptr) {
    const std::size_t count = group != nullptr ? group->size() : state.limiterNames.size();
    const auto limit = [&](std::size_t i) { return group != nullptr ? (*group)[i] : i; };
    const bool leases = state.leases();
    const bool reserve = q.argv[0] == "reserve";
    const std::size_t expected = kHead + kPerLimit * count + (leases || reserve ? 1 : 0);
    (void)detail::arrayReply("", state.label, r, expected, reserve ? "reserve" : "the script");
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
    // The Local policy's bucket: the limit that gives the fewest permits per time (rate / interval;
    // doubles are exact enough to compare an emergency estimate).
    std::int64_t tightRate = 0;
    std::int64_t tightMs = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t base = kHead + kPerLimit * i;
      // A limit's view: no delay of its own, the combined decision's time.
      d.limits.push_back(detail::decisionOf(detail::DecisionReply{at(base) == 1, at(base + 1), at(base + 2),
                                                                  at(base + 3), at(base + 4), d.time.count(), 0, 0, 0},
                                            permits));
      const std::int64_t rate = at(base + 5);
      const std::int64_t ms = at(base + 6);
      if (rate > 0 && ms > 0 &&
          (tightRate == 0 || static_cast<double>(rate) * static_cast<double>(tightMs) <
                                 static_cast<double>(tightRate) * static_cast<double>(ms))) {
        tightRate = rate;
        tightMs = ms;
      }
      if (remember) state.knownLimits[limit(i)].store(d.limits.back().limit, std::memory_order_relaxed);
    }
    const std::int64_t seenRate = state.localRate.load(std::memory_order_relaxed);
    const std::int64_t seenMs = state.localIntervalMs.load(std::memory_order_relaxed);
    const bool tighter =
        group == nullptr ||
        (tightRate > 0 && (seenRate == 0 || static_cast<double>(tightRate) * static_cast<double>(seenMs) <
                                                static_cast<double>(seenRate) * static_cast<double>(tightMs)));
    if (remember && tighter) {
      if (state.tables) state.tables->sawServerNow(d.time);
      state.localRate.store(tightRate, std::memory_order_relaxed);
      state.localIntervalMs.store(tightMs, std::memory_order_relaxed);
    }
    if (reserve) {
      d.repeated = at(expected - 1) == 1;
    } else if (leases && d.allowed && q.argv[0] == "take") {
      d.lease = Lease{q.argv.back(), microseconds{at(expected - 1)}};
    }
    return d;
  }
  // A settle reply, counted when it settled; with `group` (a give-back across slots), that slot
  // group's limits', not counted (nothing was reserved for the caller).
  static MultiSettlement parseSettlement(const State& state, const Reply& r, const Group* group = nullptr) {
    const std::size_t count = group != nullptr ? group->size() : state.limiterNames.size();
    (void)detail::arrayReply("", state.label, r, 3 + 4 * count, "settle");
    const auto at = [&](std::size_t i) { return r.elements[i].asInteger(); };
    MultiSettlement out;
    out.status = detail::settleStatusOf(at(0), state.label);
    out.reserved = at(1);
    out.actual = at(2);
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t base = 3 + 4 * i;
      const Settlement& one = out.limits.emplace_back(
          Settlement{out.status, out.reserved, out.actual, at(base), at(base + 1), at(base + 2), at(base + 3)});
      out.returned = i == 0 ? one.returned : std::min(out.returned, one.returned);
      out.charged = i == 0 ? one.charged : std::min(out.charged, one.charged);
      out.unpaid = std::max(out.unpaid, one.unpaid);
      out.remaining = i == 0 ? one.remaining : std::min(out.remaining, one.remaining);
    }
    if (group == nullptr) detail::countSettled(state.gate.monitor(), out);
    return out;
  }
  // The failure policy's decision, for all limits or those of slot group `group`.
  MultiDecision byPolicy(std::int64_t permits, bool allowed, const Group* group = nullptr) const {
    MultiDecision d;
    std::int64_t least = 0;
    const std::size_t count = group != nullptr ? group->size() : names_.size();
    for (std::size_t i = 0; i < count; ++i) {
      const std::int64_t limit =
          state_->knownLimits[group != nullptr ? (*group)[i] : i].load(std::memory_order_relaxed);
      d.limits.push_back(detail::policyDecision(permits, allowed, limit));
      least = i == 0 ? limit : std::min(least, limit);
    }
    static_cast<Decision&>(d) = detail::policyDecision(permits, allowed, least);
    unheldLease(state_->leases(), d);
    return d;
  }
  // Throws InvalidArgument for `what`, a call that waits or answers without the lease, when a
  // limit is a concurrency limit; and for `aheadWhat` (if given), a call that takes permits ahead
  // of time, when a limit takes them now or not at all (Limits::nowOnly: a calendar quota, a
  // sliding window counter, as Limiter's refusals).
  void refuse(std::string_view what, std::string_view aheadWhat = {}) const {
    if (state_->leases()) {
      throw InvalidArgument(fmt::format(
          "redlimit: {}: {} cannot be used when a limit is a concurrency limit: a place cannot be taken ahead of "
          "time, and the lease must come back to be released. Use decide() or decideAsync(): MultiDecision::lease",
          state_->label, what));
    }
    if (!aheadWhat.empty() && !state_->nowOnly.empty()) {
      throw InvalidArgument(fmt::format("redlimit: {}: {} cannot be used: {}. Use decide() and its retryAfter",
                                        state_->label, aheadWhat, state_->nowOnly));
    }
  }
  // With `leases`, an allowed decision without a lease (the failure policy's grant, or a denial
  // shadow mode let through) gets one Redis does not hold, marked as the decision is, as
  // Limiter::acquireLease's.
  static void unheldLease(bool leases, MultiDecision& d) {
    if (leases && d.allowed && !d.lease) d.lease = detail::unheldLease(d.byPolicy, d.shadowDenied);
  }

  // --- Keys in several hash slots (a Cluster): slot by slot (detail::SlotSequence) ---

  // Whether the keys are in several hash slots of a Cluster: decided slot by slot.
  bool acrossSlots() const noexcept { return groups_ != nullptr; }
  // Throws InvalidArgument for `what`, which cannot be decided slot by slot, when the keys are in
  // several hash slots.
  void refuseAcrossSlots(std::string_view what) const {
    if (!acrossSlots()) return;
    throw InvalidArgument(fmt::format(
        "redlimit: {}: its keys are in {} hash slots of a Redis Cluster, so it decides slot by slot (decide, "
        "tryAcquire without a timeout, peek, decideAsync, tryAcquireAsync); {} cannot be: give the keys one hash "
        "tag (\"{{tenant42}}:user:7\", \"{{tenant42}}:tenant\") for one script call",
        state_->label, groups_->size(), what));
  }
  // One decision (or peek) across slots: its permits and, unless a peek, its id (new in every call),
  // each group's record key (in that group's slot) and, for every group but the last, its pending
  // set, and the times below.
  struct Across {
    std::int64_t permits = 0;
    bool peek = false;
    std::string id;
    std::vector<std::string> recordKeys;   // per group
    std::vector<std::string> pendingKeys;  // per group but the last
    milliseconds hold{0};                  // how long an earlier group's grant waits for the decision
    milliseconds recordTtl{0};             // how long its record (and pending member) can be found
  };
  // The hold is twice the bound of every call of the sequence (an ask per group, a give-back per
  // group but the last) plus 1 s for the caller between calls: a live caller has decided (or given
  // back) by then. After it, a caller that went away is presumed gone: the next decision over the
  // same limits that finds its member resolves it. Records stay findable for an hour more (a
  // settled one keeps at most the hold); the last group's outlives the others' by a hold, so that a
  // resolve never finds it gone while an earlier group's record is there.
  static constexpr milliseconds kFindable{3600 * 1000};
  Across across(std::int64_t permits, bool peek) const {
    Across a{permits, peek, {}, {}, {}, {}, {}};
    if (peek) return a;
    a.id = detail::newLeaseId();
    const Groups& groups = *groups_;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      a.recordKeys.push_back(recordKeyOf(g, a.id));
      if (g + 1 < groups.size()) a.pendingKeys.push_back(pendingKeyOf(g));
    }
    const std::int64_t hold = 2 * static_cast<std::int64_t>(groups.size()) * state_->callBound.count() + 1000;
    const std::int64_t most = detail::kMaxReservationTtl.count();
    a.hold = milliseconds{std::min(hold, most / 4)};
    a.recordTtl = milliseconds{std::min(a.hold.count() + kFindable.count(), most - a.hold.count())};
    return a;
  }
  // Group `g`'s record of the decision `id`: in its first key's slot.
  std::string recordKeyOf(std::size_t g, const std::string& id) const {
    return detail::namespacedRecordKey(names_[(*groups_)[g].front()], id, "mxs");
  }
  // Group `g`'s pending set: in its first key's slot, named by what its members need to be resolved
  // and swept by another caller (FNV-1a of the group's keys and kinds, and of the last group's first
  // key): only a decision over the same limits finds them.
  std::string pendingKeyOf(std::size_t g) const {
    std::uint64_t h = 14695981039346656037ULL;
    const auto mix = [&h](std::string_view bytes) {
      for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
      h = (h ^ 0xffU) * 1099511628211ULL;
    };
    for (const std::size_t i : (*groups_)[g]) {
      mix(names_[i]);
      mix(std::string_view(&state_->kinds[i], 1));
    }
    mix(names_[groups_->back().front()]);
    return detail::namespacedRecordKey(names_[(*groups_)[g].front()], fmt::format("{:016x}", h), "mxp");
  }
  // A member of a pending set: "<id>:<permits>".
  static std::string memberOf(const Across& a) { return fmt::format("{}:{}", a.id, a.permits); }
  // The id and permits of `member`; nullopt if redlimit did not write it.
  static std::optional<std::pair<std::string, std::int64_t>> parseMember(const std::string& member) {
    const std::size_t colon = member.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= member.size() || colon + 11 < member.size()) {
      return std::nullopt;
    }
    std::int64_t n = 0;
    for (std::size_t i = colon + 1; i < member.size(); ++i) {
      if (member[i] < '0' || member[i] > '9') return std::nullopt;
      n = n * 10 + (member[i] - '0');
    }
    if (n < 1 || n > detail::kMaxPermits) return std::nullopt;
    return std::make_pair(member.substr(0, colon), n);
  }

  // An ask's answer across slots: the group's decision, the pending members it found whose hold
  // ended, and whether the decision was given up (a resolve fenced its last group's record).
  struct SlotAnswer {
    MultiDecision decision;
    std::vector<std::string> ended;
    bool fenced = false;
  };
  // The call of slot group `g`: a peek, or a reserve under its record (every group but the last
  // with its pending set). Uncounted: the combined decision is counted once (finish).
  Op<SlotAnswer> askOp(const Across& a, std::size_t g) const {
    const Group* group = &(*groups_)[g];
    if (a.peek) return answering(limitsOp(plain(), "peek", "peek", a.permits, 0, {}, {}, group), 0);
    const bool last = g + 1 == groups_->size();
    const SlotExtras extras{
        last ? std::string() : a.pendingKeys[g],
        last ? std::vector<std::string>{} : std::vector<std::string>{fmt::to_string(a.hold.count()), memberOf(a)}};
    const milliseconds ttl = last ? a.recordTtl + a.hold : a.recordTtl;
    return answering(
        limitsOp(decision(a.permits), "decide", "reserve", a.permits, ttl.count(), a.recordKeys[g], {}, group, &extras),
        kHead + kPerLimit * group->size() + 1);
  }
  // `one` answering a SlotAnswer: a reserve's reply (`size` elements before the members) may end
  // with pending members, and its `repeated` is 2 when the decision was given up.
  static Op<SlotAnswer> answering(Op<MultiDecision> one, std::size_t size) {
    return {one.params, one.what, std::move(one.request),
            [parse = std::move(one.parse), size](Core* self, const Request& q, const Reply& r) {
              SlotAnswer out;
              if (size == 0 || r.type != Reply::Type::Array || r.elements.size() <= size) {
                out.decision = parse(self, q, r);
              } else {
                Reply head = r;
                head.elements.resize(size);
                out.decision = parse(self, q, head);
                for (std::size_t i = size; i < r.elements.size(); ++i) out.ended.push_back(r.elements[i].str);
              }
              out.fenced = size != 0 && r.elements[size - 1].integer == 2;
              return out;
            },
            [policy = std::move(one.byPolicy)](Core& self, bool allowed) {
              return SlotAnswer{policy(self, allowed), {}, false};
            }};
  }
  // Settles group `g`'s record `recordKey` (`member` in its pending set, if `g` has one) as
  // `actual`: 0 gives back, the reserved permits keep them. Sent again after a closed connection
  // (the record makes a resend give nothing twice). Its record keeps at most the hold.
  Op<MultiSettlement> settleOp(const Across& a, std::size_t g, const std::string& recordKey, const std::string& member,
                               std::int64_t actual) const {
    const Group* group = &(*groups_)[g];
    const bool last = g + 1 == groups_->size();
    std::vector<std::string> argv{fmt::to_string(a.hold.count())};
    if (!last) argv.push_back(member);
    const SlotExtras extras{last ? std::string() : a.pendingKeys[g], std::move(argv)};
    return {
        plain(), "decide", limitsRequest("settle", actual, 0, recordKey, {}, group, &extras),
        [state = state_, group](Core*, const Request&, const Reply& r) { return parseSettlement(*state, r, group); }};
  }
  // Gives back group `g`'s reservation of this decision.
  Op<MultiSettlement> giveBackOp(const Across& a, std::size_t g) const {
    return settleOp(a, g, a.recordKeys[g], g + 1 < groups_->size() ? memberOf(a) : std::string(), 0);
  }
  // Whether the decision of `member` took in the last group (its record there); if it did not, it
  // never will: the resolve fences that record. Idempotent: sent again after a closed connection.
  Op<bool> resolveOp(const Across& a, const std::string& member) const {
    const auto parsed = parseMember(member);
    if (!parsed) {
      throw InvalidArgument(fmt::format("redlimit: {}: a pending member redlimit did not write", state_->label));
    }
    return {plain(), "decide",
            Request{&kMulti,
                    {recordKeyOf(groups_->size() - 1, parsed->first)},
                    {"resolve", "", "", fmt::to_string((a.recordTtl + a.hold).count())},
                    nullptr,
                    nullptr},
            [](Core*, const Request&, const Reply& r) { return r.integer == 1; }};
  }
  // Sweeps `member` from group `g`: its record settled as kept (`committed`) or given back.
  Op<MultiSettlement> sweepOp(const Across& a, std::size_t g, const std::string& member, bool committed) const {
    const auto parsed = parseMember(member);  // resolveOp read it first
    return settleOp(a, g, recordKeyOf(g, parsed->first), member, committed ? parsed->second : 0);
  }
  // The decision (or peek) across slots, waiting: each step run as one call (runOp).
  MultiDecision decideAcross(std::int64_t permits, bool peek) {
    const Across a = across(permits, peek);
    detail::SlotSequence seq(groups_->size(), peek);
    using Kind = detail::SlotSequence::Step::Kind;
    for (detail::SlotSequence::Step s = seq.start(); s.kind != Kind::Done;) {
      if (s.kind == Kind::Ask) {
        SlotAnswer answer;
        std::exception_ptr error = detail::thrownBy([&] { answer = run(askOp(a, s.group)); });
        s = error ? seq.failed(std::move(error)) : answeredBy(a, seq, std::move(answer));
      } else if (s.kind == Kind::GiveBack) {
        std::optional<MultiSettlement> back;
        (void)detail::thrownBy([&] { back = run(giveBackOp(a, s.group)); });
        s = seq.gaveBack(std::move(back));
      } else if (s.kind == Kind::Resolve) {
        std::optional<bool> committed;
        (void)detail::thrownBy([&] { committed = run(resolveOp(a, s.member)); });
        s = seq.resolved(committed);
      } else {
        (void)detail::thrownBy([&] { (void)run(sweepOp(a, s.group, s.member, s.committed)); });
        s = seq.swept();
      }
    }
    return finished(a, seq);
  }
  // `answer` to `seq`: a decision given up is the call's TimeoutError (its earlier groups given back).
  detail::SlotSequence::Step answeredBy(const Across& a, detail::SlotSequence& seq, SlotAnswer answer) const {
    if (!answer.fenced) return seq.answered(std::move(answer.decision), std::move(answer.ended));
    return seq.failed(std::make_exception_ptr(TimeoutError(fmt::format(
        "redlimit: {}: the decision across Cluster slots took longer than its hold ({} ms) before its last slot, and "
        "another caller gave its earlier slots' permits back; nothing is taken (check the latency to the Cluster's "
        "primaries)",
        state_->label, a.hold.count()))));
  }
  // finish(), and when every group granted, their records settled as kept (in the background; the
  // last group's after the others', so that it is there while theirs can be found).
  MultiDecision finished(const Across& a, const detail::SlotSequence& seq) {
    MultiDecision d = finish(a, seq);
    if (!a.peek && !seq.error() && seq.answers().size() == groups_->size() && seq.answers().back().allowed &&
        !seq.recorded().empty()) {
      keep(std::make_shared<const Across>(a), seq.recorded());
    }
    return d;
  }
  // Each callback holds this Core until its reply is read: the settles' replies are read with
  // pointers into its groups, and the MultiLimit (a temporary of on()) may be gone by then.
  void keep(const std::shared_ptr<const Across>& a, std::vector<std::size_t> earlier) {
    const std::size_t last = groups_->size() - 1;
    const bool lastRecorded = earlier.back() == last;
    if (lastRecorded) earlier.pop_back();
    std::shared_ptr<Core> self = shared_from_this();
    const auto keepLast = [self, a, last] {
      self->runAsync<MultiSettlement>([&] { return self->settleOp(*a, last, a->recordKeys[last], {}, a->permits); },
                                      [self](const MultiSettlement&, const std::exception_ptr&) { (void)self; });
    };
    if (earlier.empty()) return keepLast();
    // The last group's record is kept long only while an earlier one may still be swept.
    struct Left {
      std::atomic<std::size_t> calls;
      std::atomic<bool> failed{false};
    };
    auto left = std::make_shared<Left>();
    left->calls = earlier.size();
    for (const std::size_t g : earlier) {
      runAsync<MultiSettlement>(
          [&] { return settleOp(*a, g, a->recordKeys[g], memberOf(*a), a->permits); },
          [left, lastRecorded, keepLast](const MultiSettlement&, const std::exception_ptr& error) {
            if (error) left->failed = true;
            if (left->calls.fetch_sub(1) == 1 && !left->failed && lastRecorded) keepLast();
          });
    }
  }
  // decideAcross without waiting: each step sent when the one before answered (on the I/O thread);
  // `done` once (isolated), with the checks' error at once. The chain holds this Core: a handle
  // dropped meanwhile (a temporary of on()) still gives back.
  struct Chain {
    std::shared_ptr<Core> core;
    Across across;
    detail::SlotSequence seq;
    DecisionCallback done;
  };
  void decideAcrossAsync(std::int64_t permits, bool peek, DecisionCallback done) {
    std::shared_ptr<Chain> c;
    if (!detail::checkedOrAnswered(done, gate_.monitor(), state_->label, [&] {
          c = std::make_shared<Chain>(
              Chain{shared_from_this(), across(permits, peek), detail::SlotSequence(groups_->size(), peek), nullptr});
        })) {
      return;
    }
    c->done = std::move(done);
    step(c, c->seq.start());
  }
  static void step(const std::shared_ptr<Chain>& c, const detail::SlotSequence::Step& s) {
    Core& core = *c->core;
    using Kind = detail::SlotSequence::Step::Kind;
    switch (s.kind) {
      case Kind::Ask:
        return core.runAsync<SlotAnswer>([&] { return core.askOp(c->across, s.group); },
                                         [c](SlotAnswer answer, std::exception_ptr error) {
                                           step(c, error ? c->seq.failed(std::move(error))
                                                         : c->core->answeredBy(c->across, c->seq, std::move(answer)));
                                         });
      case Kind::GiveBack:
        return core.runAsync<MultiSettlement>(
            [&] { return core.giveBackOp(c->across, s.group); },
            [c](MultiSettlement back, const std::exception_ptr& error) {
              step(c, c->seq.gaveBack(error ? std::nullopt : std::make_optional(std::move(back))));
            });
      case Kind::Resolve:
        return core.runAsync<bool>([&] { return core.resolveOp(c->across, s.member); },
                                   [c](bool committed, const std::exception_ptr& error) {
                                     step(c, c->seq.resolved(error ? std::nullopt : std::make_optional(committed)));
                                   });
      case Kind::Sweep:
        return core.runAsync<MultiSettlement>(
            [&] { return core.sweepOp(c->across, s.group, s.member, s.committed); },
            [c](const MultiSettlement&, const std::exception_ptr&) { step(c, c->seq.swept()); });
      case Kind::Done:
        break;
    }
    MultiDecision d;
    std::exception_ptr error = detail::thrownBy([&] { d = core.finished(c->across, c->seq); });
    detail::callOnce(c->done, &core.gate_.monitor(), core.state_->label, std::move(d), std::move(error));
  }
  // The answer of a decision across slots (`seq` done), counted unless a peek, or the error of the
  // group that failed. Each limit's view is its group's answer (remaining after a give-back as that
  // settle left it); a limit in a group after the one that denied was not asked: its view has time 0,
  // allowed false and its limit as last seen. Combined: allowed when every group granted; denied:
  // retryAfter, time and deniedBy of the group that denied (a peek: of the denying group with the
  // longest retryAfter); remaining the least and resetAfter the longest of the limits asked, limit
  // the least of all.
  MultiDecision finish(const Across& a, const detail::SlotSequence& seq) const {
    if (seq.error()) std::rethrow_exception(seq.error());
    const Groups& groups = *groups_;
    MultiDecision d;
    d.permits = a.permits;
    d.allowed = true;
    d.limits.resize(names_.size());
    std::vector<bool> asked(names_.size(), false);
    for (std::size_t i = 0; i < names_.size(); ++i) {
      d.limits[i].permits = a.permits;
      d.limits[i].limit = state_->knownLimits[i].load(std::memory_order_relaxed);
    }
    const MultiDecision* deciding = nullptr;  // the denial that decided, or the last grant
    std::size_t decidingGroup = 0;
    for (std::size_t g = 0; g < seq.answers().size(); ++g) {
      const MultiDecision& one = seq.answers()[g];
      for (std::size_t j = 0; j < groups[g].size(); ++j) {
        d.limits[groups[g][j]] = one.limits[j];
        asked[groups[g][j]] = true;
      }
      d.byPolicy = d.byPolicy || one.byPolicy;
      if (one.allowed && d.allowed) {
        deciding = &one;
        decidingGroup = g;
      } else if (!one.allowed && (d.allowed || one.retryAfter > deciding->retryAfter)) {
        deciding = &one;
        decidingGroup = g;
        d.allowed = false;
      }
    }
    for (const auto& [g, back] : seq.givenBack()) {
      if (!back || back->status != Settlement::Status::Settled) continue;
      for (std::size_t j = 0; j < groups[g].size(); ++j) d.limits[groups[g][j]].remaining = back->limits[j].remaining;
    }
    d.time = deciding->time;
    d.retryAfter = d.allowed ? microseconds{0} : deciding->retryAfter;
    if (!d.allowed && deciding->deniedBy != Decision::kNone) d.deniedBy = groups[decidingGroup][deciding->deniedBy];
    bool first = true;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const Decision& v = d.limits[i];
      d.limit = i == 0 ? v.limit : std::min(d.limit, v.limit);
      if (!asked[i]) continue;
      d.remaining = first ? v.remaining : std::min(d.remaining, v.remaining);
      d.resetAfter = std::max(d.resetAfter, v.resetAfter);
      first = false;
    }
    if (!a.peek) gate_.monitor().admit(d);
    return d;
  }

  std::shared_ptr<State> state_;
  std::shared_ptr<Client>& client_;       // the state's, as the call protocol reads it
  detail::FailureGate& gate_;             // the state's
  std::vector<std::string> names_;        // the keys, or the limiters' names while unbound_
  bool unbound_;                          // a MultiLimit of Limiters before on(): no keys
  std::shared_ptr<const Groups> groups_;  // keys in several hash slots of a Cluster, by slot; null: one call
};

// --- The handle -------------------------------------------------------------------------------

MultiLimit::MultiLimit(const std::vector<Limiter>& limits, const MultiLimit::Options& options) {
  if (limits.empty() || limits.size() > kMaxLimits) {
    throw InvalidArgument(
        fmt::format("redlimit: a MultiLimit decides 1..{} limiters, got {}", kMaxLimits, limits.size()));
  }
  if (!options.name.empty()) detail::checkLimiterName(options.name, detail::kMaxNameLength);
  Core::Limits made;
  made.client = limits.front().client();
  std::vector<std::string>& names = made.limiterNames;
  std::vector<std::pair<std::size_t, detail::CalendarQuota>> calendars;  // limit index, quota
  for (const Limiter& limiter : limits) {
    const std::string& name = limiter.name();
    if (limiter.client() != made.client) {
      throw InvalidArgument(fmt::format(
          "redlimit: MultiLimit: limiter {} uses another Client than {}; one script call runs on one Client", name,
          limits.front().name()));
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
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
    if (!policy.givesLeases() && !policy.canWait() && made.nowOnly.empty()) {
      made.nowOnly = fmt::format("limit {}: {}", name, detail::whyNoWait(policy.kind()));
    }
    if (policy.kind() == Policy::Kind::Calendar) {  // its quota and, per call, its table (tables)
      const detail::CalendarQuota quota = policy.calendarQuota("a calendar limit");
      made.kinds.push_back('Q');
      made.configs.push_back(detail::calendarConfig(quota, milliseconds{policy.keepAliveMs_}));
      calendars.emplace_back(made.configs.size() - 1, quota);
      made.maxPermits = std::min(made.maxPermits, quota.limit);
    } else if (policy.givesLeases()) {  // a concurrency limit: its limit and lease TTL
      made.kinds.push_back(kLeaseKind);
      made.configs.push_back(packed.packed);
      made.leaseConfigs.push_back(policy);
    } else {  // its configuration in the call, or "" for a stored policy: the key's own
      made.kinds.push_back(packed.packed.front());
      made.configs.push_back(policy.isStored() ? std::string() : packed.packed);
      if (!policy.isStored()) made.maxPermits = std::min(made.maxPermits, packed.maxPermits);
    }
  }
  // None in the call: the stored configurations, and no configuration sent.
  if (std::all_of(made.configs.begin(), made.configs.end(), [](const std::string& c) { return c.empty(); })) {
    made.configs.clear();
  }
  // Options::name, when given, is what its events, messages and heartbeats call it, as its metrics do.
  made.label = options.name.empty() ? fmt::format("MultiLimit({})", fmt::join(names, " + ")) : options.name;
  if (!calendars.empty()) {
    made.tables = std::make_shared<detail::CalendarTables>(made.label);
    // A limit's configuration is ARGV[6 + i] of every call of the limits (limitsRequest).
    for (const auto& [index, quota] : calendars) made.tables->add(5 + index, quota, made.configs[index]);
  }
  auto state = std::make_shared<Core::State>(std::move(made), options);
  core_ = std::make_shared<Core>(state, state->limiterNames, true);
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
  Core::Groups groups = slotGroups(*s.client, stateKeys);
  if (groups.empty()) return MultiLimit(std::make_shared<Core>(core_->state_, std::move(stateKeys), false));
  // Slot by slot: a reserve in every slot, given back if a later one denies. A lease
  // cannot be reserved under a record (multi.lua refuses it), and a calendar quota's table of
  // windows is placed in the ARGV of one call of all the limits (Limits::tables): both refused.
  if (s.leases() || s.tables) {
    const std::string& a = stateKeys[groups[0].front()];
    const std::string& b = stateKeys[groups[1].front()];
    throw InvalidArgument(fmt::format(
        "redlimit: {}: on a Redis Cluster, \"{}\" is in slot {} and \"{}\" in slot {}; keys of several slots are "
        "decided slot by slot, which a {} cannot be. Give them one hash tag, the part between the first '{{' and "
        "the next '}}', which is all that Redis Cluster hashes: e.g. \"{{tenant42}}:user:7\", \"{{tenant42}}\"",
        s.label, a, detail::keySlot(a), b, detail::keySlot(b),
        s.leases() ? "concurrency limit (its lease is held in all or none)"
                   : "calendar quota (its table of windows travels in one call of all the limits)"));
  }
  return MultiLimit(std::make_shared<Core>(core_->state_, std::move(stateKeys), false,
                                           std::make_shared<const Core::Groups>(std::move(groups))));
}

MultiDecision MultiLimit::decide(std::int64_t permits) {
  if (core_->acrossSlots()) return core_->decideAcross(permits, false);
  return core_->run(core_->countedTakeOp(permits));
}

bool MultiLimit::tryAcquire(std::int64_t permits) {
  core_->refuse("tryAcquire");
  return decide(permits).allowed;
}

bool MultiLimit::tryAcquire(std::int64_t permits, milliseconds timeout) {
  core_->refuse("tryAcquire", "tryAcquire with a timeout");
  core_->refuseAcrossSlots("tryAcquire with a timeout");
  return detail::tryAcquireWithin(core_->gate_, permits, timeout, core_->taking(permits));
}

void MultiLimit::acquire(std::int64_t permits) {
  core_->refuse("acquire", "acquire");
  core_->refuseAcrossSlots("acquire");
  (void)detail::acquireWaiting(core_->gate_, permits, core_->taking(permits));
}

Decision MultiLimit::reserve(std::int64_t permits, microseconds maxWait) {
  core_->refuse("reserve", "reserve");
  core_->refuseAcrossSlots("reserve");
  // The combined decision: a reservation answers no per-limit views.
  return static_cast<const Decision&>(core_->run(core_->countedTakeOp(permits, maxWait)));
}

MultiDecision MultiLimit::peek(std::int64_t permits) {
  if (core_->acrossSlots()) return core_->decideAcross(permits, true);
  return core_->run(core_->peekOp(permits));
}

void MultiLimit::refund(std::int64_t permits) {
  core_->refuseAcrossSlots("refund");
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
  core_->runAsync<MaybeLease>([&] { return core_->renewOp(lease, leaseTtl); }, std::move(done));
}

std::future<std::optional<Lease>> MultiLimit::renewAsync(Lease lease) {
  return detail::futureOf<MaybeLease>([&](auto done) { renewAsync(std::move(lease), std::move(done)); });
}

std::future<std::optional<Lease>> MultiLimit::renewAsync(Lease lease, milliseconds leaseTtl) {
  return detail::futureOf<MaybeLease>([&](auto done) { renewAsync(std::move(lease), leaseTtl, std::move(done)); });
}

void MultiLimit::releaseAsync(const Lease& lease, ReleaseCallback done) {
  core_->runAsync<bool>([&] { return core_->releaseOp(lease); }, std::move(done));
}

std::future<bool> MultiLimit::releaseAsync(const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(lease, std::move(done)); });
}

milliseconds MultiLimit::leaseTtl() const noexcept {
  milliseconds shortest{0};
  for (const Policy& c : core_->state_->leaseConfigs) {
    if (shortest.count() == 0 || c.leaseTtl() < shortest) shortest = c.leaseTtl();
  }
  return shortest;
}

void MultiLimit::decideAsync(std::int64_t permits, DecisionCallback done) {
  if (core_->acrossSlots()) return core_->decideAcrossAsync(permits, false, std::move(done));
  core_->runAsync<MultiDecision>([&] { return core_->countedTakeOp(permits); }, std::move(done));
}

std::future<MultiDecision> MultiLimit::decideAsync(std::int64_t permits) {
  return detail::futureOf<MultiDecision>([&](auto done) { decideAsync(permits, std::move(done)); });
}

void MultiLimit::tryAcquireAsync(std::int64_t permits, std::function<void(bool, std::exception_ptr)> done) {
  if (!detail::checkedOrAnswered(done, monitor(), core_->state_->label, [&] { core_->refuse("tryAcquireAsync"); })) {
    return;
  }
  decideAsync(permits, [done = std::move(done)](const MultiDecision& d, const std::exception_ptr& error) {
    done(!error && d.allowed, error);
  });
}

std::future<bool> MultiLimit::tryAcquireAsync(std::int64_t permits) {
  return detail::futureOf<bool>([&](auto done) { tryAcquireAsync(permits, std::move(done)); });
}

// --- Reserve, then settle ------------------------------------------------------------------

std::string MultiLimit::reservationKey(const std::string& id) const {
  // The record says what each limit gives back: every kind a MultiLimit takes but concurrency limits.
  core_->refuse("reserveFor or settle");
  core_->refuseAcrossSlots("reserveFor, settle or cancel");
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
  return detail::futureOf<MultiDecision>([&](auto done) { reserveForAsync(permits, id, recordTtl, std::move(done)); });
}

MultiSettlement MultiLimit::settle(const std::string& id, std::int64_t actual) {
  return core_->run(core_->settleOp(actual, reservationKey(id)));
}

void MultiLimit::settleAsync(const std::string& id, std::int64_t actual, SettleCallback done) {
  core_->runAsync<MultiSettlement>([&] { return core_->settleOp(actual, reservationKey(id)); }, std::move(done));
}

std::future<MultiSettlement> MultiLimit::settleAsync(const std::string& id, std::int64_t actual) {
  return detail::futureOf<MultiSettlement>([&](auto done) { settleAsync(id, actual, std::move(done)); });
}

MultiSettlement MultiLimit::cancel(const std::string& id) { return settle(id, 0); }

const std::vector<std::string>& MultiLimit::names() const noexcept { return core_->names_; }
const std::string& MultiLimit::label() const noexcept { return core_->state_->label; }
std::size_t MultiLimit::size() const noexcept { return core_->names_.size(); }
const std::shared_ptr<Client>& MultiLimit::client() const noexcept { return core_->client_; }
FailureStats MultiLimit::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& MultiLimit::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
