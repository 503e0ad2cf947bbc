#include "bench/cdf_plot.h"

#include <cairo.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "base/test_util.h"

namespace tophat::bench {
namespace {

// The plot as cairo reads it back from the PNG (an independent decoder: libpng's).
class Image {
 public:
  explicit Image(const std::filesystem::path& path)
      : surface_(cairo_image_surface_create_from_png(path.c_str()), cairo_surface_destroy) {
    REQUIRE(cairo_surface_status(surface_.get()) == CAIRO_STATUS_SUCCESS);
    cairo_surface_flush(surface_.get());
    width_ = cairo_image_surface_get_width(surface_.get());
    height_ = cairo_image_surface_get_height(surface_.get());
    stride_ = cairo_image_surface_get_stride(surface_.get());
    data_ = cairo_image_surface_get_data(surface_.get());
    REQUIRE(data_ != nullptr);
  }

  int width() const { return width_; }
  int height() const { return height_; }

  Rgb At(int x, int y) const {
    // RGB24 and ARGB32 both keep a pixel in one native-endian uint32: 0xXXRRGGBB (an opaque
    // image, so ARGB32's premultiplication changes nothing).
    const uint32_t pixel =
        *reinterpret_cast<const uint32_t*>(data_ + static_cast<size_t>(y) * stride_ + 4 * x);
    return {static_cast<uint8_t>(pixel >> 16), static_cast<uint8_t>(pixel >> 8),
            static_cast<uint8_t>(pixel)};
  }

