#include "models/runtime/step_buffers.h"

#include <algorithm>

#include "kernels/decode_attention.h"

namespace tophat {

StepBuffers::StepBuffers(const ModelConfig& config, at::ScalarType dtype, at::Device device,
                         const StepBufferShape& shape) {
  const int64_t rows = std::max<int64_t>(1, shape.max_tokens);
  const int64_t d = config.hidden_size;
  const int64_t hd = config.head_dim;
  const at::TensorOptions values = at::TensorOptions().dtype(dtype).device(device);
  residual = at::empty({rows, d}, values);
  normed = at::empty({rows, d}, values);
  qkv = at::empty({rows, config.q_size() + 2 * config.kv_size()}, values);
  q = at::empty({rows, config.num_attention_heads, hd}, values);
  k = at::empty({rows, config.num_key_value_heads, hd}, values);
  attention = at::empty({rows, config.q_size()}, values);
  projected = at::empty({rows, d}, values);
  // A mixture of experts whose every layer is sparse (Mixtral) has no dense MLP to hold.
  bool dense_layer = false;
  for (int64_t layer = 0; layer < config.num_hidden_layers && !dense_layer; ++layer) {
    dense_layer = !config.MoeLayer(layer);
  }
  const int64_t dense_rows = dense_layer ? rows : 0;
  gate_up = at::empty({dense_rows, 2 * config.intermediate_size}, values);
  activated = at::empty({dense_rows, config.intermediate_size}, values);
  const int64_t experts = config.num_experts;
  const int64_t top = config.num_experts_per_token;
  const int64_t expert_rows = experts > 0 ? rows : 0;
  const int64_t routed_rows = expert_rows * top;
  const int64_t expert_width = config.moe_intermediate_size;
  router_logits = at::empty({expert_rows, experts}, values);
  router_probs = at::empty({expert_rows, experts}, values.dtype(at::kFloat));
  expert_weights = at::empty({expert_rows, top}, values.dtype(at::kFloat));
  expert_ids = at::empty({expert_rows, top}, values.dtype(at::kLong));
  expert_weight_sums = at::empty({expert_rows, 1}, values.dtype(at::kFloat));
  routed_tokens = at::empty({routed_rows}, values.dtype(at::kLong));
  routed_weights = at::empty({routed_rows, 1}, values.dtype(at::kFloat));
  routed_in = at::empty({routed_rows, d}, values);
  routed_gate_up = at::empty({routed_rows, 2 * expert_width}, values);
  routed_activated = at::empty({routed_rows, expert_width}, values);
  routed_out = at::empty({routed_rows, d}, values);
  const int64_t shared_rows = config.shared_expert_intermediate_size > 0 ? expert_rows : 0;
  const int64_t shared_width = config.shared_expert_intermediate_size;
  shared_gate_up = at::empty({shared_rows, 2 * shared_width}, values);
  shared_activated = at::empty({shared_rows, shared_width}, values);
  shared_out = at::empty({shared_rows, d}, values);
  shared_gate = at::empty({shared_rows, 1}, values);
  expert_offsets.reserve(static_cast<size_t>(experts + 1));
  expert_fill.reserve(static_cast<size_t>(experts));
  cos = at::empty({rows, hd / 2}, values.dtype(at::kFloat));
  sin = at::empty({rows, hd / 2}, values.dtype(at::kFloat));
  const int64_t local_rows = config.rope_local_theta ? rows : 0;
  local_cos = at::empty({local_rows, hd / 2}, values.dtype(at::kFloat));
  local_sin = at::empty({local_rows, hd / 2}, values.dtype(at::kFloat));
  sublayer_out = at::empty({config.gemma() ? rows : 0, d}, values);

  const int64_t block_size = std::max<int64_t>(1, shape.block_size);
  const int64_t max_blocks =
      std::max<int64_t>(1, (std::max<int64_t>(1, shape.max_context) + block_size - 1) / block_size);
  const at::TensorOptions longs = values.dtype(at::kLong);
  const at::TensorOptions ints = values.dtype(at::kInt);
  positions = at::empty({rows}, longs);
  // The paged-batch tensors serve only a GPU's batched path; a CPU step never reads them.
  const int64_t index_rows = device.is_cpu() ? 1 : rows;
  slots = at::empty({index_rows}, longs);
  block_tables = at::zeros({index_rows, max_blocks}, ints);
  seq_lens = at::zeros({index_rows}, ints);
  decode_index = at::empty({index_rows}, longs);
  decode_q = at::empty({index_rows, config.num_attention_heads, hd}, values);
  decode_out = at::empty({index_rows, config.q_size()}, values);
  if (!device.is_cpu()) {
    decode_partials = kernels::PagedDecodeWorkspace(config.num_attention_heads,
                                                    config.num_key_value_heads, hd, device);
    decode_split_counters = kernels::PagedDecodeSplitCounters(device);
  }
  const at::TensorOptions host =
      at::TensorOptions().device(at::kCPU).pinned_memory(!device.is_cpu());
  host_positions = at::empty({rows}, host.dtype(at::kLong));
  host_slots = at::empty({index_rows}, host.dtype(at::kLong));
  host_block_tables = at::zeros({index_rows, max_blocks}, host.dtype(at::kInt));
  host_seq_lens = at::zeros({index_rows}, host.dtype(at::kInt));
  host_decode_index = at::empty({index_rows}, host.dtype(at::kLong));
  decode_rows.reserve(static_cast<size_t>(rows));
  chunk_table_rows.reserve(static_cast<size_t>(rows));
}

void StepBuffers::UploadDecodeIndices(int64_t rows) {
  positions.narrow(0, 0, rows).copy_(host_positions.narrow(0, 0, rows), /*non_blocking=*/true);
  slots.narrow(0, 0, rows).copy_(host_slots.narrow(0, 0, rows), /*non_blocking=*/true);
  block_tables.narrow(0, 0, rows)
      .copy_(host_block_tables.narrow(0, 0, rows), /*non_blocking=*/true);
  seq_lens.narrow(0, 0, rows).copy_(host_seq_lens.narrow(0, 0, rows), /*non_blocking=*/true);
  uploads_read.Record();
}

int64_t StepBuffers::DeviceBytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t : {&residual,
                              &normed,
                              &qkv,
                              &q,
                              &k,
                              &attention,
                              &projected,
                              &gate_up,
                              &activated,
                              &cos,
                              &sin,
                              &local_cos,
                              &local_sin,
                              &sublayer_out,
                              &router_logits,
                              &router_probs,
                              &expert_weights,
                              &expert_ids,
                              &expert_weight_sums,
                              &routed_tokens,
                              &routed_weights,
                              &routed_in,
                              &routed_gate_up,
                              &routed_activated,
                              &routed_out,
                              &shared_gate_up,
                              &shared_activated,
                              &shared_out,
                              &shared_gate,
                              &positions,
                              &slots,
                              &block_tables,
                              &seq_lens,
                              &decode_index,
                              &decode_q,
                              &decode_out,
                              &decode_partials,
                              &decode_split_counters}) {
    if (!t->defined()) continue;
    bytes += t->numel() * static_cast<int64_t>(t->element_size());
  }
  return bytes;
}

}  // namespace tophat
