#include "models/runtime/submodel.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/decode_attention.h"
#include "kernels/gemm_f32.h"
#include "kernels/gemv.h"
#include "kernels/gemv_w8a8.h"
#include "kernels/prompt_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/small_batch_gemm.h"
#include "models/runtime/fused_experts.h"
#include "models/runtime/gemm_tactics.h"
#include "spdlog/spdlog.h"

namespace tophat {
namespace {

// fn(matrix, expert) for each weight matrix of `layers` (attention, MLP, router, shared
// expert, and each routed expert's, `expert` true), not the embedding or the head.
template <typename Fn>
void ForEachLayerMatrix(std::vector<DecoderLayerWeights>& layers, const Fn& fn) {
  for (DecoderLayerWeights& w : layers) {
    for (WeightMatrix* m : {&w.qkv, &w.o_proj, &w.gate_up, &w.down, &w.router, &w.shared_gate_up,
                            &w.shared_down, &w.shared_gate}) {
      fn(*m, false);
    }
    for (auto* experts : {&w.expert_gate_up, &w.expert_down}) {
      for (WeightMatrix& m : *experts) fn(m, true);
    }
  }
}

// One row (a decode step) streams the weights through the GEMV kernel; more rows are a
// GEMM and go to BLAS. int8 matrices take their own kernel (few rows) or are dequantized
// for BLAS (many).
at::Tensor Linear(const at::Tensor& x, const WeightMatrix& w, const at::Tensor& bias = {}) {
  if (w.is_int8()) {
    return w.int8_activations ? kernels::LinearW8A8(x, w.int8, bias)
                              : kernels::LinearInt8(x, w.int8, bias);
  }
  if (w.dense.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kFloat && x.is_cpu()) {
    return kernels::LinearBf16(x, w.dense, bias, w.bf16_activations);
  }
  if (x.size(0) == 1) return kernels::LinearSingleRow(x, w.dense, bias);
  return bias.defined() ? at::linear(x, w.dense, bias) : at::linear(x, w.dense);
}

// Whether `rows` activation rows through `w` take the small-batch kernel
// (ChooseSmallBatchGemms measured it faster than cuBLAS for them).
bool UsesSmallBatchGemm(const WeightMatrix& w, int64_t rows) {
  return !w.is_int8() && rows >= 1 && rows <= kernels::kSmallBatchGemmMaxRows &&
         ((w.small_batch_rows >> rows) & 1u) != 0;
}

// The same into `out` ([rows, N] contiguous), allocating nothing: one float32 CPU row takes
// the GEMV kernel, anything else BLAS (cuBLAS on a GPU) writing into `out` in place.
void LinearOut(const at::Tensor& x, const WeightMatrix& w, const at::Tensor& bias,
               at::Tensor& out) {
  if (w.mxfp4.defined()) {
    if (w.int8_activations) {
      kernels::LinearMxfp4A8Out(x, w.mxfp4, bias, out);
    } else {
      kernels::LinearMxfp4Out(x, w.mxfp4, bias, out);
    }
  } else if (w.is_int8()) {
    if (w.int8_activations) {
      kernels::LinearW8A8Out(x, w.int8, bias, out);
    } else {
      kernels::LinearInt8Out(x, w.int8, bias, out);
    }
  } else if (w.dense.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kFloat &&
             x.is_cpu()) {
    kernels::LinearBf16Out(x, w.dense, bias, out, w.bf16_activations);
  } else if (x.size(0) == 1 && x.is_cpu() && x.scalar_type() == at::kFloat) {
    kernels::LinearSingleRowOut(x, w.dense, bias, out);
  } else if (x.size(0) <= kernels::kFewRowsMax && x.is_cpu() &&
             kernels::LinearFewRowsOut(x, w.dense, bias, out)) {
    // A few float32 rows (a small batch, a verification chunk, an expert's routed rows): the
    // weight read once for all of them, where BLAS would pack it first.
  } else if (x.is_cpu() && kernels::LinearF32PromptIfChosenOut(x, w.dense, bias, out)) {
    // A float32 prompt on a CPU whose BLAS leaves AVX-512 unused (kernels/gemm_f32.h).
  } else if (UsesSmallBatchGemm(w, x.size(0)) &&
             kernels::SmallBatchGemmOut(x, w.dense, bias, out)) {
    // Measured faster than cuBLAS for this shape and row count (ChooseSmallBatchGemms).
  } else if (bias.defined()) {
    at::addmm_out(out, bias, x, w.dense.t());
  } else {
    at::mm_out(out, x, w.dense.t());
  }
}

// The final norm and the LM head, with float32 logits whatever the compute dtype. Rounded to
// bfloat16, a logit near 14 (the toy model's top logits) is a multiple of 1/16, so greedy
// choices whose float32 margin is under a few hundredths tie or swap. Here the head keeps the
// bfloat16 weights but multiplies and sums in float32, and the normed state stays float32
// too. On the CPU LinearBf16 takes float32 activations as they are, widening each weight
// exactly as it streams it. cuBLAS multiplies only bfloat16/float16 operands (into float32),
// so on a GPU the normed state goes in as two rows of the compute dtype, its rounding and
// what that rounding left (SplitForHalfProducts), whose products are summed: 16 mantissa bits
// of the normed state instead of 8, at the cost of twice the rows of a GEMM that reads the
// same weights (a decode step's head is bound by reading them). The all-bfloat16 serving
// test's agreement with float32 greedy (toy model, 2,400 tokens): 98.12% with bfloat16
// logits, 98.92% with float32 products of the normed state rounded once, 99.25% as here.
// float16 on the CPU has no such kernel and keeps float16 logits (ten mantissa bits, eight
// times finer).
at::Tensor NormHeadLogits(const at::Tensor& hidden, const at::Tensor& norm, double eps,
                          const WeightMatrix& head) {
  const at::ScalarType dtype = hidden.scalar_type();
  const bool dense_half = !head.is_int8() && head.dense.scalar_type() == dtype &&
                          (dtype == at::kBFloat16 || dtype == at::kHalf);
  if (dense_half && hidden.is_cuda()) {
    const int64_t rows = hidden.size(0);
    const at::Tensor products =
        at::mm(SplitForHalfProducts(RmsNorm(hidden.to(at::kFloat), norm.to(at::kFloat), eps),
                                    dtype),
               head.dense.t(), at::kFloat);
    return products.narrow(0, 0, rows).add_(products.narrow(0, rows, rows));
  }
  if (dense_half && dtype == at::kBFloat16 && hidden.is_cpu()) {
    return kernels::LinearBf16(RmsNorm(hidden.to(at::kFloat), norm.to(at::kFloat), eps),
                               head.dense);
  }
  return Linear(RmsNorm(hidden, norm, eps), head).to(at::kFloat);
}

// Each head's rows of a q_proj or k_proj matrix (or bias) in the runtime's order of a head's
// dimensions (RotaryHeadOrder): a new tensor. (Partial rotary is Phi-3's, which has no head
// norms to reorder.)
at::Tensor InHeadOrder(const at::Tensor& rows, const at::Tensor& order) {
  const int64_t hd = order.size(0);
  if (rows.dim() == 1) return rows.view({-1, hd}).index_select(1, order).reshape({-1});
  return rows.view({-1, hd, rows.size(1)}).index_select(1, order).reshape({-1, rows.size(1)});
}

void InHeadOrder(WeightMatrix& m, const at::Tensor& order) {
  if (m.is_int8()) {
    m.int8.values = InHeadOrder(m.int8.values, order.to(m.int8.values.device()));
    m.int8.scale = InHeadOrder(m.int8.scale, order.to(m.int8.scale.device()));
  } else {
    m.dense = InHeadOrder(m.dense, order.to(m.dense.device()));
  }
}

// A matrix as the fused CPU step reads it (kernels/decode_step.h), when it is of a form that
// step takes: int8 on the CPU, or dense float32 / bfloat16 with contiguous rows.
std::optional<kernels::RowMatrix> RowMatrixOf(const WeightMatrix& w) {
  using Kind = kernels::RowMatrix::Kind;
  if (w.is_int8()) {
    const at::Tensor& values = w.int8.values;
    if (!values.is_cpu() || values.dim() != 2 || values.stride(1) != 1 ||
        !w.int8.scale.is_contiguous()) {
      return std::nullopt;
    }
    return kernels::RowMatrix{.kind = w.int8_activations ? Kind::kInt8Activations : Kind::kInt8,
                              .values = values.data_ptr(),
                              .scale = w.int8.scale.data_ptr<float>(),
                              .rows = values.size(0),
                              .cols = values.size(1),
                              .row_stride = values.stride(0)};
  }
  const at::Tensor& dense = w.dense;
  if (!dense.defined() || !dense.is_cpu() || dense.dim() != 2 || dense.stride(1) != 1 ||
      (dense.scalar_type() != at::kFloat && dense.scalar_type() != at::kBFloat16)) {
    return std::nullopt;
  }
  return kernels::RowMatrix{
      .kind = dense.scalar_type() == at::kFloat ? Kind::kFloat32 : Kind::kBfloat16,
      .values = dense.data_ptr(),
      .rows = dense.size(0),
      .cols = dense.size(1),
      .row_stride = dense.stride(0)};
}

// A float32 CPU vector's data, or null when it is not one (an undefined bias).
const float* FloatData(const at::Tensor& t) {
  return t.defined() && t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()
             ? t.data_ptr<float>()
             : nullptr;
}

std::string ShapeString(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? ", " : "", t.size(i));
  return s + "]";
}

}  // namespace

absl::Status CheckDeviceOnHost(c10::Device device) {
  if (!device.is_cuda()) return absl::OkStatus();
  const std::string name = device.str();
  // at::hasCUDA(): a LibTorch built with CUDA that finds a GPU (no context is made).
  const int64_t count = at::hasCUDA() ? static_cast<int64_t>(at::getNumGPUs()) : 0;
  if (count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "device ", name, " is not usable: this process sees no CUDA device (no NVIDIA driver "
        "or GPU, or CUDA_VISIBLE_DEVICES hides them; nvidia-smi shows what the driver sees)"));
  }
  if (device.has_index() && device.index() >= count) {
    return absl::UnavailableError(absl::StrCat("device ", name, " is not on this host: its ",
                                               "driver shows ", count, " CUDA device(s), cuda:0",
                                               count > 1 ? absl::StrCat(" to cuda:", count - 1)
                                                         : std::string()));
  }
  return absl::OkStatus();
}

