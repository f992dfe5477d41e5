#include "redlimit/calendar_rate_limiter.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include <date/date.h>
#include <date/tz.h>
#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/script_call.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Steady = std::chrono::steady_clock;
using SteadyTime = Steady::time_point;

const detail::Script kCalendar{detail::lua::calendar_quota.name, detail::lua::calendar_quota.sha1,
                               detail::lua::calendar_quota.source};

constexpr char kKind = 'Q';
constexpr int kBefore = 1;  // windows sent before the current one
constexpr int kAfter = 2;   // and after it

const date::time_zone* zoneOf(const std::string& name) {
  if (name.empty()) throw InvalidArgument("redlimit: a calendar quota needs a time zone name");
  try {
    return date::locate_zone(name);
  } catch (const std::exception& e) {
    throw InvalidArgument(
        fmt::format("redlimit: unknown time zone \"{}\" (not in the system's database: {})", name, e.what()));
  }
}

char unitCode(CalendarUnit u) {
  switch (u) {
    case CalendarUnit::Day:
      return 'D';
    case CalendarUnit::Week:
      return 'W';
    case CalendarUnit::Month:
      return 'M';
  }
  return '?';
}

void checkQuota(const CalendarQuota& q) {
  if (q.limit < 1 || q.limit > CalendarRateLimiter::kMaxPermits) {
    throw InvalidArgument(fmt::format("redlimit: a calendar quota's limit must be in 1..{}, got {}",
                                      CalendarRateLimiter::kMaxPermits, q.limit));
  }
  if (unitCode(q.unit) == '?') {
    throw InvalidArgument(fmt::format("redlimit: unknown calendar unit {}", static_cast<int>(q.unit)));
  }
  const int ws = static_cast<int>(q.weekStart);
  if (ws < 0 || ws > 6) {
    throw InvalidArgument(fmt::format("redlimit: a week must start on Sunday (0) .. Saturday (6), got {}", ws));
  }
}

// The first instant of the local day `d`: midnight, or the end of a gap that skips it (date::choose
// maps a nonexistent local time to the transition), the first midnight where it occurs twice.
microseconds startOf(const date::time_zone& zone, date::local_days d) {
  const auto sys = zone.to_sys(date::local_seconds{d.time_since_epoch()}, date::choose::earliest);
  return std::chrono::duration_cast<microseconds>(sys.time_since_epoch());
}

// The first local day of the window holding the local day `d`, and of the one `k` windows later.
date::local_days windowDay(const CalendarQuota& q, date::local_days d, int k) {
  switch (q.unit) {
    case CalendarUnit::Day:
      return d + date::days{k};
    case CalendarUnit::Week: {
      const unsigned wd = date::weekday{d}.c_encoding();
      const auto back = (wd + 7U - static_cast<unsigned>(q.weekStart)) % 7U;
      return d - date::days{back} + date::days{7 * k};
    }
    case CalendarUnit::Month: {
      const date::year_month_day ymd{d};
      const date::year_month ym = date::year_month{ymd.year(), ymd.month()} + date::months{k};
      return date::local_days{ym / 1};
    }
  }
  return d;
}

std::int64_t labelOf(const CalendarQuota& q, date::local_days first) {
  if (q.unit == CalendarUnit::Month) {
    const date::year_month_day ymd{first};
    return static_cast<std::int64_t>(static_cast<int>(ymd.year())) * 12 +
           static_cast<std::int64_t>(static_cast<unsigned>(ymd.month())) - 1;
  }
  return first.time_since_epoch().count();
}

std::vector<CalendarWindow> windowsIn(const CalendarQuota& q, const date::time_zone& zone, microseconds at, int before,
                                      int after) {
  const date::sys_time<microseconds> sys{at};
  const auto local = zone.to_local(sys);
  const date::local_days today = date::floor<date::days>(local);
  std::vector<CalendarWindow> out;
  out.reserve(static_cast<std::size_t>(before) + static_cast<std::size_t>(after) + 1);
  for (int k = -before; k <= after; ++k) {
    const date::local_days first = windowDay(q, today, k);
    CalendarWindow w;
    w.label = labelOf(q, first);
    w.start = startOf(zone, first);
    w.end = startOf(zone, windowDay(q, first, 1));
    out.push_back(w);
  }
  return out;
}

void putLe64(std::string& out, std::int64_t v) {
  auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(u & 0xFFU));
    u >>= 8U;
  }
}

