// The Redis data layout, checked byte for byte with plain commands, and interoperation with data
// that Redisson (current and 3.17-3.20) writes: members, hash and value written by hand exactly as
// Redisson would, with client-clock scores.
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "helpers.hpp"
#include "redlimit/errors.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

namespace {

// xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx, lowercase hex. (No std::regex: GCC 12's trips
// -Wmaybe-uninitialized in the sanitizer presets.)
bool isUuidV4(const std::string& s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return s[14] == '4' && (s[19] == '8' || s[19] == '9' || s[19] == 'a' || s[19] == 'b');
}

class Layout : public RedisTest {
 protected:
  std::map<std::string, std::string> hgetall(const std::string& key) {
    const Reply r = raw({"HGETALL", key});
    std::map<std::string, std::string> out;
    for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) out[r.elements[i].str] = r.elements[i + 1].str;
    return out;
  }
  std::string type(const std::string& key) { return raw({"TYPE", key}).str; }
};

class Interop : public Layout {
 protected:
  /// Writes a limiter the way Redisson does: the hash (keepAliveTime only if given), and the value.
  void writeJavaLimiter(const std::string& n, std::int64_t rate, std::int64_t intervalMs, int type, std::int64_t value,
                        const std::string& clientId = "", bool withKeepAlive = true) {
    const std::string r = std::to_string(rate), i = std::to_string(intervalMs), t = std::to_string(type);
    if (withKeepAlive) {
      (void)raw({"HSET", n, "rate", r, "interval", i, "type", t, "keepAliveTime", "0"});
    } else {
      (void)raw({"HSET", n, "rate", r, "interval", i, "type", t});
    }
    const std::string valueKey = suffixName(n, clientId.empty() ? "value" : "value:" + clientId);
    (void)raw({"SET", valueKey, std::to_string(value)});
  }
  void addMember(const std::string& permitsKey, std::int64_t scoreMs, const std::string& id, std::uint32_t permits) {
    ASSERT_EQ(raw({"ZADD", permitsKey, std::to_string(scoreMs), packMember(id, permits)}).integer, 1);
  }
};

}  // namespace

TEST_F(Layout, ConfigHashHoldsFourDecimalFields) {
  RateLimiter overall(client(), name("overall"));
  ASSERT_TRUE(overall.trySetRate(RateType::Overall, 10, milliseconds(1000)));
  EXPECT_EQ(type(name("overall")), "hash");
  EXPECT_EQ(hgetall(name("overall")),
            (std::map<std::string, std::string>{
                {"rate", "10"}, {"interval", "1000"}, {"type", "0"}, {"keepAliveTime", "0"}}));
  // trySetRate touches no other key.
  EXPECT_EQ(raw({"KEYS", "*" + name("overall") + "*"}).elements.size(), 1u);

  RateLimiter perClient(client(), name("perclient"));
  perClient.setRate(RateType::PerClient, 4294967295, milliseconds(1500), milliseconds(3000));
  EXPECT_EQ(hgetall(name("perclient")),
            (std::map<std::string, std::string>{
                {"rate", "4294967295"}, {"interval", "1500"}, {"type", "1"}, {"keepAliveTime", "3000"}}));
  const std::int64_t ttl = raw({"PTTL", name("perclient")}).integer;
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 3000);
}

TEST_F(Layout, ValueIsADecimalStringUnderTheWrappedName) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 10, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire(3));
  const std::string valueKey = "{" + name() + "}:value";
  EXPECT_EQ(rl.keys()[1], valueKey);
  EXPECT_EQ(type(valueKey), "string");
  EXPECT_EQ(raw({"GET", valueKey}).str, "7");
  EXPECT_EQ(rl.availablePermits(), 7);
  EXPECT_EQ(raw({"GET", valueKey}).str, "7");
}

