// redlimit — a calendar quota as its scripts take it (lua/lib/calendar_core.lua): its checks, its
// arguments, and the tables of windows a script call carries. Lua has no time zone database, so a
// call sends each calendar quota's windows around the client's idea of the server's now;
// ScriptRequest (script_call.hpp) fills them in every try and, when the server's now is outside a
// table (the reply is that now as a bare integer, nothing written), sends once more with the tables
// around it. ScriptCore (a Limiter's one quota, lua/calendar_quota.lua) and MultiLimit (a quota
// among other limits, lua/multi.lua) share this.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "redlimit/calendar.hpp"
#include "redlimit/errors.hpp"

namespace date {
class time_zone;
}  // namespace date

namespace redlimit::detail {

/// A calendar quota's parameters, as Policy::calendar takes them.
struct CalendarQuota {
  std::int64_t limit = 0;                 // permits per window, 1..kMaxPermits
  CalendarUnit unit = CalendarUnit::Day;  // the window
  std::string zone = "UTC";               // an IANA zone name of the system's database
  Weekday weekStart = Weekday::Monday;    // CalendarUnit::Week: the first day of a week
};

/// Throws InvalidArgument unless `quota` is usable: limit in 1..kMaxPermits, a known unit,
/// weekStart in Sunday..Saturday, a zone the system's database has.
void checkCalendarQuota(const CalendarQuota& quota);

/// `before` windows before the one holding `at` (µs since the epoch), that one, and `after` after
/// it, consecutive, from the system's time zone database (Policy::windowAt says how a day starts).
/// Throws InvalidArgument for a bad quota, `before` or `after` outside 0..3, or `at` before 1970.
[[nodiscard]] std::vector<CalendarWindow> calendarWindows(const CalendarQuota& quota, std::chrono::microseconds at,
                                                          int before, int after);

/// The configuration multi.lua takes for a calendar limit ahead of its table (lua/lib/calendar_core.lua's
/// calendarWithConfig): 'Q', the unit, the limit and `keepAlive` ms (uint32s, little-endian). Throws
/// InvalidArgument for a bad quota or keepAlive (0..2^32-1 ms).
[[nodiscard]] std::string calendarConfig(const CalendarQuota& quota, std::chrono::milliseconds keepAlive);

/// The arguments lua/calendar_quota.lua takes after the count (ARGV[5..8]): the limit, the unit
/// ('D', 'W', 'M'), `keepAlive` ms and, empty, the place of the table (CalendarTables fills it in
/// every try). Throws InvalidArgument for a bad quota or keepAlive (0..2^32-1 ms).
[[nodiscard]] std::vector<std::string> calendarArgs(const CalendarQuota& quota, std::chrono::milliseconds keepAlive);

/// The calendar tables of one owner's script calls, and its guess of the server's time. Thread-safe
/// once made (add() is for the owner's constructor only).
class CalendarTables {
 public:
  /// `owner` names the caller in messages ("limiter x", "MultiLimit(a + b)").
  explicit CalendarTables(std::string owner) : owner_(std::move(owner)) {}

  /// The quota's table goes in argv[index] of every call, after `prefix`. Throws InvalidArgument
  /// for a bad quota (its zone is looked up here, once).
  void add(std::size_t index, const CalendarQuota& quota, std::string prefix);
  /// `argv` with every table around `serverNow` (µs since the epoch). Throws InvalidArgument for
  /// an argv too short for a table, or a time before 1970.
  [[nodiscard]] std::vector<std::string> filled(std::vector<std::string> argv,
                                                std::chrono::microseconds serverNow) const;
  /// The server's time as this host guesses it: its own clock plus the offset last seen.
  [[nodiscard]] std::chrono::microseconds serverNowGuess() const;
  /// Remembers the server's time `serverNow` (from a reply) against this host's clock.
  void sawServerNow(std::chrono::microseconds serverNow) const;
  /// The error of a call whose server time was outside its tables twice.
  [[nodiscard]] ReplyError outsideTwice() const;

 private:
  struct Slot {
    std::size_t index;
    CalendarQuota quota;
    const date::time_zone* zone;
    std::string prefix;
  };
  std::string owner_;
  std::vector<Slot> slots_;
  mutable std::atomic<std::int64_t> offsetUs_{0};  // server time - this host's, as last seen
};

}  // namespace redlimit::detail
