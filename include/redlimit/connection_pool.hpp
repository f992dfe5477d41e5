// redlimit — a bounded pool of connections with a finite wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "redlimit/connection.hpp"
#include "redlimit/options.hpp"

namespace redlimit {

/// Counters of a pool, for tests and metrics.
struct PoolStats {
  std::size_t open = 0;                 // connections open now (idle + leased + being opened)
  std::size_t idle = 0;                 // connections waiting in the pool now
  std::uint64_t created = 0;            // connections opened since start
  std::uint64_t discarded = 0;          // connections thrown away since start (broken, or idle
                                        // when another one broke)
  std::uint64_t waitTimeouts = 0;       // acquire() calls that gave up with PoolTimeoutError
};

/// A bounded set of Connections. acquire() hands out an idle connection, opens a new one while
/// fewer than PoolOptions::size are open (outside the lock), or waits up to
/// PoolOptions::waitTimeout for one to come back. A connection idle for longer than
/// idlePingAfter is PINGed before it is handed out; broken ones are discarded and replaced.
/// Thread-safe.
class ConnectionPool {
 public:
  class Lease;

  /// Opens no connection yet. Throws InvalidArgument for size 0 or a non-positive timeout.
  ConnectionPool(ConnectionOptions connection, PoolOptions pool);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  /// A connection for the caller's exclusive use until the Lease is destroyed.
  /// Throws PoolTimeoutError (no connection free in time) or what Connection's constructor throws.
  [[nodiscard]] Lease acquire();

  [[nodiscard]] PoolStats stats() const;
  [[nodiscard]] const ConnectionOptions& connectionOptions() const noexcept { return connection_; }
  [[nodiscard]] const PoolOptions& poolOptions() const noexcept { return options_; }

 private:
  void giveBack(std::unique_ptr<Connection> conn) noexcept;
  std::unique_ptr<Connection> openCounted();

  const ConnectionOptions connection_;
  const PoolOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::size_t open_ = 0;
  PoolStats counters_;
};

/// Exclusive use of one pooled connection; returns it (or discards it if broken) on destruction.
/// Movable, not copyable. Not thread-safe.
class ConnectionPool::Lease {
 public:
  Lease(Lease&& other) noexcept : pool_(other.pool_), conn_(std::move(other.conn_)) {}
  Lease& operator=(Lease&&) = delete;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() {
    if (conn_) pool_->giveBack(std::move(conn_));
  }
  Connection& operator*() const noexcept { return *conn_; }
  Connection* operator->() const noexcept { return conn_.get(); }

 private:
  friend class ConnectionPool;
  Lease(ConnectionPool* pool, std::unique_ptr<Connection> conn) noexcept
      : pool_(pool), conn_(std::move(conn)) {}
  ConnectionPool* pool_;
  std::unique_ptr<Connection> conn_;
};

}  // namespace redlimit
