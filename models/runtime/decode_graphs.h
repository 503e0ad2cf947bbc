// Decode steps as CUDA graphs. A decode step of a large model is ~10 kernel launches per
// layer; on an H100 the host's dispatch between them, not the GPU, set the step time at
// small batches (32% of the HBM bound at batch 1, docs/benchmarks.md). One graph per batch
// bucket is captured at warm-up over the step buffers' static tensors and replayed per step:
// one launch for every layer.
//
// Buckets: the powers of two up to the largest decode batch (1, 2, 4, ... max_batch, plus
// max_batch itself). A step of B rows replays the smallest bucket >= B, the padding rows
// writing no KV (slot -1) and attending nothing (length 0). Why powers of two: below the
// GPU's ridge point (an H100 does ~295 bf16 FLOP per byte of HBM; a decode GEMM of B rows
// does B FLOP per weight byte read), a step's time is the weights' read and barely grows
// with B, so padding up to 2x costs little, while each bucket costs a capture at start-up;
// log2(max_batch) + 1 graphs cover every batch size.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/runtime/step_buffers.h"
#include "models/runtime/submodel.h"

namespace tophat {

// The bucket sizes for decode batches of up to `max_batch` rows (pure; tested on any host).
std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch);
// The smallest bucket >= rows, or -1 when rows exceeds every bucket.
int64_t BucketFor(std::span<const int64_t> buckets, int64_t rows);

// One thread (the engine's) uses it: captures, replays and the buffers it writes are its.
class DecodeGraphs {
 public:
  // Captures one graph per bucket of DecodeGraphBuckets(max_batch) for `model` over `pool`
  // and `buffers` (which must hold max_batch rows and outlive this), then replays each once
  // against the same step run eagerly and compares them. Errors: a CPU model, a build
  // without CUDA (Unimplemented), a capture the runtime refuses, a replay that differs
  // from the eager step (Internal); the caller then runs decode steps eagerly.
  static absl::StatusOr<std::unique_ptr<DecodeGraphs>> Capture(const Submodel& model,
                                                               const KvBlockPool& pool,
                                                               StepBuffers& buffers,
                                                               int64_t max_batch);
  ~DecodeGraphs();

  // Whether a step of these chunks can be replayed: every chunk of 1 to
  // model.decode_row_chunk_tokens() tokens (a decode row per token: a speculative
  // verification chunk replays as its tokens' rows), every cache paged in the captured
  // pool, the rows within the largest bucket and each sequence within the buffers' block
  // tables.
  bool Fits(std::span<const SequenceChunk> chunks) const;
  // Runs the step (Fits must hold): stages its indices, copies `hidden` [B, D] (B: the
  // chunks' tokens) into the buffers' rows unless it is those rows, replays the bucket's
  // graph, advances the caches. Returns rows [0, B) of the buffers' residual (valid until
  // the next step).
  absl::StatusOr<at::Tensor> Run(const at::Tensor& hidden, std::span<const SequenceChunk> chunks);

  const std::vector<int64_t>& buckets() const { return buckets_; }
  int64_t replays() const { return replays_; }

 private:
  static int64_t RowsOf(std::span<const SequenceChunk> chunks);  // the chunks' tokens
  struct Graphs;  // the captured graphs (CUDA types stay out of this header)
  DecodeGraphs(const Submodel& model, const KvBlockPool& pool, StepBuffers& buffers,
               std::vector<int64_t> buckets);
  // Writes a step's indices (padding rows up to `bucket`) into the host staging and uploads
  // them to the buffers' static index tensors.
  void StageIndices(std::span<const SequenceChunk> chunks, int64_t bucket);

  const Submodel& model_;
  const KvBlockPool& pool_;
  StepBuffers& buffers_;
  std::vector<int64_t> buckets_;
  std::unique_ptr<Graphs> graphs_;
  int64_t replays_ = 0;
};

}  // namespace tophat
