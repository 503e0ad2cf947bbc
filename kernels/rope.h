// Fused rotary embedding (Hugging Face rotate-half layout) in one pass, instead of the eight
// dispatched LibTorch ops of the composite form; at decode time those dominate RoPE's cost.
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels {

// x: [T, heads, head_dim] with a contiguous last dimension (other strides free, e.g. a view
// into a fused qkv row); cos/sin: [T, head_dim/2]. Returns a contiguous rotated copy.
// Float32 CPU takes the fused loop; anything else the composite ops.
at::Tensor RotaryEmbedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tophat::kernels
