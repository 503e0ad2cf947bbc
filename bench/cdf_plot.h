// SLA-compliance CDF plots as PNG files, for `tophat bench --ablation`: x is an SLA bound in
// milliseconds, y is the share of requests that meet it (the empirical CDF), one step line per
// benchmark configuration. And line plots of a quantity against a scale (x logarithmic), for
// `tophat simulate --sweep-devices`. Drawn with cairo (anti-aliased; text in DejaVu Sans through
// fontconfig, from fonts-dejavu-core, or whatever sans-serif face fontconfig offers instead).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tophat::bench {

struct CdfSeries {
  std::string label;
  std::vector<double> values;  // one per request, e.g. milliseconds; empty: legend entry only
};

struct CdfPanel {
  std::string title;    // e.g. "Prefill SLA (SpecBench, 2 req/s)"
  std::string x_label;  // e.g. "TTFT per 128 prompt tokens (ms)"
  std::vector<CdfSeries> series;
};

struct Rgb {
  uint8_t r = 0;
  uint8_t g = 0;
  uint8_t b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

// Each panel occupies this much of the image; panels sit side by side.
inline constexpr int kCdfPanelWidth = 560;
inline constexpr int kCdfPanelHeight = 400;

// The colour of series `index` within its panel (the palette repeats after 9 series). Every
// other plot element is grey, and the palette's colours lie far apart, so a pixel close to one
// belongs to that series (anti-aliased edges blend toward the background).
Rgb CdfSeriesColor(size_t index);

// Writes the panels side by side into one RGB PNG at `path`, replacing any file there.
// InvalidArgumentError when there are no panels or a value is NaN, infinite or negative (the
// message names the panel title and series label); UnavailableError naming `path` when the file
// cannot be written.
absl::Status WriteCdfPlotPng(const std::filesystem::path& path, std::span<const CdfPanel> panels);

// A line through each series' points (sorted by x) against a logarithmic x axis, with a
// marker at every point; y linear from 0, or logarithmic.
struct LineSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (x, y), x > 0 (and y > 0 with log_y)
};

struct LinePanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;
  std::vector<LineSeries> series;
};

// Writes the panels side by side into one RGB PNG at `path` (each kCdfPanelWidth x
// kCdfPanelHeight, series coloured as CdfSeriesColor). InvalidArgumentError naming the panel
// and series when there are no panels, or a point is not finite or not positive where its axis
// is logarithmic; UnavailableError naming `path` when the file cannot be written.
absl::Status WriteLinePlotPng(const std::filesystem::path& path, std::span<const LinePanel> panels);

}  // namespace tophat::bench
