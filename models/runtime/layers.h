// The decoder-layer math of the Llama family as plain functions over tensors, shared by
// inference (Submodel) and training (toy model, adapter distillation) so that both compute
// exactly the same function.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "models/formats/config.h"

namespace tophat {

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension, computed in float32.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
// residual += delta in place, then RmsNorm(residual): a layer's residual add fused with the
// norm after it (one kernel on CUDA and for float32 on the CPU).
at::Tensor AddRmsNorm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                      double eps);

// `x` ([T, C], float32) as [2T, C] rows of `dtype` (bfloat16 or float16): rows 0..T-1 are x
// rounded, rows T..2T-1 what that rounding left, rounded. A matrix's products with the two
// halves, summed in float32, are its products with x to 16 mantissa bits (bfloat16) instead of
// 8: how a GPU, whose GEMMs take only half-precision operands, multiplies a float32 activation.
at::Tensor SplitForHalfProducts(const at::Tensor& x, at::ScalarType dtype);

// Rotary embedding tables cos/sin of shape [max_positions, head_dim / 2], float32, with the
// `rope_scaling` of the config applied (llama3 frequency bands, linear, LongRoPE's factors by
// position and its attention factor). With partial rotary (rotary_dim < head_dim) the first
// rotary_dim / 2 columns turn and the others are the identity (cos 1, sin 0): the table of a
// head in RotaryHeadOrder.
struct RopeTable {
  at::Tensor cos;
  at::Tensor sin;
  static RopeTable Create(const ModelConfig& config, int64_t max_positions, at::Device device);
  // The table of the sliding layers of a model with a base of their own
  // (ModelConfig::rope_local_theta, Gemma 3's): that base, unscaled.
  static RopeTable CreateLocal(const ModelConfig& config, int64_t max_positions, at::Device device);
  int64_t max_positions() const { return cos.size(0); }
};

// Partial rotary (Phi-4-mini's: 3/4 of each head) as the whole-head kind: the order of a
// head's dimensions in which transformers' pairs (i, i + rotary_dim/2 for i < rotary_dim/2,
// the dimensions from rotary_dim on unturned) are rotate_half's pairs (j, j + head_dim/2), the
// unturned ones paired with each other. Entry j names the stored dimension at runtime position
// j. The runtime holds q_proj's and k_proj's rows of each head in this order (scores are sums
// over a head's dimensions, which any order both q and k share leaves as they are; v and the
// hidden states keep theirs), so every rotary kernel serves it unchanged. Empty when rotary
// turns the whole head.
std::vector<int64_t> RotaryHeadOrder(const ModelConfig& config);

// Rotates `x` [..., T, heads, head_dim] in the Hugging Face "rotate_half" layout, where
// `cos`/`sin` are [T, head_dim/2] rows already gathered for the tokens' positions.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up, where gate_up = [gate | up] along the last dimension.
at::Tensor SwiGlu(const at::Tensor& gate_up);

// The Hugging Face name of a per-layer tensor, e.g. LayerTensorName(3, "mlp.up_proj.weight").
std::string LayerTensorName(int64_t layer, std::string_view suffix);

// A sparse layer's tensors (ModelConfig::MoeLayer) as its checkpoint names them: the router
// (Mixtral's block_sparse_moe.gate, Qwen3-MoE's mlp.gate, gpt-oss's mlp.router) and each
// expert's three matrices (Mixtral's block_sparse_moe.experts.E.w1, w3, w2; Qwen3-MoE's
// mlp.experts.E.gate_proj, up_proj, down_proj; gpt-oss stores its experts fused instead:
// models/runtime/fused_experts.h).
enum class ExpertMatrix { kGate, kUp, kDown };
std::string RouterTensorName(const ModelConfig& config, int64_t layer);
std::string ExpertTensorName(const ModelConfig& config, int64_t layer, int64_t expert,
                             ExpertMatrix matrix);
// Qwen2-MoE's shared expert (mlp.shared_expert.gate_proj, up_proj, down_proj) and its gate
// ([1, D], mlp.shared_expert_gate).
std::string SharedExpertTensorName(int64_t layer, ExpertMatrix matrix);
std::string SharedExpertGateTensorName(int64_t layer);

}  // namespace tophat
