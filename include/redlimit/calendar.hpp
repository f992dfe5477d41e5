// redlimit — the calendar of a calendar quota (Policy::calendar): its unit, the first day of its
// week, and one window of it.
#pragma once

#include <chrono>
#include <cstdint>

namespace redlimit {

/// The calendar window a quota counts in.
enum class CalendarUnit {
  Day,    // local midnight to local midnight: 23 or 25 hours on a DST change
  Week,   // seven local days from the quota's weekStart
  Month,  // the first of the month to the first of the next, local midnight
};

/// A day of the week, numbered as C's tm_wday (Sunday 0).
enum class Weekday { Sunday = 0, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday };

/// One window of a calendar quota: its calendar label and its bounds (Policy::windowAt).
struct CalendarWindow {
  std::int64_t label = 0;              // days: local days since 1970-01-01; weeks: that of their first
                                       // day; months: year x 12 + month - 1
  std::chrono::microseconds start{0};  // the first instant in the window, since the epoch (UTC)
  std::chrono::microseconds end{0};    // the first instant after it, since the epoch (UTC)
};

}  // namespace redlimit
