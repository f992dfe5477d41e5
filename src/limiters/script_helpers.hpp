// redlimit — what the limiter of the one-key scripts (ScriptCore, behind Limiter)
// and MultiLimit share: their errors, their monitor, their checks, reservation records, the
// replies of reserve and settle, and how tryAcquire and acquire wait. Defined in script_core.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "config/config_checks.hpp"
#include "redlimit/client.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/lease.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/limits.hpp"

namespace redlimit::detail {

class FailureGate;

/// The error a one-key script's call ended with, as ScriptCore reports it (a
/// WRONGTYPE from the script's read of `key` becomes ScriptError (InvalidConfig) naming it and the kind).
std::exception_ptr oneKeyScriptError(std::exception_ptr error, const std::string& key, char kind);
/// The monitor of a limiter named `name`, after the checks of its client and name (throws
/// InvalidArgument), as ScriptCore makes it.
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const LimiterMonitor::Options& monitor);
/// Throw InvalidArgument for permits to take outside 1..kMaxPermits, permits to refund outside
/// 0..kMaxPermits, a negative maxWait, a record TTL outside 1 ms..kMaxReservationTtl, actual
/// permits outside 0..kMaxPermits.
inline void checkPermitRange(std::int64_t permits) { checkCount("permits", permits, 1, kMaxPermits); }
/// checkPermitRange, and InvalidArgument above `most`, the most one call may take as the
/// configurations in the call say (`why`), naming the limiter as arrayReply does.
void checkPermitsUpTo(std::int64_t permits, std::int64_t most, std::string_view kind, std::string_view name,
                      std::string_view why);
inline void checkRefundPermits(std::int64_t permits) { checkCount("permits to refund", permits, 0, kMaxPermits); }
void checkMaxWait(std::chrono::microseconds maxWait);
void checkReservationTtl(std::chrono::milliseconds recordTtl);
inline void checkActualPermits(std::int64_t actual) { checkCount("actual permits", actual, 0, kMaxPermits); }
/// `r`, checked to be an array of `size` (else ReplyError (UnexpectedReply) naming the limiter,
/// `kind` then `name`: "limiter " and a key, or "" and a MultiLimit's label, and `what` answered).
const Reply& arrayReply(std::string_view kind, std::string_view name, const Reply& r, std::size_t size,
                        std::string_view what);
/// A lease renew's reply {renewed, expiry µs, now µs}: `lease` until its new expiry, or nullopt
/// when it was not live; and the first value of a reply {value, now µs} (a release's, held's) to
/// `op`. Checked as arrayReply.
std::optional<Lease> parseRenew(std::string_view kind, std::string_view name, const Reply& r, Lease lease);
std::int64_t firstOfTwo(std::string_view kind, std::string_view name, const Reply& r, std::string_view op);
/// A renew's answer `renewed` to `lease`: its new expiry when it was still held (true).
bool renewedTo(Lease& lease, const std::optional<Lease>& renewed);
/// The failure policy's decision of `permits` (allowed or not) for a limit last seen as `limit`.
Decision policyDecision(std::int64_t permits, bool allowed, std::int64_t limit);
/// The failure policy's decision of `permits` (checkPermitRange) without a reply (the segment
/// cache's wait that timed out), for a limit last seen as `rate` per `interval`: the policy's
/// answer, or TimeoutError naming the gate's limiter and `reason`.
bool decideUnanswered(FailureGate& gate, std::int64_t permits, std::int64_t rate, std::chrono::milliseconds interval,
                      const std::string& reason);
/// A lease Redis was not asked for (the failure policy's, or shadow mode's): a new id, no expiry.
Lease unheldLease(bool byPolicy, bool shadowDenied);
/// The `repeated` flag of a reserve reply (checking its shape: ReplyError (UnexpectedReply)).
bool parseReserveRepeated(const std::string& name, const Reply& reply);
/// A settle reply, counted in `monitor` when it settled (ReplyError (UnexpectedReply) for a bad shape).
Settlement parseSettlement(const std::string& name, const Reply& reply, const LimiterMonitor& monitor);
/// Counts `s` in `monitor` when it settled: the reservation, and what came back.
void countSettled(const LimiterMonitor& monitor, const Settlement& s);

/// A take of `permits` at most `maxWait` ahead, uncounted, through the call protocol (a limiter's
/// take op, run waiting).
using TakeWithin = std::function<Decision(std::chrono::microseconds maxWait)>;
/// tryAcquire with a timeout, for the limiter of `gate`: one take reserves `permits` if they come
/// within `timeout`, counted here, then this sleeps the delay on the gate's clock; false at once
/// when they do not (nothing taken). Shadow mode never waits: one take without a wait, counted (a
/// denial let through).
bool tryAcquireWithin(const FailureGate& gate, std::int64_t permits, std::chrono::milliseconds timeout,
                      const TakeWithin& take);
/// acquire, for the limiter of `gate`: takes `permits`, waiting as long as it takes (the failure
/// policy's denial: a probe interval), on the gate's clock; returns the time slept. Shadow mode
/// never waits: one take without a wait, counted (a denial let through).
std::chrono::microseconds acquireWaiting(const FailureGate& gate, std::int64_t permits, const TakeWithin& take);

}  // namespace redlimit::detail
