#include "redlimit/limiter.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

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

detail::Script scriptFrom(const detail::lua::EmbeddedScript& s) { return {s.name, s.sha1, s.source}; }

// The script of a policy of `kind`: one object for the program, as ScriptCore requires (the Client
// keeps pointers to the scripts its requests ran).
const detail::Script& scriptOf(Policy::Kind kind) {
  static const detail::Script gcra = scriptFrom(detail::lua::gcra), window = scriptFrom(detail::lua::fixed_window),
                              smooth = scriptFrom(detail::lua::smooth),
                              calendar = scriptFrom(detail::lua::calendar_quota),
                              concurrency = scriptFrom(detail::lua::concurrency),
                              sliding = scriptFrom(detail::lua::sliding_window);
  switch (kind) {
    case Policy::Kind::Gcra:
    case Policy::Kind::TokenBucket:
      return gcra;
    case Policy::Kind::FixedWindow:
      return window;
    case Policy::Kind::SlidingWindow:
      return sliding;
    case Policy::Kind::Smooth:
      return smooth;
    case Policy::Kind::Calendar:
      return calendar;
    case Policy::Kind::Concurrency:
      return concurrency;
  }
  return gcra;
}

// The checked name (made only then: a refused name must not take a place in the metrics registry).
std::string checkedName(std::string name) {
  detail::checkNamespaceName(name, detail::kMaxNameLength);
  return name;
}

// The script's "set" arguments for `policy`: its fields (lua/gcra.lua, fixed_window.lua,
// smooth.lua), and for GCRA and the token bucket the permits a new key starts with (all).
std::vector<std::string> configArgs(const detail::KeyedPolicy& policy) {
  std::vector<std::string> out;
  for (const std::int64_t f : policy.fields) out.push_back(fmt::to_string(f));
  const char kind = policy.packed.front();
  if (kind == 'G' || kind == 'T') out.push_back(fmt::to_string(policy.limit));
  return out;
}

}  // namespace

Limiter::Limiter(std::shared_ptr<Client> client, std::string name, Policy policy, Limiter::Options options)
    : policy_(std::move(policy)) {
  // The kind the script checks: a concurrency limit's 'C' (its packed form is multi.lua's
  // "limit:ttl"), else the packed configuration's first byte (a calendar quota's: 'Q').
  const char kind = policy_.givesLeases() ? 'C' : policy_.packedPolicy().packed.front();
  detail::checkDenyCacheKeys(options.denyCacheKeys, name);  // before the name takes a metrics entry
  // A concurrency limit's denial is not remembered: its retryAfter (the soonest lease's expiry)
  // comes sooner with any release, the norm for leases.
  const std::size_t denyCacheKeys = policy_.givesLeases() ? 0 : options.denyCacheKeys;
  core_ = std::make_shared<detail::ScriptCore>(
      std::move(client), checkedName(std::move(name)), std::move(options.failure), options.monitor,
      &scriptOf(policy_.kind()), kind, policy_.isStored() ? nullptr : policy_.packed_,  // stored: each key's own
      denyCacheKeys);
}

std::string Limiter::redisKey(std::string_view key) const { return detail::namespacedKey(name(), key); }

std::string Limiter::recordKey(std::string_view key, const std::string& id) const {
  return detail::namespacedRecordKey(holdKey("recordKey", key), id);
}

std::string Limiter::permitKey(std::string_view what, std::string_view key) const {
  if (policy_.givesLeases()) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: {} takes permits, but its concurrency policy gives "
                    "leases: use acquireLease, renew and release",
                    name(), what));
  }
  return redisKey(key);
}

// Under a concurrency policy, permitKey's refusal comes first (as in holdKey and refundKey).
std::string Limiter::waitKey(std::string_view what, std::string_view key) const {
  if (!policy_.givesLeases() && !policy_.canWait()) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: {}, so it has no {}; use decide and its retryAfter",
                                      name(), detail::whyNoWait(policy_.kind()), what));
  }
  return permitKey(what, key);
}

std::string Limiter::holdKey(std::string_view what, std::string_view key) const {
  if (!policy_.givesLeases() && !policy_.canHold()) {
    throw InvalidArgument(fmt::format(
        "redlimit: limiter {}: a smooth policy lends ahead rather than holding, so it has no {}; use reserve() "
        "(its delay) or another policy",
        name(), what));
  }
  return permitKey(what, key);
}

