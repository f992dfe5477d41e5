#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

using redlimit::ConnectionOptions;
using redlimit::parseUri;

TEST(ParseUri, HostPortDb) {
  ConnectionOptions o = parseUri("redis://cache.internal:6380/3");
  EXPECT_EQ(o.host, "cache.internal");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 3);
  EXPECT_TRUE(o.user.empty());
  EXPECT_TRUE(o.password.empty());
  EXPECT_TRUE(o.unixSocket.empty());
}

TEST(ParseUri, DefaultsKeepBase) {
  ConnectionOptions base;
  base.commandTimeout = std::chrono::milliseconds(42);
  ConnectionOptions o = parseUri("redis://localhost", base);
  EXPECT_EQ(o.host, "localhost");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.db, 0);
  EXPECT_EQ(o.commandTimeout.count(), 42);
}

TEST(ParseUri, UserAndPasswordPercentDecoded) {
  ConnectionOptions o = parseUri("redis://app%40svc:p%3Ass@10.0.0.1:7000");
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
  ConnectionOptions o = parseUri("redis://[::1]:6390/1");
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6390);
  EXPECT_EQ(o.db, 1);
}

TEST(ParseUri, UnixSocket) {
  ConnectionOptions o = parseUri("unix:///run/redis/redis.sock?db=2&password=pw");
  EXPECT_EQ(o.unixSocket, "/run/redis/redis.sock");
  EXPECT_EQ(o.db, 2);
  EXPECT_EQ(o.password, "pw");
}

TEST(ParseUri, RejectsMalformed) {
  for (const char* bad : {"http://h", "redis://", "redis://h:0", "redis://h:65536", "redis://h:x",
                          "redis://h/-1", "redis://h/abc", "unix://relative.sock", "unix://",
                          "redis://h?foo=1", "redis://[::1", "redis://u:p%zz@h"}) {
    EXPECT_THROW((void)parseUri(bad), redlimit::InvalidArgument) << bad;
  }
}

// Issue 9 item 12: a path longer than hiredis can hand to the OS intact (sun_path less its NUL
// and the byte hiredis leaves unterminated) would be cut to another socket's path.
TEST(ParseUri, Item12_UnixSocketPathOverTheOsLimitIsRefused) {
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
  ConnectionOptions o = parseUri("rediss://:pw@cache.internal:6380/2");
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
  ConnectionOptions o = parseUri(
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
  ConnectionOptions base;
  base.tls.caFile = "/base/ca.pem";
  base.tls.verifyPeer = false;
  ConnectionOptions o = parseUri("rediss://h?sni=s.example", base);
  EXPECT_TRUE(o.tls.enabled);
  EXPECT_EQ(o.tls.caFile, "/base/ca.pem");
  EXPECT_FALSE(o.tls.verifyPeer);
  EXPECT_EQ(o.tls.serverName, "s.example");
}

TEST(ParseUri, RedisAndUnixTurnTlsOff) {
  ConnectionOptions base;
  base.tls.enabled = true;
  EXPECT_FALSE(parseUri("redis://h", base).tls.enabled);
  EXPECT_FALSE(parseUri("unix:///tmp/r.sock", base).tls.enabled);
}

TEST(ParseUri, TlsParametersNeedRediss) {
  for (const char* bad : {"redis://h?cacert=/ca.pem", "redis://h?capath=/certs", "redis://h?cert=/c.pem",
                          "redis://h?key=/k.pem", "redis://h?sni=x", "redis://h?verify=0",
                          "unix:///tmp/r.sock?cacert=/ca.pem", "unix:///tmp/r.sock?verify=1"}) {
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
