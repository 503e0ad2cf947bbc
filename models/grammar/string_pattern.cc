#include "models/grammar/string_pattern.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int32_t kUnbounded = -1;
// Counted repetitions and the NFA they expand to are bounded before the DFA is.
constexpr int32_t kMaxCount = 1000;
constexpr size_t kMaxNfaStates = 50000;
// The subset construction's work (NFA states visited by closures, moves gathered) is bounded too: sets
// grow with unanchored counted repetitions (.{1000} keeps every position alive), and a
// request's pattern must compile in tens of milliseconds.
constexpr int64_t kMaxClosureWork = 4000000;

// Sorted, merged, without the surrogates (no UTF-8 encodes them).
Ranges Normalized(Ranges ranges) {
  Ranges split;
  for (auto [lo, hi] : ranges) {
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) split.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) split.emplace_back(0xE000, hi);
    } else {
      split.emplace_back(lo, hi);
    }
  }
  std::sort(split.begin(), split.end());
  Ranges merged;
  for (const auto& [lo, hi] : split) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  return merged;
}

Ranges Complement(const Ranges& ranges) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : Normalized(ranges)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return Normalized(out);
}

const Ranges& Digits() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& WordCharacters() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
// ECMA-262's WhiteSpace and LineTerminator.
const Ranges& Spaces() {
  static const Ranges r = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},
                           {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                           {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                           {0xFEFF, 0xFEFF}};
  return r;
}

// The regular expression's tree.
struct Node {
  enum class Kind { kClass, kConcat, kAlternation, kRepeat };
  Kind kind = Kind::kConcat;
  Ranges ranges;              // kClass
  std::vector<int> children;  // kConcat, kAlternation; kRepeat: one
  int32_t min = 0;            // kRepeat
  int32_t max = 0;            // kRepeat; kUnbounded
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<int> Parse() {
    absl::StatusOr<int> root = Alternation();
    if (!root.ok()) return root;
    if (at_ < text_.size()) return Error("an unmatched ')'");
    return root;
  }
  std::vector<Node> nodes;

  int Add(Node node) {
    nodes.push_back(std::move(node));
    return static_cast<int>(nodes.size() - 1);
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern: ", what, " at offset ", at_, " is not supported"));
  }
  bool More() const { return at_ < text_.size(); }
  char Peek() const { return text_[at_]; }

  absl::StatusOr<int> Alternation() {
    std::vector<int> branches;
    while (true) {
      absl::StatusOr<int> branch = Concatenation();
      if (!branch.ok()) return branch;
      branches.push_back(*branch);
      if (!More() || Peek() != '|') break;
      ++at_;
    }
    if (branches.size() == 1) return branches[0];
    return Add(Node{.kind = Node::Kind::kAlternation, .children = std::move(branches)});
  }

  absl::StatusOr<int> Concatenation() {
    std::vector<int> parts;
    while (More() && Peek() != '|' && Peek() != ')') {
      absl::StatusOr<int> part = Repetition();
      if (!part.ok()) return part;
      parts.push_back(*part);
    }
    return Add(Node{.kind = Node::Kind::kConcat, .children = std::move(parts)});
  }

  // A whole number at at_, or -1 if there is none (at_ unchanged then).
  int64_t Number() {
    int64_t value = -1;
    while (More() && Peek() >= '0' && Peek() <= '9') {
      value = std::min<int64_t>((value < 0 ? 0 : value) * 10 + (Peek() - '0'), 1 << 30);
      ++at_;
    }
    return value;
  }

