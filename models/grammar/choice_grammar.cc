#include "models/grammar/choice_grammar.h"

#include "absl/strings/str_cat.h"

namespace tophat {

absl::Status ChoiceSpec::Check(const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("choice: none given");
  if (choices.size() > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("choice: ", choices.size(), " given, at most ", kMaxChoices));
  }
  size_t bytes = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("choice[", i, "]: empty"));
    }
    bytes += choices[i].size();
  }
  if (bytes > kMaxChoiceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("choice: ", bytes, " bytes in all, at most ", kMaxChoiceBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ChoiceSpec>> ChoiceSpec::Create(
    const std::vector<std::string>& choices) {
  if (absl::Status checked = Check(choices); !checked.ok()) return checked;
  ByteTrie trie;
  for (size_t i = 0; i < choices.size(); ++i) trie.Insert(choices[i], static_cast<int32_t>(i));
  trie.nodes.shrink_to_fit();  // held for the request's life
  return std::shared_ptr<const ChoiceSpec>(new ChoiceSpec(std::move(trie), choices.size()));
}

std::unique_ptr<TokenConstraint> MakeChoiceConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const ChoiceSpec> spec) {
  ChoiceGrammar start(spec.get());
  return std::make_unique<ChoiceConstraint>(std::move(vocabulary), std::move(end_ids),
                                            std::move(start), std::move(spec));
}

}  // namespace tophat
