// redlimit — lease ids: 32 lowercase hex digits, made by the client before an acquire is sent (so
// that a resend takes one place), checked before anything is sent; and the bound of a lease's TTL
// (Policy::concurrency, acquire, renew, the heartbeat), checked here for every caller.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "base/random.hpp"
#include "config/config_checks.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

inline std::string newLeaseId() { return hexOf(randomIdBytes()); }

inline void checkLeaseId(const std::string& id) {
  const bool ok = id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
                    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                  });
  if (!ok) {
    throw InvalidArgument(fmt::format("redlimit: a lease id is 32 lowercase hex digits, got \"{}\"", id.substr(0, 40)));
  }
}

// lua/concurrency.lua's bound: a uint32 of ms, 49.7 days.
inline void checkLeaseTtl(std::chrono::milliseconds ttl) {
  checkCount("leaseTtl (ms)", ttl.count(), 1, kMaxInterval.count());
}

}  // namespace redlimit::detail
