#include "models/grammar/ebnf_grammar.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/tokenizers/tokenizer_utf8.h"

namespace tophat {
namespace {

constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
// The largest count a {m,n} may give (kMaxEbnfStates bounds what they multiply).
constexpr uint32_t kMaxRepetition = 1 << 16;
// The states visited finding every state's closure, in all.
constexpr size_t kMaxClosureSteps = size_t{1} << 23;

// A rule's body as parsed: alternatives of sequences of classes and calls, each repeated
// min..max times.
struct Ast {
  enum class Kind : uint8_t { kAlternatives, kSequence, kClass, kCall };
  Kind kind = Kind::kSequence;
  std::vector<Ast> children;
  uint32_t id = 0;  // the class (kClass) or rule (kCall)
  uint32_t min = 1;
  uint32_t max = 1;
};

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Quoted(uint32_t c) {
  if (c >= 0x20 && c < 0x7F) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  return absl::StrFormat("U+%04X", c);  // Unicode's own notation, upper case
}

}  // namespace

bool EbnfGrammar::CharClass::Contains(uint32_t c) const {
  for (const Range& range : ranges) {
    if (c < range.lo) return false;
    if (c <= range.hi) return true;
  }
  return false;
}

bool EbnfGrammar::CharClass::Intersects(uint32_t lo, uint32_t hi) const {
  for (const Range& range : ranges) {
    if (range.lo > hi) return false;
    if (range.hi >= lo) return true;
  }
  return false;
}

// Parses a grammar's text into rules and compiles them into the automaton.
class EbnfCompiler {
 public:
  explicit EbnfCompiler(std::string_view text) : text_(text) {}

