// The accuracy picture: grants over time against the configured rate, as a plain SVG file.
// One panel per series (RateLimiter today; SegmentedRateLimiter joins with one more
// GrantSeries). Header-only, no dependencies beyond the standard library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace redlimit::bench {

/// The grants of one limiter during one run.
struct GrantSeries {
  std::string title;                 // panel title, e.g. "RateLimiter, 8 threads"
  std::vector<std::int64_t> grantMs; // one entry per permit granted: its time (server clock, epoch ms)
};

/// What the limiters were configured with, and how to draw it.
struct AccuracyChart {
  std::int64_t rate = 0;          // permits per interval
  std::int64_t intervalMs = 0;    // the limiter's window, ms
  std::int64_t bucketMs = 50;     // width of one bar, ms
  std::int64_t durationMs = 0;    // length of the run, ms (x axis)
  std::vector<GrantSeries> series;
};

/// Numbers read off one series: what the picture shows, for the summary.
struct SeriesStats {
  std::int64_t grants = 0;             // permits granted in total
  std::int64_t maxPerBucket = 0;       // most grants in one bucket
  std::int64_t maxPerWindow = 0;       // most grants in any interval-long window (the limit's bound)
  std::vector<std::int64_t> perBucket; // grants per bucket, from the first grant on
  std::vector<std::int64_t> windowMax; // per bucket: most grants in a trailing window ending in it
};

