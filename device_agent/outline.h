// Outline-based parallel decoding (Jupiter §IV-C), the parts that are pure logic: finding an
// outline's points in its text, the text that asks for a point's expansion, and streaming
// the expansions in point order while they decode concurrently. The request flow is
// Agent::GenerateOutline (agent.cc).
//
// Lossy by design: the answer is the outline, then each point's marker and expansion, each
// expansion decoded from the prompt, the outline and its own marker only, not from the
// points before it. It is a different text from sequential decoding and is never on unless a
// request asks for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tophat {

struct OutlinePoint {
  std::string label;  // as the outline numbered it ("one", "1.")
  std::string text;   // what follows the label, up to the next label (trimmed)
};

// The points of `outline`: labels[0] at a word boundary, its text up to labels[1], and so
// on, each label found after the one before; the last point's text ends at `stop` (or at the
// end). At most `max_points`; the points end at the first label not found or the first
// point whose text is empty.
std::vector<OutlinePoint> ParseOutline(std::string_view outline,
                                       std::span<const std::string> labels,
                                       std::string_view stop, size_t max_points);

// `expand` with {label} and {point} replaced by the point's.
std::string ExpandMarker(std::string_view expand, const OutlinePoint& point);

// Streams several points' output in point order while they are produced concurrently: point
// 0's pieces go to the sink as they come; point i's are held until every point before it has
// finished, then go in one piece and the rest as they come. Thread-safe; the sink is called
// under the stream's lock, one piece at a time.
class InOrderStream {
 public:
  // Returns false to stop (the client went away): every later Push returns false too.
  using Sink = std::function<bool(std::span<const int32_t> token_ids, const std::string& text)>;
  InOrderStream(size_t points, Sink sink);

  // A piece of point `point`'s output; false once the sink has refused.
  bool Push(size_t point, std::span<const int32_t> token_ids, const std::string& text);
  // Point `point` has produced all it will.
  void Finish(size_t point);
  bool stopped() const;

 private:
  void FlushLocked();  // sends what the points up to the first unfinished one hold
  struct Held {
    std::vector<int32_t> token_ids;
    std::string text;
    bool finished = false;
  };
  mutable std::mutex mutex_;
  std::vector<Held> held_;  // under mutex_
  size_t current_ = 0;      // the point streaming now; all before it have finished
  bool stopped_ = false;
  Sink sink_;
};

}  // namespace tophat
