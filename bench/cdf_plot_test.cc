#include "bench/cdf_plot.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tophat::bench {
namespace {

struct DecodedPng {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel

  Rgb At(int x, int y) const {
    const size_t offset = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[offset], rgb[offset + 1], rgb[offset + 2]};
  }
};

uint32_t ReadBigEndian32(const std::vector<uint8_t>& bytes, size_t offset) {
  return uint32_t{bytes[offset]} << 24 | uint32_t{bytes[offset + 1]} << 16 |
         uint32_t{bytes[offset + 2]} << 8 | uint32_t{bytes[offset + 3]};
}

// Checks the structure a PNG reader relies on (signature, IHDR first, every CRC, IEND last) and
// inflates the image. Only what EncodePng writes is supported: 8-bit RGB with filter 0 rows.
DecodedPng DecodePng(const std::vector<uint8_t>& png) {
  const std::vector<uint8_t> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  REQUIRE(png.size() > signature.size());
  REQUIRE(std::vector<uint8_t>(png.begin(), png.begin() + 8) == signature);

  DecodedPng image;
  std::vector<uint8_t> idat;
  std::vector<std::string> chunk_types;
  for (size_t offset = 8; offset < png.size();) {
    REQUIRE(offset + 12 <= png.size());
    const uint32_t length = ReadBigEndian32(png, offset);
    REQUIRE(offset + 12 + length <= png.size());
    const std::string type(png.begin() + offset + 4, png.begin() + offset + 8);
    const uint8_t* data = png.data() + offset + 8;
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), png.data() + offset + 4, length + 4);
    INFO("chunk " << type);
    CHECK(ReadBigEndian32(png, offset + 8 + length) == static_cast<uint32_t>(crc));
    if (type == "IHDR") {
      REQUIRE(length == 13);
      image.width = static_cast<int>(ReadBigEndian32(png, offset + 8));
      image.height = static_cast<int>(ReadBigEndian32(png, offset + 12));
      CHECK(data[8] == 8);   // bit depth
      CHECK(data[9] == 2);   // colour type: RGB
      CHECK(data[10] == 0);  // compression: deflate
      CHECK(data[11] == 0);  // filter method
      CHECK(data[12] == 0);  // no interlace
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data, data + length);
    }
    chunk_types.push_back(type);
    offset += 12 + length;
  }
  REQUIRE(chunk_types.size() >= 3);
  CHECK(chunk_types.front() == "IHDR");
  CHECK(chunk_types.back() == "IEND");
  REQUIRE(image.width > 0);
  REQUIRE(image.height > 0);

  const size_t row_bytes = 1 + 3 * static_cast<size_t>(image.width);
  const size_t expected_size = row_bytes * image.height;
  // Room for one extra byte, so a stream longer than the image would show up as a size mismatch.
  std::vector<uint8_t> scanlines(expected_size + 1);
  uLongf inflated_size = scanlines.size();
  REQUIRE(uncompress(scanlines.data(), &inflated_size, idat.data(), idat.size()) == Z_OK);
  REQUIRE(inflated_size == expected_size);
  for (int y = 0; y < image.height; ++y) {
    const auto row = scanlines.begin() + y * row_bytes;
    REQUIRE(row[0] == 0);
    image.rgb.insert(image.rgb.end(), row + 1, row + row_bytes);
  }
  return image;
}

std::vector<uint8_t> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct ColorExtent {
  int count = 0;
  int leftmost_x = std::numeric_limits<int>::max();
};

ColorExtent FindColor(const DecodedPng& image, Rgb color, int x_begin, int x_end) {
  ColorExtent extent;
  for (int y = 0; y < image.height; ++y) {
    for (int x = x_begin; x < x_end; ++x) {
      if (image.At(x, y) != color) continue;
      ++extent.count;
      extent.leftmost_x = std::min(extent.leftmost_x, x);
    }
  }
  return extent;
}

bool ColumnHasColor(const DecodedPng& image, Rgb color, int x) {
  for (int y = 0; y < image.height; ++y) {
    if (image.At(x, y) == color) return true;
  }
  return false;
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

TEST_CASE("EncodePng writes a valid RGB PNG that round-trips the pixels") {
  const int width = 7, height = 5;
  std::vector<uint8_t> rgb;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int channel = 0; channel < 3; ++channel) {
        rgb.push_back(static_cast<uint8_t>(x * 37 + y * 91 + channel * 113));
      }
    }
  }
  const std::vector<uint8_t> png = EncodePng(width, height, rgb);
  // IHDR must directly follow the signature for readers that sniff the size.
  REQUIRE(png.size() > 33);
  CHECK(std::string(png.begin() + 12, png.begin() + 16) == "IHDR");
  const DecodedPng image = DecodePng(png);
  CHECK(image.width == width);
  CHECK(image.height == height);
  CHECK(image.rgb == rgb);
}

