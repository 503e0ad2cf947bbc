#include "models/tokenizers/sentencepiece_trainer_util.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "models/tokenizers/spm_plugin_loader.h"
#include "models/tokenizers/tokenizer_utf8.h"

namespace tophat {

absl::StatusOr<std::string> TrainSentencePieceModel(const std::vector<std::string>& sentences,
                                                    int vocab_size) {
  bool any_text = false;
  for (size_t i = 0; i < sentences.size(); ++i) {
    if (!utf8::IsValid(sentences[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("TrainSentencePiece: sentence ", i, " is not valid UTF-8"));
    }
    any_text = any_text || !sentences[i].empty();
  }
  if (!any_text) return absl::InvalidArgumentError("TrainSentencePiece: the corpus is empty");
  // SentencePiece's own check counts the corpus' characters too; this one gives a clearer
  // message for the common mistake.
  constexpr int kReservedPieces = 3 + 256;  // <unk>, <s>, </s> and the byte pieces.
  if (vocab_size <= kReservedPieces) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainSentencePiece: vocab_size ", vocab_size,
                     " is too small; the 259 control and byte pieces and the corpus' "
                     "characters need more"));
  }
  auto model = SpmTrainBpe(sentences, vocab_size);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("TrainSentencePiece: ", model.status().message()));
  }
  return model;
}

absl::Status TrainSentencePiece(const std::vector<std::string>& sentences, int vocab_size,
                                const std::filesystem::path& model_out) {
  auto model = TrainSentencePieceModel(sentences, vocab_size);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat(model.status().message(), " (training ",
                                                            model_out.string(), ")"));
  }
  std::ofstream out(model_out, std::ios::binary | std::ios::trunc);
  out.write(model->data(), static_cast<std::streamsize>(model->size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", model_out.string()));
  return absl::OkStatus();
}

}  // namespace tophat
