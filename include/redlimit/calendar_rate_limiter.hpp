// redlimit — CalendarRateLimiter: at most `limit` permits per calendar day, week or month of an
// IANA time zone ("1000 per day, resetting at midnight in Europe/Berlin"), in one Redis key.
#pragma once

#include <chrono>
#include <future>
#include <functional>
#include <exception>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/script_limiter.hpp"

namespace redlimit {

/// The calendar window a quota counts in.
enum class CalendarUnit {
  Day,    // local midnight to local midnight: 23 or 25 hours on a DST change
  Week,   // seven local days from the quota's weekStart
  Month,  // the first of the month to the first of the next, local midnight
};

/// A day of the week, numbered as C's tm_wday (Sunday 0).
enum class Weekday { Sunday = 0, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday };

/// A calendar quota: `limit` permits per `unit` in the time zone `zone`.
struct CalendarQuota {
  std::int64_t limit = 0;                 // permits per window, 1..kMaxPermits
  CalendarUnit unit = CalendarUnit::Day;  // the window
  std::string zone = "UTC";               // an IANA zone name of the system's database ("Europe/Berlin")
  Weekday weekStart = Weekday::Monday;    // CalendarUnit::Week: the first day of a week (default Monday)
};

/// One window of a quota: its calendar label and its bounds.
struct CalendarWindow {
  std::int64_t label = 0;              // days: local days since 1970-01-01; weeks: that of their first
                                       // day; months: year x 12 + month - 1
  std::chrono::microseconds start{0};  // the first instant in the window, since the epoch (UTC)
  std::chrono::microseconds end{0};    // the first instant after it, since the epoch (UTC)
};

/// Options of one CalendarRateLimiter handle.
struct CalendarRateLimiterOptions {
  FailureOptions failure;                                   // decisions when Redis cannot be asked (default: throw)
  MonitorOptions monitor;                                   // metrics (on, into MetricsRegistry::global()), shadow
                                                            // mode (off), events
  std::chrono::milliseconds keepAlive{kDefaultIdleMargin};  // the key expires this long after the end of
                                                            // its window (0..2^32-1 ms; default 1 s)
};

/// Computes `before` windows before the one holding `at` (µs since the epoch), that one, and
/// `after` after it, consecutive, from the system's time zone database (/usr/share/zoneinfo, read
/// by Howard Hinnant's date/tz, the basis of C++20's <chrono> zones). A day starts at the first
/// instant of its local date: local midnight, or the end of a DST gap that skips midnight; where
/// midnight occurs twice, the first. Thread-safe. Throws InvalidArgument for a bad quota (as
/// CalendarRateLimiter::validateQuota), `before` or `after` outside 0..3, or `at` before 1970.
[[nodiscard]] std::vector<CalendarWindow> calendarWindows(const CalendarQuota& quota, std::chrono::microseconds at,
                                                          int before = 1, int after = 2);

/// A calendar quota shared by every process that uses its name: at most `limit` permits in each
/// calendar day, week or month of an IANA time zone, with DST handled (a 23- and a 25-hour day).
///
/// How a window is chosen (lua/calendar_quota.lua, docs/algorithms.md "Calendar quotas"): the
/// client computes from its time zone database a table of four consecutive windows (the previous,
/// the current and the next two, around the server's time as last seen) and sends it; the script
/// picks the window with the server's clock (TIME). The key holds the window it opened (label,
/// bounds, count) and is authoritative until that window ends: windows are identified by label,
/// never reopened and never overlap, so two clients with different database versions cannot open
/// two windows for one day. If the server's time is outside the table (the client's clock is far
/// off), the script answers with its time and the client sends a table around it, once more.
///
/// Decisions are exact: retryAfter of a denial and resetAfter are the window's end minus the
/// server's now (resetAfter 0 while nothing is counted); the permits are never reserved ahead.
///
/// Reserve, then settle (docs/algorithms.md "Reserve, then settle"): reserveFor records a grant
/// under an id with the window it was counted in; settle gives back the unused permits once, to
/// that window only (a settle after it ended gives back nothing: its count is gone), or charges
/// the permits used beyond the reservation in the window in force, up to the limit (the rest is
/// unpaid: nothing is counted ahead in the next window).
///
/// Storage: one string key, the name, 28 bytes (unit, limit, label, bounds, count), written only
/// by a grant, with a TTL to the window's end plus keepAlive. The quota is sent in every call (the
/// limit is the caller's: a key counted under another keeps its count). Thread-safe; copies share
/// one failure gate.
///
/// Errors: InvalidArgument before anything is sent (bad quota, unknown zone, bad week start,
/// limit or permits out of range); InvalidConfigError if the key holds another Redis type or
/// another kind of limiter, InvalidStateError if it holds an unusable window (nothing is written
/// then); IoError and subclasses when Redis cannot be asked, which the failure policy decides for
/// decide and tryAcquire (Decision::byPolicy), as for the other limiters.
class CalendarRateLimiter {
 public:
  static constexpr std::int64_t kMaxPermits = 4294967295;  // uint32 in the key
  static constexpr std::size_t kMaxNameLength = 1024;      // bytes

