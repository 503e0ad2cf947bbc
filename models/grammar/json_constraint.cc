#include "models/grammar/json_constraint.h"

#include <algorithm>
#include <array>
#include <limits>

#include "models/grammar/choice_grammar.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/grammar/regex_grammar.h"
#include "models/grammar/structural_tag_grammar.h"
#include "models/grammar/tool_call_grammar.h"
#include "models/tokenizers/tokenizer_utf8.h"

namespace tophat {
namespace {

// Feeds token `id`'s bytes to `state`; false for a token the grammar refuses, and for a
// special token or one that adds nothing, which no answer may hold.
template <typename Grammar>
bool FeedToken(const TokenVocabulary& vocabulary, int32_t id, Grammar& state) {
  const std::string* bytes = vocabulary.bytes(id);
  return bytes != nullptr && !bytes->empty() && state.Feed(*bytes);
}

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::optional<std::string>> tokens)
    : tokens_(std::move(tokens)) {
  std::vector<int32_t> all;
  std::vector<uint8_t> plain(tokens_.size(), 0);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    // A token that adds nothing would let an answer grow without end: never allowed.
    if (!tokens_[i].has_value() || tokens_[i]->empty()) continue;
    const std::string& bytes = *tokens_[i];
    longest_ = std::max(longest_, bytes.size());
    all.push_back(id);
    // A valid token's bytes past ASCII are its characters past ASCII, which are plain.
    plain[i] = utf8::IsValid(bytes) && std::all_of(bytes.begin(), bytes.end(), [](char c) {
                 const auto byte = static_cast<unsigned char>(c);
                 return byte >= 0x80 || IsPlainCharacter(byte);
               });
    if (plain[i] != 0) plain_in_string_.push_back(id);
  }
  // Sorted by their bytes once: the plain tokens and the others, taken from it in order,
  // are sorted too.
  std::sort(all.begin(), all.end(),
            [&](int32_t a, int32_t b) { return *tokens_[a] < *tokens_[b]; });
  std::vector<int32_t> plain_sorted;
  std::vector<int32_t> others_sorted;
  plain_sorted.reserve(plain_in_string_.size());
  for (const int32_t id : all) (plain[id] != 0 ? plain_sorted : others_sorted).push_back(id);
  // Characters: the bytes that begin one (the token is valid UTF-8).
  const auto characters = [&](int32_t id) {
    const std::string& bytes = *tokens_[static_cast<size_t>(id)];
    return static_cast<uint32_t>(std::count_if(bytes.begin(), bytes.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    }));
  };
  std::stable_sort(plain_in_string_.begin(), plain_in_string_.end(),
                   [&](int32_t a, int32_t b) { return characters(a) < characters(b); });
  plain_chars_.reserve(plain_in_string_.size());
  for (const int32_t id : plain_in_string_) plain_chars_.push_back(characters(id));
  all_ = WalkOf(tokens_, std::move(all));
  others_in_string_ = WalkOf(tokens_, std::move(others_sorted));
  plain_by_bytes_ = WalkOf(tokens_, std::move(plain_sorted));
}

