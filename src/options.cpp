#include "redlimit/options.hpp"

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "resp.hpp"

namespace redlimit {
namespace {

using std::chrono::milliseconds;

[[noreturn]] void badOption(const std::string& why) { throw InvalidArgument(fmt::format("redlimit: {}", why)); }

void checkTimeout(const char* name, milliseconds t) {
  if (t.count() <= 0 || t > kMaxConnectionTimeout) {
    badOption(fmt::format("ConnectionOptions::{} must be in 1..{} ms (no infinite waits), got {} ms", name,
                          kMaxConnectionTimeout.count(), t.count()));
  }
}

}  // namespace

void checkOptions(const ConnectionOptions& o) {
  checkTimeout("connectTimeout", o.connectTimeout);
  checkTimeout("commandTimeout", o.commandTimeout);
  if (o.unixSocket.size() > kMaxUnixSocketPath) {
    badOption(fmt::format("unix socket path of {} bytes is longer than kMaxUnixSocketPath ({} bytes): it cannot "
                          "be handed to the OS intact: {}",
                          o.unixSocket.size(), kMaxUnixSocketPath, o.unixSocket));
  }
  if (o.unixSocket.empty() && (o.port <= 0 || o.port > 65535)) {
    badOption(fmt::format("port must be in 1..65535, got {}", o.port));
  }
  if (o.db < 0) badOption(fmt::format("db must be >= 0, got {}", o.db));
  if (!o.user.empty() && o.password.empty()) badOption("an ACL user needs a password");
  if (o.tls.enabled && !o.unixSocket.empty()) {
    badOption(fmt::format("TLS (TlsOptions::enabled, rediss://) runs over TCP, not over a unix socket; clear "
                          "unixSocket ({}) or turn TLS off",
                          o.unixSocket));
  }
  if (o.tls.certFile.empty() != o.tls.keyFile.empty()) {
    const bool onlyKey = o.tls.certFile.empty();
    badOption(fmt::format("TlsOptions::{} is set but ::{} is empty: a client certificate needs both the certificate "
                          "(certFile, cert= in a URI) and its private key (keyFile, key=)",
                          onlyKey ? "keyFile" : "certFile", onlyKey ? "certFile" : "keyFile"));
  }
  detail::checkLimits(o.replyLimits);
}

void checkOptions(const PoolOptions& p) {
  if (p.size == 0 || p.size > 1024) badOption(fmt::format("PoolOptions::size must be in 1..1024, got {}", p.size));
  if (p.maxPending == 0) badOption("PoolOptions::maxPending must be >= 1");
}

}  // namespace redlimit
