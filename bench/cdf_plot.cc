#include "bench/cdf_plot.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tophat::bench {
namespace {

// --- Bitmap font -----------------------------------------------------------------------------

// 5x7 glyphs; `rows` holds one byte per row, top row in the most significant byte, and bit 4 of
// each byte is the leftmost column. Glyphs that hang are drawn two rows lower, which lets the
// tails of g, p, q, y and ',' reach below the baseline without a taller cell for every glyph.
struct Glyph {
  char ch;
  bool hangs;
  uint64_t rows;
};
constexpr bool kHangs = true;
constexpr bool kSits = false;

constexpr Glyph kFont[] = {
    {'0', kSits, 0x0E11131519110E},  {'1', kSits, 0x040C040404040E},
    {'2', kSits, 0x0E11010204081F},  {'3', kSits, 0x0E11010601110E},
    {'4', kSits, 0x02060A121F0202},  {'5', kSits, 0x1F101E0101110E},
    {'6', kSits, 0x0608101E11110E},  {'7', kSits, 0x1F010204080808},
    {'8', kSits, 0x0E11110E11110E},  {'9', kSits, 0x0E11110F01020C},
    {'A', kSits, 0x0E11111F111111},  {'B', kSits, 0x1E11111E11111E},
    {'C', kSits, 0x0E11101010110E},  {'D', kSits, 0x1C12111111121C},
    {'E', kSits, 0x1F10101E10101F},  {'F', kSits, 0x1F10101E101010},
    {'G', kSits, 0x0E11101711110F},  {'H', kSits, 0x1111111F111111},
    {'I', kSits, 0x0E04040404040E},  {'J', kSits, 0x0702020202120C},
    {'K', kSits, 0x11121418141211},  {'L', kSits, 0x1010101010101F},
    {'M', kSits, 0x111B1515111111},  {'N', kSits, 0x11111915131111},
    {'O', kSits, 0x0E11111111110E},  {'P', kSits, 0x1E11111E101010},
    {'Q', kSits, 0x0E11111115120D},  {'R', kSits, 0x1E11111E141211},
    {'S', kSits, 0x0F10100E01011E},  {'T', kSits, 0x1F040404040404},
    {'U', kSits, 0x1111111111110E},  {'V', kSits, 0x11111111110A04},
    {'W', kSits, 0x1111111515150A},  {'X', kSits, 0x11110A040A1111},
    {'Y', kSits, 0x11110A04040404},  {'Z', kSits, 0x1F01020408101F},
    {'a', kSits, 0x00000E010F110F},  {'b', kSits, 0x1010161911111E},
    {'c', kSits, 0x00000E1010110E},  {'d', kSits, 0x01010D1311110F},
    {'e', kSits, 0x00000E111F100E},  {'f', kSits, 0x0609081C080808},
    {'g', kHangs, 0x0F1111110F010E}, {'h', kSits, 0x10101619111111},
    {'i', kSits, 0x04000C0404040E},  {'j', kSits, 0x0200060202120C},
    {'k', kSits, 0x10101214181412},  {'l', kSits, 0x0C04040404040E},
    {'m', kSits, 0x00001A15151111},  {'n', kSits, 0x00001619111111},
    {'o', kSits, 0x00000E1111110E},  {'p', kHangs, 0x1E1111111E1010},
    {'q', kHangs, 0x0F1111110F0101}, {'r', kSits, 0x00001619101010},
    {'s', kSits, 0x00000F100E011E},  {'t', kSits, 0x08081C08080906},
    {'u', kSits, 0x0000111111130D},  {'v', kSits, 0x00001111110A04},
    {'w', kSits, 0x0000111115150A},  {'x', kSits, 0x0000110A040A11},
    {'y', kHangs, 0x111111110F010E}, {'z', kSits, 0x00001F0204081F},
    {' ', kSits, 0x00000000000000},  {'.', kSits, 0x00000000000C0C},
    {',', kHangs, 0x0000000C0C0408}, {'-', kSits, 0x0000000E000000},
    {'+', kSits, 0x0004041F040400},  {'%', kSits, 0x18190204081303},
    {'(', kSits, 0x02040808080402},  {')', kSits, 0x08040202020408},
    {'/', kSits, 0x00010204081000},  {':', kSits, 0x000C0C000C0C00},
    {'=', kSits, 0x00001F001F0000},  {'_', kSits, 0x0000000000001F},
    {'<', kSits, 0x02040810080402},  {'>', kSits, 0x08040201020408},
};
// Stands in for characters the font lacks, so a missing glyph is visible rather than silently
// dropped.
constexpr Glyph kMissingGlyph = {'\0', kSits, 0x001F1111111F00};

constexpr int kGlyphAdvance = 6;  // 5 columns plus one column of spacing
constexpr int kGlyphHeight = 7;

const Glyph& FindGlyph(char ch) {
  for (const Glyph& glyph : kFont) {
    if (glyph.ch == ch) return glyph;
  }
  return kMissingGlyph;
}

int TextWidth(std::string_view text, int scale) {
  return text.empty() ? 0 : (kGlyphAdvance * static_cast<int>(text.size()) - 1) * scale;
}

// --- Raster ------------------------------------------------------------------------------------

class Canvas {
 public:
  Canvas(int width, int height)
      : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3, 255) {}

