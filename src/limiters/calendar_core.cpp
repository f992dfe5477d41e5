#include "limiters/calendar_core.hpp"

#include <exception>
#include <string_view>
#include <utility>

#include <date/date.h>
#include <date/tz.h>
#include <fmt/format.h>

#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

const Script kCalendar{lua::calendar_quota.name, lua::calendar_quota.sha1, lua::calendar_quota.source};

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

// The checks of checkCalendarQuota but the zone's; its zone, looked up.
const date::time_zone* checkedZone(const CalendarQuota& q) {
  if (q.limit < 1 || q.limit > kMaxCalendarPermits) {
    throw InvalidArgument(
        fmt::format("redlimit: a calendar quota's limit must be in 1..{}, got {}", kMaxCalendarPermits, q.limit));
  }
  if (unitCode(q.unit) == '?') {
    throw InvalidArgument(fmt::format("redlimit: unknown calendar unit {}", static_cast<int>(q.unit)));
  }
  const int ws = static_cast<int>(q.weekStart);
  if (ws < 0 || ws > 6) {
    throw InvalidArgument(fmt::format("redlimit: a week must start on Sunday (0) .. Saturday (6), got {}", ws));
  }
  return zoneOf(q.zone);
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

std::string checkedKeepAlive(milliseconds keepAlive) {
  if (keepAlive.count() < 0 || keepAlive.count() > 4294967295) {
    throw InvalidArgument(fmt::format("redlimit: keepAlive must be in 0..4294967295 ms, got {} ms", keepAlive.count()));
  }
  return fmt::to_string(keepAlive.count());
}

}  // namespace

void checkCalendarQuota(const CalendarQuota& quota) { (void)checkedZone(quota); }

std::string calendarConfig(const CalendarQuota& quota, milliseconds keepAlive) {
  (void)checkedZone(quota);
  (void)checkedKeepAlive(keepAlive);
  std::string out{kKind, unitCode(quota.unit)};
  packU32(out, quota.limit);
  packU32(out, keepAlive.count());
  return out;
}

void CalendarTables::add(std::size_t index, const CalendarQuota& quota, std::string prefix) {
  slots_.push_back(Slot{index, quota, checkedZone(quota), std::move(prefix)});
}

std::vector<std::string> CalendarTables::filled(std::vector<std::string> argv, microseconds serverNow) const {
  if (serverNow.count() < 0) {
    throw InvalidArgument(
        fmt::format("redlimit: {}: the server's time {} µs is before 1970", owner_, serverNow.count()));
  }
  for (const Slot& s : slots_) {
    if (s.index >= argv.size()) {
      throw InvalidArgument(fmt::format("redlimit: {}: no argument {} for a calendar table", owner_, s.index));
    }
    argv[s.index] = s.prefix + packTable(windowsIn(s.quota, *s.zone, serverNow, kBefore, kAfter));
  }
  return argv;
}

microseconds CalendarTables::serverNowGuess() const {
  return systemNow() + microseconds{offsetUs_.load(std::memory_order_relaxed)};
}

void CalendarTables::sawServerNow(microseconds serverNow) const {
  offsetUs_.store((serverNow - systemNow()).count(), std::memory_order_relaxed);
}

ReplyError CalendarTables::outsideTwice() const {
  return ReplyError(ErrorKind::UnexpectedReply, "",
                    fmt::format("redlimit: {}: the server's time was outside the calendar table twice", owner_));
}

std::vector<CalendarWindow> calendarWindows(const CalendarQuota& quota, microseconds at, int before, int after) {
  const date::time_zone* zone = checkedZone(quota);
  if (before < 0 || before > 3 || after < 0 || after > 3) {
    throw InvalidArgument(
        fmt::format("redlimit: calendar windows: before and after must be in 0..3, got {} and {}", before, after));
  }
  if (at.count() < 0) {
    throw InvalidArgument(
        fmt::format("redlimit: calendar windows: {} µs is before 1970; pass a time since the epoch", at.count()));
  }
  return windowsIn(quota, *zone, at, before, after);
}

CalendarCore::CalendarCore(std::shared_ptr<Client> client, std::string name, CalendarQuota quota,
                           milliseconds keepAlive, FailureOptions failure, const LimiterMonitor::Options& monitor)
    : client_(std::move(client)),
      name_(std::move(name)),
      quota_(std::move(quota)),
      gate_(name_, std::move(failure), ClockView{}, checkedMonitor(client_, name_, monitor)),
      tables_(std::make_shared<CalendarTables>("limiter " + name_)),
      keepAlive_(checkedKeepAlive(keepAlive)) {
  tables_->add(7, quota_, {});  // ARGV[8]
  const ClientOptions& o = client_->options();
  callBound_ = saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
}

