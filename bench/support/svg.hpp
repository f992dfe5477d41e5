// The accuracy picture: grants over time against the configured rate, as a plain SVG file.
// One panel per series (RateLimiter; SegmentedRateLimiter, whose panel also carries the view
// Redis has of its segment grants). Header-only, no dependencies beyond the standard library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace redlimit::bench {

/// The grants of one limiter during one run.
struct GrantSeries {
  std::string title;                  // panel title, e.g. "RateLimiter, 8 threads"
  std::vector<std::int64_t> grantMs;  // one entry per permit granted: its time (server clock, epoch ms)
  std::string note;                   // optional lines under the title ('\n' between): what the times mean
  // Optional second view of the same permits, drawn as a green step line: one entry per permit
  // at the time Redis counts it (a segment's grant time, server clock, epoch ms).
  std::vector<std::int64_t> redisGrantMs;
  std::int64_t useTimeBound = 0;  // optional dotted line: the most a window may hold by use time
};

/// What the limiters were configured with, and how to draw it.
struct AccuracyChart {
  std::int64_t rate = 0;        // permits per interval
  std::int64_t intervalMs = 0;  // the limiter's window, ms
  std::int64_t bucketMs = 50;   // width of one bar, ms
  std::int64_t durationMs = 0;  // length of the run, ms (x axis)
  std::vector<GrantSeries> series;
};

/// Numbers read off one series: what the picture shows, for the summary.
struct SeriesStats {
  std::int64_t grants = 0;              // permits granted in total
  std::int64_t maxPerBucket = 0;        // most grants in one bucket
  std::int64_t maxPerWindow = 0;        // most grants in any interval-long window (the limit's bound)
  std::vector<std::int64_t> perBucket;  // grants per bucket, from the first grant on
  std::vector<std::int64_t> windowMax;  // per bucket: most grants in a trailing window ending in it
};

/// Marks "buckets start at the first grant" for analyseSeries.
inline constexpr std::int64_t kFromFirstGrant = std::numeric_limits<std::int64_t>::min();

/// Counts grants per bucket and the most grants in any trailing window (t - interval, t].
/// Buckets start at `origin` (epoch ms), or at the first grant.
inline SeriesStats analyseSeries(const AccuracyChart& chart, std::vector<std::int64_t> grants,
                                 std::int64_t origin = kFromFirstGrant) {
  SeriesStats s;
  std::sort(grants.begin(), grants.end());
  s.grants = static_cast<std::int64_t>(grants.size());
  const std::int64_t bucket = std::max<std::int64_t>(1, chart.bucketMs);
  const auto buckets = static_cast<std::size_t>((chart.durationMs + bucket - 1) / bucket);
  s.perBucket.assign(buckets, 0);
  s.windowMax.assign(buckets, 0);
  if (grants.empty()) return s;
  const std::int64_t t0 = origin == kFromFirstGrant ? grants.front() : origin;
  std::size_t lo = 0;
  for (std::size_t i = 0; i < grants.size(); ++i) {
    // grants[lo..i] are the ones in (grants[i] - interval, grants[i]]
    while (grants[lo] <= grants[i] - chart.intervalMs) ++lo;
    const auto inWindow = static_cast<std::int64_t>(i - lo + 1);
    s.maxPerWindow = std::max(s.maxPerWindow, inWindow);
    if (grants[i] < t0) continue;
    const auto b = static_cast<std::size_t>((grants[i] - t0) / bucket);
    if (b >= buckets) continue;
    ++s.perBucket[b];
    s.windowMax[b] = std::max(s.windowMax[b], inWindow);
  }
  // The trailing window's count changes only at grants and expiries, so its maximum within a
  // bucket is reached at a grant (above) or at the bucket's start.
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::int64_t t = t0 + static_cast<std::int64_t>(b) * bucket;
    const auto upTo = [&](std::int64_t x) { return std::upper_bound(grants.begin(), grants.end(), x); };
    s.windowMax[b] = std::max(s.windowMax[b], static_cast<std::int64_t>(upTo(t) - upTo(t - chart.intervalMs)));
  }
  for (std::int64_t n : s.perBucket) s.maxPerBucket = std::max(s.maxPerBucket, n);
  return s;
}

namespace detail {

inline std::string escapeXml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

inline std::string num(double v) { return fmt::format("{:.1f}", v); }

}  // namespace detail

