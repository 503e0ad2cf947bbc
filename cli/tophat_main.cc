// `tophat`: the command line for models: make the toy model, split a checkpoint into device
// and cloud bundles, generate text, and benchmark a model against this machine's bounds.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/cli_checks.h"
#include "base/program.h"
#include "bench/dtype_numerics.h"
#include "bench/model_benchmark.h"
#include "cli/devices_command.h"
#include "cli/inspect_command.h"
#include "cli/plan_command.h"
#include "cli/serving_commands.h"
#include "cli/simulate_command.h"
#include "configs/config_checks.h"
#include "models/runtime/bundle.h"
#include "models/runtime/generate.h"
#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"
#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/tokenizer.h"
#include "models/training/distill.h"
#include "models/training/toy_corpus.h"
#include "models/training/toy_model.h"
#include "proto/hidden_states.h"

using tophat::Fail;

namespace {

namespace fs = std::filesystem;
using tophat::SubmodelOptions;

void PrintProgress(const char* what, const tophat::TrainingProgress& p) {
  const int width = 30;
  const int filled = static_cast<int>(width * p.step / std::max<int64_t>(1, p.total_steps));
  std::fprintf(stderr, "\r%s [%.*s%*s] step %lld/%lld  loss %.3f  %.0f tok/s  ETA %.0fs ", what,
               filled, "##############################", width - filled, "",
               static_cast<long long>(p.step), static_cast<long long>(p.total_steps), p.loss,
               p.tokens_per_second, p.eta_seconds);
  if (p.step == p.total_steps) std::fprintf(stderr, "\n");
}

int RunToyModel(tophat::ToyModelOptions options) {
  spdlog::info("toy-model: writing to {}", options.out_dir.string());
  auto report = tophat::MakeToyModel(
      options, [](const tophat::TrainingProgress& p) { PrintProgress("model  ", p); },
      [](const tophat::TrainingProgress& p) { PrintProgress("adapter", p); });
  if (!report.ok()) return Fail(report.status());
  if (report->reused_cache) {
    spdlog::info("toy-model: reusing the cached model in {}", options.out_dir.string());
  } else {
    spdlog::info("toy-model: trained in {:.1f}s", report->seconds);
  }
  spdlog::info(
      "toy-model: held-out loss {:.3f} nats (uniform would be {:.3f}), top-1 accuracy {:.1f}%, "
      "mean top probability {:.2f}",
      report->heldout_loss, report->uniform_loss, 100.0 * report->heldout_top1,
      report->heldout_mean_max_prob);
  if (options.adapter_input_layers > 0) {
    for (const auto& [prompt_length, accept_length] :
         report->adapter_accept_length_by_prompt_length) {
      spdlog::info("toy-model: drafter acceptance length after a {}-token held-out prompt: {:.2f}",
                   prompt_length, accept_length);
    }
    spdlog::info("toy-model: drafter adapter for m = {} ({}): {} parameters ({:.1f}% of the "
                 "model's {}), held-out acceptance length {:.2f}",
                 options.adapter_input_layers,
                 report->adapter_reused ? "cached" : fmt::format("distilled in {:.1f}s",
                                                                 report->adapter_seconds),
                 report->adapter_parameters,
                 100.0 * static_cast<double>(report->adapter_parameters) /
                     static_cast<double>(std::max<int64_t>(1, report->model_parameters)),
                 report->model_parameters, report->adapter_heldout_accept_length);
  }
  std::cout << options.out_dir.string() << "\n";
  return 0;
}

std::atomic<bool> g_interrupted{false};

int RunDistill(tophat::DistillOptions options) {
  options.interrupt = &g_interrupted;
  std::signal(SIGINT, [](int) { g_interrupted = true; });
  std::signal(SIGTERM, [](int) { g_interrupted = true; });
  spdlog::info("distill: teacher {}, data {}, writing to {}", options.model_dir.string(),
               options.data, options.out_dir.string());
  auto report = tophat::Distill(
      options, [](const tophat::TrainingProgress& p) { PrintProgress("distill", p); });
  if (!report.ok()) return Fail(report.status());
  if (!report->finished) {
    std::fprintf(stderr, "\n");
    spdlog::warn("distill: stopped at step {}; run the same command again to resume",
                 report->steps_done);
    return g_interrupted ? 130 : 0;
  }
  if (report->reused) {
    spdlog::info("distill: {} already holds the adapter these options make; reusing it",
                 options.out_dir.string());
  } else {
    spdlog::info("distill: {} steps in {:.1f}s{}; held-out loss {:.4f} -> {:.4f}",
                 report->steps_done, report->seconds,
                 report->resumed_from_step > 0
                     ? fmt::format(" (resumed at step {})", report->resumed_from_step)
                     : std::string(),
                 report->initial_heldout_loss, report->heldout_loss);
  }
  spdlog::info("distill: adapter {} parameters = {:.2f}% of the model's {}; held-out drafter "
               "top-1 agreement {:.1f}%, acceptance length {:.2f} (eta {}, max draft {})",
               report->adapter_parameters,
               100.0 * static_cast<double>(report->adapter_parameters) /
                   static_cast<double>(std::max<int64_t>(1, report->model_parameters)),
               report->model_parameters, 100.0 * report->heldout_draft_top1,
               report->heldout_accept_length, options.eta, options.max_draft);
  for (const auto& [prompt_length, accept_length] : report->accept_length_by_prompt_length) {
    spdlog::info("distill: acceptance length after a {}-token held-out prompt: {:.2f}",
                 prompt_length, accept_length);
  }
  if (report->attached_to_bundle) {
    spdlog::info("distill: recorded in {}/tophat_bundle.json", options.out_dir.string());
  }
  return 0;
}

struct GenerateArgs {
  fs::path model;
  fs::path cloud_bundle;
  std::string prompt;
  int64_t max_new_tokens = 64;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  double min_p = 0.0;
  tophat::cli::Penalties penalties;
  int64_t prefill_chunk = 0;
  bool add_bos = true;
};

int RunGenerate(const GenerateArgs& args) {
  // A device bundle runs split (with its cloud bundle, locally); a plain checkpoint runs whole.
  std::unique_ptr<tophat::Submodel> full;
  std::optional<tophat::DeviceBundle> device;
  std::optional<tophat::CloudBundle> cloud;
  std::unique_ptr<tophat::Tokenizer> tokenizer;
  std::vector<const tophat::Submodel*> stages;
  const tophat::ModelConfig* config = nullptr;
  if (fs::exists(args.model / tophat::kBundleManifestFile)) {
    if (args.cloud_bundle.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--model is a device bundle; pass its cloud half with --cloud-bundle"));
    }
    auto d = tophat::DeviceBundle::Load(args.model);
    if (!d.ok()) return Fail(d.status());
    auto c = tophat::CloudBundle::Load(args.cloud_bundle);
    if (!c.ok()) return Fail(c.status());
    device = std::move(*d);
    cloud = std::move(*c);
    stages = {device->input.get(), cloud->middle.get(), device->output.get()};
    config = &device->config;
  } else {
    auto m = tophat::LoadFullModel(args.model);
    if (!m.ok()) return Fail(m.status());
    full = std::move(*m);
    auto t = tophat::Tokenizer::Load(args.model);
    if (!t.ok()) return Fail(t.status());
    tokenizer = std::move(*t);
    stages = {full.get()};
    config = &full->config();
  }
  const tophat::Tokenizer& tok = device ? *device->tokenizer : *tokenizer;
  auto ids = tok.Encode(args.prompt);
  if (!ids.ok()) return Fail(ids.status());
  std::vector<int32_t> prompt;
  if (args.add_bos && tok.bos_id()) prompt.push_back(*tok.bos_id());
  prompt.insert(prompt.end(), ids->begin(), ids->end());

  auto generator = tophat::PipelineGenerator::Create(stages);
  if (!generator.ok()) return Fail(generator.status());
  tophat::GenerationOptions options;
  options.max_new_tokens = args.max_new_tokens;
  options.sampling = {.temperature = args.temperature,
                      .top_k = args.top_k,
                      .top_p = args.top_p,
                      .min_p = args.min_p,
                      .seed = args.seed,
                      .presence_penalty = args.penalties.presence,
                      .frequency_penalty = args.penalties.frequency,
                      .repetition_penalty = args.penalties.repetition};
  options.prefill_chunk = args.prefill_chunk;
  for (int64_t eos : config->eos_token_ids) options.stop_token_ids.push_back(static_cast<int32_t>(eos));
  if (tok.eos_id()) options.stop_token_ids.push_back(*tok.eos_id());

  // The prompt goes through the same detokenizer as the answer, so the answer's first piece
  // is decoded in context (SentencePiece drops the leading space of a text's first piece).
  tophat::StreamingDetokenizer stream(tok);
  for (int32_t id : prompt) {
    auto text = stream.Push(id);
    if (!text.ok()) return Fail(text.status());
    std::cout << *text;
  }
  std::cout << std::flush;
  auto result = generator->Generate(prompt, options, [&](int32_t token) {
    auto text = stream.Push(token);
    if (text.ok()) std::cout << *text << std::flush;
    return true;
  });
  if (!result.ok()) return Fail(result.status());
  if (auto rest = stream.Flush(); rest.ok()) std::cout << *rest;
  std::cout << std::endl;
  const double decode_rate =
      result->decode_seconds > 0 ? static_cast<double>(result->tokens.size()) / result->decode_seconds
                                 : 0.0;
  spdlog::info("{} prompt tokens in {:.1f} ms, {} new tokens at {:.1f} tokens/s ({})",
               prompt.size(), 1e3 * result->prefill_seconds, result->tokens.size(), decode_rate,
               result->finish_reason == tophat::FinishReason::kStop ? "stop" : "length");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tophat: device-cloud collaborative LLM serving — model tools and serving clients"};
  app.require_subcommand(1);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(spdlog::stderr_color_mt("tophat"));

  tophat::ToyModelOptions toy;
  toy.out_dir = tophat::DefaultToyModelDir();
  std::string toy_preset = "toy";
  auto* toy_cmd = app.add_subcommand(
      "toy-model", "Train (or reuse the cached) small Llama checkpoint on a synthetic grammar");
  toy_cmd->add_option("--preset", toy_preset,
                      "toy: the small model of the tests and demo (64-token windows, dim 192, "
                      "6 layers; minutes). eval: the ablation's evaluation model (1,024-token "
                      "windows, dim 256, 8 layers; about an hour on 2 cores), cached in " +
                          tophat::DefaultEvalModelDir().string() +
                          "; --steps, --adapter-steps and --out override it")
      ->capture_default_str()
      ->check(CLI::IsMember({"toy", "eval"}));
  auto* toy_out = toy_cmd->add_option("--out", toy.out_dir,
                                      "Output directory (cached: reused if up to date)")
      ->capture_default_str();
  auto* toy_steps = toy_cmd->add_option("--steps", toy.steps, "Training steps")
      ->capture_default_str()->check(tophat::PositiveNumber());
  toy_cmd->add_option("--seed", toy.seed, "Seed for corpus, init and batches")
      ->capture_default_str();
  toy_cmd->add_option("--threads", toy.threads, "Training threads (part of the cache key)")
      ->capture_default_str()->check(tophat::PositiveNumber());

  toy_cmd->add_option("--adapter-input-layers", toy.adapter_input_layers,
                      "Distil the shipped drafter adapter for this m (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  auto* toy_adapter_steps =
      toy_cmd->add_option("--adapter-steps", toy.adapter_steps, "Adapter distillation steps")
          ->capture_default_str()->check(tophat::PositiveNumber());

  tophat::DistillOptions distill;
  auto* distill_cmd = app.add_subcommand(
      "distill",
      "Train the drafter's adapter by distillation from the full model (resumable; Ctrl-C "
      "checkpoints)");
  distill_cmd->add_option("--model", distill.model_dir, "Full Hugging Face checkpoint (teacher)")
      ->required()->check(CLI::ExistingDirectory);
  distill_cmd->add_option("--data", distill.data,
                          "\"toy\" (synthetic grammar), a text file (one document per line) "
                          "or a .jsonl file with a \"text\" field")
      ->capture_default_str();
  distill_cmd->add_option("--out", distill.out_dir,
                          "Output directory; a device bundle also gets it in its manifest")
      ->required();
  distill_cmd->add_option("--input-layers,-m", distill.input_layers,
                          "m (0: the device bundle's, else 2)")->capture_default_str();
  distill_cmd->add_option("--intermediate-size", distill.intermediate_size,
                          "Adapter MLP width (0: the model's)")->capture_default_str();
  distill_cmd->add_option("--init-layer", distill.init_layer,
                          "Teacher layer the adapter starts from (-1: layer m)")
      ->capture_default_str();
  distill_cmd->add_option("--steps", distill.steps)->capture_default_str()
      ->check(tophat::PositiveNumber());
  distill_cmd->add_option("--batch-size", distill.batch_size)->capture_default_str()
      ->check(tophat::PositiveNumber());
  distill_cmd->add_option("--sequence-length", distill.sequence_length)->capture_default_str();
  distill_cmd->add_option("--lr", distill.learning_rate, "Peak learning rate")
      ->capture_default_str();
  distill_cmd->add_option("--ce-weight", distill.ce_weight, "Weight of the cross-entropy term")
      ->capture_default_str();
  distill_cmd->add_option("--seed", distill.seed)->capture_default_str();
  distill_cmd->add_option("--checkpoint-every", distill.checkpoint_every)->capture_default_str()
      ->check(tophat::PositiveNumber());
  distill_cmd->add_option("--stop-after", distill.stop_after,
                          "Stop (resumable) after this many steps in this run; 0: run to the end")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  distill_cmd->add_option("--eta", distill.eta, "Draft confidence threshold for the estimate")
      ->capture_default_str();
  distill_cmd->add_option("--max-draft", distill.max_draft)->capture_default_str();
  distill_cmd
      ->add_option("--eval-prompt-lengths", distill.eval_prompt_lengths,
                   "Held-out prompt lengths the acceptance is measured after (comma-separated; "
                   "the first is the reported acceptance length)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(tophat::PositiveNumber());
  distill_cmd->add_option("--threads", distill.threads, "Training threads (part of the run's identity)")
      ->capture_default_str()->check(tophat::PositiveNumber());

  tophat::SplitOptions split;
  auto* split_cmd = app.add_subcommand(
      "split", "Split a checkpoint into a device bundle and a cloud bundle");
  split_cmd->add_option("--model", split.model_dir, "Hugging Face checkpoint directory")
      ->required()->check(CLI::ExistingDirectory);
  split_cmd->add_option("--input-layers,-m", split.input_layers,
                        "Decoder layers on the device before the cloud (m)")
      ->capture_default_str();
  split_cmd->add_option("--output-layers,-k", split.output_layers,
                        "Decoder layers on the device after the cloud (k)")
      ->capture_default_str();
  split_cmd->add_option("--out", split.out_dir, "Directory that receives device/ and cloud/")
      ->required();
  std::string split_device_weights = "as-stored";
  split_cmd->add_option("--device-weights", split_device_weights,
                        "The device bundle's weight matrices: as-stored (the checkpoint's "
                        "dtype), or int8 with a float32 scale per row (a quarter of float32's "
                        "bytes; the cloud bundle keeps the checkpoint's dtype)")
      ->capture_default_str()->check(CLI::IsMember({"as-stored", "int8"}));

  GenerateArgs gen;
  auto* gen_cmd = app.add_subcommand("generate", "Generate text, streaming it to the terminal");
  gen_cmd->add_option("--model", gen.model, "Checkpoint directory, or a device bundle")
      ->required()->check(CLI::ExistingDirectory);
  gen_cmd->add_option("--cloud-bundle", gen.cloud_bundle,
                      "With a device bundle: its cloud bundle, run in this process")
      ->check(CLI::ExistingDirectory);
  gen_cmd->add_option("--prompt", gen.prompt, "Prompt text")->required();
  gen_cmd->add_option("--max-new-tokens", gen.max_new_tokens)->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--temperature", gen.temperature, "0 means greedy")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--top-k", gen.top_k, "0 keeps every token")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--top-p", gen.top_p)->capture_default_str()->check(CLI::Range(1e-9, 1.0));
  gen_cmd->add_option("--seed", gen.seed)->capture_default_str();
  gen_cmd->add_option("--min-p", gen.min_p, "Keeps tokens at least this times as likely as the "
                      "likeliest (0: off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  tophat::cli::AddPenaltyOptions(*gen_cmd, gen.penalties);
  gen_cmd->add_option("--prefill-chunk", gen.prefill_chunk,
                      "Prompt tokens per forward pass (0: all at once)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  gen_cmd->add_flag("!--no-bos", gen.add_bos, "Do not prepend the BOS token");

  fs::path bench_model_dir;
  fs::path bench_json;
  tophat::ModelBenchOptions bench;
  auto* bench_cmd = app.add_subcommand(
      "bench-model", "Prefill and decode speed against this machine's GEMM and bandwidth bounds");
  bench_cmd->add_option("--model", bench_model_dir, "Checkpoint directory")->required()
      ->check(CLI::ExistingDirectory);
  bench_cmd->add_option("--prompt-tokens", bench.prompt_tokens)->capture_default_str();
  bench_cmd->add_option("--decode-tokens", bench.decode_tokens)->capture_default_str();
  bench_cmd->add_option("--repetitions", bench.repetitions)->capture_default_str();
  bench_cmd->add_option("--json", bench_json, "Also write the report as JSON here");
  std::string bench_weights = "float32";
  bench_cmd
      ->add_option("--weights", bench_weights,
                   "The weight matrices' storage: float32, bfloat16, or int8 with per-row "
                   "scales (converted at load; activations stay float32); w8a8: int8 "
                   "weights with activations rounded to int8 per block of 32, multiplied "
                   "in integers; bf16a16: bfloat16 weights with a prompt's activations "
                   "rounded to bfloat16, bfloat16 products where the CPU has AVX512_BF16")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "bf16a16", "int8", "w8a8"}));

  bench_cmd->add_flag("--compare-layer-by-layer", bench.compare_layer_by_layer,
                      "Also time decode with the fused one-token CPU step off (the "
                      "layer-by-layer path), repetitions alternating, and print the ratio");

  tophat::DtypeNumericsOptions numerics;
  std::string numerics_dtype = "bfloat16";
  std::string numerics_device = "cpu";
  std::string numerics_wire = "cloud";
  int64_t numerics_prompts = 100;
  fs::path numerics_json;
  auto* numerics_cmd = app.add_subcommand(
      "bench-dtype",
      "How far the device's compute dtype and the wire dtype move the split model from "
      "float32: input and output submodels in --dtype, the middle in float32, hidden states "
      "encoded in --wire-dtype where they cross (as tophat-agent and tophat-cloud do); max and "
      "mean logit error and greedy agreement over toy-grammar prompts");
  numerics_cmd->add_option("--model", numerics.model_dir, "Checkpoint directory (with a tokenizer)")
      ->required()->check(CLI::ExistingDirectory);
  numerics_cmd->add_option("-m,--input-layers", numerics.input_layers)->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  numerics_cmd->add_option("-k,--output-layers", numerics.output_layers)->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  numerics_cmd->add_option("--dtype", numerics_dtype, "The device's compute dtype")
      ->capture_default_str()->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  numerics_cmd->add_option("--device", numerics_device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  numerics_cmd->add_option("--wire-dtype", numerics_wire,
                           "The hidden states' dtype on the link, both ways (cloud: float32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cloud", "float32", "float16", "bfloat16", "int8"}));
  numerics_cmd->add_option("--prompts", numerics_prompts)->capture_default_str()
      ->check(CLI::Range(1, 100000));
  numerics_cmd->add_option("--new-tokens", numerics.new_tokens, "Greedy tokens per prompt")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  numerics_cmd->add_option("--json", numerics_json, "Also write the report as JSON here");
  numerics_cmd->add_flag("--device-int8-weights", numerics.device_int8_weights,
                         "The device submodels' weight matrices in int8 with per-row scales "
                         "(as `tophat split --device-weights int8`), computed in --dtype float32");
  numerics_cmd->add_flag("--device-int8-activations", numerics.device_int8_activations,
                         "With --device-int8-weights: the device's activations rounded to int8 "
                         "per block of 32 too, integer products (agent.yaml int8_activations)");

