// Config of the device agent (`tophat-agent`), loaded from YAML. Every key and its meaning
// is documented in configs/README.md and in the commented template configs/agent.yaml.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "configs/bearer_tokens.h"

namespace tophat {

struct AgentConfig {
  std::string listen_address = "127.0.0.1:7200";  // app API (gRPC): host:port or unix:PATH
  // TLS on the app port (apps check the agent against the CA that signed this certificate).
  struct AppTls {
    std::string certificate_file;  // "" (and the key ""): plaintext
    std::string private_key_file;
    bool operator==(const AppTls&) const = default;
  } app_tls;
  // The apps allowed on the app port, each "NAME:SHA256" of its bearer token. When set, every
  // call must carry one of these tokens, and an app reaches (cancels) only its own requests.
  std::vector<BearerToken> app_tokens;
  // An address other hosts can reach needs app_tls and app_tokens, or this (plaintext and
  // anonymous, on a network you trust; a warning is logged at start-up).
  bool allow_remote_apps = false;
  std::string cloud_address = "127.0.0.1:7100";
  // Several clouds serving the same model: when set, cloud_address is not used. The agent
  // keeps a stream to each and places every new request on the less loaded of two drawn at
  // random (scheduler/cloud_placement.h); a request whose cloud is lost moves to another.
  std::vector<std::string> cloud_addresses;
  // With cloud_address "dns:///HOST:PORT" (one name for several clouds, as a Kubernetes
  // headless Service's): the streams the agent keeps, each to another of the addresses the
  // name resolves to (0: as many as it resolves to at start).
  int64_t cloud_dns_streams = 0;
  // The clouds this agent uses: cloud_addresses, or cloud_address alone.
  std::vector<std::string> clouds() const {
    return cloud_addresses.empty() ? std::vector<std::string>{cloud_address} : cloud_addresses;
  }
  std::string bundle;  // device bundle directory (required)
  // TLS of the link to the cloud, mutual: the agent presents this device's certificate and
  // accepts only a cloud whose certificate ca_file signed.
  struct CloudTls {
    bool insecure = false;  // plaintext: only on a trusted network
    std::string certificate_file;  // this device's certificate chain (PEM)
    std::string private_key_file;
    std::string ca_file;      // the CA that signs the cloud's certificate
    std::string server_name;  // the name the cloud's certificate must carry; "": cloud_address's host
    // A file holding this device's bearer token (first line), for a cloud with
    // tls.device_tokens. Read at start-up, and again before every connection to a cloud: a
    // rotated token goes out from the next stream on.
    std::string token_file;
    // Certificate revocation lists (PEM; each signed by a CA of ca_file): a cloud whose
    // certificate one lists is refused. Read at start-up and again before every connection
    // ("" for none).
    std::string crl_file;
    bool operator==(const CloudTls&) const = default;
  } cloud_tls;
  std::string dtype = "float32";
  // float32 on a CPU: float weight matrices kept in bfloat16, widened in registers
  // (SubmodelOptions.bf16_weights).
  bool bf16_weights = false;
  // An int8 device bundle's activations rounded to int8 per block of 32 too, multiplied in
  // integers (SubmodelOptions.int8_activations).
  bool int8_activations = false;
  // With bf16_weights: a prompt's rows multiplied in bfloat16 where the CPU has AVX512_BF16
  // (SubmodelOptions.bf16_activations).
  bool bf16_activations = false;
  // The dtype hidden states cross the link in, both ways: "cloud" (the cloud's compute
  // dtype, as Hello announces it), "scheduler" (the cloud scheduler's choice for this device
  // from its measured uplink, among the cloud's scheduler.wire_dtypes), float32, float16,
  // bfloat16 or int8 (one scale per position). A lossy wire changes the model: outputs equal
  // the model run with that wire.
  std::string wire_dtype = "cloud";
  std::string device = "cpu";
  int64_t compute_threads = 0;  // CPU threads for the model math (LibTorch, MKL); 0: per core
  int64_t max_context = 4096;
  int64_t prompt_chunk_size = 0;  // 0: use the size the cloud announces
  // Chunk j+1 is computed and sent while the cloud works on chunk j. Off waits for each
  // chunk's answer first: the U-Sarathi baseline of the ablation bench.
  bool pipeline_prompt_chunks = true;
  // How a prompt is cut when the cloud chooses the size (prompt_chunk_size 0): "equal", HAT's
  // one size (equation 3, the cloud's Control); "jupiter", chunks of unequal length planned
  // by Jupiter's DP over each pipeline stage's measured q(x, y) (device_agent/
  // prompt_chunk_planner.h), equal chunks until those are measured.
  std::string prompt_chunk_plan = "equal";
  int64_t max_concurrent_requests = 16;
  // Longest prompt text accepted, checked before tokenizing (a 4 MiB prompt took seconds of
  // CPU to tokenize only to be refused for its length).
  int64_t max_prompt_bytes = 1LL << 20;
  // What may wait in the outbox to the cloud (sent by requests, not yet written to the
  // stream); past either, the request that sends fails with RESOURCE_EXHAUSTED. 0: no bound.
  int64_t max_outbox_bytes = 256LL << 20;
  int64_t max_outbox_messages = 65536;
  int64_t default_max_new_tokens = 128;
  double request_timeout_s = 600;
  struct Reconnect {
    double initial_backoff_s = 0.1;
    double max_backoff_s = 2.0;
    double give_up_after_s = 60;  // a request fails after this long without a cloud
    // HTTP/2 pings on the cloud link: one after this long without a frame from the cloud, and
    // the link counts as lost (and is re-dialled) when no answer comes within
    // keepalive_timeout_s. So a frozen cloud or a dead route is noticed in seconds, not at
    // each request's deadline. 0 turns the pings off.
    double keepalive_s = 10;
    // Also gRPC's TCP_USER_TIMEOUT on the link's socket: data the cloud has not acknowledged
    // for this long kills the connection. On a saturated uplink, data (and the ping) waits
    // behind the socket's send buffer, several MB, for buffer / bandwidth seconds; 5 s here
    // reset streams at 586 KB/s (docs/benchmarks.md). Keep it above that drain time.
    double keepalive_timeout_s = 20;
    bool operator==(const Reconnect&) const = default;
  } reconnect;
  // Speculative decoding with the bundle's adapter (DESIGN.md request path 4-5). All off is
  // plain U-shaped inference, the baseline.
  struct Speculative {
    bool enabled = true;        // needs an adapter in the device bundle; else off with a warning
    double eta = 0.6;           // stop drafting below this top probability
    int64_t max_draft_tokens = 8;
    bool parallel_drafting = true;
    int64_t parallel_top_k = 2;  // candidates drafted ahead from
    int64_t parallel_steps = 4;  // λ: drafts per candidate, until the cloud decides
    bool parallel_steps_from_cloud = true;  // use the cloud's per-device λ once it sends one
    // DSD-style window: drafts per round follow acceptance, RTT and cloud queueing, and stop
    // while drafting cannot pay (scheduler/decode_decisions.h AdaptiveDraftWindow).
    bool adaptive_window = false;
    // Verification runs a request may have at the cloud at once. 2 (PipeInfer): the branch
    // drafted ahead from the best candidate goes to the cloud before the verification in
    // flight returns, and is cancelled (Truncate, results dropped) when that verification
    // rejects what it was built on. Needs parallel_drafting. Costs cloud compute on misses.
    int64_t max_runs_in_flight = 1;
    // With max_runs_in_flight 2, a request sends runs ahead only while at least this share
    // of its best branches (a moving average, sent or not) became the next round; 0 always
    // sends. A cancelled run is cloud compute spent for nothing.
    double ahead_min_keep_rate = 0.5;
    // Jump-forward: tokens the answer's format allows alone (a JSON key, a regex's literal, a
    // thinking budget's message) go to the cloud as drafts it keeps, many a round, with or
    // without an adapter (SpeculativeDecoder::Extend). Off: one a round like any other
    // token. Lossless either way.
    bool jump_forward = true;
    bool operator==(const Speculative&) const = default;
  } speculative;
  // Outline-based parallel decoding (GenerateRequest.outline; Jupiter §IV-C): how this
  // model is asked for an outline and how its points are found and expanded. Per model; the
  // toy and evaluation models' is in configs/agent.yaml. Empty directive: requests that ask
  // for an outline fail with FAILED_PRECONDITION.
  struct Outline {
    std::string directive;            // appended to the prompt to ask for the outline
    std::vector<std::string> labels;  // the outline numbers its points with these, in order
    std::string expand;               // appended after the outline to expand point {label} {point}
    std::string stop;                 // one token that ends the outline and each expansion
    int64_t max_points = 8;
    int64_t max_outline_tokens = 64;
    int64_t max_point_tokens = 64;
    bool operator==(const Outline&) const = default;
  } outline;
  // An emulated edge link in front of the cloud stream, for benchmarks on loopback: every
  // message waits `one_way_delay_s` plus its bytes over the bandwidth (0: unlimited), in order.
  // Prompt chunks wait for the cloud's receipts before more of them go (scheduler/
  // uplink_pacer.h), so a decode round waits on the uplink behind about one chunk, not behind
  // a whole prompt. Only against a cloud that sends receipts (this release on).
  // Finished conversations kept for their next turn (device_agent/conversation_cache.h): a
  // prompt that starts with one's tokens reuses its device KV and its cloud session, and only
  // the rest is computed and sent. Needs a cloud that parks sessions (Hello.parks_sessions).
  struct ConversationCache {
    bool enabled = true;
    int64_t max_bytes = 512LL << 20;  // device memory the kept conversations may hold
    double keep_alive_s = 300;        // also asked of the cloud (capped by its own limit)
    int64_t min_reuse_tokens = 16;    // shorter shared prefixes start afresh
    bool operator==(const ConversationCache&) const = default;
  } conversation_cache;
  struct UplinkPacing {
    bool enabled = true;
    // The next chunk goes this long before the ones in flight should have crossed the link
    // (by its measured bandwidth): the link does not idle while the receipt comes back.
    double lead_s = 0.02;
    bool operator==(const UplinkPacing&) const = default;
  } uplink_pacing;
  struct LinkEmulation {
    double one_way_delay_s = 0;
    double uplink_bytes_per_second = 0;
    double downlink_bytes_per_second = 0;
    bool operator==(const LinkEmulation&) const = default;
  } link_emulation;
  // The local OpenAI-compatible HTTP endpoint (device_agent/openai_server.h); off while
  // `address` is empty. Plain HTTP: loopback only, unless allow_remote_apps.
  struct OpenAi {
    std::string address;     // host:port
    std::string model_name;  // the name it answers to; "": the bundle's model id
    // How long a connection has to send a whole request (OpenAiServerOptions).
    double request_deadline_s = 10;
    // Bytes of /v1/responses answers kept for later turns (OpenAiServerOptions).
    int64_t max_stored_response_bytes = 64 << 20;
    // Where kept responses and conversations are also written, so that a restart keeps
    // them (OpenAiServerOptions); "": memory only.
    std::string store_dir;
    // Written at the end of a thinking model's reasoning when a request's
    // thinking_token_budget is spent, before "</think>" (OpenAiServerOptions); "": none.
    std::string thinking_budget_message;
    // The thinking_token_budget each OpenAI reasoning effort stands for
    // (OpenAiServerOptions); -1: no bound. An effort left out is refused.
    std::map<std::string, int64_t, std::less<>> reasoning_effort_budgets = {
        {"none", 0}, {"high", -1}, {"xhigh", -1}};
    bool operator==(const OpenAi&) const = default;
  } openai;
  std::string metrics_address = "127.0.0.1:9200";  // empty disables
  std::string log_level = "info";

