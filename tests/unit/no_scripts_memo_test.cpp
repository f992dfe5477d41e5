// What a Transport remembers of a server that runs no scripts for this client: learnt from the
// refusal, one re-check per interval, forgotten by an answer; times passed in, no server, no sleep.
#include "transport/no_scripts_memo.hpp"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

using std::chrono::milliseconds;

const Script kMemoScript{"test", "0123456789abcdef0123456789abcdef01234567", "return 1"};
const SteadyTime kMemoStart = SteadyTime{} + std::chrono::hours(1);
constexpr auto kRecheck = NoScriptsMemo::kRecheckInterval;

std::exception_ptr aclRefusal() {
  return errorOf<ConfigurationError>("NOPERM", "redlimit: the server runs no scripts for ACL user 'u': NOPERM ...");
}

const ConfigurationError& configurationErrorIn(const std::exception_ptr& e) {
  return dynamic_cast<const ConfigurationError&>(*errorIn(e));
}

TEST(NoScriptsMemo, RefusesWithItsOwnCopyOfTheRefusalAndRechecksOncePerInterval) {
  NoScriptsMemo memo;
  EXPECT_FALSE(memo.known());
  EXPECT_EQ(memo.refusal(kMemoStart), nullptr) << "nothing learnt: sent";

  const std::exception_ptr learnt = aclRefusal();
  memo.learn(learnt, kMemoStart);
  ASSERT_TRUE(memo.known());
  const std::exception_ptr first = memo.refusal(kMemoStart);
  const std::exception_ptr late = memo.refusal(kMemoStart + kRecheck - milliseconds(1));
  ASSERT_NE(first, nullptr);
  ASSERT_NE(late, nullptr);
  for (const auto& e : {first, late}) {
    EXPECT_NE(errorIn(e), errorIn(learnt)) << "each caller its own object";
    EXPECT_EQ(configurationErrorIn(e).kind(), ErrorKind::Configuration);
    EXPECT_EQ(configurationErrorIn(e).code(), "NOPERM");
    EXPECT_STREQ(configurationErrorIn(e).what(), configurationErrorIn(learnt).what()) << "the same text";
  }
  EXPECT_NE(errorIn(first), errorIn(late));
  EXPECT_EQ(memo.refused(), 2u);
  EXPECT_EQ(memo.rechecks(), 0u);

  // The interval is over: one request goes, the others of this interval do not.
  EXPECT_EQ(memo.refusal(kMemoStart + kRecheck), nullptr);
  EXPECT_NE(memo.refusal(kMemoStart + kRecheck), nullptr);
  EXPECT_NE(memo.refusal(kMemoStart + 2 * kRecheck - milliseconds(1)), nullptr);
  EXPECT_EQ(memo.rechecks(), 1u);
  // The re-check was refused again (learnt anew): the next one is an interval after it.
  memo.learn(aclRefusal(), kMemoStart + kRecheck + milliseconds(10));
  EXPECT_NE(memo.refusal(kMemoStart + 2 * kRecheck), nullptr);
  EXPECT_EQ(memo.refusal(kMemoStart + 2 * kRecheck + milliseconds(10)), nullptr);
  EXPECT_EQ(memo.rechecks(), 2u);
  EXPECT_EQ(memo.refused(), 5u);
}

TEST(NoScriptsMemo, ForgetSendsEveryRequestAgain) {
  NoScriptsMemo memo;
  memo.learn(aclRefusal(), kMemoStart);
  ASSERT_NE(memo.refusal(kMemoStart), nullptr);
  memo.forget();
  EXPECT_FALSE(memo.known());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(memo.refusal(kMemoStart), nullptr);
  EXPECT_EQ(memo.refused(), 1u);
  EXPECT_EQ(memo.rechecks(), 0u) << "sent because nothing is known, not as re-checks";
}

TEST(NoScriptsMemo, OneOfManyConcurrentCallersRechecks) {
  NoScriptsMemo memo;
  memo.learn(aclRefusal(), kMemoStart);
  constexpr int kThreads = 8;
  constexpr int kCalls = 200;
  std::atomic<int> sent{0};
  std::atomic<int> refused{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kCalls; ++i) (memo.refusal(kMemoStart + kRecheck) == nullptr ? sent : refused)++;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(sent.load(), 1);
  EXPECT_EQ(refused.load(), kThreads * kCalls - 1);
  EXPECT_EQ(memo.rechecks(), 1u);
  EXPECT_EQ(memo.refused(), static_cast<std::uint64_t>(kThreads * kCalls - 1));
}

// The pipeline learns from the answers to script requests: a refusal to run scripts teaches the
// memo; any other answer (served, or another error) makes it forget.
TEST(NoScriptsMemo, ThePipelineLearnsFromARefusalAndForgetsOnAnotherAnswer) {
  NoScriptsMemo memo;
  Pipeline p(ClientOptions::ReplyLimits{}, "u", "test:1", {}, nullptr, nullptr, &memo);
  std::vector<Finished> done;
  const auto answer = [&](const std::string& reply, bool script) {
    Request r = script ? makeScriptRequest(kMemoScript, {"k"}, {"a"})
                       : makeRequest(std::vector<std::string_view>{"GET", "k"}.data(), 2);
    r.done = [](const Outcome&) {};
    p.push(std::move(r));
    (void)p.output();
    p.wrote(p.output().size());
    p.received(reply.data(), reply.size(), done);
    for (auto& f : done) f.done(std::move(f.outcome));
    done.clear();
  };
  answer("-NOPERM this user has no permissions to run the 'evalsha' command\r\n", true);
  ASSERT_TRUE(memo.known());
  EXPECT_EQ(configurationErrorIn(memo.refusal(kMemoStart)).code(), "NOPERM");
  answer("-ERR unknown command 'GET'\r\n", false);
  EXPECT_TRUE(memo.known()) << "a command that runs no script says nothing of scripts";
  answer(":1\r\n", true);
  EXPECT_FALSE(memo.known()) << "served";

  answer("-ERR unknown command 'EVALSHA', with args beginning with: \r\n", true);
  ASSERT_TRUE(memo.known());
  EXPECT_EQ(configurationErrorIn(memo.refusal(kMemoStart)).code(), "ERR");
  answer("-NOPERM this user has no permissions to access one of the keys used as arguments\r\n", true);
  EXPECT_FALSE(memo.known()) << "the server ran the script command (and refused a key)";
}

}  // namespace
}  // namespace redlimit::detail
