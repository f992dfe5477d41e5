// checkOptions(ConnectionOptions): the TLS checks (the others are covered by the integration
// tests through Client's constructor).
#include <string>

#include <gtest/gtest.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"

using redlimit::ConnectionOptions;

namespace {

std::string rejection(const ConnectionOptions& o) {
  try {
    redlimit::checkOptions(o);
  } catch (const redlimit::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(CheckOptions, TlsIsFine) {
  ConnectionOptions o;
  o.tls.enabled = true;
  EXPECT_NO_THROW(redlimit::checkOptions(o));
  o.tls.certFile = "/c.pem";
  o.tls.keyFile = "/k.pem";
  EXPECT_NO_THROW(redlimit::checkOptions(o));
}

TEST(CheckOptions, TlsOverAUnixSocketIsRefused) {
  ConnectionOptions o;
  o.unixSocket = "/tmp/r.sock";
  o.tls.enabled = true;
  const std::string message = rejection(o);
  EXPECT_NE(message.find("unix socket"), std::string::npos) << message;
  o.tls.enabled = false;
  EXPECT_NO_THROW(redlimit::checkOptions(o));
}

TEST(CheckOptions, ClientCertificateNeedsBothFiles) {
  ConnectionOptions o;
  o.tls.enabled = true;
  o.tls.certFile = "/c.pem";
  std::string message = rejection(o);
  EXPECT_NE(message.find("TlsOptions::certFile is set but ::keyFile is empty"), std::string::npos) << message;
  o.tls.certFile.clear();
  o.tls.keyFile = "/k.pem";
  message = rejection(o);
  EXPECT_NE(message.find("TlsOptions::keyFile is set but ::certFile is empty"), std::string::npos) << message;
}

}  // namespace
