// Trains Llama-2 style SentencePiece models, for toy checkpoints and tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tophat {

// Trains a BPE `tokenizer.model` on `sentences` and writes it to `model_out`, with
// libsentencepiece's own trainer reached through the SentencePiece plugin (see
// models/tokenizers/spm_plugin_loader.h). The model has Llama-2's layout and settings: <unk>=0, <s>=1,
// </s>=2, no pad, the 256 byte-fallback pieces <0x00>..<0xFF>, then the merged pieces and the
// corpus' characters (character_coverage 1.0); identity normalisation with the dummy prefix
// and kept whitespace, so decoding reproduces the input; digits are never merged
// (split_digits).
//
// The trainer runs single-threaded on the sentences in order (no shuffling, no sampling), and
// the output path is not recorded in the model, so the same inputs always give byte-identical
// files.
//
// `vocab_size` counts the 3 control pieces, the 256 byte pieces and the corpus' characters,
// so it must be larger than 259 plus the number of distinct characters; fails with
// kInvalidArgument when SentencePiece rejects it (the message names `model_out`), and with
// kUnavailable or kNotFound when the plugin cannot be loaded (sanitizer builds; a missing
// libtophat_spm_plugin.so).
absl::Status TrainSentencePiece(const std::vector<std::string>& sentences, int vocab_size,
                                const std::filesystem::path& model_out);

// As TrainSentencePiece, returning the serialized model instead of writing it.
absl::StatusOr<std::string> TrainSentencePieceModel(const std::vector<std::string>& sentences,
                                                    int vocab_size);

}  // namespace tophat
