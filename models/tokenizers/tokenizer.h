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
};

// Streams text for a growing list of ids. Decoding ids one at a time is wrong for both
// tokenizer kinds (a UTF-8 character can span tokens; SentencePiece drops the leading space
// of the first piece), so this decodes the tail and emits only completed, new text.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Appends `id` and returns the text that became final, possibly empty.
  absl::StatusOr<std::string> Push(int32_t id);
  // Returns whatever text is still held back (e.g. an incomplete UTF-8 sequence).
  absl::StatusOr<std::string> Flush();

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  size_t emitted_bytes_ = 0;
};

}  // namespace tophat