TEST_F(Layout, PermitsMemberIsLengthByteSixteenIdBytesAndLittleEndianPermits) {
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 100000, milliseconds(5000)));
  const std::string permitsKey = "{" + name() + "}:permits";
  EXPECT_EQ(rl.keys()[3], permitsKey);

  const std::int64_t before = serverTimeUs(admin());
  ASSERT_TRUE(rl.tryAcquire(3));
  ASSERT_TRUE(rl.tryAcquire(70000));  // 0x00011170
  const std::int64_t after = serverTimeUs(admin());

  EXPECT_EQ(type(permitsKey), "zset");
  const std::vector<Entry> log = entries(admin(), permitsKey);
  ASSERT_EQ(log.size(), 2u);
  std::set<std::string> ids;
  std::multiset<std::string> tails;
  for (const Entry& e : log) {
    ASSERT_EQ(e.member.size(), 21u);
    EXPECT_EQ(static_cast<unsigned char>(e.member[0]), 0x10);
    ids.insert(e.member.substr(1, 16));
    tails.insert(e.member.substr(17));
    EXPECT_GE(e.scoreUs, before) << "the score is the grant time in epoch ms, to the µs";
    EXPECT_LE(e.scoreUs, after);
  }
  EXPECT_EQ(ids.size(), 2u) << "each acquisition gets its own random id";
  EXPECT_EQ(tails,
            (std::multiset<std::string>{std::string("\x03\x00\x00\x00", 4), std::string("\x70\x11\x01\x00", 4)}));
  EXPECT_EQ(raw({"GET", rl.keys()[1]}).str, std::to_string(100000 - 3 - 70000));
}

TEST_F(Layout, PerClientKeysCarryTheClientId) {
  ClientOptions options;
  options.clientId = "worker-7";
  auto c = newClient(options);
  RateLimiter rl(c, name());
  EXPECT_EQ(rl.keys(), (std::vector<std::string>{name(), "{" + name() + "}:value", "{" + name() + "}:value:worker-7",
                                                 "{" + name() + "}:permits", "{" + name() + "}:permits:worker-7"}));
  ASSERT_TRUE(rl.trySetRate(RateType::PerClient, 5, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire(2));
  EXPECT_EQ(raw({"GET", "{" + name() + "}:value:worker-7"}).str, "3");
  const std::vector<Entry> log = entries(admin(), "{" + name() + "}:permits:worker-7");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(unpackMember(log[0].member).permits, 2u);
  EXPECT_FALSE(exists(admin(), "{" + name() + "}:value"));
  EXPECT_FALSE(exists(admin(), "{" + name() + "}:permits"));
}

TEST_F(Layout, NameWithABraceGetsNoExtraBraces) {
  for (const std::string& suffix : {std::string("a{b}"), std::string("a{b"), std::string("a{}b")}) {
    const std::string n = name(suffix);
    RateLimiter rl(client(), n);
    ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000)));
    ASSERT_TRUE(rl.tryAcquire());
    EXPECT_EQ(raw({"GET", n + ":value"}).str, "4") << n;
    EXPECT_EQ(raw({"ZCARD", n + ":permits"}).integer, 1) << n;
    EXPECT_FALSE(exists(admin(), "{" + n + "}:value")) << n;
  }
  RateLimiter plain(client(), name("ab"));
  ASSERT_TRUE(plain.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  ASSERT_TRUE(plain.tryAcquire());
  EXPECT_EQ(raw({"GET", "{" + name("ab") + "}:value"}).str, "4");
}

TEST_F(Layout, DefaultClientIdIsARandomUuidV4) {
  auto a = newClient();
  auto b = newClient();
  EXPECT_TRUE(isUuidV4(a->clientId())) << a->clientId();
  EXPECT_TRUE(isUuidV4(b->clientId())) << b->clientId();
  EXPECT_FALSE(isUuidV4("0f8fad5b-d9cb-369f-a165-70867728950e")) << "the check itself: version 3";
  EXPECT_NE(a->clientId(), b->clientId());
  RateLimiter rl(a, name());
  ASSERT_TRUE(rl.trySetRate(RateType::PerClient, 5, milliseconds(5000)));
  ASSERT_TRUE(rl.tryAcquire());
  EXPECT_EQ(raw({"GET", "{" + name() + "}:value:" + a->clientId()}).str, "4");
}

