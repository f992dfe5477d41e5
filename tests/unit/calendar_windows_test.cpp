// calendarWindows(): the calendar windows a CalendarRateLimiter sends, from the system's time zone
// database, without Redis. The expected instants were computed independently (Python's zoneinfo
// over the same tzdata).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "redlimit/calendar_rate_limiter.hpp"
#include "redlimit/errors.hpp"

using namespace redlimit;
using std::chrono::hours;
using std::chrono::microseconds;

namespace {

constexpr std::int64_t kUsPerHour = 3600000000;

CalendarQuota quota(CalendarUnit unit, const char* zone, Weekday weekStart = Weekday::Monday) {
  CalendarQuota q;
  q.limit = 1000;
  q.unit = unit;
  q.zone = zone;
  q.weekStart = weekStart;
  return q;
}

// The window holding `at`, by itself.
CalendarWindow at(const CalendarQuota& q, std::int64_t us) { return calendarWindows(q, microseconds{us}, 0, 0).at(0); }

}  // namespace

TEST(CalendarWindows, BerlinSpringForwardDayIs23HoursAndFallBackDayIs25) {
  const CalendarQuota q = quota(CalendarUnit::Day, "Europe/Berlin");
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

TEST(CalendarWindows, ADayWhoseMidnightIsSkippedStartsAtTheEndOfTheGap) {
  // America/Santiago moves 2026-09-06 00:00 to 01:00: the day starts at 04:00Z and lasts 23 hours.
  const CalendarWindow w = at(quota(CalendarUnit::Day, "America/Santiago"), 1788696000000000);
  EXPECT_EQ(w.label, 20702);
  EXPECT_EQ(w.start.count(), 1788667200000000);
  EXPECT_EQ(w.end.count(), 1788750000000000);
}

TEST(CalendarWindows, MonthsFollowTheCalendarIncludingALeapFebruary) {
  const CalendarWindow feb = at(quota(CalendarUnit::Month, "Europe/Berlin"), 1832972400000000 + kUsPerHour * 24 * 10);
  EXPECT_EQ(feb.label, 2028 * 12 + 1);
  EXPECT_EQ(feb.start.count(), 1832972400000000);  // 2028-02-01 00:00 CET
  EXPECT_EQ(feb.end.count(), 1835478000000000);    // 2028-03-01 00:00 CET
  EXPECT_EQ(feb.end - feb.start, hours(29 * 24));
  // December to January: the label goes on counting months.
  const std::vector<CalendarWindow> t =
      calendarWindows(quota(CalendarUnit::Month, "UTC"), microseconds{1796212800000000}, 1, 2);  // 2026-12-02
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[1].label, 2026 * 12 + 11);
  EXPECT_EQ(t[2].label, 2027 * 12 + 0);
  EXPECT_EQ(t[2].end - t[2].start, hours(31 * 24));
}

TEST(CalendarWindows, WeeksStartOnTheQuotasWeekday) {
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
  const std::vector<CalendarWindow> t =
      calendarWindows(quota(CalendarUnit::Day, "Europe/Berlin"), microseconds{1792879200000000}, 1, 2);
  ASSERT_EQ(t.size(), 4u);
  for (std::size_t i = 1; i < t.size(); ++i) {
    EXPECT_EQ(t[i].start, t[i - 1].end);
    EXPECT_EQ(t[i].label, t[i - 1].label + 1);
  }
  EXPECT_EQ(t[1].label, 20751);
}

TEST(CalendarWindows, BadQuotasAreInvalidArguments) {
  EXPECT_THROW((void)at(quota(CalendarUnit::Day, "Europe/Atlantis"), 0), InvalidArgument);
  EXPECT_THROW((void)at(quota(CalendarUnit::Day, ""), 0), InvalidArgument);
  EXPECT_THROW((void)at(quota(CalendarUnit::Week, "UTC", static_cast<Weekday>(7)), 0), InvalidArgument);
  EXPECT_THROW((void)at(quota(CalendarUnit::Week, "UTC", static_cast<Weekday>(-1)), 0), InvalidArgument);
  EXPECT_THROW((void)at(quota(static_cast<CalendarUnit>(9), "UTC"), 0), InvalidArgument);
  CalendarQuota q = quota(CalendarUnit::Day, "UTC");
  q.limit = 0;
  EXPECT_THROW(CalendarRateLimiter::validateQuota(q), InvalidArgument);
  q.limit = CalendarRateLimiter::kMaxPermits + 1;
  EXPECT_THROW(CalendarRateLimiter::validateQuota(q), InvalidArgument);
  EXPECT_THROW((void)calendarWindows(quota(CalendarUnit::Day, "UTC"), microseconds{0}, 4, 0), InvalidArgument);
}
