// Unit tests of the HTTP helpers (redlimit/http.hpp): Retry-After rounding, the IETF RateLimit
// fields' syntax (draft-ietf-httpapi-ratelimit-headers-11), the X-RateLimit option, decisions made
// by the failure policy, and policy validation.
#include "redlimit/http.hpp"
#include "redlimit/policy.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "redlimit/errors.hpp"
#include "redlimit/rate_limiter_config.hpp"

namespace {

using namespace redlimit;
using namespace redlimit::http;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

Decision denied(std::int64_t retryUs, std::int64_t remaining = 0) {
  Decision d;
  d.allowed = false;
  d.permits = 1;
  d.remaining = remaining;
  d.retryAfter = microseconds{retryUs};
  d.resetAfter = microseconds{60'000'000};
  d.limit = 100;
  return d;
}

Decision allowed(std::int64_t remaining, std::int64_t resetUs) {
  Decision d;
  d.allowed = true;
  d.permits = 1;
  d.remaining = remaining;
  d.resetAfter = microseconds{resetUs};
  d.limit = 100;
  return d;
}

const RateLimitPolicy kPolicy{"default", 100, seconds{60}};

TEST(HttpRetryAfter, RoundsUpToWholeSeconds) {
  EXPECT_EQ(retryAfterSeconds(denied(1)), 1);
  EXPECT_EQ(retryAfterSeconds(denied(999'999)), 1);
  EXPECT_EQ(retryAfterSeconds(denied(1'000'000)), 1);
  EXPECT_EQ(retryAfterSeconds(denied(1'000'001)), 2);
  EXPECT_EQ(retryAfterSeconds(denied(2'000'000)), 2);
  EXPECT_EQ(retryAfterSeconds(denied(0)), 1) << "a denial never says 0";
  EXPECT_EQ(retryAfterSeconds(denied(-5)), 1);
  const std::int64_t most = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(retryAfterSeconds(denied(most)), most / 1'000'000 + 1);
  EXPECT_EQ(retryAfterHeader(denied(1)), "1");
  EXPECT_EQ(retryAfterHeader(denied(2'000'000)), "2");
  EXPECT_EQ(retryAfterHeader(denied(2'000'001)), "3");
}

TEST(HttpRetryAfter, OnlyWhenDenied) {
  Decision d = allowed(5, 1'000'000);
  d.retryAfter = microseconds{3'000'000};  // ignored when allowed
  EXPECT_EQ(retryAfterSeconds(d), 0);
  EXPECT_EQ(retryAfterHeader(d), std::nullopt);
}

TEST(HttpRateLimit, PolicyFieldSyntax) {
  EXPECT_EQ(rateLimitPolicyField(kPolicy), R"("default";q=100;w=60)");
  EXPECT_EQ(rateLimitPolicyField({"per-user", 0, seconds{0}}), R"("per-user";q=0)");  // w left out
  EXPECT_EQ(rateLimitPolicyField({"", 5, seconds{1}}), R"("";q=5;w=1)");
  EXPECT_EQ(rateLimitPolicyField({R"(a"b\c)", 1, seconds{1}}), R"("a\"b\\c";q=1;w=1)");
  EXPECT_EQ(rateLimitPolicyField({"x", kMaxSfInteger, seconds{kMaxSfInteger}}),
            R"("x";q=999999999999999;w=999999999999999)");
}

TEST(HttpRateLimit, FieldSyntaxAndNumbers) {
  EXPECT_EQ(rateLimitField(allowed(42, 6'000'001), kPolicy), R"("default";r=42;t=7)");
  EXPECT_EQ(rateLimitField(allowed(42, 0), kPolicy), R"("default";r=42;t=0)");
  // Denied: t is the retry wait (never shorter than Retry-After), r clamped at 0.
  EXPECT_EQ(rateLimitField(denied(1, -3), kPolicy), R"("default";r=0;t=1)");
  EXPECT_EQ(rateLimitField(denied(2'000'000), kPolicy), R"("default";r=0;t=2)");
  EXPECT_EQ(rateLimitField(allowed(std::numeric_limits<std::int64_t>::max(), 1), kPolicy),
            R"("default";r=999999999999999;t=1)");
}

TEST(HttpRateLimit, HeadersInOrder) {
  const Headers denial = rateLimitHeaders(denied(1'500'000), kPolicy);
  const Headers expected{
      {"RateLimit-Policy", R"("default";q=100;w=60)"}, {"RateLimit", R"("default";r=0;t=2)"}, {"Retry-After", "2"}};
  EXPECT_EQ(denial, expected);
  const Headers grant = rateLimitHeaders(allowed(9, 500'000), kPolicy);
  const Headers expectedGrant{{"RateLimit-Policy", R"("default";q=100;w=60)"}, {"RateLimit", R"("default";r=9;t=1)"}};
  EXPECT_EQ(grant, expectedGrant);
}

TEST(HttpRateLimit, XRateLimitOption) {
  HeaderOptions o;
  o.ietf = false;
  o.xRateLimit = true;
  const Headers h = rateLimitHeaders(denied(2'000'000, -1), kPolicy, o);
  const Headers expected{
      {"X-RateLimit-Limit", "100"}, {"X-RateLimit-Remaining", "0"}, {"X-RateLimit-Reset", "2"}, {"Retry-After", "2"}};
  EXPECT_EQ(h, expected);
  o.retryAfter = false;
  EXPECT_EQ(rateLimitHeaders(denied(2'000'000), kPolicy, o).size(), 3u);
}

TEST(HttpRateLimit, DecisionByPolicyHasNoLiveNumbers) {
  Decision d = denied(0);
  d.byPolicy = true;
  HeaderOptions o;
  o.xRateLimit = true;
  const Headers h = rateLimitHeaders(d, kPolicy, o);
  const Headers expected{{"RateLimit-Policy", R"("default";q=100;w=60)"}, {"X-RateLimit-Limit", "100"}};
  EXPECT_EQ(h, expected);
  EXPECT_EQ(rateLimitField(d, kPolicy), std::nullopt);
  EXPECT_EQ(retryAfterHeader(d), std::nullopt);
  d.retryAfter = microseconds{250'000};  // the policy's estimate, when it has one
  EXPECT_EQ(retryAfterHeader(d), "1");
  Decision a = allowed(0, 0);
  a.byPolicy = true;
  EXPECT_EQ(rateLimitHeaders(a, kPolicy).size(), 1u);
}

TEST(HttpRateLimit, RejectsBadPolicies) {
  EXPECT_THROW((void)rateLimitPolicyField({"caf\xc3\xa9", 1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({"tab\there", 1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({std::string("nul\0", 4), 1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({"x\x7f", 1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({"x", -1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({"x", kMaxSfInteger + 1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({"x", 1, seconds{-1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({"x", 1, seconds{kMaxSfInteger + 1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitField(allowed(1, 1), {"x", -1, seconds{1}}), InvalidArgument);
  EXPECT_THROW((void)rateLimitHeaders(allowed(1, 1), {"\n", 1, seconds{1}}), InvalidArgument);
  try {
    (void)rateLimitPolicyField({"ab\x01", 1, seconds{1}});
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("0x01 at offset 2"), std::string::npos) << e.what();
  }
}

// --- Several limits (a MultiLimit's decision) ---------------------------------------------------

// user: 10 per second, denying alone (0 left, 0.4 s); tenant: 1000 per minute, 993 left; the
// combined call succeeds in 2.5 s (a fixed window in the set, say).
MultiDecision multiDenied() {
  MultiDecision d;
  d.allowed = false;
  d.permits = 1;
  d.remaining = 0;
  d.retryAfter = microseconds{2'500'000};
  d.resetAfter = microseconds{60'000'000};
  d.limit = 10;
  d.deniedBy = 0;
  Decision user = denied(400'000, 0);
  user.limit = 10;
  user.resetAfter = microseconds{1'000'000};
  Decision tenant = allowed(993, 59'500'000);
  tenant.limit = 1000;
  d.limits = {user, tenant};
  return d;
}

const std::vector<RateLimitPolicy> kPolicies{{"user", 10, seconds{1}}, {"tenant", 1000, seconds{60}}};

TEST(HttpMultiLimit, OneItemPerLimitAndRetryAfterOfTheWholeCall) {
  const Headers h = rateLimitHeaders(multiDenied(), kPolicies);
  const Headers expected{{"RateLimit-Policy", R"("user";q=10;w=1, "tenant";q=1000;w=60)"},
                         {"RateLimit", R"("user";r=0;t=3, "tenant";r=993;t=60)"},
                         {"Retry-After", "3"}};
  EXPECT_EQ(h, expected);
  EXPECT_EQ(rateLimitPolicyField(kPolicies), R"("user";q=10;w=1, "tenant";q=1000;w=60)");
}

TEST(HttpMultiLimit, AllowedItemsSayWhenEachIsFull) {
  MultiDecision d = multiDenied();
  d.allowed = true;
  d.deniedBy = Decision::kNone;
  d.retryAfter = microseconds{0};
  d.limits[0] = allowed(4, 600'000);
  d.limits[1] = allowed(993, 59'500'000);
  EXPECT_EQ(rateLimitField(d, kPolicies), R"("user";r=4;t=1, "tenant";r=993;t=60)");
  HeaderOptions o;
  o.ietf = false;
  o.xRateLimit = true;
  const Headers x = rateLimitHeaders(d, kPolicies, o);
  const Headers expected{{"X-RateLimit-Limit", "10"}, {"X-RateLimit-Remaining", "4"}, {"X-RateLimit-Reset", "1"}};
  EXPECT_EQ(x, expected) << "the triple describes the limit with the least remaining";
}

TEST(HttpMultiLimit, XRateLimitDescribesTheLimitThatDenied) {
  MultiDecision d = multiDenied();
  d.deniedBy = 1;
  d.limits[1] = denied(2'000'000, 0);
  HeaderOptions o;
  o.ietf = false;
  o.xRateLimit = true;
  const Headers x = rateLimitHeaders(d, kPolicies, o);
  const Headers expected{
      {"X-RateLimit-Limit", "1000"}, {"X-RateLimit-Remaining", "0"}, {"X-RateLimit-Reset", "3"}, {"Retry-After", "3"}};
  EXPECT_EQ(x, expected);
}

TEST(HttpMultiLimit, DecisionByPolicyHasNoLiveNumbers) {
  MultiDecision d = multiDenied();
  d.byPolicy = true;
  EXPECT_EQ(rateLimitField(d, kPolicies), std::nullopt);
  const Headers h = rateLimitHeaders(d, kPolicies);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].first, "RateLimit-Policy");
  EXPECT_EQ(h[1].first, "Retry-After");
}

TEST(HttpMultiLimit, RejectsPolicyListsThatDoNotFit) {
  EXPECT_THROW((void)rateLimitHeaders(multiDenied(), std::vector<RateLimitPolicy>{kPolicies[0]}), InvalidArgument);
  EXPECT_THROW((void)rateLimitField(multiDenied(), {kPolicies[0], kPolicies[1], kPolicy}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField(std::vector<RateLimitPolicy>{}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({kPolicies[0], kPolicies[0]}), InvalidArgument);
  EXPECT_THROW((void)rateLimitPolicyField({kPolicies[0], RateLimitPolicy{"bad", -1, seconds{1}}}), InvalidArgument);
  // A MultiDecision is a Decision: the single-policy helpers take its combined numbers.
  EXPECT_EQ(rateLimitField(multiDenied(), kPolicy), R"("default";r=0;t=3)");
}

}  // namespace

// A hand-built denial with retryAfter 0 renders Retry-After: 1 (and t=1), never
// Retry-After: 0 on a 429.
TEST(HttpRetryAfter, DenialNeverSaysRetryAfterZero) {
  Decision d;
  d.allowed = false;
  d.limit = 10;
  RateLimitPolicy p;
  p.quota = 10;
  p.window = std::chrono::seconds(1);
  EXPECT_EQ(retryAfterHeader(d), "1");
  EXPECT_EQ(rateLimitField(d, p), R"("default";r=0;t=1)");
  const Headers h = rateLimitHeaders(d, p);
  ASSERT_FALSE(h.empty());
  EXPECT_EQ(h.back(), (std::pair<std::string, std::string>{"Retry-After", "1"}));
  d.byPolicy = true;  // the failure policy's denial without an estimate still says nothing
  EXPECT_EQ(retryAfterHeader(d), std::nullopt);
}

// The policy a RateLimiter's configuration advertises: q its rate, w its interval rounded up to
// whole seconds.
TEST(HttpPolicyOf, ARateLimiterConfiguration) {
  RateLimiterConfig r;
  r.rate = 3;
  r.rateInterval = milliseconds(60001);
  EXPECT_EQ(policyOf(r).quota, 3);
  EXPECT_EQ(policyOf(r).window, seconds(61));
  EXPECT_EQ(policyOf(r).name, "default");
}

// A Limiter's Policy: q its limit(), w its refillTime() rounded up to whole seconds.
TEST(HttpPolicyOf, EachPolicy) {
  EXPECT_EQ(rateLimitPolicyField(policyOf(Policy::gcra(5, milliseconds(1000), 10), "api")), R"("api";q=10;w=2)");
  EXPECT_EQ(policyOf(Policy::tokenBucket(7, 2, milliseconds(1000))).window, seconds(4)) << "3.5 s rounded up";
  EXPECT_EQ(policyOf(Policy::tokenBucket(7, 2, milliseconds(1000))).quota, 7);
  EXPECT_EQ(policyOf(Policy::tokenBucket(7, 2, milliseconds(1000))).name, "default");
  EXPECT_EQ(rateLimitPolicyField(policyOf(Policy::fixedWindow(100, milliseconds(60000)), "w")), R"("w";q=100;w=60)");
  EXPECT_EQ(policyOf(Policy::perMinute(100, 20)).window, seconds(12)) << "20 permits at 100 a minute";
  EXPECT_EQ(policyOf(Policy::smoothBursty(20, milliseconds(500), milliseconds(1000))).quota, 40)
      << "a second of 40 per second stored";
  EXPECT_EQ(policyOf(Policy::smoothBursty(20, milliseconds(500), milliseconds(1000))).window, seconds(1));
  EXPECT_EQ(policyOf(Policy::gcra(1, milliseconds(4294967295), 262)).window, seconds(1125281432))
      << "262 x 4294967.295 s, rounded up";
}

TEST(HttpPolicyOf, RejectsWhatTheLimiterWouldRefuse) {
  EXPECT_THROW((void)policyOf(RateLimiterConfig{}), InvalidArgument);
  EXPECT_THROW((void)policyOf(Policy::fixedWindow(1, milliseconds(1000)), "bad\nname"), InvalidArgument);
}
