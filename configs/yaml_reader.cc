#include "configs/yaml_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/strings.h"
#include "yaml-cpp/eventhandler.h"

namespace tophat {
namespace {

// Debian builds Abseil with its own string_view type, so std::string_view needs a bridge.
std::string_view TrimSpaces(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

// A config with more mistakes than this is the wrong file; listing them all helps nobody.
constexpr size_t kMaxReportedErrors = 20;

int LineOf(const YAML::Node& node) {
  // yaml-cpp marks are 0-based; a node without a mark (built in code) has line -1.
  const int line = node.Mark().line;
  return line < 0 ? 0 : line + 1;
}

// The value as the user wrote it, for "got ..." in messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar: {
      std::string text = node.Scalar();
      if (text.size() > 60) text = text.substr(0, 57) + "...";
      return absl::StrCat("\"", absl::CHexEscape(text), "\"");
    }
  }
  return "an unknown value";
}

std::string_view BoundWord(Bound bound) {
  switch (bound) {
    case Bound::kAny:
      return "";
    case Bound::kNonNegative:
      return "non-negative ";
    case Bound::kPositive:
      return "positive ";
  }
  return "";
}

template <typename T>
bool WithinBound(T value, Bound bound) {
  switch (bound) {
    case Bound::kAny:
      return true;
    case Bound::kNonNegative:
      return value >= 0;
    case Bound::kPositive:
      return value > 0;
  }
  return false;
}

bool ParseInt(std::string_view text, int64_t* out) {
  if (text.starts_with('+')) text.remove_prefix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool ParseFiniteDouble(std::string_view text, double* out) {
  if (text.starts_with('+')) text.remove_prefix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(*out);
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string JoinPath(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : absl::StrCat(Sv(prefix), ".", Sv(name));
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  const std::string_view original = text;
  auto invalid = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a byte size such as \"512MiB\", \"2GiB\" or \"1000000\", got \"",
                     absl::CHexEscape(Sv(original)), "\""));
  };
  text = TrimSpaces(text);
  const size_t unit_start = text.find_first_not_of("0123456789.");
  std::string_view number = text.substr(0, unit_start);
  const std::string_view unit = unit_start == std::string_view::npos
                                    ? std::string_view()
                                    : TrimSpaces(text.substr(unit_start));

  static const auto* const kUnits = new std::map<std::string_view, int64_t, std::less<>>{
      {"", 1},
      {"B", 1},
      {"KiB", int64_t{1} << 10},
      {"MiB", int64_t{1} << 20},
      {"GiB", int64_t{1} << 30},
      {"TiB", int64_t{1} << 40},
      {"KB", 1000},
      {"MB", 1000 * 1000},
      {"GB", int64_t{1000} * 1000 * 1000},
      {"TB", int64_t{1000} * 1000 * 1000 * 1000},
  };
  const auto found = kUnits->find(unit);
  if (found == kUnits->end()) return invalid();
  const int64_t multiplier = found->second;

  // Exact integer arithmetic: whole * multiplier + fraction_digits * multiplier / 10^n must
  // be a whole number of bytes, without going through a double.
  const size_t dot = number.find('.');
  const std::string_view whole_text = number.substr(0, dot);
  const std::string_view fraction_text =
      dot == std::string_view::npos ? std::string_view() : number.substr(dot + 1);
  if (whole_text.empty() || (dot != std::string_view::npos && fraction_text.empty()) ||
      fraction_text.find('.') != std::string_view::npos || fraction_text.size() > 12) {
    return invalid();
  }
  int64_t whole = 0;
  if (!ParseInt(whole_text, &whole)) return invalid();
  int64_t fraction = 0;
  int64_t scale = 1;
  if (!fraction_text.empty()) {
    if (!ParseInt(fraction_text, &fraction)) return invalid();
    for (size_t i = 0; i < fraction_text.size(); ++i) scale *= 10;
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (whole > kMax / multiplier) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte size \"", absl::CHexEscape(Sv(original)), "\" is too large"));
  }
  int64_t bytes = whole * multiplier;
  if (fraction != 0) {
    // fraction < scale <= 10^12 and multiplier <= 2^40 could overflow, so use 128 bits.
    const __int128 scaled = static_cast<__int128>(fraction) * multiplier;
    if (scaled % scale != 0) {
      return absl::InvalidArgumentError(absl::StrCat("byte size \"", absl::CHexEscape(Sv(original)),
                                                     "\" is not a whole number of bytes"));
    }
    const __int128 total = static_cast<__int128>(bytes) + scaled / scale;
    if (total > kMax) {
      return absl::InvalidArgumentError(
          absl::StrCat("byte size \"", absl::CHexEscape(Sv(original)), "\" is too large"));
    }
    bytes = static_cast<int64_t>(total);
  }
  return bytes;
}