  /// A handle on the quota whose key is `name`. Sends nothing. Throws InvalidArgument for a null
  /// client, an empty or too long name, a bad quota (validateQuota) or bad options.
  CalendarRateLimiter(std::shared_ptr<Client> client, std::string name, CalendarQuota quota,
                      CalendarRateLimiterOptions options = {});

  /// The checks every handle makes before it sends anything: limit in 1..kMaxPermits, a known
  /// unit, weekStart in Sunday..Saturday, a zone the system's database has. Throws InvalidArgument.
  static void validateQuota(const CalendarQuota& quota);

  /// Takes `permits` (1..limit) if the current window has them left. Never waits. When Redis cannot
  /// be asked, the failure policy decides (Decision::byPolicy).
  [[nodiscard]] Decision decide(std::int64_t permits = 1);
  /// decide(permits).allowed.
  [[nodiscard]] bool tryAcquire(std::int64_t permits = 1);
  /// decide() without waiting for the reply: `done` gets the decision (the failure policy's when
  /// Redis cannot be asked) or the error, once, on the Client's I/O thread (at once on this thread
  /// when refused before sending, or decided by the policy without asking). It must not block or
  /// make sync calls; one that throws is reported (events) and counted, not run again.
  using DecisionCallback = std::function<void(Decision decision, std::exception_ptr error)>;
  void decideAsync(std::int64_t permits, DecisionCallback done);
  /// decideAsync with a future.
  [[nodiscard]] std::future<Decision> decideAsync(std::int64_t permits = 1);
  /// What decide(permits) would answer now, taking nothing. Throws IoError when Redis cannot be asked.
  [[nodiscard]] Decision peek(std::int64_t permits = 1);

  /// How long a reservation record lives unless reserveFor is told otherwise: 1 hour.
  static constexpr std::chrono::milliseconds kDefaultReservationTtl = detail::ScriptLimiter::kDefaultReservationTtl;
  /// Takes `permits` (1..limit) as decide(permits) does and, when granted, records them under the
  /// reservation `id` with the window they were counted in, in a key of their own
  /// (reservationKey(id), same hash slot, written in the same script call) that expires after
  /// `recordTtl` (1 ms..7 days). Idempotent: the same id again takes nothing more and answers the
  /// first grant (HeldPermits::repeated); with other permits it is refused (InvalidArgument from
  /// the script). A denial records nothing. When Redis cannot be asked the failure policy decides
  /// and nothing is recorded. Sent again after a closed connection (the record makes that safe).
  /// Throws InvalidArgument before sending for permits out of range, a bad id (1..128 bytes of
  /// [A-Za-z0-9._:-]) or recordTtl, or a name no record key can share a slot with
  /// (reservationKey); InvalidStateError if the record holds something redlimit did not write.
  [[nodiscard]] HeldPermits reserveFor(std::int64_t permits, const std::string& id,
                                       std::chrono::milliseconds recordTtl = kDefaultReservationTtl);
  /// Settles the reservation `id` with the permits really used (`actual`, 0..kMaxPermits), once:
  /// gives back reserved - actual to the window the grant was counted in while that window is in
  /// force (nothing once it has ended), or takes actual - reserved more in the window in force, up
  /// to the limit, reporting the rest as unpaid. A retry answers AlreadySettled with the first
  /// answer and changes nothing; no record: SettleStatus::Unknown. The give-back is counted in the
  /// metrics' permitsRefunded. Safe to retry (sent again after a closed connection). Not a
  /// decision: throws the IoError when Redis cannot be asked; InvalidArgument before sending for
  /// a bad id or actual; InvalidStateError naming the record key for a record redlimit did not
  /// write or one of another kind of limiter (nothing written then).
  Settlement settle(const std::string& id, std::int64_t actual);
  /// settle(id, 0): gives the whole reservation back.
  Settlement cancel(const std::string& id);
  /// Gives `permits` (0..kMaxPermits) back to the window in force (its count never below 0),
  /// counted in the metrics' permitsRefunded. Never sent again after a closed connection (a second
  /// could give back twice): the ClosedError reaches the caller. Throws IoError when Redis cannot
  /// be asked; InvalidArgument before sending for permits out of range.
  void refund(std::int64_t permits);
  /// The key of the reservation record `id`: name + ":rsv:" + id if the name has a hash tag, else
  /// "{" + name + "}:rsv:" + id. Throws InvalidArgument for a bad id, and for a name without a hash
  /// tag that holds a '}'.
  [[nodiscard]] std::string reservationKey(const std::string& id) const;

