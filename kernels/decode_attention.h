// Attention of one query token against a sequence's cached keys and values, in one pass per
// head. At decode time the composite form (permute, bmm, scale, softmax, bmm, permute, copy)
// costs more in dispatch than in arithmetic.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <span>

namespace tophat::kernels {

// q: [heads, head_dim]; keys, values: [positions, kv_heads, head_dim] (row-major views into
// a KV cache, last dimension contiguous); query head h uses KV head h / (heads / kv_heads).
// Writes softmax(q k^T * scale) v into `out` ([heads * head_dim], contiguous float32).
// Returns false (and writes nothing) when the inputs are not float32 CPU of that layout, so
// the caller can take the composite path. This is PagedDecodeAttention with one block.
bool DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                     double scale, at::Tensor& out);

// The same over a paged cache. key_blocks, value_blocks: [num_blocks, block_size, kv_heads,
// head_dim] (one layer of a KvBlockPool, last dimension contiguous). Row j of the sequence
// (0 <= j < positions) lives in block block_table[j / block_size] at offset j % block_size.
// Returns false (and writes nothing) when the inputs are not float32 CPU of that layout, or
// when the table does not cover `positions` rows of valid block ids; the caller then gathers
// the rows and takes the composite path. first > 0 attends rows [first, positions) only (a
// sliding window). softcap > 0 caps each scaled score s at softcap * tanh(s / softcap) before
// the softmax (Gemma 2's attn_logit_softcapping). `sinks` (gpt-oss; [heads] float32 CPU
// contiguous, or undefined): query head h's softmax also counts a logit sinks[h] whose value
// is zero, so the weights over the positions sum to less than one.
bool PagedDecodeAttention(const at::Tensor& q, const at::Tensor& key_blocks,
                          const at::Tensor& value_blocks, std::span<const int32_t> block_table,
                          int64_t positions, double scale, at::Tensor& out, int64_t first = 0,
                          double softcap = 0, const at::Tensor& sinks = {});

// A batch of decode queries, one per sequence, over one pool's paged keys and values, in one
// CUDA launch (kernels/paged_attention.cu). q: [num_seqs, heads, head_dim] contiguous;
// key_blocks, value_blocks: [num_blocks, block_size, kv_heads, head_dim] contiguous, q's
// dtype (float32, float16 or bfloat16), on q's CUDA device; block_tables: [num_seqs,
// max_blocks] int32 and seq_lens: [num_seqs] int32 (positions each sequence attends,
// including the query's own, already written), both on the device; window > 0 limits
// attention to each sequence's last `window` positions. Writes out ([num_seqs, heads *
// head_dim], contiguous, q's dtype). Returns false (nothing launched) when the inputs are
// not of that form, the shape is one the kernel does not cover, or this build has no CUDA
// kernels; throws c10::Error when the launch itself fails.
// `partials`: a float32 workspace on q's device (PagedDecodeWorkspace) in which a batch too
// small to fill the GPU splits each sequence into stretches attended in parallel and then
// merged; undefined: one thread block per (sequence, KV head), whatever the batch.
// `split_counters` (PagedDecodeSplitCounters): with them the attention kernel merges the
// splits itself (the last block of each sequence to finish); undefined: a second kernel
// merges. Both give the same output to the bit. One stream's: two launches in flight at once
// on different streams must not share them.
bool PagedDecodeAttentionBatch(const at::Tensor& q, const at::Tensor& key_blocks,
                               const at::Tensor& value_blocks, const at::Tensor& block_tables,
                               const at::Tensor& seq_lens, int64_t window, double scale,
                               at::Tensor& out, const at::Tensor& partials = {},
                               const at::Tensor& split_counters = {});
// A workspace for PagedDecodeAttentionBatch that lets every batch on `device` take its full
// split (a few MB; undefined on a CPU or in a build without CUDA kernels). Allocate it once:
// a captured CUDA graph keeps its address.
at::Tensor PagedDecodeWorkspace(int64_t heads, int64_t kv_heads, int64_t head_dim,
                                at::Device device);
