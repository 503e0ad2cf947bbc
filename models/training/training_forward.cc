#include "models/training/training_forward.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace tophat {

namespace {

// Gemma's norms scale by 1 + weight (the runtime adds the 1 as it loads).
at::Tensor TrainingRmsNorm(const ModelConfig& c, const at::Tensor& x, const at::Tensor& weight) {
  return RmsNorm(x, c.gemma() ? weight + 1.0 : weight, c.rms_norm_eps);
}

// A sparse layer's MLP (ModelConfig::MoeLayer) of `h` [..., D], routed as the runtime and
// transformers route it: each token to its top K experts by softmax probability, renormalised
// where the model does, each expert computing only its tokens.
at::Tensor TrainingExperts(const ModelConfig& c, const WeightMap& w, int64_t layer,
                           const at::Tensor& h) {
  const at::Tensor rows = h.reshape({-1, c.hidden_size});
  // gpt-oss's router has a bias; its softmax over the top K logits is the top K renormalised.
  const at::Tensor router_bias =
      c.gpt_oss() ? w.at(LayerTensorName(layer, "mlp.router.bias")) : at::Tensor();
  const at::Tensor probs =
      at::softmax(at::linear(rows, w.at(RouterTensorName(c, layer)), router_bias), -1, at::kFloat);
  auto [weights, ids] = at::topk(probs, c.num_experts_per_token, -1);
  if (c.normalize_expert_weights) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(rows.scalar_type());
  at::Tensor out = at::zeros_like(rows);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const at::Tensor hit = (ids == e).nonzero();  // [n, 2]: token, rank
    if (hit.size(0) == 0) continue;
    const at::Tensor token = hit.select(1, 0);
    if (c.gpt_oss()) {
      // Stored fused (models/runtime/fused_experts.h): x @ W, gate and up interleaved, the
      // SwiGLU clamped.
      auto fused = [&](std::string_view part) {
        return w.at(LayerTensorName(layer, absl::StrCat("mlp.experts.", std::string(part))))[e];
      };
      const at::Tensor gate_up = at::matmul(rows.index_select(0, token), fused("gate_up_proj")) +
                                 fused("gate_up_proj_bias");
      const at::Tensor gate = gate_up.slice(-1, 0, gate_up.size(-1), 2).clamp_max(7.0);
      const at::Tensor up = gate_up.slice(-1, 1, gate_up.size(-1), 2).clamp(-7.0, 7.0);
      const at::Tensor y =
          at::matmul((up + 1) * (gate * at::sigmoid(gate * 1.702)), fused("down_proj")) +
          fused("down_proj_bias");
      const at::Tensor weight = weights.index({token, hit.select(1, 1)}).unsqueeze(1);
      out = out.index_add(0, token, y * weight);
      continue;
    }
    auto m = [&](ExpertMatrix role) -> const at::Tensor& {
      return w.at(ExpertTensorName(c, layer, e, role));
    };
    const at::Tensor x = rows.index_select(0, token);
    const at::Tensor y = at::linear(
        at::silu(at::linear(x, m(ExpertMatrix::kGate))) * at::linear(x, m(ExpertMatrix::kUp)),
        m(ExpertMatrix::kDown));
    const at::Tensor weight = weights.index({token, hit.select(1, 1)}).unsqueeze(1);
    out = out.index_add(0, token, y * weight);
  }
  if (c.shared_expert_intermediate_size > 0) {
    // Qwen2-MoE's shared expert on every token, behind its sigmoid gate.
    auto m = [&](ExpertMatrix role) -> const at::Tensor& {
      return w.at(SharedExpertTensorName(layer, role));
    };
    const at::Tensor shared = at::linear(
        at::silu(at::linear(rows, m(ExpertMatrix::kGate))) * at::linear(rows, m(ExpertMatrix::kUp)),
        m(ExpertMatrix::kDown));
    out = out + at::sigmoid(at::linear(rows, w.at(SharedExpertGateTensorName(layer)))) * shared;
  }
  return out.view(h.sizes());
}

}  // namespace

