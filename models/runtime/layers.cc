#include "models/runtime/layers.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/rms_norm.h"
#include "kernels/decode_attention.h"
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
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) /
                                                        static_cast<double>(config.head_dim));
  }
  if (config.rope_scaling.linear) {
    for (double& f : inv_freq) f /= config.rope_scaling.factor;
  }
  if (config.rope_scaling.llama3) {
    const RopeScaling& s = config.rope_scaling;
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
  at::Tensor cos = at::empty({max_positions, half}, at::kFloat);
  at::Tensor sin = at::empty({max_positions, half}, at::kFloat);
  float* cos_data = cos.data_ptr<float>();
  float* sin_data = sin.data_ptr<float>();
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      cos_data[p * half + i] = static_cast<float>(std::cos(angle));
      sin_data[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return RopeTable{.cos = cos.to(device), .sin = sin.to(device)};
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

}  // namespace tophat
