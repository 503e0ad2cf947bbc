// Text <-> token ids. Two implementations: SentencePiece `tokenizer.model` (Llama-2,
// Vicuna) and Hugging Face `tokenizer.json` byte-level BPE (GPT-2, Llama-3, Qwen2).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads the tokenizer of a checkpoint directory: tokenizer.json if present, otherwise
  // tokenizer.model. Errors name the file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::filesystem::path& dir);

  // Text to ids. No BOS is added; callers decide (see bos_id()). Special tokens written
  // literally in `text` (e.g. "<|endoftext|>") map to their ids only when
  // `parse_special` is true, so user text cannot inject control tokens by default.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool parse_special = false) const = 0;

  // Ids to text. Special tokens (BOS/EOS/added control tokens) are skipped.
  virtual absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // Returns the id of a token spelled exactly `piece`, if the vocabulary has it.
  virtual std::optional<int32_t> PieceToId(std::string_view piece) const = 0;
  // The spelling of a special token, which Decode skips (e.g. "</s>", "<|eot_id|>"): where a
  // token must be shown on its own (a log-probability's token). nullopt for any other id.
  virtual std::optional<std::string> SpecialText(int32_t /*id*/) const { return std::nullopt; }
  // The bytes token `id` adds to a text, raw: SentencePiece's "▁" as a space, a byte piece
  // as its one byte, part of a character where a token holds part of one. nullopt for
  // special and unknown tokens and ids outside the vocabulary. Decoding may drop a leading
  // space (SentencePiece's first piece); it is still here. For constrained decoding.
  virtual std::optional<std::string> TokenBytes(int32_t id) const = 0;
};

// The text of `id` shown on its own, as OpenAI's log-probabilities name tokens: what it adds
// to the text after `previous` (the token before it, which SentencePiece needs to tell
// whether a leading space shows), or its decoding alone where that is not a clean suffix (a
// character split between the two tokens); a special token's spelling. "" for an id the
// tokenizer cannot decode.
std::string TokenText(const Tokenizer& tokenizer, std::optional<int32_t> previous, int32_t id);

// Streams text for a growing list of ids. Decoding ids one at a time is wrong for both
// tokenizer kinds (a UTF-8 character can span tokens; SentencePiece drops the leading space
// of the first piece), so each Push decodes a window of the latest ids and emits only
// completed, new text. The window restarts whenever its text ends on a whole character, so a
// Push decodes a few ids however long the stream is: decoding every id so far made pushing
// an n-token prompt O(n^2) (0.2 s before a 1,200-token prompt's first chunk on a 2-vCPU VM).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Appends `id` and returns the text that became final, possibly empty. On an error (an id
  // the tokenizer cannot decode) the stream is as it was, so a caller can skip the id.
  absl::StatusOr<std::string> Push(int32_t id);
  // Returns whatever text is still held back (e.g. an incomplete UTF-8 sequence).
  absl::StatusOr<std::string> Flush();

  // The window restarts once it holds more than this many ids and ends on a whole character.
  static constexpr size_t kWindowIds = 8;
  // Ids decoded by the last Push: the window (for tests of the bound).
  size_t window_size() const { return window_.size(); }

 private:
  const Tokenizer& tokenizer_;
  // The ids decoded with each new one: those since a point where the text ended on a whole
  // character, at least the one before the newest (it carries SentencePiece's dropped space).
  std::vector<int32_t> window_;
  size_t emitted_bytes_ = 0;  // of Decode(window_), already returned
  size_t last_whole_ = 0;     // window_'s length at the last Push whose text was all final
};

}  // namespace tophat