absl::Status Submodel::ArchitectureRunsOn(const ModelConfig& config, const at::Device& device) {
  if (config.num_experts > 0 && !device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        std::string(ArchitectureName(config.architecture)), " runs on the CPU only for now (",
        device.str(),
        " asked): its mixture-of-experts layers have no GPU path yet (a grouped GEMM over "
        "the experts, and routing on the device)"));
  }
  if (config.gpt_oss() && !device.is_cpu()) {
    return absl::UnimplementedError(
        absl::StrCat("GptOssForCausalLM runs on the CPU only for now (", device.str(),
                     " asked): its attention sinks and experts have no GPU path yet"));
  }
  if (config.gemma() && !device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        std::string(ArchitectureName(config.architecture)), " runs on the CPU only for now (",
        device.str(),
        " asked): its layer's norms around each sublayer, GELU, soft-capping and per-layer "
        "windows and rotary bases have no GPU path yet"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Submodel>> Submodel::Load(const ModelConfig& config,
                                                         const CheckpointReader& checkpoint,
                                                         const SubmodelSpec& spec,
                                                         const SubmodelOptions& requested,
                                                         const Submodel* shared_embedding) {
  // "cuda" names the current GPU, while every tensor's device carries its index ("cuda:0"):
  // the options keep the indexed name, so that comparing a tensor's device with them holds.
  SubmodelOptions options = requested;
  TOPHAT_RETURN_IF_ERROR(ArchitectureRunsOn(config, options.device));
  if (!options.device.is_cpu()) {
    // Before anything loads, and naming the device: a GPU gone after a crash (the restart
    // after "is lost"), a driver missing, an index past the host's GPUs.
    TOPHAT_RETURN_IF_ERROR(CheckDeviceOnHost(options.device));
    const std::string name = options.device.str();
    absl::Status resolved =
        CatchExceptions(absl::StrCat("device ", name, " is not usable"), [&] {
          options.device = at::empty({0}, at::TensorOptions().device(options.device)).device();
        });
    if (!resolved.ok()) {
      return absl::UnavailableError(
          absl::StrCat(resolved.message(), " (nvidia-smi shows what the driver sees)"));
    }
  }
  // What loading computes and captures on the device (the small-batch GEMM timings among
  // it) runs there whatever this thread's current device is (submodel.h, class comment).
  const c10::DeviceGuard device_guard(options.device);
  if (spec.layers.begin < 0 || spec.layers.end > config.num_hidden_layers ||
      spec.layers.begin > spec.layers.end) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer range [", spec.layers.begin, ", ", spec.layers.end,
                     ") is outside the model's ", config.num_hidden_layers, " layers"));
  }
  if (options.max_context < 1) {
    return absl::InvalidArgumentError("max_context must be >= 1");
  }
  auto model = std::unique_ptr<Submodel>(new Submodel(config, spec, options));
  const int64_t d = config.hidden_size;
  const at::ScalarType dtype = options.dtype;
  auto load = [&](const std::string& name, std::vector<int64_t> shape)
      -> absl::StatusOr<at::Tensor> {
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor t, checkpoint.Load(name, shape, dtype));
    return t.to(options.device);
  };

  absl::Status status = CatchExceptions("loading weights", [&] {
    const int64_t positions = std::min(options.max_context, config.max_position_embeddings);
    model->rope_ = RopeTable::Create(config, positions, options.device);
    if (config.rope_local_theta) {
      model->rope_local_ = RopeTable::CreateLocal(config, positions, options.device);
    }
  });
  TOPHAT_RETURN_IF_ERROR(status);

  // A norm's weight. Gemma's norms scale by 1 + weight, computed in float32 as transformers
  // does; the 1 is added here, before the compute dtype, and the norm kernels stay one.
  auto load_norm = [&](const std::string& name, int64_t size) -> absl::StatusOr<at::Tensor> {
    if (!config.gemma()) {
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor t, load(name, {size}));
      return t.contiguous();
    }
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor t, checkpoint.Load(name, {size}, at::kFloat));
    return (t + 1.0).to(options.device, dtype).contiguous();
  };

  // int8 is computed on a CPU in float32 (kernels/gemv_int8.h); elsewhere an int8 matrix is
  // dequantized as it loads.
  const bool int8_compute = options.device.is_cpu() && dtype == at::kFloat;
  // Float matrices are held in this dtype: the compute dtype, or bfloat16 with bf16_weights.
  const at::ScalarType matrix_dtype =
      options.bf16_weights && int8_compute ? at::kBFloat16 : dtype;
  // Copies detach the matrices from the file mapping (no page faults at step time) and,
  // on CPU, put them on huge pages, which decode streams faster.
  auto own = [&](const at::Tensor& t) {
    return options.huge_pages ? kernels::CopyToHugePages(t) : t.clone();
  };
  // A weight matrix as the checkpoint stores it: float, or int8 values with a float32
  // "<name>_scale" of one scale per row. Not yet owned (see `own`).
  auto load_matrix = [&](const std::string& name,
                         std::vector<int64_t> shape) -> absl::StatusOr<WeightMatrix> {
    TOPHAT_ASSIGN_OR_RETURN(SafetensorsDType stored, checkpoint.StoredDType(name));
    if (stored != SafetensorsDType::kI8) {
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor dense, checkpoint.Load(name, shape, matrix_dtype));
      dense = dense.to(options.device);
      if (options.quantize_int8 && int8_compute) {
        WeightMatrix matrix;
        TOPHAT_RETURN_IF_ERROR(CatchExceptions(absl::StrCat("quantizing '", name, "'"), [&] {
          matrix.int8 = kernels::QuantizeInt8PerRow(dense);
        }));
        return matrix;
      }
      return WeightMatrix{.dense = dense};
    }
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor values, checkpoint.LoadAsStored(name));
    TOPHAT_ASSIGN_OR_RETURN(const std::filesystem::path file, checkpoint.FileOf(name));
    if (values.sizes() != at::IntArrayRef(shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.string(), ": tensor '", name, "' has shape ", ShapeString(values), ", expected ",
          ShapeString(at::empty(shape, at::kMeta))));
    }
    const std::string scale_name = name + "_scale";
    if (!checkpoint.Has(scale_name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.string(), ": tensor '", name, "' is int8 but '", scale_name,
          "' (its float32 scale per row) is missing"));
    }
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor scale, checkpoint.Load(scale_name, {shape[0]}, at::kFloat));
    WeightMatrix matrix;
    matrix.int8 = {.values = values, .scale = scale.contiguous()};
    if (int8_compute) return matrix;
    TOPHAT_RETURN_IF_ERROR(CatchExceptions(absl::StrCat("dequantizing '", name, "'"), [&] {
      matrix.dense = matrix.int8.Dequantize().to(options.device, dtype);
    }));
    matrix.int8 = {};
    return matrix;
  };
  // A float matrix computed at load (a fused expert's slice), held as load_matrix holds one.
  auto matrix_of = [&](const std::string& name, at::Tensor dense) -> absl::StatusOr<WeightMatrix> {
    WeightMatrix matrix;
    TOPHAT_RETURN_IF_ERROR(CatchExceptions(absl::StrCat("holding '", name, "'"), [&] {
      dense = dense.to(options.device, matrix_dtype);
      if (options.quantize_int8 && int8_compute) {
        matrix.int8 = kernels::QuantizeInt8PerRow(dense);
      } else {
        matrix.dense = dense;
      }
    }));
    return matrix;
  };
  // Stacked matrices (q, k, v into one; gate and up) in one owned matrix.
  auto stack = [&](std::vector<WeightMatrix> parts) -> WeightMatrix {
    const bool all_int8 = std::all_of(parts.begin(), parts.end(),
                                      [](const WeightMatrix& m) { return m.is_int8(); });
    if (all_int8) {
      std::vector<kernels::Int8Matrix> int8;
      for (WeightMatrix& part : parts) int8.push_back(std::move(part.int8));
      kernels::Int8Matrix stacked = kernels::ConcatRows(int8);
      stacked.values = own(stacked.values);
      return WeightMatrix{.int8 = std::move(stacked)};
    }
    // A mix (a checkpoint with some matrices int8): all as float.
    std::vector<at::Tensor> dense;
    for (const WeightMatrix& part : parts) {
      dense.push_back(part.Dense().to(options.device, matrix_dtype));
    }
    return WeightMatrix{.dense = own(dense.size() == 1 ? dense[0] : at::cat(dense))};
  };

  // The other submodel's table, when it has one: its embedding, or its head if tied.
  WeightMatrix shared_table;
  if (shared_embedding != nullptr) {
    if (shared_embedding->options_.dtype != options.dtype ||
        shared_embedding->options_.device != options.device ||
        shared_embedding->config_.vocab_size != config.vocab_size ||
        shared_embedding->config_.hidden_size != d) {
      return absl::InvalidArgumentError(
          "a shared embedding must come from a submodel of the same model, dtype and device");
    }
    shared_table = shared_embedding->embedding_.defined() ? shared_embedding->embedding_
                   : config.tie_word_embeddings         ? shared_embedding->lm_head_
                                                        : WeightMatrix();
  }
  if (spec.embedding) {
    if (shared_table.defined()) {
      model->embedding_ = shared_table;
    } else {
      TOPHAT_ASSIGN_OR_RETURN(model->embedding_,
                              load_matrix("model.embed_tokens.weight", {config.vocab_size, d}));
    }
  }
  const std::vector<int64_t> rotary_order = RotaryHeadOrder(config);
  const at::Tensor head_order =
      rotary_order.empty() ? at::Tensor() : at::tensor(rotary_order, at::kLong);
  for (int64_t i = spec.layers.begin; i < spec.layers.end; ++i) {
    auto name = [i](std::string_view suffix) { return LayerTensorName(i, suffix); };
    DecoderLayerWeights w;
    TOPHAT_ASSIGN_OR_RETURN(w.input_norm, load_norm(name("input_layernorm.weight"), d));
    TOPHAT_ASSIGN_OR_RETURN(WeightMatrix q, load_matrix(name("self_attn.q_proj.weight"),
                                                        {config.q_size(), d}));
    TOPHAT_ASSIGN_OR_RETURN(WeightMatrix k, load_matrix(name("self_attn.k_proj.weight"),
                                                        {config.kv_size(), d}));
    TOPHAT_ASSIGN_OR_RETURN(WeightMatrix v, load_matrix(name("self_attn.v_proj.weight"),
                                                        {config.kv_size(), d}));
    if (config.attention_bias) {
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor qb, load(name("self_attn.q_proj.bias"),
                                                  {config.q_size()}));
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor kb, load(name("self_attn.k_proj.bias"),
                                                  {config.kv_size()}));
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor vb, load(name("self_attn.v_proj.bias"),
                                                  {config.kv_size()}));
      w.qkv_bias = at::cat({qb, kb, vb});
    }
    TOPHAT_ASSIGN_OR_RETURN(WeightMatrix o, load_matrix(name("self_attn.o_proj.weight"),
                                                        {d, config.q_size()}));
    if (config.qk_norm()) {
      TOPHAT_ASSIGN_OR_RETURN(w.q_norm,
                              load_norm(name("self_attn.q_norm.weight"), config.head_dim));
      TOPHAT_ASSIGN_OR_RETURN(w.k_norm,
                              load_norm(name("self_attn.k_norm.weight"), config.head_dim));
    }
    if (config.o_bias()) {
      TOPHAT_ASSIGN_OR_RETURN(w.o_bias, load(name("self_attn.o_proj.bias"), {d}));
    }
    if (config.gpt_oss()) {
      // Softmax arithmetic is float32 whatever the compute dtype (AttendChunk).
      TOPHAT_ASSIGN_OR_RETURN(
          at::Tensor sinks,
          checkpoint.Load(name("self_attn.sinks"), {config.num_attention_heads}, at::kFloat));
      w.sinks = sinks.to(options.device).contiguous();
    }
    if (head_order.defined()) {
      // Partial rotary: q's and k's heads in the order the rotary kernels turn (layers.h).
      TOPHAT_RETURN_IF_ERROR(CatchExceptions(name("self_attn (rotary order)"), [&] {
        InHeadOrder(q, head_order);
        InHeadOrder(k, head_order);
        if (w.qkv_bias.defined()) {
          const at::Tensor order = head_order.to(w.qkv_bias.device());
          w.qkv_bias =
              at::cat({InHeadOrder(w.qkv_bias.narrow(0, 0, config.q_size()), order),
                       InHeadOrder(w.qkv_bias.narrow(0, config.q_size(), config.kv_size()), order),
                       w.qkv_bias.narrow(0, config.q_size() + config.kv_size(), config.kv_size())});
        }
      }));
    }
    if (config.gemma()) {
      // Gemma's post_attention_layernorm norms attention's output; the MLP's input norm is
      // pre_feedforward_layernorm.
      TOPHAT_ASSIGN_OR_RETURN(w.attention_out_norm,
                              load_norm(name("post_attention_layernorm.weight"), d));
      TOPHAT_ASSIGN_OR_RETURN(w.post_norm, load_norm(name("pre_feedforward_layernorm.weight"), d));
      TOPHAT_ASSIGN_OR_RETURN(w.mlp_out_norm,
                              load_norm(name("post_feedforward_layernorm.weight"), d));
    } else {
      TOPHAT_ASSIGN_OR_RETURN(w.post_norm, load_norm(name("post_attention_layernorm.weight"), d));
    }
    if (config.MoeLayer(i)) {
      const int64_t width = config.moe_intermediate_size;
      TOPHAT_ASSIGN_OR_RETURN(WeightMatrix router,
                              load_matrix(RouterTensorName(config, i), {config.num_experts, d}));
      w.router = stack({std::move(router)});
      if (config.gpt_oss()) {
        TOPHAT_ASSIGN_OR_RETURN(w.router_bias, load(name("mlp.router.bias"), {config.num_experts}));
        w.router_bias = w.router_bias.contiguous();
      }
      // Stored in MXFP4 (as released), kept so where the step computes in float32 on the CPU.
      const bool mxfp4 = config.gpt_oss() && options.mxfp4_experts && int8_compute &&
                         FusedExpertsInMxfp4(checkpoint, i);
      for (int64_t e = 0; mxfp4 && e < config.num_experts; ++e) {
        TOPHAT_ASSIGN_OR_RETURN(Mxfp4ExpertTensors expert,
                                LoadFusedExpertMxfp4(checkpoint, config, i, e));
        w.expert_gate_up.push_back(WeightMatrix{.mxfp4 = std::move(expert.gate_up)});
        w.expert_down.push_back(WeightMatrix{.mxfp4 = std::move(expert.down)});
        w.expert_gate_up_bias.push_back(std::move(expert.gate_up_bias));
        w.expert_down_bias.push_back(std::move(expert.down_bias));
      }
      for (int64_t e = 0; config.gpt_oss() && !mxfp4 && e < config.num_experts; ++e) {
        // Stored fused, all experts in one tensor (fused_experts.h), read one at a time.
        TOPHAT_ASSIGN_OR_RETURN(ExpertTensors expert,
                                LoadFusedExpert(checkpoint, config, i, e, at::kFloat));
        TOPHAT_ASSIGN_OR_RETURN(
            WeightMatrix gate_up,
            matrix_of(FusedExpertsTensorName(i, "gate_up_proj"), std::move(expert.gate_up)));
        TOPHAT_ASSIGN_OR_RETURN(WeightMatrix down, matrix_of(FusedExpertsTensorName(i, "down_proj"),
                                                             std::move(expert.down)));
        w.expert_gate_up.push_back(stack({std::move(gate_up)}));
        w.expert_down.push_back(stack({std::move(down)}));
        w.expert_gate_up_bias.push_back(expert.gate_up_bias.to(options.device, dtype).contiguous());
        w.expert_down_bias.push_back(expert.down_bias.to(options.device, dtype).contiguous());
      }
      for (int64_t e = 0; !config.gpt_oss() && e < config.num_experts; ++e) {
        auto expert = [&](ExpertMatrix role) { return ExpertTensorName(config, i, e, role); };
        TOPHAT_ASSIGN_OR_RETURN(WeightMatrix gate,
                                load_matrix(expert(ExpertMatrix::kGate), {width, d}));
        TOPHAT_ASSIGN_OR_RETURN(WeightMatrix up,
                                load_matrix(expert(ExpertMatrix::kUp), {width, d}));
        TOPHAT_ASSIGN_OR_RETURN(WeightMatrix down,
                                load_matrix(expert(ExpertMatrix::kDown), {d, width}));
        w.expert_gate_up.push_back(stack({std::move(gate), std::move(up)}));
        w.expert_down.push_back(stack({std::move(down)}));
      }
      if (const int64_t shared = config.shared_expert_intermediate_size; shared > 0) {
        TOPHAT_ASSIGN_OR_RETURN(
            WeightMatrix gate,
            load_matrix(SharedExpertTensorName(i, ExpertMatrix::kGate), {shared, d}));
        TOPHAT_ASSIGN_OR_RETURN(
            WeightMatrix up,
            load_matrix(SharedExpertTensorName(i, ExpertMatrix::kUp), {shared, d}));
        TOPHAT_ASSIGN_OR_RETURN(
            WeightMatrix down,
            load_matrix(SharedExpertTensorName(i, ExpertMatrix::kDown), {d, shared}));
        TOPHAT_ASSIGN_OR_RETURN(WeightMatrix shared_gate,
                                load_matrix(SharedExpertGateTensorName(i), {1, d}));
        w.shared_gate_up = stack({std::move(gate), std::move(up)});
        w.shared_down = stack({std::move(down)});
        w.shared_gate = stack({std::move(shared_gate)});
      }
    } else {
      TOPHAT_ASSIGN_OR_RETURN(WeightMatrix gate, load_matrix(name("mlp.gate_proj.weight"),
                                                             {config.intermediate_size, d}));
      TOPHAT_ASSIGN_OR_RETURN(
          WeightMatrix up, load_matrix(name("mlp.up_proj.weight"), {config.intermediate_size, d}));
      TOPHAT_ASSIGN_OR_RETURN(WeightMatrix down, load_matrix(name("mlp.down_proj.weight"),
                                                             {d, config.intermediate_size}));
      w.gate_up = stack({std::move(gate), std::move(up)});
      w.down = stack({std::move(down)});
    }
    w.qkv = stack({std::move(q), std::move(k), std::move(v)});
    w.o_proj = stack({std::move(o)});
    model->layers_.push_back(std::move(w));
  }
  if (spec.head) {
    TOPHAT_ASSIGN_OR_RETURN(model->final_norm_, load_norm("model.norm.weight", d));
    if (config.tie_word_embeddings) {
      if (model->embedding_.defined()) {
        model->lm_head_ = model->embedding_;
      } else if (shared_table.defined()) {
        model->lm_head_ = shared_table;
      } else {
        TOPHAT_ASSIGN_OR_RETURN(model->lm_head_,
                                load_matrix("model.embed_tokens.weight", {config.vocab_size, d}));
      }
    } else {
      TOPHAT_ASSIGN_OR_RETURN(model->lm_head_,
                              load_matrix("lm_head.weight", {config.vocab_size, d}));
    }
    // The head is streamed whole every token: it goes on huge pages (the embedding, with it,
    // when they are one table). A table shared from another submodel is there already.
    const bool from_other = shared_table.defined() &&
                            model->lm_head_.dense.is_same(shared_table.dense) &&
                            model->lm_head_.int8.values.is_same(shared_table.int8.values);
    if (options.huge_pages && !from_other) {
      const bool shared = model->lm_head_.dense.is_same(model->embedding_.dense) &&
                          model->lm_head_.int8.values.is_same(model->embedding_.int8.values);
      WeightMatrix& head = model->lm_head_;
      if (head.is_int8()) {
        head.int8.values = kernels::CopyToHugePages(head.int8.values);
      } else {
        head.dense = kernels::CopyToHugePages(head.dense);
      }
      if (shared) model->embedding_ = head;
    }
  }
  if (options.int8_activations) {
    // gpt-oss's experts held in MXFP4 take int8 activations too (kernels/gemv_mxfp4.h).
    ForEachLayerMatrix(model->layers_, [](WeightMatrix& m, bool expert) {
      m.int8_activations = m.is_int8() || (expert && m.mxfp4.defined());
    });
    model->lm_head_.int8_activations = model->lm_head_.is_int8();
  }
  if (options.bf16_activations) {
    // The layers' matrices; the LM head keeps float32 products (NormHeadLogits says why).
    ForEachLayerMatrix(model->layers_, [](WeightMatrix& m, bool) {
      m.bf16_activations =
          m.dense.defined() && m.dense.scalar_type() == at::kBFloat16 && m.dense.is_cpu();
    });
  }
  model->PrepareFusedLayers();
  model->PrepareFusedHead();
  model->ChooseSmallBatchGemms();
  return model;
}

