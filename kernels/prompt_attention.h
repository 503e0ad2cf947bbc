// Attention of a chunk of queries (a prompt's chunk, or a speculative step's verification
// rows) against a sequence's paged keys and values, float32 on a CPU, in one pass that never
// holds a score matrix: keys are visited block by block with a running (online) softmax, and
// blocks no query of a tile can see (past the causal diagonal, or before a sliding window)
// are skipped. The composite form (gather the rows, bmm, mask, softmax, bmm) computed and
// wrote every score of the [heads, n, positions] matrix, masked half included: for a
// 512-token prompt of a 110M model that took more time than the layers' linear layers in
// bfloat16 (docs/benchmarks.md, "Prompt attention").
//
// Layout inside: a tile is up to 2 x (vector lanes) query rows of a KV head (the group's
// query heads for a few positions; one vector, or AVX2's 8 lanes on AVX-512, for a chunk
// with fewer rows), held transposed so that the lanes are rows: scores, running maxima and
// sums, and the output accumulate lane-wise, with each key's and value's elements broadcast,
// so no step needs a horizontal reduction. Many tiles are shared out one KV head each; one
// tile (verification rows over a long history) has its keys split between the threads, each
// reading its stretch of the cache in order, and the parts merged.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <span>

#include "kernels/gemv.h"

namespace tophat::kernels {

// q: [n, heads, head_dim] float32 CPU, last dimension contiguous, at positions
// past..past+n-1 of the sequence; key_blocks, value_blocks: [num_blocks, block_size, kv_heads,
// head_dim] (one layer of a KvBlockPool, last dimension contiguous), whose rows [0, past + n)
// are written and live where block_table says (row j in block block_table[j / block_size]).
// Query i sees keys [0, past + i] (within `window` positions of its own when window > 0);
// query head h uses KV head h / (heads / kv_heads). `sinks` (gpt-oss; [heads] float32,
// or undefined): one more logit per query head with no value row. Writes softmax(q k^T *
// scale) v into `out` ([n, heads * head_dim], contiguous float32). Returns false (and writes
// nothing) for inputs not of that form, for softcapped scores (Gemma 2: the caller's
// composite path caps them), or a table that does not cover the rows; and always when
// TOPHAT_PROMPT_ATTENTION=off is in the environment (PromptAttentionKernelOn).
//
// Rows are independent: a query's output is the same to the bit whatever other queries share
// its call and however its prompt was split into calls (a tile's lanes never mix, and every
// query's keys are taken in the same blocks), with one exception: a chunk that fits one tile
// (at most 32 query rows a KV head on AVX-512; verification rows) over a history of 2 x
// threads key blocks or more has its keys split between the threads and the parts merged,
// which rounds differently (and by the thread count). It differs in rounding from a
// one-query decode step (kernels/decode_attention.h), as the composite form did.
bool PagedPromptAttention(const at::Tensor& q, const at::Tensor& key_blocks,
                          const at::Tensor& value_blocks, std::span<const int32_t> block_table,
                          int64_t past, double scale, at::Tensor& out, int64_t window = 0,
                          double softcap = 0, const at::Tensor& sinks = {});

// Whether PagedPromptAttention computes (read once from TOPHAT_PROMPT_ATTENTION: "off" turns
// it off, for measurements and as a way back to the composite form).
bool PromptAttentionKernelOn();

// The same on a named instruction set (tests), whatever the environment says: fails unless
// this CPU runs it.
bool PagedPromptAttentionWithIsa(CpuIsa isa, const at::Tensor& q, const at::Tensor& key_blocks,
                                 const at::Tensor& value_blocks,
                                 std::span<const int32_t> block_table, int64_t past, double scale,
                                 at::Tensor& out, int64_t window = 0, double softcap = 0,
                                 const at::Tensor& sinks = {});

}  // namespace tophat::kernels
