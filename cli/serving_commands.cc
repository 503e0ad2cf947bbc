#include "cli/serving_commands.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/program.h"
#include "base/program_paths.h"
#include "bench/ablation.h"
#include "bench/workload_runner.h"
#include "models/formats/config.h"
#include "models/runtime/bundle.h"
#include "models/tokenizers/tokenizer.h"
#include "models/training/toy_corpus.h"
#include "models/training/toy_model.h"
#include "sdk/client.h"

using tophat::Fail;

namespace tophat::cli {
namespace {

// deploy/edge-links.sh in the first folder above this program that has it: the source tree
// of a build tree's program (build/release/bin -> the sources), with no path of the machine
// that built it compiled in. Elsewhere --links-script names it.
std::filesystem::path EdgeLinksScriptAboveProgram() {
  const std::filesystem::path relative = std::filesystem::path("deploy") / "edge-links.sh";
  std::error_code ec;
  for (const std::filesystem::path& dir : FoldersAboveProgram()) {
    if (std::filesystem::exists(dir / relative, ec)) return dir / relative;
  }
  return relative;  // relative to the working directory; the ablation says if it is missing
}

const char* FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "error";
    case v1::FINISH_REASON_UNSPECIFIED:
    case v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return "unspecified";
}

// The texts of the files --json-schema, --grammar and --structural-tag name ("" without).
struct FormatFiles {
  std::string json_schema;
  std::string grammar;
  std::string structural_tag;
};

v1::GenerateRequest MakeRequest(const ChatArgs& args, const FormatFiles& files,
                                const std::string& prompt) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_max_new_tokens(static_cast<uint32_t>(args.max_new_tokens));
  request.mutable_sampling()->set_temperature(static_cast<float>(args.temperature));
  request.mutable_sampling()->set_top_k(static_cast<uint32_t>(args.top_k));
  request.mutable_sampling()->set_top_p(static_cast<float>(args.top_p));
  request.mutable_sampling()->set_min_p(static_cast<float>(args.min_p));
  request.mutable_sampling()->set_seed(args.seed);
  request.mutable_sampling()->set_presence_penalty(static_cast<float>(args.penalties.presence));
  request.mutable_sampling()->set_frequency_penalty(static_cast<float>(args.penalties.frequency));
  request.mutable_sampling()->set_repetition_penalty(static_cast<float>(args.penalties.repetition));
  request.set_response_format(!files.json_schema.empty() ? v1::RESPONSE_FORMAT_JSON_SCHEMA
                              : args.json                ? v1::RESPONSE_FORMAT_JSON_OBJECT
                                                         : v1::RESPONSE_FORMAT_TEXT);
  request.set_json_schema(files.json_schema);
  if (!args.regex.empty()) {
    request.set_response_format(v1::RESPONSE_FORMAT_REGEX);
    request.set_regex(args.regex);
  }
  if (!files.grammar.empty()) {
    request.set_response_format(v1::RESPONSE_FORMAT_GRAMMAR);
    request.set_grammar(files.grammar);
  }
  if (!files.structural_tag.empty()) {
    request.set_response_format(v1::RESPONSE_FORMAT_STRUCTURAL_TAG);
    request.set_structural_tag(files.structural_tag);
  }
  request.set_trace(!args.trace_path.empty());
  return request;
}

// The text of the file a flag names: an error naming the flag and the file when it cannot
// be read or is empty.
absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return absl::DataLossError(absl::StrCat(flag, ": cannot read ", path));
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is empty"));
  return text;
}

}  // namespace

void AddPenaltyOptions(CLI::App& command, Penalties& penalties) {
  command
      .add_option("--presence-penalty", penalties.presence,
                  "Taken from the logit of every token already generated (OpenAI's "
                  "presence_penalty; 0: off)")
      ->capture_default_str()
      ->check(CLI::Range(-2.0, 2.0));
  command
      .add_option("--frequency-penalty", penalties.frequency,
                  "Taken from a token's logit once per time it was generated (OpenAI's "
                  "frequency_penalty; 0: off)")
      ->capture_default_str()
      ->check(CLI::Range(-2.0, 2.0));
  command
      .add_option("--repetition-penalty", penalties.repetition,
                  "Divides the positive logits of the prompt's and the generated tokens, "
                  "multiplies the others (Hugging Face's; 1: off)")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 100.0));
}

