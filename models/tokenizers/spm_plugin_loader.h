// Loads libtophat_spm_plugin.so (SentencePiece behind a C ABI; see models/tokenizers/spm_plugin_api.h)
// once per process and wraps it in C++. This is the only way tophat reaches libsentencepiece.
//
// The plugin is looked for, in order: beside the running executable (the directory of
// /proc/self/exe), then in lib/tophat/ and bin/ of each folder above it. It is
// opened with RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND, or, under AddressSanitizer or
// ThreadSanitizer (which refuse RTLD_DEEPBIND), into a link namespace of its own (dlmopen).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct TophatSpm;

namespace tophat {

// Ok when the plugin is (or can now be) loaded; otherwise why not. Loading happens once, on
// the first call of this or any function below; the answer is then fixed for the process.
absl::Status SpmPluginStatus();

// A loaded SentencePiece model (sentencepiece::SentencePieceProcessor). Thread-safe for
// concurrent const calls, as the processor is.
class SpmModel {
 public:
  // Errors name `model_path`.
  static absl::StatusOr<std::unique_ptr<SpmModel>> Load(const std::filesystem::path& model_path);

  ~SpmModel();
  SpmModel(const SpmModel&) = delete;
  SpmModel& operator=(const SpmModel&) = delete;

  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const;
  // Fails with kOutOfRange for ids outside [0, piece_size()).
  absl::StatusOr<std::string> Decode(const std::vector<int>& ids) const;

  int piece_size() const;
  // -1 when the model has no such piece.
  int bos_id() const;
  int eos_id() const;
  bool IsControl(int id) const;  // False for ids out of range.
  // Empty for ids out of range.
  std::string_view IdToPiece(int id) const;
  // The id of exactly this piece, or nullopt (never unk_id for an unknown piece).
  std::optional<int> PieceToId(std::string_view piece) const;

 private:
  explicit SpmModel(TophatSpm* handle) : handle_(handle) {}
  TophatSpm* handle_;
};

// Trains a Llama-2 style BPE model with libsentencepiece's trainer (<unk>=0, <s>=1, </s>=2,
// byte fallback, identity normalisation, one thread) and returns the serialized ModelProto.
// Trainer errors come back as kInvalidArgument.
absl::StatusOr<std::string> SpmTrainBpe(const std::vector<std::string>& sentences,
                                        int vocab_size);

}  // namespace tophat
