// Uses the installed exporter (redlimit::prometheus): counts two decisions in a registry of its
// own and checks that the exposition text has them. Needs no Redis.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <redlimit/prometheus.hpp>

int main() try {
  auto registry = std::make_shared<redlimit::MetricsRegistry>();
  registry->limiter("consumer")->decided(true, 1);
  registry->limiter("consumer")->decided(false, 1);
  const std::string text = redlimit::prometheus::exposition(registry);
  const bool ok =
      text.find("redlimit_decisions_total{limiter=\"consumer\",outcome=\"granted\"} 1") != std::string::npos &&
      text.find("redlimit_decisions_total{limiter=\"consumer\",outcome=\"denied\"} 1") != std::string::npos;
  std::printf("prometheus consumer: %s\n", ok ? "both decisions exported" : "decisions missing");
  if (!ok) std::fputs(text.c_str(), stderr);
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "prometheus consumer: %s\n", e.what());
  return 1;
}
