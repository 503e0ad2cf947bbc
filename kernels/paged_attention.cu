// Paged decode attention: one thread block per (sequence, KV head), its warps splitting the
// sequence's positions and each keeping an online softmax (running max, sum and weighted
// values) for every query head of the group, merged through shared memory at the end.
// Lane l holds dimensions [l*E, (l+1)*E) of a head, so a position's key and value are read
// as one coalesced row per warp; four positions are loaded before any is used, to keep
// several reads in flight per warp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/cuda_numeric.cuh"
#include "kernels/paged_attention_cuda.cuh"

namespace tophat::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;

// E consecutive elements as one aligned vector load (head_dim is a multiple of 32, so every
// lane's slice is aligned to its size).
template <typename T, int E>
struct alignas(sizeof(T) * E) Pack {
  T v[E];
};

template <typename T, int E>
__device__ inline void LoadRow(const T* p, float (&out)[E]) {
  const Pack<T, E> pack = *reinterpret_cast<const Pack<T, E>*>(p);
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = ToFloat(pack.v[e]);
}

__device__ inline float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T, int E, int kMaxGroup>
__global__ void __launch_bounds__(kThreads)
    PagedDecodeAttentionKernel(const T* __restrict__ q, const T* __restrict__ key_blocks,
                               const T* __restrict__ value_blocks,
                               const int32_t* __restrict__ block_tables,
                               const int32_t* __restrict__ seq_lens, T* __restrict__ out,
                               int num_heads, int num_kv_heads, int block_size,
                               int max_blocks_per_seq, int window, float scale) {
  constexpr int kHeadDim = 32 * E;
  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = num_heads / num_kv_heads;
  const int len = seq_lens[seq];
  const int start = window > 0 && len > window ? len - window : 0;
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const int64_t position_stride = static_cast<int64_t>(num_kv_heads) * kHeadDim;

  float qv[kMaxGroup][E];
  float running_max[kMaxGroup];
  float running_sum[kMaxGroup];
  float acc[kMaxGroup][E];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    running_max[g] = -FLT_MAX;
    running_sum[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
    if (g < group) {
      const int head = kv_head * group + g;
      LoadRow<T, E>(q + (static_cast<int64_t>(seq) * num_heads + head) * kHeadDim + lane * E,
                    qv[g]);
#pragma unroll
      for (int e = 0; e < E; ++e) qv[g][e] *= scale;
    }
  }

  // Warp w takes positions start + w*kUnroll + [0, kUnroll), then strides by the block.
  for (int base = start + warp * kUnroll; base < len; base += kWarps * kUnroll) {
    float k[kUnroll][E];
    float v[kUnroll][E];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = base + u;
      if (p < len) {
        const int64_t row = static_cast<int64_t>(table[p / block_size]) * block_size +
                            p % block_size;
        const int64_t offset = row * position_stride + kv_head * kHeadDim + lane * E;
        LoadRow<T, E>(key_blocks + offset, k[u]);
        LoadRow<T, E>(value_blocks + offset, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u >= len) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s += qv[g][e] * k[u][e];
        s = WarpSum(s);
        const float new_max = fmaxf(running_max[g], s);
        const float correction = __expf(running_max[g] - new_max);
        const float weight = __expf(s - new_max);
        running_sum[g] = running_sum[g] * correction + weight;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * correction + weight * v[u][e];
        running_max[g] = new_max;
      }
    }
  }

  __shared__ float warp_max[kWarps][kMaxGroup];
  __shared__ float warp_sum[kWarps][kMaxGroup];
  __shared__ float warp_acc[kWarps][kMaxGroup][kHeadDim];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    if (lane == 0) {
      warp_max[warp][g] = running_max[g];
      warp_sum[warp][g] = running_sum[g];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) warp_acc[warp][g][lane * E + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    float m = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max[w][g]);
    float sum = 0.0f;
    float value = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = __expf(warp_max[w][g] - m);  // 0 for a warp that saw no position
      sum += warp_sum[w][g] * f;
      value += warp_acc[w][g][d] * f;
    }
    const int head = kv_head * group + g;
    out[(static_cast<int64_t>(seq) * num_heads + head) * kHeadDim + d] =
        FromFloat<T>(sum > 0.0f ? value / sum : 0.0f);
  }
}

template <typename T, int E, int kMaxGroup>
void Launch(const PagedDecodeAttentionArgs& a) {
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.num_kv_heads));
  PagedDecodeAttentionKernel<T, E, kMaxGroup>
      <<<grid, kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(
          static_cast<const T*>(a.q), static_cast<const T*>(a.key_blocks),
          static_cast<const T*>(a.value_blocks), a.block_tables, a.seq_lens,
          static_cast<T*>(a.out), a.num_heads, a.num_kv_heads, a.block_size,
          a.max_blocks_per_seq, a.window, a.scale);
}

template <typename T>
bool LaunchForType(const PagedDecodeAttentionArgs& a) {
  const int group = a.num_heads / a.num_kv_heads;
  switch (a.head_dim) {
    case 32:
      if (group > 8) return false;
      Launch<T, 1, 8>(a);
      return true;
    case 64:
      if (group > 8) return false;
      Launch<T, 2, 8>(a);
      return true;
    case 128:
      if (group > 8) return false;
      Launch<T, 4, 8>(a);
      return true;
    case 256:
      if (group > 4) return false;
      Launch<T, 8, 4>(a);
      return true;
    default:
      return false;
  }
}

}  // namespace

LaunchResult LaunchPagedDecodeAttention(const PagedDecodeAttentionArgs& args,
                                        std::string* error) {
  if (args.num_seqs == 0) return LaunchResult::kLaunched;
  if (args.num_kv_heads <= 0 || args.num_heads % args.num_kv_heads != 0 ||
      args.block_size <= 0) {
    return LaunchResult::kUnsupported;
  }
  bool launched = false;
  switch (args.dtype) {
    case CudaDtype::kFloat32:
      launched = LaunchForType<float>(args);
      break;
    case CudaDtype::kFloat16:
      launched = LaunchForType<__half>(args);
      break;
    case CudaDtype::kBFloat16:
      launched = LaunchForType<__nv_bfloat16>(args);
      break;
  }
  if (!launched) return LaunchResult::kUnsupported;
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    if (error != nullptr) *error = cudaGetErrorString(status);
    return LaunchResult::kCudaError;
  }
  return LaunchResult::kLaunched;
}

}  // namespace tophat::kernels