std::string Limiter::refundKey(std::string_view what, std::string_view key, std::int64_t permits) const {
  const std::int64_t most = policy_.isStored() ? detail::kMaxPermits : policy_.maxPermits();
  if (!policy_.givesLeases() && (permits < 0 || permits > most)) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: permits to refund must be in 0..{}, got {}", name(), most, permits));
  }
  return permitKey(what, key);
}

std::string Limiter::leaseKey(std::string_view what, std::string_view key) const {
  if (!policy_.givesLeases()) {
    throw InvalidArgument(fmt::format(
        "redlimit: limiter {}: {} works on leases, which only a concurrency policy gives (Policy::concurrency)", name(),
        what));
  }
  return redisKey(key);
}

Decision Limiter::decide(std::string_view key, std::int64_t permits) {
  return core_->decide(key, permits, [&] { return permitKey("decide", key); });
}

bool Limiter::tryAcquire(std::string_view key, std::int64_t permits) { return decide(key, permits).allowed; }

bool Limiter::tryAcquire(std::string_view key, std::int64_t permits, milliseconds timeout) {
  const std::string k = waitKey("tryAcquire with a timeout", key);
  return detail::tryAcquireWithin(core_->gate_, permits, timeout, core_->taking(k, permits));
}

microseconds Limiter::acquire(std::string_view key, std::int64_t permits) {
  const std::string k = waitKey("acquire", key);
  return detail::acquireWaiting(core_->gate_, permits, core_->taking(k, permits));
}

Decision Limiter::reserve(std::string_view key, std::int64_t permits, microseconds maxWait) {
  return core_->run(core_->takeOp(waitKey("reserve", key), permits, maxWait, true));
}

Decision Limiter::peek(std::string_view key, std::int64_t permits) {
  return core_->run(core_->peekOp(permitKey("peek", key), permits));
}

void Limiter::refund(std::string_view key, std::int64_t permits) {
  const detail::ForgetAfter forget(*core_->denials_, key);
  core_->giveBack(refundKey("refund", key, permits), permits, true);
}

Decision Limiter::reserveFor(std::string_view key, std::int64_t permits, const std::string& id,
                             milliseconds recordTtl) {
  return core_->run(core_->reserveForOp(holdKey("reserveFor", key), permits, id, recordTtl));
}

Settlement Limiter::settle(std::string_view key, const std::string& id, std::int64_t actual) {
  const detail::ForgetAfter forget(*core_->denials_, key);
  return core_->run(core_->settleOp(holdKey("settle", key), id, actual));
}

Settlement Limiter::cancel(std::string_view key, const std::string& id) { return settle(key, id, 0); }

bool Limiter::deleteKey(std::string_view key) {
  const detail::ForgetAfter forget(*core_->denials_, key);
  return detail::keyCommand(*core_, detail::kDeleteKey, redisKey(key));
}

void Limiter::checkStored(std::string_view what) const {
  if (!policy_.isStored()) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: {} writes a configuration into a key, but this limiter's policy travels "
                    "in every call; make it Policy::...stored() to keep it in Redis",
                    name(), what));
  }
}

bool Limiter::trySetPolicy(std::string_view key) {
  checkStored("trySetPolicy");
  const detail::ForgetAfter forget(*core_->denials_, key);
  return core_->writeConfig(redisKey(key), detail::ScriptCore::ConfigWrite::IfAbsent,
                            configArgs(policy_.packedPolicy()));
}

void Limiter::setPolicy(std::string_view key, const Policy& policy) {
  checkStored("setPolicy");
  if (policy.kind() != policy_.kind() || !policy.isStored()) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter {}: setPolicy takes a stored policy of the limiter's own algorithm", name()));
  }
  const detail::ForgetAfter forget(*core_->denials_, key);
  (void)core_->writeConfig(redisKey(key), detail::ScriptCore::ConfigWrite::KeepState,
                           configArgs(policy.packedPolicy()));
}

bool Limiter::exists(std::string_view key) { return detail::keyCommand(*core_, detail::kKeyExists, redisKey(key)); }

LeaseDecision Limiter::acquireLease(std::string_view key) { return acquireLease(key, policy_.leaseTtl()); }

LeaseDecision Limiter::acquireLease(std::string_view key, milliseconds leaseTtl) {
  return core_->run(core_->acquireOp(leaseKey("acquireLease", key), leaseTtl));
}

bool Limiter::renew(std::string_view key, Lease& lease) { return renew(key, lease, policy_.leaseTtl()); }

bool Limiter::renew(std::string_view key, Lease& lease, milliseconds leaseTtl) {
  return detail::renewedTo(lease, core_->run(core_->renewOp(leaseKey("renew", key), lease, leaseTtl)));
}

