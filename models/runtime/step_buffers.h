// The tensors one forward step of a submodel writes, allocated once for the largest step so
// that a step after warm-up allocates nothing (STYLE.md: "No allocation in the step"): the
// cloud's engine makes one set at start-up and passes it to every Submodel::Forward.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/cuda_device.h"
#include "models/formats/config.h"

namespace tophat {

// Sizes of a StepBuffers: the most rows (tokens of all chunks) and, for the paged decode
// kernel's block tables on a GPU, the longest context a sequence may reach.
struct StepBufferShape {
  int64_t max_tokens = 1;
  int64_t max_context = 1;
  int64_t block_size = 16;  // the KV pool's, for the block-table width
};

// Row r of a step lives at row r of each [max_tokens, ...] tensor; a step of T tokens uses
// rows [0, T) (narrow), so the storage never moves. Not thread-safe: the thread that runs the
// forward passes owns it, and a step's output (a view of `residual`) is valid until the next
// step with the same buffers.
struct StepBuffers {
  // Every tensor on `device`; the index staging (host_*) on the CPU, pinned when `device` is
  // a GPU so that its uploads are asynchronous. Throws as a tensor allocation does.
  StepBuffers(const ModelConfig& config, at::ScalarType dtype, at::Device device,
              const StepBufferShape& shape);

  int64_t max_tokens() const { return residual.size(0); }
  // Copies rows [0, rows) of the staged positions, slots, block tables and lengths to the
  // device asynchronously and records uploads_read behind them: a decode step's indices.
  // The caller waited for uploads_read before writing that staging.
  void UploadDecodeIndices(int64_t rows);
  int64_t max_blocks_per_sequence() const { return block_tables.size(1); }
  // Bytes held on the device, the host staging excluded.
  int64_t DeviceBytes() const;

  at::Tensor residual;   // [max_tokens, D]: the residual stream and the step's output
  at::Tensor normed;     // [max_tokens, D]: a norm's output, the next projection's input
  at::Tensor qkv;        // [max_tokens, q + 2 kv]
  at::Tensor q;          // [max_tokens, heads, head_dim]: rotated queries
  at::Tensor k;          // [max_tokens, kv_heads, head_dim]: rotated keys
  at::Tensor attention;  // [max_tokens, q]
  at::Tensor projected;  // [max_tokens, D]: o_proj's and down_proj's output
  at::Tensor gate_up;    // [max_tokens, 2 I]
  at::Tensor activated;  // [max_tokens, I]
  at::Tensor cos;        // [max_tokens, head_dim / 2] float32: rotary rows of the step's tokens
  at::Tensor sin;
  // The same from the sliding layers' table (ModelConfig::rope_local_theta); [0, ...] when
  // the model has none.
  at::Tensor local_cos;
  at::Tensor local_sin;
  // Gemma 3: a sublayer's output normed before its residual add; [0, D] for other models.
  at::Tensor sublayer_out;
  // A mixture of experts' step (ModelConfig::num_experts E > 0, each token to K of them;
  // [0, ...] for a dense model): the router's logits and probabilities, each row's chosen
  // experts and their weights, and the routed rows, one per token and chosen expert, grouped
  // by expert: which token each is, its weight, its input, and its expert's gate_up,
  // activation and output.
  at::Tensor router_logits;             // [max_tokens, E]
  at::Tensor router_probs;              // [max_tokens, E] float32
  at::Tensor expert_weights;            // [max_tokens, K] float32
  at::Tensor expert_ids;                // [max_tokens, K] int64
  at::Tensor expert_weight_sums;        // [max_tokens, 1] float32
  at::Tensor routed_tokens;             // [max_tokens * K] int64
  at::Tensor routed_weights;            // [max_tokens * K, 1] float32
  at::Tensor routed_in;                 // [max_tokens * K, D]
  at::Tensor routed_gate_up;            // [max_tokens * K, 2 moe_intermediate_size]
  at::Tensor routed_activated;          // [max_tokens * K, moe_intermediate_size]
  at::Tensor routed_out;                // [max_tokens * K, D]
  // Qwen2-MoE's shared expert ([0, ...] without one): its gate_up, activation, output and
  // gate logit.
  at::Tensor shared_gate_up;            // [max_tokens, 2 shared_expert_intermediate_size]
  at::Tensor shared_activated;          // [max_tokens, shared_expert_intermediate_size]
  at::Tensor shared_out;                // [max_tokens, D]
  at::Tensor shared_gate;               // [max_tokens, 1]
  std::vector<int64_t> expert_offsets;  // E + 1: where each expert's routed rows begin
  std::vector<int64_t> expert_fill;     // E: the next free row of each expert's
  // The experts the last step computed (those with rows), summed over its sparse layers:
  // what it read of the experts' weights (Submodel::WeightBytesRead).
  int64_t experts_computed = 0;

  // Index tensors of a step: the device copies and their host staging.
  at::Tensor positions;     // [max_tokens] int64: each row's position
  at::Tensor slots;         // [max_tokens] int64: each row's KV pool slot (GPU batches)
  at::Tensor block_tables;  // [max_tokens, max_blocks] int32: decode rows' tables (GPU)
  at::Tensor seq_lens;      // [max_tokens] int32: positions each decode row attends (GPU)
  at::Tensor decode_index;  // [max_tokens] int64: batch rows of the decode rows (GPU)
  at::Tensor decode_q;      // [max_tokens, heads, head_dim]: gathered decode queries (GPU)
  at::Tensor decode_out;    // [max_tokens, q]: their attention, before the scatter back
  // float32 workspace of the paged decode kernel's split sequences (GPU; undefined on a CPU):
  // allocated here once, so that a captured decode graph keeps its address.
  at::Tensor decode_partials;
  // int32 zeros, the kernel's split counters (kernels::PagedDecodeSplitCounters), with which
  // it merges a split sequence in the attention kernel itself; allocated once, as above.
  at::Tensor decode_split_counters;
  // Which chunks of a GPU step are longer than one row (their indices), staged by the step.
  std::vector<int64_t> chunk_table_rows;
  at::Tensor host_positions;
  at::Tensor host_slots;
  at::Tensor host_block_tables;
  at::Tensor host_seq_lens;
  at::Tensor host_decode_index;
  std::vector<int64_t> decode_rows;  // capacity max_tokens, reserved once
  // Passed once the GPU has read the host staging of the last upload: the next step waits
  // for it before writing the staging again (a GPU step's uploads are asynchronous).
  kernels::CudaFence uploads_read;
};

}  // namespace tophat
