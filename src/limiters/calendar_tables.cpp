#include "limiters/calendar_tables.hpp"

#include <exception>
#include <initializer_list>
#include <utility>

#include <date/date.h>
#include <date/tz.h>
#include <fmt/format.h>

#include "base/wall_clock.hpp"
#include "config/config_checks.hpp"
#include "limiters/keyed_policy.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

constexpr int kBefore = 1;  // windows sent before the current one
constexpr int kAfter = 2;   // and after it

// The unit as the scripts take it: 'D', 'W', 'M' (CalendarUnit's order), '?' for another value.
char unitCode(CalendarUnit u) {
  const auto i = static_cast<unsigned>(u);
  return i < 3 ? "DWM"[i] : '?';
}

// The checks of checkCalendarQuota, returning the zone they looked up.
const date::time_zone* checkedZone(const CalendarQuota& q) {
  checkCount("a calendar quota's limit", q.limit, 1, kMaxPermits);
  if (unitCode(q.unit) == '?') {
    throw InvalidArgument(fmt::format("redlimit: unknown calendar unit {}", static_cast<int>(q.unit)));
  }
  const int ws = static_cast<int>(q.weekStart);
  if (ws < 0 || ws > 6) {
    throw InvalidArgument(fmt::format("redlimit: a week must start on Sunday (0) .. Saturday (6), got {}", ws));
  }
  if (q.zone.empty()) throw InvalidArgument("redlimit: a calendar quota needs a time zone name");
  try {
    return date::locate_zone(q.zone);
  } catch (const std::exception& e) {
    throw InvalidArgument(
        fmt::format("redlimit: unknown time zone \"{}\" (not in the system's database: {})", q.zone, e.what()));
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
    out.push_back(CalendarWindow{labelOf(q, first), startOf(zone, first), startOf(zone, windowDay(q, first, 1))});
  }
  return out;
}

std::string packTable(const std::vector<CalendarWindow>& windows) {
  std::string out;
  out.reserve(windows.size() * 24);
  for (const CalendarWindow& w : windows) {
    for (const std::int64_t v : {w.label, w.start.count(), w.end.count()}) packLe(out, v, 8);  // '<i8i8i8'
  }
  return out;
}

void checkQuotaAndKeepAlive(const CalendarQuota& quota, milliseconds keepAlive) {
  (void)checkedZone(quota);
  checkMillis("keepAlive", keepAlive, 0);  // kMaxInterval: what a uint32 holds
}

}  // namespace

void checkCalendarQuota(const CalendarQuota& quota) { (void)checkedZone(quota); }

std::string calendarConfig(const CalendarQuota& quota, milliseconds keepAlive) {
  checkQuotaAndKeepAlive(quota, keepAlive);
  std::string out{'Q', unitCode(quota.unit)};
  for (const std::int64_t v : {quota.limit, keepAlive.count()}) packLe(out, v, 4);
  return out;
}

std::vector<std::string> calendarArgs(const CalendarQuota& quota, milliseconds keepAlive) {
  checkQuotaAndKeepAlive(quota, keepAlive);
  return {fmt::to_string(quota.limit), std::string(1, unitCode(quota.unit)), fmt::to_string(keepAlive.count()), {}};
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

}  // namespace redlimit::detail
