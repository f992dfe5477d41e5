#include "redlimit/lease_heartbeat.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <variant>
#include <utility>

#include <fmt/format.h>

#include "base/fork_guard.hpp"
#include "base/wall_clock.hpp"
#include "limiters/completion.hpp"
#include "limiters/lease_id.hpp"
#include "redlimit/detail/idle_sweeper.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/errors.hpp"

namespace redlimit {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

using Steady = std::chrono::steady_clock;

// A lease that Redis holds (not one the failure policy or shadow mode made up).
bool heldByRedis(const Lease& lease) { return lease.expiresAt.count() > 0 && !lease.byPolicy && !lease.shadowDenied; }

}  // namespace

// What the heartbeat thread's task, the renewals' completions and the handle share. The task gets
// a raw pointer (IdleSweeper owns nothing): the handle removes the task before it drops the State.
// Completions hold it weakly.
class LeaseHeartbeat::State : public std::enable_shared_from_this<LeaseHeartbeat::State> {
 public:
  // A Limiter's lease of one key, with the operations a MultiLimit has (a renewal always with a
  // TTL: resolved() gives one).
  struct LimiterKey {
    Limiter limiter;
    std::string key;
    void renewAsync(Lease l, milliseconds ttl, Limiter::Callback<std::optional<Lease>> done) {
      limiter.renewAsync(key, std::move(l), ttl, std::move(done));
    }
    void releaseAsync(const Lease& l, Limiter::Callback<bool> done) { limiter.releaseAsync(key, l, std::move(done)); }
    bool release(const Lease& l) { return limiter.release(key, l); }
    [[nodiscard]] const LimiterMonitor& monitor() const noexcept { return limiter.monitor(); }
  };
  using Target = std::variant<MultiLimit, LimiterKey>;

  // Options resolved (resolved()). An onLost that throws is reported through the target's events
  // (detail::isolated).
  State(Target t, Lease first, const LeaseHeartbeat::Options& o)
      : target(std::move(t)),
        renewTtl(o.leaseTtl.count() > 0 ? std::optional<milliseconds>(o.leaseTtl) : std::nullopt),
        horizon(renewTtl ? *renewTtl : std::get<MultiLimit>(target).leaseTtl()),
        interval(o.interval),
        onLost(std::visit([&](const auto& x) { return detail::isolated(o.onLost, x.monitor(), nameOf(x)); }, target)),
        lease(std::move(first)) {
    // How long the lease has left, read against this machine's clock (the server's may differ: at
    // most one TTL is assumed, so a clock ahead of the server's cannot make it seem longer).
    const microseconds left = std::clamp<microseconds>(lease.expiresAt - detail::systemNow(), microseconds{0}, horizon);
    const Steady::time_point now = Steady::now();
    liveUntil = now + left;
    // The first renewal after one interval, or at once if the lease may expire sooner than that.
    nextRenewal = left > interval ? now + interval : now;
  }

  Target target;                                              // handles: thread-safe
  const std::uint64_t generation = detail::forkGeneration();  // of the process that made it
  const std::optional<milliseconds> renewTtl;                 // none: each concurrency limit's own
  const milliseconds horizon;                                 // the shortest TTL a renewal gives
  const milliseconds interval;
  const std::function<void(const Lease&, std::exception_ptr)> onLost;

  mutable detail::Mutex m;
  Lease lease REDLIMIT_GUARDED_BY(m);
  bool lost REDLIMIT_GUARDED_BY(m) = false;
  bool stopped REDLIMIT_GUARDED_BY(m) = false;  // by stop(), release() or the destructor
  std::uint64_t renewals REDLIMIT_GUARDED_BY(m) = 0;
  std::exception_ptr lastError REDLIMIT_GUARDED_BY(m);
  // Until when the lease is live for sure: a renewal's send time (steady clock) plus its TTL, as
  // the server's expiry is its own clock at the renewal plus the TTL, which is no earlier.
  Steady::time_point liveUntil REDLIMIT_GUARDED_BY(m);
  Steady::time_point nextRenewal REDLIMIT_GUARDED_BY(m);  // when the next renewal is due
  bool inFlight REDLIMIT_GUARDED_BY(m) = false;           // a renewal was sent and not answered yet
  std::uint64_t sweepId REDLIMIT_GUARDED_BY(m) = 0;

  // The heartbeat thread's task. Should anything throw here (memory ran out), the visit comes
  // again after an interval.
  static std::int64_t tick(void* owner) noexcept {
    auto* const state = static_cast<State*>(owner);
    try {
      return state->visit();
    } catch (...) {
      return std::chrono::duration_cast<microseconds>(state->interval).count();
    }
  }

