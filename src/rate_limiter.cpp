#include "redlimit/rate_limiter.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "random.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"

namespace redlimit {
namespace {

using std::chrono::milliseconds;

Script script(const detail::lua::EmbeddedScript& s) { return Script{s.name, s.sha1, s.source}; }

const Script kAcquire = script(detail::lua::acquire);
const Script kAvailable = script(detail::lua::available_permits);
const Script kRelease = script(detail::lua::release);
const Script kSetRate = script(detail::lua::set_rate);
const Script kTtl = script(detail::lua::ttl);

std::string idBytes() {
  auto id = detail::randomId16();
  return std::string(reinterpret_cast<const char*>(id.data()), id.size());
}

void checkConfig(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  if (type != RateType::Overall && type != RateType::PerClient) {
    throw InvalidArgument("redlimit: unknown RateType");
  }
  if (rate < 1 || rate > RateLimiter::kMaxRate) {
    throw InvalidArgument(fmt::format("redlimit: rate must be in 1..{}, got {}", RateLimiter::kMaxRate, rate));
  }
  if (interval.count() < 1 || interval > RateLimiter::kMaxInterval) {
    throw InvalidArgument(fmt::format("redlimit: rateInterval must be in 1..{} ms, got {} ms",
                                      RateLimiter::kMaxInterval.count(), interval.count()));
  }
  if (keepAlive.count() != 0 && (keepAlive < interval || keepAlive > RateLimiter::kMaxInterval)) {
    throw InvalidArgument(fmt::format("redlimit: keepAliveTime must be 0 or at least rateInterval ({} ms), got {} ms",
                                      interval.count(), keepAlive.count()));
  }
}

bool startsWith(const std::string& s, std::size_t from, const char* prefix) {
  return s.compare(from, std::char_traits<char>::length(prefix), prefix) == 0;
}

// The suffixes of a limiter's state keys (Redisson's and redlimit's own partial-grant records).
bool isStateSuffix(const std::string& name, std::size_t from) {
  const std::size_t n = name.size() - from;
  return (n == 5 && startsWith(name, from, "value")) || (n == 7 && startsWith(name, from, "permits")) ||
         startsWith(name, from, "value:") || startsWith(name, from, "permits:") || startsWith(name, from, "grant:");
}

// Refuses names that are too long or that would address another limiter's keys (see
// RateLimiter::checkName).
void checkName(const std::string& name) {
  if (name.empty()) throw InvalidArgument("redlimit: limiter name must not be empty");
  if (name.size() > RateLimiter::kMaxNameLength) {
    throw InvalidArgument(fmt::format("redlimit: limiter name is {} bytes; at most {} are allowed", name.size(),
                                      RateLimiter::kMaxNameLength));
  }
  const std::size_t brace = name.find('{');
  if (brace == std::string::npos) return;  // its keys are {name}:..., which no other name produces
  // "{x}" shares every state key with the plain name "x" ({x}:value, {x}:permits, ...).
  if (name.size() >= 2 && name.front() == '{' && name.back() == '}' &&
      name.find('{', 1) == std::string::npos) {
    throw InvalidArgument(fmt::format("redlimit: limiter name \"{}\" has the same state keys as the limiter "
                                      "\"{}\"; add a suffix after the braces, e.g. \"{}:limit\"",
                                      name, name.substr(1, name.size() - 2), name));
  }
  // "x{y}:value", "{y}:permits:..." are the state keys of the limiter "x{y}" or "y".
  for (std::size_t p = name.find(':', brace); p != std::string::npos; p = name.find(':', p + 1)) {
    if (isStateSuffix(name, p + 1)) {
      throw InvalidArgument(fmt::format("redlimit: limiter name \"{}\" is a state key of the limiter \"{}\" (it "
                                        "ends in :{}); choose a name that does not end in :value, :permits or :grant",
                                        name, name.substr(0, p), name.substr(p + 1)));
    }
  }
}

void checkClientId(const std::string& id) {
  if (id.empty() || id.size() > RateLimiter::kMaxClientIdLength || id.find_first_of("{}") != std::string::npos) {
    throw InvalidArgument(fmt::format("redlimit: ClientOptions::clientId must be 1..{} bytes without '{{' or '}}', "
                                      "got \"{}\"",
                                      RateLimiter::kMaxClientIdLength, id.substr(0, 64)));
  }
}

std::string hexOf(const std::string& bytes) {
  static const char* const digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

}  // namespace

std::string suffixName(const std::string& name, const std::string& suffix) {
  if (name.find('{') != std::string::npos) return name + ":" + suffix;
  return "{" + name + "}:" + suffix;
}

RateLimiter::RateLimiter(std::shared_ptr<Client> client, std::string name, RateLimiterOptions options)
    : client_(std::move(client)), name_(std::move(name)), options_(options), gate_(name_, options_.failure) {
  if (!client_) throw InvalidArgument("redlimit: RateLimiter needs a Client");
  checkName(name_);
  const std::string& id = client_->clientId();
  checkClientId(id);
  keys_ = {name_, suffixName(name_, "value"), suffixName(name_, "value:" + id),
           suffixName(name_, "permits"), suffixName(name_, "permits:" + id)};
  keyViews_.assign(keys_.begin(), keys_.end());
  acquireKeyViews_ = keyViews_;
  acquireKeyViews_.push_back(keys_[0]);
  const ClientOptions& o = client_->options();
  // Saturating: a pool waitTimeout of milliseconds::max() must not wrap the bound negative.
  retryCost_ = detail::saturatingAdd(o.connection.connectTimeout, o.connection.commandTimeout);
  callBound_ = detail::saturatingAdd(o.pool.waitTimeout, retryCost_);
  // Twice the longest a resend can come after the first attempt, at least 1 s and at most an
  // hour: a resend later than the grant's own interval could only take capacity again for a grant
  // whose window has passed.
  recordTtl_ = fmt::to_string(
      std::clamp(detail::saturatingAdd(callBound_, callBound_), milliseconds{1000}, milliseconds{3600000}).count());
}

// Runs `call`; if the connection was closed under it (the reply may or may not have been lost),
// runs it again on a fresh connection with `resend` set, up to three tries in all and as long as
// another try fits in the call's time bound (callBound_): that holds when each close was noticed at
// once (a killed connection, a restarted server), and a close that hits the fresh
// connection too (CLIENT KILL of every client) is tried again rather than reported as an outage.
// Only for calls that are safe to send more than once: reads, and acquires whose member id makes
// a resend a no-op grant. The pool drops its idle connections when one breaks, so each try gets a
// fresh one.
template <class Call>
auto RateLimiter::onceMoreIfClosed(Call&& call) -> decltype(call(false)) {
  const auto start = std::chrono::steady_clock::now();
  constexpr int kMaxTries = 3;  // a server that closes every connection is not retried forever
  for (int tries = 1;; ++tries) {
    try {
      return call(tries > 1);
    } catch (const ClosedError&) {
      const auto spent = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
      if (tries == kMaxTries || detail::saturatingAdd(spent, retryCost_) > callBound_) throw;
    }
  }
}

void RateLimiter::remember(std::int64_t rate, milliseconds interval) noexcept {
  knownRate_.store(rate, std::memory_order_relaxed);
  knownIntervalMs_.store(interval.count(), std::memory_order_relaxed);
}

std::string RateLimiter::nowArg() const {
  if (options_.timeSource == TimeSource::Server) return {};
  auto now = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  return fmt::to_string(now.count());
}

// The rate this handle saw last, for the scripts' check of a configuration changed elsewhere
// ('' if none was seen yet).
std::string RateLimiter::expectedRateArg() const {
  const std::int64_t rate = knownRate_.load(std::memory_order_relaxed);
  return rate > 0 ? fmt::to_string(rate) : std::string();
}

Reply RateLimiter::evalOnce(const Script& s, const std::vector<std::string_view>& args) {
  return client_->eval(s, keyViews_, args);
}

// Only what is invalid whatever the rate: the rate itself may have been raised by another
// process since this handle last saw it, so `permits > rate` is the script's to decide.
void RateLimiter::checkPermits(std::int64_t permits) const {
  if (permits < 1 || permits > kMaxRate) {
    throw InvalidArgument(fmt::format("redlimit: permits must be in 1..{}, got {}", kMaxRate, permits));
  }
}

void RateLimiter::writeRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                            const char* mode, bool* written) {
  checkConfig(type, rate, interval, keepAlive);
  const std::string rateArg = fmt::to_string(rate), intervalArg = fmt::to_string(interval.count()),
                    typeArg = fmt::to_string(static_cast<int>(type)), keepArg = fmt::to_string(keepAlive.count()),
                    now = nowArg();
  const Reply r = evalOnce(kSetRate, {rateArg, intervalArg, typeArg, keepArg, mode, now});
  const bool done = r.asInteger() == 1;
  if (done) remember(rate, interval);
  if (written != nullptr) *written = done;
}

bool RateLimiter::trySetRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  bool written = false;
  writeRate(type, rate, interval, keepAlive, "try", &written);
  if (!written) knownRate_.store(0, std::memory_order_relaxed);  // someone else's rate is in force
  return written;
}

