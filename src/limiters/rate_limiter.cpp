#include "redlimit/rate_limiter.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "limiters/batcher.hpp"
#include "limiters/completion.hpp"
#include "base/fork_guard.hpp"
#include "limiters/future_of.hpp"
#include "limiters/limiter_call.hpp"
#include "limiters/script_call.hpp"
#include "limiters/script_helpers.hpp"
#include "base/random.hpp"
#include "config/config_checks.hpp"
#include "config/limiter_name.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"
#include "topology/key_slot.hpp"
#include "transport/pipeline.hpp"

namespace redlimit {

using detail::Reply;
using detail::Script;
namespace {

using std::chrono::milliseconds;

Script script(const detail::lua::EmbeddedScript& s) { return Script{s.name, s.sha1, s.source}; }

const Script kAcquire = script(detail::lua::acquire);
const Script kAcquireBatch = script(detail::lua::acquire_batch);
// Most acquisitions one coalesced call decides (acquire_batch.lua's limit).
constexpr std::size_t kMaxCoalesced = 64;
const Script kAvailable = script(detail::lua::available_permits);
const Script kRelease = script(detail::lua::release);
const Script kSetRate = script(detail::lua::set_rate);
const Script kTtl = script(detail::lua::ttl);

static_assert(RateLimiter::kMaxRate == detail::kMaxPermits, "permits are checked as every limiter's");

void checkConfig(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  if (type != RateType::Overall && type != RateType::PerClient) {
    throw InvalidArgument("redlimit: unknown RateType");
  }
  detail::checkCount("rate", rate, 1, RateLimiter::kMaxRate);
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
  detail::checkLimiterName(name, RateLimiter::kMaxNameLength);
  const std::size_t brace = name.find('{');
  if (brace == std::string::npos) return;  // its keys are {name}:..., which no other name produces
  // "{x}" shares every state key with the plain name "x" ({x}:value, {x}:permits, ...).
  if (name.size() >= 2 && name.front() == '{' && name.back() == '}' && name.find('{', 1) == std::string::npos) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter name \"{}\" has the same state keys as the limiter "
                    "\"{}\"; add a suffix after the braces, e.g. \"{}:limit\"",
                    name, name.substr(1, name.size() - 2), name));
  }
  // "x{y}:value", "{y}:permits:..." are the state keys of the limiter "x{y}" or "y".
  for (std::size_t p = name.find(':', brace); p != std::string::npos; p = name.find(':', p + 1)) {
    if (isStateSuffix(name, p + 1)) {
      throw InvalidArgument(
          fmt::format("redlimit: limiter name \"{}\" is a state key of the limiter \"{}\" (it "
                      "ends in :{}); choose a name that does not end in :value, :permits or :grant",
                      name, name.substr(0, p), name.substr(p + 1)));
    }
  }
}

void checkClientId(const std::string& id) {
  if (id.empty() || id.size() > RateLimiter::kMaxClientIdLength || id.find_first_of("{}") != std::string::npos) {
    throw InvalidArgument(
        fmt::format("redlimit: ClientOptions::clientId must be 1..{} bytes without '{{' or '}}', "
                    "got \"{}\"",
                    RateLimiter::kMaxClientIdLength, id.substr(0, 64)));
  }
}

// The integer that the scripts read in a field of the configuration hash (lua/lib/base.lua's
// parseInteger: Lua 5.1's tonumber, which is strtod followed by white space only, so " 10", "1e1"
// and "0xa" are 10), if it is one below 10^14 in magnitude; nullopt otherwise. getConfig() reads
// the hash as every script does.
std::optional<std::int64_t> luaInteger(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double d = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  while (*end != '\0' && std::isspace(static_cast<unsigned char>(*end)) != 0) ++end;
  if (*end != '\0' || !(d < 1e14 && d > -1e14) || d != std::floor(d)) return std::nullopt;
  return static_cast<std::int64_t>(d);
}

// The member as the scripts pack it: length byte, id, permits as little-endian uint32.
std::string packedMember(const std::string& id, std::int64_t permits) {
  std::string member;
  member.reserve(1 + id.size() + 4);
  member.push_back(static_cast<char>(id.size()));
  member += id;
  for (int i = 0; i < 4; ++i)
    member.push_back(static_cast<char>((static_cast<std::uint64_t>(permits) >> (8 * i)) & 0xFF));
  return member;
}

}  // namespace

std::string suffixName(const std::string& name, const std::string& suffix) {
  if (name.find('{') != std::string::npos) return name + ":" + suffix;
  return "{" + name + "}:" + suffix;
}

class RateLimiter::Impl : public std::enable_shared_from_this<RateLimiter::Impl> {
 public:
  Impl(std::shared_ptr<Client> client, std::string name, RateLimiter::Options options);
  // Acquisitions still queued for coalescing end with ClosedError.
  ~Impl();