  absl::StatusOr<int> Repetition() {
    absl::StatusOr<int> atom = Atom();
    if (!atom.ok()) return atom;
    if (!More()) return atom;
    int64_t min = 0;
    int64_t max = kUnbounded;
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++at_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : kUnbounded;
    } else if (c == '{') {
      const size_t brace = at_;
      ++at_;
      min = Number();
      if (min >= 0 && More() && Peek() == '}') {
        max = min;
        ++at_;
      } else if (min >= 0 && More() && Peek() == ',') {
        ++at_;
        max = Number();  // -1: unbounded
        if (!More() || Peek() != '}') return Error("a malformed {n,m}");
        ++at_;
      } else {
        at_ = brace;  // a literal '{' (ECMA-262's Annex B), read by the next atom
        return atom;
      }
      if (min > kMaxCount || max > kMaxCount) {
        return Error(absl::StrCat("a count above ", kMaxCount));
      }
      if (max != kUnbounded && max < min) return Error("{n,m} with m < n");
    } else {
      return atom;
    }
    if (More() && Peek() == '?') ++at_;  // lazy: the same strings
    if (More() && (Peek() == '*' || Peek() == '+' || Peek() == '?' ||
                   (Peek() == '{' && at_ + 1 < text_.size() && text_[at_ + 1] >= '0' &&
                    text_[at_ + 1] <= '9'))) {
      return Error("a quantifier after a quantifier");
    }
    return Add(Node{.kind = Node::Kind::kRepeat,
                    .children = {*atom},
                    .min = static_cast<int32_t>(min),
                    .max = static_cast<int32_t>(max)});
  }

  // One UTF-8 character of the pattern, as a code point.
  absl::StatusOr<uint32_t> Character() {
    const auto lead = static_cast<unsigned char>(text_[at_]);
    const int length = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3
                                                           : (lead >> 3) == 30 ? 4 : 0;
    if (length == 0 || at_ + static_cast<size_t>(length) > text_.size()) {
      return Error("a byte that is not UTF-8");
    }
    uint32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (int i = 1; i < length; ++i) {
      const auto next = static_cast<unsigned char>(text_[at_ + static_cast<size_t>(i)]);
      if ((next & 0xC0) != 0x80) return Error("a byte that is not UTF-8");
      code = code << 6 | (next & 0x3F);
    }
    at_ += static_cast<size_t>(length);
    return code;
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    if (at_ + static_cast<size_t>(digits) > text_.size()) return Error("a short hex escape");
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = text_[at_++];
      const int v = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (v < 0) return Error("a malformed hex escape");
      value = value << 4 | static_cast<uint32_t>(v);
    }
    return value;
  }

  // After a '\\': the characters the escape stands for. In a class, \b is the backspace.
  absl::StatusOr<Ranges> Escape(bool in_class) {
    if (!More()) return Error("a '\\' at the end");
    const char c = Peek();
    ++at_;
    switch (c) {
      case 'd': return Digits();
      case 'D': return Complement(Digits());
      case 'w': return WordCharacters();
      case 'W': return Complement(WordCharacters());
      case 's': return Spaces();
      case 'S': return Complement(Spaces());
      case 'n': return Ranges{{'\n', '\n'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
      case '0':
        if (More() && Peek() >= '0' && Peek() <= '9') return Error("an octal escape");
        return Ranges{{0, 0}};
      case 'x':
      case 'u': {
        absl::StatusOr<uint32_t> code = Hex(c == 'x' ? 2 : 4);
        if (!code.ok()) return code.status();
        return Ranges{{*code, *code}};
      }
      case 'b':
        if (in_class) return Ranges{{'\b', '\b'}};
        --at_;
        return Error("a word boundary (\\b)");
      default:
        break;
    }
    if (std::string_view("^$\\.*+?()[]{}|/-").find(c) != std::string_view::npos) {
      return Ranges{{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}};
    }
    --at_;
    if (c >= '1' && c <= '9') return Error("a backreference");
    return Error(absl::StrCat("the escape \\", std::string(1, c)));
  }

  absl::StatusOr<int> Class() {
    ++at_;  // '['
    bool negated = false;
    if (More() && Peek() == '^') {
      negated = true;
      ++at_;
    }
    Ranges ranges;
    while (true) {
      if (!More()) return Error("an unclosed '['");
      if (Peek() == ']') break;  // "[]" matches nothing, as ECMA-262 reads it
      // One item: a character or an escape; a range when '-' and a character follow.
      absl::StatusOr<Ranges> low = Peek() == '\\' ? (++at_, Escape(/*in_class=*/true))
                                                  : absl::StatusOr<Ranges>(Single());
      if (!low.ok()) return low.status();
      if (at_ + 1 < text_.size() && Peek() == '-' && text_[at_ + 1] != ']') {
        ++at_;
        absl::StatusOr<Ranges> high = Peek() == '\\' ? (++at_, Escape(/*in_class=*/true))
                                                     : absl::StatusOr<Ranges>(Single());
        if (!high.ok()) return high.status();
        if (low->size() != 1 || high->size() != 1 || (*low)[0].first != (*low)[0].second ||
            (*high)[0].first != (*high)[0].second) {
          return Error("a range between classes");
        }
        if ((*low)[0].first > (*high)[0].first) return Error("a range out of order");
        ranges.emplace_back((*low)[0].first, (*high)[0].first);
      } else {
        ranges.insert(ranges.end(), low->begin(), low->end());
      }
    }
    ++at_;  // ']'
    return Add(Node{.kind = Node::Kind::kClass,
                    .ranges = negated ? Complement(ranges) : Normalized(ranges)});
  }

  absl::StatusOr<Ranges> Single() {
    absl::StatusOr<uint32_t> code = Character();
    if (!code.ok()) return code.status();
    return Ranges{{*code, *code}};
  }

  absl::StatusOr<int> Atom() {
    const char c = Peek();
    switch (c) {
      case '(': {
        ++at_;
        if (More() && Peek() == '?') {
          if (at_ + 1 < text_.size() && text_[at_ + 1] == ':') {
            at_ += 2;
          } else {
            return Error("a lookaround or named group");
          }
        }
        absl::StatusOr<int> inner = Alternation();
        if (!inner.ok()) return inner;
        if (!More() || Peek() != ')') return Error("an unclosed '('");
        ++at_;
        return inner;
      }
      case '[':
        return Class();
      case '.':
        ++at_;
        return Add(Node{.kind = Node::Kind::kClass,
                        .ranges = Complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}})});
      case '\\': {
        ++at_;
        absl::StatusOr<Ranges> ranges = Escape(/*in_class=*/false);
        if (!ranges.ok()) return ranges.status();
        return Add(Node{.kind = Node::Kind::kClass, .ranges = Normalized(*ranges)});
      }
      case '^':
      case '$':
        return Error(absl::StrCat("an anchor '", std::string(1, c), "' inside the pattern (only ^ "
                                  "first and $ last)"));
      case '*':
      case '+':
      case '?':
        return Error("a quantifier with nothing before it");
      default: {
        absl::StatusOr<Ranges> single = Single();
        if (!single.ok()) return single.status();
        return Add(Node{.kind = Node::Kind::kClass, .ranges = *single});
      }
    }
  }

  std::string_view text_;
  size_t at_ = 0;
};

