// Private helpers of the cluster and sentinel harnesses (redis_cluster.cpp,
// redis_sentinel_group.cpp): commands to one RedisServer and polling with a deadline.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "redlimit_test/raw_command.hpp"
#include "redlimit_test/redis_server.hpp"

namespace redlimit::test::harness {

using Clock = std::chrono::steady_clock;

inline std::string nodeName(const RedisServer& s) { return "server at port " + std::to_string(s.port()); }

inline std::string msText(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

/// One command to `s` (after AUTH <password> if one is given); an error reply is returned.
inline RawReply ask(const RedisServer& s, const std::vector<std::string>& argv, const std::string& password = {}) {
  return rawCommand(s.host(), s.port(), argv, std::chrono::milliseconds(2000), password);
}

/// One command to `s` (after AUTH <password> if one is given); an error reply is thrown as
/// std::runtime_error.
inline RawReply call(const RedisServer& s, const std::vector<std::string>& argv, const std::string& password = {}) {
  RawReply r = ask(s, argv, password);
  if (r.isError()) {
    std::string command;
    for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
    throw std::runtime_error(nodeName(s) + " refused `" + command + "`: " + r.str);
  }
  return r;
}

/// Calls `step` every 20 ms until it returns "" (done) or `deadline` passes, at least once. A step
/// that throws std::runtime_error (a server not answering) is not done. Returns the last message.
template <class Step>
std::string pollUntil(Clock::time_point deadline, Step step) {
  for (;;) {
    std::string last;
    try {
      last = step();
    } catch (const std::runtime_error& e) {
      last = e.what();
    }
    if (last.empty() || Clock::now() >= deadline) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace redlimit::test::harness
