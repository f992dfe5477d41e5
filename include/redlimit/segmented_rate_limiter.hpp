// redlimit — SegmentedRateLimiter: takes permits from a distributed limiter in blocks (segments)
// and hands them out in-process, so a hot limiter costs one Redis round trip per segment instead
// of one per call.
//
// Guarantee. Every permit handed out locally was granted by the distributed limiter first, as
// part of a segment recorded in its sorted set, and is handed out only while that grant is live
// (before grant + interval, measured conservatively from the moment the request was sent). So
// the grants Redis records never exceed `rate` in any window, exactly as with RateLimiter alone.
// The price of the local cache is that permits can sit unused on one node while another is
// denied: a node holds at most `segmentSize - 1` permits (the call that triggers a refill uses
// at least one at once), so at most `nodes x (segmentSize - 1)` permits are held back from the
// other nodes at any moment. Give-back shrinks that: a node that makes no local acquire for
// `idleReturnAfter` (default a quarter of the interval), closes, or is reconfigured returns its
// unspent permits in one script that shrinks its sorted-set member and raises the value, so
// other nodes can use them in the same window. Counted by the time each permit is *handed out*
// rather than granted, a window can also contain permits granted before it began: those a node
// held then (at most `segmentSize - 1`), or those of a refill in flight then (Redis stamped the
// grant before the window; all its permits, up to `segmentSize`, are handed out after the reply;
// a call for several permits adds the leftover it tops up). For single-permit calls that is at
// most `nodes x segmentSize` beyond `rate`: Redis counts a permit at its grant, and a node may
// spend it any time before grant + interval — as with any client that acquires and works later.
//
// Design choices (each one a decision, written down so it can be revisited):
//  1. Source. The limiter is a template over a source and a clock policy (clock.hpp). The
//     sources are RateLimiter and one key of a Limiter; the cache reaches either through one
//     narrow internal interface, detail::SegmentAccess<Source> (below), whose specialisations
//     are their friends: the calls it makes are not public members of either. Unit tests use an
//     in-process stand-in (reached through its public members) and ClockRef<ManualClock>.
//     <RateLimiter, SteadyClock>, <RateLimiter, CoarseSteadyClock>, <Limiter, SteadyClock> and
//     <Limiter, CoarseSteadyClock> are compiled into the library (src/limiters/segmented_rate_limiter.cpp).
//  2. Hot path. detail::SegmentWord (segment_word.hpp): one cache-line-aligned 64-bit atomic
//     word, generation (high 32 bits) and permits left (low 32), and the segment deadline beside
//     it. A local acquire is a compare_exchange_weak loop that subtracts permits, after checking
//     the deadline. No lock, no allocation, no system call. The clock read is most of the cost
//     (bench_segment measures it): CoarseSteadyClock (CLOCK_MONOTONIC_COARSE) makes the hit
//     several times cheaper than the exact SteadyClock, at the price of ending each segment
//     clockMaxLag() (12 ms at HZ=250) early and of resting on a measured, not proven, bound on
//     how late the kernel's tick can be: opt in with SegmentedRateLimiter<RateLimiter,
//     CoarseSteadyClock> (or <Limiter, CoarseSteadyClock>) when intervals are long (>= ~500 ms).
//  3. Deadline. Local permits expire at (local clock when the refill request was sent) +
//     (interval the script reports with the grant) - (clockMaxLag(clock): how far the clock may
//     trail the true time, 0 for exact clocks). The server stamped the grant after the request
//     was sent, so the local deadline is never later than the grant's expiry in Redis.
//     Clock rate differences between this host and the server over one interval are ignored.
//  4. One refill in flight (detail::RefillCoordinator, refill_coordinator.hpp: the leader role,
//     the give-back in flight, closing, the shared denial, and the slow path's mutex). When a
//     call finds the segment short, it takes the mutex; the first becomes the leader and sends
//     the request with the mutex released; the others wait on a
//     condition variable, timed on the clock policy (clockWaitUntil; SimulatedClock in tests), for
//     at most their timeout, or `refillWait` when they have none. If the attempt they waited for
//     was denied, followers asking for as many permits or more share the denial instead of each
//     sending a request. Each call leads at most one attempt per retry. A follower that waited at
//     least refillWait and still sees the refill in flight has no answer from Redis in time: the
//     source's failure policy decides it (SegmentAccess::decideUnanswered: Allow true, Deny false,
//     Local the local bucket, Throw a TimeoutError naming the limiter and the wait), counted in the
//     source's failureStats(). A stand-in without decideUnanswered gives false. A
//     follower whose own, shorter timeout ran out returns false. acquire(), which has no
//     deadline, keeps waiting instead.
//  5. Partial segments. A refill asks for between `need` and `segmentSize` permits
//     (SegmentAccess::tryAcquireUpTo), so it takes what Redis has left rather than failing while
//     permits remain. A call that needs more than the segment has left uses the leftover and
//     asks Redis only for the difference; the leftover is restored if Redis denies.
//  6. Large requests. A call for more permits than `segmentSize` goes straight to the source
//     (one attempt per try, with the same timeout rules) and leaves the segment alone.
//  7. Give-back. The unspent part of a segment goes back on close() and destruction, on
//     reconfigure() when something changes, and when the node is idle. Nothing is returned at
//     expiry: the grant expires in Redis at the same moment (at most one one-way latency
//     later), so its permits come back there by themselves. That makes every give-back
//     best-effort: SegmentAccess::releaseGrantBestEffort(member, unspent) skips it, sending
//     nothing, while the source's Client has just found Redis unreachable (see
//     Client::admitBestEffort; a stand-in without it: releaseGrant). Over a Limiter key the
//     give-back is the key's refund, not counted as a caller's. A skipped or failed give-back counts its
//     permits as expired. So closing 10 000 limiters on one Client while Redis does not answer
//     costs one command timeout in total (then one probe per ClientOptions::bestEffortRetry),
//     not one per limiter. A give-back holds no leader role during its I/O: a caller that finds
//     the segment empty meanwhile leads its own refill. At most one give-back is in flight;
//     close() and reconfigure() wait for it.
//  8. Idle detection costs the hot path nothing, and threads do not grow with limiters: one
//     sweeper thread for the whole process (detail::IdleSweeper, started by the first limiter
//     with returnWhenIdle, stopped at exit) visits each limiter that holds permits every
//     idleReturnAfter / 2 and compares its state word; if it has not changed for
//     idleReturnAfter, the segment goes back. So give-back happens between idleReturnAfter and
//     2 x idleReturnAfter after the last local acquire. A limiter that holds nothing is not
//     visited; the next refill that leaves permits asks for a visit (one lock of the sweeper per
//     such refill, none on the hot path). A give-back stuck on Redis delays the other limiters'
//     visits, by at most one command bound per bestEffortRetry (the others are skipped). The
//     constructor registers (throwing Error if the thread cannot start); close() unregisters
//     before anything else and waits if the sweeper is visiting this limiter at that moment, so
//     the sweeper never touches a closed limiter and never keeps one alive. With
//     returnWhenIdle = false there is no registration and the owner may call releaseIfIdle()
//     from its own timer.
//  9. reconfigure(type, rate, interval, segmentSize) reads the configuration; if it differs it
//     gives the segment back and writes the new one with setRate(..., keepState = true), so the
//     permits in use stay counted (a change of type clears the state, as in Redisson). A missing
//     configuration is created with trySetRate. keepAliveTime is kept (raised to the new
//     interval if it would fall below it).
// 10. Changes by other nodes. A rate or interval written by someone else applies to this node
//     from its next refill; the permits it holds (< segmentSize) were granted under the old one.
// 11. Errors from the source propagate out of acquire calls and reconfigure(). A failed
//     give-back (idle, close) is not thrown: its permits expire in Redis within one interval and
//     are counted as expired. After close(), acquire calls throw redlimit::Error. reconfigure()
//     checks all its arguments (type, rate, interval up to RateLimiter::kMaxInterval, segment
//     size) before it sends anything. Apart from std::bad_alloc, every exception is a redlimit::Error.
// 12. Generation wrap: see detail::SegmentWord.
//
// Options (SegmentOptions; units and defaults):
//   segmentSize      permits   10     permits taken per round trip (fewer when fewer are left)
//   refillWait       ms        100    longest a call without its own timeout waits for another
//                                     thread's refill
//   returnWhenIdle   bool      true   the process's sweeper thread gives back idle segments
//   idleReturnAfter  ms        0      no local acquire for this long gives the unspent part
//                                     back; 0 = a quarter of the limiter's interval
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "redlimit/detail/acquire_result.hpp"
#include "redlimit/clock.hpp"
#include "redlimit/detail/cache_line.hpp"
#include "redlimit/detail/fork_generation.hpp"
#include "redlimit/detail/idle_sweeper.hpp"
#include "redlimit/detail/refill_coordinator.hpp"
#include "redlimit/detail/segment_word.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/monitor.hpp"
#include "redlimit/rate_limiter_config.hpp"

