// Client's constructor checks every ClientOptions first (checkOptions(const ClientOptions&)), and
// Client::fromUri reads the client URIs (parseClientUri). No server: a Client connects lazily.
#include <chrono>
#include <string>

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
  o.topology = Topology::Cluster;
  EXPECT_NE(constructionError(o).find("ClusterOptions::seeds is empty"), std::string::npos);
  o.cluster.seeds = {{"127.0.0.1", 7000}};
  o.cluster.maxRedirects = 0;
  EXPECT_NE(constructionError(o).find("ClusterOptions::maxRedirects"), std::string::npos);
  o.topology = Topology::Sentinel;
  EXPECT_NE(constructionError(o).find("SentinelOptions::sentinels is empty"), std::string::npos);
}

TEST(ClientOptionsCheck, OptionsAreCheckedBeforeBestEffortRetry) {
  ClientOptions o;
  o.topology = Topology::Cluster;
  o.bestEffortRetry = std::chrono::milliseconds(0);
  EXPECT_NE(constructionError(o).find("ClusterOptions::seeds"), std::string::npos);
  o.topology = Topology::Standalone;
  EXPECT_NE(constructionError(o).find("bestEffortRetry"), std::string::npos) << "still checked";
  o.bestEffortRetry = std::chrono::milliseconds(1);
  o.connection.connectTimeout = std::chrono::milliseconds(0);
  EXPECT_NE(constructionError(o).find("ConnectionOptions::connectTimeout"), std::string::npos);
}

TEST(ClientOptionsCheck, FromUriTakesClientUris) {
  ClientOptions base;
  base.clientId = "from-base";
  auto client = Client::fromUri("redis://u:pw@127.0.0.1:1/2", base);
  EXPECT_EQ(client->options().topology, Topology::Standalone);
  EXPECT_EQ(client->options().connection.db, 2);
  EXPECT_EQ(client->options().connection.user, "u");
  EXPECT_EQ(client->clientId(), "from-base");
  for (const char* uri :
       {"redis-cluster://h:7000?db=1", "redis-sentinel://s1:26379", "redis-cluster://", "redis://h1,h2"}) {
    EXPECT_THROW((void)Client::fromUri(uri), InvalidArgument) << uri;
  }
}

}  // namespace
