// A contiguous slice of a Llama-family model: optionally the token embedding, a range of
// decoder layers, and optionally the final norm + LM head. The monolithic model and the
// three HAT submodels (input, middle, output) are all Submodels.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/decode_step.h"
#include "kernels/gemv_int8.h"
#include "kernels/gemv_mxfp4.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/kv_cache.h"
#include "models/runtime/layers.h"
#include "models/runtime/step_buffers.h"

namespace tophat {

// Half-open range [begin, end) of decoder layer indices in the full model.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const LayerRange&) const = default;
};

struct SubmodelSpec {
  bool embedding = false;  // model.embed_tokens
  LayerRange layers;
  bool head = false;  // model.norm + lm_head (or the embedding when tied)

  static SubmodelSpec Full(const ModelConfig& config) {
    return {.embedding = true, .layers = {0, config.num_hidden_layers}, .head = true};
  }
  static SubmodelSpec Input(int64_t m) { return {.embedding = true, .layers = {0, m}}; }
  static SubmodelSpec Middle(const ModelConfig& config, int64_t m, int64_t k) {
    return {.layers = {m, config.num_hidden_layers - k}};
  }
  static SubmodelSpec Output(const ModelConfig& config, int64_t k) {
    return {.layers = {config.num_hidden_layers - k, config.num_hidden_layers}, .head = true};
  }
};

// Whether `device` is on this host, asked without starting a CUDA context (which loading
// then does, and which may still fail): a CPU always is; a CUDA device needs LibTorch with
// CUDA and a GPU of its index visible. UNAVAILABLE naming the device and why otherwise.
absl::Status CheckDeviceOnHost(c10::Device device);

struct SubmodelOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype; weights are converted on load
  at::Device device = at::kCPU;
  // Longest sequence (prompt + generated) a KV cache of this submodel can hold. Capped at
  // the config's max_position_embeddings.
  int64_t max_context = 4096;
  // Keep weight matrices on transparent huge pages (CPU): decode streams them ~25% faster.
  bool huge_pages = true;
  // Quantize the weight matrices (the layers', the LM head and the embedding) to int8 with
  // per-row scales as they load (kernels/gemv_int8.h). Matrices a checkpoint stores as int8
  // (`tophat split --device-weights int8`) load as int8 whatever this says. int8 is computed
  // on a CPU in float32; any other device or dtype dequantizes them at load.
  bool quantize_int8 = false;
  // Keep float weight matrices in bfloat16 and compute in float32 (CPU float32 submodels):
  // half float32's bytes per weight, each widened exactly in registers
  // (kernels::LinearBf16Out). Activations, norms and the KV cache stay float32. Where int8 is
  // asked for or stored, int8 wins.
  bool bf16_weights = false;
  // Keep gpt-oss's experts in MXFP4 where its checkpoint stores them so (CPU float32
  // submodels; kernels/gemv_mxfp4.h): 4.25 bits a weight, computed exactly as the
  // dequantized float32 matrices up to summation order. False dequantizes them at load (the
  // float32 reference, and what bfloat16 or a GPU does anyway). int8 and bf16_weights leave
  // them in MXFP4, which is smaller than either.
  bool mxfp4_experts = true;
  // With int8 matrices: round the activations to int8 too, per block of 32 values, as they
  // enter each linear layer, and multiply in integers (kernels/gemv_w8a8.h; llama.cpp's Q8_0
  // does the same). So do experts held in MXFP4 (kernels/gemv_mxfp4.h, LinearMxfp4A8Out). The model
  // as computed is then the dequantized weights times the rounded activations; without it, the
  // dequantized weights times float32 activations.
  bool int8_activations = false;
  // With bf16_weights: a prompt's rows (kernels::kF32GemmMinRows or more) are rounded to
  // bfloat16 as they enter each of the layers' linear layers and multiplied in bfloat16 with
  // float32 sums, where the CPU has AVX512_BF16 (kernels::LinearBf16PromptOut; llama.cpp's
  // BF16 computes so): about twice the float32 rate. Decode and verification rows, and the
  // LM head, stay float32; elsewhere this changes nothing.
  bool bf16_activations = false;
  // A one-token step on a float32 CPU submodel (the device's decode, a drafter's step) and
  // its LM head run as one parallel region each (kernels/decode_step.h), with the numbers of
  // the layer-by-layer path. Off: the layer-by-layer path (benchmarks compare the two).
  bool fused_cpu_decode = true;
  // Steps of 1-8 rows on a GPU in float16/bfloat16: whether a weight matrix's GEMM takes the
  // small-batch kernel (kernels/small_batch_gemm.h) or cuBLAS. kMeasured times both per
  // matrix shape and row count at load (models/runtime/gemm_tactics.h, well under a second)
  // and takes the kernel where it is faster; kAlways and kNever are for tests and for
  // benchmarks that compare the two in one run.
  enum class SmallBatchGemm { kMeasured, kAlways, kNever };
  SmallBatchGemm small_batch_gemm = SmallBatchGemm::kMeasured;
  // On a GPU: chunks of 2 to kDecodeRowsMaxChunkTokens tokens (speculative verification)
  // attend as decode rows, in the batched kernel and the decode graphs. Off: they attend as
  // prompt chunks do, a gather and an attention call each (benchmarks compare the two; the
  // cloud's `verification_as_decode_rows` rules it out).
  bool verification_as_decode_rows = true;
};

