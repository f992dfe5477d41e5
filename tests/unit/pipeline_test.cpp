// The request/reply state machine of one connection, fed bytes by hand: no server, no socket.
#include "transport/pipeline.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

using std::chrono::milliseconds;

const Script kScript{"test", "0123456789abcdef0123456789abcdef01234567", "return 1"};

// A request whose outcome lands in `log[slot]`.
struct Log {
  std::vector<Outcome> outcomes;
  std::vector<int> order;
};

Request request(std::initializer_list<std::string_view> argv, Log& log, int slot,
                SteadyTime deadline = SteadyTime::max()) {
  Request r = makeRequest(argv.begin(), argv.size());
  r.deadline = deadline;
  r.budget = milliseconds(100);
  if (log.outcomes.size() <= static_cast<std::size_t>(slot)) log.outcomes.resize(static_cast<std::size_t>(slot) + 1);
  r.done = [&log, slot](Outcome o) {
    log.outcomes[static_cast<std::size_t>(slot)] = std::move(o);
    log.order.push_back(slot);
  };
  return r;
}

Request scriptRequest(Log& log, int slot) {
  Request r = makeScriptRequest(kScript, {"k"}, {"a"});
  r.deadline = SteadyTime::max();
  if (log.outcomes.size() <= static_cast<std::size_t>(slot)) log.outcomes.resize(static_cast<std::size_t>(slot) + 1);
  r.done = [&log, slot](Outcome o) {
    log.outcomes[static_cast<std::size_t>(slot)] = std::move(o);
    log.order.push_back(slot);
  };
  return r;
}

void run(std::vector<Finished>& done) {
  for (auto& f : done) f.done(std::move(f.outcome));
  done.clear();
}

