// lua/batch.lua against a real redis-server: many independent takes in one call, each decided
// exactly as its own script (gcra.lua, fixed_window.lua) decides it alone at the same time (twin
// keys, a seeded random sequence), a key repeated within a batch, whole-call errors that write
// nothing, a failing decision that leaves the others decided and its key untouched, and the
// server's clock read once per batch.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "helpers.hpp"
#include "one_key_support.hpp"

using namespace redlimit;
using namespace redlimit::test;

namespace {

const Script kBatch{detail::lua::batch.name, detail::lua::batch.sha1, detail::lua::batch.source};

// One decision of a batch: its ARGV, as batch.lua takes them.
struct Take {
  explicit Take(std::string k, std::string p = "1", std::string w = "0", std::string c = "")
      : kind(std::move(k)), permits(std::move(p)), maxWait(std::move(w)), cfg(std::move(c)) {}
  std::string kind, permits, maxWait;
  std::string cfg;  // '': the configuration stored in the key
};

Reply runBatchRaw(Client& c, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::vector<std::string_view> k(keys.begin(), keys.end());
  const std::vector<std::string_view> a(args.begin(), args.end());
  return detail::eval(c, kBatch, k, a);
}

Reply runBatch(Client& c, const std::string& nowUs, const std::vector<std::string>& keys,
               const std::vector<Take>& takes) {
  std::vector<std::string> args{"take", nowUs, std::to_string(takes.size())};
  for (const Take& t : takes) args.insert(args.end(), {t.kind, t.permits, t.maxWait, t.cfg});
  return runBatchRaw(c, keys, args);
}

// A reply element as text: "[allowed remaining ...]" (the nine values of a packed decision), or
// "error: CODE message".
std::string describeElement(const Reply& r) {
  if (detail::isPackedDecision(r)) {
    const TakeReply t = takeReply(r);
    return "[" + str(t.allowed ? 1 : 0) + " " + str(t.remaining) + " " + str(t.retryAfterUs) + " " +
           str(t.resetAfterUs) + " " + str(t.limit) + " " + str(t.nowUs) + " " + str(t.delayUs) + " " +
           str(t.localRate) + " " + str(t.localIntervalMs) + "]";
  }
  if (r.type == Reply::Type::String) return "error: " + r.str;
  return "unexpected " + r.describe();
}

// The same take alone, through its own script, described as describeElement describes a batch's
// element (an error as the code the call threw and its text).
std::string runAlone(Client& c, const std::string& key, const std::string& nowUs, const Take& t) {
  std::vector<std::string> args{"take", nowUs, t.kind, t.permits, t.maxWait};
  if (!t.cfg.empty()) args.push_back(t.cfg);
  const detail::lua::EmbeddedScript& s = scriptOf(t.kind);
  const Script script{s.name, s.sha1, s.source};
  const std::vector<std::string_view> k{key};
  const std::vector<std::string_view> a(args.begin(), args.end());
  try {
    return describeElement(detail::eval(c, script, k, a));
  } catch (const ScriptError& e) {
    return "error: " + e.code() + " " + e.what();
  }
}

std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

}  // namespace

class BatchScript : public RedisTest {
 protected:
  /// A key of this test in its one hash tag.
  std::string key(const std::string& suffix) { return "{" + name("batch") + "}:" + suffix; }

  /// The key's value (or "(missing)") and its PTTL.
  std::pair<std::string, std::int64_t> stored(const std::string& k) {
    const Reply v = raw({"GET", k});
    return {v.isNil() ? std::string("(missing)") : v.str, raw({"PTTL", k}).asInteger()};
  }

  /// The code of the error a batch call fails with as a whole, or "no error".
  std::string wholeCallError(const std::vector<std::string>& keys, const std::vector<std::string>& args) {
    try {
      (void)runBatchRaw(admin(), keys, args);
    } catch (const ScriptError& e) {
      return e.code();
    }
    return "no error";
  }
};

