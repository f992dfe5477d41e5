#include "redlimit/keyed_calendar_rate_limiter.hpp"

#include <utility>

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/future_of.hpp"
#include "redlimit/errors.hpp"
#include "limiters/script_helpers.hpp"

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

template <class Out, class Go>
void KeyedCalendarRateLimiter::onCheckedKey(std::string_view key, std::function<void(Out, std::exception_ptr)> done,
                                            Go go) {
  std::string k;
  try {
    k = checkedKey(key);
  } catch (...) {
    detail::isolated(std::move(done), monitor(), getName())(Out{}, std::current_exception());
    return;
  }
  go(k, std::move(done));
}

void KeyedCalendarRateLimiter::decideAsync(std::string_view key, std::int64_t permits,
                                           CalendarRateLimiter::DecisionCallback done) {
  onCheckedKey<Decision>(key, std::move(done), [&](const std::string& k, CalendarRateLimiter::DecisionCallback d) {
    policy_.decideOnAsync(k, permits, std::move(d));
  });
}

std::future<Decision> KeyedCalendarRateLimiter::decideAsync(std::string_view key, std::int64_t permits) {
  return detail::futureOf<Decision>(
      [&](auto done) { decideAsync(key, permits, CalendarRateLimiter::DecisionCallback(std::move(done))); });
}

Decision KeyedCalendarRateLimiter::peek(std::string_view key, std::int64_t permits) {
  return policy_.peekOn(checkedKey(key), permits);
}

HeldPermits KeyedCalendarRateLimiter::reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                                                 std::chrono::milliseconds recordTtl) {
  return policy_.reserveForOn(checkedKey(key), permits, id, recordTtl);
}

Settlement KeyedCalendarRateLimiter::settle(std::string_view key, const std::string& id, std::int64_t actual) {
  return policy_.settleOn(checkedKey(key), id, actual);
}

Settlement KeyedCalendarRateLimiter::cancel(std::string_view key, const std::string& id) { return settle(key, id, 0); }

void KeyedCalendarRateLimiter::refund(std::string_view key, std::int64_t permits) {
  policy_.refundOn(checkedKey(key), permits);
}

std::string KeyedCalendarRateLimiter::reservationKey(std::string_view key, const std::string& id) const {
  return detail::reservationRecordKey(checkedKey(key), id);
}

void KeyedCalendarRateLimiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                                               std::chrono::milliseconds recordTtl,
                                               CalendarRateLimiter::HeldCallback done) {
  onCheckedKey<HeldPermits>(key, std::move(done), [&](const std::string& k, CalendarRateLimiter::HeldCallback d) {
    policy_.reserveForOnAsync(k, permits, id, recordTtl, std::move(d));
  });
}

std::future<HeldPermits> KeyedCalendarRateLimiter::reserveForAsync(std::string_view key, std::int64_t permits,
                                                                   const std::string& id,
                                                                   std::chrono::milliseconds recordTtl) {
  return detail::futureOf<HeldPermits>([&](auto done) {
    reserveForAsync(key, permits, id, recordTtl, CalendarRateLimiter::HeldCallback(std::move(done)));
  });
}

void KeyedCalendarRateLimiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual,
                                           CalendarRateLimiter::SettleCallback done) {
  onCheckedKey<Settlement>(key, std::move(done), [&](const std::string& k, CalendarRateLimiter::SettleCallback d) {
    policy_.settleOnAsync(k, id, actual, std::move(d));
  });
}

std::future<Settlement> KeyedCalendarRateLimiter::settleAsync(std::string_view key, const std::string& id,
                                                              std::int64_t actual) {
  return detail::futureOf<Settlement>(
      [&](auto done) { settleAsync(key, id, actual, CalendarRateLimiter::SettleCallback(std::move(done))); });
}

CalendarWindow KeyedCalendarRateLimiter::windowAt(std::chrono::microseconds at) const { return policy_.windowAt(at); }

bool KeyedCalendarRateLimiter::deleteKey(std::string_view key) { return policy_.deleteOn(checkedKey(key)); }

const std::string& KeyedCalendarRateLimiter::getName() const noexcept { return policy_.getName(); }
const CalendarQuota& KeyedCalendarRateLimiter::quota() const noexcept { return policy_.quota(); }
FailureStats KeyedCalendarRateLimiter::failureStats() const { return policy_.failureStats(); }
const LimiterMonitor& KeyedCalendarRateLimiter::monitor() const noexcept { return policy_.monitor(); }

}  // namespace redlimit
