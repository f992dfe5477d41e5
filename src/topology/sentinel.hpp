// redlimit — the primary a group of Redis Sentinels names, behind the Runner interface: found with
// SENTINEL get-master-addr-by-name and checked with ROLE, followed across failovers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/options.hpp"
#include "transport/runner.hpp"
#include "transport/transport.hpp"

namespace redlimit::detail {

/// What a SentinelRunner did, for tests.
struct SentinelCounters {
  std::uint64_t discoveries = 0;    // times a primary was found (and checked with ROLE)
  std::uint64_t switches = 0;       // times the primary changed address after the first
  std::uint64_t announcements = 0;  // +switch-master messages received for our primary
  ClientOptions::Node primary;      // the primary in use now (empty host: none found yet)
};

/// Sends every request to the primary that ClientOptions::Sentinel::sentinels name for primaryName.
///   - Finding it: each sentinel in turn is asked SENTINEL get-master-addr-by-name; the address it
///     gives is accepted once the server there answers ROLE with "master". This runs on a
///     background thread: at start, when a +switch-master message for the primary arrives (a
///     second thread stays subscribed to one sentinel), and at most every 200 ms after a request
///     to the primary fails with a transport error or a READONLY / MASTERDOWN answer.
///   - Requests sent before any primary is known wait for it, within their own deadline; but
///     when no primary can be found because a login is refused (every sentinel that answered
///     refused ClientOptions::Sentinel' login, or a primary they named refused ClientOptions::Connection'), they
///     fail at once with an AuthError: configuration, never an outage a policy decides.
///   - A request the old primary could not run (gone, or demoted: READONLY) ends with an IoError
///     (IoError of kind Unavailable for READONLY): an outage the limiter's failure policy decides, never the
///     configuration error READONLY means for a fixed address. The next requests go to the new
///     primary as soon as it is found.
///   - On a switch the old primary's transport is shut down and released (its connections, I/O
///     thread and descriptors); what was still on it ends with ClosedError saying the primary
///     moved and that a retry goes to the new one.
/// Thread-safe.
class SentinelRunner final : public Runner, public std::enable_shared_from_this<SentinelRunner> {
 public:
  /// Checks the options and starts looking for the primary (in the background).
  static std::shared_ptr<SentinelRunner> start(const ClientOptions& options);
  ~SentinelRunner() override;
  SentinelRunner(const SentinelRunner&) = delete;
  SentinelRunner& operator=(const SentinelRunner&) = delete;

  void send(Request request, int slot) override;
  [[nodiscard]] Outcome sendAndWait(Request request, int slot) override;
  void shutdown() noexcept override;
  void abandonAfterFork() noexcept REDLIMIT_NO_THREAD_SAFETY_ANALYSIS override;  // a forked child: no lock is taken
  [[nodiscard]] TransportCounters counters() const override;
  [[nodiscard]] bool onIoThread() const noexcept override { return currentIoRunner() == this; }

  [[nodiscard]] SentinelCounters sentinelCounters() const;

 private:
  explicit SentinelRunner(const ClientOptions& options);
  void submitTo(const std::shared_ptr<Transport>& primary, std::uint64_t generation, Request request);
  // A demoted primary's READONLY / MASTERDOWN (a ConfigurationError (Replica)) as the outage it is here.
  std::exception_ptr demotedError(const std::exception_ptr& error) const;
  // A ClosedError from the transport of primary `generation` once another is in use: says the
  // primary moved and a retry goes to the new one (nullptr: still the primary, or shut down).
  std::exception_ptr retiredError(std::uint64_t generation, const std::string& command,
                                  const std::exception_ptr& error) const;
  void wantDiscovery();
  void maintain();
  // Runs `end` on each of `requests` (taken out of parked_, lock not held) and destroys them;
  // false if that released the last reference to this runner (then nothing of it may be touched).
  template <class End>
  bool endCallbacks(std::vector<Request>& requests, End&& end);
  void subscribe();
  bool discover();  // true if a primary was found (and is in use now)
  // The AuthError (kind Auth or NoPermission) `error` as parked and later requests get it: no primary
  // can be found because a login was refused; `why` is every sentinel's and candidate's answer.
  std::exception_ptr refusedLoginError(const std::exception_ptr& error, const std::string& why) const;
  void expireParked(std::vector<Request>& expired) REDLIMIT_REQUIRES(mutex_);

  const ClientOptions options_;
  ClientOptions::Connection sentinelConnection_;  // the sentinels' own user, password and TLS

  mutable Mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<Transport> primary_ REDLIMIT_GUARDED_BY(mutex_);  // nullptr until found
  ClientOptions::Node primaryAddress_ REDLIMIT_GUARDED_BY(mutex_);
  std::uint64_t generation_ REDLIMIT_GUARDED_BY(mutex_) = 0;         // switches to a new primary_ so far (1: the first)
  std::shared_ptr<Transport> retiring_ REDLIMIT_GUARDED_BY(mutex_);  // the old primary's, while it shuts down
  TransportCounters retiredCounts_ REDLIMIT_GUARDED_BY(mutex_);      // what released transports counted
  std::vector<Request> parked_ REDLIMIT_GUARDED_BY(mutex_);          // waiting for a primary
  bool discoveryWanted_ REDLIMIT_GUARDED_BY(mutex_) = true;
  std::chrono::steady_clock::time_point lastDiscovery_ REDLIMIT_GUARDED_BY(mutex_){};
  bool stopping_ REDLIMIT_GUARDED_BY(mutex_) = false;
  std::string lastFailure_ REDLIMIT_GUARDED_BY(mutex_);  // why the last discovery failed (for parked requests' errors)
  // Set when the last discovery found no primary because a login was refused (every sentinel that
  // answered refused it, or a primary they named refused the primary's): requests fail at once
  // with it, under every failure policy, until a discovery finds a primary.
  std::exception_ptr loginRefused_ REDLIMIT_GUARDED_BY(mutex_);
  std::thread maintainer_, subscriber_;

  std::atomic<bool> stopped_{false};
  std::atomic<std::uint64_t> discoveries_{0}, switches_{0}, announcements_{0};
};

}  // namespace redlimit::detail
