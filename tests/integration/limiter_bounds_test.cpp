// Limiter's arithmetic and bounds under the one-key scripts: the scripts against exact models (128-bit
// integers, written from the algorithms' definitions) at chosen server times over random and
// extreme configurations; the limits held by 3 processes x 4 threads, checked from the grants'
// server times; reservations spaced exactly at the rate.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "one_key_support.hpp"
#include "redlimit/detail/rate_units.hpp"
#include "redlimit_test/process.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

__extension__ using Int128 = __int128;

constexpr std::int64_t kMaxU32 = 4294967295;
constexpr Int128 kTwo50 = Int128{1} << 50;
constexpr Int128 kTwo52 = Int128{1} << 52;

Int128 floorDiv(Int128 a, Int128 b) {
  Int128 q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}
Int128 ceilDiv(Int128 a, Int128 b) { return -floorDiv(-a, b); }
Int128 gcd128(Int128 a, Int128 b) {
  while (b != 0) {
    const Int128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}
std::int64_t i64(Int128 v) { return static_cast<std::int64_t>(v); }

// GCRA by its definition: TAT kept exactly, as a count of 1/P' µs since the epoch.
struct GcraModel {
  Int128 burst = 0, pp = 0, ip = 0, tat = 0, intervalUs = 0;

  GcraModel(std::int64_t b, std::int64_t permits, std::int64_t intervalMs, std::int64_t initial, std::int64_t nowUs) {
    const Int128 us = Int128{intervalMs} * 1000;
    const Int128 g = gcd128(permits, us);
    burst = b;
    intervalUs = us;
    pp = permits / g;
    ip = us / g;
    tat = Int128{nowUs} * pp + (burst - initial) * ip;
  }
  Int128 ahead(std::int64_t nowUs) const { return std::max<Int128>(0, tat - Int128{nowUs} * pp); }
  TakeReply take(std::int64_t nowUs, std::int64_t n, std::int64_t maxWait, bool write) {
    const Int128 cap = burst * ip;
    const Int128 d = ahead(nowUs);
    const Int128 need = d + n * ip;
    // The horizon: max(B x T, I), at most 2^52 / P' (lua/lib/gcra_core.lua).
    const Int128 horizon = std::min<Int128>(std::max<Int128>(floorDiv(cap, pp), intervalUs), floorDiv(kTwo52, pp));
    const Int128 longest = std::min<Int128>(maxWait, horizon);
    TakeReply r;
    r.limit = i64(burst);
    r.nowUs = nowUs;
    Int128 after = d;
    if (need <= cap) {
      r.allowed = true;
      after = need;
    } else {
      const Int128 wait = ceilDiv(need - cap, pp);
      if (wait <= longest) {
        r.allowed = true;
        r.delayUs = i64(wait);
        after = need;
      } else {
        r.retryAfterUs = i64(wait - longest);
      }
    }
    if (!write) after = d;
    if (write && r.allowed) tat = Int128{nowUs} * pp + after;
    r.remaining = after < cap ? i64((cap - after) / ip) : 0;
    r.resetAfterUs = i64(ceilDiv(after, pp));
    return r;
  }
  std::int64_t refund(std::int64_t nowUs, std::int64_t n) {
    const Int128 d = ahead(nowUs);
    const Int128 left = std::max<Int128>(0, d - Int128{n} * ip);
    if (left != d) tat = Int128{nowUs} * pp + left;
    return left >= burst * ip ? 0 : i64((burst * ip - left) / ip);
  }
};

// The fixed window by its definition: counts per aligned window (and the one after it).
struct WindowModel {
  std::int64_t limit = 0, wus = 0, start = 0, count = 0, next = 0;

  WindowModel(std::int64_t l, std::int64_t windowMs, std::int64_t nowUs)
      : limit(l), wus(windowMs * 1000), start(nowUs - nowUs % (windowMs * 1000)) {}
  void roll(std::int64_t nowUs) {
    const std::int64_t current = nowUs - nowUs % wus;
    if (current == start + wus) {
      count = next;
      next = 0;
    } else if (current > start) {
      count = next = 0;
    }
    start = std::max(start, current);
  }
  TakeReply take(std::int64_t nowUs, std::int64_t n, std::int64_t maxWait, bool write) {
    WindowModel w = *this;
    w.roll(nowUs);
    const std::int64_t wait = w.start + wus - nowUs;
    TakeReply r;
    r.limit = limit;
    r.nowUs = nowUs;
    std::int64_t c = w.count, nx = w.next;
    if (c + n <= limit) {
      r.allowed = true;
      c += n;
    } else if (nx + n <= limit && wait <= maxWait) {
      r.allowed = true;
      r.delayUs = wait;
      nx += n;
    } else if (nx + n <= limit) {
      r.retryAfterUs = wait - maxWait;  // as a reservation maxWait before the next window
    } else {
      r.retryAfterUs = std::max(wait, wait + wus - maxWait);
    }
    if (!write) {
      c = w.count;
      nx = w.next;
    }
    r.remaining = limit - c;
    r.resetAfterUs = nx > 0 ? wait + wus : c > 0 ? wait : 0;
    if (write && r.allowed) {  // only a grant writes
      *this = w;
      count = c;
      next = nx;
    }
    return r;
  }
};

std::string describeCase(std::int64_t limit, std::int64_t permits, std::int64_t intervalMs, int op) {
  return "limit " + std::to_string(limit) + ", " + std::to_string(permits) + " per " + std::to_string(intervalMs) +
         " ms, operation " + std::to_string(op);
}

void expectSame(const TakeReply& got, const TakeReply& want, const std::string& what) {
  EXPECT_EQ(got.allowed, want.allowed) << what;
  EXPECT_EQ(got.remaining, want.remaining) << what;
  EXPECT_EQ(got.retryAfterUs, want.retryAfterUs) << what;
  EXPECT_EQ(got.resetAfterUs, want.resetAfterUs) << what;
  EXPECT_EQ(got.limit, want.limit) << what;
  EXPECT_EQ(got.nowUs, want.nowUs) << what;
  EXPECT_EQ(got.delayUs, want.delayUs) << what;
}

}  // namespace

