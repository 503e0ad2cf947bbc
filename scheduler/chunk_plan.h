// Jupiter's sequence partition (§IV-B): a prompt cut into chunks of unequal lengths, planned
// by dynamic programming over the cost of each stage of the prefill pipeline. A chunk of x
// positions after y earlier ones costs a stage q(x, y): the linear layers grow with x, and
// attention with x times the context it attends, so equal chunks make the later ones the
// slowest, and the pipeline (device input layers -> uplink -> cloud stages -> downlink ->
// device output layers) runs at the pace of its slowest chunk.
//
// Pure logic over measured inputs: each stage's cost model is fitted from its own timings
// (FitChunkCost). HAT's equation 3 (one chunk size for the whole prompt, decode_decisions.h)
// stays the baseline; PlanChunks returns the plan and the baseline's latency side by side.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

// q(x, y) = fixed + per_position·x + per_pair·x·(y + (x + 1) / 2): a fixed cost per chunk
// (a step's launch, a message's framing and delay), the linear layers (or the bytes on a
// link) per position, and causal attention over the y earlier positions and the chunk's own.
struct ChunkCost {
  double fixed_s = 0;
  double per_position_s = 0;
  double per_pair_s = 0;  // per (query position, attended position) pair
  double Seconds(int64_t positions, int64_t context) const;
};

// One timing of a stage: a chunk of `positions` after `context` earlier ones took `seconds`.
struct ChunkSample {
  int64_t positions = 0;
  int64_t context = 0;
  double seconds = 0;
};

// Least squares over the three coefficients, none negative (a coefficient the fit would make
// negative is held at 0 and the others refitted). InvalidArgument naming the sample when one
// is not positive, or when the samples cannot tell the coefficients apart (fewer than three
// distinct (positions, context) pairs).
absl::StatusOr<ChunkCost> FitChunkCost(std::span<const ChunkSample> samples);

// The time a prompt's chunks take through the stages in order: chunk i enters stage s when
// it has left stage s - 1 and chunk i - 1 has left stage s (a flow shop; each stage one chunk
// at a time). Returns when the last chunk leaves the last stage.
double PipelineSeconds(std::span<const ChunkCost> stages, std::span<const int64_t> chunks);

struct ChunkPlanOptions {
  int64_t granularity = 16;  // chunk lengths are multiples of this (the KV block), the last
                             // chunk whatever is left
  int64_t min_chunk = 16;    // Jupiter's floor b: no chunk shorter (but a whole short prompt)
  int64_t max_chunks = 32;   // the k tried: 1 .. this
  // No chunk longer than this (0: no bound): the cloud's own chunk size, which bounds how long
  // a step carrying the chunk holds up other devices' decode tokens. The DP then shapes the
  // chunks within it, and max_chunks must allow prompt / max_chunk of them.
  int64_t max_chunk = 0;
  // After the DP, also take HAT's equal chunks for each k as candidates, and move the
  // boundaries of the fastest few a granule at a time while the pipeline's latency falls (the
  // DP minimises the slowest chunk only, which is not always the fastest pipeline). false:
  // Jupiter's split as it is.
  bool refine = true;
};

struct ChunkPlan {
  std::vector<int64_t> chunks;   // lengths, in prompt order; they sum to the prompt
  double seconds = 0;            // PipelineSeconds of `chunks`
  double slowest_stage_s = 0;    // the pipeline's beat: the largest q of any chunk at any stage
  // The baseline with as many chunks of one size (HAT): its latency, for the same k.
  double equal_chunks_seconds = 0;
};

// For each k, the split of `prompt` positions into k chunks whose slowest chunk (the largest
// q at any stage) is as fast as it can be, by dynamic programming: W(j, k) = the best beat
// of the first j positions in k chunks = min over i of max(W(i, k - 1), beat(i -> j)). Of
// those (and, with options.refine, equal chunks, refined), the one whose PipelineSeconds is
// least: with refinement never slower than HAT's equal chunks.
// InvalidArgument when there is no stage or the prompt is empty.
absl::StatusOr<ChunkPlan> PlanChunks(int64_t prompt, std::span<const ChunkCost> stages,
                                     const ChunkPlanOptions& options = {});

}  // namespace tophat