  bool trySetRate(RateType type, std::int64_t rate, milliseconds rateInterval, milliseconds keepAliveTime);
  void setRate(RateType type, std::int64_t rate, milliseconds rateInterval, milliseconds keepAliveTime);
  void setRate(RateType type, std::int64_t rate, milliseconds rateInterval, milliseconds keepAliveTime, bool keepState);
  bool updateRate(RateType type, std::int64_t rate, milliseconds rateInterval, milliseconds keepAliveTime);
  bool tryAcquire(std::int64_t permits);
  // Counts the decision `r` for `permits` and returns what the caller gets (shadow mode: true).
  bool admit(const detail::AcquireResult& r, std::int64_t permits) const;
  bool tryAcquire(std::int64_t permits, milliseconds timeout);
  void acquire(std::int64_t permits);
  // tryAcquire with a timeout and acquire (Redisson's: nothing is taken ahead of time): asks for
  // `permits` under one id, sleeping each wait the script reports on the limiter's clock (its
  // failure gate's), until granted or the next wait would end after `until` (µs on that clock). A
  // denial by the failure policy (no wait known) ends it, or with `probe` is asked again after a
  // probe interval. Counts the outcome; returns what the caller gets.
  bool askUntil(std::int64_t permits, std::int64_t until, bool probe);
  detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost);
  void tryAcquireUpToAsync(std::int64_t atLeast, std::int64_t atMost, AcquireCallback done);
  std::int64_t releaseGrant(const std::string& member, std::int64_t permits);
  std::optional<std::int64_t> releaseGrantBestEffort(const std::string& member, std::int64_t permits);
  bool decideUnanswered(std::int64_t permits, const std::string& reason);
  std::int64_t availablePermits();
  RateLimiterConfig getConfig();
  void release(std::int64_t permits);
  bool expire(milliseconds ttl);
  bool expireAt(std::chrono::system_clock::time_point when);
  bool clearExpire();
  milliseconds remainTimeToLive();
  bool isExists();
  bool deleteLimiter();

  // One try of an acquisition (the call protocol, limiters/limiter_call.hpp, sends another with
  // the same id when the connection closed under it).
  struct Pending {
    std::int64_t atLeast = 0;
    std::int64_t atMost = 0;
    std::string id;
    std::string record;           // the partial-grant record's key; empty when atLeast == atMost
    bool resent = false;          // a later try: the script answers a grant already made under the id
    detail::SteadyTime deadline;  // this try's
    AcquireCallback done;         // the try's outcome, errors as the limiter's types
  };
  using Sender = detail::GroupSender<Impl, Pending>;
  // Runs the attempt's callback once (later calls do nothing); one that throws is reported through
  // `self`'s monitor (`self` may be null: the handle is gone) and touches no other attempt.
  static void finish(Impl* self, Pending& attempt, detail::AcquireResult result, std::exception_ptr error) noexcept;
  // What Sender sends (limiters/batcher.hpp): an acquisition alone with acquire.lua, a group of
  // whole ones with acquire_batch.lua; and how their replies and errors reach each attempt (`self`
  // may be null: the handle is gone; when not, it remembers the configuration seen).
  void sendAlone(const std::shared_ptr<Pending>& attempt, detail::ReplyCallback done);
  void sendTogether(const std::vector<std::shared_ptr<Pending>>& group, detail::SteadyTime deadline,
                    detail::ReplyCallback done);
  static void answerAlone(Impl* self, Pending& attempt, const Reply& r, std::exception_ptr error) noexcept;
  static void answerTogether(Impl* self, const std::vector<std::shared_ptr<Pending>>& group, const Reply& r);
  static void fail(Impl* self, Pending& attempt, std::exception_ptr error) noexcept;
  // One try of an acquisition of atLeast..atMost under `id` (`resend`: a later try of the call):
  // sent, or queued while this handle has a group in flight on each connection
  // (RateLimiter::Options::coalesce); `done` gets its outcome on the I/O thread.
  void tryOnce(std::int64_t atLeast, std::int64_t atMost, const std::string& id, bool resend,
               detail::SteadyTime deadline, AcquireCallback done);
  // The call protocol's parameters of an acquisition of `permits` (at least): a deciding call.
  detail::LimiterCall::Params decision(std::int64_t permits) const;
  // An acquisition of atLeast..atMost under `id` through the call protocol: the failure gate, the
  // resend after a closed connection, the failure policy's decision (granted = atLeast or 0,
  // wait = 0, no member) when Redis cannot be asked.
  detail::AcquireResult ask(std::int64_t atLeast, std::int64_t atMost, const std::string& id);
  // ask() without waiting: `done` once, on the I/O thread (on this one when decided without sending).
  void askAsync(std::int64_t atLeast, std::int64_t atMost, std::string id, AcquireCallback done);

  // Only what is invalid whatever the rate (1..kMaxRate): the rate itself may have been raised by
  // another process since this handle last saw it, so `permits > rate` is the script's to decide.
  static void checkPermits(std::int64_t permits) { detail::checkPermitRange(permits); }
  // checkPermits(atLeast) and atMost >= atLeast; returns atMost, at most kMaxRate.
  std::int64_t checkRange(std::int64_t atLeast, std::int64_t atMost) const;
  // The configuration last seen in a reply, for the client-side permits check and the Local policy.
  void remember(std::int64_t rate, std::chrono::milliseconds interval) noexcept;
  // release.lua for up to `permits` from `member` ('' = the newest grants); returns how many went back.
  std::int64_t releasePermits(std::int64_t permits, const std::string& member);
  // set_rate.lua in `mode`: true if it wrote the configuration (then remembered).
  bool writeRate(RateType type, std::int64_t rate, std::chrono::milliseconds rateInterval,
                 std::chrono::milliseconds keepAliveTime, const char* mode);
  // `script` on the five keys, a call that takes no decision (a read, a configuration write, a
  // give-back) through the call protocol (runScript), errors as the limiter's; sent again after a
  // closed connection if `resend` says so.
  Reply evalCall(const Script& script, std::vector<std::string> args, detail::LimiterCall::Resend resend);
  std::string nowArg() const;
  std::string expectedRateArg() const;

  std::shared_ptr<Client> client_;
  std::string name_;
  RateLimiter::Options options_;
  std::vector<std::string> keys_;
  std::vector<std::string_view> keyViews_;
  // acquire.lua's keys for a call that cannot be partial (atLeast == atMost): the five, then the
  // hash key in the record's place (the script touches the record only for a range).
  std::vector<std::string_view> acquireKeyViews_;
  // The longest one call may take, resends after a closed connection included: connect timeout +
  // command timeout (saturating).
  std::chrono::milliseconds callBound_{0};
  std::string recordTtl_;                         // ms a partial grant's record is kept (acquire.lua ARGV[6])
  std::atomic<std::int64_t> knownRate_{0};        // last rate seen from Redis; 0 = unknown
  std::atomic<std::int64_t> knownIntervalMs_{0};  // last interval seen from Redis; 0 = unknown
  detail::FailureGate gate_;
  // The coalescing queue (RateLimiter::Options::coalesce): whole acquisitions that arrive while a
  // group is in flight on each connection go together as one acquire_batch.lua call
  // (limiters/batcher.hpp).
  Sender::Queue coalescing_;
};

