// The raw-hiredis form of one acquire.lua call, shared by the bench_*.cpp programs that compare
// the library with it (bench_redlimit's round trips and server costs, bench_transport's
// saturation driver). Header-only. Not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include "redlimit/rate_limiter.hpp"
#include "bench_support.hpp"

namespace redlimit::bench {

// Random bytes without the library's generator, for the raw baselines and set-up.
struct XorShift {
  std::uint64_t s = 0x9E3779B97F4A7C15ULL;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  void fill(char* out, std::size_t n) {
    for (std::size_t i = 0; i < n; i += 8) {
      const std::uint64_t v = next();
      for (std::size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<char>((v >> (8 * j)) & 0xFF);
    }
  }
};

// An EVALSHA (or EVAL) with acquire.lua's argument shape, prepared once: the raw-hiredis
// baseline, and the driver of the server-cost comparison. Not copyable (argv points into it).
class RawAcquire {
 public:
  /// `command` is EVALSHA (then `script` is the SHA1) or EVAL (then it is the source).
  /// `keys` are the limiter's five; the sixth (the partial-grant record, never written here since
  /// every call asks for exactly one permit) is added.
  RawAcquire(std::string command, std::string script, const std::vector<std::string>& keys) {
    store_ = {std::move(command), std::move(script), std::to_string(keys.size() + 1)};
    store_.insert(store_.end(), keys.begin(), keys.end());
    store_.push_back(redlimit::suffixName(keys.at(0), "grant:bench"));
    // most, least, id, now ('' = server clock), resend flag, record TTL ms, rate seen last
    store_.insert(store_.end(), {"1", "1", "", "", "0", "5000", ""});
    idIndex_ = store_.size() - 5;
    for (const std::string& s : store_) {
      ptr_.push_back(s.data());
      len_.push_back(s.size());
    }
    ptr_[idIndex_] = id_.data();
    len_[idIndex_] = id_.size();
  }
  RawAcquire(const RawAcquire&) = delete;
  RawAcquire& operator=(const RawAcquire&) = delete;

  void newId() { rng_.fill(id_.data(), id_.size()); }
  void copyId(const RawAcquire& other) { id_ = other.id_; }

  // One call; returns permits granted (0 = denied). Throws on transport or error replies.
  std::int64_t call(redisContext* ctx) {
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx, static_cast<int>(ptr_.size()), ptr_.data(), len_.data()));
    return decision(ctx, r);
  }
  // One call whose reply is not a decision (a stand-in script); throws on errors only.
  void callAnyReply(redisContext* ctx) {
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx, static_cast<int>(ptr_.size()), ptr_.data(), len_.data()));
    if (r == nullptr) throw std::runtime_error(std::string("bench: script call transport error: ") + ctx->errstr);
    RawRedis::ReplyPtr owned(r);
    if (r->type == REDIS_REPLY_ERROR)
      throw std::runtime_error("bench: script call failed: " + std::string(r->str, r->len));
  }
  void append(redisContext* ctx) {
    if (redisAppendCommandArgv(ctx, static_cast<int>(ptr_.size()), ptr_.data(), len_.data()) != REDIS_OK) {
      throw std::runtime_error("bench: append of a script call failed");
    }
  }
  static std::int64_t read(redisContext* ctx) {
    void* raw = nullptr;
    if (redisGetReply(ctx, &raw) != REDIS_OK) raw = nullptr;
    return decision(ctx, static_cast<redisReply*>(raw));
  }
  /// Permits granted by one reply `r` (taken over and freed) read from `ctx`: acquire.lua's packed reply,
  /// or the Redisson-equivalent reference's nil (granted: the one permit every call asks for) or
  /// integer (denied: the wait in ms). Throws on a null reply (transport error, ctx->errstr) and on
  /// anything but a decision.
  static std::int64_t decision(redisContext* ctx, redisReply* r) {
    if (r == nullptr) throw std::runtime_error(std::string("bench: script call transport error: ") + ctx->errstr);
    RawRedis::ReplyPtr owned(r);
    if (r->type == REDIS_REPLY_NIL) return 1;
    if (r->type == REDIS_REPLY_INTEGER) return 0;
    const std::int64_t granted = packedAcquireGranted(r);
    if (granted < 0) {
      throw std::runtime_error("bench: script call failed: " +
                               std::string(r->str != nullptr ? r->str : "unexpected reply"));
    }
    return granted;
  }

 private:
  std::vector<std::string> store_;
  std::vector<const char*> ptr_;
  std::vector<std::size_t> len_;
  std::size_t idIndex_ = 0;
  std::array<char, 16> id_{};
  XorShift rng_;
};

}  // namespace redlimit::bench
