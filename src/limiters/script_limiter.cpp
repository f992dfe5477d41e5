#include "redlimit/detail/script_limiter.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "limiters/future_of.hpp"
#include "limiters/script_core.hpp"
#include "redlimit/detail/deadline.hpp"
#include "limiters/script_helpers.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// --- The handle -------------------------------------------------------------------------------

ScriptLimiter::ScriptLimiter(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
                             const MonitorOptions& monitor, const Script& script, char kind)
    : core_(std::make_shared<ScriptCore>(std::move(client), std::move(name), std::move(failure), monitor, script,
                                         kind)) {}

void ScriptLimiter::sleepFor(microseconds d) const { core_->sleepFor(d); }

Decision ScriptLimiter::decide(std::int64_t permits) { return core_->decide(core_->name_, permits); }

bool ScriptLimiter::tryAcquire(std::int64_t permits) { return decide(permits).allowed; }

bool ScriptLimiter::tryAcquire(std::int64_t permits, milliseconds timeout) {
  return core_->tryAcquire(core_->name_, permits, timeout);
}

void ScriptLimiter::acquire(std::int64_t permits) { (void)core_->acquire(core_->name_, permits); }

Reservation ScriptLimiter::reserve(std::int64_t permits, microseconds maxWait) {
  return core_->reserve(core_->name_, permits, maxWait);
}

Decision ScriptLimiter::peek(std::int64_t permits) { return core_->peek(core_->name_, permits); }

void ScriptLimiter::refund(std::int64_t permits) {
  core_->refund(core_->name_, permits);  // a caller's refund: counted (a segment's give-back is not)
}

void ScriptLimiter::giveBack(std::int64_t permits) { core_->giveBack(core_->name_, permits); }

std::string ScriptLimiter::reservationKey(const std::string& id) const {
  return reservationRecordKey(core_->name_, id);
}

HeldPermits ScriptLimiter::reserveFor(std::int64_t permits, const std::string& id, milliseconds recordTtl) {
  return core_->reserveFor(core_->name_, permits, id, recordTtl);
}

Settlement ScriptLimiter::settle(const std::string& id, std::int64_t actual) {
  return core_->settle(core_->name_, id, actual);
}

void ScriptLimiter::reserveForAsync(std::int64_t permits, const std::string& id, milliseconds recordTtl,
                                    HeldCallback done) {
  core_->reserveForAsync(core_->name_, permits, id, recordTtl, std::move(done));
}

void ScriptLimiter::reserveForAsync(std::int64_t permits, const std::string& id, HeldCallback done) {
  reserveForAsync(permits, id, kDefaultReservationTtl, std::move(done));
}

std::future<HeldPermits> ScriptLimiter::reserveForAsync(std::int64_t permits, const std::string& id,
                                                        milliseconds recordTtl) {
  return futureOf<HeldPermits>([&](auto done) { reserveForAsync(permits, id, recordTtl, std::move(done)); });
}

void ScriptLimiter::settleAsync(const std::string& id, std::int64_t actual, SettleCallback done) {
  core_->settleAsync(core_->name_, id, actual, std::move(done));
}

std::future<Settlement> ScriptLimiter::settleAsync(const std::string& id, std::int64_t actual) {
  return futureOf<Settlement>([&](auto done) { settleAsync(id, actual, std::move(done)); });
}

Settlement ScriptLimiter::cancel(const std::string& id) { return settle(id, 0); }

AcquireResult ScriptLimiter::tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
  return core_->takeUpTo(core_->name_, atLeast, atMost);
}

std::int64_t ScriptLimiter::releaseGrant(const std::string& /*member*/, std::int64_t permits) {
  giveBack(permits);
  return permits;
}

bool ScriptLimiter::decideUnanswered(std::int64_t permits, const std::string& reason) {
  return core_->decideUnanswered(permits, reason);
}

bool ScriptLimiter::deleteLimiter() { return core_->deleteKey(core_->name_); }

bool ScriptLimiter::isExists() { return core_->exists(core_->name_); }

void ScriptLimiter::decideAsync(std::int64_t permits, DecisionCallback done) {
  core_->decideAsync(core_->name_, permits, std::move(done));
}

std::future<Decision> ScriptLimiter::decideAsync(std::int64_t permits) {
  return futureOf<Decision>([&](auto done) { decideAsync(permits, std::move(done)); });
}

void ScriptLimiter::tryAcquireAsync(std::int64_t permits, std::function<void(bool, std::exception_ptr)> done) {
  done = isolated(std::move(done), monitor(), core_->name_);
  decideAsync(permits, [done = std::move(done)](Decision d, std::exception_ptr error) {
    const bool allowed = !error && d.allowed;
    done(allowed, std::move(error));
  });
}

std::future<bool> ScriptLimiter::tryAcquireAsync(std::int64_t permits) {
  return futureOf<bool>([&](auto done) { tryAcquireAsync(permits, std::move(done)); });
}

bool ScriptLimiter::writeConfig(bool onlyIfAbsent, const std::vector<std::string>& config) {
  return core_->writeConfig(
      core_->name_, onlyIfAbsent ? ScriptCore::ConfigWrite::IfAbsent : ScriptCore::ConfigWrite::Restart, config);
}

void ScriptLimiter::writeConfigKeepingState(const std::vector<std::string>& config) {
  (void)core_->writeConfig(core_->name_, ScriptCore::ConfigWrite::KeepState, config);
}

std::vector<std::int64_t> ScriptLimiter::readConfig() {
  Reply r;
  if (const std::shared_ptr<const KeyedPolicy> config = core_->policy()) {
    try {
      r = core_->call(core_->name_, "config", {}, LimiterCall::Resend::IfClosed);
    } catch (const NotInitializedError&) {
      return config->fields;  // the key expired (or was never written): this handle's configuration
    }
  } else {
    r = core_->call(core_->name_, "config", {}, LimiterCall::Resend::IfClosed);
  }
  if (r.type != Reply::Type::Array || r.elements.size() < 3) {
    throw UnexpectedReplyError(fmt::format("redlimit: limiter {}: expected an array from the config operation, got {}",
                                           core_->name_, r.describe()));
  }
  // A handle with a configuration decides with its own, whatever the key holds now.
  if (!configured()) core_->remember(r.elements[0].asInteger(), r.elements[1].asInteger(), r.elements[2].asInteger());
  std::vector<std::int64_t> out;
  for (std::size_t i = 3; i < r.elements.size(); ++i) out.push_back(r.elements[i].asInteger());
  return out;
}

void ScriptLimiter::configure(KeyedPolicy policy) { core_->setPolicy(std::move(policy)); }

bool ScriptLimiter::configured() const noexcept { return core_->configured(); }

std::vector<std::int64_t> ScriptLimiter::ownConfigFields() const {
  const std::shared_ptr<const KeyedPolicy> config = core_->policy();
  return config ? config->fields : std::vector<std::int64_t>{};
}

std::shared_ptr<const KeyedPolicy> ScriptLimiter::policySnapshot() const { return core_->policy(); }

const std::string& ScriptLimiter::getName() const noexcept { return core_->name_; }
char ScriptLimiter::kind() const noexcept { return core_->kind_[0]; }
const std::shared_ptr<Client>& ScriptLimiter::client() const noexcept { return core_->client_; }
FailureStats ScriptLimiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& ScriptLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit::detail
