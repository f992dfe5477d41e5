#include "redlimit/policy.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "config/config_checks.hpp"
#include "limiters/calendar_tables.hpp"
#include "limiters/keyed_policy.hpp"
#include "limiters/lease_id.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/limits.hpp"
#include "redlimit/detail/rate_units.hpp"

namespace redlimit {

using std::chrono::milliseconds;

namespace {

constexpr std::int64_t kTwo52 = std::int64_t{1} << 52;
constexpr std::int64_t kTwo53 = std::int64_t{1} << 53;

// a x b, or the largest int64 when it overflows (every bound below is far under it; sums saturate
// with saturatingAdd).
std::int64_t mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::numeric_limits<std::int64_t>::max();
  return out;
}

// ceil(permits x ms / per), saturating (the factors are validated: at most 2^32 each).
std::int64_t ceilTimes(std::int64_t permits, std::int64_t ms, std::int64_t per) noexcept {
  if (ms != 0 && permits > std::numeric_limits<std::int64_t>::max() / ms)
    return std::numeric_limits<std::int64_t>::max();
  const std::int64_t product = permits * ms;
  return product / per + (product % per != 0 ? 1 : 0);
}

// A smooth policy: `permits` per `interval`, `span` the maxBurst (cold = 0, bursty) or the warm-up
// period, `cold` the cold factor. Throws InvalidArgument for a field out of range or outside the
// exactness bounds of lua/smooth.lua's derive(); else the key's header as the script packs it
// ('<c1I4I4I4BI4'), and limit, the most permits per call (n x K < 2^53) and the Local bucket as
// derive() computes them.
detail::KeyedPolicy smoothPolicy(std::int64_t permits, milliseconds interval, milliseconds span, std::int64_t cold,
                                 milliseconds keepAlive) {
  detail::checkCount("permits", permits, 1, detail::kMaxPermits);
  detail::checkMillis("interval", interval, 1);
  detail::checkMillis(cold == 0 ? "maxBurst" : "warmup", span, cold == 0 ? 0 : 1);
  detail::checkCount("coldFactor", cold, cold == 0 ? 0 : 1, detail::kMaxColdFactor);
  const auto [p, t] = detail::rateUnits(permits, interval);  // P' and I'
  const std::int64_t w = span.count() * 1000;
  const std::int64_t m = cold == 0 ? 1 : 2 * (1 + cold);
  // K units per permit and the most units stored
  const std::int64_t k = mul(t, m);
  const std::int64_t maxK = cold == 0 ? mul(w, p) : mul(mul(w, p), 5 + cold);
  if (cold == 0 && maxK > kTwo52) {
    throw InvalidArgument(fmt::format(
        "redlimit: maxBurst {} ms is too long for {} permits per {} ms: maxBurst in us x {} (permits / gcd(permits, "
        "interval in us)) must be at most 2^52",
        span.count(), permits, interval.count(), p));
  }
  // A warm-up's own bounds.
  bool fits = true;
  if (cold > 0) {
    const std::int64_t earn = mul(p, 5 + cold);
    const std::int64_t d = mul(mul(mul(16 * w, p), p), 1 + cold);
    const std::int64_t retryK = mul(mul(cold, t), 5 + cold);
    fits = k < kTwo53 && earn < kTwo53 && maxK <= kTwo52 && d <= kTwo52 && mul(mul(8 * w, p), cold) < kTwo53 &&
           mul(t, 5 + cold) < kTwo53 && mul(p, m) < kTwo53 &&
           detail::saturatingAdd(detail::saturatingAdd(maxK, retryK), earn) < kTwo53;
  }
  if (!fits) {
    throw InvalidArgument(fmt::format(
        "redlimit: a warm-up period of {} ms with cold factor {} is too long for {} permits per {} ms to keep exact: "
        "warm-up in us x P'^2 x 16 x (1 + coldFactor) must be at most 2^52, with P' = {} (permits / gcd(permits, "
        "interval in us))",
        span.count(), cold, permits, interval.count(), p));
  }
  std::string packed(1, 'S');
  for (const std::int64_t v : {permits, interval.count(), span.count()}) detail::packLe(packed, v, 4);
  detail::packLe(packed, cold, 1);  // 0..127
  detail::packLe(packed, keepAlive.count(), 4);
  const std::int64_t limit = maxK / k;
  const std::int64_t localRate = cold == 0 ? limit + 1 : 1;
  const std::int64_t most = std::min<std::int64_t>(detail::kMaxPermits, (kTwo53 - 1) / k);
  const std::int64_t localMs = detail::localIntervalMs(localRate, interval.count(), permits);
  std::vector<std::int64_t> fields{permits, interval.count(), span.count(), cold, keepAlive.count()};
  return {std::move(packed), limit, most, localRate, localMs, std::move(fields), std::nullopt};
}

// Checks the parameters (InvalidArgument naming the parameter, its bound and the value) and packs
// them as the algorithm's script stores them.
detail::KeyedPolicy packedOf(Policy::Kind kind, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d,
                             std::int64_t keepAliveMs, const std::string& zone) {
  const milliseconds keepAlive{keepAliveMs};
  detail::checkMillis("keepAlive", keepAlive, 0);
  switch (kind) {
    case Policy::Kind::Gcra:  // rate a per period b, burst c
      detail::checkCount("rate", a, 1, detail::kMaxPermits);
      detail::checkMillis("period", milliseconds{b}, 1);
      detail::checkCount("burst", c, 1, detail::kMaxPermits);
      detail::checkExact("burst", c, a, milliseconds{b});
      return detail::gcraPolicy('G', c, a, milliseconds{b}, keepAlive);
    case Policy::Kind::TokenBucket:  // capacity a, refill b per period c
      detail::checkCount("capacity", a, 1, detail::kMaxPermits);
      detail::checkCount("refill", b, 1, detail::kMaxPermits);
      detail::checkMillis("period", milliseconds{c}, 1);
      detail::checkExact("capacity", a, b, milliseconds{c});
      return detail::gcraPolicy('T', a, b, milliseconds{c}, keepAlive);
    case Policy::Kind::FixedWindow:  // limit a per window b
      detail::checkCount("limit", a, 1, detail::kMaxPermits);
      detail::checkMillis("window", milliseconds{b}, 1);
      // the key's header as lua/lib/fixed_window_core.lua packs it ('<c1I4I4I4'); the Local bucket: the window
      return detail::headerPolicy('W', {a, b, keepAliveMs}, a, b);
    case Policy::Kind::SlidingWindow:  // limit a per sliding window b
      detail::checkCount("limit", a, 1, detail::kMaxPermits);
      detail::checkMillis("window", milliseconds{b}, 1);
      // the key's header as lua/lib/sliding_window_core.lua packs it ('<c1I4I4I4'); the Local bucket: the window
      return detail::headerPolicy('V', {a, b, keepAliveMs}, a, b);
    case Policy::Kind::Smooth:  // permits a per interval b; c the maxBurst, or the warm-up with cold factor d > 0
      return smoothPolicy(a, milliseconds{b}, milliseconds{c}, d, keepAlive);
    case Policy::Kind::Calendar: {  // limit a per unit b from weekday c in `zone`
      detail::CalendarQuota q{a, static_cast<CalendarUnit>(b), zone, static_cast<Weekday>(c)};
      detail::checkCalendarQuota(q);
      // packed for equality only (no script reads it); the Local bucket: the limit per day
      std::string packed = fmt::format("Q{}:{}:{}:{}:{}", a, b, c, keepAliveMs, zone);
      return detail::KeyedPolicy{std::move(packed), a, a, a, 86400000, {a, b, c, keepAliveMs}, std::move(q)};
    }
    case Policy::Kind::Concurrency:
      detail::checkCount("limit", a, 1, detail::kMaxPermits);
      detail::checkLeaseTtl(milliseconds{b});
      // packed as multi.lua reads a concurrency limit's configuration; a lease a call
      return detail::KeyedPolicy{fmt::format("{}:{}", a, b), a, 1, a, b, {a, b}, std::nullopt};
  }
  throw InvalidArgument("redlimit: unknown policy kind");
}

std::int64_t burstOr(std::int64_t burst, std::int64_t rate) { return burst == 0 ? rate : burst; }

}  // namespace

