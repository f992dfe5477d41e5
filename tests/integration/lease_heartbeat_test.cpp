// A lease Limiter's asynchronous renew and release, and LeaseHeartbeat, against a real
// redis-server: a lease kept alive past many TTLs, released when the heartbeat ends, lost once when
// someone else releases it or Redis is gone, bad options refused before anything is sent, and one
// thread for every heartbeat. Waits are for conditions (renewals counted, the server's clock),
// never on elapsed time.
#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "helpers.hpp"
#include "redlimit/detail/idle_sweeper.hpp"
#include "redlimit/lease_heartbeat.hpp"
#include "redlimit/limiter.hpp"
#include "redlimit/metrics.hpp"
#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"
#include "redlimit_test/expect_error.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// Polls `ready` every 5 ms for up to 20 s (a loaded machine may be slow; a pass ends at once).
template <class Ready>
bool heartbeatSees(Ready&& ready) {
  for (int i = 0; i < 4000; ++i) {
    if (ready()) return true;
    sleepMs(5);
  }
  return ready();
}

// A valid lease id that no acquire made.
std::string unusedLeaseId() { return std::string(32, 'b'); }

// The CallbackThrew events a monitor's onEvent (callback()) is given.
class ThrownCallbacks {
 public:
  EventCallback callback() {
    return [this](const Event& e) {
      if (e.kind != Event::Kind::CallbackThrew) return;
      const std::lock_guard<std::mutex> lock(m_);
      events_.push_back(e);
      cv_.notify_all();
    };
  }
  // Waits up to 20 s for the `n`th (a loaded machine may be slow; a pass ends at once); true when
  // it came.
  bool cameTo(std::size_t n) {
    std::unique_lock<std::mutex> lock(m_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return events_.size() >= n; });
  }
  std::vector<Event> events() {
    const std::lock_guard<std::mutex> lock(m_);
    return events_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<Event> events_;
};

}  // namespace

class LeaseHeartbeatTest : public RedisTest {
 protected:
  static constexpr const char* kJob = "job";  // the key whose leases a test's Limiter takes
  std::int64_t zcard(const std::string& key) { return raw({"ZCARD", key}).integer; }
  // The expiry Redis holds for lease `id` (epoch µs), or -1 if it holds none.
  std::int64_t expiryOf(const std::string& key, const std::string& id) {
    const Reply r = raw({"ZSCORE", key, id});
    return r.type == Reply::Type::Nil ? -1 : std::stoll(r.str);
  }
  // A client with one connection: one thread's calls reach Redis in the order they were made, so a
  // sync call after the heartbeat's end shows whether that end sent a release.
  std::shared_ptr<Client> oneConnection() {
    ClientOptions o;
    o.pool.size = 1;
    return newClient(o);
  }
};