class LimiterBounds : public RedisTest {
 protected:
  Reply run(const detail::lua::EmbeddedScript& s, const std::string& key, const std::vector<std::string>& args) {
    return runOneKey(admin(), s, key, args);
  }
};

TEST_F(LimiterBounds, GcraScriptMatchesTheExactModelOnRandomAndExtremeConfigurations) {
  std::mt19937_64 rng(20240611);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  // Extremes first: the largest burst for the coarsest rate, P' near 2^32, whole-µs and
  // fractional emission intervals; then random ones.
  struct Cfg {
    std::int64_t burst, permits, intervalMs;
  };
  std::vector<Cfg> configs = {
      {262, 1, kMaxU32},     {kMaxU32, 1000, 1000},      {1, kMaxU32, 1}, {3, 4294967291, kMaxU32}, {1000, 7, 3},
      {kMaxU32, kMaxU32, 1}, {262144, 4294967291, 1000}, {5, 3, 10}};
  while (configs.size() < 40) {
    const std::int64_t permits = uniform(0, 2) == 0 ? uniform(1, 100) : uniform(1, kMaxU32);
    const std::int64_t intervalMs = uniform(0, 2) == 0 ? uniform(1, 1000) : uniform(1, kMaxU32);
    const std::int64_t ip = detail::rateUnits(permits, milliseconds(intervalMs)).permitUnits;
    const std::int64_t most = std::min<std::int64_t>(kMaxU32, static_cast<std::int64_t>(kTwo50 / ip));
    if (most < 1) continue;
    configs.push_back({uniform(1, most), permits, intervalMs});
  }
  int index = 0;
  for (const Cfg& cfg : configs) {
    ASSERT_NO_THROW((void)GcraTraits::policy(cfg.burst, cfg.permits, milliseconds(cfg.intervalMs)));
    const std::string key = name("gcra" + std::to_string(index++));
    const std::string kind = index % 2 == 0 ? "G" : "T";
    std::int64_t now = 1700000000000000 + uniform(0, 1000000000);
    const std::int64_t initial = kind == "G" ? cfg.burst : uniform(0, cfg.burst);
    ASSERT_EQ(run(detail::lua::gcra, key,
                  {"set", std::to_string(now), kind, "try", std::to_string(cfg.burst), std::to_string(cfg.permits),
                   std::to_string(cfg.intervalMs), "0", std::to_string(initial)})
                  .elements.at(0)
                  .asInteger(),
              1);
    GcraModel model(cfg.burst, cfg.permits, cfg.intervalMs, initial, now);
    // One permit's time, µs (at least 1): steps of a few of them move the bucket around.
    const Int128 tau = std::max<Int128>(1, ceilDiv(model.ip, model.pp));
    const std::int64_t step = i64(std::min<Int128>(tau * 3, Int128{1} << 40));
    for (int op = 0; op < 40; ++op) {
      const int kindOfStep = static_cast<int>(uniform(0, 3));
      now += kindOfStep == 0 ? 0 : kindOfStep == 1 ? 1 : uniform(0, step);
      const std::int64_t n =
          uniform(0, 1) == 0 ? uniform(1, std::min<std::int64_t>(cfg.burst, 3)) : uniform(1, cfg.burst);
      const std::string what = describeCase(cfg.burst, cfg.permits, cfg.intervalMs, op);
      const int which = static_cast<int>(uniform(0, 9));
      if (which < 6) {
        const std::int64_t maxWait = which < 3 ? 0 : uniform(0, 1) == 0 ? uniform(0, step) : uniform(0, 99999999999999);
        const TakeReply got = takeReply(run(
            detail::lua::gcra, key, {"take", std::to_string(now), kind, std::to_string(n), std::to_string(maxWait)}));
        expectSame(got, model.take(now, n, maxWait, true), what);
      } else if (which < 8) {
        const TakeReply got =
            takeReply(run(detail::lua::gcra, key, {"peek", std::to_string(now), kind, std::to_string(n)}));
        expectSame(got, model.take(now, n, 0, false), what);
      } else {
        const std::int64_t back = uniform(0, cfg.burst);
        EXPECT_EQ(run(detail::lua::gcra, key, {"refund", std::to_string(now), kind, std::to_string(back)}).asInteger(),
                  model.refund(now, back))
            << what;
      }
      if (HasFailure()) return;
    }
  }
}