namespace redlimit {

class RateLimiter;  // a source over one limit (rate_limiter.hpp, which also declares its instantiations
                    // compiled into the library)
class Limiter;      // a source over one key (limiter.hpp, likewise)

namespace detail {
// The members of a stand-in permit source (see SegmentAccess), each detected on its own so that a
// static_assert can name the one that is missing. The call is checked, not the exact signature:
// a member that accepts these arguments and whose result converts to the type named works.
template <class Source, class = void>
struct HasTryAcquireUpTo : std::false_type {};
template <class Source>
struct HasTryAcquireUpTo<Source, std::void_t<decltype(AcquireResult(std::declval<Source&>().tryAcquireUpTo(
                                     std::int64_t{}, std::int64_t{})))>> : std::true_type {};
template <class Source, class = void>
struct HasReleaseGrant : std::false_type {};
template <class Source>
struct HasReleaseGrant<Source, std::void_t<decltype(std::int64_t(std::declval<Source&>().releaseGrant(
                                   std::declval<const std::string&>(), std::int64_t{})))>> : std::true_type {};
// Optional members, detected so that sources without them keep the plain behaviour.
template <class Source, class = void>
struct HasBestEffortRelease : std::false_type {};
template <class Source>
struct HasBestEffortRelease<
    Source, std::void_t<decltype(std::optional<std::int64_t>(std::declval<Source&>().releaseGrantBestEffort(
                std::declval<const std::string&>(), std::int64_t{})))>> : std::true_type {};
template <class Source, class = void>
struct HasDecideUnanswered : std::false_type {};
template <class Source>
struct HasDecideUnanswered<Source, std::void_t<decltype(bool(std::declval<Source&>().decideUnanswered(
                                       std::int64_t{}, std::declval<const std::string&>())))>> : std::true_type {};
// A monitor(): the segment cache counts its decisions and applies shadow mode with the source's
// LimiterMonitor.
template <class Source, class = void>
struct HasMonitor : std::false_type {};
template <class Source>
struct HasMonitor<Source, std::void_t<decltype(LimiterMonitor(std::declval<const Source&>().monitor()))>>
    : std::true_type {};
// What reconfigure() needs on top (checked only when reconfigure() is used): RateLimiter's
// configuration calls, which are public.
template <class Source, class = void>
struct HasConfigCalls : std::false_type {};
template <class Source>
struct HasConfigCalls<Source, std::void_t<decltype(RateLimiterConfig(std::declval<Source&>().getConfig())),
                                          decltype(bool(std::declval<Source&>().trySetRate(
                                              RateType{}, std::int64_t{}, std::chrono::milliseconds{}))),
                                          decltype(std::declval<Source&>().setRate(
                                              RateType{}, std::int64_t{}, std::chrono::milliseconds{},
                                              std::chrono::milliseconds{}, bool{}))>> : std::true_type {};
// A static validateConfig(RateType, rate, interval) (RateLimiter's), used by reconfigure() if present.
template <class Source, class = void>
struct HasValidateConfig : std::false_type {};
template <class Source>
struct HasValidateConfig<
    Source, std::void_t<decltype(Source::validateConfig(RateType{}, std::int64_t{}, std::chrono::milliseconds{}))>>
    : std::true_type {};

/// The narrow interface through which a SegmentedRateLimiter reaches its source: the only calls it
/// makes to it. `key` is the key of a keyed source (kKeyed: a Limiter), empty for the others. The
/// library's sources (RateLimiter, Limiter) keep these operations private and befriend their
/// specialisation; this primary template reaches a stand-in (unit tests, benchmarks) through its
/// public members:
///   AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost);
///       one attempt: granted in [atLeast, atMost] with `member` and `interval` set, or
///       granted = 0 with `wait` (µs) set
///   std::int64_t releaseGrant(const std::string& member, std::int64_t permits);
///       gives back up to `permits` of that grant; returns how many went back
/// and optionally (detected at compile time):
///   std::optional<std::int64_t> releaseGrantBestEffort(const std::string& member, std::int64_t permits);
///       releaseGrant, or nullopt when it skipped the call (give-backs use it)
///   bool decideUnanswered(std::int64_t permits, const std::string& reason);
///       the failure policy's answer for a call that got no answer in time (without it: false)
///   const LimiterMonitor& monitor() const;
///       the source's metrics and shadow mode (without it: a monitor that counts nothing)
template <class Source>
struct SegmentAccess {
  static constexpr bool kKeyed = false;
  static constexpr bool kTakes = HasTryAcquireUpTo<Source>::value;
  static constexpr bool kGivesBack = HasReleaseGrant<Source>::value;