  bool operator==(const AgentConfig&) const = default;
};

// Reads and parses the YAML file at `path`; same rules as LoadCloudConfig (relative
// `bundle` resolved against the file's directory, all keys optional, missing `bundle`
// left to ValidateAgentConfig, every error naming file:line and the dotted key).
// With `values`, also the file's values by dotted key (YamlReader::Values).
absl::StatusOr<AgentConfig> LoadAgentConfig(const std::filesystem::path& path,
                                            std::map<std::string, std::string>* values = nullptr);

// OpenAI's reasoning efforts (chat's reasoning_effort, the Responses API's
// reasoning.effort), least first: the keys of openai.reasoning_effort_budgets.
inline constexpr std::string_view kOpenAiReasoningEfforts[] = {"none",   "minimal", "low",
                                                               "medium", "high",    "xhigh"};

// The longest openai.thinking_budget_message: a sentence or two, not a second prompt.
inline constexpr size_t kMaxThinkingBudgetMessageBytes = 1024;

// The keys a running tophat-agent applies when it reloads its config (SIGHUP); a change to
// any other key waits for a restart, and the reload says which. (The file that
// cloud_tls.token_file names is read again before every connection to a cloud, reload or not.)
inline constexpr std::string_view kAgentReloadedKeys[] = {"app_tokens", "log_level"};

// As LoadAgentConfig, for YAML text; `source_name` stands for the file.
absl::StatusOr<AgentConfig> ParseAgentConfig(std::string_view yaml, std::string_view source_name);

// The loader's value checks without file or line, plus `bundle: required`.
absl::Status ValidateAgentConfig(const AgentConfig& config);

}  // namespace tophat
