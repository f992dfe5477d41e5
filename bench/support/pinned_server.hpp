// A throwaway redis-server on one CPU and this process on another, so that the server's CPU time
// is its own and a load generator cannot take it: used by bench_transport and bench_algorithms.
// Header-only, Linux only. Not thread-safe: call it from main() before starting any thread.
#pragma once

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "bench_support.hpp"
#include "cpu_usage.hpp"

namespace redlimit::bench {

/// A server started by startPinnedServer, and what the summary should say about the placement.
struct PinnedServer {
  std::unique_ptr<BenchServer> server;
  std::string placement;  // one line for the summary: pinned, or why not
  bool pinned = false;    // server on serverCpu (every thread checked), this process on clientCpu
};

/// Starts a BenchServer with `extraArgs` on CPU `serverCpu` and moves this process to CPU
/// `clientCpu`: the calling thread moves to the server's CPU before the server starts (so every
/// thread the server ever makes inherits that CPU), the server's threads are pinned and checked,
/// then the calling thread moves to the client's CPU before this process starts any other thread.
/// Without two usable CPUs, or if the kernel refuses, nothing is pinned and `placement` says so.
/// Throws std::runtime_error if the server does not start or this process cannot be moved back.
inline PinnedServer startPinnedServer(std::vector<std::string> extraArgs, int serverCpu, int clientCpu) {
  PinnedServer out;
  if (!canPinTwoCpus()) {
    out.server = std::make_unique<BenchServer>(std::move(extraArgs));
    out.placement = fmt::format(
        "NOT pinned: {} CPU(s) online, {} allowed to this process (pinning needs CPUs {} and {}); server and client "
        "share them",
        ::sysconf(_SC_NPROCESSORS_ONLN), allowedCpus(), serverCpu, clientCpu);
    return out;
  }
  if (!pinThread(0, serverCpu)) {
    out.server = std::make_unique<BenchServer>(std::move(extraArgs));
    out.placement = fmt::format("NOT pinned: sched_setaffinity refused ({}); server and client share the CPUs",
                                std::strerror(errno));
    return out;
  }
  out.server = std::make_unique<BenchServer>(std::move(extraArgs));
  const int serverThreads = pinProcess(out.server->pid(), serverCpu);
  const std::string failed = serverThreads < 0 ? std::strerror(errno) : "";
  if (!pinThread(0, clientCpu))
    throw std::runtime_error(fmt::format("bench: cannot move this process to CPU {}", clientCpu));
  if (serverThreads < 0) {
    out.placement = fmt::format(
        "NOT fully pinned: redis-server started on CPU {} but not all its threads could be pinned ({}); this process "
        "pinned to CPU {}",
        serverCpu, failed, clientCpu);
    return out;
  }
  out.pinned = true;
  out.placement = fmt::format(
      "pinned: redis-server to CPU {} ({} threads), this process (load generator, callers, "
      "I/O threads) to CPU {}",
      serverCpu, serverThreads, clientCpu);
  return out;
}

}  // namespace redlimit::bench
