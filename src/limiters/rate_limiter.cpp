#include "redlimit/rate_limiter.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "limiters/batcher.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "limiters/deny_answers.hpp"
#include "limiters/future_of.hpp"
#include "limiters/limiter_call.hpp"
#include "limiters/script_call.hpp"
#include "limiters/script_helpers.hpp"
#include "base/random.hpp"
#include "base/wall_clock.hpp"
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

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Resend = detail::LimiterCall::Resend;

Script script(const detail::lua::EmbeddedScript& s) { return Script{s.name, s.sha1, s.source}; }

const Script kAcquire = script(detail::lua::acquire);
const Script kAcquireBatch = script(detail::lua::acquire_batch);
// Most acquisitions one coalesced call decides (acquire_batch.lua's limit).
constexpr std::size_t kMaxCoalesced = 64;
const Script kAvailable = script(detail::lua::available_permits);
const Script kRelease = script(detail::lua::release);
const Script kSetRate = script(detail::lua::set_rate);
const Script kTtl = script(detail::lua::ttl);

// The deny cache's one key: a RateLimiter handle is one limiter.
constexpr std::string_view kDenyKey{};
// How much sooner than a denial's retryAfter the same call may be granted: acquire.lua rounds its
// wait up to whole ms (lua/lib/redisson.lua's denialWait), so the deny cache remembers 1 ms less.
constexpr microseconds kWaitRounding{1000};

static_assert(RateLimiter::kMaxRate == detail::kMaxPermits, "permits are checked as every limiter's");

// A time in ms that RateLimiter takes (an interval, a keepAliveTime, a TTL): in lo..kMaxInterval,
// else InvalidArgument naming `what`. RateLimiter's bound is Redisson's (10^12 ms, its contract
// with the Java services that share the limiter), not every other limiter's detail::kMaxInterval.
void checkMillis(std::string_view what, milliseconds value, milliseconds lo) {
  detail::checkCount(what, value.count(), lo.count(), RateLimiter::kMaxInterval.count());
}

