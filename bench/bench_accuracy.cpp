// bench_accuracy: the accuracy picture. 8 threads hammer one limiter of 100 permits per 200 ms
// for 3 s, once through RateLimiter and once through SegmentedRateLimiter (segment 10, one node);
// <results>/accuracy.svg plots permits per 50 ms bucket against the configured rate, one panel
// per limiter type. A summary goes to stdout and <results>/bench_accuracy.summary.txt.
//
// Times, all on the server's clock (epoch ms):
//  - RateLimiter: each grant's detail::AcquireResult::grantTime, the stamp Redis counts it by.
//  - SegmentedRateLimiter, use time: each permit when its tryAcquire() call returned (it was
//    handed out during the call; the summary also counts only calls that began and returned
//    within a window), read from this host's steady clock and moved to the server's clock by an
//    offset measured with TIME before the run (the best of several, ± half its round trip;
//    checked against the refill replies, whose grantTime must fall between sending and receiving).
//  - SegmentedRateLimiter, as Redis counts: each segment grant's grantTime, weighted by its
//    permits (recorded by a source that wraps RateLimiter). The limit bounds this view; by use
//    time a window may also hold permits from earlier grants (held in the segment when it began,
//    or a refill in flight then), so the use-time view may exceed the rate by nodes x segment.
// Both views count in whole server ms, as Redis does (it compares floored ms stamps).
//
// To add a limiter type: write a benchmark like BM_Accuracy_RateLimiter whose attempt returns
// the permit's time, and push its GrantSeries onto gChart.series; the SVG gets one more panel.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redlimit/redlimit.hpp"
#include "support/bench_support.hpp"
#include "support/svg.hpp"