Policy::Policy(Kind kind, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, std::int64_t keepAliveMs,
               std::string zone)
    : kind_(kind),
      a_(a),
      b_(b),
      c_(c),
      d_(d),
      zone_(std::move(zone)),
      keepAliveMs_(keepAliveMs),
      packed_(std::make_shared<const detail::KeyedPolicy>(packedOf(kind, a, b, c, d, keepAliveMs, zone_))) {}

Policy Policy::gcra(std::int64_t rate, milliseconds period, std::int64_t burst) {
  return Policy(Kind::Gcra, rate, period.count(), burst, 0, kDefaultIdleMargin.count());
}
Policy Policy::perSecond(std::int64_t rate, std::int64_t burst) {
  return gcra(rate, std::chrono::seconds(1), burstOr(burst, rate));
}
Policy Policy::perMinute(std::int64_t rate, std::int64_t burst) {
  return gcra(rate, std::chrono::minutes(1), burstOr(burst, rate));
}
Policy Policy::perHour(std::int64_t rate, std::int64_t burst) {
  return gcra(rate, std::chrono::hours(1), burstOr(burst, rate));
}
Policy Policy::tokenBucket(std::int64_t capacity, std::int64_t refill, milliseconds period) {
  return Policy(Kind::TokenBucket, capacity, refill, period.count(), 0, kDefaultIdleMargin.count());
}
Policy Policy::fixedWindow(std::int64_t limit, milliseconds window) {
  return Policy(Kind::FixedWindow, limit, window.count(), 0, 0, kDefaultIdleMargin.count());
}
Policy Policy::slidingWindow(std::int64_t limit, milliseconds window) {
  return Policy(Kind::SlidingWindow, limit, window.count(), 0, 0, kDefaultIdleMargin.count());
}
Policy Policy::smoothBursty(std::int64_t permits, milliseconds interval, milliseconds maxBurst) {
  return Policy(Kind::Smooth, permits, interval.count(), maxBurst.count(), 0, kDefaultIdleMargin.count());
}
Policy Policy::smoothWarmingUp(std::int64_t permits, milliseconds interval, milliseconds warmup,
                               std::int64_t coldFactor) {
  // Below 1 the constructor would take it for a bursty policy (it checks the rest of the range).
  if (coldFactor < 1) detail::checkCount("coldFactor", coldFactor, 1, detail::kMaxColdFactor);
  return Policy(Kind::Smooth, permits, interval.count(), warmup.count(), coldFactor, kDefaultIdleMargin.count());
}