TEST_F(LimiterBounds, FixedWindowScriptMatchesTheModel) {
  std::mt19937_64 rng(7);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int index = 0; index < 30; ++index) {
    const std::int64_t limit = index == 0 ? kMaxU32 : uniform(1, 20);
    const std::int64_t windowMs = index == 1 ? kMaxU32 : uniform(1, 500);
    const std::string key = name("fw" + std::to_string(index));
    std::int64_t now = 1700000000000000 + uniform(0, 1000000000);
    ASSERT_EQ(run(detail::lua::fixed_window, key,
                  {"set", std::to_string(now), "W", "try", std::to_string(limit), std::to_string(windowMs), "0"})
                  .elements.at(0)
                  .asInteger(),
              1);
    WindowModel model(limit, windowMs, now);
    for (int op = 0; op < 60; ++op) {
      const int kindOfStep = static_cast<int>(uniform(0, 3));
      now += kindOfStep == 0 ? 0 : kindOfStep == 1 ? 1 : uniform(0, windowMs * 1000);
      const std::int64_t n = uniform(1, std::min<std::int64_t>(limit, 8));
      const std::string what = describeCase(limit, 0, windowMs, op);
      if (uniform(0, 3) != 0) {
        const std::int64_t maxWait = uniform(0, 1) == 0 ? 0 : uniform(0, 2 * windowMs * 1000);
        const TakeReply got =
            takeReply(run(detail::lua::fixed_window, key,
                          {"take", std::to_string(now), "W", std::to_string(n), std::to_string(maxWait)}));
        expectSame(got, model.take(now, n, maxWait, true), what);
      } else {
        const TakeReply got =
            takeReply(run(detail::lua::fixed_window, key, {"peek", std::to_string(now), "W", std::to_string(n)}));
        expectSame(got, model.take(now, n, 0, false), what);
      }
      if (HasFailure()) return;
    }
  }
}

