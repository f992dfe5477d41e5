// redlimit::prometheus against a real Redis and a real HTTP endpoint: a known sequence of
// decisions, then GET /metrics over a socket, and every series checked against what was done.
#include "redlimit/prometheus.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <prometheus/exposer.h>

#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "redlimit/rate_limiter.hpp"
#include "redlimit/segmented_rate_limiter.hpp"
#include "redlimit_test/fixture.hpp"

namespace redlimit::test {
namespace {

using std::chrono::milliseconds;

// GET `path` from 127.0.0.1:`port` (HTTP/1.0: the server closes when done); the body.
std::string httpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("connect to the exposer failed");
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)::send(fd, request.data(), request.size(), 0);
  std::string response;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    response.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const auto body = response.find("\r\n\r\n");
  if (response.compare(0, 12, "HTTP/1.1 200") != 0 && response.compare(0, 12, "HTTP/1.0 200") != 0) {
    throw std::runtime_error("unexpected response: " + response.substr(0, 80));
  }
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

// The samples of an exposition: "name{labels}" -> value (labels as written by the serializer).
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

class Prometheus : public RedisTest {};

TEST_F(Prometheus, TheScrapedEndpointCountsWhatTheLimitersDid) {
  auto registry = std::make_shared<MetricsRegistry>();
  ::prometheus::Exposer exposer("127.0.0.1:0");
  auto collector = std::make_shared<redlimit::prometheus::Collector>(registry);
  exposer.RegisterCollectable(collector);
  const int port = exposer.GetListeningPorts().at(0);

  RateLimiter::Options o;
  o.monitor.registry = registry;
  RateLimiter rl(client(), name("plain"), o);
  ASSERT_TRUE(rl.trySetRate(RateType::Overall, 4, milliseconds(60000)));
  for (int i = 0; i < 6; ++i) (void)rl.tryAcquire();  // 4 granted, 2 denied (the second by the deny cache)

  RateLimiter source(client(), name("segment"), o);
  ASSERT_TRUE(source.trySetRate(RateType::Overall, 20, milliseconds(60000)));
  SegmentOptions so;
  so.segmentSize = 10;
  so.returnWhenIdle = false;
  {
    SegmentedRateLimiter<> segment(std::make_shared<RateLimiter>(source), so);
    for (int i = 0; i < 25; ++i) (void)segment.tryAcquire();  // 20 granted (18 hits), 5 denied
  }

  const std::string text = httpGet(port, "/metrics");
  const auto s = samples(text);
  auto at = [&](const std::string& key) {
    auto it = s.find(key);
    if (it == s.end()) {
      ADD_FAILURE() << "no sample " << key << " in\n" << text;
      return -1.0;
    }
    return it->second;
  };
  const std::string plain = "limiter=\"" + rl.getName() + "\"";
  const std::string seg = "limiter=\"" + source.getName() + "\"";
  EXPECT_EQ(at("redlimit_decisions_total{" + plain + ",outcome=\"granted\"}"), 4);
  EXPECT_EQ(at("redlimit_decisions_total{" + plain + ",outcome=\"denied\"}"), 2);
  EXPECT_EQ(at("redlimit_permits_granted_total{" + plain + "}"), 4);
  EXPECT_EQ(at("redlimit_permits_refunded_total{" + plain + "}"), 0);
  EXPECT_EQ(at("redlimit_redis_round_trips_total{" + plain + "}"), 5);
  EXPECT_EQ(at("redlimit_local_hits_total{" + plain + "}"), 0);
  EXPECT_EQ(at("redlimit_local_denials_total{" + plain + "}"), 1);
  EXPECT_EQ(at("redlimit_shadow_denials_total{" + plain + "}"), 0);
  EXPECT_EQ(at("redlimit_callbacks_threw_total{" + plain + "}"), 0);
  EXPECT_EQ(at("redlimit_degraded{" + plain + "}"), 0);
  EXPECT_EQ(at("redlimit_decision_seconds_count{" + plain + "}"), 5);
  EXPECT_EQ(at("redlimit_decision_seconds_bucket{" + plain + ",le=\"+Inf\"}"), 5);
  EXPECT_GT(at("redlimit_decision_seconds_sum{" + plain + "}"), 0);
  EXPECT_EQ(at("redlimit_decisions_total{" + seg + ",outcome=\"granted\"}"), 20);
  EXPECT_EQ(at("redlimit_decisions_total{" + seg + ",outcome=\"denied\"}"), 5);
  EXPECT_EQ(at("redlimit_local_hits_total{" + seg + "}"), 18);
  EXPECT_EQ(at("redlimit_local_denials_total{" + seg + "}"), 0);      // the segment cache's refills are not remembered
  EXPECT_EQ(at("redlimit_redis_round_trips_total{" + seg + "}"), 7);  // 2 refills granted, 5 denied
  EXPECT_EQ(text.find("redlimit_errors_total{"), std::string::npos) << "no error series while no call failed";
  EXPECT_NE(text.find("# TYPE redlimit_decision_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("# TYPE redlimit_degraded gauge"), std::string::npos);
  // The same samples without an HTTP server (the Exposer adds its own exposer_* series).
  std::map<std::string, double> ours;
  for (const auto& [key, value] : s) {
    if (key.rfind("redlimit_", 0) == 0) ours.emplace(key, value);
  }
  EXPECT_EQ(samples(redlimit::prometheus::exposition(registry)), ours);
}

TEST_F(Prometheus, PoliciesErrorsAndTheCardinalityCapAreLabelled) {
  auto registry = std::make_shared<MetricsRegistry>(2);
  ClientOptions co;
  co.connection.port = 1;  // nothing listens: every call is an outage
  co.connection.connectTimeout = milliseconds(50);
  auto dead = Client::create(co);
  RateLimiter::Options o;
  o.monitor.registry = registry;
  o.failure.policy = FailurePolicy::Allow;
  RateLimiter a(dead, "tenant-a", o);
  EXPECT_TRUE(a.tryAcquire());  // the outage: Allow
  RateLimiter b(client(), "tenant-b", o);
  RateLimiter c(client(), "tenant-c", o);  // past the cap of 2
  RateLimiter d(client(), "tenant-d", o);
  EXPECT_THROW((void)c.tryAcquire(), NotInitializedError);
  EXPECT_THROW((void)d.tryAcquire(), NotInitializedError);
  const auto s = samples(redlimit::prometheus::exposition(registry));
  EXPECT_EQ(s.at("redlimit_policy_decisions_total{limiter=\"tenant-a\",policy=\"allow\",outcome=\"granted\"}"), 1);
  EXPECT_EQ(s.at("redlimit_decisions_total{limiter=\"tenant-a\",outcome=\"granted\"}"), 1);
  EXPECT_EQ(s.at("redlimit_errors_total{limiter=\"tenant-a\",type=\"io\"}"), 1);
  EXPECT_EQ(s.at("redlimit_degraded{limiter=\"tenant-a\"}"), 1);
  EXPECT_EQ(s.at("redlimit_errors_total{limiter=\"other\",type=\"reply\"}"), 2);
  EXPECT_EQ(s.count("redlimit_degraded{limiter=\"tenant-c\"}"), 0u);
  EXPECT_EQ(s.count("redlimit_degraded{limiter=\"tenant-b\"}"), 1u);
}

}  // namespace
}  // namespace redlimit::test
