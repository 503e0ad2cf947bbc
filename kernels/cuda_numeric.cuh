// Device-side conversions between the storage dtypes and the float32 the kernels compute
// in. For .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tophat::kernels {

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__half v) { return __half2float(v); }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ inline T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) { return v; }
template <>
__device__ inline __half FromFloat<__half>(float v) { return __float2half(v); }
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// SwiGLU of one gate and up value, silu(gate) * up: one expression for every kernel that
// computes it (the SwiGLU kernel, the small-batch GEMM's fused form), so that they agree to
// the bit.
__device__ inline float SwiGluOf(float gate, float up) {
  return gate / (1.0f + __expf(-gate)) * up;
}

}  // namespace tophat::kernels
