// A raw pipelined hiredis load: N connections with D requests in flight on each, sending prepared
// script calls round-robin over a set of keys, as fast as the server answers. The load of the
// server-cost comparisons (50 connections x 16 in flight). Header-only, Linux only.
// Not thread-safe: one thread drives it.
#pragma once

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include "bench_support.hpp"
#include "raw_acquire.hpp"

namespace redlimit::bench {

/// One command per key, prepared once (argv pointers and lengths kept), appended to a hiredis
/// context on demand. Optionally one argument, the same index in every argv, is a 16-byte id
/// refilled with fresh random bytes before every send (acquire.lua's member id); optionally
/// another is the caller's clock in epoch ms (13 digits), rewritten before every send (what
/// Redisson passes its scripts as "now"); optionally another holds a call counter: its last
/// `counterWidth` bytes (or, given a `counterMarker`, the `counterWidth` bytes that end where the
/// marker's first occurrence ends: an id inside a Limiter's record key) are rewritten before every
/// send with the number of calls sent so far, in zero-padded decimal (a fresh reservation or lease
/// id per call, in the same sequence every time: call i of a run that starts at key 0 goes to key
/// i mod size() with counter i).
/// Not copyable (the pointers point into it).
class PreparedCalls {
 public:
  static constexpr std::size_t kNoId = static_cast<std::size_t>(-1);

  /// `argvs[k]` is the whole command for key k (e.g. EVALSHA sha numkeys keys... args...).
  /// `idArg`: index of the id argument (its string must be 16 bytes long), or kNoId.
  /// `counterArg`: index of the argument that holds the counter, or kNoId; `counterWidth`: its
  /// digits (at least 1, at most the argument's length; zeros beyond the counter's own);
  /// `counterMarker`: see the class comment (empty: the counter ends the argument).
  explicit PreparedCalls(std::vector<std::vector<std::string>> argvs, std::size_t idArg = kNoId,
                         std::size_t clockArg = kNoId, std::size_t counterArg = kNoId, std::size_t counterWidth = 0,
                         const std::string& counterMarker = {})
      : argvs_(std::move(argvs)),
        idArg_(idArg),
        clockArg_(clockArg),
        counterArg_(counterArg),
        counterWidth_(counterWidth) {
    if (argvs_.empty()) throw std::invalid_argument("bench: PreparedCalls needs at least one command");
    ptr_.resize(argvs_.size());
    len_.resize(argvs_.size());
    for (std::size_t k = 0; k < argvs_.size(); ++k) {
      if (idArg_ != kNoId && (idArg_ >= argvs_[k].size() || argvs_[k][idArg_].size() != 16)) {
        throw std::invalid_argument("bench: PreparedCalls id argument must be 16 bytes");
      }
      if (counterArg_ != kNoId &&
          (counterArg_ >= argvs_[k].size() || counterWidth_ < 1 || argvs_[k][counterArg_].size() < counterWidth_)) {
        throw std::invalid_argument("bench: PreparedCalls counter argument missing or shorter than its width");
      }
      if (counterArg_ != kNoId) counterEnd_.push_back(counterEnd(argvs_[k][counterArg_], counterMarker));
      if (clockArg_ != kNoId) {
        if (clockArg_ >= argvs_[k].size()) throw std::invalid_argument("bench: PreparedCalls clock argument missing");
        argvs_[k][clockArg_] = epochMillis();  // 13 digits until the year 2286: the size stays
      }
      for (const std::string& a : argvs_[k]) {
        ptr_[k].push_back(a.data());
        len_[k].push_back(a.size());
      }
    }
  }
  PreparedCalls(const PreparedCalls&) = delete;
  PreparedCalls& operator=(const PreparedCalls&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return argvs_.size(); }
  [[nodiscard]] const std::vector<std::string>& argv(std::size_t key) const { return argvs_.at(key); }

  /// Queues key `key`'s command on `ctx` (a fresh id first, if there is one).
  void append(redisContext* ctx, std::size_t key) {
    if (idArg_ != kNoId) rng_.fill(argvs_[key][idArg_].data(), 16);  // same size: the pointers stay valid
    if (clockArg_ != kNoId) {
      const std::string now = epochMillis();
      std::string& arg = argvs_[key][clockArg_];
      if (now.size() != arg.size()) throw std::runtime_error("bench: the clock argument changed its length");
      arg.replace(0, now.size(), now);
    }
    if (counterArg_ != kNoId) {
      std::string& arg = argvs_[key][counterArg_];
      std::uint64_t n = counter_++;
      for (std::size_t i = 0; i < counterWidth_; ++i, n /= 10) {  // in place: the pointers stay valid
        arg[counterEnd_[key] - 1 - i] = static_cast<char>('0' + n % 10);
      }
    }
    if (redisAppendCommandArgv(ctx, static_cast<int>(ptr_[key].size()), ptr_[key].data(), len_[key].data()) !=
        REDIS_OK) {
      throw std::runtime_error("bench: append of a prepared call failed");
    }
  }

  /// Where the counter of `arg` ends: after the first `marker` (it must hold one), else at its end.
  static std::size_t counterEnd(const std::string& arg, const std::string& marker) {
    if (marker.empty()) return arg.size();
    const std::size_t at = arg.find(marker);
    if (at == std::string::npos) throw std::invalid_argument("bench: PreparedCalls counter marker missing");
    return at + marker.size();
  }

