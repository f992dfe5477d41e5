// The accuracy picture of the O(1) limiters: grants against the bound the algorithm promises, as a
// plain SVG file, one panel per limiter. Each panel has two plots:
//   left:  grants since the first one, over time, against the most the limiter may grant in the
//          window from the first grant to t (burst + rate x t for the token bucket and GCRA; limit
//          x the aligned windows touched for the fixed window);
//   right: the most grants in ANY window of length T (found over all the grants), against the
//          most the algorithm allows in a window of that length.
// The first is what a reader expects to see (a burst, then the rate); the second is the quantity
// the limit bounds. Header-only; fmt and the standard library only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace redlimit::bench {

/// The grants of one limiter during one run, and its bound.
struct EnvelopeSeries {
  std::string title;                  // panel title
  std::string note;                   // lines under the title ('\n' between)
  std::vector<std::int64_t> grantUs;  // one entry per permit: its server time (epoch µs), sorted
  std::int64_t durationUs = 0;        // x range of the left plot, from the first grant
  std::int64_t maxWindowUs = 0;       // x range of the right plot (window lengths)
  // The most permits the limiter may grant within the closed window [fromUs, fromUs + lengthUs].
  std::function<std::int64_t(std::int64_t fromUs, std::int64_t lengthUs)> boundFrom;
  // The most permits it may grant within any closed window of length lengthUs.
  std::function<std::int64_t(std::int64_t lengthUs)> boundAny;
  std::string boundLabel;  // legend of the red line, e.g. "burst + rate x T"
};

/// The most of the sorted times `us` within one closed window [s, s + lengthUs], over every s.
inline std::int64_t mostInAnyWindow(const std::vector<std::int64_t>& us, std::int64_t lengthUs) {
  std::int64_t best = 0;
  std::size_t j = 0;
  for (std::size_t i = 0; i < us.size(); ++i) {
    if (j < i) j = i;
    while (j + 1 < us.size() && us[j + 1] <= us[i] + lengthUs) ++j;
    best = std::max(best, static_cast<std::int64_t>(j - i + 1));
  }
  return best;
}

/// How many of the sorted times `us` are <= t.
inline std::int64_t countUpTo(const std::vector<std::int64_t>& us, std::int64_t t) {
  return std::upper_bound(us.begin(), us.end(), t) - us.begin();
}

namespace detail {

inline std::string fmt1(double v) { return fmt::format("{:.1f}", v); }

inline std::string escapeText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else
      out += c;
  }
  return out;
}

// A round step for about `parts` ticks up to `max`.
inline std::int64_t niceStep(std::int64_t max, int parts) {
  const std::int64_t raw = std::max<std::int64_t>(1, max / parts);
  std::int64_t p = 1;
  while (p * 10 <= raw) p *= 10;
  for (std::int64_t m : {1, 2, 5, 10}) {
    if (p * m >= raw) return p * m;
  }
  return p * 10;
}

// One plot: axes and grid, then the two polylines (points in data units: x ms, y permits).
struct Plot {
  double left = 0, top = 0, width = 0, height = 0;
  double xMax = 1, yMax = 1;
  [[nodiscard]] double x(double v) const { return left + v / xMax * width; }
  [[nodiscard]] double y(double v) const { return top + height - v / yMax * height; }

  void axes(std::ostringstream& svg, const std::string& xLabel) const {
    svg << "<g stroke=\"#ddd\">\n";
    const auto yStep = niceStep(static_cast<std::int64_t>(yMax), 5);
    for (std::int64_t v = 0; static_cast<double>(v) <= yMax; v += yStep) {
      svg << "<line x1=\"" << fmt1(left) << "\" x2=\"" << fmt1(left + width) << "\" y1=\""
          << fmt1(y(static_cast<double>(v))) << "\" y2=\"" << fmt1(y(static_cast<double>(v))) << "\"/>\n";
    }
    svg << "</g>\n<g fill=\"#444\" text-anchor=\"end\">\n";
    for (std::int64_t v = 0; static_cast<double>(v) <= yMax; v += yStep) {
      svg << "<text x=\"" << fmt1(left - 5) << "\" y=\"" << fmt1(y(static_cast<double>(v)) + 4) << "\">" << v
          << "</text>\n";
    }
    svg << "</g>\n<g fill=\"#444\" text-anchor=\"middle\">\n";
    const auto xStep = niceStep(static_cast<std::int64_t>(xMax), 5);
    for (std::int64_t v = 0; static_cast<double>(v) <= xMax; v += xStep) {
      svg << "<text x=\"" << fmt1(x(static_cast<double>(v))) << "\" y=\"" << fmt1(top + height + 15) << "\">" << v
          << "</text>\n";
    }
    svg << "</g>\n<text x=\"" << fmt1(left + width / 2) << "\" y=\"" << fmt1(top + height + 30)
        << "\" fill=\"#444\" text-anchor=\"middle\">" << escapeText(xLabel) << "</text>\n"
        << "<rect x=\"" << fmt1(left) << "\" y=\"" << fmt1(top) << "\" width=\"" << fmt1(width) << "\" height=\""
        << fmt1(height) << "\" fill=\"none\" stroke=\"#888\"/>\n";
  }

  void line(std::ostringstream& svg, const std::vector<std::pair<double, double>>& points, const char* style) const {
    svg << "<polyline fill=\"none\" " << style << " points=\"";
    for (const auto& [px, py] : points) svg << fmt1(x(px)) << ',' << fmt1(y(py)) << ' ';
    svg << "\"/>\n";
  }
};

}  // namespace detail

