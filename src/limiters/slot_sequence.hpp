// redlimit — a MultiLimit decision over keys of several Redis Cluster hash slots, slot by slot: the
// order of its script calls and give-backs as a small state machine without I/O, driven once
// waiting (runOp) and once without waiting (runOpAsync) by multi_limit.cpp.
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redlimit/decision.hpp"
#include "redlimit/settlement.hpp"

namespace redlimit::detail {

/// The steps of one decision over `groups` (>= 2) slot groups: the limits whose keys share one hash
/// slot, the groups in slot order (two callers never take in opposite orders). A decision asks
/// group 0, 1, ... in turn: each group reserves (a take of all or nothing that also writes a record
/// in its own slot); the last group's record is the decision's commit, the others' are held for a
/// while in their group's pending set. When a group denies, or its call fails, each group that
/// recorded a grant is given it back (a settle of 0 under its record: once, however often it is
/// sent), then it is done: the denial (or the error) is the answer. A peek asks every group and
/// gives nothing back.
///
/// A group's answer may list pending members whose hold has ended: decisions of callers that went
/// away between slots. Before going on, each is resolved (asked of the last group's record: did
/// that decision take there?) and swept (its record in this group settled: kept if it took, given
/// back if not). If this group had denied, it is asked once more, since the sweep may have freed
/// permits. Not thread-safe: one per call, driven by one driver.
class SlotSequence {
 public:
  struct Step {
    enum class Kind { Ask, GiveBack, Resolve, Sweep, Done };
    Kind kind = Kind::Done;
    std::size_t group = 0;   // Ask, GiveBack, Sweep: the group
    std::string member;      // Resolve, Sweep: the pending member
    bool committed = false;  // Sweep: the member's decision took in its last group
  };

  SlotSequence(std::size_t groups, bool peek) : groups_(groups), peek_(peek) {}

  /// The first step: ask group 0.
  Step start() { return ask(0); }
  /// The group asked last answered `d`, listing `ended` (pending members whose hold ended): resolve
  /// and sweep them, ask the next, give back, or done.
  Step answered(MultiDecision d, std::vector<std::string> ended = {}) {
    if (!peek_ && !retried_ && !ended.empty()) {
      held_ = std::move(d);
      sweeps_ = std::move(ended);
      swept_ = 0;
      return nextSweep();
    }
    return accept(std::move(d));
  }
  /// The group asked last failed with `error` (the caller's error; after the protocol's resends):
  /// give back what the groups before it recorded, then done.
  Step failed(std::exception_ptr error) {
    error_ = std::move(error);
    return nextGiveBack();
  }
  /// The member resolved last: its decision took in its last group (nullopt: the resolve failed;
  /// the member is left for a later caller).
  Step resolved(std::optional<bool> committed) {
    if (!committed) {
      ++swept_;
      return nextSweep();
    }
    return {Step::Kind::Sweep, asking_, sweeps_[swept_], *committed};
  }
  /// The member swept last is done (or its sweep failed: left for a later caller).
  Step swept() {
    ++swept_;
    return nextSweep();
  }
  /// The give-back asked last answered `s` (nullopt: it failed; its permits stay taken until the
  /// limit gives them back by itself, or a later caller's sweep does).
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
  /// The groups whose reserve recorded a grant, in order (the last group's included): once every
  /// group granted, the records to settle as kept.
  [[nodiscard]] const std::vector<std::size_t>& recorded() const noexcept { return recorded_; }
  /// The error of the group that failed, or null.
  [[nodiscard]] const std::exception_ptr& error() const noexcept { return error_; }

 private:
  Step ask(std::size_t g) {
    asking_ = g;
    return {Step::Kind::Ask, g, {}, false};
  }
  Step accept(MultiDecision d) {
    answers_.push_back(std::move(d));
    const MultiDecision& a = answers_.back();
    const std::size_t g = asking_;
    const bool last = g + 1 == groups_;
    if (!peek_ && !a.allowed) return nextGiveBack();
    // A grant of the failure policy recorded nothing: nothing to give back there.
    if (!peek_ && !a.byPolicy) recorded_.push_back(g);
    return last ? Step{} : ask(g + 1);
  }
  Step nextSweep() {
    if (swept_ < sweeps_.size()) return {Step::Kind::Resolve, asking_, sweeps_[swept_], false};
    sweeps_.clear();
    MultiDecision d = std::move(held_);
    // A denial may have been the departed callers' permits: ask once more (once per decision).
    retried_ = true;
    if (!d.allowed && !d.byPolicy) return ask(asking_);
    return accept(std::move(d));
  }
  Step nextGiveBack() const {
    // The last group recorded a grant only when the decision was granted: nothing to give back then.
    if (givenBack_.size() < recorded_.size()) return {Step::Kind::GiveBack, recorded_[givenBack_.size()], {}, false};
    return {};
  }

  std::size_t groups_;
  bool peek_;
  std::size_t asking_ = 0;  // the group asked last
  bool retried_ = false;    // a group was asked again after a sweep
  MultiDecision held_;      // the answer waiting for its sweeps
  std::vector<std::string> sweeps_;
  std::size_t swept_ = 0;
  std::vector<MultiDecision> answers_;
  std::vector<std::size_t> recorded_;  // groups whose reserve recorded a grant, in order
  std::vector<std::pair<std::size_t, std::optional<MultiSettlement>>> givenBack_;
  std::exception_ptr error_;
};

}  // namespace redlimit::detail
