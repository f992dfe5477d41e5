// redlimit — a concurrency limit over any number of keys (lua/concurrency.lua): at most `limit`
// leases held at once per key, each with a TTL. Every operation takes the key per call, through the
// call protocol; Limiter under Policy::concurrency is its face.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "limiters/limiter_call.hpp"
#include "limiters/permit_core.hpp"
#include "limiters/script_call.hpp"
#include "redlimit/decision.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/detail/failure_gate.hpp"

namespace redlimit::detail {

class LeaseCore : public KeyCore, public std::enable_shared_from_this<LeaseCore> {
 public:
  using LeaseDone = std::function<void(LeaseDecision, std::exception_ptr)>;
  using RenewDone = std::function<void(std::optional<Lease>, std::exception_ptr)>;
  using ReleaseDone = std::function<void(bool, std::exception_ptr)>;

  /// The limit and lease TTL of `policy`, a concurrency policy (checked when it was made). Sends
  /// nothing. Throws InvalidArgument for a null client, a bad name or failure options.
  LeaseCore(std::shared_ptr<Client> client, std::string name, const Policy& policy, FailureOptions failure,
            const LimiterMonitor::Options& monitor);

  /// A lease of `key` for `ttl` if fewer than the limit are held (the failure gate first: an
  /// outage is the failure policy's), counted (shadow mode: a denial let through with a lease
  /// Redis does not hold). Sent again after a closed connection with the same lease id (a live
  /// lease with that id is granted again, not added).
  LeaseDecision acquire(const std::string& key, std::chrono::milliseconds ttl);
  /// acquire() without waiting; `done` isolated, once.
  void acquireAsync(const std::string& key, std::chrono::milliseconds ttl, LeaseDone done);
  /// Extends `lease` of `key` to `ttl` from now; false when it was no longer held.
  bool renew(const std::string& key, Lease& lease, std::chrono::milliseconds ttl);
  void renewAsync(const std::string& key, Lease lease, std::chrono::milliseconds ttl, RenewDone done);
  /// Gives `lease` of `key` back; false when it was no longer held.
  bool release(const std::string& key, const Lease& lease);
  void releaseAsync(const std::string& key, const Lease& lease, ReleaseDone done);
  /// The leases of `key` live now.
  std::int64_t held(const std::string& key);
  void heldAsync(const std::string& key, std::function<void(std::int64_t, std::exception_ptr)> done);
  /// DEL of `key` (not sent again: a second would answer 0), and EXISTS (sent again).
  bool deleteKey(const std::string& key) override;
  void deleteKeyAsync(const std::string& key, ReleaseDone done) override;
  bool exists(const std::string& key) override;
  void existsAsync(const std::string& key, std::function<void(bool, std::exception_ptr)> done) override;
  [[nodiscard]] const std::string& coreName() const noexcept override { return name_; }
  [[nodiscard]] const std::shared_ptr<Client>& coreClient() const noexcept override { return client_; }
  [[nodiscard]] const FailureGate& coreGate() const noexcept override { return gate_; }

  std::shared_ptr<Client> client_;
  std::string name_;
  std::int64_t limit_;                  // places per key
  std::chrono::milliseconds leaseTtl_;  // a lease's TTL when the call gives none
  FailureGate gate_;
  std::chrono::milliseconds callBound_{0};

 private:
  ScriptRequest request(const std::string& key, std::string_view op, std::vector<std::string> rest) const;
  LimiterCall::Params decision() const;
  Reply call(const std::string& key, std::string_view op, std::vector<std::string> rest);
  template <class Out, class Parse>
  void callAsync(const std::string& key, std::string_view op, std::vector<std::string> rest, Parse parse,
                 std::function<void(Out, std::exception_ptr)> done);
  LeaseDecision byPolicy(bool allowed) const;
};

}  // namespace redlimit::detail
