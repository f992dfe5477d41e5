// Client's constructor checks every ClientOptions first (checkOptions(const ClientOptions&)), and
// Client::fromUri reads the client URIs (parseClientUri). No server: a Client connects lazily.
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/client.hpp"

using namespace redlimit;

namespace {

std::string constructionError(const ClientOptions& o) {
  try {
    Client c(o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "constructed";
  return {};
}

TEST(ClientOptionsCheck, ConstructorRefusesBadTopologyOptions) {
  ClientOptions o;
  o.topology = ClientOptions::Topology::Cluster;
  EXPECT_NE(constructionError(o).find("ClientOptions::Cluster::seeds is empty"), std::string::npos);
  o.cluster.seeds = {{"127.0.0.1", 7000}};
  o.cluster.maxRedirects = 0;
  EXPECT_NE(constructionError(o).find("ClientOptions::Cluster::maxRedirects"), std::string::npos);
  o.topology = ClientOptions::Topology::Sentinel;
  EXPECT_NE(constructionError(o).find("ClientOptions::Sentinel::sentinels is empty"), std::string::npos);
}

TEST(ClientOptionsCheck, OptionsAreCheckedBeforeBestEffortRetry) {
  ClientOptions o;
  o.topology = ClientOptions::Topology::Cluster;
  o.bestEffortRetry = std::chrono::milliseconds(0);
  EXPECT_NE(constructionError(o).find("ClientOptions::Cluster::seeds"), std::string::npos);
  o.topology = ClientOptions::Topology::Standalone;
  EXPECT_NE(constructionError(o).find("bestEffortRetry"), std::string::npos) << "still checked";
  o.bestEffortRetry = std::chrono::milliseconds(1);
  o.connection.connectTimeout = std::chrono::milliseconds(0);
  EXPECT_NE(constructionError(o).find("ClientOptions::Connection::connectTimeout"), std::string::npos);
}

TEST(ClientOptionsCheck, FromUriTakesClientUris) {
  ClientOptions base;
  base.clientId = "from-base";
  auto client = Client::fromUri("redis://u:pw@127.0.0.1:1/2", base);
  EXPECT_EQ(client->options().topology, ClientOptions::Topology::Standalone);
  EXPECT_EQ(client->options().connection.db, 2);
  EXPECT_EQ(client->options().connection.user, "u");
  EXPECT_EQ(client->clientId(), "from-base");
  for (const char* uri :
       {"redis-cluster://h:7000?db=1", "redis-sentinel://s1:26379", "redis-cluster://", "redis://h1,h2"}) {
    EXPECT_THROW((void)Client::fromUri(uri), InvalidArgument) << uri;
  }
}

}  // namespace

// verifyPeer = false disables authentication of the server; the Client says so
// once, as an event, when it is made (no server needed: a Client connects lazily).
TEST(ClientOptionsCheck, InsecureTlsIsReportedOncePerClient) {
  std::vector<Event> seen;
  ClientOptions o;
  o.connection.host = "127.0.0.1";
  o.connection.port = 6380;
  o.connection.tls.enabled = true;
  o.onEvent = [&](const Event& e) { seen.push_back(e); };
  { Client verified(o); }
  EXPECT_TRUE(seen.empty());
  o.connection.tls.verifyPeer = false;
  { Client insecure(o); }
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, Event::Kind::InsecureTls);
  EXPECT_EQ(seen[0].node, "127.0.0.1:6380");
  EXPECT_NE(seen[0].description.find("verifyPeer = false"), std::string::npos) << seen[0].description;
  EXPECT_NE(seen[0].description.find("caFile"), std::string::npos) << seen[0].description;
  o.connection.tls.enabled = false;  // no TLS: nothing to authenticate, nothing said
  { Client plain(o); }
  EXPECT_EQ(seen.size(), 1u);
}