  // One visit: at the lease's known expiry the lease is lost, whether or not a renewal is in
  // flight (its deadline may come later: a late answer then changes nothing); else a renewal is
  // sent (without waiting) when one is due and none is in flight. Returns µs until the next
  // visit: the next renewal or the expiry, whichever comes first (an answer reschedules sooner).
  std::int64_t visit() {
    const Steady::time_point now = Steady::now();
    Lease copy;
    std::exception_ptr why;
    bool lostNow = false;
    bool send = false;
    Steady::time_point next;
    {
      const detail::LockGuard lk(m);
      if (stopped || lost) return -1;
      copy = lease;
      if (now >= liveUntil) {  // no renewal answered in time
        lost = lostNow = true;
        why = lastError;
        if (!why) {  // none failed either: one is in flight, unanswered
          why = std::make_exception_ptr(TimeoutError(
              fmt::format("redlimit: lease {}: no renewal was answered before its expiry; its holder must stop "
                          "(keep the lease's TTL well above the Client's connectTimeout + commandTimeout)",
                          lease.id)));
        }
      } else {
        send = !inFlight && now >= nextRenewal;
        inFlight = inFlight || send;
        next = inFlight ? liveUntil : std::min(nextRenewal, liveUntil);
      }
    }
    if (lostNow) {
      onLost(copy, why);
      return -1;
    }
    if (send) {
      MultiLimit::RenewCallback done = [weak = weak_from_this(), now](const std::optional<Lease>& renewed,
                                                                      const std::exception_ptr& e) {
        if (const std::shared_ptr<State> s = weak.lock()) s->answered(renewed, e, now);
      };
      if (renewTtl) {
        std::visit([&](auto& t) { t.renewAsync(std::move(copy), *renewTtl, std::move(done)); }, target);
      } else {  // a MultiLimit's, each limit's own TTL
        std::get<MultiLimit>(target).renewAsync(std::move(copy), std::move(done));
      }
    }
    return std::max<std::int64_t>(0, std::chrono::duration_cast<microseconds>(next - Steady::now()).count());
  }

  // A renewal's completion: on the I/O thread (or at once on the heartbeat thread when the
  // request was refused before it was queued). Should anything throw (memory ran out), the lease
  // counts as lost: nobody would renew it any more.
  void answered(const std::optional<Lease>& renewed, const std::exception_ptr& error,
                Steady::time_point sent) noexcept {
    try {
      settle(renewed, error, sent);
    } catch (...) {
      try {
        const detail::LockGuard lk(m);
        lost = true;
      } catch (...) {
      }
    }
  }

  void settle(const std::optional<Lease>& renewed, const std::exception_ptr& error, Steady::time_point sent) {
    Lease copy;
    bool lostNow = false;
    std::uint64_t id = 0;
    Steady::duration delay{};
    {
      const detail::LockGuard lk(m);
      if (stopped || lost) return;  // a late answer changes nothing
      inFlight = false;
      const Steady::time_point now = Steady::now();
      if (!error && renewed) {
        lease.expiresAt = renewed->expiresAt;
        ++renewals;
        liveUntil = std::max(liveUntil, sent + horizon);
        lastError = nullptr;
      } else if (!error) {  // not live any more: expired, or released by someone else
        lost = lostNow = true;
      } else {  // lost if the lease may have expired already, else tried again at the next interval
        lastError = error;
        lost = lostNow = now >= liveUntil;
      }
      nextRenewal = now + interval;
      delay = std::min<Steady::duration>(interval, liveUntil - now);
      copy = lease;
      id = sweepId;
    }
    if (lostNow) {
      onLost(copy, error);
      return;
    }
    detail::IdleSweeper::instance().schedule(id, std::chrono::duration_cast<microseconds>(delay));
  }

  static std::string nameOf(const MultiLimit& limits) { return limits.label(); }
  static std::string nameOf(const LimiterKey& t) { return t.limiter.name(); }
};

namespace {

LeaseHeartbeat::Options checkedInterval(const std::string& name, LeaseHeartbeat::Options options,
                                        milliseconds horizon) {
  if (options.interval.count() == 0) options.interval = std::max(milliseconds{1}, horizon / 3);
  if (options.interval.count() < 1 || options.interval >= horizon) {
    throw InvalidArgument(
        fmt::format("redlimit: {}: a lease heartbeat's interval must be 1 ms or more and shorter than the leaseTtl of "
                    "{} ms, got {} ms",
                    name, horizon.count(), options.interval.count()));
  }
  return options;
}

}  // namespace

LeaseHeartbeat::Options LeaseHeartbeat::resolved(const Limiter& limiter, LeaseHeartbeat::Options options) {
  if (!limiter.policy().givesLeases()) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: a lease heartbeat renews leases, which only a concurrency policy gives",
                    limiter.name()));
  }
  if (options.leaseTtl.count() == 0) options.leaseTtl = limiter.policy().leaseTtl();
  detail::checkLeaseTtl(options.leaseTtl);
  const milliseconds horizon = options.leaseTtl;
  return checkedInterval("limiter " + limiter.name(), std::move(options), horizon);
}

