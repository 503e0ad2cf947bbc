#include "models/training/training_forward.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <limits>

namespace tophat {

at::Tensor TrainingLayers(const ModelConfig& c, const WeightMap& w, const RopeTable& rope,
                          at::Tensor x, int64_t begin, int64_t end) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t hd = c.head_dim;
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  const at::Tensor cos = rope.cos.narrow(0, 0, seq);
  const at::Tensor sin = rope.sin.narrow(0, 0, seq);
  // Causal, and with a sliding window only the last `window` positions (the runtime's and
  // transformers' rule: query i sees keys j with i - window < j <= i).
  at::Tensor mask =
      at::full({seq, seq}, -std::numeric_limits<float>::infinity(), x.options()).triu(1);
  if (c.sliding_window && *c.sliding_window < seq) {
    mask = mask + at::full({seq, seq}, -std::numeric_limits<float>::infinity(), x.options())
                      .tril(-*c.sliding_window);
  }
  for (int64_t i = begin; i < end; ++i) {
    auto p = [&](std::string_view s) -> const at::Tensor& { return w.at(LayerTensorName(i, s)); };
    // Every projection as the runtime computes it: the biases the architecture has (Qwen2's
    // q/k/v, Llama's with attention_bias) and Qwen3's head norms before rotary.
    auto project = [&](const std::string& name, bool bias, const at::Tensor& input) {
      return bias ? at::linear(input, p(name + ".weight"), p(name + ".bias"))
                  : at::linear(input, p(name + ".weight"));
    };
    at::Tensor h = RmsNorm(x, p("input_layernorm.weight"), c.rms_norm_eps);
    at::Tensor q = project("self_attn.q_proj", c.attention_bias, h).view({batch, seq, -1, hd});
    at::Tensor k = project("self_attn.k_proj", c.attention_bias, h).view({batch, seq, -1, hd});
    at::Tensor v = project("self_attn.v_proj", c.attention_bias, h).view({batch, seq, -1, hd});
    if (c.qk_norm()) {
      q = RmsNorm(q, p("self_attn.q_norm.weight"), c.rms_norm_eps);
      k = RmsNorm(k, p("self_attn.k_norm.weight"), c.rms_norm_eps);
    }
    q = ApplyRope(q, cos, sin).transpose(1, 2);
    k = ApplyRope(k, cos, sin).repeat_interleave(group, 2).transpose(1, 2);
    v = v.repeat_interleave(group, 2).transpose(1, 2);
    at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
    at::Tensor attention = at::matmul(at::softmax(scores + mask, -1), v);
    attention = attention.transpose(1, 2).reshape({batch, seq, -1});
    x = x + project("self_attn.o_proj", c.o_bias(), attention);
    h = RmsNorm(x, p("post_attention_layernorm.weight"), c.rms_norm_eps);
    at::Tensor mlp = at::silu(at::linear(h, p("mlp.gate_proj.weight"))) *
                     at::linear(h, p("mlp.up_proj.weight"));
    x = x + at::linear(mlp, p("mlp.down_proj.weight"));
  }
  return x;
}

at::Tensor TrainingHead(const ModelConfig& c, const WeightMap& w, const at::Tensor& x) {
  const at::Tensor h = RmsNorm(x, w.at("model.norm.weight"), c.rms_norm_eps);
  return at::linear(h, c.tie_word_embeddings ? w.at("model.embed_tokens.weight")
                                             : w.at("lm_head.weight"));
}

at::Tensor TrainingLogits(const ModelConfig& c, const WeightMap& w, const RopeTable& rope,
                          const at::Tensor& ids) {
  at::Tensor x = at::embedding(w.at("model.embed_tokens.weight"), ids);
  return TrainingHead(c, w, TrainingLayers(c, w, rope, x, 0, c.num_hidden_layers));
}

double WarmupCosineLearningRate(double peak, int64_t step, int64_t total_steps) {
  const int64_t warmup = std::max<int64_t>(1, total_steps / 20);
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

TrainingProgress MakeTrainingProgress(int64_t step, int64_t total_steps, int64_t steps_this_run,
                                      double loss, int64_t tokens_per_step,
                                      double elapsed_seconds) {
  const auto done = static_cast<double>(steps_this_run);
  TrainingProgress progress;
  progress.step = step;
  progress.total_steps = total_steps;
  progress.loss = loss;
  progress.tokens_per_second = done * static_cast<double>(tokens_per_step) / elapsed_seconds;
  progress.eta_seconds = elapsed_seconds / done * static_cast<double>(total_steps - step);
  return progress;
}

nlohmann::json ReadJsonOrNull(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json();
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

}  // namespace tophat
