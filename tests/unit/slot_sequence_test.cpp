// SlotSequence: the steps of a MultiLimit decision over keys of several Cluster slots, fed answers
// without a server.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

TEST(SlotSequence, RecordsEveryGrantingGroupTheLastIncluded) {
  SlotSequence seq(3, false);
  (void)seq.start();
  (void)seq.answered(slotAnswer(true));
  (void)seq.answered(slotAnswer(true, true));  // the failure policy's: no record
  EXPECT_EQ(seq.answered(slotAnswer(true)).kind, Kind::Done);
  EXPECT_EQ(seq.recorded(), (std::vector<std::size_t>{0, 2}));
}

TEST(SlotSequence, EndedMembersAreResolvedAndSweptInTheirGroupBeforeTheNextGroupIsAsked) {
  SlotSequence seq(3, false);
  (void)seq.start();
  SlotSequence::Step s = seq.answered(slotAnswer(true));
  ASSERT_EQ(s.kind, Kind::Ask);
  ASSERT_EQ(s.group, 1u);
  s = seq.answered(slotAnswer(true), {"a:1", "b:2"});
  ASSERT_EQ(s.kind, Kind::Resolve);
  EXPECT_EQ(s.member, "a:1");
  s = seq.resolved(true);
  ASSERT_EQ(s.kind, Kind::Sweep);
  EXPECT_EQ(s.group, 1u);
  EXPECT_EQ(s.member, "a:1");
  EXPECT_TRUE(s.committed);
  s = seq.swept();
  ASSERT_EQ(s.kind, Kind::Resolve);
  EXPECT_EQ(s.member, "b:2");
  s = seq.resolved(false);
  ASSERT_EQ(s.kind, Kind::Sweep);
  EXPECT_FALSE(s.committed);
  s = seq.swept();
  ASSERT_EQ(s.kind, Kind::Ask) << "the grant held during the sweep goes on";
  EXPECT_EQ(s.group, 2u);
  EXPECT_EQ(seq.answered(slotAnswer(true)).kind, Kind::Done);
  EXPECT_EQ(seq.answers().size(), 3u);
  EXPECT_EQ(seq.recorded(), (std::vector<std::size_t>{0, 1, 2}));
}

TEST(SlotSequence, AGroupThatDeniedIsAskedOnceMoreAfterItsSweep) {
  SlotSequence seq(2, false);
  (void)seq.start();
  SlotSequence::Step s = seq.answered(slotAnswer(false), {"a:1"});
  ASSERT_EQ(s.kind, Kind::Resolve);
  s = seq.resolved(false);
  ASSERT_EQ(s.kind, Kind::Sweep);
  s = seq.swept();
  ASSERT_EQ(s.kind, Kind::Ask) << "the permits swept back may be enough now";
  EXPECT_EQ(s.group, 0u);
  // Once only: a second list of ended members is left for a later caller.
  EXPECT_EQ(seq.answered(slotAnswer(false), {"c:1"}).kind, Kind::Done);
  EXPECT_EQ(seq.answers().size(), 1u);
  EXPECT_TRUE(seq.givenBack().empty());
}

TEST(SlotSequence, AMemberWhoseResolveFailedIsLeftAndNotSwept) {
  SlotSequence seq(2, false);
  (void)seq.start();
  SlotSequence::Step s = seq.answered(slotAnswer(true), {"a:1"});
  ASSERT_EQ(s.kind, Kind::Resolve);
  s = seq.resolved(std::nullopt);
  ASSERT_EQ(s.kind, Kind::Ask);
  EXPECT_EQ(s.group, 1u);
}

TEST(SlotSequence, APeekSweepsNothing) {
  SlotSequence seq(2, true);
  (void)seq.start();
  EXPECT_EQ(seq.answered(slotAnswer(true), {"a:1"}).kind, Kind::Ask);
}

}  // namespace
}  // namespace redlimit::detail
