#include "bench/cdf_plot.h"

#include <cairo.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tophat::bench {
namespace {

struct SurfaceDeleter {
  void operator()(cairo_surface_t* surface) const { cairo_surface_destroy(surface); }
};
struct ContextDeleter {
  void operator()(cairo_t* cr) const { cairo_destroy(cr); }
};

// Saturated and far apart (every pair differs by 60 or more in some channel), and none is a
// grey, so series never blend with the axes, grid or text.
constexpr Rgb kPalette[] = {
    {0, 100, 220}, {240, 120, 0}, {0, 160, 70},  {220, 20, 40}, {140, 60, 210},
    {0, 175, 200}, {225, 0, 150}, {150, 90, 20}, {120, 150, 0},
};

constexpr Rgb kInk = {0, 0, 0};
constexpr Rgb kGrid = {225, 225, 225};
constexpr Rgb kLegendBorder = {150, 150, 150};
constexpr Rgb kWhite = {255, 255, 255};

constexpr const char* kFontFamily = "DejaVu Sans";  // fonts-dejavu-core
constexpr double kTitleSize = 15;
constexpr double kLabelSize = 12;
constexpr double kTickSize = 11;
constexpr double kCurveWidth = 2;

// Plot-area corners relative to the panel's top-left; the margins hold title, labels and ticks.
constexpr double kPlotLeft = 66;
constexpr double kPlotRight = 540;
constexpr double kPlotTop = 44;
constexpr double kPlotBottom = 340;

void SetColor(cairo_t* cr, Rgb color) {
  cairo_set_source_rgb(cr, color.r / 255.0, color.g / 255.0, color.b / 255.0);
}

void SetFont(cairo_t* cr, double size, bool bold = false) {
  cairo_select_font_face(cr, kFontFamily, CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

double TextWidth(cairo_t* cr, const std::string& text) {
  cairo_text_extents_t extents;
  cairo_text_extents(cr, text.c_str(), &extents);
  return extents.x_advance;
}

// Draws `text` in the current font starting at `x` (`align` 0), centred on it (0.5) or ending at
// it (1); the glyphs sit on `baseline_y`.
void ShowText(cairo_t* cr, const std::string& text, double x, double baseline_y, double align = 0) {
  cairo_move_to(cr, x - align * TextWidth(cr, text), baseline_y);
  cairo_show_text(cr, text.c_str());
}

// A one-pixel line between pixel centres, so that axis-parallel lines stay crisp.
void HairLine(cairo_t* cr, double x0, double y0, double x1, double y1, Rgb color) {
  SetColor(cr, color);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, std::round(x0) + 0.5, std::round(y0) + 0.5);
  cairo_line_to(cr, std::round(x1) + 0.5, std::round(y1) + 0.5);
  cairo_stroke(cr);
}

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

// The empirical CDF as a step line: flat until the next request's value, up by 1/n there, and
// flat at 1 to the right edge once every request meets the bound.
void DrawStepCurve(cairo_t* cr, std::vector<double> values, Rgb color, auto to_x, auto to_y,
                   double right) {
  if (values.empty()) return;
  std::sort(values.begin(), values.end());
  const double count = static_cast<double>(values.size());
  double y = to_y(0.0);
  cairo_move_to(cr, to_x(values.front()), y);
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = to_x(values[i]);
    cairo_line_to(cr, x, y);
    y = to_y(static_cast<double>(i + 1) / count);
    cairo_line_to(cr, x, y);
  }
  cairo_line_to(cr, right, y);
  SetColor(cr, color);
  cairo_set_line_width(cr, kCurveWidth);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_MITER);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_BUTT);
  cairo_stroke(cr);
}

void DrawLegend(cairo_t* cr, const CdfPanel& panel, double right, double bottom) {
  if (panel.series.empty()) return;
  constexpr double kPadding = 7, kSwatchWidth = 20, kRowHeight = 16;
  SetFont(cr, kTickSize);
  double widest_label = 0;
  for (const CdfSeries& series : panel.series) {
    widest_label = std::max(widest_label, TextWidth(cr, series.label));
  }
  const double width = std::ceil(kPadding + kSwatchWidth + kPadding + widest_label + kPadding);
  const double height = kPadding + kRowHeight * static_cast<double>(panel.series.size()) + 2;
  // Lower right: a CDF rises early toward 1, so the region of large bounds and low shares is
  // where curves seldom go.
  const double x0 = right - 10 - width, y0 = bottom - 10 - height;
  cairo_rectangle(cr, x0 + 0.5, y0 + 0.5, width, height);
  SetColor(cr, kWhite);
  cairo_fill_preserve(cr);
  SetColor(cr, kLegendBorder);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const double row_top = y0 + kPadding + kRowHeight * static_cast<double>(i);
    SetColor(cr, CdfSeriesColor(i));
    cairo_rectangle(cr, x0 + kPadding, row_top + 5, kSwatchWidth, 4);
    cairo_fill(cr);
    SetColor(cr, kInk);
    ShowText(cr, panel.series[i].label, x0 + 2 * kPadding + kSwatchWidth, row_top + 11);
  }
}