TEST_CASE("EncodePng rejects a pixel buffer that does not match the size") {
  const std::vector<uint8_t> rgb(4 * 3 * 3);
  CHECK(EncodePng(4, 3, rgb).size() > 0);
  CHECK(EncodePng(4, 4, rgb).empty());
  CHECK(EncodePng(0, 3, std::span<const uint8_t>()).empty());
}

TEST_CASE("CdfSeriesColor gives at least eight distinct non-grey colours") {
  for (size_t i = 0; i < 8; ++i) {
    const Rgb color = CdfSeriesColor(i);
    CHECK_FALSE((color.r == color.g && color.g == color.b));
    for (size_t j = 0; j < i; ++j) CHECK(CdfSeriesColor(j) != color);
  }
}

TEST_CASE("WriteCdfPlotPng draws each series where its values lie") {
  // Panel 0 has the fast series first, panel 1 has it last, so a drawing that ignored the
  // values (or mixed up the panels) would fail one of the orderings.
  const std::vector<CdfPanel> panels = {
      {"Prefill SLA (SpecBench, 2 req/s)",
       "TTFT per 128 prompt tokens (ms)",
       {{"U-shape", Spread(5, 10, 50)},
        {"+spec", Spread(20, 30, 50)},
        {"+both", Spread(40, 100, 50)}}},
      {"Decode SLA",
       "delay per 10 tokens (ms)",
       {{"U-Sarathi-128", Spread(300, 800, 40)},
        {"+chunk", Spread(150, 200, 40)},
        {"+parallel", Spread(10, 60, 40)}}},
  };
  const std::filesystem::path path = TempPngPath("cdf_plot_test");
  REQUIRE(WriteCdfPlotPng(path, panels).ok());
  const DecodedPng image = DecodePng(ReadFile(path));
  std::filesystem::remove(path);
  REQUIRE(image.width == 2 * kCdfPanelWidth);
  REQUIRE(image.height == kCdfPanelHeight);

  std::vector<ColorExtent> first, second;
  for (size_t i = 0; i < 3; ++i) {
    first.push_back(FindColor(image, CdfSeriesColor(i), 0, kCdfPanelWidth));
    second.push_back(FindColor(image, CdfSeriesColor(i), kCdfPanelWidth, 2 * kCdfPanelWidth));
    INFO("series " << i);
    // A step line through the plot is far bigger than a legend swatch.
    CHECK(first[i].count > 300);
    CHECK(second[i].count > 300);
  }
  CHECK(first[0].leftmost_x < first[1].leftmost_x);
  CHECK(first[1].leftmost_x < first[2].leftmost_x);
  CHECK(second[2].leftmost_x < second[1].leftmost_x);
  CHECK(second[1].leftmost_x < second[0].leftmost_x);

  // The x axis is linear from 0, so the curves start at distances proportional to the
  // differences of their minimums (5, 20 and 40 ms).
  const double pixels_per_ms = (first[2].leftmost_x - first[0].leftmost_x) / 35.0;
  CHECK(first[1].leftmost_x - first[0].leftmost_x == Approx(15 * pixels_per_ms).margin(2));
  CHECK(pixels_per_ms > 2);

  // Between the fast series' last value (10 ms) and the next series' first (20 ms) only the
  // fast series is drawn, at full compliance.
  const int x_at_15_ms = first[0].leftmost_x + static_cast<int>(10 * pixels_per_ms);
  CHECK(ColumnHasColor(image, CdfSeriesColor(0), x_at_15_ms));
  CHECK_FALSE(ColumnHasColor(image, CdfSeriesColor(1), x_at_15_ms));
  CHECK_FALSE(ColumnHasColor(image, CdfSeriesColor(2), x_at_15_ms));
}

TEST_CASE("WriteCdfPlotPng lists an empty series in the legend without a curve") {
  const std::vector<CdfPanel> panels = {
      {"Empty", "x (ms)", {{"measured", Spread(1, 2, 10)}, {"not run", {}}}}};
  const std::filesystem::path path = TempPngPath("cdf_plot_empty_test");
  REQUIRE(WriteCdfPlotPng(path, panels).ok());
  const DecodedPng image = DecodePng(ReadFile(path));
  std::filesystem::remove(path);
  const ColorExtent measured = FindColor(image, CdfSeriesColor(0), 0, image.width);
  const ColorExtent not_run = FindColor(image, CdfSeriesColor(1), 0, image.width);
  CHECK(not_run.count > 0);
  CHECK(not_run.count * 4 < measured.count);
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

}  // namespace
}  // namespace tophat::bench
