// Paged decode attention, split along the sequence (flash-decoding): thread block (sequence,
// KV head, split) takes one stretch of the sequence's positions, in tiles that its threads
// copy from the paged pool into shared memory with 16-byte loads (the next tile's loads in
// flight while the current one is computed). With one split the block writes the output;
// with several, each writes its unnormalized partial, and the partials are merged either by
// the last of the sequence's blocks to finish (counted in a workspace of split counters) or,
// without that workspace, by a second kernel.
// Splits are what lets one sequence of 8 KV heads use more than 8 of a GPU's SMs: the count
// depends only on the batch (seqs x KV heads against the SM count), never on lengths, so a
// captured CUDA graph stays valid as sequences grow; a split past a short sequence's end
// returns at once, and the merge reads only the splits with positions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "kernels/cuda_device_attribute.cuh"
#include "kernels/cuda_launch_status.cuh"
#include "kernels/cuda_numeric.cuh"
#include "kernels/cuda_overlap.cuh"
#include "kernels/paged_attention_cuda.cuh"

namespace tophat::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxSplits = 64;
constexpr int kBlocksPerSm = 4;  // the kernel's __launch_bounds__

// The tile of one block: kPositions positions of one KV head's keys and values in shared
// memory. A position's dot products are computed by kThreadsPerPosition adjacent threads,
// each taking every kThreadsPerPosition-th 16-byte chunk of the row; rows are padded by
// 16 bytes per such thread so that a quarter warp's 8 loads fall in distinct banks.
template <typename T, int kHeadDim>
struct TileShape {
  static constexpr int kRowBytes = kHeadDim * static_cast<int>(sizeof(T));
  static constexpr int kPositions = 16384 / kRowBytes < 64 ? 16384 / kRowBytes : 64;
  static constexpr int kThreadsPerPosition = kThreads / kPositions;
  static constexpr int kStrideBytes = kRowBytes + 16 * kThreadsPerPosition;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kChunksPerThreadRow = kChunksPerRow / kThreadsPerPosition;
  static constexpr int kChunks = kPositions * kChunksPerRow;
  static constexpr int kChunksPerThread = kChunks / kThreads;
  static constexpr int kLaneElements = kHeadDim / 32;  // values each lane accumulates
  static constexpr int kTileBytes = kPositions * kStrideBytes;
  static_assert(kChunks % kThreads == 0, "the tile's 16-byte chunks split evenly");
  static_assert(kRowBytes % 16 == 0, "rows are whole 16-byte chunks");
  static_assert(kChunksPerRow % kThreadsPerPosition == 0, "a row's chunks split evenly");
  static_assert(kThreadsPerPosition <= 32 && 32 % kThreadsPerPosition == 0,
                "a position's threads are adjacent lanes of one warp");
};

__device__ inline float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The positions [begin, end) that split `split` of `splits` takes of a sequence of `len`
// (the last `window` of them when window > 0): whole tiles of `tile` positions a split, so
// that only a sequence's last tile is ever partial. The splits with positions come first.
struct SplitRange {
  int begin;
  int end;
};
__device__ inline int PositionsPerSplit(int visible, int splits, int tile) {
  return ((visible + splits - 1) / splits + tile - 1) / tile * tile;
}
__device__ inline SplitRange SplitPositions(int len, int window, int splits, int split,
                                            int tile) {
  const int start = window > 0 && len > window ? len - window : 0;
  const int per_split = PositionsPerSplit(len - start, splits, tile);
  const int begin = start + split * per_split;
  return {begin, min(len, begin + per_split)};
}
// How many of a sequence's splits have positions (a prefix of them).
__device__ inline int UsedSplits(int len, int window, int splits, int tile) {
  const int start = window > 0 && len > window ? len - window : 0;
  const int visible = len - start;
  if (visible <= 0) return 0;
  const int per_split = PositionsPerSplit(visible, splits, tile);
  return min(splits, (visible + per_split - 1) / per_split);
}

// 16 bytes of T as floats.
template <typename T>
struct Chunk {
  static constexpr int kElements = 16 / static_cast<int>(sizeof(T));
};

// A lane's kE consecutive values of a row, as one aligned load (rows start on 16 bytes).
template <typename T, int kE>
struct alignas(sizeof(T) * kE) LanePack {
  T v[kE];
};

template <typename T>
__device__ inline void ChunkToFloat(const uint4& raw, float (&out)[Chunk<T>::kElements]) {
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < Chunk<T>::kElements; ++e) out[e] = ToFloat(v[e]);
}