LeaseHeartbeat::Options LeaseHeartbeat::resolved(const MultiLimit& limits, LeaseHeartbeat::Options options) {
  const std::string name = State::nameOf(limits);
  if (limits.leaseTtl().count() == 0) {
    throw InvalidArgument(
        fmt::format("redlimit: {}: a lease heartbeat needs a concurrency limit in the MultiLimit", name));
  }
  if (options.leaseTtl.count() != 0) detail::checkLeaseTtl(options.leaseTtl);
  const milliseconds horizon = options.leaseTtl.count() != 0 ? options.leaseTtl : limits.leaseTtl();
  return checkedInterval(name, std::move(options), horizon);
}

LeaseHeartbeat::LeaseHeartbeat(Limiter limiter, std::string key, const Lease& lease, LeaseHeartbeat::Options options) {
  detail::checkLeaseId(lease.id);
  options = resolved(limiter, std::move(options));
  (void)limiter.redisKey(key);  // a bad key: InvalidArgument now
  start(std::make_shared<State>(State::LimiterKey{std::move(limiter), std::move(key)}, lease, options));
}

LeaseHeartbeat::LeaseHeartbeat(MultiLimit limits, const Lease& lease, LeaseHeartbeat::Options options) {
  detail::checkLeaseId(lease.id);
  options = resolved(limits, std::move(options));
  start(std::make_shared<State>(std::move(limits), lease, options));
}

void LeaseHeartbeat::start(std::shared_ptr<State> state) {
  state_ = std::move(state);
  Steady::time_point first;  // the first visit: the first renewal (State's constructor set it)
  {
    const detail::LockGuard lk(state_->m);
    if (!heldByRedis(state_->lease)) return;
    first = state_->nextRenewal;
  }
  detail::IdleSweeper& sweeper = detail::IdleSweeper::instance();
  const std::uint64_t id = sweeper.add(state_.get(), &State::tick);
  {
    const detail::LockGuard lk(state_->m);
    state_->sweepId = id;
  }
  sweeper.schedule(id, std::chrono::duration_cast<microseconds>(first - Steady::now()));
}

LeaseHeartbeat::~LeaseHeartbeat() {
  if (!state_) return;
  // Inherited through fork(): the lease and its renewals are the parent's. Left alone (and the
  // state is not locked: a parent thread that does not exist here may have held its mutex).
  if (state_->generation != detail::forkGeneration()) {
    new std::shared_ptr<State>(std::move(state_));  // leaked on purpose: its mutex may be held
    return;
  }
  Lease held;
  bool toRelease = false;
  {
    const detail::LockGuard lk(state_->m);
    toRelease = !state_->stopped && !state_->lost && heldByRedis(state_->lease);
    held = state_->lease;
  }
  halt();
  if (!toRelease) return;
  try {  // without waiting: a release that fails leaves the lease to expire after its TTL
    std::visit([&](auto& t) { t.releaseAsync(held, [](bool, const std::exception_ptr&) {}); }, state_->target);
  } catch (...) {
  }
}

LeaseHeartbeat::LeaseHeartbeat(LeaseHeartbeat&& other) noexcept = default;

LeaseHeartbeat& LeaseHeartbeat::operator=(LeaseHeartbeat&& other) noexcept {
  if (this != &other) {
    LeaseHeartbeat ending(std::move(*this));  // ends this one's lease as its destructor does
    state_ = std::move(other.state_);
  }
  return *this;
}

void LeaseHeartbeat::halt() noexcept {
  std::uint64_t id = 0;
  {
    const detail::LockGuard lk(state_->m);
    state_->stopped = true;
    id = std::exchange(state_->sweepId, 0);
  }
  // Waits for a visit that is sending a renewal (never for Redis); a completion that comes later
  // finds the heartbeat stopped.
  if (id != 0) detail::IdleSweeper::instance().remove(id);
}

Lease LeaseHeartbeat::lease() const {
  if (!state_) throw InvalidArgument("redlimit: a LeaseHeartbeat that was moved from has no lease");
  const detail::LockGuard lk(state_->m);
  return state_->lease;
}

bool LeaseHeartbeat::lost() const {
  if (!state_) return false;
  const detail::LockGuard lk(state_->m);
  return state_->lost;
}

std::uint64_t LeaseHeartbeat::renewals() const {
  if (!state_) return 0;
  const detail::LockGuard lk(state_->m);
  return state_->renewals;
}

bool LeaseHeartbeat::release() {
  const Lease held = stop();
  if (!heldByRedis(held)) return false;
  return std::visit([&](auto& t) { return t.release(held); }, state_->target);
}

Lease LeaseHeartbeat::stop() {
  if (state_) halt();
  return lease();  // InvalidArgument for a heartbeat that was moved from
}

}  // namespace redlimit
