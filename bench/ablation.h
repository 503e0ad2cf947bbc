// `tophat bench --ablation`: HAT's evaluation on this machine. The same seeded Poisson
// workload runs through a fresh tophat-cloud and N tophat-agents per configuration (U-shape,
// then speculative decoding, prompt chunking, both, parallel drafting, and U-Sarathi with
// fixed chunks and no transfer overlap), each agent behind its own emulated edge link.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "bench/workload_runner.h"

namespace tophat::bench {

enum class ChunkMode {
  kWholePrompt,  // one chunk: the prompt is computed, sent and answered in one piece
  kAdaptive,     // the cloud's per-device choice (the state-monitoring scheduler)
  kFixed,
};

struct AblationConfig {
  std::string name;
  std::string description;
  bool speculative = false;
  bool parallel_drafting = false;
  ChunkMode chunking = ChunkMode::kWholePrompt;
  int64_t fixed_chunk = 0;       // with kFixed
  bool pipeline_chunks = true;   // false: wait for each chunk's answer (U-Sarathi)
  int64_t runs_in_flight = 1;    // speculative.max_runs_in_flight (2: PipeInfer)
  std::string chunk_plan = "equal";  // prompt_chunk_plan ("jupiter": Jupiter's DP)
};

// In table order: U-shape, +spec, +chunk, +spec+chunk, +parallel (everything: HAT),
// +pipeinfer (HAT plus runs sent ahead of verification), U-Sarathi-128, U-Sarathi-256,
// +jupiter (+chunk with Jupiter's chunks of unequal length).
std::vector<AblationConfig> AblationConfigs();
// "all" or a comma-separated list of names; an unknown name is an error that lists the known.
absl::StatusOr<std::vector<AblationConfig>> SelectAblationConfigs(const std::string& names);

struct BandwidthRange {
  double min_bytes_per_second = 0;
  double max_bytes_per_second = 0;
};
struct DeviceLink {
  double uplink_bytes_per_second = 0;
  double downlink_bytes_per_second = 0;
};
// Device `index` of `devices` gets the index-th of `devices` equal slices of each range, so
// the devices differ and device 0 is the slowest; `draw_up`/`draw_down` in [0, 1] pick the
// point within the slice (0.5: its middle). `scale` multiplies the result.
DeviceLink DeviceLinkAt(int index, int devices, const BandwidthRange& uplink,
                        const BandwidthRange& downlink, double draw_up, double draw_down,
                        double scale);

struct AblationOptions {
  std::filesystem::path device_bundle;
  std::filesystem::path cloud_bundle;
  std::filesystem::path bin_dir;   // holds tophat-cloud and tophat-agent
  std::filesystem::path work_dir;  // configs, logs, plots, JSON
  std::vector<AblationConfig> configs = AblationConfigs();
  int devices = 2;
  std::vector<std::string> datasets = {"specbench", "cnndm"};
  std::vector<double> rates = {1, 2};
  int64_t requests = 24;  // per (dataset, rate, configuration)
  int64_t output_tokens = 128;
  uint64_t seed = 0;
  int64_t max_context = 2048;
  SlaTargets sla;
  std::vector<int32_t> text_tokens;  // prompt text (WorkloadSpec::text_tokens)

  // Links. HAT's testbed: 5-10 MB/s up and 10-15 MB/s down per device for Vicuna-7B, whose
  // hidden state is 8 KB per token at fp16. With `bytes_per_token` (this model's, as sent)
  // the ranges are scaled by bytes_per_token / reference_bytes_per_token, so a small model
  // spends the same time per token on the wire.
  std::string links = "auto";  // auto | netns | emulated
  std::filesystem::path links_script;  // deploy/edge-links.sh
  BandwidthRange uplink{5e6, 10e6};
  BandwidthRange downlink{10e6, 15e6};
  double one_way_delay_s = 0.01;
  double bytes_per_token = 0;  // 0: no scaling
  double reference_bytes_per_token = 8192;
  double link_period_s = 5;  // netns links redraw their bandwidth this often
  // Every agent's wire_dtype (configs/agent.yaml): cloud, float32, float16, bfloat16, int8.
  // The link scaling above stays at the model's float32 bytes, so a smaller wire shows as
  // time saved on the same links.
  std::string wire_dtype = "cloud";
  // Every agent's uplink_pacing.enabled (scheduler/uplink_pacer.h).
  bool uplink_pacing = true;
  // The cloud's middle layers in this many pipeline stages, one process each on this host,
  // linked by Gloo (configs/cloud.yaml `pipeline`), the layers split evenly; each stage gets
  // its share of this machine's cores. 1: one process.
  int cloud_stages = 1;
  int64_t middle_begin = 0;  // the cloud bundle's middle layers [begin, end), split among
  int64_t middle_end = 0;    // the stages
};

// What an agent of one configuration is told (exposed for tests: it must load with the real
// config loader).
struct AgentSlot {
  int index = 0;
  std::string listen_address;
  std::string cloud_address;
  std::string metrics_address;
  double one_way_delay_s = 0;           // added in process
  double uplink_bytes_per_second = 0;   // in-process shaping; 0 when the kernel shapes
  double downlink_bytes_per_second = 0;
};
std::string AgentYaml(const AblationConfig& config, const AblationOptions& options,
                      const AgentSlot& slot);
// `rendezvous_address`: where stage 0 serves the stages' store (unused with one stage).
std::string CloudYaml(const AblationOptions& options, const std::string& listen_address,
                      const std::string& metrics_address,
                      const std::string& rendezvous_address = "");
// Layer boundaries of `stages` stages over layers [begin, end), as even as whole layers
// allow (the first stages take the extra layers): stages + 1 numbers from begin to end.
std::vector<int64_t> EvenStageBoundaries(int64_t begin, int64_t end, int stages);

// Runs everything, printing progress to stderr and the tables to stdout; writes the SLA
// plots (sla-<dataset>-<rate>rps.png) into work_dir and returns the report.
absl::StatusOr<nlohmann::json> RunAblation(const AblationOptions& options);

}  // namespace tophat::bench
