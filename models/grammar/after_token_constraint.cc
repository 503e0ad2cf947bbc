#include "models/grammar/after_token_constraint.h"

#include <algorithm>
#include <utility>

namespace tophat {
namespace {

std::shared_ptr<const std::vector<uint8_t>> OnlyToken(int32_t vocabulary_size, int32_t token) {
  std::vector<uint8_t> mask(static_cast<size_t>(std::max(vocabulary_size, 0)), 0);
  if (token >= 0 && token < vocabulary_size) mask[static_cast<size_t>(token)] = 1;
  return std::make_shared<const std::vector<uint8_t>>(std::move(mask));
}

}  // namespace

AfterTokenConstraint::AfterTokenConstraint(int32_t vocabulary_size, int32_t gate,
                                           std::unique_ptr<TokenConstraint> inner, int64_t budget)
    : gate_(gate),
      inner_(std::move(inner)),
      budget_(budget),
      gate_only_(OnlyToken(vocabulary_size, gate)) {}

void AfterTokenConstraint::Commit(std::span<const int32_t> tokens) {
  if (!open_) {
    const auto gate = std::find(tokens.begin(), tokens.end(), gate_);
    before_ += gate - tokens.begin();
    if (gate == tokens.end()) return;
    open_ = true;
    tokens = tokens.subspan(static_cast<size_t>(gate - tokens.begin()) + 1);
  }
  if (!tokens.empty() && inner_ != nullptr) inner_->Commit(tokens);
}

std::shared_ptr<const std::vector<uint8_t>> AfterTokenConstraint::Allowed(
    std::span<const int32_t> pending) const {
  if (open_) return inner_ != nullptr ? inner_->Allowed(pending) : nullptr;
  // A draft that holds the gate opens the format for the tokens after it.
  const auto gate = std::find(pending.begin(), pending.end(), gate_);
  if (gate == pending.end()) {
    const int64_t reasoned = before_ + static_cast<int64_t>(pending.size());
    return budget_ >= 0 && reasoned >= budget_ ? gate_only_ : nullptr;
  }
  if (inner_ == nullptr) return nullptr;
  return inner_->Allowed(pending.subspan(static_cast<size_t>(gate - pending.begin()) + 1));
}

}  // namespace tophat
