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

// The series' labels with their colours' swatches, in a box in a corner of the plot area:
// its lower right (`top` false) or upper left (`top` true, x from `left`).
void DrawLegend(cairo_t* cr, const std::vector<std::string>& labels, double left, double right,
                double top, double bottom, bool upper_left) {
  if (labels.empty()) return;
  constexpr double kPadding = 7, kSwatchWidth = 20, kRowHeight = 16;
  SetFont(cr, kTickSize);
  double widest_label = 0;
  for (const std::string& label : labels) widest_label = std::max(widest_label, TextWidth(cr, label));
  const double width = std::ceil(kPadding + kSwatchWidth + kPadding + widest_label + kPadding);
  const double height = kPadding + kRowHeight * static_cast<double>(labels.size()) + 2;
  const double x0 = upper_left ? left + 10 : right - 10 - width;
  const double y0 = upper_left ? top + 10 : bottom - 10 - height;
  cairo_rectangle(cr, x0 + 0.5, y0 + 0.5, width, height);
  SetColor(cr, kWhite);
  cairo_fill_preserve(cr);
  SetColor(cr, kLegendBorder);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t i = 0; i < labels.size(); ++i) {
    const double row_top = y0 + kPadding + kRowHeight * static_cast<double>(i);
    SetColor(cr, CdfSeriesColor(i));
    cairo_rectangle(cr, x0 + kPadding, row_top + 5, kSwatchWidth, 4);
    cairo_fill(cr);
    SetColor(cr, kInk);
    ShowText(cr, labels[i], x0 + 2 * kPadding + kSwatchWidth, row_top + 11);
  }
}

// The frame, title, x label and y label (rotated) of a panel whose plot area is
// [left, right] x [top, bottom].
void DrawFrameAndLabels(cairo_t* cr, double origin_x, double left, double right, double top,
                        double bottom, const std::string& title, const std::string& x_label,
                        const std::string& y_label) {
  SetColor(cr, kInk);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, std::round(left) + 0.5, std::round(top) + 0.5,
                  std::round(right) - std::round(left), std::round(bottom) - std::round(top));
  cairo_stroke(cr);
  // Titles take the larger type, shrunk if they would spill into the neighbouring panel.
  const double center_x = (left + right) / 2;
  const double title_room = 2 * (origin_x + kCdfPanelWidth - 6 - center_x);
  SetFont(cr, kTitleSize, /*bold=*/true);
  if (const double width = TextWidth(cr, title); width > title_room) {
    SetFont(cr, kTitleSize * title_room / width, /*bold=*/true);
  }
  ShowText(cr, title, center_x, 26, /*align=*/0.5);
  SetFont(cr, kLabelSize);
  ShowText(cr, x_label, center_x, bottom + 40, /*align=*/0.5);
  cairo_save(cr);
  cairo_translate(cr, origin_x + 18, (top + bottom) / 2);
  cairo_rotate(cr, -std::numbers::pi / 2);
  ShowText(cr, y_label, 0, 0, /*align=*/0.5);
  cairo_restore(cr);
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
  DrawFrameAndLabels(cr, origin_x, left, right, top, bottom, panel.title, panel.x_label,
                     "share of requests within the bound");
  for (size_t i = 0; i < panel.series.size(); ++i) {
    DrawStepCurve(cr, panel.series[i].values, CdfSeriesColor(i), to_x, to_y, right);
  }
  // Lower right: a CDF rises early toward 1, so the region of large bounds and low shares is
  // where curves seldom go.
  std::vector<std::string> labels;
  for (const CdfSeries& series : panel.series) labels.push_back(series.label);
  DrawLegend(cr, labels, left, right, top, bottom, /*upper_left=*/false);
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

// Whole decades [10^low, 10^high] around positive values from `smallest` to `largest`.
struct LogAxis {
  int low = 0;
  int high = 1;
};

LogAxis ChooseLogAxis(double smallest, double largest) {
  LogAxis axis;
  axis.low = static_cast<int>(std::floor(std::log10(smallest) + 1e-9));
  axis.high = static_cast<int>(std::ceil(std::log10(largest) - 1e-9));
  if (axis.high <= axis.low) axis.high = axis.low + 1;
  return axis;
}

