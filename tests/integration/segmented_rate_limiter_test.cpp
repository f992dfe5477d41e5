// SegmentedRateLimiter against a real redis-server: several processes sharing one limiter,
// give-back by an idle node, partial segments, close and reconfigure.
#include "redlimit_test/hex.hpp"
#include "redlimit/segmented_rate_limiter.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"

extern char** environ;

namespace {

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

using Segmented = SegmentedRateLimiter<RateLimiter>;

using redlimit::test::hex;

/// Permits packed in a member (Redisson layout: length byte, id, uint32 little-endian).
std::int64_t memberPermits(const std::string& member) {
  const std::size_t at = 1 + static_cast<unsigned char>(member[0]);
  std::uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(member[at + static_cast<std::size_t>(i)]);
  return n;
}

class SegmentedRateLimiterIT : public RedisTest {
 protected:
  std::shared_ptr<RateLimiter> limiter(const std::string& name, const std::shared_ptr<Client>& c = nullptr) {
    return std::make_shared<RateLimiter>(c ? c : client(), name);
  }
  std::int64_t serverNowMs() {
    const Reply t = raw({"TIME"});
    return std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  }
  /// value + permits of every member still in the sorted set; equals the rate at rest.
  std::int64_t valuePlusMembers(const RateLimiter& rl) {
    const Reply value = raw({"GET", rl.keys()[1]});
    std::int64_t sum = value.isNil() ? 0 : value.asInteger();
    const Reply members = raw({"ZRANGE", rl.keys()[3], "0", "-1"});
    for (const Reply& m : members.elements) sum += memberPermits(m.str);
    return sum;
  }
};

// --- several processes x threads on one limiter ----------------------------------------------

struct WorkerReport {
  struct Grant {
    std::int64_t time, granted;
    std::string member;  // hex
  };
  std::vector<Grant> grants;
  std::map<std::string, std::int64_t> released;  // member hex -> permits released
  std::int64_t asked = 0, returnedByRedis = 0, used = 0;
  std::int64_t local = 0, direct = 0, fromRemote = 0, returned = 0, expired = 0, held = 0, roundTrips = 0;
  bool complete = false;
};

WorkerReport parseReport(const std::string& path) {
  WorkerReport r;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "G") {
      WorkerReport::Grant g;
      fields >> g.time >> g.granted >> g.member;
      r.grants.push_back(g);
    } else if (kind == "R") {
      std::string member;
      std::int64_t asked = 0, released = 0;
      fields >> member >> asked >> released;
      r.released[member] += released;
      r.asked += asked;
      r.returnedByRedis += released;
    } else if (kind == "U") {
      fields >> r.used;
    } else if (kind == "S") {
      fields >> r.local >> r.direct >> r.fromRemote >> r.returned >> r.expired >> r.held >> r.roundTrips;
      r.complete = true;
    }
  }
  return r;
}

