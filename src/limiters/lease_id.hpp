// redlimit — lease ids: 32 lowercase hex digits, made by the client before an acquire is sent (so
// that a resend takes one place), checked before anything is sent; and the bounds of a concurrency
// limit (Policy::concurrency, a lease's TTL), checked here for every caller.
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

inline constexpr std::int64_t kMaxLeases = 4294967295;                // a concurrency limit's most places
inline constexpr std::chrono::milliseconds kMaxLeaseTtl{4294967295};  // 49.7 days: lua/concurrency.lua's bound

inline std::string newLeaseId() { return hexOf(randomIdBytes()); }

inline void checkLeaseId(const std::string& id) {
  const bool ok = id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
                    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                  });
  if (!ok) {
    throw InvalidArgument(fmt::format("redlimit: a lease id is 32 lowercase hex digits, got \"{}\"", id.substr(0, 40)));
  }
}

inline void checkLeaseTtl(std::chrono::milliseconds ttl) {
  checkCount("leaseTtl (ms)", ttl.count(), 1, kMaxLeaseTtl.count());
}

/// A concurrency limit's parameters: `limit` places (1..kMaxLeases), leases of `leaseTtl`. Throws
/// InvalidArgument.
inline void checkLeaseLimit(std::int64_t limit, std::chrono::milliseconds leaseTtl) {
  checkCount("limit", limit, 1, kMaxLeases);
  checkLeaseTtl(leaseTtl);
}

}  // namespace redlimit::detail