void DrawPanel(cairo_t* cr, double origin_x, const CdfPanel& panel) {
  const double left = origin_x + kPlotLeft, right = origin_x + kPlotRight;
  const double top = kPlotTop, bottom = kPlotBottom;
  double largest_value = 0;
  for (const CdfSeries& series : panel.series) {
    for (double value : series.values) largest_value = std::max(largest_value, value);
  }
  const XAxis axis = ChooseXAxis(largest_value);
  const auto to_x = [&](double value) { return left + value / axis.max * (right - left); };
  const auto to_y = [&](double share) { return bottom - share * (bottom - top); };

  SetFont(cr, kTickSize);
  const int x_ticks = static_cast<int>(std::lround(axis.max / axis.step));
  for (int i = 0; i <= x_ticks; ++i) {
    const double x = to_x(i * axis.step);
    HairLine(cr, x, top, x, bottom, kGrid);
    HairLine(cr, x, bottom, x, bottom + 4, kInk);
    SetColor(cr, kInk);
    ShowText(cr, absl::StrFormat("%.*f", axis.decimals, i * axis.step), std::round(x) + 0.5,
             bottom + 18, /*align=*/0.5);
  }
  for (int tenths = 0; tenths <= 10; tenths += 2) {
    const double y = to_y(tenths / 10.0);
    HairLine(cr, left, y, right, y, kGrid);
    HairLine(cr, left - 4, y, left, y, kInk);
    SetColor(cr, kInk);
    ShowText(cr, absl::StrFormat("%.1f", tenths / 10.0), left - 7, std::round(y) + 4.5,
             /*align=*/1);
  }
  SetColor(cr, kInk);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, std::round(left) + 0.5, std::round(top) + 0.5,
                  std::round(right) - std::round(left), std::round(bottom) - std::round(top));
  cairo_stroke(cr);

  // Titles take the larger type, shrunk if they would spill into the neighbouring panel.
  const double center_x = (left + right) / 2;
  const double title_room = 2 * (origin_x + kCdfPanelWidth - 6 - center_x);
  SetFont(cr, kTitleSize, /*bold=*/true);
  if (const double width = TextWidth(cr, panel.title); width > title_room) {
    SetFont(cr, kTitleSize * title_room / width, /*bold=*/true);
  }
  ShowText(cr, panel.title, center_x, 26, /*align=*/0.5);
  SetFont(cr, kLabelSize);
  ShowText(cr, panel.x_label, center_x, bottom + 40, /*align=*/0.5);
  cairo_save(cr);
  cairo_translate(cr, origin_x + 18, (top + bottom) / 2);
  cairo_rotate(cr, -std::numbers::pi / 2);
  ShowText(cr, "share of requests within the bound", 0, 0, /*align=*/0.5);
  cairo_restore(cr);

  for (size_t i = 0; i < panel.series.size(); ++i) {
    DrawStepCurve(cr, panel.series[i].values, CdfSeriesColor(i), to_x, to_y, right);
  }
  DrawLegend(cr, panel, right, bottom);
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

}  // namespace

Rgb CdfSeriesColor(size_t index) { return kPalette[index % std::size(kPalette)]; }

absl::Status WriteCdfPlotPng(const std::filesystem::path& path, std::span<const CdfPanel> panels) {
  if (absl::Status status = ValidatePanels(panels); !status.ok()) return status;
  const std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(cairo_image_surface_create(
      CAIRO_FORMAT_RGB24, kCdfPanelWidth * static_cast<int>(panels.size()), kCdfPanelHeight));
  const std::unique_ptr<cairo_t, ContextDeleter> cr(cairo_create(surface.get()));
  SetColor(cr.get(), kWhite);
  cairo_paint(cr.get());
  for (size_t i = 0; i < panels.size(); ++i) {
    DrawPanel(cr.get(), kCdfPanelWidth * static_cast<double>(i), panels[i]);
  }
  if (const cairo_status_t drawn = cairo_status(cr.get()); drawn != CAIRO_STATUS_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("drawing the CDF plot failed: ", cairo_status_to_string(drawn)));
  }

  errno = 0;
  const cairo_status_t written = cairo_surface_write_to_png(surface.get(), path.c_str());
  if (written != CAIRO_STATUS_SUCCESS) {
    // cairo says only "error while writing to output stream"; errno (fopen's or the failed
    // write's) says why.
    const int error = errno;
    return absl::UnavailableError(
        absl::StrCat("cannot write the CDF plot to ", path.string(), ": ",
                     error != 0 ? std::strerror(error) : cairo_status_to_string(written)));
  }
  return absl::OkStatus();
}

}  // namespace tophat::bench
