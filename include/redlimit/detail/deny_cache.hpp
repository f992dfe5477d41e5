// redlimit — the deny cache of a limiter: keys that Redis denied, remembered until the time at
// which the same call could first be granted, so that a hot key denied for the next 30 s costs no
// script call per request (Upstash ratelimit's ephemeral cache and rate-limiter-flexible's
// inMemoryBlockOnConsumed answer such keys in memory too). Header-only, no Redis: the faces
// (Limiter, RateLimiter) ask it before sending and tell it the denials Redis gave.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "redlimit/clock.hpp"
#include "redlimit/detail/cache_line.hpp"
#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

/// Keys denied by Redis, each with the permits denied and `until`: the time on `Clock` before
/// which no call of at least those permits can be granted (give-backs by other processes aside).
/// A lookup answers only "denied, retry after X" or "ask Redis": nothing here can grant. At most
/// maxKeys keys are kept; a new one evicts the least recently used. A cache of 4096 keys or more
/// is split into kShards shards by the key's hash, each an exact LRU of its own keys under its own
/// lock (so threads deciding different keys rarely meet); a smaller one is a single exact LRU.
/// Thread-safe.
template <class Clock = SteadyClock>
class DenyCache {
 public:
  /// The largest cap accepted (a limiter's option is checked against it): 16 Mi keys.
  static constexpr std::size_t kMaxKeys = std::size_t{1} << 24;
  static constexpr std::size_t kShards = 16;

  /// When a call was sent, on the cache's clock, and the forget generation then (a give-back by
  /// this process while the call was in flight makes its denial not remembered).
  struct Ticket {
    std::chrono::microseconds sentAt{0};
    std::uint64_t generation = 0;
  };

  /// A denial: of at least `permits`, until `retryAfter` from now; the other fields are those of
  /// the Redis denial that is remembered, as Decision's (time: its server time, epoch µs).
  struct Denial {
    std::int64_t permits = 0;
    std::chrono::microseconds retryAfter{0};
    std::int64_t remaining = 0;
    std::chrono::microseconds resetAfter{0};
    std::int64_t limit = 0;
    std::chrono::microseconds time{0};
  };

