// tophat-bench-conversation: what keeping a conversation between its turns saves
// (device_agent/conversation_cache.h, ParkSession). A real tophat-cloud and two tophat-agent
// processes behind the same emulated edge link (the ablation's, scaled to the model's bytes
// per token), one keeping conversations and one not, hold the same multi-turn conversations
// through the SDK's tophat::Conversation: a long first message, then an answer and a new
// message per turn. Per turn: time to first token, prompt tokens, tokens reused, bytes of
// hidden states uploaded. The two agents alternate conversation by conversation, so both see
// the same machine. Prints a table and a JSON report.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/program.h"
#include "bench/bench_util.h"
#include "bench/process_control.h"
#include "models/formats/config.h"
#include "models/runtime/bundle.h"
#include "models/training/toy_corpus.h"
#include "sdk/client.h"
#include "sdk/conversation.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

struct Args {
  std::string model_dir;
  int64_t input_layers = 2;
  int64_t output_layers = 1;
  int64_t turns = 5;
  int64_t conversations = 3;     // per agent
  int64_t first_sentences = 16;  // toy-grammar sentences in the first message
  int64_t turn_sentences = 2;    // in each later message
  int64_t answer_tokens = 32;
  // The ablation's middle link for a model whose float32 hidden state is 1 KiB (the
  // evaluation model): HAT's 7.5 MB/s up and 12.5 MB/s down scaled by 1 KiB / Vicuna-7B's
  // 8 KiB per token.
  double uplink_bytes_per_second = 7.5e6 / 8;
  double downlink_bytes_per_second = 12.5e6 / 8;
  double one_way_delay_ms = 10;
  std::string json_path;
  // > 0: fail unless every later turn of the keeping agent uploads at most this fraction of
  // what the other agent uploads for it (the CTest's check).
  double max_upload_fraction = 0;
};

struct Turn {
  int64_t prompt_tokens = 0;
  int64_t reused = 0;
  double ttft_s = 0;
  double uploaded_bytes = 0;
};

double UploadedBytes(int metrics_port) {
  return bench::MetricValue(bench::HttpGet(metrics_port, "/metrics"),
                            "tophat_hidden_state_bytes_total", "direction=\"up\"")
      .value_or(0);
}

// The text of the conversation's messages: toy-grammar sentences, held out by seed.
std::vector<std::string> Messages(const Args& args, int64_t conversation) {
  std::vector<std::string> messages;
  for (int64_t turn = 0; turn < args.turns; ++turn) {
    const int64_t count = turn == 0 ? args.first_sentences : args.turn_sentences;
    std::string text;
    for (const std::string& sentence :
         ToyPrompts(static_cast<uint64_t>(9000 + conversation * 100 + turn), count)) {
      absl::StrAppend(&text, sentence, " ");
    }
    messages.push_back(text);
  }
  return messages;
}