std::string FormatByteSize(int64_t bytes) {
  static constexpr std::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024 && bytes > -1024) return absl::StrCat(bytes, " B");
  size_t unit = 0;
  double value = static_cast<double>(bytes);
  while (std::abs(value) >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  if (value == std::floor(value))
    return absl::StrCat(static_cast<int64_t>(value), " ", Sv(kUnits[unit]));
  return absl::StrFormat("%.1f %s", value, Sv(kUnits[unit]));
}

void ConfigErrors::Add(std::string_view key, int line, std::string_view message) {
  std::string text;
  if (source_.empty()) {
    text = absl::StrCat(Sv(key), ": ", Sv(message));
  } else if (line > 0) {
    text = absl::StrCat(source_, ":", line, ": ", Sv(key), ": ", Sv(message));
  } else if (key.empty()) {
    text = absl::StrCat(source_, ": ", Sv(message));
  } else {
    text = absl::StrCat(source_, ": ", Sv(key), ": ", Sv(message));
  }
  errors_.push_back({line, std::move(text)});
}

absl::Status ConfigErrors::ToStatus() const {
  if (errors_.empty()) return absl::OkStatus();
  std::vector<const Error*> sorted;
  sorted.reserve(errors_.size());
  for (const Error& error : errors_) sorted.push_back(&error);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Error* a, const Error* b) {
    // Line 0 (no line) sorts last.
    const unsigned a_line = static_cast<unsigned>(a->line - 1);
    const unsigned b_line = static_cast<unsigned>(b->line - 1);
    return a_line < b_line;
  });
  std::string message;
  for (size_t i = 0; i < sorted.size() && i < kMaxReportedErrors; ++i) {
    if (i > 0) message += "\n";
    message += sorted[i]->text;
  }
  if (sorted.size() > kMaxReportedErrors) {
    absl::StrAppend(&message, "\n(and ", sorted.size() - kMaxReportedErrors, " more errors)");
  }
  return absl::InvalidArgumentError(message);
}

namespace {

// Counts a stream's documents through yaml-cpp's event interface, and stops on the stream
// yaml-cpp 0.7 cannot leave. When a document's first token is one no node starts with (a ','
// after a document's node, or a '?' after a tagged block scalar), yaml-cpp's parser consumes
// nothing, reports an empty document and starts the next one on the same token: YAML::LoadAll then
// collects empty documents until memory runs out (found by fuzz/yaml_config_fuzzer three times: a
// ',' first, after an anchor, then in CI a stream whose input was not kept;
// fuzz/regressions/yaml_config/; fixed upstream after 0.8.0, jbeder/yaml-cpp#1319). Two documents
// starting at one position are exactly that loop: a document that consumes a token moves the next
// one's start past it. (Checked against YAML::LoadAll on 3,550 short streams of YAML's indicators:
// the 7% it hangs on are the ones flagged here, and no other.)
class DocumentScan final : public YAML::EventHandler {
 public:
  // The number of documents, or where the stream stalled.
  struct Result {
    int64_t documents = 0;
    std::optional<YAML::Mark> stalled_at;
  };

  // Throws what YAML::Parser throws on malformed YAML.
  static Result Run(const std::string& yaml) {
    std::istringstream stream(yaml);
    YAML::Parser parser(stream);
    DocumentScan scan;
    Result result;
    while (parser.HandleNextDocument(scan)) {
      ++result.documents;
      if (scan.stalled_) {
        result.stalled_at = scan.last_start_;
        break;
      }
    }
    return result;
  }

