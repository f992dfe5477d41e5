// redlimit — HTTP helpers: a Decision as the response header fields a rate-limited web service
// sends (Retry-After, RateLimit-Policy, RateLimit, optionally X-RateLimit-*).
//
// Fields and the documents they come from:
//  * Retry-After (RFC 9110 §10.2.3): delay-seconds, a non-negative decimal integer. Sent only
//    with a denial; the decision's retryAfter (µs) is rounded UP to whole seconds, so a client
//    that waits the advertised time never comes back early (1 µs -> 1, exactly 2 s -> 2), and
//    never below 1 (a denial with retryAfter 0 says 1: "Retry-After: 0" asks for an instant retry).
//  * RateLimit-Policy and RateLimit, as defined by draft-ietf-httpapi-ratelimit-headers-11
//    (May 2026; syntax checked against its text). A -12 is said to exist; its text was not at hand
//    when this was last checked, so -11 is what is implemented: the field names,
//    Structured Field List syntax and the q/w/r/t parameters have been stable since -07, and a
//    client that reads -11 fields is what redlimit can test against. Both are Structured Field Lists
//    (RFC 9651) whose items are Strings naming the policy:
//        RateLimit-Policy: "default";q=100;w=60      q = quota, w = window in seconds (optional)
//        RateLimit: "default";r=42;t=7              r = available quota, t = effective window (s)
//    The policy name is always sent as an sf-string (the -11 draft requires a String item), so it
//    may hold any printable ASCII character; '"' and '\' are escaped.
//  * X-RateLimit-Limit / -Remaining / -Reset: the older triple that many APIs still send, opt-in
//    (HeaderOptions::xRateLimit). There is no standard for it; redlimit sends Reset as
//    delta-seconds, like the IETF drafts before -07 (GitHub's API sends epoch seconds instead).
//
// What the numbers mean:
//  * r = max(remaining, 0) (a limiter that owes time reports a negative `remaining`; clients
//    only ever see 0), capped at the largest sf-integer.
//  * t: when denied, retryAfter rounded up, at least 1 (the time within which the client can use nothing,
//    and never less than Retry-After, as the draft asks of responses carrying both); when
//    allowed, resetAfter rounded up (until the limiter is full again).
//  * A decision made by the failure policy (Decision::byPolicy: Redis was not asked) has no exact
//    numbers. The static RateLimit-Policy (and X-RateLimit-Limit) are still sent, RateLimit (and
//    X-RateLimit-Remaining/-Reset) are left out — the draft lets a server omit them on any
//    response (§6.2) and a guess would mislead clients — and Retry-After is sent for a denial
//    only when the policy supplied a positive estimate.
//
// Several limits (a MultiLimit's MultiDecision): the draft lets both fields carry a list, one
// item per policy, so each limit gets its own RateLimitPolicy (policies[i] describes limit i):
//     RateLimit-Policy: "user";q=10;w=1, "tenant";q=1000;w=60
//     RateLimit: "user";r=0;t=1, "tenant";r=993;t=60
//  * each item's r and t are its limit's, as above (t: when that limit alone denies, its own
//    retryAfter; else its resetAfter); the limit that denied the call (deniedBy) gets the
//    decision's combined retryAfter as t, the time at which the whole call succeeds, so no item
//    promises less than Retry-After;
//  * Retry-After is the combined retryAfter;
//  * X-RateLimit-* can describe one limit only: the one that denied, else the one with the least
//    remaining (the first of equals).
//
// All functions are pure (no I/O, no state) and thread-safe. Every structured-field integer is
// checked against the sf-integer range (at most 15 digits).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redlimit/decision.hpp"

namespace redlimit {
struct RateLimiterConfig;
class Policy;
}  // namespace redlimit

