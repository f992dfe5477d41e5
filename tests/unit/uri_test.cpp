#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

using redlimit::ClientOptions;
using redlimit::parseUri;

TEST(ParseUri, HostPortDb) {
  ClientOptions::Connection o = parseUri("redis://cache.internal:6380/3");
  EXPECT_EQ(o.host, "cache.internal");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 3);
  EXPECT_TRUE(o.user.empty());
  EXPECT_TRUE(o.password.empty());
  EXPECT_TRUE(o.unixSocket.empty());
}

TEST(ParseUri, DefaultsKeepBase) {
  ClientOptions::Connection base;
  base.commandTimeout = std::chrono::milliseconds(42);
  ClientOptions::Connection o = parseUri("redis://localhost", base);
  EXPECT_EQ(o.host, "localhost");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.db, 0);
  EXPECT_EQ(o.commandTimeout.count(), 42);
}

TEST(ParseUri, UserAndPasswordPercentDecoded) {
  ClientOptions::Connection o = parseUri("redis://app%40svc:p%3Ass@10.0.0.1:7000");
  EXPECT_EQ(o.user, "app@svc");
  EXPECT_EQ(o.password, "p:ss");
  EXPECT_EQ(o.host, "10.0.0.1");
  EXPECT_EQ(o.port, 7000);
}

TEST(ParseUri, PasswordOnly) {
  EXPECT_EQ(parseUri("redis://:secret@h").password, "secret");
  EXPECT_EQ(parseUri("redis://:secret@h").user, "");
  EXPECT_EQ(parseUri("redis://secret@h").password, "secret");
}

TEST(ParseUri, Ipv6) {
  ClientOptions::Connection o = parseUri("redis://[::1]:6390/1");
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6390);
  EXPECT_EQ(o.db, 1);
}

TEST(ParseUri, UnixSocket) {
  ClientOptions::Connection o = parseUri("unix:///run/redis/redis.sock?db=2&password=pw");
  EXPECT_EQ(o.unixSocket, "/run/redis/redis.sock");
  EXPECT_EQ(o.db, 2);
  EXPECT_EQ(o.password, "pw");
}

TEST(ParseUri, RejectsMalformed) {
  for (const char* bad :
       {"http://h", "redis://", "redis://h:0", "redis://h:65536", "redis://h:x", "redis://h/-1", "redis://h/abc",
        "unix://relative.sock", "unix://", "redis://h?foo=1", "redis://[::1", "redis://u:p%zz@h"}) {
    EXPECT_THROW((void)parseUri(bad), redlimit::InvalidArgument) << bad;
  }
}

// A path longer than hiredis can hand to the OS intact (sun_path less its NUL
// and the byte hiredis leaves unterminated) would be cut to another socket's path.
TEST(ParseUri, UnixSocketPathOverTheOsLimitIsRefused) {
  EXPECT_EQ(redlimit::kMaxUnixSocketPath, 106u) << "on Linux";
  const std::string longest = "/" + std::string(redlimit::kMaxUnixSocketPath - 1, 's');
  EXPECT_EQ(parseUri("unix://" + longest).unixSocket, longest);
  try {
    (void)parseUri("unix://" + longest + "x?db=1");
    ADD_FAILURE() << "a " << longest.size() + 1 << "-byte socket path was accepted";
  } catch (const redlimit::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(redlimit::kMaxUnixSocketPath)), std::string::npos) << e.what();
  }
}

TEST(ParseUri, RedissTurnsTlsOn) {
  ClientOptions::Connection o = parseUri("rediss://:pw@cache.internal:6380/2");
  EXPECT_TRUE(o.tls.enabled);
  EXPECT_EQ(o.host, "cache.internal");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 2);
  EXPECT_EQ(o.password, "pw");
  EXPECT_TRUE(o.tls.verifyPeer);
  EXPECT_TRUE(o.tls.caFile.empty());
  EXPECT_TRUE(o.tls.serverName.empty());
}

