#include "models/runtime/model_init.h"

#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "models/formats/checkpoint.h"
#include "models/formats/safetensors.h"
#include "models/runtime/fused_experts.h"
#include "models/runtime/layers.h"
#include "models/runtime/submodel.h"

namespace tophat {

NamedTensors InitWeights(const ModelConfig& c, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto normal = [&gen](std::vector<int64_t> shape) {
    return at::normal(0.0, 0.02, shape, gen, at::TensorOptions().dtype(at::kFloat));
  };
  // A norm's weight: 1; Gemma's, which scale by 1 + weight, around 0 and not 0, so that a
  // path that skipped the 1 or the weight shows.
  auto norm = [&](int64_t n) {
    return c.gemma() ? normal({n}).mul_(5) : at::ones({n}, at::kFloat);
  };
  const int64_t d = c.hidden_size;
  NamedTensors w;
  w.emplace_back("model.embed_tokens.weight", normal({c.vocab_size, d}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto name = [i](std::string_view s) { return LayerTensorName(i, s); };
    w.emplace_back(name("input_layernorm.weight"), norm(d));
    w.emplace_back(name("self_attn.q_proj.weight"), normal({c.q_size(), d}));
    w.emplace_back(name("self_attn.k_proj.weight"), normal({c.kv_size(), d}));
    w.emplace_back(name("self_attn.v_proj.weight"), normal({c.kv_size(), d}));
    if (c.attention_bias) {
      w.emplace_back(name("self_attn.q_proj.bias"), normal({c.q_size()}));
      w.emplace_back(name("self_attn.k_proj.bias"), normal({c.kv_size()}));
      w.emplace_back(name("self_attn.v_proj.bias"), normal({c.kv_size()}));
    }
    w.emplace_back(name("self_attn.o_proj.weight"), normal({d, c.q_size()}));
    if (c.qk_norm()) {
      // Around 1, as trained norms are, but not 1: a head norm's weights must matter.
      const double one = c.gemma() ? 0.0 : 1.0;  // Gemma's norms scale by 1 + weight
      w.emplace_back(name("self_attn.q_norm.weight"), normal({c.head_dim}).mul_(10).add_(one));
      w.emplace_back(name("self_attn.k_norm.weight"), normal({c.head_dim}).mul_(10).add_(one));
    }
    if (c.o_bias()) {
      w.emplace_back(name("self_attn.o_proj.bias"), normal({d}));
    }
    w.emplace_back(name("post_attention_layernorm.weight"), norm(d));
    if (c.gemma()) {
      w.emplace_back(name("pre_feedforward_layernorm.weight"), norm(d));
      w.emplace_back(name("post_feedforward_layernorm.weight"), norm(d));
    }
    if (c.gpt_oss()) {
      // Sinks that take a real share of each row's weight.
      w.emplace_back(name("self_attn.sinks"), normal({c.num_attention_heads}).mul_(50));
    }
    if (c.MoeLayer(i)) {
      // A router whose probabilities differ well beyond rounding, so that every path picks
      // the same experts.
      w.emplace_back(RouterTensorName(c, i), normal({c.num_experts, d}).mul_(50));
      const int64_t width = c.moe_intermediate_size;
      if (c.gpt_oss()) {
        // Stored fused (fused_experts.h): gate_up's biases large enough (sd 8) that the
        // clamps at +-7 bite on a third of the units, its weights (sd 0.1) moving each unit
        // by token, and a narrow down projection, so that the clamped activations (up to 56)
        // add to the residual at the other layers' scale. (Weights large enough to clamp
        // instead amplify rounding past the batching tests' 1e-6.)
        const int64_t e = c.num_experts;
        w.emplace_back(name("mlp.router.bias"), normal({e}).mul_(200));
        w.emplace_back(FusedExpertsTensorName(i, "gate_up_proj"),
                       normal({e, d, 2 * width}).mul_(5));
        w.emplace_back(FusedExpertsTensorName(i, "gate_up_proj_bias"),
                       normal({e, 2 * width}).mul_(400));
        w.emplace_back(FusedExpertsTensorName(i, "down_proj"), normal({e, width, d}).mul_(0.05));
        w.emplace_back(FusedExpertsTensorName(i, "down_proj_bias"), normal({e, d}));
        continue;
      }
      for (int64_t e = 0; e < c.num_experts; ++e) {
        w.emplace_back(ExpertTensorName(c, i, e, ExpertMatrix::kGate), normal({width, d}));
        w.emplace_back(ExpertTensorName(c, i, e, ExpertMatrix::kUp), normal({width, d}));
        w.emplace_back(ExpertTensorName(c, i, e, ExpertMatrix::kDown), normal({d, width}));
      }
      if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {
        w.emplace_back(SharedExpertTensorName(i, ExpertMatrix::kGate), normal({shared, d}));
        w.emplace_back(SharedExpertTensorName(i, ExpertMatrix::kUp), normal({shared, d}));
        w.emplace_back(SharedExpertTensorName(i, ExpertMatrix::kDown), normal({d, shared}));
        // A gate whose sigmoid is well away from 0 and 1 and differs by token.
        w.emplace_back(SharedExpertGateTensorName(i), normal({1, d}).mul_(25));
      }
      continue;
    }
    w.emplace_back(name("mlp.gate_proj.weight"), normal({c.intermediate_size, d}));
    w.emplace_back(name("mlp.up_proj.weight"), normal({c.intermediate_size, d}));
    w.emplace_back(name("mlp.down_proj.weight"), normal({d, c.intermediate_size}));
  }
  w.emplace_back("model.norm.weight", norm(d));
  if (!c.tie_word_embeddings) w.emplace_back("lm_head.weight", normal({c.vocab_size, d}));
  return w;
}

NamedTensors FusePhi3Projections(const NamedTensors& weights) {
  const std::map<std::string, at::Tensor> by_name(weights.begin(), weights.end());
  NamedTensors out;
  for (const auto& [name, tensor] : weights) {
    bool part = false;
    for (const auto& [stored, parts] : Phi3FusedProjections()) {
      for (size_t i = 0; i < parts.size(); ++i) {
        const size_t at = name.rfind(parts[i] + ".");
        if (at == std::string::npos) continue;
        part = true;
        if (i != 0) continue;  // stacked where the first part stands
        const std::string prefix = name.substr(0, at);
        const std::string kind = name.substr(at + parts[i].size());  // ".weight" or ".bias"
        std::vector<at::Tensor> rows;
        for (const std::string& p : parts) rows.push_back(by_name.at(prefix + p + kind));
        out.emplace_back(prefix + stored + kind, at::cat(rows));
      }
    }
    if (!part) out.emplace_back(name, tensor);
  }
  return out;
}

absl::Status WriteCheckpoint(const ModelConfig& config, const NamedTensors& weights,
                             const std::filesystem::path& dir, at::ScalarType dtype) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(dir.string(), ": cannot create directory: ",
                                            ec.message()));
  }
  ModelConfig stored = config;
  stored.torch_dtype = TorchDtypeName(dtype);
  {
    std::ofstream out(dir / "config.json");
    out << stored.ToJson().dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat((dir / "config.json").string(), ": write failed"));
  }
  NamedTensors converted;
  converted.reserve(weights.size());
  // Packed values (int8 matrices, MXFP4 blocks and their exponents) are written as they are.
  for (const auto& [name, tensor] : weights) {
    converted.emplace_back(name, tensor.is_floating_point() ? tensor.to(dtype) : tensor);
  }
  if (config.architecture == Architecture::kPhi3) converted = FusePhi3Projections(converted);
  return WriteSafetensors(dir / "model.safetensors", converted, {{"format", "pt"}});
}