  static void check(const Source& /*source*/, const std::string& /*key*/) {}
  static LimiterMonitor monitor(const Source& source) {
    if constexpr (HasMonitor<Source>::value) {
      return source.monitor();
    } else {
      (void)source;
      return LimiterMonitor{};
    }
  }
  static AcquireResult tryAcquireUpTo(Source& source, const std::string& /*key*/, std::int64_t atLeast,
                                      std::int64_t atMost) {
    return source.tryAcquireUpTo(atLeast, atMost);
  }
  static std::optional<std::int64_t> releaseGrantBestEffort(Source& source, const std::string& /*key*/,
                                                            const std::string& member, std::int64_t permits) {
    if constexpr (HasBestEffortRelease<Source>::value) {
      return source.releaseGrantBestEffort(member, permits);
    } else {
      return source.releaseGrant(member, permits);
    }
  }
  static bool decideUnanswered(Source& source, const std::string& /*key*/, std::int64_t permits,
                               const std::string& reason) {
    if constexpr (HasDecideUnanswered<Source>::value) {
      return source.decideUnanswered(permits, reason);
    } else {
      (void)source, (void)permits, (void)reason;
      return false;
    }
  }
};

/// RateLimiter's (defined in src/limiters/rate_limiter.cpp): its sorted-set grants. The two calls
/// after the cache's are for tests and benchmarks, which check the grants themselves.
template <>
struct SegmentAccess<RateLimiter> {
  static constexpr bool kKeyed = false;
  static constexpr bool kTakes = true;
  static constexpr bool kGivesBack = true;

  static void check(const RateLimiter& source, const std::string& key);
  static LimiterMonitor monitor(const RateLimiter& source);
  /// One attempt for between atLeast and atMost permits (as many as are free, up to atMost); the
  /// grant, or the wait. When Redis cannot be asked, the failure policy decides `atLeast` permits
  /// (no member, no interval). Counted as a round trip, not a decision.
  static AcquireResult tryAcquireUpTo(RateLimiter& source, const std::string& key, std::int64_t atLeast,
                                      std::int64_t atMost);
  /// releaseGrant, not sent while the Client has found Redis unreachable (Client::admitBestEffort):
  /// then nullopt, and the permits come back by themselves when the grant expires.
  static std::optional<std::int64_t> releaseGrantBestEffort(RateLimiter& source, const std::string& key,
                                                            const std::string& member, std::int64_t permits);
  /// The failure policy's decision for `permits` when a call could not get Redis's answer in time
  /// (Allow true, Deny false, Local the local bucket, Throw a TimeoutError naming the limiter and
  /// `reason`), counted in failureStats(). Sends nothing.
  static bool decideUnanswered(RateLimiter& source, const std::string& key, std::int64_t permits,
                               const std::string& reason);

  /// Gives back up to `permits` of a grant (`member` from tryAcquireUpTo's result); returns how
  /// many went back (0 once the grant has expired). Always sent.
  static std::int64_t releaseGrant(RateLimiter& source, const std::string& member, std::int64_t permits);
  /// tryAcquireUpTo without waiting for the reply (coalesced with the handle's other acquisitions).
  static void tryAcquireUpToAsync(RateLimiter& source, std::int64_t atLeast, std::int64_t atMost,
                                  std::function<void(AcquireResult result, std::exception_ptr error)> done);
};

/// Limiter's (defined in src/limiters/limiter.cpp): one key of a GCRA, token bucket, fixed window
/// or smooth policy, whose segments count for the time their permits take to come back.
template <>
struct SegmentAccess<Limiter> {
  static constexpr bool kKeyed = true;
  static constexpr bool kTakes = true;
  static constexpr bool kGivesBack = true;