TEST_F(LimiterBounds, TokenBucketInitialTokensAndExactRefill) {
  // 3 permits per second: one every 333333.33 µs, never rounded to whole ms or seconds. The bucket
  // is written empty by the script's `set` (initial tokens 0), then decided by a Limiter of a
  // stored token bucket.
  Limiter rl(client(), limiterName(), Policy::tokenBucket(6, 3, milliseconds(1000)).stored());
  const std::string key = rl.redisKey("k");
  LimiterConfig c{'T', 6, 3, 1000, 0};
  (void)runOneKey(admin(), detail::lua::gcra, key, setArgs(c, serverTimeUs(admin()), 0));
  const Decision d = rl.decide("k");
  ASSERT_FALSE(d.allowed) << "the bucket starts empty";
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.limit, 6);
  // e µs after the bucket was written: the next permit comes at 333334 - e, full at 2000000 - e.
  EXPECT_LE(d.retryAfter.count(), 333334);
  EXPECT_EQ(d.resetAfter.count(), 2000000 - (333334 - d.retryAfter.count()));
  const std::int64_t at = d.time.count() + d.retryAfter.count();
  EXPECT_FALSE(
      takeReply(runOneKey(admin(), detail::lua::gcra, key, {"peek", std::to_string(at - 1), "T", "1"})).allowed);
  EXPECT_TRUE(takeReply(runOneKey(admin(), detail::lua::gcra, key, {"peek", std::to_string(at), "T", "1"})).allowed);

  // Polled faster than one permit comes back, the bucket still refills (the whole-second seed
  // never did): 3 per 10 ms, asked every ms.
  c = LimiterConfig{'T', 3, 3, 10, 0};
  (void)raw({"DEL", key});
  (void)runOneKey(admin(), detail::lua::gcra, key, setArgs(c, serverTimeUs(admin()), 0));
  int granted = 0;
  const auto start = std::chrono::steady_clock::now();
  while (granted < 5 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    if (rl.tryAcquire("k")) ++granted;
    sleepMs(1);
  }
  EXPECT_EQ(granted, 5);
}

TEST_F(LimiterBounds, GcraReservationsLeaveExactlyAtTheRate) {
  // 10 per 100 ms, burst 1: one every 10 ms. Callers that reserve are queued: each may use its
  // permit exactly 10 ms after the one before.
  Limiter rl(client(), limiterName(), GcraTraits::policy(1, 10, milliseconds(100)).stored());
  ASSERT_TRUE(rl.trySetPolicy("k"));
  std::vector<std::int64_t> useTimes;
  for (int i = 0; i < 10; ++i) {
    const Decision r = rl.reserve("k", 1, microseconds(1000000));
    ASSERT_TRUE(r.allowed);
    EXPECT_EQ(r.retryAfter.count(), 0);
    useTimes.push_back((r.time + r.delay).count());
  }
  for (std::size_t i = 2; i < useTimes.size(); ++i) EXPECT_EQ(useTimes[i] - useTimes[i - 1], 10000) << i;
  // A caller that will not wait that long is refused, nothing taken, and told when it would fit.
  const Decision refused = rl.reserve("k", 1, microseconds(5000));
  ASSERT_FALSE(refused.allowed);
  const std::int64_t due = useTimes.back() + 10000;  // when the next permit is free
  EXPECT_EQ(refused.time.count() + refused.retryAfter.count() + 5000, due);
  const Decision next = rl.reserve("k", 1, microseconds(1000000));
  EXPECT_EQ((next.time + next.delay).count(), due) << "the refusal took nothing";
}

// --- 3 processes x 4 threads ---------------------------------------------------------------------

