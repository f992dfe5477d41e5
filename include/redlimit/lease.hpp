// redlimit — Lease: one place of a concurrency limit (a Limiter under Policy::concurrency, or the
// concurrency limits of a MultiLimit), held until it expires or is released.
#pragma once

#include <chrono>
#include <string>

namespace redlimit {

/// A lease: one of the `limit` places, held until it expires or is released.
struct Lease {
  std::string id;                          // 32 lowercase hex digits, random, unique per acquisition
  std::chrono::microseconds expiresAt{0};  // epoch µs on the server's clock (a MultiLimit's: the soonest of its
                                           // concurrency limits'); 0 when Redis holds no such lease
                                           // (granted by the failure policy or shadow mode)
  bool byPolicy = false;                   // granted by the failure policy: Redis was not asked
  bool shadowDenied = false;               // shadow mode let a denial through: Redis holds no lease
};

}  // namespace redlimit
