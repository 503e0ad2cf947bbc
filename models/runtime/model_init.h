// Freshly initialised Llama-family weights under Hugging Face tensor names, for training
// the toy model, for tests ("smaller random models made the same way") and for benchmarks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/formats/config.h"

namespace tophat {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
class Submodel;

// Deterministic for a given seed: normal(0, 0.02) matrices (the Llama init) and unit norms.
NamedTensors InitWeights(const ModelConfig& config, uint64_t seed);

// Phi-3's stored form of Llama-named weights: each layer's q/k/v projections as one
// `self_attn.qkv_proj` (q's rows first) and gate/up as one `mlp.gate_up_proj` (gate's first),
// as transformers writes Phi3ForCausalLM; CheckpointReader names them back.
NamedTensors FusePhi3Projections(const NamedTensors& weights);

// Writes config.json and model.safetensors (floating tensors in `dtype`, integer ones as they
// are) for `weights` into `dir`; a Phi-3 config's projections fused as FusePhi3Projections.
absl::Status WriteCheckpoint(const ModelConfig& config, const NamedTensors& weights,
                             const std::filesystem::path& dir,
                             at::ScalarType dtype = at::kFloat);

// A small config used across tests: GQA, 4 layers, vocab 300.
ModelConfig TinyTestConfig();

// TinyTestConfig with heads of 32 (hidden size 128): the smallest head the GPU's paged
// decode kernel takes (kernels/paged_attention.cu), so that a GPU step of it runs the
// batched kernels, and can be captured as a CUDA graph, as a real model's does.
ModelConfig TinyDecodeKernelConfig();

// The middle (layers [1, 3)) of a TinyTestConfig model of seed 5, written to `dir` and
// loaded back: the cloud's part in the engine's tests and its fuzz target.
absl::StatusOr<std::shared_ptr<const Submodel>> TinyTestMiddle(const std::filesystem::path& dir);

// TinyTestConfig in each architecture feature the loaders and layers handle differently,
// named for test sections: Llama GQA, Qwen2 (attention biases, tied embeddings), Llama 3
// rope scaling with a head_dim independent of hidden_size / heads, Mistral sliding window.
std::vector<std::pair<std::string, ModelConfig>> TinyTestVariants();

}  // namespace tophat