void RateLimiter::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  writeRate(type, rate, interval, keepAlive, "reset", nullptr);
}

void RateLimiter::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                          bool keepState) {
  writeRate(type, rate, interval, keepAlive, keepState ? "keep" : "reset", nullptr);
}

bool RateLimiter::updateRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  bool written = false;
  writeRate(type, rate, interval, keepAlive, "update", &written);
  return written;
}

AcquireResult RateLimiter::attempt(std::int64_t atLeast, std::int64_t atMost, const std::string& id) {
  const std::string most = fmt::to_string(atMost), least = fmt::to_string(atLeast);
  // A call that may be partial (atLeast < atMost) names the record a partial grant leaves of its
  // size, so that a resend finds its member in O(1); other calls never touch it.
  std::string record;
  std::vector<std::string_view> rangeKeys;
  if (atLeast < atMost) {
    record = suffixName(name_, "grant:" + hexOf(id));
    rangeKeys = keyViews_;
    rangeKeys.push_back(record);
  }
  const std::vector<std::string_view>& keys = atLeast < atMost ? rangeKeys : acquireKeyViews_;
  return onceMoreIfClosed([&](bool resend) {
    const std::string now = nowArg(), expected = expectedRateArg();
    const Reply r = client_->eval(kAcquire, keys, {most, least, id, now, resend ? "1" : "0", recordTtl_, expected});
    if (r.type != Reply::Type::Array || r.elements.size() != 6) {
      throw UnexpectedReplyError(fmt::format(
          "redlimit: limiter {}: expected an array of 6 from the acquire script, got another reply", name_));
    }
    AcquireResult out;
    out.granted = r.elements[0].asInteger();
    out.wait = milliseconds{r.elements[1].asInteger()};
    out.remaining = std::max<std::int64_t>(0, r.elements[2].asInteger());
    out.rate = r.elements[3].asInteger();
    out.grantTime = std::chrono::microseconds{r.elements[4].asInteger()};
    out.interval = milliseconds{r.elements[5].asInteger()};
    remember(out.rate, out.interval);
    if (out.granted > 0) {
      // The member as the script packed it: length byte, id, permits as little-endian uint32.
      out.member.reserve(1 + id.size() + 4);
      out.member.push_back(static_cast<char>(id.size()));
      out.member += id;
      for (int i = 0; i < 4; ++i) out.member.push_back(static_cast<char>((static_cast<std::uint64_t>(out.granted) >> (8 * i)) & 0xFF));
    }
    return out;
  });
}