TEST_F(BatchScript, DecidesEveryTakeExactlyAsItsOwnScriptAtTheSameTime) {
  // Six keys; each has a kind it mostly gets, and two configurations per kind (the second with a
  // TTL: keepAlive long enough that nothing expires during the test).
  const std::vector<char> homeKind{'T', 'G', 'W', 'T', 'G', 'W'};
  const std::vector<LimiterConfig> gcraT{{'T', 5, 2, 100, 0}, {'T', 8, 3, 70, 300000}};
  const std::vector<LimiterConfig> gcraG{{'G', 4, 10, 1000, 0}, {'G', 6, 7, 333, 200000}};
  const std::vector<LimiterConfig> windows{{'W', 5, 0, 50, 0}, {'W', 7, 0, 80, 250000}};
  auto configsOf = [&](char kind) -> const std::vector<LimiterConfig>& {
    return kind == 'T' ? gcraT : kind == 'G' ? gcraG : windows;
  };
  std::vector<std::string> keysA, keysB;
  for (int i = 0; i < 6; ++i) {
    keysA.push_back(key("a:k" + std::to_string(i)));
    keysB.push_back(key("b:k" + std::to_string(i)));
  }
  std::mt19937_64 rng(20261204);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  std::int64_t now = 1'900'000'000'000'000 + uniform(0, 1'000'000'000);  // 2030: after any real clock

  // Keys 3 and 4 start missing; the others hold a stored configuration.
  for (std::size_t i : {0U, 1U, 2U, 5U}) {
    const LimiterConfig& c = configsOf(homeKind[i])[i == 5 ? 1 : 0];
    const std::vector<std::string> args = setArgs(c, now, uniform(0, c.limit));
    ASSERT_EQ(runOneKey(admin(), scriptOf(std::string(1, c.kind)), keysA[i], args).elements.at(0).asInteger(), 1);
    ASSERT_EQ(runOneKey(admin(), scriptOf(std::string(1, c.kind)), keysB[i], args).elements.at(0).asInteger(), 1);
  }

  // The sequence: which key, and the take's arguments.
  struct Step {
    std::size_t key;
    Take take;
  };
  std::vector<Step> sequence;
  for (int i = 0; i < 600; ++i) {
    const auto k = static_cast<std::size_t>(uniform(0, 5));
    const char kind = uniform(0, 9) == 0 ? "TGW"[uniform(0, 2)] : homeKind[k];
    const std::int64_t p = uniform(0, 99);
    const std::string permits = p < 80   ? str(uniform(1, 2))
                                : p < 92 ? str(uniform(1, 10))
                                : p < 96 ? "0"
                                : p < 98 ? "x"
                                         : "-1";
    const std::int64_t w = uniform(0, 99);
    const std::string maxWait = w < 72 ? "0" : w < 98 ? str(uniform(1, 400'000)) : "-5";
    const std::int64_t c = uniform(0, 99);
    std::string cfg;
    if (c < 35) {
      cfg = header(configsOf(kind)[static_cast<std::size_t>(uniform(0, 1))]);
    } else if (c < 37) {
      cfg = "not a configuration";
    }
    sequence.push_back(Step{k, Take(std::string(1, kind), permits, maxWait, cfg)});
  }

  int allowed = 0, delayed = 0, denied = 0, errors = 0, batches = 0;
  std::size_t next = 0;
  while (next < sequence.size()) {
    // The time moves on between batches (now and then a step back: a clock step, clamped states).
    const std::int64_t move = uniform(0, 99);
    now += move < 45   ? uniform(0, 20'000)
           : move < 85 ? uniform(0, 200'000)
           : move < 92 ? uniform(0, 2'000'000)
                       : -uniform(0, 5'000'000);
    if (uniform(0, 9) == 0) {  // a key deleted, as by hand
      const std::size_t gone = static_cast<std::size_t>(uniform(0, 5));
      (void)raw({"DEL", keysA[gone], keysB[gone]});
    }
    const std::size_t size =
        std::min(sequence.size() - next, static_cast<std::size_t>(uniform(0, 1) == 0 ? uniform(1, 8) : uniform(1, 64)));
    std::vector<std::string> keys;
    std::vector<Take> takes;
    for (std::size_t j = next; j < next + size; ++j) {
      keys.push_back(keysA[sequence[j].key]);
      takes.push_back(sequence[j].take);
    }
    const Reply batch = runBatch(admin(), str(now), keys, takes);
    ASSERT_EQ(batch.type, Reply::Type::Array);
    ASSERT_EQ(batch.elements.size(), size);
    for (std::size_t j = 0; j < size; ++j) {
      const Step& s = sequence[next + j];
      const std::string got = replaceAll(describeElement(batch.elements[j]), "}:a:k", "}:b:k");
      const std::string want = runAlone(admin(), keysB[s.key], str(now), s.take);
      EXPECT_EQ(got, want) << "batch " << batches << ", decision " << j << " (step " << next + j << "): key " << s.key
                           << ", kind " << s.take.kind << ", permits " << s.take.permits << ", maxWait "
                           << s.take.maxWait << ", cfg of " << s.take.cfg.size() << " bytes";
      const Reply& e = batch.elements[j];
      if (!detail::isPackedDecision(e)) {
        ++errors;
      } else if (!takeReply(e).allowed) {
        ++denied;
      } else {
        ++allowed;
        if (takeReply(e).delayUs > 0) ++delayed;
      }
    }
    for (std::size_t i = 0; i < keysA.size(); ++i) {
      const auto a = stored(keysA[i]);
      const auto b = stored(keysB[i]);
      EXPECT_EQ(a.first, b.first) << "value of key " << i << " after batch " << batches;
      // The same PX from the same now, set a little earlier for A: within 3 s of each other.
      EXPECT_EQ(a.second > 0, b.second > 0) << "TTL of key " << i << " after batch " << batches;
      if (a.second <= 0 || b.second <= 0) {
        EXPECT_EQ(a.second, b.second) << "TTL of key " << i << " after batch " << batches;
      } else {
        EXPECT_LE(std::abs(a.second - b.second), 3000) << "TTL of key " << i << " after batch " << batches;
      }
    }
    if (HasFailure()) return;
    next += size;
    ++batches;
  }
  // The sequence reached every kind of outcome.
  EXPECT_GT(batches, 10);
  EXPECT_GT(allowed, 80);
  EXPECT_GT(delayed, 5);
  EXPECT_GT(denied, 40);
  EXPECT_GT(errors, 40);
  RecordProperty("outcomes", "allowed " + str(allowed) + " (delayed " + str(delayed) + "), denied " + str(denied) +
                                 ", errors " + str(errors) + ", batches " + str(batches));
}

TEST_F(BatchScript, ARepeatedKeySeesTheTakesBeforeIt) {
  // A bucket of 3, one permit back per second: 10 takes of 1 at one instant, in one call.
  const LimiterConfig bucket{'T', 3, 1, 1000, 0};
  const std::int64_t now = 1'900'000'000'000'000;
  const std::string a = key("a"), b = key("b");
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, a, setArgs(bucket, now, 3)).elements.at(0).asInteger(), 1);
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, b, setArgs(bucket, now, 3)).elements.at(0).asInteger(), 1);
  const std::int64_t at = now + 1234;
  const Reply batch = runBatch(admin(), str(at), std::vector<std::string>(10, a), std::vector<Take>(10, Take("T")));
  ASSERT_EQ(batch.elements.size(), 10U);
  for (std::size_t i = 0; i < 10; ++i) {
    const TakeReply t = takeReply(batch.elements[i]);
    EXPECT_EQ(t.allowed, i < 3) << i;
    EXPECT_EQ(t.remaining, i < 3 ? 2 - static_cast<std::int64_t>(i) : 0) << i;
    EXPECT_EQ(t.nowUs, at) << i;
    EXPECT_EQ(describeElement(batch.elements[i]), runAlone(admin(), b, str(at), Take("T"))) << "one by one, take " << i;
    if (i >= 3) {
      EXPECT_EQ(t.retryAfterUs, takeReply(batch.elements[3]).retryAfterUs) << i;
    }
  }
  EXPECT_GT(takeReply(batch.elements[3]).retryAfterUs, 0);
  EXPECT_EQ(stored(a), stored(b));
}