TEST_F(SegmentedRateLimiterIT, ProcessesTimesThreadsNeverExceedTheRateInAnyWindow) {
  constexpr std::int64_t kRate = 200, kSegment = 10;
  constexpr std::int64_t kIntervalMs = 500;
  constexpr int kProcesses = 3, kThreads = 2;
  constexpr std::int64_t kDurationMs = 2000;
  // Process 0 calls without pause and keeps the limiter saturated; the others use 13 permits
  // (leaving part of a segment) and then stay silent for longer than their idle give-back takes
  // (at most 2 x interval / 4), so give-backs happen during the load.
  constexpr std::int64_t kSessionPermits = 13, kIdleMs = 300;
  RateLimiter rl(client(), name());
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, kRate, milliseconds(kIntervalMs)));

  char dirTemplate[] = "/tmp/redlimit-segment-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string dir = dirTemplate;
  const std::int64_t startAt =
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count() + 500;
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int p = 0; p < kProcesses; ++p) {
    const std::string out = dir + "/worker" + std::to_string(p) + ".txt";
    outputs.push_back(out);
    std::vector<std::string> args = {REDLIMIT_SEGMENT_WORKER,
                                     server().uri(),
                                     name(),
                                     std::to_string(kSegment),
                                     std::to_string(kThreads),
                                     std::to_string(startAt),
                                     std::to_string(kDurationMs),
                                     std::to_string(p == 0 ? 0 : kSessionPermits),
                                     std::to_string(kIdleMs)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_EQ(rc, 0) << "cannot start " << argv[0];
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker status " << status;
  }

  // Each member's net permits (granted minus given back), stamped with its server grant time.
  std::vector<std::pair<std::int64_t, std::int64_t>> net;  // (time, permits)
  std::map<std::string, std::int64_t> netById;             // hex of the member's length byte + id (without the count)
  std::int64_t used = 0, granted = 0, returned = 0;
  for (const std::string& path : outputs) {
    const WorkerReport w = parseReport(path);
    ASSERT_TRUE(w.complete) << path;
    std::int64_t fromLog = 0;
    for (const auto& g : w.grants) {
      const auto rel = w.released.find(g.member);
      const std::int64_t n = g.granted - (rel == w.released.end() ? 0 : rel->second);
      ASSERT_GE(n, 0);
      net.emplace_back(g.time, n);
      netById[g.member.substr(0, g.member.size() - 8)] = n;
      fromLog += g.granted;
    }
    // The node's counters agree with what Redis answered, and nothing was handed out twice.
    EXPECT_EQ(w.fromRemote, fromLog) << path;
    EXPECT_EQ(w.returned, w.returnedByRedis) << path;
    EXPECT_EQ(w.held, 0) << path;
    EXPECT_EQ(w.used, w.local + w.direct) << path;
    EXPECT_EQ(w.fromRemote, w.local + w.direct + w.returned + w.expired) << path;
    EXPECT_GT(w.local, 0) << path << ": permits came from local segments";
    used += w.used;
    granted += fromLog;
    returned += w.returned;
  }
  std::remove((dir + "/worker0.txt").c_str());
  std::remove((dir + "/worker1.txt").c_str());
  std::remove((dir + "/worker2.txt").c_str());
  rmdir(dir.c_str());

  // Every window of one interval, as Redis counts permits (at their grant time): at most the rate.
  std::sort(net.begin(), net.end());
  std::int64_t worst = 0, sum = 0;
  std::size_t lo = 0;
  for (std::size_t hi = 0; hi < net.size(); ++hi) {
    sum += net[hi].second;
    while (net[lo].first <= net[hi].first - kIntervalMs) sum -= net[lo++].second;
    worst = std::max(worst, sum);
  }
  EXPECT_LE(worst, kRate);
  EXPECT_GT(used, kRate) << "the test must span more than one window's worth of permits";
  EXPECT_GT(returned, 0) << "idle phases and close() gave permits back during the run";
  std::cout << "permits used " << used << " of " << granted << " granted, " << returned
            << " given back; fullest window " << worst << "/" << kRate << "\n";

  // The recorded history is the sorted set's: every member still there (a give-back rewrites a
  // member with the same id and fewer permits) carries its net permits.
  const Reply members = raw({"ZRANGE", rl.keys()[3], "0", "-1"});
  EXPECT_FALSE(members.elements.empty());
  for (const Reply& m : members.elements) {
    const std::string id = hex(m.str);
    const auto it = netById.find(id.substr(0, id.size() - 8));
    ASSERT_NE(it, netById.end()) << "a member nobody recorded";
    EXPECT_EQ(memberPermits(m.str), it->second);
  }
  EXPECT_EQ(valuePlusMembers(rl), kRate) << "give-backs keep value + live permits == rate";
}

// --- give-back by an idle node ----------------------------------------------------------------

