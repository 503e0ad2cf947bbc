// tophat-bench-speculative: decode speed of speculative decoding against plain U-shaped
// decoding, on the toy model, through the real pieces: the cloud's CloudService and Engine on
// a loopback gRPC port in this process, and real Agents (device bundle, adapter, drafter,
// verification, rollback) whose cloud link has a fixed emulated delay, so that every
// verification trip costs what a network round trip costs.
//
// Three agent configurations run the same greedy prompts, interleaved prompt by prompt so
// that machine noise falls on all three alike:
//   u-shape           speculative decoding off (the baseline)
//   speculative       drafts verified in the cloud, no parallel drafting
//   spec + parallel   plus drafting ahead while a verification is in flight
//   + pipeinfer       plus the best branch drafted ahead sent before the verification
//                     returns (speculative.max_runs_in_flight 2)
// Reported: mean time between tokens (TBT) and its ratio to the baseline in the same run,
// tokens per verification round (acceptance length), parallel-draft hit rate, and the
// adapter's size against the model's.
//
// --regex or --json-schema: every answer follows a format (by default a record as compact
// JSON), and each configuration also runs with speculative.jump_forward off, so that what
// sending the tokens the format leaves as drafts saves is a same-run ratio. Greedy decoding
// is lossless either way: over a float32 wire the benchmark fails if any two
// configurations' tokens differ.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "device_agent/agent.h"
#include "models/runtime/bundle.h"
#include "models/tokenizers/tokenizer.h"
#include "models/training/toy_corpus.h"
#include "models/training/toy_model.h"
#include "bench/bench_util.h"
#include "server/cloud_service.h"
#include "server/engine.h"
#include "base/program.h"

using tophat::Fail;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace tophat;

struct Args {
  fs::path model;
  double one_way_delay_ms = 10;
  int64_t prompts = 12;
  int64_t new_tokens = 64;
  int64_t input_layers = 2;
  int64_t output_layers = 1;
  std::string wire_dtype = "cloud";
  std::string json_path;
  std::string json_schema;  // empty: free text (or the regex)
  std::string regex;
  int64_t min_forced_tokens = 0;
};

// The built-in answer format for --regex: a record as compact JSON (Outlines' way of writing
// a JSON Schema as a pattern, here without whitespace between tokens): four keys in a fixed
// order, an enum, a digit, a bounded string of the toy grammar's letters, a boolean. The kind
// of extraction an app asks a device for.
constexpr char kBuiltinRegex[] =
    R"re(\{"location":"[a-z ]{1,16}","category":"(weather report|traffic incident|local news)",)re"
    R"re("severity":[0-9],"confirmed_by_reporter":(true|false)\})re";

struct Mode {
  std::string name;
  bool speculative = false;
  bool parallel = false;
  int64_t runs_in_flight = 1;
  bool jump_forward = true;
  std::unique_ptr<Agent> agent;
  std::vector<double> tbt;   // per request
  std::vector<double> ttft;
  int64_t tokens = 0, rounds = 0, drafted = 0, accepted = 0, ahead = 0, hits = 0;
  int64_t runs_sent = 0, runs_kept = 0, forced = 0, forced_sent = 0;
  int64_t differing = 0;  // answers not the baseline's (a lossy wire dtype only)
  std::vector<std::vector<int32_t>> answers;  // per request, for the lossless check
};