ScriptRequest CalendarCore::request(const Call& c) const {
  std::vector<std::string> argv{c.op,
                                "",
                                std::string(1, kKind),
                                fmt::to_string(c.count),
                                fmt::to_string(quota_.limit),
                                std::string(1, unitCode(quota_.unit)),
                                keepAlive_,
                                {}};  // the table, per try
  if (c.recordTtl.count() > 0) argv.push_back(fmt::to_string(c.recordTtl.count()));
  ScriptRequest r{&kCalendar, {c.key}, std::move(argv), nullptr, tables_};
  if (!c.recordKey.empty()) r.keys.push_back(c.recordKey);
  return r;
}

// `c` through the call protocol, waiting: `parse(reply)`, `byPolicy(allowed)` as runSync's.
template <class Parse, class ByPolicy>
auto CalendarCore::call(const LimiterCall::Params& params, std::string_view what, const Call& c, Parse&& parse,
                        ByPolicy&& byPolicy) {
  return runScript(*this, params, what, request(c), OneKeyErrors{c.key, kKind}, std::forward<Parse>(parse),
                   std::forward<ByPolicy>(byPolicy));
}

// `c` through the call protocol, reporting to `done` once (runScriptAsync): `parse(CalendarCore*,
// reply)`, `byPolicy(CalendarCore&, allowed)`.
template <class Out, class Parse, class ByPolicy>
void CalendarCore::callAsync(const LimiterCall::Params& params, const Call& c, Parse parse, ByPolicy byPolicy,
                             std::function<void(Out, std::exception_ptr)> done) {
  runScriptAsync<Out>(shared_from_this(), params, request(c), OneKeyErrors{c.key, kKind}, std::move(parse),
                      std::move(byPolicy), std::move(done));
}

Decision CalendarCore::parse(CalendarCore* self, const std::string& key, const Reply& r, std::int64_t permits) {
  const DecisionReply v = parseDecisionReply(r, DecisionForm::Packed, key);
  if (self != nullptr) self->saw(v);
  return decisionOf(v, permits);
}

Decision CalendarCore::held(CalendarCore* self, const std::string& key, const Reply& r, std::int64_t permits) {
  DecisionReply v;
  Decision out = parseHeld(r, key, permits, v);
  if (self != nullptr) self->saw(v);
  return out;
}

void CalendarCore::saw(const DecisionReply& v) {
  tables_->sawServerNow(microseconds{v.nowUs});
  localIntervalMs_.store(v.localIntervalMs, std::memory_order_relaxed);
}

LimiterCall::Params CalendarCore::decision(std::int64_t permits) const {
  return LimiterCall::decision(callBound_, permits, quota_.limit,
                               milliseconds{localIntervalMs_.load(std::memory_order_relaxed)});
}

Decision CalendarCore::decide(const std::string& key, std::int64_t permits) {
  checkPermits(permits);
  Decision d = call(
      decision(permits), "decide", Call{key, "take", permits, {}, {}},
      [&](const Reply& r) { return parse(this, key, r, permits); },
      [&](bool allowed) { return byPolicy(permits, allowed); });
  gate_.monitor().admit(d);
  return d;
}

void CalendarCore::decideAsync(const std::string& key, std::int64_t permits, DecisionDone done) {
  // Isolated: a callback that throws is reported once and cannot make this one run again.
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { checkPermits(permits); })) return;
  callAsync<Decision>(
      decision(permits), Call{key, "take", permits, {}, {}},
      [key, permits](CalendarCore* self, const Reply& r) { return parse(self, key, r, permits); },
      [permits](CalendarCore& self, bool allowed) { return self.byPolicy(permits, allowed); },
      [monitor = gate_.monitor(), done = std::move(done)](Decision d, std::exception_ptr error) {
        if (!error) monitor.admit(d);
        done(d, std::move(error));
      });
}

Decision CalendarCore::peek(const std::string& key, std::int64_t permits) {
  checkPermits(permits);
  return call(
      LimiterCall::plain(callBound_), "peek", Call{key, "peek", permits, {}, {}},
      [&](const Reply& r) { return parse(this, key, r, permits); }, [](bool) { return Decision{}; });
}

void CalendarCore::peekAsync(const std::string& key, std::int64_t permits, DecisionDone done) {
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { checkPermits(permits); })) return;
  callAsync<Decision>(
      LimiterCall::plain(callBound_), Call{key, "peek", permits, {}, {}},
      [key, permits](CalendarCore* self, const Reply& r) { return parse(self, key, r, permits); },
      [](CalendarCore&, bool) { return Decision{}; }, std::move(done));
}

CalendarCore::Call CalendarCore::reserveCall(const std::string& key, std::int64_t permits, const std::string& id,
                                             milliseconds recordTtl) const {
  std::string record = recordKey(key, id);
  checkReservationTtl(recordTtl);
  checkPermits(permits);
  return Call{key, "reserve", permits, std::move(record), recordTtl};
}

Decision CalendarCore::reserveFor(const std::string& key, std::int64_t permits, const std::string& id,
                                  milliseconds recordTtl) {
  const Call c = reserveCall(key, permits, id, recordTtl);
  Decision out = call(
      decision(permits), "reserveFor", c, [&](const Reply& r) { return held(this, key, r, permits); },
      [&](bool allowed) { return byPolicy(permits, allowed); });
  admitHeld(gate_.monitor(), out);
  return out;
}