 private:
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface_;
  int width_ = 0;
  int height_ = 0;
  int stride_ = 0;
  const unsigned char* data_ = nullptr;
};

// Anti-aliased edges blend a series' colour toward the background, so a series' pixels are
// those within kTolerance of its colour in every channel (no pixel is near two series: see the
// CdfSeriesColor test).
constexpr int kTolerance = 24;

int Distance(Rgb a, Rgb b) {
  return std::max({std::abs(a.r - b.r), std::abs(a.g - b.g), std::abs(a.b - b.b)});
}

bool Near(Rgb a, Rgb b) { return Distance(a, b) <= kTolerance; }

// Where pixels close to `color` lie within columns [x_begin, x_end).
struct ColorPixels {
  int count = 0;
  int left = std::numeric_limits<int>::max();
  int right = std::numeric_limits<int>::min();
  int top = std::numeric_limits<int>::max();
  int bottom = std::numeric_limits<int>::min();
  std::vector<int> per_column;  // indexed by x - x_begin
};

ColorPixels FindColor(const Image& image, Rgb color, int x_begin, int x_end) {
  ColorPixels found;
  found.per_column.assign(x_end - x_begin, 0);
  for (int y = 0; y < image.height(); ++y) {
    for (int x = x_begin; x < x_end; ++x) {
      if (!Near(image.At(x, y), color)) continue;
      ++found.count;
      ++found.per_column[x - x_begin];
      found.left = std::min(found.left, x);
      found.right = std::max(found.right, x);
      found.top = std::min(found.top, y);
      found.bottom = std::max(found.bottom, y);
    }
  }
  return found;
}

// A CDF whose values all lie close together rises at one x: within a band of rows that the
// rise crosses, every row holds the colour, at (almost) the same column.
struct Rise {
  int rows_hit = 0;
  int left = std::numeric_limits<int>::max();
  int right = std::numeric_limits<int>::min();
  double mean_x = 0;
};

Rise FindRise(const Image& image, Rgb color, int x_begin, int x_end, int y_begin, int y_end) {
  Rise rise;
  int count = 0;
  for (int y = y_begin; y < y_end; ++y) {
    bool hit = false;
    for (int x = x_begin; x < x_end; ++x) {
      if (!Near(image.At(x, y), color)) continue;
      hit = true;
      ++count;
      rise.mean_x += x;
      rise.left = std::min(rise.left, x);
      rise.right = std::max(rise.right, x);
    }
    rise.rows_hit += hit ? 1 : 0;
  }
  if (count > 0) rise.mean_x /= count;
  return rise;
}

// The plot area's left edge (the y axis, x = 0 ms): the leftmost column of the panel with a
// run of 200 or more dark pixels. Tick labels and text are far shorter.
int YAxisColumn(const Image& image, int x_begin, int x_end) {
  for (int x = x_begin; x < x_end; ++x) {
    int run = 0;
    for (int y = 0; y < image.height(); ++y) {
      const Rgb pixel = image.At(x, y);
      run = pixel.r < 80 && pixel.g < 80 && pixel.b < 80 ? run + 1 : 0;
      if (run >= 200) return x;
    }
  }
  FAIL("no y axis in columns " << x_begin << ".." << x_end);
  return -1;
}

std::vector<double> Spread(double low, double high, int count) {
  std::vector<double> values;
  for (int i = 0; i < count; ++i) values.push_back(low + (high - low) * i / (count - 1));
  return values;
}

std::filesystem::path TempPngPath(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         (name + "-" + std::to_string(::getpid()) + ".png");
}

// Writes the plot, reads it back and removes the file, unless TOPHAT_KEEP_PLOTS is set (to look
// at the plot: the path is printed).
Image WriteAndRead(const std::string& name, const std::vector<CdfPanel>& panels) {
  const std::filesystem::path path = TempPngPath(name);
  const absl::Status status = WriteCdfPlotPng(path, panels);
  INFO(status.ToString());
  REQUIRE(status.ok());
  Image image(path);
  if (std::getenv("TOPHAT_KEEP_PLOTS") != nullptr) {
    WARN("plot kept at " << path.string());
  } else {
    std::filesystem::remove(path);
  }
  return image;
}

TEST_CASE("CdfSeriesColor gives nine colours that no grey or other series' pixel is near") {
  for (size_t i = 0; i < 9; ++i) {
    const Rgb color = CdfSeriesColor(i);
    INFO("series " << i);
    // Text, axes and grid are grey, and stay grey when anti-aliased against white.
    for (int level = 0; level <= 255; ++level) {
      const auto grey = static_cast<uint8_t>(level);
      CHECK_FALSE(Near(color, {grey, grey, grey}));
    }
    // Far enough apart that no pixel is near two of them.
    for (size_t j = 0; j < i; ++j) CHECK(Distance(CdfSeriesColor(j), color) > 2 * kTolerance);
  }
  CHECK(CdfSeriesColor(9) == CdfSeriesColor(0));
}

TEST_CASE("WriteCdfPlotPng draws each series' rise where its values lie") {
  // Each series' values lie within 1 ms of 100, 300 or 500 ms, so each rises in one place.
  // Panel 0 has the fast series first, panel 1 has it last, so a drawing that ignored the
  // values, mixed up the colours or mixed up the panels would fail one of the orderings.
  const std::vector<CdfPanel> panels = {
      {"Prefill SLA (SpecBench, 2 req/s)",
       "TTFT per 128 prompt tokens (ms)",
       {{"U-shape", Spread(99, 101, 30)},
        {"+spec", Spread(299, 301, 30)},
        {"+both", Spread(499, 501, 30)}}},
      {"Decode SLA (SpecBench, 2 req/s)",
       "delay per 10 tokens (ms)",
       {{"U-Sarathi-128", Spread(499, 501, 30)},
        {"+chunk", Spread(299, 301, 30)},
        {"+parallel", Spread(99, 101, 30)}}},
  };
  const Image image = WriteAndRead("cdf_plot_rise_test", panels);
  REQUIRE(image.width() == 2 * kCdfPanelWidth);
  REQUIRE(image.height() == kCdfPanelHeight);
  // Rows a quarter to half way down the image: shares of roughly 0.5 to 0.8, above the legend
  // in the lower right and below the curves' flat tops at 1.
  const int band_top = kCdfPanelHeight / 4, band_bottom = kCdfPanelHeight / 2;

  for (int panel = 0; panel < 2; ++panel) {
    INFO("panel " << panel);
    const int x_begin = panel * kCdfPanelWidth, x_end = x_begin + kCdfPanelWidth;
    // rise[k], found[k]: the series whose values lie near 100 + 200 k ms.
    std::vector<double> rise(3);
    std::vector<ColorPixels> found(3);
    for (int k = 0; k < 3; ++k) {
      const size_t series = panel == 0 ? k : 2 - k;
      const Rise r = FindRise(image, CdfSeriesColor(series), x_begin, x_end, band_top, band_bottom);
      INFO("series " << series << ": " << r.rows_hit << " rows, x " << r.left << ".." << r.right);
      CHECK(r.rows_hit == band_bottom - band_top);
      CHECK(r.right - r.left <= 4);
      rise[k] = r.mean_x;
      found[k] = FindColor(image, CdfSeriesColor(series), x_begin, x_end);
    }
    // The x axis is linear from 0 at the y axis: 100, 300 and 500 ms sit at 1, 3 and 5 times
    // the 100 ms distance from it.
    const int axis = YAxisColumn(image, x_begin, x_end);
    const double pixels_per_100_ms = (rise[2] - rise[0]) / 4;
    INFO("y axis at x=" << axis << ", rises at " << rise[0] << " " << rise[1] << " " << rise[2]);
    CHECK(pixels_per_100_ms > 50);
    CHECK(rise[0] - axis == Approx(pixels_per_100_ms).margin(2));
    CHECK(rise[1] - axis == Approx(3 * pixels_per_100_ms).margin(2));

    // Left of its values a series draws nothing (not even at 0), so at 200 ms, between the
    // first and second series' values, only the first series is drawn (at full compliance).
    const int x_at_200_ms = axis + static_cast<int>(std::lround(2 * pixels_per_100_ms));
    CHECK(found[0].per_column[x_at_200_ms - x_begin] > 0);
    CHECK(found[1].per_column[x_at_200_ms - x_begin] == 0);
    CHECK(found[2].per_column[x_at_200_ms - x_begin] == 0);
  }
}

TEST_CASE("WriteCdfPlotPng lists an empty series in the legend without a curve") {
  const std::vector<CdfPanel> panels = {
      {"Empty", "x (ms)", {{"measured", Spread(0.2, 2, 10)}, {"not run", {}}}}};
  const Image image = WriteAndRead("cdf_plot_empty_test", panels);
  const ColorPixels measured = FindColor(image, CdfSeriesColor(0), 0, image.width());
  const ColorPixels not_run = FindColor(image, CdfSeriesColor(1), 0, image.width());
  INFO("not run: " << not_run.count << " px in x " << not_run.left << ".." << not_run.right
                   << ", y " << not_run.top << ".." << not_run.bottom);
  // The swatch: a short bar, the same as the measured series' swatch beside its curve.
  CHECK(not_run.count >= 40);
  CHECK(not_run.right - not_run.left <= 30);
  CHECK(not_run.bottom - not_run.top <= 8);
  // The measured series' curve spans the plot (values 0.2 to 2 ms on an axis to 2 ms).
  CHECK(measured.right - measured.left > 300);
  CHECK(measured.bottom - measured.top > 200);
}

TEST_CASE("WriteCdfPlotPng reports bad input and unwritable paths") {
  const std::filesystem::path path = TempPngPath("cdf_plot_error_test");
  absl::Status status = WriteCdfPlotPng(path, {});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);

