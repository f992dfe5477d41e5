// Policy::windowAt and the table of windows a calendar limiter sends (detail::calendarWindows),
// from the system's time zone database, without Redis: the time is passed in. The expected instants
// were computed independently (Python's zoneinfo over the same tzdata).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "limiters/calendar_tables.hpp"
#include "redlimit/calendar.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/policy.hpp"

using namespace redlimit;
using std::chrono::hours;
using std::chrono::microseconds;

namespace {

constexpr std::int64_t kUsPerHour = 3600000000;

Policy quota(CalendarUnit unit, const char* zone, Weekday weekStart = Weekday::Monday) {
  return Policy::calendar(1000, unit, zone, weekStart);
}

// The window holding `at`.
CalendarWindow at(const Policy& q, std::int64_t us) { return q.windowAt(microseconds{us}); }

// The table of `before` windows before the one holding `at` and `after` after it, as sent.
std::vector<CalendarWindow> tableAround(CalendarUnit unit, const char* zone, std::int64_t us, int before, int after) {
  detail::CalendarQuota q;
  q.limit = 1000;
  q.unit = unit;
  q.zone = zone;
  return detail::calendarWindows(q, microseconds{us}, before, after);
}

}  // namespace

TEST(PolicyWindowAt, BerlinSpringForwardDayIs23HoursAndFallBackDayIs25) {
  const Policy q = quota(CalendarUnit::Day, "Europe/Berlin");
  // 2026-03-29: 00:00 CET = 2026-03-28T23:00Z to 00:00 CEST = 2026-03-29T22:00Z.
  const CalendarWindow spring = at(q, 1774738800000000 + 12 * kUsPerHour);
  EXPECT_EQ(spring.label, 20541);  // days since 1970-01-01
  EXPECT_EQ(spring.start.count(), 1774738800000000);
  EXPECT_EQ(spring.end.count(), 1774821600000000);
  EXPECT_EQ(spring.end - spring.start, hours(23));
  // 2026-10-25: 00:00 CEST = 2026-10-24T22:00Z to 00:00 CET = 2026-10-25T23:00Z.
  const CalendarWindow autumn = at(q, 1792879200000000 + 24 * kUsPerHour);  // in the 25th hour
  EXPECT_EQ(autumn.label, 20751);
  EXPECT_EQ(autumn.start.count(), 1792879200000000);
  EXPECT_EQ(autumn.end.count(), 1792969200000000);
  EXPECT_EQ(autumn.end - autumn.start, hours(25));
  // The first and last microseconds of a day are in it; the next one is not.
  EXPECT_EQ(at(q, autumn.start.count()).label, 20751);
  EXPECT_EQ(at(q, autumn.end.count() - 1).label, 20751);
  EXPECT_EQ(at(q, autumn.end.count()).label, 20752);
}

TEST(PolicyWindowAt, ADayWhoseMidnightIsSkippedStartsAtTheEndOfTheGap) {
  // America/Santiago moves 2026-09-06 00:00 to 01:00: the day starts at 04:00Z and lasts 23 hours.
  const CalendarWindow w = at(quota(CalendarUnit::Day, "America/Santiago"), 1788696000000000);
  EXPECT_EQ(w.label, 20702);
  EXPECT_EQ(w.start.count(), 1788667200000000);
  EXPECT_EQ(w.end.count(), 1788750000000000);
}

TEST(PolicyWindowAt, MonthsFollowTheCalendarIncludingALeapFebruary) {
  const CalendarWindow feb = at(quota(CalendarUnit::Month, "Europe/Berlin"), 1832972400000000 + kUsPerHour * 24 * 10);
  EXPECT_EQ(feb.label, 2028 * 12 + 1);
  EXPECT_EQ(feb.start.count(), 1832972400000000);  // 2028-02-01 00:00 CET
  EXPECT_EQ(feb.end.count(), 1835478000000000);    // 2028-03-01 00:00 CET
  EXPECT_EQ(feb.end - feb.start, hours(29 * 24));
  // December to January: the label goes on counting months.
  const std::vector<CalendarWindow> t = tableAround(CalendarUnit::Month, "UTC", 1796212800000000, 1, 2);  // 2026-12-02
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[1].label, 2026 * 12 + 11);
  EXPECT_EQ(t[2].label, 2027 * 12 + 0);
  EXPECT_EQ(t[2].end - t[2].start, hours(31 * 24));
}

TEST(PolicyWindowAt, WeeksStartOnTheQuotasWeekday) {
  const std::int64_t wednesday = 1796212800000000;  // 2026-12-02T12:00Z, a Wednesday
  const CalendarWindow monday = at(quota(CalendarUnit::Week, "UTC", Weekday::Monday), wednesday);
  EXPECT_EQ(monday.label, 20787);  // 2026-11-30
  EXPECT_EQ(monday.start.count(), 20787LL * 24 * kUsPerHour);
  EXPECT_EQ(monday.end - monday.start, hours(7 * 24));
  const CalendarWindow sunday = at(quota(CalendarUnit::Week, "UTC", Weekday::Sunday), wednesday);
  EXPECT_EQ(sunday.label, 20786);  // 2026-11-29
  EXPECT_EQ(sunday.start.count(), 20786LL * 24 * kUsPerHour);
  // On the start day itself the week is that one.
  EXPECT_EQ(at(quota(CalendarUnit::Week, "UTC", Weekday::Wednesday), wednesday).label, 20789);
}

TEST(CalendarWindows, TheTableIsConsecutiveAroundNow) {
  const std::vector<CalendarWindow> t = tableAround(CalendarUnit::Day, "Europe/Berlin", 1792879200000000, 1, 2);
  ASSERT_EQ(t.size(), 4u);
  for (std::size_t i = 1; i < t.size(); ++i) {
    EXPECT_EQ(t[i].start, t[i - 1].end);
    EXPECT_EQ(t[i].label, t[i - 1].label + 1);
  }
  EXPECT_EQ(t[1].label, 20751);
}

TEST(PolicyWindowAt, BadQuotasBadTimesAndOtherPoliciesAreInvalidArguments) {
  EXPECT_THROW((void)quota(CalendarUnit::Day, "Europe/Atlantis"), InvalidArgument);
  EXPECT_THROW((void)quota(CalendarUnit::Day, ""), InvalidArgument);
  EXPECT_THROW((void)quota(CalendarUnit::Week, "UTC", static_cast<Weekday>(7)), InvalidArgument);
  EXPECT_THROW((void)quota(CalendarUnit::Week, "UTC", static_cast<Weekday>(-1)), InvalidArgument);
  EXPECT_THROW((void)quota(static_cast<CalendarUnit>(9), "UTC"), InvalidArgument);
  EXPECT_THROW((void)Policy::calendar(0, CalendarUnit::Day, "UTC"), InvalidArgument);
  EXPECT_THROW((void)Policy::calendar(4294967296, CalendarUnit::Day, "UTC"), InvalidArgument);
  EXPECT_NO_THROW((void)Policy::calendar(4294967295, CalendarUnit::Day, "UTC"));
  EXPECT_THROW((void)at(quota(CalendarUnit::Day, "UTC"), -1), InvalidArgument) << "before 1970";
  EXPECT_THROW((void)Policy::perSecond(10).windowAt(microseconds{0}), InvalidArgument) << "not a calendar quota";
  EXPECT_THROW((void)tableAround(CalendarUnit::Day, "UTC", 0, 4, 0), InvalidArgument);
  EXPECT_THROW((void)tableAround(CalendarUnit::Day, "UTC", 0, 0, -1), InvalidArgument);
}
