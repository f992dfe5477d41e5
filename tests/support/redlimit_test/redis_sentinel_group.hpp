// Test harness: a primary, one replica and three sentinels monitoring them, each a throwaway
// redis-server (RedisServer) on a free loopback port.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "redlimit_test/redis_server.hpp"

namespace redlimit::test {

/// Passwords for a RedisSentinelGroup; empty: none.
struct SentinelGroupPasswords {
  /// The sentinels' own: `requirepass` in their config, and `sentinel sentinel-pass` so that they
  /// still reach one another.
  std::string sentinel;
  /// The primary's and the replica's: `--requirepass` and `--masterauth` on both (so that either
  /// may replicate the other after a failover), and `sentinel auth-pass` in the sentinels' config.
  std::string primary;
};

/// A primary, a replica of it (REPLICAOF) and three sentinels with quorum 2, configured with
///   sentinel down-after-milliseconds <downAfter>   subjectively down after this long
///   sentinel failover-timeout 2000                  a failed failover is retried after 4 s
/// and the replica with --repl-diskless-sync-delay 0 on the primary (the default waits 5 s).
/// Each sentinel has its own writable config file (sentinels rewrite it).
/// Not thread-safe: drive it from the test's main thread. Calls that wait throw
/// std::runtime_error with what they last saw when their time runs out.
class RedisSentinelGroup {
 public:
  /// Starts the servers and waits up to 20 s until every sentinel names the primary
  /// (SENTINEL GET-MASTER-ADDR-BY-NAME), lists the replica as up (SENTINEL REPLICAS) and knows the
  /// two other sentinels (SENTINEL SENTINELS). Throws std::invalid_argument for downAfter < 1 ms
  /// or an empty name; std::runtime_error if a server does not start or the group does not settle.
  /// The harness authenticates its own commands with `passwords`.
  explicit RedisSentinelGroup(std::chrono::milliseconds downAfter = std::chrono::milliseconds(500),
                              std::string primaryName = "mymaster", SentinelGroupPasswords passwords = {});
  ~RedisSentinelGroup();
  RedisSentinelGroup(const RedisSentinelGroup&) = delete;
  RedisSentinelGroup& operator=(const RedisSentinelGroup&) = delete;

  /// The server started as the primary (it keeps this name after a failover).
  [[nodiscard]] RedisServer& primary() { return *primary_; }
  /// The server started as the replica.
  [[nodiscard]] RedisServer& replica() { return *replica_; }
  /// Sentinel i, 0..2. Throws std::out_of_range.
  [[nodiscard]] RedisServer& sentinel(int i);
  [[nodiscard]] std::vector<int> sentinelPorts() const;
  /// `redis-sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<primaryName>`, with
  /// `:<primary password>@` before the hosts and `?sentinel_password=<sentinel password>` after
  /// the name when they are set (passwords go in as given: no percent-encoding).
  [[nodiscard]] std::string uri() const;
  [[nodiscard]] const std::string& primaryName() const noexcept { return name_; }
  /// The primary's port as the first answering sentinel names it now. Throws std::runtime_error
  /// if no sentinel answers.
  [[nodiscard]] int currentPrimaryPort() const;
  /// Waits until every running sentinel names a primary other than `oldPort`, the same one, and
  /// that server says role:master; returns its port.
  int waitForFailover(int oldPort, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));

 private:
  std::string name_;
  SentinelGroupPasswords passwords_;
  std::unique_ptr<RedisServer> primary_;
  std::unique_ptr<RedisServer> replica_;
  std::vector<std::unique_ptr<RedisServer>> sentinels_;
};

}  // namespace redlimit::test
