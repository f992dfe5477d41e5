// Saturating duration arithmetic (include/redlimit/detail/deadline.hpp): durations that would
// overflow saturate instead.
#include <chrono>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "redlimit/detail/deadline.hpp"

using namespace redlimit::detail;
using namespace std::chrono;

namespace {

// A clock without now(): deadlineAfter(now, timeout) only needs its types.
struct FixedClock {
  using duration = nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<FixedClock>;
};

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

}  // namespace

TEST(Deadline, SaturatingAddClampsAtBothEnds) {
  EXPECT_EQ(saturatingAdd(std::int64_t{1}, std::int64_t{2}), 3);
  EXPECT_EQ(saturatingAdd(kMax, std::int64_t{1}), kMax);
  EXPECT_EQ(saturatingAdd(kMax - 5, std::int64_t{5}), kMax);
  EXPECT_EQ(saturatingAdd(kMin, std::int64_t{-1}), kMin);
  EXPECT_EQ(saturatingAdd(std::int64_t{-3}, std::int64_t{1}), -2);
  EXPECT_EQ(saturatingAdd(milliseconds::max(), milliseconds(500)), milliseconds::max());
  EXPECT_EQ(saturatingAdd(milliseconds(100), milliseconds(500)), milliseconds(600));
}

TEST(Deadline, SaturatingCastClampsWhereDurationCastWouldWrap) {
  EXPECT_EQ(saturatingCast<nanoseconds>(milliseconds::max()), nanoseconds::max());
  EXPECT_EQ(saturatingCast<microseconds>(milliseconds::max()), microseconds::max());
  EXPECT_EQ(saturatingCast<nanoseconds>(milliseconds::min()), nanoseconds::min());
  EXPECT_EQ(saturatingCast<microseconds>(hours::max()), microseconds::max());
  // The largest value that still fits converts exactly; one more saturates.
  const milliseconds fits{nanoseconds::max().count() / 1000000};
  EXPECT_EQ(saturatingCast<nanoseconds>(fits), nanoseconds(fits.count() * 1000000));
  EXPECT_EQ(saturatingCast<nanoseconds>(fits + milliseconds(1)), nanoseconds::max());
  // Coarser targets round toward zero, as duration_cast does.
  EXPECT_EQ(saturatingCast<milliseconds>(nanoseconds::max()), milliseconds(nanoseconds::max().count() / 1000000));
  EXPECT_EQ(saturatingCast<milliseconds>(microseconds(-1999)), milliseconds(-1));
  EXPECT_EQ(saturatingCast<milliseconds>(milliseconds(42)), milliseconds(42));
}

TEST(Deadline, DeadlineAfterSaturatesInsteadOfWrappingIntoThePast) {
  const FixedClock::time_point now{nanoseconds(123456789)};
  EXPECT_EQ(deadlineAfter<FixedClock>(now, milliseconds(5)), now + milliseconds(5));
  EXPECT_EQ(deadlineAfter<FixedClock>(now, milliseconds::max()), FixedClock::time_point::max());
  EXPECT_EQ(deadlineAfter<FixedClock>(now, hours::max()), FixedClock::time_point::max());
  EXPECT_EQ(deadlineAfter<FixedClock>(now, nanoseconds::max()), FixedClock::time_point::max());
  EXPECT_EQ(deadlineAfter<FixedClock>(now, milliseconds(0)), now);
  EXPECT_EQ(deadlineAfter<FixedClock>(now, milliseconds::min()), now) << "a negative timeout is no wait";
  // Just below the end of the clock's range: the step that fits is taken, a larger one saturates.
  const FixedClock::time_point late = FixedClock::time_point::max() - nanoseconds(10);
  EXPECT_EQ(deadlineAfter<FixedClock>(late, nanoseconds(9)), late + nanoseconds(9));
  EXPECT_EQ(deadlineAfter<FixedClock>(late, nanoseconds(10)), FixedClock::time_point::max());
  EXPECT_EQ(deadlineAfter<FixedClock>(late, milliseconds(1)), FixedClock::time_point::max());
  // steady_clock: a wait of milliseconds::max() ends after now, not before.
  const auto steadyNow = steady_clock::now();
  EXPECT_GT(deadlineAfter<steady_clock>(steadyNow, milliseconds::max()), steadyNow + hours(24 * 365 * 100));
}
