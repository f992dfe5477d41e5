// http_handler: the rate-limiting part of a web service's request handler, ready to copy.
// Two limits apply to every request, each shared by every instance of the service:
//  * per API key: a token bucket of kPerKeyBurst requests, refilled at that many per kPerKeyRefill
//    (a key idle long enough expires in Redis, so nothing grows with the number of keys);
//  * for the whole service: kGlobalRate requests per kGlobalInterval.
// Both are Limiters (one Policy each, the key in the call), decided together in ONE MultiLimit
// call, all or nothing: a request either takes a permit of both or of neither, so a request the
// global limit refuses spends nothing of its caller's own limit. A request its own limit refuses
// gets 429, one the global limit refuses 503 (the service is busy, the caller did nothing wrong);
// either with Retry-After and the IETF RateLimit-Policy and RateLimit fields of the limit that
// refused it. A request both allow gets the per-key fields: the global limit's remaining is shared
// by every caller, so it would promise one caller what the others may take first
// (docs/algorithms.md, "HTTP headers"). One call touches keys of two hash slots: fine on one
// server (standalone or Sentinel); on a Redis Cluster give both keys one hash tag or decide the
// global limit in a call of its own.
//
//   http_handler [redis://host:port]       (default: $REDLIMIT_URI, else redis://127.0.0.1:6379)
//
// The test suite runs it against a throwaway redis-server (build/dev/tests/with-redis). It sends
// requests for three keys, prints each answer, and exits non-zero if a limit was not kept.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "redlimit/redlimit.hpp"

namespace {

using namespace std::chrono;

constexpr std::int64_t kPerKeyBurst = 5;  // requests at once per API key, ...
constexpr seconds kPerKeyRefill{2};       // ... coming back at that many per 2 s
constexpr std::int64_t kGlobalRate = 8;   // requests of all keys together (small, so that the
constexpr seconds kGlobalInterval{10};    // demo below reaches it) per 10 s

struct Request {
  std::string path;
  std::string apiKey;  // whatever identifies the caller: API key, user id, client address
};

struct Response {
  int status = 200;
  redlimit::http::Headers headers;  // (name, value) pairs, in order
  std::string body;
};

// One per process, shared by every request thread (Limiter and MultiLimit are thread-safe).
class RateLimitedService {
 public:
  RateLimitedService(const std::shared_ptr<redlimit::Client>& client, const std::string& prefix)
      : perKey_(client, prefix + "per-key", redlimit::Policy::tokenBucket(kPerKeyBurst, kPerKeyBurst, kPerKeyRefill),
                options()),
        global_(client, prefix + "global", redlimit::Policy::gcra(kGlobalRate, kGlobalInterval, kGlobalRate),
                options()),
        both_({perKey_, global_}),
        perKeyPolicy_(redlimit::http::policyOf(perKey_.policy(), "per-key")),   // "per-key";q=5;w=2
        globalPolicy_(redlimit::http::policyOf(global_.policy(), "global")) {}  // "global";q=8;w=10

  Response handle(const Request& request) {
    const redlimit::MultiDecision d = both_.on({request.apiKey, "all"}).decide();
    if (!d.allowed && d.deniedBy == 0) return refuse(429, d.limits[0], perKeyPolicy_);
    if (!d.allowed) return refuse(503, d.limits[1], globalPolicy_);
    Response response;
    response.headers = redlimit::http::rateLimitHeaders(d.limits[0], perKeyPolicy_, headerOptions_);
    response.body = fmt::format("hello from {}\n", request.path);
    return response;
  }

  redlimit::Limiter& perKey() { return perKey_; }
  redlimit::Limiter& global() { return global_; }

 private:
  static redlimit::Limiter::Options options() {
    redlimit::Limiter::Options options;
    options.failure.policy = redlimit::FailurePolicy::Allow;  // Redis down: serve, unlimited
    return options;
  }

  Response refuse(int status, const redlimit::Decision& decision, const redlimit::http::RateLimitPolicy& policy) const {
    Response response;
    response.status = status;
    response.headers = redlimit::http::rateLimitHeaders(decision, policy, headerOptions_);
    response.body = status == 429 ? "Too Many Requests\n" : "Service Unavailable\n";
    return response;
  }

  redlimit::Limiter perKey_;
  redlimit::Limiter global_;
  const redlimit::MultiLimit both_;  // per key first: limits[0] is the caller's, limits[1] the global
  const redlimit::http::RateLimitPolicy perKeyPolicy_;
  const redlimit::http::RateLimitPolicy globalPolicy_;
  const redlimit::http::HeaderOptions headerOptions_;  // xRateLimit = true adds X-RateLimit-*
};

}  // namespace

int main(int argc, char** argv) try {
  try {
    std::string uri = "redis://127.0.0.1:6379";
    if (const char* env = std::getenv("REDLIMIT_URI")) uri = env;
    if (argc == 2) uri = argv[1];
    auto client = redlimit::Client::fromUri(uri);
    // Names of this run's own, so runs against a shared server do not meet each other's limits.
    const std::string run =
        fmt::format("{}", duration_cast<microseconds>(system_clock::now().time_since_epoch()).count());
    RateLimitedService service(client, "api." + run + ".");

    // alice sends 7: 5 pass (her burst), 2 get 429. bob sends 1 and carol 3: 2 of those pass, which
    // makes the global limit's 8, so carol's last gets 503.
    std::vector<std::pair<std::string, int>> expected;
    for (int i = 0; i < 7; ++i) expected.emplace_back("alice", i < kPerKeyBurst ? 200 : 429);
    expected.emplace_back("bob", 200);
    for (int i = 0; i < 3; ++i) expected.emplace_back("carol", i < 2 ? 200 : 503);
    int wrong = 0;
    for (const auto& [who, status] : expected) {
      const Response r = service.handle({"/hello", who});
      fmt::print("{:5}: {}", who, r.status);
      for (const auto& [name, value] : r.headers) fmt::print("  {}: {}", name, value);
      fmt::print("{}\n", r.status == status ? "" : fmt::format("   (expected {})", status));
      wrong += r.status != status;
    }

    for (const char* who : {"alice", "bob", "carol"}) (void)service.perKey().deleteKey(who);
    (void)service.global().deleteKey("all");
    if (wrong != 0) {
      fmt::print(stderr, "http_handler: {} answers were not the expected ones\n", wrong);
      return 1;
    }
    return 0;
  } catch (const redlimit::Error& e) {
    fmt::print(stderr, "http_handler: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "http_handler", e.what());
  return 1;
}
