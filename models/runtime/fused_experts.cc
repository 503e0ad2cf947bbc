#include "models/runtime/fused_experts.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "models/formats/mxfp4.h"
#include "models/formats/safetensors.h"
#include "models/runtime/layers.h"

namespace tophat {

namespace {

// A stored tensor with its file in errors, checked against the shape the config implies.
absl::StatusOr<at::Tensor> Stored(const CheckpointReader& checkpoint, const std::string& name,
                                  at::IntArrayRef shape, bool packed) {
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor t, checkpoint.LoadAsStored(name));
  TOPHAT_ASSIGN_OR_RETURN(const std::filesystem::path file, checkpoint.FileOf(name));
  if (t.sizes() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": tensor '", name,
                                                   "' has shape ", ShapeString(t.sizes()), ", expected ",
                                                   ShapeString(shape)));
  }
  const bool fits = packed ? t.scalar_type() == at::kByte
                           : at::isFloatingType(t.scalar_type()) && t.element_size() <= 4;
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.string(), ": tensor '", name, "' has dtype ", c10::toString(t.scalar_type()),
        packed ? ", expected U8 (MXFP4)" : ", expected a floating type"));
  }
  return t;
}

// Rows 0, 2, 4, ... then 1, 3, 5, ...: the interleaved gate and up as gate's block and up's.
at::Tensor Deinterleave(const at::Tensor& t) {
  return at::cat({t.slice(0, 0, t.size(0), 2), t.slice(0, 1, t.size(0), 2)});
}

// Expert e's matrix of `part` in MXFP4 as stored: blocks [out, in / 32, 16], scales
// [out, in / 32].
absl::StatusOr<kernels::Mxfp4Matrix> StoredExpertMxfp4(const CheckpointReader& checkpoint,
                                                       int64_t layer, int64_t experts,
                                                       int64_t expert, std::string_view part,
                                                       int64_t in, int64_t out) {
  const std::string blocks_name = FusedExpertsTensorName(layer, part) + "_blocks";
  if (in % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        blocks_name, ": MXFP4 needs rows of whole 32-value blocks, and these are ", in, " wide"));
  }
  const std::string scales_name = FusedExpertsTensorName(layer, part) + "_scales";
  TOPHAT_ASSIGN_OR_RETURN(const at::Tensor blocks,
                          Stored(checkpoint, blocks_name, {experts, out, in / 32, 16}, true));
  TOPHAT_ASSIGN_OR_RETURN(const at::Tensor scales,
                          Stored(checkpoint, scales_name, {experts, out, in / 32}, true));
  return kernels::Mxfp4Matrix{.blocks = blocks[expert], .scales = scales[expert]};
}

// Expert e's matrix of `part` as a linear layer's [out, in], in float32.
absl::StatusOr<at::Tensor> StoredExpertMatrix(const CheckpointReader& checkpoint, int64_t layer,
                                              int64_t experts, int64_t expert,
                                              std::string_view part, int64_t in, int64_t out) {
  const std::string name = FusedExpertsTensorName(layer, part);
  if (checkpoint.Has(name + "_blocks")) {
    TOPHAT_ASSIGN_OR_RETURN(const kernels::Mxfp4Matrix packed,
                            StoredExpertMxfp4(checkpoint, layer, experts, expert, part, in, out));
    return DequantizeMxfp4(packed.blocks, packed.scales, at::kFloat,
                           absl::StrCat(name, "_blocks, ", name, "_scales"));
  }
  TOPHAT_ASSIGN_OR_RETURN(const at::Tensor stored,
                          Stored(checkpoint, name, {experts, in, out}, false));
  return stored[expert].t().to(at::kFloat).contiguous();
}

}  // namespace

std::string FusedExpertsTensorName(int64_t layer, std::string_view part) {
  return LayerTensorName(layer, absl::StrCat("mlp.experts.", std::string(part)));
}