// "measured", "always" or "never" as SubmodelOptions::SmallBatchGemm; anything else is
// InvalidArgument naming `key` (the config key or flag it came from).
absl::StatusOr<SubmodelOptions::SmallBatchGemm> ParseSmallBatchGemm(std::string_view name,
                                                                    std::string_view key);

// A weight matrix in one of the forms the runtime computes with: `dense` in the compute
// dtype (or bfloat16 under a float32 CPU submodel with bf16_weights), or `int8` with per-row
// scales (CPU float32 submodels; kernels/gemv_int8.h).
struct WeightMatrix {
  at::Tensor dense;
  kernels::Int8Matrix int8;
  // int8 or MXFP4: x is rounded to int8 too (kernels/gemv_w8a8.h, kernels/gemv_mxfp4.h)
  bool int8_activations = false;
  // bfloat16 `dense`: a prompt's rows are rounded to bfloat16 too (SubmodelOptions.
  // bf16_activations)
  bool bf16_activations = false;
  // gpt-oss's experts as released (kernels/gemv_mxfp4.h; CPU float32 submodels).
  kernels::Mxfp4Matrix mxfp4;
  // Bit r (1 <= r <= 8): a step of r rows takes the small-batch GEMM kernel instead of BLAS
  // (SubmodelOptions::small_batch_gemm; set at load on a GPU).
  uint32_t small_batch_rows = 0;

  bool defined() const { return dense.defined() || int8.defined() || mxfp4.defined(); }
  bool is_int8() const { return int8.defined(); }
  // Bytes as held: values and scales.
  int64_t bytes() const;
  // The matrix as float: `dense` itself, or int8's values times their scales (tests, tools).
  at::Tensor Dense() const;
};

struct DecoderLayerWeights {
  at::Tensor input_norm;  // [D]
  WeightMatrix qkv;       // [q + 2kv, D]: q_proj, k_proj, v_proj stacked, one GEMM
  at::Tensor qkv_bias;    // [q + 2kv] or undefined
  at::Tensor q_norm;      // [hd]: each query head's RMSNorm before rotary (Qwen3), or undefined
  at::Tensor k_norm;      // [hd]: each key head's (Qwen3), or undefined
  WeightMatrix o_proj;    // [D, q]
  at::Tensor o_bias;      // [D] or undefined (Llama with attention_bias)
  at::Tensor post_norm;   // [D]: the MLP's input norm (Gemma 3: pre_feedforward_layernorm)
  WeightMatrix gate_up;   // [2I, D]: gate_proj, up_proj stacked (undefined in a sparse layer)
  WeightMatrix down;      // [D, I]
  // A sparse layer's (ModelConfig::MoeLayer) router [E, D] and each expert's gate_up
  // [2I', D] and down [D, I'], I' = moe_intermediate_size; empty in a dense layer.
  WeightMatrix router;
  std::vector<WeightMatrix> expert_gate_up;
  std::vector<WeightMatrix> expert_down;
  // Qwen2-MoE's shared expert in a sparse layer: gate_up [2S, D], down [D, S], and its gate
  // [1, D]; undefined otherwise.
  WeightMatrix shared_gate_up;
  WeightMatrix shared_down;
  WeightMatrix shared_gate;
  // gpt-oss: the router's bias [E], each expert's gate_up bias [2I'] and down bias [D], and
  // attention's sink logit per query head [H]; undefined (empty) otherwise.
  at::Tensor router_bias;
  std::vector<at::Tensor> expert_gate_up_bias;
  std::vector<at::Tensor> expert_down_bias;
  at::Tensor sinks;
  bool sparse() const { return !expert_down.empty(); }
  // Gemma 3: attention's output normed before its residual add (its checkpoint's
  // post_attention_layernorm), and the MLP's (post_feedforward_layernorm); else undefined.
  at::Tensor attention_out_norm;  // [D]
  at::Tensor mlp_out_norm;        // [D]
};