// The merge of one query head's splits, by every thread of the block (all must call it): the
// first `used` splits' partials (the others wrote nothing) rescaled to their common maximum
// and normalized by the summed weights. The splits' scales are computed once by the first
// warp into `factor` (shared, kMaxSplits) and `total` (shared). Partials are read through L2
// (ld.global.cg): in the fused form other blocks of this grid wrote them, and L1 is not
// coherent with their writes. The same code in both forms, so they agree to the bit.
template <typename T>
__device__ inline void MergeHeadSplits(const float* partial_values, const float* partial_stats,
                                       int64_t head_row, int splits, int used, int head_dim, T* out,
                                       float* factor, float* total) {
  const float* stats = partial_stats + 2 * head_row * splits;
  if (threadIdx.x < 32) {
    float max_score = -INFINITY;
    for (int s = threadIdx.x; s < used; s += 32) {
      max_score = fmaxf(max_score, __ldcg(stats + 2 * s));
    }
    max_score = WarpMax(max_score);
    float sum = 0.0f;
    for (int s = threadIdx.x; s < used; s += 32) {
      const float f = max_score > -INFINITY ? __expf(__ldcg(stats + 2 * s) - max_score) : 0.0f;
      factor[s] = f;
      sum += __ldcg(stats + 2 * s + 1) * f;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) *total = sum;
  }
  __syncthreads();
  const float inverse = *total > 0.0f ? 1.0f / *total : 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float value = 0.0f;
    const float* values = partial_values + head_row * splits * head_dim + d;
#pragma unroll 4
    for (int s = 0; s < used; ++s) {
      value += __ldcg(values + static_cast<int64_t>(s) * head_dim) * factor[s];
    }
    out[head_row * head_dim + d] = FromFloat<T>(value * inverse);
  }
}

