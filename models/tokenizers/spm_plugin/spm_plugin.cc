// The SentencePiece plugin; see models/tokenizers/spm_plugin_api.h for why it is one. This is the only
// translation unit that includes SentencePiece's headers.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/tokenizers/spm_plugin_api.h"

struct TophatSpm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

char* CopyToMalloc(const std::string& s, size_t* len = nullptr) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  if (len != nullptr) *len = s.size();
  return out;
}

void SetError(char** error, const std::string& message) {
  if (error != nullptr) *error = CopyToMalloc(message);
}

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& sentences) : sentences_(sentences) {}
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& sentences_;
  size_t index_ = 0;
};

}  // namespace

extern "C" {

TophatSpm* tophat_spm_load(const char* path, char** error) {
  auto* spm = new TophatSpm;
  const auto status = spm->processor.Load(path);
  if (!status.ok()) {
    SetError(error, status.ToString());
    delete spm;
    return nullptr;
  }
  return spm;
}

void tophat_spm_free(TophatSpm* spm) { delete spm; }

int tophat_spm_encode(const TophatSpm* spm, const char* text, size_t text_len, int** ids,
                      size_t* num_ids, char** error) {
  std::vector<int> out;
  const auto status = spm->processor.Encode(std::string(text, text_len), &out);
  if (!status.ok()) {
    SetError(error, status.ToString());
    return 1;
  }
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.size() + 1)));
  if (*ids == nullptr) {
    SetError(error, "out of memory");
    return 1;
  }
  std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  *num_ids = out.size();
  return 0;
}

int tophat_spm_decode(const TophatSpm* spm, const int* ids, size_t num_ids, char** text,
                      size_t* text_len, char** error) {
  std::string out;
  const auto status = spm->processor.Decode(std::vector<int>(ids, ids + num_ids), &out);
  if (!status.ok()) {
    SetError(error, status.ToString());
    return 1;
  }
  *text = CopyToMalloc(out, text_len);
  return *text == nullptr ? 1 : 0;
}

int tophat_spm_piece_size(const TophatSpm* spm) { return spm->processor.GetPieceSize(); }
int tophat_spm_bos_id(const TophatSpm* spm) { return spm->processor.bos_id(); }
int tophat_spm_eos_id(const TophatSpm* spm) { return spm->processor.eos_id(); }
int tophat_spm_is_control(const TophatSpm* spm, int id) {
  return spm->processor.IsControl(id) ? 1 : 0;
}

const char* tophat_spm_id_to_piece(const TophatSpm* spm, int id, size_t* len) {
  const std::string& piece = spm->processor.IdToPiece(id);
  *len = piece.size();
  return piece.data();
}

int tophat_spm_piece_to_id(const TophatSpm* spm, const char* piece, size_t len) {
  // SentencePiece answers unk_id for pieces it does not know; tell that apart from "<unk>".
  const std::string wanted(piece, len);
  const int id = spm->processor.PieceToId(wanted);
  if (id < 0 || id >= spm->processor.GetPieceSize()) return -1;
  return spm->processor.IdToPiece(id) == wanted ? id : -1;
}

int tophat_spm_train_bpe(const char* const* sentences, const size_t* lengths, size_t count,
                         int vocab_size, char** model_proto, size_t* model_len, char** error) {
  // Identity normalisation and kept whitespace make decoding reproduce the input exactly,
  // as Llama-2's tokenizer does. The proto is returned rather than written under a
  // model_prefix because the prefix would be recorded in it and make the bytes depend on
  // the output path.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"num_threads", "1"},
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"unk_piece", "<unk>"},
      {"bos_piece", "<s>"},
      {"eos_piece", "</s>"},
      {"shuffle_input_sentence", "false"},
      {"input_sentence_size", "0"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"minloglevel", "2"},
  };
  std::vector<std::string> corpus;
  corpus.reserve(count);
  for (size_t i = 0; i < count; ++i) corpus.emplace_back(sentences[i], lengths[i]);
  VectorIterator iterator(corpus);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &iterator, &proto);
  if (!status.ok()) {
    SetError(error, status.ToString());
    return 1;
  }
  *model_proto = CopyToMalloc(proto, model_len);
  return *model_proto == nullptr ? 1 : 0;
}

void tophat_spm_free_buffer(void* buffer) { std::free(buffer); }

}  // extern "C"
