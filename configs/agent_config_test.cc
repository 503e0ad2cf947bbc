#include "configs/agent_config.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/test_util.h"

namespace tophat {
namespace {

std::string ErrorOf(std::string_view yaml) {
  absl::StatusOr<AgentConfig> config = ParseAgentConfig(yaml, "agent.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST_CASE("An empty agent config yields the defaults") {
  absl::StatusOr<AgentConfig> config = ParseAgentConfig("", "agent.yaml");
  REQUIRE(config.ok());
  CHECK(*config == AgentConfig{});
  CHECK(config->listen_address == "127.0.0.1:7200");
  CHECK(config->prompt_chunk_size == 0);
  CHECK(config->reconnect.initial_backoff_s == 0.1);
  CHECK(ValidateAgentConfig(*config).message() ==
        "bundle: required (set it in the config or on the command line)\n"
        "cloud_tls: the agent reaches the cloud over mutual TLS: set certificate_file, "
        "private_key_file, ca_file (or cloud_tls.insecure: true for plaintext on a trusted "
        "network)");
}

TEST_CASE("Every agent config key is parsed") {
  absl::StatusOr<AgentConfig> config = ParseAgentConfig(R"(
listen_address: "[::1]:7201"
cloud_address: cloud.example:7100
bundle: /abs/device
cloud_tls:
  certificate_file: /etc/tophat/device.crt
  private_key_file: /etc/tophat/device.key
  ca_file: /etc/tophat/ca.crt
  server_name: cloud.example
  crl_file: /etc/tophat/clouds.crl
dtype: float16
device: cuda
compute_threads: 2
max_context: 2048
prompt_chunk_size: 64
pipeline_prompt_chunks: false
prompt_chunk_plan: jupiter
max_concurrent_requests: 4
default_max_new_tokens: 32
request_timeout_s: 30
reconnect:
  initial_backoff_s: 0.5
  max_backoff_s: 8
  give_up_after_s: 0
speculative:
  enabled: false
  eta: 0.4
  max_draft_tokens: 5
  parallel_drafting: false
  parallel_top_k: 3
  parallel_steps: 2
  adaptive_window: true
conversation_cache:
  enabled: false
  max_bytes: 1MiB
  keep_alive_s: 30
  min_reuse_tokens: 4
uplink_pacing:
  enabled: false
  lead_s: 0.05
link_emulation:
  one_way_delay_s: 0.02
  uplink_bytes_per_second: 5e6
  downlink_bytes_per_second: 10e6
openai:
  address: "127.0.0.1:8000"
  model_name: my-model
  request_deadline_s: 3
  max_stored_response_bytes: 1024
  store_dir: /var/lib/tophat-agent/openai
  thinking_budget_message: "Time is up.\n"
  reasoning_effort_budgets:
    low: 512
    medium: 2048
    high: 8192
metrics_address: ""
log_level: trace
)",
                                                        "agent.yaml");
  INFO(config.status().ToString());
  REQUIRE(config.ok());
  CHECK(config->listen_address == "[::1]:7201");
  CHECK(config->cloud_address == "cloud.example:7100");
  CHECK(config->bundle == "/abs/device");
  CHECK(config->cloud_tls.certificate_file == "/etc/tophat/device.crt");
  CHECK(config->cloud_tls.private_key_file == "/etc/tophat/device.key");
  CHECK(config->cloud_tls.ca_file == "/etc/tophat/ca.crt");
  CHECK(config->cloud_tls.server_name == "cloud.example");
  CHECK(config->cloud_tls.crl_file == "/etc/tophat/clouds.crl");
  CHECK_FALSE(config->cloud_tls.insecure);
  CHECK(config->dtype == "float16");
  CHECK(config->device == "cuda");
  CHECK(config->compute_threads == 2);
  CHECK(config->max_context == 2048);
  CHECK(config->prompt_chunk_size == 64);
  CHECK_FALSE(config->pipeline_prompt_chunks);
  CHECK(config->prompt_chunk_plan == "jupiter");
  CHECK(config->max_concurrent_requests == 4);
  CHECK(config->default_max_new_tokens == 32);
  CHECK(config->request_timeout_s == 30);
  CHECK(config->reconnect.initial_backoff_s == 0.5);
  CHECK(config->reconnect.max_backoff_s == 8);
  CHECK(config->reconnect.give_up_after_s == 0);
  CHECK_FALSE(config->speculative.enabled);
  CHECK(config->speculative.eta == 0.4);
  CHECK(config->speculative.max_draft_tokens == 5);
  CHECK_FALSE(config->speculative.parallel_drafting);
  CHECK(config->speculative.parallel_top_k == 3);
  CHECK(config->speculative.parallel_steps == 2);
  CHECK(config->speculative.adaptive_window);
  CHECK_FALSE(config->conversation_cache.enabled);
  CHECK(config->conversation_cache.max_bytes == 1 << 20);
  CHECK(config->conversation_cache.keep_alive_s == 30);
  CHECK(config->conversation_cache.min_reuse_tokens == 4);
  CHECK_FALSE(config->uplink_pacing.enabled);
  CHECK(config->uplink_pacing.lead_s == 0.05);
  CHECK(config->link_emulation.one_way_delay_s == 0.02);
  CHECK(config->link_emulation.uplink_bytes_per_second == 5e6);
  CHECK(config->link_emulation.downlink_bytes_per_second == 10e6);
  CHECK(config->openai.address == "127.0.0.1:8000");
  CHECK(config->openai.model_name == "my-model");
  CHECK(config->openai.request_deadline_s == 3);
  CHECK(config->openai.max_stored_response_bytes == 1024);
  CHECK(config->openai.store_dir == "/var/lib/tophat-agent/openai");
  CHECK(config->openai.thinking_budget_message == "Time is up.\n");
  // Given efforts added to the defaults (none: 0, high and xhigh: no bound), or replacing them.
  CHECK(config->openai.reasoning_effort_budgets ==
        std::map<std::string, int64_t, std::less<>>{
            {"none", 0}, {"low", 512}, {"medium", 2048}, {"high", 8192}, {"xhigh", -1}});
  CHECK(config->metrics_address.empty());
  CHECK(config->log_level == "trace");
  CHECK(ValidateAgentConfig(*config).ok());
}

TEST_CASE("A prompt chunk plan the agent does not know is refused by key") {
  CHECK(AgentConfig{}.prompt_chunk_plan == "equal");
  CHECK_THAT(ErrorOf("prompt_chunk_plan: dp\n"),
             Catch::Contains("prompt_chunk_plan") && Catch::Contains("\"dp\""));
}

TEST_CASE("Compact weight settings are read, and refused by key off a float32 CPU") {
  auto config = ParseAgentConfig("bf16_weights: true\nint8_activations: true\n", "agent.yaml");
  REQUIRE(config.ok());
  CHECK(config->bf16_weights);
  CHECK(config->int8_activations);
  CHECK_FALSE(AgentConfig{}.bf16_weights);
  CHECK_FALSE(AgentConfig{}.int8_activations);
  CHECK_THAT(ErrorOf("dtype: bfloat16\nbf16_weights: true\n"),
             Catch::Contains("bf16_weights") && Catch::Contains("bfloat16"));
  CHECK_THAT(ErrorOf("device: cuda\nint8_activations: true\n"),
             Catch::Contains("int8_activations") && Catch::Contains("cuda"));
  auto bf16a16 = ParseAgentConfig("bf16_weights: true\nbf16_activations: true\n", "agent.yaml");
  REQUIRE(bf16a16.ok());
  CHECK(bf16a16->bf16_activations);
  CHECK_FALSE(AgentConfig{}.bf16_activations);
  CHECK_THAT(ErrorOf("bf16_activations: true\n"),
             Catch::Contains("bf16_activations") && Catch::Contains("bf16_weights"));
}

TEST_CASE("The OpenAI endpoint is plain HTTP: loopback unless remote apps are allowed") {
  CHECK_THAT(ErrorOf("openai:\n  address: \"0.0.0.0:8000\"\n"),
             Catch::Contains("openai.address") && Catch::Contains("plain HTTP"));
  CHECK_THAT(ErrorOf("openai:\n  address: \"localhost\"\n"),
             Catch::Contains("openai.address"));
  absl::StatusOr<AgentConfig> remote =
      ParseAgentConfig("openai:\n  address: \"0.0.0.0:8000\"\nallow_remote_apps: true\n",
                       "agent.yaml");
  INFO(remote.status().ToString());
  CHECK(remote.ok());
  CHECK(AgentConfig{}.openai.address.empty());  // off by default
}

TEST_CASE("A reasoning effort's budget is a number of tokens or -1, for OpenAI's efforts") {
  CHECK(AgentConfig{}.openai.reasoning_effort_budgets ==
        std::map<std::string, int64_t, std::less<>>{{"none", 0}, {"high", -1}, {"xhigh", -1}});
  CHECK_THAT(ErrorOf("openai:\n  reasoning_effort_budgets:\n    low: -2\n"),
             Catch::Contains("openai.reasoning_effort_budgets.low: must be a number of tokens"));
  CHECK_THAT(ErrorOf("openai:\n  reasoning_effort_budgets:\n    extreme: 9\n"),
             Catch::Contains("openai.reasoning_effort_budgets.extreme"));
  CHECK_THAT(ErrorOf("openai:\n  reasoning_effort_budgets:\n    medium: lots\n"),
             Catch::Contains("openai.reasoning_effort_budgets.medium"));
}

TEST_CASE("A thinking budget message longer than a sentence or two is refused by key") {
  CHECK(AgentConfig{}.openai.thinking_budget_message.empty());
  CHECK_THAT(ErrorOf(absl::StrCat("openai:\n  thinking_budget_message: \"",
                                  std::string(kMaxThinkingBudgetMessageBytes + 1, 'x'), "\"\n")),
             Catch::Contains("openai.thinking_budget_message: 1025 bytes, more than the 1024"));
  CHECK(ParseAgentConfig(absl::StrCat("openai:\n  thinking_budget_message: \"",
                                      std::string(kMaxThinkingBudgetMessageBytes, 'x'), "\"\n"),
                         "agent.yaml")
            .ok());
}

TEST_CASE("Agent speculative settings out of range name their key") {
  auto eta = ParseAgentConfig("speculative:\n  eta: 1.5\n", "agent.yaml");
  REQUIRE_FALSE(eta.ok());
  CHECK_THAT(std::string(eta.status().message()),
             Catch::Contains("agent.yaml:2") && Catch::Contains("speculative.eta"));
  auto draft = ParseAgentConfig("speculative:\n  max_draft_tokens: 0\n", "agent.yaml");
  REQUIRE_FALSE(draft.ok());
  CHECK_THAT(std::string(draft.status().message()),
             Catch::Contains("speculative.max_draft_tokens"));
  auto runs = ParseAgentConfig("speculative:\n  max_runs_in_flight: 3\n", "agent.yaml");
  REQUIRE_FALSE(runs.ok());
  CHECK_THAT(std::string(runs.status().message()),
             Catch::Contains("agent.yaml:2") && Catch::Contains("speculative.max_runs_in_flight") &&
                 Catch::Contains("deeper pipelines are not implemented"));
  auto ahead_alone = ParseAgentConfig(
      "speculative:\n  parallel_drafting: false\n  max_runs_in_flight: 2\n", "agent.yaml");
  REQUIRE_FALSE(ahead_alone.ok());
  CHECK_THAT(std::string(ahead_alone.status().message()),
             Catch::Contains("needs speculative.parallel_drafting: true"));
  auto keep_rate =
      ParseAgentConfig("speculative:\n  ahead_min_keep_rate: 1.5\n", "agent.yaml");
  REQUIRE_FALSE(keep_rate.ok());
  CHECK_THAT(std::string(keep_rate.status().message()),
             Catch::Contains("agent.yaml:2") && Catch::Contains("speculative.ahead_min_keep_rate") &&
                 Catch::Contains("not in [0, 1]"));
  auto pipelined = ParseAgentConfig("speculative:\n  max_runs_in_flight: 2\n", "agent.yaml");
  REQUIRE(pipelined.ok());
  CHECK(pipelined->speculative.max_runs_in_flight == 2);
  auto delay = ParseAgentConfig("link_emulation:\n  one_way_delay_s: -1\n", "agent.yaml");
  REQUIRE_FALSE(delay.ok());
  CHECK_THAT(std::string(delay.status().message()),
             Catch::Contains("link_emulation.one_way_delay_s"));
}

TEST_CASE("An agent's cloud_address may be one dns:/// name for several clouds") {
  absl::StatusOr<AgentConfig> config = ParseAgentConfig(
      "cloud_address: \"dns:///tophat-cloud.tophat.svc:7100\"\ncloud_dns_streams: 3\n",
      "agent.yaml");
  INFO(config.status().ToString());
  REQUIRE(config.ok());
  CHECK(config->cloud_address == "dns:///tophat-cloud.tophat.svc:7100");
  CHECK(config->cloud_dns_streams == 3);
  CHECK_THAT(ErrorOf("cloud_address: \"dns:///tophat-cloud\"\n"),
             Catch::Contains("agent.yaml:1: cloud_address: expected host:port"));
  CHECK_THAT(ErrorOf("cloud_addresses: [\"10.0.0.5:7100\", \"dns:///clouds:7100\"]\n"),
             Catch::Contains("cloud_addresses[1]: \"dns:///clouds:7100\": a dns:/// name for "
                             "several clouds goes in cloud_address, alone"));
  CHECK_THAT(ErrorOf("cloud_dns_streams: -1\n"), Catch::Contains("cloud_dns_streams"));
}

TEST_CASE("Agent config errors name the dotted key and line") {
  const std::string message = ErrorOf(
      "cloud_address: 127.0.0.1:0\n"
      "prompt_chunk_size: -1\n"
      "max_concurrent_requests: many\n"
      "reconnect:\n"
      "  initial_backoff_s: 0\n"
      "  max_backoff: 2\n"
      "  give_up_after_s: -1\n"
      "request_timeout: 5\n");
  CHECK_THAT(message, Catch::Contains("agent.yaml:1: cloud_address: expected host:port"));
  CHECK_THAT(message, Catch::Contains("port 0 cannot be connected to"));
  CHECK_THAT(message, Catch::Contains("agent.yaml:2: prompt_chunk_size: expected a non-negative "
                                      "integer, got \"-1\""));
  CHECK_THAT(message, Catch::Contains("agent.yaml:3: max_concurrent_requests: expected a positive "
                                      "integer, got \"many\""));
  CHECK_THAT(message, Catch::Contains("agent.yaml:5: reconnect.initial_backoff_s: expected a "
                                      "positive number of seconds, got \"0\""));
  CHECK_THAT(message, Catch::Contains("agent.yaml:6: reconnect.max_backoff: unknown key (did you "
                                      "mean 'max_backoff_s'?)"));
  CHECK_THAT(message, Catch::Contains("agent.yaml:7: reconnect.give_up_after_s: expected a "
                                      "non-negative number of seconds"));
  CHECK_THAT(message, Catch::Contains("agent.yaml:8: request_timeout: unknown key (did you mean "
                                      "'request_timeout_s'?)"));
}

TEST_CASE("An agent's CRL needs mutual TLS") {
  CHECK_THAT(ErrorOf("cloud_tls:\n  insecure: true\n  crl_file: /etc/tophat/clouds.crl\n"),
             Catch::Contains("agent.yaml:3: cloud_tls.crl_file: revokes certificates, and with "
                             "cloud_tls.insecure the cloud presents none"));
}

TEST_CASE("Agent config cross-checks backoff and the default generation length") {
  const std::string message = ErrorOf(
      "max_context: 64\n"
      "default_max_new_tokens: 64\n"
      "reconnect:\n"
      "  initial_backoff_s: 5\n"
      "  max_backoff_s: 1\n");
  CHECK_THAT(message, Catch::Contains("agent.yaml:2: default_max_new_tokens: 64 leaves no room "
                                      "for a prompt in max_context (64)"));
  CHECK_THAT(message, Catch::Contains("agent.yaml:4: reconnect.initial_backoff_s: 5 is more than "
                                      "reconnect.max_backoff_s (1)"));

  AgentConfig config;
  config.bundle = "/b";
  config.cloud_tls.insecure = true;
  config.reconnect.max_backoff_s = 0.01;
  CHECK(ValidateAgentConfig(config).message() ==
        "reconnect.initial_backoff_s: 0.1 is more than reconnect.max_backoff_s (0.01)");
}

TEST_CASE("A relative agent bundle is resolved against the config file's directory") {
  testing::TempDir dir;
  const std::filesystem::path file = dir.path() / "agent.yaml";
  testing::WriteBytes(file,
                      "bundle: ./bundles/./device/\ncloud_tls:\n  certificate_file: "
                      "tls/device.crt\n  private_key_file: tls/device.key\n  ca_file: "
                      "/etc/ca.crt\nopenai:\n  store_dir: state/openai\n");
  absl::StatusOr<AgentConfig> config = LoadAgentConfig(file);
  REQUIRE(config.ok());
  CHECK(config->bundle == (dir.path() / "bundles" / "device" / "").string());
  // So are the TLS files.
  CHECK(config->cloud_tls.certificate_file == (dir.path() / "tls" / "device.crt").string());
  CHECK(config->cloud_tls.ca_file == "/etc/ca.crt");
  // And the kept responses' folder.
  CHECK(config->openai.store_dir == (dir.path() / "state" / "openai").string());
  CHECK(ValidateAgentConfig(*config).ok());  // existence is the bundle loader's business
}

}  // namespace
}  // namespace tophat
