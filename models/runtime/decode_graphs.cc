#include "models/runtime/decode_graphs.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

#ifdef TOPHAT_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tophat {

std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch) {
  std::vector<int64_t> buckets;
  for (int64_t b = 1; b < max_batch; b *= 2) buckets.push_back(b);
  if (max_batch >= 1) buckets.push_back(max_batch);
  return buckets;
}

int64_t BucketFor(std::span<const int64_t> buckets, int64_t rows) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), rows);
  return it == buckets.end() ? -1 : *it;
}

#ifdef TOPHAT_HAVE_CUDA
struct DecodeGraphs::Graphs {
  std::vector<std::unique_ptr<at::cuda::CUDAGraph>> by_bucket;  // buckets_ order
};
#else
struct DecodeGraphs::Graphs {};
#endif

DecodeGraphs::DecodeGraphs(const Submodel& model, const KvBlockPool& pool, StepBuffers& buffers,
                           std::vector<int64_t> buckets)
    : model_(model),
      pool_(pool),
      buffers_(buffers),
      buckets_(std::move(buckets)),
      graphs_(std::make_unique<Graphs>()) {}

DecodeGraphs::~DecodeGraphs() = default;

int64_t DecodeGraphs::RowsOf(std::span<const SequenceChunk> chunks) {
  int64_t rows = 0;
  for (const SequenceChunk& chunk : chunks) rows += chunk.num_tokens;
  return rows;
}

bool DecodeGraphs::Fits(std::span<const SequenceChunk> chunks) const {
  if (chunks.empty() || RowsOf(chunks) > buckets_.back()) return false;
  for (const SequenceChunk& chunk : chunks) {
    if (chunk.num_tokens < 1 || chunk.num_tokens > model_.decode_row_chunk_tokens() ||
        chunk.cache == nullptr || &chunk.cache->pool() != &pool_ || !chunk.cache->paged()) {
      return false;
    }
    const int64_t end = chunk.cache->length() + chunk.num_tokens;
    if (end > chunk.cache->capacity() || end > model_.max_context() ||
        pool_.BlocksFor(end) > buffers_.max_blocks_per_sequence()) {
      return false;
    }
  }
  return true;
}

void DecodeGraphs::StageIndices(std::span<const SequenceChunk> chunks, int64_t bucket) {
  buffers_.uploads_read.Wait();  // the last upload has left the pinned staging
  const int64_t width = buffers_.max_blocks_per_sequence();
  int64_t* positions = buffers_.host_positions.data_ptr<int64_t>();
  int64_t* slots = buffers_.host_slots.data_ptr<int64_t>();
  int32_t* tables = buffers_.host_block_tables.data_ptr<int32_t>();
  int32_t* lens = buffers_.host_seq_lens.data_ptr<int32_t>();
  // A row per token, token i of a chunk seeing positions [0, past + i]
  // (kDecodeRowsMaxChunkTokens).
  int64_t r = 0;
  for (const SequenceChunk& chunk : chunks) {
    const KvCache& cache = *chunk.cache;
    const std::span<const int32_t> table = cache.block_table();
    for (int64_t i = 0; i < chunk.num_tokens; ++i, ++r) {
      const int64_t position = cache.length() + i;
      positions[r] = position;
      slots[r] = cache.SlotOf(position);
      lens[r] = static_cast<int32_t>(position + 1);
      std::copy(table.begin(), table.begin() + pool_.BlocksFor(position + 1), tables + r * width);
    }
  }
  // Padding: rotates a query at position 0, writes no K/V, attends nothing.
  for (; r < bucket; ++r) {
    positions[r] = 0;
    slots[r] = -1;
    lens[r] = 0;
  }
  buffers_.UploadDecodeIndices(bucket);
}

absl::StatusOr<at::Tensor> DecodeGraphs::Run(const at::Tensor& hidden,
                                             std::span<const SequenceChunk> chunks) {
#ifdef TOPHAT_HAVE_CUDA
  const int64_t rows = RowsOf(chunks);
  const int64_t bucket = BucketFor(buckets_, rows);
  if (!Fits(chunks) || bucket < 0 || hidden.dim() != 2 || hidden.size(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("a step of ", chunks.size(), " chunks (",
                                                   rows, " rows) does not fit the captured "
                                                   "decode graphs"));
  }
  const size_t index = static_cast<size_t>(
      std::find(buckets_.begin(), buckets_.end(), bucket) - buckets_.begin());
  at::Tensor x = buffers_.residual.narrow(0, 0, rows);
  TOPHAT_RETURN_IF_ERROR(CatchExceptions("decode graph replay", [&] {
    const c10::cuda::CUDAGuard device_guard(x.device());  // the copy's stream and the replay's
    StageIndices(chunks, bucket);
    if (hidden.data_ptr() != x.data_ptr()) x.copy_(hidden, /*non_blocking=*/true);
    graphs_->by_bucket[index]->replay();
  }));
  for (const SequenceChunk& chunk : chunks) chunk.cache->Advance(chunk.num_tokens);
  ++replays_;
  return x;
#else
  (void)hidden;
  (void)chunks;
  return absl::UnimplementedError("this build has no CUDA");
#endif
}

