// A checkpoint's config.json, read as every tophat program reads one.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "models/formats/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = tophat::fuzz::WriteInput("config.json", data, size);
  auto config = tophat::ModelConfig::Load(path);
  if (!config.ok()) return 0;
  // What it accepted is a usable shape, and reads back to itself.
  TOPHAT_FUZZ_CHECK(config->hidden_size > 0 && config->num_hidden_layers > 0);
  TOPHAT_FUZZ_CHECK(config->head_dim > 0 && config->num_key_value_heads > 0);
  // Rotary turns an even number of a head's dimensions, and LongRoPE has a factor per pair.
  const int64_t rotary_dim = config->rotary_dim();
  TOPHAT_FUZZ_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= config->head_dim);
  const tophat::RopeScaling& scaling = config->rope_scaling;
  if (scaling.longrope) {
    TOPHAT_FUZZ_CHECK(static_cast<int64_t>(scaling.short_factor.size()) == rotary_dim / 2);
    TOPHAT_FUZZ_CHECK(static_cast<int64_t>(scaling.long_factor.size()) == rotary_dim / 2);
    TOPHAT_FUZZ_CHECK(scaling.attention_factor > 0 && scaling.original_max_position_embeddings > 0);
  }
  if (scaling.yarn) {
    TOPHAT_FUZZ_CHECK(scaling.factor > 0 && scaling.attention_factor > 0);
    TOPHAT_FUZZ_CHECK(scaling.beta_fast > 0 && scaling.beta_slow > 0);
  }
  // Soft-caps are Gemma 2's, positive and finite where set.
  for (const double cap : {config->attn_logit_softcapping, config->final_logit_softcapping}) {
    TOPHAT_FUZZ_CHECK(cap == 0 || (cap > 0 && std::isfinite(cap)));
    TOPHAT_FUZZ_CHECK(cap == 0 || config->architecture == tophat::Architecture::kGemma2);
  }
  // Experts: a mixture's choice fits its experts, and its dense layers are layers.
  if (config->num_experts > 0) {
    TOPHAT_FUZZ_CHECK(config->num_experts_per_token >= 1 &&
                      config->num_experts_per_token <= config->num_experts);
    TOPHAT_FUZZ_CHECK(config->moe_intermediate_size > 0 && config->decoder_sparse_step >= 1);
    for (const int64_t layer : config->mlp_only_layers) {
      TOPHAT_FUZZ_CHECK(layer >= 0 && layer < config->num_hidden_layers);
    }
  }
  auto again = tophat::ModelConfig::FromJson(config->ToJson(), "round trip");
  TOPHAT_FUZZ_CHECK(again.ok());
  TOPHAT_FUZZ_CHECK(again->hidden_size == config->hidden_size);
  TOPHAT_FUZZ_CHECK(again->rotary_dim() == rotary_dim);
  TOPHAT_FUZZ_CHECK(again->rope_scaling.longrope == scaling.longrope);
  TOPHAT_FUZZ_CHECK(again->rope_scaling.long_factor == scaling.long_factor);
  TOPHAT_FUZZ_CHECK(again->rope_scaling.yarn == scaling.yarn);
  TOPHAT_FUZZ_CHECK(again->rope_scaling.attention_factor == scaling.attention_factor);
  TOPHAT_FUZZ_CHECK(again->rope_scaling.factor == scaling.factor);
  TOPHAT_FUZZ_CHECK(again->attn_logit_softcapping == config->attn_logit_softcapping);
  TOPHAT_FUZZ_CHECK(again->final_logit_softcapping == config->final_logit_softcapping);
  TOPHAT_FUZZ_CHECK(again->sliding_layers == config->sliding_layers);
  TOPHAT_FUZZ_CHECK(again->num_experts == config->num_experts);
  TOPHAT_FUZZ_CHECK(again->num_experts_per_token == config->num_experts_per_token);
  TOPHAT_FUZZ_CHECK(again->moe_intermediate_size == config->moe_intermediate_size);
  TOPHAT_FUZZ_CHECK(again->normalize_expert_weights == config->normalize_expert_weights);
  TOPHAT_FUZZ_CHECK(again->mlp_only_layers == config->mlp_only_layers);
  TOPHAT_FUZZ_CHECK(again->shared_expert_intermediate_size ==
                    config->shared_expert_intermediate_size);
  TOPHAT_FUZZ_CHECK(again->attention_bias == config->attention_bias);
  return 0;
}
