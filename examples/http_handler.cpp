// http_handler: the rate-limiting part of a web service's request handler, ready to copy.
// Each API key may make kQuota requests per kWindow, shared by every instance of the service;
// a request over the limit gets 429 with Retry-After, and every response carries the IETF
// RateLimit-Policy and RateLimit header fields (redlimit/http.hpp).
//
//   http_handler [redis://host:port]       (default: $REDLIMIT_URI, else redis://127.0.0.1:6379)
//
// The test suite runs it against a throwaway redis-server (build/dev/tests/with-redis). It sends a
// burst of requests for two keys, prints each answer, and exits non-zero if the limit was not kept.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "redlimit/redlimit.hpp"

namespace {

using namespace std::chrono;

constexpr std::int64_t kQuota = 5;  // requests ...
constexpr seconds kWindow{2};       // ... per window, per API key

struct Request {
  std::string path;
  std::string apiKey;  // whatever identifies the caller: API key, user id, client address
};

struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// One per process: a Client and a limiter handle per API key (handles are cheap; keeping them
// keeps each key's failure-policy state).
class RateLimitedService {
 public:
  explicit RateLimitedService(std::shared_ptr<redlimit::Client> client) : client_(std::move(client)) {}

  Response handle(const Request& request) {
    redlimit::Decision decision;
    try {
      decision = limiterFor(request.apiKey).decide(1);
    } catch (const redlimit::NotInitializedError&) {
      // First request for this key anywhere: create its configuration (only if still absent, so
      // concurrent instances agree), then decide.
      (void)limiterFor(request.apiKey).trySetRate(redlimit::RateType::Overall, kQuota, kWindow);
      decision = limiterFor(request.apiKey).decide(1);
    }
    Response response;
    response.headers = redlimit::http::rateLimitHeaders(decision, policy_);
    if (!decision.allowed) {
      response.status = 429;
      response.body = "Too Many Requests\n";
      return response;
    }
    response.body = fmt::format("hello from {}\n", request.path);
    return response;
  }

 private:
  redlimit::RateLimiter& limiterFor(const std::string& apiKey) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = limiters_.find(apiKey);
    if (it == limiters_.end()) {
      redlimit::RateLimiterOptions options;
      options.failure.policy = redlimit::FailurePolicy::Allow;  // Redis down: serve, unlimited
      it = limiters_.emplace(apiKey, redlimit::RateLimiter(client_, "api:" + apiKey, options)).first;
    }
    return it->second;
  }

  std::shared_ptr<redlimit::Client> client_;
  const redlimit::http::RateLimitPolicy policy_{"per-key", kQuota, kWindow};
  std::mutex mutex_;
  std::map<std::string, redlimit::RateLimiter> limiters_;  // never erased: a real service would
                                                           // bound this (LRU)
};

}  // namespace

int main(int argc, char** argv) try {
  try {
    std::string uri = "redis://127.0.0.1:6379";
    if (const char* env = std::getenv("REDLIMIT_URI")) uri = env;
    if (argc == 2) uri = argv[1];
    auto client = redlimit::Client::fromUri(uri);
    RateLimitedService service(client);

    // A demo key per run, so runs against a shared server do not meet each other's limits.
    const std::string run =
        fmt::format("{}", duration_cast<microseconds>(system_clock::now().time_since_epoch()).count());
    int ok = 0;
    int limited = 0;
    for (int i = 0; i < 8; ++i) {
      const Response r = service.handle({"/hello", "alice-" + run});
      fmt::print("alice #{}: {}", i + 1, r.status);
      for (const auto& [name, value] : r.headers) fmt::print("  {}: {}", name, value);
      fmt::print("\n");
      (r.status == 200 ? ok : limited)++;
    }
    const Response bob = service.handle({"/hello", "bob-" + run});
    fmt::print("bob   #1: {} {}", bob.status, bob.body);

    for (const std::string& key : {"alice-" + run, "bob-" + run}) {
      (void)redlimit::RateLimiter(client, "api:" + key).deleteLimiter();
    }
    if (ok != kQuota || limited != 8 - kQuota || bob.status != 200) {
      fmt::print(stderr, "http_handler: expected {} x 200 then 429s, and 200 for bob\n", kQuota);
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
