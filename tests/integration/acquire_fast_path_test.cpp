// acquire.lua decides a whole acquire on usable state in a fast path above its `-- include:` line
// (before its libraries), written again with locals only. These tests hold it to the full code
// below it: the same state on two limiters, one call each, the first by the fast path (resend flag
// 0) and the second by the full code (resend flag 1 with an id that was never granted: the resend
// look-up finds nothing and the call goes on as an ordinary acquire). The replies and what each call left in Redis must agree.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <typeinfo>

#include "helpers.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

constexpr std::int64_t kFastPathIntervalMs = 10000;

/// What one call left behind, in a form two limiters can be compared by.
struct State {
  std::string value;                   // the value key ("" = missing)
  std::vector<std::uint32_t> permits;  // permits of every member, sorted (0: not a permit entry)
  bool valueTtl = false, logTtl = false, hashTtl = false;
  bool operator==(const State& o) const {
    return value == o.value && permits == o.permits && valueTtl == o.valueTtl && logTtl == o.logTtl &&
           hashTtl == o.hashTtl;
  }
};

std::ostream& operator<<(std::ostream& out, const State& s) {
  out << "value \"" << s.value << "\", " << s.permits.size() << " members (";
  for (std::uint32_t p : s.permits) out << p << ' ';
  return out << "), TTL on value/log/hash " << s.valueTtl << s.logTtl << s.hashTtl;
}

/// The outcome of one call: the reply's numbers, or the error's type.
struct Outcome {
  std::string error;  // "" = a reply
  std::int64_t granted = 0, wait = 0, value = 0, rate = 0, interval = 0;
};

class AcquireFastPath : public RedissonMixTest {
 protected:
  /// Sets `rl` up as `build` says (the hash first, then anything by hand, times relative to `now`).
  using Build = std::function<void(const RateLimiter& rl, std::int64_t nowMs)>;

  Outcome call(const RateLimiter& rl, const std::string& permits, bool resend, const std::string& expected) {
    static const detail::Script script{detail::lua::acquire.name, detail::lua::acquire.sha1,
                                       detail::lua::acquire.source};
    const std::string id = resend ? std::string(16, 'r') : std::string(16, 'f');
    const std::vector<std::string> keys = acquireKeys(rl, id);
    const std::vector<std::string_view> views(keys.begin(), keys.end());
    Outcome o;
    try {
      const Reply r = unpackAcquireReply(
          detail::eval(admin(), script, views, {permits, permits, id, "", resend ? "1" : "0", "5000", expected}));
      o.granted = r.elements.at(0).integer;
      o.wait = r.elements.at(1).integer;
      o.value = r.elements.at(2).integer;
      o.rate = r.elements.at(3).integer;
      o.interval = r.elements.at(5).integer;
    } catch (const std::exception&) {
      try {
        std::rethrow_exception(detail::limiterError(std::current_exception()));  // as RateLimiter maps it
      } catch (const std::exception& mapped) {
        o.error = typeid(mapped).name();
      }
    }
    return o;
  }

  State state(const RateLimiter& rl) {
    State s;
    const std::string type = raw({"TYPE", rl.keys()[1]}).str;
    s.value = type == "string" ? raw({"GET", rl.keys()[1]}).str : type == "none" ? "" : "(a " + type + ")";
    if (raw({"TYPE", rl.keys()[3]}).str == "zset") {
      for (const Entry& e : entries(admin(), rl.keys()[3])) {
        try {
          s.permits.push_back(unpackMember(e.member).permits);
        } catch (const std::exception&) {
          s.permits.push_back(0);  // not a permit entry (a member written by hand)
        }
      }
    }
    std::sort(s.permits.begin(), s.permits.end());
    s.valueTtl = raw({"PTTL", rl.keys()[1]}).integer > 0;
    s.logTtl = raw({"PTTL", rl.keys()[3]}).integer > 0;
    s.hashTtl = raw({"PTTL", rl.keys()[0]}).integer > 0;
    return s;
  }