// The UTF-8 byte ranges of the code points [lo, hi] (no surrogates), as sequences of byte
// ranges, each sequence a set of characters of one length.
void Utf8Sequences(uint32_t lo, uint32_t hi,
                   std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (const uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      Utf8Sequences(lo, edge, out);
      Utf8Sequences(edge + 1, hi, out);
      return;
    }
  }
  const int length = hi <= 0x7F ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int i = 1; i < length; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto encode = [length](uint32_t code) {
    std::vector<uint8_t> bytes(static_cast<size_t>(length));
    if (length == 1) {
      bytes[0] = static_cast<uint8_t>(code);
      return bytes;
    }
    for (int i = length - 1; i > 0; --i) {
      bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(0x80 | (code & 0x3F));
      code >>= 6;
    }
    bytes[0] = static_cast<uint8_t>((0xF00u >> length) | code);
    return bytes;
  };
  const std::vector<uint8_t> a = encode(lo);
  const std::vector<uint8_t> b = encode(hi);
  std::vector<std::pair<uint8_t, uint8_t>> sequence;
  for (size_t i = 0; i < a.size(); ++i) sequence.emplace_back(a[i], b[i]);
  out.push_back(std::move(sequence));
}

// A Thompson NFA over bytes.
class Nfa {
 public:
  struct State {
    std::vector<int> empty;  // moves on no byte
    std::vector<std::tuple<uint8_t, uint8_t, int>> bytes;
  };
  std::vector<State> states;
  bool too_large = false;