TEST_F(Layout, ClientTimeSourceStampsWithThisHostsClock) {
  RateLimiter rl(client(), name(), timeSourceOptions(TimeSource::Client));
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 5, milliseconds(5000)));
  const std::int64_t before = wallUs();
  ASSERT_TRUE(rl.tryAcquire(2));
  const std::int64_t after = wallUs();
  const std::vector<Entry> log = entries(admin(), rl.keys()[3]);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_GE(log[0].scoreUs, before);
  EXPECT_LE(log[0].scoreUs, after);
  EXPECT_EQ(unpackMember(log[0].member).permits, 2u);
}

// Redisson 3.17-3.20 wrote 8-byte ids (length byte 0x08). Expired ones give their permits back,
// live ones count against the rate, through every refill path: the whole log expired, fewer
// expired than live (the expired side is unpacked), more expired than live (the live side is).
TEST_F(Interop, OldRedissonEightByteMembers) {
  struct Case {
    const char* label;
    int expired;  // members of 1 permit each, expired
    int live;     // members of 2 permits each, live
  };
  for (const Case& k : {Case{"all expired", 3, 0}, Case{"fewer expired", 1, 3}, Case{"more expired", 4, 1}}) {
    SCOPED_TRACE(k.label);
    const std::string n = name(k.label);
    const std::int64_t rate = 10, used = k.expired + 2 * k.live;
    writeJavaLimiter(n, rate, 2000, 0, rate - used, "", false);
    const std::string permitsKey = suffixName(n, "permits");
    const std::int64_t now = wallMs();
    for (int i = 0; i < k.expired; ++i) addMember(permitsKey, now - 5000 - i, testId(8, static_cast<unsigned>(i)), 1);
    for (int i = 0; i < k.live; ++i) addMember(permitsKey, now - 100 - i, testId(8, static_cast<unsigned>(100 + i)), 2);

    RateLimiter rl(client(), n);
    EXPECT_EQ(rl.getConfig().keepAliveTime, milliseconds(0)) << "a missing keepAliveTime field means 0";
    const std::int64_t free = rate - std::int64_t{2} * k.live;
    EXPECT_EQ(rl.availablePermits(), free);
    EXPECT_EQ(raw({"ZCARD", permitsKey}).integer, k.live) << "expired members removed, live ones kept";
    if (free < rate) {
      EXPECT_FALSE(rl.tryAcquire(free + 1));
    }
    if (free > 0) {
      EXPECT_TRUE(rl.tryAcquire(free));
    }
    EXPECT_FALSE(rl.tryAcquire());
    EXPECT_EQ(raw({"GET", suffixName(n, "value")}).str, "0");
    // The old members are still intact, next to a new 16-byte one.
    int old = 0, fresh = 0;
    for (const Entry& e : entries(admin(), permitsKey)) {
      const Member m = unpackMember(e.member);
      if (m.id.size() == 8) {
        ++old;
        EXPECT_EQ(m.permits, 2u);
      } else {
        ++fresh;
        EXPECT_EQ(m.id.size(), 16u);
        EXPECT_EQ(static_cast<std::int64_t>(m.permits), free);
      }
    }
    EXPECT_EQ(old, k.live);
    EXPECT_EQ(fresh, free > 0 ? 1 : 0);
  }
}

