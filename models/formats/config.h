// The model hyperparameters of a Hugging Face `config.json`, for the Llama family (Llama,
// Mistral, Qwen2, and Qwen3, which norms each query and key head before rotary), Phi-3 and
// Phi-4-mini (the Llama layer with q/k/v and gate/up stored fused, rotary over part of each
// head, LongRoPE scaling), Gemma 3 (its text model: the Llama layer with norms around each
// sublayer, GELU, and sliding-window layers between full ones) and Gemma 2 (Gemma 3's layer
// without head norms, one rotary base, and attention scores and logits soft-capped), and three
// mixtures of experts: Mixtral (Mistral's layer with its MLP a router over experts), Qwen3-MoE
// (Qwen3's) and Qwen2-MoE (Qwen2's, with a shared expert beside the routed ones), and gpt-oss
// (biases everywhere, attention sinks, every other layer sliding, YaRN, and experts whose
// clamped SwiGLU has biases).
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

enum class Architecture {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kGemma3,
  kPhi3,
  kGemma2,
  kMixtral,
  kQwen3Moe,
  kQwen2Moe,
  kGptOss
};

std::string_view ArchitectureName(Architecture architecture);

// The `torch_dtype` spelling of a tensor dtype ("float32", "float16", "bfloat16"), or
// LibTorch's own name for any other dtype.
std::string TorchDtypeName(at::ScalarType dtype);
// The inverse for the three compute dtypes; `key` names the setting in the error.
absl::StatusOr<at::ScalarType> ParseTorchDtypeName(std::string_view name, std::string_view key);

