// A Google Benchmark console reporter that also keeps each run's real time per iteration, so a
// program can print a summary of the figures it just measured. Header-only.
#pragma once

#include <benchmark/benchmark.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace redlimit::bench {

/// Prints the usual console table and remembers, per benchmark name, the real time per
/// iteration in nanoseconds (for N threads with UseRealTime: wall time divided by the iterations
/// of all threads, i.e. the inverse of the total throughput). Not thread-safe (the library calls
/// it from one thread).
class CollectReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      ns_[r.benchmark_name()] = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit) * 1e9;
    }
    ConsoleReporter::ReportRuns(runs);
  }

  /// Real ns per iteration of `name` (the median if the run had repetitions); NaN if missing.
  [[nodiscard]] double ns(const std::string& name) const {
    auto it = ns_.find(name + "_median");
    if (it == ns_.end()) it = ns_.find(name);
    return it == ns_.end() ? std::nan("") : it->second;
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace redlimit::bench
