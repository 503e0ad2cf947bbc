// How far the device's compute dtype and the wire's dtype move the split model's output from
// float32: the input and output submodels in the device's dtype, the middle in float32 (the
// cloud), and the hidden states encoded in the wire dtype and decoded where they cross, with
// the code tophat-agent and tophat-cloud use (proto/hidden_states.h). Compared with the whole
// model in float32 on the same prompts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

struct DtypeNumericsOptions {
  std::filesystem::path model_dir;
  int64_t input_layers = 2;   // m
  int64_t output_layers = 1;  // k
  at::ScalarType device_dtype = at::kBFloat16;
  // Both directions; DTYPE_UNSPECIFIED: the cloud's float32, as wire_dtype: cloud does.
  v1::DType wire_dtype = v1::DTYPE_UNSPECIFIED;
  at::Device device = at::kCPU;
  int64_t new_tokens = 32;  // greedy tokens per prompt
  // The device submodels' matrices in int8 with per-row scales (`--device-weights int8`).
  bool device_int8_weights = false;
  // With device_int8_weights: their activations rounded to int8 per block of 32 too
  // (SubmodelOptions.int8_activations).
  bool device_int8_activations = false;
};

struct DtypeNumericsReport {
  std::string device_dtype;
  std::string device_weights;  // "int8", or device_dtype's
  std::string wire_dtype;
  int64_t wire_bytes_per_position = 0;  // one direction
  int64_t prompts = 0;
  int64_t positions = 0;           // logit rows compared (prompt + continuation)
  double max_abs_logit_error = 0;  // over every row and vocabulary entry
  double mean_abs_logit_error = 0;
  double logit_range = 0;          // float32's largest |logit|, for scale
  // Teacher-forced along float32's greedy continuation: positions whose device argmax is
  // float32's token.
  int64_t greedy_positions = 0;
  int64_t greedy_agreed = 0;
  // Free-running: prompts whose whole greedy continuation equals float32's.
  int64_t identical_continuations = 0;
  double mean_first_divergence = 0;  // over the prompts that diverge: index of the first
                                     // differing token

  std::string ToTable() const;
  nlohmann::json ToJson() const;
};

// `prompts`: token ids. Errors name the checkpoint and what failed to load or run.
absl::StatusOr<DtypeNumericsReport> MeasureDeviceDtype(
    const DtypeNumericsOptions& options, const std::vector<std::vector<int32_t>>& prompts);

}  // namespace tophat
