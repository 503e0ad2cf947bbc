#include "models/grammar/harmony_call_constraint.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tophat {

absl::StatusOr<std::shared_ptr<const HarmonyCallSpec>> HarmonyCallSpec::Create(
    HarmonyCallIds ids, std::vector<ToolCallTool> tools) {
  const std::pair<const char*, int32_t> named[] = {
      {"start", ids.start}, {"channel", ids.channel},     {"message", ids.message},
      {"end", ids.end},     {"constrain", ids.constrain}, {"call", ids.call}};
  for (size_t i = 0; i < std::size(named); ++i) {
    if (named[i].second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("harmony: the ", named[i].first, " token's id is missing"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (named[j].second == named[i].second) {
        return absl::InvalidArgumentError(absl::StrCat("harmony: the ", named[i].first,
                                                       " token's id ", named[i].second, " is the ",
                                                       named[j].first, " token's"));
      }
    }
  }
  // The tools' names and schemas are checked as any calls' are (one a turn): the layout's
  // text around the name is harmony's, its close the <|call|> token.
  absl::StatusOr<std::shared_ptr<const ToolCallSpec>> checked = ToolCallSpec::Create(
      ToolCallSyntax{.open = std::string(kCallHeaderPrefix), .between = " ", .close = "<|call|>"},
      std::move(tools), /*max_calls=*/1);
  if (!checked.ok()) return checked.status();
  std::shared_ptr<HarmonyCallSpec> spec(new HarmonyCallSpec());
  spec->ids_ = ids;
  spec->tools_ = (*checked)->tools();
  spec->headers_.emplace_back(kAnalysis);
  for (const ToolCallTool& tool : spec->tools_) {
    spec->headers_.push_back(absl::StrCat(std::string(kCallHeaderPrefix), tool.name, " "));
  }
  const auto choice = [](std::vector<std::string> choices) {
    absl::StatusOr<std::shared_ptr<const ChoiceSpec>> made = ChoiceSpec::Create(choices);
    return made.ok() ? *std::move(made) : nullptr;
  };
  spec->header_choice_ = choice(spec->headers_);
  spec->call_header_choice_ =
      choice(std::vector<std::string>(spec->headers_.begin() + 1, spec->headers_.end()));
  spec->assistant_choice_ = choice({std::string(kAssistant)});
  spec->json_choice_ = choice({std::string(kJson)});
  if (!spec->header_choice_ || !spec->call_header_choice_ || !spec->assistant_choice_ ||
      !spec->json_choice_) {
    return absl::InternalError("harmony: the header literals did not compile");
  }
  return spec;
}

HarmonyCallConstraint::HarmonyCallConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                                             std::vector<int32_t> end_ids,
                                             std::shared_ptr<const HarmonyCallSpec> spec,
                                             int64_t budget, std::vector<int32_t> budget_end)
    : vocabulary_(std::move(vocabulary)),
      end_ids_(std::move(end_ids)),
      spec_(std::move(spec)),
      budget_(budget),
      budget_end_(std::move(budget_end)) {
  const auto size = static_cast<size_t>(std::max(vocabulary_->size(), 0));
  std::vector<uint8_t> reasoning(size, 0);
  for (int32_t id = 0; id < vocabulary_->size(); ++id) {
    const std::string* bytes = vocabulary_->bytes(id);
    reasoning[static_cast<size_t>(id)] = bytes != nullptr && !bytes->empty() ? 1 : 0;
  }
  const int32_t end = spec_->ids().end;
  if (end < vocabulary_->size()) reasoning[static_cast<size_t>(end)] = 1;
  reasoning_ = std::make_shared<const std::vector<uint8_t>>(std::move(reasoning));
  std::vector<uint8_t> ends(size, 0);
  for (const int32_t id : end_ids_) {
    if (id >= 0 && id < vocabulary_->size()) ends[static_cast<size_t>(id)] = 1;
  }
  ends_only_ = std::make_shared<const std::vector<uint8_t>>(std::move(ends));
}

HarmonyCallConstraint::~HarmonyCallConstraint() = default;

void HarmonyCallConstraint::Enter(Position& position, Phase phase) const {
  position.phase = phase;
  position.segment.clear();
  position.text.clear();
  // A header begun after the budget is spent is a call's.
  position.calls_only = phase == Phase::kHeader && Spent(position);
}

void HarmonyCallConstraint::Settle(Position& position) const {
  if (position.phase != Phase::kReasoning || !Spent(position) || position.forced_from >= 0) {
    return;
  }
  if (position.partial.whole() || position.counted >= budget_ + PartialCharacter::kWait) {
    position.forced_from = position.counted;
  }
}