absl::StatusOr<std::unique_ptr<DecodeGraphs>> DecodeGraphs::Capture(const Submodel& model,
                                                                    const KvBlockPool& pool,
                                                                    StepBuffers& buffers,
                                                                    int64_t max_batch) {
#ifdef TOPHAT_HAVE_CUDA
  if (!model.options().device.is_cuda()) {
    return absl::FailedPreconditionError("decode graphs need a CUDA device");
  }
  if (max_batch < 1 || max_batch > buffers.max_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("decode graphs up to batch ", max_batch,
                                                   " in step buffers of ",
                                                   buffers.max_tokens(), " rows"));
  }
  auto graphs = std::unique_ptr<DecodeGraphs>(
      new DecodeGraphs(model, pool, buffers, DecodeGraphBuckets(max_batch)));
  const std::vector<int64_t>& buckets = graphs->buckets_;
  const int64_t d = model.config().hidden_size;
  // Validation rows: every row attends the first position of block 0 and writes no K/V, so
  // the pool (whoever's blocks those are) is only read.
  auto stage_validation = [&](int64_t bucket) {
    buffers.uploads_read.Wait();
    for (int64_t r = 0; r < bucket; ++r) {
      buffers.host_positions[r] = r % model.max_context();
      buffers.host_slots[r] = -1;
      buffers.host_seq_lens[r] = 1;
      buffers.host_block_tables[r][0] = 0;
    }
    buffers.UploadDecodeIndices(bucket);
  };
  absl::Status status = CatchExceptions("capturing decode graphs", [&] {
    // The pool stream and the capture are the current device's: the model's, from any thread.
    const c10::cuda::CUDAGuard device_guard(buffers.residual.device());
    const at::Tensor input = at::randn({buckets.back(), d}, buffers.residual.options());
    // Capture runs on a side stream (the legacy default stream cannot be captured); its
    // cuBLAS workspace is made by an eager step there first.
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream();
    caller.synchronize();  // start-up only: the side stream sees everything before it
    {
      c10::cuda::CUDAStreamGuard guard(side);
      const at::cuda::MempoolId_t mempool = at::cuda::graph_pool_handle();
      graphs->graphs_->by_bucket.resize(buckets.size());
      // Largest first: the smaller graphs reuse the largest one's private memory.
      for (size_t i = buckets.size(); i-- > 0;) {
        const int64_t bucket = buckets[i];
        stage_validation(bucket);
        buffers.residual.narrow(0, 0, bucket).copy_(input.narrow(0, 0, bucket));
        absl::Status eager = model.DecodeStepInBuffers(pool, bucket, buffers);
        TORCH_CHECK(eager.ok(), eager.ToString());
        auto graph = std::make_unique<at::cuda::CUDAGraph>();
        graph->capture_begin(mempool);
        absl::Status captured = model.DecodeStepInBuffers(pool, bucket, buffers);
        graph->capture_end();
        TORCH_CHECK(captured.ok(), captured.ToString());
        graphs->graphs_->by_bucket[i] = std::move(graph);
      }
      side.synchronize();
    }
    // Each graph against the eager step on the same inputs.
    for (size_t i = 0; i < buckets.size(); ++i) {
      const int64_t bucket = buckets[i];
      stage_validation(bucket);
      at::Tensor rows = buffers.residual.narrow(0, 0, bucket);
      rows.copy_(input.narrow(0, 0, bucket));
      absl::Status eager = model.DecodeStepInBuffers(pool, bucket, buffers);
      TORCH_CHECK(eager.ok(), eager.ToString());
      const at::Tensor expected = rows.to(at::kFloat);
      rows.copy_(input.narrow(0, 0, bucket));
      graphs->graphs_->by_bucket[i]->replay();
      const at::Tensor got = rows.to(at::kFloat);
      const double error = (got - expected).abs().max().item<double>();
      const double scale = expected.abs().max().item<double>();
      TORCH_CHECK(std::isfinite(error) && error <= 1e-3 * scale + 1e-3, "the graph of batch ",
                  bucket, " differs from the eager step by ", error, " (largest value ", scale,
                  ")");
    }
  });
  if (!status.ok()) return status;
  return graphs;
#else
  (void)model;
  (void)pool;
  (void)buffers;
  (void)max_batch;
  return absl::UnimplementedError("this build has no CUDA kernels, so no decode graphs");
#endif
}

}  // namespace tophat
