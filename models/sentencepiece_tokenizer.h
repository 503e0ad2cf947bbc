// SentencePiece `tokenizer.model` (Llama-2, Vicuna): BPE models with identity
// normalisation, implemented natively because libsentencepiece cannot share a process with
// LibTorch here (see sentencepiece_model_proto.h). Encode and Decode follow
// SentencePieceProcessor: the normaliser's dummy prefix, whitespace escaping and
// remove_extra_whitespaces, score-ordered merges, UNUSED-piece resegmentation, byte fallback,
// and on decoding the stripped leading space, " ⁇ " for <unk> and U+FFFD per invalid byte.
// Unigram models and precompiled normalisation rules (nmt_nfkc) fail with kUnimplemented.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/sentencepiece_model_proto.h"
#include "models/tokenizer.h"

namespace tophat {

class SentencePieceTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(
      const std::filesystem::path& model_path);
  // As Load, from the file's contents; `source` names it in errors.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromSerialized(
      std::string_view model_bytes, std::string_view source);

  // With `parse_special`, control pieces and "<unk>" written literally (e.g. "<s>") become
  // their ids and the text between them is encoded part by part, each part getting the dummy
  // prefix space, as Hugging Face's slow Llama tokenizer does. Fails with kInvalidArgument
  // when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool parse_special = false) const override;
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;

  int32_t vocab_size() const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;
  std::optional<int32_t> PieceToId(std::string_view piece) const override;

 private:
  using PieceType = SentencePieceModelProto::PieceType;

  SentencePieceTokenizer() = default;
  std::string Normalize(std::string_view text) const;
  void EncodeNormalized(std::string_view normalized, std::vector<int32_t>& ids) const;
  // Length of the longest user-defined piece at the start of `text`, or 0.
  size_t MatchUserDefined(std::string_view text) const;
  int32_t LookUp(std::string_view piece) const;  // unk_id_ when absent.

  std::string source_;
  std::vector<SentencePieceModelProto::Piece> pieces_;
  // NORMAL, USER_DEFINED and UNUSED pieces: the ones merges may produce.
  std::unordered_map<std::string, int32_t> mergeable_ids_;
  // CONTROL, UNKNOWN and BYTE pieces.
  std::unordered_map<std::string, int32_t> reserved_ids_;
  std::vector<std::string> user_defined_;  // Longest first.
  std::array<int32_t, 256> byte_ids_{};    // -1 where the model has no <0xXX> piece.
  int32_t unk_id_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  bool byte_fallback_ = false;
  std::string unk_surface_;
  SentencePieceModelProto::NormalizerSpec normalizer_;
  // Pieces that parse_special recognises, longest first.
  std::vector<std::pair<std::string, int32_t>> special_pieces_;
};

}  // namespace tophat