// The suffixes of a limiter's state keys (Redisson's and redlimit's own partial-grant records):
// value, permits, and value:..., permits:..., grant:...
bool isStateSuffix(std::string_view suffix) {
  const std::string_view head = suffix.substr(0, suffix.find(':'));
  return head == "value" || head == "permits" || (head == "grant" && head.size() < suffix.size());
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
    if (isStateSuffix(std::string_view(name).substr(p + 1))) {
      throw InvalidArgument(
          fmt::format("redlimit: limiter name \"{}\" is a state key of the limiter \"{}\" (it "
                      "ends in :{}); choose a name that does not end in :value, :permits or :grant",
                      name, name.substr(0, p), name.substr(p + 1)));
    }
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

// A decision of the failure policy: no member, no interval, nothing recorded in Redis.
detail::AcquireResult policyResult(std::int64_t permits, bool granted) {
  return detail::AcquireResult{granted ? permits : 0, {}, 0, 0, {}, {}, {}, true};
}

// The monitor of a handle whose arguments pass every limiter's checks and Redisson's (made only
// then: a refused name must not take a place in the metrics registry).
LimiterMonitor checkedMonitor(const std::shared_ptr<Client>& client, const std::string& name,
                              const LimiterMonitor::Options& options) {
  if (client) {
    checkName(name);
    const std::string& id = client->clientId();
    if (id.empty() || id.size() > RateLimiter::kMaxClientIdLength || id.find_first_of("{}") != std::string::npos) {
      throw InvalidArgument(
          fmt::format("redlimit: ClientOptions::clientId must be 1..{} bytes without '{{' or '}}', "
                      "got \"{}\"",
                      RateLimiter::kMaxClientIdLength, id.substr(0, 64)));
    }
  }
  return detail::checkedMonitor(client, name, options);
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

  // tryAcquire with or without a timeout and acquire (Redisson's: nothing is taken ahead of time):
  // checks `permits`, then asks for them under one id, sleeping each wait the script reports on the
  // limiter's clock (its failure gate's), until granted or the next wait would end after `until`
  // (µs on that clock). A denial by the failure policy (no wait known) ends it, or with `probe` is
  // asked again after a probe interval. Shadow mode never waits: one attempt, a denial let through.
  // Counts the outcome; returns what the caller gets.
  bool askUntil(std::int64_t permits, std::int64_t until, bool probe) {
    detail::checkPermitRange(permits);
    const ClockView& clock = gate_.clock();
    const LimiterMonitor& monitor = gate_.monitor();
    const auto admit = [&](const detail::AcquireResult& r) {
      return monitor.admit(r.granted > 0, permits, r.wait, r.byPolicy);
    };
    const std::string id = detail::randomIdBytes();  // one id per call: a resend can never be granted twice
    for (;;) {
      const detail::AcquireResult r = ask(permits, permits, id);
      if (r.granted > 0 || (r.wait.count() <= 0 && !probe) || monitor.shadow()) return admit(r);
      const microseconds wait =
          r.wait.count() > 0 ? r.wait : detail::saturatingCast<microseconds>(options_.failure.probeInterval);
      if (detail::saturatingAdd(clock.now().count(), wait.count()) > until) return admit(r);
      clock.sleepFor(wait);
    }
  }
  detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
    return ask(atLeast, checkRange(atLeast, atMost), detail::randomIdBytes());
  }
  void tryAcquireUpToAsync(std::int64_t atLeast, std::int64_t atMost, AcquireCallback done) {
    if (!detail::checkedOrAnswered(done, gate_.monitor(), name_, [&] { atMost = checkRange(atLeast, atMost); })) return;
    // ask() without waiting: `done` once, on the I/O thread (on this one when decided without sending).
    detail::runAsync<detail::AcquireResult, detail::AcquireResult>(
        shared_from_this(), decision(atLeast),
        [atLeast, atMost, id = detail::randomIdBytes()](Impl& self, detail::SteadyTime deadline, AcquireCallback sent,
                                                        bool resend) {
          self.tryOnce(atLeast, atMost, id, resend, deadline, std::move(sent));
        },
        [](std::exception_ptr error) { return error; },  // tryOnce reports the limiter's errors
        [](Impl*, const detail::AcquireResult& r) { return r; },
        [atLeast](Impl&, bool allowed) { return policyResult(atLeast, allowed); }, std::move(done));
  }
  // An acquisition of exactly `permits` (`r`) as a Decision, counted in `monitor` (shadow mode
  // applied); a decision of the failure policy reports the limit `self` saw last (none when `self`
  // is null: the handle is gone).
  static Decision admitted(const Impl* self, const LimiterMonitor& monitor, const detail::AcquireResult& r,
                           std::int64_t permits) {
    const bool allowed = r.granted > 0;
    const std::int64_t knownRate = self != nullptr ? self->knownRate_.load(std::memory_order_relaxed) : 0;
    Decision d = r.byPolicy
                     ? detail::policyDecision(permits, allowed, knownRate)
                     : detail::decisionOf({allowed, r.remaining, allowed ? 0 : r.wait.count(),
                                           microseconds(r.interval).count(), r.rate, r.grantTime.count(), 0, 0, 0},
                                          permits);
    monitor.admit(d);
    return d;
  }

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
  static void finish(Impl* self, Pending& attempt, detail::AcquireResult result, std::exception_ptr error) noexcept {
    detail::callOnce(attempt.done, self != nullptr ? &self->gate_.monitor() : nullptr,
                     self != nullptr ? std::string_view(self->name_) : std::string_view(), std::move(result),
                     std::move(error));
  }
  // The limiter's name in a reply's error (`self` may be null: the handle is gone).
  static std::string nameOf(const Impl* self) { return self != nullptr ? self->name_ : std::string("?"); }

  // What Sender sends (limiters/batcher.hpp): an acquisition alone with acquire.lua, a group of
  // whole ones with acquire_batch.lua; and how their replies and errors reach each attempt (`self`
  // may be null: the handle is gone; when not, it remembers the configuration seen).
  void sendAlone(const std::shared_ptr<Pending>& a, detail::ReplyCallback done) {
    gate_.monitor().roundTrip();  // the protocol leaves the count to this sender (a batch is one request)
    const std::string most = fmt::to_string(a->atMost), least = fmt::to_string(a->atLeast), now = nowArg(),
                      expected = expectedRateArg();
    // A call that may be partial (atLeast < atMost) names the record a partial grant leaves of its
    // size, so that a resend finds its member in O(1); other calls never touch it and pass the
    // hash key in its place (wholeKeyViews_: no key list made per call).
    std::vector<std::string_view> rangeKeys;
    if (!a->record.empty()) {
      rangeKeys = keyViews_;
      rangeKeys.push_back(a->record);
    }
    detail::evalAsync(*client_, kAcquire, a->record.empty() ? wholeKeyViews_ : rangeKeys,
                      {most, least, a->id, now, a->resent ? "1" : "0", recordTtl_, expected}, std::move(done),
                      a->deadline);
  }
  void sendTogether(const std::vector<std::shared_ptr<Pending>>& group, detail::SteadyTime deadline,
                    detail::ReplyCallback done) {
    gate_.monitor().roundTrip();
    const std::string now = nowArg(), expected = expectedRateArg(), count = fmt::to_string(group.size());
    std::vector<std::string> permits(group.size());
    std::vector<std::string_view> args{now, expected, count};
    args.reserve(3 + 3 * group.size());
    for (std::size_t i = 0; i < group.size(); ++i) {
      permits[i] = fmt::to_string(group[i]->atLeast);
      args.insert(args.end(), {permits[i], group[i]->id, group[i]->resent ? "1" : "0"});
    }
    // Each acquisition's own call decides whether it is sent again after an error (with its id: one
    // granted is found, not taken twice).
    detail::evalAsync(*client_, kAcquireBatch, keyViews_, args, std::move(done), deadline);
  }
  static void answerAlone(Impl* self, Pending& a, const Reply& r, std::exception_ptr error) noexcept {
    detail::AcquireResult out;  // none when the call failed: its error, as the limiter's
    try {
      if (!error) out = acquired(self, a, packedAcquire(self, r));
    } catch (...) {
      error = std::current_exception();
    }
    finish(self, a, std::move(out), error ? detail::limiterError(std::move(error)) : nullptr);
  }
  static void answerTogether(Impl* self, const std::vector<std::shared_ptr<Pending>>& group, const Reply& r) {
    const std::size_t n = group.size();
    (void)detail::arrayReply("limiter ", nameOf(self), r, 3 + 3 * n, "the batch acquire script");
    std::vector<std::pair<detail::AcquireResult, std::exception_ptr>> results(n);
    for (std::size_t i = 0; i < n; ++i) {
      try {
        const auto field = [&r](std::size_t at) { return r.elements[at].asInteger(); };
        const std::size_t at = 3 + 3 * i;
        results[i].first =
            acquired(self, *group[i], {field(at), field(at + 1), field(at + 2), field(0), field(1), field(2)});
      } catch (const InvalidArgument&) {  // that acquisition's only; a reply that cannot be read answers none
        results[i].second = std::current_exception();
      }
    }
    // Each completion on its own: one that throws is reported and the loop goes on.
    for (std::size_t i = 0; i < n; ++i) finish(self, *group[i], std::move(results[i].first), results[i].second);
  }
  // What acquire.lua answers one acquisition, and acquire_batch.lua each of its group's: granted
  // (0 = denied, -1 = more than the rate), the wait after a denial in ms (or a resent acquisition's
  // earlier grant's stamp, negated), the permits left; then the configuration and time they were
  // decided under: rate, now in µs, interval in ms.
  using AcquireValues = std::array<std::int64_t, 6>;
  // acquire.lua's reply: the six values packed as little-endian int64 (lua/acquire.lua's REPLY).
  static AcquireValues packedAcquire(const Impl* self, const Reply& r) {
    AcquireValues v{};
    if (r.type != Reply::Type::String || r.str.size() != 8 * v.size()) {
      throw ReplyError(ErrorKind::UnexpectedReply, "",
                       fmt::format("redlimit: limiter {}: expected {} packed bytes from the acquire script, got {}",
                                   nameOf(self), 8 * v.size(), r.describe()));
    }
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = detail::packedInt64(r.str, 8 * i);
    return v;
  }
  // The answer to `a`, whose configuration `self` remembers. When granted, the member the scripts
  // pack (length byte, id, permits as little-endian uint32).
  static detail::AcquireResult acquired(Impl* self, const Pending& a, const AcquireValues& v) {
    const std::int64_t granted = v[0], wait = v[1], remaining = v[2], rate = v[3], now = v[4];
    const milliseconds interval{v[5]};
    if (self != nullptr) self->remember(rate, interval);
    if (granted < 0) {
      throw InvalidArgument(
          fmt::format("redlimit: Requested permits amount ({}) cannot exceed defined rate ({}) of limiter {}",
                      a.atLeast, rate, nameOf(self)));
    }
    detail::AcquireResult out{granted, {},   std::max<std::int64_t>(0, remaining), rate, microseconds{now}, interval,
                              {},      false};
    if (granted == 0) {
      out.wait = detail::saturatingCast<microseconds>(milliseconds{wait});
      return out;
    }
    if (wait < 0) out.grantTime = microseconds{-wait};
    out.member.reserve(1 + a.id.size() + 4);
    out.member.push_back(static_cast<char>(a.id.size()));
    out.member += a.id;
    for (int i = 0; i < 4; ++i)
      out.member.push_back(static_cast<char>((static_cast<std::uint64_t>(granted) >> (8 * i)) & 0xFF));
    return out;
  }
  // One try of an acquisition of atLeast..atMost under `id` (`resend`: a later try of the call):
  // sent, or queued while this handle has a group in flight on each connection
  // (RateLimiter::Options::coalesce); `done` gets its outcome on the I/O thread.
  void tryOnce(std::int64_t atLeast, std::int64_t atMost, const std::string& id, bool resend,
               detail::SteadyTime deadline, AcquireCallback done) {
    auto a = std::make_shared<Pending>(
        Pending{atLeast, atMost, id, atLeast < atMost ? suffixName(name_, "grant:" + detail::hexOf(id)) : std::string(),
                resend, deadline, std::move(done)});
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
  // The call protocol's parameters of an acquisition of `permits` (at least): a deciding call,
  // with the configuration last seen for the failure policy.
  detail::LimiterCall::Params decision(std::int64_t permits) const {
    detail::LimiterCall::Params p =
        detail::LimiterCall::decision(callBound_, permits, knownRate_.load(std::memory_order_relaxed),
                                      milliseconds{knownIntervalMs_.load(std::memory_order_relaxed)});
    p.senderCountsRequests = true;  // sendAlone() and sendTogether() count: a coalesced batch is one request
    return p;
  }
  // An acquisition of atLeast..atMost under `id` through the call protocol: the failure gate, the
  // resend after a closed connection, the failure policy's decision (granted = atLeast or 0,
  // wait = 0, no member) when Redis cannot be asked.
  detail::AcquireResult ask(std::int64_t atLeast, std::int64_t atMost, const std::string& id) {
    return detail::runSync(
        *client_, gate_, decision(atLeast), "tryAcquire",
        [&](detail::SteadyTime deadline, bool resend) {
          return detail::awaitTry<detail::AcquireResult>(client_->options(), deadline, [&](AcquireCallback done) {
            tryOnce(atLeast, atMost, id, resend, deadline, std::move(done));
          });
        },
        [](detail::AcquireResult r) { return r; }, [&](bool allowed) { return policyResult(atLeast, allowed); });
  }

  // checkPermitRange(atLeast) and atMost >= atLeast; returns atMost, at most kMaxRate. Only what is
  // invalid whatever the rate: the rate itself may have been raised by another process since this
  // handle last saw it, so `permits > rate` is the script's to decide.
  static std::int64_t checkRange(std::int64_t atLeast, std::int64_t atMost) {
    detail::checkPermitRange(atLeast);
    if (atMost < atLeast) throw InvalidArgument(fmt::format("redlimit: atMost ({}) < atLeast ({})", atMost, atLeast));
    return std::min(atMost, kMaxRate);
  }
  // The configuration last seen in a reply, for the client-side permits check and the Local policy.
  void remember(std::int64_t rate, milliseconds interval) noexcept {
    knownRate_.store(rate, std::memory_order_relaxed);
    knownIntervalMs_.store(interval.count(), std::memory_order_relaxed);
  }
  // release.lua for up to `permits` from `member` ('' = the newest grants); returns how many went
  // back. Not sent again: a resend could give back twice.
  std::int64_t releasePermits(std::int64_t permits, const std::string& member) {
    if (permits < 0) throw InvalidArgument(fmt::format("redlimit: permits to release must be >= 0, got {}", permits));
    std::int64_t left = std::min(permits, kMaxRate), released = 0;
    // Each script call looks at a bounded number of members and says whether it stopped early.
    while (left > 0) {
      const Reply r =
          call("release", kRelease, {fmt::to_string(left), member, nowArg(), expectedRateArg()}, Resend::Never);
      const std::int64_t got =
          detail::arrayReply("limiter ", name_, r, 3, "the release script").elements[0].asInteger();
      released += got;
      left -= got;
      if (r.elements[2].asInteger() == 0 || got <= 0) break;
    }
    return released;
  }
  // set_rate.lua in `mode` (try, reset, keep, update): true if it wrote the configuration (then
  // remembered; a try that did not write forgets the rate seen: another one is in force). Not sent
  // again: a second "try" after a first that was applied would answer its own write.
  bool writeRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                 std::string_view mode) {
    validateConfig(type, rate, interval, keepAlive);
    const detail::ForgetAfter forget(*denials_, kDenyKey);  // a rate written here may grant sooner
    const bool written =
        call("setRate", kSetRate,
             {fmt::to_string(rate), fmt::to_string(interval.count()), fmt::to_string(static_cast<int>(type)),
              fmt::to_string(keepAlive.count()), std::string(mode), nowArg()},
             Resend::Never)
            .asInteger() == 1;
    if (written) remember(rate, interval);
    if (!written && mode == "try") knownRate_.store(0, std::memory_order_relaxed);  // someone else's rate is in force
    return written;
  }
  // ttl.lua's `command` (PEXPIRE, PEXPIREAT or PERSIST, with `arg`) on the limiter's five keys: true
  // if any changed. Not sent again: a second PERSIST after a first that went through answers 0.
  bool setTtl(const char* command, std::string arg) {
    return call("expire", kTtl, {command, std::move(arg)}, Resend::Never).asInteger() == 1;
  }
  // `script` with `args` on the five keys, a call named `what` that takes no decision (a read, a
  // configuration write, a give-back), through the call protocol (a ScriptOp run by runOp), errors
  // as the limiter's; sent again after a closed connection if `resend` says so. Its reply.
  Reply call(std::string_view what, const Script& script, std::vector<std::string> args, Resend resend) {
    const detail::ScriptOp<Impl, Reply> op{detail::LimiterCall::plain(callBound_, resend), what,
                                           detail::ScriptRequest{&script, keys_, std::move(args), nullptr, nullptr},
                                           [](Impl*, const Reply& r) { return r; }};
    return detail::runOp(*this, op, &detail::limiterError);
  }
  // The scripts' now: '' for the server's clock, else this host's, epoch µs.
  std::string nowArg() const {
    if (options_.timeSource == TimeSource::Server) return {};
    return fmt::to_string(detail::systemNow().count());
  }
  // The rate this handle saw last, for the scripts' check of a configuration changed elsewhere
  // ('' if none was seen yet).
  std::string expectedRateArg() const {
    const std::int64_t rate = knownRate_.load(std::memory_order_relaxed);
    return rate > 0 ? fmt::to_string(rate) : std::string();
  }

  std::shared_ptr<Client> client_;
  std::string name_;
  RateLimiter::Options options_;
  std::vector<std::string> keys_;
  std::vector<std::string_view> keyViews_;
  // acquire.lua's keys for a whole acquisition (atLeast == atMost): the five, then the hash key in
  // the partial-grant record's place.
  std::vector<std::string_view> wholeKeyViews_;
  // The longest one call may take, resends after a closed connection included: connect timeout +
  // command timeout (saturating).
  milliseconds callBound_{0};
  std::string recordTtl_;                         // ms a partial grant's record is kept (acquire.lua ARGV[6])
  std::atomic<std::int64_t> knownRate_{0};        // last rate seen from Redis; 0 = unknown
  std::atomic<std::int64_t> knownIntervalMs_{0};  // last interval seen from Redis; 0 = unknown
  // This limiter (one key: kDenyKey) while Redis denied it, answered locally by decide and
  // tryAcquire without a timeout until its retryAfter (less kWaitRounding).
  std::shared_ptr<detail::LimiterDenyCache> denials_;
  detail::FailureGate gate_;
  // The coalescing queue (RateLimiter::Options::coalesce): whole acquisitions that arrive while a
  // group is in flight on each connection go together as one acquire_batch.lua call
  // (limiters/batcher.hpp).
  Sender::Queue coalescing_;
};

