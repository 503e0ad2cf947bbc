// What the two trainers (the toy model, adapter distillation) share: the batched,
// cache-free forward — the same layer math as Submodel (models/runtime/layers.h), over [B, S]
// sequences with a causal mask, on weights held by Hugging Face name so that autograd can
// reach them — the learning-rate schedule, progress reports and their JSON stamp files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "models/formats/config.h"
#include "models/runtime/layers.h"

namespace tophat {

using WeightMap = std::map<std::string, at::Tensor>;

// Runs decoder layers [begin, end) of `weights` (named model.layers.N.*) over `x` [B, S, D],
// positions 0..S-1 (`rope` must cover S). Returns the residual stream after layer end - 1.
at::Tensor TrainingLayers(const ModelConfig& config, const WeightMap& weights,
                          const RopeTable& rope, at::Tensor x, int64_t begin, int64_t end);

// The token embedding of ids [B, S] -> [B, S, D] (scaled as the architecture scales it).
at::Tensor TrainingEmbed(const ModelConfig& config, const WeightMap& weights,
                         const at::Tensor& ids);

// Final norm + LM head (the embedding when tied): [B, S, D] -> [B, S, V].
at::Tensor TrainingHead(const ModelConfig& config, const WeightMap& weights, const at::Tensor& x);

// Embedding, every layer, head: token ids [B, S] -> logits [B, S, V].
at::Tensor TrainingLogits(const ModelConfig& config, const WeightMap& weights,
                          const RopeTable& rope, const at::Tensor& ids);

// The learning rate at `step` of `total_steps`: linear warm-up over the first 5% of the
// steps, then cosine decay to 10% of `peak`.
double WarmupCosineLearningRate(double peak, int64_t step, int64_t total_steps);

struct TrainingProgress {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0.0;
  double tokens_per_second = 0.0;
  double eta_seconds = 0.0;
};

// Progress after `step` of `total_steps`, of which `steps_this_run` ran in `elapsed_seconds`
// (a resumed run counts only its own), each on `tokens_per_step` tokens.
TrainingProgress MakeTrainingProgress(int64_t step, int64_t total_steps, int64_t steps_this_run,
                                      double loss, int64_t tokens_per_step,
                                      double elapsed_seconds);

// A trainer's stamp or state file: its JSON, or null when it is missing or not JSON (then
// the trainer starts afresh rather than failing).
nlohmann::json ReadJsonOrNull(const std::filesystem::path& path);

}  // namespace tophat