 private:
  std::vector<std::size_t> counterEnd_;  // per key: where the counter ends in its argument
  std::vector<std::vector<std::string>> argvs_;
  std::vector<std::vector<const char*>> ptr_;
  std::vector<std::vector<std::size_t>> len_;
  static std::string epochMillis() {
    using namespace std::chrono;
    return std::to_string(duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count());
  }

  std::size_t idArg_;
  std::size_t clockArg_;
  std::size_t counterArg_;
  std::size_t counterWidth_;
  std::uint64_t counter_ = 0;
  XorShift rng_;
};

/// What one run of the load did.
struct LoadResult {
  std::int64_t calls = 0;
  std::int64_t allowed = 0;  // replies whose first element is an integer > 0, and nil replies
  double seconds = 0;        // first request sent to last reply read
};

/// `connections` connections to one server, each with up to `depth` requests in flight.
class PipelinedLoad {
 public:
  PipelinedLoad(const std::string& host, int port, int connections, int depth) : depth_(depth) {
    for (int i = 0; i < connections; ++i) {
      conns_.push_back(std::make_unique<RawRedis>(host, port));
      (void)conns_.back()->command({"PING"});
      fds_.push_back(pollfd{conns_.back()->get()->fd, POLLIN, 0});
    }
  }

  [[nodiscard]] int connections() const noexcept { return static_cast<int>(conns_.size()); }
  [[nodiscard]] int depth() const noexcept { return depth_; }

  /// Sends `calls` requests, key after key round-robin from `firstKey` (wrapping at calls.size()),
  /// keeping `depth` in flight on every connection, and reads every reply. Every reply must be an
  /// array whose first element is an integer (a decision); after anything else no more requests
  /// are sent, the replies still in flight are read (so the connections stay usable), and the
  /// first bad reply is thrown as std::runtime_error.
  LoadResult run(PreparedCalls& prepared, std::int64_t calls, std::size_t firstKey = 0) {
    LoadResult out;
    std::int64_t issued = 0, answered = 0;
    std::string failure;
    std::size_t key = firstKey % prepared.size();
    auto send = [&](redisContext* ctx) {
      prepared.append(ctx, key);
      if (++key == prepared.size()) key = 0;
      ++issued;
    };
    const auto start = Clock::now();
    for (auto& c : conns_) {
      for (int k = 0; k < depth_ && issued < calls; ++k) send(c->get());
      flush(c->get());
    }
    while (answered < issued) {
      const int ready = ::poll(fds_.data(), fds_.size(), 10000);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) throw std::runtime_error("bench: pipelined load: no reply in 10 s");
      for (std::size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i].revents == 0) continue;
        redisContext* ctx = conns_[i]->get();
        // The socket is readable: one read() returns what arrived without blocking.
        if (redisBufferRead(ctx) != REDIS_OK) {
          throw std::runtime_error(std::string("bench: pipelined load: read failed: ") + ctx->errstr);
        }
        bool sent = false;
        for (;;) {
          void* raw = nullptr;
          if (redisGetReplyFromReader(ctx, &raw) != REDIS_OK) {
            throw std::runtime_error(std::string("bench: pipelined load: protocol error: ") + ctx->errstr);
          }
          if (raw == nullptr) break;
          ++answered;
          const std::int64_t allowed = allowedOf(static_cast<redisReply*>(raw), failure);
          if (allowed >= 0) {
            out.allowed += allowed;
            ++out.calls;
          }
          if (failure.empty() && issued < calls) {
            send(ctx);
            sent = true;
          }
        }
        if (sent) flush(ctx);
      }
    }
    out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!failure.empty()) throw std::runtime_error("bench: pipelined load: " + failure);
    return out;
  }

 private:
  static void flush(redisContext* ctx) {
    int written = 0;  // blocking socket: redisBufferWrite returns once a write took everything
    while (written == 0) {
      if (redisBufferWrite(ctx, &written) != REDIS_OK) {
        throw std::runtime_error(std::string("bench: pipelined load: write failed: ") + ctx->errstr);
      }
    }
  }

  // 1 if the decision allowed, 0 if not; -1 for anything but a decision (the first such reply is
  // described in `failure`). Frees `r`.
  static std::int64_t allowedOf(redisReply* r, std::string& failure) {
    RawRedis::ReplyPtr owned(r);
    if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0]->type == REDIS_REPLY_INTEGER) {
      return r->element[0]->integer > 0 ? 1 : 0;
    }
    if (const int packed = packedDecisionAllowed(r); packed >= 0) return packed;  // the one-key scripts
    if (const std::int64_t granted = packedAcquireGranted(r); granted >= 0) return granted > 0 ? 1 : 0;  // acquire.lua
    // The Redisson-equivalent scripts: acquire answers nil to a grant and the wait (an integer) to a
    // denial; release answers nil (counted as allowed); availablePermits answers the value, an
    // integer or the string GET read (counted as not allowed).
    if (r->type == REDIS_REPLY_NIL) return 1;
    if (r->type == REDIS_REPLY_INTEGER) return 0;
    // Redisson's availablePermits answers the value as the string GET read when nothing expired.
    if (r->type == REDIS_REPLY_STRING) return 0;
    if (failure.empty()) {
      failure = r->type == REDIS_REPLY_ERROR ? "error reply: " + std::string(r->str, r->len)
                                             : std::string("the reply is not a decision");
    }
    return -1;
  }

  std::vector<std::unique_ptr<RawRedis>> conns_;
  std::vector<pollfd> fds_;
  int depth_;
};

}  // namespace redlimit::bench
