// `tophat simulate`: the discrete-event simulator (sim/simulator.h) from the command line,
// printing latency percentiles and each cloud's load as a table and JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/simulator.h"

namespace CLI {
class App;
}

namespace tophat::cli {

struct SimulateArgs {
  sim::SimConfig config;
  double rate_per_minute = 1;           // requests per device per minute
  std::string step_profile;             // a tophat-bench-engine JSON report
  std::vector<std::string> step_points; // "TOKENS:MS", instead of a report
  double uplink_mbit = 10;
  double downlink_mbit = 40;
  double delay_ms = 20;
  double pacing_lead_ms = 20;
  double input_ms_per_token = 0.5;
  double input_decode_ms = 2;
  double output_ms_per_token = 0.5;
  double output_decode_ms = 4;
  double draft_ms = 2;  // the drafter's time a draft (with config.device.draft_tokens > 0)
  std::string json_path;
  std::string replay;         // tophat bench --ablation JSON reports, comma-separated
  bool calibrate = false;     // fit the device's compute times to the runs first
  double hold_out_rate = -1;  // runs at this rate are validation (-1: the highest; 0: none)
  std::vector<int64_t> sweep_devices;  // simulate at each fleet size instead of config.devices
  std::string plot_path;               // with sweep_devices: TTFT and TBT against the size
  std::string replay_config;  // its configuration to replay (default: its first)
  std::vector<std::string> outages;  // "CLOUD@DOWN_S[-UP_S]"
  double failover_detect_ms = 0;
};

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args);
int RunSimulate(SimulateArgs args);

}  // namespace tophat::cli