  /// One call on each of two limiters built alike; the fast path's must match the full code's.
  void expectSame(const std::string& label, const Build& build, const std::string& permits,
                  const std::string& expected = "") {
    SCOPED_TRACE(label);
    RateLimiter fast(client(), name(label + ":fast")), full(client(), name(label + ":full"));
    const std::int64_t now = serverTimeMs(admin());
    build(fast, now);
    build(full, now);
    const std::int64_t before = serverTimeMs(admin());
    const Outcome a = call(fast, permits, false, expected);
    const Outcome b = call(full, permits, true, expected);
    const std::int64_t apart = serverTimeMs(admin()) - before;  // the second call's wait is shorter by this
    EXPECT_EQ(a.error, b.error);
    EXPECT_EQ(a.granted, b.granted);
    EXPECT_NEAR(static_cast<double>(a.wait), static_cast<double>(b.wait), static_cast<double>(apart + 1))
        << "ms; the calls were " << apart << " ms apart";
    EXPECT_EQ(a.value, b.value);
    EXPECT_EQ(a.rate, b.rate);
    EXPECT_EQ(a.interval, b.interval);
    EXPECT_EQ(state(fast), state(full));
  }

  void hash(const RateLimiter& rl, const std::string& rate, const std::string& keepAlive = "0") {
    (void)raw({"HSET", rl.keys()[0], "rate", rate, "interval", std::to_string(kFastPathIntervalMs), "type", "0",
               "keepAliveTime", keepAlive});
  }
  void value(const RateLimiter& rl, const std::string& v) { (void)raw({"SET", rl.keys()[1], v}); }
  /// `n` members of `permits` each, stamped `ageMs` before `nowMs` (older ones first).
  void members(const RateLimiter& rl, std::int64_t nowMs, int n, std::int64_t ageMs, std::uint32_t permits, char tag) {
    for (int i = 0; i < n; ++i) {
      const std::string digits = std::to_string(i);
      const std::string id = std::string(1, tag) + std::string(15 - digits.size(), '0') + digits;
      const std::string micros = std::to_string(100 + i % 900);  // three digits
      (void)raw(
          {"ZADD", rl.keys()[3], std::to_string(nowMs - ageMs - (n - i)) + "." + micros, packMember(id, permits)});
    }
  }
};

TEST_F(AcquireFastPath, GrantsAndDenialsOnUsableState) {
  expectSame(
      "empty log, value at the rate",
      [&](auto& rl, auto) {
        hash(rl, "10");
        value(rl, "10");
      },
      "1");
  expectSame(
      "empty log, value below the rate",
      [&](auto& rl, auto) {
        hash(rl, "10");
        value(rl, "0");
      },
      "3");
  expectSame(
      "live members, enough left",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "5");
        members(rl, now, 5, 100, 1, 'a');
      },
      "2");
  expectSame(
      "live members, used up",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "0");
        members(rl, now, 10, 100, 1, 'a');
      },
      "1");
  expectSame(
      "a wide member frees the want at once",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "1");
        members(rl, now, 1, 3000, 6, 'w');
        members(rl, now, 3, 100, 1, 'a');
      },
      "4");
  expectSame(
      "the wait walks several members",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "0");
        members(rl, now, 10, 2000, 1, 'a');
      },
      "5");
  expectSame(
      "expired members reclaimed, then granted",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "5");
        members(rl, now, 3, kFastPathIntervalMs + 500, 1, 'x');
        members(rl, now, 2, 100, 1, 'a');
      },
      "7");
  expectSame(
      "expired members reclaimed, still denied",
      [&](auto& rl, auto now) {
        hash(rl, "5");
        value(rl, "0");
        members(rl, now, 2, kFastPathIntervalMs + 500, 1, 'x');
        members(rl, now, 3, 100, 1, 'a');
      },
      "3");
  expectSame(
      "every member expired",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "0");
        members(rl, now, 10, kFastPathIntervalMs + 500, 1, 'x');
      },
      "10");
}

TEST_F(AcquireFastPath, TtlRules) {
  expectSame(
      "keepAliveTime refreshes every key on a grant",
      [&](auto& rl, auto now) {
        hash(rl, "10", "20000");
        value(rl, "5");
        members(rl, now, 5, 100, 1, 'a');
      },
      "1");
  expectSame(
      "keepAliveTime refreshes every key on a denial",
      [&](auto& rl, auto now) {
        hash(rl, "10", "20000");
        value(rl, "0");
        members(rl, now, 10, 100, 1, 'a');
      },
      "1");
  expectSame(
      "a new log inherits the hash's TTL",
      [&](auto& rl, auto) {
        hash(rl, "10");
        value(rl, "10");
        (void)raw({"PEXPIRE", rl.keys()[0], "60000"});
      },
      "1");
  expectSame(
      "an existing log keeps its own (none)",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "5");
        members(rl, now, 5, 100, 1, 'a');
        (void)raw({"PEXPIRE", rl.keys()[0], "60000"});
      },
      "1");
}