namespace {
// The monitor of a handle whose arguments pass every limiter's checks and Redisson's (made only
// then: a refused name must not take a place in the metrics registry).
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const LimiterMonitor::Options& options) {
  if (client) {
    checkName(name);
    checkClientId(client->clientId());
  }
  return detail::checkedMonitor(client, name, options);
}
}  // namespace

RateLimiter::Impl::Impl(std::shared_ptr<Client> client, std::string name, RateLimiter::Options options)
    : client_(std::move(client)),
      name_(std::move(name)),
      options_(std::move(options)),
      gate_(name_, options_.failure, ClockView{}, checkedMonitor(client_, name_, options_.monitor)),
      coalescing_(kMaxCoalesced, detail::groupsInFlight(client_->options())) {
  const std::string& id = client_->clientId();
  keys_ = {name_, suffixName(name_, "value"), suffixName(name_, "value:" + id), suffixName(name_, "permits"),
           suffixName(name_, "permits:" + id)};
  if (client_->options().topology == ClientOptions::Topology::Cluster &&
      detail::keySlot(keys_[0]) != detail::keySlot(keys_[1])) {
    // Redisson's suffix rule wraps a name without '{' in braces ({name}:value); a name with one is
    // suffixed as it is, so its keys share a slot only if it holds a non-empty hash tag.
    throw InvalidArgument(fmt::format(
        "redlimit: limiter name \"{}\" puts its keys in different Redis Cluster slots (\"{}\" in slot {}, \"{}\" in "
        "slot {}): a name with a '{{' keeps Redisson's suffixes outside any braces, so it needs a non-empty hash tag; "
        "on a cluster use a name without braces, or one like \"{{tenant}}:api\"",
        name_, keys_[0], detail::keySlot(keys_[0]), keys_[1], detail::keySlot(keys_[1])));
  }
  keyViews_.assign(keys_.begin(), keys_.end());
  acquireKeyViews_ = keyViews_;
  acquireKeyViews_.push_back(keys_[0]);
  callBound_ = detail::LimiterCall::boundOf(*client_);
  // Twice the longest a resend can come after the first attempt, at least 1 s and at most an
  // hour: a resend later than the grant's own interval could only take capacity again for a grant
  // whose window has passed.
  recordTtl_ = fmt::to_string(
      std::clamp(detail::saturatingAdd(callBound_, callBound_), milliseconds{1000}, milliseconds{3600000}).count());
}

RateLimiter::Impl::~Impl() {
  Sender::close(*this, coalescing_,
                std::make_exception_ptr(ClosedError(fmt::format(
                    "redlimit: limiter {}: the last handle was dropped before this acquisition was sent", name_))));
}

void RateLimiter::Impl::finish(Impl* self, Pending& a, detail::AcquireResult result,
                               std::exception_ptr error) noexcept {
  AcquireCallback done = std::move(a.done);
  a.done = nullptr;
  if (!done) return;
  try {
    done(std::move(result), std::move(error));
  } catch (...) {
    if (self != nullptr) detail::reportCallbackThrew(self->gate_.monitor(), self->name_, std::current_exception());
  }
}

void RateLimiter::Impl::remember(std::int64_t rate, milliseconds interval) noexcept {
  knownRate_.store(rate, std::memory_order_relaxed);
  knownIntervalMs_.store(interval.count(), std::memory_order_relaxed);
}