std::string packTable(const std::vector<CalendarWindow>& windows) {
  std::string out;
  out.reserve(windows.size() * 24);
  for (const CalendarWindow& w : windows) {
    putLe64(out, w.label);
    putLe64(out, w.start.count());
    putLe64(out, w.end.count());
  }
  return out;
}

microseconds systemNow() {
  return std::chrono::duration_cast<microseconds>(std::chrono::system_clock::now().time_since_epoch());
}

}  // namespace

std::vector<CalendarWindow> calendarWindows(const CalendarQuota& quota, microseconds at, int before, int after) {
  CalendarRateLimiter::validateQuota(quota);
  if (before < 0 || before > 3 || after < 0 || after > 3) {
    throw InvalidArgument(
        fmt::format("redlimit: calendarWindows: before and after must be in 0..3, got {} and {}", before, after));
  }
  if (at.count() < 0) throw InvalidArgument("redlimit: calendarWindows: a time before 1970");
  return windowsIn(quota, *zoneOf(quota.zone), at, before, after);
}

class CalendarRateLimiter::Core : public std::enable_shared_from_this<CalendarRateLimiter::Core> {
 public:
  Core(std::shared_ptr<Client> client, std::string name, CalendarQuota quota, CalendarRateLimiterOptions options,
       const date::time_zone* zone, LimiterMonitor monitor)
      : client_(std::move(client)),
        name_(std::move(name)),
        quota_(std::move(quota)),
        zone_(zone),
        keepAlive_(fmt::to_string(options.keepAlive.count())),
        gate_(name_, std::move(options.failure), ClockView{}, std::move(monitor)) {
    const ClientOptions& o = client_->options();
    callBound_ = detail::saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
  }

  // One script call: `op` of `count` on `key` (count: the permits of take, peek and reserve, the
  // actual permits of settle, the permits of refund), with the reservation record `recordKey`
  // (KEYS[2] of reserve and settle; empty: none) and, for reserve, its TTL.
  struct Call {
    std::string key;
    std::string op;
    std::int64_t count = 0;
    std::string recordKey;
    milliseconds recordTtl{0};
  };

  // The script's arguments for `c`, with a table of windows around `around` (the server's time as
  // this host guesses it).
  std::vector<std::string> argv(const Call& c, microseconds around) const {
    std::vector<std::string> out{c.op,
                                 "",
                                 std::string(1, kKind),
                                 fmt::to_string(c.count),
                                 fmt::to_string(quota_.limit),
                                 std::string(1, unitCode(quota_.unit)),
                                 keepAlive_,
                                 packTable(windowsIn(quota_, *zone_, around, kBefore, kAfter))};
    if (c.recordTtl.count() > 0) out.push_back(fmt::to_string(c.recordTtl.count()));
    return out;
  }
  detail::ScriptRequest request(const Call& c, microseconds around) const {
    detail::ScriptRequest r{&kCalendar, {c.key}, argv(c, around), nullptr};
    if (!c.recordKey.empty()) r.keys.push_back(c.recordKey);
    return r;
  }
  microseconds serverNowGuess() const { return systemNow() + microseconds{offsetUs_.load(std::memory_order_relaxed)}; }
  void sawServerNow(microseconds serverNow) {
    offsetUs_.store((serverNow - systemNow()).count(), std::memory_order_relaxed);
  }
  static UnexpectedReplyError outsideTwice(const std::string& key) {
    return UnexpectedReplyError(
        fmt::format("redlimit: limiter {}: the server's time was outside the calendar table twice", key));
  }

  // One try of `c`: a table around the server's time as last seen, and once more around the time
  // the server answered when that was outside it (nothing was written then). The operation's
  // reply; the limiter's errors.
  detail::Reply send(const Call& c, SteadyTime deadline) {
    microseconds around = serverNowGuess();
    for (int tries = 0; tries < 2; ++tries) {
      detail::Reply reply;
      try {
        reply = request(c, around).send(*client_, deadline);
      } catch (const ScriptError&) {
        std::rethrow_exception(detail::oneKeyScriptError(std::current_exception(), c.key, kKind));
      }
      if (reply.type != detail::Reply::Type::Integer) return reply;
      around = microseconds{reply.integer};  // the server's now, outside the table
      sawServerNow(around);
    }
    throw outsideTwice(c.key);
  }

