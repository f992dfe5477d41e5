// metrics_service: a service that rolls a new limit out in shadow mode and exposes redlimit's
// metrics on /metrics for Prometheus to scrape (redlimit::prometheus, over prometheus-cpp's
// Exposer). It serves for a few seconds, reads its own endpoint once, prints the redlimit lines
// and exits, so the test suite can run it.
//
//   metrics_service [redis://host:port] [listen address]
//       (default: $REDLIMIT_URI, else redis://127.0.0.1:6379; 127.0.0.1:0 = any free port)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <prometheus/exposer.h>

#include "redlimit/prometheus.hpp"
#include "redlimit/redlimit.hpp"

namespace {

// One GET over a plain socket, so the example needs no HTTP client library.
std::string scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    (void)::send(fd, request.data(), request.size(), 0);
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, static_cast<std::size_t>(n));
  }
  if (fd >= 0) ::close(fd);
  return response;
}

}  // namespace

int main(int argc, char** argv) try {
  const char* env = std::getenv("REDLIMIT_URI");
  const std::string uri = argc > 1 ? argv[1] : (env != nullptr ? env : "redis://127.0.0.1:6379");
  const std::string listen = argc > 2 ? argv[2] : "127.0.0.1:0";

  // Every limiter counts into MetricsRegistry::global() unless told otherwise; export that one.
  // The Exposer holds collectables weakly: keep the collector alive as long as it serves.
  prometheus::Exposer exposer(listen);
  const auto collector = std::make_shared<redlimit::prometheus::Collector>();
  exposer.RegisterCollectable(collector);
  const int port = exposer.GetListeningPorts().at(0);
  std::printf("serving /metrics on port %d\n", port);

  auto client = redlimit::Client::fromUri(uri);
  // The limit being rolled out: 20 per second, in shadow mode. Every call is decided and counted
  // (redlimit_decisions_total, redlimit_shadow_denials_total) but let through.
  redlimit::RateLimiter::Options options;
  options.monitor.shadow = true;
  options.failure.policy = redlimit::FailurePolicy::Allow;  // and through an outage too
  redlimit::RateLimiter limiter(client, "metrics-service:api", options);
  limiter.setRate(redlimit::RateType::Overall, 20, std::chrono::seconds(1));

  int served = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < end) {
    if (limiter.tryAcquire()) ++served;  // always true in shadow mode
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const redlimit::LimiterMetrics::Snapshot s = redlimit::MetricsRegistry::global()->snapshot(limiter.getName());
  std::printf("served %d requests; the new limit would have denied %llu of them\n", served,
              static_cast<unsigned long long>(s.shadowDenied));

  std::istringstream body(scrape(port));
  int lines = 0;
  for (std::string line; std::getline(body, line);) {
    if (line.rfind("redlimit_decisions_total", 0) == 0 || line.rfind("redlimit_shadow_denials_total", 0) == 0) {
      std::printf("  %s\n", line.c_str());
      ++lines;
    }
  }
  // The endpoint must show what the limiter did.
  return lines >= 3 && s.shadowDenied > 0 && served > 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "metrics_service: %s\n", e.what());
  return 1;
}
