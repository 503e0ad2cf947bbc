#include "bench/model_benchmark.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/runtime/compute_threads.h"
#include "models/runtime/kv_cache.h"
#include "bench/machine_bounds.h"
#include "models/runtime/model_init.h"
#include "base/status_macros.h"
#include "models/runtime/submodel.h"

namespace tophat {
namespace {

using Clock = std::chrono::steady_clock;

// Context before the first timed decode step.
constexpr int64_t kDecodePromptTokens = 16;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0) return 0.0;
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

at::Tensor RandomIds(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& id : ids) id = dist(rng);
  return at::tensor(ids, at::kLong);
}

// One step of generation as a server runs it: embed, decoder layers, final norm + LM head
// on the last position, greedy argmax. Returns the next token.
absl::StatusOr<int64_t> ForwardStep(const Submodel& model, const at::Tensor& ids, KvCache& cache) {
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor hidden, model.Embed(ids));
  TOPHAT_ASSIGN_OR_RETURN(hidden, model.Forward(hidden, cache));
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits,
                          model.Logits(hidden.narrow(0, hidden.size(0) - 1, 1)));
  int64_t token = 0;
  TOPHAT_RETURN_IF_ERROR(
      CatchExceptions("argmax", [&] { token = logits.argmax(-1).item<int64_t>(); }));
  return token;
}

std::string Si(double value, std::string_view unit) {
  static constexpr const char* kPrefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (std::fabs(value) >= 1000.0 && p < 5) {
    value /= 1000.0;
    ++p;
  }
  return absl::StrFormat("%.2f %s%s", value, kPrefixes[p], std::string(unit));
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100.0 * fraction); }

}  // namespace

ModelConfig Bench110MConfig() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.vocab_size = 32000;
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 12;
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "float32";
  return c;
}

ModelConfig Llama1BShapeConfig() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  c.torch_dtype = "float32";
  return c;
}

absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed,
                              const std::filesystem::path& dir) {
  NamedTensors weights;
  TOPHAT_RETURN_IF_ERROR(CatchExceptions("initialising weights", [&] {
    weights = InitWeights(config, seed);
  }));
  return WriteCheckpoint(config, weights, dir, at::kFloat);
}

