// A limiter with requests in flight at fork() must not be dead in the child; the failure gate's
// part: a fork() child whose parent was
// delivering a health event at fork() must deliver its own events (the inherited "delivering"
// flag belonged to a parent thread that does not exist in the child).
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "redlimit/clock.hpp"
#include "redlimit/detail/failure_gate.hpp"
#include "redlimit/errors.hpp"

using namespace redlimit;
using detail::FailureGate;
using std::chrono::milliseconds;

namespace {

std::atomic<pid_t> gParent{0};
std::atomic<bool> gParentInCallback{false};
std::atomic<bool> gReleaseParent{false};
std::atomic<int> gChildRecovered{0};

}  // namespace

TEST(FailureGate, DeliversInAChildForkedMidDelivery) {
  gParent = ::getpid();
  FailureOptions o;
  o.policy = FailurePolicy::Deny;
  o.probeInterval = milliseconds(100);
  o.onHealthChange = [](const HealthEvent& e) {
    if (::getpid() != gParent.load()) {  // the child: count its Recovered, never block
      if (e.kind == HealthEvent::Kind::Recovered) gChildRecovered.fetch_add(1);
      return;
    }
    if (e.kind != HealthEvent::Kind::Degraded) return;
    gParentInCallback = true;  // the parent's delivering thread holds on here across the fork
    while (!gReleaseParent.load()) std::this_thread::sleep_for(milliseconds(1));
  };
  FailureGate gate("g", o);
  std::thread delivering([&] { gate.failed(IoError("refused"), gate.callStart()); });
  while (!gParentInCallback.load()) std::this_thread::sleep_for(milliseconds(1));

  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: no gtest. Redis answered: the Recovered event must reach the callback here (on
    // the old code it stayed queued behind the parent's delivering flag: exit status 1).
    gate.succeeded();
    ::_exit(gChildRecovered.load() == 1 && !gate.stats().degraded ? 0 : 1);
  }
  gReleaseParent = true;
  delivering.join();
  ASSERT_GT(pid, 0) << std::strerror(errno);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's Recovered event was not delivered";
  EXPECT_TRUE(gate.stats().degraded);  // the parent is still degraded: the child's news is its own
}