std::string RateLimiter::Impl::nowArg() const {
  if (options_.timeSource == TimeSource::Server) return {};
  auto now = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  return fmt::to_string(now.count());
}

// The rate this handle saw last, for the scripts' check of a configuration changed elsewhere
// ('' if none was seen yet).
std::string RateLimiter::Impl::expectedRateArg() const {
  const std::int64_t rate = knownRate_.load(std::memory_order_relaxed);
  return rate > 0 ? fmt::to_string(rate) : std::string();
}

Reply RateLimiter::Impl::evalCall(const Script& script, std::vector<std::string> args,
                                  detail::LimiterCall::Resend resend) {
  return detail::runScript(
      *this, detail::LimiterCall::plain(callBound_, resend), "call",
      detail::ScriptRequest{&script, keys_, std::move(args), nullptr, nullptr}, detail::limiterError,
      [](Reply r) { return r; }, [](bool) { return Reply{}; });
}

std::int64_t RateLimiter::Impl::checkRange(std::int64_t atLeast, std::int64_t atMost) const {
  checkPermits(atLeast);
  if (atMost < atLeast) throw InvalidArgument(fmt::format("redlimit: atMost ({}) < atLeast ({})", atMost, atLeast));
  return std::min(atMost, kMaxRate);
}

bool RateLimiter::Impl::writeRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                                  const char* mode) {
  checkConfig(type, rate, interval, keepAlive);
  const std::string rateArg = fmt::to_string(rate), intervalArg = fmt::to_string(interval.count()),
                    typeArg = fmt::to_string(static_cast<int>(type)), keepArg = fmt::to_string(keepAlive.count()),
                    now = nowArg();
  // Not sent again: a second "try" after a first that was applied would answer its own write.
  const Reply r =
      evalCall(kSetRate, {rateArg, intervalArg, typeArg, keepArg, mode, now}, detail::LimiterCall::Resend::Never);
  const bool written = r.asInteger() == 1;
  if (written) remember(rate, interval);
  return written;
}

bool RateLimiter::Impl::trySetRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  const bool written = writeRate(type, rate, interval, keepAlive, "try");
  if (!written) knownRate_.store(0, std::memory_order_relaxed);  // someone else's rate is in force
  return written;
}

void RateLimiter::Impl::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  (void)writeRate(type, rate, interval, keepAlive, "reset");
}

void RateLimiter::Impl::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                                bool keepState) {
  (void)writeRate(type, rate, interval, keepAlive, keepState ? "keep" : "reset");
}

bool RateLimiter::Impl::updateRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  return writeRate(type, rate, interval, keepAlive, "update");
}

void RateLimiter::Impl::fail(Impl* self, Pending& a, std::exception_ptr error) noexcept {
  finish(self, a, detail::AcquireResult{}, detail::limiterError(std::move(error)));
}

void RateLimiter::Impl::answerAlone(Impl* self, Pending& a, const Reply& r, std::exception_ptr error) noexcept {
  if (error) {
    fail(self, a, std::move(error));
    return;
  }
  detail::AcquireResult out;
  try {
    (void)detail::arrayReply("limiter ", self != nullptr ? self->name_ : std::string("?"), r, 6, "the acquire script");
    out.granted = r.elements[0].asInteger();
    out.wait = detail::saturatingCast<std::chrono::microseconds>(milliseconds{r.elements[1].asInteger()});
    out.remaining = std::max<std::int64_t>(0, r.elements[2].asInteger());
    out.rate = r.elements[3].asInteger();
    out.grantTime = std::chrono::microseconds{r.elements[4].asInteger()};
    out.interval = milliseconds{r.elements[5].asInteger()};
    if (out.granted > 0) out.member = packedMember(a.id, out.granted);
  } catch (...) {
    fail(self, a, std::current_exception());
    return;
  }
  if (self != nullptr) self->remember(out.rate, out.interval);
  finish(self, a, std::move(out), nullptr);
}

void RateLimiter::Impl::sendAlone(const std::shared_ptr<Pending>& a, detail::ReplyCallback done) {
  gate_.monitor().roundTrip();  // the protocol leaves the count to this sender (a batch is one request)
  const fmt::format_int most(a->atMost), least(a->atLeast);
  const std::string now = nowArg(), expected = expectedRateArg();
  // A call that may be partial (atLeast < atMost) names the record a partial grant leaves of its
  // size, so that a resend finds its member in O(1); other calls never touch it.
  std::vector<std::string_view> rangeKeys;
  if (!a->record.empty()) {
    rangeKeys = keyViews_;
    rangeKeys.push_back(a->record);
  }
  const std::vector<std::string_view>& keys = a->record.empty() ? acquireKeyViews_ : rangeKeys;
  const std::vector<std::string_view> args = {std::string_view(most.data(), most.size()),
                                              std::string_view(least.data(), least.size()),
                                              a->id,
                                              now,
                                              a->resent ? "1" : "0",
                                              recordTtl_,
                                              expected};
  detail::evalAsync(*client_, kAcquire, keys, args, std::move(done), a->deadline);
}

