// Fused decoder-layer kernels: RMSNorm (optionally with the residual add before it),
// SwiGLU, rotary embedding, and rotary embedding of a qkv row together with the paged KV
// write. All compute in float32 and store in the tensors' dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_launch_status.cuh"
#include "kernels/cuda_numeric.cuh"
#include "kernels/cuda_overlap.cuh"
#include "kernels/fused_ops_cuda.cuh"

namespace tophat::kernels {
namespace {

constexpr int kThreads = 256;

__device__ inline float BlockSum(float value) {
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

// One block per row. With a residual, the sum is stored first and normalised as stored,
// so the result is what `residual = residual + x; y = norm(residual)` gives op by op.
template <typename T, bool kAddResidual>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ w,
                  T* __restrict__ y, int64_t d, float eps) {
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * d;
  const T* xr = x + offset;
  T* yr = y + offset;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    float v = ToFloat(xr[i]);
    if constexpr (kAddResidual) {
      const T stored = FromFloat<T>(v + ToFloat(residual[offset + i]));
      residual[offset + i] = stored;
      v = ToFloat(stored);
    }
    sum += v * v;
  }
  const float scale = rsqrtf(BlockSum(sum) / static_cast<float>(d) + eps);
  // Each thread reads back only the elements it wrote itself: no barrier needed.
  const T* source = kAddResidual ? residual + offset : xr;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    yr[i] = FromFloat<T>(ToFloat(source[i]) * scale * ToFloat(w[i]));
  }
}

// The same with 16-byte loads, each thread's (at most kMaxVectors) vectors of the row held in
// registers between the sum and the scaling: one read of x and the residual instead of a
// read, a write and a read back, and four times fewer loads in flight per byte. A short row
// (4,096 elements at decode, one block) is latency-bound, and that is what it cuts.
constexpr int kMaxVectors = 4;

template <typename T>
struct alignas(16) Vector16 {
  static constexpr int kElements = 16 / static_cast<int>(sizeof(T));
  T v[kElements];
};

template <typename T, bool kAddResidual>
__global__ void __launch_bounds__(kThreads)
    RmsNormVectorKernel(const T* __restrict__ x, T* __restrict__ residual,
                        const T* __restrict__ w, T* __restrict__ y, int64_t d, float eps) {
  using V = Vector16<T>;
  constexpr int E = V::kElements;
  const int64_t vectors = d / E;
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * d;
  const V* xr = reinterpret_cast<const V*>(x + offset);
  V* rr = kAddResidual ? reinterpret_cast<V*>(residual + offset) : nullptr;
  V* yr = reinterpret_cast<V*>(y + offset);
  // The norm's weights, loaded while the preceding kernel finishes (an overlapped launch:
  // weights are what a kernel may read before the wait, kernels/cuda_overlap.cuh).
  const V* wr = reinterpret_cast<const V*>(w);
  V weights[kMaxVectors];
#pragma unroll
  for (int j = 0; j < kMaxVectors; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i >= vectors) break;
    weights[j] = wr[i];
  }
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  float held[kMaxVectors][E];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVectors; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i >= vectors) break;
    const V xv = xr[i];
    V stored;
    if constexpr (kAddResidual) {
      const V rv = rr[i];
#pragma unroll
      for (int e = 0; e < E; ++e) stored.v[e] = FromFloat<T>(ToFloat(xv.v[e]) + ToFloat(rv.v[e]));
      rr[i] = stored;
    } else {
      stored = xv;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      held[j][e] = ToFloat(stored.v[e]);
      sum += held[j][e] * held[j][e];
    }
  }
  const float scale = rsqrtf(BlockSum(sum) / static_cast<float>(d) + eps);
#pragma unroll
  for (int j = 0; j < kMaxVectors; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i >= vectors) break;
    const V& wv = weights[j];
    V out;
#pragma unroll
    for (int e = 0; e < E; ++e) out.v[e] = FromFloat<T>(held[j][e] * scale * ToFloat(wv.v[e]));
    yr[i] = out;
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A warp per head: head_dim (128 in Qwen3) is a few elements a lane, and a block of
// kThreads covers kThreads / 32 heads. In place, so no __restrict__ on x.
constexpr int kHeadsPerBlock = kThreads / 32;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    HeadRmsNormKernel(T* x, int64_t row_stride, const T* __restrict__ w, int64_t units, int heads,
                      int head_dim, float eps) {
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kHeadsPerBlock + threadIdx.x / 32;
  if (unit >= units) return;  // whole warps only: no block barrier below
  const int lane = static_cast<int>(threadIdx.x % 32);
  T* head = x + (unit / heads) * row_stride + (unit % heads) * static_cast<int64_t>(head_dim);
  float sum = 0.0f;
  for (int i = lane; i < head_dim; i += 32) {
    const float v = ToFloat(head[i]);
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float scale = rsqrtf(sum / static_cast<float>(head_dim) + eps);
  for (int i = lane; i < head_dim; i += 32) {
    head[i] = FromFloat<T>(ToFloat(head[i]) * scale * ToFloat(w[i]));
  }
}

template <typename T>
__global__ void SwiGluKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                             int64_t inner) {
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int64_t total = rows * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inner;
    const int64_t c = i - r * inner;
    const float g = ToFloat(gate_up[r * 2 * inner + c]);
    const float u = ToFloat(gate_up[r * 2 * inner + inner + c]);
    out[i] = FromFloat<T>(SwiGluOf(g, u));
  }
}