absl::StatusOr<SubmodelOptions::SmallBatchGemm> ParseSmallBatchGemm(std::string_view name,
                                                                    std::string_view key) {
  using Mode = SubmodelOptions::SmallBatchGemm;
  if (name == "measured") return Mode::kMeasured;
  if (name == "always") return Mode::kAlways;
  if (name == "never") return Mode::kNever;
  return absl::InvalidArgumentError(absl::StrCat(std::string(key), ": \"", std::string(name),
                                                 "\" is none of \"measured\", \"always\", "
                                                 "\"never\""));
}

void Submodel::ChooseSmallBatchGemms() {
  using Mode = SubmodelOptions::SmallBatchGemm;
  const at::ScalarType dtype = options_.dtype;
  if (!options_.device.is_cuda() || (dtype != at::kBFloat16 && dtype != at::kHalf) ||
      layers_.empty() || options_.small_batch_gemm == Mode::kNever) {
    return;
  }
  constexpr int64_t kMaxRows = kernels::kSmallBatchGemmMaxRows;
  constexpr uint32_t kEveryRow = ((1u << (kMaxRows + 1)) - 1) & ~1u;  // bits 1..8
  using Epilogue = SmallBatchEpilogue::Kind;
  struct Role {
    const char* name;
    WeightMatrix DecoderLayerWeights::*matrix;
    at::Tensor DecoderLayerWeights::*bias;
    // What a decode step does with the products (RunLayers): the kernel's fused form is
    // timed against cuBLAS and the kernel it replaces.
    Epilogue epilogue;
  };
  static constexpr Role kRoles[] = {
      {"qkv", &DecoderLayerWeights::qkv, &DecoderLayerWeights::qkv_bias, Epilogue::kRotaryQkv},
      {"o_proj", &DecoderLayerWeights::o_proj, &DecoderLayerWeights::o_bias, Epilogue::kNone},
      {"gate_up", &DecoderLayerWeights::gate_up, nullptr, Epilogue::kSwiGlu},
      {"down", &DecoderLayerWeights::down, nullptr, Epilogue::kNone}};
  std::string summary;
  for (const Role& role : kRoles) {
    // Every layer's matrix of a role has the first layer's shape: one choice for all, timed
    // across them (TimeSmallBatchGemm says why).
    const DecoderLayerWeights& first = layers_.front();
    const WeightMatrix& matrix = first.*role.matrix;
    if (matrix.is_int8() || !matrix.dense.defined()) continue;
    uint32_t rows = kEveryRow;
    if (options_.small_batch_gemm == Mode::kMeasured) {
      std::vector<at::Tensor> weights;
      std::vector<at::Tensor> biases;
      for (const DecoderLayerWeights& w : layers_) {
        weights.push_back((w.*role.matrix).dense);
        if (role.bias != nullptr && (w.*role.bias).defined()) biases.push_back(w.*role.bias);
      }
      // With head norms between them (Qwen3) the projection is never fused with rotary.
      const Epilogue kind = role.epilogue == Epilogue::kRotaryQkv && first.q_norm.defined()
                                ? Epilogue::kNone
                                : role.epilogue;
      const SmallBatchEpilogue epilogue{.kind = kind,
                                        .heads = config_.num_attention_heads,
                                        .kv_heads = config_.num_key_value_heads,
                                        .head_dim = config_.head_dim};
      absl::StatusOr<SmallBatchTimings> timings =
          TimeSmallBatchGemm(weights, biases, kMaxRows, epilogue);
      const char* form = kind == Epilogue::kRotaryQkv ? "+rotary"
                         : kind == Epilogue::kSwiGlu  ? "+swiglu"
                                                      : "";
      if (!timings.ok() && kind != Epilogue::kNone) {
        // The step still takes the plain kernel where the fused form cannot run.
        spdlog::warn("{}: timing the fused form failed ({}); timing the plain product",
                     role.name, timings.status().ToString());
        timings = TimeSmallBatchGemm(weights, biases, kMaxRows);
        form = "";
      }
      if (!timings.ok()) {
        spdlog::warn("{}: steps of every size take cuBLAS: {}", role.name,
                     timings.status().ToString());
        continue;
      }
      rows = SmallBatchRowsMask(timings->kernel_seconds, timings->blas_seconds);
      absl::StrAppendFormat(&summary, " %s%s [%d x %d] %.1f/%.1f us at 1 row, %.1f/%.1f at %d,",
                            role.name, form, matrix.dense.size(0), matrix.dense.size(1),
                            1e6 * timings->kernel_seconds.front(),
                            1e6 * timings->blas_seconds.front(),
                            1e6 * timings->kernel_seconds.back(),
                            1e6 * timings->blas_seconds.back(), kMaxRows);
    }
    absl::StrAppend(&summary, " ", role.name, " takes the kernel at rows {",
                    absl::StrJoin(SmallBatchRows(rows), ","), "};");
    for (DecoderLayerWeights& w : layers_) (w.*role.matrix).small_batch_rows = rows;
  }
  spdlog::info("small-batch GEMM (kernel/cuBLAS per launch; +rotary and +swiglu: with the "
               "kernel each form replaces):{}",
               summary);
}