absl::StatusOr<ModelBenchReport> RunModelBenchmark(
    const std::filesystem::path& model_dir, const ModelBenchOptions& options,
    std::function<void(std::string_view)> progress) {
  auto say = [&progress](const std::string& line) {
    if (progress) progress(line);
  };
  if (options.prompt_tokens < 1 || options.decode_tokens < 1 || options.repetitions < 1) {
    return absl::InvalidArgumentError(
        "prompt_tokens, decode_tokens and repetitions must all be >= 1");
  }
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(model_dir / "config.json"));
  const int64_t decode_prompt = std::min(kDecodePromptTokens, options.prompt_tokens);
  const int64_t context = std::max(options.prompt_tokens, decode_prompt + options.decode_tokens);
  if (context > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the benchmark needs ", context, " positions but the model's context is ",
        config.max_position_embeddings));
  }

  const std::string weights = options.int8_weights && options.int8_activations   ? "w8a8"
                              : options.int8_weights                             ? "int8"
                              : options.bf16_weights && options.bf16_activations ? "bf16a16"
                              : options.bf16_weights                             ? "bfloat16"
                                                                                 : "float32";
  say(absl::StrCat("loading ", model_dir.string(), " (", weights, " weights, ",
                   options.int8_weights && options.int8_activations
                       ? "int8 activations, integer products)"
                   : options.bf16_weights && options.bf16_activations
                       ? "a prompt's activations in bfloat16, bfloat16 products)"
                       : "float32 compute)"));
  SubmodelOptions load_options;
  load_options.dtype = at::kFloat;
  load_options.max_context = context;
  load_options.quantize_int8 = options.int8_weights;
  load_options.bf16_weights = options.bf16_weights;
  load_options.int8_activations = options.int8_activations;
  load_options.bf16_activations = options.bf16_activations;
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<Submodel> model, LoadFullModel(model_dir, load_options));

  ModelBenchReport report;
  report.model_dir = model_dir.string();
  report.layers = config.num_hidden_layers;
  report.hidden_size = config.hidden_size;
  report.intermediate_size = config.intermediate_size;
  report.attention_heads = config.num_attention_heads;
  report.kv_heads = config.num_key_value_heads;
  report.vocab_size = config.vocab_size;
  report.parameters = config.ParameterCount();
  report.weights = weights;
  report.threads = at::get_num_threads();
  report.blas_threads = BlasThreads();
  report.prompt_tokens = options.prompt_tokens;
  report.decode_tokens = options.decode_tokens;
  report.decode_prompt_tokens = decode_prompt;
  report.repetitions = options.repetitions;

  std::mt19937_64 rng(20240601);
  const int64_t vocab = config.vocab_size;

  say("measuring memory read bandwidth");
  BandwidthOptions huge_page_probe;
  huge_page_probe.bytes = options.bandwidth_bytes;
  const double bandwidth_before = MeasureReadBandwidth(huge_page_probe);

  // Warm-up: thread pools, BLAS buffers, first-touch of the weights.
  {
    say("warming up");
    KvCache cache = model->NewCache(context);
    TOPHAT_ASSIGN_OR_RETURN(int64_t token,
                            ForwardStep(*model, RandomIds(rng, decode_prompt, vocab), cache));
    TOPHAT_ASSIGN_OR_RETURN(token, ForwardStep(*model, at::tensor({token}, at::kLong), cache));
    (void)token;
  }

  // Prefill: one forward pass over the whole prompt into a fresh cache, LM head on the last
  // position, argmax.
  std::vector<double> prefill_seconds;
  for (int r = 0; r < options.repetitions; ++r) {
    say(absl::StrCat("prefill ", options.prompt_tokens, " tokens (", r + 1, "/",
                     options.repetitions, ")"));
    KvCache cache = model->NewCache(context);
    at::Tensor ids = RandomIds(rng, options.prompt_tokens, vocab);
    const auto start = Clock::now();
    TOPHAT_ASSIGN_OR_RETURN(int64_t token, ForwardStep(*model, ids, cache));
    prefill_seconds.push_back(Seconds(start));
    (void)token;
  }

  // Decode: after an untimed short prompt, `decode_tokens` single-token steps, each feeding
  // the previous step's argmax.
  // With compare_layer_by_layer, each repetition times the fused step and then the
  // layer-by-layer path, so that both see the same state of a machine whose memory rate drifts.
  report.fused_decode = model->fused_cpu_decode();
  std::vector<double> decode_seconds;
  std::vector<double> layer_by_layer_seconds;
  for (int r = 0; r < options.repetitions; ++r) {
    for (const bool fused : {true, false}) {
      if (!fused && !options.compare_layer_by_layer) continue;
      model->SetFusedCpuDecode(fused);
      say(absl::StrCat("decode ", options.decode_tokens, " tokens", fused ? "" : " layer by layer",
                       " (", r + 1, "/", options.repetitions, ")"));
      KvCache cache = model->NewCache(context);
      TOPHAT_ASSIGN_OR_RETURN(int64_t token,
                              ForwardStep(*model, RandomIds(rng, decode_prompt, vocab), cache));
      const auto start = Clock::now();
      for (int64_t i = 0; i < options.decode_tokens; ++i) {
        TOPHAT_ASSIGN_OR_RETURN(token,
                                ForwardStep(*model, at::tensor({token}, at::kLong), cache));
      }
      (fused ? decode_seconds : layer_by_layer_seconds).push_back(Seconds(start));
    }
    model->SetFusedCpuDecode(true);
  }
  if (!layer_by_layer_seconds.empty()) {
    report.decode_layer_by_layer_tokens_per_s =
        static_cast<double>(options.decode_tokens) / Median(layer_by_layer_seconds);
  }
  const double prompt = static_cast<double>(options.prompt_tokens);
  const double decoded = static_cast<double>(options.decode_tokens);
  report.prefill_tokens_per_s = prompt / Median(prefill_seconds);
  report.prefill_best_tokens_per_s =
      prompt / *std::min_element(prefill_seconds.begin(), prefill_seconds.end());
  report.decode_tokens_per_s = decoded / Median(decode_seconds);
  report.decode_best_tokens_per_s =
      decoded / *std::min_element(decode_seconds.begin(), decode_seconds.end());

  // Bytes per decoded token: every weight once (WeightBytes: layers, final norm, LM head
  // and one embedding row). Reported apart from it, the K/V reads: at position p a token
  // reads K and V of p + 1 positions in every layer; averaged over the timed positions
  // decode_prompt .. decode_prompt + N - 1 that is decode_prompt + (N + 1) / 2 positions.
  const int64_t element = 4;  // float32
  report.weight_bytes_per_token = model->WeightBytes();
  report.kv_bytes_per_token = static_cast<int64_t>(
      2.0 * static_cast<double>(config.num_hidden_layers * config.kv_size() * element) *
      (static_cast<double>(decode_prompt) + (decoded + 1.0) / 2.0));

  // FLOPs per prefill token, for a prompt of T tokens:
  //   2 * L * (D * (q + 2 kv) + q * D + 3 * D * I)   the layer GEMMs (qkv, o, gate_up, down;
  //                                                  a sparse layer: the router and the
  //                                                  token's K experts, not the E)
  // + 2 * L * q * (T + 1)                            causal attention: the token at position
  //                                                  p does QK^T and PV over p + 1 keys,
  //                                                  2 * 2 * (p + 1) * q, averaged over p
  // + 2 * V * D / T                                  LM head, on the last position only
  // Norms, RoPE, SwiGLU and softmax are O(D) per token and left out. (The implementation
  // computes the masked half of the attention scores too; the bound counts useful work.)
  {
    const double d = static_cast<double>(config.hidden_size);
    const double q = static_cast<double>(config.q_size());
    const double layers = static_cast<double>(config.num_hidden_layers);
    double matmul_params = 0.0;
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      matmul_params += static_cast<double>(config.LayerActiveMatrixParameters(layer));
    }
    report.flops_per_prefill_token = 2.0 * matmul_params + 2.0 * layers * q * (prompt + 1.0) +
                                     2.0 * static_cast<double>(vocab) * d / prompt;
  }

  say("measuring memory read bandwidth (again)");
  // The bound is the better of the probes before and after the model runs: on a shared or
  // virtualised machine the attainable bandwidth drifts, and a bound must not be low.
  report.read_bandwidth_bytes_per_s =
      std::max(bandwidth_before, MeasureReadBandwidth(huge_page_probe));
  BandwidthOptions small_page_probe = huge_page_probe;
  small_page_probe.huge_pages = false;
  report.read_bandwidth_small_pages_bytes_per_s = MeasureReadBandwidth(small_page_probe);
  if (!(report.read_bandwidth_bytes_per_s > 0.0) ||
      !(report.read_bandwidth_small_pages_bytes_per_s > 0.0)) {
    return absl::ResourceExhaustedError("could not allocate the bandwidth probe's buffer");
  }

  // The GEMM rate on the prefill's own shapes, x [T, K] times a [N, K] weight transposed as
  // at::linear does it, combined as total FLOPs over total time of one layer's GEMMs.
  say("measuring GEMM rate");
  absl::Status gemm_status = CatchExceptions("GEMM benchmark", [&] {
    const int64_t t = options.prompt_tokens;
    const int64_t d = config.hidden_size;
    const int64_t q = config.q_size();
    // The first layer's MLP width (an expert's in a sparse layer; each expert's GEMMs then
    // have fewer rows than the prompt, which this rate does not model).
    const int64_t width =
        config.MoeLayer(0) ? config.moe_intermediate_size : config.intermediate_size;
    const std::vector<std::pair<int64_t, int64_t>> shapes = {// {N, K}
                                                             {q + 2 * config.kv_size(), d},
                                                             {d, q},
                                                             {2 * width, d},
                                                             {d, width}};
    double flops = 0.0;
    double seconds = 0.0;
    for (const auto& [n, k] : shapes) {
      const double f = 2.0 * static_cast<double>(t * n * k);
      const double rate = MeasureGemmFlops(t, n, k, 3, /*b_transposed=*/true);
      flops += f;
      seconds += rate > 0.0 ? f / rate : 0.0;
    }
    report.gemm_flops_per_s = seconds > 0.0 ? flops / seconds : 0.0;
    report.gemm_peak_flops_per_s = MeasureGemmFlops(1024, 1024, 1024, 3);
  });
  TOPHAT_RETURN_IF_ERROR(gemm_status);

  report.decode_bound_tokens_per_s =
      report.read_bandwidth_bytes_per_s / static_cast<double>(report.weight_bytes_per_token);
  report.prefill_bound_tokens_per_s = report.gemm_flops_per_s / report.flops_per_prefill_token;
  report.decode_fraction = report.decode_tokens_per_s / report.decode_bound_tokens_per_s;
  report.prefill_fraction = report.prefill_tokens_per_s / report.prefill_bound_tokens_per_s;
  return report;
}