  int New() {
    if (states.size() >= kMaxNfaStates) too_large = true;
    states.emplace_back();
    return static_cast<int>(states.size() - 1);
  }
  // The fragment of node `node` from `from`; returns its end.
  int Build(const std::vector<Node>& nodes, int node, int from) {
    if (too_large) return from;
    const Node& n = nodes[static_cast<size_t>(node)];
    switch (n.kind) {
      case Node::Kind::kClass: {
        const int end = New();
        std::vector<std::vector<std::pair<uint8_t, uint8_t>>> sequences;
        for (const auto& [lo, hi] : n.ranges) Utf8Sequences(lo, hi, sequences);
        for (const auto& sequence : sequences) {
          int at = from;
          for (size_t i = 0; i < sequence.size(); ++i) {
            const int next = i + 1 == sequence.size() ? end : New();
            states[static_cast<size_t>(at)].bytes.emplace_back(sequence[i].first,
                                                               sequence[i].second, next);
            at = next;
          }
        }
        return end;
      }
      case Node::Kind::kConcat: {
        int at = from;
        for (const int child : n.children) at = Build(nodes, child, at);
        return at;
      }
      case Node::Kind::kAlternation: {
        const int end = New();
        for (const int child : n.children) {
          const int start = New();
          states[static_cast<size_t>(from)].empty.push_back(start);
          const int child_end = Build(nodes, child, start);
          states[static_cast<size_t>(child_end)].empty.push_back(end);
        }
        return end;
      }
      case Node::Kind::kRepeat: {
        int at = from;
        for (int32_t i = 0; i < n.min; ++i) at = Build(nodes, n.children[0], at);
        if (n.max == kUnbounded) {
          // at -> loop -> (child -> loop) | end
          const int loop = New();
          const int end = New();
          states[static_cast<size_t>(at)].empty.push_back(loop);
          const int body = New();
          states[static_cast<size_t>(loop)].empty.push_back(body);
          states[static_cast<size_t>(loop)].empty.push_back(end);
          const int body_end = Build(nodes, n.children[0], body);
          states[static_cast<size_t>(body_end)].empty.push_back(loop);
          return end;
        }
        const int end = New();
        for (int32_t i = n.min; i < n.max; ++i) {
          states[static_cast<size_t>(at)].empty.push_back(end);
          at = Build(nodes, n.children[0], at);
        }
        states[static_cast<size_t>(at)].empty.push_back(end);
        return end;
      }
    }
    return from;
  }
};

// The bytes a JSON string's decoded characters may be that SchemaGrammar can write: all but
// the control characters without a short escape.
bool Writable(int byte) {
  return byte >= 0x20 || byte == '\b' || byte == '\t' || byte == '\n' || byte == '\f' ||
         byte == '\r';
}

}  // namespace

