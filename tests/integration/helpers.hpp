// Helpers shared by the integration tests: reading the Redisson data layout with plain commands,
// counting the commands a server processed, checking grant times against a sliding window, and a
// loopback listener that never completes a connect.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/limiter_errors.hpp"
#include <stdexcept>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "redlimit_test/fixture.hpp"
#include "redlimit_test/stall_peers.hpp"
#include "redlimit_test/hex.hpp"
#include "redlimit/calendar.hpp"
#include "redlimit/failure_policy.hpp"
#include "redlimit/policy.hpp"
#include "redlimit/detail/script.hpp"
#include "limiters/decision_reply.hpp"
#include "redlimit_lua.hpp"

namespace redlimit::test {

/// BATCH in lua/lib/redisson.lua: no script call reads, unpacks or removes more members than this.
constexpr std::int64_t kScriptBatch = 1000;

/// The events a Client or a limiter reported, as they arrived (from any thread).
class EventLog {
 public:
  EventCallback callback() {
    return [this](const Event& e) {
      const std::lock_guard<std::mutex> lk(m_);
      events_.push_back(e);
    };
  }
  std::vector<Event> all() const {
    const std::lock_guard<std::mutex> lk(m_);
    return events_;
  }
  std::vector<Event> of(Event::Kind kind) const {
    std::vector<Event> out;
    for (const Event& e : all()) {
      if (e.kind == kind) out.push_back(e);
    }
    return out;
  }

