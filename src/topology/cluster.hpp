// redlimit — a Redis Cluster behind the Runner interface: a slot map learnt from the cluster, a
// Transport (multiplexed connections, one I/O thread) per primary, and redirects followed within
// each request's deadline.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/detail/thread_annotations.hpp"
#include "redlimit/options.hpp"
#include "transport/runner.hpp"
#include "topology/slot_map.hpp"
#include "transport/transport.hpp"

namespace redlimit::detail {

/// What a ClusterRunner did, for tests and the bench.
struct ClusterCounters {
  std::uint64_t moved = 0;         // MOVED redirects followed
  std::uint64_t asked = 0;         // ASK redirects followed
  std::uint64_t retried = 0;       // TRYAGAIN answers retried after a pause
  std::uint64_t refreshes = 0;     // slot maps fetched and applied
  std::size_t nodes = 0;           // nodes with a transport (retired ones not counted)
  std::uint64_t retired = 0;       // nodes retired (no map named them any more)
  std::uint64_t released = 0;      // of them, transports shut down once their requests ended
  std::uint64_t outages = 0;       // times a node was found in an outage (it was up before)
  std::uint64_t probes = 0;        // requests sent to a node in an outage (one per probe interval)
  std::uint64_t failedFast = 0;    // requests ended at once because their node is in an outage
  std::uint64_t seedsSkipped = 0;  // requests sent on to another node because theirs was
                                   // unreachable before the slot map was known
};

/// Routes each request to the primary that serves its slot.
///   - The slot map comes from CLUSTER SHARDS (CLUSTER SLOTS on servers that lack it), asked of the
///     known primaries and then the seeds, on a background thread: at start, at most once per
///     ClientOptions::Cluster::minRefreshInterval after a MOVED, a CLUSTERDOWN or a transport failure, and
///     every refreshPeriod while requests flow. A request never waits for a refresh: a slot not in
///     the map yet goes to any node, whose MOVED tells where it lives.
///   - MOVED: the slot is recorded at the node named and the request goes there. ASK: the request
///     goes to the node named, after ASKING, and the map is left alone. At most maxRedirects per
///     request; TRYAGAIN is retried after a short pause (5 ms, doubling up to 100 ms). All of it
///     within the request's own deadline; a request that runs out of time or redirects ends with
///     IoError (Unavailable) (an outage: the failure policy decides), never with a MOVED or an ASK.
///   - Node health, learnt once for the whole Client: a node that fails a request with an outage
///     (a timeout, an I/O error, CLUSTERDOWN "the cluster is down", LOADING, BUSY) is in an
///     outage. Requests routed to it then end at once with IoError (Unavailable) (code "NODEDOWN", or
///     "CLUSTERDOWN"), naming the node, the error and when the next probe is; one request per
///     ClientOptions::bestEffortRetry goes to it as the probe, and the first answer from it ends
///     the outage. Other nodes are not touched: their requests go on as before. CLUSTERDOWN is
///     never retried (it lasts at least the cluster's node timeout, far beyond a deadline).
///     A failure of a request sent before the node's last recovery is stale and changes nothing.
///   - Before the first slot map, a request whose node (a seed) is unreachable goes on to the
///     next known node that is not in an outage, within its deadline.
///   - Scripts are loaded per node when it first answers NOSCRIPT (the pipeline's resend).
///   - A refresh that finds no slot map because the seeds answer "cluster support disabled" (a
///     single server behind redis-cluster://) makes every request fail at once with
///     ConfigurationError saying so (thrown under every failure policy), reported once as a
///     Topology event, until a refresh finds a map. Requests sent before that first refresh ended
///     went to the seed (see above).
///   - A primary that a new slot map no longer names (its slots moved away, it left the cluster)
///     and that is not a seed is retired: no request goes to it any more, and once the requests
///     still on it have ended (each holds its node), the maintenance thread shuts its transport
///     down (its connections, I/O thread and descriptors); its counts stay in counters().
///     Other nodes, once known, keep their transport until shutdown. Thread-safe.
class ClusterRunner final : public Runner, public std::enable_shared_from_this<ClusterRunner> {
 public:
  /// Checks the options, starts the maintenance thread and asks for the slot map (in the
  /// background). Throws InvalidArgument for unusable options.
  static std::shared_ptr<ClusterRunner> start(const ClientOptions& options);
  ~ClusterRunner() override;
  ClusterRunner(const ClusterRunner&) = delete;
  ClusterRunner& operator=(const ClusterRunner&) = delete;

  void send(Request request, int slot) override;
  [[nodiscard]] Outcome sendAndWait(Request request, int slot) override;
  void shutdown() noexcept override;
  void abandonAfterFork() noexcept REDLIMIT_NO_THREAD_SAFETY_ANALYSIS override;  // a forked child: no lock is taken
  [[nodiscard]] TransportCounters counters() const override;
  [[nodiscard]] bool onIoThread() const noexcept override { return currentIoRunner() == this; }

  [[nodiscard]] ClusterCounters clusterCounters() const;