TEST_F(BatchScript, AWholeCallErrorWritesNothing) {
  // A bucket of 100 that nothing refills: every take of 1 would be granted and written.
  const LimiterConfig bucket{'T', 100, 1, 3600000, 0};
  const std::int64_t now = 1'900'000'000'000'000;
  const std::string k = key("k");
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, k, setArgs(bucket, now, 100)).elements.at(0).asInteger(), 1);
  const auto before = stored(k);
  // n takes of 1 on k at `now`, with `extra` arguments more (or fewer).
  auto args = [&](const std::string& op, const std::string& n, int takes, int extra) {
    std::vector<std::string> out{op, str(now + 1), n};
    for (int i = 0; i < takes; ++i) out.insert(out.end(), {"T", "1", "0", ""});
    for (int i = 0; i < extra; ++i) out.push_back("0");
    if (extra < 0) out.resize(out.size() - static_cast<std::size_t>(-extra));
    return out;
  };
  const std::vector<std::string> two(2, k);
  EXPECT_EQ(wholeCallError({}, args("take", "0", 0, 0)), "REDLIMIT_INVALID_ARGUMENT") << "n = 0";
  EXPECT_EQ(wholeCallError(std::vector<std::string>(65, k), args("take", "65", 65, 0)), "REDLIMIT_INVALID_ARGUMENT")
      << "n = 65";
  EXPECT_EQ(wholeCallError(two, args("take", "2", 2, -1)), "REDLIMIT_INVALID_ARGUMENT") << "one argument missing";
  EXPECT_EQ(wholeCallError(two, args("take", "2", 2, 1)), "REDLIMIT_INVALID_ARGUMENT") << "one argument more";
  EXPECT_EQ(wholeCallError({k}, args("take", "2", 2, 0)), "REDLIMIT_INVALID_ARGUMENT") << "a key missing";
  EXPECT_EQ(wholeCallError(two, args("take", "1", 2, 0)), "REDLIMIT_INVALID_ARGUMENT") << "n below the takes";
  EXPECT_EQ(wholeCallError(two, args("take", "two", 2, 0)), "REDLIMIT_INVALID_ARGUMENT") << "n not a number";
  EXPECT_EQ(wholeCallError(two, args("peek", "2", 2, 0)), "REDLIMIT_INVALID_ARGUMENT") << "another operation";
  std::vector<std::string> badTime = args("take", "2", 2, 0);
  badTime[1] = "-1";
  EXPECT_EQ(wholeCallError(two, badTime), "REDLIMIT_INVALID_ARGUMENT") << "a bad time";
  EXPECT_EQ(wholeCallError({}, {"take", ""}), "REDLIMIT_INVALID_ARGUMENT") << "no n at all";
  EXPECT_EQ(stored(k), before) << "a call that failed as a whole wrote nothing";

  // The largest batch: 64 takes, every one granted and written.
  const Reply full = runBatchRaw(admin(), std::vector<std::string>(64, k), args("take", "64", 64, 0));
  ASSERT_EQ(full.elements.size(), 64U);
  EXPECT_EQ(takeReply(full.elements[63]).remaining, 36);
  EXPECT_NE(stored(k), before);
}