namespace {

namespace rb = redlimit::bench;
using std::chrono::milliseconds;

constexpr int kThreads = 8;
constexpr std::int64_t kRate = 100;
constexpr milliseconds kInterval{200};
constexpr milliseconds kDuration{3000};
constexpr milliseconds kBucket{50};
constexpr std::int64_t kSegment = 10;
constexpr std::int64_t kNodes = 1;  // SegmentedRateLimiter instances sharing the limiter
constexpr int kOffsetSamples = 25;  // TIME round trips; the shortest gives the offset

rb::BenchServer* gServer = nullptr;
rb::AccuracyChart gChart{kRate, kInterval.count(), kBucket.count(), kDuration.count(), {}};

struct Row {
  std::string title;
  std::string clock;  // what the times are
  rb::SeriesStats stats;
  std::int64_t attempts = 0;
  std::int64_t errors = 0;
  std::int64_t bound = 0;        // the most the limit allows over the span of the grants
  std::int64_t limit = kRate;    // the most this view may hold in one window
  std::int64_t certainMax = -1;  // use-time view: the most counting only calls inside one window
};
std::vector<Row> gRows;
std::vector<std::string> gNotes;  // lines for the summary after the table

std::int64_t localMicros(rb::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::int64_t floorDiv(std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

/// Server clock (epoch µs) minus this host's steady clock (µs), from the TIME round trip with the
/// shortest duration; the server read its clock somewhere within that round trip.
struct ClockOffset {
  std::int64_t offsetUs = 0;
  std::int64_t uncertaintyUs = 0;  // half the round trip
};

ClockOffset measureOffset(rb::RawRedis& admin) {
  ClockOffset best;
  std::int64_t bestRtt = std::numeric_limits<std::int64_t>::max();
  for (int i = 0; i < kOffsetSamples; ++i) {
    const std::int64_t sent = localMicros(rb::Clock::now());
    const auto r = admin.command({"TIME"});
    const std::int64_t received = localMicros(rb::Clock::now());
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) throw std::runtime_error("bench: unexpected TIME reply");
    const std::int64_t server =
        std::strtoll(r->element[0]->str, nullptr, 10) * 1000000 + std::strtoll(r->element[1]->str, nullptr, 10);
    if (received - sent < bestRtt) {
      bestRtt = received - sent;
      best.offsetUs = server - (sent + received) / 2;
      best.uncertaintyUs = (bestRtt + 1) / 2;
    }
  }
  return best;
}

/// A grant time (epoch µs) as whole epoch ms, floored. Safe for counting per window: two stamps at
/// least one interval apart stay at least one interval apart when floored.
std::int64_t floorMs(std::chrono::microseconds us) { return std::chrono::floor<milliseconds>(us).count(); }

/// A permit source for SegmentedRateLimiter: RateLimiter, recording every grant (its grantTime,
/// permits, and when the request was sent and answered, local µs) and every give-back.
/// Thread-safe.
class RecordingSource {
 public:
  struct Grant {
    std::int64_t grantMs = 0;
    std::int64_t permits = 0;
    std::int64_t sentUs = 0;
    std::int64_t receivedUs = 0;
  };
  struct GiveBack {
    std::int64_t atUs = 0;
    std::int64_t permits = 0;
  };

  RecordingSource(std::shared_ptr<redlimit::Client> client, std::string name)
      : limiter_(std::move(client), std::move(name)) {}

  redlimit::RateLimiter& limiter() { return limiter_; }

  redlimit::detail::AcquireResult tryAcquireUpTo(std::int64_t atLeast, std::int64_t atMost) {
    const std::int64_t sent = localMicros(rb::Clock::now());
    redlimit::detail::AcquireResult r =
        redlimit::detail::SegmentAccess<redlimit::RateLimiter>::tryAcquireUpTo(limiter_, {}, atLeast, atMost);
    const std::int64_t received = localMicros(rb::Clock::now());
    if (r.granted > 0) {
      std::lock_guard<std::mutex> lk(mutex_);
      grants_.push_back(Grant{floorMs(r.grantTime), r.granted, sent, received});
    }
    return r;
  }

  std::int64_t releaseGrant(const std::string& member, std::int64_t permits) {
    const std::int64_t n =
        redlimit::detail::SegmentAccess<redlimit::RateLimiter>::releaseGrant(limiter_, member, permits);
    std::lock_guard<std::mutex> lk(mutex_);
    giveBacks_.push_back(GiveBack{localMicros(rb::Clock::now()), n});
    return n;
  }

  std::vector<Grant> grants() const {
    std::lock_guard<std::mutex> lk(mutex_);
    return grants_;
  }
  std::vector<GiveBack> giveBacks() const {
    std::lock_guard<std::mutex> lk(mutex_);
    return giveBacks_;
  }

 private:
  redlimit::RateLimiter limiter_;
  mutable std::mutex mutex_;
  std::vector<Grant> grants_;
  std::vector<GiveBack> giveBacks_;
};

/// Calls `attempt(out)` from kThreads threads until kDuration has passed; for a granted call,
/// `attempt` appends what it records (the permit's time) to `out`, its thread's vector. Returns
/// the records of all threads; counts attempts and failures.
template <class Record, class Attempt>
std::vector<Record> hammer(Attempt&& attempt, std::int64_t& attempts, std::int64_t& errors) {
  std::vector<std::vector<Record>> perThread(kThreads);
  std::atomic<std::int64_t> calls{0}, failed{0};
  const auto deadline = rb::Clock::now() + kDuration;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto& mine = perThread[static_cast<std::size_t>(t)];
      std::int64_t n = 0;
      while (rb::Clock::now() < deadline) {
        ++n;
        try {
          attempt(mine);
        } catch (const std::exception&) {
          failed.fetch_add(1, std::memory_order_relaxed);
        }
      }
      calls.fetch_add(n, std::memory_order_relaxed);
    });
  }
  for (auto& th : threads) th.join();
  attempts = calls.load();
  errors = failed.load();
  std::vector<Record> all;
  for (auto& v : perThread) all.insert(all.end(), v.begin(), v.end());
  return all;
}