  fs::path init_out;
  std::string init_preset = "bench-110m";
  uint64_t init_seed = 0;
  auto* init_cmd = app.add_subcommand(
      "init-model", "Write a randomly initialised checkpoint (for benchmarks and tests)");
  init_cmd->add_option("--out", init_out, "Output directory")->required();
  std::string init_dtype = "float32";
  init_cmd->add_option("--preset", init_preset,
                       "bench-110m (dim 768, 12 layers), llama-1b (Llama 3.2 1B's shape, with a "
                       "placeholder byte-level tokenizer so that it can be served) or tiny")
      ->capture_default_str()->check(CLI::IsMember({"bench-110m", "llama-1b", "tiny"}));
  init_cmd->add_option("--dtype", init_dtype, "dtype of the stored weights")
      ->capture_default_str()->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  init_cmd->add_option("--seed", init_seed)->capture_default_str();

  tophat::cli::PlanArgs plan;
  auto* plan_cmd = app.add_subcommand(
      "plan", "Choose the cloud's pipeline stages: profile each device's layer times, run "
              "EdgeShard's planner, print the plan against an even split and its config lines");
  plan_cmd->add_option("--model", plan.model_dir, "Hugging Face checkpoint directory")
      ->required()->check(CLI::ExistingDirectory);
  plan_cmd->add_option("--input-layers,-m", plan.input_layers, "The middle starts at layer m")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  plan_cmd->add_option("--output-layers,-k", plan.output_layers,
                       "... and ends k layers before the last")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  plan_cmd->add_option("--device", plan.devices,
                       "A stage device, stage 0 first (repeat): cpu, cpu:THREADS, cuda, cuda:N")
      ->required();
  plan_cmd->add_option("--memory-gib", plan.memory_gib,
                       "Memory each device can give the layers, one per --device (default: no "
                       "limit)");
  plan_cmd->add_option("--link-mb-s", plan.link_mb_per_s, "Bandwidth between stage devices")
      ->capture_default_str()->check(tophat::PositiveNumber());
  plan_cmd->add_option("--tokens", plan.tokens, "Positions per profiled step")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  plan_cmd->add_option("--repetitions", plan.repetitions, "Timed runs per layer (median)")
      ->capture_default_str()->check(tophat::PositiveNumber());
  plan_cmd->add_option("--objective", plan.objective,
                       "throughput (micro-batches in flight: the slowest stage) or latency (one "
                       "step through every stage)")
      ->capture_default_str()->check(CLI::IsMember({"throughput", "latency"}));