void RateLimiter::Impl::sendTogether(const std::vector<std::shared_ptr<Pending>>& group, detail::SteadyTime deadline,
                                     detail::ReplyCallback done) {
  gate_.monitor().roundTrip();
  const std::string now = nowArg(), expected = expectedRateArg(), count = fmt::to_string(group.size());
  std::vector<std::string> permits;
  permits.reserve(group.size());
  std::vector<std::string_view> args;
  args.reserve(3 + 3 * group.size());
  args.push_back(now);
  args.push_back(expected);
  args.push_back(count);
  for (const auto& a : group) {
    permits.push_back(fmt::to_string(a->atLeast));
    args.push_back(permits.back());
    args.push_back(a->id);
    args.emplace_back(a->resent ? "1" : "0");
  }
  // Each acquisition's own call decides whether it is sent again after an error (with its id: one
  // granted is found, not taken twice).
  detail::evalAsync(*client_, kAcquireBatch, keyViews_, args, std::move(done), deadline);
}

void RateLimiter::Impl::answerTogether(Impl* self, const std::vector<std::shared_ptr<Pending>>& group, const Reply& r) {
  const std::size_t n = group.size();
  const std::string name = self != nullptr ? self->name_ : std::string("?");
  (void)detail::arrayReply("limiter ", name, r, 3 + 3 * n, "the batch acquire script");
  const std::int64_t rate = r.elements[0].asInteger();
  const std::chrono::microseconds nowUs{r.elements[1].asInteger()};
  const milliseconds interval{r.elements[2].asInteger()};
  if (self != nullptr) self->remember(rate, interval);
  std::vector<std::pair<detail::AcquireResult, std::exception_ptr>> results(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Pending& a = *group[i];
    const std::int64_t granted = r.elements[3 + 3 * i].asInteger();
    const std::int64_t wait = r.elements[4 + 3 * i].asInteger();
    detail::AcquireResult& out = results[i].first;
    if (granted < 0) {
      results[i].second = std::make_exception_ptr(InvalidArgument(
          fmt::format("redlimit: Requested permits amount ({}) cannot exceed defined rate ({}) of limiter {}",
                      a.atLeast, rate, name)));
      continue;
    }
    out.granted = granted;
    out.wait = detail::saturatingCast<std::chrono::microseconds>(milliseconds{granted > 0 ? 0 : wait});
    out.remaining = std::max<std::int64_t>(0, r.elements[5 + 3 * i].asInteger());
    out.rate = rate;
    out.grantTime = granted > 0 && wait < 0 ? std::chrono::microseconds{-wait} : nowUs;
    out.interval = interval;
    if (granted > 0) out.member = packedMember(a.id, granted);
  }
  // Each completion on its own: one that throws is reported and the loop goes on.
  for (std::size_t i = 0; i < n; ++i) finish(self, *group[i], std::move(results[i].first), results[i].second);
}

detail::AcquireResult RateLimiter::Impl::tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
  return ask(atLeast, checkRange(atLeast, atMost), detail::randomIdBytes());
}

namespace {
// A decision of the failure policy: no member, no interval, nothing recorded in Redis.
detail::AcquireResult policyResult(std::int64_t permits, bool granted) {
  detail::AcquireResult r;
  r.granted = granted ? permits : 0;
  r.byPolicy = true;
  return r;
}
}  // namespace

void RateLimiter::Impl::tryOnce(std::int64_t atLeast, std::int64_t atMost, const std::string& id, bool resend,
                                detail::SteadyTime deadline, AcquireCallback done) {
  auto a = std::make_shared<Pending>();
  a->atLeast = atLeast;
  a->atMost = atMost;
  a->id = id;
  if (atLeast < atMost) a->record = suffixName(name_, "grant:" + detail::hexOf(id));
  a->resent = resend;
  a->deadline = deadline;
  a->done = std::move(done);
  if (options_.coalesce && a->record.empty()) {  // a range is never coalesced: acquire_batch.lua takes whole ones
    Sender::submit(*this, coalescing_, std::move(a));
    return;
  }
  // The completion holds the handle weakly: requests in flight must not keep a dropped limiter (and
  // through it the Client and its I/O thread) alive; without it they are answered as they are.
  sendAlone(a, [weak = weak_from_this(), a](const Reply& r, std::exception_ptr error) {
    answerAlone(weak.lock().get(), *a, r, std::move(error));
  });
}

detail::LimiterCall::Params RateLimiter::Impl::decision(std::int64_t permits) const {
  detail::LimiterCall::Params p =
      detail::LimiterCall::decision(callBound_, permits, knownRate_.load(std::memory_order_relaxed),
                                    milliseconds{knownIntervalMs_.load(std::memory_order_relaxed)});
  p.senderCountsRequests = true;  // sendAlone() and sendTogether() count: a coalesced batch is one request
  return p;
}

detail::AcquireResult RateLimiter::Impl::ask(std::int64_t atLeast, std::int64_t atMost, const std::string& id) {
  return detail::runSync(
      *client_, gate_, decision(atLeast), "tryAcquire",
      [&](detail::SteadyTime deadline, bool resend) {
        return detail::awaitTry<detail::AcquireResult>(client_->options(), deadline, [&](AcquireCallback done) {
          tryOnce(atLeast, atMost, id, resend, deadline, std::move(done));
        });
      },
      [](detail::AcquireResult r) { return r; }, [&](bool allowed) { return policyResult(atLeast, allowed); });
}