void Submodel::PrepareFusedLayers() {
  if (!options_.device.is_cpu() || options_.dtype != at::kFloat) return;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayerWeights& w = layers_[l];
    const int64_t layer = spec_.layers.begin + static_cast<int64_t>(l);
    const auto qkv = RowMatrixOf(w.qkv);
    const auto o_proj = RowMatrixOf(w.o_proj);
    const auto gate_up = RowMatrixOf(w.gate_up);
    const auto down = RowMatrixOf(w.down);
    const float* input_norm = FloatData(w.input_norm);
    const float* post_norm = FloatData(w.post_norm);
    // A sparse layer's experts have no one-token kernel: the step computes it.
    if (w.sparse() || !qkv || !o_proj || !gate_up || !down || input_norm == nullptr ||
        post_norm == nullptr || (w.qkv_bias.defined() && FloatData(w.qkv_bias) == nullptr) ||
        (w.q_norm.defined() && FloatData(w.q_norm) == nullptr) ||
        (w.k_norm.defined() && FloatData(w.k_norm) == nullptr) ||
        (w.o_bias.defined() && FloatData(w.o_bias) == nullptr) ||
        (w.attention_out_norm.defined() && FloatData(w.attention_out_norm) == nullptr) ||
        (w.mlp_out_norm.defined() && FloatData(w.mlp_out_norm) == nullptr)) {
      fused_layers_.clear();
      return;
    }
    fused_layers_.push_back({.input_norm = input_norm,
                             .qkv = *qkv,
                             .qkv_bias = FloatData(w.qkv_bias),
                             .q_norm = FloatData(w.q_norm),
                             .k_norm = FloatData(w.k_norm),
                             .o_proj = *o_proj,
                             .o_bias = FloatData(w.o_bias),
                             .post_norm = post_norm,
                             .gate_up = *gate_up,
                             .down = *down,
                             .attention_out_norm = FloatData(w.attention_out_norm),
                             .mlp_out_norm = FloatData(w.mlp_out_norm),
                             .gelu_gate = config_.gemma(),
                             .window = config_.LayerWindow(layer).value_or(0),
                             .local_rope = config_.LocalRope(layer)});
  }
  fused_shape_ = {.hidden = config_.hidden_size,
                  .heads = config_.num_attention_heads,
                  .kv_heads = config_.num_key_value_heads,
                  .head_dim = config_.head_dim,
                  .intermediate = config_.intermediate_size,
                  .eps = static_cast<float>(config_.rms_norm_eps),
                  .attention_scale = static_cast<float>(config_.attention_scale()),
                  .attention_softcap = static_cast<float>(config_.attn_logit_softcapping)};
  auto table_fits = [](const RopeTable& table) {
    return table.cos.is_contiguous() && table.sin.is_contiguous() &&
           table.cos.scalar_type() == at::kFloat && table.sin.scalar_type() == at::kFloat;
  };
  if (!kernels::DecodeStepTakes(fused_shape_, fused_layers_) || !table_fits(rope_) ||
      (rope_local_.cos.defined() && !table_fits(rope_local_))) {
    fused_layers_.clear();
  }
}

void Submodel::PrepareFusedHead() {
  if (!spec_.head || !options_.device.is_cpu() || options_.dtype != at::kFloat) return;
  const auto head = RowMatrixOf(lm_head_);
  if (head && head->cols == config_.hidden_size && FloatData(final_norm_) != nullptr) {
    fused_head_ = *head;
  }
}

bool Submodel::FusedDecodeTakes(std::span<const SequenceChunk> chunks) const {
  if (fused_layers_.empty() || !options_.fused_cpu_decode || chunks.size() != 1 ||
      chunks[0].num_tokens != 1) {
    return false;
  }
  const KvCache& cache = *chunks[0].cache;
  const KvBlockPool& pool = cache.pool();
  const int64_t position = cache.length();
  return pool.dtype() == at::kFloat && pool.device().is_cpu() && position < rope_.max_positions() &&
         position < cache.capacity() &&
         (!rope_local_.cos.defined() || position < rope_local_.max_positions());
}

void Submodel::FusedDecode(const KvCache& cache, float* x) const {
  // The layers with this cache's storage: a copy per calling thread that grows once.
  thread_local std::vector<kernels::DecodeLayer> layers;
  layers.assign(fused_layers_.begin(), fused_layers_.end());
  const KvBlockPool& pool = cache.pool();
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].keys = kernels::KvRowsOf(pool.keys(static_cast<int64_t>(l)));
    layers[l].values = kernels::KvRowsOf(pool.values(static_cast<int64_t>(l)));
  }
  const int64_t position = cache.length();
  const int64_t half = config_.head_dim / 2;
  kernels::DecodePosition at{.block_table = cache.block_table(),
                             .block_size = pool.block_size(),
                             .position = position,
                             .cos = rope_.cos.data_ptr<float>() + position * half,
                             .sin = rope_.sin.data_ptr<float>() + position * half};
  if (rope_local_.cos.defined()) {
    at.local_cos = rope_local_.cos.data_ptr<float>() + position * half;
    at.local_sin = rope_local_.sin.data_ptr<float>() + position * half;
  }
  // Every layer reads as many bytes as the first.
  const DecoderLayerWeights& w = layers_.front();
  const int64_t layer_bytes =
      w.qkv.bytes() + w.o_proj.bytes() + w.gate_up.bytes() + w.down.bytes();
  kernels::DecodeLayersOneToken(fused_shape_, layers, at, x,
                                kernels::DecodeStepThreads(layer_bytes));
}

KvCache Submodel::NewCache(int64_t capacity) const {
  if (capacity <= 0) capacity = max_context();
  return KvCache(config_, spec_.layers.size(), capacity, options_.dtype, options_.device);
}