TEST_F(LeaseHeartbeatTest, RenewAsyncAndReleaseAsyncAnswerAsTheSyncForms) {
  Limiter cl(client(), limiterName(), Policy::concurrency(2, milliseconds(100)));
  const std::optional<Lease> lease = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(lease);
  const std::optional<Lease> renewed = cl.renewAsync(kJob, *lease, milliseconds(60000)).get();
  ASSERT_TRUE(renewed);
  EXPECT_EQ(renewed->id, lease->id);
  EXPECT_GT(renewed->expiresAt, lease->expiresAt);
  EXPECT_EQ(expiryOf(cl.redisKey(kJob), lease->id), renewed->expiresAt.count());

  std::promise<std::pair<std::optional<Lease>, std::exception_ptr>> got;
  cl.renewAsync(kJob, *renewed, [&](std::optional<Lease> r, std::exception_ptr e) {
    got.set_value({std::move(r), e});
  });
  const auto [byCallback, error] = got.get_future().get();
  EXPECT_FALSE(error);
  ASSERT_TRUE(byCallback);
  EXPECT_EQ(expiryOf(cl.redisKey(kJob), lease->id), byCallback->expiresAt.count()) << "the policy's 100 ms TTL";
  EXPECT_LT(byCallback->expiresAt, renewed->expiresAt);

  EXPECT_TRUE(cl.releaseAsync(kJob, *lease).get());
  EXPECT_FALSE(cl.releaseAsync(kJob, *lease).get()) << "a second release is a no-op";
  EXPECT_FALSE(cl.renewAsync(kJob, *lease).get().has_value()) << "a released lease is not renewed";
  EXPECT_FALSE(exists(admin(), cl.redisKey(kJob)));

  // Bad input: InvalidArgument through the future and the callback, nothing sent.
  const std::int64_t calls = scriptCalls();
  Lease bogus = *lease;
  bogus.id = "abc";
  EXPECT_THROW((void)cl.renewAsync(kJob, bogus).get(), InvalidArgument);
  EXPECT_THROW((void)cl.releaseAsync(kJob, bogus).get(), InvalidArgument);
  EXPECT_THROW((void)cl.renewAsync(kJob, *lease, milliseconds(0)).get(), InvalidArgument);
  std::promise<std::exception_ptr> refused;
  cl.releaseAsync(kJob, bogus, [&](bool, std::exception_ptr e) { refused.set_value(e); });
  EXPECT_THROW(std::rethrow_exception(refused.get_future().get()), InvalidArgument);
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";

  // A corrupted key: the limiter's typed error, nothing written.
  (void)raw({"SET", cl.redisKey(kJob), "garbage"});
  EXPECT_TRUE(
      test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)cl.renewAsync(kJob, *lease).get(); }));
  EXPECT_TRUE(
      test::throwsError<ScriptError>(ErrorKind::InvalidConfig, [&] { (void)cl.releaseAsync(kJob, *lease).get(); }));
  EXPECT_EQ(raw({"GET", cl.redisKey(kJob)}).str, "garbage");
}

TEST_F(LeaseHeartbeatTest, KeepsALeaseAlivePastItsTtlUntilReleased) {
  Limiter cl(client(), limiterName(), Policy::concurrency(1, milliseconds(1000)));
  const std::optional<Lease> lease = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(lease);
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(100);
  LeaseHeartbeat hb(cl, kJob, *lease, o);
  // Past the acquired lease's expiry on the server's clock, with renewals seen.
  ASSERT_TRUE(heartbeatSees([&] { return serverTimeUs(admin()) > lease->expiresAt.count() + 200000; }));
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 3; }));
  EXPECT_FALSE(hb.lost());
  EXPECT_GT(expiryOf(cl.redisKey(kJob), lease->id), serverTimeUs(admin())) << "the lease is live in Redis";
  EXPECT_GT(hb.lease().expiresAt, lease->expiresAt);
  EXPECT_FALSE(cl.acquireLease(kJob).lease.has_value()) << "its place is still held";

  EXPECT_TRUE(hb.release());
  EXPECT_FALSE(exists(admin(), cl.redisKey(kJob))) << "released: the last lease's key is deleted";
  const std::uint64_t renewals = hb.renewals();
  EXPECT_FALSE(hb.release()) << "a second release answers false";
  sleepMs(300);  // three intervals: a heartbeat that went on would have renewed (and counted) by now
  EXPECT_EQ(hb.renewals(), renewals);
  EXPECT_FALSE(hb.lost());
  EXPECT_TRUE(cl.acquireLease(kJob).lease.has_value());
}