int RunChat(const ChatArgs& args) {
  FormatFiles files;
  for (const auto& [flag, path, text] :
       {std::tuple{"--json-schema", &args.json_schema_path, &files.json_schema},
        {"--grammar", &args.grammar_path, &files.grammar},
        {"--structural-tag", &args.structural_tag_path, &files.structural_tag}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> read = ReadFlagFile(flag, *path);
    if (!read.ok()) return Fail(read.status());
    *text = *std::move(read);
  }
  auto client = Client::Connect(args.agent);
  if (!client.ok()) return Fail(client.status());
  const auto ask = [&](const std::string& prompt) -> int {
    auto result = (*client)->Generate(
        MakeRequest(args, files, prompt),
        [](const v1::GenerateResponse& update) { std::cout << update.text() << std::flush; });
    // Flushed before anything goes to stderr: where stdout is a pipe it is buffered, and the
    // statistics line would land inside the answer.
    std::cout << std::endl;
    if (!result.ok()) return Fail(result.status());
    if (!result->ok()) return Fail(absl::InternalError(result->error));
    if (!args.trace_path.empty()) {
      // The request's stats with its per-chunk and per-round trace, as JSON.
      std::string json;
      google::protobuf::util::JsonPrintOptions options;
      options.add_whitespace = true;
      options.preserve_proto_field_names = true;
      if (!google::protobuf::util::MessageToJsonString(result->stats, &json, options).ok()) {
        return Fail(absl::InternalError("cannot print the trace as JSON"));
      }
      if (args.trace_path == "-") {
        std::cerr << json << "\n";
      } else {
        std::ofstream out(args.trace_path);
        out << json << "\n";
        if (!out) return Fail(absl::InternalError(absl::StrCat(args.trace_path, ": write failed")));
      }
    }
    if (args.stats) {
      std::fprintf(stderr, "[%s: %zu tokens, TTFT %.1f ms, mean TBT %.2f ms]\n",
                   FinishName(result->finish_reason), result->token_ids.size(),
                   result->time_to_first_token_seconds() * 1e3,
                   result->mean_inter_token_seconds() * 1e3);
    }
    return 0;
  };
  if (!args.prompt.empty()) return ask(args.prompt);
  std::string line;
  std::fprintf(stderr, "tophat chat: one prompt per line, Ctrl-D to quit\n");
  while (std::fprintf(stderr, "> "), std::getline(std::cin, line)) {
    if (line.empty()) continue;
    if (int rc = ask(line); rc != 0) return rc;
  }
  return 0;
}

int RunBench(const BenchArgs& args) {
  bench::WorkloadSpec spec{.prompts = args.prompts,
                           .requests = args.requests,
                           .rate = args.rate,
                           .prompt_lengths = args.prompt_lengths,
                           .output_tokens = args.output_tokens,
                           .seed = args.seed};
  auto run = bench::RunWorkload(args.agents, spec);
  if (!run.ok()) return Fail(run.status());
  const bench::SlaTargets sla{.ttft_s = args.sla_ttft_s, .tbt_s = args.sla_tbt_s};
  const bench::WorkloadSummary summary = bench::SummarizeRun(*run, sla);

  const bool table = args.per_request || !args.prompts.empty();
  nlohmann::json per_request = nlohmann::json::array();
  if (table) {
    std::printf("%-4s %-16s %7s %7s %10s %14s  %-9s %s\n", "req", "agent", "prompt", "tokens",
                "TTFT ms", "mean TBT ms", "finish", "text");
  }
  for (size_t i = 0; i < run->outcomes.size(); ++i) {
    const bench::RequestOutcome& o = run->outcomes[i];
    const GenerateResult& r = o.result;
    const double first = r.time_to_first_token_seconds();
    const double gap = r.mean_inter_token_seconds();
    if (table) {
      std::string text = o.status.ok() ? r.text : std::string(o.status.message());
      std::replace(text.begin(), text.end(), '\n', ' ');
      if (text.size() > 60) text = text.substr(0, 57) + "...";
      std::printf("%-4zu %-16s %7u %7zu %10.1f %14.2f  %-9s %s\n", i,
                  args.agents[o.agent].c_str(), r.stats.prompt_tokens(), r.token_ids.size(),
                  first * 1e3, gap * 1e3, o.status.ok() ? FinishName(r.finish_reason) : "error",
                  text.c_str());
    }
    nlohmann::json request = bench::OutcomeJson(o);
    request["agent"] = args.agents[o.agent];
    per_request.push_back(std::move(request));
  }
  std::printf("\n%-10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99");
  for (const auto& [name, s] : {std::pair{"TTFT", summary.ttft}, std::pair{"TBT", summary.tbt},
                                std::pair{"E2E", summary.e2e}}) {
    std::printf("%-10s %10.1f %10.1f %10.1f %10.1f\n", name, s.mean * 1e3, s.p50 * 1e3,
                s.p90 * 1e3, s.p99 * 1e3);
  }
  std::printf("\n%lld requests (%lld failed) in %.2f s: %.1f tokens/s, %.2f requests/s; "
              "SLA (TTFT <= %.0f ms, TBT <= %.0f ms) met by %.1f%%\n",
              static_cast<long long>(summary.requests), static_cast<long long>(summary.failed),
              run->wall_seconds, summary.output_tokens_per_second,
              (summary.requests - summary.failed) / run->wall_seconds, args.sla_ttft_s * 1e3,
              args.sla_tbt_s * 1e3, summary.sla_compliance * 100);

  nlohmann::json report = bench::SummaryJson(summary);
  report["agents"] = args.agents;
  report["rate"] = args.rate;
  report["prompt_lengths"] = args.prompts.empty() ? args.prompt_lengths : "prompts";
  report["output_tokens"] = args.output_tokens;
  report["wall_seconds"] = run->wall_seconds;
  report["sla"] = {{"ttft_s", args.sla_ttft_s},
                   {"tbt_s", args.sla_tbt_s},
                   {"compliance", summary.sla_compliance}};
  report["per_request"] = per_request;
  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    out << report.dump(2) << "\n";
    if (!out) {
      return Fail(absl::UnavailableError(absl::StrCat("--json: cannot write ", args.json_path)));
    }
  }
  return summary.failed == 0 ? 0 : 2;
}

