// Host launcher for the CUDA paged decode attention; includable from .cc files (no CUDA
// types exposed). The kernel is in paged_attention.cu.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda_launch.h"

namespace tophat::kernels {

struct PagedDecodeAttentionArgs {
  CudaDtype dtype = CudaDtype::kFloat32;
  const void* q = nullptr;             // [num_seqs, num_heads, head_dim], contiguous
  const void* key_blocks = nullptr;    // [num_blocks, block_size, num_kv_heads, head_dim]
  const void* value_blocks = nullptr;  // same
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], device memory
  const int32_t* seq_lens = nullptr;      // [num_seqs]: positions to attend (the new one too)
  void* out = nullptr;                    // [num_seqs, num_heads * head_dim], q's dtype
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int max_blocks_per_seq = 0;
  int window = 0;  // > 0: only the last `window` positions are visible (sliding window)
  float scale = 1.0f;
  void* stream = nullptr;  // cudaStream_t; nullptr is the legacy default stream
  // Device float32 workspace for split sequences' partial results (nullptr: no splits, one
  // thread block per (sequence, KV head)); its size in floats. PagedDecodePartialFloats is
  // enough for every batch; a smaller one only limits the splits.
  float* partials = nullptr;
  int64_t partial_floats = 0;
  // Device int32 counters, zeros, one for each (sequence, KV head) of a split batch
  // (PagedDecodeSplitCounterCount is enough for every batch): the last block of a split
  // sequence to finish merges its partials, and each launch leaves the counters zeros. Without
  // them (nullptr, or fewer than the batch needs) a second kernel merges. A workspace serves
  // one stream: launches on two streams at once must not share it.
  int* split_counters = nullptr;
  int64_t split_counter_count = 0;
  bool overlap = false;  // kernels/cuda_overlap.cuh
};

// How many stretches each sequence is split into (1: no partials, no merge): enough thread
// blocks for four per SM, at most 64, as the workspace allows. Depends on the batch's
// shape and the device only, never on sequence lengths (a captured graph replays it).
int PagedDecodeSplits(const PagedDecodeAttentionArgs& args);
// Workspace floats that let every batch shape on the current device take its full split.
int64_t PagedDecodePartialFloats(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);
// Split counters that let every batch shape on the current device merge in the attention
// kernel itself.
int64_t PagedDecodeSplitCounterCount();

// One query token per sequence against its paged keys and values (grouped-query attention:
// query head h reads KV head h / (num_heads / num_kv_heads)), softmax in float32 whatever
// the storage dtype. kUnsupported (nothing launched) for a head_dim outside {32, 64, 128,
// 256} or more than 8 query heads per KV head (4 at head_dim 256); kCudaError fills `error`.
LaunchResult LaunchPagedDecodeAttention(const PagedDecodeAttentionArgs& args, std::string* error);

}  // namespace tophat::kernels
