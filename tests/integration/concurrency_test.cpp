// Several processes with several threads each hammer one limiter: exactly `rate` grants.
#include <sstream>

#include "redlimit_test/fixture.hpp"
#include "redlimit_test/process.hpp"

using namespace redlimit;
using namespace redlimit::test;
using std::chrono::milliseconds;

class Concurrency : public RedisTest {};

TEST_F(Concurrency, ProcessesAndThreadsGetExactlyRate) {
  const std::string n = name();
  RateLimiter rl(client(), n);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 100, milliseconds(10000)));

  constexpr int kProcesses = 3;
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < kProcesses; ++i) {
    workers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{REDLIMIT_LIMITER_WORKER, server().uri(), n, "4", "1000"}));
  }
  long total = 0;
  for (auto& w : workers) {
    std::string out;
    ASSERT_EQ(w->wait(out), 0) << out;
    std::istringstream in(out);
    long grants = -1, errors = -1;
    in >> grants >> errors;
    EXPECT_EQ(errors, 0);
    EXPECT_GE(grants, 0);
    total += grants;
  }
  EXPECT_EQ(total, 100);
  EXPECT_EQ(raw({"ZCARD", suffixName(n, "permits")}).asInteger(), 100);
  EXPECT_EQ(raw({"GET", suffixName(n, "value")}).str, "0");
}