 private:
  mutable std::mutex m_;
  std::vector<Event> events_;
};

/// Client options for failover tests: connects and commands give up after 200 ms.
inline ClientOptions failoverClientOptions() {
  ClientOptions o;
  o.connection.connectTimeout = std::chrono::milliseconds(200);
  o.connection.commandTimeout = std::chrono::milliseconds(200);
  return o;
}

/// Limiter options for failover tests: Deny decides while Redis cannot be asked, one probe per 20 ms.
inline RateLimiter::Options denyDuringOutages() {
  RateLimiter::Options o;
  o.failure.policy = FailurePolicy::Deny;
  o.failure.probeInterval = std::chrono::milliseconds(20);
  return o;
}

/// What a caller saw from a failure on until its first granted call.
struct UntilGranted {
  std::chrono::steady_clock::time_point grantedAt{};  // the epoch: none within the limit
  std::int64_t deniedByPolicy = 0;                    // calls answered false meanwhile
  std::string error;                                  // what escaped to the caller, if anything did
};

/// Calls rl.tryAcquire() every 5 ms until one is granted, an exception escapes (the policy must
/// decide every call, so that ends it too), or `limit` has passed since `from`.
inline UntilGranted callUntilGranted(RateLimiter& rl, std::chrono::steady_clock::time_point from,
                                     std::chrono::milliseconds limit) {
  UntilGranted out;
  while (std::chrono::steady_clock::now() - from < limit) {
    try {
      if (rl.tryAcquire()) {
        out.grantedAt = std::chrono::steady_clock::now();
        return out;
      }
      ++out.deniedByPolicy;
    } catch (const std::exception& e) {
      out.error = e.what();
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

/// Limiter options with the given time source and the rest at their defaults.
inline RateLimiter::Options timeSourceOptions(TimeSource source) {
  RateLimiter::Options o;
  o.timeSource = source;
  return o;
}

// Redisson's release() (3.52): value = min(value + permits, rate); the log is not touched.
inline const char* const kRedissonRelease =
    "local v = tonumber(redis.call('GET', KEYS[1])) + tonumber(ARGV[1]) "
    "if v > tonumber(ARGV[2]) then v = tonumber(ARGV[2]) end "
    "redis.call('SET', KEYS[1], v) return v";

// Fills a permits log the way a busy Redisson limiter leaves it: ARGV[1] members of 1 permit
// stamped (server TIME - ARGV[2] ms) and ARGV[3] members stamped now, in one script.
inline const char* const kFillLog =
    "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local old, live = tonumber(ARGV[1]), tonumber(ARGV[3]) "
    "for i = 1, old do redis.call('ZADD', KEYS[1], now - tonumber(ARGV[2]) - (i % 50), "
    "  struct.pack('<Bc0I4', 16, string.format('%016x', i), 1)) end "
    "for i = 1, live do redis.call('ZADD', KEYS[1], now - (i % 50), "
    "  struct.pack('<Bc0I4', 16, string.format('L%015x', i), 1)) end "
    "return redis.call('ZCARD', KEYS[1])";

/// The six keys acquire.lua takes: the limiter's five, then the record of a partial grant made
/// under `id` ({name}:grant:<hex id>).
inline std::vector<std::string> acquireKeys(const RateLimiter& rl, const std::string& id) {
  std::vector<std::string> keys = rl.keys();
  keys.push_back(suffixName(rl.getName(), "grant:" + hex(id)));
  return keys;
}

/// acquire.lua's packed reply (six little-endian int64: granted, wait, value, rate, now µs,
/// interval) as an array of those six integers, to read as the script's values.
inline Reply unpackAcquireReply(const Reply& packed) {
  if (packed.type != Reply::Type::String || packed.str.size() != 48) {
    throw std::runtime_error("test: acquire.lua answered " + packed.describe() + ", not 48 packed bytes");
  }
  Reply out;
  out.type = Reply::Type::Array;
  for (std::size_t i = 0; i < 6; ++i) {
    Reply v;
    v.type = Reply::Type::Integer;
    v.integer = detail::packedInt64(packed.str, 8 * i);
    out.elements.push_back(v);
  }
  return out;
}

/// Runs acquire.lua directly: most, least, id, resend flag; server clock; record TTL 5 s. Its
/// reply as unpackAcquireReply gives it.
inline Reply runAcquireScript(Client& c, const RateLimiter& rl, const std::string& most, const std::string& least,
                              const std::string& id, bool resend) {
  static const Script script{detail::lua::acquire.name, detail::lua::acquire.sha1, detail::lua::acquire.source};
  const std::vector<std::string> keys = acquireKeys(rl, id);
  const std::vector<std::string_view> views(keys.begin(), keys.end());
  try {
    return unpackAcquireReply(detail::eval(c, script, views, {most, least, id, "", resend ? "1" : "0", "5000"}));
  } catch (const ScriptError&) {
    std::rethrow_exception(detail::limiterError(std::current_exception()));  // as RateLimiter does
  }
}

/// A sorted-set member as Redisson encodes it: length byte, id, permits as little-endian uint32.
struct Member {
  std::string id;
  std::uint32_t permits = 0;
};

inline std::string packMember(const std::string& id, std::uint32_t permits) {
  std::string m;
  m.push_back(static_cast<char>(id.size()));
  m += id;
  for (int i = 0; i < 4; ++i) m.push_back(static_cast<char>((permits >> (8 * i)) & 0xFFu));
  return m;
}

/// Decodes a member; throws if its length does not match its length byte.
inline Member unpackMember(const std::string& m) {
  if (m.empty()) throw std::runtime_error("empty member");
  const std::size_t idLen = static_cast<unsigned char>(m[0]);
  if (m.size() != 1 + idLen + 4) {
    throw std::runtime_error("member of " + std::to_string(m.size()) + " bytes with length byte " +
                             std::to_string(idLen));
  }
  Member out;
  out.id = m.substr(1, idLen);
  for (std::size_t i = 0; i < 4; ++i) {
    out.permits |= static_cast<std::uint32_t>(static_cast<unsigned char>(m[1 + idLen + i])) << (8 * i);
  }
  return out;
}

/// An id of `n` bytes that differs per call (for members written "by Java").
inline std::string testId(std::size_t n, unsigned seed) {
  std::string id;
  for (std::size_t i = 0; i < n; ++i)
    id.push_back(static_cast<char>((std::size_t{seed} * 131u + i * 17u + 7u) & 0xFFu));
  return id;
}

struct Entry {
  std::string member;
  double score = 0;          // epoch ms, fractional: redlimit stamps with µs precision
  std::int64_t scoreUs = 0;  // the same in whole epoch µs
};

/// ZRANGE key 0 -1 WITHSCORES, oldest first.
inline std::vector<Entry> entries(Client& c, const std::string& key) {
  const Reply r = detail::command(c, {"ZRANGE", key, "0", "-1", "WITHSCORES"});
  std::vector<Entry> out;
  for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    const double ms = std::stod(r.elements[i + 1].str);
    out.push_back({r.elements[i].str, ms, std::llround(ms * 1000.0)});
  }
  return out;
}

/// Sum of the permits of members with score > nowMs - intervalMs.
inline std::int64_t livePermits(Client& c, const std::string& key, std::int64_t nowMs, std::int64_t intervalMs) {
  std::int64_t sum = 0;
  for (const Entry& e : entries(c, key)) {
    if (e.scoreUs > (nowMs - intervalMs) * 1000) sum += unpackMember(e.member).permits;
  }
  return sum;
}

/// Sum of the permits of every member, live or not.
inline std::int64_t allPermits(Client& c, const std::string& key) {
  std::int64_t sum = 0;
  for (const Entry& e : entries(c, key)) sum += unpackMember(e.member).permits;
  return sum;
}

/// The server's clock (TIME) in epoch ms.
inline std::int64_t serverTimeMs(Client& c) {
  const Reply r = detail::command(c, {"TIME"});
  return std::stoll(r.elements[0].str) * 1000 + std::stoll(r.elements[1].str) / 1000;
}

/// The server's clock (TIME) in epoch µs.
inline std::int64_t serverTimeUs(Client& c) {
  const Reply r = detail::command(c, {"TIME"});
  return std::stoll(r.elements[0].str) * 1000000 + std::stoll(r.elements[1].str);
}

/// This host's wall clock in epoch ms (what Redisson stamps with).
inline std::int64_t wallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// GET key as an integer; throws if the key is missing.
inline std::int64_t getInt(Client& c, const std::string& key) {
  const Reply r = detail::command(c, {"GET", key});
  if (r.isNil()) throw std::runtime_error("key " + key + " does not exist");
  return std::stoll(r.str);
}

inline bool exists(Client& c, const std::string& key) { return detail::command(c, {"EXISTS", key}).integer == 1; }

/// Sum of `calls` and `rejected_calls` over every cmdstat_* line of INFO commandstats. The INFO call itself is counted
/// only after it has answered, so it shows up in the next reading.
inline std::int64_t totalCommandCalls(Client& c) {
  const Reply info = detail::command(c, {"INFO", "commandstats"});
  std::istringstream in(info.str);
  std::string line;
  std::int64_t sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind("cmdstat_", 0) != 0) continue;
    const auto pos = line.find(":calls=");
    if (pos != std::string::npos) sum += std::stoll(line.substr(pos + 7));
    const auto rejected = line.find("rejected_calls=");  // refused before running (Redis 7)
    if (rejected != std::string::npos) sum += std::stoll(line.substr(rejected + 15));
  }
  return sum;
}

/// Everything about a key that a write would change: its type, DUMP bytes and whether it has a TTL.
inline std::string keyState(Client& c, const std::string& key) {
  const Reply type = detail::command(c, {"TYPE", key});
  const Reply dump = detail::command(c, {"DUMP", key});
  const std::int64_t ttl = detail::command(c, {"PTTL", key}).integer;
  return type.str + "|" + (dump.isNil() ? std::string("nil") : dump.str) + "|" +
         (ttl >= 0 ? "ttl" : std::to_string(ttl));
}

inline std::vector<std::string> keyStates(Client& c, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(keyState(c, k));
  return out;
}

/// When a grant happened, as seen from the client: the server stamped it somewhere in
/// [beforeUs, afterUs] (system clock, µs; the server's TIME reads the same clock).
struct GrantSpan {
  std::int64_t beforeUs = 0;
  std::int64_t afterUs = 0;
};

inline std::int64_t wallUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Checks "at most `rate` grants in any window of `intervalMs`" against grant spans measured on the
/// client. For rate + 1 grants the server stamps span at least the interval, so the latest
/// `afterUs` minus the earliest `beforeUs` of any rate + 1 grants must be >= the interval (less
/// `slackUs`; 0 holds since stamps carry µs). Only a definite violation is reported, so scheduling
/// delays on a loaded machine cannot make it fail. Returns "" or a description of the violation.
inline std::string windowViolation(std::vector<GrantSpan> grants, std::size_t rate, std::int64_t intervalMs,
                                   std::int64_t slackUs = 0) {
  std::sort(grants.begin(), grants.end(),
            [](const GrantSpan& a, const GrantSpan& b) { return a.beforeUs < b.beforeUs; });
  const std::int64_t limitUs = intervalMs * 1000 - slackUs;
  for (std::size_t i = 0; i + rate < grants.size(); ++i) {
    std::vector<std::int64_t> afters;
    for (std::size_t j = i; j < grants.size(); ++j) afters.push_back(grants[j].afterUs);
    std::nth_element(afters.begin(), afters.begin() + static_cast<std::ptrdiff_t>(rate), afters.end());
    const std::int64_t span = afters[rate] - grants[i].beforeUs;
    if (span < limitUs) {
      return std::to_string(rate + 1) + " grants within " + std::to_string(span) + " us (interval " +
             std::to_string(intervalMs) + " ms), starting at grant " + std::to_string(i);
    }
  }
  return "";
}

/// A fixture for tests that play Redisson beside redlimit and build large logs: Redisson's
/// release(), a log filler, a patient client, server time per command, key snapshots.
class RedissonMixTest : public RedisTest {
 protected:
  std::int64_t redissonRelease(const RateLimiter& rl, std::int64_t permits, std::int64_t rate) {
    return raw({"EVAL", kRedissonRelease, "1", rl.keys()[1], std::to_string(permits), std::to_string(rate)}).integer;
  }
  /// Sum of `usec` of one command in INFO commandstats.
  std::int64_t usecOf(const std::string& command) {
    const std::string stats = infoField(admin(), "commandstats", "cmdstat_" + command);
    const auto pos = stats.find("usec=");
    return pos == std::string::npos ? 0 : std::stoll(stats.substr(pos + 5));
  }
  std::vector<std::string> snapshot(const RateLimiter& rl) { return keyStates(admin(), rl.keys()); }
  /// A client that waits long enough for scripts over large logs on a loaded machine.
  std::shared_ptr<Client> patientClient() {
    ClientOptions patient;
    patient.connection.commandTimeout = std::chrono::milliseconds(20000);
    return newClient(patient);
  }
  /// Fills a log with kFillLog.
  std::int64_t fillLog(const std::string& key, std::int64_t old, std::int64_t ageMs, std::int64_t live) {
    return detail::command(*patientClient(), {"EVAL", kFillLog, "1", key, std::to_string(old), std::to_string(ageMs),
                                              std::to_string(live)})
        .integer;
  }
};

// Small helpers that several test files need. They live here, not in each file's anonymous
// namespace, because CI builds the test files as unity batches (tests/CMakeLists.txt): two
// files defining one name would clash there.

/// Polls `ready` every 2 ms until it holds or `limit` passed; returns its last value.
inline bool waitFor(const std::function<bool()>& ready, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= end) return ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// Whether `text` contains `part`.
inline bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

/// The decimal text of `n` (script arguments).
inline std::string str(std::int64_t n) { return std::to_string(n); }

/// Appends the `bytes` low bytes of `v`, little-endian, as the scripts' struct.pack writes them.
inline void putLe(std::string& out, std::int64_t v, int bytes) {
  auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>(u & 0xFFU));
    u >>= 8U;
  }
}