template <typename T>
__device__ inline void Rotate(const T* __restrict__ in, T* __restrict__ out, int i, int half,
                              float c, float s) {
  const float x1 = ToFloat(in[i]);
  const float x2 = ToFloat(in[i + half]);
  out[i] = FromFloat<T>(RotatedFirst(x1, x2, c, s));
  out[i + half] = FromFloat<T>(RotatedSecond(x1, x2, c, s));
}

// One block per token; its threads cover (head, i < half) pairs.
template <typename T>
__global__ void RotaryKernel(const T* __restrict__ x, int64_t row_stride, int64_t head_stride,
                             T* __restrict__ out, const float* __restrict__ cos,
                             const float* __restrict__ sin, int heads, int head_dim) {
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int64_t t = blockIdx.x;
  const int half = head_dim / 2;
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int h = j / half;
    const int i = j - h * half;
    Rotate(x + t * row_stride + h * head_stride, out + (t * heads + h) * head_dim, i, half,
           cos[t * half + i], sin[t * half + i]);
  }
}

// Blocks (token, part): a token's items are its query pairs, then its key pairs (into the
// cache slot), then its value elements (copied into the cache slot), and its gridDim.y
// blocks take every gridDim.y-th stretch of blockDim.x of them. A decode step's few tokens
// then spread over more than a few SMs: one block a token looped 14 times at batch 1
// (Llama-3's 3,584 items a token), each pass a round of dependent loads.
template <typename T>
__global__ void RotaryQkvToCacheKernel(const T* __restrict__ qkv, int64_t row_stride,
                                       T* __restrict__ q_out, T* __restrict__ key_slots,
                                       T* __restrict__ value_slots,
                                       const int64_t* __restrict__ slots,
                                       const float* __restrict__ cos,
                                       const float* __restrict__ sin, int heads, int kv_heads,
                                       int head_dim) {
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int64_t t = blockIdx.x;
  const int half = head_dim / 2;
  const T* row = qkv + t * row_stride;
  const int64_t slot = slots[t];
  const int q_pairs = heads * half;
  // A padding row (slot < 0) of a captured graph's bucket rotates its query only.
  const int k_pairs = slot < 0 ? 0 : kv_heads * half;
  const int v_elements = slot < 0 ? 0 : kv_heads * head_dim;
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < q_pairs + k_pairs + v_elements;
       j += gridDim.y * blockDim.x) {
    if (j < q_pairs) {
      const int h = j / half;
      const int i = j - h * half;
      Rotate(row + h * head_dim, q_out + (t * heads + h) * head_dim, i, half, cos[t * half + i],
             sin[t * half + i]);
    } else if (j < q_pairs + k_pairs) {
      const int h = (j - q_pairs) / half;
      const int i = (j - q_pairs) - h * half;
      Rotate(row + (heads + h) * head_dim, key_slots + (slot * kv_heads + h) * head_dim, i,
             half, cos[t * half + i], sin[t * half + i]);
    } else {
      const int e = j - q_pairs - k_pairs;
      value_slots[slot * v_elements + e] = row[(heads + kv_heads) * head_dim + e];
    }
  }
}

// Calls fn(T{}) with the storage type of `dtype`.
template <typename Fn>
void WithType(CudaDtype dtype, Fn&& fn) {
  switch (dtype) {
    case CudaDtype::kFloat32:
      fn(float{});
      break;
    case CudaDtype::kFloat16:
      fn(__half{});
      break;
    case CudaDtype::kBFloat16:
      fn(__nv_bfloat16{});
      break;
  }
}

unsigned ElementwiseBlocks(int64_t total) {
  // Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
  return static_cast<unsigned>(std::clamp<int64_t>((total + kThreads - 1) / kThreads, 1, 65535));
}

}  // namespace

