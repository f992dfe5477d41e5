// Uses the installed redlimit: one limiter, three permits, the fourth is denied.
#include <cstdio>
#include <cstdlib>

#include <redlimit/redlimit.hpp>

int main() {
  const char* uri = std::getenv("REDLIMIT_URI");
  if (uri == nullptr) return 2;
  auto client = redlimit::Client::fromUri(uri);
  redlimit::RateLimiter limiter(client, "consumer");
  limiter.setRate(redlimit::RateType::Overall, 3, std::chrono::seconds(10));
  int granted = 0;
  for (int i = 0; i < 4; ++i) granted += limiter.tryAcquire() ? 1 : 0;
  std::printf("consumer: %d of 4 granted\n", granted);
  return granted == 3 ? 0 : 1;
}