AcquireResult RateLimiter::tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
  checkPermits(atLeast);
  if (atMost < atLeast) {
    throw InvalidArgument(fmt::format("redlimit: atMost ({}) < atLeast ({})", atMost, atLeast));
  }
  if (atMost > kMaxRate) atMost = kMaxRate;
  return guardedAttempt(atLeast, atMost, idBytes());
}

AcquireResult RateLimiter::guardedAttempt(std::int64_t permits, std::int64_t atMost, const std::string& id) {
  auto decided = [&](bool granted) {
    AcquireResult r;  // no member, no interval: nothing was recorded in Redis
    r.granted = granted ? permits : 0;
    return r;
  };
  const std::int64_t rate = knownRate_.load(std::memory_order_relaxed);
  const milliseconds interval{knownIntervalMs_.load(std::memory_order_relaxed)};
  if (!gate_.shouldTry()) {
    if (auto d = gate_.decide(permits, rate, interval)) return decided(*d);
    gate_.throwUnavailable();
  }
  const std::int64_t started = gate_.callStart();
  try {
    AcquireResult r = attempt(permits, atMost, id);
    gate_.succeeded();
    return r;
  } catch (const IoError&) {
    // Redis could not be asked: the policy decides this call. An exhausted pool (congestion in
    // this process) does not degrade the limiter; any other IoError does (noteError).
    gate_.noteError(started);
    if (auto d = gate_.decide(permits, rate, interval)) return decided(*d);
    throw;
  } catch (const Error&) {
    // A configuration error is reported and thrown, never decided by the policy; any other
    // answer means Redis is reachable.
    gate_.noteError(started);
    throw;
  }
}