/// One permit handed out by SegmentedRateLimiter: when the call began and when it returned
/// (server clock, epoch ms). The permit was handed out at some moment between the two.
struct Use {
  std::int64_t calledMs = 0;
  std::int64_t returnedMs = 0;
};

/// The most permits in one window (t - interval, t] counting only the calls that both began and
/// returned inside it: that many were certainly handed out within one window.
std::int64_t certainMaxPerWindow(std::vector<Use> uses) {
  std::sort(uses.begin(), uses.end(), [](const Use& a, const Use& b) { return a.returnedMs < b.returnedMs; });
  std::int64_t best = 0;
  std::size_t lo = 0;
  for (std::size_t i = 0; i < uses.size(); ++i) {
    const std::int64_t start = uses[i].returnedMs - kInterval.count();
    while (uses[lo].returnedMs <= start) ++lo;
    std::int64_t n = 0;
    for (std::size_t j = lo; j <= i; ++j) n += uses[j].calledMs > start ? 1 : 0;
    best = std::max(best, n);
  }
  return best;
}

/// The window (t - interval, t] holding the most permits by use time, split by where its permits
/// came from: grants Redis counted within it, and earlier grants (held in the segment when the
/// window began, or granted by a refill still in flight then, whose permits all came later).
struct WindowSplit {
  std::int64_t endMs = 0;
  std::int64_t total = 0;
  std::int64_t grantedWithin = 0;  // Redis's count for the same window
  // The last refill Redis stamped before the window: when its reply came, relative to the window's
  // first ms (µs; > 0: it was in flight when the window opened, and all its permits fall in it).
  std::int64_t lastRefillReplyUs = 0;
  bool hasLastRefill = false;
};

WindowSplit busiestWindow(std::vector<std::int64_t> used, std::vector<std::int64_t> redisView,
                          const std::vector<RecordingSource::Grant>& grants, std::int64_t offsetUs) {
  WindowSplit w;
  std::sort(used.begin(), used.end());
  std::sort(redisView.begin(), redisView.end());
  std::size_t lo = 0;
  for (std::size_t i = 0; i < used.size(); ++i) {
    while (used[lo] <= used[i] - kInterval.count()) ++lo;
    if (static_cast<std::int64_t>(i - lo + 1) > w.total) {
      w.total = static_cast<std::int64_t>(i - lo + 1);
      w.endMs = used[i];
    }
  }
  const std::int64_t start = w.endMs - kInterval.count();  // the window is (start, endMs]
  w.grantedWithin = std::upper_bound(redisView.begin(), redisView.end(), w.endMs) -
                    std::upper_bound(redisView.begin(), redisView.end(), start);
  const RecordingSource::Grant* last = nullptr;
  for (const RecordingSource::Grant& g : grants) {
    if (g.grantMs <= start && (last == nullptr || g.sentUs > last->sentUs)) last = &g;
  }
  if (last != nullptr) {
    w.hasLastRefill = true;
    w.lastRefillReplyUs = last->receivedUs + offsetUs - (start + 1) * 1000;
  }
  return w;
}

Row makeRow(const std::string& title, const std::string& clock, const std::vector<std::int64_t>& grants,
            std::int64_t attempts, std::int64_t errors, std::int64_t limit) {
  Row row{title, clock, rb::analyseSeries(gChart, grants), attempts, errors, 0, limit};
  if (!grants.empty()) {
    const auto [lo, hi] = std::minmax_element(grants.begin(), grants.end());
    const std::int64_t span = *hi - *lo + 1;
    row.bound = kRate * ((span + kInterval.count() - 1) / kInterval.count());
  }
  return row;
}

void countersFor(benchmark::State& state, const Row& row, const std::string& prefix) {
  state.counters[prefix + "grants"] = static_cast<double>(row.stats.grants);
  state.counters[prefix + "max_in_any_window"] = static_cast<double>(row.stats.maxPerWindow);
  state.counters[prefix + "max_per_bucket"] = static_cast<double>(row.stats.maxPerBucket);
}