TEST_F(SegmentedRateLimiterIT, IdleNodeGivesBackAndAnotherNodeUsesThePermitsInTheSameWindow) {
  constexpr std::int64_t kIntervalMs = 10000;  // long, so "the same window" holds on a slow machine
  auto nodeA = limiter(name(), newClient());
  auto nodeB = limiter(name(), newClient());
  ASSERT_TRUE(nodeA->trySetRate(RateType::Overall, 10, milliseconds(kIntervalMs)));
  SegmentOptions a;
  a.segmentSize = 10;
  a.idleReturnAfter = milliseconds(100);
  SegmentOptions b;
  b.segmentSize = 10;
  b.returnWhenIdle = false;
  Segmented segA(nodeA, a);
  Segmented segB(nodeB, b);

  ASSERT_TRUE(segA.tryAcquire());  // A takes the whole rate: uses 1, holds 9
  const Reply first = raw({"ZRANGE", nodeA->keys()[3], "0", "-1", "WITHSCORES"});
  ASSERT_EQ(first.elements.size(), 2u);
  const double grantedAt = std::stod(first.elements[1].str);
  EXPECT_FALSE(segB.tryAcquire()) << "A holds everything";

  // A goes idle; its thread gives the 9 back (bounded wait).
  for (int i = 0; i < 1000 && segA.stats().permitsReturned < 9; ++i) sleepMs(5);
  EXPECT_EQ(segA.stats().permitsReturned, 9);
  EXPECT_EQ(valuePlusMembers(*nodeA), 10);
  const Reply shrunk = raw({"ZRANGE", nodeA->keys()[3], "0", "-1"});
  ASSERT_EQ(shrunk.elements.size(), 1u);
  EXPECT_EQ(memberPermits(shrunk.elements[0].str), 1) << "A's member now holds only the permit it used";

  for (int i = 0; i < 9; ++i) EXPECT_TRUE(segB.tryAcquire()) << i;
  EXPECT_FALSE(segB.tryAcquire());
  EXPECT_LT(serverNowMs(), grantedAt + kIntervalMs) << "all of this happened within A's window";
  EXPECT_EQ(valuePlusMembers(*nodeA), 10);
}

