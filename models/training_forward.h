// The batched, cache-free forward used for training (the toy model, adapter distillation):
// the same layer math as Submodel (models/layers.h), over [B, S] sequences with a causal
// mask, on weights held by Hugging Face name so that autograd can reach them.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <ATen/ATen.h>

#include "models/config.h"
#include "models/layers.h"

namespace tophat {

using WeightMap = std::map<std::string, at::Tensor>;

// Runs decoder layers [begin, end) of `weights` (named model.layers.N.*) over `x` [B, S, D],
// positions 0..S-1 (`rope` must cover S). Returns the residual stream after layer end - 1.
at::Tensor TrainingLayers(const ModelConfig& config, const WeightMap& weights,
                          const RopeTable& rope, at::Tensor x, int64_t begin, int64_t end);

// Final norm + LM head (the embedding when tied): [B, S, D] -> [B, S, V].
at::Tensor TrainingHead(const ModelConfig& config, const WeightMap& weights, const at::Tensor& x);

// Embedding, every layer, head: token ids [B, S] -> logits [B, S, V].
at::Tensor TrainingLogits(const ModelConfig& config, const WeightMap& weights,
                          const RopeTable& rope, const at::Tensor& ids);

// The learning rate at `step` of `total_steps`: linear warm-up over the first 5% of the
// steps, then cosine decay to 10% of `peak`.
double WarmupCosineLearningRate(double peak, int64_t step, int64_t total_steps);

}  // namespace tophat
