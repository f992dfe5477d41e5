// redlimit — a deciding call through the limiter's deny cache (redlimit/detail/deny_cache.hpp),
// written once for both faces that have one (Limiter's decide, RateLimiter's decide and
// tryAcquire without a timeout, sync and async): a key that Redis denied is answered here, denied,
// until the same call could first be granted; every other call goes to Redis, and a denial it
// answers is remembered. Never a local grant; a decision of the failure policy (byPolicy) is never
// remembered. docs/api.md, "The deny cache", says when a local denial can be wrong (a give-back by
// another process) and by how much.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "limiters/completion.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/detail/deny_cache.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/monitor.hpp"

namespace redlimit::detail {

using LimiterDenyCache = DenyCache<SteadyClock>;

/// A limiter's option denyCacheKeys: InvalidArgument naming `limiter` above
/// LimiterDenyCache::kMaxKeys.
inline void checkDenyCacheKeys(std::size_t maxKeys, std::string_view limiter) {
  if (maxKeys > LimiterDenyCache::kMaxKeys) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: denyCacheKeys must be at most {}, got {}", limiter,
                                      LimiterDenyCache::kMaxKeys, maxKeys));
  }
}

/// The cache's answer to `permits` of `key`, as the caller gets it (counted by `monitor`, shadow
/// mode applied), or nullopt: ask Redis.
inline std::optional<Decision> localDenial(LimiterDenyCache& cache, std::string_view key, std::int64_t permits,
                                           const LimiterMonitor& monitor) {
  const std::optional<LimiterDenyCache::Denial> denial = cache.denied(key, permits);
  if (!denial) return std::nullopt;
  Decision d;
  d.permits = permits;
  d.remaining = denial->remaining;
  d.retryAfter = denial->retryAfter;
  d.resetAfter = std::max(denial->resetAfter, denial->retryAfter);
  d.limit = denial->limit;
  d.time = denial->time;
  monitor.admitLocalDenial(d);
  return d;
}

/// Remembers `d` (a decision of `key` sent with `sent`) if Redis denied it (in shadow mode: would
/// have), for its retryAfter less `slack`: how much sooner than retryAfter the same call may
/// already be granted (RateLimiter's script rounds its wait up to whole ms).
inline void rememberDenial(LimiterDenyCache& cache, std::string_view key, const LimiterDenyCache::Ticket& sent,
                           const Decision& d, std::chrono::microseconds slack) {
  if (d.byPolicy || (d.allowed && !d.shadowDenied)) return;
  cache.remember(key, sent, {d.permits, d.retryAfter - slack, d.remaining, d.resetAfter, d.limit, d.time});
}

/// A deciding call of `permits` on `key`, waiting: `cache`'s local denial, or `ask()` (the call to
/// Redis, counted as it counts) remembered. The caller has made the call's argument checks. On the
/// Client's I/O thread (`onIoThread`) it goes to ask(), which refuses a sync call there, whatever
/// the cache holds: a callback's sync call fails the same way every time, not only when its key
/// was not denied lately.
template <class Ask>
Decision decideThrough(LimiterDenyCache& cache, std::string_view key, std::int64_t permits,
                       const LimiterMonitor& monitor, std::chrono::microseconds slack, bool onIoThread, Ask&& ask) {
  if (!cache.enabled() || onIoThread) return ask();
  if (std::optional<Decision> local = localDenial(cache, key, permits, monitor)) return *local;
  const LimiterDenyCache::Ticket sent = cache.ticket();
  Decision d = ask();
  rememberDenial(cache, key, sent, d, slack);
  return d;
}

/// decideThrough without waiting: `check()` (the argument checks; their error reaches `done` at
/// once), then the local denial (`done` on this thread), or `ask(done)`, the call to Redis, whose
/// decision is remembered before `done` has it. `done` is isolated as every async call's
/// (completion.hpp), naming `limiter`.
template <class Check, class Ask>
void decideThroughAsync(const std::shared_ptr<LimiterDenyCache>& cache, std::string_view key, std::int64_t permits,
                        const LimiterMonitor& monitor, std::string_view limiter, std::chrono::microseconds slack,
                        Check&& check, Ask&& ask, std::function<void(Decision, std::exception_ptr)> done) {
  if (!checkedOrAnswered(done, monitor, limiter, std::forward<Check>(check))) return;
  if (!cache->enabled()) return ask(std::move(done));
  if (std::optional<Decision> local = localDenial(*cache, key, permits, monitor)) {
    return callOnce(done, &monitor, limiter, *local, nullptr);
  }
  ask([cache, k = std::string(key), sent = cache->ticket(), slack, done = std::move(done)](Decision d,
                                                                                           std::exception_ptr error) {
    if (!error) rememberDenial(*cache, k, sent, d, slack);
    done(d, std::move(error));  // a Decision is trivially copyable
  });
}

/// Forgets `key` (nullopt: every key) when it leaves scope: after a give-back by this process (a
/// refund, settle, release, delete, a write of the policy or rate), whatever its outcome (one that
/// failed may have been applied).
class ForgetAfter {
 public:
  ForgetAfter(LimiterDenyCache& cache, std::optional<std::string_view> key) noexcept : cache_(cache), key_(key) {}
  ForgetAfter(const ForgetAfter&) = delete;
  ForgetAfter& operator=(const ForgetAfter&) = delete;
  ~ForgetAfter() {
    if (key_) {
      cache_.forget(*key_);
    } else {
      cache_.clear();
    }
  }

 private:
  LimiterDenyCache& cache_;
  std::optional<std::string_view> key_;
};

/// `done` of an async give-back, made to forget `key` (nullopt: every key) first, whatever the
/// outcome.
template <class T>
std::function<void(T, std::exception_ptr)> forgettingFirst(std::shared_ptr<LimiterDenyCache> cache,
                                                           std::optional<std::string_view> key,
                                                           std::function<void(T, std::exception_ptr)> done) {
  if (!cache->enabled()) return done;
  return [cache = std::move(cache), k = key ? std::optional<std::string>(*key) : std::nullopt, done = std::move(done)](
             T out, std::exception_ptr error) {
    { const ForgetAfter forget(*cache, k); }
    done(std::move(out), std::move(error));
  };
}

}  // namespace redlimit::detail