int Run(const Args& args) {
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  auto scratch = bench::ScratchDir::Create("tophat-bench-conversation");
  if (!scratch.ok()) return Fail(scratch.status());
  const fs::path bundles = scratch->path() / "bundles";
  auto split = SplitCheckpoint({.model_dir = args.model_dir, .input_layers = args.input_layers,
                                .output_layers = args.output_layers, .out_dir = bundles});
  if (!split.ok()) return Fail(split.status());
  auto config = ModelConfig::Load(fs::path(args.model_dir) / "config.json");
  if (!config.ok()) return Fail(config.status());

  const int cloud_port = bench::FreePort();
  const std::string cloud = absl::StrFormat(
      "listen_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\ntls:\n  insecure: true\n"
      "metrics_address: \"\"\nkv_cache:\n  memory_bytes: 256MiB\n"
      "limits:\n  max_kv_fraction_per_device: 1\n",
      cloud_port, (bundles / "cloud").string());
  auto cloud_process = bench::StartDaemon(bin / "tophat-cloud", cloud, scratch->path(), "cloud",
                                          cloud_port, std::chrono::seconds(600));
  if (!cloud_process.ok()) return Fail(cloud_process.status());

  struct Agent {
    std::string label;
    bool keeps = false;
    int metrics_port = 0;
    std::unique_ptr<bench::ChildProcess> process;
    std::unique_ptr<Client> client;
    std::vector<std::vector<Turn>> conversations;
  };
  std::vector<Agent> agents(2);
  agents[0].label = "keeps conversations";
  agents[0].keeps = true;
  agents[1].label = "does not";
  for (size_t i = 0; i < agents.size(); ++i) {
    Agent& agent = agents[i];
    const int port = bench::FreePort();
    agent.metrics_port = bench::FreePort();
    const std::string yaml = absl::StrFormat(
        "listen_address: \"127.0.0.1:%d\"\ncloud_address: \"127.0.0.1:%d\"\nbundle: \"%s\"\n"
        "cloud_tls:\n  insecure: true\nmetrics_address: \"127.0.0.1:%d\"\n"
        "conversation_cache:\n  enabled: %s\n"
        "link_emulation:\n  one_way_delay_s: %.6f\n  uplink_bytes_per_second: %.0f\n"
        "  downlink_bytes_per_second: %.0f\n",
        port, cloud_port, (bundles / "device").string(), agent.metrics_port,
        agent.keeps ? "true" : "false", args.one_way_delay_ms / 1e3,
        args.uplink_bytes_per_second, args.downlink_bytes_per_second);
    auto process = bench::StartDaemon(bin / "tophat-agent", yaml, scratch->path(),
                                      absl::StrCat("agent", i), port, std::chrono::seconds(600));
    if (!process.ok()) return Fail(process.status());
    agent.process = *std::move(process);
    auto client = Client::Connect(absl::StrCat("127.0.0.1:", port), 60);
    if (!client.ok()) return Fail(client.status());
    agent.client = std::move(*client);
  }

  v1::GenerateRequest options;
  options.set_max_new_tokens(static_cast<uint32_t>(args.answer_tokens));
  options.set_ignore_eos(true);  // every answer the same length, both agents alike
  for (int64_t c = 0; c < args.conversations; ++c) {
    const std::vector<std::string> messages = Messages(args, c);
    for (Agent& agent : agents) {
      std::fprintf(stderr, "conversation %lld of %lld, agent that %s\n",
                   static_cast<long long>(c + 1), static_cast<long long>(args.conversations),
                   agent.label.c_str());
      Conversation conversation(*agent.client, options);
      std::vector<Turn> turns;
      for (const std::string& message : messages) {
        const double before = UploadedBytes(agent.metrics_port);
        auto result = conversation.Say(message);
        if (!result.ok()) return Fail(result.status());
        if (!result->ok()) return Fail(absl::InternalError(result->error));
        turns.push_back({.prompt_tokens = result->stats.prompt_tokens(),
                         .reused = result->stats.reused_prompt_tokens(),
                         .ttft_s = result->time_to_first_token_seconds(),
                         .uploaded_bytes = UploadedBytes(agent.metrics_port) - before});
      }
      agent.conversations.push_back(std::move(turns));
    }
  }
  for (Agent& agent : agents) {
    agent.process->Signal(SIGTERM);
    agent.process->Wait(std::chrono::seconds(30));
  }
  (*cloud_process)->Signal(SIGTERM);
  (*cloud_process)->Wait(std::chrono::seconds(30));

  // Means over the conversations, turn by turn.
  std::string table = absl::StrFormat(
      "%lld conversations of %lld turns, %lld-token answers; link %.0f KB/s up, %.0f KB/s "
      "down, %.0f ms each way (emulated in the agents)\n"
      "turn  prompt  | keeps: reused  TTFT ms   KB up | does not: TTFT ms   KB up | TTFT ratio\n",
      static_cast<long long>(args.conversations), static_cast<long long>(args.turns),
      static_cast<long long>(args.answer_tokens), args.uplink_bytes_per_second / 1e3,
      args.downlink_bytes_per_second / 1e3, args.one_way_delay_ms);
  nlohmann::json rows = nlohmann::json::array();
  bool within = true;
  for (int64_t t = 0; t < args.turns; ++t) {
    Turn mean[2];
    for (int a = 0; a < 2; ++a) {
      for (const std::vector<Turn>& turns : agents[a].conversations) {
        mean[a].prompt_tokens += turns[t].prompt_tokens;
        mean[a].reused += turns[t].reused;
        mean[a].ttft_s += turns[t].ttft_s;
        mean[a].uploaded_bytes += turns[t].uploaded_bytes;
      }
      const double n = static_cast<double>(agents[a].conversations.size());
      mean[a].prompt_tokens = static_cast<int64_t>(mean[a].prompt_tokens / n);
      mean[a].reused = static_cast<int64_t>(mean[a].reused / n);
      mean[a].ttft_s /= n;
      mean[a].uploaded_bytes /= n;
    }
    const double ratio = mean[0].ttft_s / std::max(1e-9, mean[1].ttft_s);
    absl::StrAppendFormat(&table, "%4d  %6d  |  %12d  %7.1f  %6.1f |  %14.1f  %6.1f | %9.2f\n",
                          t + 1, mean[1].prompt_tokens, mean[0].reused, mean[0].ttft_s * 1e3,
                          mean[0].uploaded_bytes / 1e3, mean[1].ttft_s * 1e3,
                          mean[1].uploaded_bytes / 1e3, ratio);
    if (t > 0 && args.max_upload_fraction > 0 &&
        mean[0].uploaded_bytes > args.max_upload_fraction * mean[1].uploaded_bytes) {
      within = false;
    }
    rows.push_back({{"turn", t + 1},
                    {"prompt_tokens", mean[1].prompt_tokens},
                    {"reused_tokens", mean[0].reused},
                    {"ttft_ms_keeping", mean[0].ttft_s * 1e3},
                    {"ttft_ms_not_keeping", mean[1].ttft_s * 1e3},
                    {"uploaded_kb_keeping", mean[0].uploaded_bytes / 1e3},
                    {"uploaded_kb_not_keeping", mean[1].uploaded_bytes / 1e3},
                    {"ttft_ratio", ratio}});
  }
  std::printf("%s", table.c_str());
  const nlohmann::json report = {
      {"benchmark", "conversation"},
      {"model", args.model_dir},
      {"hidden_size", config->hidden_size},
      {"link",
       {{"uplink_bytes_per_second", args.uplink_bytes_per_second},
        {"downlink_bytes_per_second", args.downlink_bytes_per_second},
        {"one_way_delay_ms", args.one_way_delay_ms}}},
      {"conversations", args.conversations},
      {"answer_tokens", args.answer_tokens},
      {"turns", rows}};
  std::printf("%s\n", report.dump(2).c_str());
  if (!args.json_path.empty()) {
    if (absl::Status s = bench::WriteTextFile(args.json_path, report.dump(2)); !s.ok()) {
      return Fail(s);
    }
  }
  if (!within) {
    std::fprintf(stderr, "FAIL: a later turn uploaded more than %.2f of a fresh request's bytes\n",
                 args.max_upload_fraction);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Args args;
  CLI::App app{"What keeping a conversation between turns saves: TTFT and upload per turn of "
               "the same conversations with and without the agent's conversation cache"};
  app.add_option("--model", args.model_dir, "Checkpoint directory (a Hugging Face layout)")
      ->required();
  app.add_option("--turns", args.turns, "Turns per conversation")->capture_default_str();
  app.add_option("--conversations", args.conversations, "Conversations per agent")
      ->capture_default_str();
  app.add_option("--first-sentences", args.first_sentences,
                 "Toy-grammar sentences in the first message")
      ->capture_default_str();
  app.add_option("--turn-sentences", args.turn_sentences, "Sentences in each later message")
      ->capture_default_str();
  app.add_option("--answer-tokens", args.answer_tokens, "Tokens per answer")
      ->capture_default_str();
  app.add_option("--uplink", args.uplink_bytes_per_second, "Emulated uplink, bytes/s")
      ->capture_default_str();
  app.add_option("--downlink", args.downlink_bytes_per_second, "Emulated downlink, bytes/s")
      ->capture_default_str();
  app.add_option("--one-way-delay-ms", args.one_way_delay_ms, "Emulated delay each way")
      ->capture_default_str();
  app.add_option("--json", args.json_path, "Also write the JSON report here");
  app.add_option("--max-upload-fraction", args.max_upload_fraction,
                 "Fail unless every later turn uploads at most this fraction of a fresh "
                 "request's bytes (0: no check)");
  CLI11_PARSE(app, argc, argv);
  return tophat::Run(args);
}
