#include "models/grammar/after_token_constraint.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

namespace tophat {
namespace {

std::shared_ptr<const std::vector<uint8_t>> OnlyToken(int32_t vocabulary_size, int32_t token) {
  std::vector<uint8_t> mask(static_cast<size_t>(std::max(vocabulary_size, 0)), 0);
  if (token >= 0 && token < vocabulary_size) mask[static_cast<size_t>(token)] = 1;
  return std::make_shared<const std::vector<uint8_t>>(std::move(mask));
}

}  // namespace

AfterTokenConstraint::AfterTokenConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                                           int32_t gate, std::unique_ptr<TokenConstraint> inner,
                                           int64_t budget, std::vector<int32_t> budget_end,
                                           std::vector<int32_t> gate_prefix)
    : vocabulary_(std::move(vocabulary)),
      gate_(gate),
      inner_(std::move(inner)),
      budget_(budget),
      budget_end_(std::move(budget_end)),
      gate_prefix_(std::move(gate_prefix)),
      forced_([this] {
        std::vector<int32_t> forced = budget_end_;
        forced.insert(forced.end(), gate_prefix_.begin(), gate_prefix_.end());
        return forced;
      }()),
      gate_only_(OnlyToken(vocabulary_->size(), gate)) {}

void AfterTokenConstraint::Settle(Reasoning& reasoning) const {
  if (budget_ < 0 || reasoning.forced_from >= 0 || reasoning.tokens < budget_) return;
  if (reasoning.partial.whole() || reasoning.tokens >= budget_ + kCharacterWait) {
    reasoning.forced_from = reasoning.tokens;
  }
}

void AfterTokenConstraint::Step(Reasoning& reasoning, int32_t token) const {
  Settle(reasoning);
  ++reasoning.tokens;
  if (!gate_prefix_.empty()) {
    // The prefix's first token does not recur in it, so a mismatch restarts at that token.
    if (reasoning.prefix_matched < gate_prefix_.size() &&
        token == gate_prefix_[reasoning.prefix_matched]) {
      ++reasoning.prefix_matched;
    } else {
      reasoning.prefix_matched = token == gate_prefix_[0] ? 1 : 0;
    }
  }
  // Only the waiting for a character's end reads the bytes; forced tokens need not.
  if (budget_ < 0 || reasoning.forced_from >= 0) return;
  reasoning.partial.Push(vocabulary_->bytes(token));
}

std::shared_ptr<const std::vector<uint8_t>> AfterTokenConstraint::Only(int32_t token) const {
  if (token == gate_) return gate_only_;
  if (token != last_only_token_) {
    last_only_ = OnlyToken(vocabulary_->size(), token);
    last_only_token_ = token;
  }
  return last_only_;
}

void AfterTokenConstraint::Commit(std::span<const int32_t> tokens) {
  while (!open_ && !tokens.empty()) {
    const int32_t token = tokens.front();
    tokens = tokens.subspan(1);
    if (Opens(committed_, token)) {
      open_ = true;
    } else {
      Step(committed_, token);
    }
  }
  if (!tokens.empty() && inner_ != nullptr) inner_->Commit(tokens);
}

AfterTokenConstraint::Next AfterTokenConstraint::Locate(std::span<const int32_t> pending) const {
  if (open_) return {.open = true, .after_gate = pending};
  Reasoning reasoning = committed_;
  for (size_t i = 0; i < pending.size(); ++i) {
    // A draft that holds the gate opens the format for the tokens after it.
    if (Opens(reasoning, pending[i])) {
      return {.open = true, .after_gate = pending.subspan(i + 1)};
    }
    Step(reasoning, pending[i]);
  }
  Settle(reasoning);
  if (reasoning.forced_from < 0) return {};
  // The forced tokens in order; a draft that strayed from them is refused at its row
  // anyway, so past them it is the gate.
  const auto forced = static_cast<size_t>(reasoning.tokens - reasoning.forced_from);
  return {.forced = forced < forced_.size() ? forced_[forced] : gate_};
}

std::shared_ptr<const std::vector<uint8_t>> AfterTokenConstraint::Allowed(
    std::span<const int32_t> pending) const {
  const Next next = Locate(pending);
  if (next.open) return inner_ != nullptr ? inner_->Allowed(next.after_gate) : nullptr;
  return next.forced >= 0 ? Only(next.forced) : nullptr;
}

std::optional<ForcedDraft> AfterTokenConstraint::Forced(std::span<const int32_t> pending) const {
  const Next next = Locate(pending);
  if (next.open) return inner_ != nullptr ? inner_->Forced(next.after_gate) : std::nullopt;
  if (next.forced < 0) return std::nullopt;
  return ForcedDraft{.token = next.forced};
}

}  // namespace tophat
