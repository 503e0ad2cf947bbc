#include "models/grammar/schema_grammar.h"

#include <algorithm>
#include <limits>
#include <optional>

namespace tophat {
namespace {

bool IsWhitespace(unsigned char byte) {
  return byte == ' ' || byte == '\t' || byte == '\n' || byte == '\r';
}

// The bounds of a number's magnitude given its sign: nullptr where there is none; possible
// false when no number of that sign is within the bounds.
struct DecimalMagnitudes {
  const SchemaNode::DecimalBound* low = nullptr;
  const SchemaNode::DecimalBound* high = nullptr;
  bool possible = true;
};

bool IsZero(const SchemaNode::DecimalBound& bound) {
  return bound.integer == "0" && bound.fraction.empty();
}

DecimalMagnitudes MagnitudesOf(const SchemaNode& node, bool negative) {
  const SchemaNode::DecimalBound& lo = node.number_minimum;
  const SchemaNode::DecimalBound& hi = node.number_maximum;
  DecimalMagnitudes m;
  if (!negative) {  // lo <= value <= hi, value >= 0
    if (lo.set && !lo.negative && !IsZero(lo)) m.low = &lo;
    if (hi.set) {
      m.possible = !hi.negative;
      m.high = &hi;
    }
  } else {  // lo <= -magnitude <= hi: |hi| <= magnitude (hi < 0), magnitude <= |lo| (lo <= 0)
    if (hi.set && hi.negative) m.low = &hi;
    if (lo.set) {
      m.possible = lo.negative || IsZero(lo);
      m.high = &lo;
    }
  }
  return m;
}

int8_t Order(unsigned char a, unsigned char b) { return a < b ? -1 : a > b ? 1 : 0; }

// The order of an integer part of `digits` digits whose digits compare as `cmp` with the
// bound's first ones, against the bound's whole integer part (neither has leading zeros).
int8_t IntegerOrder(size_t digits, int8_t cmp, const SchemaNode::DecimalBound& bound) {
  if (digits != bound.integer.size()) return digits < bound.integer.size() ? -1 : 1;
  return cmp;
}

}  // namespace

SchemaGrammar::SchemaGrammar(const CompiledSchema* schema)
    : schema_(schema), expected_(schema->root()) {}

SchemaGrammar::SchemaGrammar(const CompiledSchema* schema, int32_t node, uint8_t base_depth,
                             int8_t first_key)
    : schema_(schema), base_depth_(base_depth), first_key_(first_key), expected_(node) {}

SchemaGrammar& SchemaGrammar::operator=(const SchemaGrammar& other) {
  schema_ = other.schema_;
  phase_ = other.phase_;
  depth_ = other.depth_;
  base_depth_ = other.base_depth_;
  first_key_ = other.first_key_;
  whitespace_ = other.whitespace_;
  integer_ = other.integer_;
  expected_ = other.expected_;
  trie_ = other.trie_;
  leaf_ = other.leaf_;
  chars_ = other.chars_;
  key_escape_ = other.key_escape_;
  negative_ = other.negative_;
  digits_ = other.digits_;
  bounded_number_ = other.bounded_number_;
  point_ = other.point_;
  leading_zero_ = other.leading_zero_;
  fraction_digits_ = other.fraction_digits_;
  cmp_low_ = other.cmp_low_;
  cmp_high_ = other.cmp_high_;
  multiple_ = other.multiple_;
  magnitude_ = other.magnitude_;
  pattern_state_ = other.pattern_state_;
  pattern_escape_ = other.pattern_escape_;
  // Only the frames in use: the frames above them are never read (and compare as unused).
  std::copy_n(other.frames_.begin(), other.depth_, frames_.begin());
  alternatives_ = other.alternatives_;
  return *this;
}

bool SchemaGrammar::operator==(const SchemaGrammar& other) const {
  return schema_ == other.schema_ && phase_ == other.phase_ && depth_ == other.depth_ &&
         whitespace_ == other.whitespace_ && integer_ == other.integer_ &&
         expected_ == other.expected_ && trie_ == other.trie_ && leaf_ == other.leaf_ &&
         chars_ == other.chars_ && key_escape_ == other.key_escape_ &&
         negative_ == other.negative_ && digits_ == other.digits_ &&
         bounded_number_ == other.bounded_number_ && point_ == other.point_ &&
         leading_zero_ == other.leading_zero_ && fraction_digits_ == other.fraction_digits_ &&
         cmp_low_ == other.cmp_low_ && cmp_high_ == other.cmp_high_ &&
         multiple_ == other.multiple_ && magnitude_ == other.magnitude_ &&
         pattern_state_ == other.pattern_state_ && pattern_escape_ == other.pattern_escape_ &&
         base_depth_ == other.base_depth_ && first_key_ == other.first_key_ &&
         std::equal(frames_.begin(), frames_.begin() + depth_, other.frames_.begin()) &&
         alternatives_ == other.alternatives_;
}

bool SchemaGrammar::can_end() const {
  if (complete()) return true;
  if (depth_ != 0) return false;
  if (phase_ == Phase::kLeaf) {
    return leaf_.number_could_end() && DecimalWithinBounds() && MultipleHolds();
  }
  return phase_ == Phase::kEnum && Node(expected_).enum_trie.nodes[static_cast<size_t>(trie_)]
                                           .terminal >= 0;
}

bool SchemaGrammar::in_string() const {
  switch (phase_) {
    case Phase::kLeaf:
      // A pattern's string is walked whole: its characters are not all taken.
      return leaf_.in_string() && pattern_state_ < 0;
    case Phase::kKeyString:
      // Off the declared names, any undeclared key takes any character.
      return trie_ < 0 && UndeclaredMayCome(top()) && leaf_.in_string();
    case Phase::kAlternatives:
      return std::all_of(alternatives_.begin(), alternatives_.end(),
                         [](const SchemaGrammar& g) { return g.in_string(); });
    default:
      return false;
  }
}

int64_t SchemaGrammar::string_room() const {
  if (phase_ == Phase::kAlternatives) {
    int64_t room = 0;
    for (const SchemaGrammar& g : alternatives_) room = std::max(room, g.string_room());
    return room;
  }
  if (phase_ == Phase::kLeaf && expected_ != SchemaNode::kNone) {
    const SchemaNode& node = Node(expected_);
    if (node.max_length >= 0) return node.max_length - chars_;
  }
  return std::numeric_limits<int64_t>::max();
}

bool SchemaGrammar::DecimalMayReachBounds() const {
  if (!bounded_number_) return true;
  const DecimalMagnitudes m = MagnitudesOf(Node(expected_), negative_);
  if (!m.possible) return false;
  if (digits_ == 0) return true;  // a lone '-': the magnitudes of that sign are not empty
  if (point_) {
    // Digits so far x with f fraction digits reach [x, x + 10^-f): some of it is within
    // [low, high] when x <= high and x + 10^-f > low.
    return (m.high == nullptr || cmp_high_ <= 0) && (m.low == nullptr || cmp_low_ >= 0);
  }
  // Integer digits v (n of them) reach [v 10^k, (v + 1) 10^k) with an integer part of
  // N = n + k digits, for every k >= 0 (only k = 0 after a leading 0). The smallest N whose
  // range ends past low, if its range starts at or below high (a larger N starts higher).
  const size_t n = digits_;
  size_t first = n;
  if (m.low != nullptr) {
    const size_t low_digits = m.low->integer.size();
    if (n < low_digits) first = cmp_low_ >= 0 ? low_digits : low_digits + 1;
    if (n == low_digits && cmp_low_ < 0) first = n + 1;
  }
  if (leading_zero_ && first != n) return false;
  if (m.high == nullptr) return true;
  const size_t high_digits = m.high->integer.size();
  return first < high_digits || (first == high_digits && cmp_high_ <= 0);
}

bool SchemaGrammar::DecimalWithinBounds() const {
  if (!bounded_number_) return true;
  if (digits_ == 0) return false;  // a lone '-' is no number
  const DecimalMagnitudes m = MagnitudesOf(Node(expected_), negative_);
  if (!m.possible) return false;
  if (m.low != nullptr) {
    const int8_t order = point_ ? cmp_low_ : IntegerOrder(digits_, cmp_low_, *m.low);
    // Equal so far: below low if low has more (nonzero) fraction digits.
    if (order < 0 || (order == 0 && m.low->fraction.size() > fraction_digits_)) return false;
  }
  if (m.high != nullptr) {
    const int8_t order = point_ ? cmp_high_ : IntegerOrder(digits_, cmp_high_, *m.high);
    if (order > 0) return false;
  }
  return true;
}

void SchemaGrammar::CountDecimalByte(unsigned char byte) {
  const DecimalMagnitudes m = MagnitudesOf(Node(expected_), negative_);
  if (byte == '-') {
    negative_ = true;
    return;
  }
  if (byte == '.') {
    point_ = true;
    if (m.low != nullptr) cmp_low_ = IntegerOrder(digits_, cmp_low_, *m.low);
    if (m.high != nullptr) cmp_high_ = IntegerOrder(digits_, cmp_high_, *m.high);
    return;
  }
  if (point_) {
    // A fraction digit against the bounds' digit at its place (0 past their last).
    const auto place = [&](const SchemaNode::DecimalBound& bound) -> unsigned char {
      return fraction_digits_ < bound.fraction.size() ? bound.fraction[fraction_digits_] : '0';
    };
    if (m.low != nullptr && cmp_low_ == 0) cmp_low_ = Order(byte, place(*m.low));
    if (m.high != nullptr && cmp_high_ == 0) cmp_high_ = Order(byte, place(*m.high));
    if (fraction_digits_ < UINT16_MAX) ++fraction_digits_;
    return;
  }
  if (digits_ == 0 && byte == '0') leading_zero_ = true;
  if (m.low != nullptr && cmp_low_ == 0 && digits_ < m.low->integer.size()) {
    cmp_low_ = Order(byte, m.low->integer[digits_]);
  }
  if (m.high != nullptr && cmp_high_ == 0 && digits_ < m.high->integer.size()) {
    cmp_high_ = Order(byte, m.high->integer[digits_]);
  }
  if (digits_ < UINT16_MAX) ++digits_;
}

std::optional<SchemaGrammar::PatternCursor> SchemaGrammar::pattern_cursor() const {
  if (phase_ != Phase::kLeaf || pattern_state_ < 0 || pattern_escape_ || !leaf_.in_string()) {
    return std::nullopt;
  }
  const SchemaNode& node = Node(expected_);
  return PatternCursor{.pattern = node.pattern.get(),
                       .lengths = node.pattern_lengths.get(),
                       .state = pattern_state_,
                       .chars = chars_};
}

void SchemaGrammar::CountMultipleByte(unsigned char byte) {
  if (byte == '-') {
    negative_ = true;
    return;
  }
  if (byte < '0' || byte > '9') return;  // an integer has nothing else
  // No overflow: a multipleOf's bounds lie within +-2^53 (json_schema.cc, FillMultiple), and
  // a digit past them is refused before the next, so it stays below 2^53 * 10 + 9.
  magnitude_ = magnitude_ * 10 + static_cast<uint64_t>(byte - '0');
}

bool SchemaGrammar::MultipleHolds() const {
  return !multiple_ || magnitude_ % static_cast<uint64_t>(Node(expected_).multiple_of) == 0;
}

bool SchemaGrammar::MultipleMayBeReached() const {
  // A multipleOf's node is always bounded on both sides (within +-2^53, FillMultiple).
  const SchemaNode& node = Node(expected_);
  const __int128 low = node.minimum;
  const __int128 high = node.maximum;
  const __int128 k = node.multiple_of;
  // Whether [from, to], within the bounds, holds a multiple.
  const auto holds_multiple = [&](__int128 from, __int128 to) {
    from = std::max(from, low);
    to = std::min(to, high);
    if (from > to) return false;
    __int128 first = from / k * k;  // truncated toward zero: at or below `from` when positive
    if (first < from) first += k;
    return first <= to;
  };
  if (digits_ == 0) {  // a lone '-': any number at or below 0
    return holds_multiple(low, 0);
  }
  // The digits so far (magnitude p) go on to [p 10^n, (p + 1) 10^n - 1] for each n more
  // digits (none after a leading 0), until past the bounds' 16 digits.
  const __int128 p = magnitude_;
  __int128 scale = 1;
  for (int n = 0; n <= 17; ++n) {
    const __int128 from = p * scale;
    const __int128 to = from + scale - 1;
    if (negative_ ? holds_multiple(-to, -from) : holds_multiple(from, to)) return true;
    if (leading_zero_) break;
    scale *= 10;
  }
  return false;
}

bool SchemaGrammar::PatternByte(const SchemaNode& node, unsigned char byte) {
  const StringPattern& pattern = *node.pattern;
  // With a length, a character is taken only where a match of an allowed length can follow.
  const auto reachable = [&](int32_t state, int64_t written) {
    return node.pattern_lengths == nullptr || node.pattern_lengths->Reachable(state, written);
  };
  unsigned char decoded = byte;
  if (pattern_escape_) {
    pattern_escape_ = false;
    switch (byte) {
      case '"':
      case '\\':
      case '/':
        break;
      case 'b': decoded = '\b'; break;
      case 'f': decoded = '\f'; break;
      case 'n': decoded = '\n'; break;
      case 'r': decoded = '\r'; break;
      case 't': decoded = '\t'; break;
      default:
        return false;  // \u: its characters are written as they are (the others have none)
    }
  } else if (byte == '\\') {
    // Only where a character some escape stands for can come: the walk must go on.
    pattern_escape_ = true;
    for (const unsigned char escaped : {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'}) {
      const int32_t next = pattern.Next(pattern_state_, escaped);
      if (next != StringPattern::kDead && reachable(next, chars_ + 1)) return true;
    }
    return false;
  } else if (byte == '"') {
    return pattern.Accepts(pattern_state_);  // the close
  }
  // chars_ is the grammar's own count (leaf_ moves it on), so the cursor's is dropped.
  PatternCursor cursor{.pattern = &pattern,
                       .lengths = node.pattern_lengths.get(),
                       .state = pattern_state_,
                       .chars = chars_};
  if (!cursor.Feed(decoded)) return false;
  pattern_state_ = cursor.state;
  return true;
}

bool SchemaGrammar::Fits(int32_t node) const {
  return node != SchemaNode::kNone && Depth() + Node(node).min_depth <= kMaxDepth;
}

bool SchemaGrammar::KeyMayCome(const Frame& frame) const {
  return KeysLeft(frame) != 0 || UndeclaredMayCome(frame);
}

bool SchemaGrammar::FirstKeyPending(const Frame& frame) const {
  return first_key_ >= 0 && &frame == &frames_[0] && frame.seen == 0;
}

uint64_t SchemaGrammar::KeysLeft(const Frame& frame) const {
  // The discriminator is required, so its value fits.
  return FirstKeyPending(frame) ? uint64_t{1} << first_key_ : frame.open & ~frame.seen;
}

bool SchemaGrammar::UndeclaredMayCome(const Frame& frame) const {
  return frame.additional && !FirstKeyPending(frame);
}

bool SchemaGrammar::ItemMayCome(const Frame& frame) const {
  const SchemaNode& node = Node(frame.node);
  return (node.max_items < 0 || frame.count < node.max_items) && Fits(node.item(frame.count));
}

bool SchemaGrammar::Feed(std::string_view bytes) {
  for (const char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool SchemaGrammar::Feed(unsigned char byte) {
  // Inside a value. A number, or a numeric enum value, has no byte of its own that ends it:
  // a byte that cannot go on with it ends it and is read after it (the loop's second turn).
  switch (phase_) {
    case Phase::kLeaf: {
      if (leaf_.number_could_end() && !leaf_.NumberContinues(byte)) {
        if (!DecimalWithinBounds() || !MultipleHolds()) return false;
        EndValue();
        break;
      }
      if (integer_ && (byte == '.' || byte == 'e' || byte == 'E')) return false;
      // A number with bounds is written without an exponent: its digits are compared with
      // the bounds' place by place (an integer's have no fraction either, above).
      if (bounded_number_ && (byte == 'e' || byte == 'E')) return false;
      const SchemaNode& node = Node(expected_);
      const bool counted = node.limits_length() && leaf_.in_string();
      if (counted) {
        // Between characters: the close, or the next character.
        if (byte == '"' ? chars_ < node.min_length
                        : node.max_length >= 0 && chars_ >= node.max_length) {
          return false;
        }
      }
      if (pattern_state_ >= 0 && !PatternByte(node, byte)) return false;
      if (!leaf_.Feed(byte)) return false;
      // Back between characters: one more written (a byte that starts a character leaves
      // the string's state until the character is whole).
      if (node.limits_length() && leaf_.in_string()) {
        if (node.max_length >= 0 || chars_ < node.min_length) ++chars_;
      }
      if (bounded_number_) {
        CountDecimalByte(byte);
        if (!DecimalMayReachBounds()) return false;
      }
      if (multiple_) {
        CountMultipleByte(byte);
        if (!MultipleMayBeReached()) return false;
      }
      if (leaf_.complete()) EndValue();
      return true;
    }
    case Phase::kEnum: {
      const ByteTrie& trie = Node(expected_).enum_trie;
      const int32_t child = trie.Child(trie_, byte);
      if (child >= 0) {
        trie_ = child;
        if (trie.nodes[static_cast<size_t>(child)].edges.empty()) EndValue();
        return true;
      }
      if (trie.nodes[static_cast<size_t>(trie_)].terminal < 0) return false;
      EndValue();
      break;
    }
    case Phase::kKeyString:
      return KeyByte(byte);
    case Phase::kAlternatives:
      return AlternativesByte(byte);
    case Phase::kDone:
      return false;
    default:
      break;
  }
  if (phase_ == Phase::kDone) return false;
  // Between tokens.
  if (IsWhitespace(byte)) return ++whitespace_ <= kMaxWhitespaceRun;
  whitespace_ = 0;
  switch (phase_) {
    case Phase::kValue:
      return StartValue(byte);
    case Phase::kValueOrClose:
      if (byte == ']') return Close(/*object=*/false);
      return ItemMayCome(top()) && StartValue(byte);
    case Phase::kKeyOrClose:
      if (byte == '}') return Close(/*object=*/true);
      return StartKey(byte);
    case Phase::kKey:
      return StartKey(byte);
    case Phase::kColon: {
      if (byte != ':') return false;
      const Frame& frame = top();
      const SchemaNode& node = Node(frame.node);
      expected_ = frame.property == kUndeclared
                      ? node.additional
                      : node.property_nodes[static_cast<size_t>(frame.property)];
      phase_ = Phase::kValue;
      return true;
    }
    case Phase::kAfterValue:
      return AfterValue(byte);
    case Phase::kKeyString:
    case Phase::kLeaf:
    case Phase::kEnum:
    case Phase::kAlternatives:
    case Phase::kDone:
      break;  // handled above
  }
  return false;
}

bool SchemaGrammar::StartValue(unsigned char byte) {
  const uint8_t type = JsonTypeOfFirstByte(byte);
  if (type == 0) return false;
  const int32_t index = schema_->ForType(expected_, type);
  if (index == SchemaNode::kNone) return false;
  const SchemaNode& node = Node(index);
  if (!node.members.empty()) return StartAlternatives(index, byte);
  expected_ = index;
  if (!node.any && !node.enum_texts.empty()) {
    const int32_t child = node.enum_trie.Child(0, byte);
    if (child < 0) return false;
    phase_ = Phase::kEnum;
    trie_ = child;
    if (node.enum_trie.nodes[static_cast<size_t>(child)].edges.empty()) EndValue();
    return true;
  }
  if (!node.any && type == kTypeObject) return OpenObject(index);
  if (!node.any && type == kTypeArray) return OpenArray(index);
  // A scalar, or any value at all: JsonGrammar reads it.
  leaf_ = JsonGrammar::AnyValue();
  if (!leaf_.Feed(byte)) return false;
  // A multipleOf's numbers are written as integers, a "number"'s too.
  integer_ =
      !node.any && type == kTypeNumber && ((node.types & kTypeNumber) == 0 || node.multiple_of > 0);
  if (!node.any && type == kTypeString && node.pattern != nullptr) {
    pattern_state_ = StringPattern::start();
  }
  phase_ = Phase::kLeaf;
  bounded_number_ = !node.any && type == kTypeNumber && node.bounds_numbers();
  if (bounded_number_) {
    CountDecimalByte(byte);
    if (!DecimalMayReachBounds()) return false;
  }
  multiple_ = !node.any && type == kTypeNumber && node.multiple_of > 0;
  if (multiple_) {
    CountMultipleByte(byte);
    if (!MultipleMayBeReached()) return false;
  }
  return true;
}

bool SchemaGrammar::StartAlternatives(int32_t node, unsigned char byte) {
  alternatives_.clear();
  const SchemaNode& overlap = Node(node);
  for (size_t i = 0; i < overlap.members.size(); ++i) {
    const int32_t member = overlap.members[i];
    // A member whose smallest value does not fit here is no alternative (its reading could
    // not be completed).
    if (!Fits(member)) continue;
    SchemaGrammar reading(schema_, member, static_cast<uint8_t>(Depth()),
                          overlap.first_keys.empty()
                              ? int8_t{-1}
                              : static_cast<int8_t>(overlap.first_keys[i]));
    if (reading.Feed(byte)) alternatives_.push_back(std::move(reading));
  }
  if (alternatives_.empty()) return false;
  expected_ = node;
  phase_ = Phase::kAlternatives;
  if (alternatives_.front().complete()) {
    alternatives_.clear();
    EndValue();
  }
  return true;
}

bool SchemaGrammar::AlternativesByte(unsigned char byte) {
  // Each reading takes the byte or is dropped (Feed leaves a refusing one unspecified).
  size_t kept = 0;
  for (size_t i = 0; i < alternatives_.size(); ++i) {
    if (!alternatives_[i].Feed(byte)) continue;
    if (kept != i) alternatives_[kept] = alternatives_[i];
    ++kept;
  }
  alternatives_.erase(alternatives_.begin() + static_cast<std::ptrdiff_t>(kept),
                      alternatives_.end());
  if (alternatives_.empty()) return false;
  // The members' values end at a byte of their own, so the readings left end together.
  if (alternatives_.front().complete()) {
    alternatives_.clear();
    EndValue();
  }
  return true;
}

bool SchemaGrammar::OpenObject(int32_t index) {
  const SchemaNode& node = Node(index);
  if (Depth() + node.object_depth > kMaxDepth) return false;
  Frame& frame = frames_[depth_++];
  frame = Frame{.node = index, .object = true};
  // Properties whose smallest value fits below this object (the required ones all do: the
  // object's own depth counts them).
  for (size_t i = 0; i < node.property_nodes.size(); ++i) {
    if (Fits(node.property_nodes[i])) frame.open |= uint64_t{1} << i;
  }
  frame.additional = Fits(node.additional);
  phase_ = Phase::kKeyOrClose;
  return true;
}

bool SchemaGrammar::OpenArray(int32_t index) {
  const SchemaNode& node = Node(index);
  if (Depth() + node.array_depth > kMaxDepth) return false;
  frames_[depth_++] = Frame{.node = index, .object = false};
  expected_ = node.item(0);
  phase_ = Phase::kValueOrClose;
  return true;
}

bool SchemaGrammar::StartKey(unsigned char byte) {
  if (byte != '"' || !KeyMayCome(top())) return false;
  leaf_ = JsonGrammar::AnyValue();
  leaf_.Feed(byte);
  trie_ = 0;
  phase_ = Phase::kKeyString;
  return true;
}

bool SchemaGrammar::KeyByte(unsigned char byte) {
  Frame& frame = top();
  const ByteTrie& names = Node(frame.node).keys;
  const uint64_t left = KeysLeft(frame);
  const bool undeclared = UndeclaredMayCome(frame);
  if (byte == '"' && leaf_.in_string()) {
    // The key ends: a declared name not yet written, else an undeclared key where one may
    // come (never a declared name again: JSON would keep one of the two values).
    const int32_t name = trie_ >= 0 ? names.nodes[static_cast<size_t>(trie_)].terminal : -1;
    if (name >= 0) {
      if ((left >> name & 1u) == 0) return false;
      frame.property = name;
      frame.seen |= uint64_t{1} << name;
    } else if (undeclared) {
      frame.property = kUndeclared;
    } else {
      return false;
    }
    leaf_ = JsonGrammar();
    trie_ = 0;
    whitespace_ = 0;
    phase_ = Phase::kColon;
    return true;
  }
  if (!KeyEscapeByte(byte) || !leaf_.Feed(byte)) return false;
  if (trie_ >= 0) trie_ = names.Child(trie_, byte);
  // Still the start of a name left to write, or of an undeclared key.
  return (trie_ >= 0 && (names.nodes[static_cast<size_t>(trie_)].below & left) != 0) ||
         undeclared;
}

bool SchemaGrammar::KeyEscapeByte(unsigned char byte) {
  const auto hex = [](unsigned char b) { return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f'); };
  switch (key_escape_) {
    case 0:
      if (byte == '\\') key_escape_ = 1;
      return true;
    case 1:
      key_escape_ = byte == 'u' ? 2 : 0;
      return byte == 'u' || byte == '"' || byte == '\\' || byte == 'b' || byte == 'f' ||
             byte == 'n' || byte == 'r' || byte == 't';
    case 2:
    case 3:
      ++key_escape_;
      return byte == '0';
    case 4:
      key_escape_ = byte == '0' ? 5 : 6;
      return byte == '0' || byte == '1';
    case 5:  // \u000X: not the five with short escapes (\b \t \n \f \r)
      key_escape_ = 0;
      return hex(byte) && byte != '8' && byte != '9' && byte != 'a' && byte != 'c' && byte != 'd';
    default:  // \u001X
      key_escape_ = 0;
      return hex(byte);
  }
}

bool SchemaGrammar::AfterValue(unsigned char byte) {
  const Frame& frame = top();
  if (byte == ',') {
    if (frame.object) {
      if (!KeyMayCome(frame)) return false;
      phase_ = Phase::kKey;
    } else {
      if (!ItemMayCome(frame)) return false;
      expected_ = Node(frame.node).item(frame.count);
      phase_ = Phase::kValue;
    }
    return true;
  }
  if (byte == '}' || byte == ']') return Close(/*object=*/byte == '}');
  return false;
}

bool SchemaGrammar::Close(bool object) {
  const Frame& frame = top();
  if (frame.object != object) return false;
  const SchemaNode& node = Node(frame.node);
  if (object ? (node.required & ~frame.seen) != 0 : frame.count < node.min_items) return false;
  frames_[--depth_] = Frame{};
  EndValue();
  return true;
}

void SchemaGrammar::EndValue() {
  whitespace_ = 0;
  // What read the value is cleared, so that equal positions compare equal.
  leaf_ = JsonGrammar();
  trie_ = 0;
  integer_ = false;
  chars_ = 0;
  negative_ = false;
  digits_ = 0;
  bounded_number_ = false;
  point_ = false;
  leading_zero_ = false;
  fraction_digits_ = 0;
  cmp_low_ = 0;
  cmp_high_ = 0;
  multiple_ = false;
  magnitude_ = 0;
  pattern_state_ = -1;
  pattern_escape_ = false;
  expected_ = SchemaNode::kNone;
  if (depth_ == 0) {
    phase_ = Phase::kDone;
    return;
  }
  Frame& frame = top();
  if (!frame.object) ++frame.count;
  phase_ = Phase::kAfterValue;
}

}  // namespace tophat