nlohmann::json ModelBenchReport::ToJson() const {
  return nlohmann::json{
      {"model",
       {{"dir", model_dir},
        {"parameters", parameters},
        {"layers", layers},
        {"hidden_size", hidden_size},
        {"intermediate_size", intermediate_size},
        {"attention_heads", attention_heads},
        {"kv_heads", kv_heads},
        {"vocab_size", vocab_size},
        {"dtype", dtype},
        {"weights", weights}}},
      {"threads", threads},
      {"blas_threads", blas_threads},
      {"prompt_tokens", prompt_tokens},
      {"decode_tokens", decode_tokens},
      {"decode_prompt_tokens", decode_prompt_tokens},
      {"repetitions", repetitions},
      {"prefill_tokens_per_s", prefill_tokens_per_s},
      {"prefill_best_tokens_per_s", prefill_best_tokens_per_s},
      {"decode_tokens_per_s", decode_tokens_per_s},
      {"decode_best_tokens_per_s", decode_best_tokens_per_s},
      {"fused_decode", fused_decode},
      {"decode_layer_by_layer_tokens_per_s", decode_layer_by_layer_tokens_per_s},
      {"weight_bytes_per_token", weight_bytes_per_token},
      {"kv_bytes_per_token", kv_bytes_per_token},
      {"flops_per_prefill_token", flops_per_prefill_token},
      {"read_bandwidth_bytes_per_s", read_bandwidth_bytes_per_s},
      {"read_bandwidth_small_pages_bytes_per_s", read_bandwidth_small_pages_bytes_per_s},
      {"gemm_flops_per_s", gemm_flops_per_s},
      {"gemm_peak_flops_per_s", gemm_peak_flops_per_s},
      {"decode_bound_tokens_per_s", decode_bound_tokens_per_s},
      {"prefill_bound_tokens_per_s", prefill_bound_tokens_per_s},
      {"decode_fraction", decode_fraction},
      {"prefill_fraction", prefill_fraction},
  };
}