TEST(ParseUri, RedissTlsParametersPercentDecoded) {
  ClientOptions::Connection o = parseUri(
      "rediss://[::1]:6390?cacert=%2Fetc%2Fredis%2Fca%20file.pem&capath=/etc/ssl/certs&cert=/k/c.pem&key=/k/c%2Bkey.pem"
      "&sni=cache.example&verify=0&db=3");
  EXPECT_TRUE(o.tls.enabled);
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6390);
  EXPECT_EQ(o.tls.caFile, "/etc/redis/ca file.pem");
  EXPECT_EQ(o.tls.caPath, "/etc/ssl/certs");
  EXPECT_EQ(o.tls.certFile, "/k/c.pem");
  EXPECT_EQ(o.tls.keyFile, "/k/c+key.pem");
  EXPECT_EQ(o.tls.serverName, "cache.example");
  EXPECT_FALSE(o.tls.verifyPeer);
  EXPECT_EQ(o.db, 3);
  EXPECT_TRUE(parseUri("rediss://h?verify=1").tls.verifyPeer);
}

TEST(ParseUri, RedissKeepsBaseTlsOptions) {
  ClientOptions::Connection base;
  base.tls.caFile = "/base/ca.pem";
  base.tls.verifyPeer = false;
  ClientOptions::Connection o = parseUri("rediss://h?sni=s.example", base);
  EXPECT_TRUE(o.tls.enabled);
  EXPECT_EQ(o.tls.caFile, "/base/ca.pem");
  EXPECT_FALSE(o.tls.verifyPeer);
  EXPECT_EQ(o.tls.serverName, "s.example");
}

TEST(ParseUri, RedisAndUnixTurnTlsOff) {
  ClientOptions::Connection base;
  base.tls.enabled = true;
  EXPECT_FALSE(parseUri("redis://h", base).tls.enabled);
  EXPECT_FALSE(parseUri("unix:///tmp/r.sock", base).tls.enabled);
}