template <class E>
bool holds(const Outcome& o) {
  if (!o.error) return false;
  try {
    std::rethrow_exception(o.error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::string messageOf(const Outcome& o) {
  try {
    std::rethrow_exception(o.error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string drain(Pipeline& p) {
  std::string out(p.output());
  p.wrote(out.size());
  return out;
}

TEST(Pipeline, RequestsQueuedTogetherLeaveInOneWriteAndRepliesMatchInOrder) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  p.push(request({"ECHO", "a"}, log, 0));
  p.push(request({"PING"}, log, 1));
  p.push(request({"INCR", "n"}, log, 2));
  EXPECT_EQ(drain(p), "*2\r\n$4\r\nECHO\r\n$1\r\na\r\n*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n");
  EXPECT_FALSE(p.hasOutput());
  EXPECT_EQ(p.awaiting(), 3u);
  std::vector<Finished> done;
  const std::string replies = "$1\r\na\r\n+PONG\r\n:7\r\n";
  for (char c : replies) p.received(&c, 1, done);  // byte by byte
  run(done);
  ASSERT_EQ(log.order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(log.outcomes[0].reply.str, "a");
  EXPECT_EQ(log.outcomes[1].reply.str, "PONG");
  EXPECT_EQ(log.outcomes[2].reply.integer, 7);
  EXPECT_EQ(p.replies(), 3u);
  EXPECT_EQ(p.awaiting(), 0u);
}

TEST(Pipeline, ErrorRepliesBecomeTheirTypedExceptionsAndTheConnectionGoesOn) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  p.push(request({"GET", "k"}, log, 0));
  p.push(request({"PING"}, log, 1));
  drain(p);
  std::vector<Finished> done;
  const std::string replies = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n+PONG\r\n";
  p.received(replies.data(), replies.size(), done);
  run(done);
  EXPECT_TRUE(holds<ReplyError>(log.outcomes[0])) << messageOf(log.outcomes[0]);
  EXPECT_EQ(log.outcomes[1].reply.str, "PONG");
  EXPECT_FALSE(p.broken());
}

TEST(Pipeline, AWrittenRequestPastItsDeadlineTimesOutAndBreaksTheConnection) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  const SteadyTime t0 = Steady::now();
  p.push(request({"PING"}, log, 0, t0 + milliseconds(100)));
  p.push(request({"PING"}, log, 1, t0 + milliseconds(500)));
  drain(p);
  p.push(request({"PING"}, log, 2, t0 + milliseconds(500)));  // queued, never written
  EXPECT_EQ(p.nextDeadline(), t0 + milliseconds(100));
  std::vector<Finished> done;
  p.expire(t0 + milliseconds(99), done);
  EXPECT_TRUE(done.empty());
  p.expire(t0 + milliseconds(100), done);
  run(done);
  EXPECT_TRUE(holds<TimeoutError>(log.outcomes[0])) << messageOf(log.outcomes[0]);
  EXPECT_TRUE(holds<ClosedError>(log.outcomes[1])) << "written on the same connection: its reply would come late";
  EXPECT_TRUE(p.broken());
  // The late reply to the first request is never matched to anything.
  p.received("+PONG\r\n", 7, done);
  EXPECT_TRUE(done.empty());
  // The request never written goes elsewhere.
  auto rest = p.close(std::make_exception_ptr(ClosedError("closed")), done);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(log.order.size(), 2u);
}

TEST(Pipeline, AQueuedRequestPastItsDeadlineLeavesAloneWithoutBreakingAnything) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  const SteadyTime t0 = Steady::now();
  p.push(request({"PING"}, log, 0, t0 + milliseconds(100)));
  std::vector<Finished> done;
  p.expire(t0 + milliseconds(200), done);
  run(done);
  EXPECT_TRUE(holds<TimeoutError>(log.outcomes[0]));
  EXPECT_FALSE(p.broken());
  EXPECT_FALSE(p.hasOutput());
}

TEST(Pipeline, GarbageFailsTheRequestItAnswersWithProtocolErrorAndTheRestWithIt) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  p.push(request({"PING"}, log, 0));
  p.push(request({"PING"}, log, 1));
  drain(p);
  std::vector<Finished> done;
  p.received("!garbage\r\n", 10, done);
  run(done);
  EXPECT_TRUE(holdsKind(log.outcomes[0].error, ErrorKind::Protocol)) << messageOf(log.outcomes[0]);
  EXPECT_TRUE(holds<IoError>(log.outcomes[1]));
  EXPECT_TRUE(p.broken());
}

TEST(Pipeline, AReplyOverTheLimitsBreaksTheConnectionAtTheHeader) {
  ClientOptions::ReplyLimits limits;
  limits.maxElements = 16;
  Pipeline p(limits, "", "test:1");
  Log log;
  p.push(request({"PING"}, log, 0));
  drain(p);
  std::vector<Finished> done;
  p.received("*2147483647\r\n", 13, done);
  run(done);
  ASSERT_EQ(log.order.size(), 1u);
  EXPECT_TRUE(holdsKind(log.outcomes[0].error, ErrorKind::Protocol));
  EXPECT_NE(messageOf(log.outcomes[0]).find("maxElements"), std::string::npos) << messageOf(log.outcomes[0]);
}

TEST(Pipeline, AReplyToNoRequestIsAProtocolError) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  std::vector<Finished> done;
  p.received("+PONG\r\n", 7, done);
  EXPECT_TRUE(p.broken());
  EXPECT_TRUE(done.empty());
}

TEST(Pipeline, NoScriptLoadsOnceAndResendsEveryFailedRequest) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  for (int i = 0; i < 3; ++i) p.push(scriptRequest(log, i));
  const std::string first = drain(p);
  EXPECT_EQ(first.find("EVALSHA"), first.rfind("EVALSHA") - 2 * (first.size() / 3)) << "three EVALSHAs";
  std::vector<Finished> done;
  const std::string noscript = "-NOSCRIPT No matching script. Please use EVAL.\r\n";
  for (int i = 0; i < 3; ++i) p.received(noscript.data(), noscript.size(), done);
  EXPECT_TRUE(done.empty()) << "nobody fails: the pipeline resends";
  const std::string second = drain(p);
  // One SCRIPT LOAD, then the three requests again.
  EXPECT_EQ(second.find("SCRIPT"), second.rfind("SCRIPT"));
  EXPECT_LT(second.find("SCRIPT"), second.find("EVALSHA"));
  std::size_t evalshas = 0;
  for (auto at = second.find("EVALSHA"); at != std::string::npos; at = second.find("EVALSHA", at + 1)) ++evalshas;
  EXPECT_EQ(evalshas, 3u);
  // The load answers; the first resend meets NOSCRIPT again (flushed in between): sent as EVAL.
  const std::string replies = "$40\r\n" + std::string(kScript.sha1) + "\r\n" + noscript + ":1\r\n:2\r\n";
  p.received(replies.data(), replies.size(), done);
  run(done);
  EXPECT_EQ(log.outcomes[1].reply.integer, 1);
  EXPECT_EQ(log.outcomes[2].reply.integer, 2);
  const std::string third = drain(p);
  EXPECT_EQ(third.find("EVALSHA"), std::string::npos);
  EXPECT_NE(third.find("$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n1\r\n$1\r\nk\r\n$1\r\na\r\n"), std::string::npos)
      << third;
  p.received(":0\r\n", 4, done);
  run(done);
  EXPECT_EQ(log.outcomes[0].reply.integer, 0);
  EXPECT_EQ(log.order, (std::vector<int>{1, 2, 0}));
}