  void OnDocumentStart(const YAML::Mark& mark) override {
    stalled_ = started_ && mark.pos == last_start_.pos;
    started_ = true;
    last_start_ = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  bool started_ = false;
  bool stalled_ = false;
  YAML::Mark last_start_;
};

// The character at `pos` as a message shows it: itself when printable ASCII, else its byte.
std::string CharacterAt(std::string_view text, int pos) {
  if (pos < 0 || static_cast<size_t>(pos) >= text.size()) return "the end of the input";
  const auto c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  return absl::StrFormat("byte 0x%02x", c);
}

}  // namespace

YamlReader::YamlReader(const YAML::Node& root, std::string source_name)
    : root_(std::make_unique<YAML::Node>(root)),
      source_name_(source_name),
      errors_(std::move(source_name)) {}

absl::StatusOr<YamlReader> YamlReader::Parse(std::string_view yaml, std::string source_name) {
  // YAML allows no C0 control character but tab, LF and CR (YAML 1.2, section 5.1), and
  // yaml-cpp 0.7 does not check: a NUL inside an unclosed quoted scalar made it allocate
  // without end (found by fuzz/yaml_config_fuzzer; fuzz/regressions/yaml_config/).
  int64_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < yaml.size(); ++i) {
    const auto c = static_cast<unsigned char>(yaml[i]);
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    } else if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: invalid YAML (column %d): control character 0x%02x is not allowed",
          source_name, line, i - line_start + 1, c));
    }
  }
  const std::string text(yaml);
  YAML::Node root;
  try {
    const DocumentScan::Result scan = DocumentScan::Run(text);
    if (scan.stalled_at) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: invalid YAML (column %d): no node starts with %s here",
                          source_name, scan.stalled_at->line + 1, scan.stalled_at->column + 1,
                          CharacterAt(yaml, scan.stalled_at->pos)));
    }
    if (scan.documents > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": expected one YAML document, found ", scan.documents,
                       " (remove the extra '---' separators)"));
    }
    // YAML::Load builds the first document only, so the loop above cannot reach it.
    if (scan.documents == 1) root.reset(YAML::Load(text));
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", e.mark.line + 1,
                                                   ": invalid YAML (column ", e.mark.column + 1,
                                                   "): ", e.msg));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": invalid YAML: ", e.what()));
  }
  if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", LineOf(root),
                                                   ": expected a mapping of keys at the top "
                                                   "level, got ",
                                                   Describe(root)));
  }
  return YamlReader(root, std::move(source_name));
}

absl::StatusOr<YamlReader> YamlReader::Load(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(name, ": config file not found"));
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat(name, ": ", ec.message()));
  if (status.type() != std::filesystem::file_type::regular) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (in.bad() || !in.is_open()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot read the file"));
  }
  return Parse(text, name);
}

bool YamlReader::Lookup(std::string_view key, Entry* entry, std::string* not_a_map) const {
  YAML::Node map(*root_);
  std::string prefix;
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    // An empty section (`kv_cache:` with nothing under it) means all defaults.
    if (map.IsNull()) return false;
    if (!map.IsMap()) {
      *not_a_map = prefix;
      return false;
    }
    bool found = false;
    // Iterate rather than index: indexing a const node cannot tell us the key's mark, and
    // with duplicate keys (reported by Finish) the first one wins consistently.
    for (const auto& item : map) {
      if (item.first.IsScalar() && item.first.Scalar() == parts[i]) {
        // reset(), never operator=: assigning a YAML::Node overwrites the node it refers
        // to, inside the document.
        entry->key.reset(item.first);
        entry->value.reset(item.second);
        found = true;
        break;
      }
    }
    if (!found) return false;
    prefix = JoinPath(prefix, parts[i]);
    map.reset(entry->value);
  }
  return true;
}

bool YamlReader::Find(std::string_view key, Entry* entry) {
  known_.emplace(key);
  std::string not_a_map;
  if (Lookup(key, entry, &not_a_map)) return true;
  if (!not_a_map.empty()) {
    Entry section;
    std::string unused;
    Lookup(not_a_map, &section, &unused);
    TypeError(not_a_map, section, "a mapping");
  }
  return false;
}

void YamlReader::TypeError(std::string_view key, const Entry& entry, std::string_view expected) {
  AddError(key, absl::StrCat("expected ", Sv(expected), ", got ", Describe(entry.value)));
}

bool YamlReader::Has(std::string_view key) const {
  Entry entry;
  std::string unused;
  return Lookup(key, &entry, &unused);
}

int YamlReader::Line(std::string_view key) const {
  Entry entry;
  std::string unused;
  return Lookup(key, &entry, &unused) ? LineOf(entry.key) : 0;
}

void YamlReader::AddError(std::string_view key, std::string_view message,
                          std::string_view related_key) {
  if (!error_keys_.emplace(key).second) return;
  int line = Line(key);
  if (line == 0 && !related_key.empty()) line = Line(related_key);
  errors_.Add(key, line, message);
}

