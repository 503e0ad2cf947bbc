#include "device_agent/outline.h"

#include <cctype>

namespace tophat {
namespace {

bool WordBoundaryAt(std::string_view text, size_t at) {
  return at == 0 || std::isspace(static_cast<unsigned char>(text[at - 1]));
}

// Where `label` next starts at a word boundary and ends at one, from `from`; npos if nowhere.
size_t FindLabel(std::string_view text, std::string_view label, size_t from) {
  for (size_t at = text.find(label, from); at != std::string_view::npos;
       at = text.find(label, at + 1)) {
    const size_t end = at + label.size();
    const bool ends_word = end == text.size() ||
                           std::isspace(static_cast<unsigned char>(text[end]));
    if (WordBoundaryAt(text, at) && ends_word) return at;
  }
  return std::string_view::npos;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<OutlinePoint> ParseOutline(std::string_view outline,
                                       std::span<const std::string> labels,
                                       std::string_view stop, size_t max_points) {
  // The outline is what comes before its stop; a label after it belongs to something else.
  std::string_view body = outline;
  const std::string_view stop_text = Trim(stop);
  if (!stop_text.empty()) {
    if (const size_t at = outline.find(stop_text); at != std::string_view::npos) {
      body = outline.substr(0, at);
    }
  }
  std::vector<OutlinePoint> points;
  const size_t count = std::min(labels.size(), max_points);
  size_t at = labels.empty() ? std::string_view::npos : FindLabel(body, labels[0], 0);
  for (size_t i = 0; i < count && at != std::string_view::npos; ++i) {
    const size_t text_start = at + labels[i].size();
    const size_t next =
        i + 1 < labels.size() ? FindLabel(body, labels[i + 1], text_start) : std::string_view::npos;
    const std::string_view text =
        Trim(body.substr(text_start, next == std::string_view::npos ? std::string_view::npos
                                                                    : next - text_start));
    if (text.empty()) break;
    points.push_back({.label = labels[i], .text = std::string(text)});
    at = next;
  }
  return points;
}

std::string ExpandMarker(std::string_view expand, const OutlinePoint& point) {
  std::string out;
  for (size_t i = 0; i < expand.size();) {
    if (expand.substr(i).starts_with("{label}")) {
      out += point.label;
      i += 7;
    } else if (expand.substr(i).starts_with("{point}")) {
      out += point.text;
      i += 7;
    } else {
      out += expand[i++];
    }
  }
  return out;
}

InOrderStream::InOrderStream(size_t points, Sink sink) : held_(points), sink_(std::move(sink)) {}

bool InOrderStream::Push(size_t point, std::span<const int32_t> token_ids,
                         const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_) return false;
  Held& held = held_.at(point);
  held.token_ids.insert(held.token_ids.end(), token_ids.begin(), token_ids.end());
  held.text += text;
  if (point == current_) FlushLocked();
  return !stopped_;
}

void InOrderStream::Finish(size_t point) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.at(point).finished = true;
  FlushLocked();
}

bool InOrderStream::stopped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopped_;
}

void InOrderStream::FlushLocked() {
  while (current_ < held_.size() && !stopped_) {
    Held& held = held_[current_];
    if (!held.token_ids.empty() || !held.text.empty()) {
      if (!sink_(held.token_ids, held.text)) stopped_ = true;
      held.token_ids.clear();
      held.text.clear();
    }
    if (!held.finished) break;
    ++current_;
  }
}

}  // namespace tophat