TEST_F(LeaseHeartbeatTest, KeepsALimitersLeaseOfAKeyAlivePastItsTtlUntilReleased) {
  Limiter jobs(client(), limiterName(), Policy::concurrency(1, milliseconds(1000)));
  const LeaseDecision first = jobs.acquireLease("job");
  ASSERT_TRUE(first.lease.has_value());
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(100);
  LeaseHeartbeat hb(jobs, "job", *first.lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return serverTimeUs(admin()) > first.lease->expiresAt.count() + 200000; }));
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 3; }));
  EXPECT_FALSE(hb.lost());
  EXPECT_GT(hb.lease().expiresAt, first.lease->expiresAt);
  EXPECT_FALSE(jobs.acquireLease("job").decision.allowed) << "its place is still held";
  EXPECT_TRUE(jobs.acquireLease("other").decision.allowed) << "another key has its own places";
  EXPECT_TRUE(hb.release());
  EXPECT_EQ(jobs.held("job"), 0);
  EXPECT_TRUE(jobs.acquireLease("job").decision.allowed);
}

TEST_F(LeaseHeartbeatTest, ALimiterHeartbeatNeedsAConcurrencyPolicyAndAGoodKeyBeforeAnythingIsSent) {
  Limiter jobs(client(), limiterName("jobs"), Policy::concurrency(1, milliseconds(1000)));
  Limiter rate(client(), limiterName("rate"), Policy::perSecond(10));
  Lease lease;
  lease.id = "0123456789abcdef0123456789abcdef";
  const std::int64_t calls = scriptCalls();
  EXPECT_THROW(LeaseHeartbeat(rate, "job", lease), InvalidArgument) << "a rate policy gives no leases";
  EXPECT_THROW(LeaseHeartbeat(jobs, "", lease), InvalidArgument) << "an empty key";
  LeaseHeartbeat::Options tooSlow;
  tooSlow.interval = milliseconds(1000);
  EXPECT_THROW(LeaseHeartbeat(jobs, "job", lease, tooSlow), InvalidArgument) << "not shorter than the TTL";
  EXPECT_EQ(scriptCalls(), calls);
}

TEST_F(LeaseHeartbeatTest, EndingTheHeartbeatReleasesTheLeaseAndStopKeepsIt) {
  Limiter cl(oneConnection(), limiterName(), Policy::concurrency(3, milliseconds(60000)));
  const std::optional<Lease> ended = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(ended);
  { LeaseHeartbeat hb(cl, kJob, *ended); }
  EXPECT_EQ(cl.held(kJob), 0) << "the destructor sent a release before this call, on the same connection";

  const std::optional<Lease> kept = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(kept);
  {
    LeaseHeartbeat hb(cl, kJob, *kept);
    const Lease back = hb.stop();
    EXPECT_EQ(back.id, kept->id);
  }
  EXPECT_EQ(cl.held(kJob), 1) << "stop() keeps the lease: nothing was released";

  // Moved: the heartbeat moved to renews and releases; the one moved from does neither.
  const std::optional<Lease> moved = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(moved);
  std::optional<LeaseHeartbeat> from;
  from.emplace(cl, kJob, *moved);
  LeaseHeartbeat to(std::move(*from));
  from.reset();
  EXPECT_EQ(cl.held(kJob), 2) << "the moved-from heartbeat released nothing";
  EXPECT_EQ(to.lease().id, moved->id);
  LeaseHeartbeat other(cl, kJob, *kept);
  to = std::move(other);  // ends `moved` as a destructor would, and takes `kept`
  EXPECT_EQ(cl.held(kJob), 1);
  EXPECT_EQ(to.lease().id, kept->id);
  EXPECT_TRUE(to.release());
  EXPECT_EQ(cl.held(kJob), 0);
}

