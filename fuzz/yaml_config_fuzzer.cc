// The daemons' YAML configs: any text parsed and validated as tophat-cloud's and as
// tophat-agent's config, and read as a reload reads it (its values by key).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "configs/agent_config.h"
#include "configs/cloud_config.h"
#include "configs/yaml_reader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  (void)tophat::ParseCloudConfig(yaml, "fuzz/cloud.yaml");
  (void)tophat::ParseAgentConfig(yaml, "fuzz/agent.yaml");
  if (auto reader = tophat::YamlReader::Parse(yaml, "fuzz/config.yaml"); reader.ok()) {
    (void)reader->Values();
  }
  return 0;
}
