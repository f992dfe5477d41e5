// redlimit — KeyedCalendarRateLimiter: one calendar quota (per day, week or month of a time zone)
// applied to many keys, the quota sent in every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>

#include "redlimit/calendar_rate_limiter.hpp"
#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/settlement.hpp"

namespace redlimit {

/// One calendar quota for many keys, as the other keyed families: decide("{user:42}:daily")
/// counts in that key, CalendarRateLimiter's key (the same layout and script: a CalendarRateLimiter
/// on the key sees the same count), with the quota sent in the call, so a key needs no set-up and
/// expires keepAlive after its window ends. The policy's name is its metrics label and the limiter
/// named in events, never a key; the failure policy is the policy's, for all its keys (one outage
/// degrades every key; FailurePolicy::Local runs one local bucket of `limit` per window for all
/// of them in this process). Thread-safe; copies share one failure gate and one metrics series.
///
/// Errors: as CalendarRateLimiter's, and InvalidArgument before anything is sent for an empty key
/// or one longer than kMaxKeyLength.
class KeyedCalendarRateLimiter {
 public:
  static constexpr std::size_t kMaxKeyLength = CalendarRateLimiter::kMaxNameLength;  // bytes

  /// The policy `name` with `quota`. Sends nothing. Throws InvalidArgument as CalendarRateLimiter's
  /// constructor does.
  KeyedCalendarRateLimiter(std::shared_ptr<Client> client, std::string name, CalendarQuota quota,
                           CalendarRateLimiterOptions options = {});

  /// Takes `permits` (1..limit) from the current window of `key` if it has them. Never waits.
  [[nodiscard]] Decision decide(std::string_view key, std::int64_t permits = 1);
  /// decide(key, permits).allowed.
  [[nodiscard]] bool tryAcquire(std::string_view key, std::int64_t permits = 1);
  /// decide(key, permits) without waiting for the reply (CalendarRateLimiter::decideAsync).
  void decideAsync(std::string_view key, std::int64_t permits, CalendarRateLimiter::DecisionCallback done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<Decision> decideAsync(std::string_view key, std::int64_t permits = 1);
  /// What decide(key, permits) would answer now, writing nothing. Throws IoError when Redis cannot
  /// be asked.
  [[nodiscard]] Decision peek(std::string_view key, std::int64_t permits = 1);

  /// Reserve, then settle, on the quota of `key`, as CalendarRateLimiter's (reserveFor, settle,
  /// cancel, refund and their async forms; docs/algorithms.md "Reserve, then settle"): the record
  /// of `id` belongs to that key (reservationKey(key, id)), so one id may be used on several keys.
  /// Bad keys are refused as decide's are, before anything is sent.
  [[nodiscard]] HeldPermits reserveFor(
      std::string_view key, std::int64_t permits, const std::string& id,
      std::chrono::milliseconds recordTtl = CalendarRateLimiter::kDefaultReservationTtl);
  Settlement settle(std::string_view key, const std::string& id, std::int64_t actual);
  /// settle(key, id, 0).
  Settlement cancel(std::string_view key, const std::string& id);
  void refund(std::string_view key, std::int64_t permits);
  [[nodiscard]] std::string reservationKey(std::string_view key, const std::string& id) const;
  void reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                       std::chrono::milliseconds recordTtl, CalendarRateLimiter::HeldCallback done);
  [[nodiscard]] std::future<HeldPermits> reserveForAsync(
      std::string_view key, std::int64_t permits, const std::string& id,
      std::chrono::milliseconds recordTtl = CalendarRateLimiter::kDefaultReservationTtl);
  void settleAsync(std::string_view key, const std::string& id, std::int64_t actual,
                   CalendarRateLimiter::SettleCallback done);
  [[nodiscard]] std::future<Settlement> settleAsync(std::string_view key, const std::string& id, std::int64_t actual);

  /// The window that holds `at` (µs since the epoch), from the time zone database.
  [[nodiscard]] CalendarWindow windowAt(std::chrono::microseconds at) const;
  /// Deletes the key: its next decision opens a new window. True if it existed.
  bool deleteKey(std::string_view key);

  /// The policy's name.
  [[nodiscard]] const std::string& getName() const noexcept;
  [[nodiscard]] const CalendarQuota& quota() const noexcept;
  /// Decisions made under the failure policy (all keys), and whether the policy is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The policy's metrics, shadow mode and events.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 private:
  CalendarRateLimiter policy_;  // named after the policy; decides on the caller's keys

  static std::string checkedKey(std::string_view key);
  // go(checked key, done); a key the check refuses goes to `done` instead (isolated), nothing sent.
  template <class Out, class Go>
  void onCheckedKey(std::string_view key, std::function<void(Out, std::exception_ptr)> done, Go go);
};

}  // namespace redlimit
