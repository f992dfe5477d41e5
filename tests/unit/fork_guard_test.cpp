// forkGeneration() and the random ids after fork(): a child must not draw its parent's ids.
//
// The children do little (draw ids, write to a pipe) and leave with _exit, without gtest
// assertions, flushing stdio or running destructors the parent owns.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "base/fork_guard.hpp"
#include "redlimit_test/fd_io.hpp"
#include "base/random.hpp"

using redlimit::detail::forkGeneration;
using redlimit::detail::randomId16;
using redlimit::test::readToEnd;
using redlimit::test::writeAll;

namespace {

using Id = std::array<std::uint8_t, 16>;
constexpr std::size_t kIds = 1000;

// What a child wrote: its forkGeneration(), then the ids it drew.
struct ChildReport {
  std::uint64_t generation = 0;
  std::vector<Id> ids;
};

// The child: reports its generation and draws `ids` ids, then _exit(0); _exit(1) if a write fails.
[[noreturn]] void runChild(int fd, std::size_t ids) {
  const std::uint64_t generation = forkGeneration();
  bool ok = writeAll(fd, &generation, sizeof generation);
  for (std::size_t i = 0; ok && i < ids; ++i) {
    const Id id = randomId16();
    ok = writeAll(fd, id.data(), id.size());
  }
  ::_exit(ok ? 0 : 1);
}

// Forks a child that runs runChild(ids); in the parent, calls `afterFork` while the child runs and
// then collects the child's report. Fails the test (and returns an empty report) if anything fails.
template <class AfterFork>
ChildReport forkChild(std::size_t ids, AfterFork afterFork) {
  int fds[2];
  if (::pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    runChild(fds[1], ids);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    ::close(fds[0]);
    return {};
  }
  afterFork();
  const std::string bytes = readToEnd(fds[0]);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ChildReport report;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "the child failed, wait status " << status;
    return report;
  }
  if (bytes.size() != sizeof report.generation + ids * sizeof(Id)) {
    ADD_FAILURE() << "the child wrote " << bytes.size() << " bytes";
    return report;
  }
  std::memcpy(&report.generation, bytes.data(), sizeof report.generation);
  report.ids.resize(ids);
  for (std::size_t i = 0; i < ids; ++i)
    std::memcpy(report.ids[i].data(), bytes.data() + sizeof report.generation + i * sizeof(Id), sizeof(Id));
  return report;
}

}  // namespace

TEST(ForkGuard, GenerationIsStableWithoutFork) {
  const std::uint64_t g = forkGeneration();
  EXPECT_EQ(forkGeneration(), g);
  std::uint64_t inThread = 0;
  std::thread([&] { inThread = forkGeneration(); }).join();
  EXPECT_EQ(inThread, g);
}

TEST(ForkGuard, ChildSeesANewGeneration) {
  const std::uint64_t parent = forkGeneration();
  const ChildReport child = forkChild(0, [] {});
  EXPECT_NE(child.generation, parent);
  EXPECT_EQ(forkGeneration(), parent) << "fork() must not change the parent's generation";
}

TEST(ForkGuard, ChildAndParentDrawDifferentIdsAfterFork) {
  // Seed this thread's generator before the fork, so that the child inherits its state.
  (void)randomId16();
  std::vector<Id> parent;
  const ChildReport child = forkChild(kIds, [&] {
    for (std::size_t i = 0; i < kIds; ++i) parent.push_back(randomId16());
  });
  ASSERT_EQ(child.ids.size(), kIds);
  const std::set<Id> parentIds(parent.begin(), parent.end());
  const std::set<Id> childIds(child.ids.begin(), child.ids.end());
  EXPECT_EQ(parentIds.size(), kIds);
  EXPECT_EQ(childIds.size(), kIds);
  std::vector<Id> shared;
  std::set_intersection(parentIds.begin(), parentIds.end(), childIds.begin(), childIds.end(),
                        std::back_inserter(shared));
  EXPECT_TRUE(shared.empty()) << shared.size() << " of " << kIds << " ids drawn by both parent and child";
}