  for (double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    const std::vector<CdfPanel> panels = {
        {"Prefill SLA", "ms", {{"fine", {1, 2}}, {"+spec", {1, bad, 3}}}}};
    status = WriteCdfPlotPng(path, panels);
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(status.message().find("+spec") != std::string::npos);
    CHECK(status.message().find("Prefill SLA") != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(path));

  const std::vector<CdfPanel> panels = {{"ok", "ms", {{"a", {1, 2, 3}}}}};
  status = WriteCdfPlotPng("/nonexistent-dir/x.png", panels);
  INFO(status.ToString());
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(status.message().find("/nonexistent-dir/x.png") != std::string::npos);
}

TEST_CASE("WriteLinePlotPng puts each point where its logarithmic x and its y say") {
  const testing::TempDir scratch;
  const std::filesystem::path path = scratch.path() / "line_plot_test.png";
  // x at three decades: the first at the plot's left edge, the second in its middle, the third
  // at its right edge; y 1, 2, 3 on an axis from 0 to 3.
  const std::vector<LinePanel> panels = {
      {"TBT by devices", "devices", "ms", false, {{"p50", {{1000, 3}, {10, 1}, {100, 2}}}}},
      {"TTFT by devices", "devices", "s", true, {{"p90", {{10, 1}, {1000, 100}}}}}};
  REQUIRE(WriteLinePlotPng(path, panels).ok());
  const Image image(path);
  CHECK(image.width() == 2 * kCdfPanelWidth);
  // The plot area: x from 66 to 540 (474 px), y from 44 to 340 (296 px). (Its left edge is
  // not found as in the CDF tests: the markers on it break the axis' run of dark pixels.)
  const int axis = 66;
  const ColorPixels line = FindColor(image, CdfSeriesColor(0), 0, kCdfPanelWidth);
  INFO("axis " << axis << ", line x " << line.left << ".." << line.right << ", y " << line.top
               << ".." << line.bottom);
  CHECK(std::abs(line.left - axis) <= 6);        // the marker at x = 10, radius 3.5
  CHECK(std::abs(line.right - (axis + 474)) <= 6);  // x = 1000
  // y = 3 at the top of the area, y = 1 a third of the way up from its bottom (340).
  CHECK(std::abs(line.top - 44) <= 6);
  CHECK(std::abs(line.bottom - (340 - 296 / 3)) <= 6);
  // The middle point (x = 100, y = 2): the series' colour there, two thirds up.
  bool middle = false;
  for (int dx = -3; dx <= 3; ++dx) {
    for (int dy = -3; dy <= 3; ++dy) {
      middle = middle || Near(image.At(axis + 237 + dx, 340 - 2 * 296 / 3 + dy), CdfSeriesColor(0));
    }
  }
  CHECK(middle);
  // The log-y panel: 1 at the bottom, 100 at the top (decades 0 to 2).
  const ColorPixels logged = FindColor(image, CdfSeriesColor(0), kCdfPanelWidth, 2 * kCdfPanelWidth);
  CHECK(std::abs(logged.top - 44) <= 6);
  CHECK(std::abs(logged.bottom - 340) <= 6);
}

TEST_CASE("WriteLinePlotPng refuses points a logarithmic axis cannot show, by panel and series") {
  const testing::TempDir scratch;
  const std::filesystem::path path = scratch.path() / "line_plot_error_test.png";
  CHECK(WriteLinePlotPng(path, {}).code() == absl::StatusCode::kInvalidArgument);
  const std::vector<LinePanel> zero_x = {{"By devices", "devices", "s", false,
                                          {{"p50", {{0, 1}}}}}};
  absl::Status status = WriteLinePlotPng(path, zero_x);
  INFO(status.ToString());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message().find("By devices") != std::string::npos);
  CHECK(status.message().find("p50") != std::string::npos);
  const std::vector<LinePanel> zero_log_y = {{"TTFT", "devices", "s", true, {{"p90", {{10, 0}}}}}};
  CHECK(WriteLinePlotPng(path, zero_log_y).code() == absl::StatusCode::kInvalidArgument);
  const std::vector<LinePanel> zero_linear_y = {{"TBT", "devices", "ms", false,
                                                 {{"p90", {{10, 0}}}}}};
  CHECK(WriteLinePlotPng(path, zero_linear_y).ok());
}

}  // namespace
}  // namespace tophat::bench
