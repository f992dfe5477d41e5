// redlimit — SegmentWord: the segment cache's hot state, one atomic word and its deadline.
//
// Storage apart from policy (folly's TokenBucket keeps its atomic and pure operations in a class
// of their own): SegmentedRateLimiter composes this word with the refill coordination; this
// class knows nothing of sources, locks or threads. Header-only, no dependency: part of the
// redlimit::local target.
#pragma once

#include <atomic>
#include <cstdint>

#include "redlimit/detail/cache_line.hpp"

namespace redlimit::detail {

/// A 64-bit atomic word, generation (high 32 bits) and permits left (low 32), and the clock time
/// (µs) at which the permits in it expire, on one cache line. Every operation is noexcept and
/// lock-free.
///
/// Roles: any thread may tryTake(); only the thread that holds the cache's leader role calls
/// takeAll(), putBack() and install() (the segment cache's mutex serialises them); close() may
/// race with both.
///
/// Memory ordering: tryTake's load and failed CAS are acquire, pairing with install()'s release
/// store of a new generation, so the deadline written before that store is visible. A successful
/// CAS is acq_rel: its release half pairs with takeAll()'s acq_rel CAS that empties the word
/// before the leader writes the next deadline, so a CAS that succeeded on generation g read
/// generation g's deadline and not a later one (the word never returns to a value it had before
/// that emptying CAS except by the leader's own putBack(), which writes no deadline).
///
/// Generation wrap: the 32-bit generation skips 0 and kClosedGen; a thread would have to stall
/// across 4 billion refills between its load and its compare-exchange to be fooled.
class alignas(kCacheLine) SegmentWord {
 public:
  static constexpr std::uint64_t kLeftMask = 0xFFFFFFFFull;
  static constexpr std::uint32_t kClosedGen = 0xFFFFFFFFu;
  /// The most permits a word holds.
  static constexpr std::int64_t kMaxLeft = 0xFFFFFFFF;

  [[nodiscard]] static constexpr std::uint64_t pack(std::uint32_t gen, std::uint64_t left) noexcept {
    return (static_cast<std::uint64_t>(gen) << 32) | (left & kLeftMask);
  }
  [[nodiscard]] static constexpr std::int64_t leftOf(std::uint64_t s) noexcept {
    return static_cast<std::int64_t>(s & kLeftMask);
  }
  [[nodiscard]] static constexpr std::uint32_t genOf(std::uint64_t s) noexcept {
    return static_cast<std::uint32_t>(s >> 32);
  }
  /// The generation after g: never 0 (the initial word) nor kClosedGen.
  [[nodiscard]] static constexpr std::uint32_t nextGen(std::uint32_t g) noexcept {
    return g >= kClosedGen - 1 ? 1 : g + 1;
  }

  /// The hot path: takes `permits` (>= 1) if the word holds that many and `now()` (µs, read only
  /// if it does) is before the deadline. The update has no side effects, so the weak
  /// compare-exchange may run it again.
  template <class Now>
  [[nodiscard]] bool tryTake(std::int64_t permits, Now&& now) noexcept(noexcept(now())) {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    if (leftOf(s) < permits) return false;
    const std::int64_t t = now();
    do {
      if (leftOf(s) < permits || t >= deadline_.load(std::memory_order_relaxed)) return false;
    } while (!state_.compare_exchange_weak(s, s - static_cast<std::uint64_t>(permits), std::memory_order_acq_rel,
                                           std::memory_order_acquire));
    return true;
  }

  /// Empties the word, keeping its generation, and returns the old word. Leader only.
  std::uint64_t takeAll() noexcept {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    while (!state_.compare_exchange_weak(s, s & ~kLeftMask, std::memory_order_acq_rel, std::memory_order_acquire)) {
    }
    return s;
  }

  /// Puts n permits back into the word emptied by takeAll(). Leader only: nobody else adds
  /// permits, and tryTake() cannot take from an empty word, so the word is (gen, 0) here.
  void putBack(std::int64_t n) noexcept {
    if (n > 0) state_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_acq_rel);
  }

  /// Installs a new segment of `permits` (1..kMaxLeft) expiring at `deadline`, in the generation
  /// after `previous` (the word takeAll() returned). Leader only, on an emptied word.
  void install(std::uint64_t previous, std::int64_t permits, std::int64_t deadline) noexcept {
    deadline_.store(deadline, std::memory_order_relaxed);
    state_.store(pack(nextGen(genOf(previous)), static_cast<std::uint64_t>(permits)), std::memory_order_release);
  }

  /// Marks the word closed (no permits, kClosedGen) and returns the old word.
  std::uint64_t close() noexcept { return state_.exchange(pack(kClosedGen, 0), std::memory_order_acq_rel); }

  [[nodiscard]] std::uint64_t load() const noexcept { return state_.load(std::memory_order_acquire); }
  [[nodiscard]] std::int64_t left() const noexcept { return leftOf(load()); }
  [[nodiscard]] bool closed() const noexcept { return genOf(load()) == kClosedGen; }
  /// µs on the cache's clock; meaningful while the word holds permits.
  [[nodiscard]] std::int64_t deadline() const noexcept { return deadline_.load(std::memory_order_relaxed); }
  /// True if the permits in the word have expired at `now` (µs).
  [[nodiscard]] bool expiredAt(std::int64_t now) const noexcept { return now >= deadline(); }

 private:
  std::atomic<std::uint64_t> state_{0};  // generation : 32 | left : 32
  std::atomic<std::int64_t> deadline_{0};
};

}  // namespace redlimit::detail
