// Config of the cloud daemon (`tophat-cloud`), loaded from YAML. Every key and its meaning
// is documented in configs/README.md and in the commented template configs/cloud.yaml.
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

struct CloudConfig {
  std::string listen_address = "127.0.0.1:7100";  // gRPC address for agents
  std::string bundle;                             // cloud bundle directory (required)
  std::string dtype = "float32";                  // float32 | float16 | bfloat16
  std::string device = "cpu";                     // cpu | cuda | cuda:N
  // CPU threads for the model math (LibTorch's OpenMP pool, MKL); 0: one per core.
  int64_t compute_threads = 0;
  // On a GPU: decode steps of up to this many sequences replay CUDA graphs captured at
  // start-up (models/runtime/decode_graphs.h); 0 runs every step eagerly. Capped at
  // scheduler.max_running_sessions.
  int64_t cuda_graph_max_batch = 64;
  // On a GPU in float16/bfloat16: which GEMMs of decode steps of 1-8 sessions take the
  // small-batch kernel instead of cuBLAS (kernels/small_batch_gemm.h): "measured" where it
  // was faster at start-up, "always", or "never".
  std::string small_batch_gemm = "measured";
  // On a GPU of compute capability 9.0 or later: tophat's kernels launch overlapped with the
  // kernel before them (programmatic dependent launch, kernels/cuda_overlap.cuh); false
  // serializes them as a plain stream does.
  bool overlap_kernel_launches = true;
  // On a GPU: the paged decode attention merges a split sequence's partials in the attention
  // kernel itself (the last block to finish); false merges them with a second kernel.
  bool fused_split_merge = true;
  // On a GPU: a speculative verification chunk (2-16 positions) attends as a decode row per
  // position, in the batched attention kernel and the decode graphs; false attends it as a
  // prompt chunk (SubmodelOptions::verification_as_decode_rows).
  bool verification_as_decode_rows = true;
  int64_t max_context = 4096;                     // longest session, positions
  // TLS of the agents' port, mutual: agents present certificates client_ca_file signed, and
  // each device is known by the name its certificate gives (proto/channel_security.h).
  struct Tls {
    bool insecure = false;  // plaintext, no device identity: only on a trusted network
    std::string certificate_file;  // the cloud's certificate chain (PEM)
    std::string private_key_file;
    std::string client_ca_file;    // the CA that signs the devices' certificates
    // Devices' bearer tokens, each "DEVICE:SHA256" of the token. When set, every stream must
    // carry one; with a certificate too, the token must be that device's. Where TLS ends in
    // front of the cloud (insecure: true), the token alone names the device.
    std::vector<BearerToken> device_tokens;
    // Devices refused whatever they present: a certificate's name or a token's. A reload
    // (SIGHUP) applies this and device_tokens to the streams already open: a stream that no
    // longer passes is ended.
    std::vector<std::string> revoked_devices;
    // Certificate revocation lists (PEM, one or more, each signed by a CA of client_ca_file):
    // a device whose certificate one lists is refused, and a reload ends its open streams.
    // Read again at every reload ("" for none; mutual TLS only).
    std::string crl_file;
    bool operator==(const Tls&) const = default;
  } tls;
  struct KvCache {
    int64_t block_size = 16;             // positions per block
    int64_t memory_bytes = 256LL << 20;  // size of the block pool ("256MiB")
    // On a GPU: the pool takes this fraction of the memory free once the weights are
    // loaded, instead of memory_bytes (0: use memory_bytes).
    double memory_fraction = 0;
    bool operator==(const KvCache&) const = default;
  } kv_cache;
  struct Scheduler {
    int64_t max_batch_tokens = 512;  // token budget per engine step
    int64_t max_running_sessions = 64;
    int64_t max_waiting_sessions = 64;  // admission queue bound; beyond it RESOURCE_EXHAUSTED
    int64_t prompt_chunk_size = 128;    // told to agents (the scheduler may adapt it)
    int64_t draft_steps = 0;            // λ told to agents before their device is measured
    // Per-device chunk size and λ from each agent's DeviceState (HAT's equations).
    bool adaptive = true;
    int64_t min_prompt_chunk_size = 16;  // adaptive chunk sizes stay within [this, limits.max_chunk_tokens]
    double max_step_seconds = 0;         // cap on a step carrying a chunk (0: none)
    int64_t max_draft_steps = 8;         // cap on adaptive λ
    // The wire dtypes the scheduler may choose from, per device, for agents that follow it
    // (wire_dtype: scheduler): the widest whose upload keeps up with the cloud.
    std::vector<std::string> wire_dtypes = {"float32", "float16"};
    // Fair share between devices: while a device decodes, the other devices' prompt chunks
    // may make a step at most this many times as long as its decode work alone (0: no cap).
    double decode_step_stretch = 2;
    // Each device's weight in the split of a step's prompt budget ("DEVICE:WEIGHT"; a device
    // not listed has weight 1), parsed.
    std::map<std::string, double> device_weights;
    bool operator==(const Scheduler&) const = default;
  } scheduler;
  struct Limits {
    int64_t max_message_bytes = 64LL << 20;  // gRPC receive limit
    int64_t max_chunk_tokens = 2048;         // larger hidden-state chunks fail that request
    double session_timeout_s = 600;          // per-session deadline when the agent sets none
    double max_session_timeout_s = 3600;     // longest deadline an agent may ask for (0: any)
    // Longest a finished conversation's session keeps its KV for the next turn (ParkSession;
    // evicted sooner when KV is needed). 0: no parking.
    double max_parked_session_s = 300;
    int64_t max_sessions_per_device = 32;    // open sessions per device identity (0: no limit)
    int64_t max_waiting_sessions_per_device = 16;  // of those, waiting for admission (0: no limit)
    double max_kv_fraction_per_device = 0.5;  // of the KV pool, by max_positions (1: no limit)
    double max_messages_per_second_per_device = 5000;  // reads paced above it (0: no limit)
    // Refused sessions a device is told of per second; later refusals are sent late (0: no
    // limit).
    double max_refusals_per_second_per_device = 20;
    // Unread results before a stream's work waits for its agent to read them.
    int64_t max_queued_bytes_per_stream = 64LL << 20;
    // What an agent's messages may hold in the engine before its stream is read no further
    // (each message 1 KiB plus a chunk's payload).
    int64_t max_inflight_bytes_per_stream = 256LL << 20;
    int64_t max_queued_bytes_total = 1LL << 30;  // the same over all streams
    // A stream held back like that which takes no result for this long is ended.
    double unread_stream_timeout_s = 10;
    bool operator==(const Limits&) const = default;
  } limits;
  // The middle split into stages, one process each (server/pipeline). Empty
  // layer_boundaries: one stage, this process.
  struct Pipeline {
    std::string rendezvous_address;  // host:port of stage 0's store (required with stages)
    // P + 1 increasing layer numbers: stage i runs [b_i, b_{i+1}); the first and last are
    // the bundle's middle. Empty: no pipeline.
    std::vector<int64_t> layer_boundaries;
    // Instead of layer_boundaries: this many stages, whose layers the planner chooses at
    // start-up from each stage's own profile (0: use layer_boundaries).
    int64_t planned_stages = 0;
    std::vector<std::string> devices;  // per stage; empty: `device` for every stage
    // Compute threads per stage (0: all cores); empty: `compute_threads` for every stage.
    std::vector<int64_t> compute_threads;
    // How tensors move between stages: "gloo" (anywhere; GPU tensors staged through host
    // memory) or "nccl" (GPU to GPU; every stage on its own CUDA device).
    std::string backend = "gloo";
    // Network interface of the stages' links across hosts (e.g. "eth1"); empty: the
    // store's address on one host, else the interface of the host's name.
    std::string interface;
    double timeout_s = 60;  // to meet at start-up, and for each transfer within a step
    // What stage `rank` computes with: its entry of compute_threads, else the default.
    int64_t StageComputeThreads(int rank, int64_t default_threads) const {
      return compute_threads.empty() ? default_threads
                                     : compute_threads[static_cast<size_t>(rank)];
    }
    int64_t stages() const {
      if (planned_stages > 0) return planned_stages;
      return layer_boundaries.empty() ? 1 : static_cast<int64_t>(layer_boundaries.size()) - 1;
    }
    bool operator==(const Pipeline&) const = default;
  } pipeline;
  double drain_grace_period_s = 30;  // SIGTERM: finish in-flight work this long, then cancel
  std::string metrics_address = "127.0.0.1:9100";  // Prometheus; empty disables
  std::string log_level = "info";                  // trace|debug|info|warn|error

