// redlimit — what a Limiter asks of its core, on a Redis key. Every core (ScriptCore, LeaseCore) is
// a KeyCore: the key operations and what names the limiter. A permit policy's core (ScriptCore:
// GCRA, token bucket, fixed window, smooth, calendar) is a PermitCore. The waiting operations
// (tryAcquire with a timeout, acquire, reserve) and the stored configuration are ScriptCore's
// beyond it; the lease operations LeaseCore's.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "redlimit/decision.hpp"
#include "redlimit/settlement.hpp"

namespace redlimit {
class Client;
}  // namespace redlimit

namespace redlimit::detail {

class FailureGate;

class KeyCore {
 public:
  template <class T>
  using Done = std::function<void(T, std::exception_ptr)>;

  KeyCore() = default;
  KeyCore(const KeyCore&) = delete;
  KeyCore& operator=(const KeyCore&) = delete;
  virtual ~KeyCore() = default;

  /// DEL of `key` (not sent again: a second would answer 0), EXISTS (sent again); `done` isolated.
  virtual bool deleteKey(const std::string& key) = 0;
  virtual void deleteKeyAsync(const std::string& key, Done<bool> done) = 0;
  virtual bool exists(const std::string& key) = 0;
  virtual void existsAsync(const std::string& key, Done<bool> done) = 0;

  [[nodiscard]] virtual const std::string& coreName() const noexcept = 0;
  [[nodiscard]] virtual const std::shared_ptr<Client>& coreClient() const noexcept = 0;
  [[nodiscard]] virtual const FailureGate& coreGate() const noexcept = 0;
};

class PermitCore : public KeyCore {
 public:
  // The deciding operations (the failure gate first; an outage is the failure policy's), counted.
  virtual Decision decide(const std::string& key, std::int64_t permits) = 0;
  virtual void decideAsync(const std::string& key, std::int64_t permits, Done<Decision> done) = 0;
  virtual Decision reserveFor(const std::string& key, std::int64_t permits, const std::string& id,
                              std::chrono::milliseconds recordTtl) = 0;
  virtual void reserveForAsync(const std::string& key, std::int64_t permits, const std::string& id,
                               std::chrono::milliseconds recordTtl, Done<Decision> done) = 0;

  // The others: their IoError reaches the caller. Every async form's `done` is isolated, once.
  virtual Decision peek(const std::string& key, std::int64_t permits) = 0;
  virtual void peekAsync(const std::string& key, std::int64_t permits, Done<Decision> done) = 0;
  /// Gives `permits` back to `key`, counted (LimiterMetrics::refunded); never sent again.
  virtual void refund(const std::string& key, std::int64_t permits) = 0;
  virtual void refundAsync(const std::string& key, std::int64_t permits, Done<bool> done) = 0;
  virtual Settlement settle(const std::string& key, const std::string& id, std::int64_t actual) = 0;
  virtual void settleAsync(const std::string& key, const std::string& id, std::int64_t actual,
                           Done<Settlement> done) = 0;
  [[nodiscard]] virtual std::string recordKey(const std::string& key, const std::string& id) const = 0;
};

}  // namespace redlimit::detail