void RateLimiter::Impl::askAsync(std::int64_t atLeast, std::int64_t atMost, std::string id, AcquireCallback done) {
  detail::runAsync<detail::AcquireResult, detail::AcquireResult>(
      shared_from_this(), decision(atLeast),
      [atLeast, atMost, id = std::move(id)](Impl& self, detail::SteadyTime deadline, AcquireCallback sent,
                                            bool resend) {
        self.tryOnce(atLeast, atMost, id, resend, deadline, std::move(sent));
      },
      [](std::exception_ptr error) { return error; },  // tryOnce reports the limiter's errors
      [](Impl*, const detail::AcquireResult& r) { return r; },
      [atLeast](Impl&, bool allowed) { return policyResult(atLeast, allowed); }, std::move(done));
}

void RateLimiter::Impl::tryAcquireUpToAsync(std::int64_t atLeast, std::int64_t atMost, AcquireCallback done) {
  std::int64_t most = 0;
  if (!detail::isolateThenCheck(done, gate_.monitor(), name_, [&] { most = checkRange(atLeast, atMost); })) return;
  askAsync(atLeast, most, detail::randomIdBytes(), std::move(done));
}

bool RateLimiter::Impl::admit(const detail::AcquireResult& r, std::int64_t permits) const {
  return gate_.monitor().admit(r.granted > 0, permits, r.wait, r.byPolicy);
}

bool RateLimiter::Impl::tryAcquire(std::int64_t permits) {
  checkPermits(permits);
  return admit(ask(permits, permits, detail::randomIdBytes()), permits);
}

bool RateLimiter::Impl::askUntil(std::int64_t permits, std::int64_t until, bool probe) {
  const ClockView& clock = gate_.clock();
  const std::string id = detail::randomIdBytes();  // one id per call: a resend can never be granted twice
  for (;;) {
    const detail::AcquireResult r = ask(permits, permits, id);
    if (r.granted > 0 || (r.wait.count() <= 0 && !probe)) return admit(r, permits);
    const std::chrono::microseconds wait =
        r.wait.count() > 0 ? r.wait : detail::saturatingCast<std::chrono::microseconds>(options_.failure.probeInterval);
    if (detail::saturatingAdd(clock.now().count(), wait.count()) > until) return admit(r, permits);
    clock.sleepFor(wait);
  }
}

bool RateLimiter::Impl::tryAcquire(std::int64_t permits, milliseconds timeout) {
  checkPermits(permits);
  if (gate_.monitor().shadow()) return tryAcquire(permits);  // shadow mode never waits
  // A timeout <= 0 means one attempt.
  const std::int64_t wait =
      std::max<std::int64_t>(detail::saturatingCast<std::chrono::microseconds>(timeout).count(), 0);
  return askUntil(permits, detail::saturatingAdd(gate_.clock().now().count(), wait), false);
}

void RateLimiter::Impl::acquire(std::int64_t permits) {
  checkPermits(permits);
  if (gate_.monitor().shadow()) {  // shadow mode never waits: one attempt, a denial let through
    (void)tryAcquire(permits);
    return;
  }
  (void)askUntil(permits, std::numeric_limits<std::int64_t>::max(), true);
}

std::int64_t RateLimiter::Impl::availablePermits() {
  const std::string now = nowArg(), expected = expectedRateArg();
  return evalCall(kAvailable, {now, expected}, detail::LimiterCall::Resend::IfClosed).asInteger();
}

