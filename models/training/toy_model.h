// `tophat toy-model`: a small Llama checkpoint in Hugging Face layout (config.json,
// model.safetensors, tokenizer.model), trained with LibTorch on the synthetic corpus of
// toy_corpus.h. Deterministic for a given seed and thread count, and cached: a directory
// that already holds a model made with the same options is reused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "models/formats/config.h"
#include "models/training/training_forward.h"

namespace tophat {

struct ToyModelOptions {
  std::filesystem::path out_dir;
  uint64_t seed = 1234;
  int64_t vocab_size = 512;
  int64_t hidden_size = 192;
  int64_t intermediate_size = 512;
  int64_t num_layers = 6;
  int64_t num_heads = 6;
  int64_t num_kv_heads = 2;
  // Sentences of the grammar span ~15 tokens, so 64-token windows see whole documents.
  int64_t sequence_length = 64;
  int64_t batch_size = 16;
  // 900: the outline answers (toy_corpus.h) need them; at 300 the model wrote the outline's
  // form but neither copied the prompt's creatures nor kept a point's sentence to its creature.
  int64_t steps = 900;
  double learning_rate = 3e-3;
  int64_t corpus_documents = 20000;
  // Training threads are pinned so that the result does not depend on the machine's cores.
  int threads = 2;
  // The drafter adapter shipped with the model (adapter.json + adapter.safetensors), distilled
  // for this many input layers (the split the demo and tests use); 0 ships none. Changing
  // the adapter settings re-distills the adapter without retraining the model.
  int64_t adapter_input_layers = 2;
  int64_t adapter_steps = 200;
  int64_t adapter_sequence_length = 64;
  int64_t adapter_batch_size = 16;
  // Held-out prompt lengths the drafter's acceptance is reported at.
  std::vector<int64_t> acceptance_prompt_lengths = {12};

  nlohmann::json ToJson() const;  // the model's identity (not the adapter's)
};

struct ToyModelReport {
  bool reused_cache = false;
  double seconds = 0.0;
  double final_train_loss = 0.0;
  double heldout_loss = 0.0;     // mean next-token cross-entropy, nats
  double uniform_loss = 0.0;     // ln(vocab): what a model with no knowledge scores
  double heldout_top1 = 0.0;     // fraction of held-out next tokens predicted exactly
  double heldout_mean_max_prob = 0.0;
  nlohmann::json ToJson() const;

  // The shipped adapter (when adapter_input_layers > 0).
  bool adapter_reused = false;
  double adapter_seconds = 0.0;
  double adapter_heldout_accept_length = 0.0;
  std::vector<std::pair<int64_t, double>> adapter_accept_length_by_prompt_length;
  int64_t adapter_parameters = 0;
  int64_t model_parameters = 0;
};

absl::StatusOr<ToyModelReport> MakeToyModel(
    const ToyModelOptions& options,
    const std::function<void(const TrainingProgress&)>& on_progress = {},
    const std::function<void(const TrainingProgress&)>& on_adapter_progress = {});

// Where `tophat toy-model` caches the model by default: $XDG_CACHE_HOME/tophat/toy-model,
// else ~/.cache/tophat/toy-model.
std::filesystem::path DefaultToyModelDir();

// `tophat toy-model --preset eval`: the evaluation model of the ablation. The same grammar,
// trained on 1,024-token windows (a prompt of the ablation's length is inside what it was
// trained on, and so is the drafter's), 8 layers of dim 256 (~6 M parameters, 2.4x the toy's):
// the cloud's prefill of a 351-token prompt (~0.1 s on 2 cores) is a fifth of its upload on
// the ablation's scaled links, not negligible, while cloud, two devices and their drafters
// still fit on the 2 cores that run the ablation at 2 req/s (dim 512 computes that prompt in
// ~0.4 s and would saturate them). About an hour on 2 CPU cores; not built in CI. Cached
// beside the toy model (eval-model).
ToyModelOptions EvalModelOptions();
std::filesystem::path DefaultEvalModelDir();

// The config the toy model is trained with (before the tokenizer fixes the vocabulary).
ModelConfig ToyModelConfig(const ToyModelOptions& options);

}  // namespace tophat