int RunAblationCommand(const AblationArgs& args) {
  namespace fs = std::filesystem;
  // "eval" (the default) and "toy" name the two synthetic-grammar models, made on first use and
  // cached; anything else is a checkpoint directory.
  fs::path model = args.model_dir;
  if (args.model_dir.empty() || args.model_dir == "eval" || args.model_dir == "toy") {
    const bool eval = args.model_dir != "toy";
    ToyModelOptions options = eval ? EvalModelOptions() : ToyModelOptions{};
    if (!eval) options.out_dir = DefaultToyModelDir();
    model = options.out_dir;
    spdlog::info("ablation: {} model in {} (trained on first use{}, then cached)",
                 eval ? "evaluation" : "toy", model.string(),
                 eval ? ": about an hour on 2 cores" : "");
    auto made = MakeToyModel(options, nullptr, nullptr);
    if (!made.ok()) return Fail(made.status());
  }
  auto config = ModelConfig::Load(model / "config.json");
  if (!config.ok()) return Fail(config.status());
  // m = 2 (the toy adapter's), k = 1: the device keeps the last layer, so whole hidden states
  // cross the link both ways.
  const fs::path work_dir = fs::absolute(args.work_dir);
  auto split = SplitCheckpoint({.model_dir = model,
                                .input_layers = 2,
                                .output_layers = 1,
                                .out_dir = work_dir / "bundles"});
  if (!split.ok()) return Fail(split.status());
  if (!split->adapter_note.empty()) spdlog::warn("ablation: {}", split->adapter_note);

  bench::AblationOptions options;
  auto configs = bench::SelectAblationConfigs(args.configs);
  if (!configs.ok()) return Fail(configs.status());
  options.configs = *std::move(configs);
  options.device_bundle = split->device_dir;
  options.cloud_bundle = split->cloud_dir;
  options.bin_dir = fs::read_symlink("/proc/self/exe").parent_path();
  options.work_dir = work_dir;
  options.devices = args.devices;
  options.datasets = args.datasets;
  options.rates = args.rates;
  options.requests = args.requests;
  options.output_tokens = args.output_tokens;
  options.seed = args.seed;
  options.max_context = std::min<int64_t>(4096, config->max_position_embeddings);
  options.sla = {.ttft_s = args.sla_ttft_s, .tbt_s = args.sla_tbt_s};
  options.links = args.links;
  options.links_script = args.links_script.empty()
                             ? EdgeLinksScriptAboveProgram()
                             : fs::path(args.links_script);
  options.one_way_delay_s = args.one_way_delay_ms / 1e3;
  // The links are scaled by the model's float32 hidden state (the cloud's dtype in the
  // ablation), whatever --wire-dtype sends over them.
  options.bytes_per_token = args.scale_links ? static_cast<double>(config->hidden_size) * 4 : 0;
  options.wire_dtype = args.wire_dtype;
  options.uplink_pacing = args.uplink_pacing;
  options.link_period_s = args.link_period_s;
  const int64_t middle_layers =
      split->cloud.middle_layers.end - split->cloud.middle_layers.begin;
  if (args.cloud_stages > middle_layers) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--cloud-stages ", args.cloud_stages, ": the cloud bundle has ",
                     middle_layers, " middle layers, fewer than the stages")));
  }
  options.cloud_stages = args.cloud_stages;
  options.middle_begin = split->cloud.middle_layers.begin;
  options.middle_end = split->cloud.middle_layers.end;

  // Prompts are windows of English-like text from the toy grammar (held out from training by
  // its seed), tokenized by the model's tokenizer.
  auto tokenizer = Tokenizer::Load(model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  for (const std::string& document : GenerateToyCorpus(/*seed=*/977, 600)) {
    auto ids = (*tokenizer)->Encode(document + " ");
    if (!ids.ok()) return Fail(ids.status());
    options.text_tokens.insert(options.text_tokens.end(), ids->begin(), ids->end());
  }
  auto report = bench::RunAblation(options);
  if (!report.ok()) return Fail(report.status());
  const fs::path json_path =
      args.json_path.empty() ? work_dir / "ablation.json" : fs::path(args.json_path);
  std::ofstream out(json_path);
  out << report->dump(2) << "\n";
  if (!out) {
    return Fail(absl::UnavailableError(absl::StrCat("--json: cannot write ", json_path.string())));
  }
  std::printf("JSON report: %s\n", json_path.string().c_str());
  return 0;
}

}  // namespace tophat::cli