absl::StatusOr<std::shared_ptr<const Submodel>> TinyTestMiddle(const std::filesystem::path& dir) {
  const ModelConfig config = TinyTestConfig();
  TOPHAT_RETURN_IF_ERROR(WriteCheckpoint(config, InitWeights(config, 5), dir));
  TOPHAT_ASSIGN_OR_RETURN(auto checkpoint, CheckpointReader::Open(dir));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<Submodel> middle,
                          Submodel::Load(config, *checkpoint, SubmodelSpec::Middle(config, 1, 1)));
  return std::shared_ptr<const Submodel>(std::move(middle));
}

ModelConfig TinyTestConfig() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

ModelConfig TinyDecodeKernelConfig() {
  ModelConfig c = TinyTestConfig();
  c.hidden_size = 128;
  c.head_dim = 32;
  return c;
}

std::vector<std::pair<std::string, ModelConfig>> TinyTestVariants() {
  std::vector<std::pair<std::string, ModelConfig>> v;
  v.emplace_back("llama_gqa", TinyTestConfig());
  ModelConfig qwen = TinyTestConfig();
  qwen.architecture = Architecture::kQwen2;
  qwen.attention_bias = true;
  qwen.tie_word_embeddings = true;
  v.emplace_back("qwen2_bias_tied", qwen);
  ModelConfig llama3 = TinyTestConfig();
  llama3.rope_theta = 500000.0;
  llama3.rope_scaling = {.llama3 = true, .factor = 8.0, .low_freq_factor = 1.0,
                         .high_freq_factor = 4.0, .original_max_position_embeddings = 64};
  llama3.head_dim = 32;  // head_dim independent of hidden_size / heads
  v.emplace_back("llama3_rope_scaling", llama3);
  ModelConfig mistral = TinyTestConfig();
  mistral.architecture = Architecture::kMistral;
  mistral.sliding_window = 6;
  v.emplace_back("mistral_sliding_window", mistral);
  ModelConfig qwen3 = TinyTestConfig();
  qwen3.architecture = Architecture::kQwen3;
  qwen3.head_dim = 32;  // q_size 128 > hidden 64, as Qwen3-0.6B's 2048 > 1024
  qwen3.tie_word_embeddings = true;
  v.emplace_back("qwen3_qk_norm", qwen3);
  // Gemma 3: layers 0-2 slide over 6 positions with their own rotary base, layer 3 attends
  // in full; a score scale that is not head_dim's.
  ModelConfig gemma3 = TinyTestConfig();
  gemma3.architecture = Architecture::kGemma3;
  gemma3.head_dim = 32;
  gemma3.tie_word_embeddings = true;
  gemma3.sliding_window = 6;
  gemma3.sliding_layers = {true, true, true, false};
  gemma3.rope_theta = 1000000.0;
  gemma3.rope_local_theta = 10000.0;
  gemma3.query_pre_attn_scalar = 24;
  v.emplace_back("gemma3", gemma3);
  // Gemma 2: every other layer slides, from the first, all with one rotary base; scores and
  // logits soft-capped, the caps at these weights' scale (scores near 0.03, logits near 0.2)
  // so that both bite.
  ModelConfig gemma2 = TinyTestConfig();
  gemma2.architecture = Architecture::kGemma2;
  gemma2.head_dim = 32;
  gemma2.tie_word_embeddings = true;
  gemma2.sliding_window = 6;
  gemma2.sliding_layers = {true, false, true, false};
  gemma2.query_pre_attn_scalar = 24;
  gemma2.attn_logit_softcapping = 0.03;
  gemma2.final_logit_softcapping = 0.1;
  v.emplace_back("gemma2_softcap", gemma2);
  // Phi-4-mini's rotary: 12 of each head's 16 dimensions turn, by LongRoPE's short factors
  // below position 8 and its long ones from there (and an attention factor of sqrt(3));
  // stored with fused projections.
  ModelConfig phi3 = TinyTestConfig();
  phi3.architecture = Architecture::kPhi3;
  phi3.partial_rotary_factor = 0.75;
  phi3.tie_word_embeddings = true;
  phi3.rope_scaling = {.longrope = true,
                       .factor = 64.0,
                       .original_max_position_embeddings = 8,
                       .short_factor = {1.0, 1.2, 1.5, 2.0, 3.0, 4.0},
                       .long_factor = {1.0, 2.0, 4.0, 8.0, 16.0, 32.0},
                       .attention_factor = std::sqrt(3.0)};
  v.emplace_back("phi3_partial_longrope", phi3);
  // Mixtral: every layer's MLP 4 experts, 2 a token, their weights renormalised.
  ModelConfig mixtral = TinyTestConfig();
  mixtral.architecture = Architecture::kMixtral;
  mixtral.num_experts = 4;
  mixtral.num_experts_per_token = 2;
  mixtral.moe_intermediate_size = mixtral.intermediate_size;
  v.emplace_back("mixtral_experts", mixtral);
  // Qwen3-MoE: head norms; 8 narrower experts, 3 a token, weights as the router gave them
  // (norm_topk_prob false); layer 2 dense (mlp_only_layers).
  ModelConfig qwen3_moe = TinyTestConfig();
  qwen3_moe.architecture = Architecture::kQwen3Moe;
  qwen3_moe.head_dim = 32;
  qwen3_moe.num_experts = 8;
  qwen3_moe.num_experts_per_token = 3;
  qwen3_moe.moe_intermediate_size = 48;
  qwen3_moe.normalize_expert_weights = false;
  qwen3_moe.mlp_only_layers = {2};
  v.emplace_back("qwen3_moe_mixed", qwen3_moe);
  // Qwen2-MoE: q/k/v biases, 6 experts of 40, 2 a token, and a shared expert of 96 on every
  // token behind its sigmoid gate.
  ModelConfig qwen2_moe = TinyTestConfig();
  qwen2_moe.architecture = Architecture::kQwen2Moe;
  qwen2_moe.attention_bias = true;
  qwen2_moe.num_experts = 6;
  qwen2_moe.num_experts_per_token = 2;
  qwen2_moe.moe_intermediate_size = 40;
  qwen2_moe.normalize_expert_weights = false;
  qwen2_moe.shared_expert_intermediate_size = 96;
  v.emplace_back("qwen2_moe_shared", qwen2_moe);
  // gpt-oss: biases everywhere, sinks, every other layer sliding from the first, YaRN with
  // its ramp unrounded, 4 experts of 32 with 2 a token, clamped SwiGLU, stored fused.
  ModelConfig gpt_oss = TinyTestConfig();
  gpt_oss.architecture = Architecture::kGptOss;
  gpt_oss.attention_bias = true;
  gpt_oss.sliding_window = 6;
  gpt_oss.sliding_layers = {true, false, true, false};
  gpt_oss.rope_theta = 150000.0;
  gpt_oss.rope_scaling = {.yarn = true,
                          .factor = 8.0,
                          .original_max_position_embeddings = 16,
                          .attention_factor = 0.1 * std::log(8.0) + 1.0,
                          .truncate = false};
  gpt_oss.num_experts = 4;
  gpt_oss.num_experts_per_token = 2;
  gpt_oss.intermediate_size = 32;  // gpt-oss's experts are intermediate_size wide
  gpt_oss.moe_intermediate_size = 32;
  v.emplace_back("gpt_oss", gpt_oss);
  return v;
}

}  // namespace tophat