std::string DecadeLabel(int exponent) {
  return exponent >= 0 ? absl::StrFormat("%.0f", std::pow(10.0, exponent))
                       : absl::StrFormat("%.*f", -exponent, std::pow(10.0, exponent));
}

void DrawLinePanel(cairo_t* cr, double origin_x, const LinePanel& panel) {
  const double left = origin_x + kPlotLeft, right = origin_x + kPlotRight;
  const double top = kPlotTop, bottom = kPlotBottom;
  double min_x = 0, max_x = 0, min_y = 0, max_y = 0;
  bool any = false;
  for (const LineSeries& series : panel.series) {
    for (const auto& [x, y] : series.points) {
      min_x = any ? std::min(min_x, x) : x;
      max_x = any ? std::max(max_x, x) : x;
      min_y = any ? std::min(min_y, y) : y;
      max_y = any ? std::max(max_y, y) : y;
      any = true;
    }
  }
  if (!any) min_x = max_x = min_y = max_y = 1;
  const LogAxis x_axis = ChooseLogAxis(min_x, max_x);
  const auto to_x = [&](double x) {
    return left + (std::log10(x) - x_axis.low) / (x_axis.high - x_axis.low) * (right - left);
  };
  const LogAxis y_log = ChooseLogAxis(std::max(min_y, 1e-300), std::max(max_y, 1e-300));
  const XAxis y_linear = ChooseXAxis(max_y);
  const auto to_y = [&](double y) {
    const double share = panel.log_y
                             ? (std::log10(y) - y_log.low) / (y_log.high - y_log.low)
                             : y / y_linear.max;
    return bottom - share * (bottom - top);
  };

  // x: a labelled tick at each decade, grid lines at its 2..9 multiples too.
  SetFont(cr, kTickSize);
  for (int e = x_axis.low; e <= x_axis.high; ++e) {
    const double x = to_x(std::pow(10.0, e));
    HairLine(cr, x, top, x, bottom, kGrid);
    HairLine(cr, x, bottom, x, bottom + 4, kInk);
    SetColor(cr, kInk);
    ShowText(cr, DecadeLabel(e), std::round(x) + 0.5, bottom + 18, /*align=*/0.5);
    for (int m = 2; e < x_axis.high && m <= 9; ++m) {
      const double minor = to_x(m * std::pow(10.0, e));
      HairLine(cr, minor, top, minor, bottom, kGrid);
    }
  }
  if (panel.log_y) {
    for (int e = y_log.low; e <= y_log.high; ++e) {
      const double y = to_y(std::pow(10.0, e));
      HairLine(cr, left, y, right, y, kGrid);
      HairLine(cr, left - 4, y, left, y, kInk);
      SetColor(cr, kInk);
      ShowText(cr, DecadeLabel(e), left - 7, std::round(y) + 4.5, /*align=*/1);
      for (int m = 2; e < y_log.high && m <= 9; ++m) {
        const double minor = to_y(m * std::pow(10.0, e));
        HairLine(cr, left, minor, right, minor, kGrid);
      }
    }
  } else {
    const int ticks = static_cast<int>(std::lround(y_linear.max / y_linear.step));
    for (int i = 0; i <= ticks; ++i) {
      const double y = to_y(i * y_linear.step);
      HairLine(cr, left, y, right, y, kGrid);
      HairLine(cr, left - 4, y, left, y, kInk);
      SetColor(cr, kInk);
      ShowText(cr, absl::StrFormat("%.*f", y_linear.decimals, i * y_linear.step), left - 7,
               std::round(y) + 4.5, /*align=*/1);
    }
  }
  DrawFrameAndLabels(cr, origin_x, left, right, top, bottom, panel.title, panel.x_label,
                     panel.y_label);
  for (size_t i = 0; i < panel.series.size(); ++i) {
    std::vector<std::pair<double, double>> points = panel.series[i].points;
    if (points.empty()) continue;
    std::sort(points.begin(), points.end());
    SetColor(cr, CdfSeriesColor(i));
    cairo_set_line_width(cr, kCurveWidth);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_move_to(cr, to_x(points.front().first), to_y(points.front().second));
    for (const auto& [x, y] : points) cairo_line_to(cr, to_x(x), to_y(y));
    cairo_stroke(cr);
    for (const auto& [x, y] : points) {
      cairo_arc(cr, to_x(x), to_y(y), 3.5, 0, 2 * std::numbers::pi);
      cairo_fill(cr);
    }
  }
  // Upper left: the lines here rise with the scale, toward the upper right.
  std::vector<std::string> labels;
  for (const LineSeries& series : panel.series) labels.push_back(series.label);
  DrawLegend(cr, labels, left, right, top, bottom, /*upper_left=*/true);
}