  /// InvalidArgument, before anything is sent, for a bad key or a policy that cannot serve
  /// segments (a concurrency limit, a calendar quota, a stored policy).
  static void check(const Limiter& source, const std::string& key);
  static LimiterMonitor monitor(const Limiter& source);
  /// One attempt for between atLeast and atMost permits of `key` (atMost cut to the policy's
  /// limit): atMost if available now; else, if at least atLeast remain, what remains (a second
  /// call); else denied with the wait for atLeast (a second call, exact). `interval` is how long
  /// the granted permits count against the key: the time they take to come back at the policy's
  /// rate or, if sooner, until the key is full again (a fixed window: its end), rounded down to
  /// ms; `member` is empty. The failure policy decides when Redis cannot be asked.
  static AcquireResult tryAcquireUpTo(Limiter& source, const std::string& key, std::int64_t atLeast,
                                      std::int64_t atMost);
  /// Gives `permits` back to `key` (not counted as a caller's refund), not sent while the Client
  /// has found Redis unreachable (nullopt then: the permits come back as the key refills).
  static std::optional<std::int64_t> releaseGrantBestEffort(Limiter& source, const std::string& key,
                                                            const std::string& member, std::int64_t permits);
  /// As RateLimiter's, under the Limiter's failure policy.
  static bool decideUnanswered(Limiter& source, const std::string& key, std::int64_t permits,
                               const std::string& reason);
};

/// True if SegmentedRateLimiter can take segments from `Source`: RateLimiter, Limiter, and a
/// stand-in with the members the primary SegmentAccess calls.
template <class Source>
struct IsPermitSource : std::bool_constant<SegmentAccess<Source>::kTakes && SegmentAccess<Source>::kGivesBack> {};
template <class Source>
inline constexpr bool isPermitSourceV = IsPermitSource<Source>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20: the same test as a concept.
template <class Source>
concept PermitSource = isPermitSourceV<Source>;
#endif
}  // namespace detail

/// Options of a SegmentedRateLimiter.
struct SegmentOptions {
  std::int64_t segmentSize = 10;                 // permits taken per round trip; 1..2^32-1
  std::chrono::milliseconds refillWait{100};     // wait for another thread's refill when a call has no timeout, ms;
                                                 // 1..10^12 (SegmentedRateLimiter::kMaxWait)
  bool returnWhenIdle = true;                    // the process's sweeper thread gives back an idle segment
  std::chrono::milliseconds idleReturnAfter{0};  // idle time before give-back, ms; 0 = interval / 4; >= 0
};

/// Counters of one SegmentedRateLimiter, in permits unless they say otherwise. Invariants:
/// permitsFromRemote = directGrants + localGrants + permitsHeld + permitsReturned + permitsExpired
/// (when no refill or give-back is in flight).
struct SegmentStats {
  std::int64_t localGrants = 0;        // permits handed out from a local segment (no round trip)
  std::int64_t directGrants = 0;       // permits handed to the caller of a round trip
  std::int64_t remoteRoundTrips = 0;   // calls sent to the source (acquire and give-back)
  std::int64_t refillWaits = 0;        // calls that waited for another thread's refill (calls)
  std::int64_t permitsFromRemote = 0;  // permits the source granted
  std::int64_t permitsReturned = 0;    // unspent permits given back to the source
  std::int64_t permitsExpired = 0;     // unspent permits dropped because their grant expired
  std::int64_t permitsHeld = 0;        // permits in the local segment now (maybe expired)
};

/// A local segment cache over a distributed limiter: takes `segmentSize` permits per round trip
/// and hands them out in-process, lock-free (see the file comment for the guarantee and design).
///
/// `Source` is where segments come from, one of two:
///  - RateLimiter (the default): SegmentedRateLimiter<>(rateLimiter, options). Segments are
///    grants in its sorted set, live for one interval; reconfigure() writes its configuration.
///  - Limiter: SegmentedRateLimiter<Limiter>(limiter, key, options), one key of a GCRA, token
///    bucket, fixed window or smooth policy sent with every call. A segment counts for the time its
///    permits take to come back in that key (a fixed window: until its end), so the policy's bound
///    holds plus at most one segment per node. Other policies are refused (constructor).
/// What the cache asks of its source (take between atLeast and atMost permits, give the unspent
/// part of a grant back, the failure policy's answer for a call left unanswered, the monitor) is
/// internal: detail::SegmentAccess, which reaches the sources' private members. Unit tests drive
/// the cache with in-process stand-ins through that interface's primary template (see there).
///
/// Metrics and shadow mode are the source's (its options' `monitor`): a hit on the segment counts
/// as a granted decision and a local hit (one relaxed addition; the hit is not timed), a call that
/// needed the slow path as a decision; the source's refills count as its round trips. In shadow
/// mode a denial is let through and counted, and no call waits (acquire and tryAcquire with a
/// timeout make one attempt).
/// `Clock` is a clock policy (clock.hpp): segment deadlines, waits for another thread's refill,
/// the idle check and sleeps between retries all read or wait on it.
///
/// Thread-safe: any thread may call any member, including close() (the destructor must not race
/// with other calls, as for any object, nor run inside a call this limiter makes to its own
/// source). Errors: InvalidArgument for bad arguments (nothing sent); what the source throws
/// (IoError and subclasses, NotInitializedError for a RateLimiter without configuration, ...;
/// under FailurePolicy::Throw a
/// TimeoutError when a refill by another thread is still in flight after refillWait); Error after
/// close() or when the sweeper's thread cannot be started.
template <class Source = RateLimiter, class Clock = SteadyClock>
class alignas(detail::kCacheLine) SegmentedRateLimiter {
  using Access = detail::SegmentAccess<Source>;
  static_assert(Access::kTakes,
                "SegmentedRateLimiter: Source is not a permit source: it lacks "
                "detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost)");
  static_assert(Access::kGivesBack,
                "SegmentedRateLimiter: Source is not a permit source: it lacks "
                "std::int64_t releaseGrant(const std::string& member, std::int64_t permits)");

 public:
  /// The most permits per call and per segment (kMaxPermits, a uint32 in a member).
  static constexpr std::int64_t kMaxPermits = detail::SegmentWord::kMaxLeft;
  /// The longest refillWait, idleReturnAfter and timeout (kMaxWait).
  static constexpr std::chrono::milliseconds kMaxWait{1000000000000};

  /// Takes segments from `source`. Sends nothing. With options.returnWhenIdle, registers with the
  /// process's idle sweeper (detail::IdleSweeper), starting its one thread if this is the first
  /// limiter. Throws InvalidArgument for a null source or bad options, Error if the sweeper's
  /// thread cannot be started.
  template <bool Keyed = Access::kKeyed, std::enable_if_t<!Keyed, int> = 0>
  explicit SegmentedRateLimiter(std::shared_ptr<Source> source, SegmentOptions options = {}, Clock clock = Clock{})
      : SegmentedRateLimiter(Build{}, std::move(source), std::string{}, options, std::move(clock)) {}

  /// Takes segments from `key` of `source` (a Limiter); otherwise as above. Throws
  /// InvalidArgument, before anything is sent, also for a bad key and for a policy that cannot
  /// serve segments: a concurrency limit (it gives leases, not permits), a calendar quota (its
  /// permits come back only when its window ends, up to a month later: a segment would outlive
  /// the one-interval horizon over which clock rates are taken as equal, design choice 3) and a
  /// stored policy (each key's own rate, which any process may change while a segment is held: its
  /// permits could come back sooner than the segment ends).
  template <bool Keyed = Access::kKeyed, std::enable_if_t<Keyed, int> = 0>
  SegmentedRateLimiter(std::shared_ptr<Source> source, std::string key, SegmentOptions options = {},
                       Clock clock = Clock{})
      : SegmentedRateLimiter(Build{}, std::move(source), std::move(key), options, std::move(clock)) {}

  /// The same over a copy of `source` (a Limiter is a cheap value; copies share its state).
  template <bool Keyed = Access::kKeyed, std::enable_if_t<Keyed, int> = 0>
  SegmentedRateLimiter(const Source& source, std::string key, SegmentOptions options = {}, Clock clock = Clock{})
      : SegmentedRateLimiter(Build{}, std::make_shared<Source>(source), std::move(key), options, std::move(clock)) {}

  /// close(): gives back the unspent permits and leaves the idle sweeper. Must not run inside a
  /// call this limiter makes to its own source.
  ~SegmentedRateLimiter() { close(); }

  SegmentedRateLimiter(const SegmentedRateLimiter&) = delete;
  SegmentedRateLimiter& operator=(const SegmentedRateLimiter&) = delete;

  /// Takes one permit if one is available now (see tryAcquire(permits)).
  [[nodiscard]] bool tryAcquire() { return tryAcquire(1); }

  /// Takes `permits` (>= 1) if available now: from the local segment if it holds enough and has
  /// not expired (lock-free), otherwise with one distributed attempt — its own refill, or the
  /// one another thread has in flight (waited for up to refillWait; if it is still in flight
  /// then, the source's failure policy answers, see the file comment). Never sleeps for a denial.
  [[nodiscard]] bool tryAcquire(std::int64_t permits) {
    checkPermits(permits);
    if (takeLocal(permits)) {
      monitor_.localHit(permits);
      return true;
    }
    return admitSlow(acquireSlow(permits, std::chrono::microseconds{0}, false), permits);
  }