TEST(Pipeline, ANoScriptForAScriptTheServerHadRunIsAReloadEventAndAFirstLoadIsNone) {
  std::vector<Event> events;
  std::vector<const Script*> seen;  // the server's scripts as its connections saw them
  const std::string noscript = "-NOSCRIPT No matching script. Please use EVAL.\r\n";
  const std::string loaded = "$40\r\n" + std::string(kScript.sha1) + "\r\n";
  Log log;
  std::vector<Finished> done;
  {
    Pipeline p(
        ClientOptions::ReplyLimits{}, "", "test:1", [&](const Event& e) { events.push_back(e); }, &seen);
    p.push(scriptRequest(log, 0));
    drain(p);
    p.received(noscript.data(), noscript.size(), done);  // the first load on this server
    EXPECT_TRUE(done.empty());
    drain(p);
    const std::string replies = loaded + ":1\r\n";
    p.received(replies.data(), replies.size(), done);
    run(done);
    EXPECT_TRUE(events.empty()) << "a first load is no event";
  }
  // A new connection to the same server (after a restart): its NOSCRIPT is a reload.
  Pipeline p(
      ClientOptions::ReplyLimits{}, "", "test:1", [&](const Event& e) { events.push_back(e); }, &seen);
  p.push(scriptRequest(log, 1));
  drain(p);
  p.received(noscript.data(), noscript.size(), done);
  ASSERT_EQ(done.size(), 1u) << "the event, as a completion (run outside the connection's lock)";
  EXPECT_TRUE(events.empty()) << "not before the completions run";
  run(done);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::Kind::ScriptReload);
  EXPECT_EQ(events[0].script, "test");
  EXPECT_EQ(events[0].node, "test:1");
  drain(p);
  const std::string replies = loaded + ":2\r\n";
  p.received(replies.data(), replies.size(), done);
  run(done);
  EXPECT_EQ(log.outcomes[1].reply.integer, 2) << "the call itself succeeded";
  EXPECT_EQ(events.size(), 1u);
}

TEST(Pipeline, AFailedGreetingFailsEverythingOnTheConnectionWithItsError) {
  Pipeline p(ClientOptions::ReplyLimits{}, "alice", "test:1");
  Log log;
  Request auth = request({"AUTH", "alice", "wrong"}, log, 0);
  auth.internal = true;
  p.push(std::move(auth));
  p.push(request({"PING"}, log, 1));
  drain(p);
  std::vector<Finished> done;
  const std::string replies = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
  p.received(replies.data(), replies.size(), done);
  run(done);
  EXPECT_TRUE(holds<AuthError>(log.outcomes[0]));
  EXPECT_TRUE(holds<AuthError>(log.outcomes[1])) << messageOf(log.outcomes[1]);
  EXPECT_TRUE(p.broken());
}

TEST(Pipeline, CloseFailsWrittenRequestsAndHandsBackTheOthers) {
  Pipeline p(ClientOptions::ReplyLimits{}, "", "test:1");
  Log log;
  p.push(request({"PING"}, log, 0));
  const std::string big(std::size_t{2} << 20, 'x');
  p.push(request({"SET", "k", big}, log, 1));
  drain(p);
  p.push(request({"PING"}, log, 2));
  std::vector<Finished> done;
  auto rest = p.close(std::make_exception_ptr(ClosedError("reset")), done);
  run(done);
  EXPECT_TRUE(holds<ClosedError>(log.outcomes[0]));
  EXPECT_TRUE(holdsKind(log.outcomes[1].error, ErrorKind::RequestLimit))
      << "a 2 MiB request on a connection the server closed";
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].command, "PING");
}

