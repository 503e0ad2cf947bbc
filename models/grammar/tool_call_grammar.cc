#include "models/grammar/tool_call_grammar.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

bool IsNameByte(unsigned char byte) {
  return (byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
         (byte >= '0' && byte <= '9') || byte == '_' || byte == '-';
}

bool IsWhitespace(unsigned char byte) {
  return byte == ' ' || byte == '\t' || byte == '\r' || byte == '\n';
}

bool IsName(std::string_view name) {
  return !name.empty() && name.size() <= ToolCallSpec::kMaxNameLength &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return IsNameByte(static_cast<unsigned char>(c)); });
}

// Whether every value `schema` takes is an object: its root, or the branch a union sends
// objects to, is a constrained object and nothing else.
bool TakesObjectsOnly(const CompiledSchema& schema) {
  const SchemaNode& root = schema.node(schema.root());
  if (root.any || root.types != kTypeObject) return false;
  const int32_t object = schema.ForType(schema.root(), kTypeObject);
  return object != SchemaNode::kNone && !schema.node(object).any &&
         schema.node(object).types == kTypeObject;
}

// KMP's failure function: borders[k] for k in [0, text.size()] (ToolCallSpec::tag_borders_).
std::vector<uint32_t> Borders(std::string_view text) {
  std::vector<uint32_t> borders(text.size() + 1, 0);
  uint32_t border = 0;
  for (size_t i = 1; i < text.size(); ++i) {
    while (border > 0 && text[i] != text[border]) border = borders[border];
    if (text[i] == text[border]) ++border;
    borders[i + 1] = border;
  }
  return borders;
}

}  // namespace

ToolCallSpec::ToolCallSpec(ToolCallSyntax syntax, std::vector<ToolCallTool> tools,
                           int32_t max_calls, bool text_first, ByteTrie names)
    : syntax_(std::move(syntax)),
      tools_(std::move(tools)),
      max_calls_(max_calls),
      text_first_(text_first),
      names_(std::move(names)),
      tag_borders_(Borders(syntax_.start_tag)) {}

uint32_t ToolCallSpec::TagMatch(uint32_t matched, unsigned char byte) const {
  const std::string& tag = syntax_.start_tag;
  while (static_cast<unsigned char>(tag[matched]) != byte) {
    if (matched == 0) return 0;
    matched = tag_borders_[matched];
  }
  return matched + 1;
}

absl::StatusOr<std::shared_ptr<const ToolCallSpec>> ToolCallSpec::Create(
    ToolCallSyntax syntax, std::vector<ToolCallTool> tools, int32_t max_calls, bool text_first) {
  if (tools.empty()) return absl::InvalidArgumentError("tools: none given (at least one)");
  if (tools.size() > kMaxTools) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools: ", tools.size(), " given, at most ", kMaxTools));
  }
  ByteTrie names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolCallTool& tool = tools[i];
    if (!IsName(tool.name)) {
      return absl::InvalidArgumentError(absl::StrCat("tools[", i, "]: name \"", tool.name,
                                                     "\" must be 1 to ", kMaxNameLength,
                                                     " of A-Z, a-z, 0-9, '_' and '-'"));
    }
    if (const int32_t before = names.Find(tool.name); before >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "]: name \"", tool.name, "\" is tools[", before, "]'s too"));
    }
    if (tool.parameters == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "] (\"", tool.name, "\"): no parameters schema"));
    }
    if (!TakesObjectsOnly(*tool.parameters)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "] (\"", tool.name,
                       "\"): its parameters schema must take JSON objects only (\"type\": "
                       "\"object\"), the arguments being one"));
    }
    names.Insert(tool.name, static_cast<int32_t>(i));
  }
  if (max_calls < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_calls must be >= 1, got ", max_calls));
  }
  if (max_calls > 1 && !syntax.separator.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_calls ", max_calls,
                     ": this syntax has no separator between calls (one call an answer)"));
  }
  for (const auto& [part, text] :
       {std::pair{"open", &syntax.open}, {"between", &syntax.between}, {"close", &syntax.close}}) {
    if (text->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("syntax: ", part, " is empty"));
    }
  }
  if (IsNameByte(static_cast<unsigned char>(syntax.between[0]))) {
    return absl::InvalidArgumentError(
        absl::StrCat("syntax: between \"", syntax.between,
                     "\" starts with a character a name may have: where a name ends would be "
                     "ambiguous"));
  }
  if (text_first && syntax.start_tag.empty() &&
      IsWhitespace(static_cast<unsigned char>(syntax.open[0]))) {
    return absl::InvalidArgumentError(
        absl::StrCat("syntax: open \"", absl::CEscape(syntax.open),
                     "\" starts with whitespace: with text first and no start_tag, the first "
                     "byte past the answer's leading whitespace says whether it is a call"));
  }
  if (text_first && !syntax.start_tag.empty() && !syntax.open.starts_with(syntax.start_tag)) {
    return absl::InvalidArgumentError(
        absl::StrCat("syntax: open \"", absl::CEscape(syntax.open),
                     "\" does not start with start_tag \"", absl::CEscape(syntax.start_tag),
                     "\": with text first, a call begins where the text writes start_tag"));
  }
  return std::shared_ptr<const ToolCallSpec>(new ToolCallSpec(
      std::move(syntax), std::move(tools), max_calls, text_first, std::move(names)));
}