void CalendarCore::reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id,
                                   milliseconds recordTtl, DecisionDone done) {
  Call c;
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { c = reserveCall(key, permits, id, recordTtl); })) return;
  callAsync<Decision>(
      decision(permits), c, [key, permits](CalendarCore* self, const Reply& r) { return held(self, key, r, permits); },
      [permits](CalendarCore& self, bool allowed) { return self.byPolicy(permits, allowed); },
      [monitor = gate_.monitor(), done = std::move(done)](Decision out, std::exception_ptr error) {
        if (!error) admitHeld(monitor, out);
        done(out, std::move(error));
      });
}

// Not a decision; sent again after a closed connection (a second answers AlreadySettled).
CalendarCore::Call CalendarCore::settleCall(const std::string& key, const std::string& id, std::int64_t actual) const {
  std::string record = recordKey(key, id);
  checkActualPermits(actual);
  return Call{key, "settle", actual, std::move(record), {}};
}

Settlement CalendarCore::settle(const std::string& key, const std::string& id, std::int64_t actual) {
  return call(
      LimiterCall::plain(callBound_), "settle", settleCall(key, id, actual),
      [&](const Reply& r) { return parseSettlement(key, r, gate_.monitor()); }, [](bool) { return Settlement{}; });
}

void CalendarCore::settleAsync(const std::string& key, const std::string& id, std::int64_t actual, SettleDone done) {
  Call c;
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { c = settleCall(key, id, actual); })) return;
  callAsync<Settlement>(
      LimiterCall::plain(callBound_), c,
      [key, monitor = gate_.monitor()](CalendarCore*, const Reply& r) { return parseSettlement(key, r, monitor); },
      [](CalendarCore&, bool) { return Settlement{}; }, std::move(done));
}

void CalendarCore::checkRefund(std::int64_t permits) const {
  if (permits < 0 || permits > kMaxCalendarPermits) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: permits to refund must be in 0..{}, got {}", name_,
                                      kMaxCalendarPermits, permits));
  }
}

std::int64_t CalendarCore::parseRefund(const std::string& key, const Reply& r) {
  if (r.type != Reply::Type::Array || r.elements.size() != 1) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: limiter {}: expected an array of 1 from refund, got {}", key, r.describe()));
  }
  return r.elements[0].asInteger();
}

// Never resent: a refund that went through and was sent again would give the permits back twice.
void CalendarCore::refund(const std::string& key, std::int64_t permits) {
  checkRefund(permits);
  if (permits == 0) return;
  (void)call(
      LimiterCall::plain(callBound_, LimiterCall::Resend::Never), "refund", Call{key, "refund", permits, {}, {}},
      [&](const Reply& r) { return parseRefund(key, r); }, [](bool) { return std::int64_t{0}; });
  gate_.monitor().refunded(permits);
}

void CalendarCore::refundAsync(const std::string& key, std::int64_t permits, Done<bool> done) {
  if (!isolateThenCheck(done, gate_.monitor(), name_, [&] { checkRefund(permits); })) return;
  if (permits == 0) {
    done(true, nullptr);
    return;
  }
  callAsync<bool>(
      LimiterCall::plain(callBound_, LimiterCall::Resend::Never), Call{key, "refund", permits, {}, {}},
      [key](CalendarCore*, const Reply& r) { return parseRefund(key, r) >= 0; },
      [](CalendarCore&, bool) { return false; },
      [monitor = gate_.monitor(), permits, done = std::move(done)](bool, std::exception_ptr e) {
        const bool given = !e;
        if (given) monitor.refunded(permits);
        done(given, std::move(e));
      });
}

bool CalendarCore::deleteKey(const std::string& key) { return redlimit::detail::deleteKey(*this, key); }

void CalendarCore::deleteKeyAsync(const std::string& key, Done<bool> done) {
  redlimit::detail::deleteKeyAsync(shared_from_this(), key, isolated(std::move(done), gate_.monitor(), name_));
}

bool CalendarCore::exists(const std::string& key) { return keyExists(*this, key); }

void CalendarCore::existsAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) {
  keyExistsAsync(shared_from_this(), key, isolated(std::move(done), gate_.monitor(), name_));
}

std::string CalendarCore::recordKey(const std::string& key, const std::string& id) const {
  return namespacedRecordKey(key, id);
}

void CalendarCore::checkPermits(std::int64_t permits) const {
  if (permits < 1 || permits > quota_.limit) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: permits must be in 1..{} (its limit), got {}", name_,
                                      quota_.limit, permits));
  }
}

Decision CalendarCore::byPolicy(std::int64_t permits, bool allowed) const {
  Decision d;
  d.allowed = allowed;
  d.permits = permits;
  d.limit = quota_.limit;
  d.byPolicy = true;
  return d;
}

}  // namespace redlimit::detail