// One sequence's part of a batched forward: `num_tokens` consecutive rows of the hidden
// states continue `cache` at position cache->length().
struct SequenceChunk {
  KvCache* cache = nullptr;
  int64_t num_tokens = 0;
};

// On a GPU, with every cache in one paged pool (the cloud's steps), a chunk of up to this many
// tokens attends as decode rows: a row per token, each seeing its own position and those
// before it (the K/V of the whole chunk is written first), in the batched paged-attention
// kernel and in the replayed decode graphs. A speculative verification chunk (the draft and
// one more, HAT's lambda + 1 <= 9 by default) is such a chunk; the alternative, a gather of
// its history and a masked attention call per chunk and layer, is ten or more launches and
// allocations each. Longer chunks (prompts) read their history once through that path.
inline constexpr int64_t kDecodeRowsMaxChunkTokens = 16;

// Every method that computes (Load's start-up work included) runs on options().device
// whatever the calling thread's current CUDA device is: each takes a device guard, as ATen's
// ops do, so that a middle on cuda:1 computes there from any thread (the custom kernels
// launch on the current device's current stream). A caller queuing its own work around these
// calls (copies into pinned staging, events, NCCL transfers) holds a c10::DeviceGuard for the
// submodel's device at the top of its thread.
class Submodel {
 public:
  // Whether `config`'s architecture computes on `device`: UNIMPLEMENTED naming the
  // architecture where it does not (Gemma 2 and 3: on the CPU only for now). Load checks it
  // before anything else; `tophat inspect` reports it.
  static absl::Status ArchitectureRunsOn(const ModelConfig& config, const at::Device& device);

  // Loads the tensors `spec` needs from `checkpoint`, checking every shape against `config`.
  // Errors name the file and tensor.
  // `shared_embedding` (may be null): a submodel of the same model, config and options whose
  // token embedding this one's embedding, and its LM head when the model ties them, share
  // instead of loading a second copy (the device's input and output submodels: a tied
  // embedding is a large part of a small model, 1 GiB of Llama 3.2 1B in float32).
  static absl::StatusOr<std::unique_ptr<Submodel>> Load(const ModelConfig& config,
                                                        const CheckpointReader& checkpoint,
                                                        const SubmodelSpec& spec,
                                                        const SubmodelOptions& options = {},
                                                        const Submodel* shared_embedding = nullptr);

  const ModelConfig& config() const { return config_; }
  const SubmodelSpec& spec() const { return spec_; }
  const SubmodelOptions& options() const { return options_; }
  // The longest chunk that attends as decode rows in a batched GPU step:
  // kDecodeRowsMaxChunkTokens, or 1 with SubmodelOptions::verification_as_decode_rows off.
  int64_t decode_row_chunk_tokens() const {
    return options_.verification_as_decode_rows ? kDecodeRowsMaxChunkTokens : 1;
  }
  int64_t max_context() const { return rope_.max_positions(); }

  // A contiguous KV cache for this submodel's layers; capacity defaults to max_context().
  KvCache NewCache(int64_t capacity = 0) const;
  // A growing contiguous KV cache (KvCache::Growing) of at most `max_capacity` positions
  // (default max_context()); Forward grows it as the sequence does.
  KvCache NewGrowingCache(int64_t max_capacity = 0, int64_t growth_step = 64) const;
  // A pool of KV blocks for this submodel's layers, in its dtype and on its device, for
  // paged caches (KvCache(pool)). Errors as KvBlockPool::Create.
  absl::StatusOr<std::shared_ptr<KvBlockPool>> NewPagedPool(int64_t num_blocks,
                                                            int64_t block_size) const;

  // token ids [T] (int64) -> hidden states [T, D]. Requires spec().embedding.
  absl::StatusOr<at::Tensor> Embed(const at::Tensor& token_ids) const;