LaunchResult LaunchRmsNorm(const RmsNormArgs& a, std::string* error) {
  if (a.rows == 0 || a.d == 0) return LaunchResult::kLaunched;
  if (a.rows > 0x7fffffff) return LaunchResult::kUnsupported;
  const auto stream = static_cast<cudaStream_t>(a.stream);
  WithType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    const auto* x = static_cast<const T*>(a.x);
    const auto* w = static_cast<const T*>(a.weight);
    auto* y = static_cast<T*>(a.y);
    constexpr int E = Vector16<T>::kElements;
    const bool vector = a.d % E == 0 && a.d / E <= static_cast<int64_t>(kThreads) * kMaxVectors &&
                        Aligned16(x) && Aligned16(w) && Aligned16(y) &&
                        (a.residual == nullptr || Aligned16(a.residual));
    const dim3 grid(static_cast<unsigned>(a.rows));
    T* residual = static_cast<T*>(a.residual);
    if (vector && a.residual != nullptr) {
      LaunchKernel(a.overlap, RmsNormVectorKernel<T, true>, grid, kThreads, stream, x, residual,
                   w, y, a.d, a.eps);
    } else if (vector) {
      LaunchKernel(a.overlap, RmsNormVectorKernel<T, false>, grid, kThreads, stream, x, residual,
                   w, y, a.d, a.eps);
    } else if (a.residual != nullptr) {
      LaunchKernel(a.overlap, RmsNormKernel<T, true>, grid, kThreads, stream, x, residual, w, y,
                   a.d, a.eps);
    } else {
      LaunchKernel(a.overlap, RmsNormKernel<T, false>, grid, kThreads, stream, x, residual, w, y,
                   a.d, a.eps);
    }
  });
  return LaunchStatus(error);
}

LaunchResult LaunchHeadRmsNorm(const HeadRmsNormArgs& a, std::string* error) {
  const int64_t units = a.tokens * a.heads;
  if (units == 0 || a.head_dim == 0) return LaunchResult::kLaunched;
  const int64_t blocks = (units + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (blocks > 0x7fffffff) return LaunchResult::kUnsupported;
  WithType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    LaunchKernel(a.overlap, HeadRmsNormKernel<T>, static_cast<unsigned>(blocks), kThreads,
                 static_cast<cudaStream_t>(a.stream), static_cast<T*>(a.x), a.row_stride,
                 static_cast<const T*>(a.weight), units, a.heads, a.head_dim, a.eps);
  });
  return LaunchStatus(error);
}

LaunchResult LaunchSwiGlu(const SwiGluArgs& a, std::string* error) {
  const int64_t total = a.rows * a.inner;
  if (total == 0) return LaunchResult::kLaunched;
  WithType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    LaunchKernel(a.overlap, SwiGluKernel<T>, ElementwiseBlocks(total), kThreads,
                 static_cast<cudaStream_t>(a.stream), static_cast<const T*>(a.gate_up),
                 static_cast<T*>(a.out), a.rows, a.inner);
  });
  return LaunchStatus(error);
}

LaunchResult LaunchRotary(const RotaryArgs& a, std::string* error) {
  if (a.tokens == 0 || a.heads == 0) return LaunchResult::kLaunched;
  if (a.head_dim % 2 != 0 || a.tokens > 0x7fffffff) return LaunchResult::kUnsupported;
  WithType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    LaunchKernel(a.overlap, RotaryKernel<T>, static_cast<unsigned>(a.tokens), kThreads,
                 static_cast<cudaStream_t>(a.stream), static_cast<const T*>(a.x), a.row_stride,
                 a.head_stride, static_cast<T*>(a.out), a.cos, a.sin, a.heads, a.head_dim);
  });
  return LaunchStatus(error);
}

LaunchResult LaunchRotaryQkvToCache(const RotaryQkvToCacheArgs& a, std::string* error) {
  if (a.tokens == 0) return LaunchResult::kLaunched;
  if (a.head_dim % 2 != 0 || a.kv_heads <= 0 || a.tokens > 0x7fffffff) {
    return LaunchResult::kUnsupported;
  }
  WithType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    const int64_t items =
        static_cast<int64_t>(a.heads + a.kv_heads) * (a.head_dim / 2) +
        static_cast<int64_t>(a.kv_heads) * a.head_dim;
    const dim3 grid(static_cast<unsigned>(a.tokens),
                    static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads,
                                                              1, 65535)));
    LaunchKernel(a.overlap, RotaryQkvToCacheKernel<T>, grid, kThreads,
                 static_cast<cudaStream_t>(a.stream), static_cast<const T*>(a.qkv), a.row_stride,
                 static_cast<T*>(a.q_out), static_cast<T*>(a.key_slots),
                 static_cast<T*>(a.value_slots), a.slots, a.cos, a.sin, a.heads, a.kv_heads,
                 a.head_dim);
  });
  return LaunchStatus(error);
}

}  // namespace tophat::kernels