TokenVocabulary::Walk TokenVocabulary::WalkOf(const std::vector<std::optional<std::string>>& tokens,
                                              std::vector<int32_t> sorted) {
  Walk walk{.sorted = std::move(sorted), .shared = {}, .tails = {}, .tail_ends = {}};
  walk.shared.resize(walk.sorted.size(), 0);
  walk.tail_ends.resize(walk.sorted.size(), 0);
  for (size_t i = 0; i < walk.sorted.size(); ++i) {
    const std::string& token = *tokens[walk.sorted[i]];
    if (i > 0) {
      const std::string& before = *tokens[walk.sorted[i - 1]];
      const auto [mismatch, unused] =
          std::mismatch(token.begin(), token.end(), before.begin(), before.end());
      walk.shared[i] = static_cast<uint32_t>(mismatch - token.begin());
    }
    walk.tails.append(token, walk.shared[i]);
    walk.tail_ends[i] = static_cast<uint32_t>(walk.tails.size());
  }
  return walk;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromTokenizer(const Tokenizer& tokenizer) {
  std::vector<std::optional<std::string>> tokens(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) tokens[id] = tokenizer.TokenBytes(id);
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

std::optional<ForcedDraft> TokenConstraint::Forced(std::span<const int32_t> pending) const {
  const std::shared_ptr<const std::vector<uint8_t>> mask = Allowed(pending);
  if (mask == nullptr) return std::nullopt;
  return ForcedByMask(*mask, nullptr);
}

std::optional<ForcedDraft> TokenConstraint::ForcedByMask(const std::vector<uint8_t>& mask,
                                                         const TokenVocabulary* vocabulary) {
  // The allowed ids, up to the bound: a scan for non-zero bytes, cheap past the last one.
  std::array<int32_t, kMaxForcedWays> ways;
  int count = 0;
  const auto allowed = [](uint8_t value) { return value != 0; };
  for (auto it = std::find_if(mask.begin(), mask.end(), allowed); it != mask.end();
       it = std::find_if(it + 1, mask.end(), allowed)) {
    if (count == kMaxForcedWays) return std::nullopt;
    ways[count++] = static_cast<int32_t>(it - mask.begin());
  }
  if (count == 0) return std::nullopt;
  if (count == 1) return ForcedDraft{.token = ways[0]};
  if (vocabulary == nullptr) return std::nullopt;
  // The longest, unique; every other a prefix of it. An end id (no bytes) ends the chain.
  const std::string* longest = nullptr;
  int32_t longest_id = -1;
  bool tied = false;
  for (int i = 0; i < count; ++i) {
    const std::string* bytes = vocabulary->bytes(ways[i]);
    if (bytes == nullptr || bytes->empty()) return std::nullopt;
    if (longest == nullptr || bytes->size() > longest->size()) {
      longest = bytes;
      longest_id = ways[i];
      tied = false;
    } else if (bytes->size() == longest->size()) {
      tied = true;
    }
  }
  if (tied) return std::nullopt;
  for (int i = 0; i < count; ++i) {
    if (!longest->starts_with(*vocabulary->bytes(ways[i]))) return std::nullopt;
  }
  return ForcedDraft{.token = longest_id, .only = false};
}

const std::string* TokenVocabulary::bytes(int32_t id) const {
  if (id < 0 || id >= size() || !tokens_[id].has_value()) return nullptr;
  return &*tokens_[id];
}

template <typename Grammar>
GrammarConstraint<Grammar>::GrammarConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                                              std::vector<int32_t> end_ids, Grammar start,
                                              std::shared_ptr<const void> owner)
    : vocabulary_(std::move(vocabulary)),
      end_ids_(std::move(end_ids)),
      owner_(std::move(owner)),
      start_(start),
      state_(std::move(start)) {}

template <typename Grammar>
void GrammarConstraint<Grammar>::Commit(std::span<const int32_t> tokens) {
  for (const int32_t token : tokens) {
    if (!state_.has_value()) return;
    if (!FeedToken(*vocabulary_, token, *state_)) state_.reset();
  }
}

template <typename Grammar>
std::shared_ptr<const std::vector<uint8_t>> GrammarConstraint<Grammar>::Allowed(
    std::span<const int32_t> pending) const {
  if (!state_.has_value()) return EndsOnly();
  Grammar state = *state_;
  for (const int32_t token : pending) {
    if (!FeedToken(*vocabulary_, token, state)) return EndsOnly();
  }
  if (state.complete()) return EndsOnly();
  if (const auto it = cache_.find(state); it != cache_.end()) return it->second;
  std::shared_ptr<const std::vector<uint8_t>> mask = Compute(state);
  if (cache_.size() >= kCachedMasks) cache_.clear();
  cache_.emplace(state, mask);
  return mask;
}

template <typename Grammar>
std::optional<ForcedDraft> GrammarConstraint<Grammar>::Forced(
    std::span<const int32_t> pending) const {
  return ForcedByMask(*Allowed(pending), vocabulary_.get());
}

template <typename Grammar>
std::shared_ptr<const std::vector<uint8_t>> GrammarConstraint<Grammar>::Compute(
    const Grammar& state) const {
  ++computed_;
  const TokenVocabulary& vocabulary = *vocabulary_;
  auto allowed = std::make_shared<std::vector<uint8_t>>(vocabulary.tokens_.size(), 0);
  bool any = false;
  std::optional<SchemaGrammar::PatternCursor> pattern;
  if constexpr (requires { state.pattern_cursor(); }) pattern = state.pattern_cursor();
  if (pattern.has_value()) {
    // A string with a pattern: the plain tokens through its automaton alone, a few bytes
    // copied a step instead of the grammar (2.4 ms instead of 30 ms on a 128k vocabulary
    // for a pattern that takes nearly every token; docs/benchmarks.md, "Walks over the
    // walk's own bytes").
    any = WalkTokens(*pattern, vocabulary.plain_by_bytes_, *allowed);
    any = WalkTokens(state, vocabulary.others_in_string_, *allowed) || any;
  } else if (state.in_string()) {
    // The plain tokens that fit the string's room, without a walk.
    const int64_t room = state.string_room();
    const auto fitting = static_cast<size_t>(
        std::upper_bound(vocabulary.plain_chars_.begin(), vocabulary.plain_chars_.end(), room,
                         [](int64_t r, uint32_t chars) { return r < int64_t{chars}; }) -
        vocabulary.plain_chars_.begin());
    for (size_t i = 0; i < fitting; ++i) (*allowed)[vocabulary.plain_in_string_[i]] = 1;
    any = fitting > 0;
    any = WalkTokens(state, vocabulary.others_in_string_, *allowed) || any;
  } else {
    any = WalkTokens(state, vocabulary.all_, *allowed);
  }
  if (!any) return EndsOnly();
  // A value that may end here or go on (a top-level number): the end ids besides.
  if (state.can_end()) {
    for (const int32_t id : end_ids_) {
      if (id >= 0 && id < vocabulary.size()) (*allowed)[static_cast<size_t>(id)] = 1;
    }
  }
  return allowed;
}

template <typename Grammar>
template <typename Automaton>
bool GrammarConstraint<Grammar>::WalkTokens(const Automaton& state,
                                            const TokenVocabulary::Walk& walk,
                                            std::vector<uint8_t>& allowed) const {
  // Walks the sorted tokens keeping the automaton after each prefix of the one before:
  // states[i] has read its first i bytes. A token re-reads only what it does not share with
  // the one before, and tokens sharing a refused prefix are refused without reading.
  std::vector<Automaton> states(vocabulary_->longest_ + 1, state);
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  size_t refused_at = kNone;  // the byte the last token read was refused at
  bool any = false;
  // Raw pointers: the walk's arrays stay in registers through the tight skip of refused
  // tokens, which most walks spend most of their time in.
  const size_t count = walk.sorted.size();
  const uint32_t* shared = walk.shared.data();
  const uint32_t* tail_ends = walk.tail_ends.data();
  const char* tails = walk.tails.data();
  for (size_t i = 0; i < count; ++i) {
    // The refused byte is in the shared prefix: refused too. Otherwise states[0..shared] are
    // this token's (the token before was read at least that far).
    if (refused_at < shared[i]) continue;
    refused_at = kNone;
    size_t at = shared[i];
    for (size_t k = i == 0 ? 0 : tail_ends[i - 1]; k < tail_ends[i]; ++k, ++at) {
      states[at + 1] = states[at];
      if (!states[at + 1].Feed(static_cast<unsigned char>(tails[k]))) {
        refused_at = at;
        break;
      }
    }
    if (refused_at == kNone) {
      allowed[walk.sorted[i]] = 1;
      any = true;
    }
  }
  return any;
}

template <typename Grammar>
std::shared_ptr<const std::vector<uint8_t>> GrammarConstraint<Grammar>::EndsOnly() const {
  if (ends_only_ == nullptr) {
    auto mask = std::make_shared<std::vector<uint8_t>>(vocabulary_->tokens_.size(), 0);
    for (const int32_t id : end_ids_) {
      if (id >= 0 && id < vocabulary_->size()) (*mask)[id] = 1;
    }
    ends_only_ = std::move(mask);
  }
  return ends_only_;
}

template class GrammarConstraint<JsonGrammar>;
template class GrammarConstraint<SchemaGrammar>;
template class GrammarConstraint<ToolCallGrammar>;
template class GrammarConstraint<RegexGrammar>;
template class GrammarConstraint<EbnfState>;
template class GrammarConstraint<StructuralTagGrammar>;
template class GrammarConstraint<ChoiceGrammar>;

std::unique_ptr<TokenConstraint> MakeSchemaConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const CompiledSchema> schema) {
  SchemaGrammar start(schema.get());
  return std::make_unique<SchemaConstraint>(std::move(vocabulary), std::move(end_ids),
                                            std::move(start), std::move(schema));
}

}  // namespace tophat
