// The small-batch GEMM (kernels/small_batch_gemm_cuda.cuh says what and why).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda_launch_status.cuh"
#include "kernels/cuda_numeric.cuh"
#include "kernels/cuda_overlap.cuh"
#include "kernels/small_batch_gemm_cuda.cuh"

namespace tophat::kernels {
namespace {

constexpr int kWarps = 8;  // weight rows per block
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;  // 16-byte loads in flight per lane
constexpr int kVector = 8;  // elements per 16 bytes

// 16 bytes of weights, read once: not kept in L1, which holds the activation rows.
__device__ inline uint4 LoadStreaming(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

template <typename T>
__device__ inline float2 Pair(uint32_t bits);
template <>
__device__ inline float2 Pair<__nv_bfloat16>(uint32_t bits) {
  __nv_bfloat162 v;
  memcpy(&v, &bits, sizeof(v));
  return __bfloat1622float2(v);
}
template <>
__device__ inline float2 Pair<__half>(uint32_t bits) {
  __half2 v;
  memcpy(&v, &bits, sizeof(v));
  return __half22float2(v);
}

template <typename T>
__device__ inline float Dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = Pair<T>(ws[i]);
    const float2 b = Pair<T>(xs[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// One warp per output column: each lane takes every 32nd 16-byte vector of the weight row,
// for all M activation rows at once, so each weight is read once whatever M. kRows weight
// rows a column: 1, or 2 for the SwiGLU form (gate row j and up row n + j, streamed
// together, twice the loads in flight).
template <typename T, int M, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads)
    SmallBatchGemmKernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ w,
                         const T* __restrict__ bias, T* __restrict__ out, int64_t ldo,
                         int64_t n, int64_t k) {
  constexpr int kRows = kSwiGlu ? 2 : 1;
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t vectors = k / kVector;
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    wr[r] = reinterpret_cast<const uint4*>(w + (row + r * n) * k);
  }
  // While the preceding kernel finishes (an overlapped launch), the first pass's weights on
  // their way to L2: 128-byte lines, a lane each, kUnroll x 32 vectors a row.
  constexpr int kVectorsPerLine = 128 / 16;
  const int64_t first_pass = vectors < kUnroll * 32 ? vectors : kUnroll * 32;
  if (row < n && lane * kVectorsPerLine < first_pass) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) PrefetchToL2(wr[r] + lane * kVectorsPerLine);
  }
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  if (row >= n) return;  // the whole warp: row is the same for its lanes
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }
  for (int64_t base = lane; base < vectors; base += 32 * kUnroll) {
    uint4 wv[kRows][kUnroll];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * 32;
        wv[r][u] = i < vectors ? LoadStreaming(wr[r] + i) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * 32;
      if (i < vectors) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + i);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[r][m] = Dot8<T>(wv[r][u], xv, acc[r][m]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
      }
    }
  }
  if (lane == 0) {
    if constexpr (kSwiGlu) {
      // Gate and up rounded as the plain form writes them (its `acc + 0.0f` included), then
      // the SwiGLU kernel's expression.
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float gate = ToFloat(FromFloat<T>(acc[0][m] + 0.0f));
        const float up = ToFloat(FromFloat<T>(acc[1][m] + 0.0f));
        out[m * ldo + row] = FromFloat<T>(SwiGluOf(gate, up));
      }
    } else {
      const float b = bias != nullptr ? ToFloat(bias[row]) : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) out[m * ldo + row] = FromFloat<T>(acc[0][m] + b);
    }
  }
}

template <typename T, int M>
void Launch(const SmallBatchGemmArgs& a, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((a.n + kWarps - 1) / kWarps);
  auto* kernel = a.swiglu ? SmallBatchGemmKernel<T, M, true> : SmallBatchGemmKernel<T, M, false>;
  LaunchKernel(a.overlap, kernel, blocks, kThreads, stream, static_cast<const T*>(a.x), a.ldx,
               static_cast<const T*>(a.weight), static_cast<const T*>(a.bias),
               static_cast<T*>(a.out), a.ldo, a.n, a.k);
}

template <typename T>
void LaunchRows(const SmallBatchGemmArgs& a, cudaStream_t stream) {
  switch (a.rows) {
    case 1: return Launch<T, 1>(a, stream);
    case 2: return Launch<T, 2>(a, stream);
    case 3: return Launch<T, 3>(a, stream);
    case 4: return Launch<T, 4>(a, stream);
    case 5: return Launch<T, 5>(a, stream);
    case 6: return Launch<T, 6>(a, stream);
    case 7: return Launch<T, 7>(a, stream);
    default: return Launch<T, 8>(a, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

LaunchResult LaunchSmallBatchGemm(const SmallBatchGemmArgs& a, std::string* error) {
  static_assert(kSmallBatchGemmMaxRows == 8, "LaunchRows instantiates rows 1..8");
  if (a.dtype == CudaDtype::kFloat32 || a.rows < 1 || a.rows > kSmallBatchGemmMaxRows ||
      a.n < 1 || a.k < kVector || a.k % kVector != 0 || a.ldx % kVector != 0 ||
      a.ldx < a.k || a.ldo < a.n || !Aligned16(a.x) || !Aligned16(a.weight) ||
      (a.swiglu && a.bias != nullptr) ||
      (a.n + kWarps - 1) / kWarps > 0x7fffffff) {
    return LaunchResult::kUnsupported;
  }
  const auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.dtype == CudaDtype::kBFloat16) {
    LaunchRows<__nv_bfloat16>(a, stream);
  } else {
    LaunchRows<__half>(a, stream);
  }
  return LaunchStatus(error);
}

}  // namespace tophat::kernels