std::string ModelBenchReport::ToTable() const {
  std::string out = absl::StrFormat(
      "model %s: %.1fM parameters, %d layers, dim %d, intermediate %d, heads %d/%d, "
      "vocab %d, %s compute, %s weights, %d ATen threads, %d BLAS threads, decode %s\n",
      model_dir, static_cast<double>(parameters) / 1e6, layers, hidden_size, intermediate_size,
      attention_heads, kv_heads, vocab_size, dtype, weights, threads, blas_threads,
      fused_decode ? "in the fused one-token step" : "layer by layer");
  auto row = [&out](const std::string& metric, const std::string& measured,
                    const std::string& bound, const std::string& fraction) {
    absl::StrAppend(&out, absl::StrFormat("%-28s | %-16s | %-16s | %s\n", metric, measured, bound,
                                          fraction));
  };
  row("metric", "measured", "bound", "fraction");
  absl::StrAppend(&out, std::string(28, '-'), "-+-", std::string(16, '-'), "-+-",
                  std::string(16, '-'), "-+-", std::string(8, '-'), "\n");
  row(absl::StrCat("prefill (", prompt_tokens, " tokens)"), Si(prefill_tokens_per_s, "tok/s"),
      Si(prefill_bound_tokens_per_s, "tok/s"), Percent(prefill_fraction));
  row("  best repetition", Si(prefill_best_tokens_per_s, "tok/s"), "",
      Percent(prefill_best_tokens_per_s / prefill_bound_tokens_per_s));
  row(absl::StrCat("decode (", decode_tokens, " tokens)"), Si(decode_tokens_per_s, "tok/s"),
      Si(decode_bound_tokens_per_s, "tok/s"), Percent(decode_fraction));
  row("  best repetition", Si(decode_best_tokens_per_s, "tok/s"), "",
      Percent(decode_best_tokens_per_s / decode_bound_tokens_per_s));
  if (decode_layer_by_layer_tokens_per_s > 0.0) {
    row("  layer by layer", Si(decode_layer_by_layer_tokens_per_s, "tok/s"), "",
        absl::StrFormat("%s (fused step %.2fx)",
                        Percent(decode_layer_by_layer_tokens_per_s / decode_bound_tokens_per_s),
                        decode_tokens_per_s / decode_layer_by_layer_tokens_per_s));
  }
  row("read bandwidth", Si(read_bandwidth_bytes_per_s, "B/s"), "", "");
  row("  with 4 KiB pages", Si(read_bandwidth_small_pages_bytes_per_s, "B/s"), "", "");
  row("GEMM rate (prefill shapes)", Si(gemm_flops_per_s, "FLOP/s"), "", "");
  row("GEMM rate (1024^3)", Si(gemm_peak_flops_per_s, "FLOP/s"), "", "");
  row("weight bytes / token", Si(static_cast<double>(weight_bytes_per_token), "B"), "", "");
  row("KV bytes / decoded token", Si(static_cast<double>(kv_bytes_per_token), "B"), "", "");
  row("FLOPs / prefill token", Si(flops_per_prefill_token, "FLOP"), "", "");
  return out;
}

}  // namespace tophat