// The demo's override (deploy/demo.sh), else where `tophat toy-model` caches it.
fs::path DefaultToyModel() {
  if (const char* dir = std::getenv("TOPHAT_TOY_MODEL"); dir != nullptr && *dir != '\0') return dir;
  return DefaultToyModelDir();
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Speculative decoding against U-shaped decoding on the toy model, with an emulated link "
      "delay between agent and cloud; prints a table and JSON");
  Args args;
  args.model = DefaultToyModel();
  app.add_option("--model", args.model,
                 "Checkpoint with adapter.json (the toy model: tophat toy-model)")
      ->capture_default_str();
  app.add_option("--one-way-delay-ms", args.one_way_delay_ms, "Emulated link delay each way")
      ->capture_default_str();
  app.add_option("--prompts", args.prompts, "Prompts per configuration")->capture_default_str();
  app.add_option("--new-tokens", args.new_tokens, "Tokens generated per prompt")
      ->capture_default_str();
  app.add_option("--wire-dtype", args.wire_dtype,
                 "The agents' wire_dtype: hidden states on the link, both ways (cloud: float32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cloud", "float32", "float16", "bfloat16", "int8"}));
  app.add_option("--json", args.json_path, "Also write the report here");
  std::string schema_path;
  CLI::Option* schema_option =
      app.add_option("--json-schema", schema_path,
                     "Answers as JSON values of the schema in this file; each configuration also "
                     "runs with jump-forward off");
  CLI::Option* regex_option =
      app.add_option("--regex", args.regex,
                     "Answers matching this regex (without a value: a record as compact JSON); "
                     "each configuration also runs with jump-forward off")
          ->expected(0, 1);
  schema_option->excludes(regex_option);
  app.add_option("--min-forced-tokens", args.min_forced_tokens,
                 "Fail unless the U-shape configuration kept at least this many forced tokens "
                 "(a check that jump-forward ran; with --regex or --json-schema)")
      ->capture_default_str();
  std::string device_weights = "as-stored";
  app.add_option("--device-weights", device_weights,
                 "The device bundle's matrices, drafter's included: as-stored or int8 "
                 "(tophat split --device-weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"as-stored", "int8"}));
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::err);
  if (!schema_path.empty()) {
    std::ifstream in(schema_path);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", schema_path)));
    args.json_schema.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (regex_option->count() > 0 && args.regex.empty()) args.regex = kBuiltinRegex;
  const bool formatted = !args.json_schema.empty() || !args.regex.empty();

  auto scratch = bench::ScratchDir::Create("tophat-bench-spec");
  if (!scratch.ok()) return Fail(scratch.status());
  auto split = SplitCheckpoint({.model_dir = args.model,
                                .input_layers = args.input_layers,
                                .output_layers = args.output_layers,
                                .out_dir = scratch->path(),
                                .device_weights = device_weights == "int8"
                                                      ? DeviceWeights::kInt8
                                                      : DeviceWeights::kAsStored});
  if (!split.ok()) return Fail(split.status());
  if (!split->device.adapter) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        args.model.string(), " has no adapter for m = ", args.input_layers, ": ",
        split->adapter_note.empty() ? "run `tophat toy-model` or `tophat distill`"
                                    : split->adapter_note)));
  }

  // The cloud, in process.
  auto cloud = CloudBundle::Load(split->cloud_dir, {.max_context = 1024});
  if (!cloud.ok()) return Fail(cloud.status());
  std::shared_ptr<const Submodel> middle = std::move(cloud->middle);
  EngineOptions engine_options{.model_id = "toy", .kv_block_size = 16, .kv_num_blocks = 1024};
  // Agents check that the cloud serves their model.
  engine_options.model_fingerprint = cloud->manifest.model_fingerprint;
  engine_options.control.set_prompt_chunk_size(64);
  auto engine = Engine::Create(engine_options, middle, nullptr);
  if (!engine.ok()) return Fail(engine.status());
  CloudServiceImpl service(engine->get(), {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return Fail(absl::UnavailableError("cannot listen"));
  (*engine)->Start();

  std::vector<Mode> modes;
  modes.push_back({.name = "u-shape"});
  modes.push_back({.name = "speculative", .speculative = true});
  modes.push_back({.name = "spec + parallel", .speculative = true, .parallel = true});
  modes.push_back(
      {.name = "+ pipeinfer", .speculative = true, .parallel = true, .runs_in_flight = 2});
  const size_t base_modes = modes.size();
  if (formatted) {
    // Each configuration's twin without jump-forward, after it in the table.
    std::vector<Mode> paired;
    for (Mode& mode : modes) {
      Mode twin{.name = mode.name + " -jf",
                .speculative = mode.speculative,
                .parallel = mode.parallel,
                .runs_in_flight = mode.runs_in_flight,
                .jump_forward = false};
      paired.push_back(std::move(mode));
      paired.push_back(std::move(twin));
    }
    modes = std::move(paired);
  }
  for (Mode& mode : modes) {
    AgentConfig config;
    config.bundle = split->device_dir.string();
    config.cloud_address = absl::StrCat("127.0.0.1:", port);
    config.metrics_address = "";
    config.cloud_tls.insecure = true;  // an in-process cloud on loopback
    config.max_context = 1024;
    config.wire_dtype = args.wire_dtype;
    config.speculative.enabled = mode.speculative;
    config.speculative.parallel_drafting = mode.parallel;
    config.speculative.max_runs_in_flight = mode.runs_in_flight;
    config.speculative.jump_forward = mode.jump_forward;
    config.link_emulation.one_way_delay_s = args.one_way_delay_ms / 1000.0;
    auto agent = Agent::Create(config, nullptr);
    if (!agent.ok()) return Fail(agent.status());
    mode.agent = *std::move(agent);
  }

  const std::vector<std::string> prompts = ToyPrompts(2024, args.prompts + 1);
  std::string first_answer;  // the baseline's to the first measured prompt
  // A warm-up request per agent, not measured.
  for (int64_t p = -1; p < args.prompts; ++p) {
    for (Mode& mode : modes) {
      v1::GenerateRequest request;
      request.set_prompt(prompts[static_cast<size_t>(p + 1)]);
      request.set_max_new_tokens(static_cast<uint32_t>(args.new_tokens));
      // A formatted answer ends where its format does.
      if (!args.json_schema.empty()) {
        request.set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
        request.set_json_schema(args.json_schema);
      } else if (!args.regex.empty()) {
        request.set_response_format(v1::RESPONSE_FORMAT_REGEX);
        request.set_regex(args.regex);
      } else {
        request.set_ignore_eos(true);
      }
      std::vector<int32_t> answer;
      std::string text;
      v1::GenerateResponse response = mode.agent->Generate(request, [&](const TokenEvent& event) {
        answer.insert(answer.end(), event.token_ids.begin(), event.token_ids.end());
        text += event.text;
        return true;
      });
      if (p == 0 && &mode == &modes[0]) first_answer = text;
      if (response.finish_reason() == v1::FINISH_REASON_ERROR) {
        return Fail(absl::InternalError(absl::StrCat(mode.name, ": ", response.error())));
      }
      if (p < 0) continue;
      const v1::RequestStats& stats = response.stats();
      mode.tbt.push_back(stats.mean_inter_token_seconds());
      mode.ttft.push_back(stats.time_to_first_token_seconds());
      mode.tokens += stats.generated_tokens();
      mode.rounds += stats.decode_rounds();
      mode.drafted += stats.draft_tokens();
      mode.accepted += stats.accepted_tokens();
      mode.ahead += stats.parallel_drafts();
      mode.hits += stats.parallel_hits();
      mode.runs_sent += stats.ahead_runs_sent();
      mode.runs_kept += stats.ahead_runs_kept();
      mode.forced += stats.forced_tokens();
      mode.forced_sent += stats.forced_draft_tokens();
      mode.answers.push_back(std::move(answer));
    }
  }
  // Greedy speculative decoding and jump-forward are lossless: every configuration gave the
  // baseline's tokens, or the numbers compare different work. A lossy wire dtype rounds the
  // hidden states of each round's rows together, so there a near tie may go either way:
  // counted, not refused.
  const bool lossless_wire = args.wire_dtype == "cloud" || args.wire_dtype == "float32";
  for (Mode& mode : modes) {
    for (size_t i = 0; i < mode.answers.size(); ++i) {
      if (mode.answers[i] == modes[0].answers[i]) continue;
      ++mode.differing;
      if (lossless_wire) {
        return Fail(absl::InternalError(absl::StrCat(mode.name, "'s answer to prompt ", i,
                                                     " differs from ", modes[0].name, "'s")));
      }
    }
  }
  // Agents first: their streams are calls the server would otherwise wait for.
  for (Mode& mode : modes) mode.agent.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  (*engine)->Stop();

  const double base_tbt = Mean(modes[0].tbt);
  const AdapterInfo& adapter = *split->device.adapter;
  const int64_t model_parameters =
      adapter.distillation.value("report", json::object()).value("model_parameters", int64_t{0});
  json report = {
      {"model", fs::absolute(args.model).string()},
      {"one_way_delay_ms", args.one_way_delay_ms},
      {"wire_dtype", args.wire_dtype},
      {"prompts", args.prompts},
      {"new_tokens", args.new_tokens},
      {"first_answer", first_answer},
      {"json_schema", args.json_schema.empty() ? json(nullptr) : json(args.json_schema)},
      {"regex", args.regex.empty() ? json(nullptr) : json(args.regex)},
      {"split", {{"input_layers", args.input_layers}, {"output_layers", args.output_layers}}},
      {"adapter_parameters", adapter.num_parameters},
      {"model_parameters", model_parameters},
      {"adapter_fraction", model_parameters > 0 ? static_cast<double>(adapter.num_parameters) /
                                                      static_cast<double>(model_parameters)
                                                : 0.0},
      {"modes", json::array()}};
  std::printf("%-20s %10s %10s %9s %12s %11s %10s %12s %12s\n", "mode", "TBT ms", "speedup",
              "TTFT ms", "tokens/round", "acceptance", "par. hits", "runs kept", "forced kept");
  for (const Mode& mode : modes) {
    const double tbt = Mean(mode.tbt);
    const double per_round = mode.rounds > 0 ? static_cast<double>(mode.tokens - args.prompts) /
                                                   static_cast<double>(mode.rounds)
                                             : 0;
    const double acceptance =
        mode.drafted > 0 ? static_cast<double>(mode.accepted) / static_cast<double>(mode.drafted) : 0;
    const double hit_rate =
        mode.ahead > 0 ? static_cast<double>(mode.hits) / static_cast<double>(mode.ahead) : 0;
    const std::string kept =
        mode.runs_sent > 0 ? absl::StrCat(mode.runs_kept, "/", mode.runs_sent) : "-";
    const std::string forced =
        mode.forced_sent > 0 ? absl::StrCat(mode.forced, "/", mode.forced_sent) : "-";
    std::printf("%-20s %10.2f %9.2fx %9.1f %12.2f %10.1f%% %9.1f%% %12s %12s\n", mode.name.c_str(),
                tbt * 1000, base_tbt / tbt, Mean(mode.ttft) * 1000, per_round, 100 * acceptance,
                100 * hit_rate, kept.c_str(), forced.c_str());
    report["modes"].push_back({{"name", mode.name},
                               {"mean_tbt_seconds", tbt},
                               {"decode_speedup_vs_ushape", base_tbt / tbt},
                               {"mean_ttft_seconds", Mean(mode.ttft)},
                               {"tokens", mode.tokens},
                               {"rounds", mode.rounds},
                               {"tokens_per_round", per_round},
                               {"draft_tokens", mode.drafted},
                               {"accepted_tokens", mode.accepted},
                               {"draft_acceptance_rate", acceptance},
                               {"parallel_draft_rounds", mode.ahead},
                               {"parallel_hits", mode.hits},
                               {"parallel_hit_rate", hit_rate},
                               {"ahead_runs_sent", mode.runs_sent},
                               {"ahead_runs_kept", mode.runs_kept},
                               {"jump_forward", mode.jump_forward},
                               {"forced_tokens", mode.forced},
                               {"forced_draft_tokens", mode.forced_sent},
                               {"answers_differing_from_baseline", mode.differing}});
  }
  std::printf("first answer (%s): %s\n", modes[0].name.c_str(), first_answer.c_str());
  std::printf("adapter: %lld parameters, %.1f%% of the model's %lld\n",
              static_cast<long long>(adapter.num_parameters),
              100.0 * report["adapter_fraction"].get<double>(),
              static_cast<long long>(model_parameters));
  if (modes[0].forced < args.min_forced_tokens) {
    return Fail(absl::InternalError(absl::StrCat(modes[0].name, " kept ", modes[0].forced,
                                                 " forced tokens, fewer than --min-forced-tokens ",
                                                 args.min_forced_tokens)));
  }
  // With --json-schema the twins sit between: configuration c is modes[c * stride].
  const size_t stride = modes.size() / base_modes;
  const double spec_tbt = Mean(modes[1 * stride].tbt);
  const double parallel_tbt = Mean(modes[2 * stride].tbt);
  const double pipeinfer_tbt = Mean(modes[3 * stride].tbt);
  if (stride == 2) {
    // Same-run ratios: each configuration's TBT without jump-forward over its TBT with it.
    json jump = json::object();
    for (size_t c = 0; c < base_modes; ++c) {
      const double with = Mean(modes[c * 2].tbt);
      const double without = Mean(modes[c * 2 + 1].tbt);
      std::printf("jump-forward, %-16s %.2fx (TBT %.2f ms without, %.2f ms with)\n",
                  modes[c * 2].name.c_str(), without / with, without * 1000, with * 1000);
      jump[modes[c * 2].name] = without / with;
    }
    report["jump_forward_speedup"] = jump;
  }
  report["goals"] = {{"acceptance_length_ge_2",
                      report["modes"][1 * stride]["tokens_per_round"].get<double>() >= 2.0},
                     {"decode_speedup_ge_1_65", base_tbt / parallel_tbt >= 1.65},
                     {"parallel_lowers_tbt", parallel_tbt < spec_tbt},
                     {"pipeinfer_lowers_tbt", pipeinfer_tbt < parallel_tbt}};
  std::printf("%s\n", report.dump(2).c_str());
  if (!args.json_path.empty()) std::ofstream(args.json_path) << report.dump(2) << "\n";
  return 0;
}
