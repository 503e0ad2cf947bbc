#include "bench/ablation.h"

#include "configs/agent_config.h"
#include "configs/cloud_config.h"

#include <catch2/catch.hpp>

namespace tophat::bench {
namespace {

TEST_CASE("ablation configurations follow HAT's ablation order", "[ablation]") {
  const std::vector<AblationConfig> configs = AblationConfigs();
  REQUIRE(configs.size() == 9);
  CHECK(configs[0].name == "U-shape");
  CHECK_FALSE(configs[0].speculative);
  CHECK(configs[0].chunking == ChunkMode::kWholePrompt);
  CHECK(configs[4].name == "+parallel");
  CHECK(configs[4].speculative);
  CHECK(configs[4].parallel_drafting);
  CHECK(configs[4].chunking == ChunkMode::kAdaptive);
  CHECK(configs[4].runs_in_flight == 1);
  CHECK(configs[5].name == "+pipeinfer");
  CHECK(configs[5].runs_in_flight == 2);
  CHECK(configs[6].chunking == ChunkMode::kFixed);
  CHECK(configs[6].fixed_chunk == 128);
  CHECK_FALSE(configs[6].pipeline_chunks);
  CHECK(configs[8].name == "+jupiter");
  CHECK(configs[8].chunking == ChunkMode::kAdaptive);
  CHECK(configs[8].chunk_plan == "jupiter");
  CHECK(configs[2].chunk_plan == "equal");
}

TEST_CASE("configurations are selected by name", "[ablation]") {
  auto all = SelectAblationConfigs("all");
  REQUIRE(all.ok());
  CHECK(all->size() == 9);
  auto two = SelectAblationConfigs("U-shape,+chunk");
  REQUIRE(two.ok());
  REQUIRE(two->size() == 2);
  CHECK((*two)[1].name == "+chunk");
  auto unknown = SelectAblationConfigs("U-shape,+turbo");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message().find("+turbo") != std::string::npos);
  CHECK(unknown.status().message().find("U-Sarathi-256") != std::string::npos);
}

TEST_CASE("device links take ordered slices of the bandwidth ranges", "[ablation]") {
  const BandwidthRange up{5e6, 10e6};
  const BandwidthRange down{10e6, 15e6};
  const DeviceLink slow = DeviceLinkAt(0, 2, up, down, 0.5, 0.5, 1.0);
  const DeviceLink fast = DeviceLinkAt(1, 2, up, down, 0.5, 0.5, 1.0);
  CHECK(slow.uplink_bytes_per_second == Approx(6.25e6));
  CHECK(fast.uplink_bytes_per_second == Approx(8.75e6));
  CHECK(slow.downlink_bytes_per_second == Approx(11.25e6));
  // Draws stay inside the device's slice, so device 0 stays the slowest while links vary.
  CHECK(DeviceLinkAt(0, 2, up, down, 1.0, 1.0, 1.0).uplink_bytes_per_second <=
        DeviceLinkAt(1, 2, up, down, 0.0, 0.0, 1.0).uplink_bytes_per_second);
  CHECK(DeviceLinkAt(1, 2, up, down, 7.0, 0.5, 1.0).uplink_bytes_per_second == Approx(10e6));
  // A model with 768-byte tokens sees 768/8192 of Vicuna-7B's bandwidth.
  CHECK(DeviceLinkAt(0, 1, up, down, 0.0, 0.0, 768.0 / 8192).uplink_bytes_per_second ==
        Approx(5e6 * 768.0 / 8192));
}

TEST_CASE("generated agent configs load with the agent's config loader", "[ablation]") {
  AblationOptions options;
  options.device_bundle = "/tmp/bundles/device";
  options.max_context = 2048;
  const AgentSlot slot{.index = 1,
                       .listen_address = "127.0.0.1:7301",
                       .cloud_address = "127.0.0.1:7300",
                       .metrics_address = "127.0.0.1:9301",
                       .one_way_delay_s = 0.01,
                       .uplink_bytes_per_second = 500000,
                       .downlink_bytes_per_second = 1000000};
  for (const AblationConfig& config : AblationConfigs()) {
    auto parsed = ParseAgentConfig(AgentYaml(config, options, slot), config.name);
    REQUIRE(parsed.ok());
    CHECK(parsed->listen_address == "127.0.0.1:7301");
    CHECK(parsed->cloud_address == "127.0.0.1:7300");
    CHECK(parsed->speculative.enabled == config.speculative);
    CHECK(parsed->speculative.parallel_drafting == config.parallel_drafting);
    CHECK(parsed->speculative.max_runs_in_flight == config.runs_in_flight);
    CHECK(parsed->pipeline_prompt_chunks == config.pipeline_chunks);
    CHECK(parsed->prompt_chunk_plan == config.chunk_plan);
    CHECK(parsed->link_emulation.one_way_delay_s == Approx(0.01));
    CHECK(parsed->link_emulation.uplink_bytes_per_second == Approx(500000));
    CHECK(parsed->link_emulation.downlink_bytes_per_second == Approx(1000000));
    switch (config.chunking) {
      case ChunkMode::kWholePrompt:
        CHECK(parsed->prompt_chunk_size == 2048);
        break;
      case ChunkMode::kAdaptive:
        CHECK(parsed->prompt_chunk_size == 0);
        break;
      case ChunkMode::kFixed:
        CHECK(parsed->prompt_chunk_size == config.fixed_chunk);
        break;
    }
  }
}

TEST_CASE("agents on emulated links may serve the host namespace's client, on loopback not",
          "[ablation]") {
  AblationOptions options;
  options.device_bundle = "/tmp/bundles/device";
  options.max_context = 2048;
  AgentSlot slot{.index = 1, .listen_address = "10.200.1.2:7301",
                 .cloud_address = "10.200.1.1:7300", .metrics_address = "10.200.1.2:9301"};
  auto netns = ParseAgentConfig(AgentYaml(AblationConfigs()[0], options, slot), "netns");
  REQUIRE(netns.ok());
  CHECK(netns->allow_remote_apps);
  slot.listen_address = "127.0.0.1:7301";
  auto loopback = ParseAgentConfig(AgentYaml(AblationConfigs()[0], options, slot), "loopback");
  REQUIRE(loopback.ok());
  CHECK_FALSE(loopback->allow_remote_apps);
  // The agent's own check refuses a reachable address without the key.
  auto refused = ParseAgentConfig("listen_address: \"0.0.0.0:7301\"\ncloud_tls: {insecure: true}\n",
                                  "agent.yaml");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("allow_remote_apps"));
}

