// `tophat plan`: EdgeShard's layer planner (scheduler/layer_planner.h) fed by a short profile
// of each stage device, printing the plan, its predicted step time against an even split, and
// the `pipeline:` lines for the cloud's config.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tophat::cli {

struct PlanArgs {
  std::filesystem::path model_dir;  // a Hugging Face checkpoint
  int64_t input_layers = 2;         // m: the middle starts here
  int64_t output_layers = 1;        // k: and ends k layers before the last
  // One per stage candidate, stage 0 first: cpu, cpu:THREADS, cuda, cuda:N.
  std::vector<std::string> devices;
  std::vector<double> memory_gib;   // per device (empty: no limit)
  double link_mb_per_s = 1000;      // between any two stage devices
  int64_t tokens = 64;              // positions per profiled step
  int repetitions = 5;
  std::string objective = "throughput";  // or latency
};

int RunPlan(const PlanArgs& args);

}  // namespace tophat::cli
