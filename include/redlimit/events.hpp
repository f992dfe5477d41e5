// redlimit — events: what happened to a limiter or a Client, with its cause, for logs and alerts.
#pragma once

#include <functional>
#include <string>

#include "redlimit/failure_policy.hpp"

namespace redlimit {

/// Something an operator wants to hear about. Subscribe per limiter (LimiterMonitor::Options::onEvent: its
/// health) or per Client (ClientOptions::onEvent: the health of every limiter made on it, and the
/// Client's own script reloads and topology changes, which belong to a connection or a
/// deployment rather than to one limiter). Switch on `kind` with a default: kinds may be added.
struct Event {
  enum class Kind {
    Health,           // a limiter degraded or recovered: `health` says which, why, and the error
    ScriptReload,     // a server that had run a script answered NOSCRIPT for it (it restarted, or
                      // SCRIPT FLUSH): the script was loaded again and the calls resent; none failed
                      // (a script's first load on a server is no event)
    Topology,         // the deployment changed under the Client: a Sentinel failover (a new
                      // primary) or a new Redis Cluster slot map (slots moved between nodes); or
                      // a redis-cluster:// Client found no cluster (its seeds have cluster support
                      // disabled): its calls throw ConfigurationError, `node` names the seed
    CallbackThrew,    // a completion callback of an ...Async call threw: the exception was caught
                      // and dropped (counted as LimiterMetrics::Snapshot::callbacksThrew); the call it
                      // completed and every other call are unaffected; `limiter` names the limiter
    InsecureTls,      // a Client was made with TLS and ClientOptions::Tls::verifyPeer = false: the server's
                      // certificate is not checked, so whoever can intercept the connection can pose
                      // as Redis; reported once, by the Client's constructor, on its thread
    CallbackBlocked,  // a completion callback held the Client's I/O thread for 100 ms or more
                      // (it blocked): no reply was read and no request written meanwhile; requests
                      // whose deadline passed end with TimeoutError (CallbackBlocked), which no limiter counts
                      // as a Redis outage; `node` names the server of that I/O thread
  };
  Kind kind = Kind::Health;
  HealthEvent health;       // Kind::Health: the change (limiter, kind, cause, error)
  std::string script;       // Kind::ScriptReload: the script's name ("acquire", "gcra", ...)
  std::string node;         // ScriptReload: the server ("host:port"); Topology: the new primary
                            // (Sentinel) or empty (Cluster: many nodes); InsecureTls: the server
                            // the options name (a Cluster's first seed, a Sentinel's primary name);
                            // CallbackBlocked: the server whose I/O thread was held
  std::string limiter;      // CallbackThrew: the limiter whose callback threw
  std::string description;  // every kind: one line saying what happened and why, for logs
};

/// Receives events. Called on the thread where the event happened (a caller's, or the Client's I/O
/// thread), never while redlimit holds a lock the callback could need: it may call the limiter or
/// the Client again, but must not throw and should not block (on the I/O thread every request of
/// the Client waits while it runs).
using EventCallback = std::function<void(const Event&)>;

}  // namespace redlimit
