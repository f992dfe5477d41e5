// redlimit — a MultiLimit decision over keys of several Redis Cluster hash slots, slot by slot: the
// order of its script calls and give-backs as a small state machine without I/O, driven once
// waiting (runOp) and once without waiting (runOpAsync) by multi_limit.cpp.
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "redlimit/decision.hpp"
#include "redlimit/settlement.hpp"

namespace redlimit::detail {

/// The steps of one decision over `groups` (>= 2) slot groups: the limits whose keys share one hash
/// slot, the groups in slot order (two callers never take in opposite orders). A decision asks
/// group 0, 1, ... in turn: every group but the last reserves (a take of all or nothing that also
/// writes a record in its own slot), the last takes. When a group denies, or its call fails, each
/// group that recorded a grant is given it back (a settle of 0 under its record: once, however
/// often it is sent), then it is done: the denial (or the error) is the answer. A peek asks every
/// group and gives nothing back. Not thread-safe: one per call, driven by one driver.
class SlotSequence {
 public:
  struct Step {
    enum class Kind { Ask, GiveBack, Done };
    Kind kind = Kind::Done;
    std::size_t group = 0;  // Ask, GiveBack: the group
  };

  SlotSequence(std::size_t groups, bool peek) : groups_(groups), peek_(peek) {}

  /// The first step: ask group 0.
  Step start() { return {Step::Kind::Ask, 0}; }
  /// The group asked last answered `d`: ask the next, give back, or done.
  Step answered(MultiDecision d) {
    answers_.push_back(std::move(d));
    const MultiDecision& a = answers_.back();
    const std::size_t g = answers_.size() - 1;
    const bool last = g + 1 == groups_;
    if (!peek_ && !a.allowed) return nextGiveBack();
    // A grant of the failure policy recorded nothing: nothing to give back there.
    if (!peek_ && !last && !a.byPolicy) recorded_.push_back(g);
    return last ? Step{} : Step{Step::Kind::Ask, g + 1};
  }
  /// The group asked last failed with `error` (the caller's error; after the protocol's resends):
  /// give back what the groups before it recorded, then done.
  Step failed(std::exception_ptr error) {
    error_ = std::move(error);
    return nextGiveBack();
  }
  /// The give-back asked last answered `s` (nullopt: it failed; its permits stay taken until the
  /// limit gives them back by itself).
  Step gaveBack(std::optional<MultiSettlement> s) {
    givenBack_.emplace_back(recorded_[givenBack_.size()], std::move(s));
    return nextGiveBack();
  }

  /// The answers of the groups asked, in group order (a failed group has none).
  [[nodiscard]] const std::vector<MultiDecision>& answers() const noexcept { return answers_; }
  /// The give-backs: group, and what its settle answered (nullopt: it failed).
  [[nodiscard]] const std::vector<std::pair<std::size_t, std::optional<MultiSettlement>>>& givenBack() const noexcept {
    return givenBack_;
  }
  /// The error of the group that failed, or null.
  [[nodiscard]] const std::exception_ptr& error() const noexcept { return error_; }

 private:
  Step nextGiveBack() const {
    if (givenBack_.size() < recorded_.size()) return {Step::Kind::GiveBack, recorded_[givenBack_.size()]};
    return {};
  }

  std::size_t groups_;
  bool peek_;
  std::vector<MultiDecision> answers_;
  std::vector<std::size_t> recorded_;  // groups whose reserve recorded a grant, in order
  std::vector<std::pair<std::size_t, std::optional<MultiSettlement>>> givenBack_;
  std::exception_ptr error_;
};

}  // namespace redlimit::detail