// Per tile: the threads copy it in (the next tile's loads then go in flight); the adjacent
// threads of each position compute its dot product with every query head of the group,
// reading and converting the key row once for all of them; every warp takes the tile's
// maximum of each head (all warps alike, so their running maxima stay equal) and then
// accumulates a quarter of the positions for every head, reading and converting each value
// row once. The warps' partial sums are added at the end. With `split_counters` (zeros, one
// per (sequence, KV head); each launch leaves them zeros) each block with positions counts
// itself in once its partials are visible device-wide, and the one that completes the count
// merges the sequence's splits for the group's query heads: no second kernel, whose launch
// and ramp cost more than the merge at small batches.
template <typename T, int kHeadDim, int kMaxGroup>
// Four resident blocks an SM (at most 128 registers a thread): more loads in flight.
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    PagedDecodeAttentionKernel(const T* __restrict__ q, const T* __restrict__ key_blocks,
                               const T* __restrict__ value_blocks,
                               const int32_t* __restrict__ block_tables,
                               const int32_t* __restrict__ seq_lens, T* __restrict__ out,
                               float* __restrict__ partial_values,
                               float* __restrict__ partial_stats, int* __restrict__ split_counters,
                               int num_heads, int num_kv_heads, int block_size,
                               int max_blocks_per_seq, int window, float scale) {
  using Shape = TileShape<T, kHeadDim>;
  constexpr int P = Shape::kPositions;
  constexpr int R = Shape::kThreadsPerPosition;
  constexpr int kE = Shape::kLaneElements;
  constexpr int kChunkElements = Chunk<T>::kElements;
  constexpr int kPositionsPerWarp = P / kWarps;
  static_assert(kWarps * kMaxGroup * kHeadDim * 4 <= Shape::kTileBytes,
                "the warps' partial sums fit in the key tile");

  __shared__ __align__(16) unsigned char key_tile[Shape::kTileBytes];
  __shared__ __align__(16) unsigned char value_tile[Shape::kTileBytes];
  __shared__ __align__(16) float q_tile[kMaxGroup][kHeadDim];  // scaled queries
  __shared__ float scores[kMaxGroup][P];
  __shared__ float weights[kMaxGroup][P];
  __shared__ float warp_sums[kWarps][kMaxGroup];
  __shared__ float head_max[kMaxGroup];
  __shared__ float merge_factor[kMaxSplits];
  __shared__ float merge_total;
  __shared__ bool merges_splits;

  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = num_heads / num_kv_heads;

  const int len = seq_lens[seq];
  const SplitRange range = SplitPositions(len, window, splits, split, P);
  const int begin = range.begin;
  const int end = range.end;
  // A split past a short sequence's end: the merge reads only the splits with positions
  // (UsedSplits), so there is nothing to write. Split 0 of a sequence without positions (a
  // padding row) carries on with an empty range: it writes the zero output (fused merge) or
  // a partial nobody reads.
  if (splits > 1 && begin >= end && split > 0) return;

  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const int64_t position_stride = static_cast<int64_t>(num_kv_heads) * kHeadDim;

  for (int i = threadIdx.x; i < group * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    q_tile[g][d] =
        ToFloat(q[(static_cast<int64_t>(seq) * num_heads + kv_head * group + g) * kHeadDim + d]) *
        scale;
  }

  uint4 key_regs[Shape::kChunksPerThread];
  uint4 value_regs[Shape::kChunksPerThread];
  auto load_tile = [&](int tile_begin) {
#pragma unroll
    for (int j = 0; j < Shape::kChunksPerThread; ++j) {
      const int chunk = threadIdx.x + j * kThreads;
      const int p = chunk / Shape::kChunksPerRow;
      const int c = chunk % Shape::kChunksPerRow;
      const int position = tile_begin + p;
      if (position < end) {
        const int64_t row =
            static_cast<int64_t>(table[position / block_size]) * block_size + position % block_size;
        const int64_t offset = row * position_stride + static_cast<int64_t>(kv_head) * kHeadDim +
                               c * kChunkElements;
        key_regs[j] = *reinterpret_cast<const uint4*>(key_blocks + offset);
        value_regs[j] = *reinterpret_cast<const uint4*>(value_blocks + offset);
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int j = 0; j < Shape::kChunksPerThread; ++j) {
      const int chunk = threadIdx.x + j * kThreads;
      const int p = chunk / Shape::kChunksPerRow;
      const int c = chunk % Shape::kChunksPerRow;
      // Rows past the end hold whatever the registers held: never read (their scores are
      // masked, the weighted sum skips them).
      *reinterpret_cast<uint4*>(key_tile + p * Shape::kStrideBytes + c * 16) = key_regs[j];
      *reinterpret_cast<uint4*>(value_tile + p * Shape::kStrideBytes + c * 16) = value_regs[j];
    }
  };

  float running_max[kMaxGroup];
  float running_sum[kMaxGroup];  // this warp's positions only
  float acc[kMaxGroup][kE];      // the same
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    running_max[g] = -FLT_MAX;
    running_sum[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[g][e] = 0.0f;
  }

  const int score_position = threadIdx.x / R;
  const int score_part = threadIdx.x % R;
  if (begin < end) load_tile(begin);
  for (int tile_begin = begin; tile_begin < end; tile_begin += P) {
    store_tile();
    __syncthreads();  // the tile (and, the first time, q_tile) is in shared memory
    const int valid = min(P, end - tile_begin);
    if (tile_begin + P < end) load_tile(tile_begin + P);  // in flight during the compute

    {
      float dot[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) dot[g] = 0.0f;
      const unsigned char* key_row = key_tile + score_position * Shape::kStrideBytes;
#pragma unroll
      for (int j = 0; j < Shape::kChunksPerThreadRow; ++j) {
        const int c = j * R + score_part;
        float k[kChunkElements];
        ChunkToFloat<T>(*reinterpret_cast<const uint4*>(key_row + c * 16), k);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= group) break;
          const float4* qg = reinterpret_cast<const float4*>(&q_tile[g][c * kChunkElements]);
#pragma unroll
          for (int e4 = 0; e4 < kChunkElements / 4; ++e4) {
            const float4 qv = qg[e4];
            dot[g] += qv.x * k[4 * e4] + qv.y * k[4 * e4 + 1] + qv.z * k[4 * e4 + 2] +
                      qv.w * k[4 * e4 + 3];
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
        for (int offset = R / 2; offset > 0; offset /= 2) {
          dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
        }
      }
      if (score_part == 0) {
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= group) break;
          scores[g][score_position] = score_position < valid ? dot[g] : -INFINITY;
        }
      }
    }
    __syncthreads();

    const int first = warp * kPositionsPerWarp;
    const int last = min(valid, first + kPositionsPerWarp);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= group) break;
      float tile_max = -INFINITY;
      for (int p = lane; p < valid; p += 32) tile_max = fmaxf(tile_max, scores[g][p]);
      const float new_max = fmaxf(running_max[g], WarpMax(tile_max));
      const float correction = __expf(running_max[g] - new_max);
      running_max[g] = new_max;
      running_sum[g] *= correction;
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[g][e] *= correction;
      for (int p = first + lane; p < last; p += 32) weights[g][p] = __expf(scores[g][p] - new_max);
    }
    __syncwarp();
    for (int p = first; p < last; ++p) {
      const LanePack<T, kE> packed = *reinterpret_cast<const LanePack<T, kE>*>(
          value_tile + p * Shape::kStrideBytes + lane * kE * static_cast<int>(sizeof(T)));
      float v[kE];
#pragma unroll
      for (int e = 0; e < kE; ++e) v[e] = ToFloat(packed.v[e]);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        const float w = weights[g][p];
        running_sum[g] += w;
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[g][e] += w * v[e];
      }
    }
    __syncthreads();  // before the next tile overwrites the tiles, scores and weights
  }

  // The warps' partial sums, added through shared memory (the key tile is free now).
  float* warp_acc = reinterpret_cast<float*>(key_tile);  // [kWarps][group][kHeadDim]
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    if (lane == 0) warp_sums[warp][g] = running_sum[g];
    if (warp == 0 && lane == 0) head_max[g] = running_max[g];  // every warp's is the same
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      warp_acc[(warp * group + g) * kHeadDim + lane * kE + e] = acc[g][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    float sum = 0.0f;
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sum += warp_sums[w][g];
      value += warp_acc[(w * group + g) * kHeadDim + d];
    }
    const int64_t head_row = static_cast<int64_t>(seq) * num_heads + kv_head * group + g;
    if (splits == 1) {
      out[head_row * kHeadDim + d] = FromFloat<T>(sum > 0.0f ? value / sum : 0.0f);
    } else {
      const int64_t partial = head_row * splits + split;
      partial_values[partial * kHeadDim + d] = value;
      if (d == 0) {
        // An empty split (past a short sequence's end) weighs nothing in the merge.
        partial_stats[2 * partial] = sum > 0.0f ? head_max[g] : -INFINITY;
        partial_stats[2 * partial + 1] = sum;
      }
    }
  }
  if (splits == 1 || split_counters == nullptr) return;

  // The fused merge. Release: every thread's partials are made visible device-wide before
  // the block counts itself in; acquire: the block that completes the count fences before
  // it reads the others' partials. That block also resets the counter, for the next launch
  // (which, on the same stream, starts reading it only after this grid has completed).
  const int used = UsedSplits(len, window, splits, P);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = split_counters + static_cast<int64_t>(seq) * num_kv_heads + kv_head;
    const bool last = atomicAdd(counter, 1) == max(used, 1) - 1;
    if (last) {
      atomicExch(counter, 0);
      __threadfence();
    }
    merges_splits = last;
  }
  __syncthreads();
  if (!merges_splits) return;
  for (int g = 0; g < group; ++g) {
    MergeHeadSplits<T>(partial_values, partial_stats,
                       static_cast<int64_t>(seq) * num_heads + kv_head * group + g, splits, used,
                       kHeadDim, out, merge_factor, &merge_total);
    __syncthreads();  // before the next head's scales overwrite these
  }
}

