// redlimit — events: what happened to a limiter or a Client, with its cause, for logs and alerts.
#pragma once

#include <functional>
#include <string>

#include "redlimit/failure_policy.hpp"

namespace redlimit {

/// Something an operator wants to hear about. Subscribe per limiter (MonitorOptions::onEvent) or
/// per Client (ClientOptions::onEvent: the events of every limiter made on it, and the Client's own).
struct Event {
  enum class Kind {
    Health,        // a limiter degraded or recovered: `health` says which, why, and the error
    ScriptReload,  // a server answered NOSCRIPT (restarted, SCRIPT FLUSH, a new node): the script
                   // was loaded again and the calls resent; `script` names it
    Topology,      // the Client's view of the deployment changed: a Sentinel failover (a new
                   // primary) or a new Redis Cluster slot map
  };
  Kind kind = Kind::Health;
  HealthEvent health;       // Kind::Health: the change (limiter, kind, cause, error)
  std::string script;       // Kind::ScriptReload: the script's name (e.g. "acquire")
  std::string description;  // every kind: one line saying what happened and why
};

/// Receives events. Called on the thread where the event happened (a caller's, or the Client's I/O
/// thread), never while redlimit holds a lock the callback could need: it may call the limiter or
/// the Client again, but must not throw and should not block (on the I/O thread every request of
/// the Client waits while it runs).
using EventCallback = std::function<void(const Event&)>;

}  // namespace redlimit