// Two connections, each request's completion taking one millisecond of a clock the test moves.
// Connection A's head passes its deadline at t0: A breaks, and the 100 requests written behind it
// (due from t0 + 100 ms) fail with it at once. Connection B's head is due at t0 + 5 ms. Run as the
// transport runs them (runCompletions: earliest deadline first, 8 at a time, every connection's
// deadlines checked between slices), B's head times out within a slice of its deadline, and so
// does every other completion. All of A's at once, B's head would wait for the 101 of them.
TEST(Pipeline, CompletionsRunEarliestDeadlineFirstInSlicesSoAnotherConnectionsDeadlineIsNotMissed) {
  constexpr std::size_t kSlice = 8;
  const SteadyTime t0 = Steady::now();  // a base only: `now` below is moved by the test
  SteadyTime now = t0;
  struct Answer {
    SteadyTime deadline;
    SteadyTime at;
    Outcome outcome;
  };
  std::vector<Answer> answers;
  auto timed = [&](SteadyTime deadline) {
    Request r = makeRequest(std::array<std::string_view, 1>{"PING"}.data(), 1);
    r.deadline = deadline;
    r.budget = milliseconds(100);
    r.done = [&answers, &now, deadline](Outcome o) { answers.push_back(Answer{deadline, now, std::move(o)}); };
    return r;
  };
  Pipeline a(ClientOptions::ReplyLimits{}, "", "a:6379");
  Pipeline b(ClientOptions::ReplyLimits{}, "", "b:6379");
  a.push(timed(t0));
  for (int i = 0; i < 100; ++i) a.push(timed(t0 + milliseconds(100 + i)));
  b.push(timed(t0 + milliseconds(5)));
  b.push(timed(t0 + milliseconds(400)));
  drain(a);
  drain(b);

  std::vector<Finished> done;
  a.expire(now, done);
  ASSERT_EQ(done.size(), 101u);
  CompletionQueue queue;
  queue.add(done);
  std::size_t slices = 0;
  runCompletions(
      queue, kSlice,
      [&](std::vector<Finished>& due) {
        if (b.nextDeadline() <= now) b.expire(now, due);
      },
      [&](std::vector<Finished>& slice) {
        ++slices;
        EXPECT_LE(slice.size(), kSlice);
        for (auto& f : slice) {
          now += milliseconds(1);
          f.done(std::move(f.outcome));
        }
      });

  ASSERT_EQ(answers.size(), 103u);
  EXPECT_GE(slices, 103u / kSlice);
  for (const Answer& x : answers) {
    EXPECT_LE(x.at - x.deadline, milliseconds(kSlice))
        << "due at t0 + " << std::chrono::duration_cast<milliseconds>(x.deadline - t0).count()
        << " ms, answered at t0 + " << std::chrono::duration_cast<milliseconds>(x.at - t0).count() << " ms";
  }
  const auto bHead =
      std::find_if(answers.begin(), answers.end(), [&](const Answer& x) { return x.deadline == t0 + milliseconds(5); });
  ASSERT_NE(bHead, answers.end());
  EXPECT_TRUE(holds<TimeoutError>(bHead->outcome)) << messageOf(bHead->outcome);
  // Earliest deadline first: B's head before A's tail, whatever came first.
  for (auto it = std::next(bHead); it != answers.end(); ++it) EXPECT_GE(it->deadline, bHead->deadline);
}

TEST(Pipeline, TheCompletionQueueHandsOutEarliestDeadlinesFirstAndEqualOnesInTheOrderTheyCame) {
  const SteadyTime t0 = Steady::now();
  std::vector<int> order;
  auto finished = [&](int id, SteadyTime deadline) {
    return Finished{[&order, id](const Outcome&) { order.push_back(id); }, Outcome{}, true, deadline};
  };
  CompletionQueue queue;
  std::vector<Finished> in;
  in.push_back(finished(1, t0 + milliseconds(30)));
  in.push_back(finished(2, t0 + milliseconds(10)));
  in.push_back(finished(3, t0 + milliseconds(30)));
  queue.add(in);
  EXPECT_TRUE(in.empty());
  std::vector<Finished> slice;
  queue.take(1, slice);
  ASSERT_EQ(slice.size(), 1u);
  in.push_back(finished(4, t0 + milliseconds(20)));
  in.push_back(finished(5, SteadyTime::max()));  // no deadline (an event): last
  queue.add(in);
  EXPECT_EQ(queue.size(), 4u);
  queue.take(10, slice);
  EXPECT_TRUE(queue.empty());
  for (auto& f : slice) f.done(f.outcome);
  EXPECT_EQ(order, (std::vector<int>{2, 4, 1, 3, 5}));
}

}  // namespace
}  // namespace redlimit::detail