  tophat::cli::DevicesArgs devices;
  auto* devices_cmd = app.add_subcommand(
      "devices",
      "Who holds a running tophat-cloud: the devices whose open sessions count the "
      "most KV blocks, from its metrics port's /devices, as a table");
  devices_cmd
      ->add_option("--cloud-metrics", devices.cloud_metrics,
                   "The cloud's metrics_address, HOST:PORT")
      ->capture_default_str();
  devices_cmd->add_option("--limit", devices.limit, "Devices listed")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  devices_cmd->add_flag("--json", devices.json, "Print the endpoint's JSON as it came");
  devices_cmd
      ->add_option("--timeout-s", devices.timeout_s,
                   "How long to wait for the cloud (it answers between engine steps)")
      ->capture_default_str()
      ->check(tophat::PositiveNumber());

  tophat::cli::InspectArgs inspect;
  auto* inspect_cmd = app.add_subcommand(
      "inspect",
      "What tophat makes of a checkpoint before you split or serve it: its architecture and "
      "features, weights, tokenizer, chat template, whether a GPU cloud computes it, and each "
      "side's bytes for a split; read by the loaders serving uses, so errors are theirs");
  inspect_cmd->add_option("--model", inspect.model, "Hugging Face checkpoint directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  inspect_cmd
      ->add_option("-m,--input-layers", inspect.input_layers,
                   "Decoder layers on the device before the cloud (m), for the split's bytes")
      ->capture_default_str();
  inspect_cmd
      ->add_option("-k,--output-layers", inspect.output_layers,
                   "Decoder layers on the device after the cloud (k)")
      ->capture_default_str();
  inspect_cmd->add_flag("--json", inspect.json, "Print the inspection as JSON");

  tophat::cli::SimulateArgs simulate;
  auto* simulate_cmd = tophat::cli::AddSimulateCommand(app, simulate);

  tophat::cli::ChatArgs chat;
  auto* chat_cmd = app.add_subcommand(
      "chat", "Talk to a running tophat-agent (one prompt per line, or --prompt once)");
  chat_cmd->add_option("--agent", chat.agent, "tophat-agent host:port")->capture_default_str();
  chat_cmd->add_option("--prompt", chat.prompt, "Ask once and exit");
  chat_cmd->add_option("--max-new-tokens", chat.max_new_tokens)->capture_default_str()
      ->check(tophat::PositiveNumber());
  chat_cmd->add_option("--temperature", chat.temperature, "0 means greedy")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  chat_cmd->add_option("--top-k", chat.top_k)->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  chat_cmd->add_option("--top-p", chat.top_p)->capture_default_str()
      ->check(CLI::Range(1e-9, 1.0));
  chat_cmd->add_option("--seed", chat.seed)->capture_default_str();
  chat_cmd->add_option("--min-p", chat.min_p, "Keeps tokens at least this times as likely as "
                       "the likeliest (0: off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  tophat::cli::AddPenaltyOptions(*chat_cmd, chat.penalties);
  chat_cmd->add_flag("--json", chat.json,
                     "Answer with a JSON object: each token is chosen to keep it one, and the "
                     "answer ends when it closes (docs/openai.md, \"JSON answers\")");
  chat_cmd->add_option("--json-schema", chat.json_schema_path,
                       "Answer with a value of the JSON Schema in FILE, each token chosen to "
                       "keep it one (docs/openai.md, \"JSON answers\")")
      ->excludes("--json");
  chat_cmd
      ->add_option("--regex", chat.regex,
                   "Answer with text this regular expression matches whole, each token "
                   "chosen to keep a match possible (docs/openai.md, \"Regular expressions "
                   "and choices\")")
      ->excludes("--json", "--json-schema");
  chat_cmd
      ->add_option("--grammar", chat.grammar_path,
                   "Answer with text the GBNF grammar in FILE (llama.cpp's syntax) matches "
                   "whole from its root rule, each token chosen to keep a match possible "
                   "(docs/openai.md, \"Grammars\")")
      ->excludes("--json", "--json-schema", "--regex");
  chat_cmd
      ->add_option("--structural-tag", chat.structural_tag_path,
                   "Answer with text in which each structure of the structural tag in FILE "
                   "(JSON: {\"structures\": [{\"begin\", \"schema\", \"end\"}], "
                   "\"triggers\": [...]}) that the text starts is whole and valid "
                   "(docs/openai.md, \"Structural tags\")")
      ->excludes("--json", "--json-schema", "--regex", "--grammar");
  chat_cmd->add_flag("--stats", chat.stats, "Print TTFT and mean TBT after each answer");
  chat_cmd->add_option("--trace", chat.trace_path,
                       "Write each answer's trace (prompt chunks: device, upload, queue, "
                       "compute, download times; decode rounds) as JSON to FILE, or - for "
                       "stderr");

  tophat::cli::BenchArgs serve_bench;
  std::string bench_agents = "127.0.0.1:7200";
  auto* serve_bench_cmd = app.add_subcommand(
      "bench", "Workload driver: Poisson arrivals across agents; TTFT/TBT percentiles, "
               "throughput and SLA compliance");
  serve_bench_cmd->add_option("--agents", bench_agents, "Comma-separated agent host:ports")
      ->capture_default_str();
  serve_bench_cmd->add_option("--prompt", serve_bench.prompts,
                              "Text prompt (repeatable): one request each, sent together, "
                              "with a per-request table");
  serve_bench_cmd->add_option("--requests", serve_bench.requests)->capture_default_str()
      ->check(tophat::PositiveNumber());
  serve_bench_cmd->add_option("--rate", serve_bench.rate, "Requests/s (Poisson); 0 = all at once")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  serve_bench_cmd->add_option("--prompt-lengths", serve_bench.prompt_lengths,
                              "specbench (mean 351, P90 891), cnndm (mean 1037, P90 1772), "
                              "fixed:N, or a file of lengths")
      ->capture_default_str();
  serve_bench_cmd->add_option("--output-tokens", serve_bench.output_tokens)
      ->capture_default_str()->check(tophat::PositiveNumber());
  serve_bench_cmd->add_option("--sla-ttft", serve_bench.sla_ttft_s, "SLA on TTFT, seconds")
      ->capture_default_str();
  serve_bench_cmd->add_option("--sla-tbt", serve_bench.sla_tbt_s, "SLA on mean TBT, seconds")
      ->capture_default_str();
  serve_bench_cmd->add_option("--seed", serve_bench.seed)->capture_default_str();
  serve_bench_cmd->add_option("--json", serve_bench.json_path, "Write the report as JSON here");
  serve_bench_cmd->add_flag("--per-request", serve_bench.per_request, "Print every request");

  // The ablation starts its own cloud and agents; the options above that it shares are
  // --requests, --output-tokens, --seed, --sla-* and --json.
  tophat::cli::AblationArgs ablation;
  bool run_ablation = false;
  std::string ablation_datasets = "specbench,cnndm";
  std::string ablation_rates = "1,2";
  auto* ablation_flag = serve_bench_cmd->add_flag(
      "--ablation", run_ablation,
      "HAT's ablation: for each configuration (U-shape, +spec, +chunk, +spec+chunk, +parallel, "
      "+pipeinfer, "
      "U-Sarathi-128/256, +jupiter) start a cloud and --devices agents behind emulated edge links, run "
      "the same seeded workload, print a Table-V-style table, write SLA CDF plots (PNG) and "
      "JSON into --work-dir");
  serve_bench_cmd->add_option("--model", ablation.model_dir,
                              "Ablation: checkpoint directory (split at m=2, k=1), or eval (the "
                              "evaluation model of `tophat toy-model --preset eval`) or toy (the "
                              "tests' small model); both are trained on first use and cached")
      ->capture_default_str()
      ->needs(ablation_flag);
  serve_bench_cmd->add_option("--work-dir", ablation.work_dir,
                              "Ablation: configs, logs, plots and JSON go here")
      ->capture_default_str()->needs(ablation_flag);
  serve_bench_cmd->add_option("--configs", ablation.configs,
                              "Ablation: 'all' or comma-separated configuration names")
      ->capture_default_str()->needs(ablation_flag);
  serve_bench_cmd->add_option("--devices", ablation.devices, "Ablation: agents (devices)")
      ->capture_default_str()->check(CLI::Range(1, 32))->needs(ablation_flag);
  serve_bench_cmd->add_option("--datasets", ablation_datasets,
                              "Ablation: comma-separated prompt-length distributions")
      ->capture_default_str()->needs(ablation_flag);
  serve_bench_cmd->add_option("--rates", ablation_rates,
                              "Ablation: comma-separated request rates (requests/s)")
      ->capture_default_str()->needs(ablation_flag);
  serve_bench_cmd->add_option("--links", ablation.links,
                              "Ablation: netns (namespaces + tc, needs root), emulated "
                              "(in-process shaper), or auto (netns when possible)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "netns", "emulated"}))
      ->needs(ablation_flag);
  serve_bench_cmd->add_option("--links-script", ablation.links_script,
                              "Ablation: the namespace script (default: deploy/edge-links.sh)")
      ->needs(ablation_flag);
  serve_bench_cmd->add_option("--one-way-delay-ms", ablation.one_way_delay_ms,
                              "Ablation: link delay each way")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->needs(ablation_flag);
  serve_bench_cmd->add_flag("!--no-link-scaling", ablation.scale_links,
                            "Ablation: use HAT's 5-10 MB/s up, 10-15 MB/s down as is, instead "
                            "of scaling them so each token takes Vicuna-7B's time on the wire")
      ->needs(ablation_flag);
  serve_bench_cmd->add_option("--wire-dtype", ablation.wire_dtype,
                              "Ablation: every agent's wire_dtype (hidden states on the links; "
                              "the links keep their float32 scaling; scheduler: the cloud's "
                              "choice among float32 and float16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cloud", "scheduler", "float32", "float16", "bfloat16", "int8"}))
      ->needs(ablation_flag);
  serve_bench_cmd->add_flag("!--no-uplink-pacing", ablation.uplink_pacing,
                            "Ablation: agents send prompt chunks as they are computed instead "
                            "of pacing them by the cloud's receipts (the behaviour before "
                            "uplink pacing)")
      ->needs(ablation_flag);
  serve_bench_cmd->add_option("--cloud-stages", ablation.cloud_stages,
                              "Ablation: the cloud's middle layers in this many pipeline stages "
                              "(one tophat-cloud process each on this host, linked by Gloo, the "
                              "layers split evenly, the cores shared among them)")
      ->capture_default_str()->check(CLI::Range(1, 16))->needs(ablation_flag);
  serve_bench_cmd->add_option("--link-period", ablation.link_period_s,
                              "Ablation: seconds between bandwidth changes (netns links)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->needs(ablation_flag);
  auto* output_tokens_option = serve_bench_cmd->get_option("--output-tokens");

  // CLI11 answers `--help` before it looks at the words before it, so `tophat NOSUCH --help`
  // would print the top-level help and exit 0: an unknown subcommand is named first.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    bool known = false;
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
      known |= sub->check_name(word);
    }
    if (!known) {
      std::fprintf(stderr, "tophat: unknown subcommand '%s'; the subcommands are: %s\n",
                   word.c_str(), absl::StrJoin(names, ", ").c_str());
      return 2;
    }
  }
  CLI11_PARSE(app, argc, argv);

