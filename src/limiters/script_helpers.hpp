// redlimit — what the limiter of the one-key scripts (ScriptCore, behind Limiter)
// and MultiLimit share: their errors, their monitor, reservation records, and the checks and
// replies of reserve and settle. Defined in script_core.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>

#include "redlimit/client.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/settlement.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/limits.hpp"

namespace redlimit::detail {

/// The error a one-key script's call ended with, as ScriptCore reports it (a
/// WRONGTYPE from the script's read of `key` becomes ScriptError (InvalidConfig) naming it and the kind).
std::exception_ptr oneKeyScriptError(std::exception_ptr error, const std::string& key, char kind);
/// The monitor of a limiter named `name`, after the checks of its client and name (throws
/// InvalidArgument), as ScriptCore makes it.
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const LimiterMonitor::Options& monitor);
/// Throw InvalidArgument for a record TTL outside 1 ms..kMaxReservationTtl, actual permits outside
/// 0..kMaxPermits.
void checkReservationTtl(std::chrono::milliseconds recordTtl);
void checkActualPermits(std::int64_t actual);
/// The `repeated` flag of a reserve reply (checking its shape: ReplyError (UnexpectedReply)).
bool parseReserveRepeated(const std::string& name, const Reply& reply);
/// A settle reply, counted in `monitor` when it settled (ReplyError (UnexpectedReply) for a bad shape).
Settlement parseSettlement(const std::string& name, const Reply& reply, const LimiterMonitor& monitor);

}  // namespace redlimit::detail