// `rope_scaling` of type "llama3" (Llama 3.1+): frequencies below a wavelength band are
// divided by `factor`, those above are kept, and the band between is interpolated.
// `rope_scaling` of type "linear" (Gemma 3 4B and up): every frequency divided by `factor`
// (`linear` true, the llama3 fields unused).
// `rope_scaling` of type "longrope" (Phi-3 128k, Phi-3.5, Phi-4-mini): frequency i divided by
// short_factor[i] at positions below original_max_position_embeddings and by long_factor[i]
// from there on, cos and sin multiplied by attention_factor. A position always turns by its
// own range's factors (transformers' model forward with a cache); transformers' Phi-3 turns a
// whole pass by the long factors once it reaches past the original length, and its generate()
// recomputes the cache at that crossing (docs/architecture.md, "Numerics").
// `rope_scaling` of type "yarn" (Qwen3 and Qwen2.5 past 32k, gpt-oss, DeepSeek): YaRN's
// "NTK-by-parts": pairs turning fewer than beta_slow times over the original length are
// divided by `factor`, pairs turning more than beta_fast times are kept, a linear ramp
// between (its ends rounded outwards unless `truncate` is false); cos and sin multiplied by
// attention_factor (default 0.1 ln(factor) + 1, or that with `mscale` over that with
// `mscale_all_dim`). Every position turns by the same frequencies.
struct RopeScaling {
  bool llama3 = false;
  bool linear = false;
  bool longrope = false;
  bool yarn = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  std::vector<double> short_factor;  // longrope: rotary_dim / 2 each
  std::vector<double> long_factor;
  double attention_factor = 1.0;  // longrope's and yarn's factor on cos and sin
  double beta_fast = 32.0;        // yarn: the ramp's ends, in turns over the original length
  double beta_slow = 1.0;
  bool truncate = true;  // yarn: the ramp's ends rounded to whole pairs (floor, ceil)
  bool scaled() const { return llama3 || linear || longrope || yarn; }
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // < num_attention_heads means grouped-query attention
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Rotary embeddings turn the first partial_rotary_factor of each head (Phi-4-mini: 0.75)
  // and pass the rest through; rotary_dim() is that width.
  double partial_rotary_factor = 1.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (and o_proj's, but for Qwen2); true for Qwen2
  std::optional<int64_t> sliding_window;  // Mistral; attention sees the last N positions
  // The layers the window applies to (transformers' `layer_types`): empty for all of them;
  // Gemma 3 slides five layers of six and attends in full in the sixth, Gemma 2 every other.
  std::vector<bool> sliding_layers;
  // Gemma 3: the rotary base of the sliding layers (`rope_local_base_freq`), without
  // scaling; rope_theta and rope_scaling are the full layers'.
  std::optional<double> rope_local_theta;
  // Gemma 2 and 3: attention scores are scaled by query_pre_attn_scalar^-1/2; 0: head_dim's.
  double query_pre_attn_scalar = 0;
  // Gemma 2's soft-capping, 0 for none: a scaled attention score s becomes
  // cap * tanh(s / cap) before the mask and softmax (attn_logit_softcapping), and so does each
  // logit of the LM head (final_logit_softcapping).
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "float32";
  // Read from a multimodal checkpoint's text_config (GemmaTextModel).
  bool multimodal_text = false;
  // A mixture of experts (Mixtral, Qwen3-MoE), 0 experts for a dense model. In a sparse layer
  // (MoeLayer) the MLP is `num_experts` SwiGLU experts of width moe_intermediate_size and a
  // router ([num_experts, hidden_size]): each token's hidden state goes to the
  // num_experts_per_token experts of the highest softmax probability, and their outputs are
  // summed weighted by those probabilities, renormalised to sum to 1 where
  // normalize_expert_weights (Mixtral always; Qwen3-MoE's norm_topk_prob). Qwen3-MoE's other
  // layers (mlp_only_layers, and those decoder_sparse_step skips) have a dense MLP of
  // intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  bool normalize_expert_weights = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // Qwen2-MoE: a sparse layer also runs a shared expert (a SwiGLU MLP of this width, 0 for
  // none) on every token and adds its output scaled by sigmoid(shared_expert_gate . x).
  int64_t shared_expert_intermediate_size = 0;
  // gpt-oss's expert weights are MXFP4 (`quantization_config.quant_method` "mxfp4": 4-bit
  // values in blocks of 32 with a power-of-two scale each, `<name>_blocks` and
  // `<name>_scales`), dequantized as they load.
  bool mxfp4_experts = false;

  // Parses and validates a config.json object. Errors name `source` (the file) and the key.
  static absl::StatusOr<ModelConfig> FromJson(const nlohmann::json& json, const std::string& source);
  static absl::StatusOr<ModelConfig> Load(const std::filesystem::path& config_json);
  // Gemma3ForConditionalGeneration's text model (its `text_config`, with Gemma3TextConfig's
  // defaults for what it leaves out) as a Gemma3ForCausalLM: tophat serves text, and the
  // vision tower's tensors are never read.
  static absl::StatusOr<ModelConfig> GemmaTextModel(const nlohmann::json& json,
                                                    const std::string& source);

  // The config.json this config reads back from (Hugging Face key names).
  nlohmann::json ToJson() const;

  // Qwen3's q_norm and k_norm: an RMSNorm over each query and key head ([head_dim] weights,
  // the same for every head of a layer) between the projection and rotary.
  bool qk_norm() const {
    return architecture == Architecture::kQwen3 || architecture == Architecture::kQwen3Moe ||
           architecture == Architecture::kGemma3;
  }
  // gpt-oss (GptOssForCausalLM): q/k/v/o biases; a learned logit per query head (`sinks`)
  // joins each row's softmax and takes its share of the weight to no value; the router has a
  // bias and its top K logits are softmaxed; the experts are stored fused ([E, D, 2I]
  // gate_up_proj with gate and up interleaved, [E, I, D] down_proj, a bias each) and
  // activate as (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).
  bool gpt_oss() const { return architecture == Architecture::kGptOss; }
  // Whether `layer`'s MLP is a mixture of experts (transformers' Qwen3MoeDecoderLayer rule:
  // not in mlp_only_layers, and every decoder_sparse_step-th layer; Mixtral: every layer).
  bool MoeLayer(int64_t layer) const {
    return num_experts > 0 &&
           std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
               mlp_only_layers.end() &&
           (layer + 1) % decoder_sparse_step == 0;
  }
  // Gemma's layer (2 and 3): every RMSNorm scales by 1 + its weight (Load adds the 1), the
  // token embedding is scaled by sqrt(hidden_size), attention's and the MLP's outputs are
  // normed before their residual adds (post_attention_layernorm, post_feedforward_layernorm;
  // the MLP's input norm is pre_feedforward_layernorm), and the MLP's gate is GELU (tanh form).
  bool gemma() const {
    return architecture == Architecture::kGemma3 || architecture == Architecture::kGemma2;
  }
  // The head dimensions rotary embeddings turn: int(head_dim * partial_rotary_factor), as
  // transformers truncates it (FromJson checks it is even and at least 2).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  // The window layer `layer` attends within, or none.
  std::optional<int64_t> LayerWindow(int64_t layer) const {
    if (!sliding_window) return std::nullopt;
    if (sliding_layers.empty()) return sliding_window;
    const auto index = static_cast<size_t>(layer);
    return index < sliding_layers.size() && sliding_layers[index] ? sliding_window : std::nullopt;
  }
  // Whether `layer` turns with the sliding layers' rotary base (rope_local_theta).
  bool LocalRope(int64_t layer) const { return rope_local_theta && LayerWindow(layer); }
  // What attention scores are scaled by the inverse root of: query_pre_attn_scalar, or
  // head_dim; and that factor.
  double attention_scalar() const {
    return query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
  }
  double attention_scale() const;
  // The factor on the token embedding's rows: sqrt(hidden_size) in float32 for Gemma
  // (transformers' Gemma3TextScaledWordEmbedding and Gemma 2's), else 1.
  float embedding_scale() const;
  // o_proj has a bias: attention_bias, except in Qwen2 (q/k/v biases only).
  bool o_bias() const {
    return attention_bias && architecture != Architecture::kQwen2 &&
           architecture != Architecture::kQwen2Moe;
  }
  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Parameters of one decoder layer, for bandwidth and FLOP accounting: a sparse layer counts
  // every expert (what it stores; a token reads num_experts_per_token of them).
  int64_t LayerParameterCount(int64_t layer = 0) const;
  // The parameters one token multiplies in `layer`'s GEMMs: attention's projections and the
  // MLP's matrices, a sparse layer's router and its K experts of the E (norms left out).
  int64_t LayerActiveMatrixParameters(int64_t layer) const;
  // A sparse layer's shared expert and its gate (Qwen2-MoE), 0 without one.
  int64_t SharedExpertParameters() const;
  // Every parameter stored: embedding, layers, final norm, and the head when untied.
  int64_t ParameterCount() const;
};

}  // namespace tophat