  // Runs the decoder layers over `hidden` [T, D], where T is the sum of the chunks' token
  // counts, each chunk attending to its own cache. Appends K/V and advances every cache.
  // A chunk may have any length; this is what chunked prefill and multi-token verification
  // rely on. With no layers, returns `hidden` unchanged (and still advances the caches).
  // Caches may be contiguous or paged, mixed in one batch; a paged or fixed cache must
  // already hold room for its new positions (else ResourceExhausted, and no cache's length
  // changes); a growing cache is grown here.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& hidden,
                                     std::span<const SequenceChunk> chunks) const;
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& hidden, KvCache& cache) const;
  // The same step computed in `buffers` (NewStepBuffers), which after the first such step
  // allocates no tensor storage on a CPU (float32) or beyond cuBLAS's workspace on a GPU.
  // Returns rows [0, T) of buffers.residual: valid until the next step with these buffers.
  // `hidden` may be those very rows (the caller wrote its input there: nothing is copied)
  // or any [T, D] tensor, pinned host memory included (copied asynchronously). Errors as
  // above, and InvalidArgument when the buffers hold fewer than T rows or another dtype or
  // device.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& hidden,
                                     std::span<const SequenceChunk> chunks,
                                     StepBuffers& buffers) const;
  // The layers of a decode-only step whose every input is already in `buffers`: rows
  // [0, rows) of residual (the hidden states), positions, slots (a negative slot: a padding
  // row, whose K/V is not written), block_tables and seq_lens (0 for a padding row), all
  // over `pool`. Reads nothing from the host, allocates nothing, launches only on the
  // current stream, and does not advance any cache: what a CUDA graph captures
  // (models/runtime/decode_graphs.h). Errors: a CPU submodel, or a shape the fused kernels
  // do not take (FailedPrecondition / Internal).
  absl::Status DecodeStepInBuffers(const KvBlockPool& pool, int64_t rows,
                                   StepBuffers& buffers) const;
  // Buffers for steps of up to `max_tokens` rows over KV pools of `block_size` positions a
  // block. Throws as a tensor allocation does.
  StepBuffers NewStepBuffers(int64_t max_tokens, int64_t block_size = 16) const;

  // Final norm + LM head: hidden [T, D] -> logits [T, V] (float32). Requires spec().head.
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& hidden) const;

  // Turns the fused one-token CPU step (SubmodelOptions.fused_cpu_decode) on or off, for a
  // benchmark that times both paths on one loaded model. Not while a step runs.
  void SetFusedCpuDecode(bool on) { options_.fused_cpu_decode = on; }
  // Whether one-token steps of this submodel take the fused CPU step.
  bool fused_cpu_decode() const { return !fused_layers_.empty() && options_.fused_cpu_decode; }

  // Bytes of weights this submodel reads per decoded token (for bandwidth bounds): a sparse
  // layer's router and the token's K experts of the E.
  int64_t WeightBytes() const;
  // Bytes of weights a step reads that computed `experts_computed` experts over its sparse
  // layers (StepBuffers::experts_computed): a batch's tokens share some experts and not
  // others. WeightBytes() for a dense submodel.
  int64_t WeightBytesRead(int64_t experts_computed) const;
  // Bytes of weights this submodel holds: every expert, and the whole embedding table (once
  // when the head shares it). What placing it on a device costs in memory.
  int64_t StoredWeightBytes() const;

  const WeightMatrix& embedding() const { return embedding_; }
  const std::vector<DecoderLayerWeights>& layers() const { return layers_; }
  const at::Tensor& final_norm() const { return final_norm_; }
  const WeightMatrix& lm_head() const { return lm_head_; }
  // Whether the weight matrices are int8 (loaded so, or quantized at load).
  bool int8_weights() const;
  // Whether any matrix rounds its input to int8 (SubmodelOptions.int8_activations, which
  // int8 matrices and experts held in MXFP4 take).
  bool rounds_activations() const;

 private:
  Submodel(ModelConfig config, SubmodelSpec spec, SubmodelOptions options)
      : config_(std::move(config)), spec_(spec), options_(options) {}

  // Checks a step's inputs and makes room in growing caches; returns its token count.
  absl::StatusOr<int64_t> CheckStep(const at::Tensor& hidden,
                                    std::span<const SequenceChunk> chunks) const;

  // The per-step index tensors of a GPU forward whose chunks share one KV pool (else
  // `slots` is undefined and chunks are handled one by one): views of the step buffers,
  // uploaded once per Forward.
  struct DeviceBatch {
    const KvBlockPool* pool = nullptr;  // every chunk's
    at::Tensor slots;         // [T] int64: pool row (block * block_size + offset) of each new row
    int64_t decode_count = 0;  // decode rows: a row per token of the chunks of up to
                               // decode_row_chunk_tokens() tokens
    int64_t decode_first_row = -1;
    bool decode_rows_contiguous = true;  // decode_rows == first, first+1, ...
    at::Tensor decode_index;  // decode_rows on the device, when not contiguous
    at::Tensor decode_q;      // their gathered queries and attention, when not contiguous
    at::Tensor decode_out;
    at::Tensor block_tables;  // [decode rows, max blocks] int32
    at::Tensor seq_lens;      // [decode rows] int32: positions each attends, its own included
    at::Tensor partials;      // the decode kernel's split workspace (StepBuffers)
    at::Tensor split_counters;  // and its split counters (the same)
    // [chunks longer than one row, max blocks] int32: their block tables on the device, in
    // chunk order, uploaded once for every layer's gather; undefined when one is too long.
    at::Tensor chunk_tables;
  };
  DeviceBatch PrepareDeviceBatch(std::span<const SequenceChunk> chunks, int64_t total,
                                 StepBuffers& buffers) const;
  // Every decoder layer over rows [0, total) of `buffers`, the residual stream in
  // buffers.residual; throws c10::Error. `graph`: a captured decode step (no chunks), which
  // throws where an eager step would fall back to per-chunk ops.
  // `local_cos`/`local_sin`: the rows of the sliding layers' table (rope_local_), or
  // undefined when the model has none.
  void RunLayers(int64_t total, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& local_cos, const at::Tensor& local_sin,
                 const DeviceBatch& device_batch, std::span<const SequenceChunk> chunks,
                 StepBuffers& buffers, bool graph) const;
  // A sparse layer's MLP of rows [0, total) of `h` into `out` ([total, D]), in the step's
  // buffers: the router picks each row's experts, the rows are grouped by expert (a counting
  // sort on the host: a sparse model computes on the CPU), each expert computes its rows in
  // one GEMM pair, and the weighted outputs are summed back into their tokens' rows in
  // expert order, as transformers sums them.
  void MixExperts(const DecoderLayerWeights& w, const at::Tensor& h, int64_t total,
                  StepBuffers& buffers, at::Tensor& out) const;
  // One layer of a DeviceBatch: writes every new K/V row with one scatter (unless k is
  // undefined: RotaryQkvToCache wrote them), attends the decode rows in one kernel launch,
  // and the longer chunks one by one (AttendChunk). False when the decode rows did not take
  // the batched kernel and `chunks` is empty (nothing attended them).
  bool AttendDeviceBatch(const DeviceBatch& batch, std::span<const SequenceChunk> chunks,
                         int64_t layer, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, at::Tensor& attention) const;

  // Fill fused_layers_ and fused_head_ from the loaded weights (end of Load).
  void PrepareFusedLayers();
  void PrepareFusedHead();
  // Sets each layer matrix's small_batch_rows from SubmodelOptions::small_batch_gemm (a GPU
  // submodel in float16/bfloat16; nothing elsewhere). A timing that fails leaves cuBLAS.
  void ChooseSmallBatchGemms();
  // Whether a step of these chunks takes the fused one-token CPU step: one chunk of one
  // token over a float32 CPU cache, no sliding window in reach, weights it reads.
  bool FusedDecodeTakes(std::span<const SequenceChunk> chunks) const;
  // That step over x [hidden] (the residual stream, in place); the cache has room (CheckStep)
  // and is advanced by the caller.
  void FusedDecode(const KvCache& cache, float* x) const;

  // Attention of the chunk's queries q [n, H, hd] (positions past..past+n-1, past =
  // cache.length()) against positions [0, past + n) of `layer`, already written.
  // `device_ids`: the cache's block ids on the device (DeviceBatch::chunk_tables), or
  // undefined.
  void AttendChunk(const at::Tensor& q, const KvCache& cache, int64_t layer, at::Tensor out,
                   const at::Tensor& device_ids = {}) const;

  ModelConfig config_;
  SubmodelSpec spec_;
  SubmodelOptions options_;
  RopeTable rope_;
  RopeTable rope_local_;    // the sliding layers' (ModelConfig::rope_local_theta), or empty
  WeightMatrix embedding_;  // [V, D]
  std::vector<DecoderLayerWeights> layers_;
  at::Tensor final_norm_;  // [D]
  WeightMatrix lm_head_;    // [V, D]
  // The layers and head as the fused CPU step reads them (FusedDecodeTakes), filled at load
  // when every matrix is of a form it takes (else empty, and the head's values null); the
  // layers' K/V rows are set per step.
  std::vector<kernels::DecodeLayer> fused_layers_;
  kernels::DecodeShape fused_shape_;
  kernels::RowMatrix fused_head_;
};

// Loads config.json + weights of a Hugging Face checkpoint directory as one full model.
absl::StatusOr<std::unique_ptr<Submodel>> LoadFullModel(const std::filesystem::path& dir,
                                                        const SubmodelOptions& options = {});

}  // namespace tophat