/// The what() of the exception `e` holds; "(no error)" for none.
inline std::string messageOf(const std::exception_ptr& e) {
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

/// Threads of this process now (/proc/self/task).
inline std::size_t threadCount() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

/// This process's TCP connections to `port` on any address (/proc/self/fd's sockets found in
/// /proc/net/tcp by inode, the remote port matched): what a transport holds to one server, whatever
/// other descriptors come and go meanwhile.
inline std::size_t connectionsTo(int port) {
  std::set<std::string> inodes;  // "socket:[123]" -> "123"
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::size_t n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      const auto colon = remote.rfind(':');
      if (colon == std::string::npos || inodes.count(inode) == 0) continue;
      if (std::stoi(remote.substr(colon + 1), nullptr, 16) == port) ++n;
    }
  }
  return n;
}

/// The state letter of process `pid` (/proc/<pid>/stat: 'R', 'S', 'T', 'Z', ...; '?' if unreadable).
inline char processState(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');  // the command name may contain spaces
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

/// Stops a redis-server process (SIGSTOP) until destroyed: the kernel still accepts connections
/// and queues requests, but nothing is answered, so calls wait for their command timeout.
/// The constructor returns once the process has stopped (kill() returns before it has).
class Stall {
 public:
  explicit Stall(pid_t pid) : pid_(pid) {
    ::kill(pid_, SIGSTOP);
    for (int i = 0; i < 1000 && processState(pid_) != 'T'; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(processState(pid_), 'T') << "redis-server " << pid_ << " did not stop";
  }
  ~Stall() { resume(); }
  Stall(const Stall&) = delete;
  Stall& operator=(const Stall&) = delete;
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

/// The pid of the server a client talks to (INFO server), so a test can stall its own server.
inline pid_t serverPid(Client& c) { return static_cast<pid_t>(std::stol(infoField(c, "server", "process_id"))); }

/// Checks the outcomes of `calls` decisions made while Redis was gone (`allowed`, `denied`, and
/// `thrown` IoErrors) against what `policy` decides: Allow grants all, Deny denies all, Throw
/// throws, Local grants `localGrants` (its bucket) and denies the rest.
inline void expectDecidedByPolicy(FailurePolicy policy, int allowed, int denied, int thrown, int calls,
                                  int localGrants) {
  switch (policy) {
    case FailurePolicy::Allow:
      EXPECT_EQ(allowed, calls);
      break;
    case FailurePolicy::Deny:
      EXPECT_EQ(denied, calls);
      break;
    case FailurePolicy::Throw:
      EXPECT_EQ(thrown, calls);
      break;
    case FailurePolicy::Local:
      EXPECT_EQ(allowed, localGrants) << "the local bucket";
      EXPECT_EQ(denied, calls - localGrants);
      break;
  }
}

/// Policies as the tests write them: a GCRA of `burst` at `rate` per `period`, a token bucket of
/// `capacity` refilled `permits` per `interval`, a fixed window of `limit` per `length`.
inline Policy gcra(std::int64_t burst, std::int64_t rate, std::chrono::milliseconds period) {
  return Policy::gcra(rate, period, burst);
}
inline Policy bucket(std::int64_t capacity, std::int64_t permits, std::chrono::milliseconds interval) {
  return Policy::tokenBucket(capacity, permits, interval);
}
inline Policy window(std::int64_t limit, std::chrono::milliseconds length) {
  return Policy::fixedWindow(limit, length);
}

/// `limit` per calendar `unit` in Europe/Berlin.
inline Policy berlinCalendar(std::int64_t limit, CalendarUnit unit) {
  return Policy::calendar(limit, unit, "Europe/Berlin");
}

/// A calendar table as lua/lib/calendar_core.lua takes it: `count` consecutive windows of `len` µs
/// labelled from `label`, the first starting at `start`.
inline std::string calendarTable(std::int64_t label, std::int64_t start, std::int64_t len, int count = 4) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    putLe(out, label + i, 8);
    putLe(out, start + i * len, 8);
    putLe(out, start + (i + 1) * len, 8);
  }
  return out;
}

}  // namespace redlimit::test