TEST_F(LeaseHeartbeatTest, ALeaseReleasedElsewhereIsLostOnceAndNotRenewedAgain) {
  Limiter cl(client(), limiterName(), Policy::concurrency(1, milliseconds(1000)));
  const std::optional<Lease> lease = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(lease);
  std::atomic<int> lostCalls{0};
  std::mutex m;
  std::exception_ptr why = std::make_exception_ptr(std::runtime_error("not called"));
  std::string lostId;
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(20);
  o.onLost = [&](const Lease& l, std::exception_ptr e) {
    const std::lock_guard<std::mutex> lock(m);
    why = std::move(e);
    lostId = l.id;
    lostCalls.fetch_add(1);
  };
  LeaseHeartbeat hb(cl, kJob, *lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 1; }));
  ASSERT_TRUE(cl.release(kJob, *lease));  // another holder of the id releases it
  ASSERT_TRUE(heartbeatSees([&] { return hb.lost(); }));
  const std::uint64_t renewals = hb.renewals();
  sleepMs(100);  // five intervals: a heartbeat that went on would have called onLost again by now
  EXPECT_EQ(lostCalls.load(), 1);
  EXPECT_EQ(hb.renewals(), renewals);
  {
    const std::lock_guard<std::mutex> lock(m);
    EXPECT_FALSE(why) << "not live: no error";
    EXPECT_EQ(lostId, lease->id);
  }
  EXPECT_FALSE(hb.release()) << "nothing to release";
  EXPECT_FALSE(exists(admin(), cl.redisKey(kJob)));
}

// An onLost that throws: the exception is counted and reported once, as a CallbackThrew event
// under the limiter's name, and the lease stays lost.
TEST_F(LeaseHeartbeatTest, AnOnLostThatThrowsIsCountedAndReportedUnderTheLimitersName) {
  Limiter::Options lo;
  lo.monitor.registry = std::make_shared<MetricsRegistry>();
  ThrownCallbacks thrown;
  lo.monitor.onEvent = thrown.callback();
  Limiter cl(client(), limiterName(), Policy::concurrency(1, milliseconds(1000)), lo);
  const std::optional<Lease> lease = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(lease);
  std::atomic<int> lostCalls{0};
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(20);
  o.onLost = [&](const Lease&, const std::exception_ptr&) {
    lostCalls.fetch_add(1);
    throw std::runtime_error("the holder's onLost throws");
  };
  LeaseHeartbeat hb(cl, kJob, *lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 1; }));
  ASSERT_TRUE(cl.release(kJob, *lease));  // another holder of the id releases it
  ASSERT_TRUE(thrown.cameTo(1));
  EXPECT_TRUE(hb.lost());
  EXPECT_EQ(lostCalls.load(), 1);
  EXPECT_EQ(cl.monitor().metrics()->snapshot().callbacksThrew, 1u);
  const std::vector<Event> threw = thrown.events();
  ASSERT_EQ(threw.size(), 1u);
  EXPECT_EQ(threw[0].limiter, cl.name());
  EXPECT_NE(threw[0].description.find("the holder's onLost throws"), std::string::npos) << threw[0].description;
}

// A MultiLimit's heartbeat names it as the MultiLimit's own events and messages do: its onLost
// that throws is reported under the name a callback of the MultiLimit's own call that throws is,
// and a bad interval's message gives that name too.
TEST_F(LeaseHeartbeatTest, AMultiLimitsHeartbeatNamesItAsTheMultiLimitsOwnEventsDo) {
  MultiLimit::Options mo;
  mo.monitor.registry = std::make_shared<MetricsRegistry>();
  ThrownCallbacks thrown;
  mo.monitor.onEvent = thrown.callback();
  Limiter places(client(), limiterName("places"), Policy::concurrency(1, milliseconds(1000)));
  MultiLimit all = MultiLimit({places}, mo).on({kJob});
  const std::optional<Lease> lease = all.decide().lease;
  ASSERT_TRUE(lease);
  all.renewAsync(*lease, [](const std::optional<Lease>&, const std::exception_ptr&) {
    throw std::runtime_error("the MultiLimit's own callback throws");
  });
  ASSERT_TRUE(thrown.cameTo(1));
  const std::string name = thrown.events()[0].limiter;
  LeaseHeartbeat::Options tooSlow;
  tooSlow.interval = milliseconds(1000);
  const std::string refused = messageOfError<InvalidArgument>(ErrorKind::InvalidArgument,
                                                              [&] { (void)LeaseHeartbeat::resolved(all, tooSlow); });
  EXPECT_NE(refused.find(name), std::string::npos) << refused << " does not name " << name;

  LeaseHeartbeat::Options o;
  o.interval = milliseconds(20);
  o.onLost = [](const Lease&, const std::exception_ptr&) { throw std::runtime_error("the holder's onLost throws"); };
  LeaseHeartbeat hb(all, *lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 1; }));
  ASSERT_TRUE(all.release(*lease));  // another holder of the id releases it
  ASSERT_TRUE(thrown.cameTo(2));
  EXPECT_TRUE(hb.lost());
  const std::vector<Event> threw = thrown.events();
  ASSERT_EQ(threw.size(), 2u);
  EXPECT_EQ(threw[1].limiter, name) << "one name for one MultiLimit";
  EXPECT_NE(threw[1].description.find("the holder's onLost throws"), std::string::npos) << threw[1].description;
}