at::Tensor TrainingLayers(const ModelConfig& c, const WeightMap& w, const RopeTable& rope,
                          at::Tensor x, int64_t begin, int64_t end) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t hd = c.head_dim;
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  const at::Tensor cos = rope.cos.narrow(0, 0, seq);
  const at::Tensor sin = rope.sin.narrow(0, 0, seq);
  // Gemma 3's sliding layers turn with a base of their own.
  RopeTable local_rope;
  if (c.rope_local_theta) local_rope = RopeTable::CreateLocal(c, seq, x.device());
  // Causal, and with a sliding window only the last `window` positions (the runtime's and
  // transformers' rule: query i sees keys j with i - window < j <= i).
  const at::Tensor causal =
      at::full({seq, seq}, -std::numeric_limits<float>::infinity(), x.options()).triu(1);
  at::Tensor windowed = causal;
  if (c.sliding_window && *c.sliding_window < seq) {
    windowed = causal + at::full({seq, seq}, -std::numeric_limits<float>::infinity(), x.options())
                            .tril(-*c.sliding_window);
  }
  auto norm = [&](const at::Tensor& input, const at::Tensor& weight) {
    return TrainingRmsNorm(c, input, weight);
  };
  // Partial rotary: the weights stay in their stored order (what the runtime loads and
  // reorders), the projected heads are put in the runtime's order for the runtime's table.
  const std::vector<int64_t> rotary_order = RotaryHeadOrder(c);
  const at::Tensor head_order =
      rotary_order.empty() ? at::Tensor() : at::tensor(rotary_order, at::kLong).to(x.device());
  for (int64_t i = begin; i < end; ++i) {
    auto p = [&](std::string_view s) -> const at::Tensor& { return w.at(LayerTensorName(i, s)); };
    const at::Tensor& mask = c.LayerWindow(i) ? windowed : causal;
    const bool local = c.LocalRope(i);
    const at::Tensor& layer_cos = local ? local_rope.cos : cos;
    const at::Tensor& layer_sin = local ? local_rope.sin : sin;
    // Every projection as the runtime computes it: the biases the architecture has (Qwen2's
    // q/k/v, Llama's with attention_bias) and Qwen3's head norms before rotary.
    auto project = [&](const std::string& name, bool bias, const at::Tensor& input) {
      return bias ? at::linear(input, p(name + ".weight"), p(name + ".bias"))
                  : at::linear(input, p(name + ".weight"));
    };
    at::Tensor h = norm(x, p("input_layernorm.weight"));
    at::Tensor q = project("self_attn.q_proj", c.attention_bias, h).view({batch, seq, -1, hd});
    at::Tensor k = project("self_attn.k_proj", c.attention_bias, h).view({batch, seq, -1, hd});
    at::Tensor v = project("self_attn.v_proj", c.attention_bias, h).view({batch, seq, -1, hd});
    if (c.qk_norm()) {
      q = norm(q, p("self_attn.q_norm.weight"));
      k = norm(k, p("self_attn.k_norm.weight"));
    }
    if (head_order.defined()) {
      q = q.index_select(3, head_order);
      k = k.index_select(3, head_order);
    }
    q = ApplyRope(q, layer_cos, layer_sin).transpose(1, 2);
    k = ApplyRope(k, layer_cos, layer_sin).repeat_interleave(group, 2).transpose(1, 2);
    v = v.repeat_interleave(group, 2).transpose(1, 2);
    // Divided by the root rather than multiplied by its reciprocal, which rounds differently
    // where the root is inexact (head_dim 32) and trains another toy model: the one the
    // serving tests' agreement counts were measured on is this arithmetic's.
    at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(c.attention_scalar());
    if (const double cap = c.attn_logit_softcapping; cap > 0) {
      scores = at::tanh(scores / cap) * cap;  // Gemma 2's cap, before the mask
    }
    at::Tensor probs;
    if (auto sinks = w.find(LayerTensorName(i, "self_attn.sinks")); sinks != w.end()) {
      // gpt-oss: a sink logit per head joins each row's softmax and is dropped after it.
      const at::Tensor column = sinks->second.to(scores.scalar_type())
                                    .view({1, -1, 1, 1})
                                    .expand({batch, c.num_attention_heads, seq, 1});
      probs = at::softmax(at::cat({scores + mask, column}, -1), -1).narrow(-1, 0, seq);
    } else {
      probs = at::softmax(scores + mask, -1);
    }
    at::Tensor attention = at::matmul(probs, v);
    attention = attention.transpose(1, 2).reshape({batch, seq, -1});
    at::Tensor out = project("self_attn.o_proj", c.o_bias(), attention);
    if (c.gemma()) {
      // Gemma norms each sublayer's output before its residual add.
      x = x + norm(out, p("post_attention_layernorm.weight"));
      h = norm(x, p("pre_feedforward_layernorm.weight"));
      const at::Tensor mlp = at::gelu(at::linear(h, p("mlp.gate_proj.weight")), "tanh") *
                             at::linear(h, p("mlp.up_proj.weight"));
      x = x +
          norm(at::linear(mlp, p("mlp.down_proj.weight")), p("post_feedforward_layernorm.weight"));
      continue;
    }
    x = x + out;
    h = norm(x, p("post_attention_layernorm.weight"));
    if (c.MoeLayer(i)) {
      x = x + TrainingExperts(c, w, i, h);
      continue;
    }
    at::Tensor mlp = at::silu(at::linear(h, p("mlp.gate_proj.weight"))) *
                     at::linear(h, p("mlp.up_proj.weight"));
    x = x + at::linear(mlp, p("mlp.down_proj.weight"));
  }
  return x;
}

at::Tensor TrainingEmbed(const ModelConfig& c, const WeightMap& w, const at::Tensor& ids) {
  at::Tensor x = at::embedding(w.at("model.embed_tokens.weight"), ids);
  if (c.gemma()) x = x * c.embedding_scale();
  return x;
}

at::Tensor TrainingHead(const ModelConfig& c, const WeightMap& w, const at::Tensor& x) {
  const at::Tensor h = TrainingRmsNorm(c, x, w.at("model.norm.weight"));
  const at::Tensor logits = at::linear(
      h, c.tie_word_embeddings ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight"));
  const double cap = c.final_logit_softcapping;
  return cap > 0 ? at::tanh(logits / cap) * cap : logits;  // Gemma 2's cap
}

at::Tensor TrainingLogits(const ModelConfig& c, const WeightMap& w, const RopeTable& rope,
                          const at::Tensor& ids) {
  const at::Tensor x = TrainingEmbed(c, w, ids);
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
