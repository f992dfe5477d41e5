#include "redlimit/calendar_rate_limiter.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string_view>

#include <date/date.h>
#include <date/tz.h>
#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/future_of.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/detail/keyed_script_limiter.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Steady = std::chrono::steady_clock;

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

  // The script's answer for `op` (take or peek) on `key` (this limiter's name, or a key of the
  // keyed family): a table around the server's time as last seen, and once more around the time
  // the server answered when that was outside it.
  detail::DecisionReply run(const std::string& key, std::string_view op, std::int64_t permits) {
    const std::string n = fmt::to_string(permits);
    const std::string limit = fmt::to_string(quota_.limit);
    const std::string unit(1, unitCode(quota_.unit));
    const std::string kind(1, kKind);
    const microseconds sentAt = systemNow();
    microseconds around = sentAt + microseconds{offsetUs_.load(std::memory_order_relaxed)};
    for (int tries = 0; tries < 2; ++tries) {
      const std::string table = packTable(windowsIn(quota_, *zone_, around, kBefore, kAfter));
      const std::vector<std::string_view> args{op, "", kind, n, limit, unit, keepAlive_, table};
      const std::vector<std::string_view> keys{key};
      detail::Reply r;
      try {
        r = detail::ClientAccess::eval(*client_, kCalendar, keys, args,
                                       detail::deadlineAfter<Steady>(Steady::now(), callBound_));
      } catch (const ScriptError&) {
        std::rethrow_exception(detail::oneKeyScriptError(std::current_exception(), key, kKind));
      }
      if (r.type == detail::Reply::Type::Integer) {  // the server's now, outside the table
        around = microseconds{r.integer};
        offsetUs_.store((around - sentAt).count(), std::memory_order_relaxed);
        continue;
      }
      detail::DecisionReply v = detail::parseDecisionReply(r, detail::DecisionForm::Packed, key);
      offsetUs_.store(v.nowUs - sentAt.count(), std::memory_order_relaxed);
      localIntervalMs_.store(v.localIntervalMs, std::memory_order_relaxed);
      return v;
    }
    throw UnexpectedReplyError(
        fmt::format("redlimit: limiter {}: the server's time was outside the calendar table twice", key));
  }

  Decision take(const std::string& key, std::int64_t permits) {
    checkPermits(permits);
    const milliseconds interval{localIntervalMs_.load(std::memory_order_relaxed)};
    if (!gate_.shouldTry()) {
      if (auto d = gate_.decide(permits, quota_.limit, interval)) return byPolicy(permits, *d);
      gate_.throwUnavailable();
    }
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    try {
      Decision d = detail::decisionOf(run(key, "take", permits), permits);
      gate_.answered(started);
      return d;
    } catch (const Error&) {
      if (auto d = gate_.settle(std::current_exception(), started, permits, quota_.limit, interval)) {
        return byPolicy(permits, *d);
      }
      throw;
    }
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
    const milliseconds interval{localIntervalMs_.load(std::memory_order_relaxed)};
    if (gate_.answerWithoutRedis(
            permits, quota_.limit, interval, [&](bool allowed) { done(byPolicy(permits, allowed), nullptr); },
            [&](const std::exception_ptr& e) { done(Decision{}, e); })) {
      return;
    }
    const std::int64_t started = gate_.callStart();
    gate_.monitor().roundTrip();
    const microseconds sentAt = systemNow();
    sendTake(key, permits, sentAt, sentAt + microseconds{offsetUs_.load(std::memory_order_relaxed)}, 0, started,
             std::move(done));
  }

  // One try of takeAsync, with a table around `around`; the second try is around the time the
  // server answered with when the first table did not hold it (as run()). Never resent on a closed
  // connection: a take sent twice would count twice.
  void sendTake(const std::string& key, std::int64_t permits, microseconds sentAt, microseconds around, int tries,
                std::int64_t started, DecisionDone done) {
    std::string table;
    try {
      table = packTable(windowsIn(quota_, *zone_, around, kBefore, kAfter));
    } catch (...) {
      failTake(permits, started, std::current_exception(), done);
      return;
    }
    const std::string n = fmt::to_string(permits), limit = fmt::to_string(quota_.limit);
    const std::string unit(1, unitCode(quota_.unit)), kind(1, kKind);
    const std::vector<std::string_view> args{"take", "", kind, n, limit, unit, keepAlive_, table};
    const std::vector<std::string_view> keys{key};
    // The completion holds the handle weakly: a request in flight must not keep a dropped limiter
    // (and through it the Client and its I/O thread) alive.
    detail::ClientAccess::evalAsync(
        *client_, kCalendar, keys, args,
        [weak = weak_from_this(), key, permits, sentAt, tries, started, done = std::move(done)](
            const detail::Reply& r, std::exception_ptr error) mutable {
          const std::shared_ptr<Core> self = weak.lock();  // null: the handle was dropped meanwhile
          const auto fail = [&](const std::exception_ptr& e) {
            if (self) {
              self->failTake(permits, started, e, done);
            } else {
              done(Decision{}, e);
            }
          };
          if (error) {
            fail(detail::oneKeyScriptError(std::move(error), key, kKind));
            return;
          }
          try {
            if (r.type == detail::Reply::Type::Integer) {  // the server's now, outside the table
              if (tries > 0) {
                throw UnexpectedReplyError(
                    fmt::format("redlimit: limiter {}: the server's time was outside the calendar table twice", key));
              }
              if (!self) throw ClosedError("redlimit: limiter " + key + ": the handle was dropped before its reply");
              const microseconds serverNow{r.integer};
              self->offsetUs_.store((serverNow - sentAt).count(), std::memory_order_relaxed);
              self->sendTake(key, permits, sentAt, serverNow, tries + 1, started, std::move(done));
              return;
            }
            const detail::DecisionReply v = detail::parseDecisionReply(r, detail::DecisionForm::Packed, key);
            const Decision d = detail::decisionOf(v, permits);
            if (self) {
              self->offsetUs_.store(v.nowUs - sentAt.count(), std::memory_order_relaxed);
              self->localIntervalMs_.store(v.localIntervalMs, std::memory_order_relaxed);
              self->gate_.answered(started);
            }
            done(d, nullptr);
          } catch (...) {
            fail(std::current_exception());
          }
        },
        detail::deadlineAfter<Steady>(Steady::now(), callBound_));
  }

  // A take that ended with `error`: the failure policy decides, or `done` gets the error.
  void failTake(std::int64_t permits, std::int64_t started, const std::exception_ptr& error, const DecisionDone& done) {
    const milliseconds interval{localIntervalMs_.load(std::memory_order_relaxed)};
    if (auto d = gate_.settle(error, started, permits, quota_.limit, interval)) {
      done(byPolicy(permits, *d), nullptr);
      return;
    }
    done(Decision{}, error);
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

  std::shared_ptr<Client> client_;
  std::string name_;
  CalendarQuota quota_;
  const date::time_zone* zone_;
  std::string keepAlive_;  // ms, as sent
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

Decision CalendarRateLimiter::peekOn(const std::string& key, std::int64_t permits) {
  core_->checkPermits(permits);
  return detail::decisionOf(core_->run(key, "peek", permits), permits);
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

FailureStats CalendarRateLimiter::failureStats() const { return core_->gate_.stats(); }

const LimiterMonitor& CalendarRateLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