  /// Takes one permit, waiting up to `timeout` (see tryAcquire(permits, timeout)).
  [[nodiscard]] bool tryAcquire(std::chrono::milliseconds timeout) { return tryAcquire(1, timeout); }

  /// Takes `permits`, waiting up to `timeout`: on a denial it sleeps the wait the distributed
  /// limiter returns and tries again, and returns false at once when the time left cannot cover
  /// that wait (as RateLimiter). timeout <= 0 means one attempt, like tryAcquire(permits);
  /// timeouts beyond kMaxWait are cut to it.
  [[nodiscard]] bool tryAcquire(std::int64_t permits, std::chrono::milliseconds timeout) {
    if (monitor_.shadow()) return tryAcquire(permits);  // shadow mode never waits
    checkPermits(permits);
    if (takeLocal(permits)) {
      monitor_.localHit(permits);
      return true;
    }
    const auto bounded = std::clamp(timeout, std::chrono::milliseconds{0}, kMaxWait);
    return admitSlow(acquireSlow(permits, std::chrono::microseconds{bounded}, false), permits);
  }

  /// Takes one permit, waiting as long as it takes.
  void acquire() { acquire(1); }

  /// Takes `permits` (>= 1), waiting as long as it takes. Source errors are thrown, not retried.
  void acquire(std::int64_t permits) {
    if (monitor_.shadow()) {  // shadow mode never waits: one attempt, a denial let through
      (void)tryAcquire(permits);
      return;
    }
    checkPermits(permits);
    if (takeLocal(permits)) {
      monitor_.localHit(permits);
      return;
    }
    (void)admitSlow(acquireSlow(permits, std::chrono::microseconds{0}, true), permits);
  }

  /// Brings the distributed configuration to (type, rate, interval) if it differs — giving the
  /// unspent segment back first and keeping the permits in use (setRate with keepState) — and
  /// sets the segment size (a new size also gives the segment back). Creates the configuration
  /// if none exists. Returns true if it wrote the configuration. Waits for a refill in flight.
  /// Throws InvalidArgument for bad values (before anything is sent), what the source throws,
  /// Error after close().
  /// RateLimiter only (a template so that a source without it compiles the rest).
  template <class S = Source>
  bool reconfigure(RateType type, std::int64_t rate, std::chrono::milliseconds interval, std::int64_t segmentSize) {
    static_assert(detail::HasConfigCalls<S>::value,
                  "SegmentedRateLimiter::reconfigure: Source lacks getConfig(), trySetRate(RateType, "
                  "std::int64_t, std::chrono::milliseconds) or setRate(RateType, std::int64_t, "
                  "std::chrono::milliseconds, std::chrono::milliseconds, bool)");
    checkSegmentSize(segmentSize);
    // The keepAliveTime written is derived from a valid configuration.
    if constexpr (detail::HasValidateConfig<S>::value) {
      S::validateConfig(type, rate, interval);
    } else if (rate < 1 || interval.count() < 1) {
      throw InvalidArgument("redlimit: reconfigure needs rate >= 1 and interval >= 1 ms, got " + std::to_string(rate) +
                            " per " + std::to_string(interval.count()) + " ms");
    }
    ensureThisProcess();
    {
      detail::UniqueLock lk(refill_.mutex());
      if (!refill_.leadWhenIdle(lk)) throwClosed();
    }
    try {
      std::optional<RateLimiterConfig> current;
      try {
        current = source_->getConfig();
      } catch (const NotInitializedError&) {
      }
      auto differs = [&] {
        return !current || current->rateType != type || current->rate != rate || current->rateInterval != interval;
      };
      bool changed = false;
      if (differs() || segmentSize != segmentSize_.load(std::memory_order_relaxed)) {
        const detail::LockGuard lk(refill_.mutex());
        releaseSegment(true);
      }
      if (!current) {
        changed = source_->trySetRate(type, rate, interval);
        if (!changed) current = source_->getConfig();  // another node created it meanwhile
      }
      if (current && differs()) {
        std::chrono::milliseconds keepAlive = current->keepAliveTime;
        if (keepAlive.count() > 0 && keepAlive < interval) keepAlive = interval;
        source_->setRate(type, rate, interval, keepAlive, true);
        changed = true;
      }
      segmentSize_.store(segmentSize, std::memory_order_relaxed);
      const detail::LockGuard lk(refill_.mutex());
      finishLead();
      return changed;
    } catch (...) {
      const detail::LockGuard lk(refill_.mutex());
      finishLead();
      throw;
    }
  }

  /// Gives the unspent segment back if no local acquire has changed it for idleReturnAfter
  /// (measured from the first call that saw it unchanged); drops it if it has expired. Returns
  /// the permits given back. The shared sweeper calls this; call it yourself (from your own
  /// timer) with returnWhenIdle = false. Holds no leader role during the give-back, so acquire
  /// calls never wait for it; does nothing while a refill, reconfigure or another give-back is in
  /// flight. Never throws for source errors (the permits then count as expired). Thread-safe.
  std::int64_t releaseIfIdle() noexcept {
    try {
      ensureThisProcess();
      const detail::LockGuard lk(refill_.mutex());
      if (refill_.closed() || refill_.busy()) return 0;
      const std::int64_t now = clock_.now().count();
      std::uint64_t s = word_.load();
      if (s != idleSeen_) {
        idleSeen_ = s;
        idleSince_ = now;
        return 0;
      }
      const std::int64_t after = idleAfterMicros();
      if (Word::leftOf(s) == 0 || after <= 0 || now - idleSince_ < after) return 0;
      const std::uint64_t old = word_.takeAll();
      idleSeen_ = old & ~Word::kLeftMask;
      return releaseTaken(Word::leftOf(old), false);
    } catch (...) {
      return 0;
    }
  }

  /// Gives the unspent segment back and leaves the idle sweeper (waiting for its visit to this
  /// limiter if one is running); later acquire calls throw Error. Waits for a refill or give-back
  /// in flight. Idempotent. Returns the permits given back. A give-back that fails, or that is
  /// skipped because the source's Client has just found Redis unreachable, is not thrown: those
  /// permits expire in Redis within one interval and count as expired. So closing many limiters
  /// on one Client while Redis does not answer costs one command timeout in total.
  std::int64_t close() noexcept {
    ensureThisProcess();
    {
      const detail::LockGuard lk(refill_.mutex());
      if (!refill_.close()) return 0;  // no refill starts from now on; waiters throw Error
    }
    if (sweepId_ != 0) detail::IdleSweeper::instance().remove(sweepId_);
    detail::UniqueLock lk(refill_.mutex());
    (void)refill_.leadWhenIdle(lk, /*evenIfClosed=*/true);
    const std::uint64_t old = word_.close();
    const std::int64_t returned = releaseTaken(Word::leftOf(old), false);
    finishLead();
    return returned;
  }