TEST_F(BatchScript, AKeyOfAnotherTypeFailsOnlyItsOwnDecision) {
  const std::int64_t now = 1'900'000'000'000'000;
  const LimiterConfig bucket{'T', 5, 1, 1000, 0};
  const LimiterConfig window{'W', 4, 0, 1000, 0};
  const std::string t = key("t"), w = key("w"), list = key("list");
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, t, setArgs(bucket, now, 5)).elements.at(0).asInteger(), 1);
  ASSERT_EQ(runOneKey(admin(), detail::lua::fixed_window, w, setArgs(window, now, 0)).elements.at(0).asInteger(), 1);
  (void)raw({"RPUSH", list, "x", "y"});
  const std::vector<std::string> keys{t, list, w, list, list, t};
  const std::vector<Take> takes{
      Take("T"), Take("T"), Take("W"), Take("W"), Take("G", "1", "0", header({'G', 2, 1, 10, 0})), Take("T")};
  const Reply batch = runBatch(admin(), str(now + 1), keys, takes);
  ASSERT_EQ(batch.elements.size(), 6U);
  for (std::size_t i : {1U, 3U, 4U}) {
    ASSERT_EQ(batch.elements[i].type, Reply::Type::String) << i;
    EXPECT_EQ(batch.elements[i].str.rfind("REDLIMIT_INVALID_CONFIG key " + list + " holds another Redis type", 0), 0U)
        << batch.elements[i].str;
  }
  EXPECT_EQ(takeReply(batch.elements[0]).remaining, 4);
  EXPECT_EQ(takeReply(batch.elements[2]).remaining, 3);
  EXPECT_EQ(takeReply(batch.elements[5]).remaining, 3);
  EXPECT_TRUE(takeReply(batch.elements[5]).allowed);
  EXPECT_EQ(raw({"TYPE", list}).str, "list");
  const Reply items = raw({"LRANGE", list, "0", "-1"});
  ASSERT_EQ(items.elements.size(), 2U);
  EXPECT_EQ(items.elements[0].str, "x");
  EXPECT_EQ(items.elements[1].str, "y");
  EXPECT_EQ(raw({"PTTL", list}).asInteger(), -1);
}