bool Limiter::release(std::string_view key, const Lease& lease) {
  return core_->run(core_->releaseOp(leaseKey("release", key), lease));
}

std::int64_t Limiter::held(std::string_view key) { return core_->run(core_->heldOp(leaseKey("held", key))); }

// The ...Async forms make their key inside the op's make(): the policy's refusal and a bad key
// reach `done` at once, as the op's own checks do (runOpAsync).

void Limiter::decideAsync(std::string_view key, std::int64_t permits, Callback<Decision> done) {
  core_->decideAsync(
      key, permits, [&] { return permitKey("decideAsync", key); }, std::move(done));
}

std::future<Decision> Limiter::decideAsync(std::string_view key, std::int64_t permits) {
  return detail::futureOf<Decision>([&](auto done) { decideAsync(key, permits, std::move(done)); });
}

void Limiter::reserveAsync(std::string_view key, std::int64_t permits, microseconds maxWait, Callback<Decision> done) {
  core_->runAsync([&] { return core_->takeOp(waitKey("reserveAsync", key), permits, maxWait, true); }, std::move(done));
}

std::future<Decision> Limiter::reserveAsync(std::string_view key, std::int64_t permits, microseconds maxWait) {
  return detail::futureOf<Decision>([&](auto done) { reserveAsync(key, permits, maxWait, std::move(done)); });
}

void Limiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id, milliseconds recordTtl,
                              Callback<Decision> done) {
  core_->runAsync([&] { return core_->reserveForOp(holdKey("reserveForAsync", key), permits, id, recordTtl); },
                  std::move(done));
}

std::future<Decision> Limiter::reserveForAsync(std::string_view key, std::int64_t permits, const std::string& id,
                                               milliseconds recordTtl) {
  return detail::futureOf<Decision>([&](auto done) { reserveForAsync(key, permits, id, recordTtl, std::move(done)); });
}

void Limiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual, Callback<Settlement> done) {
  core_->runAsync([&] { return core_->settleOp(holdKey("settleAsync", key), id, actual); },
                  detail::forgettingFirst(core_->denials_, key, std::move(done)));
}

std::future<Settlement> Limiter::settleAsync(std::string_view key, const std::string& id, std::int64_t actual) {
  return detail::futureOf<Settlement>([&](auto done) { settleAsync(key, id, actual, std::move(done)); });
}

void Limiter::peekAsync(std::string_view key, std::int64_t permits, Callback<Decision> done) {
  core_->runAsync([&] { return core_->peekOp(permitKey("peekAsync", key), permits); }, std::move(done));
}

std::future<Decision> Limiter::peekAsync(std::string_view key, std::int64_t permits) {
  return detail::futureOf<Decision>([&](auto done) { peekAsync(key, permits, std::move(done)); });
}

void Limiter::refundAsync(std::string_view key, std::int64_t permits, Callback<bool> done) {
  core_->refundAsync([&] { return refundKey("refundAsync", key, permits); }, permits,
                     detail::forgettingFirst(core_->denials_, key, std::move(done)));
}

std::future<bool> Limiter::refundAsync(std::string_view key, std::int64_t permits) {
  return detail::futureOf<bool>([&](auto done) { refundAsync(key, permits, std::move(done)); });
}

void Limiter::deleteKeyAsync(std::string_view key, Callback<bool> done) {
  core_->keyAsync(
      detail::kDeleteKey, [&] { return redisKey(key); },
      detail::forgettingFirst(core_->denials_, key, std::move(done)));
}

std::future<bool> Limiter::deleteKeyAsync(std::string_view key) {
  return detail::futureOf<bool>([&](auto done) { deleteKeyAsync(key, std::move(done)); });
}

void Limiter::existsAsync(std::string_view key, Callback<bool> done) {
  core_->keyAsync(
      detail::kKeyExists, [&] { return redisKey(key); }, std::move(done));
}

std::future<bool> Limiter::existsAsync(std::string_view key) {
  return detail::futureOf<bool>([&](auto done) { existsAsync(key, std::move(done)); });
}

void Limiter::heldAsync(std::string_view key, Callback<std::int64_t> done) {
  core_->runAsync([&] { return core_->heldOp(leaseKey("heldAsync", key)); }, std::move(done));
}

std::future<std::int64_t> Limiter::heldAsync(std::string_view key) {
  return detail::futureOf<std::int64_t>([&](auto done) { heldAsync(key, std::move(done)); });
}