RateLimiterConfig RateLimiter::Impl::getConfig() {
  const Reply r =
      detail::plainCommand(*this, "getConfig", {"HGETALL", keys_[0]}, detail::LimiterCall::Resend::IfClosed);
  if (r.type != Reply::Type::Array || r.elements.empty()) {
    throw NotInitializedError("ERR", fmt::format("redlimit: RateLimiter {} is not initialized", name_));
  }
  RateLimiterConfig cfg;
  bool haveRate = false, haveInterval = false, haveType = false;
  for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    const std::string& field = r.elements[i].str;
    const Reply& value = r.elements[i + 1];
    auto number = [&](std::int64_t lo, std::int64_t hi) {
      const std::optional<std::int64_t> read =
          value.type == Reply::Type::Integer ? std::optional<std::int64_t>(value.integer) : luaInteger(value.str);
      const std::int64_t v = read.value_or(lo - 1);
      if (v < lo || v > hi) {
        throw ScriptError(ErrorKind::InvalidConfig, "ERR",
                          fmt::format("redlimit: field {} of {} holds \"{}\", not an integer in {}..{}", field, name_,
                                      value.str, lo, hi));
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
    throw ScriptError(ErrorKind::InvalidConfig, "ERR",
                      fmt::format("redlimit: configuration of {} lacks rate, interval or type", name_));
  }
  remember(cfg.rate, cfg.rateInterval);
  return cfg;
}

std::int64_t RateLimiter::Impl::releasePermits(std::int64_t permits, const std::string& member) {
  if (permits < 0) throw InvalidArgument(fmt::format("redlimit: permits to release must be >= 0, got {}", permits));
  std::int64_t left = permits > kMaxRate ? kMaxRate : permits;
  std::int64_t released = 0;
  // Each script call looks at a bounded number of members and says whether it stopped early.
  while (left > 0) {
    const std::string n = fmt::to_string(left), now = nowArg(), expected = expectedRateArg();
    const Reply r =
        evalCall(kRelease, {n, member, now, expected}, detail::LimiterCall::Resend::Never);  // could give back twice
    (void)detail::arrayReply("limiter ", name_, r, 3, "the release script");
    const std::int64_t got = r.elements[0].asInteger();
    released += got;
    left -= got;
    if (r.elements[2].asInteger() == 0 || got <= 0) break;
  }
  return released;
}

void RateLimiter::Impl::release(std::int64_t permits) { (void)releasePermits(permits, ""); }

std::int64_t RateLimiter::Impl::releaseGrant(const std::string& member, std::int64_t permits) {
  if (member.empty()) throw InvalidArgument("redlimit: releaseGrant needs the member of a grant");
  return releasePermits(permits, member);
}

void RateLimiter::validateConfig(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  redlimit::checkConfig(type, rate, interval, keepAlive);
}

std::optional<std::int64_t> RateLimiter::Impl::releaseGrantBestEffort(const std::string& member, std::int64_t permits) {
  // Bad input and the no-op go to releaseGrant first: they cost no probe.
  if (!member.empty() && permits > 0 && !client_->admitBestEffort()) return std::nullopt;
  return releaseGrant(member, permits);
}

bool RateLimiter::Impl::decideUnanswered(std::int64_t permits, const std::string& reason) {
  return detail::decideUnanswered(gate_, permits, knownRate_.load(std::memory_order_relaxed),
                                  milliseconds{knownIntervalMs_.load(std::memory_order_relaxed)}, reason);
}

bool RateLimiter::Impl::expire(milliseconds ttl) {
  if (ttl.count() <= 0 || ttl > kMaxInterval) {
    throw InvalidArgument(
        fmt::format("redlimit: expire needs a TTL in 1..{} ms, got {} ms", kMaxInterval.count(), ttl.count()));
  }
  const std::string ms = fmt::to_string(ttl.count());
  return evalCall(kTtl, {"PEXPIRE", ms}, detail::LimiterCall::Resend::Never).asInteger() == 1;
}

bool RateLimiter::Impl::expireAt(std::chrono::system_clock::time_point when) {
  const auto ms = std::chrono::duration_cast<milliseconds>(when.time_since_epoch()).count();
  if (ms <= 0) throw InvalidArgument("redlimit: expireAt needs a time after the epoch");
  const std::string arg = fmt::to_string(ms);
  return evalCall(kTtl, {"PEXPIREAT", arg}, detail::LimiterCall::Resend::Never).asInteger() == 1;
}

bool RateLimiter::Impl::clearExpire() {
  return evalCall(kTtl, {"PERSIST", ""}, detail::LimiterCall::Resend::Never).asInteger() == 1;
}

milliseconds RateLimiter::Impl::remainTimeToLive() {
  return milliseconds{
      detail::integerCommand(*this, "remainTimeToLive", {"PTTL", keys_[0]}, detail::LimiterCall::Resend::IfClosed)};
}

bool RateLimiter::Impl::isExists() { return detail::keyExists(*this, keys_[0]); }

bool RateLimiter::Impl::deleteLimiter() {
  knownRate_.store(0, std::memory_order_relaxed);
  return detail::integerCommand(*this, "deleteLimiter", {"DEL", keys_[0], keys_[1], keys_[2], keys_[3], keys_[4]},
                                detail::LimiterCall::Resend::Never) > 0;
}

// --- The handle: forwards to the shared state ----------------------------------------------------

RateLimiter::RateLimiter(std::shared_ptr<Client> client, std::string name, RateLimiter::Options options)
    : impl_(std::make_shared<Impl>(std::move(client), std::move(name), std::move(options))) {}

bool RateLimiter::trySetRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  return impl_->trySetRate(type, rate, interval, keepAlive);
}
void RateLimiter::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  impl_->setRate(type, rate, interval, keepAlive);
}
void RateLimiter::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                          bool keepState) {
  impl_->setRate(type, rate, interval, keepAlive, keepState);
}
bool RateLimiter::updateRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  return impl_->updateRate(type, rate, interval, keepAlive);
}
bool RateLimiter::tryAcquire(std::int64_t permits) { return impl_->tryAcquire(permits); }
bool RateLimiter::tryAcquire(std::int64_t permits, milliseconds timeout) { return impl_->tryAcquire(permits, timeout); }
void RateLimiter::acquire(std::int64_t permits) { impl_->acquire(permits); }
namespace {

// An acquire of exactly `permits` as a Decision; `knownRate` is the limit reported for a decision
// of the failure policy.
Decision decisionOf(const detail::AcquireResult& r, std::int64_t permits, std::int64_t knownRate) {
  if (r.byPolicy) return detail::policyDecision(permits, r.granted > 0, knownRate);
  Decision d;
  d.allowed = r.granted > 0;
  d.permits = permits;
  d.remaining = r.remaining;
  d.retryAfter = d.allowed ? std::chrono::microseconds{0} : r.wait;
  d.resetAfter = r.interval;
  d.limit = r.rate;
  d.time = r.grantTime;
  return d;
}

}  // namespace

