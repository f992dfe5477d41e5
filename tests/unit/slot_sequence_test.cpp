// SlotSequence: the steps of a MultiLimit decision over keys of several Cluster slots, fed answers
// without a server.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>

#include "limiters/slot_sequence.hpp"

namespace redlimit::detail {
namespace {

using Kind = SlotSequence::Step::Kind;

MultiDecision slotAnswer(bool allowed, bool byPolicy = false) {
  MultiDecision d;
  d.allowed = allowed;
  d.byPolicy = byPolicy;
  return d;
}

MultiSettlement settledBack() {
  MultiSettlement s;
  s.status = Settlement::Status::Settled;
  return s;
}

TEST(SlotSequence, AsksEveryGroupInOrderAndGivesNothingBackWhenAllGrant) {
  SlotSequence seq(3, false);
  SlotSequence::Step s = seq.start();
  for (std::size_t g = 0; g < 3; ++g) {
    ASSERT_EQ(s.kind, Kind::Ask);
    EXPECT_EQ(s.group, g);
    s = seq.answered(slotAnswer(true));
  }
  EXPECT_EQ(s.kind, Kind::Done);
  EXPECT_EQ(seq.answers().size(), 3u);
  EXPECT_TRUE(seq.givenBack().empty());
  EXPECT_FALSE(seq.error());
}

TEST(SlotSequence, GivesBackEveryGroupBeforeTheOneThatDeniedAndAsksNoFurther) {
  SlotSequence seq(4, false);
  SlotSequence::Step s = seq.start();
  s = seq.answered(slotAnswer(true));
  s = seq.answered(slotAnswer(true));
  ASSERT_EQ(s.kind, Kind::Ask);
  EXPECT_EQ(s.group, 2u);
  s = seq.answered(slotAnswer(false));
  ASSERT_EQ(s.kind, Kind::GiveBack);
  EXPECT_EQ(s.group, 0u);
  s = seq.gaveBack(settledBack());
  ASSERT_EQ(s.kind, Kind::GiveBack);
  EXPECT_EQ(s.group, 1u);
  s = seq.gaveBack(std::nullopt);  // a give-back that failed ends nothing else
  EXPECT_EQ(s.kind, Kind::Done);
  ASSERT_EQ(seq.givenBack().size(), 2u);
  EXPECT_TRUE(seq.givenBack()[0].second.has_value());
  EXPECT_FALSE(seq.givenBack()[1].second.has_value());
  EXPECT_EQ(seq.answers().size(), 3u);
}

TEST(SlotSequence, AFailedGroupGivesBackTheGroupsBeforeItAndKeepsTheError) {
  SlotSequence seq(3, false);
  SlotSequence::Step s = seq.start();
  s = seq.answered(slotAnswer(true));
  ASSERT_EQ(s.kind, Kind::Ask);
  s = seq.failed(std::make_exception_ptr(std::runtime_error("timeout")));
  ASSERT_EQ(s.kind, Kind::GiveBack);
  EXPECT_EQ(s.group, 0u);
  EXPECT_EQ(seq.gaveBack(settledBack()).kind, Kind::Done);
  EXPECT_TRUE(seq.error());
}

TEST(SlotSequence, ADenialByTheFirstGroupGivesNothingBack) {
  SlotSequence seq(2, false);
  (void)seq.start();
  EXPECT_EQ(seq.answered(slotAnswer(false)).kind, Kind::Done);
  EXPECT_TRUE(seq.givenBack().empty());
}

TEST(SlotSequence, AGrantOfTheFailurePolicyRecordedNothingAndIsNotGivenBack) {
  SlotSequence seq(3, false);
  (void)seq.start();
  (void)seq.answered(slotAnswer(true, true));  // the failure policy's grant: no record
  (void)seq.answered(slotAnswer(true));
  const SlotSequence::Step s = seq.answered(slotAnswer(false));
  ASSERT_EQ(s.kind, Kind::GiveBack);
  EXPECT_EQ(s.group, 1u);
  EXPECT_EQ(seq.gaveBack(settledBack()).kind, Kind::Done);
}

TEST(SlotSequence, APeekAsksEveryGroupEvenAfterADenialAndGivesNothingBack) {
  SlotSequence seq(3, true);
  SlotSequence::Step s = seq.start();
  s = seq.answered(slotAnswer(false));
  ASSERT_EQ(s.kind, Kind::Ask);
  s = seq.answered(slotAnswer(true));
  ASSERT_EQ(s.kind, Kind::Ask);
  EXPECT_EQ(seq.answered(slotAnswer(false)).kind, Kind::Done);
  EXPECT_TRUE(seq.givenBack().empty());
  EXPECT_EQ(seq.answers().size(), 3u);
}

}  // namespace
}  // namespace redlimit::detail