  /// A snapshot of the counters. Thread-safe.
  [[nodiscard]] SegmentStats stats() const {
    // A fork child's first call may be this one: the renewal touches no state a caller sees
    // change other than the counters it resets to this process's (see renewAfterFork).
    const_cast<SegmentedRateLimiter*>(this)->ensureThisProcess();  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    const detail::LockGuard lk(refill_.mutex());
    SegmentStats out;
    out.directGrants = directGrants_.load(std::memory_order_relaxed);
    out.remoteRoundTrips = remoteRoundTrips_.load(std::memory_order_relaxed);
    out.refillWaits = refill_.refillWaits();
    out.permitsFromRemote = permitsFromRemote_.load(std::memory_order_relaxed);
    out.permitsReturned = returned_;
    out.permitsExpired = expired_;
    out.permitsHeld = word_.left();
    out.localGrants = installed_ - out.permitsHeld - inHand_ - backInFlight_ - returned_ - expired_;
    return out;
  }

  /// Permits taken per round trip. Thread-safe.
  [[nodiscard]] std::int64_t segmentSize() const noexcept { return segmentSize_.load(std::memory_order_relaxed); }
  /// The distributed limiter segments come from.
  [[nodiscard]] const std::shared_ptr<Source>& source() const noexcept { return source_; }
  /// The key of the Limiter segments come from; empty for another source.
  [[nodiscard]] const std::string& key() const noexcept { return key_; }

 private:
  using Word = detail::SegmentWord;

  // Every public constructor: `key` for a keyed source, empty for the others.
  struct Build {};
  SegmentedRateLimiter(Build /*tag*/, std::shared_ptr<Source> source, std::string key, SegmentOptions options,
                       Clock clock)
      : clock_(std::move(clock)),
        source_(std::move(source)),
        key_(std::move(key)),
        refillWait_(options.refillWait),
        idleReturnAfter_(options.idleReturnAfter) {
    if (!source_) throw InvalidArgument("redlimit: SegmentedRateLimiter needs a source");
    Access::check(*source_, key_);
    monitor_ = Access::monitor(*source_);
    checkSegmentSize(options.segmentSize);
    // Bounded above so that every deadline computed from them (µs, steady_clock) stays in range.
    if (options.refillWait.count() <= 0 || options.refillWait > kMaxWait) {
      throw InvalidArgument("redlimit: refillWait must be in 1.." + std::to_string(kMaxWait.count()) + " ms, got " +
                            std::to_string(options.refillWait.count()) + " ms");
    }
    if (options.idleReturnAfter.count() < 0 || options.idleReturnAfter > kMaxWait) {
      throw InvalidArgument("redlimit: idleReturnAfter must be in 0.." + std::to_string(kMaxWait.count()) +
                            " ms, got " + std::to_string(options.idleReturnAfter.count()) + " ms");
    }
    segmentSize_.store(options.segmentSize, std::memory_order_relaxed);
    if (!detail::registerForkCounter()) throw Error("redlimit: SegmentedRateLimiter: pthread_atfork failed (ENOMEM)");
    forkGen_.store(detail::forkCounter(), std::memory_order_relaxed);
    renewClaim_.store(detail::forkCounter(), std::memory_order_relaxed);
    if (options.returnWhenIdle) sweepId_ = detail::IdleSweeper::instance().add(this, &sweepTask);
  }

  struct TryResult {
    bool granted = false;
    bool timedOut = false;              // gave up waiting for another thread's refill
    std::chrono::microseconds wait{0};  // denied: the distributed limiter's retry-after
  };

  static void checkPermits(std::int64_t permits) {
    if (permits < 1 || permits > kMaxPermits) {
      throw InvalidArgument("redlimit: permits must be in 1.." + std::to_string(kMaxPermits) + ", got " +
                            std::to_string(permits));
    }
  }
  static void checkSegmentSize(std::int64_t size) {
    if (size < 1 || size > kMaxPermits) {
      throw InvalidArgument("redlimit: segmentSize must be in 1.." + std::to_string(kMaxPermits) + ", got " +
                            std::to_string(size));
    }
  }
  [[noreturn]] static void throwClosed() { throw Error("redlimit: SegmentedRateLimiter is closed"); }

  // The hot path (detail::SegmentWord::tryTake): reads the clock only if the word holds enough.
  // In a fork() child, until the first slow-path call has renewed this handle (renewAfterFork),
  // the generation differs and nothing is taken: the segment in the word is the parent's. The
  // load is acquire (a plain load on x86-64) so that a thread that sees the renewed generation
  // also sees the emptied word.
  bool takeLocal(std::int64_t permits) {
    if (forkGen_.load(std::memory_order_acquire) != detail::forkCounter()) return false;
    return word_.tryTake(permits, [this] { return clock_.now().count(); });
  }

  // Every entry to the slow path and every member that takes the mutex calls this first.
  void ensureThisProcess() noexcept {
    if (forkGen_.load(std::memory_order_acquire) != detail::forkCounter()) renewAfterFork();
  }

