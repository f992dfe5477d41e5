#include "redlimit/concurrency_limiter.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "config/config_checks.hpp"
#include "limiters/future_of.hpp"
#include "limiters/lease_core.hpp"
#include "limiters/lease_id.hpp"

namespace redlimit {

using std::chrono::milliseconds;

ConcurrencyLimiter::ConcurrencyLimiter(std::shared_ptr<Client> client, std::string name,
                                       const ConcurrencyConfig& config, ConcurrencyLimiterOptions options)
    : core_(std::make_shared<detail::LeaseCore>(std::move(client), std::move(name), config, std::move(options.failure),
                                                options.monitor)) {}

void ConcurrencyLimiter::validateConfig(const ConcurrencyConfig& config) {
  detail::checkCount("limit", config.limit, 1, kMaxLimit);
  detail::checkLeaseTtl(config.leaseTtl);
}

LeaseDecision ConcurrencyLimiter::decide() { return decide(core_->config_.leaseTtl); }

LeaseDecision ConcurrencyLimiter::decide(milliseconds leaseTtl) { return core_->acquire(core_->name_, leaseTtl); }

void ConcurrencyLimiter::decideAsync(LeaseCallback done) { decideAsync(core_->config_.leaseTtl, std::move(done)); }

void ConcurrencyLimiter::decideAsync(milliseconds leaseTtl, LeaseCallback done) {
  core_->acquireAsync(core_->name_, leaseTtl, std::move(done));
}

std::future<LeaseDecision> ConcurrencyLimiter::decideAsync(milliseconds leaseTtl) {
  return detail::futureOf<LeaseDecision>([&](auto done) { decideAsync(leaseTtl, std::move(done)); });
}

std::future<LeaseDecision> ConcurrencyLimiter::decideAsync() { return decideAsync(core_->config_.leaseTtl); }

std::optional<Lease> ConcurrencyLimiter::tryAcquire() { return decide().lease; }

std::optional<Lease> ConcurrencyLimiter::tryAcquire(milliseconds leaseTtl) { return decide(leaseTtl).lease; }

bool ConcurrencyLimiter::renew(Lease& lease) { return renew(lease, core_->config_.leaseTtl); }

bool ConcurrencyLimiter::renew(Lease& lease, milliseconds leaseTtl) {
  return core_->renew(core_->name_, lease, leaseTtl);
}

bool ConcurrencyLimiter::release(const Lease& lease) { return core_->release(core_->name_, lease); }

void ConcurrencyLimiter::renewAsync(Lease lease, RenewCallback done) {
  renewAsync(std::move(lease), core_->config_.leaseTtl, std::move(done));
}

void ConcurrencyLimiter::renewAsync(Lease lease, milliseconds leaseTtl, RenewCallback done) {
  core_->renewAsync(core_->name_, std::move(lease), leaseTtl, std::move(done));
}

std::future<std::optional<Lease>> ConcurrencyLimiter::renewAsync(Lease lease) {
  return renewAsync(std::move(lease), core_->config_.leaseTtl);
}

std::future<std::optional<Lease>> ConcurrencyLimiter::renewAsync(Lease lease, milliseconds leaseTtl) {
  return detail::futureOf<std::optional<Lease>>(
      [&](auto done) { renewAsync(std::move(lease), leaseTtl, RenewCallback(std::move(done))); });
}

void ConcurrencyLimiter::releaseAsync(const Lease& lease, ReleaseCallback done) {
  core_->releaseAsync(core_->name_, lease, std::move(done));
}

std::future<bool> ConcurrencyLimiter::releaseAsync(const Lease& lease) {
  return detail::futureOf<bool>([&](auto done) { releaseAsync(lease, ReleaseCallback(std::move(done))); });
}

std::int64_t ConcurrencyLimiter::held() { return core_->held(core_->name_); }

std::int64_t ConcurrencyLimiter::available() { return std::max<std::int64_t>(0, core_->config_.limit - held()); }

bool ConcurrencyLimiter::deleteLimiter() { return core_->deleteKey(core_->name_); }

const std::string& ConcurrencyLimiter::getName() const noexcept { return core_->name_; }
const ConcurrencyConfig& ConcurrencyLimiter::config() const noexcept { return core_->config_; }
const std::shared_ptr<Client>& ConcurrencyLimiter::client() const noexcept { return core_->client_; }
FailureStats ConcurrencyLimiter::failureStats() const { return core_->gate_.stats(); }
const LimiterMonitor& ConcurrencyLimiter::monitor() const noexcept { return core_->gate_.monitor(); }

}  // namespace redlimit