KvCache Submodel::NewGrowingCache(int64_t max_capacity, int64_t growth_step) const {
  if (max_capacity <= 0) max_capacity = max_context();
  return KvCache::Growing(config_, spec_.layers.size(), max_capacity, growth_step,
                          options_.dtype, options_.device);
}

absl::StatusOr<std::shared_ptr<KvBlockPool>> Submodel::NewPagedPool(int64_t num_blocks,
                                                                    int64_t block_size) const {
  return KvBlockPool::Create(config_, spec_.layers.size(), num_blocks, block_size,
                             options_.dtype, options_.device);
}

absl::StatusOr<at::Tensor> Submodel::Embed(const at::Tensor& token_ids) const {
  const c10::DeviceGuard device_guard(options_.device);
  if (!spec_.embedding) {
    return absl::FailedPreconditionError("this submodel holds no token embedding");
  }
  if (token_ids.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ids must be 1-D, got shape ", ShapeString(token_ids)));
  }
  if (token_ids.numel() > 0) {
    const int64_t lo = token_ids.min().item<int64_t>();
    const int64_t hi = token_ids.max().item<int64_t>();
    if (lo < 0 || hi >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", lo < 0 ? lo : hi,
                                                     " is outside the vocabulary of ",
                                                     config_.vocab_size));
    }
  }
  at::Tensor rows;
  absl::Status status = CatchExceptions("token embedding", [&] {
    if (embedding_.is_int8()) {
      rows = kernels::GatherRowsInt8(embedding_.int8, token_ids);
    } else {
      // A bfloat16 table (bf16_weights) gives rows in the compute dtype.
      rows = at::embedding(embedding_.dense, token_ids.to(at::kLong).to(options_.device))
                 .to(options_.dtype);
    }
    // Gemma's scale, rounded to the table's dtype as transformers rounds it.
    if (config_.gemma()) {
      rows.mul_(
          at::scalar_tensor(config_.embedding_scale(), at::kFloat).to(rows.scalar_type()).item());
    }
  });
  TOPHAT_RETURN_IF_ERROR(status);
  return rows;
}

void Submodel::AttendChunk(const at::Tensor& q, const KvCache& cache, int64_t layer,
                           at::Tensor out, const at::Tensor& device_ids) const {
  // q: [n, H, hd] at positions past..past+n-1; keys/values: [past+n, KV, hd].
  const int64_t n = q.size(0);
  const int64_t past = cache.length();
  const int64_t total = past + n;
  const int64_t kv_heads = config_.num_key_value_heads;
  const int64_t group = config_.num_attention_heads / kv_heads;
  const int64_t hd = config_.head_dim;
  const double scale = config_.attention_scale();
  const double softcap = config_.attn_logit_softcapping;
  const std::optional<int64_t> window = config_.LayerWindow(spec_.layers.begin + layer);
  const bool windowed = window && total > *window;
  const at::Tensor& sinks = layers_[static_cast<size_t>(layer)].sinks;
  // One query: the fused kernel reads the blocks in place, from the window's first row.
  if (n == 1 && kernels::PagedDecodeAttention(
                    q[0], cache.pool().keys(layer), cache.pool().values(layer), cache.block_table(),
                    total, scale, out, windowed ? total - *window : 0, softcap, sinks)) {
    return;
  }
  // More queries (a prompt's chunk, verification rows): block by block with a running softmax
  // over the cache in place, the hidden blocks skipped (kernels/prompt_attention.h).
  if (n > 1 && kernels::PagedPromptAttention(q, cache.pool().keys(layer),
                                             cache.pool().values(layer), cache.block_table(), past,
                                             scale, out, windowed ? *window : 0, softcap, sinks)) {
    return;
  }
  const at::Tensor keys = cache.Keys(layer, total, device_ids);
  const at::Tensor values = cache.Values(layer, total, device_ids);
  // Soft-capped scores (Gemma 2) take the composite path below in every dtype: fused
  // attention has no cap.
  if ((q.is_cuda() || q.scalar_type() != at::kFloat) && softcap == 0 && !sinks.defined()) {
    // Fused attention (on a GPU flash or memory-efficient kernels, in the compute dtype) over
    // the chunk and its history, instead of a float32 score matrix. CPU dtypes other than
    // float32 take it too, which is how the CPU tests check the masks below. A first chunk with no
    // window is plainly causal (flash takes it); with history or a window, the mask says
    // which keys each query sees (query i is at position past + i).
    std::optional<at::Tensor> mask;
    if (past > 0 || windowed) {
      const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(q.device());
      const at::Tensor key_pos = at::arange(total, longs).unsqueeze(0);
      const at::Tensor query_pos = at::arange(past, total, longs).unsqueeze(1);
      at::Tensor visible = key_pos <= query_pos;  // [n, total]
      if (windowed) visible.logical_and_(key_pos > query_pos - *window);
      mask = visible;
    }
    const at::Tensor context = at::scaled_dot_product_attention(
        q.permute({1, 0, 2}).unsqueeze(0), keys.permute({1, 0, 2}).unsqueeze(0),
        values.permute({1, 0, 2}).unsqueeze(0), mask, /*dropout_p=*/0.0,
        /*is_causal=*/!mask.has_value(), scale, /*enable_gqa=*/group > 1);  // [1, H, n, hd]
    out.copy_(context.squeeze(0).permute({1, 0, 2}).reshape({n, kv_heads * group * hd}));
    return;
  }

  // Query head h uses KV head h / group (grouped-query attention), so fold the group into
  // the query rows and run one batched GEMM per KV head.
  at::Tensor qh = q.view({n, kv_heads, group, hd}).permute({1, 0, 2, 3}).reshape(
      {kv_heads, n * group, hd});
  at::Tensor scores = at::bmm(qh, keys.permute({1, 2, 0})).mul_(scale);  // [KV, n*g, total]
  // transformers' eager order and dtype: divided by the cap, tanh, multiplied by it.
  if (softcap > 0) scores.div_(softcap).tanh_().mul_(softcap);
  if (n > 1 || windowed) {
    at::Tensor key_pos = at::arange(total, at::TensorOptions().dtype(at::kLong).device(q.device()));
    at::Tensor query_pos = at::arange(past, past + n, key_pos.options()).unsqueeze(1);
    at::Tensor hidden = key_pos.unsqueeze(0) > query_pos;  // [n, total]
    if (windowed) hidden.logical_or_(key_pos.unsqueeze(0) <= query_pos - *window);
    scores.view({kv_heads, n, group, total})
        .masked_fill_(hidden.view({1, n, 1, total}), -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs;
  if (sinks.defined()) {
    // gpt-oss: each query head's sink is one more logit in its row's softmax, with no value
    // (transformers' eager order: the sink column appended, softmax, the column dropped).
    // Rows are (query, head in group) within a KV head: head h = kv * group + g.
    const at::Tensor sink_column = sinks.to(scores.scalar_type())
                                       .view({kv_heads, 1, group, 1})
                                       .expand({kv_heads, n, group, 1})
                                       .reshape({kv_heads, n * group, 1});
    probs = at::softmax(at::cat({scores, sink_column}, -1), -1, at::kFloat)
                .narrow(-1, 0, total)
                .to(q.scalar_type());
  } else {
    probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  }
  at::Tensor context = at::bmm(probs, values.permute({1, 0, 2}));  // [KV, n*g, hd]
  out.copy_(context.view({kv_heads, n, group, hd}).permute({1, 0, 2, 3}).reshape(
      {n, kv_heads * group * hd}));
}

Submodel::DeviceBatch Submodel::PrepareDeviceBatch(std::span<const SequenceChunk> chunks,
                                                   int64_t total, StepBuffers& buffers) const {
  DeviceBatch batch;
  if (options_.device.is_cpu() || chunks.empty()) return batch;
  const KvBlockPool* pool = &chunks.front().cache->pool();
  batch.pool = pool;
  for (const SequenceChunk& chunk : chunks) {
    if (&chunk.cache->pool() != pool) return batch;  // caches of several pools: per chunk
  }
  const int64_t width = buffers.max_blocks_per_sequence();
  int64_t* slots = buffers.host_slots.data_ptr<int64_t>();
  int32_t* tables = buffers.host_block_tables.data_ptr<int32_t>();
  int32_t* lens = buffers.host_seq_lens.data_ptr<int32_t>();
  std::vector<int64_t>& decode_rows = buffers.decode_rows;
  decode_rows.clear();
  int64_t row = 0;
  batch.decode_first_row = -1;
  batch.decode_rows_contiguous = true;
  // Longer chunks' block tables go in the rows after the decode rows' (whose count is known
  // only after this loop, so it notes which chunks they are, and they are copied after it).
  std::vector<int64_t>& chunk_table_rows = buffers.chunk_table_rows;
  chunk_table_rows.clear();
  for (const SequenceChunk& chunk : chunks) {
    const std::span<const int32_t> table = chunk.cache->block_table();
    const int64_t past = chunk.cache->length();
    for (int64_t i = 0; i < chunk.num_tokens; ++i) slots[row + i] = chunk.cache->SlotOf(past + i);
    if (chunk.num_tokens >= 1 && chunk.num_tokens <= decode_row_chunk_tokens()) {
      // A row per token, token i seeing positions [0, past + i].
      if (pool->BlocksFor(past + chunk.num_tokens) > width) {
        return DeviceBatch{};  // longer than the buffers were sized for
      }
      for (int64_t i = 0; i < chunk.num_tokens; ++i) {
        const auto d = static_cast<int64_t>(decode_rows.size());
        if (batch.decode_first_row < 0) batch.decode_first_row = row + i;
        if (row + i != batch.decode_first_row + d) batch.decode_rows_contiguous = false;
        decode_rows.push_back(row + i);
        lens[d] = static_cast<int32_t>(past + i + 1);
        std::copy(table.begin(), table.begin() + pool->BlocksFor(past + i + 1), tables + d * width);
      }
    } else if (chunk.num_tokens > decode_row_chunk_tokens()) {
      // Gathered from the pool in every layer (AttendChunk): its ids go up once per step.
      chunk_table_rows.push_back(static_cast<int64_t>(&chunk - chunks.data()));
    }
    row += chunk.num_tokens;
  }
  // One asynchronous host-to-device copy per index tensor per step, from pinned staging.
  batch.slots = buffers.slots.narrow(0, 0, total);
  batch.slots.copy_(buffers.host_slots.narrow(0, 0, total), /*non_blocking=*/true);
  const auto count = static_cast<int64_t>(decode_rows.size());
  batch.decode_count = count;
  batch.partials = buffers.decode_partials;
  batch.split_counters = buffers.decode_split_counters;
  auto multi = static_cast<int64_t>(chunk_table_rows.size());
  for (int64_t m = 0; m < multi; ++m) {
    const SequenceChunk& chunk = chunks[static_cast<size_t>(chunk_table_rows[m])];
    const int64_t needed = pool->BlocksFor(chunk.cache->length() + chunk.num_tokens);
    if (needed > width) {  // longer than the buffers were sized for: each gather uploads its own
      multi = 0;
      break;
    }
    const std::span<const int32_t> table = chunk.cache->block_table();
    std::copy(table.begin(), table.begin() + needed, tables + (count + m) * width);
  }
  if (count + multi > 0) {
    // The decode rows' tables and the longer chunks' in one upload.
    buffers.block_tables.narrow(0, 0, count + multi)
        .copy_(buffers.host_block_tables.narrow(0, 0, count + multi), true);
  }
  if (multi > 0) batch.chunk_tables = buffers.block_tables.narrow(0, count, multi);
  if (count > 0) {
    batch.block_tables = buffers.block_tables.narrow(0, 0, count);
    batch.seq_lens = buffers.seq_lens.narrow(0, 0, count);
    batch.seq_lens.copy_(buffers.host_seq_lens.narrow(0, 0, count), true);
    if (!batch.decode_rows_contiguous) {
      std::copy(decode_rows.begin(), decode_rows.end(),
                buffers.host_decode_index.data_ptr<int64_t>());
      batch.decode_index = buffers.decode_index.narrow(0, 0, count);
      batch.decode_index.copy_(buffers.host_decode_index.narrow(0, 0, count), true);
      batch.decode_q = buffers.decode_q.narrow(0, 0, count);
      batch.decode_out = buffers.decode_out.narrow(0, 0, count);
    }
  }
  return batch;
}

bool Submodel::AttendDeviceBatch(const DeviceBatch& batch, std::span<const SequenceChunk> chunks,
                                 int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, at::Tensor& attention) const {
  const KvBlockPool& pool = *batch.pool;
  const int64_t kv_heads = config_.num_key_value_heads;
  const int64_t hd = config_.head_dim;
  // Every new row of every chunk into its slot: [num_blocks * block_size, KV, hd] views.
  if (k.defined()) {
    pool.keys(layer).view({-1, kv_heads, hd}).index_copy_(0, batch.slots, k);
    pool.values(layer).view({-1, kv_heads, hd}).index_copy_(0, batch.slots, v);
  }

  bool decode_done = false;
  const int64_t decode_count = batch.decode_count;
  if (decode_count > 0) {
    const double scale = config_.attention_scale();
    const int64_t window = config_.LayerWindow(spec_.layers.begin + layer).value_or(0);
    if (batch.decode_rows_contiguous) {
      const at::Tensor decode_q = q.narrow(0, batch.decode_first_row, decode_count);
      at::Tensor decode_out = attention.narrow(0, batch.decode_first_row, decode_count);
      decode_done = kernels::PagedDecodeAttentionBatch(decode_q, pool.keys(layer),
                                                       pool.values(layer), batch.block_tables,
                                                       batch.seq_lens, window, scale, decode_out,
                                                       batch.partials, batch.split_counters);
    } else {
      at::Tensor decode_q = batch.decode_q;
      at::index_select_out(decode_q, q, 0, batch.decode_index);
      at::Tensor decode_out = batch.decode_out;
      decode_done = kernels::PagedDecodeAttentionBatch(decode_q, pool.keys(layer),
                                                       pool.values(layer), batch.block_tables,
                                                       batch.seq_lens, window, scale, decode_out,
                                                       batch.partials, batch.split_counters);
      if (decode_done) attention.index_copy_(0, batch.decode_index, decode_out);
    }
  }
  int64_t row = 0;
  int64_t multi = 0;  // the longer chunks in order, as PrepareDeviceBatch staged their tables
  for (const SequenceChunk& chunk : chunks) {
    const int64_t n = chunk.num_tokens;
    const bool longer = n > decode_row_chunk_tokens();  // not among the decode rows
    if (n > 0 && (longer || !decode_done)) {
      const at::Tensor ids =
          longer && batch.chunk_tables.defined() ? batch.chunk_tables[multi] : at::Tensor();
      AttendChunk(q.narrow(0, row, n), *chunk.cache, layer, attention.narrow(0, row, n), ids);
    }
    if (longer) ++multi;
    row += n;
  }
  return decode_done || decode_count == 0;
}

absl::StatusOr<int64_t> Submodel::CheckStep(const at::Tensor& hidden,
                                            std::span<const SequenceChunk> chunks) const {
  const int64_t d = config_.hidden_size;
  if (hidden.dim() != 2 || hidden.size(1) != d) {
    return absl::InvalidArgumentError(absl::StrCat("hidden states must have shape [T, ", d,
                                                   "], got ", ShapeString(hidden)));
  }
  if (hidden.scalar_type() != options_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("hidden states have dtype ",
                                                   c10::toString(hidden.scalar_type()),
                                                   ", the model computes in ",
                                                   c10::toString(options_.dtype)));
  }
  int64_t total = 0;
  for (const SequenceChunk& chunk : chunks) {
    if (chunk.cache == nullptr || chunk.num_tokens < 0) {
      return absl::InvalidArgumentError("a sequence chunk has no cache or a negative length");
    }
    if (chunk.cache->num_layers() != spec_.layers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache has ", chunk.cache->num_layers(), " layers, the submodel has ",
                       spec_.layers.size()));
    }
    const KvBlockPool& pool = chunk.cache->pool();
    if (pool.kv_heads() != config_.num_key_value_heads || pool.head_dim() != config_.head_dim ||
        pool.dtype() != options_.dtype || pool.device() != options_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache holds ", pool.kv_heads(), " heads x ", pool.head_dim(), " ",
          c10::toString(pool.dtype()), " on ", pool.device().str(), "; the submodel needs ",
          config_.num_key_value_heads, " x ", config_.head_dim, " ",
          c10::toString(options_.dtype), " on ", options_.device.str()));
    }
    const int64_t end = chunk.cache->length() + chunk.num_tokens;
    // A growing cache makes room here (its length and contents stay as they were).
    if (chunk.cache->growing() && end <= max_context()) {
      TOPHAT_RETURN_IF_ERROR(chunk.cache->Reserve(end));
    }
    if (end > chunk.cache->capacity() || end > max_context()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sequence would reach ", end, " positions; the KV cache holds ",
          chunk.cache->capacity(), " and the context limit is ", max_context()));
    }
    total += chunk.num_tokens;
  }
  if (total != hidden.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("chunks cover ", total,
                                                   " tokens but the hidden states hold ",
                                                   hidden.size(0)));
  }
  return total;
}