// The merge as its own kernel, for a launch without split counters: one block per
// (sequence, query head), one thread per dimension.
template <typename T>
__global__ void MergeSplitsKernel(const float* __restrict__ partial_values,
                                  const float* __restrict__ partial_stats,
                                  const int32_t* __restrict__ seq_lens, T* __restrict__ out,
                                  int num_heads, int head_dim, int splits, int window,
                                  int tile_positions) {
  __shared__ float factor[kMaxSplits];  // exp(max_s - max), 0 for an empty split
  __shared__ float total;
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  const int64_t head_row = static_cast<int64_t>(blockIdx.x) * num_heads + blockIdx.y;
  const int used = UsedSplits(seq_lens[blockIdx.x], window, splits, tile_positions);
  MergeHeadSplits<T>(partial_values, partial_stats, head_row, splits, used, head_dim, out, factor,
                     &total);
}

// SMs of the current device (an H100's 132 where the runtime does not say).
int MultiprocessorCount() {
  return CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>().value_or(132);
}

template <typename T, int kHeadDim, int kMaxGroup>
void Launch(const PagedDecodeAttentionArgs& a, int splits) {
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(splits));
  const auto stream = static_cast<cudaStream_t>(a.stream);
  float* partial_values = a.partials;
  float* partial_stats =
      a.partials == nullptr
          ? nullptr
          : a.partials + static_cast<int64_t>(a.num_seqs) * a.num_heads * splits * kHeadDim;
  // The fused merge needs a counter for each (sequence, KV head) of the batch.
  int* split_counters =
      splits > 1 && static_cast<int64_t>(a.num_seqs) * a.num_kv_heads <= a.split_counter_count
          ? a.split_counters
          : nullptr;
  LaunchKernel(a.overlap, PagedDecodeAttentionKernel<T, kHeadDim, kMaxGroup>, grid, kThreads,
               stream, static_cast<const T*>(a.q), static_cast<const T*>(a.key_blocks),
               static_cast<const T*>(a.value_blocks), a.block_tables, a.seq_lens,
               static_cast<T*>(a.out), partial_values, partial_stats, split_counters, a.num_heads,
               a.num_kv_heads, a.block_size, a.max_blocks_per_seq, a.window, a.scale);
  if (splits > 1 && split_counters == nullptr) {
    const dim3 merge_grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.num_heads));
    LaunchKernel(a.overlap, MergeSplitsKernel<T>, merge_grid, kHeadDim, stream,
                 static_cast<const float*>(partial_values),
                 static_cast<const float*>(partial_stats), a.seq_lens, static_cast<T*>(a.out),
                 a.num_heads, kHeadDim, splits, a.window, TileShape<T, kHeadDim>::kPositions);
  }
}