 private:
  struct Node {
    ClientOptions::Node address;
    std::string endpoint;                  // "host:port", the key of nodes_
    std::shared_ptr<Transport> transport;  // never null; fixed at creation
    // Health (see the class comment). Memory ordering: `why` and `nextProbe` are written before
    // `down` is set (release), and read after it is seen (acquire).
    std::atomic<bool> down{false};
    std::atomic<std::int64_t> nextProbe{0};   // ns on the steady clock: the next probe may go then
    std::atomic<std::int64_t> restoredAt{0};  // ns on the steady clock: the last end of an outage
    Mutex whyMutex;
    std::string why REDLIMIT_GUARDED_BY(whyMutex);      // the error that started (or last prolonged) the outage
    std::string whyCode REDLIMIT_GUARDED_BY(whyMutex);  // "NODEDOWN" or "CLUSTERDOWN"
  };
  using NodePtr = std::shared_ptr<Node>;  // held by the map and by each request on its way
  struct Retired {                        // a node no map names any more, until its requests end
    std::weak_ptr<Node> node;
    std::shared_ptr<Transport> transport;
  };
  struct Attempt;  // one caller's request on its way through redirects and retries
  struct Timer {
    SteadyTime at;
    std::uint64_t seq;
    std::function<void()> run;
    bool operator>(const Timer& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  explicit ClusterRunner(const ClientOptions& options);
  NodePtr route(int slot) const;
  NodePtr nodeAt(const ClientOptions::Node& address);  // finds or starts it; nullptr after shutdown
  NodePtr anotherNode(const Attempt& a) const;         // for a request whose node failed before the map was known
  bool mapped(int slot) const;
  void dispatch(const std::shared_ptr<Attempt>& a, NodePtr node, bool asking);
  void finished(const std::shared_ptr<Attempt>& a, const NodePtr& node, std::int64_t sentAt, Outcome out);
  bool takeProbe(Node& node, std::int64_t now);
  void nodeFailed(Node& node, std::int64_t sentAt, const std::string& code, const std::string& why);
  void nodeAnswered(Node& node);
  void failFast(const std::shared_ptr<Attempt>& a, Node& node, std::int64_t now);
  void redirect(const std::shared_ptr<Attempt>& a, const Redirect& to);
  bool retryLater(const std::shared_ptr<Attempt>& a);  // false: no time left
  void later(SteadyTime at, std::function<void()> run);
  void wantRefresh();
  // After a refresh found no map: `disabled` lists the seeds that have cluster support disabled
  // (empty: none, and requests go on as before).
  void noteNotACluster(const std::vector<std::string>& disabled);
  void maintain();
  bool refresh();
  void releaseRetired();  // shuts down the retired transports no request holds any more

  const ClientOptions options_;
  TlsContext tls_;  // set by start(), then read-only; empty: each node builds its own
  const std::chrono::milliseconds minRefresh_, refreshPeriod_;
  const std::int64_t probeNanos_;  // ClientOptions::bestEffortRetry: a node in an outage is probed this often

  mutable SharedMutex mapMutex_;
  // The primary of each of the 16384 slots (nullptr: not known).
  std::vector<NodePtr> slots_ REDLIMIT_GUARDED_BY(mapMutex_) = std::vector<NodePtr>(16384);
  std::map<std::string, NodePtr> nodes_ REDLIMIT_GUARDED_BY(mapMutex_);
  NodePtr fallback_ REDLIMIT_GUARDED_BY(mapMutex_);  // for kAnySlot and slots not in the map
  std::vector<Retired> retired_ REDLIMIT_GUARDED_BY(mapMutex_);
  TransportCounters retiredCounts_ REDLIMIT_GUARDED_BY(mapMutex_);  // what released transports counted
  std::atomic<bool> anyRetired_{false};                             // retired_ is not empty
  std::vector<ClientOptions::Node> seeds_;

  Mutex mutex_;
  std::condition_variable wake_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_ REDLIMIT_GUARDED_BY(mutex_);
  std::uint64_t timerSeq_ REDLIMIT_GUARDED_BY(mutex_) = 0;
  bool refreshWanted_ REDLIMIT_GUARDED_BY(mutex_) = true;  // a refresh at the next opportunity
  SteadyTime lastRefresh_ REDLIMIT_GUARDED_BY(mutex_){};   // when the last refresh started
  bool stopping_ REDLIMIT_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // started by the constructor, joined by shutdown()

  std::atomic<bool> stopped_{false};  // shutdown() began: no new nodes, no new timers
  // The last refresh found no map because seeds have cluster support disabled: requests fail.
  std::atomic<bool> notCluster_{false};
  std::string notClusterWhy_ REDLIMIT_GUARDED_BY(mutex_);  // which seeds said so
  std::atomic<bool> used_{false};                          // a request was sent since the last refresh
  std::atomic<std::uint64_t> moved_{0}, asked_{0}, retried_{0}, refreshes_{0};
  std::atomic<std::uint64_t> outages_{0}, probes_{0}, failedFast_{0}, seedsSkipped_{0};
  std::atomic<std::uint64_t> retiredNodes_{0}, released_{0};
};

}  // namespace redlimit::detail
