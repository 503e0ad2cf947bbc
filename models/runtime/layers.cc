#include "models/runtime/layers.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/decode_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace tophat {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return kernels::RmsNorm(x, weight, eps);
}

at::Tensor AddRmsNorm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                      double eps) {
  return kernels::AddRmsNorm(residual, delta, weight, eps);
}

at::Tensor SplitForHalfProducts(const at::Tensor& x, at::ScalarType dtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat,
              "SplitForHalfProducts takes float32 rows [T, C]");
  const int64_t rows = x.size(0);
  at::Tensor halves = at::empty({2 * rows, x.size(1)}, x.options().dtype(dtype));
  at::Tensor rounded = halves.narrow(0, 0, rows);
  rounded.copy_(x);
  halves.narrow(0, rows, rows).copy_(x - rounded.to(at::kFloat));
  return halves;
}

RopeTable RopeTable::Create(const ModelConfig& config, int64_t max_positions, at::Device device) {
  const int64_t half = config.head_dim / 2;
  // The turning pairs: all of the head's, or rotary_dim / 2 of them (partial rotary).
  const int64_t pairs = config.rotary_dim() / 2;
  auto frequencies = [&](const std::vector<double>& divisors) {
    std::vector<double> inv_freq(pairs);
    for (int64_t i = 0; i < pairs; ++i) {
      inv_freq[i] = 1.0 / std::pow(config.rope_theta,
                                   static_cast<double>(2 * i) / static_cast<double>(2 * pairs));
      if (!divisors.empty()) inv_freq[i] /= divisors[i];
    }
    return inv_freq;
  };
  const RopeScaling& s = config.rope_scaling;
  std::vector<double> inv_freq = frequencies(s.longrope ? s.short_factor : std::vector<double>());
  if (s.linear) {
    for (double& f : inv_freq) f /= s.factor;
  }
  if (s.llama3) {
    const double old_context = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / s.low_freq_factor;
    const double high_freq_wavelen = old_context / s.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  if (s.yarn) {
    // YaRN as transformers computes it: the pair index d at which a frequency turns r times
    // over the original length, a ramp from the fast end (beta_fast turns, kept) to the slow
    // end (beta_slow turns, divided by the factor).
    const double dim = static_cast<double>(2 * pairs);
    const double original = static_cast<double>(s.original_max_position_embeddings);
    auto pair_turning = [&](double turns) {
      return dim * std::log(original / (turns * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(config.rope_theta));
    };
    double low = pair_turning(s.beta_fast);
    double high = pair_turning(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    for (int64_t i = 0; i < pairs; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double kept = 1.0 - ramp;  // the share of the unscaled frequency
      inv_freq[i] = inv_freq[i] / s.factor * (1.0 - kept) + inv_freq[i] * kept;
    }
  }
  // LongRoPE: positions from the original length on turn by the long factors.
  const std::vector<double> long_inv_freq =
      s.longrope ? frequencies(s.long_factor) : std::vector<double>();
  const int64_t long_from = s.longrope ? s.original_max_position_embeddings : max_positions;
  const double magnitude = s.longrope || s.yarn ? s.attention_factor : 1.0;
  at::Tensor cos = at::empty({max_positions, half}, at::kFloat);
  at::Tensor sin = at::empty({max_positions, half}, at::kFloat);
  float* cos_data = cos.data_ptr<float>();
  float* sin_data = sin.data_ptr<float>();
  for (int64_t p = 0; p < max_positions; ++p) {
    const std::vector<double>& freq = p < long_from ? inv_freq : long_inv_freq;
    for (int64_t i = 0; i < pairs; ++i) {
      const double angle = static_cast<double>(p) * freq[i];
      cos_data[p * half + i] = static_cast<float>(std::cos(angle) * magnitude);
      sin_data[p * half + i] = static_cast<float>(std::sin(angle) * magnitude);
    }
    // The pairs RotaryHeadOrder puts the unturned dimensions in: the identity.
    for (int64_t i = pairs; i < half; ++i) {
      cos_data[p * half + i] = 1.0f;
      sin_data[p * half + i] = 0.0f;
    }
  }
  return RopeTable{.cos = cos.to(device), .sin = sin.to(device)};
}

std::vector<int64_t> RotaryHeadOrder(const ModelConfig& config) {
  const int64_t hd = config.head_dim;
  const int64_t r = config.rotary_dim();
  if (r == hd) return {};
  // Stored order: [turned first halves | turned second halves | unturned]; rotate_half pairs
  // dimension i with i + r/2 for i < r/2. Runtime order: [turned first halves | unturned first
  // half | turned second halves | unturned second half], so that dimension j pairs with
  // j + hd/2 for every j, the unturned ones with an identity row of the table.
  const int64_t pass = (hd - r) / 2;
  std::vector<int64_t> order;
  order.reserve(hd);
  for (int64_t i = 0; i < r / 2; ++i) order.push_back(i);
  for (int64_t i = 0; i < pass; ++i) order.push_back(r + i);
  for (int64_t i = 0; i < r / 2; ++i) order.push_back(r / 2 + i);
  for (int64_t i = 0; i < pass; ++i) order.push_back(r + pass + i);
  return order;
}

RopeTable RopeTable::CreateLocal(const ModelConfig& config, int64_t max_positions,
                                 at::Device device) {
  ModelConfig local = config;
  local.rope_theta = config.rope_local_theta.value_or(config.rope_theta);
  local.rope_scaling = {};
  return Create(local, max_positions, device);
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return kernels::RotaryEmbedding(x, cos, sin);
}

at::Tensor SwiGlu(const at::Tensor& gate_up) { return kernels::SwiGlu(gate_up); }

std::string LayerTensorName(int64_t layer, std::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", std::string(suffix));
}

namespace {
bool MixtralNames(const ModelConfig& config) {
  return config.architecture == Architecture::kMixtral;
}
}  // namespace

std::string RouterTensorName(const ModelConfig& config, int64_t layer) {
  if (config.gpt_oss()) return LayerTensorName(layer, "mlp.router.weight");
  return LayerTensorName(layer,
                         MixtralNames(config) ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}

std::string SharedExpertTensorName(int64_t layer, ExpertMatrix matrix) {
  static constexpr const char* kNames[] = {"gate_proj", "up_proj", "down_proj"};
  return absl::StrCat("model.layers.", layer, ".mlp.shared_expert.",
                      kNames[static_cast<size_t>(matrix)], ".weight");
}

std::string SharedExpertGateTensorName(int64_t layer) {
  return LayerTensorName(layer, "mlp.shared_expert_gate.weight");
}

std::string ExpertTensorName(const ModelConfig& config, int64_t layer, int64_t expert,
                             ExpertMatrix matrix) {
  static constexpr const char* kMixtral[] = {"w1", "w3", "w2"};
  static constexpr const char* kQwen[] = {"gate_proj", "up_proj", "down_proj"};
  const auto index = static_cast<size_t>(matrix);
  return MixtralNames(config) ? absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.",
                                             expert, ".", kMixtral[index], ".weight")
                              : absl::StrCat("model.layers.", layer, ".mlp.experts.", expert, ".",
                                             kQwen[index], ".weight");
}

}  // namespace tophat