  // send() without waiting: `done` gets the reply or the error (ScriptErrors as they are), once.
  // `around`: the second table's time.
  void sendAsync(const Call& c, SteadyTime deadline, detail::ReplyCallback done,
                 std::optional<microseconds> around = std::nullopt) {
    detail::ScriptRequest r;
    try {
      r = request(c, around.value_or(serverNowGuess()));
    } catch (...) {
      done(detail::Reply{}, std::current_exception());
      return;
    }
    const bool second = around.has_value();
    r.sendAsync(*client_, deadline,
                [weak = weak_from_this(), c, deadline, second, done = std::move(done)](
                    const detail::Reply& reply, std::exception_ptr error) mutable {
                  if (error || reply.type != detail::Reply::Type::Integer) {
                    done(reply, std::move(error));
                    return;
                  }
                  const std::shared_ptr<Core> self = weak.lock();
                  if (second || !self) {
                    done(detail::Reply{},
                         second ? std::make_exception_ptr(outsideTwice(c.key))
                                : std::make_exception_ptr(ClosedError("redlimit: limiter " + c.key +
                                                                      ": the handle was dropped before its reply")));
                    return;
                  }
                  const microseconds serverNow{reply.integer};
                  self->sawServerNow(serverNow);
                  self->sendAsync(c, deadline, std::move(done), serverNow);
                });
  }

  // `c` through the call protocol, waiting: `parse(reply)`, `byPolicy(allowed)` as runSync's.
  template <class Parse, class ByPolicy>
  auto call(const detail::LimiterCall::Params& params, std::string_view what, const Call& c, Parse&& parse,
            ByPolicy&& byPolicy) {
    return detail::runSync(
        *client_, gate_, params, what, [&](SteadyTime deadline) { return send(c, deadline); },
        std::forward<Parse>(parse), std::forward<ByPolicy>(byPolicy));
  }

  // `c` through the call protocol, reporting to `done` once (runAsync): `parse(Core*, reply)`,
  // `byPolicy(Core&, allowed)`.
  template <class Out, class Parse, class ByPolicy>
  void callAsync(const detail::LimiterCall::Params& params, Call c, Parse parse, ByPolicy byPolicy,
                 std::function<void(Out, std::exception_ptr)> done) {
    detail::OneKeyErrors errors{c.key, kKind};
    detail::runAsync<Out>(
        shared_from_this(), params,
        [c = std::move(c)](Core& self, SteadyTime deadline, detail::ReplyCallback sent) {
          self.sendAsync(c, deadline, std::move(sent));
        },
        std::move(errors), std::move(parse), std::move(byPolicy), std::move(done));
  }

  // The decision in a take or peek reply; `self` (null: the handle was dropped) remembers the
  // server's time and the Local policy's interval.
  static Decision parse(Core* self, const std::string& key, const detail::Reply& r, std::int64_t permits) {
    const detail::DecisionReply v = detail::parseDecisionReply(r, detail::DecisionForm::Packed, key);
    if (self != nullptr) self->saw(v);
    return detail::decisionOf(v, permits);
  }
  // The same for a reserve reply.
  static HeldPermits held(Core* self, const std::string& key, const detail::Reply& r, std::int64_t permits) {
    detail::DecisionReply v;
    HeldPermits out = detail::parseHeld(r, key, permits, v);
    if (self != nullptr) self->saw(v);
    return out;
  }
  void saw(const detail::DecisionReply& v) {
    sawServerNow(microseconds{v.nowUs});
    localIntervalMs_.store(v.localIntervalMs, std::memory_order_relaxed);
  }

  detail::LimiterCall::Params decision(std::int64_t permits) const {
    return detail::LimiterCall::decision(callBound_, permits, quota_.limit,
                                         milliseconds{localIntervalMs_.load(std::memory_order_relaxed)});
  }

  // A take is sent again after a closed connection: it may count twice, never grant twice.
  Decision take(const std::string& key, std::int64_t permits) {
    checkPermits(permits);
    return call(
        decision(permits), "decide", Call{key, "take", permits, {}, {}},
        [&](const detail::Reply& r) { return parse(this, key, r, permits); },
        [&](bool allowed) { return byPolicy(permits, allowed); });
  }

  Decision peek(const std::string& key, std::int64_t permits) {
    checkPermits(permits);
    return call(
        detail::LimiterCall::plain(callBound_), "peek", Call{key, "peek", permits, {}, {}},
        [&](const detail::Reply& r) { return parse(this, key, r, permits); }, [](bool) { return Decision{}; });
  }