void YamlReader::ReadBool(std::string_view key, bool* out) {
  Entry entry;
  if (!Find(key, &entry)) return;
  if (entry.value.IsScalar()) {
    // YAML 1.2 core schema spellings only: yaml-cpp also takes y/n/on/off, which YAML 1.2
    // dropped because `country: no` turned into false.
    const std::string& text = entry.value.Scalar();
    if (text == "true" || text == "True" || text == "TRUE") {
      *out = true;
      return;
    }
    if (text == "false" || text == "False" || text == "FALSE") {
      *out = false;
      return;
    }
  }
  TypeError(key, entry, "true or false");
}

void YamlReader::ReadInt(std::string_view key, int64_t* out, Bound bound) {
  Entry entry;
  if (!Find(key, &entry)) return;
  int64_t value = 0;
  if (entry.value.IsScalar() && ParseInt(entry.value.Scalar(), &value) &&
      WithinBound(value, bound)) {
    *out = value;
    return;
  }
  const std::string_view article = bound == Bound::kAny ? "an " : "a ";
  TypeError(key, entry, absl::StrCat(Sv(article), Sv(BoundWord(bound)), "integer"));
}

void YamlReader::ReadDouble(std::string_view key, double* out, Bound bound) {
  Entry entry;
  if (!Find(key, &entry)) return;
  double value = 0;
  if (entry.value.IsScalar() && ParseFiniteDouble(entry.value.Scalar(), &value) &&
      WithinBound(value, bound)) {
    *out = value;
    return;
  }
  TypeError(key, entry, absl::StrCat("a ", Sv(BoundWord(bound)), "number"));
}

void YamlReader::ReadSeconds(std::string_view key, double* out, Bound bound) {
  Entry entry;
  if (!Find(key, &entry)) return;
  double value = 0;
  if (entry.value.IsScalar() && ParseFiniteDouble(entry.value.Scalar(), &value) &&
      WithinBound(value, bound)) {
    *out = value;
    return;
  }
  TypeError(key, entry, absl::StrCat("a ", Sv(BoundWord(bound)), "number of seconds"));
}

void YamlReader::ReadString(std::string_view key, std::string* out) {
  Entry entry;
  if (!Find(key, &entry)) return;
  if (entry.value.IsScalar()) {
    *out = entry.value.Scalar();
    return;
  }
  TypeError(key, entry,
            entry.value.IsNull() ? "a string (write \"\" for an empty one)" : "a string");
}

void YamlReader::ReadStringList(std::string_view key, std::vector<std::string>* out) {
  Entry entry;
  if (!Find(key, &entry)) return;
  if (!entry.value.IsSequence()) {
    TypeError(key, entry, "a list of strings");
    return;
  }
  std::vector<std::string> values;
  size_t i = 0;
  for (const YAML::Node& item : entry.value) {
    if (!item.IsScalar()) {
      // Name the item's own line: a block sequence puts items below the key.
      errors_.Add(absl::StrCat(Sv(key), "[", i, "]"), LineOf(item),
                  absl::StrCat("expected a string, got ", Describe(item)));
      error_keys_.emplace(key);
      return;
    }
    values.push_back(item.Scalar());
    ++i;
  }
  *out = std::move(values);
}

void YamlReader::ReadByteSize(std::string_view key, int64_t* out, Bound bound) {
  Entry entry;
  if (!Find(key, &entry)) return;
  if (!entry.value.IsScalar()) {
    TypeError(key, entry, "a byte size such as \"512MiB\"");
    return;
  }
  absl::StatusOr<int64_t> bytes = ParseByteSize(entry.value.Scalar());
  if (!bytes.ok()) {
    AddError(key, std::string(bytes.status().message()));
    return;
  }
  if (!WithinBound(*bytes, bound)) {
    TypeError(key, entry, absl::StrCat("a ", Sv(BoundWord(bound)), "byte size"));
    return;
  }
  *out = *bytes;
}