TEST_F(LeaseHeartbeatTest, AServerThatIsGoneLosesTheLeaseWithTheLastError) {
  RedisServer server;
  auto c = shortTimeoutClient(server);
  Limiter cl(c, "gone", Policy::concurrency(1, milliseconds(600)));
  const std::optional<Lease> lease = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(lease);
  std::promise<std::exception_ptr> lost;
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(100);
  o.onLost = [&](const Lease&, std::exception_ptr e) { lost.set_value(std::move(e)); };
  LeaseHeartbeat hb(cl, kJob, *lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 1; }));
  server.kill();
  std::future<std::exception_ptr> why = lost.get_future();
  ASSERT_EQ(why.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const std::exception_ptr error = why.get();
  ASSERT_TRUE(error) << "lost for want of an answer: the last error is given";
  EXPECT_THROW(std::rethrow_exception(error), IoError);
  EXPECT_TRUE(hb.lost());
  EXPECT_FALSE(hb.lease().id.empty());
}

// A renewal that hangs (the server is stopped, and the call deadline is far longer than the TTL)
// does not put the loss off: it is declared at the lease's known expiry while that renewal is still
// in flight (a TimeoutError, nothing having failed), and the renewal's late answer changes nothing.
TEST_F(LeaseHeartbeatTest, ALeaseIsLostAtItsKnownExpiryWhileARenewalHangs) {
  RedisServer server;
  ClientOptions co;
  co.connection = parseUri(server.uri());
  co.connection.commandTimeout = std::chrono::seconds(60);  // the hung renewal's deadline
  co.pool.size = 1;  // the test's sync call below is answered after the renewal sent before it
  const std::shared_ptr<Client> c = Client::create(co);
  Limiter cl(c, "hung", Policy::concurrency(1, milliseconds(900)));
  const std::optional<Lease> lease = cl.acquireLease(kJob).lease;
  ASSERT_TRUE(lease);
  std::atomic<int> lostCalls{0};
  std::promise<std::exception_ptr> lost;
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(100);
  o.onLost = [&](const Lease&, std::exception_ptr e) {
    if (lostCalls.fetch_add(1) == 0) lost.set_value(std::move(e));
  };
  LeaseHeartbeat hb(cl, kJob, *lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 1; }));
  std::uint64_t renewals = 0;
  {
    Stall stall(serverPid(*c));
    // Well before the hung renewal's deadline (60 s): it is still in flight when the loss comes.
    std::future<std::exception_ptr> why = lost.get_future();
    ASSERT_EQ(why.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "the loss waited for the renewal in flight";
    EXPECT_THROW(std::rethrow_exception(why.get()), TimeoutError);
    EXPECT_TRUE(hb.lost());
    renewals = hb.renewals();
  }                     // the server goes on: the hung renewal is answered now
  (void)cl.held(kJob);  // one connection: answered after the renewal
  EXPECT_EQ(lostCalls.load(), 1);
  EXPECT_EQ(hb.renewals(), renewals) << "a late answer changes nothing";
  EXPECT_TRUE(hb.lost());
}

