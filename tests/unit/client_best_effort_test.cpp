// Client::admitBestEffort without a server: a refused connection is a transport failure that
// makes the client skip best-effort calls; ClientOptions::bestEffortRetry is checked. (The probe
// timing is the FailureGate's, tested in failure_gate_test.cpp; a stalled server in
// tests/integration/segmented_rate_limiter_faults_test.cpp.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "redlimit/detail/client_access.hpp"
#include "redlimit/client.hpp"

using namespace redlimit;
using std::chrono::milliseconds;

namespace {

/// A loopback port nothing listens on: bound to an ephemeral port, then closed.
int closedLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "no ephemeral port";
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

TEST(ClientBestEffort, TransportFailureSkipsBestEffortCallsUntilTheRetryInterval) {
  ClientOptions o;
  o.connection.port = closedLoopbackPort();
  o.bestEffortRetry = milliseconds(60000);  // no probe during this test
  Client client(o);
  EXPECT_TRUE(client.admitBestEffort()) << "nothing failed yet";
  EXPECT_THROW((void)detail::command(client, {"PING"}), IoError);  // refused
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(client.admitBestEffort()) << i;
  const PoolStats s = client.poolStats();
  EXPECT_TRUE(s.unreachable);
  EXPECT_EQ(s.bestEffortSent, 1u);
  EXPECT_EQ(s.bestEffortSkipped, 1000u);
}

TEST(ClientBestEffort, ClientRefusesANonPositiveRetryInterval) {
  ClientOptions o;
  o.bestEffortRetry = milliseconds(0);
  EXPECT_THROW(Client{o}, InvalidArgument);
  o.bestEffortRetry = milliseconds(-5);
  EXPECT_THROW(Client{o}, InvalidArgument);
  o.bestEffortRetry = milliseconds(1);
  const Client c(o);  // connects lazily: nothing sent
  const PoolStats s = c.poolStats();
  EXPECT_EQ(s.bestEffortSent, 0u);
  EXPECT_EQ(s.bestEffortSkipped, 0u);
  EXPECT_FALSE(s.unreachable);
}