TEST_CASE("the generated cloud config loads and carries whole prompts", "[ablation]") {
  AblationOptions options;
  options.cloud_bundle = "/tmp/bundles/cloud";
  options.max_context = 2048;
  auto parsed =
      ParseCloudConfig(CloudYaml(options, "0.0.0.0:7300", "127.0.0.1:9300"), "cloud.yaml");
  REQUIRE(parsed.ok());
  CHECK(parsed->listen_address == "0.0.0.0:7300");
  CHECK(parsed->max_context == 2048);
  // A whole-prompt chunk must fit one message.
  CHECK(parsed->limits.max_chunk_tokens == 2048);
  CHECK(parsed->scheduler.adaptive);
  CHECK(ValidateCloudConfig(*parsed).ok());
  CHECK(parsed->pipeline.layer_boundaries.empty());
}

TEST_CASE("the generated cloud config splits the middle evenly among pipeline stages",
          "[ablation]") {
  CHECK(EvenStageBoundaries(2, 7, 1) == std::vector<int64_t>{2, 7});
  CHECK(EvenStageBoundaries(2, 7, 2) == std::vector<int64_t>{2, 5, 7});
  CHECK(EvenStageBoundaries(2, 8, 3) == std::vector<int64_t>{2, 4, 6, 8});
  AblationOptions options;
  options.cloud_bundle = "/tmp/bundles/cloud";
  options.cloud_stages = 2;
  options.middle_begin = 2;
  options.middle_end = 7;
  auto parsed = ParseCloudConfig(
      CloudYaml(options, "0.0.0.0:7300", "127.0.0.1:9300", "127.0.0.1:7400"), "cloud.yaml");
  REQUIRE(parsed.ok());
  CHECK(parsed->pipeline.rendezvous_address == "127.0.0.1:7400");
  CHECK(parsed->pipeline.layer_boundaries == std::vector<int64_t>{2, 5, 7});
  REQUIRE(parsed->pipeline.compute_threads.size() == 2);
  CHECK(parsed->pipeline.compute_threads[0] >= 1);
  CHECK(ValidateCloudConfig(*parsed).ok());
}

}  // namespace
}  // namespace tophat::bench
