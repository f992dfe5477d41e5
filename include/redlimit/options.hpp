// redlimit — connection, pool and client options: plain aggregates with finite defaults.
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include <sys/un.h>

#include "redlimit/events.hpp"

namespace redlimit {

/// The longest connect or command timeout: an int of milliseconds (about 24.8 days), what poll()
/// and epoll_wait() take. Longer timeouts are refused with InvalidArgument.
inline constexpr std::chrono::milliseconds kMaxConnectionTimeout{INT_MAX};
/// The longest unix socket path redlimit connects to: sizeof(sockaddr_un::sun_path) - 2, 106 bytes
/// on Linux. The OS takes 107 and a NUL; redlimit keeps the limit hiredis-based clients have
/// (hiredis copies at most 107 bytes into memory it does not clear), so a configuration that works
/// with one works with the other. Longer paths are refused with InvalidArgument, never cut short.
inline constexpr std::size_t kMaxUnixSocketPath = sizeof(sockaddr_un::sun_path) - 2;

/// Everything a Client needs. Build it by hand or from a URI with Client::fromUri(). Its parts are
/// nested: ClientOptions::Connection (one server), ::Tls, ::ReplyLimits, ::Pool, ::Topology,
/// ::Cluster, ::Sentinel and ::Node (an address of a cluster seed or a sentinel).
struct ClientOptions {
  /// TLS for the connection (OpenSSL 3). `rediss://` URIs turn it on; their query parameters
  /// `cacert`, `capath`, `cert`, `key`, `sni` and `verify=0|1` fill the fields of the same meaning.
  struct Tls {
    bool enabled = false;    // speak TLS on the TCP connection
    std::string caFile;      // PEM file of trusted CAs; empty (and caPath empty)
                             // = the system's default trust store
    std::string caPath;      // directory of hashed CA certificates (c_rehash)
    std::string certFile;    // client certificate (PEM) for mutual TLS; needs keyFile
    std::string keyFile;     // private key of certFile (PEM, unencrypted)
    std::string serverName;  // SNI and the name the certificate must carry;
                             // empty = the host of the Connection
    bool verifyPeer = true;  // check the server's certificate chain and name; false accepts any
                             // server (a man in the middle too), and with caFile/caPath set is
                             // refused (InvalidArgument)
  };

  /// The largest reply redlimit accepts from a server. A reply over a limit is a protocol failure,
  /// found at its header before anything is allocated: the connection is closed and every request
  /// waiting on it fails (IoError (Protocol) for the one whose reply broke the limit). Limiters'
  /// replies are tiny; the limits only bound what a broken or hostile peer can make a client allocate.
  struct ReplyLimits {
    std::size_t maxBulkBytes = std::size_t{64} << 20;  // longest bulk string (and status or error line),
                                                       // bytes; >= 1
    std::size_t maxElements = std::size_t{1} << 20;    // most elements in one array (each level), >= 1
    int maxDepth = 7;                                  // deepest nesting of arrays, 1..7 (hiredis
                                                       // 0.14's reader stops at 7)
  };

  /// How to reach one Redis server and what to send after connecting.
  struct Connection {
    std::string host = "127.0.0.1";                 // TCP host; ignored when unixSocket is set
    int port = 6379;                                // TCP port
    std::string unixSocket;                         // path of a unix socket; empty = use TCP;
                                                    // at most kMaxUnixSocketPath bytes
    std::string user;                               // ACL user for AUTH; empty = "default"
    std::string password;                           // AUTH password; empty = no AUTH
    int db = 0;                                     // SELECT db after connecting (0 = none sent)
    std::chrono::milliseconds connectTimeout{500};  // TCP/unix connect and the first exchange
                                                    // (AUTH/SELECT/PING), ms; in 1..kMaxConnectionTimeout
    std::chrono::milliseconds commandTimeout{500};  // a request's whole deadline (queueing, waiting for a
                                                    // connection, writing, the reply), ms, from the call;
                                                    // in 1..kMaxConnectionTimeout; a limiter call gets
                                                    // connectTimeout + commandTimeout
    bool keepAlive = true;                          // TCP keep-alive on the socket
    Tls tls;                                        // TLS (off unless `rediss://` or set here)
    ReplyLimits replyLimits;                        // what a reply may make the client allocate
  };

  /// The connections a Client multiplexes its requests over. Any number of threads share them:
  /// the size bounds connections, not concurrency.
  struct Pool {
    std::size_t size = 8;             // connections to the server, opened when first
                                      // needed; requests spread round-robin; 1..1024.
                                      // Up to this many threads' sync calls each do
                                      // their own I/O at once (docs/transport.md)
    std::size_t maxPending = 100000;  // requests queued or awaiting replies at once, per
                                      // Client; more are refused with TimeoutError (PoolTimeout); >= 1
  };

  /// What a Client talks to: one server, a Redis Cluster, or the primary a group of Sentinels names.
  enum class Topology {
    Standalone,  // the Connection's server
    Cluster,     // a Redis Cluster found from Cluster::seeds
    Sentinel,    // the primary Sentinel::sentinels name for Sentinel::primaryName
  };

  /// A TCP address: host name or IP literal, and port.
  struct Node {
    std::string host;
    int port = 6379;
  };

  /// Redis Cluster (Topology::Cluster). The slot map comes from the cluster itself (CLUSTER SHARDS,
  /// or CLUSTER SLOTS on servers without it), asked of the seeds and of every node learnt since.
  /// Every node is reached with the Client's Connection (user, password, TLS, timeouts, reply
  /// limits; host, port and unixSocket are replaced by the node's address; db must be 0).
  struct Cluster {
    std::vector<Node> seeds;                            // where to ask for the slot map first; >= 1
    std::chrono::milliseconds minRefreshInterval{200};  // slot map refreshes (after a redirect or a node
                                                        // failure) at most this often, ms; > 0
    std::chrono::milliseconds refreshPeriod{10000};     // and at least this often while the Client is in
                                                        // use, ms; >= minRefreshInterval
    int maxRedirects = 5;                               // MOVED/ASK followed per request, 1..16, within its deadline
  };

