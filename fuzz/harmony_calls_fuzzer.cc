// gpt-oss's required call in harmony's layout (models/grammar/harmony_call_constraint.h): the
// input is a JSON object {"tools": [{"name", "parameters"}], "budget", "budget_end": [ids]},
// a NUL byte, then choices: each byte picks the next token among those the constraint allows
// (its index modulo their count), or, where it is the count itself, one it refuses. The spec
// is built or refused with a status, never a crash. Along the answer every mask allows some
// token, a forced token is an allowed one, a refused token leaves only the ends, an answer
// is complete only after its <|call|>, and the masks and forced tokens after a draft (the
// answer's second half, not committed) are those of the answer committed whole.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/mask_check.h"
#include "fuzz/tool_spec_json.h"
#include "models/grammar/harmony_call_constraint.h"
#include "nlohmann/json.hpp"

namespace {

// mask_check.h's vocabulary, then harmony's control tokens and pieces of its headers.
struct HarmonyVocabulary {
  std::shared_ptr<const tophat::TokenVocabulary> vocabulary;
  tophat::HarmonyCallIds ids;
  int32_t ret = -1;  // <|return|>, an end
};

const HarmonyVocabulary& Vocabulary() {
  static const HarmonyVocabulary made = [] {
    const tophat::TokenVocabulary& base = *tophat::fuzz::MaskVocabulary();
    std::vector<std::optional<std::string>> tokens;
    for (int32_t id = 0; id < base.size(); ++id) {
      const std::string* bytes = base.bytes(id);
      tokens.push_back(bytes != nullptr ? std::optional<std::string>(*bytes) : std::nullopt);
    }
    HarmonyVocabulary v;
    const auto control = [&] {
      tokens.emplace_back(std::nullopt);
      return static_cast<int32_t>(tokens.size() - 1);
    };
    v.ids = {.start = control(),
             .channel = control(),
             .message = control(),
             .end = control(),
             .constrain = control(),
             .call = control()};
    v.ret = control();
    for (const char* piece : {"analysis", "commentary", " to", "=functions", ".", "assistant",
                              "json", "commentary to=functions.", "final", "get_weather"}) {
      tokens.emplace_back(piece);
    }
    v.vocabulary = std::make_shared<const tophat::TokenVocabulary>(std::move(tokens));
    return v;
  }();
  return made;
}

std::vector<int32_t> AllowedIds(const std::vector<uint8_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != 0) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<tophat::fuzz::ToolSpecInput> input =
      tophat::fuzz::ReadToolSpecInput(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!input) return 0;
  const nlohmann::json& spec = input->spec;
  std::vector<tophat::ToolCallTool>& tools = input->tools;
  const HarmonyVocabulary& v = Vocabulary();
  const auto budget_value = spec.value("budget", nlohmann::json(-1));
  if (!budget_value.is_number_integer()) return 0;
  const int64_t budget = std::clamp<int64_t>(budget_value.get<int64_t>(), -1, 64);
  std::vector<int32_t> budget_end;
  if (const auto it = spec.find("budget_end"); it != spec.end()) {
    if (!it->is_array() || it->size() > 8) return 0;
    for (const nlohmann::json& id : *it) {
      // The constraint's contract: ids of the vocabulary, none of them <|end|>.
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= v.vocabulary->size() || id.get<int64_t>() == v.ids.end) {
        return 0;
      }
      budget_end.push_back(id.get<int32_t>());
    }
  }
  const auto built = tophat::HarmonyCallSpec::Create(v.ids, std::move(tools));
  if (!built.ok()) return 0;

  const std::vector<int32_t> ends = {v.ret, v.ids.call, tophat::fuzz::kMaskEnd};
  tophat::HarmonyCallConstraint stepped(v.vocabulary, ends, *built, budget, budget_end);
  std::vector<int32_t> answer;
  bool refused = false;
  for (const char choice : input->rest) {
    const std::shared_ptr<const std::vector<uint8_t>> mask = stepped.Allowed({});
    TOPHAT_FUZZ_CHECK(mask != nullptr && mask->size() == static_cast<size_t>(v.vocabulary->size()));
    const std::vector<int32_t> allowed = AllowedIds(*mask);
    TOPHAT_FUZZ_CHECK(!allowed.empty());
    if (refused) {
      // Only ends (inside the arguments, their end alone: <|call|>).
      for (const int32_t id : allowed) {
        TOPHAT_FUZZ_CHECK(std::find(ends.begin(), ends.end(), id) != ends.end());
      }
      break;
    }
    if (const auto forced = stepped.Forced({})) {
      TOPHAT_FUZZ_CHECK((*mask)[static_cast<size_t>(forced->token)] != 0);
    }
    if (stepped.complete()) break;
    const auto pick =
        static_cast<size_t>(static_cast<unsigned char>(choice)) % (allowed.size() + 1);
    int32_t token;
    if (pick < allowed.size()) {
      token = allowed[pick];
      // The ends stop the answer, as the sampler's stop ids do; <|call|> among them only
      // where the call is written whole.
      if (token == v.ret || token == tophat::fuzz::kMaskEnd) break;
    } else {
      const auto refused_token =
          static_cast<size_t>(std::find(mask->begin(), mask->end(), uint8_t{0}) - mask->begin());
      if (refused_token >= mask->size()) continue;
      token = static_cast<int32_t>(refused_token);
      refused = true;
    }
    answer.push_back(token);
    stepped.Commit(std::span<const int32_t>(&answer.back(), 1));
    if (token == v.ids.call && !refused) {
      TOPHAT_FUZZ_CHECK(stepped.complete());
      break;
    }
  }
  TOPHAT_FUZZ_CHECK(!stepped.complete() || (!answer.empty() && answer.back() == v.ids.call));
  // The answer's second half as a draft: masked as the answer committed whole.
  const size_t half = answer.size() / 2;
  tophat::HarmonyCallConstraint drafted(v.vocabulary, ends, *built, budget, budget_end);
  drafted.Commit(std::span<const int32_t>(answer).first(half));
  const auto pending = std::span<const int32_t>(answer).subspan(half);
  TOPHAT_FUZZ_CHECK(*drafted.Allowed(pending) == *stepped.Allowed({}));
  TOPHAT_FUZZ_CHECK(drafted.Forced(pending) == stepped.Forced({}));
  return 0;
}