TEST_F(BatchScript, AFailingDecisionNamesItsOwnKeyAndWritesNothing) {
  const std::int64_t now = 1'900'000'000'000'000;
  const LimiterConfig bucket{'T', 5, 1, 1000, 0};
  const std::string t1 = key("t1"), t2 = key("t2"), t3 = key("t3");
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, t1, setArgs(bucket, now, 5)).elements.at(0).asInteger(), 1);
  const std::vector<std::string> keys{t1, t2, t3, t2, t1};
  const std::vector<Take> takes{Take("X"), Take("T", "0", "0", header(bucket)), Take("G"),
                                Take("T", "9", "0", header(bucket)), Take("T")};
  const Reply batch = runBatch(admin(), str(now + 1), keys, takes);
  ASSERT_EQ(batch.elements.size(), 5U);
  EXPECT_EQ(describeElement(batch.elements[0]),
            "error: REDLIMIT_INVALID_ARGUMENT unknown limiter kind \"X\" for key " + t1 + " (T, G or W)");
  EXPECT_EQ(describeElement(batch.elements[1]),
            "error: REDLIMIT_INVALID_ARGUMENT permits must be an integer in "
            "1..4294967295 for limiter " +
                t2 + ", got \"0\"");
  EXPECT_EQ(describeElement(batch.elements[2]), "error: REDLIMIT_NOT_INITIALIZED GCRA limiter " + t3 +
                                                    " is not initialized: store its configuration first "
                                                    "(Limiter::trySetPolicy or setPolicy)");
  EXPECT_EQ(describeElement(batch.elements[3]),
            "error: REDLIMIT_INVALID_ARGUMENT Requested permits (9) exceed the burst (5) of token bucket limiter " +
                t2 + ": they could never be granted at once");
  EXPECT_EQ(takeReply(batch.elements[4]).remaining, 4) << "the unknown kind took nothing from " << t1;
  EXPECT_TRUE(raw({"GET", t2}).isNil()) << "the failing decisions wrote nothing";
  EXPECT_TRUE(raw({"GET", t3}).isNil());
}

TEST_F(BatchScript, TheServerClockIsReadOnceForTheWholeBatch) {
  // 64 takes at the server's time ('') on 8 keys, 8 each: one instant for all of them.
  const LimiterConfig bucket{'G', 10, 1, 1000, 0};
  std::vector<std::string> keys;
  std::vector<Take> takes;
  for (int i = 0; i < 64; ++i) {
    keys.push_back(key("k" + std::to_string(i % 8)));
    takes.emplace_back("G", "1", "0", header(bucket));
  }
  const std::int64_t before = serverTimeUs(admin());
  const Reply batch = runBatch(admin(), "", keys, takes);
  const std::int64_t after = serverTimeUs(admin());
  ASSERT_EQ(batch.elements.size(), 64U);
  const std::int64_t at = takeReply(batch.elements[0]).nowUs;
  EXPECT_GE(at, before);
  EXPECT_LE(at, after);
  for (std::size_t i = 0; i < 64; ++i) {
    const TakeReply t = takeReply(batch.elements[i]);
    EXPECT_EQ(t.nowUs, at) << i;
    EXPECT_TRUE(t.allowed) << i;
    EXPECT_EQ(t.remaining, 9 - static_cast<std::int64_t>(i / 8)) << i;
  }
}