/// Counts grants per bucket and the most grants in any trailing window (t - interval, t].
inline SeriesStats analyseSeries(const AccuracyChart& chart, std::vector<std::int64_t> grants) {
  SeriesStats s;
  std::sort(grants.begin(), grants.end());
  s.grants = static_cast<std::int64_t>(grants.size());
  const std::int64_t bucket = std::max<std::int64_t>(1, chart.bucketMs);
  const auto buckets = static_cast<std::size_t>((chart.durationMs + bucket - 1) / bucket);
  s.perBucket.assign(buckets, 0);
  s.windowMax.assign(buckets, 0);
  if (grants.empty()) return s;
  const std::int64_t t0 = grants.front();
  std::size_t lo = 0;
  for (std::size_t i = 0; i < grants.size(); ++i) {
    // grants[lo..i] are the ones in (grants[i] - interval, grants[i]]
    while (grants[lo] <= grants[i] - chart.intervalMs) ++lo;
    const auto inWindow = static_cast<std::int64_t>(i - lo + 1);
    s.maxPerWindow = std::max(s.maxPerWindow, inWindow);
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
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace detail

/// The SVG document: per series a panel with bars (grants per bucket), a step line (most grants
/// in a trailing window ending in that bucket: the quantity the limit bounds), the limit (rate
/// per interval) as a red line and the rate scaled to one bucket as a dashed line.
inline std::string renderAccuracySvg(const AccuracyChart& chart) {
  using detail::num;
  const double width = 960, panelHeight = 270, top = 72, left = 64, right = 40, plotHeight = 200;
  const double plotWidth = width - left - right;
  const double height = top + panelHeight * static_cast<double>(chart.series.size()) + 10;
  const double bucketRate = static_cast<double>(chart.rate * chart.bucketMs) / static_cast<double>(chart.intervalMs);

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\"" << num(height)
      << "\" viewBox=\"0 0 " << num(width) << ' ' << num(height) << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << num(left) << "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">redlimit accuracy: "
      << chart.rate << " permits per " << chart.intervalMs << " ms</text>\n"
      << "<text x=\"" << num(left) << "\" y=\"40\" fill=\"#444\"><tspan fill=\"#4a7fc1\">bars</tspan>: grants per "
      << chart.bucketMs << " ms (server clock).  <tspan fill=\"#e08a00\">line</tspan>: most grants in any "
      << chart.intervalMs << " ms window ending in that bar (what the limit bounds).</text>\n"
      << "<text x=\"" << num(left) << "\" y=\"56\" fill=\"#444\"><tspan fill=\"#d62728\">red</tspan>: the limit, "
      << chart.rate << " per " << chart.intervalMs << " ms.  dashed: the same rate spread evenly, per " << chart.bucketMs
      << " ms (" << num(bucketRate) << ").</text>\n";

  for (std::size_t p = 0; p < chart.series.size(); ++p) {
    const GrantSeries& series = chart.series[p];
    const SeriesStats stats = analyseSeries(chart, series.grantMs);
    const double y0 = top + panelHeight * static_cast<double>(p) + 24;  // top of the plot area
    const double yMax = static_cast<double>(std::max<std::int64_t>(chart.rate, stats.maxPerWindow)) * 1.15;
    auto yOf = [&](double v) { return y0 + plotHeight - v / yMax * plotHeight; };
    const double bucketWidth = plotWidth / static_cast<double>(std::max<std::size_t>(1, stats.perBucket.size()));

    svg << "<text x=\"" << num(left) << "\" y=\"" << num(y0 - 8) << "\" font-weight=\"bold\">"
        << detail::escapeXml(series.title) << "</text>\n"
        << "<text x=\"" << num(width - right) << "\" y=\"" << num(y0 - 8) << "\" text-anchor=\"end\" fill=\"#444\">"
        << stats.grants << " grants; most in one " << chart.intervalMs << " ms window: " << stats.maxPerWindow
        << " (limit " << chart.rate << ")</text>\n";
    // axes and grid
    svg << "<g stroke=\"#ccc\">\n";
    const std::int64_t yStep = std::max<std::int64_t>(1, chart.rate / 4);
    for (std::int64_t v = 0; static_cast<double>(v) <= yMax; v += yStep) {
      svg << "<line x1=\"" << num(left) << "\" x2=\"" << num(left + plotWidth) << "\" y1=\"" << num(yOf(static_cast<double>(v)))
          << "\" y2=\"" << num(yOf(static_cast<double>(v))) << "\"/>\n";
    }
    svg << "</g>\n<g fill=\"#444\" text-anchor=\"end\">\n";
    for (std::int64_t v = 0; static_cast<double>(v) <= yMax; v += yStep) {
      svg << "<text x=\"" << num(left - 6) << "\" y=\"" << num(yOf(static_cast<double>(v)) + 4) << "\">" << v << "</text>\n";
    }
    svg << "</g>\n<g fill=\"#444\" text-anchor=\"middle\">\n";
    const std::int64_t xStep = 500;
    for (std::int64_t t = 0; t <= chart.durationMs; t += xStep) {
      const double x = left + plotWidth * static_cast<double>(t) / static_cast<double>(chart.durationMs);
      svg << "<text x=\"" << num(x) << "\" y=\"" << num(y0 + plotHeight + 16) << "\">" << t << " ms</text>\n";
    }
    svg << "</g>\n<text x=\"16\" y=\"" << num(y0 + plotHeight / 2) << "\" fill=\"#444\" transform=\"rotate(-90 16 "
        << num(y0 + plotHeight / 2) << ")\" text-anchor=\"middle\">grants</text>\n";
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
    // the limit and the rate per bucket
    svg << "<line x1=\"" << num(left) << "\" x2=\"" << num(left + plotWidth) << "\" y1=\""
        << num(yOf(static_cast<double>(chart.rate))) << "\" y2=\"" << num(yOf(static_cast<double>(chart.rate)))
        << "\" stroke=\"#d62728\" stroke-width=\"4\"/>\n"
        << "<line x1=\"" << num(left) << "\" x2=\"" << num(left + plotWidth) << "\" y1=\"" << num(yOf(bucketRate))
        << "\" y2=\"" << num(yOf(bucketRate)) << "\" stroke=\"#555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
    // trailing-window maximum as a step line
    svg << "<polyline fill=\"none\" stroke=\"#e08a00\" stroke-width=\"2\" points=\"";
    for (std::size_t b = 0; b < stats.windowMax.size(); ++b) {
      const double y = yOf(static_cast<double>(stats.windowMax[b]));
      svg << num(left + bucketWidth * static_cast<double>(b)) << ',' << num(y) << ' '
          << num(left + bucketWidth * static_cast<double>(b + 1)) << ',' << num(y) << ' ';
    }
    svg << "\"/>\n";
    svg << "<rect x=\"" << num(left) << "\" y=\"" << num(y0) << "\" width=\"" << num(plotWidth) << "\" height=\""
        << num(plotHeight) << "\" fill=\"none\" stroke=\"#888\"/>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace redlimit::bench