Policy Policy::calendar(std::int64_t limit, CalendarUnit unit, std::string zone, Weekday weekStart) {
  return Policy(Kind::Calendar, limit, static_cast<std::int64_t>(unit), static_cast<std::int64_t>(weekStart), 0,
                kDefaultIdleMargin.count(), std::move(zone));
}

Policy Policy::calendar(std::int64_t limit, CalendarUnit unit, std::string zone) {
  return calendar(limit, unit, std::move(zone), Weekday::Monday);
}

detail::CalendarQuota Policy::calendarQuota(const char* what) const {
  if (kind_ != Kind::Calendar) {
    throw InvalidArgument(
        fmt::format("redlimit: {} is a calendar policy's: make the policy with Policy::calendar", what));
  }
  return *packed_->calendar;
}

CalendarWindow Policy::windowAt(std::chrono::microseconds at) const {
  return detail::calendarWindows(calendarQuota("windowAt"), at, 0, 0).front();
}

Policy Policy::concurrency(std::int64_t limit, milliseconds leaseTtl) {
  return Policy(Kind::Concurrency, limit, leaseTtl.count(), 0, 0, 0);
}

Policy Policy::keepAlive(milliseconds idle) const {
  if (stored_) {
    throw InvalidArgument(
        "redlimit: a stored policy's keys are permanent (its configuration lives in them); keepAlive does not apply");
  }
  detail::checkMillis("keepAlive", idle, 1);
  return Policy(kind_, a_, b_, c_, d_, idle.count(), zone_);  // not stored: refused above
}

Policy Policy::permanent() const {
  Policy p(kind_, a_, b_, c_, d_, 0, zone_);
  p.stored_ = stored_;
  return p;
}

Policy Policy::stored() const {
  if (kind_ == Kind::Calendar || kind_ == Kind::Concurrency || kind_ == Kind::SlidingWindow) {
    throw InvalidArgument(
        fmt::format("redlimit: a {} travels in every call and cannot be stored; stored() is for "
                    "gcra, tokenBucket, fixedWindow and the smooth policies",
                    kind_ == Kind::Calendar        ? "calendar quota"
                    : kind_ == Kind::SlidingWindow ? "sliding window counter"
                                                   : "concurrency limit"));
  }
  // Permanent: a stored configuration must outlive the key's idle time (deleteKey removes it).
  Policy p = permanent();
  p.stored_ = true;
  return p;
}

std::int64_t Policy::limit() const noexcept { return packed_->limit; }

milliseconds Policy::refillTime() const noexcept {
  switch (kind_) {
    case Kind::Gcra:    // rate a per period b (the limit: burst c)
    case Kind::Smooth:  // permits a per interval b
      return milliseconds{ceilTimes(limit(), b_, a_)};
    case Kind::TokenBucket:  // capacity a, refill b per period c
      return milliseconds{ceilTimes(a_, c_, b_)};
    case Kind::FixedWindow:    // limit a per window b
    case Kind::SlidingWindow:  // limit a per sliding window b
    case Kind::Concurrency:    // b: a lease's TTL
      return milliseconds{b_};
    case Kind::Calendar: {  // a window: a day, a week, a (31-day) month at most
      const auto unit = static_cast<CalendarUnit>(b_);
      return std::chrono::hours(24 * (unit == CalendarUnit::Week ? 7 : unit == CalendarUnit::Month ? 31 : 1));
    }
  }
  return milliseconds{0};
}
std::int64_t Policy::maxPermits() const noexcept { return packed_->maxPermits; }

bool operator==(const Policy& a, const Policy& b) noexcept {
  return a.stored_ == b.stored_ && a.packed_->packed == b.packed_->packed;
}

}  // namespace redlimit