RateLimiter::Impl::Impl(std::shared_ptr<Client> client, std::string name, RateLimiter::Options options)
    : client_(std::move(client)),
      name_(std::move(name)),
      options_(std::move(options)),
      denials_((detail::checkDenyCacheKeys(options_.denyCacheKeys, name_),
                std::make_shared<detail::LimiterDenyCache>(std::min<std::size_t>(options_.denyCacheKeys, 1)))),
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
  wholeKeyViews_ = keyViews_;
  wholeKeyViews_.push_back(keys_[0]);
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

void RateLimiter::validateConfig(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  if (type != RateType::Overall && type != RateType::PerClient) {
    throw InvalidArgument("redlimit: unknown RateType");
  }
  detail::checkCount("rate", rate, 1, kMaxRate);
  checkMillis("rateInterval (ms)", interval, milliseconds{1});
  if (keepAlive.count() != 0) checkMillis("keepAliveTime (ms; 0, or at least rateInterval)", keepAlive, interval);
}

// --- The handle: its calls, on the shared state --------------------------------------------------

RateLimiter::RateLimiter(std::shared_ptr<Client> client, std::string name, RateLimiter::Options options)
    : impl_(std::make_shared<Impl>(std::move(client), std::move(name), std::move(options))) {}

bool RateLimiter::trySetRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  return impl_->writeRate(type, rate, interval, keepAlive, "try");
}
void RateLimiter::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  setRate(type, rate, interval, keepAlive, false);
}
void RateLimiter::setRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive,
                          bool keepState) {
  (void)impl_->writeRate(type, rate, interval, keepAlive, keepState ? "keep" : "reset");
}
bool RateLimiter::updateRate(RateType type, std::int64_t rate, milliseconds interval, milliseconds keepAlive) {
  return impl_->writeRate(type, rate, interval, keepAlive, "update");
}
bool RateLimiter::tryAcquire(std::int64_t permits) { return decide(permits).allowed; }
bool RateLimiter::tryAcquire(std::int64_t permits, milliseconds timeout) {
  // A timeout <= 0 means one attempt.
  const std::int64_t wait = std::max<std::int64_t>(detail::saturatingCast<microseconds>(timeout).count(), 0);
  return impl_->askUntil(permits, detail::saturatingAdd(impl_->gate_.clock().now().count(), wait), false);
}
void RateLimiter::acquire(std::int64_t permits) {
  (void)impl_->askUntil(permits, std::numeric_limits<std::int64_t>::max(), true);
}
Decision RateLimiter::decide(std::int64_t permits) {
  Impl& impl = *impl_;
  detail::checkPermitRange(permits);  // before the cache: it holds only valid calls
  return detail::decideThrough(
      *impl.denials_, kDenyKey, permits, impl.gate_.monitor(), kWaitRounding, impl.client_->onIoThread(),
      [&] { return Impl::admitted(&impl, impl.gate_.monitor(), impl.tryAcquireUpTo(permits, permits), permits); });
}
void RateLimiter::decideAsync(std::int64_t permits, std::function<void(Decision, std::exception_ptr)> done) {
  Impl& impl = *impl_;
  detail::decideThroughAsync(
      impl.denials_, kDenyKey, permits, impl.gate_.monitor(), impl.name_, kWaitRounding,
      [permits] { detail::checkPermitRange(permits); },
      [&](std::function<void(Decision, std::exception_ptr)> asked) {
        impl.tryAcquireUpToAsync(permits, permits,
                                 [weak = std::weak_ptr<Impl>(impl_), monitor = impl.gate_.monitor(), permits,
                                  asked = std::move(asked)](const detail::AcquireResult& r, std::exception_ptr error) {
                                   if (error) return asked(Decision{}, std::move(error));
                                   asked(Impl::admitted(weak.lock().get(), monitor, r, permits), nullptr);
                                 });
      },
      std::move(done));
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
std::int64_t RateLimiter::availablePermits() {
  return impl_->call("availablePermits", kAvailable, {impl_->nowArg(), impl_->expectedRateArg()}, Resend::IfClosed)
      .asInteger();
}
RateLimiterConfig RateLimiter::getConfig() {
  Impl& impl = *impl_;
  const Reply r = detail::plainCommand(impl, "getConfig", {"HGETALL", impl.keys_[0]}, Resend::IfClosed);
  if (r.type != Reply::Type::Array || r.elements.empty()) {
    throw NotInitializedError("ERR", fmt::format("redlimit: RateLimiter {} is not initialized: call trySetRate() or "
                                                 "setRate() first (as Redisson's RRateLimiter)",
                                                 impl.name_));
  }
  // The fields read, each with its bounds (validateConfig's); keepAliveTime may be missing (0).
  struct Field {
    const char* name;
    std::int64_t lo, hi;
    std::optional<std::int64_t> value;
  } fields[] = {{"rate", 1, kMaxRate, {}},
                {"interval", 1, kMaxInterval.count(), {}},
                {"type", 0, 1, {}},
                {"keepAliveTime", 0, kMaxInterval.count(), 0}};
  for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    const Reply& value = r.elements[i + 1];
    for (Field& f : fields) {
      if (r.elements[i].str != f.name) continue;
      f.value = value.type == Reply::Type::Integer ? std::optional<std::int64_t>(value.integer) : luaInteger(value.str);
      if (!f.value || *f.value < f.lo || *f.value > f.hi) {
        throw ScriptError(ErrorKind::InvalidConfig, "ERR",
                          fmt::format("redlimit: field {} of {} holds \"{}\", not an integer in {}..{}", f.name,
                                      impl.name_, value.str, f.lo, f.hi));
      }
    }
  }
  const auto [rate, interval, type, keepAlive] = fields;
  if (!rate.value || !interval.value || !type.value) {
    throw ScriptError(ErrorKind::InvalidConfig, "ERR",
                      fmt::format("redlimit: configuration of {} lacks rate, interval or type", impl.name_));
  }
  impl.remember(*rate.value, milliseconds{*interval.value});
  return RateLimiterConfig{*type.value == 0 ? RateType::Overall : RateType::PerClient, *rate.value,
                           milliseconds{*interval.value}, milliseconds{*keepAlive.value}};
}
void RateLimiter::release(std::int64_t permits) {
  const detail::ForgetAfter forget(*impl_->denials_, kDenyKey);
  (void)impl_->releasePermits(permits, "");
}
bool RateLimiter::expire(milliseconds ttl) {
  checkMillis("expire's TTL (ms)", ttl, milliseconds{1});
  return impl_->setTtl("PEXPIRE", fmt::to_string(ttl.count()));
}
bool RateLimiter::expireAt(std::chrono::system_clock::time_point when) {
  const auto ms = std::chrono::duration_cast<milliseconds>(when.time_since_epoch()).count();
  if (ms <= 0) throw InvalidArgument("redlimit: expireAt needs a time after the epoch");
  return impl_->setTtl("PEXPIREAT", fmt::to_string(ms));
}
bool RateLimiter::clearExpire() { return impl_->setTtl("PERSIST", ""); }
milliseconds RateLimiter::remainTimeToLive() {
  return milliseconds{detail::integerCommand(*impl_, "remainTimeToLive", {"PTTL", impl_->keys_[0]}, Resend::IfClosed)};
}
bool RateLimiter::isExists() { return detail::keyExists(*impl_, impl_->keys_[0]); }
bool RateLimiter::deleteLimiter() {
  const detail::ForgetAfter forget(*impl_->denials_, kDenyKey);
  const std::vector<std::string>& k = impl_->keys_;
  impl_->knownRate_.store(0, std::memory_order_relaxed);
  return detail::integerCommand(*impl_, "deleteLimiter", {"DEL", k[0], k[1], k[2], k[3], k[4]}, Resend::Never) > 0;
}
const std::string& RateLimiter::getName() const noexcept { return impl_->name_; }
const std::vector<std::string>& RateLimiter::keys() const noexcept { return impl_->keys_; }
const std::shared_ptr<Client>& RateLimiter::client() const noexcept { return impl_->client_; }
FailureStats RateLimiter::failureStats() const { return impl_->gate_.stats(); }
const LimiterMonitor& RateLimiter::monitor() const noexcept { return impl_->gate_.monitor(); }

