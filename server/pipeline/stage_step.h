// What stage 0 sends down the pipeline each step, besides the hidden states: which KV
// blocks each chunk of the batch reads and writes. Stage 0's allocator chooses every block
// id; each stage's pool has the same number of blocks (of its own layers), so an id names
// the same session's rows on every stage and the later stages keep no session state.
// Truncate, Cancel and Close therefore reach them in step order by construction: a rolled
// back or freed position is simply addressed (and overwritten) by a later step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"

namespace tophat::pipeline {

enum class StageOp : int64_t { kForward = 1, kShutdown = 2 };

// A fixed-size int64 tensor, sent first: the receiver sizes the rest from it.
struct StepHeader {
  StageOp op = StageOp::kForward;
  int64_t step = 0;            // stage 0's step counter, for logs and checks
  int64_t total_tokens = 0;    // rows of the hidden states that follow
  int64_t address_length = 0;  // int64 elements of the chunk addresses that follow
};
constexpr int64_t kHeaderElements = 4;
at::Tensor EncodeHeader(const StepHeader& header);
absl::StatusOr<StepHeader> DecodeHeader(const at::Tensor& encoded);

// One chunk of the batch: it writes positions [past, past + num_tokens) and attends to
// [0, past + num_tokens), in the blocks named by `blocks` (in position order).
struct ChunkAddress {
  int64_t past = 0;
  int64_t num_tokens = 0;
  std::span<const int32_t> blocks;
};

// A KV block every later stage copies before the step's forward: a forked session's copy of
// its parent's KV (stage 0 copied its own layers' blocks when it admitted the fork). In step
// order, so the parent's blocks are read before any later step can reuse them.
struct BlockCopy {
  int32_t from = 0;
  int32_t to = 0;
};

// Flattened as: chunk count, then per chunk past, num_tokens, block count, block ids; then
// copy count, then per copy its two block ids.
void EncodeAddresses(std::span<const ChunkAddress> chunks, std::span<const BlockCopy> copies,
                     std::vector<int64_t>& out);

struct DecodedChunk {
  int64_t past = 0;
  int64_t num_tokens = 0;
  std::vector<int32_t> blocks;
};
struct DecodedStep {
  std::vector<DecodedChunk> chunks;
  std::vector<int32_t> copy_from;  // BlockCopy.from of each copy, in order
  std::vector<int32_t> copy_to;
};
// Checks every id against `num_blocks` and that the blocks cover each chunk's positions
// (block_size each), and that the chunks' tokens sum to `total_tokens`.
absl::StatusOr<DecodedStep> DecodeAddresses(std::span<const int64_t> encoded,
                                            int64_t total_tokens, int64_t num_blocks,
                                            int64_t block_size);

}  // namespace tophat::pipeline
