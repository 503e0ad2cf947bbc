// Reads and writes SentencePiece's `tokenizer.model` (a serialized sentencepiece.ModelProto)
// without libsentencepiece. Debian's libsentencepiece bundles and exports its own protobuf
// 3.14 runtime, which clashes with the libprotobuf that LibTorch loads: any process linking
// both crashes during static initialisation. Only the fields tokenization needs are read;
// the rest are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

struct SentencePieceModelProto {
  // ModelProto.SentencePiece.Type.
  enum class PieceType : int {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };
  // TrainerSpec.ModelType.
  enum class ModelType : int { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

  struct Piece {
    std::string piece;
    float score = 0.0f;
    PieceType type = PieceType::kNormal;
  };

  // TrainerSpec, with the proto's defaults. Fields marked "written only" are recorded by
  // TrainSentencePiece for tools that inspect the model; parsing ignores them.
  struct TrainerSpec {
    ModelType model_type = ModelType::kUnigram;
    int32_t vocab_size = 8000;
    float character_coverage = 0.9995f;         // Written only.
    int32_t num_threads = 16;                   // Written only.
    bool shuffle_input_sentence = true;         // Written only.
    int32_t max_sentencepiece_length = 16;      // Written only.
    bool split_digits = false;                  // Written only.
    bool allow_whitespace_only_pieces = false;  // Written only.
    bool treat_whitespace_as_suffix = false;
    bool byte_fallback = false;
    int32_t unk_id = 0;
    int32_t bos_id = 1;
    int32_t eos_id = 2;
    int32_t pad_id = -1;
    std::string unk_piece = "<unk>";
    std::string bos_piece = "<s>";
    std::string eos_piece = "</s>";
    std::string pad_piece = "<pad>";
    std::string unk_surface = " \xE2\x81\x87 ";  // " ⁇ "
  };

  struct NormalizerSpec {
    std::string name;
    std::string precompiled_charmap;
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
  };

  std::vector<Piece> pieces;
  TrainerSpec trainer_spec;
  NormalizerSpec normalizer_spec;

  // Fails with kInvalidArgument on malformed wire data.
  static absl::StatusOr<SentencePieceModelProto> Parse(std::string_view bytes);
  std::string Serialize() const;
};

}  // namespace tophat