void Limiter::acquireLeaseAsync(std::string_view key, Callback<LeaseDecision> done) {
  acquireLeaseAsync(key, policy_.leaseTtl(), std::move(done));
}

void Limiter::acquireLeaseAsync(std::string_view key, milliseconds leaseTtl, Callback<LeaseDecision> done) {
  core_->runAsync([&] { return core_->acquireOp(leaseKey("acquireLeaseAsync", key), leaseTtl); }, std::move(done));
}

std::future<LeaseDecision> Limiter::acquireLeaseAsync(std::string_view key) {
  return acquireLeaseAsync(key, policy_.leaseTtl());
}

std::future<LeaseDecision> Limiter::acquireLeaseAsync(std::string_view key, milliseconds leaseTtl) {
  return detail::futureOf<LeaseDecision>([&](auto done) { acquireLeaseAsync(key, leaseTtl, std::move(done)); });
}

void Limiter::renewAsync(std::string_view key, Lease lease, Callback<std::optional<Lease>> done) {
  renewAsync(key, std::move(lease), policy_.leaseTtl(), std::move(done));
}

void Limiter::renewAsync(std::string_view key, Lease lease, milliseconds leaseTtl,
                         Callback<std::optional<Lease>> done) {
  core_->runAsync([&] { return core_->renewOp(leaseKey("renewAsync", key), lease, leaseTtl); }, std::move(done));
}

std::future<std::optional<Lease>> Limiter::renewAsync(std::string_view key, Lease lease) {
  return renewAsync(key, std::move(lease), policy_.leaseTtl());
}

std::future<std::optional<Lease>> Limiter::renewAsync(std::string_view key, Lease lease, milliseconds leaseTtl) {
  return detail::futureOf<std::optional<Lease>>(
      [&](auto done) { renewAsync(key, std::move(lease), leaseTtl, std::move(done)); });
}

void Limiter::releaseAsync(std::string_view key, const Lease& lease, Callback<bool> done) {
  core_->runAsync([&] { return core_->releaseOp(leaseKey("releaseAsync", key), lease); }, std::move(done));
}

std::future<bool> Limiter::releaseAsync(std::string_view key, const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(key, lease, std::move(done)); });
}

const std::string& Limiter::name() const noexcept { return core_->name_; }
const std::shared_ptr<Client>& Limiter::client() const noexcept { return core_->client_; }
FailureStats Limiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& Limiter::monitor() const noexcept { return core_->gate_.monitor(); }

// --- The segment cache's access ------------------------------------------------------------------

namespace detail {

void SegmentAccess<Limiter>::check(const Limiter& source, const std::string& key) {
  const Policy& policy = source.policy();
  const auto refuse = [&](std::string_view why) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: a SegmentedRateLimiter cannot take segments from it: {}",
                                      source.name(), why));
  };
  if (policy.givesLeases()) refuse("its concurrency policy gives leases, not permits; use acquireLease and release");
  if (policy.kind() == Policy::Kind::Calendar) {
    refuse(
        "a calendar quota's permits come back only when its window ends (up to a month), longer than a segment "
        "may live; call decide on the limiter itself");
  }
  if (policy.isStored()) {
    refuse(
        "a stored policy's rate is each key's own and may be changed by any process while a segment is held; use "
        "a policy sent with every call (without stored())");
  }
  (void)source.redisKey(key);  // InvalidArgument for a bad key
}

LimiterMonitor SegmentAccess<Limiter>::monitor(const Limiter& source) { return source.monitor(); }

AcquireResult SegmentAccess<Limiter>::tryAcquireUpTo(Limiter& source, const std::string& key, std::int64_t atLeast,
                                                     std::int64_t atMost) {
  return source.core_->takeUpTo(source.redisKey(key), atLeast, atMost);
}

std::optional<std::int64_t> SegmentAccess<Limiter>::releaseGrantBestEffort(Limiter& source, const std::string& key,
                                                                           const std::string& /*member*/,
                                                                           std::int64_t permits) {
  if (permits <= 0) return 0;
  if (!source.client()->admitBestEffort()) return std::nullopt;
  const ForgetAfter forget(*source.core_->denials_, key);
  source.core_->giveBack(source.redisKey(key), permits);  // a segment's give-back, not a caller's refund
  return permits;
}

bool SegmentAccess<Limiter>::decideUnanswered(Limiter& source, const std::string& /*key*/, std::int64_t permits,
                                              const std::string& reason) {
  return source.core_->decideUnanswered(permits, reason);
}

}  // namespace detail

}  // namespace redlimit
