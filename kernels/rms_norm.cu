#include <cuda_runtime.h>

#include "kernels/rms_norm_cuda.cuh"

namespace tophat::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormF32Kernel(const float* __restrict__ x, const float* __restrict__ w,
                                 float* __restrict__ y, int64_t d, float eps) {
  const float* xr = x + blockIdx.x * d;
  float* yr = y + blockIdx.x * d;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i] * xr[i];
  // Warp reduction, then one value per warp through shared memory.
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (threadIdx.x == 0) warp_sums[0] = rsqrtf(sum / static_cast<float>(d) + eps);
  }
  __syncthreads();
  const float scale = warp_sums[0];
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

}  // namespace

void LaunchRmsNormF32(const float* x, const float* w, float* y, int64_t rows, int64_t d,
                      float eps, void* stream) {
  if (rows == 0) return;
  RmsNormF32Kernel<<<static_cast<unsigned>(rows), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(x, w, y, d, eps);
}

}  // namespace tophat::kernels