TEST(ParseUri, TlsParametersNeedRediss) {
  for (const char* bad :
       {"redis://h?cacert=/ca.pem", "redis://h?capath=/certs", "redis://h?cert=/c.pem", "redis://h?key=/k.pem",
        "redis://h?sni=x", "redis://h?verify=0", "unix:///tmp/r.sock?cacert=/ca.pem", "unix:///tmp/r.sock?verify=1"}) {
    try {
      (void)parseUri(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const redlimit::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rediss://"), std::string::npos) << e.what();
    }
  }
}

TEST(ParseUri, RejectsMalformedRediss) {
  for (const char* bad : {"rediss://", "rediss://h?verify=2", "rediss://h?verify=", "rediss://h?verify=yes",
                          "rediss://h?cacert=%zz", "rediss://h?tls=1", "redis+tls://h", "REDISS://h"}) {
    EXPECT_THROW((void)parseUri(bad), redlimit::InvalidArgument) << bad;
  }
}

// parseClientUri: the standalone forms go through parseUri; the cluster and sentinel forms share
// its userinfo, host:port and query rules.
using redlimit::parseClientUri;

namespace {

std::string uriRejection(const std::string& uri) {
  try {
    (void)parseClientUri(uri);
  } catch (const redlimit::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << uri << " was accepted";
  return {};
}

void expectNodes(const std::vector<ClientOptions::Node>& nodes,
                 const std::vector<std::pair<std::string, int>>& expected) {
  ASSERT_EQ(nodes.size(), expected.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(nodes[i].host, expected[i].first) << i;
    EXPECT_EQ(nodes[i].port, expected[i].second) << i;
  }
}

}  // namespace

TEST(ParseClientUri, StandaloneFormsAreParseUris) {
  ClientOptions base;
  base.topology = ClientOptions::Topology::Cluster;  // a standalone URI says what it names
  base.clientId = "kept";
  base.connection.commandTimeout = std::chrono::milliseconds(42);
  for (const char* uri :
       {"redis://u:p@h:7000/3", "rediss://[::1]:6390?cacert=/ca.pem&verify=0", "unix:///run/redis.sock?db=2"}) {
    ClientOptions o = parseClientUri(uri, base);
    EXPECT_EQ(o.topology, ClientOptions::Topology::Standalone) << uri;
    EXPECT_EQ(o.clientId, "kept");
    ClientOptions::Connection expected = parseUri(uri, base.connection);
    EXPECT_EQ(o.connection.host, expected.host) << uri;
    EXPECT_EQ(o.connection.port, expected.port) << uri;
    EXPECT_EQ(o.connection.unixSocket, expected.unixSocket) << uri;
    EXPECT_EQ(o.connection.db, expected.db) << uri;
    EXPECT_EQ(o.connection.user, expected.user) << uri;
    EXPECT_EQ(o.connection.password, expected.password) << uri;
    EXPECT_EQ(o.connection.tls.enabled, expected.tls.enabled) << uri;
    EXPECT_EQ(o.connection.tls.caFile, expected.tls.caFile) << uri;
    EXPECT_EQ(o.connection.commandTimeout.count(), 42) << uri;
  }
}

TEST(ParseClientUri, Cluster) {
  ClientOptions base;
  base.connection.unixSocket = "/tmp/r.sock";  // cluster nodes are TCP: the URI clears it
  base.connection.tls.enabled = true;          // redis-cluster:// is plain text
  base.cluster.maxRedirects = 3;
  ClientOptions o = parseClientUri("redis-cluster://app:p%40ss@10.0.0.1:7000,[::1]:7001,node-c,fe80::2:7003", base);
  EXPECT_EQ(o.topology, ClientOptions::Topology::Cluster);
  expectNodes(o.cluster.seeds, {{"10.0.0.1", 7000}, {"::1", 7001}, {"node-c", 6379}, {"fe80::2", 7003}});
  EXPECT_EQ(o.connection.user, "app");
  EXPECT_EQ(o.connection.password, "p@ss");
  EXPECT_EQ(o.connection.db, 0);
  EXPECT_TRUE(o.connection.unixSocket.empty());
  EXPECT_FALSE(o.connection.tls.enabled);
  EXPECT_EQ(o.cluster.maxRedirects, 3);
  EXPECT_NO_THROW(redlimit::checkOptions(o));

  o = parseClientUri("redis-cluster://:pw@h:7000?user=u2&db=0");
  expectNodes(o.cluster.seeds, {{"h", 7000}});
  EXPECT_EQ(o.connection.user, "u2");
  EXPECT_EQ(o.connection.password, "pw");
  EXPECT_EQ(parseClientUri("redis-cluster://h:7000/0").connection.db, 0);
  EXPECT_EQ(parseClientUri("redis-cluster://h:7000/").cluster.seeds.size(), 1u);
}

TEST(ParseClientUri, ClusterOverTls) {
  ClientOptions o = parseClientUri(
      "rediss-cluster://h1:7000,h2:7001?cacert=%2Fca%20dir%2Fca.pem&cert=/c.pem&key=/k.pem&sni=redis.example&verify=0");
  EXPECT_EQ(o.topology, ClientOptions::Topology::Cluster);
  expectNodes(o.cluster.seeds, {{"h1", 7000}, {"h2", 7001}});
  EXPECT_TRUE(o.connection.tls.enabled);
  EXPECT_EQ(o.connection.tls.caFile, "/ca dir/ca.pem");
  EXPECT_EQ(o.connection.tls.certFile, "/c.pem");
  EXPECT_EQ(o.connection.tls.keyFile, "/k.pem");
  EXPECT_EQ(o.connection.tls.serverName, "redis.example");
  EXPECT_FALSE(o.connection.tls.verifyPeer);
  EXPECT_FALSE(o.sentinel.tls);
}

TEST(ParseClientUri, ClusterHasOnlyDb0) {
  for (const char* uri : {"redis-cluster://h:7000/1", "redis-cluster://h:7000?db=2", "rediss-cluster://h?db=15"}) {
    const std::string message = uriRejection(uri);
    EXPECT_NE(message.find("a Redis Cluster has only db 0"), std::string::npos) << message;
  }
  EXPECT_NE(uriRejection("redis-cluster://h:7000?db=x").find("db must be a number"), std::string::npos);
}

TEST(ParseClientUri, Sentinel) {
  ClientOptions o = parseClientUri(
      "redis-sentinel://app:secret@s1:26380,[::1],s3/my%2Dprimary/4?sentinel_user=watcher&sentinel_password=s%26p");
  EXPECT_EQ(o.topology, ClientOptions::Topology::Sentinel);
  expectNodes(o.sentinel.sentinels, {{"s1", 26380}, {"::1", 26379}, {"s3", 26379}});
  EXPECT_EQ(o.sentinel.primaryName, "my-primary");
  EXPECT_EQ(o.connection.db, 4);
  EXPECT_EQ(o.connection.user, "app");
  EXPECT_EQ(o.connection.password, "secret");
  EXPECT_EQ(o.sentinel.user, "watcher");
  EXPECT_EQ(o.sentinel.password, "s&p");
  EXPECT_FALSE(o.connection.tls.enabled);
  EXPECT_FALSE(o.sentinel.tls);
  EXPECT_NO_THROW(redlimit::checkOptions(o));

  o = parseClientUri("redis-sentinel://s1/mymaster?db=2&password=pw");
  EXPECT_EQ(o.sentinel.primaryName, "mymaster");
  EXPECT_EQ(o.connection.db, 2);
  EXPECT_EQ(o.connection.password, "pw");
  EXPECT_TRUE(o.sentinel.user.empty());
  EXPECT_TRUE(o.sentinel.password.empty());
  EXPECT_EQ(parseClientUri("redis-sentinel://s1/mymaster/").connection.db, 0);
}

TEST(ParseClientUri, SentinelOverTls) {
  ClientOptions base;
  base.sentinel.primaryName = "replaced";
  ClientOptions o = parseClientUri("rediss-sentinel://s1:26379/mymaster?capath=/certs&verify=1", base);
  EXPECT_TRUE(o.connection.tls.enabled);
  EXPECT_TRUE(o.sentinel.tls);
  EXPECT_EQ(o.connection.tls.caPath, "/certs");
  EXPECT_EQ(o.sentinel.primaryName, "mymaster");
}

TEST(ParseClientUri, SentinelNeedsThePrimaryName) {
  for (const char* uri : {"redis-sentinel://s1:26379", "redis-sentinel://s1:26379/", "redis-sentinel://s1//3",
                          "rediss-sentinel://s1?db=1"}) {
    const std::string message = uriRejection(uri);
    EXPECT_NE(message.find("missing the primary's name"), std::string::npos) << message;
  }
}

TEST(ParseClientUri, RejectsMalformed) {
  for (const char* uri : {
           "redis-cluster://",
           "redis-cluster://h:7000,",
           "redis-cluster://,h",
           "redis-cluster://h:0",
           "redis-cluster://h:70000",
           "redis-cluster://[::1",
           "redis-cluster://[::1]x",
           "redis-cluster://u:p%zz@h",
           "redis-cluster://h?foo=1",
           "redis-cluster://h?db",
           "redis-sentinel:///mymaster",
           "redis-sentinel://s1,,s2/m",
           "redis-sentinel://s1:x/m",
           "redis-sentinel://s1/m/x",
           "redis-sentinel://s1/m/1/2",
           "redis-sentinel://s1/m%zz",
           "redis-sentinel://s1/m?sentinel_password=%z",
           "REDIS-CLUSTER://h",
           "redis+cluster://h",
           "http://h",
           "",
       }) {
    EXPECT_THROW((void)parseClientUri(uri), redlimit::InvalidArgument) << uri;
  }
  EXPECT_NE(uriRejection("redis-cluster://h?foo=1")
                .find("bad Redis URI \"redis-cluster://h?foo=***\": unknown query "
                      "parameter \"foo\""),
            std::string::npos);
  EXPECT_NE(uriRejection("valkey://h").find("redis-cluster://"), std::string::npos) << "names every scheme";
}

TEST(ParseClientUri, TlsParametersNeedTheTlsScheme) {
  EXPECT_NE(uriRejection("redis-cluster://h?cacert=/ca.pem").find("use a rediss-cluster:// URI"), std::string::npos);
  EXPECT_NE(uriRejection("redis-sentinel://h/m?verify=0").find("use a rediss-sentinel:// URI"), std::string::npos);
}

TEST(ParseClientUri, SentinelParametersOnlyOnSentinelUris) {
  for (const char* uri :
       {"redis://h?sentinel_user=u", "redis-cluster://h?sentinel_password=p", "unix:///tmp/r.sock?sentinel_user=u"}) {
    const std::string message = uriRejection(uri);
    EXPECT_NE(message.find("is for redis-sentinel:// URIs"), std::string::npos) << message;
  }
}

TEST(ParseUri, NamesTheClientUriFormsItDoesNotTake) {
  for (const char* uri : {"redis://h1:7000,h2:7001", "rediss://h1,h2"}) {
    try {
      (void)parseUri(uri);
      ADD_FAILURE() << uri << " was accepted";
    } catch (const redlimit::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("use redis-cluster:// or redis-sentinel://"), std::string::npos) << e.what();
    }
  }
  for (const char* uri : {"redis-cluster://h:7000", "rediss-sentinel://s/m"}) {
    try {
      (void)parseUri(uri);
      ADD_FAILURE() << uri << " was accepted";
    } catch (const redlimit::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("parseClientUri"), std::string::npos) << e.what();
    }
  }
}