bool RateLimiter::tryAcquire(std::int64_t permits) {
  checkPermits(permits);
  return guardedAttempt(permits, permits, idBytes()).granted > 0;
}

bool RateLimiter::tryAcquire(std::int64_t permits, milliseconds timeout) {
  checkPermits(permits);
  const auto deadline = detail::deadlineAfter(timeout);  // saturates; <= 0 means one attempt
  const std::string id = idBytes();  // one id per call: a resend can never be granted twice
  for (;;) {
    const AcquireResult r = guardedAttempt(permits, permits, id);
    if (r.granted > 0) return true;
    if (r.wait.count() <= 0) return false;  // decided by the failure policy
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left < r.wait) return false;
    std::this_thread::sleep_for(r.wait);
  }
}

void RateLimiter::acquire(std::int64_t permits) {
  checkPermits(permits);
  const std::string id = idBytes();
  for (;;) {
    const AcquireResult r = guardedAttempt(permits, permits, id);
    if (r.granted > 0) return;
    // Denied by the failure policy (no wait known): try again after a probe interval.
    std::this_thread::sleep_for(r.wait.count() > 0 ? r.wait : options_.failure.probeInterval);
  }
}

std::int64_t RateLimiter::availablePermits() {
  return onceMoreIfClosed([&](bool) {
    const std::string now = nowArg(), expected = expectedRateArg();
    return evalOnce(kAvailable, {now, expected}).asInteger();
  });
}

RateLimiterConfig RateLimiter::getConfig() {
  const Reply r = onceMoreIfClosed([&](bool) { return client_->command({"HGETALL", keys_[0]}); });
  if (r.type != Reply::Type::Array || r.elements.empty()) {
    throw NotInitializedError("ERR", fmt::format("redlimit: RateLimiter {} is not initialized", name_));
  }
  RateLimiterConfig cfg;
  bool haveRate = false, haveInterval = false, haveType = false;
  for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    const std::string& field = r.elements[i].str;
    const Reply& value = r.elements[i + 1];
    auto number = [&](std::int64_t lo, std::int64_t hi) {
      std::int64_t v = 0;
      try {
        v = value.asInteger();
      } catch (const Error&) {
        v = lo - 1;
      }
      if (v < lo || v > hi) {
        throw InvalidConfigError("ERR", fmt::format("redlimit: field {} of {} holds \"{}\", not an integer in {}..{}",
                                                    field, name_, value.str, lo, hi));
      }
      return v;
    };
    if (field == "rate") {
      cfg.rate = number(1, kMaxRate);
      haveRate = true;
    } else if (field == "interval") {
      cfg.rateInterval = milliseconds{number(1, kMaxInterval.count())};
      haveInterval = true;
    } else if (field == "type") {
      cfg.rateType = number(0, 1) == 0 ? RateType::Overall : RateType::PerClient;
      haveType = true;
    } else if (field == "keepAliveTime") {
      cfg.keepAliveTime = milliseconds{number(0, kMaxInterval.count())};
    }
  }
  if (!haveRate || !haveInterval || !haveType) {
    throw InvalidConfigError("ERR", fmt::format("redlimit: configuration of {} lacks rate, interval or type", name_));
  }
  remember(cfg.rate, cfg.rateInterval);
  return cfg;
}

