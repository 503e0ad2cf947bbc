// Every YAML file shipped under configs/ must load and validate, so a template or demo
// config can never rot unnoticed. Bundles are not checked for existence (the demo builds
// them later); Validate*Config never touches them.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "configs/agent_config.h"
#include "configs/cloud_config.h"

namespace tophat {
namespace {

const std::filesystem::path kConfigsDir = std::filesystem::path(TOPHAT_SOURCE_DIR) / "configs";

std::vector<std::filesystem::path> ShippedYamlFiles() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(kConfigsDir)) {
    const std::string extension = entry.path().extension().string();
    if (entry.is_regular_file() && (extension == ".yaml" || extension == ".yml")) {
      files.push_back(entry.path());
    }
  }
  return files;
}

TEST_CASE("Every YAML file under configs/ loads and validates") {
  const std::vector<std::filesystem::path> files = ShippedYamlFiles();
  CHECK(files.size() >= 5);
  for (const std::filesystem::path& file : files) {
    const std::string name = file.filename().string();
    INFO(file.string());
    if (name.starts_with("cloud")) {
      absl::StatusOr<CloudConfig> config = LoadCloudConfig(file);
      INFO(config.status().ToString());
      REQUIRE(config.ok());
      CHECK(ValidateCloudConfig(*config).ok());
    } else if (name.starts_with("agent")) {
      absl::StatusOr<AgentConfig> config = LoadAgentConfig(file);
      INFO(config.status().ToString());
      REQUIRE(config.ok());
      CHECK(ValidateAgentConfig(*config).ok());
    } else {
      FAIL("a YAML file under configs/ must be named cloud*.yaml or agent*.yaml");
    }
  }
}

TEST_CASE("The templates set every key to its default") {
  // So the templates are a complete, current reference: a new key must be added to them,
  // and a changed default changes them too.
  absl::StatusOr<CloudConfig> cloud = LoadCloudConfig(kConfigsDir / "cloud.yaml");
  REQUIRE(cloud.ok());
  CHECK_FALSE(cloud->bundle.empty());
  CloudConfig cloud_defaults;
  cloud_defaults.bundle = cloud->bundle;
  // Paths without a default, like the bundle; plaintext stays off.
  CHECK_FALSE(cloud->tls.insecure);
  cloud_defaults.tls = cloud->tls;
  CHECK(*cloud == cloud_defaults);

  absl::StatusOr<AgentConfig> agent = LoadAgentConfig(kConfigsDir / "agent.yaml");
  REQUIRE(agent.ok());
  CHECK_FALSE(agent->bundle.empty());
  AgentConfig agent_defaults;
  agent_defaults.bundle = agent->bundle;
  CHECK_FALSE(agent->cloud_tls.insecure);
  CHECK(agent->cloud_tls.server_name.empty());
  agent_defaults.cloud_tls = agent->cloud_tls;
  // The installed agent's state folder (the unit's StateDirectory); memory only by default.
  CHECK(agent->openai.store_dir == "/var/lib/tophat-agent/openai");
  CHECK(agent_defaults.openai.store_dir.empty());
  agent_defaults.openai.store_dir = agent->openai.store_dir;
  CHECK(*agent == agent_defaults);
}

TEST_CASE("The demo configs run on loopback with bundles in build/demo-bundles") {
  const std::filesystem::path source(TOPHAT_SOURCE_DIR);
  absl::StatusOr<CloudConfig> cloud = LoadCloudConfig(kConfigsDir / "demo" / "cloud.yaml");
  REQUIRE(cloud.ok());
  CHECK(cloud->listen_address == "127.0.0.1:7100");
  CHECK(cloud->metrics_address == "127.0.0.1:9100");
  CHECK(cloud->kv_cache.memory_bytes == 64LL << 20);
  CHECK(cloud->scheduler.prompt_chunk_size == 32);
  CHECK(std::filesystem::path(cloud->bundle) ==
        (source / "build" / "demo-bundles" / "cloud").lexically_normal());

  for (int i : {1, 2}) {
    INFO("agent " << i);
    absl::StatusOr<AgentConfig> agent =
        LoadAgentConfig(kConfigsDir / "demo" / ("agent-" + std::to_string(i) + ".yaml"));
    REQUIRE(agent.ok());
    CHECK(agent->listen_address == "127.0.0.1:720" + std::to_string(i));
    CHECK(agent->outline.directive == " outline :");  // the toy model's outline answers
    CHECK(agent->outline.labels.size() == 10);
    CHECK(agent->metrics_address == "127.0.0.1:920" + std::to_string(i));
    CHECK(agent->cloud_address == cloud->listen_address);
    CHECK(agent->prompt_chunk_size == 32);
    CHECK(agent->max_context <= cloud->max_context);
    CHECK(std::filesystem::path(agent->bundle) ==
          (source / "build" / "demo-bundles" / "device").lexically_normal());
  }
}

}  // namespace
}  // namespace tophat
