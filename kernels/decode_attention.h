// Attention of one query token against a sequence's cached keys and values, in one pass per
// head. At decode time the composite form (permute, bmm, scale, softmax, bmm, permute, copy)
// costs more in dispatch than in arithmetic.
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels {

// q: [heads, head_dim]; keys, values: [positions, kv_heads, head_dim] (row-major views into
// a KV cache, last dimension contiguous); query head h uses KV head h / (heads / kv_heads).
// Writes softmax(q k^T * scale) v into `out` ([heads * head_dim], contiguous float32).
// Returns false (and writes nothing) when the inputs are not float32 CPU of that layout, so
// the caller can take the composite path.
bool DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                     double scale, at::Tensor& out);

// silu(gate) * up for gate_up = [gate | up] along the last dimension, in one pass.
at::Tensor SwiGlu(const at::Tensor& gate_up);

}  // namespace tophat::kernels