namespace redlimit::http {

/// The largest integer a Structured Field may carry (RFC 9651 §3.3.1: 15 digits).
inline constexpr std::int64_t kMaxSfInteger = 999'999'999'999'999;

/// A quota policy as RateLimit-Policy advertises it. Usually one constant per endpoint class.
struct RateLimitPolicy {
  std::string name = "default";    // policy identifier, sent as an sf-string: printable ASCII
                                   // (0x20..0x7E); may be empty
  std::int64_t quota = 0;          // q: quota units per window; 0..kMaxSfInteger
  std::chrono::seconds window{0};  // w: the window, seconds; 1..kMaxSfInteger, or 0 to omit w
};

/// The RateLimitPolicy a RateLimiter's configuration advertises, named `name`: q = rate,
/// w = rateInterval in seconds rounded up (at least 1, at most kMaxSfInteger; PerClient: each
/// client's own quota). Throws InvalidArgument for a configuration the limiter would refuse (its
/// validateConfig) or a name with a character outside 0x20..0x7E. Thread-safe.
[[nodiscard]] RateLimitPolicy policyOf(const RateLimiterConfig& config, std::string name = "default");
/// The RateLimitPolicy of a Limiter's Policy, named `name`: q = policy.limit(), the most permits
/// it grants at once (GCRA: burst, token bucket: capacity, fixed window: limit, smooth: the
/// permits it stores), w = policy.refillTime(), the time that many take to come back, in seconds
/// rounded up (at least 1, at most kMaxSfInteger). Throws InvalidArgument for a name with a
/// character outside 0x20..0x7E. Thread-safe.
[[nodiscard]] RateLimitPolicy policyOf(const Policy& policy, std::string name = "default");

/// Which fields rateLimitHeaders() produces.
struct HeaderOptions {
  bool ietf = true;         // RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-11)
  bool xRateLimit = false;  // X-RateLimit-Limit, -Remaining, -Reset (delta-seconds)
  bool retryAfter = true;   // Retry-After on a denial
};

/// Header fields as (name, value) pairs, in the order they should be sent.
using Headers = std::vector<std::pair<std::string, std::string>>;

/// Whole seconds to wait before retrying: retryAfter rounded up when denied, and at least 1 (a
/// hand-built denial with retryAfter 0 or less says 1 s, never 0); 0 when allowed. Thread-safe;
/// does not throw.
[[nodiscard]] std::int64_t retryAfterSeconds(const Decision& decision) noexcept;

/// The Retry-After field value (delta-seconds) for a denial, nullopt when allowed, and nullopt
/// for a denial by the failure policy with no positive estimate (see the file comment).
/// Thread-safe; does not throw (but std::bad_alloc).
[[nodiscard]] std::optional<std::string> retryAfterHeader(const Decision& decision);

/// The RateLimit-Policy field value of `policy`, e.g. `"default";q=100;w=60`.
/// Throws InvalidArgument for a name with a character outside 0x20..0x7E, a quota outside
/// 0..kMaxSfInteger, or a window outside 1..kMaxSfInteger seconds (0 omits w). Thread-safe.
[[nodiscard]] std::string rateLimitPolicyField(const RateLimitPolicy& policy);

/// The RateLimit field value for `decision` under `policy`, e.g. `"default";r=42;t=7`; nullopt
/// for a decision by the failure policy. Throws InvalidArgument for a bad policy (as above).
/// Thread-safe.
[[nodiscard]] std::optional<std::string> rateLimitField(const Decision& decision, const RateLimitPolicy& policy);

/// Every field a response should carry for `decision`: RateLimit-Policy, RateLimit (unless
/// byPolicy), the X-RateLimit triple if asked for, and Retry-After when denied (see
/// retryAfterHeader). Throws InvalidArgument for a bad policy. Thread-safe.
[[nodiscard]] Headers rateLimitHeaders(const Decision& decision, const RateLimitPolicy& policy,
                                       const HeaderOptions& options = {});

/// The RateLimit-Policy field value with one item per policy, e.g. `"user";q=10;w=1, "tenant";q=1000`.
/// Throws InvalidArgument for an empty list, two policies with one name, or a bad policy.
/// Thread-safe.
[[nodiscard]] std::string rateLimitPolicyField(const std::vector<RateLimitPolicy>& policies);

/// The RateLimit field value with one item per limit of `decision` (policies[i] names limit i),
/// e.g. `"user";r=0;t=1, "tenant";r=993;t=60`; nullopt for a decision by the failure policy.
/// Throws InvalidArgument unless there is one policy per limit, or for bad policies (as above).
/// Thread-safe.
[[nodiscard]] std::optional<std::string> rateLimitField(const MultiDecision& decision,
                                                        const std::vector<RateLimitPolicy>& policies);

/// Every field a response should carry for a MultiLimit's decision: RateLimit-Policy and
/// RateLimit with one item per limit, the X-RateLimit triple of one limit if asked for, and
/// Retry-After (the combined retryAfter) when denied. Throws InvalidArgument unless there is one
/// policy per limit, or for bad policies. Thread-safe.
[[nodiscard]] Headers rateLimitHeaders(const MultiDecision& decision, const std::vector<RateLimitPolicy>& policies,
                                       const HeaderOptions& options = {});

}  // namespace redlimit::http