int32_t HarmonyCallConstraint::ForcedInReasoning(const Position& position) const {
  if (position.forced_from < 0) return -1;
  const auto forced = static_cast<size_t>(position.counted - position.forced_from);
  return forced < budget_end_.size() ? budget_end_[forced] : spec_->ids().end;
}

int32_t HarmonyCallConstraint::WholeHeader(const std::string& text) const {
  const std::vector<std::string>& headers = spec_->headers();
  const auto found = std::find(headers.begin(), headers.end(), text);
  return found == headers.end() ? -1 : static_cast<int32_t>(found - headers.begin());
}

void HarmonyCallConstraint::Step(Position& position, int32_t token) const {
  const HarmonyCallIds& ids = spec_->ids();
  const std::string* bytes = vocabulary_->bytes(token);
  // A literal takes text that still starts one of its strings, and its control token after
  // it whole.
  const auto literal = [&](std::span<const std::string> strings) {
    if (bytes == nullptr) return false;
    const std::string text = position.text + *bytes;
    const bool starts = std::any_of(strings.begin(), strings.end(), [&](const std::string& s) {
      return s.size() > text.size() ? s.compare(0, text.size(), text) == 0 : s == text;
    });
    if (!starts || bytes->empty()) return false;
    position.text = text;
    position.segment.push_back(token);
    return true;
  };
  // The budget counts every token before the call's <|constrain|>.
  const bool before_call = position.phase == Phase::kChannel || position.phase == Phase::kHeader ||
                           position.phase == Phase::kReasoning || position.phase == Phase::kStart ||
                           position.phase == Phase::kAssistant;
  // Once the budget is spent, the token the reasoning must take (its message, then <|end|>).
  int32_t forced = -1;
  if (budget_ >= 0 && before_call) {
    Settle(position);
    if (position.phase == Phase::kReasoning) forced = ForcedInReasoning(position);
    ++position.counted;
    if (position.phase == Phase::kReasoning && position.forced_from < 0) {
      position.partial.Push(bytes);
    }
  }
  switch (position.phase) {
    case Phase::kChannel:
      if (token == ids.channel) return Enter(position, Phase::kHeader);
      break;
    case Phase::kHeader: {
      if (bytes == nullptr) {
        const int32_t header = WholeHeader(position.text);
        if (header == 0 && token == ids.message) return Enter(position, Phase::kReasoning);
        if (header > 0 && token == ids.constrain) {
          Enter(position, Phase::kJson);
          position.tool = header - 1;
          return;
        }
        break;
      }
      // A header begun after the budget is spent: the calls' alone.
      if (literal(std::span<const std::string>(spec_->headers())
                      .subspan(position.calls_only ? 1 : 0))) {
        return;
      }
      break;
    }
    case Phase::kReasoning:
      if (forced >= 0 && token != forced) break;
      if (token == ids.end) return Enter(position, Phase::kStart);
      // A spent budget's message is whatever the request forced.
      if (forced >= 0 || (bytes != nullptr && !bytes->empty())) return;
      break;
    case Phase::kStart:
      if (token == ids.start) return Enter(position, Phase::kAssistant);
      break;
    case Phase::kAssistant:
      if (bytes == nullptr && token == ids.channel &&
          position.text == HarmonyCallSpec::kAssistant) {
        return Enter(position, Phase::kHeader);
      }
      if (literal(std::span<const std::string>(&spec_->assistant(), 1))) return;
      break;
    case Phase::kJson:
      if (bytes == nullptr && token == ids.message && position.text == HarmonyCallSpec::kJson) {
        const int32_t tool = position.tool;
        Enter(position, Phase::kArguments);
        position.tool = tool;
        return;
      }
      if (literal(std::span<const std::string>(&spec_->json(), 1))) return;
      break;
    case Phase::kArguments:
      // The arguments' constraint decides what is valid, <|call|> included (its end).
      if (token == ids.call) return Enter(position, Phase::kDone);
      position.segment.push_back(token);
      return;
    case Phase::kDone:
    case Phase::kRefused:
      break;
  }
  Enter(position, Phase::kRefused);
}

std::unique_ptr<TokenConstraint> HarmonyCallConstraint::SegmentConstraint(
    const Position& position) const {
  switch (position.phase) {
    case Phase::kHeader:
      // No end ids: a whole literal is followed by its control token, which Allowed gives.
      return MakeChoiceConstraint(
          vocabulary_, {},
          position.calls_only ? spec_->call_header_choice() : spec_->header_choice());
    case Phase::kAssistant:
      return MakeChoiceConstraint(vocabulary_, {}, spec_->assistant_choice());
    case Phase::kJson:
      return MakeChoiceConstraint(vocabulary_, {}, spec_->json_choice());
    case Phase::kArguments:
      return MakeSchemaConstraint(vocabulary_, {spec_->ids().call},
                                  spec_->tools()[static_cast<size_t>(position.tool)].parameters);
    default:
      return nullptr;
  }
}