  int width() const { return width_; }
  int height() const { return height_; }
  std::span<const uint8_t> rgb() const { return rgb_; }

  // Inclusive corners in any order. Clipped, so long labels and thick lines at the image edge
  // need no special casing by callers.
  void FillRect(int x0, int y0, int x1, int y1, Rgb color) {
    if (x0 > x1) std::swap(x0, x1);
    if (y0 > y1) std::swap(y0, y1);
    x0 = std::max(x0, 0), y0 = std::max(y0, 0);
    x1 = std::min(x1, width_ - 1), y1 = std::min(y1, height_ - 1);
    for (int y = y0; y <= y1; ++y) {
      for (int x = x0; x <= x1; ++x) {
        uint8_t* pixel = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
        pixel[0] = color.r, pixel[1] = color.g, pixel[2] = color.b;
      }
    }
  }

  void StrokeRect(int x0, int y0, int x1, int y1, Rgb color) {
    FillRect(x0, y0, x1, y0, color);
    FillRect(x0, y1, x1, y1, color);
    FillRect(x0, y0, x0, y1, color);
    FillRect(x1, y0, x1, y1, color);
  }

  // (x, y) is the top-left corner of horizontal text. Upward text reads bottom to top with the
  // glyph tops facing left, as a y-axis label does; (x, y) is then its bottom-left corner.
  void DrawText(int x, int y, std::string_view text, Rgb color, int scale = 1,
                bool upward = false) {
    int pen = 0;
    for (char ch : text) {
      const Glyph& glyph = FindGlyph(ch);
      for (int row = 0; row < kGlyphHeight; ++row) {
        const uint64_t bits = glyph.rows >> (8 * (kGlyphHeight - 1 - row));
        for (int col = 0; col < 5; ++col) {
          if ((bits & (0x10 >> col)) == 0) continue;
          const int along = (pen + col) * scale;
          const int across = (row + (glyph.hangs ? 2 : 0)) * scale;
          if (upward) {
            FillRect(x + across, y - along, x + across + scale - 1, y - along - scale + 1, color);
          } else {
            FillRect(x + along, y + across, x + along + scale - 1, y + across + scale - 1, color);
          }
        }
      }
      pen += kGlyphAdvance;
    }
  }

 private:
  int width_;
  int height_;
  std::vector<uint8_t> rgb_;
};

// --- Plot --------------------------------------------------------------------------------------

constexpr Rgb kInk = {0, 0, 0};
constexpr Rgb kGrid = {225, 225, 225};
constexpr Rgb kLegendBorder = {150, 150, 150};
constexpr Rgb kWhite = {255, 255, 255};

// Saturated and mutually distinct, and none is a grey, so series never blend with the axes,
// grid or text.
constexpr Rgb kPalette[] = {
    {0, 100, 220}, {240, 120, 0}, {0, 160, 70},  {220, 20, 40}, {140, 60, 210},
    {0, 175, 200}, {225, 0, 150}, {150, 90, 20}, {120, 150, 0},
};

// Plot-area corners relative to the panel's top-left; the margins hold title, labels and ticks.
constexpr int kPlotLeft = 62;
constexpr int kPlotRight = 540;
constexpr int kPlotTop = 44;
constexpr int kPlotBottom = 344;

struct XAxis {
  double max = 1;
  double step = 0.2;
  int decimals = 1;  // enough to tell neighbouring tick labels apart
};

// Ticks at multiples of a 1/2/5 x 10^n step read as round numbers; aiming for about six
// intervals keeps the labels from crowding a plot area under 500 px wide.
XAxis ChooseXAxis(double largest_value) {
  if (!(largest_value > 0)) return XAxis{};
  const double raw_step = largest_value / 6;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw_step)));
  double step = 10 * magnitude;
  for (double mantissa : {1.0, 2.0, 5.0}) {
    if (mantissa * magnitude >= raw_step * (1 - 1e-9)) {
      step = mantissa * magnitude;
      break;
    }
  }
  XAxis axis;
  axis.step = step;
  axis.max = step * std::ceil(largest_value / step - 1e-9);
  axis.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return axis;
}

