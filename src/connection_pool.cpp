#include "redlimit/connection_pool.hpp"

#include <string>

#include <fmt/format.h>

#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"

namespace redlimit {

void checkOptions(const PoolOptions& p) {
  if (p.size == 0) throw InvalidArgument("redlimit: pool size must be >= 1");
  if (p.waitTimeout.count() <= 0) {
    throw InvalidArgument(
        fmt::format("redlimit: pool waitTimeout must be > 0 ms (no infinite waits), got {} ms", p.waitTimeout.count()));
  }
  if (p.idlePingAfter.count() < 0) {
    throw InvalidArgument(
        fmt::format("redlimit: pool idlePingAfter must be >= 0 ms, got {} ms", p.idlePingAfter.count()));
  }
}

ConnectionPool::ConnectionPool(ConnectionOptions connection, PoolOptions pool)
    : connection_(std::move(connection)), options_(pool) {
  checkOptions(options_);
  checkOptions(connection_);
  idle_.reserve(options_.size);
}

ConnectionPool::~ConnectionPool() = default;

std::unique_ptr<Connection> ConnectionPool::openCounted() {
  // Called with a slot reserved in open_; connects outside the lock.
  try {
    auto conn = std::make_unique<Connection>(connection_);
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.created;
    return conn;
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --open_;
    }
    available_.notify_one();
    throw;
  }
}

ConnectionPool::Lease ConnectionPool::acquire() {
  // Saturates: a waitTimeout of milliseconds::max() waits as long as the clock counts.
  const auto deadline = detail::deadlineAfter(options_.waitTimeout);
  std::unique_ptr<Connection> conn;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (!idle_.empty()) {
        conn = std::move(idle_.back());
        idle_.pop_back();
        break;
      }
      if (open_ < options_.size) {
        ++open_;
        break;  // open a new one below, outside the lock
      }
      if (available_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
          open_ >= options_.size) {
        ++counters_.waitTimeouts;
        throw PoolTimeoutError(fmt::format("redlimit: no free connection within {} ms (pool size {})",
                                           options_.waitTimeout.count(), options_.size));
      }
    }
  }
  if (!conn) return Lease(this, openCounted());

  // A connection that sat idle for long may have been closed by the server or a middlebox.
  // Compared in ms: converting idlePingAfter to the clock's ns could overflow.
  const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - conn->lastUsed());
  if (idle > options_.idlePingAfter) {
    try {
      (void)conn->command({"PING"});
    } catch (const IoError&) {
      conn.reset();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++counters_.discarded;
      }
      return Lease(this, openCounted());  // the slot stays reserved for the replacement
    } catch (...) {
      giveBack(std::move(conn));  // an error reply leaves the connection usable
      throw;
    }
  }
  return Lease(this, std::move(conn));
}

void ConnectionPool::giveBack(std::unique_ptr<Connection> conn) noexcept {
  // When one connection breaks, the idle ones most likely broke with it (server restarted,
  // connections killed): drop them too, so the next caller connects afresh instead of finding
  // out one dead connection at a time. They are destroyed outside the lock.
  std::vector<std::unique_ptr<Connection>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (conn->broken()) {
      dropped.swap(idle_);
      open_ -= 1 + dropped.size();
      counters_.discarded += 1 + dropped.size();
    } else {
      idle_.push_back(std::move(conn));
    }
  }
  available_.notify_all();
}

PoolStats ConnectionPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PoolStats s = counters_;
  s.open = open_;
  s.idle = idle_.size();
  return s;
}

}  // namespace redlimit