std::int64_t RateLimiter::runRelease(std::int64_t permits, const std::string& member) {
  if (permits < 0) throw InvalidArgument(fmt::format("redlimit: permits to release must be >= 0, got {}", permits));
  std::int64_t left = permits > kMaxRate ? kMaxRate : permits;
  std::int64_t released = 0;
  // Each script call looks at a bounded number of members and says whether it stopped early.
  while (left > 0) {
    const std::string n = fmt::to_string(left), now = nowArg(), expected = expectedRateArg();
    const Reply r = evalOnce(kRelease, {n, member, now, expected});
    if (r.type != Reply::Type::Array || r.elements.size() != 3) {
      throw UnexpectedReplyError(fmt::format(
          "redlimit: limiter {}: expected an array of 3 from the release script, got another reply", name_));
    }
    const std::int64_t got = r.elements[0].asInteger();
    released += got;
    left -= got;
    if (r.elements[2].asInteger() == 0 || got <= 0) break;
  }
  return released;
}

void RateLimiter::release(std::int64_t permits) { (void)runRelease(permits, ""); }

std::int64_t RateLimiter::releaseGrant(const std::string& member, std::int64_t permits) {
  if (member.empty()) throw InvalidArgument("redlimit: releaseGrant needs the member of a grant");
  return runRelease(permits, member);
}

void RateLimiter::validateConfig(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  redlimit::checkConfig(type, rate, interval, keepAlive);
}

std::optional<std::int64_t> RateLimiter::releaseGrantBestEffort(const std::string& member, std::int64_t permits) {
  // Bad input and the no-op go to releaseGrant first: they cost no probe.
  if (!member.empty() && permits > 0 && !client_->admitBestEffort()) return std::nullopt;
  return releaseGrant(member, permits);
}

bool RateLimiter::decideUnanswered(std::int64_t permits, const std::string& reason) {
  checkPermits(permits);
  const milliseconds interval{knownIntervalMs_.load(std::memory_order_relaxed)};
  if (auto d = gate_.decide(permits, knownRate_.load(std::memory_order_relaxed), interval)) return *d;
  throw TimeoutError(fmt::format("redlimit: limiter {}: {}", name_, reason));
}

bool RateLimiter::expire(milliseconds ttl) {
  if (ttl.count() <= 0 || ttl > kMaxInterval) {
    throw InvalidArgument(
        fmt::format("redlimit: expire needs a TTL in 1..{} ms, got {} ms", kMaxInterval.count(), ttl.count()));
  }
  const std::string ms = fmt::to_string(ttl.count());
  return evalOnce(kTtl, {"PEXPIRE", ms}).asInteger() == 1;
}

bool RateLimiter::expireAt(std::chrono::system_clock::time_point when) {
  const auto ms = std::chrono::duration_cast<milliseconds>(when.time_since_epoch()).count();
  if (ms <= 0) throw InvalidArgument("redlimit: expireAt needs a time after the epoch");
  const std::string arg = fmt::to_string(ms);
  return evalOnce(kTtl, {"PEXPIREAT", arg}).asInteger() == 1;
}

bool RateLimiter::clearExpire() { return evalOnce(kTtl, {"PERSIST", ""}).asInteger() == 1; }

milliseconds RateLimiter::remainTimeToLive() {
  return milliseconds{onceMoreIfClosed([&](bool) { return client_->command({"PTTL", keys_[0]}); }).asInteger()};
}

bool RateLimiter::isExists() {
  return onceMoreIfClosed([&](bool) { return client_->command({"EXISTS", keys_[0]}); }).asInteger() == 1;
}

bool RateLimiter::deleteLimiter() {
  knownRate_.store(0, std::memory_order_relaxed);
  return client_->command({"DEL", keys_[0], keys_[1], keys_[2], keys_[3], keys_[4]}).asInteger() > 0;
}

}  // namespace redlimit
