#include "models/grammar/tool_call_grammar.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

bool IsNameByte(unsigned char byte) {
  return (byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
         (byte >= '0' && byte <= '9') || byte == '_' || byte == '-';
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

}  // namespace

absl::StatusOr<std::shared_ptr<const ToolCallSpec>> ToolCallSpec::Create(
    ToolCallSyntax syntax, std::vector<ToolCallTool> tools, int32_t max_calls) {
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
  return std::shared_ptr<const ToolCallSpec>(
      new ToolCallSpec(std::move(syntax), std::move(tools), max_calls, std::move(names)));
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

void ToolCallGrammar::Enter(Phase phase) {
  at_ = 0;
  node_ = 0;
  switch (phase) {
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