StepBuffers Submodel::NewStepBuffers(int64_t max_tokens, int64_t block_size) const {
  return StepBuffers(config_, options_.dtype, options_.device,
                     {.max_tokens = max_tokens, .max_context = max_context(),
                      .block_size = block_size});
}

absl::StatusOr<at::Tensor> Submodel::Forward(const at::Tensor& hidden,
                                             std::span<const SequenceChunk> chunks) const {
  TOPHAT_ASSIGN_OR_RETURN(const int64_t total, CheckStep(hidden, chunks));
  if (FusedDecodeTakes(chunks)) {
    // One token on a CPU: a row of its own, no step buffers.
    at::Tensor x;
    TOPHAT_RETURN_IF_ERROR(CatchExceptions("forward pass", [&] {
      x = at::empty({1, config_.hidden_size}, at::TensorOptions().dtype(at::kFloat));
      x.copy_(hidden);
    }));
    FusedDecode(*chunks[0].cache, x.data_ptr<float>());
    chunks[0].cache->Advance(1);
    return x;
  }
  // Buffers for this step alone: the same code path as a caller's long-lived buffers.
  std::optional<StepBuffers> buffers;
  TOPHAT_RETURN_IF_ERROR(CatchExceptions("allocating step buffers", [&] {
    buffers.emplace(NewStepBuffers(
        total, chunks.empty() ? 16 : chunks.front().cache->pool().block_size()));
  }));
  return Forward(hidden, chunks, *buffers);
}

absl::StatusOr<at::Tensor> Submodel::Forward(const at::Tensor& hidden,
                                             std::span<const SequenceChunk> chunks,
                                             StepBuffers& buffers) const {
  const c10::DeviceGuard device_guard(options_.device);
  TOPHAT_ASSIGN_OR_RETURN(const int64_t total, CheckStep(hidden, chunks));
  if (total > buffers.max_tokens() || buffers.residual.scalar_type() != options_.dtype ||
      buffers.residual.device() != options_.device ||
      buffers.residual.size(1) != config_.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step buffers hold ", buffers.max_tokens(), " rows of ",
        c10::toString(buffers.residual.scalar_type()), " on ", buffers.residual.device().str(),
        "; this step needs ", total, " rows of ", c10::toString(options_.dtype), " on ",
        options_.device.str()));
  }

  // The residual stream, updated in place: the buffers' rows, which the caller may have
  // filled already (then nothing is copied).
  at::Tensor x = buffers.residual.narrow(0, 0, total);
  absl::Status status = CatchExceptions("forward pass", [&] {
    if (hidden.data_ptr() != x.data_ptr()) x.copy_(hidden, /*non_blocking=*/true);
    if (layers_.empty() || total == 0) return;
    if (FusedDecodeTakes(chunks)) {
      FusedDecode(*chunks[0].cache, x.data_ptr<float>());
      return;
    }
    // On a GPU, with every chunk in one pool (the cloud's engine), the step's K/V rows are
    // written with one scatter per layer and its decode rows attend in one kernel launch;
    // the index tensors for both are uploaded once here, not per layer.
    // The host staging of the index uploads (pinned on a GPU) is written again only once the
    // last step's uploads have read it; they were queued before that step's layers, so this
    // waits for almost nothing.
    const bool upload = !options_.device.is_cpu();
    if (upload) buffers.uploads_read.Wait();
    const DeviceBatch device_batch = PrepareDeviceBatch(chunks, total, buffers);
    // Rotary rows for every token of the batch, gathered once for all layers.
    at::Tensor cos;
    at::Tensor sin;
    at::Tensor local_cos;  // the sliding layers' (Gemma 3), where they have their own table
    at::Tensor local_sin;
    const bool local = rope_local_.cos.defined();
    if (chunks.size() == 1) {
      cos = rope_.cos.narrow(0, chunks[0].cache->length(), total);
      sin = rope_.sin.narrow(0, chunks[0].cache->length(), total);
      if (local) {
        local_cos = rope_local_.cos.narrow(0, chunks[0].cache->length(), total);
        local_sin = rope_local_.sin.narrow(0, chunks[0].cache->length(), total);
      }
    } else {
      int64_t* positions = buffers.host_positions.data_ptr<int64_t>();
      int64_t row = 0;
      for (const SequenceChunk& chunk : chunks) {
        for (int64_t i = 0; i < chunk.num_tokens; ++i) {
          positions[row++] = chunk.cache->length() + i;
        }
      }
      at::Tensor index = buffers.host_positions.narrow(0, 0, total);
      if (upload) index = buffers.positions.narrow(0, 0, total).copy_(index, /*non_blocking=*/true);
      cos = buffers.cos.narrow(0, 0, total);
      sin = buffers.sin.narrow(0, 0, total);
      at::index_select_out(cos, rope_.cos, 0, index);
      at::index_select_out(sin, rope_.sin, 0, index);
      if (local) {
        local_cos = buffers.local_cos.narrow(0, 0, total);
        local_sin = buffers.local_sin.narrow(0, 0, total);
        at::index_select_out(local_cos, rope_local_.cos, 0, index);
        at::index_select_out(local_sin, rope_local_.sin, 0, index);
      }
    }
    if (upload) buffers.uploads_read.Record();
    RunLayers(total, cos, sin, local_cos, local_sin, device_batch, chunks, buffers,
              /*graph=*/false);
  });
  TOPHAT_RETURN_IF_ERROR(status);
  for (const SequenceChunk& chunk : chunks) chunk.cache->Advance(chunk.num_tokens);
  return x;
}

