// checkOptions(ClientOptions::Connection): the TLS checks (the others are covered by the integration
// tests through Client's constructor). checkOptions(ClientOptions): the Cluster and Sentinel checks.
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

using redlimit::ClientOptions;

namespace {

template <typename Options>
std::string rejection(const Options& o) {
  try {
    redlimit::checkOptions(o);
  } catch (const redlimit::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(CheckOptions, TlsIsFine) {
  ClientOptions::Connection o;
  o.tls.enabled = true;
  EXPECT_NO_THROW(redlimit::checkOptions(o));
  o.tls.certFile = "/c.pem";
  o.tls.keyFile = "/k.pem";
  EXPECT_NO_THROW(redlimit::checkOptions(o));
}

TEST(CheckOptions, TlsOverAUnixSocketIsRefused) {
  ClientOptions::Connection o;
  o.unixSocket = "/tmp/r.sock";
  o.tls.enabled = true;
  const std::string message = rejection(o);
  EXPECT_NE(message.find("unix socket"), std::string::npos) << message;
  o.tls.enabled = false;
  EXPECT_NO_THROW(redlimit::checkOptions(o));
}

TEST(CheckOptions, ClientCertificateNeedsBothFiles) {
  ClientOptions::Connection o;
  o.tls.enabled = true;
  o.tls.certFile = "/c.pem";
  std::string message = rejection(o);
  EXPECT_NE(message.find("ClientOptions::Tls::certFile is set but ::keyFile is empty"), std::string::npos) << message;
  o.tls.certFile.clear();
  o.tls.keyFile = "/k.pem";
  message = rejection(o);
  EXPECT_NE(message.find("ClientOptions::Tls::keyFile is set but ::certFile is empty"), std::string::npos) << message;
}

ClientOptions clusterOptions() {
  ClientOptions o;
  o.topology = ClientOptions::Topology::Cluster;
  o.cluster.seeds = {{"10.0.0.1", 7000}, {"10.0.0.2", 7001}};
  return o;
}

ClientOptions sentinelOptions() {
  ClientOptions o;
  o.topology = ClientOptions::Topology::Sentinel;
  o.sentinel.sentinels = {{"10.0.0.1", 26379}};
  o.sentinel.primaryName = "mymaster";
  return o;
}

// Each case changes one option of a valid ClientOptions; the message must name it.
struct Refused {
  const char* name;
  void (*change)(ClientOptions&);
  const char* inMessage;
};

void expectRefused(const ClientOptions& valid, const std::vector<Refused>& cases) {
  EXPECT_NO_THROW(redlimit::checkOptions(valid));
  for (const Refused& c : cases) {
    ClientOptions o = valid;
    c.change(o);
    const std::string message = rejection(o);
    EXPECT_NE(message.find(c.inMessage), std::string::npos) << c.name << ": " << message;
  }
}

TEST(CheckClientOptions, StandaloneRunsTheConnectionAndPoolChecks) {
  ClientOptions o;
  EXPECT_NO_THROW(redlimit::checkOptions(o));
  o.cluster.seeds.clear();  // the other topologies' options are not looked at
  o.sentinel.primaryName = "a b";
  EXPECT_NO_THROW(redlimit::checkOptions(o));
  o.connection.user = "app";
  EXPECT_NE(rejection(o).find("an ACL user needs a password"), std::string::npos);
  o.connection.user.clear();
  o.pool.size = 0;
  EXPECT_NE(rejection(o).find("ClientOptions::Pool::size"), std::string::npos);
}

TEST(CheckClientOptions, Cluster) {
  expectRefused(
      clusterOptions(),
      {
          {"no seeds", [](ClientOptions& o) { o.cluster.seeds.clear(); },
           "ClientOptions::Cluster::seeds is empty; give at least one node, e.g. redis-cluster://"},
          {"empty host", [](ClientOptions& o) { o.cluster.seeds[1].host.clear(); },
           "ClientOptions::Cluster::seeds[1].host is empty"},
          {"port 0", [](ClientOptions& o) { o.cluster.seeds[0].port = 0; },
           "ClientOptions::Cluster::seeds[0].port must be in 1..65535, got 0"},
          {"port 65536", [](ClientOptions& o) { o.cluster.seeds[1].port = 65536; }, "seeds[1].port"},
          {"db 1", [](ClientOptions& o) { o.connection.db = 1; }, "a Redis Cluster has only db 0"},
          {"unix socket", [](ClientOptions& o) { o.connection.unixSocket = "/tmp/r.sock"; },
           "ClientOptions::Connection::unixSocket"},
          {"min refresh 0", [](ClientOptions& o) { o.cluster.minRefreshInterval = std::chrono::milliseconds(0); },
           "ClientOptions::Cluster::minRefreshInterval must be > 0 ms, got 0 ms"},
          {"refresh period under min",
           [](ClientOptions& o) {
             o.cluster.refreshPeriod = o.cluster.minRefreshInterval - std::chrono::milliseconds(1);
           },
           "ClientOptions::Cluster::refreshPeriod (199 ms) must be >= minRefreshInterval (200 ms)"},
          {"0 redirects", [](ClientOptions& o) { o.cluster.maxRedirects = 0; },
           "ClientOptions::Cluster::maxRedirects must be in 1..16, got 0"},
          {"17 redirects", [](ClientOptions& o) { o.cluster.maxRedirects = 17; }, "maxRedirects"},
          {"connection checked too",
           [](ClientOptions& o) { o.connection.commandTimeout = std::chrono::milliseconds(0); },
           "ClientOptions::Connection::commandTimeout"},
          {"pool checked too", [](ClientOptions& o) { o.pool.maxPending = 0; }, "ClientOptions::Pool::maxPending"},
      });
  ClientOptions edges = clusterOptions();
  edges.cluster.seeds = {{"::1", 1}, {"h", 65535}};
  edges.cluster.minRefreshInterval = edges.cluster.refreshPeriod = std::chrono::milliseconds(1);
  edges.cluster.maxRedirects = 16;
  edges.connection.tls.enabled = true;
  edges.connection.user = "app";
  edges.connection.password = "pw";
  EXPECT_NO_THROW(redlimit::checkOptions(edges));
  edges.cluster.maxRedirects = 1;
  EXPECT_NO_THROW(redlimit::checkOptions(edges));
}

TEST(CheckClientOptions, Sentinel) {
  expectRefused(sentinelOptions(),
                {
                    {"no sentinels", [](ClientOptions& o) { o.sentinel.sentinels.clear(); },
                     "ClientOptions::Sentinel::sentinels is empty; give at least one node, e.g. redis-sentinel://"},
                    {"empty host", [](ClientOptions& o) { o.sentinel.sentinels[0].host.clear(); },
                     "ClientOptions::Sentinel::sentinels[0].host"},
                    {"port -1", [](ClientOptions& o) { o.sentinel.sentinels[0].port = -1; },
                     "sentinels[0].port must be in 1..65535"},
                    {"no primary name", [](ClientOptions& o) { o.sentinel.primaryName.clear(); },
                     "ClientOptions::Sentinel::primaryName is empty"},
                    {"space in name", [](ClientOptions& o) { o.sentinel.primaryName = "my master"; }, "byte 0x20"},
                    {"newline in name", [](ClientOptions& o) { o.sentinel.primaryName = "m\n"; }, "byte 0x0a"},
                    {"DEL in name", [](ClientOptions& o) { o.sentinel.primaryName = "m\x7f"; }, "byte 0x7f"},
                    {"user without password", [](ClientOptions& o) { o.sentinel.user = "sentinel-admin"; },
                     "ClientOptions::Sentinel::user needs ClientOptions::Sentinel::password"},
                    {"unix socket", [](ClientOptions& o) { o.connection.unixSocket = "/tmp/r.sock"; },
                     "sentinel nodes are reached over TCP"},
                    {"primary's user without password", [](ClientOptions& o) { o.connection.user = "app"; },
                     "an ACL user needs a password"},
                });
  ClientOptions fine = sentinelOptions();
  fine.sentinel.primaryName = "primary-1.eu_west";
  fine.sentinel.password = "only-a-password";
  fine.connection.db = 5;
  fine.sentinel.tls = true;
  EXPECT_NO_THROW(redlimit::checkOptions(fine));
}

TEST(CheckClientOptions, UnknownTopologyIsRefused) {
  ClientOptions o;
  o.topology = static_cast<ClientOptions::Topology>(7);
  EXPECT_NE(rejection(o).find("ClientOptions::topology"), std::string::npos);
}

}  // namespace