ToolCallGrammar::ToolCallGrammar(const ToolCallSpec* spec) : spec_(spec) {
  if (!spec->text_first()) return;
  phase_ = spec->syntax().start_tag.empty() ? Phase::kLeadingSpace : Phase::kText;
}

bool ToolCallGrammar::can_end() const {
  switch (phase_) {
    case Phase::kText:
    case Phase::kLeadingSpace:
    case Phase::kFreeText:
    case Phase::kAfterCall:
    case Phase::kDone:
      return true;
    case Phase::kOpen:
    case Phase::kName:
    case Phase::kBetween:
    case Phase::kArgumentsOpen:
    case Phase::kArguments:
    case Phase::kClose:
    case Phase::kSeparator:
      return false;
  }
  return false;
}

bool ToolCallGrammar::Feed(std::string_view bytes) {
  for (const char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool ToolCallGrammar::Feed(unsigned char byte) {
  const ToolCallSyntax& syntax = spec_->syntax();
  switch (phase_) {
    case Phase::kText:
      // Create made sure open starts with start_tag: once the text ends with it, a call is
      // under way.
      at_ = spec_->TagMatch(at_, byte);
      if (at_ == syntax.start_tag.size()) EnterOpenAt(at_);
      return true;
    case Phase::kLeadingSpace:
      if (IsWhitespace(byte)) {
        if (at_ < kMaxLeadingWhitespace) {
          ++at_;
        } else {
          Enter(Phase::kFreeText);
        }
        return true;
      }
      if (byte == static_cast<unsigned char>(syntax.open[0])) {
        EnterOpenAt(1);
      } else {
        Enter(Phase::kFreeText);
      }
      return true;
    case Phase::kFreeText:
      return true;
    case Phase::kOpen:
      return LiteralByte(syntax.open, byte, Phase::kName);
    case Phase::kName: {
      // Create refused a between that starts with a name's byte: a byte either goes on with
      // a name or ends one, never both.
      const ByteTrie& names = spec_->names();
      if (const int32_t child = names.Child(node_, byte); child >= 0) {
        node_ = child;
        return true;
      }
      const int32_t tool = names.nodes[static_cast<size_t>(node_)].terminal;
      if (tool < 0) return false;
      tool_ = tool;
      Enter(Phase::kBetween);
      return LiteralByte(syntax.between, byte, Phase::kArgumentsOpen);
    }
    case Phase::kBetween:
      return LiteralByte(syntax.between, byte, Phase::kArgumentsOpen);
    case Phase::kArgumentsOpen:
      // SchemaGrammar would take whitespace first; the arguments start at once.
      if (byte != '{') return false;
      Enter(Phase::kArguments);
      [[fallthrough]];
    case Phase::kArguments:
      if (!arguments_->Feed(byte)) return false;
      if (arguments_->complete()) Enter(Phase::kClose);
      return true;
    case Phase::kClose:
      return LiteralByte(syntax.close, byte, Phase::kAfterCall);
    case Phase::kAfterCall:
      // Create made sure a second call has a separator; an empty one leads straight on.
      if (syntax.separator->empty()) {
        Enter(Phase::kOpen);
        return Feed(byte);
      }
      Enter(Phase::kSeparator);
      return LiteralByte(*syntax.separator, byte, Phase::kOpen);
    case Phase::kSeparator:
      return LiteralByte(*syntax.separator, byte, Phase::kOpen);
    case Phase::kDone:
      return false;
  }
  return false;
}

bool ToolCallGrammar::LiteralByte(std::string_view literal, unsigned char byte, Phase next) {
  if (at_ >= literal.size() || static_cast<unsigned char>(literal[at_]) != byte) return false;
  if (++at_ == literal.size()) Enter(next);
  return true;
}

void ToolCallGrammar::EnterOpenAt(uint32_t at) {
  Enter(Phase::kOpen);
  at_ = at;
  if (at_ == spec_->syntax().open.size()) Enter(Phase::kName);
}

void ToolCallGrammar::Enter(Phase phase) {
  at_ = 0;
  node_ = 0;
  switch (phase) {
    case Phase::kText:
    case Phase::kLeadingSpace:
    case Phase::kFreeText:
    case Phase::kOpen:
    case Phase::kName:
    case Phase::kBetween:
    case Phase::kArguments:
    case Phase::kSeparator:
    case Phase::kDone:
      break;
    case Phase::kArgumentsOpen:
      arguments_.emplace(spec_->tools()[static_cast<size_t>(tool_)].parameters.get());
      break;
    case Phase::kClose:
      tool_ = -1;
      arguments_.reset();
      break;
    case Phase::kAfterCall:
      ++calls_;
      if (calls_ == spec_->max_calls()) phase = Phase::kDone;
      break;
  }
  phase_ = phase;
}

std::unique_ptr<TokenConstraint> MakeToolCallConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const ToolCallSpec> spec) {
  ToolCallGrammar start(spec.get());
  return std::make_unique<ToolCallConstraint>(std::move(vocabulary), std::move(end_ids),
                                              std::move(start), std::move(spec));
}

}  // namespace tophat