// A limiter created and used by "Java" (hash, value and members written as Redisson writes them,
// stamped with the client's clock) is shared by redlimit: expired permits come back, live ones
// count, and a permit returns exactly when its Java member expires.
TEST_F(Interop, JavaWrittenLimiterIsShared) {
  const std::string n = name();
  const std::int64_t intervalMs = 600;
  writeJavaLimiter(n, 6, intervalMs, 0, 0);  // 6 in use: 2 expired + 3 + 1 live, not yet released
  const std::string permitsKey = suffixName(n, "permits");
  const std::int64_t t0 = wallMs();
  addMember(permitsKey, t0 - 700, testId(16, 1), 2);  // expired
  addMember(permitsKey, t0 - 400, testId(16, 2), 3);  // live until t0 + 200
  addMember(permitsKey, t0, testId(16, 3), 1);        // live until t0 + 600

  for (TimeSource source : {TimeSource::Server, TimeSource::Client}) {
    RateLimiter rl(client(), n, timeSourceOptions(source));
    const RateLimiterConfig cfg = rl.getConfig();
    EXPECT_EQ(cfg.rate, 6);
    EXPECT_EQ(cfg.rateInterval, milliseconds(intervalMs));
    EXPECT_EQ(cfg.rateType, RateType::Overall);
  }
  RateLimiter rl(client(), n, timeSourceOptions(TimeSource::Client));
  EXPECT_EQ(rl.availablePermits(), 2);
  EXPECT_FALSE(rl.tryAcquire(3));
  EXPECT_TRUE(rl.tryAcquire(2));
  EXPECT_FALSE(rl.tryAcquire());
  // What "Java" reads back: three members, ours in Redisson's encoding.
  std::int64_t sum = 0;
  for (const Entry& e : entries(admin(), permitsKey)) {
    EXPECT_EQ(e.member.size(), 21u);
    sum += unpackMember(e.member).permits;
  }
  EXPECT_EQ(sum, 6);
  EXPECT_EQ(raw({"GET", suffixName(n, "value")}).str, "0");

  std::this_thread::sleep_until(std::chrono::system_clock::time_point(milliseconds(t0 + 320)));
  EXPECT_EQ(rl.availablePermits(), 3) << "the Java member stamped t0-400 has expired, the others are live";
  EXPECT_TRUE(rl.tryAcquire(3));
  EXPECT_FALSE(rl.tryAcquire());
  ASSERT_LT(wallMs(), t0 + 580) << "machine too slow for this test's timing";
}

// PER_CLIENT data written by a Java client whose id is a UUID is read by a redlimit Client that
// uses the same id, and not by one with another id.
TEST_F(Interop, JavaPerClientStateFollowsTheClientId) {
  const std::string n = name();
  const std::string javaId = "0f8fad5b-d9cb-469f-a165-70867728950e";
  writeJavaLimiter(n, 4, 5000, 1, 1, javaId);
  const std::int64_t now = wallMs();
  addMember(suffixName(n, "permits:" + javaId), now - 10, testId(16, 9), 3);

  ClientOptions sameId;
  sameId.clientId = javaId;
  RateLimiter same(newClient(sameId), n);
  EXPECT_EQ(same.availablePermits(), 1);
  EXPECT_FALSE(same.tryAcquire(2));
  EXPECT_TRUE(same.tryAcquire());

  ClientOptions otherId;
  otherId.clientId = "another-host";
  RateLimiter other(newClient(otherId), n);
  EXPECT_EQ(other.availablePermits(), 4);
  EXPECT_TRUE(other.tryAcquire(4));
  EXPECT_EQ(raw({"GET", suffixName(n, "value:" + javaId)}).str, "0");
  EXPECT_EQ(raw({"GET", suffixName(n, "value:another-host")}).str, "0");
}

// Redisson's scripts leave value + live permits == rate; redlimit keeps that invariant for every
// operation, so a Java client reading the keys afterwards sees consistent data.
TEST_F(Interop, InvariantHoldsAfterEveryOperation) {
  RateLimiter rl(client(), name());
  rl.setRate(RateType::Overall, 20, milliseconds(5000));
  auto check = [&](const char* step) {
    const std::int64_t now = serverTimeMs(admin());
    EXPECT_EQ(getInt(admin(), rl.keys()[1]) + livePermits(admin(), rl.keys()[3], now, 5000), 20) << step;
  };
  ASSERT_TRUE(rl.tryAcquire(5));
  check("tryAcquire(5)");
  rl.acquire(4);
  check("acquire(4)");
  EXPECT_EQ(redlimit::detail::SegmentAccess<RateLimiter>::tryAcquireUpTo(rl, {}, 1, 50).granted, 11);
  check("tryAcquireUpTo");
  rl.release(7);
  check("release(7)");
  EXPECT_EQ(rl.availablePermits(), 7);
  check("availablePermits");
  rl.setRate(RateType::Overall, 30, milliseconds(5000), milliseconds(0), true);
  const std::int64_t now = serverTimeMs(admin());
  EXPECT_EQ(getInt(admin(), rl.keys()[1]) + livePermits(admin(), rl.keys()[3], now, 5000), 30);
}