// Instantiated for groups of up to 4 query heads per KV head (Llama-3, Mistral, Qwen: fewer
// registers a thread, more resident blocks) and up to 8.
template <typename T, int kHeadDim>
void LaunchForGroup(const PagedDecodeAttentionArgs& a, int splits, int group) {
  if (group <= 4) {
    Launch<T, kHeadDim, 4>(a, splits);
  } else {
    Launch<T, kHeadDim, 8>(a, splits);
  }
}

template <typename T>
bool LaunchForType(const PagedDecodeAttentionArgs& a, int splits) {
  const int group = a.num_heads / a.num_kv_heads;
  switch (a.head_dim) {
    case 32:
      if (group > 8) return false;
      LaunchForGroup<T, 32>(a, splits, group);
      return true;
    case 64:
      if (group > 8) return false;
      LaunchForGroup<T, 64>(a, splits, group);
      return true;
    case 128:
      if (group > 8) return false;
      LaunchForGroup<T, 128>(a, splits, group);
      return true;
    case 256:
      if (group > 4) return false;
      Launch<T, 256, 4>(a, splits);
      return true;
    default:
      return false;
  }
}

}  // namespace

int PagedDecodeSplits(const PagedDecodeAttentionArgs& args) {
  if (args.partials == nullptr || args.num_seqs <= 0 || args.num_kv_heads <= 0) return 1;
  const int64_t blocks = static_cast<int64_t>(args.num_seqs) * args.num_kv_heads;
  // The four blocks an SM holds at once (128 registers a thread, ~41 KB of shared memory a
  // block): a batch that fills them needs no split.
  const int64_t target = kBlocksPerSm * static_cast<int64_t>(MultiprocessorCount());
  int64_t splits = std::min<int64_t>(kMaxSplits, (target + blocks - 1) / blocks);
  const int64_t per_split_floats =
      static_cast<int64_t>(args.num_seqs) * args.num_heads * (args.head_dim + 2);
  if (per_split_floats > 0) splits = std::min(splits, args.partial_floats / per_split_floats);
  return static_cast<int>(std::max<int64_t>(1, splits));
}

int64_t PagedDecodePartialFloats(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  if (num_kv_heads <= 0) return 0;
  // Splits are only taken while seqs x KV heads < target (kBlocksPerSm per SM), and then
  // seqs x KV heads x splits < 2 x target: room for that many blocks' query heads, on up to
  // 256 SMs.
  const int64_t blocks = 2 * kBlocksPerSm * std::max(256, MultiprocessorCount());
  return blocks * (num_heads / num_kv_heads) * (head_dim + 2);
}

int64_t PagedDecodeSplitCounterCount() {
  // Splits are only taken while seqs x KV heads < target (kBlocksPerSm per SM), on up to 256
  // SMs as for the partials.
  return static_cast<int64_t>(kBlocksPerSm) * std::max(256, MultiprocessorCount());
}

LaunchResult LaunchPagedDecodeAttention(const PagedDecodeAttentionArgs& args,
                                        std::string* error) {
  if (args.num_seqs == 0) return LaunchResult::kLaunched;
  if (args.num_kv_heads <= 0 || args.num_heads % args.num_kv_heads != 0 ||
      args.block_size <= 0) {
    return LaunchResult::kUnsupported;
  }
  const int splits = PagedDecodeSplits(args);
  bool launched = false;
  switch (args.dtype) {
    case CudaDtype::kFloat32:
      launched = LaunchForType<float>(args, splits);
      break;
    case CudaDtype::kFloat16:
      launched = LaunchForType<__half>(args, splits);
      break;
    case CudaDtype::kBFloat16:
      launched = LaunchForType<__nv_bfloat16>(args, splits);
      break;
  }
  if (!launched) return LaunchResult::kUnsupported;
  return LaunchStatus(error);
}

}  // namespace tophat::kernels
