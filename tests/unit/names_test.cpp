#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "config/limiter_name.hpp"
#include "redlimit/calendar.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit/multi_limit.hpp"
#include "redlimit/rate_limiter.hpp"
#include "redlimit_test/redis_server.hpp"

TEST(SuffixName, WrapsPlainNames) {
  EXPECT_EQ(redlimit::suffixName("api", "value"), "{api}:value");
  EXPECT_EQ(redlimit::suffixName("api", "permits:abc"), "{api}:permits:abc");
}

TEST(SuffixName, KeepsNamesWithABraceAsTheyAre) {
  // Redisson's rule: any '{' in the name means no extra braces, even for "a{b" or "a{}b".
  EXPECT_EQ(redlimit::suffixName("{api}", "value"), "{api}:value");
  EXPECT_EQ(redlimit::suffixName("a{b", "value"), "a{b:value");
  EXPECT_EQ(redlimit::suffixName("a{}b", "permits"), "a{}b:permits");
}

// --- A limiter name is UTF-8 (it is a Prometheus label) --------------------------------------------

namespace {

// A Client on a loopback port that nothing listens on: constructing a limiter sends nothing.
std::shared_ptr<redlimit::Client> clientToNowhere() {
  redlimit::ClientOptions o;
  o.connection.port = redlimit::test::freeLoopbackPort();
  return redlimit::Client::create(o);
}

// A valid configuration of each family the tests construct.
struct Configs {
  redlimit::Policy lease = redlimit::Policy::concurrency(1, std::chrono::milliseconds(1000));
  redlimit::Policy quota = redlimit::Policy::calendar(10, redlimit::CalendarUnit::Day, "UTC");
};

// Runs `make` and expects InvalidArgument saying the name is not UTF-8.
template <class Make>
void refusedAsNotUtf8(Make&& make, const char* what) {
  try {
    make();
    ADD_FAILURE() << what << ": accepted";
  } catch (const redlimit::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not UTF-8"), std::string::npos) << what << ": " << e.what();
  }
}

}  // namespace

TEST(LimiterName, FirstInvalidUtf8FindsTheFirstByteOfNoValidSequence) {
  using redlimit::detail::firstInvalidUtf8;
  constexpr std::size_t kValid = std::string_view::npos;
  EXPECT_EQ(firstInvalidUtf8(""), kValid);
  EXPECT_EQ(firstInvalidUtf8("api:tenant-42"), kValid);
  EXPECT_EQ(firstInvalidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), kValid) << "2, 3 and 4 bytes";
  EXPECT_EQ(firstInvalidUtf8("\xf4\x8f\xbf\xbf"), kValid) << "U+10FFFF";
  EXPECT_EQ(firstInvalidUtf8("\xff\xfe"), 0u);
  EXPECT_EQ(firstInvalidUtf8("ok\x80"), 2u) << "a lone continuation byte";
  EXPECT_EQ(firstInvalidUtf8("ab\xc3"), 2u) << "truncated";
  EXPECT_EQ(firstInvalidUtf8("\xc0\xaf"), 0u) << "overlong '/'";
  EXPECT_EQ(firstInvalidUtf8("\xe0\x80\xaf"), 0u) << "overlong, 3 bytes";
  EXPECT_EQ(firstInvalidUtf8("\xed\xa0\x80"), 0u) << "a surrogate";
  EXPECT_EQ(firstInvalidUtf8("\xf4\x90\x80\x80"), 0u) << "above U+10FFFF";
  EXPECT_EQ(firstInvalidUtf8("x\xe2\x82z"), 1u) << "a sequence cut by an ASCII byte";
}

TEST(LimiterName, ANameThatIsNotUtf8IsRefusedByEveryLimiter) {
  const auto client = clientToNowhere();
  const std::string bad = "api\xff\xfe";
  const Configs c;
  const redlimit::Policy& lease = c.lease;
  const redlimit::Policy& quota = c.quota;
  refusedAsNotUtf8([&] { redlimit::RateLimiter l(client, bad); }, "RateLimiter");
  refusedAsNotUtf8([&] { redlimit::Limiter l(client, bad, redlimit::Policy::perSecond(10)); }, "Limiter");
  refusedAsNotUtf8([&] { redlimit::Limiter l(client, bad, lease); }, "Limiter under a concurrency policy");
  refusedAsNotUtf8([&] { redlimit::Limiter l(client, bad, quota); }, "Limiter under a calendar policy");
  redlimit::MultiLimit::Options named;
  named.name = bad;
  const redlimit::Limiter good(client, "api", redlimit::Policy::perSecond(10));
  refusedAsNotUtf8([&] { redlimit::MultiLimit m({good}, named); }, "MultiLimit");
  for (const redlimit::LimiterMetrics::Snapshot& m : redlimit::MetricsRegistry::global()->snapshot()) {
    EXPECT_NE(m.limiter, bad) << "a refused name has no metrics entry";
  }
}

// --- A name or key never has the form of a reservation record's key ---------------------------

TEST(LimiterName, ANameOrKeyWithTheFormOfARecordKeyIsRefusedByEveryLimiter) {
  const auto client = clientToNowhere();
  const Configs c;
  const redlimit::Policy& lease = c.lease;
  const redlimit::Policy& quota = c.quota;
  for (const std::string bad : {"{bob}:rsv:req-2", "{bob}:mrsv:req-2", "{a}:rsv", "x:mrsv", "a:rsv:b c"}) {
    EXPECT_THROW(redlimit::RateLimiter(client, bad), redlimit::InvalidArgument) << bad;
    EXPECT_THROW(redlimit::Limiter(client, bad, redlimit::Policy::perSecond(10)), redlimit::InvalidArgument) << bad;
    EXPECT_THROW(redlimit::Limiter(client, bad, lease), redlimit::InvalidArgument) << bad;
    EXPECT_THROW(redlimit::Limiter(client, bad, quota), redlimit::InvalidArgument) << bad;
  }
  for (const std::string fine : {"{bob}:rsvp", "rsv:x", "{rsv}:x", "a:rsvx:b", "mrsv", "{a}:rsv-1"}) {
    EXPECT_NO_THROW(redlimit::RateLimiter(client, fine)) << fine;
  }
}