void YamlReader::CheckUnknown(const YAML::Node& map, const std::string& prefix) {
  std::map<std::string, int, std::less<>> seen;  // key -> first line
  for (const auto& item : map) {
    if (!item.first.IsScalar()) {
      errors_.Add(prefix.empty() ? "(top level)" : prefix, LineOf(item.first),
                  absl::StrCat("keys must be plain strings, got ", Describe(item.first)));
      continue;
    }
    const std::string& name = item.first.Scalar();
    const std::string path = JoinPath(prefix, name);
    const int line = LineOf(item.first);
    if (auto [it, inserted] = seen.emplace(name, line); !inserted) {
      errors_.Add(path, line, absl::StrCat("duplicate key (first set on line ", it->second, ")"));
      continue;
    }
    // A key containing '.' is never valid: nesting is written as mappings. Checking it
    // explicitly keeps `kv_cache.block_size: 8` at the top level from matching the known
    // path "kv_cache.block_size" and being silently ignored.
    const bool dotted = name.find('.') != std::string::npos;
    const bool known = !dotted && known_.contains(path);
    const auto child = known_.lower_bound(path + ".");
    const bool has_known_children =
        !dotted && child != known_.end() && child->starts_with(path + ".");
    if (known || has_known_children) {
      if (has_known_children && item.second.IsMap()) CheckUnknown(item.second, path);
      continue;
    }
    std::string message = "unknown key";
    if (dotted) {
      absl::StrAppend(&message, " (nested keys are written as mappings, not dotted names)");
    } else if (std::string suggestion = ClosestSibling(prefix, name); !suggestion.empty()) {
      absl::StrAppend(&message, " (did you mean '", suggestion, "'?)");
    }
    errors_.Add(path, line, message);
  }
}

std::string YamlReader::ClosestSibling(std::string_view prefix, std::string_view name) const {
  std::string suggestion;
  size_t best = std::max<size_t>(2, name.size() / 4) + 1;  // typos, not different words
  const std::string sibling_prefix = prefix.empty() ? "" : absl::StrCat(Sv(prefix), ".");
  for (const std::string& candidate : known_) {
    if (!candidate.starts_with(sibling_prefix)) continue;
    std::string_view sibling = std::string_view(candidate).substr(sibling_prefix.size());
    sibling = sibling.substr(0, sibling.find('.'));
    if (const size_t distance = EditDistance(name, sibling); distance < best) {
      best = distance;
      suggestion = std::string(sibling);
    }
  }
  return suggestion;
}

namespace {

void CollectValues(const YAML::Node& map, const std::string& prefix,
                   std::map<std::string, std::string>* values) {
  for (const auto& item : map) {
    if (!item.first.IsScalar()) continue;
    const std::string path = JoinPath(prefix, item.first.Scalar());
    const YAML::Node& value = item.second;
    if (value.IsMap()) {
      CollectValues(value, path, values);
    } else if (value.IsScalar()) {
      (*values)[path] = value.Scalar();
    } else {
      YAML::Emitter flow;
      flow.SetSeqFormat(YAML::Flow);
      flow.SetMapFormat(YAML::Flow);
      flow << value;
      (*values)[path] = flow.c_str();
    }
  }
}

}  // namespace

std::map<std::string, std::string> YamlReader::Values() const {
  std::map<std::string, std::string> values;
  if (root_->IsMap()) CollectValues(*root_, "", &values);
  return values;
}

std::vector<std::string> ChangedConfigKeys(const std::map<std::string, std::string>& before,
                                           const std::map<std::string, std::string>& after) {
  std::vector<std::string> changed;
  auto old_value = before.begin();
  auto new_value = after.begin();
  // Both maps are sorted by key: one merge pass.
  while (old_value != before.end() || new_value != after.end()) {
    if (new_value == after.end() ||
        (old_value != before.end() && old_value->first < new_value->first)) {
      changed.push_back((old_value++)->first);
    } else if (old_value == before.end() || new_value->first < old_value->first) {
      changed.push_back((new_value++)->first);
    } else {
      if (old_value->second != new_value->second) changed.push_back(old_value->first);
      ++old_value;
      ++new_value;
    }
  }
  return changed;
}

std::vector<std::string> KeysAwaitingRestart(const std::map<std::string, std::string>& before,
                                             const std::map<std::string, std::string>& after,
                                             std::span<const std::string_view> reloaded) {
  std::vector<std::string> waiting;
  for (std::string& key : ChangedConfigKeys(before, after)) {
    if (std::find(reloaded.begin(), reloaded.end(), key) == reloaded.end()) {
      waiting.push_back(std::move(key));
    }
  }
  return waiting;
}

absl::Status YamlReader::Finish() {
  CheckUnknown(*root_, "");
  return errors_.ToStatus();
}

}  // namespace tophat