  if (*chat_cmd) return tophat::cli::RunChat(chat);
  if (*plan_cmd) return tophat::cli::RunPlan(plan);
  if (*devices_cmd) return tophat::cli::RunDevices(devices);
  if (*inspect_cmd) return tophat::cli::RunInspect(inspect);
  if (*simulate_cmd) return tophat::cli::RunSimulate(simulate);
  if (*serve_bench_cmd && run_ablation) {
    ablation.datasets.clear();
    for (const auto& part : CLI::detail::split(ablation_datasets, ',')) {
      if (!part.empty()) ablation.datasets.push_back(part);
    }
    ablation.rates.clear();
    for (const auto& part : CLI::detail::split(ablation_rates, ',')) {
      if (part.empty()) continue;
      double rate = 0;
      if (!CLI::detail::lexical_cast(part, rate) || rate <= 0) {
        return Fail(absl::InvalidArgumentError(
            "--rates: \"" + part + "\" is not a positive number of requests/s"));
      }
      ablation.rates.push_back(rate);
    }
    ablation.requests = serve_bench.requests;
    // HAT's evaluation generates 128 tokens per request.
    ablation.output_tokens = output_tokens_option->count() > 0 ? serve_bench.output_tokens : 128;
    ablation.seed = serve_bench.seed;
    ablation.sla_ttft_s = serve_bench.sla_ttft_s;
    ablation.sla_tbt_s = serve_bench.sla_tbt_s;
    ablation.json_path = serve_bench.json_path;
    return tophat::cli::RunAblationCommand(ablation);
  }
  if (*serve_bench_cmd) {
    serve_bench.agents.clear();
    for (const auto& part : CLI::detail::split(bench_agents, ',')) {
      if (!part.empty()) serve_bench.agents.push_back(part);
    }
    return tophat::cli::RunBench(serve_bench);
  }
  if (*toy_cmd) {
    if (toy_preset == "eval") {
      // The preset's shape and recipe; what was given on the command line still wins.
      tophat::ToyModelOptions eval = tophat::EvalModelOptions();
      if (toy_out->count() > 0) eval.out_dir = toy.out_dir;
      if (toy_steps->count() > 0) eval.steps = toy.steps;
      if (toy_adapter_steps->count() > 0) eval.adapter_steps = toy.adapter_steps;
      eval.seed = toy.seed;
      eval.threads = toy.threads;
      eval.adapter_input_layers = toy.adapter_input_layers;
      toy = eval;
    }
    return RunToyModel(toy);
  }
  if (*distill_cmd) return RunDistill(distill);
  if (*split_cmd) {
    if (split_device_weights == "int8") split.device_weights = tophat::DeviceWeights::kInt8;
    auto result = tophat::SplitCheckpoint(split);
    if (!result.ok()) return Fail(result.status());
    if (result->device.adapter) {
      spdlog::info("device bundle carries the drafter adapter ({} parameters)",
                   result->device.adapter->num_parameters);
    } else if (!result->adapter_note.empty()) {
      spdlog::warn("{}", result->adapter_note);
    }
    spdlog::info("device bundle: {} (embedding, layers [0, {}), layers [{}, {}), head{})",
                 result->device_dir.string(), result->device.input_layers.end,
                 result->device.output_layers.begin, result->device.output_layers.end,
                 result->device.weights == "int8" ? "; int8 weights" : "");
    spdlog::info("cloud bundle:  {} (layers [{}, {}), no embedding, no head)",
                 result->cloud_dir.string(), result->cloud.middle_layers.begin,
                 result->cloud.middle_layers.end);
    return 0;
  }
  if (*gen_cmd) return RunGenerate(gen);
  if (*bench_cmd) {
    bench.int8_weights = bench_weights == "int8" || bench_weights == "w8a8";
    bench.int8_activations = bench_weights == "w8a8";
    bench.bf16_weights = bench_weights == "bfloat16" || bench_weights == "bf16a16";
    bench.bf16_activations = bench_weights == "bf16a16";
    auto report = tophat::RunModelBenchmark(bench_model_dir, bench, [](std::string_view line) {
      spdlog::info("{}", line);
    });
    if (!report.ok()) return Fail(report.status());
    std::cout << report->ToTable() << "\n" << report->ToJson().dump(2) << "\n";
    if (!bench_json.empty()) {
      std::ofstream out(bench_json);
      out << report->ToJson().dump(2) << "\n";
    }
    return 0;
  }
  if (*numerics_cmd) {
    if (absl::Status s = tophat::CheckDevice(numerics_device); !s.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--device: ", s.message())));
    }
    if (absl::Status s = tophat::CheckDtypeOnDevice(numerics_dtype, numerics_device); !s.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--dtype: ", s.message())));
    }
    auto dtype = tophat::ParseTorchDtypeName(numerics_dtype, "--dtype");
    if (!dtype.ok()) return Fail(dtype.status());
    numerics.device_dtype = *dtype;
    numerics.device = at::Device(numerics_device);
    if (numerics_wire != "cloud") {
      auto wire = tophat::ParseWireDtypeName(numerics_wire);
      if (!wire.ok()) return Fail(wire.status());
      numerics.wire_dtype = *wire;
    }
    auto tokenizer = tophat::Tokenizer::Load(numerics.model_dir);
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& text : tophat::ToyPrompts(2024, numerics_prompts)) {
      auto ids = (*tokenizer)->Encode(text, /*parse_special=*/false);
      if (!ids.ok()) return Fail(ids.status());
      if (auto bos = (*tokenizer)->bos_id()) ids->insert(ids->begin(), *bos);
      prompts.push_back(*std::move(ids));
    }
    if (numerics.device_int8_activations && !numerics.device_int8_weights) {
      return Fail(absl::InvalidArgumentError(
          "--device-int8-activations needs --device-int8-weights (activations are rounded for "
          "int8 matrices only)"));
    }
    spdlog::info("bench-dtype: {} prompts, {} greedy tokens each, device dtype {}, wire {}",
                 prompts.size(), numerics.new_tokens, numerics_dtype, numerics_wire);
    auto report = tophat::MeasureDeviceDtype(numerics, prompts);
    if (!report.ok()) return Fail(report.status());
    std::cout << report->ToTable() << "\n" << report->ToJson().dump(2) << "\n";
    if (!numerics_json.empty()) {
      std::ofstream out(numerics_json);
      out << report->ToJson().dump(2) << "\n";
    }
    return 0;
  }
  if (*init_cmd) {
    const tophat::ModelConfig config = init_preset == "tiny"       ? tophat::TinyTestConfig()
                                       : init_preset == "llama-1b" ? tophat::Llama1BShapeConfig()
                                                                   : tophat::Bench110MConfig();
    auto dtype = tophat::ParseTorchDtypeName(init_dtype, "--dtype");
    if (!dtype.ok()) return Fail(dtype.status());
    spdlog::info("init-model: writing a random {} checkpoint ({}) to {}", init_preset,
                 init_dtype, init_out.string());
    absl::Status status = tophat::WriteCheckpoint(
        config, tophat::InitWeights(config, init_seed), init_out, *dtype);
    if (!status.ok()) return Fail(status);
    if (init_preset == "llama-1b") {
      std::ofstream out(init_out / "tokenizer.json");
      out << tophat::PlaceholderByteLevelTokenizerJson(
          static_cast<int32_t>(config.vocab_size), static_cast<int32_t>(*config.bos_token_id),
          static_cast<int32_t>(config.eos_token_ids.front()));
      if (!out) {
        return Fail(absl::InternalError(
            absl::StrCat((init_out / "tokenizer.json").string(), ": write failed")));
      }
    }
    return 0;
  }
  return 0;
}