  using DecisionDone = std::function<void(Decision, std::exception_ptr)>;

  // take() without waiting: `done` gets the decision (the failure policy's when Redis cannot be
  // asked) or the error, once, on the I/O thread (at once here when refused before sending).
  void takeAsync(const std::string& key, std::int64_t permits, DecisionDone done) {
    try {
      checkPermits(permits);
    } catch (...) {
      done(Decision{}, std::current_exception());
      return;
    }
    callAsync<Decision>(
        decision(permits), Call{key, "take", permits, {}, {}},
        [key, permits](Core* self, const detail::Reply& r) { return parse(self, key, r, permits); },
        [permits](Core& self, bool allowed) { return self.byPolicy(permits, allowed); }, std::move(done));
  }

  // A reserve of `permits` on `key` under the record of `id` (checked before anything is sent); a
  // decision, sent again after a closed connection (the record answers a resend: repeated).
  Call reserveCall(const std::string& key, std::int64_t permits, const std::string& id, milliseconds recordTtl) const {
    std::string recordKey = recordKeyOf(key, id);
    detail::checkReservationTtl(recordTtl);
    checkPermits(permits);
    return Call{key, "reserve", permits, std::move(recordKey), recordTtl};
  }

  HeldPermits reserveFor(const std::string& key, std::int64_t permits, const std::string& id, milliseconds recordTtl) {
    const Call c = reserveCall(key, permits, id, recordTtl);
    HeldPermits out = call(
        decision(permits), "reserveFor", c, [&](const detail::Reply& r) { return held(this, key, r, permits); },
        [&](bool allowed) { return heldByPolicy(permits, allowed); });
    detail::admitHeld(gate_.monitor(), out);
    return out;
  }

  void reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id, milliseconds recordTtl,
                       HeldCallback done) {
    // Isolated: a callback that throws is reported once and cannot make this one run again.
    done = detail::isolated(std::move(done), gate_.monitor(), name_);
    Call c;
    try {
      c = reserveCall(key, permits, id, recordTtl);
    } catch (...) {
      done(HeldPermits{}, std::current_exception());
      return;
    }
    callAsync<HeldPermits>(
        decision(permits), std::move(c),
        [key, permits](Core* self, const detail::Reply& r) { return held(self, key, r, permits); },
        [permits](Core& self, bool allowed) { return self.heldByPolicy(permits, allowed); },
        [monitor = gate_.monitor(), done = std::move(done)](HeldPermits out, std::exception_ptr error) {
          if (!error) detail::admitHeld(monitor, out);
          done(out, std::move(error));
        });
  }

  // A settle of the record of `id` on `key` with `actual` (checked before anything is sent). Not a
  // decision; sent again after a closed connection (a second answers AlreadySettled).
  Call settleCall(const std::string& key, const std::string& id, std::int64_t actual) const {
    std::string recordKey = recordKeyOf(key, id);
    detail::checkActualPermits(actual);
    return Call{key, "settle", actual, std::move(recordKey), {}};
  }

  Settlement settle(const std::string& key, const std::string& id, std::int64_t actual) {
    return call(
        detail::LimiterCall::plain(callBound_), "settle", settleCall(key, id, actual),
        [&](const detail::Reply& r) { return detail::parseSettlement(key, r, gate_.monitor()); },
        [](bool) { return Settlement{}; });
  }

  void settleAsync(const std::string& key, const std::string& id, std::int64_t actual, SettleCallback done) {
    done = detail::isolated(std::move(done), gate_.monitor(), name_);
    Call c;
    try {
      c = settleCall(key, id, actual);
    } catch (...) {
      done(Settlement{}, std::current_exception());
      return;
    }
    callAsync<Settlement>(
        detail::LimiterCall::plain(callBound_), std::move(c),
        [key, monitor = gate_.monitor()](Core*, const detail::Reply& r) {
          return detail::parseSettlement(key, r, monitor);
        },
        [](Core&, bool) { return Settlement{}; }, std::move(done));
  }

  // Gives `permits` back to the window in force on `key`, counted in the metrics. Never sent
  // again: a refund that went through and was sent again would give the permits back twice.
  // The record `id` of `key`: next to it (0.x), or in redlimit's namespace (a Limiter's).
  std::string recordKeyOf(const std::string& key, const std::string& id) const {
    return namespacedRecords_ ? detail::namespacedRecordKey(key, id) : detail::reservationRecordKey(key, id);
  }

  void refund(const std::string& key, std::int64_t permits) {
    if (permits < 0 || permits > kMaxPermits) {
      throw InvalidArgument(
          fmt::format("redlimit: limiter {}: permits to refund must be in 0..{}, got {}", name_, kMaxPermits, permits));
    }
    if (permits == 0) return;
    (void)call(
        detail::LimiterCall::plain(callBound_, detail::LimiterCall::Resend::Never), "refund",
        Call{key, "refund", permits, {}, {}},
        [&](const detail::Reply& r) {
          if (r.type != detail::Reply::Type::Array || r.elements.size() != 1) {
            throw UnexpectedReplyError(
                fmt::format("redlimit: limiter {}: expected an array of 1 from refund, got {}", key, r.describe()));
          }
          return r.elements[0].asInteger();
        },
        [](bool) { return std::int64_t{0}; });
    gate_.monitor().refunded(permits);
  }

  void checkPermits(std::int64_t permits) const {
    if (permits < 1 || permits > quota_.limit) {
      throw InvalidArgument(fmt::format("redlimit: limiter {}: permits must be in 1..{} (its limit), got {}", name_,
                                        quota_.limit, permits));
    }
  }

  Decision byPolicy(std::int64_t permits, bool allowed) const {
    Decision d;
    d.allowed = allowed;
    d.permits = permits;
    d.limit = quota_.limit;
    d.byPolicy = true;
    return d;
  }
  HeldPermits heldByPolicy(std::int64_t permits, bool allowed) const {
    HeldPermits out;
    out.decision = byPolicy(permits, allowed);
    return out;
  }

  std::shared_ptr<Client> client_;
  std::string name_;
  CalendarQuota quota_;
  const date::time_zone* zone_;
  std::string keepAlive_;           // ms, as sent
  bool namespacedRecords_ = false;  // a Limiter's (recordKeyOf)
  detail::FailureGate gate_;
  milliseconds callBound_{0};
  std::atomic<std::int64_t> offsetUs_{0};                // server time - this host's, as last seen
  std::atomic<std::int64_t> localIntervalMs_{86400000};  // the Local policy's interval: the last window's length
};