void DrawStepCurve(Canvas& canvas, std::vector<double> values, Rgb color, auto to_x, auto to_y,
                   int right) {
  if (values.empty()) return;
  std::sort(values.begin(), values.end());
  const double count = static_cast<double>(values.size());
  int x = to_x(values.front());
  int y = to_y(0.0);
  for (size_t i = 0; i < values.size(); ++i) {
    const int next_x = to_x(values[i]);
    const int next_y = to_y(static_cast<double>(i + 1) / count);
    canvas.FillRect(x, y - 1, next_x + 1, y, color);  // flat until the next request's value
    canvas.FillRect(next_x, next_y - 1, next_x + 1, y, color);  // ... where compliance steps up
    x = next_x;
    y = next_y;
  }
  canvas.FillRect(x, y - 1, right, y, color);  // fully compliant for every larger bound
}

void DrawLegend(Canvas& canvas, const CdfPanel& panel, int right, int bottom) {
  if (panel.series.empty()) return;
  constexpr int kPadding = 6, kSwatchWidth = 16, kRowHeight = 12;
  int widest_label = 0;
  for (const CdfSeries& series : panel.series) {
    widest_label = std::max(widest_label, TextWidth(series.label, 1));
  }
  const int box_width = kPadding + kSwatchWidth + kPadding + widest_label + kPadding;
  const int box_height = kPadding + kRowHeight * static_cast<int>(panel.series.size()) + 1;
  // Lower right: a CDF rises early toward 100%, so the region of large bounds and low
  // compliance is where curves seldom go.
  const int x0 = right - 8 - box_width, y0 = bottom - 8 - box_height;
  canvas.FillRect(x0, y0, x0 + box_width, y0 + box_height, kWhite);
  canvas.StrokeRect(x0, y0, x0 + box_width, y0 + box_height, kLegendBorder);
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const int row_top = y0 + kPadding + kRowHeight * static_cast<int>(i);
    canvas.FillRect(x0 + kPadding, row_top + 2, x0 + kPadding + kSwatchWidth - 1, row_top + 4,
                    CdfSeriesColor(i));
    canvas.DrawText(x0 + 2 * kPadding + kSwatchWidth, row_top, panel.series[i].label, kInk);
  }
}

void DrawPanel(Canvas& canvas, int origin_x, const CdfPanel& panel) {
  const int left = origin_x + kPlotLeft, right = origin_x + kPlotRight;
  const int top = kPlotTop, bottom = kPlotBottom;
  double largest_value = 0;
  for (const CdfSeries& series : panel.series) {
    for (double value : series.values) largest_value = std::max(largest_value, value);
  }
  const XAxis axis = ChooseXAxis(largest_value);
  const auto to_x = [&](double value) {
    return left + static_cast<int>(std::lround(value / axis.max * (right - left)));
  };
  const auto to_y = [&](double fraction) {
    return bottom - static_cast<int>(std::lround(fraction * (bottom - top)));
  };

  const int x_ticks = static_cast<int>(std::lround(axis.max / axis.step));
  for (int i = 0; i <= x_ticks; ++i) {
    const int x = to_x(i * axis.step);
    canvas.FillRect(x, top, x, bottom, kGrid);
    canvas.FillRect(x, bottom + 1, x, bottom + 4, kInk);
    const std::string label = absl::StrFormat("%.*f", axis.decimals, i * axis.step);
    canvas.DrawText(x - TextWidth(label, 1) / 2, bottom + 8, label, kInk);
  }
  for (int percent = 0; percent <= 100; percent += 20) {
    const int y = to_y(percent / 100.0);
    canvas.FillRect(left, y, right, y, kGrid);
    canvas.FillRect(left - 4, y, left - 1, y, kInk);
    const std::string label = absl::StrCat(percent, "%");
    canvas.DrawText(left - 7 - TextWidth(label, 1), y - kGlyphHeight / 2, label, kInk);
  }
  canvas.StrokeRect(left, top, right, bottom, kInk);

  // Titles are worth the larger type, unless that would spill into the neighbouring panel.
  const int center_x = (left + right) / 2;
  const int title_half_room = origin_x + kCdfPanelWidth - 4 - center_x;
  const int title_scale = TextWidth(panel.title, 2) / 2 <= title_half_room ? 2 : 1;
  canvas.DrawText(center_x - TextWidth(panel.title, title_scale) / 2, 12, panel.title, kInk,
                  title_scale);
  canvas.DrawText(center_x - TextWidth(panel.x_label, 1) / 2, bottom + 26, panel.x_label, kInk);
  constexpr std::string_view kYLabel = "compliance (%)";
  canvas.DrawText(origin_x + 12, (top + bottom) / 2 + TextWidth(kYLabel, 1) / 2, kYLabel, kInk, 1,
                  /*upward=*/true);

  for (size_t i = 0; i < panel.series.size(); ++i) {
    DrawStepCurve(canvas, panel.series[i].values, CdfSeriesColor(i), to_x, to_y, right);
  }
  DrawLegend(canvas, panel, right, bottom);
}

