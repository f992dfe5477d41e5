// redlimit — a calendar quota over any number of keys (lua/calendar_quota.lua): at most `limit`
// permits per calendar day, week or month of an IANA time zone per key, the quota sent in every
// call. Every operation takes the key per call, through the call protocol (limiter_call.hpp);
// Limiter under Policy::calendar is its face.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "limiters/calendar_tables.hpp"
#include "limiters/limiter_call.hpp"
#include "limiters/permit_core.hpp"
#include "limiters/script_call.hpp"
#include "redlimit/calendar.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/failure_gate.hpp"

namespace redlimit::detail {

struct DecisionReply;

/// Throws InvalidArgument unless `quota` is usable: limit in 1..kMaxCalendarPermits, a known unit,
/// weekStart in Sunday..Saturday, a zone the system's database has.
void checkCalendarQuota(const CalendarQuota& quota);

/// `before` windows before the one holding `at` (µs since the epoch), that one, and `after` after
/// it, consecutive, from the system's time zone database (Policy::windowAt says how a day starts).
/// Throws InvalidArgument for a bad quota, `before` or `after` outside 0..3, or `at` before 1970.
[[nodiscard]] std::vector<CalendarWindow> calendarWindows(const CalendarQuota& quota, std::chrono::microseconds at,
                                                          int before, int after);

/// The configuration multi.lua takes for a calendar limit ahead of its table (lua/lib/calendar_core.lua's
/// calendarWithConfig): 'Q', the unit, the limit and `keepAlive` ms (uint32s, little-endian). Throws
/// InvalidArgument for a bad quota or keepAlive (0..2^32-1 ms).
[[nodiscard]] std::string calendarConfig(const CalendarQuota& quota, std::chrono::milliseconds keepAlive);

class CalendarCore : public PermitCore, public std::enable_shared_from_this<CalendarCore> {
 public:
  using DecisionDone = std::function<void(Decision, std::exception_ptr)>;
  using SettleDone = std::function<void(Settlement, std::exception_ptr)>;

  /// Sends nothing. Throws InvalidArgument for a null client, a bad name, quota, keepAlive
  /// (0..2^32-1 ms: how long a key outlives its window) or failure options.
  CalendarCore(std::shared_ptr<Client> client, std::string name, CalendarQuota quota,
               std::chrono::milliseconds keepAlive, FailureOptions failure, const LimiterMonitor::Options& monitor);

  /// Takes `permits` (1..limit) from the window in force on `key` (the failure gate first: an
  /// outage is the failure policy's), counted. Sent again after a closed connection: it may count
  /// twice, never grant twice.
  Decision decide(const std::string& key, std::int64_t permits) override;
  /// decide() without waiting; `done` isolated, once.
  void decideAsync(const std::string& key, std::int64_t permits, DecisionDone done) override;
  /// What decide() would answer, writing nothing; its IoError reaches the caller.
  Decision peek(const std::string& key, std::int64_t permits) override;
  void peekAsync(const std::string& key, std::int64_t permits, DecisionDone done) override;
  /// decide() under the record of `id` (recordKey) for `recordTtl`, counted; sent again after a
  /// closed connection (a resend answers repeated). Bad id or TTL: InvalidArgument before sending.
  Decision reserveFor(const std::string& key, std::int64_t permits, const std::string& id,
                      std::chrono::milliseconds recordTtl) override;
  void reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id,
                       std::chrono::milliseconds recordTtl, DecisionDone done) override;
  /// Settles the record `id` of `key` with `actual` (0..kMaxCalendarPermits), once: the unused
  /// back to the window it was counted in while that is in force, the extra charged to the window
  /// in force up to the limit. Safe to send again (a second answers AlreadySettled).
  Settlement settle(const std::string& key, const std::string& id, std::int64_t actual) override;
  void settleAsync(const std::string& key, const std::string& id, std::int64_t actual, SettleDone done) override;
  /// Gives `permits` (0..kMaxCalendarPermits) back to the window in force on `key` (its count never
  /// below 0), counted; never sent again (it could give back twice).
  void refund(const std::string& key, std::int64_t permits) override;
  void refundAsync(const std::string& key, std::int64_t permits, Done<bool> done) override;
  /// DEL of `key` (not sent again) and EXISTS (sent again after a closed connection).
  bool deleteKey(const std::string& key) override;
  void deleteKeyAsync(const std::string& key, Done<bool> done) override;
  bool exists(const std::string& key) override;
  void existsAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) override;
  /// The record `id` of `key`, in redlimit's namespace (namespacedRecordKey).
  [[nodiscard]] std::string recordKey(const std::string& key, const std::string& id) const override;
  [[nodiscard]] const std::string& coreName() const noexcept override { return name_; }
  [[nodiscard]] const std::shared_ptr<Client>& coreClient() const noexcept override { return client_; }
  [[nodiscard]] const FailureGate& coreGate() const noexcept override { return gate_; }

  std::shared_ptr<Client> client_;
  std::string name_;
  CalendarQuota quota_;
  FailureGate gate_;
  std::chrono::milliseconds callBound_{0};  // connect + command timeout, saturated

 private:
  // One script call: `op` of `count` on `key` (count: the permits of take, peek and reserve, the
  // actual permits of settle, the permits of refund), with the record `recordKey` (KEYS[2] of
  // reserve and settle; empty: none) and, for reserve, its TTL.
  struct Call {
    std::string key;
    std::string op;
    std::int64_t count = 0;
    std::string recordKey;
    std::chrono::milliseconds recordTtl{0};
  };

  // The script call of `c`; its table is filled around the server's now in every try (tables_).
  ScriptRequest request(const Call& c) const;
  template <class Parse, class ByPolicy>
  auto call(const LimiterCall::Params& params, std::string_view what, const Call& c, Parse&& parse,
            ByPolicy&& byPolicy);
  template <class Out, class Parse, class ByPolicy>
  void callAsync(const LimiterCall::Params& params, const Call& c, Parse parse, ByPolicy byPolicy,
                 std::function<void(Out, std::exception_ptr)> done);
  // The decision in a take or peek reply, and in a reserve reply; `self` (null: the limiter is
  // gone) remembers the server's time and the Local policy's interval.
  static Decision parse(CalendarCore* self, const std::string& key, const Reply& r, std::int64_t permits);
  static Decision held(CalendarCore* self, const std::string& key, const Reply& r, std::int64_t permits);
  void saw(const DecisionReply& v);
  LimiterCall::Params decision(std::int64_t permits) const;
  Call reserveCall(const std::string& key, std::int64_t permits, const std::string& id,
                   std::chrono::milliseconds recordTtl) const;
  Call settleCall(const std::string& key, const std::string& id, std::int64_t actual) const;
  void checkPermits(std::int64_t permits) const;
  void checkRefund(std::int64_t permits) const;
  static std::int64_t parseRefund(const std::string& key, const Reply& r);
  Decision byPolicy(std::int64_t permits, bool allowed) const;

  std::shared_ptr<CalendarTables> tables_;               // the table at ARGV[8], the server's time as seen
  std::string keepAlive_;                                // ms, as sent
  std::atomic<std::int64_t> localIntervalMs_{86400000};  // the Local policy's interval: the last window's length
};

}  // namespace redlimit::detail