void Submodel::RunLayers(int64_t total, const at::Tensor& global_cos, const at::Tensor& global_sin,
                         const at::Tensor& local_cos, const at::Tensor& local_sin,
                         const DeviceBatch& device_batch, std::span<const SequenceChunk> chunks,
                         StepBuffers& buffers, bool graph) const {
  at::Tensor x = buffers.residual.narrow(0, 0, total);
  const int64_t q_size = config_.q_size();
  const int64_t kv_size = config_.kv_size();
  const int64_t heads = config_.num_attention_heads;
  const int64_t kv_heads = config_.num_key_value_heads;
  const int64_t hd = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  at::Tensor h = buffers.normed.narrow(0, 0, total);
  at::Tensor qkv = buffers.qkv.narrow(0, 0, total);
  at::Tensor q = buffers.q.narrow(0, 0, total);
  at::Tensor k = buffers.k.narrow(0, 0, total);
  at::Tensor attention = buffers.attention.narrow(0, 0, total);
  at::Tensor projected = buffers.projected.narrow(0, 0, total);
  // A model whose every layer mixes experts has no dense MLP rows (StepBuffers).
  const bool dense_rows = buffers.gate_up.size(0) > 0;
  at::Tensor gate_up = dense_rows ? buffers.gate_up.narrow(0, 0, total) : at::Tensor();
  at::Tensor activated = dense_rows ? buffers.activated.narrow(0, 0, total) : at::Tensor();
  kernels::RmsNormOut(x, layers_.front().input_norm, eps, h);
  buffers.experts_computed = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayerWeights& w = layers_[l];
    const auto layer = static_cast<int64_t>(l);
    const bool local = config_.LocalRope(spec_.layers.begin + layer);
    TORCH_CHECK(!local || local_cos.defined(), "a sliding layer's rotary rows are missing");
    const at::Tensor& cos = local ? local_cos : global_cos;
    const at::Tensor& sin = local ? local_sin : global_sin;
    // Where the small-batch kernel was measured faster for qkv at this row count, its rotary
    // form writes the rotated queries and the cache's keys and values itself, the same bits
    // as the projection into `qkv` followed by RotaryQkvToCache, in one launch.
    at::Tensor key_slots;  // a GPU batch's pool layer, viewed by slot
    at::Tensor value_slots;
    if (device_batch.slots.defined()) {
      key_slots = device_batch.pool->keys(layer).view({-1, kv_heads, hd});
      value_slots = device_batch.pool->values(layer).view({-1, kv_heads, hd});
    }
    // A model with head norms (Qwen3) norms q and k in place between the projection and
    // rotary, so the fused projection-and-rotary form is not for it.
    const bool head_norms = w.q_norm.defined();
    const bool projected_to_cache =
        key_slots.defined() && !head_norms && UsesSmallBatchGemm(w.qkv, total) &&
        kernels::SmallBatchGemmRotaryQkvToCache(h, w.qkv.dense, w.qkv_bias, cos, sin, heads,
                                                kv_heads, hd, key_slots, value_slots,
                                                device_batch.slots, q);
    if (!projected_to_cache) LinearOut(h, w.qkv, w.qkv_bias, qkv);
    if (head_norms) {
      at::Tensor q_heads = qkv.narrow(1, 0, q_size).view({total, heads, hd});
      at::Tensor k_heads = qkv.narrow(1, q_size, kv_size).view({total, kv_heads, hd});
      kernels::HeadRmsNormInPlace(q_heads, w.q_norm, eps);
      kernels::HeadRmsNormInPlace(k_heads, w.k_norm, eps);
    }
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({total, kv_heads, hd});
    if (key_slots.defined()) {
      if (projected_to_cache ||
          kernels::RotaryQkvToCache(qkv, cos, sin, heads, kv_heads, hd, key_slots, value_slots,
                                    device_batch.slots, q)) {
        // A captured step has no chunks to fall back on: its decode rows must all have
        // taken the batched kernel.
        TORCH_CHECK(AttendDeviceBatch(device_batch, chunks, layer, q, {}, {}, attention) ||
                        !graph,
                    "the paged decode kernel does not take this model's shapes");
      } else {
        TORCH_CHECK(!graph, "the fused rotary kernel does not take this model's shapes");
        kernels::RotaryEmbeddingOut(qkv.narrow(1, 0, q_size).view({total, heads, hd}), cos,
                                    sin, q);
        kernels::RotaryEmbeddingOut(qkv.narrow(1, q_size, kv_size).view({total, kv_heads, hd}),
                                    cos, sin, k);
        AttendDeviceBatch(device_batch, chunks, layer, q, k, v, attention);
      }
    } else {
      kernels::RotaryEmbeddingOut(qkv.narrow(1, 0, q_size).view({total, heads, hd}), cos, sin,
                                  q);
      kernels::RotaryEmbeddingOut(qkv.narrow(1, q_size, kv_size).view({total, kv_heads, hd}),
                                  cos, sin, k);
      int64_t row = 0;
      for (const SequenceChunk& chunk : chunks) {
        const int64_t n = chunk.num_tokens;
        if (n == 0) continue;
        chunk.cache->Write(layer, chunk.cache->length(), k.narrow(0, row, n),
                           v.narrow(0, row, n));
        AttendChunk(q.narrow(0, row, n), *chunk.cache, layer, attention.narrow(0, row, n));
        row += n;
      }
    }
    // Each residual add is fused with the norm that follows it. Gemma norms each sublayer's
    // output before its add (into buffers.sublayer_out).
    LinearOut(attention, w.o_proj, w.o_bias, projected);
    at::Tensor delta = projected;
    if (w.attention_out_norm.defined()) {
      delta = buffers.sublayer_out.narrow(0, 0, total);
      kernels::RmsNormOut(projected, w.attention_out_norm, eps, delta);
    }
    kernels::AddRmsNormOut(x, delta, w.post_norm, eps, h);
    if (w.sparse()) {
      MixExperts(w, h, total, buffers, projected);
    } else if (config_.gemma()) {
      // GELU (tanh form) of the gate times up, as transformers' GemmaMLP computes it.
      LinearOut(h, w.gate_up, {}, gate_up);
      kernels::GeluTanhGluOut(gate_up, activated);
    } else if (!(UsesSmallBatchGemm(w.gate_up, total) &&
                 kernels::SmallBatchGemmSwiGluOut(h, w.gate_up.dense, activated))) {
      // Where the small-batch kernel was measured faster for gate_up at this row count, its
      // SwiGLU form computes the same bits in one launch.
      LinearOut(h, w.gate_up, {}, gate_up);
      kernels::SwiGluOut(gate_up, activated);
    }
    if (!w.sparse()) LinearOut(activated, w.down, {}, projected);
    delta = projected;
    if (w.mlp_out_norm.defined()) {
      delta = buffers.sublayer_out.narrow(0, 0, total);
      kernels::RmsNormOut(projected, w.mlp_out_norm, eps, delta);
    }
    if (l + 1 < layers_.size()) {
      kernels::AddRmsNormOut(x, delta, layers_[l + 1].input_norm, eps, h);
    } else {
      x.add_(delta);
    }
  }
}

