#include "models/grammar/string_pattern.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
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

// Cuts the moves into states from which no accepting state can be reached (`next`: states x
// 256, kDead for none); false when the start is such a state.
bool PruneDead(std::vector<int32_t>& next, const std::vector<uint8_t>& accepting) {
  const size_t count = accepting.size();
  std::vector<std::vector<int32_t>> sources(count);
  for (size_t s = 0; s < count; ++s) {
    for (int b = 0; b < 256; ++b) {
      const int32_t t = next[s * 256 + static_cast<size_t>(b)];
      if (t != StringPattern::kDead) sources[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
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
  if (live[0] == 0) return false;
  for (int32_t& t : next) {
    if (t != StringPattern::kDead && live[static_cast<size_t>(t)] == 0) t = StringPattern::kDead;
  }
  return true;
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
  if (!PruneDead(next, accepting)) return nothing();
  auto pattern = std::make_shared<StringPattern>();
  pattern->next_ = std::move(next);
  pattern->accepting_ = std::move(accepting);
  pattern->MarkCharacters();
  return std::shared_ptr<const StringPattern>(std::move(pattern));
}

void StringPattern::MarkCharacters() {
  bytes_left_.assign(accepting_.size(), -1);
  bytes_left_[0] = 0;
  std::vector<int32_t> work = {start()};
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    const int8_t left = bytes_left_[static_cast<size_t>(s)];
    for (int b = 0; b < 256; ++b) {
      const int32_t t = Next(s, static_cast<unsigned char>(b));
      if (t == kDead) continue;
      int8_t after = 0;
      if (left > 0) {
        after = static_cast<int8_t>(left - 1);
      } else if (b >= 0xF0) {
        after = 3;
      } else if (b >= 0xE0) {
        after = 2;
      } else if (b >= 0x80) {
        after = 1;
      }
      int8_t& mark = bytes_left_[static_cast<size_t>(t)];
      if (mark < 0) {
        mark = after;
        work.push_back(t);
      }
      // The automaton's states are sets of the NFA's, which are each at one place in a UTF-8
      // sequence; a state reached at two places would be a bug in the construction.
      assert(mark == after);
    }
  }
}

absl::StatusOr<std::shared_ptr<const StringPattern>> StringPattern::Intersect(
    const StringPattern& a, const StringPattern& b) {
  std::map<std::pair<int32_t, int32_t>, int32_t> index;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::vector<int32_t> next;
  std::vector<uint8_t> accepting;
  const auto intern = [&](int32_t x, int32_t y) {
    const auto [it, added] = index.emplace(std::make_pair(x, y), static_cast<int32_t>(pairs.size()));
    if (added) {
      pairs.emplace_back(x, y);
      accepting.push_back(a.Accepts(x) && b.Accepts(y) ? 1 : 0);
      next.resize(pairs.size() * 256, kDead);
    }
    return it->second;
  };
  intern(a.start(), b.start());
  for (size_t s = 0; s < pairs.size(); ++s) {
    if (pairs.size() > static_cast<size_t>(kMaxStates)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pattern and format together: their automaton has more than ", kMaxStates, " states"));
    }
    const auto [x, y] = pairs[s];
    for (int byte = 0; byte < 256; ++byte) {
      const int32_t tx = a.Next(x, static_cast<unsigned char>(byte));
      const int32_t ty = b.Next(y, static_cast<unsigned char>(byte));
      if (tx == kDead || ty == kDead) continue;
      const int32_t t = intern(tx, ty);
      next[s * 256 + static_cast<size_t>(byte)] = t;
    }
  }
  // Only the pairs from which both can still match.
  if (!PruneDead(next, accepting)) {
    return absl::InvalidArgumentError("pattern and format together: no string matches both");
  }
  auto pattern = std::make_shared<StringPattern>();
  pattern->next_ = std::move(next);
  pattern->accepting_ = std::move(accepting);
  pattern->MarkCharacters();
  return std::shared_ptr<const StringPattern>(std::move(pattern));
}

namespace {

// An IPv6 address (RFC 4291 section 2.2): eight groups of 1 to 4 hex digits, a run of zero
// groups written "::" once, the last two groups as an IPv4 address where written so.
std::string Ipv6Regex(const std::string& ipv4) {
  const std::string h = "[0-9A-Fa-f]{1,4}";
  const auto groups = [&](int n) {  // n >= 1 groups joined by ':'
    return n == 1 ? h : absl::StrCat("(?:", h, ":){", n - 1, "}", h);
  };
  std::vector<std::string> forms = {groups(8), absl::StrCat("(?:", h, ":){6}", ipv4)};
  for (int left = 0; left <= 7; ++left) {
    // "::" stands for one group or more: left + right <= 7.
    const std::string before = left == 0 ? "" : groups(left);
    const std::string after =
        left == 7 ? "" : absl::StrCat("(?:", h, "(?::", h, "){0,", 6 - left, "})?");
    forms.push_back(absl::StrCat(before, "::", after));
    if (left <= 5) {
      forms.push_back(absl::StrCat(before, "::(?:", h, ":){0,", 5 - left, "}", ipv4));
    }
  }
  std::string regex = "^(?:";
  for (size_t i = 0; i < forms.size(); ++i) absl::StrAppend(&regex, i == 0 ? "" : "|", forms[i]);
  return regex + ")$";
}

struct FormatEntry {
  std::string_view name;
  std::string regex;
};

// The formats JSON Schema names that structured outputs use (OpenAI's strict mode supports
// these but uri; Pydantic writes them for datetime, date, time, timedelta, UUID, EmailStr,
// IPv4Address, IPv6Address and AnyUrl), as patterns of the strings each allows:
//   date-time, date, time: RFC 3339's date-time, full-date and full-time (an offset is part
//     of a time; the day of the month at most its month's, February's 29);
//   duration: RFC 3339's (Appendix A): P1Y2M3DT4H5M6S, P3W; no fractions;
//   email: RFC 5321's dot-atom local part @ a domain of two labels or more (no quoted local
//     parts, no address literals: what mail libraries accept everywhere);
//   hostname: RFC 1123's labels of 1 to 63 letters, digits and inner hyphens, dot-joined;
//   ipv4: four decimal bytes without leading zeros; ipv6: RFC 4291's text forms;
//   uuid: RFC 9562's 8-4-4-4-12 hex digits;
//   uri: a scheme, ':', and the characters RFC 3986 allows (percent escapes whole), not its
//     finer structure.
// Lengths (a hostname's 253 characters, an email's 254) are not in these: a maxLength beside
// a format bounds them.
const std::vector<FormatEntry>& Formats() {
  static const std::vector<FormatEntry>* const formats = [] {
    const std::string byte = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    const std::string ipv4 = absl::StrCat("(?:", byte, "\\.){3}", byte);
    const std::string date =
        "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|"
        "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))";
    const std::string time =
        "(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?"
        "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    const std::string dur_time = "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)";
    const std::string dur_date = "(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)";
    const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
    const std::string hex = "[0-9A-Fa-f]";
    return new std::vector<FormatEntry>{
        {"date-time", absl::StrCat("^", date, "[Tt]", time, "$")},
        {"date", absl::StrCat("^", date, "$")},
        {"time", absl::StrCat("^", time, "$")},
        {"duration", absl::StrCat("^P(?:", dur_date, "(?:", dur_time, ")?|", dur_time, "|[0-9]+W)$")},
        {"email", absl::StrCat("^", atext, "+(?:\\.", atext, "+)*@", label, "(?:\\.", label, ")+$")},
        {"hostname", absl::StrCat("^", label, "(?:\\.", label, ")*$")},
        {"ipv4", absl::StrCat("^", ipv4, "$")},
        {"ipv6", Ipv6Regex(ipv4)},
        {"uuid", absl::StrCat("^", hex, "{8}-", hex, "{4}-", hex, "{4}-", hex, "{4}-", hex, "{12}$")},
        {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9._~:/?#\\[\\]@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*$"},
    };
  }();
  return *formats;
}

}  // namespace

std::vector<std::string_view> StringPattern::FormatNames() {
  std::vector<std::string_view> names;
  for (const FormatEntry& entry : Formats()) names.push_back(entry.name);
  return names;
}

std::string_view StringPattern::FormatRegex(std::string_view name) {
  for (const FormatEntry& entry : Formats()) {
    if (entry.name == name) return entry.regex;
  }
  return {};
}

std::shared_ptr<const StringPattern> StringPattern::Format(std::string_view name) {
  // Compiled on first use, each once; they are built from constants, so a failure is a bug.
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const StringPattern>, std::less<>> compiled;
  const std::string_view regex = FormatRegex(name);
  if (regex.empty()) return nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = compiled.find(name);
  if (found != compiled.end()) return found->second;
  absl::StatusOr<std::shared_ptr<const StringPattern>> pattern = Compile(regex);
  if (!pattern.ok()) {
    std::fprintf(stderr, "format %.*s: %s\n", static_cast<int>(name.size()), name.data(),
                 std::string(pattern.status().message()).c_str());
    std::abort();
  }
  compiled.emplace(std::string(name), *pattern);
  return *std::move(pattern);
}

absl::StatusOr<std::shared_ptr<const PatternLengths>> PatternLengths::Compile(
    const StringPattern& pattern, int64_t min_length, int64_t max_length) {
  const std::vector<int8_t>& left = pattern.bytes_left();
  const auto count = static_cast<size_t>(pattern.states());
  // The distinct moves of each state, and whether each ends a character (a move into a
  // state between characters does).
  std::vector<size_t> first(count + 1, 0);
  std::vector<int32_t> to;
  std::vector<uint8_t> ends;
  for (size_t s = 0; s < count; ++s) {
    first[s] = to.size();
    if (left[s] < 0) continue;
    const size_t begin = to.size();
    for (int byte = 0; byte < 256; ++byte) {
      const int32_t t = pattern.Next(static_cast<int32_t>(s), static_cast<unsigned char>(byte));
      if (t == StringPattern::kDead) continue;
      if (std::find(to.begin() + static_cast<std::ptrdiff_t>(begin), to.end(), t) != to.end()) continue;
      to.push_back(t);
      ends.push_back(left[static_cast<size_t>(t)] == 0 ? 1 : 0);
    }
  }
  first[count] = to.size();
  // A move that does not end a character goes one byte further into it: states one byte
  // from a character's end first, then two, then three, then those between characters, so
  // that such a move's target is filled before its source in each length.
  std::vector<int32_t> order;
  for (const int8_t want : {1, 2, 3, 0}) {
    for (size_t s = 0; s < count; ++s) {
      if (left[s] == want) order.push_back(static_cast<int32_t>(s));
    }
  }
  auto lengths = std::make_shared<PatternLengths>();
  lengths->min_length_ = min_length;
  lengths->max_length_ = max_length;
  const bool bounded = max_length >= 0;
  // With a maximum, lengths 0 to max_length. Without, 0 to min_length, or fewer: the sets
  // only shrink, and once one repeats all further ones do, so within the states' count.
  const int64_t tracked =
      (bounded ? max_length : std::min(min_length, static_cast<int64_t>(count))) + 1;
  const auto moves = static_cast<int64_t>(to.size()) + static_cast<int64_t>(count);
  if (tracked > kMaxBits / static_cast<int64_t>(count) || tracked > kMaxWork / moves) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pattern beside ", bounded ? "maxLength " : "minLength ", tracked - 1,
        ": too costly to track (", count, " automaton states times the length)"));
  }
  lengths->words_ = static_cast<size_t>((tracked + 63) / 64);
  lengths->bits_.assign(count * lengths->words_, 0);
  std::vector<uint8_t> previous(count, 0);
  std::vector<uint8_t> current(count, 0);
  int64_t n = 0;
  for (; n < tracked; ++n) {
    for (const int32_t s : order) {
      const auto at = static_cast<size_t>(s);
      bool reach;
      if (bounded) {
        // A match exactly n characters on.
        reach = n == 0 && left[at] == 0 && pattern.Accepts(s);
      } else {
        // A match n or more characters on: from every state when n = 0 (each can reach one).
        reach = n == 0;
      }
      for (size_t e = first[at]; !reach && e < first[at + 1]; ++e) {
        const auto t = static_cast<size_t>(to[e]);
        reach = ends[e] != 0 ? n > 0 && previous[t] != 0 : current[t] != 0;
      }
      current[at] = reach ? 1 : 0;
      if (reach) lengths->bits_[at * lengths->words_ + static_cast<size_t>(n / 64)] |= uint64_t{1} << (n % 64);
    }
    // Without a maximum the sets only shrink; once one repeats, all further ones do.
    if (!bounded && n > 0 && current == previous) break;
    std::swap(previous, current);
  }
  lengths->tracked_ = bounded ? tracked : std::min(n + 1, tracked);
  if (!lengths->Reachable(StringPattern::start(), 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no string of ", min_length, bounded ? absl::StrCat(" to ", max_length) : " or more",
        " characters matches the pattern"));
  }
  return std::shared_ptr<const PatternLengths>(std::move(lengths));
}

bool PatternLengths::Reachable(int32_t state, int64_t written) const {
  const int64_t low = std::max<int64_t>(0, min_length_ - written);
  if (max_length_ < 0) return Bit(state, std::min(low, tracked_ - 1));
  const int64_t high = max_length_ - written;
  for (int64_t n = low; n <= high; ++n) {
    if (n % 64 == 0 && n + 63 <= high &&
        bits_[static_cast<size_t>(state) * words_ + static_cast<size_t>(n / 64)] == 0) {
      n += 63;
      continue;
    }
    if (Bit(state, n)) return true;
  }
  return false;
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