/// The SVG document: one panel per series (see the file comment).
inline std::string renderEnvelopeSvg(const std::string& heading, const std::vector<EnvelopeSeries>& series) {
  const double width = 1000, top = 74, lineHeight = 16, plotHeight = 220, gap = 70, left = 60, middle = 70;
  const double plotWidth = (width - left - middle - 30) / 2;
  auto noteLines = [](const std::string& note) {
    std::vector<std::string> lines;
    std::istringstream in(note);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  double height = top;
  for (const EnvelopeSeries& s : series) {
    height += lineHeight * static_cast<double>(1 + noteLines(s.note).size()) + plotHeight + gap;
  }

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << detail::fmt1(width) << "\" height=\""
      << detail::fmt1(height) << "\" viewBox=\"0 0 " << detail::fmt1(width) << ' ' << detail::fmt1(height)
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << left << "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">" << detail::escapeText(heading)
      << "</text>\n"
      << "<text x=\"" << left << "\" y=\"40\" fill=\"#444\"><tspan fill=\"#e08a00\">orange</tspan>: permits granted "
      << "(by the server times of the decisions).  <tspan fill=\"#d62728\">red</tspan>: the most the algorithm allows."
      << "</text>\n<text x=\"" << left << "\" y=\"56\" fill=\"#444\">Left: granted since the first grant, over "
      << "time.  Right: the most granted in any window of length T, over all windows of the run.</text>\n";

  double y = top;
  for (const EnvelopeSeries& s : series) {
    const std::vector<std::string> note = noteLines(s.note);
    const std::int64_t t0 = s.grantUs.empty() ? 0 : s.grantUs.front();
    svg << "<text x=\"" << left << "\" y=\"" << detail::fmt1(y + lineHeight) << "\" font-weight=\"bold\">"
        << detail::escapeText(s.title) << "</text>\n";
    for (std::size_t i = 0; i < note.size(); ++i) {
      svg << "<text x=\"" << left << "\" y=\"" << detail::fmt1(y + lineHeight * static_cast<double>(i + 2))
          << "\" fill=\"#444\">" << detail::escapeText(note[i]) << "</text>\n";
    }
    const double plotTop = y + lineHeight * static_cast<double>(1 + note.size()) + 14;
    constexpr int kSamples = 400;

    // Left: grants since the first one.
    std::vector<std::pair<double, double>> granted, bound;
    std::int64_t yMax = 1;
    for (int k = 0; k <= kSamples; ++k) {
      const std::int64_t t = s.durationUs * k / kSamples;
      const std::int64_t n = countUpTo(s.grantUs, t0 + t);
      const std::int64_t b = s.boundFrom ? s.boundFrom(t0, t) : 0;
      granted.emplace_back(static_cast<double>(t) / 1000, static_cast<double>(n));
      bound.emplace_back(static_cast<double>(t) / 1000, static_cast<double>(b));
      yMax = std::max({yMax, n, b});
    }
    detail::Plot lp{left,
                    plotTop,
                    plotWidth,
                    plotHeight,
                    static_cast<double>(s.durationUs) / 1000,
                    static_cast<double>(yMax) * 1.08};
    lp.axes(svg, "t, ms since the first grant");
    lp.line(svg, bound, "stroke=\"#d62728\" stroke-width=\"3\" stroke-opacity=\"0.6\"");
    lp.line(svg, granted, "stroke=\"#e08a00\" stroke-width=\"1.8\"");

    // Right: most in any window of length T.
    std::vector<std::pair<double, double>> most, allowed;
    yMax = 1;
    for (int k = 0; k <= kSamples / 2; ++k) {
      const std::int64_t len = s.maxWindowUs * k / (kSamples / 2);
      const std::int64_t n = mostInAnyWindow(s.grantUs, len);
      const std::int64_t b = s.boundAny ? s.boundAny(len) : 0;
      most.emplace_back(static_cast<double>(len) / 1000, static_cast<double>(n));
      allowed.emplace_back(static_cast<double>(len) / 1000, static_cast<double>(b));
      yMax = std::max({yMax, n, b});
    }
    detail::Plot rp{
        left + plotWidth + middle,       plotTop, plotWidth, plotHeight, static_cast<double>(s.maxWindowUs) / 1000,
        static_cast<double>(yMax) * 1.08};
    rp.axes(svg, "window length T, ms");
    rp.line(svg, allowed, "stroke=\"#d62728\" stroke-width=\"3\" stroke-opacity=\"0.6\"");
    rp.line(svg, most, "stroke=\"#e08a00\" stroke-width=\"1.8\"");
    svg << "<text x=\"" << detail::fmt1(rp.left + 8) << "\" y=\"" << detail::fmt1(plotTop + 16)
        << "\" fill=\"#d62728\">" << detail::escapeText(s.boundLabel) << "</text>\n";
    svg << "<text x=\"" << detail::fmt1(left - 44) << "\" y=\"" << detail::fmt1(plotTop + plotHeight / 2)
        << "\" fill=\"#444\" transform=\"rotate(-90 " << detail::fmt1(left - 44) << ' '
        << detail::fmt1(plotTop + plotHeight / 2) << ")\" text-anchor=\"middle\">permits</text>\n";
    y = plotTop + plotHeight + gap - 14;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace redlimit::bench