  bool operator==(const CloudConfig&) const = default;
};

// Reads and parses the YAML file at `path`. A relative `bundle` is resolved against the
// file's directory (and made absolute), so a config works from any working directory.
// Every key is optional; an empty file yields the defaults. A missing `bundle` is accepted
// here because a command-line flag may still supply it: call ValidateCloudConfig after
// applying flags. Errors are InvalidArgument (NotFound for a missing file) and name
// file:line and the dotted key, all errors of the file at once. With `values`, also the
// file's values by dotted key (YamlReader::Values), for telling what a reload changed.
absl::StatusOr<CloudConfig> LoadCloudConfig(const std::filesystem::path& path,
                                            std::map<std::string, std::string>* values = nullptr);

// The keys a running tophat-cloud applies when it reloads its config (SIGHUP, `systemctl
// reload`); a change to any other key waits for a restart, and the reload says which.
inline constexpr std::string_view kCloudReloadedKeys[] = {
    "tls.device_tokens",
    "tls.revoked_devices",
    "tls.crl_file",
    "limits.max_sessions_per_device",
    "limits.max_waiting_sessions_per_device",
    "limits.max_kv_fraction_per_device",
    "limits.max_messages_per_second_per_device",
    "limits.max_refusals_per_second_per_device",
    "scheduler.device_weights",
    "scheduler.decode_step_stretch",
    "log_level"};

// As LoadCloudConfig, for YAML text; `source_name` stands for the file in messages, and a
// relative `bundle` is resolved against its directory (the working directory when it has
// none, e.g. "<test>").
absl::StatusOr<CloudConfig> ParseCloudConfig(std::string_view yaml, std::string_view source_name);

// The value checks of the loader, without file or line (for a config changed by flags),
// plus `bundle: required`. Does not touch the file system beyond asking for the machine's
// physical memory: whether the bundle exists is the bundle loader's error to report.
absl::Status ValidateCloudConfig(const CloudConfig& config);

}  // namespace tophat