// A fork() child gives idle segments back too, both of a limiter it inherited (the parent's had
// been registered with the parent's sweeper) and of one it made: the child has a sweeper thread of
// its own. It then exits normally.
TEST_F(SegmentedRateLimiterIT, AForkedChildGivesIdleSegmentsBackAndExitsNormally) {
  auto source = limiter(name(), newClient());
  ASSERT_TRUE(source->trySetRate(RateType::Overall, 100, milliseconds(60000)));
  SegmentOptions o;
  o.segmentSize = 10;
  o.idleReturnAfter = milliseconds(50);
  Segmented inherited(source, o);
  ASSERT_TRUE(inherited.tryAcquire());  // the parent's sweeper thread runs from here on
  // Waits (bounded) until `s` has given 9 more permits back than `before`.
  const auto givenBack = [](Segmented& s, std::int64_t before) {
    for (int i = 0; i < 4000 && s.stats().permitsReturned < before + 9; ++i) sleepMs(5);
    return s.stats().permitsReturned == before + 9;
  };
  ASSERT_TRUE(givenBack(inherited, 0)) << "the parent gives its idle segment back";

  const int status = statusOfForkedChild(
      [&]() -> int {
        if (!inherited.tryAcquire()) return 10;  // the child's own segment of 10: uses 1, holds 9
        if (!givenBack(inherited, 9)) return 11;
        Segmented made(source, o);
        if (!made.tryAcquire()) return 12;
        if (!givenBack(made, 0)) return 13;
        return 0;
      },
      ChildExit::Immediately);
  ASSERT_TRUE(WIFEXITED(status)) << "the child " << describeWaitStatus(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (see its return codes)";
  EXPECT_EQ(source->availablePermits(), 97) << "three permits used, every idle one given back";
}

// --- 5 per window, segment 3: the second node gets the remaining 2 ----------------------------

TEST_F(SegmentedRateLimiterIT, SecondNodeGetsAPartialSegment) {
  auto nodeA = limiter(name(), newClient());
  auto nodeB = limiter(name(), newClient());
  ASSERT_TRUE(nodeA->trySetRate(RateType::Overall, 5, milliseconds(10000)));
  SegmentOptions o;
  o.segmentSize = 3;
  o.returnWhenIdle = false;
  Segmented segA(nodeA, o);
  Segmented segB(nodeB, o);
  ASSERT_TRUE(segA.tryAcquire());  // segment of 3
  EXPECT_TRUE(segB.tryAcquire());  // the 2 left: a partial segment
  EXPECT_TRUE(segB.tryAcquire());
  EXPECT_FALSE(segB.tryAcquire());
  EXPECT_EQ(segB.stats().permitsFromRemote, 2);
  EXPECT_TRUE(segA.tryAcquire());
  EXPECT_TRUE(segA.tryAcquire());
  EXPECT_FALSE(segA.tryAcquire());
  EXPECT_EQ(nodeA->availablePermits(), 0);
}

// --- close and reconfigure -------------------------------------------------------------------

TEST_F(SegmentedRateLimiterIT, CloseShrinksTheMemberAndRaisesTheValue) {
  auto rl = limiter(name());
  ASSERT_TRUE(rl->trySetRate(RateType::Overall, 20, milliseconds(10000)));
  SegmentOptions o;
  o.segmentSize = 10;
  Segmented seg(rl, o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(seg.tryAcquire());
  EXPECT_EQ(rl->availablePermits(), 10);
  EXPECT_EQ(seg.close(), 7);
  EXPECT_EQ(rl->availablePermits(), 17);
  const Reply members = raw({"ZRANGE", rl->keys()[3], "0", "-1"});
  ASSERT_EQ(members.elements.size(), 1u);
  EXPECT_EQ(memberPermits(members.elements[0].str), 3);
  EXPECT_EQ(valuePlusMembers(*rl), 20);
  EXPECT_THROW((void)seg.tryAcquire(), Error);
}

TEST_F(SegmentedRateLimiterIT, ReconfigureUpdatesOnlyWhenDifferentAndKeepsState) {
  auto rl = limiter(name());
  ASSERT_TRUE(rl->trySetRate(RateType::Overall, 10, milliseconds(10000)));
  SegmentOptions o;
  o.segmentSize = 5;
  o.returnWhenIdle = false;
  Segmented seg(rl, o);
  ASSERT_TRUE(seg.tryAcquire());  // holds 4
  const std::int64_t evalsBefore = commandCalls(admin(), "evalsha");
  EXPECT_FALSE(seg.reconfigure(RateType::Overall, 10, milliseconds(10000), 5));
  EXPECT_EQ(commandCalls(admin(), "evalsha"), evalsBefore) << "same configuration: nothing written or returned";
  EXPECT_EQ(seg.stats().permitsHeld, 4);

  EXPECT_TRUE(seg.reconfigure(RateType::Overall, 20, milliseconds(10000), 5));
  const RateLimiterConfig cfg = rl->getConfig();
  EXPECT_EQ(cfg.rate, 20);
  EXPECT_EQ(cfg.rateInterval, milliseconds(10000));
  EXPECT_EQ(seg.stats().permitsReturned, 4);
  EXPECT_EQ(rl->availablePermits(), 19) << "the permit in use stays counted";
  EXPECT_TRUE(seg.tryAcquire());
  EXPECT_EQ(rl->availablePermits(), 14);

  Segmented fresh(limiter(name("new")), o);
  EXPECT_TRUE(fresh.reconfigure(RateType::Overall, 7, milliseconds(1000), 5));
  EXPECT_EQ(fresh.source()->getConfig().rate, 7);
}

TEST_F(SegmentedRateLimiterIT, ExpiredSegmentIsNotSpentAndNothingIsReturned) {
  auto rl = limiter(name());
  ASSERT_TRUE(rl->trySetRate(RateType::Overall, 10, milliseconds(300)));
  SegmentOptions o;
  o.segmentSize = 10;
  o.returnWhenIdle = false;
  Segmented seg(rl, o);
  ASSERT_TRUE(seg.tryAcquire());  // holds 9
  sleepMs(320);
  EXPECT_TRUE(seg.tryAcquire());  // a new segment: the old one expired with its grant
  const SegmentStats s = seg.stats();
  EXPECT_EQ(s.permitsExpired, 9);
  EXPECT_EQ(s.permitsFromRemote, 20);
  EXPECT_EQ(s.remoteRoundTrips, 2);
  EXPECT_EQ(rl->availablePermits(), 0) << "the new segment holds the whole rate again";
}

}  // namespace
