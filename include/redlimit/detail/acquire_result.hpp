// redlimit — detail::AcquireResult: the outcome of one attempt for a range of permits, as a source
// gives it to SegmentedRateLimiter (detail::SegmentAccess::tryAcquireUpTo). Internal: no public
// call answers it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace redlimit::detail {

/// The outcome of one attempt for between atLeast and atMost permits (the segment cache's refill,
/// see SegmentAccess). Over a Limiter key (no sorted-set member), `interval` is how long the
/// granted permits count against the key and `member` is empty.
struct AcquireResult {
  std::int64_t granted = 0;                // permits granted; 0 = denied
  std::chrono::microseconds wait{0};       // when denied: retry after this long, µs
  std::int64_t remaining = 0;              // permits left in the limiter after the call
  std::int64_t rate = 0;                   // the rate in force
  std::chrono::microseconds grantTime{0};  // the stamp of the grant, epoch µs (the
                                           // permits expire one interval later)
  std::chrono::milliseconds interval{0};   // the interval in force at this call, ms
  std::string member;                      // when granted: the sorted-set member written
  bool byPolicy = false;                   // decided by the failure policy: Redis was not
                                           // asked (no wait, remaining, rate or member)
};

}  // namespace redlimit::detail
