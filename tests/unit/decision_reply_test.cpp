// parseDecisionReply: the packed take/peek reply of the one-key scripts (lib/onekey.lua's
// packDecision) and smooth.lua's array of 9, byte by byte, and everything it refuses; the Decision
// made of it (decisionOf, parseHeld), a reservation's delay and repeated flag included.
#include "limiters/decision_reply.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "redlimit_test/expect_error.hpp"

using redlimit::Decision;
using redlimit::ErrorKind;
using redlimit::ReplyError;
using redlimit::detail::DecisionForm;
using redlimit::detail::decisionOf;
using redlimit::detail::DecisionReply;
using redlimit::detail::isPackedDecision;
using redlimit::detail::kPackedDecisionSize;
using redlimit::detail::parseDecisionReply;
using redlimit::detail::parseHeld;
using redlimit::detail::Reply;

namespace {

// What struct.pack('<Bi8i8i8i8i8i8i8i8', 0xA0 + allowed, ...) makes, written independently.
Reply packed(unsigned char first, std::initializer_list<std::int64_t> values) {
  Reply r;
  r.type = Reply::Type::String;
  r.str.push_back(static_cast<char>(first));
  for (const std::int64_t v : values) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int shift = 0; shift < 64; shift += 8) r.str.push_back(static_cast<char>((u >> shift) & 0xffU));
  }
  return r;
}

Reply integer(std::int64_t v) {
  Reply r;
  r.type = Reply::Type::Integer;
  r.integer = v;
  return r;
}

constexpr std::int64_t kTwo53 = std::int64_t{1} << 53;

}  // namespace

TEST(DecisionReply, ReadsEveryFieldOfThePackedFormAtItsExtremes) {
  const Reply r = packed(0xA1, {-(std::int64_t{1} << 32) + 1, kTwo53, kTwo53 - 1, 4294967295, 9000000000000000,
                                123456789, 4294967295, 1000000000000});
  ASSERT_EQ(r.str.size(), kPackedDecisionSize);
  ASSERT_TRUE(isPackedDecision(r));
  const DecisionReply d = parseDecisionReply(r, DecisionForm::Packed, "lim");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, -4294967295);
  EXPECT_EQ(d.retryAfterUs, kTwo53);
  EXPECT_EQ(d.resetAfterUs, kTwo53 - 1);
  EXPECT_EQ(d.limit, 4294967295);
  EXPECT_EQ(d.nowUs, 9000000000000000);
  EXPECT_EQ(d.delayUs, 123456789);
  EXPECT_EQ(d.localRate, 4294967295);
  EXPECT_EQ(d.localIntervalMs, 1000000000000);

  const DecisionReply denied = parseDecisionReply(packed(0xA0, {0, 1, 2, 3, 4, 5, 6, 7}), DecisionForm::Packed, "lim");
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 0);
  EXPECT_EQ(denied.localIntervalMs, 7);
}

TEST(DecisionReply, RefusesAnythingButAPackedDecisionNamingTheLimiter) {
  Reply text;
  text.type = Reply::Type::String;
  text.str = "REDLIMIT_INVALID_ARGUMENT permits must be an integer in 1..4294967295";
  Reply shortByOne = packed(0xA1, {0, 0, 0, 0, 0, 0, 0, 0});
  shortByOne.str.pop_back();
  Reply longByOne = packed(0xA1, {0, 0, 0, 0, 0, 0, 0, 0});
  longByOne.str.push_back('\0');
  Reply array;
  array.type = Reply::Type::Array;
  for (int i = 0; i < 9; ++i) array.elements.push_back(integer(1));
  // Error texts of exactly the packed size, and bytes next to the marker.
  Reply errorOfThatSize = text;
  errorOfThatSize.str.resize(kPackedDecisionSize, 'x');
  for (const Reply& r : {text, shortByOne, longByOne, array, integer(1), Reply{}, errorOfThatSize,
                         packed(0xA2, {0, 0, 0, 0, 0, 0, 0, 0}), packed(0x01, {0, 0, 0, 0, 0, 0, 0, 0}),
                         packed(0x20, {0, 0, 0, 0, 0, 0, 0, 0})}) {
    EXPECT_FALSE(isPackedDecision(r)) << r.describe();
    try {
      (void)parseDecisionReply(r, DecisionForm::Packed, "my-limiter");
      ADD_FAILURE() << "accepted " << r.describe();
    } catch (const ReplyError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::UnexpectedReply) << e.what();
      EXPECT_NE(std::string(e.what()).find("my-limiter"), std::string::npos) << e.what();
    }
  }
}