void Submodel::MixExperts(const DecoderLayerWeights& w, const at::Tensor& h, int64_t total,
                          StepBuffers& buffers, at::Tensor& out) const {
  const int64_t experts = config_.num_experts;
  const int64_t top = config_.num_experts_per_token;
  TORCH_CHECK(h.is_cpu(), "a mixture of experts computes on the CPU only");
  at::Tensor logits = buffers.router_logits.narrow(0, 0, total);
  LinearOut(h, w.router, w.router_bias, logits);
  // As transformers routes: softmax in float32 over every expert, the top K, renormalised
  // (Mixtral; Qwen3-MoE's norm_topk_prob).
  at::Tensor probs = buffers.router_probs.narrow(0, 0, total);
  at::softmax_out(probs, logits, 1, at::kFloat);
  at::Tensor weights = buffers.expert_weights.narrow(0, 0, total);
  at::Tensor ids = buffers.expert_ids.narrow(0, 0, total);
  at::topk_out(weights, ids, probs, top, 1, /*largest=*/true, /*sorted=*/true);
  if (config_.normalize_expert_weights) {
    at::Tensor sums = buffers.expert_weight_sums.narrow(0, 0, total);
    at::sum_out(sums, weights, {1}, /*keepdim=*/true);
    weights.div_(sums);
  }
  // Group the (token, expert) pairs by expert, tokens ascending within each.
  const int64_t routed = total * top;
  const int64_t* chosen = ids.data_ptr<int64_t>();
  const float* chosen_weight = weights.data_ptr<float>();
  std::vector<int64_t>& offsets = buffers.expert_offsets;
  std::vector<int64_t>& fill = buffers.expert_fill;
  offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int64_t i = 0; i < routed; ++i) ++offsets[static_cast<size_t>(chosen[i] + 1)];
  for (int64_t e = 0; e < experts; ++e) {
    offsets[static_cast<size_t>(e + 1)] += offsets[static_cast<size_t>(e)];
  }
  fill.assign(offsets.begin(), offsets.end() - 1);
  int64_t* tokens = buffers.routed_tokens.data_ptr<int64_t>();
  float* token_weights = buffers.routed_weights.data_ptr<float>();
  for (int64_t i = 0; i < routed; ++i) {
    const int64_t slot = fill[static_cast<size_t>(chosen[i])]++;
    tokens[slot] = i / top;
    token_weights[slot] = chosen_weight[i];
  }
  const at::Tensor routed_tokens = buffers.routed_tokens.narrow(0, 0, routed);
  at::Tensor in = buffers.routed_in.narrow(0, 0, routed);
  at::Tensor expert_out = buffers.routed_out.narrow(0, 0, routed);
  at::index_select_out(in, h, 0, routed_tokens);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t rows = offsets[static_cast<size_t>(e + 1)] - begin;
    if (rows == 0) continue;
    ++buffers.experts_computed;
    at::Tensor gate_up = buffers.routed_gate_up.narrow(0, begin, rows);
    at::Tensor activated = buffers.routed_activated.narrow(0, begin, rows);
    at::Tensor expert_rows = expert_out.narrow(0, begin, rows);
    const auto index = static_cast<size_t>(e);
    if (!w.expert_down_bias.empty()) {
      // gpt-oss: biases, and its clamped SwiGLU.
      LinearOut(in.narrow(0, begin, rows), w.expert_gate_up[index], w.expert_gate_up_bias[index],
                gate_up);
      kernels::ClampedSwiGluOut(gate_up, activated);
      LinearOut(activated, w.expert_down[index], w.expert_down_bias[index], expert_rows);
      continue;
    }
    LinearOut(in.narrow(0, begin, rows), w.expert_gate_up[index], {}, gate_up);
    kernels::SwiGluOut(gate_up, activated);
    LinearOut(activated, w.expert_down[index], {}, expert_rows);
  }
  expert_out.mul_(buffers.routed_weights.narrow(0, 0, routed));
  out.zero_();
  out.index_add_(0, routed_tokens, expert_out);
  if (w.shared_down.defined()) {
    // Qwen2-MoE's shared expert on every row, scaled by the sigmoid of its gate, added after
    // the routed experts as transformers adds it.
    at::Tensor gate_up = buffers.shared_gate_up.narrow(0, 0, total);
    at::Tensor activated = buffers.shared_activated.narrow(0, 0, total);
    at::Tensor shared = buffers.shared_out.narrow(0, 0, total);
    at::Tensor gate = buffers.shared_gate.narrow(0, 0, total);
    LinearOut(h, w.shared_gate_up, {}, gate_up);
    kernels::SwiGluOut(gate_up, activated);
    LinearOut(activated, w.shared_down, {}, shared);
    LinearOut(h, w.shared_gate, {}, gate);
    gate.sigmoid_();
    out.addcmul_(shared, gate);
  }
}

absl::Status Submodel::DecodeStepInBuffers(const KvBlockPool& pool, int64_t rows,
                                           StepBuffers& buffers) const {
  const c10::DeviceGuard device_guard(options_.device);
  if (options_.device.is_cpu() || layers_.empty()) {
    return absl::FailedPreconditionError("a captured decode step needs a GPU and layers");
  }
  if (rows < 1 || rows > buffers.max_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("a decode step of ", rows,
                                                   " rows in buffers of ", buffers.max_tokens()));
  }
  return CatchExceptions("captured decode step", [&] {
    DeviceBatch batch;
    batch.pool = &pool;
    batch.slots = buffers.slots.narrow(0, 0, rows);
    batch.decode_count = rows;
    batch.decode_first_row = 0;
    batch.decode_rows_contiguous = true;
    batch.block_tables = buffers.block_tables.narrow(0, 0, rows);
    batch.seq_lens = buffers.seq_lens.narrow(0, 0, rows);
    batch.partials = buffers.decode_partials;
    batch.split_counters = buffers.decode_split_counters;
    const at::Tensor positions = buffers.positions.narrow(0, 0, rows);
    at::Tensor cos = buffers.cos.narrow(0, 0, rows);
    at::Tensor sin = buffers.sin.narrow(0, 0, rows);
    at::index_select_out(cos, rope_.cos, 0, positions);
    at::index_select_out(sin, rope_.sin, 0, positions);
    // A model with a second rotary table (Gemma 3) loads on the CPU only.
    RunLayers(rows, cos, sin, {}, {}, batch, {}, buffers, /*graph=*/true);
  });
}

absl::StatusOr<at::Tensor> Submodel::Forward(const at::Tensor& hidden, KvCache& cache) const {
  SequenceChunk chunk{.cache = &cache, .num_tokens = hidden.dim() > 0 ? hidden.size(0) : 0};
  return Forward(hidden, std::span<const SequenceChunk>(&chunk, 1));
}

absl::StatusOr<at::Tensor> Submodel::Logits(const at::Tensor& hidden) const {
  if (!spec_.head) return absl::FailedPreconditionError("this submodel holds no LM head");
  const c10::DeviceGuard device_guard(options_.device);
  if (hidden.dim() != 2 || hidden.size(1) != config_.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("hidden states must have shape [T, ",
                                                   config_.hidden_size, "], got ",
                                                   ShapeString(hidden)));
  }
  at::Tensor logits;
  TOPHAT_RETURN_IF_ERROR(CatchExceptions("LM head", [&] {
    if (fused_head_.values != nullptr && options_.fused_cpu_decode && hidden.size(0) == 1 &&
        hidden.is_cpu() &&
        hidden.scalar_type() == at::kFloat) {
      // One row: the norm and the head in one parallel region (kernels/decode_step.h).
      const at::Tensor row = hidden.contiguous();
      logits = at::empty({1, fused_head_.rows}, at::TensorOptions().dtype(at::kFloat));
      kernels::NormHeadOneToken(row.data_ptr<float>(), final_norm_.data_ptr<float>(),
                                config_.hidden_size, static_cast<float>(config_.rms_norm_eps),
                                fused_head_, logits.data_ptr<float>(),
                                kernels::DecodeStepThreads(lm_head_.bytes()));
      return;
    }
    logits = NormHeadLogits(hidden, final_norm_, config_.rms_norm_eps, lm_head_);
  }));
  // Gemma 2's cap on the logits (float32 here, as the logits are).
  if (const double cap = config_.final_logit_softcapping; cap > 0) {
    logits.div_(cap).tanh_().mul_(cap);
  }
  return logits;
}

namespace {

int64_t TensorBytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// One expert's bytes in a sparse layer (every expert has the first's shape), 0 in a dense one.
int64_t ExpertBytes(const DecoderLayerWeights& w) {
  if (!w.sparse()) return 0;
  int64_t bytes = w.expert_gate_up.front().bytes() + w.expert_down.front().bytes();
  if (!w.expert_down_bias.empty()) {
    bytes += TensorBytes(w.expert_gate_up_bias.front()) + TensorBytes(w.expert_down_bias.front());
  }
  return bytes;
}

// A layer's weights with `experts` of its experts.
int64_t LayerWeightBytes(const DecoderLayerWeights& w, int64_t experts) {
  int64_t bytes = experts * ExpertBytes(w);
  for (const at::Tensor* t :
       {&w.input_norm, &w.qkv_bias, &w.q_norm, &w.k_norm, &w.o_bias, &w.post_norm,
        &w.attention_out_norm, &w.mlp_out_norm, &w.router_bias, &w.sinks}) {
    bytes += TensorBytes(*t);
  }
  for (const WeightMatrix* m : {&w.qkv, &w.o_proj, &w.gate_up, &w.down, &w.router,
                                &w.shared_gate_up, &w.shared_down, &w.shared_gate}) {
    bytes += m->bytes();
  }
  return bytes;
}

}  // namespace

int64_t Submodel::WeightBytes() const {
  // A token reads its K experts of a sparse layer's E.
  int64_t bytes = 0;
  for (const DecoderLayerWeights& w : layers_) {
    bytes += LayerWeightBytes(w, config_.num_experts_per_token);
  }
  bytes += TensorBytes(final_norm_) + lm_head_.bytes();
  // An embedding lookup reads one row per token, not the table.
  if (embedding_.is_int8()) {
    bytes += config_.hidden_size * embedding_.int8.values.element_size() +
             embedding_.int8.scale.element_size();
  } else if (embedding_.defined()) {
    bytes += config_.hidden_size * embedding_.dense.element_size();
  }
  return bytes;
}

int64_t Submodel::StoredWeightBytes() const {
  int64_t bytes = 0;
  for (const DecoderLayerWeights& w : layers_) bytes += LayerWeightBytes(w, config_.num_experts);
  bytes += TensorBytes(final_norm_) + lm_head_.bytes();
  const bool shared = embedding_.dense.is_same(lm_head_.dense) &&
                      embedding_.int8.values.is_same(lm_head_.int8.values);
  if (!shared) bytes += embedding_.bytes();
  return bytes;
}

int64_t Submodel::WeightBytesRead(int64_t experts_computed) const {
  int64_t bytes = WeightBytes();
  int64_t expert_bytes = 0;
  for (const DecoderLayerWeights& w : layers_) {
    if (!w.sparse()) continue;
    expert_bytes = ExpertBytes(w);
    bytes -= expert_bytes * config_.num_experts_per_token;  // WeightBytes' one token's K
  }
  return bytes + experts_computed * expert_bytes;
}

bool Submodel::int8_weights() const {
  if (!layers_.empty()) return layers_.front().qkv.is_int8();
  return lm_head_.is_int8() || embedding_.is_int8();
}

bool Submodel::rounds_activations() const {
  if (lm_head_.int8_activations) return true;
  for (const DecoderLayerWeights& w : layers_) {
    if (w.qkv.int8_activations) return true;
    for (const auto* experts : {&w.expert_gate_up, &w.expert_down}) {
      for (const WeightMatrix& m : *experts) {
        if (m.int8_activations) return true;
      }
    }
  }
  return false;
}

int64_t WeightMatrix::bytes() const {
  auto size = [](const at::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  return size(dense) + size(int8.values) + size(int8.scale) + size(mxfp4.blocks) +
         size(mxfp4.scales);
}

at::Tensor WeightMatrix::Dense() const {
  if (mxfp4.defined()) return mxfp4.Dequantize();
  return is_int8() ? int8.Dequantize() : dense;
}

absl::StatusOr<std::unique_ptr<Submodel>> LoadFullModel(const std::filesystem::path& dir,
                                                        const SubmodelOptions& options) {
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir / "config.json"));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                          CheckpointReader::Open(dir));
  return Submodel::Load(config, *checkpoint, SubmodelSpec::Full(config), options);
}

}  // namespace tophat
