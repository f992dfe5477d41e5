// The counters of a Cluster or Sentinel client's runner, for the topology tests.
#pragma once

#include <stdexcept>

#include "redlimit/client.hpp"
#include "redlimit/detail/client_access.hpp"
#include "topology/cluster.hpp"
#include "topology/sentinel.hpp"

namespace redlimit::test {

/// What the Cluster runner of `c` counted; throws if `c` is not a Cluster client.
inline detail::ClusterCounters clusterCountersOf(Client& c) {
  auto* runner = dynamic_cast<detail::ClusterRunner*>(&detail::ClientAccess::runner(c));
  if (runner == nullptr) throw std::runtime_error("not a cluster client");
  return runner->clusterCounters();
}

/// What the Sentinel runner of `c` counted; throws if `c` is not a Sentinel client.
inline detail::SentinelCounters sentinelCountersOf(Client& c) {
  auto* runner = dynamic_cast<detail::SentinelRunner*>(&detail::ClientAccess::runner(c));
  if (runner == nullptr) throw std::runtime_error("not a sentinel client");
  return runner->sentinelCounters();
}

}  // namespace redlimit::test