absl::Status ValidatePanels(std::span<const LinePanel> panels) {
  if (panels.empty()) return absl::InvalidArgumentError("a line plot needs at least one panel");
  for (const LinePanel& panel : panels) {
    for (const LineSeries& series : panel.series) {
      for (size_t i = 0; i < series.points.size(); ++i) {
        const auto [x, y] = series.points[i];
        if (std::isfinite(x) && std::isfinite(y) && x > 0 && (panel.log_y ? y > 0 : y >= 0)) {
          continue;
        }
        return absl::InvalidArgumentError(absl::StrFormat(
            "line panel \"%s\", series \"%s\": point #%d is (%g, %g), but x must be finite and "
            "positive (a logarithmic axis) and y finite and %s",
            panel.title, series.label, i, x, y,
            panel.log_y ? "positive (a logarithmic axis)" : "non-negative"));
      }
    }
  }
  return absl::OkStatus();
}

// Draws `count` panels side by side (`draw(cr, origin_x, i)`) and writes them as a PNG.
template <typename Draw>
absl::Status WritePanelsPng(const std::filesystem::path& path, size_t count, const char* what,
                            Draw draw) {
  const std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(cairo_image_surface_create(
      CAIRO_FORMAT_RGB24, kCdfPanelWidth * static_cast<int>(count), kCdfPanelHeight));
  const std::unique_ptr<cairo_t, ContextDeleter> cr(cairo_create(surface.get()));
  SetColor(cr.get(), kWhite);
  cairo_paint(cr.get());
  for (size_t i = 0; i < count; ++i) draw(cr.get(), kCdfPanelWidth * static_cast<double>(i), i);
  if (const cairo_status_t drawn = cairo_status(cr.get()); drawn != CAIRO_STATUS_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("drawing the ", what, " failed: ", cairo_status_to_string(drawn)));
  }

  errno = 0;
  const cairo_status_t written = cairo_surface_write_to_png(surface.get(), path.c_str());
  if (written != CAIRO_STATUS_SUCCESS) {
    // cairo says only "error while writing to output stream"; errno (fopen's or the failed
    // write's) says why.
    const int error = errno;
    return absl::UnavailableError(
        absl::StrCat("cannot write the ", what, " to ", path.string(), ": ",
                     error != 0 ? std::strerror(error) : cairo_status_to_string(written)));
  }
  return absl::OkStatus();
}

}  // namespace

Rgb CdfSeriesColor(size_t index) { return kPalette[index % std::size(kPalette)]; }

absl::Status WriteCdfPlotPng(const std::filesystem::path& path, std::span<const CdfPanel> panels) {
  if (absl::Status status = ValidatePanels(panels); !status.ok()) return status;
  return WritePanelsPng(path, panels.size(), "CDF plot",
                        [&](cairo_t* cr, double origin_x, size_t i) {
                          DrawPanel(cr, origin_x, panels[i]);
                        });
}

absl::Status WriteLinePlotPng(const std::filesystem::path& path,
                              std::span<const LinePanel> panels) {
  if (absl::Status status = ValidatePanels(panels); !status.ok()) return status;
  return WritePanelsPng(path, panels.size(), "line plot",
                        [&](cairo_t* cr, double origin_x, size_t i) {
                          DrawLinePanel(cr, origin_x, panels[i]);
                        });
}

}  // namespace tophat::bench
