// Fused rotary embedding (Hugging Face rotate-half layout) in one pass, instead of the eight
// dispatched LibTorch ops of the composite form; at decode time those dominate RoPE's cost.
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels {

// x: [T, heads, head_dim] with a contiguous last dimension (other strides free, e.g. a view
// into a fused qkv row); cos/sin: [T, head_dim/2] float32 on x's device. Returns a
// contiguous rotated copy. Float32 on the CPU takes the fused loop, float32/16/bf16 on CUDA
// one kernel launch; anything else the composite ops.
at::Tensor RotaryEmbedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// The same into `out` (contiguous, x's shape, dtype and device), allocating nothing on the
// fused paths.
void RotaryEmbeddingOut(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        at::Tensor& out);

// One head of head_dim = 2 * half float32 values rotated into `out` (not aliasing `in`) with
// one position's cos/sin rows: the arithmetic of RotaryEmbeddingOut's CPU path, for callers
// that work head by head (kernels/decode_step.h gets the same numbers).
void RotateHeadRow(const float* in, const float* cos, const float* sin, int64_t half,
                   float* out);

// A decoder layer's queries and keys rotated and its keys and values written into paged KV
// slots, in one CUDA launch (instead of two rotations of eight ops each and two scatters).
// qkv: [T, (heads + 2 * kv_heads) * head_dim], last dimension contiguous; cos/sin: [T,
// head_dim/2] float32; key_slots, value_slots: [num_slots, kv_heads, head_dim] contiguous
// (one pool layer viewed by slot), qkv's dtype and device; slots: [T] int64 on the device.
// Writes q_out ([T, heads, head_dim] contiguous). A negative slot writes no key or value
// (the padding rows of a captured decode graph). Returns false, touching nothing, when the
// inputs are not of that form or this build has no CUDA kernels: the caller then rotates
// with RotaryEmbedding and scatters itself.
bool RotaryQkvToCache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                      int64_t heads, int64_t kv_heads, int64_t head_dim, at::Tensor& key_slots,
                      at::Tensor& value_slots, const at::Tensor& slots, at::Tensor& q_out);
// Whether RotaryQkvToCache's destinations and tables take `tokens` rows of `like`'s dtype and
// device (the qkv rows' or, for the small-batch GEMM's rotary form, the activations'): cos
// and sin [tokens, head_dim / 2] float32, key_slots and value_slots [num_slots, kv_heads,
// head_dim], q_out [tokens, heads, head_dim], slots [tokens] int64, all contiguous there.
bool RotaryCacheWriteFits(const at::Tensor& like, int64_t tokens, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          const at::Tensor& key_slots, const at::Tensor& value_slots,
                          const at::Tensor& slots, const at::Tensor& q_out);

}  // namespace tophat::kernels
