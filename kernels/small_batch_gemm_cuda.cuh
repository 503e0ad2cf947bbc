// Host launcher for the small-batch GEMM on CUDA (kernels/small_batch_gemm.cu); includable
// from .cc files (no CUDA types exposed).
//
// A decode step of a few rows multiplies each weight matrix by 1-8 activation rows: it is a
// read of the weights, and its time is their bytes over the memory rate. cuBLAS picks its
// kernel per shape; on an H100 at batch 1 it read Llama-3-8B's o_proj (4,096 x 4,096) at
// 1.6 TB/s against 2.9 for the other matrices (docs/benchmarks.md). This kernel streams
// every matrix the same way: one warp a weight row, 16-byte loads four deep that skip L1 so
// that the activation rows, read by every warp, stay there, products and sums in float32,
// and each output rounded once to the storage dtype (what cuBLAS gives too). Which row counts
// of which matrices take it is measured at load (models/runtime/gemm_tactics.h), not assumed.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda_launch.h"

namespace tophat::kernels {

// Most activation rows the kernel takes: past this a step is a GEMM that tensor cores win.
inline constexpr int64_t kSmallBatchGemmMaxRows = 8;

// out[r, j] = sum_i x[r, i] * weight[j, i] (+ bias[j]) for r < rows, j < n, i < k.
// x: rows of k values, ldx apart; weight: [n, k] contiguous; bias: [n] or nullptr; out: rows
// of n values, ldo apart; all of `dtype` (float16 or bfloat16). kUnsupported (nothing
// launched) for float32, rows outside [1, kSmallBatchGemmMaxRows], k or ldx not a multiple
// of 8, or x / weight not 16-byte aligned.
// Two more forms write what this GEMM followed by another kernel would, to the bit, in one
// launch and without the intermediate (each product rounded to the storage dtype first, as
// the plain form writes it):
// - kSwiGlu: the weight is a gate and up projection stacked, [2n, k] (gate rows first), and
//   out[r, j] = silu(g) * u of g = x[r] · weight[j] and u = x[r] · weight[n + j] (the SwiGLU
//   kernel after the GEMM). No bias.
// - kRotaryQkv: the weight is a stacked q, k, v projection, [(heads + 2 kv_heads) head_dim,
//   k] (bias optional), and the products go where the rotary + KV-write kernel
//   (LaunchRotaryQkvToCache) would put them: rotated queries into rotary.q_out, rotated
//   keys and the values into the cache slots of rotary.slots (none for a negative slot).
//   n is the weight's rows; out and ldo are unused.
enum class SmallBatchGemmForm { kPlain, kSwiGlu, kRotaryQkv };

// Where the rotary form's products go (RotaryQkvToCacheArgs's fields of the same names).
struct SmallBatchGemmRotary {
  void* q_out = nullptr;        // [rows, heads, head_dim] contiguous
  void* key_slots = nullptr;    // [num_slots, kv_heads, head_dim] contiguous
  void* value_slots = nullptr;  // the same
  const int64_t* slots = nullptr;  // [rows]
  const float* cos = nullptr;      // [rows, head_dim / 2]
  const float* sin = nullptr;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
};

struct SmallBatchGemmArgs {
  CudaDtype dtype = CudaDtype::kBFloat16;
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t ldo = 0;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t k = 0;
  SmallBatchGemmForm form = SmallBatchGemmForm::kPlain;
  SmallBatchGemmRotary rotary;  // kRotaryQkv
  void* stream = nullptr;  // cudaStream_t; nullptr is the legacy default stream
  bool overlap = false;  // kernels/cuda_overlap.cuh
};
LaunchResult LaunchSmallBatchGemm(const SmallBatchGemmArgs& args, std::string* error);

}  // namespace tophat::kernels