  /// Redis Sentinel (Topology::Sentinel): the primary is the one the sentinels name; the Client
  /// follows failovers. The Connection (user, password, db, TLS, timeouts) is for the primary;
  /// host, port and unixSocket are replaced by its address.
  struct Sentinel {
    std::vector<Node> sentinels;  // >= 1
    std::string primaryName;      // the name the sentinels monitor, e.g. "mymaster"
    std::string user;             // the sentinels' own ACL user (empty = "default")
    std::string password;         // the sentinels' own password (empty = no AUTH)
    bool tls = false;             // speak TLS to the sentinels (with Connection::tls's
                                  // CA and client certificate)
  };

  Topology topology = Topology::Standalone;        // what `connection` (or `cluster`, `sentinel`) names
  Connection connection;                           // the server (every node, for a cluster or sentinel)
  Cluster cluster;                                 // Topology::Cluster
  Sentinel sentinel;                               // Topology::Sentinel
  Pool pool;                                       // the pool (per node, for a cluster)
  std::string clientId;                            // PER_CLIENT identity; empty = random UUID v4 per Client
  std::chrono::milliseconds bestEffortRetry{250};  // after a transport failure, best-effort calls (give-backs)
                                                   // are skipped for this long, then one probe per interval, ms; > 0;
                                                   // also a down Cluster node's probe interval (its requests fail
                                                   // at once in between)
  EventCallback onEvent;                           // the events of every limiter made on this Client
                                                   // (events.hpp), after the limiter's own; empty = none
  bool coalesce = false;                           // true: decisions of the token bucket, GCRA and
                                                   // fixed-window limiters (handles and keyed) that arrive
                                                   // while 4 are in flight on each connection of the pool
                                                   // go to Redis together, up to 64 in one script call
                                                   // (lua/batch.lua), whatever their keys (on a
                                                   // cluster: keys of one slot). Off by default: it
                                                   // pays with many decisions in flight (async callers),
                                                   // and with few it only equals one call each
                                                   // (docs/transport.md, "When to turn it on")
};

/// Throws InvalidArgument naming the first option that cannot be used: a timeout outside
/// 1..kMaxConnectionTimeout, a port outside 1..65535, a negative db, a unix socket path longer than
/// kMaxUnixSocketPath, a user without a password, TLS with a unix socket, a TLS certFile without
/// keyFile or keyFile without certFile. Client's constructor calls it.
void checkOptions(const ClientOptions::Connection& options);
/// Throws InvalidArgument for a pool size outside 1..1024 or a maxPending of 0.
void checkOptions(const ClientOptions::Pool& options);

/// Throws InvalidArgument naming the first option that cannot be used: first the topology's (no
/// seeds or sentinels, a port outside 1..65535, an empty host, a db other than 0 or a unix socket
/// on a cluster, refresh intervals or maxRedirects out of range; an empty primary name or one with
/// spaces or control characters, a sentinel user without a password, or a unix socket with
/// Sentinel), then what checkOptions(ClientOptions::Connection) and checkOptions(ClientOptions::Pool) refuse.
/// Client's constructor calls it. Thread-safe.
void checkOptions(const ClientOptions& options);

/// Parses a Client URI into options, starting from `base`: every form parseUri takes, and
///   `redis-cluster://[[user]:password@]host:port[,host:port...][?...]` (ClientOptions::Topology::Cluster, the
///       hosts as seeds; `rediss-cluster://` the same over TLS, with parseUri's TLS parameters)
///   `redis-sentinel://[[user]:password@]host:port[,host:port...]/primaryName[/db][?...]`
///       (ClientOptions::Topology::Sentinel; user and password are the primary's; `sentinel_user=` and
///       `sentinel_password=` are the sentinels' own; `rediss-sentinel://` speaks TLS to both)
/// parseUri's forms give ClientOptions::Topology::Standalone. Hosts without a port get 6379 (cluster) or 26379
/// (sentinel); an IPv6 address is written in brackets, `[::1]:7000`. The cluster and sentinel
/// forms clear ClientOptions::Connection::unixSocket and set TLS as their scheme says.
/// Throws InvalidArgument on a malformed URI (as parseUri), a db other than 0 in a cluster URI, or
/// a sentinel URI without the primary's name.
[[nodiscard]] ClientOptions parseClientUri(const std::string& uri, ClientOptions base = {});

/// Parses a URI into connection options, starting from `base`:
///   `redis://[[user]:password@]host[:port][/db][?db=N&user=...&password=...]`
///   `rediss://...` the same over TLS (tls.enabled = true), with the TLS query parameters
///       `cacert=` (ClientOptions::Tls::caFile), `capath=` (caPath), `cert=` (certFile), `key=` (keyFile),
///       `sni=` (serverName) and `verify=0|1` (verifyPeer)
///   `unix:///path/to/socket[?db=N&user=...&password=...]`
/// redis:// and unix:// turn TLS off. User, password and query values are percent-decoded.
/// Throws InvalidArgument on a malformed URI, an unknown query parameter, a TLS parameter on a
/// redis:// or unix:// URI, a socket path longer than kMaxUnixSocketPath, or a list of hosts or a
/// cluster or sentinel scheme (parseClientUri reads those).
[[nodiscard]] ClientOptions::Connection parseUri(const std::string& uri, ClientOptions::Connection base = {});

}  // namespace redlimit