TEST_F(LeaseHeartbeatTest, BadOptionsAreRefusedBeforeAnythingIsSent) {
  Limiter cl(client(), limiterName(), Policy::concurrency(2, milliseconds(900)));
  const LeaseHeartbeat::Options defaults = LeaseHeartbeat::resolved(cl, {});
  EXPECT_EQ(defaults.leaseTtl, milliseconds(900));
  EXPECT_EQ(defaults.interval, milliseconds(300)) << "a third of the TTL";
  LeaseHeartbeat::Options ttlOnly;
  ttlOnly.leaseTtl = milliseconds(2);
  EXPECT_EQ(LeaseHeartbeat::resolved(cl, ttlOnly).interval, milliseconds(1)) << "at least 1 ms";

  Lease lease;
  lease.id = unusedLeaseId();
  lease.expiresAt = microseconds(1);
  const std::int64_t calls = scriptCalls();
  const auto refused = [&](milliseconds ttl, milliseconds interval) {
    LeaseHeartbeat::Options o;
    o.leaseTtl = ttl;
    o.interval = interval;
    EXPECT_THROW([&] { LeaseHeartbeat hb(cl, kJob, lease, o); }(), InvalidArgument)
        << ttl.count() << " ms, every " << interval.count() << " ms";
  };
  refused(milliseconds(900), milliseconds(900));
  refused(milliseconds(900), milliseconds(1000));
  refused(milliseconds(900), milliseconds(-1));
  refused(milliseconds(-1), milliseconds(0));
  refused(milliseconds(4294967295) + milliseconds(1), milliseconds(0));  // above the longest TTL, 49.7 days
  refused(milliseconds(1), milliseconds(0));                             // no time between renewals
  for (const std::string& id : {std::string(), std::string(32, 'G'), unusedLeaseId() + "0"}) {
    Lease bad = lease;
    bad.id = id;
    EXPECT_THROW([&] { LeaseHeartbeat hb(cl, kJob, bad); }(), InvalidArgument) << id;
  }
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
  EXPECT_FALSE(exists(admin(), cl.redisKey(kJob)));
}

TEST_F(LeaseHeartbeatTest, ALeaseRedisDoesNotHoldIsNeitherRenewedNorReleased) {
  Limiter cl(client(), limiterName(), Policy::concurrency(2, milliseconds(300)));
  Lease byPolicy;
  byPolicy.id = unusedLeaseId();
  byPolicy.byPolicy = true;  // as the failure policy grants one: expiresAt 0
  const std::int64_t calls = scriptCalls();
  {
    LeaseHeartbeat::Options o;
    o.interval = milliseconds(10);
    LeaseHeartbeat hb(cl, kJob, byPolicy, o);
    sleepMs(50);  // five intervals
    EXPECT_EQ(hb.renewals(), 0u);
    EXPECT_FALSE(hb.lost());
    EXPECT_FALSE(hb.release()) << "Redis holds no such lease";
  }
  { LeaseHeartbeat ended(cl, kJob, byPolicy); }
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent for a lease Redis does not hold";
}