absl::StatusOr<std::shared_ptr<const StringPattern>> StringPattern::Compile(std::string_view regex) {
  if (regex.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern: longer than ", kMaxPatternBytes, " bytes"));
  }
  // ^ first and $ last anchor the match; without them it may be anywhere in the string.
  bool anchored_start = false;
  bool anchored_end = false;
  std::string_view body = regex;
  if (!body.empty() && body.front() == '^') {
    anchored_start = true;
    body.remove_prefix(1);
  }
  if (!body.empty() && body.back() == '$') {
    size_t backslashes = 0;
    while (backslashes + 1 < body.size() && body[body.size() - 2 - backslashes] == '\\') {
      ++backslashes;
    }
    if (backslashes % 2 == 0) {
      anchored_end = true;
      body.remove_suffix(1);
    }
  }
  Parser parser(body);
  absl::StatusOr<int> root = parser.Parse();
  if (!root.ok()) return root.status();
  if ((anchored_start || anchored_end) &&
      parser.nodes[static_cast<size_t>(*root)].kind == Node::Kind::kAlternation) {
    return absl::InvalidArgumentError(
        "pattern: an anchor beside a '|' at the top is not supported: group the alternatives, "
        "as in ^(a|b)$");
  }
  // Unanchored ends: any characters.
  const int any = parser.Add(Node{.kind = Node::Kind::kClass, .ranges = Normalized({{0, kMaxCodePoint}})});
  const int any_run = parser.Add(Node{.kind = Node::Kind::kRepeat, .children = {any}, .min = 0,
                                      .max = kUnbounded});
  std::vector<int> parts;
  if (!anchored_start) parts.push_back(any_run);
  parts.push_back(*root);
  if (!anchored_end) parts.push_back(any_run);
  const int whole = parser.Add(Node{.kind = Node::Kind::kConcat, .children = std::move(parts)});

  Nfa nfa;
  const int start = nfa.New();
  const int accept = nfa.Build(parser.nodes, whole, start);
  if (nfa.too_large) {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern: expands to more than ", kMaxNfaStates,
                     " automaton states (counted repetitions of large classes)"));
  }
  // Subset construction over the bytes JSON can write.
  // Marks by generation, so that a closure costs its own size, not the NFA's.
  std::vector<uint32_t> mark(nfa.states.size(), 0);
  uint32_t generation = 0;
  int64_t closure_work = 0;
  const auto closure = [&](std::vector<int> set) {
    ++generation;
    closure_work += static_cast<int64_t>(set.size());
    size_t unique = 0;
    for (const int s : set) {
      if (mark[static_cast<size_t>(s)] != generation) {
        mark[static_cast<size_t>(s)] = generation;
        set[unique++] = s;
      }
    }
    set.resize(unique);
    for (size_t i = 0; i < set.size(); ++i) {
      for (const int next : nfa.states[static_cast<size_t>(set[i])].empty) {
        if (mark[static_cast<size_t>(next)] != generation) {
          mark[static_cast<size_t>(next)] = generation;
          set.push_back(next);
        }
      }
    }
    // Only the states that move on a byte (or accept) tell sets apart.
    std::vector<int> kept;
    for (const int s : set) {
      if (!nfa.states[static_cast<size_t>(s)].bytes.empty() || s == accept) kept.push_back(s);
    }
    std::sort(kept.begin(), kept.end());
    closure_work += static_cast<int64_t>(set.size());
    return kept;
  };
  std::map<std::vector<int>, int32_t> index;
  std::vector<std::vector<int>> sets;
  std::vector<int32_t> next;
  std::vector<uint8_t> accepting;
  const auto intern = [&](std::vector<int> set) -> int32_t {
    if (set.empty()) return kDead;
    const auto [it, added] = index.emplace(set, static_cast<int32_t>(sets.size()));
    if (added) {
      accepting.push_back(std::binary_search(set.begin(), set.end(), accept) ? 1 : 0);
      sets.push_back(std::move(set));
      next.resize(sets.size() * 256, kDead);
    }
    return it->second;
  };
  const auto nothing = [] {
    return absl::InvalidArgumentError(
        "pattern: no string JSON can write matches it (the control characters but \\b \\f "
        "\\n \\r \\t are not written)");
  };
  if (intern(closure({start})) == kDead) return nothing();
  for (size_t s = 0; s < sets.size(); ++s) {
    if (closure_work > kMaxClosureWork) {
      return absl::InvalidArgumentError(
          "pattern: too costly to compile (repetitions that keep many positions alive at once)");
    }
    if (sets.size() > static_cast<size_t>(kMaxStates)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pattern: its automaton has more than ", kMaxStates,
          " states (counted repetitions, or classes under a repetition, grow it)"));
    }
    std::vector<std::vector<int>> by_byte(256);
    for (const int state : sets[s]) {
      for (const auto& [lo, hi, to] : nfa.states[static_cast<size_t>(state)].bytes) {
        for (int b = lo; b <= hi; ++b) {
          if (Writable(b)) by_byte[static_cast<size_t>(b)].push_back(to);
          ++closure_work;
        }
      }
    }
    // Bytes of a class move to the same states: each such set is closed once.
    std::map<std::vector<int>, int32_t> closed;
    for (int b = 0; b < 256; ++b) {
      std::vector<int>& moves = by_byte[static_cast<size_t>(b)];
      if (moves.empty()) continue;
      std::sort(moves.begin(), moves.end());
      moves.erase(std::unique(moves.begin(), moves.end()), moves.end());
      auto found = closed.find(moves);
      if (found == closed.end()) found = closed.emplace(moves, intern(closure(moves))).first;
      next[s * 256 + static_cast<size_t>(b)] = found->second;
    }
  }
  // Only states from which a match can still be written: the others are dead.
  const size_t count = sets.size();
  std::vector<std::vector<int32_t>> sources(count);
  for (size_t s = 0; s < count; ++s) {
    for (int b = 0; b < 256; ++b) {
      const int32_t t = next[s * 256 + static_cast<size_t>(b)];
      if (t != kDead) sources[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<uint8_t> live(count, 0);
  std::vector<int32_t> work;
  for (size_t s = 0; s < count; ++s) {
    if (accepting[s] != 0) {
      live[s] = 1;
      work.push_back(static_cast<int32_t>(s));
    }
  }
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (const int32_t s : sources[static_cast<size_t>(t)]) {
      if (live[static_cast<size_t>(s)] == 0) {
        live[static_cast<size_t>(s)] = 1;
        work.push_back(s);
      }
    }
  }
  if (live[0] == 0) return nothing();
  for (int32_t& t : next) {
    if (t != kDead && live[static_cast<size_t>(t)] == 0) t = kDead;
  }
  auto pattern = std::make_shared<StringPattern>();
  pattern->next_ = std::move(next);
  pattern->accepting_ = std::move(accepting);
  return std::shared_ptr<const StringPattern>(std::move(pattern));
}

bool StringPattern::Matches(std::string_view utf8) const {
  int32_t state = start();
  for (const char c : utf8) {
    state = Next(state, static_cast<unsigned char>(c));
    if (state == kDead) return false;
  }
  return Accepts(state);
}

}  // namespace tophat