HarmonyCallConstraint::Position HarmonyCallConstraint::Locate(std::span<const int32_t> pending,
                                                              bool& same_segment) const {
  Position position = committed_;
  same_segment = true;
  for (const int32_t token : pending) {
    const Phase before = position.phase;
    Step(position, token);
    // A token that starts a segment (or leaves one) leaves the committed segment behind.
    if (position.phase != before || position.segment.empty()) same_segment = false;
  }
  return position;
}

const TokenConstraint* HarmonyCallConstraint::Segment(
    const Position& position, std::span<const int32_t>& pending,
    std::unique_ptr<TokenConstraint>& fresh) const {
  fresh = SegmentConstraint(position);
  if (fresh == nullptr) return nullptr;
  pending = position.segment;
  return fresh.get();
}

int32_t HarmonyCallConstraint::NextControl(const Position& position) const {
  const HarmonyCallIds& ids = spec_->ids();
  switch (position.phase) {
    case Phase::kChannel:
      return ids.channel;
    case Phase::kStart:
      return ids.start;
    case Phase::kHeader: {
      const int32_t header = WholeHeader(position.text);
      return header == 0 ? ids.message : header > 0 ? ids.constrain : -1;
    }
    case Phase::kAssistant:
      return position.text == HarmonyCallSpec::kAssistant ? ids.channel : -1;
    case Phase::kJson:
      return position.text == HarmonyCallSpec::kJson ? ids.message : -1;
    default:
      return -1;
  }
}

std::shared_ptr<const std::vector<uint8_t>> HarmonyCallConstraint::Only(int32_t token) const {
  for (const auto& [id, mask] : only_) {
    if (id == token) return mask;
  }
  std::vector<uint8_t> mask(static_cast<size_t>(std::max(vocabulary_->size(), 0)), 0);
  if (token >= 0 && token < vocabulary_->size()) mask[static_cast<size_t>(token)] = 1;
  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(mask));
  only_.emplace_back(token, shared);
  return shared;
}

void HarmonyCallConstraint::Commit(std::span<const int32_t> tokens) {
  for (const int32_t token : tokens) {
    const Phase before = committed_.phase;
    Step(committed_, token);
    if (committed_.phase != before || committed_.segment.empty()) {
      // A new segment (or none): its constraint starts over.
      segment_ = SegmentConstraint(committed_);
    } else if (segment_ != nullptr) {
      segment_->Commit(std::span<const int32_t>(&token, 1));
    }
  }
}

std::shared_ptr<const std::vector<uint8_t>> HarmonyCallConstraint::Allowed(
    std::span<const int32_t> pending) const {
  bool same_segment = false;
  Position position = Locate(pending, same_segment);
  if (position.phase == Phase::kRefused || position.phase == Phase::kDone) return ends_only_;
  if (position.phase == Phase::kReasoning) {
    Settle(position);
    const int32_t forced = ForcedInReasoning(position);
    return forced >= 0 ? Only(forced) : reasoning_;
  }
  if (const int32_t control = NextControl(position); control >= 0) return Only(control);
  if (same_segment && segment_ != nullptr) return segment_->Allowed(pending);
  std::unique_ptr<TokenConstraint> fresh;
  std::span<const int32_t> segment_tokens;
  const TokenConstraint* segment = Segment(position, segment_tokens, fresh);
  return segment != nullptr ? segment->Allowed(segment_tokens) : ends_only_;
}

std::optional<ForcedDraft> HarmonyCallConstraint::Forced(std::span<const int32_t> pending) const {
  bool same_segment = false;
  Position position = Locate(pending, same_segment);
  if (position.phase == Phase::kRefused || position.phase == Phase::kDone) return std::nullopt;
  if (position.phase == Phase::kReasoning) {
    Settle(position);
    const int32_t forced = ForcedInReasoning(position);
    return forced >= 0 ? std::optional<ForcedDraft>(ForcedDraft{.token = forced}) : std::nullopt;
  }
  if (const int32_t control = NextControl(position); control >= 0) {
    return ForcedDraft{.token = control};
  }
  if (same_segment && segment_ != nullptr) return segment_->Forced(pending);
  std::unique_ptr<TokenConstraint> fresh;
  std::span<const int32_t> segment_tokens;
  const TokenConstraint* segment = Segment(position, segment_tokens, fresh);
  return segment != nullptr ? segment->Forced(segment_tokens) : std::nullopt;
}

std::unique_ptr<TokenConstraint> MakeHarmonyCallConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const HarmonyCallSpec> spec, int64_t budget, std::vector<int32_t> budget_end) {
  return std::make_unique<HarmonyCallConstraint>(std::move(vocabulary), std::move(end_ids),
                                                 std::move(spec), budget, std::move(budget_end));
}

}  // namespace tophat