// Whether PagedDecodeAttentionBatch merges split sequences in the attention kernel when it
// is given split counters (on unless set off), or always with a second kernel. Process-wide,
// for operators and benchmarks (config key `fused_split_merge`, `tophat-bench-engine
// --fused-split-merge`); set it before the first step (a captured graph keeps what it saw).
bool FusedSplitMerge();
void SetFusedSplitMerge(bool enabled);
// Split counters for PagedDecodeAttentionBatch on `device`: int32 zeros, which every launch
// leaves zeros (a few KB; undefined on a CPU or in a build without CUDA kernels). Allocate
// them once, as the workspace.
at::Tensor PagedDecodeSplitCounters(at::Device device);
// How many stretches PagedDecodeAttentionBatch splits each of `seqs` sequences into with
// `partials` (1: none); 1 without CUDA kernels.
int PagedDecodeSplitCount(int64_t seqs, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          const at::Tensor& partials);

// Where one layer's keys or values keep their rows (float32): row r of block b, KV head kv,
// starts at base + b * block_stride + r * row_stride + kv * head_stride (head_dim floats,
// contiguous). A contiguous cache is one block.
struct KvRows {
  const float* base;
  int64_t block_stride;
  int64_t row_stride;
  int64_t head_stride;
};

// The rows of one layer of a KV pool, blocks [num_blocks, block_size, kv_heads, head_dim]
// float32 with the last dimension contiguous (the caller checked).
KvRows KvRowsOf(const at::Tensor& blocks);

// One query head's decode attention on the calling thread: softmax(q k^T * scale) v over
// positions [first, positions) of KV head `kv_head` (first > 0: a sliding window; softcap >
// 0: each scaled score capped as PagedDecodeAttention caps it), laid out
// in blocks as PagedDecodeAttention reads them (block_table covers them). `scores`: room for
// `positions - first` floats; `out`: head_dim floats. The arithmetic of DecodeAttention and
// PagedDecodeAttention, head by head (kernels/decode_step.h gets the same numbers). `sink`:
// the head's attention sink logit (gpt-oss), -infinity for none.
void AttendHead(const float* q, const KvRows& k, const KvRows& v, int64_t kv_head, int64_t head_dim,
                std::span<const int32_t> block_table, int64_t block_size, int64_t first,
                int64_t positions, float scale, float softcap, float* scores, float* out,
                float sink = -INFINITY);

// silu(gate[i]) * up[i] for i < n, float32 on the calling thread: SwiGluOut's CPU arithmetic.
void SwiGluRow(const float* gate, const float* up, int64_t n, float* out);
// gelu_tanh(gate[i]) * up[i] (Gemma's MLP: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))),
// float32 on the calling thread: GeluTanhGluOut's CPU arithmetic.
void GeluTanhGluRow(const float* gate, const float* up, int64_t n, float* out);
// gelu_tanh(gate) * up for gate_up = [gate | up] along the last dimension, into `out` (gate_up's
// shape with the last dimension halved, contiguous); on a float32 CPU row by row with
// GeluTanhGluRow, elsewhere ATen's gelu.
void GeluTanhGluOut(const at::Tensor& gate_up, at::Tensor& out);

// gpt-oss's experts: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate,
// limit), for gate_up = [gate | up] along the last dimension ([rows, 2I] float32 CPU
// contiguous), into `out` ([rows, I] contiguous float32), allocating nothing (other dtypes
// and devices: composite ops); transformers' GptOssExperts with alpha 1.702 and limit 7.
void ClampedSwiGluOut(const at::Tensor& gate_up, at::Tensor& out, float alpha = 1.702f,
                      float limit = 7.0f);

// silu(gate) * up for gate_up = [gate | up] along the last dimension, in one pass.
at::Tensor SwiGlu(const at::Tensor& gate_up);
// The same into `out` (gate_up's shape with the last dimension halved, contiguous), allocating
// nothing on the fused paths.
void SwiGluOut(const at::Tensor& gate_up, at::Tensor& out);

}  // namespace tophat::kernels