namespace {

struct ExpertBiases {
  at::Tensor gate_up;  // [2I], gate's then up's
  at::Tensor down;     // [D]
};

// Expert e's biases in `dtype`.
absl::StatusOr<ExpertBiases> StoredExpertBiases(const CheckpointReader& checkpoint,
                                                const ModelConfig& config, int64_t layer,
                                                int64_t expert, at::ScalarType dtype) {
  const int64_t experts = config.num_experts;
  TOPHAT_ASSIGN_OR_RETURN(const at::Tensor gate_up,
                          Stored(checkpoint, FusedExpertsTensorName(layer, "gate_up_proj_bias"),
                                 {experts, 2 * config.moe_intermediate_size}, false));
  TOPHAT_ASSIGN_OR_RETURN(const at::Tensor down,
                          Stored(checkpoint, FusedExpertsTensorName(layer, "down_proj_bias"),
                                 {experts, config.hidden_size}, false));
  return ExpertBiases{.gate_up = Deinterleave(gate_up[expert]).to(dtype).contiguous(),
                      .down = down[expert].to(dtype).contiguous()};
}

}  // namespace

bool FusedExpertsInMxfp4(const CheckpointReader& checkpoint, int64_t layer) {
  return checkpoint.Has(FusedExpertsTensorName(layer, "gate_up_proj_blocks"));
}

absl::StatusOr<Mxfp4ExpertTensors> LoadFusedExpertMxfp4(const CheckpointReader& checkpoint,
                                                        const ModelConfig& config, int64_t layer,
                                                        int64_t expert) {
  const int64_t experts = config.num_experts;
  const int64_t d = config.hidden_size;
  const int64_t width = config.moe_intermediate_size;
  TOPHAT_ASSIGN_OR_RETURN(
      const kernels::Mxfp4Matrix gate_up,
      StoredExpertMxfp4(checkpoint, layer, experts, expert, "gate_up_proj", d, 2 * width));
  TOPHAT_ASSIGN_OR_RETURN(
      const kernels::Mxfp4Matrix down,
      StoredExpertMxfp4(checkpoint, layer, experts, expert, "down_proj", width, d));
  TOPHAT_ASSIGN_OR_RETURN(ExpertBiases biases,
                          StoredExpertBiases(checkpoint, config, layer, expert, at::kFloat));
  // Copies of this expert's rows (the checkpoint's are mapped), gate's and up's apart.
  return Mxfp4ExpertTensors{.gate_up = {.blocks = Deinterleave(gate_up.blocks).contiguous(),
                                        .scales = Deinterleave(gate_up.scales).contiguous()},
                            .gate_up_bias = std::move(biases.gate_up),
                            .down = {.blocks = down.blocks.clone(), .scales = down.scales.clone()},
                            .down_bias = std::move(biases.down)};
}

absl::StatusOr<ExpertTensors> LoadFusedExpert(const CheckpointReader& checkpoint,
                                              const ModelConfig& config, int64_t layer,
                                              int64_t expert, at::ScalarType dtype) {
  const int64_t experts = config.num_experts;
  const int64_t d = config.hidden_size;
  const int64_t width = config.moe_intermediate_size;
  ExpertTensors result;
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor gate_up, StoredExpertMatrix(checkpoint, layer, experts, expert,
                                                                 "gate_up_proj", d, 2 * width));
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor down, StoredExpertMatrix(checkpoint, layer, experts, expert,
                                                              "down_proj", width, d));
  TOPHAT_ASSIGN_OR_RETURN(ExpertBiases biases,
                          StoredExpertBiases(checkpoint, config, layer, expert, dtype));
  result.gate_up = Deinterleave(gate_up).to(dtype).contiguous();
  result.down = down.to(dtype).contiguous();
  result.gate_up_bias = std::move(biases.gate_up);
  result.down_bias = std::move(biases.down);
  return result;
}

}  // namespace tophat
