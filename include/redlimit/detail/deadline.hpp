// redlimit — saturating duration arithmetic: a deadline "now + timeout" that never overflows.
//
// std::chrono arithmetic overflows silently: steady_clock::now() + milliseconds::max() wraps to a
// time in the past (a wait that should last "forever" ends at once), and converting
// milliseconds::max() to the clock's nanoseconds wraps too. Every duration redlimit adds or
// converts goes through these helpers, which clamp at the limits of the result type instead.
// Header-only, no dependencies: the local (header-only) part may use it as well.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <ratio>
#include <type_traits>

namespace redlimit::detail {

/// a + b, clamped to [INT64_MIN, INT64_MAX] instead of overflowing.
[[nodiscard]] constexpr std::int64_t saturatingAdd(std::int64_t a, std::int64_t b) noexcept {
  if (b > 0 && a > std::numeric_limits<std::int64_t>::max() - b) return std::numeric_limits<std::int64_t>::max();
  if (b < 0 && a < std::numeric_limits<std::int64_t>::min() - b) return std::numeric_limits<std::int64_t>::min();
  return a + b;
}

/// `d` converted to `To` (integral durations only), rounded toward zero like duration_cast, but
/// clamped to To::min()/To::max() where duration_cast would overflow (for example
/// milliseconds::max() to nanoseconds).
template <class To, class Rep, class Period>
[[nodiscard]] constexpr To saturatingCast(std::chrono::duration<Rep, Period> d) noexcept {
  static_assert(std::is_integral_v<Rep> && std::is_signed_v<Rep> && std::is_integral_v<typename To::rep>,
                "saturatingCast handles signed integral durations");
  using Ratio = std::ratio_divide<Period, typename To::period>;  // To ticks per From tick
  if constexpr (Ratio::den == 1) {
    // To is finer (or the same): multiplying by Ratio::num may overflow. Compare in From's unit,
    // where To's range, truncated, is representable (dividing cannot overflow).
    constexpr auto maxFrom = static_cast<std::intmax_t>(To::max().count()) / Ratio::num;
    constexpr auto minFrom = static_cast<std::intmax_t>(To::min().count()) / Ratio::num;
    if (static_cast<std::intmax_t>(d.count()) > maxFrom) return To::max();
    if (static_cast<std::intmax_t>(d.count()) < minFrom) return To::min();
    return std::chrono::duration_cast<To>(d);
  } else {
    // To is coarser: dividing cannot overflow.
    static_assert(Ratio::num == 1, "saturatingCast converts between units that divide each other");
    return std::chrono::duration_cast<To>(d);
  }
}

/// `a + b` for durations of one type, clamped instead of overflowing.
template <class Rep, class Period>
[[nodiscard]] constexpr std::chrono::duration<Rep, Period> saturatingAdd(
    std::chrono::duration<Rep, Period> a, std::chrono::duration<Rep, Period> b) noexcept {
  return std::chrono::duration<Rep, Period>(
      saturatingAdd(static_cast<std::int64_t>(a.count()), static_cast<std::int64_t>(b.count())));
}

/// The time point `timeout` after `now`: Clock::time_point::max() if that is beyond what the
/// clock can represent (a wait of milliseconds::max() lasts as long as the clock can count, it
/// does not end at once), and `now` for a negative timeout.
template <class Clock, class Rep, class Period>
[[nodiscard]] constexpr typename Clock::time_point deadlineAfter(typename Clock::time_point now,
                                                                 std::chrono::duration<Rep, Period> timeout) noexcept {
  using Duration = typename Clock::duration;
  if (timeout <= std::chrono::duration<Rep, Period>::zero()) return now;
  const Duration step = saturatingCast<Duration>(timeout);
  if (now.time_since_epoch() < Duration::zero()) return now + step;  // room for any step
  if (step >= Clock::time_point::max() - now) return Clock::time_point::max();
  return now + step;
}

/// deadlineAfter(Clock::now(), timeout).
template <class Clock = std::chrono::steady_clock, class Rep, class Period>
[[nodiscard]] typename Clock::time_point deadlineAfter(std::chrono::duration<Rep, Period> timeout) {
  return deadlineAfter<Clock>(Clock::now(), timeout);
}

}  // namespace redlimit::detail
