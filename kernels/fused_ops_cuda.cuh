// Host launchers for the fused elementwise and row kernels of a decoder layer on CUDA
// (kernels/fused_ops.cu); includable from .cc files (no CUDA types exposed). Each replaces
// a run of LibTorch ops whose launches, not their arithmetic, dominate a decode step: on an
// H100 a 29-layer bf16 middle spent 9 of its 13 ms per batch-1 step outside the memory
// bound, about 45 launches per layer. Arithmetic is float32 whatever the storage dtype.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda_launch.h"

namespace tophat::kernels {

// y = x * rsqrt(mean(x^2) + eps) * weight, row by row. With `residual` non-null, first
// residual += x (rounded to the storage dtype, as the composite `x + residual` would be)
// and then y = norm(residual): the add of a layer's output into the residual stream fused
// with the next norm. x, residual, y: [rows, d] contiguous; weight: [d]; all of `dtype`.
struct RmsNormArgs {
  CudaDtype dtype = CudaDtype::kFloat32;
  const void* x = nullptr;
  void* residual = nullptr;
  const void* weight = nullptr;
  void* y = nullptr;
  int64_t rows = 0;
  int64_t d = 0;
  float eps = 1e-6f;
  void* stream = nullptr;  // cudaStream_t; nullptr is the legacy default stream
  // Launched overlapped with the preceding kernel (kernels/cuda_overlap.cuh); the callers
  // pass OverlapKernelLaunches().
  bool overlap = false;
};
LaunchResult LaunchRmsNorm(const RmsNormArgs& args, std::string* error);

// Each head's RMSNorm in place (Qwen3's q_norm and k_norm): `heads` heads per token, token t's
// head h at x + t * row_stride + h * head_dim (head_dim contiguous: the query or key part of a
// qkv row), each scaled by rsqrt(mean(head^2) + eps) and by weight [head_dim].
struct HeadRmsNormArgs {
  CudaDtype dtype = CudaDtype::kFloat32;
  void* x = nullptr;
  int64_t row_stride = 0;
  const void* weight = nullptr;
  int64_t tokens = 0;
  int heads = 0;
  int head_dim = 0;
  float eps = 1e-6f;
  void* stream = nullptr;
  bool overlap = false;  // kernels/cuda_overlap.cuh
};
LaunchResult LaunchHeadRmsNorm(const HeadRmsNormArgs& args, std::string* error);

// out = silu(gate) * up for rows of [gate | up]: gate_up [rows, 2 * inner], out [rows,
// inner], both contiguous.
struct SwiGluArgs {
  CudaDtype dtype = CudaDtype::kFloat32;
  const void* gate_up = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t inner = 0;
  void* stream = nullptr;
  bool overlap = false;  // kernels/cuda_overlap.cuh
};
LaunchResult LaunchSwiGlu(const SwiGluArgs& args, std::string* error);

// Rotary embedding (Hugging Face rotate-half layout) of `heads` heads per token read from
// x (token t, head h at x + t * row_stride + h * head_stride, head_dim contiguous) into out
// [tokens, heads, head_dim] contiguous. cos, sin: [tokens, head_dim / 2] float32.
struct RotaryArgs {
  CudaDtype dtype = CudaDtype::kFloat32;
  const void* x = nullptr;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
  void* out = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t tokens = 0;
  int heads = 0;
  int head_dim = 0;
  void* stream = nullptr;
  bool overlap = false;  // kernels/cuda_overlap.cuh
};
LaunchResult LaunchRotary(const RotaryArgs& args, std::string* error);

// The step of a layer between its qkv projection and attention, in one launch: from qkv
// rows [tokens, (heads + 2 * kv_heads) * head_dim] (row t at qkv + t * row_stride), the
// rotated queries into q_out [tokens, heads, head_dim] contiguous, and each token's rotated
// key and its value into the paged cache slot slots[t] of key_slots / value_slots
// ([num_slots, kv_heads, head_dim] contiguous: a KvBlockPool layer viewed by slot).
struct RotaryQkvToCacheArgs {
  CudaDtype dtype = CudaDtype::kFloat32;
  const void* qkv = nullptr;
  int64_t row_stride = 0;
  void* q_out = nullptr;
  void* key_slots = nullptr;
  void* value_slots = nullptr;
  const int64_t* slots = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t tokens = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  void* stream = nullptr;
  bool overlap = false;  // kernels/cuda_overlap.cuh
};
LaunchResult LaunchRotaryQkvToCache(const RotaryQkvToCacheArgs& args, std::string* error);

}  // namespace tophat::kernels
