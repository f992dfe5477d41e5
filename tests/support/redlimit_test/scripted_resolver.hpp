// Test fixture: a NameResolver (the transport's name lookup, replaceable in tests) that sends
// each connection of a pool to a port of the test's choosing, or stalls its lookup: a connect that
// hangs for one connection of a pool and not for the others. Include after
// "transport/connector.hpp" (detail::NameResolver, detail::resolveName).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "redlimit/errors.hpp"
#include "transport/connector.hpp"

namespace redlimit::test {

// A NameResolver whose lookups are answered in turn from `ports` (the last one repeats) with
// 127.0.0.1 and that port, so each connection of a pool can be sent to another peer; a port of 0
// stalls that lookup until release(). The lookup threads share its state, which outlives them.
class ScriptedResolver {
 public:
  explicit ScriptedResolver(std::vector<int> ports) : state_(std::make_shared<State>()) {
    state_->ports = std::move(ports);
  }
  ~ScriptedResolver() { release(); }
  ScriptedResolver(const ScriptedResolver&) = delete;
  ScriptedResolver& operator=(const ScriptedResolver&) = delete;

  [[nodiscard]] detail::NameResolver resolver() const {
    return [s = state_](const std::string& host, int) {
      std::unique_lock<std::mutex> lock(s->m);
      const int port = s->ports[std::min(s->started++, s->ports.size() - 1)];
      ++s->inFlight;
      s->cv.notify_all();
      if (port == 0) s->cv.wait(lock, [&] { return s->released; });
      --s->inFlight;
      if (port == 0) throw IoError("redlimit test: the lookup of " + host + " was released without an answer");
      lock.unlock();
      return detail::resolveName("127.0.0.1", port);
    };
  }
  void release() {
    const std::lock_guard<std::mutex> lock(state_->m);
    state_->released = true;
    state_->cv.notify_all();
  }
  [[nodiscard]] std::size_t inFlight() const {
    const std::lock_guard<std::mutex> lock(state_->m);
    return state_->inFlight;
  }

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv;
    std::vector<int> ports;
    std::size_t started = 0;
    std::size_t inFlight = 0;
    bool released = false;
  };
  std::shared_ptr<State> state_;
};

}  // namespace redlimit::test