TEST_F(BatchScript, ReadsEveryKeyOnceAndWritesEachTakenKeyOnce) {
  // Keys that hold a usable limiter of each kind, taken 8 times each with the configuration in the
  // call and with the stored one (the fast path of each take's script): the batch reads them all
  // with one MGET and writes each key that granted once, as the last of its grants left it; nothing
  // else is read or written, and the time was given, so no TIME.
  const std::int64_t now = 1'900'000'000'000'000;
  const std::vector<LimiterConfig> configs{{'T', 3, 1, 1000, 0}, {'G', 4, 2, 1000, 60000}, {'W', 3, 0, 1000, 60000}};
  std::vector<std::string> keysA, keysB;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const LimiterConfig& c = configs[i];
    keysA.push_back(key("a:k" + std::to_string(i)));
    keysB.push_back(key("b:k" + std::to_string(i)));
    const std::string kind(1, c.kind);
    ASSERT_EQ(runOneKey(admin(), scriptOf(kind), keysA[i], setArgs(c, now, c.limit)).elements.at(0).asInteger(), 1);
    ASSERT_EQ(runOneKey(admin(), scriptOf(kind), keysB[i], setArgs(c, now, c.limit)).elements.at(0).asInteger(), 1);
  }
  std::vector<std::string> keys;
  std::vector<Take> takes;
  std::vector<std::size_t> of;
  for (std::size_t j = 0; j < 24; ++j) {  // 8 takes per key, every other one with the configuration in the call
    const std::size_t i = j % configs.size();
    keys.push_back(keysA[i]);
    of.push_back(i);
    takes.emplace_back(std::string(1, configs[i].kind), "1", "0", j % 2 == 0 ? header(configs[i]) : "");
  }
  const auto calls = [&](const char* command) { return commandCalls(admin(), command); };
  const std::int64_t getsBefore = calls("get"), mgetsBefore = calls("mget"), setsBefore = calls("set"),
                     timesBefore = calls("time");
  const Reply batch = runBatch(admin(), str(now + 1), keys, takes);
  const std::int64_t gets = calls("get") - getsBefore, mgets = calls("mget") - mgetsBefore,
                     sets = calls("set") - setsBefore, times = calls("time") - timesBefore;
  ASSERT_EQ(batch.elements.size(), takes.size());
  std::int64_t granted = 0;
  for (std::size_t j = 0; j < takes.size(); ++j) {
    ASSERT_TRUE(detail::isPackedDecision(batch.elements[j])) << describeElement(batch.elements[j]);
    if (takeReply(batch.elements[j]).allowed) ++granted;
    EXPECT_EQ(replaceAll(describeElement(batch.elements[j]), "}:a:k", "}:b:k"),
              runAlone(admin(), keysB[of[j]], str(now + 1), takes[j]))
        << "decision " << j;
  }
  EXPECT_EQ(granted, 3 + 4 + 3) << "each key granted its limit, then denied";
  EXPECT_EQ(mgets, 1) << "every key read at once";
  EXPECT_EQ(gets, 0) << "no key read again";
  EXPECT_EQ(sets, 3) << "one SET per key taken";
  EXPECT_EQ(times, 0) << "the time was given";
  for (std::size_t i = 0; i < configs.size(); ++i) EXPECT_EQ(stored(keysA[i]).first, stored(keysB[i]).first) << i;
}

