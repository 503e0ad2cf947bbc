// Trains Llama-2 style SentencePiece models, for toy checkpoints and tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tophat {

// Trains a BPE `tokenizer.model` on `sentences` and writes it to `model_out`. The model has
// Llama-2's layout and settings: <unk>=0, <s>=1, </s>=2, no pad, the 256 byte-fallback pieces
// <0x00>..<0xFF>, then merged pieces by merge order, then every character of the corpus
// (character_coverage 1.0); identity normalisation with the dummy prefix and kept
// whitespace, so decoding reproduces the input; digits are never merged (split_digits).
//
// Training is native rather than libsentencepiece's trainer, which cannot be loaded beside
// LibTorch (see sentencepiece_model_proto.h). It is single-threaded and breaks ties by piece
// spelling, so the same inputs always give byte-identical files. The resulting file loads in
// SentencePiece itself as well as in SentencePieceTokenizer.
//
// `vocab_size` counts the 3 control pieces, the 256 byte pieces and the corpus' characters,
// so it must be at least 259 plus the number of distinct characters; fails with
// kInvalidArgument when it is smaller, or larger than the corpus has merges for.
absl::Status TrainSentencePiece(const std::vector<std::string>& sentences, int vocab_size,
                                const std::filesystem::path& model_out);

// As TrainSentencePiece, returning the serialized model instead of writing it.
absl::StatusOr<std::string> TrainSentencePieceModel(const std::vector<std::string>& sentences,
                                                    int vocab_size);

}  // namespace tophat