TEST_F(LeaseHeartbeatTest, FiftyHeartbeatsShareOneThread) {
  Limiter cl(client(), limiterName(), Policy::concurrency(50, milliseconds(1000)));
  std::vector<Lease> leases;
  for (int i = 0; i < 50; ++i) {
    const std::optional<Lease> l = cl.acquireLease(kJob).lease;
    ASSERT_TRUE(l);
    leases.push_back(*l);
  }
  {
    LeaseHeartbeat warm(cl, kJob, leases[0]);  // the heartbeat thread exists from here on
    (void)warm.stop();
  }
  const std::size_t threads = threadCount();
  LeaseHeartbeat::Options o;
  o.interval = milliseconds(50);
  std::vector<LeaseHeartbeat> beats;
  beats.reserve(leases.size());
  for (const Lease& l : leases) beats.emplace_back(cl, kJob, l, o);
  // Not a thread per heartbeat (50 more); the Client may start a thread of its own meanwhile.
  EXPECT_LT(threadCount(), threads + 5);
  EXPECT_GE(detail::IdleSweeper::instance().size(), 50u) << "50 tasks of the one heartbeat thread";
  ASSERT_TRUE(heartbeatSees([&] {
    for (const LeaseHeartbeat& b : beats) {
      if (b.renewals() < 2) return false;
    }
    return true;
  }));
  for (const LeaseHeartbeat& b : beats) EXPECT_FALSE(b.lost());
  EXPECT_EQ(cl.held(kJob), 50);
  beats.clear();  // each releases its lease without waiting
  EXPECT_TRUE(heartbeatSees([&] { return cl.held(kJob) == 0; }));
}

// A pre-fork server: the parent has used a heartbeat (the process's heartbeat thread runs), then
// forks a worker that takes its own lease and heartbeat. The worker's heartbeat must renew it past
// its TTL and report its loss, and the worker must exit normally. (It had no heartbeat thread:
// nothing renewed, nothing was reported, and its exit aborted on the inherited thread object.)
TEST_F(LeaseHeartbeatTest, AHeartbeatInAForkedChildRenewsReportsItsLossAndTheChildExitsNormally) {
  Limiter cl(client(), limiterName(), Policy::concurrency(2, milliseconds(1000)));
  {
    const std::optional<Lease> parents = cl.acquireLease(kJob).lease;
    ASSERT_TRUE(parents);
    LeaseHeartbeat::Options o;
    o.interval = milliseconds(50);
    LeaseHeartbeat hb(cl, kJob, *parents, o);
    ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 1; }));
  }  // released
  ASSERT_EQ(cl.held(kJob), 0);

  int result = -1;
  const int status = statusOfForkedChild(
      [&]() -> int {
        // Clients of its own (a child that ends with exit() must not leak an inherited one, see ChildExit).
        const std::shared_ptr<Client> own = newClient();
        Limiter childs(own, limiterName(), Policy::concurrency(2, milliseconds(1000)));
        const std::optional<Lease> lease = childs.acquireLease(kJob).lease;
        if (!lease) return 10;
        std::atomic<int> lostCalls{0};
        LeaseHeartbeat::Options o;
        o.interval = milliseconds(100);
        o.onLost = [&](const Lease&, const std::exception_ptr&) { lostCalls.fetch_add(1); };
        LeaseHeartbeat hb(childs, kJob, *lease, o);
        if (!heartbeatSees([&] { return hb.renewals() >= 3; })) return 11;  // renewed
        // Past the acquired lease's expiry on the server's clock, and still held there.
        const auto serverNow = [&] { return serverTimeUs(*own); };
        if (!heartbeatSees([&] { return serverNow() > lease->expiresAt.count(); })) return 12;
        const Reply expiry = detail::command(*own, {"ZSCORE", childs.redisKey(kJob), lease->id});
        if (expiry.type == Reply::Type::Nil || std::stoll(expiry.str) <= serverNow() || hb.lost()) return 13;
        if (!childs.release(kJob, *lease)) return 14;  // someone else releases it: the heartbeat reports the loss
        if (!heartbeatSees([&] { return lostCalls.load() == 1; }) || !hb.lost()) return 15;
        return 0;  // ends with exit(): the process's statics are destroyed, the heartbeat thread stopped
      },
      ChildExit::Normally, &result);
  EXPECT_EQ(result, 0) << "the child's check that failed (see its return codes; -1: it never got to the end)";
  ASSERT_TRUE(WIFEXITED(status)) << "the child " << describeWaitStatus(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child ran to its end, then did not exit normally";
  EXPECT_EQ(cl.held(kJob), 0);
}

