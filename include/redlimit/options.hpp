// redlimit — connection, pool and client options: plain aggregates with finite defaults.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace redlimit {

/// How to reach one Redis server and what to send after connecting.
struct ConnectionOptions {
  std::string host = "127.0.0.1";                     // TCP host; ignored when unixSocket is set
  int port = 6379;                                    // TCP port
  std::string unixSocket;                             // path of a unix socket; empty = use TCP
  std::string user;                                   // ACL user for AUTH; empty = "default"
  std::string password;                               // AUTH password; empty = no AUTH
  int db = 0;                                         // SELECT db after connecting (0 = none sent)
  std::chrono::milliseconds connectTimeout{500};      // TCP/unix connect, ms; must be > 0
  std::chrono::milliseconds commandTimeout{500};      // waiting for one reply, ms; must be > 0
  bool keepAlive = true;                              // TCP keep-alive on the socket
};

/// Bounds of the connection pool a Client uses.
struct PoolOptions {
  std::size_t size = 4;                               // connections kept open at most; >= 1
  std::chrono::milliseconds waitTimeout{100};         // waiting for a free connection, ms; > 0, never "forever"
  std::chrono::milliseconds idlePingAfter{30000};     // PING a connection idle longer than this on checkout, ms
};

/// Everything a Client needs. Build it by hand or from a URI with Client::fromUri().
struct ClientOptions {
  ConnectionOptions connection;                       // the server
  PoolOptions pool;                                   // the pool
  std::string clientId;                               // PER_CLIENT identity; empty = random UUID v4 per Client
  std::chrono::milliseconds bestEffortRetry{250};     // after a transport failure, best-effort calls (give-backs)
                                                      // are skipped for this long, then one probe per interval, ms; > 0
};

/// Parses `redis://[[user]:password@]host[:port][/db]` or `unix:///path/to/socket[?db=N]`
/// (also `?password=...&user=...` on unix URIs) into connection options, starting from `base`.
/// Percent-escapes in user and password are decoded. Throws InvalidArgument on a malformed URI.
[[nodiscard]] ConnectionOptions parseUri(const std::string& uri, ConnectionOptions base = {});

}  // namespace redlimit