  absl::StatusOr<std::shared_ptr<const EbnfGrammar>> Compile() {
    if (text_.size() > kMaxEbnfGrammarBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: longer than ", kMaxEbnfGrammarBytes, " bytes"));
    }
    if (absl::Status parsed = ParseRules(); !parsed.ok()) return parsed;
    for (size_t rule = 0; rule < names_.size(); ++rule) {
      if (!bodies_[rule].has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "grammar: rule '", names_[rule], "' (", Where(first_use_[rule]), ") is not defined"));
      }
    }
    const auto root = rule_ids_.find("root");
    if (root == rule_ids_.end() || !bodies_[root->second].has_value()) {
      return absl::InvalidArgumentError(
          "grammar: no 'root' rule (root ::= ... is the whole answer)");
    }
    grammar_ = std::make_shared<EbnfGrammar>();
    grammar_->root_ = root->second;
    grammar_->classes_ = std::move(classes_);
    grammar_->rule_starts_.resize(names_.size());
    for (size_t rule = 0; rule < names_.size(); ++rule) {
      absl::StatusOr<Fragment> body = Build(*bodies_[rule]);
      if (!body.ok()) return body.status();
      grammar_->rule_starts_[rule] = body->start;
      ends_[body->end] = true;
    }
    if (absl::Status productive = CheckProductive(); !productive.ok()) return productive;
    // Before the closures take the terminal edges.
    nullable_ = RulesThatEnd(/*through_characters=*/false);
    if (absl::Status closures = ComputeClosures(); !closures.ok()) return closures;
    if (absl::Status left = CheckLeftRecursion(); !left.ok()) return left;
    return std::shared_ptr<const EbnfGrammar>(std::move(grammar_));
  }

 private:
  struct Fragment {
    uint32_t start;
    uint32_t end;
  };

  // --- Parsing ---

  std::string Where(size_t pos) const {
    size_t line = 1;
    size_t column = 1;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::StrCat("line ", line, ", column ", column);
  }
  absl::Status ErrorAt(size_t pos, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: ", Where(pos), ": ", std::string(what)));
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // Spaces, newlines and comments.
  void SkipSpace() {
    while (!AtEnd()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && text_[pos_] != '\n') ++pos_;
      } else {
        return;
      }
    }
  }

  std::string_view ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  // Whether a rule's definition (`name ::=`) starts here.
  bool AtRuleStart() const {
    size_t at = pos_;
    if (at >= text_.size() || !IsNameChar(text_[at])) return false;
    while (at < text_.size() && IsNameChar(text_[at])) ++at;
    while (at < text_.size()) {
      const char c = text_[at];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++at;
      } else if (c == '#') {
        while (at < text_.size() && text_[at] != '\n') ++at;
      } else {
        break;
      }
    }
    return text_.substr(at, 3) == "::=";
  }

  uint32_t RuleId(std::string_view name, size_t used_at) {
    const auto [it, added] = rule_ids_.try_emplace(std::string(name), names_.size());
    if (added) {
      names_.emplace_back(name);
      bodies_.emplace_back();
      defined_at_.push_back(0);
      first_use_.push_back(used_at);
    }
    return it->second;
  }

  absl::Status ParseRules() {
    SkipSpace();
    while (!AtEnd()) {
      const size_t start = pos_;
      const std::string_view name = ParseName();
      if (name.empty())
        return ErrorAt(pos_, absl::StrCat("expected a rule's name, found ",
                                          Quoted(static_cast<uint8_t>(Peek()))));
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") {
        return ErrorAt(
            pos_, absl::StrCat("expected '::=' after the rule's name '", std::string(name), "'"));
      }
      pos_ += 3;
      const uint32_t rule = RuleId(name, start);
      if (bodies_[rule].has_value()) {
        return ErrorAt(start,
                       absl::StrCat("rule '", std::string(name), "' is defined twice (first at ",
                                    Where(defined_at_[rule]), ")"));
      }
      defined_at_[rule] = start;
      SkipSpace();
      absl::StatusOr<Ast> body = ParseAlternatives(/*nested=*/false, 0);
      if (!body.ok()) return body.status();
      bodies_[rule] = *std::move(body);
      SkipSpace();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Ast> ParseAlternatives(bool nested, int depth) {
    if (depth > 256) return ErrorAt(pos_, "groups nested more than 256 deep");
    Ast alternatives{.kind = Ast::Kind::kAlternatives};
    while (true) {
      absl::StatusOr<Ast> sequence = ParseSequence(nested, depth);
      if (!sequence.ok()) return sequence.status();
      alternatives.children.push_back(*std::move(sequence));
      if (Peek() != '|') break;
      ++pos_;
      SkipSpace();
    }
    if (alternatives.children.size() == 1) return std::move(alternatives.children.front());
    return alternatives;
  }

  absl::StatusOr<Ast> ParseSequence(bool nested, int depth) {
    Ast sequence{.kind = Ast::Kind::kSequence};
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '|') break;
      if (c == ')') {
        if (nested) break;
        return ErrorAt(pos_, "')' without its '('");
      }
      if (AtRuleStart()) {
        if (nested) return ErrorAt(pos_, "expected ')' before the next rule");
        break;
      }
      const size_t start = pos_;
      Ast element;
      if (c == '"') {
        absl::StatusOr<Ast> literal = ParseLiteral();
        if (!literal.ok()) return literal.status();
        element = *std::move(literal);
      } else if (c == '[') {
        absl::StatusOr<Ast> char_class = ParseClass();
        if (!char_class.ok()) return char_class.status();
        element = *std::move(char_class);
      } else if (c == '.') {
        ++pos_;
        element =
            Ast{.kind = Ast::Kind::kClass, .id = AddClass({EbnfGrammar::Range{0, kMaxCodePoint}})};
      } else if (c == '(') {
        ++pos_;
        SkipSpace();
        absl::StatusOr<Ast> group = ParseAlternatives(/*nested=*/true, depth + 1);
        if (!group.ok()) return group.status();
        if (Peek() != ')') return ErrorAt(start, "'(' without its ')'");
        ++pos_;
        element = *std::move(group);
      } else if (IsNameChar(c)) {
        const std::string_view name = ParseName();
        element = Ast{.kind = Ast::Kind::kCall, .id = RuleId(name, start)};
      } else {
        return ErrorAt(pos_, absl::StrCat("unexpected ", Quoted(static_cast<uint8_t>(c))));
      }
      SkipSpace();
      if (absl::Status repeated = ParseRepetition(element); !repeated.ok()) return repeated;
      SkipSpace();
      sequence.children.push_back(std::move(element));
    }
    return sequence;
  }

  // *, +, ?, {m}, {m,}, {m,n} or {,n} after an element, if any.
  absl::Status ParseRepetition(Ast& element) {
    const char c = Peek();
    uint32_t min = 1;
    uint32_t max = 1;
    if (c == '*') {
      min = 0;
      max = kUnbounded;
    } else if (c == '+') {
      max = kUnbounded;
    } else if (c == '?') {
      min = 0;
    } else if (c == '{') {
      const size_t start = pos_;
      ++pos_;
      const auto number = [&]() -> std::optional<uint32_t> {
        SkipSpace();
        if (AtEnd() || Peek() < '0' || Peek() > '9') return std::nullopt;
        uint64_t value = 0;
        while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
          value = std::min<uint64_t>(value * 10 + static_cast<uint64_t>(Peek() - '0'),
                                     uint64_t{kMaxRepetition} + 1);
          ++pos_;
        }
        SkipSpace();
        return static_cast<uint32_t>(value);
      };
      const std::optional<uint32_t> low = number();
      min = low.value_or(0);
      max = min;
      if (Peek() == ',') {
        ++pos_;
        const std::optional<uint32_t> high = number();
        max = high.value_or(kUnbounded);
        if (!low.has_value() && !high.has_value()) return ErrorAt(start, "'{,}' gives no count");
      } else if (!low.has_value()) {
        return ErrorAt(start, "expected a count after '{'");
      }
      if (Peek() != '}') return ErrorAt(start, "'{' without its '}'");
      if ((min != kUnbounded && min > kMaxRepetition) ||
          (max != kUnbounded && max > kMaxRepetition)) {
        return ErrorAt(start, absl::StrCat("a count above ", kMaxRepetition));
      }
      if (max < min)
        return ErrorAt(start,
                       absl::StrCat("{", min, ",", max, "}: the most is less than the least"));
    } else {
      return absl::OkStatus();
    }
    ++pos_;
    element.min = min;
    element.max = max;
    return absl::OkStatus();
  }

  // One character of a literal or a class: an escape or a UTF-8 character.
  absl::StatusOr<uint32_t> ParseChar() {
    const size_t start = pos_;
    const auto byte = static_cast<uint8_t>(text_[pos_]);
    if (byte == '\\') {
      if (pos_ + 1 >= text_.size()) return ErrorAt(start, "an escape at the end of the text");
      const char e = text_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint32_t>(e);
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t value = 0;
          for (int i = 0; i < digits; ++i) {
            const int digit = pos_ < text_.size() ? HexValue(text_[pos_]) : -1;
            if (digit < 0) {
              return ErrorAt(start, absl::StrCat("'\\", std::string(1, e), "' needs ", digits,
                                                 " hexadecimal digits"));
            }
            value = value * 16 + static_cast<uint32_t>(digit);
            ++pos_;
          }
          if (value > kMaxCodePoint || (value >= 0xD800 && value <= 0xDFFF)) {
            return ErrorAt(start, "an escape that is not a Unicode character");
          }
          return value;
        }
        default: {
          // Named by its character, whole: a byte of it would make the message not UTF-8.
          if (static_cast<uint8_t>(e) >= 0x20 && static_cast<uint8_t>(e) < 0x7F) {
            return ErrorAt(start, absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
          }
          size_t length = 0;
          const char32_t escaped = utf8::DecodeAt(text_, pos_ - 1, &length);
          return ErrorAt(start, absl::StrCat("unknown escape: '\\' before ",
                                             Quoted(static_cast<uint32_t>(escaped))));
        }
      }
    }
    // UTF-8 in the grammar's own text: an ill-formed byte decodes as U+FFFD of length 1.
    size_t length = 0;
    const char32_t value = utf8::DecodeAt(text_, pos_, &length);
    if (length == 1 && byte >= 0x80) return ErrorAt(start, "a byte that is not UTF-8");
    pos_ += length;
    return static_cast<uint32_t>(value);
  }

  absl::StatusOr<Ast> ParseLiteral() {
    const size_t start = pos_;
    ++pos_;  // '"'
    Ast literal{.kind = Ast::Kind::kSequence};
    while (true) {
      if (AtEnd() || Peek() == '\n') return ErrorAt(start, "'\"' without its closing '\"'");
      if (Peek() == '"') break;
      absl::StatusOr<uint32_t> c = ParseChar();
      if (!c.ok()) return c.status();
      literal.children.push_back(
          Ast{.kind = Ast::Kind::kClass, .id = AddClass({EbnfGrammar::Range{*c, *c}})});
    }
    ++pos_;
    if (literal.children.size() == 1) return std::move(literal.children.front());
    return literal;
  }

  absl::StatusOr<Ast> ParseClass() {
    const size_t start = pos_;
    ++pos_;  // '['
    const bool negated = Peek() == '^';
    if (negated) ++pos_;
    std::vector<EbnfGrammar::Range> ranges;
    while (true) {
      if (AtEnd() || Peek() == '\n') return ErrorAt(start, "'[' without its ']'");
      if (Peek() == ']') break;
      absl::StatusOr<uint32_t> lo = ParseChar();
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        const size_t dash = pos_;
        ++pos_;
        absl::StatusOr<uint32_t> end = ParseChar();
        if (!end.ok()) return end.status();
        if (*end < *lo) {
          return ErrorAt(dash,
                         absl::StrCat("a range from ", Quoted(*lo), " down to ", Quoted(*end)));
        }
        hi = *end;
      }
      ranges.push_back({*lo, hi});
    }
    ++pos_;
    if (ranges.empty() && !negated) return ErrorAt(start, "an empty character class");
    std::sort(ranges.begin(), ranges.end(),
              [](const EbnfGrammar::Range& a, const EbnfGrammar::Range& b) { return a.lo < b.lo; });
    std::vector<EbnfGrammar::Range> merged;
    for (const EbnfGrammar::Range& range : ranges) {
      if (!merged.empty() && range.lo <= merged.back().hi + 1) {
        merged.back().hi = std::max(merged.back().hi, range.hi);
      } else {
        merged.push_back(range);
      }
    }
    if (negated) {
      std::vector<EbnfGrammar::Range> complement;
      uint32_t next = 0;
      for (const EbnfGrammar::Range& range : merged) {
        if (range.lo > next) complement.push_back({next, range.lo - 1});
        next = range.hi + 1;
      }
      if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
      if (complement.empty()) return ErrorAt(start, "a class that takes no character");
      merged = std::move(complement);
    }
    return Ast{.kind = Ast::Kind::kClass, .id = AddClass(std::move(merged))};
  }

  uint32_t AddClass(std::vector<EbnfGrammar::Range> ranges) {
    classes_.push_back(EbnfGrammar::CharClass{std::move(ranges)});
    return static_cast<uint32_t>(classes_.size() - 1);
  }

  // --- The automaton ---

  absl::StatusOr<uint32_t> NewState() {
    if (terminals_.size() >= kMaxEbnfStates) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: compiles to more than ", kMaxEbnfStates,
                       " states (repetition counts multiply what they repeat)"));
    }
    terminals_.emplace_back();
    calls_.emplace_back();
    empty_moves_.emplace_back();
    ends_.push_back(false);
    return static_cast<uint32_t>(terminals_.size() - 1);
  }

  absl::StatusOr<Fragment> Build(const Ast& node) {
    if (node.min == 1 && node.max == 1) return BuildOnce(node);
    absl::StatusOr<uint32_t> start = NewState();
    if (!start.ok()) return start.status();
    uint32_t at = *start;
    for (uint32_t i = 0; i < node.min; ++i) {
      absl::StatusOr<Fragment> once = BuildOnce(node);
      if (!once.ok()) return once.status();
      empty_moves_[at].push_back(once->start);
      at = once->end;
    }
    if (node.max == kUnbounded) {
      // A loop on `at`: zero or more further copies.
      absl::StatusOr<Fragment> once = BuildOnce(node);
      if (!once.ok()) return once.status();
      empty_moves_[at].push_back(once->start);
      empty_moves_[once->end].push_back(at);
      return Fragment{*start, at};
    }
    absl::StatusOr<uint32_t> end = NewState();
    if (!end.ok()) return end.status();
    empty_moves_[at].push_back(*end);
    for (uint32_t i = node.min; i < node.max; ++i) {
      absl::StatusOr<Fragment> once = BuildOnce(node);
      if (!once.ok()) return once.status();
      empty_moves_[at].push_back(once->start);
      at = once->end;
      empty_moves_[at].push_back(*end);
    }
    return Fragment{*start, *end};
  }

  absl::StatusOr<Fragment> BuildOnce(const Ast& node) {
    absl::StatusOr<uint32_t> start = NewState();
    if (!start.ok()) return start.status();
    switch (node.kind) {
      case Ast::Kind::kClass:
      case Ast::Kind::kCall: {
        absl::StatusOr<uint32_t> end = NewState();
        if (!end.ok()) return end.status();
        if (node.kind == Ast::Kind::kClass) {
          terminals_[*start].push_back({node.id, *end});
        } else {
          calls_[*start].push_back({node.id, *end});
        }
        return Fragment{*start, *end};
      }
      case Ast::Kind::kSequence: {
        uint32_t at = *start;
        for (const Ast& child : node.children) {
          absl::StatusOr<Fragment> part = Build(child);
          if (!part.ok()) return part.status();
          empty_moves_[at].push_back(part->start);
          at = part->end;
        }
        return Fragment{*start, at};
      }
      case Ast::Kind::kAlternatives: {
        absl::StatusOr<uint32_t> end = NewState();
        if (!end.ok()) return end.status();
        for (const Ast& child : node.children) {
          absl::StatusOr<Fragment> part = Build(child);
          if (!part.ok()) return part.status();
          empty_moves_[*start].push_back(part->start);
          empty_moves_[part->end].push_back(*end);
        }
        return Fragment{*start, *end};
      }
    }
    return absl::InternalError("grammar: an unknown element");
  }

  // Which rules can end, and so which states can reach their rule's end: through characters
  // and calls (`through_characters`: a rule that derives some finite text), or through empty
  // moves and calls of such rules alone (a rule that may match nothing). A worklist over the
  // reversed edges, linear in the automaton.
  std::vector<bool> RulesThatEnd(bool through_characters) const {
    const size_t count = terminals_.size();
    const size_t rules = names_.size();
    std::vector<std::vector<uint32_t>> before(count);  // s -> t by a character or no move
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> calling(count);  // t: (s, rule)
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> callers(rules);  // rule: (s, t)
    std::vector<std::vector<uint32_t>> starting(count);  // the rules starting at a state
    for (uint32_t s = 0; s < count; ++s) {
      if (through_characters) {
        for (const EbnfGrammar::Terminal& terminal : terminals_[s]) {
          before[terminal.target].push_back(s);
        }
      }
      for (const uint32_t t : empty_moves_[s]) before[t].push_back(s);
      for (const EbnfGrammar::Call& call : calls_[s]) {
        calling[call.target].emplace_back(s, call.rule);
        callers[call.rule].emplace_back(s, call.target);
      }
    }
    for (uint32_t rule = 0; rule < rules; ++rule) {
      starting[grammar_->rule_starts_[rule]].push_back(rule);
    }
    std::vector<bool> finishes(count, false);
    std::vector<bool> ends(rules, false);
    std::vector<uint32_t> work;
    const auto mark = [&](uint32_t s) {
      if (!finishes[s]) {
        finishes[s] = true;
        work.push_back(s);
      }
    };
    for (uint32_t s = 0; s < count; ++s) {
      if (ends_[s]) mark(s);
    }
    while (!work.empty()) {
      const uint32_t at = work.back();
      work.pop_back();
      for (const uint32_t s : before[at]) mark(s);
      for (const auto& [s, rule] : calling[at]) {
        if (ends[rule]) mark(s);
      }
      for (const uint32_t rule : starting[at]) {
        ends[rule] = true;
        for (const auto& [s, t] : callers[rule]) {
          if (finishes[t]) mark(s);
        }
      }
    }
    return ends;
  }

  // A rule no finite text completes (`a ::= "x" a`) would let an answer run on forever
  // with every prefix taken: refused. Otherwise every state can reach its rule's end, so a
  // text the matcher takes can always be completed.
  absl::Status CheckProductive() const {
    const std::vector<bool> productive = RulesThatEnd(/*through_characters=*/true);
    for (uint32_t rule = 0; rule < names_.size(); ++rule) {
      if (!productive[rule]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "grammar: rule '", names_[rule], "' (", Where(defined_at_[rule]),
            ") never ends: every way through it calls a rule that no finite text completes"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ComputeClosures() {
    const size_t count = terminals_.size();
    // Each state's closure is found on its own: optional parts in a long row make that
    // quadratic (`("a"?){30000}`), so its total is bounded.
    size_t steps = 0;
    grammar_->terminals_ = std::move(terminals_);
    grammar_->closures_.resize(count);
    std::vector<uint32_t> seen_at(count, kUnbounded);
    std::vector<uint32_t> stack;
    for (uint32_t state = 0; state < count; ++state) {
      EbnfGrammar::Closure& closure = grammar_->closures_[state];
      stack = {state};
      seen_at[state] = state;
      while (!stack.empty()) {
        const uint32_t at = stack.back();
        stack.pop_back();
        if (++steps > kMaxClosureSteps) {
          return absl::InvalidArgumentError(absl::StrCat(
              "grammar: too many ways to skip optional parts (more than ", kMaxClosureSteps,
              " steps to compile); repeat a group with {m,n} rather than a row of optional ones"));
        }
        if (!grammar_->terminals_[at].empty()) closure.ready.push_back(at);
        for (const EbnfGrammar::Call& call : calls_[at]) closure.calls.push_back(call);
        if (ends_[at]) closure.ends = true;
        for (const uint32_t next : empty_moves_[at]) {
          if (seen_at[next] != state) {
            seen_at[next] = state;
            stack.push_back(next);
          }
        }
      }
      std::sort(closure.ready.begin(), closure.ready.end());
      closure.ends_only = closure.ends && closure.ready.empty() && closure.calls.empty();
    }
    return absl::OkStatus();
  }

  // Left recursion would call rules forever without reading: refused, naming the cycle.
  absl::Status CheckLeftRecursion() {
    const size_t rules = names_.size();
    const std::vector<bool>& nullable = nullable_;
    std::vector<uint32_t> seen(grammar_->state_count(), kUnbounded);
    uint32_t mark = 0;
    // first[r]: the rules r may call before reading anything.
    std::vector<std::vector<uint32_t>> first(rules);
    for (uint32_t rule = 0; rule < rules; ++rule) {
      std::vector<uint32_t> states = {grammar_->rule_starts_[rule]};
      const uint32_t this_mark = mark++;
      seen[states.back()] = this_mark;
      while (!states.empty()) {
        const uint32_t at = states.back();
        states.pop_back();
        for (const EbnfGrammar::Call& call : grammar_->closures_[at].calls) {
          first[rule].push_back(call.rule);
          if (nullable[call.rule] && seen[call.target] != this_mark) {
            seen[call.target] = this_mark;
            states.push_back(call.target);
          }
        }
      }
    }
    // A cycle in `first`, by depth-first search (iterative: a grammar may hold thousands of
    // rules).
    std::vector<uint8_t> color(rules, 0);  // 0 unvisited, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;  // a rule and the next of its callees
    for (uint32_t root = 0; root < rules; ++root) {
      if (color[root] != 0) continue;
      color[root] = 1;
      path.emplace_back(root, 0);
      while (!path.empty()) {
        auto& [rule, next] = path.back();
        if (next == first[rule].size()) {
          color[rule] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t callee = first[rule][next++];
        if (color[callee] == 1) {
          std::vector<std::string> names;
          auto it = std::find_if(path.begin(), path.end(),
                                 [&](const auto& entry) { return entry.first == callee; });
          for (; it != path.end(); ++it) names.push_back(names_[it->first]);
          names.push_back(names_[callee]);
          return absl::InvalidArgumentError(absl::StrCat(
              "grammar: rule '", names.front(), "' is left-recursive (",
              absl::StrJoin(names, " -> "),
              " before reading a character); write the repetition with * or + instead"));
        }
        if (color[callee] == 0) {
          color[callee] = 1;
          path.emplace_back(callee, 0);
        }
      }
    }
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
  absl::flat_hash_map<std::string, uint32_t> rule_ids_;
  std::vector<std::string> names_;
  std::vector<std::optional<Ast>> bodies_;
  std::vector<size_t> defined_at_;
  std::vector<size_t> first_use_;
  std::vector<EbnfGrammar::CharClass> classes_;
  std::vector<std::vector<EbnfGrammar::Terminal>> terminals_;
  std::vector<std::vector<EbnfGrammar::Call>> calls_;
  std::vector<std::vector<uint32_t>> empty_moves_;
  std::vector<bool> ends_;
  std::vector<bool> nullable_;  // rules that may match nothing
  std::shared_ptr<EbnfGrammar> grammar_;
};

absl::StatusOr<std::shared_ptr<const EbnfGrammar>> EbnfGrammar::Compile(std::string_view text) {
  return EbnfCompiler(text).Compile();
}

EbnfWorkspace::EbnfWorkspace(const EbnfGrammar* grammar)
    : grammar_(grammar),
      ids_(0, ConfigurationHash{&configurations_}, ConfigurationEq{&configurations_}) {
  Configuration first;
  advanced_.clear();
  visited_.clear();
  Expand(grammar_->root_start(), nullptr, advanced_, &first.accepts);
  std::sort(advanced_.begin(), advanced_.end());
  advanced_.erase(std::unique(advanced_.begin(), advanced_.end()), advanced_.end());
  first.items.assign(advanced_.begin(), advanced_.end());
  start_ = Intern(std::move(first));
}

const EbnfWorkspace::Node* EbnfWorkspace::Push(uint32_t resume, const Node* caller, bool* over) {
  const int32_t depth = caller == nullptr ? 1 : caller->depth + 1;
  if (depth > kMaxEbnfCallDepth) {
    *over = true;
    over_limit_ = true;
    return nullptr;
  }
  const auto it = interned_nodes_.find(std::make_pair(resume, caller));
  if (it != interned_nodes_.end()) return it->second;
  if (nodes_.size() >= kMaxStackNodes) {
    *over = true;
    over_limit_ = true;
    return nullptr;
  }
  const Node* node = &nodes_.emplace_back(Node{resume, depth, caller});
  interned_nodes_.emplace(std::make_pair(resume, caller), node);
  return node;
}

void EbnfWorkspace::Expand(uint32_t state, const Node* stack, std::vector<Item>& out,
                           bool* accepts) {
  pending_.clear();
  pending_.emplace_back(state, stack);
  while (!pending_.empty()) {
    const auto [at, under] = pending_.back();
    pending_.pop_back();
    if (!visited_.emplace(at, under).second) continue;
    const EbnfGrammar::Closure& closure = grammar_->closure(at);
    for (const uint32_t ready : closure.ready) out.emplace_back(ready, under);
    for (const EbnfGrammar::Call& call : closure.calls) {
      const Node* callee = under;
      // A call whose caller has nothing left to read returns straight to the caller's
      // caller: right recursion keeps its stack.
      if (!grammar_->closure(call.target).ends_only) {
        bool over = false;
        callee = Push(call.target, under, &over);
        if (over) continue;
      }
      pending_.emplace_back(grammar_->rule_start(call.rule), callee);
    }
    if (closure.ends) {
      if (under == nullptr) {
        *accepts = true;
      } else {
        pending_.emplace_back(under->resume, under->caller);
      }
    }
  }
}

bool EbnfWorkspace::Advance(const Configuration& from, uint32_t c, Configuration* to) {
  advanced_.clear();
  visited_.clear();
  to->accepts = false;
  for (const Item& item : from.items) {
    for (const EbnfGrammar::Terminal& terminal : grammar_->terminals(item.first)) {
      if (grammar_->char_class(terminal.char_class).Contains(c)) {
        Expand(terminal.target, item.second, advanced_, &to->accepts);
      }
    }
  }
  work_ += from.items.size() + visited_.size();
  std::sort(advanced_.begin(), advanced_.end());
  advanced_.erase(std::unique(advanced_.begin(), advanced_.end()), advanced_.end());
  if (advanced_.size() > kMaxWays || work_ > kMaxWork) {
    // An ambiguous grammar can double its ways with each character ("("+ expr, where
    // expr may start with "(" too), and each new transition costs its ways: past either
    // bound the character is refused.
    over_limit_ = true;
    return false;
  }
  to->items.assign(advanced_.begin(), advanced_.end());
  return !to->items.empty() || to->accepts;
}

bool EbnfWorkspace::Viable(const Configuration& c) const {
  const uint32_t free_bits = 6u * c.pending_bytes;
  uint32_t lo = c.pending << free_bits;
  uint32_t hi = std::min(lo | ((1u << free_bits) - 1), kMaxCodePoint);
  if (c.lead != 0) {
    // Only the first byte is read: the shortest form and surrogates are not characters.
    static constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    lo = std::max(lo, kLeast[c.pending_bytes]);
    if (c.lead == 0xED) hi = 0xD7FF;
  }
  for (const Item& item : c.items) {
    for (const EbnfGrammar::Terminal& terminal : grammar_->terminals(item.first)) {
      if (grammar_->char_class(terminal.char_class).Intersects(lo, hi)) return true;
    }
  }
  return false;
}

bool EbnfWorkspace::Step(const Configuration& from, uint8_t byte, Configuration* to) {
  if (from.pending_bytes == 0) {
    if (byte < 0x80) return Advance(from, byte, to);
    to->items = from.items;
    // A character starts: the answer cannot end inside it.
    to->accepts = false;
    if (byte >= 0xC2 && byte <= 0xDF) {
      to->pending_bytes = 1;
      to->pending = byte & 0x1F;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      to->pending_bytes = 2;
      to->pending = byte & 0x0F;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      to->pending_bytes = 3;
      to->pending = byte & 0x07;
    } else {
      return false;
    }
    to->lead = byte;
    return Viable(*to);
  }
  uint8_t least = 0x80;
  uint8_t most = 0xBF;
  if (from.lead == 0xE0) least = 0xA0;  // shorter forms
  if (from.lead == 0xED) most = 0x9F;   // surrogates
  if (from.lead == 0xF0) least = 0x90;  // shorter forms
  if (from.lead == 0xF4) most = 0x8F;   // past U+10FFFF
  if (byte < least || byte > most) return false;
  const uint32_t bits = (from.pending << 6) | (byte & 0x3F);
  if (from.pending_bytes > 1) {
    to->items = from.items;
    to->accepts = false;
    to->pending = bits;
    to->pending_bytes = static_cast<uint8_t>(from.pending_bytes - 1);
    to->lead = 0;
    return Viable(*to);
  }
  return Advance(from, bits, to);
}

int32_t EbnfWorkspace::Intern(Configuration c) {
  // Stored once, in configurations_: the set holds ids and hashes what they name.
  configurations_.push_back(std::move(c));
  const auto id = static_cast<int32_t>(configurations_.size() - 1);
  const auto [it, added] = ids_.insert(id);
  if (!added) {
    configurations_.pop_back();
    return *it;
  }
  if (configurations_.size() > kMaxConfigurations) {
    ids_.erase(id);
    configurations_.pop_back();
    over_limit_ = true;
    return kDead;
  }
  rows_.emplace_back();
  loops_.push_back(kUnknown);
  return id;
}

namespace {

// TokenVocabulary::IsPlainCharacter as ranges, for LoopsOnPlainCharacters' bounds.
constexpr EbnfGrammar::Range kPlain[] = {
    {0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, 0xD7FF}, {0xE000, kMaxCodePoint}};
// The two agree at each range's ends and just past them (between the ranges lie only the
// characters IsPlainCharacter leaves out).
constexpr bool PlainRangesAgree() {
  for (const EbnfGrammar::Range& range : kPlain) {
    if (!TokenVocabulary::IsPlainCharacter(range.lo) ||
        !TokenVocabulary::IsPlainCharacter(range.hi) ||
        TokenVocabulary::IsPlainCharacter(range.lo - 1) ||
        TokenVocabulary::IsPlainCharacter(range.hi + 1)) {
      return false;
    }
  }
  return true;
}
static_assert(PlainRangesAgree());

}  // namespace

bool EbnfWorkspace::LoopsOnPlainCharacters(int32_t configuration) {
  const auto at = static_cast<size_t>(configuration);
  if (loops_[at] != kUnknown) return loops_[at] == 1;
  loops_[at] = 0;
  // configurations_ is a deque, and nothing is interned below: the reference stays valid.
  const Configuration& from = configurations_[at];
  if (from.pending_bytes != 0 || from.items.empty()) return false;
  // A character's next configuration depends only on which of the ways' classes hold it
  // (Advance), so between consecutive bounds of those classes and of the plain characters
  // one character stands for all.
  bounds_.clear();
  const auto add = [&](const EbnfGrammar::Range& range) {
    bounds_.push_back(range.lo);
    bounds_.push_back(range.hi + 1);
  };
  for (const EbnfGrammar::Range& range : kPlain) add(range);
  for (const Item& item : from.items) {
    for (const EbnfGrammar::Terminal& terminal : grammar_->terminals(item.first)) {
      for (const EbnfGrammar::Range& range : grammar_->char_class(terminal.char_class).ranges) {
        add(range);
      }
    }
    if (bounds_.size() > kMaxLoopBounds) return false;  // walked instead
  }
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  // A character refused for a bound here is not one the answer met: not reported.
  const bool was_over_limit = over_limit_;
  Configuration next;
  for (size_t i = 0; i + 1 < bounds_.size(); ++i) {
    if (!TokenVocabulary::IsPlainCharacter(bounds_[i])) continue;
    if (!Advance(from, bounds_[i], &next) || !(next == from)) {
      over_limit_ = was_over_limit;
      return false;
    }
  }
  loops_[at] = 1;
  return true;
}

int32_t EbnfWorkspace::Next(int32_t configuration, uint8_t byte) {
  const auto at = static_cast<size_t>(configuration);
  if (rows_[at] != nullptr) {
    const int32_t known = (*rows_[at])[byte];
    if (known != kUnknown) return known;
  }
  Configuration next;
  // configurations_ is a deque: the reference stays valid while Intern appends.
  const int32_t id = Step(configurations_[at], byte, &next) ? Intern(std::move(next)) : kDead;
  if (rows_[at] == nullptr && kept_rows_ < kMaxKeptRows) {
    rows_[at] = std::make_unique<std::array<int32_t, 256>>();
    rows_[at]->fill(kUnknown);
    ++kept_rows_;
  }
  if (rows_[at] != nullptr) (*rows_[at])[byte] = id;
  return id;
}

bool EbnfWorkspace::can_end(int32_t configuration) const {
  const Configuration& c = configurations_[static_cast<size_t>(configuration)];
  return c.accepts && c.pending_bytes == 0;
}

bool EbnfWorkspace::complete(int32_t configuration) const {
  const Configuration& c = configurations_[static_cast<size_t>(configuration)];
  return c.accepts && c.pending_bytes == 0 && c.items.empty();
}

size_t EbnfWorkspace::ways(int32_t configuration) const {
  return configurations_[static_cast<size_t>(configuration)].items.size();
}

std::unique_ptr<TokenConstraint> MakeEbnfConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const EbnfGrammar> grammar) {
  struct Owned {
    explicit Owned(std::shared_ptr<const EbnfGrammar> g)
        : grammar(std::move(g)), workspace(grammar.get()) {}
    std::shared_ptr<const EbnfGrammar> grammar;
    EbnfWorkspace workspace;
  };
  auto owned = std::make_shared<Owned>(std::move(grammar));
  EbnfState start(&owned->workspace);
  return std::make_unique<EbnfConstraint>(std::move(vocabulary), std::move(end_ids),
                                          std::move(start), std::move(owned));
}

}  // namespace tophat