TEST(DecisionReply, SmoothsArrayOfNineIsTheArrayForm) {
  Reply array;
  array.type = Reply::Type::Array;
  for (const std::int64_t v : {1, 2, 3, 4, 5, 6, 7, 8, 9}) array.elements.push_back(integer(v));
  const DecisionReply d = parseDecisionReply(array, DecisionForm::Array, "smooth");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.nowUs, 6);
  EXPECT_EQ(d.localIntervalMs, 9);
  array.elements.pop_back();
  EXPECT_TRUE(redlimit::test::throwsError<ReplyError>(
      ErrorKind::UnexpectedReply, [&] { (void)parseDecisionReply(array, DecisionForm::Array, "smooth"); }));
  EXPECT_TRUE(redlimit::test::throwsError<ReplyError>(ErrorKind::UnexpectedReply, [&] {
    (void)parseDecisionReply(packed(0xA1, {0, 0, 0, 0, 0, 0, 0, 0}), DecisionForm::Array, "smooth");
  }));
}

// The one result of every deciding call, a reservation's too, is a plain value: copied byte for
// byte, it is the same decision.
static_assert(std::is_trivially_copyable_v<Decision>, "Decision must stay trivially copyable");

TEST(DecisionReply, DecisionIsTriviallyCopyableWithTheReservationsDelayAndRepeatedFlag) {
  Decision d;
  d.allowed = true;
  d.permits = 3;
  d.delay = std::chrono::microseconds(250000);
  d.repeated = true;
  Decision copy;
  std::memcpy(&copy, &d, sizeof d);
  EXPECT_TRUE(copy.allowed);
  EXPECT_EQ(copy.permits, 3);
  EXPECT_EQ(copy.delay.count(), 250000);
  EXPECT_TRUE(copy.repeated);
  EXPECT_EQ(Decision{}.delay.count(), 0) << "at once unless a reservation says otherwise";
  EXPECT_FALSE(Decision{}.repeated);
}

// A take's reply carries the reservation's delay into the Decision; a reserve's reply (the nine
// values, then repeated) sets Decision::repeated.
TEST(DecisionReply, AReservationsDelayAndARepeatedReserveAreOnTheDecision) {
  Reply array;
  array.type = Reply::Type::Array;
  for (const std::int64_t v : {1, 7, 0, 1000, 10, 5, 250000, 1, 1000}) array.elements.push_back(integer(v));
  const Decision reserved = decisionOf(parseDecisionReply(array, DecisionForm::Array, "lim"), 3);
  EXPECT_TRUE(reserved.allowed);
  EXPECT_EQ(reserved.permits, 3);
  EXPECT_EQ(reserved.remaining, 7);
  EXPECT_EQ(reserved.time.count(), 5);
  EXPECT_EQ(reserved.delay.count(), 250000) << "use the permits 250 ms after the decision";
  EXPECT_FALSE(reserved.repeated);

  array.elements[6] = integer(0);
  array.elements.push_back(integer(1));
  DecisionReply values;
  const Decision again = parseHeld(array, "lim", 3, values);
  EXPECT_TRUE(again.allowed);
  EXPECT_TRUE(again.repeated) << "the id was reserved already";
  EXPECT_EQ(again.permits, 3);
  EXPECT_EQ(again.remaining, 7);
  EXPECT_EQ(again.delay.count(), 0);
  EXPECT_EQ(values.limit, 10);

  array.elements.back() = integer(0);
  EXPECT_FALSE(parseHeld(array, "lim", 3, values).repeated) << "a first reserve";
}
