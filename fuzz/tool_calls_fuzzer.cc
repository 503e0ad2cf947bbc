// Tool calls and an answer constrained to them (models/grammar/tool_call_grammar.h): the input
// is a JSON object {"open", "between", "close", "separator", "start_tag", "text_first",
// "max_calls", "tools": [{"name", "parameters"}]}, a NUL byte, then the answer's bytes. The
// spec is built or refused with a status, never a crash. When it is built, the grammar fed
// the answer's bytes must, where it stops (a byte refused, or the answer's end), take some
// byte unless it may end there: every prefix it takes can be completed. An answer it takes
// whole and may end holds no more calls than max_calls, and in the required mode at least
// one. Where it stops, the constraint's mask is each token fed on its own (mask_check.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/mask_check.h"
#include "fuzz/tool_spec_json.h"
#include "models/grammar/tool_call_grammar.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<tophat::fuzz::ToolSpecInput> input =
      tophat::fuzz::ReadToolSpecInput(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!input) return 0;
  const nlohmann::json& spec = input->spec;
  std::vector<tophat::ToolCallTool>& tools = input->tools;
  const auto Text = tophat::fuzz::JsonText;
  tophat::ToolCallSyntax syntax{.open = Text(spec, "open").value_or(""),
                                .between = Text(spec, "between").value_or(""),
                                .close = Text(spec, "close").value_or(""),
                                .separator = Text(spec, "separator"),
                                .start_tag = Text(spec, "start_tag").value_or("")};
  const auto max_calls = spec.value("max_calls", nlohmann::json(1));
  if (!max_calls.is_number_integer()) return 0;
  const auto built = tophat::ToolCallSpec::Create(
      std::move(syntax), std::move(tools),
      static_cast<int32_t>(std::clamp<int64_t>(max_calls.get<int64_t>(), -1, 64)),
      spec.value("text_first", nlohmann::json(false)) == true);
  if (!built.ok()) return 0;
  const std::string_view answer = input->rest;
  tophat::ToolCallGrammar grammar(built->get());
  size_t taken = 0;
  for (; taken < answer.size(); ++taken) {
    tophat::ToolCallGrammar next = grammar;
    if (!next.Feed(static_cast<unsigned char>(answer[taken]))) break;
    grammar = next;
  }
  if (!grammar.can_end()) {
    bool any = false;
    for (int byte = 0; byte < 256 && !any; ++byte) {
      tophat::ToolCallGrammar next = grammar;
      any = next.Feed(static_cast<unsigned char>(byte));
    }
    TOPHAT_FUZZ_CHECK(any);
  }
  tophat::fuzz::CheckMaskAfterBytes(
      tophat::MakeToolCallConstraint(tophat::fuzz::MaskVocabulary(), {tophat::fuzz::kMaskEnd},
                                     *built),
      grammar, answer.substr(0, taken));
  TOPHAT_FUZZ_CHECK(grammar.calls() <= (*built)->max_calls());
  if (grammar.can_end() && !(*built)->text_first()) TOPHAT_FUZZ_CHECK(grammar.calls() >= 1);
  return 0;
}
