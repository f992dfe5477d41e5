#include "redlimit/policy.hpp"

#include <limits>

#include <fmt/format.h>

#include "limiters/calendar_core.hpp"
#include "limiters/keyed_policy.hpp"
#include "limiters/lease_id.hpp"
#include "redlimit/distributed_smooth_rate_limiter.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/fixed_window_rate_limiter.hpp"
#include "redlimit/gcra_rate_limiter.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/token_bucket_rate_limiter.hpp"

namespace redlimit {

using std::chrono::milliseconds;

namespace {

// Checks the parameters as the algorithm's configuration (the messages name its fields) and packs
// them as its script stores them.
detail::KeyedPolicy packedOf(Policy::Kind kind, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d,
                             std::int64_t keepAliveMs, const std::string& zone) {
  const milliseconds keepAlive{keepAliveMs};
  switch (kind) {
    case Policy::Kind::Gcra: {
      GcraConfig g;
      g.rate = a;
      g.period = milliseconds{b};
      g.burst = c;
      g.keepAlive = keepAlive;
      GcraRateLimiter::validateConfig(g);
      return detail::gcraPolicy('G', g.burst, g.rate, g.period, keepAlive);
    }
    case Policy::Kind::TokenBucket: {
      TokenBucketConfig t;
      t.capacity = a;
      t.refillPermits = b;
      t.refillInterval = milliseconds{c};
      t.keepAlive = keepAlive;
      TokenBucketRateLimiter::validateConfig(t);
      return detail::gcraPolicy('T', t.capacity, t.refillPermits, t.refillInterval, keepAlive);
    }
    case Policy::Kind::FixedWindow: {
      FixedWindowConfig w;
      w.limit = a;
      w.window = milliseconds{b};
      w.keepAlive = keepAlive;
      FixedWindowRateLimiter::validateConfig(w);
      return detail::windowPolicy(w.limit, w.window, keepAlive);
    }
    case Policy::Kind::Smooth: {
      SmoothConfig s;
      s.permits = a;
      s.interval = milliseconds{b};
      s.keepAlive = keepAlive;
      if (d > 0) {  // warming up: c the warm-up period, d the cold factor
        s.warmupPeriod = milliseconds{c};
        s.coldFactor = d;
        if (c < 1)
          throw InvalidArgument(
              fmt::format("redlimit: warmup must be in 1..{} ms, got {} ms", GcraRateLimiter::kMaxInterval.count(), c));
      } else {
        s.maxBurst = milliseconds{c};
      }
      DistributedSmoothRateLimiter::validateConfig(s);
      return d > 0 ? detail::smoothPolicy(s.permits, s.interval, s.warmupPeriod, s.coldFactor, keepAlive)
                   : detail::smoothPolicy(s.permits, s.interval, s.maxBurst, 0, keepAlive);
    }
    case Policy::Kind::Calendar: {  // limit a per unit b from weekday c in `zone`
      detail::CalendarQuota q;
      q.limit = a;
      q.unit = static_cast<CalendarUnit>(b);
      q.zone = zone;
      q.weekStart = static_cast<Weekday>(c);
      detail::checkCalendarQuota(q);
      detail::KeyedPolicy p;
      p.packed = fmt::format("Q{}:{}:{}:{}:{}", a, b, c, keepAliveMs, zone);  // for equality: no script reads it
      p.limit = a;
      p.maxPermits = a;
      p.localRate = a;
      p.localIntervalMs = 86400000;
      p.fields = {a, b, c, keepAliveMs};
      return p;
    }
    case Policy::Kind::Concurrency: {
      detail::checkLeaseLimit(a, milliseconds{b});
      detail::KeyedPolicy p;
      p.packed = fmt::format("{}:{}", a, b);  // as multi.lua reads a concurrency limit's configuration
      p.limit = a;
      p.maxPermits = 1;
      p.localRate = a;
      p.localIntervalMs = b;
      p.fields = {a, b};
      return p;
    }
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
Policy Policy::smoothBursty(std::int64_t permits, milliseconds interval, milliseconds maxBurst) {
  return Policy(Kind::Smooth, permits, interval.count(), maxBurst.count(), 0, kDefaultIdleMargin.count());
}
Policy Policy::smoothWarmingUp(std::int64_t permits, milliseconds interval, milliseconds warmup,
                               std::int64_t coldFactor) {
  if (coldFactor < 1) {
    throw InvalidArgument(fmt::format("redlimit: coldFactor must be in 1..{}, got {}",
                                      DistributedSmoothRateLimiter::kMaxColdFactor, coldFactor));
  }
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
  detail::CalendarQuota q;
  q.limit = a_;
  q.unit = static_cast<CalendarUnit>(b_);
  q.zone = zone_;
  q.weekStart = static_cast<Weekday>(c_);
  return q;
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
  if (idle.count() < 1 || idle > GcraRateLimiter::kMaxInterval) {
    throw InvalidArgument(fmt::format("redlimit: keepAlive must be in 1..{} ms, got {} ms",
                                      GcraRateLimiter::kMaxInterval.count(), idle.count()));
  }
  Policy p(kind_, a_, b_, c_, d_, idle.count(), zone_);
  p.stored_ = stored_;
  return p;
}

Policy Policy::permanent() const {
  Policy p(kind_, a_, b_, c_, d_, 0, zone_);
  p.stored_ = stored_;
  return p;
}

Policy Policy::stored() const {
  if (kind_ == Kind::Calendar || kind_ == Kind::Concurrency) {
    throw InvalidArgument(
        fmt::format("redlimit: a {} travels in every call and cannot be stored; stored() is for "
                    "gcra, tokenBucket, fixedWindow and the smooth policies",
                    kind_ == Kind::Calendar ? "calendar quota" : "concurrency limit"));
  }
  // Permanent: a stored configuration must outlive the key's idle time (deleteKey removes it).
  Policy p(kind_, a_, b_, c_, d_, 0, zone_);
  p.stored_ = true;
  return p;
}

std::int64_t Policy::limit() const noexcept { return packed_->limit; }

namespace {
// ceil(permits x ms / per), saturating (the factors are validated: at most 2^32 each).
std::int64_t ceilTimes(std::int64_t permits, std::int64_t ms, std::int64_t per) noexcept {
  if (ms != 0 && permits > std::numeric_limits<std::int64_t>::max() / ms)
    return std::numeric_limits<std::int64_t>::max();
  const std::int64_t product = permits * ms;
  return product / per + (product % per != 0 ? 1 : 0);
}
}  // namespace

milliseconds Policy::refillTime() const noexcept {
  switch (kind_) {
    case Kind::Gcra:  // rate a per period b, burst c
      return milliseconds{ceilTimes(c_, b_, a_)};
    case Kind::TokenBucket:  // capacity a, refill b per period c
      return milliseconds{ceilTimes(a_, c_, b_)};
    case Kind::FixedWindow:  // limit a per window b
      return milliseconds{b_};
    case Kind::Smooth:  // permits a per interval b
      return milliseconds{ceilTimes(limit(), b_, a_)};
    case Kind::Concurrency:  // a lease's TTL
      return milliseconds{b_};
    case Kind::Calendar:  // a window: a day, a week, a (31-day) month at most
      switch (static_cast<CalendarUnit>(b_)) {
        case CalendarUnit::Day:
          return std::chrono::hours(24);
        case CalendarUnit::Week:
          return std::chrono::hours(24 * 7);
        case CalendarUnit::Month:
          return std::chrono::hours(24 * 31);
      }
      return std::chrono::hours(24);
  }
  return milliseconds{0};
}
std::int64_t Policy::maxPermits() const noexcept { return packed_->maxPermits; }

bool operator==(const Policy& a, const Policy& b) noexcept {
  return a.stored_ == b.stored_ && a.packed_->packed == b.packed_->packed;
}

}  // namespace redlimit