// --- The segment cache's access ------------------------------------------------------------------

namespace detail {

using RateLimiterAccess = SegmentAccess<RateLimiter>;

void RateLimiterAccess::check(const RateLimiter& /*source*/, const std::string& /*key*/) {}

LimiterMonitor RateLimiterAccess::monitor(const RateLimiter& source) { return source.monitor(); }

AcquireResult RateLimiterAccess::tryAcquireUpTo(RateLimiter& source, const std::string& /*key*/, std::int64_t atLeast,
                                                std::int64_t atMost) {
  return source.impl_->tryAcquireUpTo(atLeast, atMost);
}

std::optional<std::int64_t> RateLimiterAccess::releaseGrantBestEffort(RateLimiter& source, const std::string& /*key*/,
                                                                      const std::string& member, std::int64_t permits) {
  // Bad input and the no-op go to releaseGrant first: they cost no probe.
  if (!member.empty() && permits > 0 && !source.impl_->client_->admitBestEffort()) return std::nullopt;
  return releaseGrant(source, member, permits);
}

bool RateLimiterAccess::decideUnanswered(RateLimiter& source, const std::string& /*key*/, std::int64_t permits,
                                         const std::string& reason) {
  const LimiterCall::Params p = source.impl_->decision(permits);  // with the configuration last seen
  return detail::decideUnanswered(source.impl_->gate_, permits, p.rate, p.interval, reason);
}

std::int64_t RateLimiterAccess::releaseGrant(RateLimiter& source, const std::string& member, std::int64_t permits) {
  if (member.empty()) throw InvalidArgument("redlimit: releaseGrant needs the member of a grant");
  const ForgetAfter forget(*source.impl_->denials_, kDenyKey);
  return source.impl_->releasePermits(permits, member);
}

void RateLimiterAccess::tryAcquireUpToAsync(RateLimiter& source, std::int64_t atLeast, std::int64_t atMost,
                                            std::function<void(AcquireResult, std::exception_ptr)> done) {
  source.impl_->tryAcquireUpToAsync(atLeast, atMost, std::move(done));
}

}  // namespace detail

}  // namespace redlimit