  /// maxKeys 0 remembers nothing (every lookup says "ask Redis"). The caller checks maxKeys
  /// against kMaxKeys.
  explicit DenyCache(std::size_t maxKeys, Clock clock = Clock{})
      : clock_(std::move(clock)), shards_(maxKeys >= 4096 ? kShards : 1) {
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      shards_[i].cap = maxKeys / shards_.size() + (i < maxKeys % shards_.size() ? 1 : 0);
    }
  }
  DenyCache(const DenyCache&) = delete;
  DenyCache& operator=(const DenyCache&) = delete;

  [[nodiscard]] bool enabled() const noexcept { return shards_.front().cap > 0; }

  /// Taken just before a call is sent: remember() needs it.
  [[nodiscard]] Ticket ticket() const { return Ticket{clock_.now(), generation_.load(std::memory_order_acquire)}; }

  /// "Denied" while `key` is remembered as denied for at most `permits` and its until has not come;
  /// else nullopt: ask Redis. A key whose until has come is forgotten.
  [[nodiscard]] std::optional<Denial> denied(std::string_view key, std::int64_t permits) {
    if (!enabled()) return std::nullopt;
    const std::size_t h = std::hash<std::string_view>{}(key);
    Shard& s = shardOf(h);
    const std::int64_t now = clock_.now().count();
    const LockGuard lock(s.mutex);
    const auto it = s.index.find(key);
    if (it == s.index.end()) return std::nullopt;
    const Entry& e = *it->second;
    if (now >= e.until) {
      s.erase(it);
      return std::nullopt;
    }
    if (permits < e.permits) return std::nullopt;
    if (it->second != s.lru.begin()) s.lru.splice(s.lru.begin(), s.lru, it->second);
    const std::int64_t elapsed = now - e.sentAt;
    return Denial{e.permits,   std::chrono::microseconds{e.until - now},
                  e.remaining, std::chrono::microseconds{e.resetAt > now ? e.resetAt - now : 0},
                  e.limit,     std::chrono::microseconds{e.time + elapsed}};
  }

  /// Remembers Redis's denial `d` of `key` (d.retryAfter from the server's decision, which came at
  /// or after `sent`): until = sent.sentAt + d.retryAfter. Nothing when a forget came after the
  /// ticket, or when that time has passed. A key remembered already takes the new denial.
  void remember(std::string_view key, const Ticket& sent, const Denial& d) {
    if (!enabled() || d.retryAfter.count() <= 0 || d.permits <= 0) return;
    const std::int64_t until = sent.sentAt.count() + d.retryAfter.count();
    const std::size_t h = std::hash<std::string_view>{}(key);
    Shard& s = shardOf(h);
    const std::int64_t now = clock_.now().count();
    if (now >= until) return;
    const LockGuard lock(s.mutex);
    if (generation_.load(std::memory_order_acquire) != sent.generation) return;  // a give-back since
    const Entry values{
        {},      d.permits,     until, sent.sentAt.count(), d.remaining, sent.sentAt.count() + d.resetAfter.count(),
        d.limit, d.time.count()};
    if (const auto it = s.index.find(key); it != s.index.end()) {
      refill(*it->second, values);  // the index's view points into its key: kept in place
      if (it->second != s.lru.begin()) s.lru.splice(s.lru.begin(), s.lru, it->second);
      return;
    }
    if (s.cap == 0) return;
    if (s.lru.size() < s.cap) {
      s.lru.push_front(values);
      s.lru.front().key.assign(key.data(), key.size());
      s.index.emplace(std::string_view(s.lru.front().key), s.lru.begin());
      return;
    }
    // Full: the least recently used entry and its index node become the new key's (no allocation
    // once the shard is full, but for a key longer than the string's room).
    auto node = s.index.extract(std::string_view(s.lru.back().key));
    s.lru.splice(s.lru.begin(), s.lru, std::prev(s.lru.end()));
    Entry& e = s.lru.front();
    refill(e, values);
    e.key.assign(key.data(), key.size());
    node.key() = std::string_view(e.key);
    node.mapped() = s.lru.begin();
    s.index.insert(std::move(node));
  }

  /// Forgets `key` (a give-back by this process), and what calls in flight would remember.
  void forget(std::string_view key) {
    if (!enabled()) return;
    Shard& s = shardOf(std::hash<std::string_view>{}(key));
    const LockGuard lock(s.mutex);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    if (const auto it = s.index.find(key); it != s.index.end()) s.erase(it);
  }

  /// Forgets every key (a change of rate or policy by this process), and what calls in flight
  /// would remember.
  void clear() {
    if (!enabled()) return;
    generation_.fetch_add(1, std::memory_order_acq_rel);
    for (Shard& s : shards_) {
      const LockGuard lock(s.mutex);
      s.index.clear();
      s.lru.clear();
    }
  }

  /// Keys remembered now (those whose until has come included, until looked up or evicted).
  [[nodiscard]] std::size_t size() const {
    std::size_t n = 0;
    for (const Shard& s : shards_) {
      const LockGuard lock(s.mutex);
      n += s.lru.size();
    }
    return n;
  }

 private:
  struct Entry {
    std::string key;
    std::int64_t permits = 0;
    std::int64_t until = 0;   // µs on the clock
    std::int64_t sentAt = 0;  // µs on the clock
    std::int64_t remaining = 0;
    std::int64_t resetAt = 0;  // µs on the clock
    std::int64_t limit = 0;
    std::int64_t time = 0;  // the denial's server time, epoch µs
  };
  using Lru = std::list<Entry>;  // the most recently used first
  struct alignas(kCacheLine) Shard {
    mutable Mutex mutex;
    Lru lru REDLIMIT_GUARDED_BY(mutex);
    std::unordered_map<std::string_view, typename Lru::iterator> index
        REDLIMIT_GUARDED_BY(mutex);  // views of the entries' keys
    std::size_t cap = 0;             // set once, before any use

    void erase(typename std::unordered_map<std::string_view, typename Lru::iterator>::iterator it)
        REDLIMIT_REQUIRES(mutex) {
      const typename Lru::iterator entry = it->second;
      index.erase(it);
      lru.erase(entry);
    }
  };

  // `e` takes the values of `values`, all but its key, whose string (and room) stays.
  static void refill(Entry& e, const Entry& values) {
    std::string key = std::move(e.key);
    e = values;
    e.key = std::move(key);
  }

  Shard& shardOf(std::size_t hash) noexcept { return shards_[shards_.size() == 1 ? 0 : (hash >> 7) % kShards]; }

  Clock clock_;
  std::vector<Shard> shards_;
  std::atomic<std::uint64_t> generation_{0};
};

}  // namespace redlimit::detail