// --- A MultiLimit's lease --------------------------------------------------------------------------

TEST_F(LeaseHeartbeatTest, AMultiLimitsLeaseIsRenewedInEveryConcurrencyLimitWithItsOwnTtl) {
  Limiter rate(client(), limiterName("rate"), Policy::gcra(100, milliseconds(1000), 100));
  Limiter shortLeases(client(), limiterName("short"), Policy::concurrency(1, milliseconds(1000)));
  Limiter longLeases(client(), limiterName("long"), Policy::concurrency(2, milliseconds(3000)));
  const std::string shortKey = shortLeases.redisKey(kJob);
  const std::string longKey = longLeases.redisKey(kJob);
  MultiLimit all = MultiLimit({rate, shortLeases, longLeases}).on({kJob, kJob, kJob});
  EXPECT_EQ(all.leaseTtl(), milliseconds(1000)) << "the shortest";
  EXPECT_EQ(LeaseHeartbeat::resolved(all, {}).interval, milliseconds(333)) << "a third of the shortest";
  EXPECT_EQ(LeaseHeartbeat::resolved(all, {}).leaseTtl, milliseconds(0)) << "each limit's own";
  const MultiDecision d = all.decide();
  ASSERT_TRUE(d.allowed);
  ASSERT_TRUE(d.lease);
  const Lease lease = *d.lease;

  // The async forms first.
  const std::optional<Lease> renewed = all.renewAsync(lease).get();
  ASSERT_TRUE(renewed);
  EXPECT_EQ(expiryOf(longKey, lease.id) - expiryOf(shortKey, lease.id), 2'000'000) << "one call, each limit's own TTL";
  EXPECT_EQ(renewed->expiresAt.count(), expiryOf(shortKey, lease.id)) << "the soonest";

  LeaseHeartbeat::Options o;
  o.interval = milliseconds(100);
  LeaseHeartbeat hb(all, lease, o);
  ASSERT_TRUE(heartbeatSees([&] { return serverTimeUs(admin()) > renewed->expiresAt.count() + 200000; }));
  ASSERT_TRUE(heartbeatSees([&] { return hb.renewals() >= 3; }));
  EXPECT_FALSE(hb.lost());
  const std::int64_t now = serverTimeUs(admin());
  EXPECT_GT(expiryOf(shortKey, lease.id), now) << "live past its first expiry";
  EXPECT_GT(expiryOf(longKey, lease.id), now);
  EXPECT_FALSE(all.decide().allowed) << "the short limit's one place is still held";
  EXPECT_TRUE(hb.release());
  EXPECT_FALSE(exists(admin(), shortKey));
  EXPECT_FALSE(exists(admin(), longKey));
  EXPECT_FALSE(all.releaseAsync(lease).get()) << "released already";

  // Refused before anything is sent: no concurrency limit, a bad id or TTL.
  const std::int64_t calls = scriptCalls();
  MultiLimit rateOnly = MultiLimit({rate}).on({kJob});
  EXPECT_THROW([&] { LeaseHeartbeat none(rateOnly, lease); }(), InvalidArgument);
  EXPECT_THROW((void)rateOnly.renewAsync(lease).get(), InvalidArgument);
  EXPECT_THROW((void)rateOnly.releaseAsync(lease).get(), InvalidArgument);
  Lease bogus = lease;
  bogus.id = "xyz";
  EXPECT_THROW((void)all.renewAsync(bogus).get(), InvalidArgument);
  EXPECT_THROW((void)all.renewAsync(lease, milliseconds(0)).get(), InvalidArgument);
  LeaseHeartbeat::Options tooSlow;
  tooSlow.interval = milliseconds(1000);
  EXPECT_THROW([&] { LeaseHeartbeat slow(all, lease, tooSlow); }(), InvalidArgument) << "not shorter than 1 s";
  EXPECT_EQ(scriptCalls(), calls) << "nothing sent";
}