void record(benchmark::State& state, const std::string& title, std::vector<std::int64_t> grants, std::int64_t attempts,
            std::int64_t errors) {
  Row row = makeRow(title, "server grant time", grants, attempts, errors, kRate);
  state.counters["attempts"] = static_cast<double>(attempts);
  state.counters["errors"] = static_cast<double>(errors);
  state.counters["limit_per_window"] = static_cast<double>(kRate);
  countersFor(state, row, "");
  rb::GrantSeries series;
  series.title = title;
  series.grantMs = std::move(grants);
  series.note =
      "bars, orange: each permit at its grant time (detail::AcquireResult::grantTime, the server's clock), as Redis "
      "counts it.";
  gChart.series.push_back(std::move(series));
  gRows.push_back(std::move(row));
}

// A client for kThreads hammering threads: one connection each, generous timeouts (the run
// measures accuracy, not latency).
std::shared_ptr<redlimit::Client> hammerClient() {
  redlimit::ClientOptions options;
  options.connection.host = gServer->host();
  options.connection.port = gServer->port();
  options.connection.commandTimeout = std::chrono::seconds(10);
  options.pool.size = kThreads;
  return redlimit::Client::create(options);
}

void BM_Accuracy_RateLimiter(benchmark::State& state) {
  try {
    auto client = hammerClient();
    redlimit::RateLimiter limiter(client, "bench:accuracy:rate_limiter");
    limiter.setRate(redlimit::RateType::Overall, kRate, kInterval);
    std::vector<std::int64_t> grants;
    std::int64_t attempts = 0, errors = 0;
    for (auto _ : state) {
      grants = hammer<std::int64_t>(
          [&](std::vector<std::int64_t>& out) {
            const redlimit::detail::AcquireResult r =
                redlimit::detail::SegmentAccess<redlimit::RateLimiter>::tryAcquireUpTo(limiter, {}, 1, 1);
            if (r.granted > 0) out.push_back(floorMs(r.grantTime));
          },
          attempts, errors);
      state.SetIterationTime(std::chrono::duration<double>(kDuration).count());
    }
    record(state, "RateLimiter::tryAcquire, 8 threads", std::move(grants), attempts, errors);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// SegmentedRateLimiter over the same kind of limiter: 8 threads on one instance (one node).
void BM_Accuracy_Segmented(benchmark::State& state) {
  try {
    auto client = hammerClient();
    auto source = std::make_shared<RecordingSource>(client, "bench:accuracy:segmented");
    source->limiter().setRate(redlimit::RateType::Overall, kRate, kInterval);

    rb::RawRedis admin(gServer->host(), gServer->port());
    const ClockOffset before = measureOffset(admin);
    const std::int64_t offset = before.offsetUs;
    auto toServerMs = [offset](std::int64_t localUs) { return floorDiv(localUs + offset, 1000); };

    std::vector<Use> uses;
    std::int64_t attempts = 0, errors = 0, runEndUs = 0;
    redlimit::SegmentStats stats;
    {
      redlimit::SegmentOptions segmentOptions;
      segmentOptions.segmentSize = kSegment;
      redlimit::SegmentedRateLimiter<RecordingSource> limiter(source, segmentOptions);
      for (auto _ : state) {
        uses = hammer<Use>(
            [&](std::vector<Use>& out) {
              const std::int64_t called = localMicros(rb::Clock::now());
              if (limiter.tryAcquire())
                out.push_back(Use{toServerMs(called), toServerMs(localMicros(rb::Clock::now()))});
            },
            attempts, errors);
        state.SetIterationTime(std::chrono::duration<double>(kDuration).count());
      }
      runEndUs = localMicros(rb::Clock::now());
      stats = limiter.stats();
    }  // close(): the unspent segment goes back
    const ClockOffset after = measureOffset(admin);

    // By use time: each permit when its call returned.
    std::vector<std::int64_t> used;
    for (const Use& u : uses) used.push_back(u.returnedMs);
    // As Redis counts: every segment grant at its grantTime, one entry per permit.
    std::vector<std::int64_t> redisView;
    std::int64_t fromRedis = 0;
    // The refill replies bound the offset: the server read grantTime (floored ms) between the
    // request's sending and its reply.
    std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
    for (const RecordingSource::Grant& g : source->grants()) {
      redisView.insert(redisView.end(), static_cast<std::size_t>(g.permits), g.grantMs);
      fromRedis += g.permits;
      lo = std::max(lo, g.grantMs * 1000 - g.receivedUs);
      hi = std::min(hi, g.grantMs * 1000 + 999 - g.sentUs);
    }
    std::int64_t returnedInRun = 0, returnedAfter = 0;
    for (const RecordingSource::GiveBack& b : source->giveBacks())
      (b.atUs <= runEndUs ? returnedInRun : returnedAfter) += b.permits;

    const std::string title = "SegmentedRateLimiter (segment " + std::to_string(kSegment) + ", " +
                              std::to_string(kNodes) + " node), " + std::to_string(kThreads) + " threads";
    const std::string rowName = "SegmentedRateLimiter, segment " + std::to_string(kSegment);
    const std::int64_t useBound = kRate + kNodes * kSegment;
    const WindowSplit busiest = busiestWindow(used, redisView, source->grants(), offset);
    Row useRow = makeRow(rowName + ", by use time", "when tryAcquire() returned it (local steady clock + TIME offset)",
                         used, attempts, errors, useBound);
    useRow.certainMax = certainMaxPerWindow(uses);
    Row redisRow = makeRow(rowName + ", as Redis counts", "segment grant time (server)", redisView, 0, 0, kRate);
    state.counters["attempts"] = static_cast<double>(attempts);
    state.counters["errors"] = static_cast<double>(errors);
    state.counters["limit_per_window"] = static_cast<double>(kRate);
    state.counters["use_time_bound_per_window"] = static_cast<double>(useBound);
    state.counters["remote_round_trips"] = static_cast<double>(stats.remoteRoundTrips);
    countersFor(state, useRow, "use_");
    state.counters["use_certain_max_in_any_window"] = static_cast<double>(useRow.certainMax);
    countersFor(state, redisRow, "redis_");

    gNotes.push_back(
        fmt::format("  segmented: {} permits from Redis in {} grants = {} handed out + {} given back during the run "
                    "+ {} at close + {} expired unused; {} round trips for {} calls",
                    fromRedis, source->grants().size(), useRow.stats.grants, returnedInRun, returnedAfter,
                    stats.permitsExpired, stats.remoteRoundTrips, attempts));
    const std::size_t refills = source->grants().size();
    std::string check = "no refill replies";
    if (refills > 0) {
      const bool consistent = offset >= lo - before.uncertaintyUs && offset <= hi + before.uncertaintyUs;
      check = fmt::format("the {} refill replies bound it to [{:+}, {:+}] us around it: {}", refills, lo - offset,
                          hi - offset, consistent ? "consistent" : "INCONSISTENT");
    }
    gNotes.push_back(fmt::format(
        "  clock offset (server epoch - local steady) from TIME, best of {}: +- {} us; after the run it differed by "
        "{:+} us (+- {}); {}",
        kOffsetSamples, before.uncertaintyUs, after.offsetUs - before.offsetUs, after.uncertaintyUs, check));
    const std::string lastRefill =
        busiest.hasLastRefill ? fmt::format("the last refill stamped before it was answered {:+} us from its start",
                                            busiest.lastRefillReplyUs)
                              : std::string("no refill was stamped before it");
    gNotes.push_back(
        fmt::format("  busiest window by use time: {} permits = {} granted within it (as Redis counts) + {} "
                    "granted before it; {}",
                    busiest.total, busiest.grantedWithin, busiest.total - busiest.grantedWithin, lastRefill));
    gNotes.push_back(
        "  by use time a window may exceed the limit by nodes x segment = " + std::to_string(kNodes * kSegment) +
        " (permits granted before it: held, or a refill in flight), as Redis counts not at all. Use times are"
        " read when\n  tryAcquire() returns, so a thread descheduled in between stamps its permit late (" +
        std::to_string(kThreads) + " threads on " + std::to_string(std::thread::hardware_concurrency()) +
        " cores); (n): counting only calls that began and returned inside the window, checked against the bound");

    rb::GrantSeries series;
    series.title = title;
    series.grantMs = std::move(used);
    series.redisGrantMs = std::move(redisView);
    series.useTimeBound = useBound;
    series.note =
        "bars, orange: each permit when its tryAcquire() call returned (this host's clock, moved to the server's by a "
        "TIME offset).\ngreen dashed: the segment grants as Redis counts them (grantTime).  purple dotted: " +
        std::to_string(useBound) + " = limit + nodes x segment, the bound by use time.";
    gChart.series.push_back(std::move(series));
    gRows.push_back(std::move(useRow));
    gRows.push_back(std::move(redisRow));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

std::string summary(const std::string& machine) {
  std::ostringstream out;
  out << "Machine: " << machine << "\n"
      << "Accuracy (bench_accuracy): " << kThreads << " threads for " << kDuration.count() << " ms on one limiter of "
      << kRate << " permits per " << kInterval.count() << " ms; all times on the server clock\n"
      << "  limiter, view                                      attempts  permits  most in any " << kInterval.count()
      << " ms window  bound  permits / most allowed\n";
  for (const Row& r : gRows) {
    const std::string attempts = r.attempts > 0 ? std::to_string(r.attempts) : std::string("");
    std::string most = std::to_string(r.stats.maxPerWindow);
    if (r.certainMax >= 0) most += " (" + std::to_string(r.certainMax) + ")";
    const std::int64_t checked = r.certainMax >= 0 ? r.certainMax : r.stats.maxPerWindow;
    out << fmt::format("  {:<50} {:>8} {:8} {:>25} {:6}   {:5.1f}%{}\n", r.title, attempts, r.stats.grants, most,
                       r.limit,
                       r.bound > 0 ? 100.0 * static_cast<double>(r.stats.grants) / static_cast<double>(r.bound) : 0.0,
                       checked > r.limit ? "   ABOVE THE BOUND" : "")
        << "      times: " << r.clock << "\n";
    if (r.errors > 0) out << fmt::format("    ({} calls failed)\n", r.errors);
  }
  for (const std::string& note : gNotes) out << note << "\n";
  out << "  picture: accuracy.svg\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) try {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    rb::BenchServer server;
    gServer = &server;
    benchmark::RegisterBenchmark("Accuracy/RateLimiter", BM_Accuracy_RateLimiter)->Iterations(1)->UseManualTime();
    benchmark::RegisterBenchmark("Accuracy/SegmentedRateLimiter", BM_Accuracy_Segmented)
        ->Iterations(1)
        ->UseManualTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    gServer = nullptr;
    const std::string machine = rb::machineDescription(server.version());

    const std::string dir = rb::resultsDir();
    if (!gChart.series.empty()) std::ofstream(dir + "/accuracy.svg") << rb::renderAccuracySvg(gChart);
    const std::string text = summary(machine);
    std::cout << '\n' << text << std::flush;
    std::ofstream(dir + "/bench_accuracy.summary.txt") << text;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_accuracy: {}\n", e.what());
    return 1;
  }
} catch (const std::exception& e) {  // what a limiter or the harness threw: said, not an abort
  std::fprintf(stderr, "%s: %s\n", "bench_accuracy", e.what());
  return 1;
}