// No message about a URI shows a password: not the userinfo's, not password= or sentinel_password=,
// not a misspelt parameter's value; each still says what is wrong, and the user name stays.
TEST(ParseClientUri, RejectionsMaskEveryPassword) {
  const struct {
    std::string uri;
    std::string says;
  } cases[] = {
      {"redis://:s3cret@127.0.0.1:notaport", "port must be a number"},
      {"redis://app:s3cret@127.0.0.1:6379?foo=1", "unknown query parameter \"foo\""},
      {"redis://app:s3cret@127.0.0.1:6379/notadb", "db must be a number"},
      {"redis://s3cret@127.0.0.1:0", "port must be a number"},
      {"rediss://app:s3cret@h:6379?verify=2", "verify must be 0 or 1"},
      {"redis-cluster://app:s3cret@h1:7000,h2:7001/3", "a Redis Cluster has only db 0"},
      {"redis-cluster://h1:7000?password=s3cret&db=1", "a Redis Cluster has only db 0"},
      {"redis-sentinel://app:s3cret@s1:26379,s2:26379", "missing the primary's name"},
      {"redis-sentinel://s1:26379/mymaster?sentinel_password=s3cret&db=x", "db must be a number"},
      {"redis-sentinel://s1:26379/mymaster?sentinel_user=watch&sentinel_password=s3cret&foo=1",
       "unknown query parameter \"foo\""},
      {"redis://h:6379?password=s3cret&bogus=1", "unknown query parameter \"bogus\""},
      {"redis://h:6379?pasword=s3cret", "unknown query parameter \"pasword\""},
      {"redis://h:6379?s3cret", "query parameter without '='"},
      {"unix:///run/redis.sock?password=s3cret&db=-1", "db must be a number"},
      {"redis://app:s3cret@h1:6379,h2:6379", "a list of hosts names a cluster or sentinels"},
      {"redis://:s3%63ret@h:6379/x", "db must be a number"},
      {"redis://:s3cr/et@h:6379", "db must be a number"},    // an unescaped '/' in the password
      {"redis://:s3cr?et@h:6379", "port must be a number"},  // an unescaped '?' in the password
      {"redis://:s3cret@h:6379?password=%zz", "broken percent-escape"},
  };
  for (const auto& c : cases) {
    const std::string message = uriRejection(c.uri);
    EXPECT_EQ(message.find("s3cr"), std::string::npos) << c.uri << " -> " << message;
    EXPECT_EQ(message.find("et@"), std::string::npos) << c.uri << " -> " << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.uri << " -> " << message;
  }
  // What stays: the user name, the hosts, and the values that hold no secret.
  const std::string message = uriRejection("redis://app:s3cret@cache.internal:6379?db=1&password=s3cret&foo=1");
  EXPECT_NE(message.find("\"redis://app:***@cache.internal:6379?db=1&password=***&foo=***\""), std::string::npos)
      << message;
}