TEST_F(BatchScript, EveryKindOfKeyIsDecidedAsItsOwnScriptDecidesIt) {
  // One batch of every kind, mixed: keys that hold a usable limiter, fresh keys with the
  // configuration in the call (a full bucket, an empty window), a key with nothing left (denied),
  // keys taken with another configuration than the one they hold, a key of another kind, a key of
  // another Redis type, and a fresh key without a configuration. Each answer and each stored value
  // is what the take's own script makes of the twin key.
  const std::int64_t now = windowTime(1000, 250'000);
  const LimiterConfig bucket{'T', 3, 1, 1000, 30000}, gcra{'G', 5, 5, 1000, 0}, window{'W', 2, 0, 1000, 30000};
  const LimiterConfig biggerBucket{'T', 6, 2, 1000, 30000}, longerWindow{'W', 4, 0, 2000, 0};
  struct Case {
    std::string name;
    Take take;
    const LimiterConfig* holds;  // what the key holds before the batch; null: nothing
    std::int64_t initial;        // its permits (T, G)
  };
  const std::vector<Case> cases{
      {"usable T", Take("T"), &bucket, 3},
      {"usable G, cfg", Take("G", "2", "0", header(gcra)), &gcra, 5},
      {"usable W, cfg", Take("W", "1", "0", header(window)), &window, 0},
      {"fresh T, cfg", Take("T", "1", "0", header(bucket)), nullptr, 0},
      {"fresh G, cfg", Take("G", "5", "0", header(gcra)), nullptr, 0},
      {"G, one left, waits for three", Take("G", "3", "1000000", header(gcra)), &gcra, 1},
      {"fresh W, cfg", Take("W", "2", "0", header(window)), nullptr, 0},
      {"empty T, denied", Take("T", "1", "0", header(bucket)), &bucket, 0},
      {"T, another configuration", Take("T", "1", "0", header(biggerBucket)), &bucket, 1},
      {"W, another configuration", Take("W", "1", "0", header(longerWindow)), &window, 0},
      {"a window asked as GCRA", Take("G", "1", "0", header(gcra)), &window, 0},
      {"a bucket asked as a window", Take("W"), &bucket, 2},
      {"fresh G, no cfg", Take("G"), nullptr, 0},
  };
  std::vector<std::string> keys;
  std::vector<Take> takes;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    for (const char* twin : {"a:k", "b:k"}) {
      const std::string k = key(twin + std::to_string(i));
      if (c.holds != nullptr) {
        const std::string kind(1, c.holds->kind);
        ASSERT_EQ(runOneKey(admin(), scriptOf(kind), k, setArgs(*c.holds, now, c.initial)).elements.at(0).asInteger(),
                  1);
      }
    }
    keys.push_back(key("a:k" + std::to_string(i)));
    takes.push_back(c.take);
  }
  const std::string list = key("list");
  (void)raw({"RPUSH", list, "x"});
  keys.push_back(list);
  takes.emplace_back("W", "1", "0", header(window));

  const Reply batch = runBatch(admin(), str(now), keys, takes);
  ASSERT_EQ(batch.elements.size(), takes.size());
  std::map<std::string, int> outcomes;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string got = replaceAll(describeElement(batch.elements[i]), "}:a:k", "}:b:k");
    const std::string twin = key("b:k" + std::to_string(i));
    EXPECT_EQ(got, runAlone(admin(), twin, str(now), cases[i].take)) << cases[i].name;
    const auto a = stored(keys[i]), b = stored(twin);
    EXPECT_EQ(a.first, b.first) << cases[i].name;
    // The same PX from the same now, set a little earlier for the batch's key.
    EXPECT_EQ(a.second > 0, b.second > 0) << cases[i].name;
    EXPECT_LE(std::abs(a.second - b.second), 3000) << cases[i].name;
    const Reply& e = batch.elements[i];
    ++outcomes[!detail::isPackedDecision(e) ? "error" : !takeReply(e).allowed ? "denied" : "granted"];
  }
  EXPECT_EQ(outcomes["granted"], 9);
  EXPECT_EQ(outcomes["denied"], 1);
  EXPECT_EQ(outcomes["error"], 3);
  EXPECT_GT(takeReply(batch.elements[5]).delayUs, 0) << "the GCRA key with one permit left reserved three";
  EXPECT_EQ(describeElement(batch.elements.back()).rfind("error: REDLIMIT_INVALID_CONFIG key " + list, 0), 0U)
      << describeElement(batch.elements.back());
  EXPECT_EQ(raw({"TYPE", list}).str, "list");
}

TEST_F(BatchScript, ATakeOnTheFullPathSeesTheTakesBeforeItOnItsKey) {
  // Three takes of a bucket of 5 on the fast path (their write held), then one with another
  // configuration (the full path: the bucket rescaled, from the state the three left), then two more
  // under the new configuration: each answer and the stored value are the ones of one-by-one calls.
  const std::int64_t now = 1'900'000'000'000'000;
  const LimiterConfig bucket{'T', 5, 1, 1000, 30000}, bigger{'T', 10, 1, 1000, 30000};
  const std::string a = key("a"), b = key("b");
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, a, setArgs(bucket, now, 5)).elements.at(0).asInteger(), 1);
  ASSERT_EQ(runOneKey(admin(), detail::lua::gcra, b, setArgs(bucket, now, 5)).elements.at(0).asInteger(), 1);
  const std::vector<Take> takes{Take("T", "1", "0", header(bucket)), Take("T"),
                                Take("T", "1", "0", header(bucket)), Take("T", "1", "0", header(bigger)),
                                Take("T", "4", "0", header(bigger)), Take("T", "3", "0", header(bigger))};
  const Reply batch = runBatch(admin(), str(now + 10), std::vector<std::string>(takes.size(), a), takes);
  ASSERT_EQ(batch.elements.size(), takes.size());
  for (std::size_t i = 0; i < takes.size(); ++i) {
    EXPECT_EQ(describeElement(batch.elements[i]), runAlone(admin(), b, str(now + 10), takes[i])) << i;
  }
  EXPECT_EQ(takeReply(batch.elements[3]).remaining, 6) << "the rescaled bucket kept the three permits in use";
  EXPECT_FALSE(takeReply(batch.elements[5]).allowed);
  EXPECT_EQ(stored(a).first, stored(b).first);
}