TEST_F(AcquireFastPath, StateTheFullCodeRepairsOrRefuses) {
  expectSame(
      "value above what the log allows (count check)",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "10");
        members(rl, now, 4, 100, 1, 'a');
      },
      "1");
  expectSame(
      "value above the rate",
      [&](auto& rl, auto) {
        hash(rl, "10");
        value(rl, "11");
      },
      "1");
  expectSame(
      "the rate moved and the value is 0 (Redisson's clamp)",
      [&](auto& rl, auto now) {
        hash(rl, "4");
        value(rl, "0");
        members(rl, now, 3, 100, 2, 'a');
      },
      "1", "10");
  expectSame(
      "the same, with members reclaimed",
      [&](auto& rl, auto now) {
        hash(rl, "4");
        value(rl, "0");
        members(rl, now, 1, kFastPathIntervalMs + 500, 1, 'x');
        members(rl, now, 3, 100, 1, 'a');
      },
      "1", "10");
  expectSame(
      "a value in a form DECRBY refuses",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "5e0");
        members(rl, now, 5, 100, 1, 'a');
      },
      "1");
  expectSame(
      "the value key missing",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        members(rl, now, 3, 100, 1, 'a');
      },
      "1");
  expectSame(
      "a frozen value",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "-10000000000000");
        members(rl, now, 3, 100, 1, 'a');
      },
      "1");
  expectSame(
      "an expired member that is not a permit entry",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "5");
        (void)raw({"ZADD", rl.keys()[3], std::to_string(now - kFastPathIntervalMs - 100), "abc"});
        members(rl, now, 2, 100, 1, 'a');
      },
      "1");
  expectSame(
      "a live member that is not a permit entry, read by the wait",
      [&](auto& rl, auto now) {
        hash(rl, "10");
        value(rl, "0");
        (void)raw({"ZADD", rl.keys()[3], std::to_string(now - 100), "abc"});
      },
      "1");
  expectSame(
      "permits above the rate",
      [&](auto& rl, auto) {
        hash(rl, "10");
        value(rl, "10");
      },
      "11");
  expectSame(
      "the value of another type",
      [&](auto& rl, auto) {
        hash(rl, "10");
        (void)raw({"RPUSH", rl.keys()[1], "x"});
      },
      "1");
  expectSame(
      "the log of another type",
      [&](auto& rl, auto) {
        hash(rl, "10");
        value(rl, "10");
        (void)raw({"SET", rl.keys()[3], "x"});
      },
      "1");
}

// More than a batch expired: both reclaim exactly one batch (the rest counts as in use), or, when
// the whole log has expired, drop it with one UNLINK.
TEST_F(AcquireFastPath, MoreThanABatchExpired) {
  const std::int64_t batch = kScriptBatch;
  auto fill = [&](const RateLimiter& rl, std::int64_t expired, std::int64_t live) {
    ASSERT_EQ(fillLog(rl.keys()[3], expired, kFastPathIntervalMs + 1000, live), expired + live);
  };
  expectSame(
      "a batch and a half expired, some live",
      [&](auto& rl, auto) {
        hash(rl, "100000");
        fill(rl, batch + batch / 2, 10);
        value(rl, std::to_string(100000 - batch - batch / 2 - 10));
      },
      "1");
  expectSame(
      "the same, used up",
      [&](auto& rl, auto) {
        hash(rl, "3000");
        fill(rl, batch + batch / 2, 1500);
        value(rl, "0");
      },
      "2000");
  expectSame(
      "a batch and a half, all expired",
      [&](auto& rl, auto) {
        hash(rl, "100000");
        fill(rl, batch + batch / 2, 0);
        value(rl, "0");
      },
      "1");
  expectSame(
      "exactly a batch, all expired",
      [&](auto& rl, auto) {
        hash(rl, "100000");
        fill(rl, batch, 0);
        value(rl, "0");
      },
      "1");
}

}  // namespace