/// The SVG document: per series a panel with bars (permits per bucket), a step line (most permits
/// in a trailing window ending in that bucket: the quantity the limit bounds), the limit (rate
/// per interval) as a red line and the rate scaled to one bucket as a dashed line. A series with
/// a Redis view gets a second step line (green) for it, and its use-time bound as a dotted line.
inline std::string renderAccuracySvg(const AccuracyChart& chart) {
  using detail::num;
  const double width = 960, top = 72, left = 64, right = 40, plotHeight = 200, lineHeight = 16;
  const double plotWidth = width - left - right;
  auto noteLines = [](const std::string& note) {
    std::vector<std::string> lines;
    std::istringstream in(note);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  // A panel: its header (title, then the note's lines), the plot, the x labels and a gap.
  auto headerHeight = [&](const GrantSeries& series) {
    return lineHeight * static_cast<double>(1 + noteLines(series.note).size()) + 10;
  };
  double height = top + 10;
  for (const GrantSeries& series : chart.series) height += headerHeight(series) + plotHeight + 50;
  const double bucketRate = static_cast<double>(chart.rate * chart.bucketMs) / static_cast<double>(chart.intervalMs);

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\"" << num(height)
      << "\" viewBox=\"0 0 " << num(width) << ' ' << num(height) << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << num(left)
      << "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">redlimit accuracy: " << chart.rate << " permits per "
      << chart.intervalMs << " ms</text>\n"
      << "<text x=\"" << num(left) << "\" y=\"40\" fill=\"#444\"><tspan fill=\"#4a7fc1\">bars</tspan>: permits per "
      << chart.bucketMs << " ms (server clock).  <tspan fill=\"#e08a00\">orange</tspan>: most permits in any "
      << chart.intervalMs << " ms window ending in that bar (what the limit bounds).</text>\n"
      << "<text x=\"" << num(left) << "\" y=\"56\" fill=\"#444\"><tspan fill=\"#d62728\">red</tspan>: the limit, "
      << chart.rate << " per " << chart.intervalMs << " ms.  dashed: the same rate spread evenly, per "
      << chart.bucketMs << " ms (" << num(bucketRate) << ").</text>\n";

  double panelTop = top;
  for (const GrantSeries& series : chart.series) {
    const bool redisView = !series.redisGrantMs.empty();
    // Both views of a series share the x axis: it starts at the earliest time of either.
    std::int64_t origin = kFromFirstGrant;
    for (const auto* v : {&series.grantMs, &series.redisGrantMs}) {
      if (v->empty()) continue;
      const std::int64_t first = *std::min_element(v->begin(), v->end());
      origin = origin == kFromFirstGrant ? first : std::min(origin, first);
    }
    const SeriesStats stats = analyseSeries(chart, series.grantMs, origin);
    const SeriesStats redis = redisView ? analyseSeries(chart, series.redisGrantMs, origin) : SeriesStats{};
    const std::vector<std::string> note = noteLines(series.note);
    const double y0 = panelTop + headerHeight(series);  // top of the plot area
    panelTop = y0 + plotHeight + 50;
    const std::int64_t peak = std::max({chart.rate, stats.maxPerWindow, redis.maxPerWindow, series.useTimeBound});
    const double yMax = static_cast<double>(peak) * 1.15;
    auto yOf = [&](double v) { return y0 + plotHeight - v / yMax * plotHeight; };
    const double bucketWidth = plotWidth / static_cast<double>(std::max<std::size_t>(1, stats.perBucket.size()));

    const double titleY = y0 - 10 - lineHeight * static_cast<double>(note.size());
    svg << "<text x=\"" << num(left) << "\" y=\"" << num(titleY) << "\" font-weight=\"bold\">"
        << detail::escapeXml(series.title) << "</text>\n"
        << "<text x=\"" << num(width - right) << "\" y=\"" << num(titleY) << "\" text-anchor=\"end\" fill=\"#444\">"
        << stats.grants << " permits; most per " << chart.intervalMs << " ms window: " << stats.maxPerWindow;
    if (redisView) svg << " by use time, " << redis.maxPerWindow << " in Redis";
    svg << "</text>\n";
    for (std::size_t i = 0; i < note.size(); ++i) {
      svg << "<text x=\"" << num(left) << "\" y=\"" << num(titleY + lineHeight * static_cast<double>(i + 1))
          << "\" fill=\"#444\">" << detail::escapeXml(note[i]) << "</text>\n";
    }
    // axes and grid
    svg << "<g stroke=\"#ccc\">\n";
    const std::int64_t yStep = std::max<std::int64_t>(1, chart.rate / 4);
    for (std::int64_t v = 0; static_cast<double>(v) <= yMax; v += yStep) {
      svg << "<line x1=\"" << num(left) << "\" x2=\"" << num(left + plotWidth) << "\" y1=\""
          << num(yOf(static_cast<double>(v))) << "\" y2=\"" << num(yOf(static_cast<double>(v))) << "\"/>\n";
    }
    svg << "</g>\n<g fill=\"#444\" text-anchor=\"end\">\n";
    for (std::int64_t v = 0; static_cast<double>(v) <= yMax; v += yStep) {
      svg << "<text x=\"" << num(left - 6) << "\" y=\"" << num(yOf(static_cast<double>(v)) + 4) << "\">" << v
          << "</text>\n";
    }
    svg << "</g>\n<g fill=\"#444\" text-anchor=\"middle\">\n";
    const std::int64_t xStep = 500;
    for (std::int64_t t = 0; t <= chart.durationMs; t += xStep) {
      const double x = left + plotWidth * static_cast<double>(t) / static_cast<double>(chart.durationMs);
      svg << "<text x=\"" << num(x) << "\" y=\"" << num(y0 + plotHeight + 16) << "\">" << t << " ms</text>\n";
    }
    svg << "</g>\n<text x=\"16\" y=\"" << num(y0 + plotHeight / 2) << "\" fill=\"#444\" transform=\"rotate(-90 16 "
        << num(y0 + plotHeight / 2) << ")\" text-anchor=\"middle\">permits</text>\n";
    // bars
    svg << "<g fill=\"#4a7fc1\">\n";
    for (std::size_t b = 0; b < stats.perBucket.size(); ++b) {
      if (stats.perBucket[b] == 0) continue;
      const double v = static_cast<double>(stats.perBucket[b]);
      svg << "<rect x=\"" << num(left + bucketWidth * static_cast<double>(b) + 1) << "\" y=\"" << num(yOf(v))
          << "\" width=\"" << num(std::max(1.0, bucketWidth - 2)) << "\" height=\"" << num(y0 + plotHeight - yOf(v))
          << "\"/>\n";
    }
    svg << "</g>\n";
    // the limit, the rate per bucket, and the use-time bound
    auto hline = [&](double v, const char* style) {
      svg << "<line x1=\"" << num(left) << "\" x2=\"" << num(left + plotWidth) << "\" y1=\"" << num(yOf(v))
          << "\" y2=\"" << num(yOf(v)) << "\" " << style << "/>\n";
    };
    hline(static_cast<double>(chart.rate), "stroke=\"#d62728\" stroke-width=\"4\"");
    hline(bucketRate, "stroke=\"#555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"");
    if (series.useTimeBound > 0) {
      hline(static_cast<double>(series.useTimeBound), "stroke=\"#9467bd\" stroke-width=\"2\" stroke-dasharray=\"2 3\"");
    }
    // trailing-window maxima as step lines
    auto steps = [&](const std::vector<std::int64_t>& windowMax, const char* style) {
      svg << "<polyline fill=\"none\" " << style << " points=\"";
      for (std::size_t b = 0; b < windowMax.size(); ++b) {
        const double y = yOf(static_cast<double>(windowMax[b]));
        svg << num(left + bucketWidth * static_cast<double>(b)) << ',' << num(y) << ' '
            << num(left + bucketWidth * static_cast<double>(b + 1)) << ',' << num(y) << ' ';
      }
      svg << "\"/>\n";
    };
    steps(stats.windowMax, "stroke=\"#e08a00\" stroke-width=\"2\"");
    if (redisView) steps(redis.windowMax, "stroke=\"#2ca02c\" stroke-width=\"2\" stroke-dasharray=\"8 5\"");
    svg << "<rect x=\"" << num(left) << "\" y=\"" << num(y0) << "\" width=\"" << num(plotWidth) << "\" height=\""
        << num(plotHeight) << "\" fill=\"none\" stroke=\"#888\"/>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace redlimit::bench
