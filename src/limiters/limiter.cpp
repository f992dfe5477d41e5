#include "redlimit/limiter.hpp"

#include <fmt/format.h>

#include "limiters/completion.hpp"
#include "limiters/future_of.hpp"
#include "limiters/key_layout.hpp"
#include "limiters/keyed_policy.hpp"
#include "limiters/script_core.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {

using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

const detail::Script kGcra{detail::lua::gcra.name, detail::lua::gcra.sha1, detail::lua::gcra.source};
const detail::Script kFixedWindow{detail::lua::fixed_window.name, detail::lua::fixed_window.sha1,
                                  detail::lua::fixed_window.source};
const detail::Script kSmooth{detail::lua::smooth.name, detail::lua::smooth.sha1, detail::lua::smooth.source};

const detail::Script& scriptOf(Policy::Kind kind) {
  switch (kind) {
    case Policy::Kind::Gcra:
    case Policy::Kind::TokenBucket:
      return kGcra;
    case Policy::Kind::FixedWindow:
      return kFixedWindow;
    case Policy::Kind::Smooth:
      return kSmooth;
  }
  return kGcra;
}

// The checked name (made only then: a refused name must not take a place in the metrics registry).
std::string checkedName(std::string name) {
  detail::checkNamespaceName(name, detail::ScriptLimiter::kMaxNameLength);
  return name;
}

}  // namespace

Limiter::Limiter(std::shared_ptr<Client> client, std::string name, Policy policy, LimiterOptions options)
    : policy_(std::move(policy)) {
  const char kind = policy_.packedPolicy().packed.front();
  core_ = std::make_shared<detail::ScriptCore>(std::move(client), checkedName(std::move(name)),
                                               std::move(options.failure), options.monitor, scriptOf(policy_.kind()),
                                               kind, detail::ScriptCore::Records::Namespaced);
  core_->setPolicy(policy_.packedPolicy());
}

std::string Limiter::redisKey(std::string_view key) const { return detail::namespacedKey(core_->name_, key); }

std::string Limiter::recordKey(std::string_view key, const std::string& id) const {
  return core_->recordKey(redisKey(key), id);
}

void Limiter::checkHold() const {
  if (!policy_.canHold()) {
    throw InvalidArgument(fmt::format(
        "redlimit: limiter {}: a smooth policy lends ahead rather than holding, so it has no reserveFor/settle; use "
        "reserve() (its delay) or another policy",
        core_->name_));
  }
}

Decision Limiter::decide(std::string_view key, std::int64_t permits) { return core_->decide(redisKey(key), permits); }

bool Limiter::tryAcquire(std::string_view key, std::int64_t permits) { return decide(key, permits).allowed; }

bool Limiter::tryAcquire(std::string_view key, std::int64_t permits, milliseconds timeout) {
  return core_->tryAcquire(redisKey(key), permits, timeout);
}

microseconds Limiter::acquire(std::string_view key, std::int64_t permits) {
  return core_->acquire(redisKey(key), permits);
}

Reservation Limiter::reserve(std::string_view key, std::int64_t permits, microseconds maxWait) {
  return core_->reserve(redisKey(key), permits, maxWait);
}

Decision Limiter::peek(std::string_view key, std::int64_t permits) { return core_->peek(redisKey(key), permits); }

void Limiter::refund(std::string_view key, std::int64_t permits) {
  if (permits > policy_.maxPermits()) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: permits to refund must be in 0..{}, got {}", core_->name_,
                                      policy_.maxPermits(), permits));
  }
  core_->giveBack(redisKey(key), permits);
  core_->gate_.monitor().refunded(permits);
}

HeldPermits Limiter::reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                                milliseconds recordTtl) {
  checkHold();
  return core_->reserveFor(redisKey(key), permits, id, recordTtl);
}

Settlement Limiter::settle(std::string_view key, const std::string& id, std::int64_t actual) {
  checkHold();
  return core_->settle(redisKey(key), id, actual);
}

Settlement Limiter::cancel(std::string_view key, const std::string& id) { return settle(key, id, 0); }

bool Limiter::deleteKey(std::string_view key) { return core_->deleteKey(redisKey(key)); }

namespace {
// `body(redisKey)` with the checked key, or `done` with the error of a bad one (isolated).
template <class T, class Body>
void withKey(const Limiter& self, std::string_view key, Limiter::Callback<T>& done, Body&& body) {
  std::string redisKey;
  try {
    redisKey = self.redisKey(key);
  } catch (...) {
    detail::isolated(std::move(done), self.monitor(), self.name())(T{}, std::current_exception());
    return;
  }
  body(std::move(redisKey));
}
}  // namespace

void Limiter::decideAsync(std::string_view key, std::int64_t permits, Callback<Decision> done) {
  withKey<Decision>(*this, key, done, [&](std::string k) { core_->decideAsync(k, permits, std::move(done)); });
}

std::future<Decision> Limiter::decideAsync(std::string_view key, std::int64_t permits) {
  return detail::futureOf<Decision>([&](auto done) { decideAsync(key, permits, std::move(done)); });
}

void Limiter::reserveAsync(std::string_view key, std::int64_t permits, microseconds maxWait,
                           Callback<Reservation> done) {
  withKey<Reservation>(*this, key, done,
                       [&](std::string k) { core_->reserveAsync(k, permits, maxWait, std::move(done)); });
}

std::future<Reservation> Limiter::reserveAsync(std::string_view key, std::int64_t permits, microseconds maxWait) {
  return detail::futureOf<Reservation>([&](auto done) { reserveAsync(key, permits, maxWait, std::move(done)); });
}

void Limiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id, milliseconds recordTtl,
                              Callback<HeldPermits> done) {
  try {
    checkHold();
  } catch (...) {
    detail::isolated(std::move(done), monitor(), name())(HeldPermits{}, std::current_exception());
    return;
  }
  withKey<HeldPermits>(*this, key, done,
                       [&](std::string k) { core_->reserveForAsync(k, permits, id, recordTtl, std::move(done)); });
}

std::future<HeldPermits> Limiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                                                  milliseconds recordTtl) {
  return detail::futureOf<HeldPermits>(
      [&](auto done) { reserveForAsync(key, permits, id, recordTtl, std::move(done)); });
}

void Limiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual, Callback<Settlement> done) {
  try {
    checkHold();
  } catch (...) {
    detail::isolated(std::move(done), monitor(), name())(Settlement{}, std::current_exception());
    return;
  }
  withKey<Settlement>(*this, key, done, [&](std::string k) { core_->settleAsync(k, id, actual, std::move(done)); });
}

std::future<Settlement> Limiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual) {
  return detail::futureOf<Settlement>([&](auto done) { settleAsync(key, id, actual, std::move(done)); });
}

const std::string& Limiter::name() const noexcept { return core_->name_; }
const std::shared_ptr<Client>& Limiter::client() const noexcept { return core_->client_; }
FailureStats Limiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& Limiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