CalendarRateLimiter::CalendarRateLimiter(std::shared_ptr<Client> client, std::string name, CalendarQuota quota,
                                         CalendarRateLimiterOptions options) {
  if (!client) throw InvalidArgument("redlimit: a limiter needs a Client");
  detail::checkLimiterName(name, kMaxNameLength);
  validateQuota(quota);
  if (options.keepAlive.count() < 0 || options.keepAlive.count() > 4294967295) {
    throw InvalidArgument(
        fmt::format("redlimit: keepAlive must be in 0..4294967295 ms, got {} ms", options.keepAlive.count()));
  }
  const date::time_zone* zone = zoneOf(quota.zone);
  LimiterMonitor monitor(name, options.monitor, client->options().onEvent);
  core_ = std::make_shared<Core>(std::move(client), std::move(name), std::move(quota), std::move(options), zone,
                                 std::move(monitor));
}

void CalendarRateLimiter::validateQuota(const CalendarQuota& quota) {
  checkQuota(quota);
  (void)zoneOf(quota.zone);
}

Decision CalendarRateLimiter::decide(std::int64_t permits) { return decideOn(core_->name_, permits); }

Decision CalendarRateLimiter::decideOn(const std::string& key, std::int64_t permits) {
  Decision d = core_->take(key, permits);
  monitor().admit(d);
  return d;
}

bool CalendarRateLimiter::tryAcquire(std::int64_t permits) { return decide(permits).allowed; }

void CalendarRateLimiter::decideAsync(std::int64_t permits, DecisionCallback done) {
  decideOnAsync(core_->name_, permits, std::move(done));
}

std::future<Decision> CalendarRateLimiter::decideAsync(std::int64_t permits) {
  return detail::futureOf<Decision>([&](auto done) { decideAsync(permits, DecisionCallback(std::move(done))); });
}

void CalendarRateLimiter::decideOnAsync(const std::string& key, std::int64_t permits, DecisionCallback done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  done = detail::isolated(std::move(done), monitor(), core_->name_);
  core_->takeAsync(key, permits, [monitor = monitor(), done](Decision d, const std::exception_ptr& error) {
    if (!error) monitor.admit(d);
    done(d, error);
  });
}