Decision RateLimiter::decide(std::int64_t permits) {
  Decision d =
      decisionOf(impl_->tryAcquireUpTo(permits, permits), permits, impl_->knownRate_.load(std::memory_order_relaxed));
  impl_->gate_.monitor().admit(d);
  return d;
}
void RateLimiter::decideAsync(std::int64_t permits, std::function<void(Decision, std::exception_ptr)> done) {
  impl_->tryAcquireUpToAsync(permits, permits,
                             [weak = std::weak_ptr<Impl>(impl_), monitor = impl_->gate_.monitor(), permits,
                              done = std::move(done)](const detail::AcquireResult& r, std::exception_ptr error) {
                               if (error) {
                                 done(Decision{}, std::move(error));
                                 return;
                               }
                               const auto self = weak.lock();
                               Decision d =
                                   decisionOf(r, permits, self ? self->knownRate_.load(std::memory_order_relaxed) : 0);
                               monitor.admit(d);
                               done(d, nullptr);
                             });
}
std::future<Decision> RateLimiter::decideAsync(std::int64_t permits) {
  return detail::futureOf<Decision>([&](auto done) { decideAsync(permits, std::move(done)); });
}
void RateLimiter::tryAcquireAsync(std::int64_t permits, std::function<void(bool, std::exception_ptr)> done) {
  // decideAsync counts the decision and isolates `done` (a throw from it is reported, once).
  decideAsync(permits, [done = std::move(done)](const Decision& d, std::exception_ptr error) {
    const bool granted = !error && d.allowed;
    done(granted, std::move(error));  // moved: the caller's reference is the last one
  });
}
std::future<bool> RateLimiter::tryAcquireAsync(std::int64_t permits) {
  return detail::futureOf<bool>([&](auto done) { tryAcquireAsync(permits, std::move(done)); });
}
std::int64_t RateLimiter::availablePermits() { return impl_->availablePermits(); }
RateLimiterConfig RateLimiter::getConfig() { return impl_->getConfig(); }
void RateLimiter::release(std::int64_t permits) { impl_->release(permits); }
bool RateLimiter::expire(milliseconds ttl) { return impl_->expire(ttl); }
bool RateLimiter::expireAt(std::chrono::system_clock::time_point when) { return impl_->expireAt(when); }
bool RateLimiter::clearExpire() { return impl_->clearExpire(); }
milliseconds RateLimiter::remainTimeToLive() { return impl_->remainTimeToLive(); }
bool RateLimiter::isExists() { return impl_->isExists(); }
bool RateLimiter::deleteLimiter() { return impl_->deleteLimiter(); }
const std::string& RateLimiter::getName() const noexcept { return impl_->name_; }
const std::vector<std::string>& RateLimiter::keys() const noexcept { return impl_->keys_; }
const std::shared_ptr<Client>& RateLimiter::client() const noexcept { return impl_->client_; }
FailureStats RateLimiter::failureStats() const { return impl_->gate_.stats(); }
const LimiterMonitor& RateLimiter::monitor() const noexcept { return impl_->gate_.monitor(); }

// --- The segment cache's access ------------------------------------------------------------------

namespace detail {

void SegmentAccess<RateLimiter>::check(const RateLimiter& /*source*/, const std::string& /*key*/) {}

LimiterMonitor SegmentAccess<RateLimiter>::monitor(const RateLimiter& source) { return source.monitor(); }

detail::AcquireResult SegmentAccess<RateLimiter>::tryAcquireUpTo(RateLimiter& source, const std::string& /*key*/,
                                                                 std::int64_t atLeast, std::int64_t atMost) {
  return source.impl_->tryAcquireUpTo(atLeast, atMost);
}

std::optional<std::int64_t> SegmentAccess<RateLimiter>::releaseGrantBestEffort(RateLimiter& source,
                                                                               const std::string& /*key*/,
                                                                               const std::string& member,
                                                                               std::int64_t permits) {
  return source.impl_->releaseGrantBestEffort(member, permits);
}

bool SegmentAccess<RateLimiter>::decideUnanswered(RateLimiter& source, const std::string& /*key*/, std::int64_t permits,
                                                  const std::string& reason) {
  return source.impl_->decideUnanswered(permits, reason);
}

std::int64_t SegmentAccess<RateLimiter>::releaseGrant(RateLimiter& source, const std::string& member,
                                                      std::int64_t permits) {
  return source.impl_->releaseGrant(member, permits);
}

void SegmentAccess<RateLimiter>::tryAcquireUpToAsync(
    RateLimiter& source, std::int64_t atLeast, std::int64_t atMost,
    std::function<void(detail::AcquireResult, std::exception_ptr)> done) {
  source.impl_->tryAcquireUpToAsync(atLeast, atMost, std::move(done));
}

}  // namespace detail

}  // namespace redlimit
