#include "redlimit/options.hpp"

#include <cstddef>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "redlimit/errors.hpp"
#include "codec/resp.hpp"

namespace redlimit {
namespace {

using std::chrono::milliseconds;

[[noreturn]] void badOption(const std::string& why) { throw InvalidArgument(fmt::format("redlimit: {}", why)); }

void checkTimeout(const char* name, milliseconds t) {
  if (t.count() <= 0 || t > kMaxConnectionTimeout) {
    badOption(fmt::format("ClientOptions::Connection::{} must be in 1..{} ms (no infinite waits), got {} ms", name,
                          kMaxConnectionTimeout.count(), t.count()));
  }
}

// `what` is e.g. "ClientOptions::Cluster::seeds"; the first bad address is named by its index.
void checkNodes(std::string_view what, const std::vector<ClientOptions::Node>& nodes, std::string_view example) {
  if (nodes.empty()) {
    badOption(fmt::format("{} is empty; give at least one node, e.g. {}", what, example));
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].host.empty()) badOption(fmt::format("{}[{}].host is empty", what, i));
    if (nodes[i].port <= 0 || nodes[i].port > 65535) {
      badOption(fmt::format("{}[{}].port must be in 1..65535, got {}", what, i, nodes[i].port));
    }
  }
}

// Cluster and Sentinel: the nodes' addresses come from the cluster or the sentinels, always TCP.
void checkNoUnixSocket(const ClientOptions::Connection& o, std::string_view topology) {
  if (!o.unixSocket.empty()) {
    badOption(
        fmt::format("ClientOptions::Connection::unixSocket is set ({}), but {} nodes are reached over TCP at the "
                    "addresses {} gives; clear unixSocket",
                    o.unixSocket, topology, topology == "cluster" ? "the cluster" : "the sentinels"));
  }
}

void checkCluster(const ClientOptions& o) {
  const ClientOptions::Cluster& c = o.cluster;
  checkNodes("ClientOptions::Cluster::seeds", c.seeds, "redis-cluster://127.0.0.1:7000");
  if (o.connection.db != 0) {
    badOption(
        fmt::format("ClientOptions::Connection::db is {}, but a Redis Cluster has only db 0 (it refuses SELECT); "
                    "use db 0, or key prefixes to separate data",
                    o.connection.db));
  }
  checkNoUnixSocket(o.connection, "cluster");
  if (c.minRefreshInterval.count() <= 0) {
    badOption(fmt::format("ClientOptions::Cluster::minRefreshInterval must be > 0 ms, got {} ms",
                          c.minRefreshInterval.count()));
  }
  if (c.refreshPeriod < c.minRefreshInterval) {
    badOption(fmt::format("ClientOptions::Cluster::refreshPeriod ({} ms) must be >= minRefreshInterval ({} ms)",
                          c.refreshPeriod.count(), c.minRefreshInterval.count()));
  }
  if (c.maxRedirects < 1 || c.maxRedirects > 16) {
    badOption(fmt::format("ClientOptions::Cluster::maxRedirects must be in 1..16, got {}", c.maxRedirects));
  }
}

void checkSentinel(const ClientOptions& o) {
  const ClientOptions::Sentinel& s = o.sentinel;
  checkNodes("ClientOptions::Sentinel::sentinels", s.sentinels, "redis-sentinel://127.0.0.1:26379/mymaster");
  if (s.primaryName.empty()) {
    badOption(
        "ClientOptions::Sentinel::primaryName is empty; give the name the sentinels monitor (\"mymaster\" in "
        "redis-sentinel://127.0.0.1:26379/mymaster)");
  }
  for (char ch : s.primaryName) {
    const auto u = static_cast<unsigned char>(ch);
    if (u <= 0x20 || u == 0x7f) {
      badOption(fmt::format(
          "ClientOptions::Sentinel::primaryName \"{}\" holds a space or a control character (byte {:#04x}); "
          "sentinels name primaries with one word",
          s.primaryName, u));
    }
  }
  if (!s.user.empty() && s.password.empty()) {
    badOption(
        "ClientOptions::Sentinel::user needs ClientOptions::Sentinel::password (sentinel_password= in a URI): an ACL "
        "user "
        "needs a password");
  }
  checkNoUnixSocket(o.connection, "sentinel");
}

}  // namespace

void checkOptions(const ClientOptions::Connection& o) {
  checkTimeout("connectTimeout", o.connectTimeout);
  checkTimeout("commandTimeout", o.commandTimeout);
  if (o.unixSocket.size() > kMaxUnixSocketPath) {
    badOption(
        fmt::format("unix socket path of {} bytes is longer than kMaxUnixSocketPath ({} bytes): it cannot "
                    "be handed to the OS intact: {}",
                    o.unixSocket.size(), kMaxUnixSocketPath, o.unixSocket));
  }
  if (o.unixSocket.empty() && (o.port <= 0 || o.port > 65535)) {
    badOption(fmt::format("port must be in 1..65535, got {}", o.port));
  }
  if (o.db < 0) badOption(fmt::format("db must be >= 0, got {}", o.db));
  if (!o.user.empty() && o.password.empty()) badOption("an ACL user needs a password");
  if (o.tls.enabled && !o.unixSocket.empty()) {
    badOption(
        fmt::format("TLS (ClientOptions::Tls::enabled, rediss://) runs over TCP, not over a unix socket; clear "
                    "unixSocket ({}) or turn TLS off",
                    o.unixSocket));
  }
  if (o.tls.certFile.empty() != o.tls.keyFile.empty()) {
    const bool onlyKey = o.tls.certFile.empty();
    badOption(
        fmt::format("ClientOptions::Tls::{} is set but ::{} is empty: a client certificate needs both the certificate "
                    "(certFile, cert= in a URI) and its private key (keyFile, key=)",
                    onlyKey ? "keyFile" : "certFile", onlyKey ? "certFile" : "keyFile"));
  }
  if (o.tls.enabled && !o.tls.verifyPeer && (!o.tls.caFile.empty() || !o.tls.caPath.empty())) {
    // verifyPeer = false checks nothing, so the CA named would be ignored without a word.
    badOption(
        fmt::format("ClientOptions::Tls::verifyPeer is false (verify=0) but ::{} is set ({}): without verification the "
                    "CA is never used and any server, a man in the middle too, is accepted; keep verifyPeer = true "
                    "to check the server against that CA, or clear caFile/caPath",
                    o.tls.caFile.empty() ? "caPath" : "caFile", o.tls.caFile.empty() ? o.tls.caPath : o.tls.caFile));
  }
  detail::checkLimits(o.replyLimits);
}

void checkOptions(const ClientOptions::Pool& p) {
  if (p.size == 0 || p.size > 1024)
    badOption(fmt::format("ClientOptions::Pool::size must be in 1..1024, got {}", p.size));
  if (p.maxPending == 0) badOption("ClientOptions::Pool::maxPending must be >= 1");
}

void checkOptions(const ClientOptions& o) {
  switch (o.topology) {
    case ClientOptions::Topology::Standalone:
      break;
    case ClientOptions::Topology::Cluster:
      checkCluster(o);
      break;
    case ClientOptions::Topology::Sentinel:
      checkSentinel(o);
      break;
    default:
      badOption(fmt::format("ClientOptions::topology is not a ClientOptions::Topology value ({})",
                            static_cast<int>(o.topology)));
  }
  checkOptions(o.connection);
  checkOptions(o.pool);
}

}  // namespace redlimit
