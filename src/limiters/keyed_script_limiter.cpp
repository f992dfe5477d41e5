#include "redlimit/detail/keyed_script_limiter.hpp"

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "limiters/completion.hpp"
#include "limiters/future_of.hpp"
#include "limiters/script_core.hpp"
#include "redlimit/errors.hpp"

namespace redlimit::detail {

using std::chrono::milliseconds;

KeyedScriptLimiter::KeyedScriptLimiter(std::shared_ptr<Client> client, std::string name, FailureOptions failure,
                                       const MonitorOptions& monitor, const Script& script, char kind,
                                       KeyedPolicy policy)
    : core_(
          std::make_shared<ScriptCore>(std::move(client), std::move(name), std::move(failure), monitor, script, kind)) {
  core_->setPolicy(std::move(policy));
}

std::string KeyedScriptLimiter::checkedKey(std::string_view key) const {
  if (key.empty()) throw InvalidArgument(fmt::format("redlimit: {}: the key must not be empty", core_->name_));
  if (key.size() > ScriptLimiter::kMaxNameLength) {
    throw InvalidArgument(fmt::format("redlimit: {}: key is {} bytes; at most {} are allowed", core_->name_, key.size(),
                                      ScriptLimiter::kMaxNameLength));
  }
  checkNotRecordKey(key, "key");
  return std::string(key);
}

Decision KeyedScriptLimiter::decide(std::string_view key, std::int64_t permits) {
  return core_->decide(checkedKey(key), permits);
}

bool KeyedScriptLimiter::tryAcquire(std::string_view key, std::int64_t permits) { return decide(key, permits).allowed; }

Decision KeyedScriptLimiter::peek(std::string_view key, std::int64_t permits) {
  return core_->peek(checkedKey(key), permits);
}

void KeyedScriptLimiter::decideAsync(std::string_view key, std::int64_t permits, DecisionCallback done) {
  std::string checked;
  try {
    checked = checkedKey(key);
  } catch (...) {
    isolated(std::move(done), monitor(), core_->name_)(Decision{}, std::current_exception());
    return;
  }
  core_->decideAsync(checked, permits, std::move(done));
}

std::future<Decision> KeyedScriptLimiter::decideAsync(std::string_view key, std::int64_t permits) {
  return futureOf<Decision>([&](auto done) { decideAsync(key, permits, std::move(done)); });
}

bool KeyedScriptLimiter::deleteKey(std::string_view key) { return core_->deleteKey(checkedKey(key)); }

std::string KeyedScriptLimiter::reservationKey(std::string_view key, const std::string& id) const {
  return reservationRecordKey(checkedKey(key), id);
}

HeldPermits KeyedScriptLimiter::reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                                           milliseconds recordTtl) {
  return core_->reserveFor(checkedKey(key), permits, id, recordTtl);
}

Settlement KeyedScriptLimiter::settle(std::string_view key, const std::string& id, std::int64_t actual) {
  return core_->settle(checkedKey(key), id, actual);
}

Settlement KeyedScriptLimiter::cancel(std::string_view key, const std::string& id) { return settle(key, id, 0); }

void KeyedScriptLimiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                                         milliseconds recordTtl, ScriptLimiter::HeldCallback done) {
  std::string checked;
  try {
    checked = checkedKey(key);
  } catch (...) {
    isolated(std::move(done), monitor(), core_->name_)(HeldPermits{}, std::current_exception());
    return;
  }
  core_->reserveForAsync(checked, permits, id, recordTtl, std::move(done));
}

std::future<HeldPermits> KeyedScriptLimiter::reserveForAsync(std::string_view key, std::int64_t permits,
                                                             const std::string& id, milliseconds recordTtl) {
  return futureOf<HeldPermits>([&](auto done) { reserveForAsync(key, permits, id, recordTtl, std::move(done)); });
}

void KeyedScriptLimiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual,
                                     ScriptLimiter::SettleCallback done) {
  std::string checked;
  try {
    checked = checkedKey(key);
  } catch (...) {
    isolated(std::move(done), monitor(), core_->name_)(Settlement{}, std::current_exception());
    return;
  }
  core_->settleAsync(checked, id, actual, std::move(done));
}

std::future<Settlement> KeyedScriptLimiter::settleAsync(std::string_view key, const std::string& id,
                                                        std::int64_t actual) {
  return futureOf<Settlement>([&](auto done) { settleAsync(key, id, actual, std::move(done)); });
}

const std::string& KeyedScriptLimiter::getName() const noexcept { return core_->name_; }
const std::shared_ptr<Client>& KeyedScriptLimiter::client() const noexcept { return core_->client_; }
FailureStats KeyedScriptLimiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& KeyedScriptLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit::detail
