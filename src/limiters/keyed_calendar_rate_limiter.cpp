#include "redlimit/keyed_calendar_rate_limiter.hpp"

#include <utility>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/future_of.hpp"
#include "redlimit/errors.hpp"

namespace redlimit {

KeyedCalendarRateLimiter::KeyedCalendarRateLimiter(std::shared_ptr<Client> client, std::string name,
                                                   CalendarQuota quota, CalendarRateLimiterOptions options)
    : policy_(std::move(client), std::move(name), std::move(quota), std::move(options)) {}

std::string KeyedCalendarRateLimiter::checkedKey(std::string_view key) {
  if (key.empty()) throw InvalidArgument("redlimit: a key must not be empty");
  if (key.size() > kMaxKeyLength) {
    throw InvalidArgument(
        fmt::format("redlimit: a key is {} bytes; at most {} are allowed", key.size(), kMaxKeyLength));
  }
  detail::checkNotRecordKey(key, "key");
  return std::string(key);
}

Decision KeyedCalendarRateLimiter::decide(std::string_view key, std::int64_t permits) {
  return policy_.decideOn(checkedKey(key), permits);
}

bool KeyedCalendarRateLimiter::tryAcquire(std::string_view key, std::int64_t permits) {
  return decide(key, permits).allowed;
}

void KeyedCalendarRateLimiter::decideAsync(std::string_view key, std::int64_t permits,
                                           CalendarRateLimiter::DecisionCallback done) {
  done = detail::isolated(std::move(done), monitor(), getName());
  std::string k;
  try {
    k = checkedKey(key);
  } catch (...) {
    done(Decision{}, std::current_exception());
    return;
  }
  policy_.decideOnAsync(k, permits, std::move(done));
}

std::future<Decision> KeyedCalendarRateLimiter::decideAsync(std::string_view key, std::int64_t permits) {
  return detail::futureOf<Decision>(
      [&](auto done) { decideAsync(key, permits, CalendarRateLimiter::DecisionCallback(std::move(done))); });
}

Decision KeyedCalendarRateLimiter::peek(std::string_view key, std::int64_t permits) {
  return policy_.peekOn(checkedKey(key), permits);
}

CalendarWindow KeyedCalendarRateLimiter::windowAt(std::chrono::microseconds at) const { return policy_.windowAt(at); }

bool KeyedCalendarRateLimiter::deleteKey(std::string_view key) { return policy_.deleteOn(checkedKey(key)); }

const std::string& KeyedCalendarRateLimiter::getName() const noexcept { return policy_.getName(); }
const CalendarQuota& KeyedCalendarRateLimiter::quota() const noexcept { return policy_.quota(); }
FailureStats KeyedCalendarRateLimiter::failureStats() const { return policy_.failureStats(); }
const LimiterMonitor& KeyedCalendarRateLimiter::monitor() const noexcept { return policy_.monitor(); }

}  // namespace redlimit
