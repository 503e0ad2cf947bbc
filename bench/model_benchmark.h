// The model benchmark behind `tophat bench-model`: measured prefill and decode speed of a
// checkpoint next to the bounds the machine sets (memory bandwidth for decode, GEMM rate
// for prefill), so a slow forward pass shows up as a low fraction of its bound.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/formats/config.h"

namespace tophat {

struct ModelBenchOptions {
  int64_t prompt_tokens = 512;  // prefill: one forward pass over this many random tokens
  int64_t decode_tokens = 64;   // decode: tokens generated one at a time
  int repetitions = 3;          // of each measurement; the report keeps median and best
  int64_t bandwidth_bytes = 0;  // buffer of the bandwidth probe; 0 = auto (>= 1 GiB)
  // Weight matrices as int8 with per-row scales, quantized at load (kernels/gemv_int8.h);
  // activations stay float32.
  bool int8_weights = false;
  // With int8_weights: activations rounded to int8 per block of 32 too, multiplied in
  // integers (SubmodelOptions.int8_activations).
  bool int8_activations = false;
  // Weight matrices in bfloat16, computed in float32 (SubmodelOptions.bf16_weights).
  bool bf16_weights = false;
  // With bf16_weights: a prompt's rows rounded to bfloat16 and multiplied in bfloat16
  // (SubmodelOptions.bf16_activations; "bf16a16").
  bool bf16_activations = false;
  // Also time decode on the layer-by-layer path (the fused one-token CPU step off), in
  // repetitions alternating with the fused path's, and report the ratio.
  bool compare_layer_by_layer = false;
};

struct ModelBenchReport {
  // The model.
  std::string model_dir;
  int64_t parameters = 0;  // distinct parameters (a tied LM head counted once)
  int64_t layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t attention_heads = 0;
  int64_t kv_heads = 0;
  int64_t vocab_size = 0;
  std::string dtype = "float32";
  // or "int8", "w8a8", "bfloat16", "bf16a16": the matrices' storage (and activations')
  std::string weights = "float32";
  int threads = 0;       // ATen intra-op threads (at::get_num_threads())
  int blas_threads = 0;  // OpenBLAS threads (prefill GEMMs run on these); 0 = unknown

  // Workload.
  int64_t prompt_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t decode_prompt_tokens = 0;  // context before the first decoded token
  int repetitions = 0;

  // Measured (median over repetitions; *_best is the fastest repetition).
  double prefill_tokens_per_s = 0.0;
  double prefill_best_tokens_per_s = 0.0;
  double decode_tokens_per_s = 0.0;
  double decode_best_tokens_per_s = 0.0;
  bool fused_decode = false;  // one-token steps took the fused CPU step (kernels/decode_step.h)
  // compare_layer_by_layer: decode with the fused step off, same runs alternating (0: not
  // measured).
  double decode_layer_by_layer_tokens_per_s = 0.0;

  // Work per token.
  int64_t weight_bytes_per_token = 0;  // Submodel::WeightBytes()
  int64_t kv_bytes_per_token = 0;      // K/V read per decoded token, averaged over the run
  double flops_per_prefill_token = 0.0;

  // Machine.
  double read_bandwidth_bytes_per_s = 0.0;              // huge pages (the bound)
  double read_bandwidth_small_pages_bytes_per_s = 0.0;  // 4 KiB pages, as weights are now
  double gemm_flops_per_s = 0.0;       // at::mm rate on this model's prefill GEMM shapes
  double gemm_peak_flops_per_s = 0.0;  // at::mm rate on a large square product

  // Bounds and fractions (measured median / bound).
  double decode_bound_tokens_per_s = 0.0;   // bandwidth / weight bytes per token
  double prefill_bound_tokens_per_s = 0.0;  // GEMM rate / FLOPs per prefill token
  double decode_fraction = 0.0;
  double prefill_fraction = 0.0;

  nlohmann::json ToJson() const;
  std::string ToTable() const;
};

// Loads the model in `model_dir` (float32), measures prefill and decode, and the machine's
// read bandwidth and GEMM rate. `progress` (may be empty) receives one line per stage.
absl::StatusOr<ModelBenchReport> RunModelBenchmark(
    const std::filesystem::path& model_dir, const ModelBenchOptions& options,
    std::function<void(std::string_view)> progress = {});

// The benchmark model: Llama-style, ~110M parameters (the llama2.c "stories110M" shape):
// dim 768, 12 layers, 12 heads (12 KV heads), intermediate 2048, vocab 32000, context 2048,
// with the LM head tied to the embedding.
ModelConfig Bench110MConfig();

// Llama 3.2 1B's shape (1.24B parameters): dim 2048, 16 layers, 32 heads (8 KV heads of 64),
// intermediate 8192, vocab 128256 (BOS 128000, EOS 128001), LM head tied, rope theta 5e5,
// context capped at 8192.
ModelConfig Llama1BShapeConfig();

// Writes a randomly initialised checkpoint of `config` (InitWeights + WriteCheckpoint,
// float32) into `dir`.
absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed,
                              const std::filesystem::path& dir);

}  // namespace tophat