  /// How an asynchronous reserveFor and settle end: what the sync call would return (error ==
  /// nullptr) or the exception it would have thrown; called once, as DecisionCallback is.
  using HeldCallback = detail::ScriptLimiter::HeldCallback;
  using SettleCallback = detail::ScriptLimiter::SettleCallback;
  /// reserveFor without waiting for the reply: the same answers, failure policy, shadow mode and
  /// metrics. Bad arguments and the failure policy while the limiter is degraded reach `done` on
  /// this thread before the call returns, with nothing sent.
  void reserveForAsync(std::int64_t permits, const std::string& id, std::chrono::milliseconds recordTtl,
                       HeldCallback done);
  /// reserveForAsync with the default record TTL.
  void reserveForAsync(std::int64_t permits, const std::string& id, HeldCallback done);
  /// reserveForAsync with a future.
  [[nodiscard]] std::future<HeldPermits> reserveForAsync(std::int64_t permits, const std::string& id,
                                                         std::chrono::milliseconds recordTtl = kDefaultReservationTtl);
  /// settle without waiting for the reply: the same answers and metrics; an IoError reaches `done`
  /// (no failure policy). Bad arguments reach `done` on this thread, nothing sent.
  void settleAsync(const std::string& id, std::int64_t actual, SettleCallback done);
  /// settleAsync with a future.
  [[nodiscard]] std::future<Settlement> settleAsync(const std::string& id, std::int64_t actual);

  /// The window holding `at` by this handle's database (not necessarily the one the key holds).
  [[nodiscard]] CalendarWindow windowAt(std::chrono::microseconds at) const;
  /// Deletes the quota's key. True if it existed.
  bool deleteLimiter();
  /// True if the quota's key exists.
  [[nodiscard]] bool isExists();

  [[nodiscard]] const std::string& getName() const noexcept;
  [[nodiscard]] const CalendarQuota& quota() const noexcept;
  [[nodiscard]] const std::shared_ptr<Client>& client() const noexcept;
  /// Decisions made under the failure policy, and whether the limiter is degraded now.
  [[nodiscard]] FailureStats failureStats() const;
  /// The handle's metrics, shadow mode and events.
  [[nodiscard]] const LimiterMonitor& monitor() const noexcept;

 private:
  friend class KeyedCalendarRateLimiter;
  friend class Limiter;  // under Policy::calendar, on its keys

  // Reservation records in redlimit's namespace (a Limiter's keys), and the record of `key`.
  void useNamespacedRecords() noexcept;
  [[nodiscard]] std::string recordKeyOn(const std::string& key, const std::string& id) const;
  class Core;
  std::shared_ptr<Core> core_;

  // decide and peek on `key` instead of the name (KeyedCalendarRateLimiter: the name is the
  // policy's, for metrics and events).
  Decision decideOn(const std::string& key, std::int64_t permits);
  Decision peekOn(const std::string& key, std::int64_t permits);
  void decideOnAsync(const std::string& key, std::int64_t permits, DecisionCallback done);
  bool deleteOn(const std::string& key);
  // Reserve, then settle, and refund, on `key` (the Core's operations).
  HeldPermits reserveForOn(const std::string& key, std::int64_t permits, const std::string& id,
                           std::chrono::milliseconds recordTtl);
  void reserveForOnAsync(const std::string& key, std::int64_t permits, const std::string& id,
                         std::chrono::milliseconds recordTtl, HeldCallback done);
  Settlement settleOn(const std::string& key, const std::string& id, std::int64_t actual);
  void settleOnAsync(const std::string& key, const std::string& id, std::int64_t actual, SettleCallback done);
  void refundOn(const std::string& key, std::int64_t permits);
};

}  // namespace redlimit