namespace {

struct Grant {
  std::int64_t useUs = 0;
  std::int64_t permits = 0;
};

// Runs 3 one_key_worker processes of 4 threads on the key `key` of the Limiter `limiter` for `ms`
// and collects their grants.
std::vector<Grant> hammer(const std::string& kind, const std::string& uri, const std::string& limiter,
                          const std::string& key, int ms, std::int64_t maxWaitUs) {
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        REDLIMIT_ONE_KEY_WORKER, kind, uri, limiter, key, "4", std::to_string(ms), std::to_string(maxWaitUs)}));
  }
  std::vector<Grant> grants;
  for (auto& w : workers) {
    std::string out;
    EXPECT_EQ(w->wait(out), 0) << out;
    std::istringstream in(out);
    long long count = -1, errors = -1;
    in >> count >> errors;
    EXPECT_EQ(errors, 0);
    for (long long i = 0; i < count; ++i) {
      Grant g;
      in >> g.useUs >> g.permits;
      grants.push_back(g);
    }
  }
  std::sort(grants.begin(), grants.end(), [](const Grant& a, const Grant& b) { return a.useUs < b.useUs; });
  return grants;
}

// "At most burst + permits x T / interval in any window of length T", checked for every pair of
// grants i <= j: sum(permits) x interval <= burst x interval + (u_j - u_i + 1 us) x permits. (The
// 1 µs: a reservation's use time is rounded up to a whole µs.) Returns "" or the violation.
std::string gcraViolation(const std::vector<Grant>& g, std::int64_t burst, std::int64_t permits,
                          std::int64_t intervalUs) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    Int128 sum = 0;
    for (std::size_t j = i; j < g.size(); ++j) {
      sum += g[j].permits;
      if (sum * intervalUs > Int128{burst} * intervalUs + Int128{g[j].useUs - g[i].useUs + 1} * permits) {
        return std::to_string(static_cast<long long>(sum)) + " permits within " +
               std::to_string(g[j].useUs - g[i].useUs) + " us";
      }
    }
  }
  return "";
}

}  // namespace

template <class Traits>
class LimiterProcesses : public RedisTest {};
using ProcessTypes = ::testing::Types<TokenBucketTraits, GcraTraits, FixedWindowTraits>;
class ProcessNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return T::kWorkerKind;
  }
};
TYPED_TEST_SUITE(LimiterProcesses, ProcessTypes, ProcessNames);

TYPED_TEST(LimiterProcesses, ThreeProcessesOfFourThreadsNeverExceedTheBound) {
  // Burst 20, 50 per 100 ms (the window: 40 per 100 ms). One thread per process reserves with a
  // 30 ms maxWait; the grants are checked at the times their permits may be used.
  constexpr std::int64_t kBurst = 20, kPermits = 50, kIntervalMs = 100;
  const std::int64_t limit = std::is_same_v<TypeParam, FixedWindowTraits> ? 40 : kBurst;
  Limiter rl(this->client(), this->limiterName(),
             TypeParam::policy(limit, kPermits, milliseconds(kIntervalMs)).stored());
  ASSERT_TRUE(rl.trySetPolicy("k"));
  const std::vector<Grant> grants = hammer(TypeParam::kWorkerKind, this->server().uri(), rl.name(), "k", 1000, 30000);
  ASSERT_FALSE(grants.empty());
  std::int64_t total = 0;
  for (const Grant& g : grants) total += g.permits;
  const std::int64_t spanUs = grants.back().useUs - grants.front().useUs;
  std::printf("BOUNDS %s grants=%zu permits=%lld span_us=%lld\n", TypeParam::kWorkerKind, grants.size(),
              static_cast<long long>(total), static_cast<long long>(spanUs));
  if constexpr (std::is_same_v<TypeParam, FixedWindowTraits>) {
    std::map<std::int64_t, std::int64_t> perWindow;
    for (const Grant& g : grants) perWindow[g.useUs / (kIntervalMs * 1000)] += g.permits;
    for (const auto& [window, permits] : perWindow) EXPECT_LE(permits, limit) << "window " << window;
    EXPECT_GE(perWindow.size(), 5u);
  } else {
    EXPECT_EQ(gcraViolation(grants, kBurst, kPermits, kIntervalMs * 1000), "");
    // Saturated: far more than the burst went through, as the rate allows.
    EXPECT_GT(total, kBurst + kPermits);
  }
}
