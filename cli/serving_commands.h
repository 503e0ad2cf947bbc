// `tophat chat` and `tophat bench`: the command-line clients of a running tophat-agent,
// built on the tophat::Client SDK.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace tophat::cli {

// Penalties on repetition (SamplingParams), as --presence-penalty, --frequency-penalty and
// --repetition-penalty.
struct Penalties {
  double presence = 0;
  double frequency = 0;
  double repetition = 1;
};
void AddPenaltyOptions(CLI::App& command, Penalties& penalties);

struct ChatArgs {
  std::string agent = "127.0.0.1:7200";
  std::string prompt;  // one-shot when set; otherwise read prompts from stdin
  int64_t max_new_tokens = 64;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1;
  double min_p = 0;
  uint64_t seed = 0;
  Penalties penalties;
  bool json = false;  // answers are JSON objects (GenerateRequest.response_format)
  std::string json_schema_path;  // answers are values of this file's JSON Schema
  std::string regex;             // answers are whole matches of this regular expression
  std::string grammar_path;      // answers are what this file's GBNF grammar's root matches
  // answers are text whose structures this file's structural tag (JSON) holds to
  std::string structural_tag_path;
  bool stats = false;
  std::string trace_path;  // "-": stderr; else a file (last answer's trace)
};
int RunChat(const ChatArgs& args);

struct BenchArgs {
  std::vector<std::string> agents = {"127.0.0.1:7200"};
  // With prompts: one request per prompt, all at once, and a per-request table.
  std::vector<std::string> prompts;
  int64_t requests = 32;
  double rate = 4;  // requests/s, Poisson; 0 = all at once
  std::string prompt_lengths = "specbench";
  int64_t output_tokens = 64;
  double sla_ttft_s = 1.0;
  double sla_tbt_s = 0.1;
  uint64_t seed = 0;
  std::string json_path;
  bool per_request = false;
};
int RunBench(const BenchArgs& args);

// `tophat bench --ablation`: starts its own cloud and agents per configuration.
struct AblationArgs {
  std::string model_dir = "eval";  // "eval", "toy" (made on first use) or a checkpoint
  std::string work_dir = "tophat-ablation";
  std::string configs = "all";
  int devices = 2;
  std::vector<std::string> datasets = {"specbench", "cnndm"};
  std::vector<double> rates = {1, 2};
  int64_t requests = 24;
  int64_t output_tokens = 128;
  uint64_t seed = 0;
  double sla_ttft_s = 1.0;
  double sla_tbt_s = 0.1;
  std::string links = "auto";
  std::string links_script;  // "": deploy/edge-links.sh of the source tree
  double one_way_delay_ms = 10;
  bool scale_links = true;
  double link_period_s = 5;
  std::string wire_dtype = "cloud";
  bool uplink_pacing = true;
  int cloud_stages = 1;
  std::string json_path;  // "": WORK_DIR/ablation.json
};
int RunAblationCommand(const AblationArgs& args);

}  // namespace tophat::cli