absl::Status ValidatePanels(std::span<const CdfPanel> panels) {
  if (panels.empty()) return absl::InvalidArgumentError("a CDF plot needs at least one panel");
  for (const CdfPanel& panel : panels) {
    for (const CdfSeries& series : panel.series) {
      for (size_t i = 0; i < series.values.size(); ++i) {
        const double value = series.values[i];
        if (std::isfinite(value) && value >= 0) continue;
        return absl::InvalidArgumentError(absl::StrFormat(
            "CDF panel \"%s\", series \"%s\": value #%d is %g, but values must be finite and "
            "non-negative",
            panel.title, series.label, i, value));
      }
    }
  }
  return absl::OkStatus();
}

// --- PNG ---------------------------------------------------------------------------------------

void AppendBigEndian32(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

void AppendChunk(std::vector<uint8_t>& png, std::string_view type, std::span<const uint8_t> data) {
  AppendBigEndian32(png, static_cast<uint32_t>(data.size()));
  const size_t type_offset = png.size();
  png.insert(png.end(), type.begin(), type.end());
  png.insert(png.end(), data.begin(), data.end());
  // The CRC covers the chunk type as well as its data, but not the length.
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), png.data() + type_offset,
                          static_cast<uInt>(png.size() - type_offset));
  AppendBigEndian32(png, static_cast<uint32_t>(crc));
}

}  // namespace

Rgb CdfSeriesColor(size_t index) { return kPalette[index % std::size(kPalette)]; }

std::vector<uint8_t> EncodePng(int width, int height, std::span<const uint8_t> rgb) {
  if (width <= 0 || height <= 0) return {};
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  if (rgb.size() != row_bytes * height) return {};

  // Filter 0 (none) on every row: plots are mostly flat colour, which DEFLATE already squeezes
  // well, so per-row filter selection would buy little.
  std::vector<uint8_t> scanlines;
  scanlines.reserve((row_bytes + 1) * height);
  for (int y = 0; y < height; ++y) {
    scanlines.push_back(0);
    const auto row = rgb.subspan(y * row_bytes, row_bytes);
    scanlines.insert(scanlines.end(), row.begin(), row.end());
  }
  std::vector<uint8_t> compressed(compressBound(scanlines.size()));
  uLongf compressed_size = compressed.size();
  if (compress2(compressed.data(), &compressed_size, scanlines.data(), scanlines.size(),
                Z_BEST_COMPRESSION) != Z_OK) {
    return {};
  }
  compressed.resize(compressed_size);

  std::vector<uint8_t> header;
  AppendBigEndian32(header, static_cast<uint32_t>(width));
  AppendBigEndian32(header, static_cast<uint32_t>(height));
  // 8-bit RGB, deflate, filter method 0, no interlace.
  header.insert(header.end(), {8, 2, 0, 0, 0});

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  AppendChunk(png, "IHDR", header);
  AppendChunk(png, "IDAT", compressed);
  AppendChunk(png, "IEND", {});
  return png;
}

absl::Status WriteCdfPlotPng(const std::filesystem::path& path, std::span<const CdfPanel> panels) {
  if (absl::Status status = ValidatePanels(panels); !status.ok()) return status;
  Canvas canvas(kCdfPanelWidth * static_cast<int>(panels.size()), kCdfPanelHeight);
  for (size_t i = 0; i < panels.size(); ++i) {
    DrawPanel(canvas, kCdfPanelWidth * static_cast<int>(i), panels[i]);
  }
  const std::vector<uint8_t> png = EncodePng(canvas.width(), canvas.height(), canvas.rgb());
  if (png.empty()) return absl::InternalError("PNG encoding of the CDF plot failed");

  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path.string(), " for writing: ", std::strerror(errno)));
  }
  out.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("failed to write ", path.string()));
  return absl::OkStatus();
}

}  // namespace tophat::bench