  // This handle was inherited through fork(). The segment in the word belongs to the parent,
  // which still spends it or gives it back: it is dropped here without a give-back (counted as
  // expired). A refill or give-back in flight was a parent thread that does not exist here, and
  // the coordinator's mutex may be held by one: the coordinator is replaced in place (see
  // RefillCoordinator::renewInPlace), never locked. The registration with the idle sweeper is
  // the parent's too: the child's handle registers with the child's own sweeper (a new one, see
  // IdleSweeper::instance), so idle segments are given back in the child as well; if that
  // sweeper's thread cannot start, the child has no idle give-back. One thread of the child renews (claimed with a compare-exchange, no lock: a lock could be held by a parent
  // thread that was renewing at fork()); the others wait for it, without a lock either.
  void renewAfterFork() noexcept REDLIMIT_NO_THREAD_SAFETY_ANALYSIS {
    const std::uint64_t now = detail::forkCounter();
    std::uint64_t seen = renewClaim_.load(std::memory_order_acquire);
    while (seen != now) {
      if (!renewClaim_.compare_exchange_weak(seen, now, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      detail::RefillCoordinator::renewInPlace(refill_);
      const std::uint64_t old = word_.takeAll();
      expired_ += Word::leftOf(old) + inHand_ + backInFlight_;  // the parent's: not ours to spend or return
      inHand_ = 0;
      backInFlight_ = 0;
      sweepArmed_ = false;
      if (sweepId_ != 0) {  // returnWhenIdle
        try {
          sweepId_ = detail::IdleSweeper::instance().add(this, &sweepTask);
        } catch (...) {
          sweepId_ = 0;
        }
      }
      forkGen_.store(now, std::memory_order_release);
      return;
    }
    while (forkGen_.load(std::memory_order_acquire) != now) std::this_thread::yield();
  }

  std::int64_t idleAfterMicros() const noexcept {
    if (idleReturnAfter_.count() > 0) return std::chrono::microseconds{idleReturnAfter_}.count();
    return intervalMicros_.load(std::memory_order_relaxed) / 4;
  }

  // What the slow path decided; a denial carries the wait the source returned (0 when the
  // failure policy answered), which shadow mode reports as the would-be retryAfter.
  struct SlowResult {
    bool granted = false;
    std::chrono::microseconds wait{0};
  };

  bool admitSlow(const SlowResult& r, std::int64_t permits) const { return monitor_.admit(r.granted, permits, r.wait); }

  SlowResult acquireSlow(std::int64_t permits, std::chrono::microseconds timeout, bool forever) {
    ensureThisProcess();
    const std::int64_t until = clock_.now().count() + timeout.count();
    for (;;) {
      TryResult a;
      std::chrono::microseconds waitFor{refillWait_};
      const bool ownTimeout = !forever && timeout.count() > 0;
      if (permits > segmentSize_.load(std::memory_order_relaxed)) {
        a = askSourceDirectly(permits);
      } else {
        if (ownTimeout) waitFor = std::chrono::microseconds{std::max<std::int64_t>(0, until - clock_.now().count())};
        a = takeOrRefill(permits, clock_.now() + waitFor);
      }
      if (a.granted) return SlowResult{true, {}};
      if (a.timedOut) {
        if (forever) continue;
        return SlowResult{refillTimedOut(permits, waitFor, ownTimeout), {}};
      }
      const std::chrono::microseconds wait = std::max<std::chrono::microseconds>(a.wait, std::chrono::milliseconds{1});
      if (!forever) {
        if (timeout.count() <= 0) return SlowResult{false, wait};
        if (until - clock_.now().count() < wait.count()) return SlowResult{false, wait};
      }
      clock_.sleepFor(wait);
    }
  }

  // A call gave up waiting for another thread's refill after `waited`: Redis has not answered that
  // refill yet, so the source's failure policy decides, as for a call of its own that got no
  // answer in time (SegmentAccess::decideUnanswered). A source without a policy: false. A call
  // whose own timeout ran out before refillWait did not find Redis slow, only its own time
  // short: it returns false, as RateLimiter::tryAcquire(permits, timeout) does.
  bool refillTimedOut(std::int64_t permits, std::chrono::microseconds waited, bool ownTimeout) {
    if (ownTimeout && waited < std::chrono::microseconds{refillWait_}) return false;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
    return Access::decideUnanswered(*source_, key_, permits,
                                    "waited " + std::to_string(ms) + " ms (" +
                                        (ownTimeout ? "the call's timeout" : "refillWait") +
                                        ") for another thread's refill in flight, still unanswered");
  }

  // One attempt for more permits than a segment holds: straight to the source.
  TryResult askSourceDirectly(std::int64_t permits) {
    if (word_.closed()) throwClosed();
    remoteRoundTrips_.fetch_add(1, std::memory_order_relaxed);
    const detail::AcquireResult r = Access::tryAcquireUpTo(*source_, key_, permits, permits);
    if (r.granted <= 0) return TryResult{false, false, r.wait};
    permitsFromRemote_.fetch_add(r.granted, std::memory_order_relaxed);
    directGrants_.fetch_add(r.granted, std::memory_order_relaxed);
    return TryResult{true, false, {}};
  }

  // Takes `permits` (<= segment size) from the segment, leading a refill or waiting (until
  // `waitUntil`, µs on the clock) for the one in flight.
  TryResult takeOrRefill(std::int64_t permits, std::chrono::microseconds waitUntil) {
    detail::UniqueLock lk(refill_.mutex());
    bool counted = false;
    for (;;) {
      if (refill_.closed()) throwClosed();
      if (takeLocal(permits)) return TryResult{true, false, {}};
      if (refill_.tryLead()) return leadRefill(permits);
      if (!counted) {
        refill_.countWait();
        counted = true;
      }
      const std::uint64_t seen = refill_.attempts();
      if (!refill_.awaitLeader(clock_, lk, waitUntil)) return TryResult{false, true, {}};
      if (refill_.closed()) throwClosed();
      if (takeLocal(permits)) return TryResult{true, false, {}};
      if (const auto wait = refill_.sharedDenial(seen, permits)) return TryResult{false, false, *wait};
    }
  }

  // The refill: called with the mutex held and the leader role just taken; sends one request
  // with the mutex released. The caller's permits come from the leftover of the current segment
  // (if it has not expired) plus the new grant; the rest of the grant becomes the next segment.
  TryResult leadRefill(std::int64_t permits) REDLIMIT_REQUIRES(refill_.mutex()) {
    const std::uint64_t old = word_.takeAll();
    std::int64_t leftover = Word::leftOf(old);
    if (leftover > 0 && word_.expiredAt(clock_.now().count())) {
      expired_ += leftover;
      leftover = 0;
    }
    if (leftover >= permits) {  // cannot happen (takeLocal just failed under the lock); kept safe
      word_.putBack(leftover - permits);
      finishLead();
      return TryResult{true, false, {}};
    }
    inHand_ = leftover;
    const std::int64_t need = permits - leftover;
    const std::int64_t most = std::max(need, segmentSize_.load(std::memory_order_relaxed));
    refill_.mutex().unlock();  // the request goes out without the lock
    detail::AcquireResult r;
    const std::int64_t sentAt = clock_.now().count();
    try {
      remoteRoundTrips_.fetch_add(1, std::memory_order_relaxed);
      r = Access::tryAcquireUpTo(*source_, key_, need, most);
    } catch (...) {
      refill_.mutex().lock();
      inHand_ = 0;
      word_.putBack(leftover);
      finishLead();
      throw;
    }
    refill_.mutex().lock();
    inHand_ = 0;
    if (r.granted < need) {  // denied (a source never grants less than atLeast otherwise)
      word_.putBack(leftover);
      refill_.recordDenial(permits, r.wait);
      finishLead();
      return TryResult{false, false, r.wait};
    }
    refill_.recordGrant();
    permitsFromRemote_.fetch_add(r.granted, std::memory_order_relaxed);
    directGrants_.fetch_add(need, std::memory_order_relaxed);
    const std::int64_t surplus = r.granted - need;
    if (surplus > 0) {
      const std::int64_t interval = std::chrono::microseconds{r.interval}.count();
      installed_ += surplus;
      member_ = std::move(r.member);
      intervalMicros_.store(interval, std::memory_order_relaxed);
      // A clock that may trail the true time (CoarseSteadyClock) ends the segment that much early.
      const std::int64_t life = interval - clockMaxLag(clock_).count();
      word_.install(old, surplus, sentAt + std::max<std::int64_t>(life, 0));
    }
    finishLead();
    return TryResult{true, false, {}};
  }

  // Empties the segment and gives its unspent, unexpired permits back. Called with the mutex
  // held and the leader role taken (RefillCoordinator); returns with both.
  std::int64_t releaseSegment(bool rethrow) REDLIMIT_REQUIRES(refill_.mutex()) {
    return releaseTaken(Word::leftOf(word_.takeAll()), rethrow);
  }

  // Gives back `n` permits already taken out of the segment (or counts them expired if the
  // segment has expired), as a best-effort call when the source offers one. Called with the mutex
  // held, no give-back in flight, and the segment taken out under the same lock; releases the
  // mutex during the call, marking a give-back in flight (RefillCoordinator::beginRelease), not the leader role.
  std::int64_t releaseTaken(std::int64_t n, bool rethrow) REDLIMIT_REQUIRES(refill_.mutex()) {
    if (n <= 0) return 0;
    if (word_.expiredAt(clock_.now().count())) {
      expired_ += n;
      return 0;
    }
    refill_.beginRelease();
    backInFlight_ = n;
    const std::string member = member_;
    refill_.mutex().unlock();
    std::int64_t returned = 0;
    bool sent = true;  // false: the source skipped the best-effort call and sent nothing
    std::exception_ptr error;
    try {
      const std::optional<std::int64_t> answer = Access::releaseGrantBestEffort(*source_, key_, member, n);
      sent = answer.has_value();
      returned = answer.value_or(0);
    } catch (...) {
      error = std::current_exception();
    }
    if (sent) remoteRoundTrips_.fetch_add(1, std::memory_order_relaxed);
    refill_.mutex().lock();
    returned = std::clamp<std::int64_t>(returned, 0, n);
    refill_.endRelease();  // close() and reconfigure() wait for a give-back in flight
    backInFlight_ = 0;
    returned_ += returned;
    expired_ += n - returned;  // not returned: the grant expired in Redis, the call failed or was skipped
    if (error && rethrow) std::rethrow_exception(error);
    return returned;
  }

  // Ends the leader role (mutex held), wakes the waiters, and has the sweeper watch what is held.
  void finishLead() REDLIMIT_REQUIRES(refill_.mutex()) {
    refill_.endLead();
    armSweep();
  }

  // Asks the shared sweeper to visit this limiter while it holds permits (mutex held). The visit
  // disarms when it finds nothing held; the next leader to leave permits arms it again.
  void armSweep() REDLIMIT_REQUIRES(refill_.mutex()) {
    if (sweepId_ == 0 || sweepArmed_ || refill_.closed() || word_.left() == 0) return;
    sweepArmed_ = true;
    detail::IdleSweeper::instance().schedule(sweepId_, std::chrono::microseconds{0});
  }

  // One visit of the shared sweeper (its thread; never after close() has left the sweeper): the
  // idle check, then µs until the next visit (half the idle time), or -1 to wait to be armed.
  static std::int64_t sweepTask(void* self) noexcept { return static_cast<SegmentedRateLimiter*>(self)->sweep(); }
  std::int64_t sweep() noexcept {
    (void)releaseIfIdle();
    const detail::LockGuard lk(refill_.mutex());
    if (refill_.closed() || word_.left() == 0) {
      sweepArmed_ = false;
      return -1;
    }
    return std::max<std::int64_t>(idleAfterMicros() / 2, 1000);
  }

  // Read-only after construction.
  Clock clock_;
  std::shared_ptr<Source> source_;
  std::string key_;         // a keyed source's key (a Limiter's); empty for the others
  LimiterMonitor monitor_;  // the source's (SegmentAccess::monitor)
  std::chrono::milliseconds refillWait_;
  std::chrono::milliseconds idleReturnAfter_;
  // detail::forkCounter() of the process this handle's state belongs to: read by every local
  // acquire, written once per fork() child (renewAfterFork).
  std::atomic<std::uint64_t> forkGen_{0};
  std::atomic<std::uint64_t> renewClaim_{0};  // the generation a thread has claimed to renew for

  // The hot cache line: written by every local acquire.
  Word word_;

  // The slow path: the refill coordinator (leadership, give-back in flight, closing, shared
  // denials) and its mutex, which also guards the members marked so below.
  alignas(detail::kCacheLine) detail::RefillCoordinator refill_;
  bool sweepArmed_ REDLIMIT_GUARDED_BY(refill_.mutex()) =
      false;                                                 // the sweeper will visit (it does while permits are held)
  std::string member_ REDLIMIT_GUARDED_BY(refill_.mutex());  // sorted-set member of the current segment's grant
  std::uint64_t idleSeen_ REDLIMIT_GUARDED_BY(refill_.mutex()) = 0;  // the state word the idle check saw last
  std::int64_t idleSince_ REDLIMIT_GUARDED_BY(refill_.mutex()) = 0;  // clock µs when it first saw it
  std::int64_t installed_ REDLIMIT_GUARDED_BY(refill_.mutex()) = 0;  // permits placed in segments
  std::int64_t inHand_ REDLIMIT_GUARDED_BY(refill_.mutex()) =
      0;  // permits taken out of the segment by a leader in flight
  std::int64_t backInFlight_ REDLIMIT_GUARDED_BY(refill_.mutex()) = 0;  // permits in the give-back in flight
  std::int64_t returned_ REDLIMIT_GUARDED_BY(refill_.mutex()) = 0;
  std::int64_t expired_ REDLIMIT_GUARDED_BY(refill_.mutex()) = 0;
  std::atomic<std::int64_t> segmentSize_{0};
  std::atomic<std::int64_t> intervalMicros_{0};  // interval of the last grant
  std::atomic<std::int64_t> remoteRoundTrips_{0};
  std::atomic<std::int64_t> permitsFromRemote_{0};
  std::atomic<std::int64_t> directGrants_{0};
  std::uint64_t sweepId_ = 0;  // registration with the idle sweeper; 0 = none (returnWhenIdle off)
};

}  // namespace redlimit