Decision CalendarRateLimiter::peek(std::int64_t permits) { return peekOn(core_->name_, permits); }

Decision CalendarRateLimiter::peekOn(const std::string& key, std::int64_t permits) { return core_->peek(key, permits); }

HeldPermits CalendarRateLimiter::reserveFor(std::int64_t permits, const std::string& id, milliseconds recordTtl) {
  return reserveForOn(core_->name_, permits, id, recordTtl);
}

HeldPermits CalendarRateLimiter::reserveForOn(const std::string& key, std::int64_t permits, const std::string& id,
                                              milliseconds recordTtl) {
  return core_->reserveFor(key, permits, id, recordTtl);
}

void CalendarRateLimiter::reserveForAsync(std::int64_t permits, const std::string& id, milliseconds recordTtl,
                                          HeldCallback done) {
  reserveForOnAsync(core_->name_, permits, id, recordTtl, std::move(done));
}

void CalendarRateLimiter::reserveForAsync(std::int64_t permits, const std::string& id, HeldCallback done) {
  reserveForAsync(permits, id, kDefaultReservationTtl, std::move(done));
}

std::future<HeldPermits> CalendarRateLimiter::reserveForAsync(std::int64_t permits, const std::string& id,
                                                              milliseconds recordTtl) {
  return detail::futureOf<HeldPermits>(
      [&](auto done) { reserveForAsync(permits, id, recordTtl, HeldCallback(std::move(done))); });
}

void CalendarRateLimiter::reserveForOnAsync(const std::string& key, std::int64_t permits, const std::string& id,
                                            milliseconds recordTtl, HeldCallback done) {
  core_->reserveForAsync(key, permits, id, recordTtl, std::move(done));
}

Settlement CalendarRateLimiter::settle(const std::string& id, std::int64_t actual) {
  return settleOn(core_->name_, id, actual);
}

Settlement CalendarRateLimiter::settleOn(const std::string& key, const std::string& id, std::int64_t actual) {
  return core_->settle(key, id, actual);
}

Settlement CalendarRateLimiter::cancel(const std::string& id) { return settle(id, 0); }

void CalendarRateLimiter::settleAsync(const std::string& id, std::int64_t actual, SettleCallback done) {
  settleOnAsync(core_->name_, id, actual, std::move(done));
}

std::future<Settlement> CalendarRateLimiter::settleAsync(const std::string& id, std::int64_t actual) {
  return detail::futureOf<Settlement>([&](auto done) { settleAsync(id, actual, SettleCallback(std::move(done))); });
}

void CalendarRateLimiter::settleOnAsync(const std::string& key, const std::string& id, std::int64_t actual,
                                        SettleCallback done) {
  core_->settleAsync(key, id, actual, std::move(done));
}

void CalendarRateLimiter::refund(std::int64_t permits) { refundOn(core_->name_, permits); }

void CalendarRateLimiter::refundOn(const std::string& key, std::int64_t permits) { core_->refund(key, permits); }

void CalendarRateLimiter::useNamespacedRecords() noexcept { core_->namespacedRecords_ = true; }

std::string CalendarRateLimiter::recordKeyOn(const std::string& key, const std::string& id) const {
  return core_->recordKeyOf(key, id);
}

std::string CalendarRateLimiter::reservationKey(const std::string& id) const {
  return detail::reservationRecordKey(core_->name_, id);
}

CalendarWindow CalendarRateLimiter::windowAt(microseconds at) const {
  return windowsIn(core_->quota_, *core_->zone_, at, 0, 0).front();
}

bool CalendarRateLimiter::deleteLimiter() { return deleteOn(core_->name_); }

bool CalendarRateLimiter::deleteOn(const std::string& key) {
  return detail::command(*core_->client_, {"DEL", key}).asInteger() > 0;
}

bool CalendarRateLimiter::isExists() {
  return detail::command(*core_->client_, {"EXISTS", core_->name_}).asInteger() == 1;
}

const std::string& CalendarRateLimiter::getName() const noexcept { return core_->name_; }

const CalendarQuota& CalendarRateLimiter::quota() const noexcept { return core_->quota_; }
const std::shared_ptr<Client>& CalendarRateLimiter::client() const noexcept { return core_->client_; }

FailureStats CalendarRateLimiter::failureStats() const { return core_->gate_.stats(); }

const LimiterMonitor& CalendarRateLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
