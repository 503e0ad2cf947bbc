// End-to-end serving tests: real tophat-cloud and tophat-agent processes on loopback ports,
// driven through the tophat::Client SDK and, for malformed input, a raw CloudService stream.
// Cases tagged [timing] estimate real link and compute rates, and need daemons as fast as a
// release build: deploy/sanitize.sh leaves them out under AddressSanitizer.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/program_paths.h"
#include "base/test_util.h"
#include "kernels/gemm_int8.h"
#include "kernels/gemv.h"
#include "kernels/gemv_w8a8.h"
#include "models/runtime/bundle.h"
#include "models/runtime/generate.h"
#include "models/runtime/submodel.h"
#include "models/tokenizers/tokenizer.h"
#include "models/training/toy_corpus.h"
#include "proto/channel_security.h"
#include "sdk/client.h"
#include "sdk/conversation.h"
#include "tests/process_util.h"
#include "tophat/v1/agent.grpc.pb.h"
#include "tophat/v1/cloud.grpc.pb.h"

// Last: LibTorch's glog defines CHECK too, and Catch's must win.
#include <catch2/catch.hpp>

namespace tophat {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::ChildProcess;

// Waits until a daemon accepts connections on `port`, and stops waiting when it exits: a
// daemon that failed at start-up fails the test at once, with its log in the message (the
// log as it is after the wait, not the empty one of the moment it was started).
void RequireListening(ChildProcess& daemon, int port, std::chrono::milliseconds timeout,
                      const std::string& host = "127.0.0.1") {
  bool listening = false;
  testing::WaitUntil(
      [&] {
        listening = testing::WaitForPort(port, 100ms, host);
        return listening || !daemon.running();
      },
      timeout);
  INFO(daemon.log_path().filename().string()
       << (listening ? "" : daemon.running() ? " still not listening" : " exited") << ":\n"
       << daemon.Log());
  REQUIRE(listening);
}

fs::path EnvPath(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// The first folder at or above this test binary's own folder that holds `marker`, joined
// with `leaf`: in the build tree (build/release/tests, below build/release and the sources)
// and in an unpacked GPU bundle (deploy/gpu/pack.sh) alike, with no path of the machine
// that built it compiled in. An environment variable `env` overrides it.
fs::path FoundAbove(const char* env, const fs::path& marker, const fs::path& leaf) {
  const char* value = std::getenv(env);
  if (value != nullptr && *value != '\0') return value;
  std::error_code ec;
  for (const fs::path& dir : FoldersAboveProgram()) {
    if (fs::exists(dir / marker, ec)) return dir / leaf;
  }
  return fs::path("(no ") / marker / (") above this test program; set " + std::string(env) + ")");
}

fs::path ToyDir() { return FoundAbove("TOPHAT_TOY_MODEL_DIR", "toy-model/config.json", "toy-model"); }
fs::path BinDir() { return FoundAbove("TOPHAT_BIN_DIR", "bin/tophat-cloud", "bin"); }
fs::path MakeCertsScript() {
  return FoundAbove("TOPHAT_SOURCE_DIR", "deploy/make-certs.sh", "") / "deploy" / "make-certs.sh";
}
// Where the cloud's middle submodel runs: `cpu`, or what tophat_serving_cuda_test sets
// (cuda) to run the [cuda-cloud] cases with the cloud on a GPU.
std::string CloudDevice() { return EnvPath("TOPHAT_TEST_CLOUD_DEVICE", "cpu").string(); }
// Where the default pipeline's stages run, and over what: empty (every stage on
// CloudDevice(), over Gloo), or a list such as "cuda:0,cuda:1" (deploy/gpu/check.sh on a
// server with two GPUs), one device a stage, over NCCL.
std::string CloudStageDevices() {
  return EnvPath("TOPHAT_TEST_CLOUD_STAGE_DEVICES", "").string();
}
// The cloud's pipeline.layer_boundaries for cases that do not set their own: none (one
// stage), or what tophat_serving_staged_test sets ("2,4,5": two stages) to run the [staged]
// cases with the middle split across two processes.
std::vector<int> CloudStages() {
  std::vector<int> boundaries;
  const std::string text = EnvPath("TOPHAT_TEST_CLOUD_STAGES", "").string();
  for (size_t at = 0; at < text.size();) {
    const size_t comma = text.find(',', at);
    boundaries.push_back(std::stoi(text.substr(at, comma - at)));
    at = comma == std::string::npos ? text.size() : comma + 1;
  }
  return boundaries;
}

// What this test process makes once and shares between its cases (certificates, bundles):
// a directory of its own, removed when the process exits. A fixed name (by pid) would let a
// later process with the same pid take a stale copy.
const fs::path& RunDir() {
  static const testing::TempDir dir;
  return dir.path();
}

// The name the DNS-name case gives its clouds (in a hosts file of its own).
constexpr char kCloudsDnsName[] = "clouds.tophat.test";

// Certificates made once per test run with deploy/make-certs.sh: a CA, the cloud's, and
// device-1 and device-2. The daemons run over mutual TLS, as deployed.
const fs::path& Certs() {
  static const fs::path dir = [] {
    fs::path out = RunDir() / "certs";
    const std::string script = MakeCertsScript().string();
    // The cloud's certificate also names the DNS name the DNS-name case resolves.
    REQUIRE(std::system(("TOPHAT_CLOUD_NAMES=DNS:" + std::string(kCloudsDnsName) + " bash " +
                         script + " " + out.string() + " device-1 device-2")
                            .c_str()) == 0);
    return out;
  }();
  return dir;
}

// Runs deploy/make-certs.sh with `args` (e.g. "--revoke DIR device-1"); it must succeed.
void MakeCerts(const std::string& args) {
  REQUIRE(std::system(("bash " + MakeCertsScript().string() + " " + args).c_str()) == 0);
}

// A copy of the run's certificates in `dir`/certs with a CRL that revokes nothing,
// certs/crl.pem. The copy's CA is the run's, so what MakeCerts("--revoke COPY NAME") revokes
// in it is revoked for the run's certificates, wherever that CRL is read, and nowhere else.
fs::path CertsWithCrl(const fs::path& dir) {
  const fs::path certs = dir / "certs";
  fs::copy(Certs(), certs, fs::copy_options::recursive);
  MakeCerts("--crl " + certs.string());
  return certs;
}

TlsFiles DeviceTls(const std::string& device) {
  return {.certificate_file = (Certs() / (device + ".crt")).string(),
          .private_key_file = (Certs() / (device + ".key")).string(),
          .ca_file = (Certs() / "ca.crt").string()};
}

// A device's channel to the cloud, as an agent would open it.
std::shared_ptr<grpc::ChannelCredentials> DeviceCredentials(const std::string& device = "device-1") {
  auto credentials = MutualTlsChannelCredentials(DeviceTls(device), "test");
  REQUIRE(credentials.ok());
  return *credentials;
}

// The toy model split once per test run: device = embedding + layers [0, 2) + layer 5 + head,
// cloud = layers [2, 5).
const fs::path& Bundles() {
  static const fs::path dir = [] {
    fs::path out = RunDir() / "bundles";
    auto split = SplitCheckpoint({.model_dir = ToyDir(), .input_layers = 2, .output_layers = 1,
                                  .out_dir = out});
    REQUIRE(split.ok());
    return out;
  }();
  return dir;
}

// The same split with the device's matrices in int8 (`--device-weights int8`); its cloud
// half is the float32 one of Bundles().
const fs::path& Int8Bundles() {
  static const fs::path dir = [] {
    fs::path out = RunDir() / "bundles-int8";
    auto split = SplitCheckpoint({.model_dir = ToyDir(), .input_layers = 2, .output_layers = 1,
                                  .out_dir = out, .device_weights = DeviceWeights::kInt8});
    REQUIRE(split.ok());
    return out;
  }();
  return dir;
}

std::mutex reference_mutex;

// The monolithic float32 model on the CPU; callers hold reference_mutex.
Submodel& ReferenceModel() {
  static std::unique_ptr<Submodel> model;
  if (model == nullptr) {
    auto loaded = LoadFullModel(ToyDir());
    REQUIRE(loaded.ok());
    model = std::move(*loaded);
  }
  return *model;
}

// Greedy tokens of the monolithic model: the ground truth every split run must reproduce.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                               bool stop_at_eos) {
  std::lock_guard<std::mutex> lock(reference_mutex);
  Submodel* model = &ReferenceModel();
  auto generator = PipelineGenerator::Create({model});
  REQUIRE(generator.ok());
  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  if (stop_at_eos) {
    for (int64_t eos : model->config().eos_token_ids) {
      options.stop_token_ids.push_back(static_cast<int32_t>(eos));
    }
  }
  auto result = generator->Generate(prompt, options);
  REQUIRE(result.ok());
  return result->tokens;
}

// The monolithic model's log-softmax at each generated token's position: row i scores
// generated[i] ([generated, V]); with `whole`, every position's but the last: row i scores
// token i + 1 of prompt + generated.
at::Tensor ReferenceLogprobs(const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& generated, bool whole = false) {
  std::lock_guard<std::mutex> lock(reference_mutex);
  Submodel& model = ReferenceModel();
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), generated.begin(), generated.end());
  KvCache cache = model.NewCache(static_cast<int64_t>(ids.size()));
  auto embedded = model.Embed(at::tensor(ids, at::kLong));
  REQUIRE(embedded.ok());
  auto hidden = model.Forward(*embedded, cache);
  REQUIRE(hidden.ok());
  const int64_t first = whole ? 0 : static_cast<int64_t>(prompt.size()) - 1;
  auto logits = model.Logits(hidden->narrow(0, first, static_cast<int64_t>(ids.size()) - 1 - first));
  REQUIRE(logits.ok());
  return at::log_softmax(logits->to(at::kFloat), 1);
}

std::vector<int32_t> Tokenize(const std::string& text) {
  static std::unique_ptr<Tokenizer> tokenizer = [] {
    auto loaded = Tokenizer::Load(ToyDir());
    REQUIRE(loaded.ok());
    return std::move(*loaded);
  }();
  auto ids = tokenizer->Encode(text);
  REQUIRE(ids.ok());
  std::vector<int32_t> out = {*tokenizer->bos_id()};
  out.insert(out.end(), ids->begin(), ids->end());
  return out;
}

// Tests whose workload needs the cloud to out-run an emulated link run both daemons with
// `compute_threads: 1`. Each daemon's OpenBLAS otherwise keeps a pool of busy-waiting
// threads (two on a 2-core machine), and a cloud's and an agent's pools spin against each
// other: in the link test the cloud's steps (33 positions on average) took 80 ms each on an
// idle 2-core machine and 126 ms with the other core busy, against 5 ms with one thread each.
constexpr int kOneComputeThread = 1;

// Built with AddressSanitizer (deploy/sanitize.sh runs these cases against sanitized daemons,
// every process several times slower): a case that repeats one path over many prompts may
// repeat it fewer times there, where what it checks stays the same. Not the cases that need
// a draft rejected somewhere among their prompts: the first 16 of the 50 greedy prompts, and
// 6 of 12 per pipeline layout, had every draft accepted.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
// `full` repetitions, or `sanitized` ones under a sanitizer.
constexpr size_t Repetitions(size_t full, size_t sanitized) {
  return kSanitized ? sanitized : full;
}

struct CloudSettings {
  int64_t max_batch_tokens = 64;
  std::string kv_memory = "64MiB";
  int64_t max_running_sessions = 64;
  int64_t max_waiting_sessions = 64;
  int64_t max_chunk_tokens = 2048;
  std::string max_message_bytes = "64MiB";
  double drain_grace_period_s = 5;
  int64_t max_draft_steps = 8;  // scheduler.max_draft_steps: the cap on the cloud's λ
  int64_t min_prompt_chunk_size = 16;  // scheduler.min_prompt_chunk_size
  int compute_threads = 0;  // see kOneComputeThread
  std::string dtype = "float32";
  // pipeline.layer_boundaries: empty for one stage; e.g. {2, 4, 5} for two stages of the
  // toy model's middle [2, 5), each stage its own process.
  std::vector<int> layer_boundaries;
  int planned_stages = 0;  // pipeline.planned_stages: the planner chooses the boundaries
  int64_t max_sessions_per_device = 0;  // limits.max_sessions_per_device
  std::string max_queued_bytes_per_stream = "64MiB";  // limits.max_queued_bytes_per_stream
  std::string max_inflight_bytes_per_stream = "256MiB";  // limits.max_inflight_bytes_per_stream
  double unread_stream_timeout_s = 10;                 // limits.unread_stream_timeout_s
  double max_messages_per_second_per_device = 5000;    // limits.max_messages_per_second_per_device
  double max_refusals_per_second_per_device = 20;      // limits.max_refusals_per_second_per_device
  double max_kv_fraction_per_device = 0.5;             // limits.max_kv_fraction_per_device
  std::vector<std::string> device_tokens;  // tls.device_tokens, each "DEVICE:SHA256"
  std::string crl_file;                    // tls.crl_file ("": none)
  bool adaptive = true;                               // scheduler.adaptive
  std::vector<std::string> wire_dtypes = {"float32", "float16"};  // scheduler.wire_dtypes
  std::string bundle;  // "": the toy model's cloud bundle
  std::string listen_host = "127.0.0.1";  // listen_address's host (any 127.x is loopback)
  std::vector<std::string> extra_args;  // on stage 0's command line (e.g. a drill)
  std::string device;  // "": CloudDevice()
  bool start = true;   // false: the config is written, nothing started (--check-config)
};

class CloudProcess {
 public:
  CloudProcess(const fs::path& dir, const CloudSettings& settings, int port = 0)
      : port_(port != 0 ? port : testing::FreePort()),
        metrics_port_(testing::FreePort()) {
    config_ = dir / ("cloud-" + std::to_string(port_) + ".yaml");
    host_ = settings.listen_host;
    std::ofstream(config_)
        << "listen_address: \"" << host_ << ":" << port_ << "\"\n"
        << "bundle: "
        << (settings.bundle.empty() ? (Bundles() / "cloud").string() : settings.bundle) << "\n"
        << "tls:\n  certificate_file: " << (Certs() / "cloud.crt").string()
        << "\n  private_key_file: " << (Certs() / "cloud.key").string()
        << "\n  client_ca_file: " << (Certs() / "ca.crt").string() << "\n"
        << "  device_tokens: [" << absl::StrJoin(settings.device_tokens, ", ") << "]\n"
        << (settings.crl_file.empty() ? "" : "  crl_file: " + settings.crl_file + "\n")
        << "device: " << (settings.device.empty() ? CloudDevice() : settings.device) << "\n"
        << "dtype: " << settings.dtype << "\n"
        << "max_context: 1024\n"
        << "kv_cache:\n  block_size: 16\n  memory_bytes: " << settings.kv_memory << "\n"
        << "scheduler:\n  max_batch_tokens: " << settings.max_batch_tokens
        << "\n  max_running_sessions: " << settings.max_running_sessions
        << "\n  max_waiting_sessions: " << settings.max_waiting_sessions
        << "\n  prompt_chunk_size: 16\n"
        << "  max_draft_steps: " << settings.max_draft_steps << "\n"
        << "  min_prompt_chunk_size: " << settings.min_prompt_chunk_size
        << "\n  adaptive: " << (settings.adaptive ? "true" : "false") << "\n  wire_dtypes: ["
        << absl::StrJoin(settings.wire_dtypes, ", ") << "]\n"
        << "limits:\n  max_chunk_tokens: " << settings.max_chunk_tokens
        << "\n  max_message_bytes: " << settings.max_message_bytes
        << "\n  max_sessions_per_device: " << settings.max_sessions_per_device
        << "\n  max_queued_bytes_per_stream: " << settings.max_queued_bytes_per_stream
        << "\n  max_inflight_bytes_per_stream: " << settings.max_inflight_bytes_per_stream
        << "\n  unread_stream_timeout_s: " << settings.unread_stream_timeout_s
        << "\n  max_messages_per_second_per_device: " << settings.max_messages_per_second_per_device
        << "\n  max_refusals_per_second_per_device: " << settings.max_refusals_per_second_per_device
        << "\n  max_kv_fraction_per_device: " << settings.max_kv_fraction_per_device << "\n"
        << "drain_grace_period_s: " << settings.drain_grace_period_s << "\n"
        << "metrics_address: \"127.0.0.1:" << metrics_port_ << "\"\n"
        << "compute_threads: " << settings.compute_threads << "\n";
    std::vector<int> layer_boundaries = settings.layer_boundaries;
    if (layer_boundaries.empty() && settings.planned_stages == 0) layer_boundaries = CloudStages();
    if (!layer_boundaries.empty() || settings.planned_stages > 0) {
      std::ofstream config(config_, std::ios::app);
      config << "pipeline:\n  rendezvous_address: \"127.0.0.1:" << testing::FreePort()
             << "\"\n  timeout_s: 30\n";
      if (settings.planned_stages > 0) {
        config << "  planned_stages: " << settings.planned_stages << "\n";
        stages_ = settings.planned_stages;
      } else {
        config << "  layer_boundaries: [";
        for (size_t i = 0; i < layer_boundaries.size(); ++i) {
          config << (i > 0 ? ", " : "") << layer_boundaries[i];
        }
        config << "]\n";
        stages_ = static_cast<int>(layer_boundaries.size()) - 1;
        if (settings.layer_boundaries.empty() && !CloudStageDevices().empty()) {
          config << "  backend: nccl\n  devices: ["
                 << absl::StrJoin(absl::StrSplit(CloudStageDevices(), ','), ", ") << "]\n";
        }
      }
    }
    extra_args_ = settings.extra_args;
    if (settings.start) Start(dir);
  }

  // Starts stage 0 (the gRPC-facing daemon) and, with a pipeline, its later stages.
  void Start(const fs::path& dir) {
    const std::string run = std::to_string(port_) + "-" + std::to_string(starts_++);
    std::vector<std::string> args = {(BinDir() / "tophat-cloud").string(), "--config",
                                     config_.string()};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    process_ = std::make_unique<ChildProcess>(std::move(args), dir / ("cloud-" + run + ".log"));
    stage_processes_.clear();
    for (int stage = 1; stage < stages_; ++stage) {
      stage_processes_.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{(BinDir() / "tophat-cloud").string(), "--config",
                                   config_.string(), "--stage", std::to_string(stage)},
          dir / ("cloud-" + run + "-stage" + std::to_string(stage) + ".log")));
    }
    RequireListening(*process_, port_, 60s, host_);
    RequireListening(*process_, metrics_port_, 10s);
  }

  std::string Metrics() const { return testing::HttpGet(metrics_port_, "/metrics"); }
  // GET `path` on the metrics port: the body of a 200, else "".
  std::string MetricsPortGet(const std::string& path) const {
    return testing::HttpGet(metrics_port_, path);
  }
  double Metric(const std::string& name, const std::string& labels = "") const {
    return testing::MetricValue(Metrics(), name, labels).value_or(-1);
  }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  const fs::path& config() const { return config_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  ChildProcess& process() { return *process_; }
  int stages() const { return stages_; }
  // Stage i >= 1 of a pipeline.
  ChildProcess& stage(int i) { return *stage_processes_.at(static_cast<size_t>(i - 1)); }

 private:
  int port_;
  int metrics_port_;
  std::string host_;
  int starts_ = 0;
  int stages_ = 1;
  std::vector<std::unique_ptr<ChildProcess>> stage_processes_;
  fs::path config_;
  std::vector<std::string> extra_args_;
  std::unique_ptr<ChildProcess> process_;
};

class AgentProcess {
 public:
  // `yaml`: extra agent config (e.g. the speculative: section), written to a file.
  // `cloud_token_file`: cloud_tls.token_file, for a cloud with device tokens.
  AgentProcess(const fs::path& dir, const CloudProcess& cloud, int64_t chunk_size,
               const std::string& yaml = "", int compute_threads = 0,
               const std::string& cloud_token_file = "")
      : AgentProcess(dir, cloud.address(), chunk_size, yaml, compute_threads,
                     cloud_token_file) {}
  // `clouds`: one cloud's address, or several comma-separated. `launcher`: what runs the
  // agent's command line (empty: run directly). `cloud_crl_file`: cloud_tls.crl_file.
  AgentProcess(const fs::path& dir, const std::string& clouds, int64_t chunk_size,
               const std::string& yaml = "", int compute_threads = 0,
               const std::string& cloud_token_file = "",
               const std::vector<std::string>& launcher = {}, const fs::path& bundle = {},
               const std::vector<std::string>& extra_args = {},
               const std::string& cloud_crl_file = "")
      : port_(testing::FreePort()), metrics_port_(testing::FreePort()) {
    std::vector<std::string> args = launcher;
    const std::vector<std::string> agent_args = {
        (BinDir() / "tophat-agent").string(), "--bundle",
        (bundle.empty() ? Bundles() / "device" : bundle).string(),
        "--listen", address(), "--cloud", clouds, "--metrics",
        "127.0.0.1:" + std::to_string(metrics_port_), "--prompt-chunk-size",
        std::to_string(chunk_size)};
    args.insert(args.end(), agent_args.begin(), agent_args.end());
    // Every agent is device-1 to the cloud, over mutual TLS.
    const TlsFiles tls = DeviceTls("device-1");
    config_ = dir / ("agent-" + std::to_string(port_) + ".yaml");
    const fs::path& config = config_;
    std::ofstream(config) << "cloud_tls:\n  certificate_file: " << tls.certificate_file
                          << "\n  private_key_file: " << tls.private_key_file
                          << "\n  ca_file: " << tls.ca_file << "\n"
                          << (cloud_token_file.empty() ? ""
                                                       : "  token_file: " + cloud_token_file + "\n")
                          << (cloud_crl_file.empty() ? "" : "  crl_file: " + cloud_crl_file + "\n")
                          // Finished requests free their cloud KV (tests count it), unless
                          // the test is about conversations.
                          << (yaml.find("conversation_cache") == std::string::npos
                                  ? "conversation_cache:\n  enabled: false\n"
                                  : "")
                          << yaml << "\ncompute_threads: " << compute_threads << "\n";
    args.push_back("--config");
    args.push_back(config.string());
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    process_ = std::make_unique<ChildProcess>(std::move(args),
                                              dir / ("agent-" + std::to_string(port_) + ".log"));
    RequireListening(*process_, port_, 60s);
    // 30 s, as the wait for its cloud below: in one sanitized CI run (2 cores) an agent that
    // listened did not complete the SDK's connection within its default 10 s (not
    // reproduced in 8 runs under ASan with the cores loaded). A failure now says whether the
    // agent still runs, and shows its log.
    auto client = Client::Connect(address(), 30);
    INFO("Client::Connect: " << client.status() << "; the agent "
                             << (process_->running() ? "runs" : "has exited") << "; its log:\n"
                             << process_->Log());
    REQUIRE(client.ok());
    client_ = std::move(*client);
    // Ready once its cloud stream is up.
    const bool connected = testing::WaitUntil(
        [&] {
          auto health = client_->Health();
          return health.ok() && health->cloud_connected();
        },
        30s);
    INFO("the agent's log as it is:\n" << process_->Log());
    REQUIRE(connected);
  }

  Client& client() { return *client_; }
  // Whether its Health says it is `connected` to a cloud, or not, within `timeout`.
  bool WaitForCloud(bool connected, std::chrono::seconds timeout) {
    return testing::WaitUntil(
        [&] {
          auto health = client_->Health();
          return health.ok() && health->cloud_connected() == connected;
        },
        timeout);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  ChildProcess& process() { return *process_; }
  const fs::path& config() const { return config_; }
  double Metric(const std::string& name, const std::string& labels = "") const {
    return testing::MetricValue(testing::HttpGet(metrics_port_, "/metrics"), name, labels)
        .value_or(-1);
  }

 private:
  int port_;
  int metrics_port_;
  fs::path config_;
  std::unique_ptr<ChildProcess> process_;
  std::unique_ptr<Client> client_;
};

v1::GenerateRequest IdsRequest(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                               bool ignore_eos = false) {
  v1::GenerateRequest request;
  for (int32_t id : prompt) request.mutable_prompt_ids()->add_ids(static_cast<uint32_t>(id));
  request.set_max_new_tokens(static_cast<uint32_t>(max_new_tokens));
  request.set_ignore_eos(ignore_eos);
  return request;
}

// grpc.health.v1.Health/Check for the whole server, through a generic stub (Debian ships the
// health service but not its generated client). Returns the ServingStatus enum value:
// 1 = SERVING, 2 = NOT_SERVING; -1 if the call failed.
int HealthCheck(const std::string& address) {
  auto channel = grpc::CreateChannel(address, DeviceCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  // HealthCheckRequest{service: ""}, with the empty field written out explicitly.
  const std::string encoded("\x0a\x00", 2);
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::CompletionQueue queue;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &queue);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!queue.Next(&tag, &ok) || !ok || !status.ok()) {
    UNSCOPED_INFO("health check: " << status.error_code() << " " << status.error_message());
    return -1;
  }
  queue.Shutdown();
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // HealthCheckResponse{status = 1}: tag 0x08, then the enum value.
  if (bytes.size() == 2 && bytes[0] == 0x08) return bytes[1];
  return bytes.empty() ? 0 : -1;
}

std::vector<int32_t> Tokens(const GenerateResult& result) {
  return {result.token_ids.begin(), result.token_ids.end()};
}

TEST_CASE("Three agents with chunk sizes 1, 16 and 128 reproduce the monolithic greedy tokens",
          "[serving][cuda-cloud][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_batch_tokens = 48});
  std::vector<std::unique_ptr<AgentProcess>> agents;
  for (int64_t chunk : {1, 16, 128}) {
    agents.push_back(std::make_unique<AgentProcess>(dir.path(), cloud, chunk));
  }

  // Prompts of different lengths, up to a few hundred tokens (several joined sentences).
  std::vector<std::string> sentences = ToyPrompts(11, 24);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < 6; ++i) {
    std::string text;
    for (size_t j = 0; j <= i * 3; ++j) text += sentences[(i + j) % sentences.size()] + " ";
    prompts.push_back(Tokenize(text));
  }
  const int64_t max_new_tokens = 24;
  std::vector<std::future<absl::StatusOr<GenerateResult>>> futures;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Client& client = agents[i % agents.size()]->client();
    v1::GenerateRequest request = IdsRequest(prompts[i], max_new_tokens);
    // Half of them with their tokens' log-probabilities and two alternatives.
    if (i % 2 == 0) {
      request.set_logprobs(true);
      request.set_top_logprobs(2);
      request.set_prompt_logprobs(true);  // its rows come back chunk by chunk
    }
    futures.push_back(std::async(std::launch::async, [&client, request] {
      return client.Generate(request);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<GenerateResult> result = futures[i].get();
    INFO("prompt " << i << " (" << prompts[i].size() << " tokens) on agent " << i % 3);
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == Reference(prompts[i], max_new_tokens, /*stop_at_eos=*/true));
    CHECK(result->stats.prompt_tokens() == prompts[i].size());
    if (i % 2 == 0) {
      // The monolithic model's, to float32's rounding over different chunkings and rounds
      // (7.5e-6 at most measured on the CPU; a GPU's kernels sum in other orders still).
      const double margin = CloudDevice() == "cpu" ? 1e-4 : 1e-3;
      REQUIRE(result->logprobs.size() == result->token_ids.size());
      const at::Tensor want = ReferenceLogprobs(prompts[i], Tokens(*result));
      for (size_t t = 0; t < result->logprobs.size(); ++t) {
        const v1::TokenLogprobs& got = result->logprobs[t];
        INFO("token " << t);
        CHECK(got.logprob() ==
              Approx(want[t][result->token_ids[t]].item<float>()).margin(margin));
        REQUIRE(got.top_ids_size() == 2);
        CHECK(got.top_ids(0) == result->token_ids[t]);  // greedy
        CHECK(got.top_logprobs(1) ==
              Approx(want[t][got.top_ids(1)].item<float>()).margin(margin));
        CHECK(got.top_logprobs(0) >= got.top_logprobs(1));
      }
      REQUIRE(result->prompt_logprobs.size() == prompts[i].size() - 1);
      const at::Tensor whole = ReferenceLogprobs(prompts[i], Tokens(*result), /*whole=*/true);
      for (size_t t = 0; t + 1 < prompts[i].size(); ++t) {
        INFO("prompt token " << t + 1);
        CHECK(result->prompt_logprobs[t].logprob() ==
              Approx(whole[t][prompts[i][t + 1]].item<float>()).margin(margin));
      }
    } else {
      CHECK(result->logprobs.empty());
      CHECK(result->prompt_logprobs.empty());
    }
    CHECK(result->time_to_first_token_seconds() > 0);
  }
  // Every session closed: the cloud's KV is back to empty.
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") == 0; },
                             5s));
  CHECK(cloud.Metric("tophat_prompt_tokens_total") > 0);
  CHECK(cloud.Metric("tophat_hidden_state_bytes_total", "direction=\"in\"") > 0);
  // When the certificates end, for the expiry alerts: make-certs.sh's run at the start of the
  // tests made them for 825 days.
  const double days_from_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() +
      800 * 86400.0;
  CHECK(cloud.Metric("tophat_tls_certificate_expiry_timestamp_seconds",
                     "key=\"tls.certificate_file\"") > days_from_now);
  CHECK(cloud.Metric("tophat_tls_certificate_expiry_timestamp_seconds",
                     "key=\"tls.client_ca_file\"") > days_from_now);
  CHECK(agents[0]->Metric("tophat_tls_certificate_expiry_timestamp_seconds",
                          "key=\"cloud_tls.certificate_file\"") > days_from_now);

  CHECK(HealthCheck(cloud.address()) == 1);  // SERVING

  // SIGTERM drains and exits 0.
  cloud.process().Signal(SIGTERM);
  auto code = cloud.process().Wait(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

// A raw agent-side stream, for sending what a real agent never would.
class RawStream {
 public:
  // `receive_window`: HTTP/2's window for what the cloud may send ahead of our reads (0:
  // gRPC's, which grows to megabytes), so that tests of unread results need not fill it.
  // `token`: a bearer token sent with the stream, for a cloud with device tokens.
  explicit RawStream(const std::string& address, const std::string& device = "device-1",
                     int receive_window = 0, const std::string& token = "") {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(256 << 20);
    if (receive_window > 0) {
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, receive_window);
    }
    // A hung test fails instead of blocking forever (a write to a cloud that stopped
    // reading blocks until then).
    context_.set_deadline(std::chrono::system_clock::now() + 120s);
    channel_ = grpc::CreateCustomChannel(address, DeviceCredentials(device), args);
    stub_ = v1::CloudService::NewStub(channel_);
    if (!token.empty()) context_.AddMetadata(kAuthorizationMetadata, BearerMetadataValue(token));
    stream_ = stub_->Connect(&context_);
    v1::CloudMessage first;
    REQUIRE(stream_->Read(&first));
    REQUIRE(first.has_hello());
    hello_ = first.hello();
  }
  const v1::Hello& hello() const { return hello_; }
  bool Send(const v1::AgentMessage& message) { return stream_->Write(message); }
  // The next message but load reports (which come on the cloud's timer).
  v1::CloudMessage Read() {
    v1::CloudMessage message;
    do {
      REQUIRE(stream_->Read(&message));
    } while (message.has_load());
    return message;
  }
  // Reads past `session`'s admission and every chunk receipt to the next other message.
  v1::CloudMessage ReadFor(uint64_t session) {
    while (true) {
      v1::CloudMessage message = Read();
      if (message.has_admitted() && message.admitted().session_id() == session) continue;
      if (message.has_received()) continue;
      return message;
    }
  }
  // Ends the call without waiting for the server to end it.
  void Cancel() { context_.TryCancel(); }
  grpc::Status Finish() {
    stream_->WritesDone();
    v1::CloudMessage ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CloudService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>> stream_;
  v1::Hello hello_;
};

v1::AgentMessage OpenMessage(uint64_t session, uint32_t max_positions) {
  v1::AgentMessage message;
  message.mutable_open()->set_session_id(session);
  message.mutable_open()->set_max_positions(max_positions);
  return message;
}

v1::AgentMessage ChunkMessage(uint64_t session, uint32_t first, uint32_t positions,
                              uint32_t hidden, v1::DType dtype, int64_t bytes_delta = 0) {
  v1::AgentMessage message;
  v1::ForwardChunk* chunk = message.mutable_forward();
  chunk->set_session_id(session);
  chunk->set_sequence_number(7);
  chunk->set_first_position(first);
  chunk->set_phase(v1::PHASE_PREFILL);
  chunk->mutable_states()->set_dtype(dtype);
  chunk->mutable_states()->set_num_positions(positions);
  chunk->mutable_states()->set_hidden_size(hidden);
  const int64_t element = dtype == v1::DTYPE_FLOAT32              ? 4
                          : dtype == v1::DTYPE_INT8_PER_POSITION ? 1
                                                                 : 2;
  chunk->mutable_states()->mutable_data()->assign(positions * hidden * element + bytes_delta,
                                                  '\0');
  return message;
}

// That the cloud still serves `stream`: a 4-position chunk of a new `session` comes back
// computed.
void RequireServes(RawStream& stream, uint64_t session) {
  const uint32_t d = stream.hello().hidden_size();
  REQUIRE(stream.Send(OpenMessage(session, 64)));
  REQUIRE(stream.Send(ChunkMessage(session, 0, 4, d, v1::DTYPE_FLOAT32)));
  const v1::CloudMessage reply = stream.ReadFor(session);
  REQUIRE(reply.has_result());
  CHECK(reply.result().states().num_positions() == 4);
}

// Waits until the cloud `probe` streams to refuses new sessions with UNAVAILABLE: its drain
// has begun (the signal takes effect whenever the cloud's main thread gets to it, so this is
// a condition, not a guessed delay). Probe sessions it still admits are closed at once; their
// ids count up from `first_id`.
void WaitUntilDraining(RawStream& probe, uint64_t first_id) {
  uint64_t id = first_id;
  REQUIRE(testing::WaitUntil(
      [&] {
        ++id;
        REQUIRE(probe.Send(OpenMessage(id, 16)));
        const v1::CloudMessage reply = probe.Read();
        if (reply.has_error()) {
          return reply.error().code() == static_cast<int>(absl::StatusCode::kUnavailable);
        }
        // Admitted: the drain has not begun yet. Close it and ask again.
        v1::AgentMessage close;
        close.mutable_close()->set_session_id(id);
        REQUIRE(probe.Send(close));
        return false;
      },
      10s));
}

TEST_CASE("Malformed hidden-state chunks fail their own session, and the cloud keeps serving",
          "[serving][cuda-cloud][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_chunk_tokens = 256, .max_message_bytes = "1MiB"});
  AgentProcess agent(dir.path(), cloud, 16);
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(5, 1)[0]);
  const std::vector<int32_t> expected = Reference(prompt, 16, true);

  RawStream raw(cloud.address());
  const uint32_t d = raw.hello().hidden_size();
  struct Case {
    std::string name;
    v1::AgentMessage message;
    absl::StatusCode code;
    std::string mentions;
  };
  uint64_t session = 100;
  std::vector<Case> cases;
  cases.push_back({"wrong hidden size", ChunkMessage(session, 0, 4, d + 1, v1::DTYPE_FLOAT32),
                   absl::StatusCode::kInvalidArgument, "states.hidden_size"});
  // Any wire dtype is accepted (protocol version 2); one this build does not know is not.
  cases.push_back({"unknown dtype", ChunkMessage(++session, 0, 4, d, static_cast<v1::DType>(9)),
                   absl::StatusCode::kInvalidArgument, "states.dtype"});
  // int8 without its per-position scales.
  cases.push_back({"int8 without scales",
                   ChunkMessage(++session, 0, 4, d, v1::DTYPE_INT8_PER_POSITION),
                   absl::StatusCode::kInvalidArgument, "states.scales"});
  cases.push_back({"wrong byte length", ChunkMessage(++session, 0, 4, d, v1::DTYPE_FLOAT32, -3),
                   absl::StatusCode::kInvalidArgument, "states.data"});
  cases.push_back({"position gap", ChunkMessage(++session, 5, 4, d, v1::DTYPE_FLOAT32),
                   absl::StatusCode::kInvalidArgument, "first_position"});
  cases.push_back({"too many positions", ChunkMessage(++session, 0, 300, d, v1::DTYPE_FLOAT32),
                   absl::StatusCode::kInvalidArgument, "num_positions"});
  // One after another on one stream and one cloud (a cloud per case took 2 s each, 5 s
  // under ASan): each fails only its own session.
  for (Case& c : cases) {
    INFO(c.name);
    const uint64_t id = c.message.forward().session_id();
    REQUIRE(raw.Send(OpenMessage(id, 64)));
    REQUIRE(raw.Send(c.message));
    v1::CloudMessage reply = raw.ReadFor(id);
    REQUIRE(reply.has_error());
    CHECK(reply.error().session_id() == id);
    CHECK(reply.error().code() == static_cast<int>(c.code));
    INFO(reply.error().message());
    CHECK(reply.error().message().find(c.mentions) != std::string::npos);
  }
  {
    INFO("unknown session id");
    REQUIRE(raw.Send(ChunkMessage(999, 0, 4, d, v1::DTYPE_FLOAT32)));
    v1::CloudMessage reply = raw.ReadFor(999);
    REQUIRE(reply.has_error());
    CHECK(reply.error().code() == static_cast<int>(absl::StatusCode::kNotFound));
    CHECK(reply.error().message().find("999") != std::string::npos);
  }
  {
    INFO("a valid chunk on the same stream still works after all those bad ones");
    REQUIRE(raw.Send(OpenMessage(1, 64)));
    REQUIRE(raw.Send(ChunkMessage(1, 3, 4, d, v1::DTYPE_FLOAT32)));  // gap: fails session 1
    REQUIRE(raw.ReadFor(1).has_error());
    REQUIRE(raw.Send(OpenMessage(2, 64)));
    REQUIRE(raw.Send(ChunkMessage(2, 0, 4, d, v1::DTYPE_FLOAT32)));
    // The prompt chunk's receipt comes first, as soon as the cloud read it (the agent's
    // uplink pacing waits for it), then its result.
    CHECK(raw.hello().acknowledges_chunks());
    v1::CloudMessage receipt = raw.Read();
    while (receipt.has_admitted()) receipt = raw.Read();
    REQUIRE(receipt.has_received());
    CHECK(receipt.received().session_id() == 2);
    CHECK(receipt.received().sequence_number() == 7);
    CHECK(receipt.received().received_at_seconds() > 0);
    v1::CloudMessage reply = raw.ReadFor(2);
    REQUIRE(reply.has_result());
    CHECK(reply.result().states().num_positions() == 4);
    CHECK(reply.result().chunk_done());
  }
  {
    INFO("an oversize message ends only its own stream");
    RawStream oversize(cloud.address());
    // 2 MiB of payload against a 1 MiB limit: the whole call fails with RESOURCE_EXHAUSTED.
    oversize.Send(ChunkMessage(3, 0, (2 << 20) / (4 * d) + 1, d, v1::DTYPE_FLOAT32));
    grpc::Status status = oversize.Finish();
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    // The first stream is still served.
    REQUIRE(raw.Send(ChunkMessage(2, 4, 4, d, v1::DTYPE_FLOAT32)));
    v1::CloudMessage reply = raw.ReadFor(2);
    REQUIRE(reply.has_result());
    CHECK(reply.result().first_position() == 4);
  }
  // After all of that, the daemon still serves a real agent correctly.
  auto result = agent.client().Generate(IdsRequest(prompt, 16));
  REQUIRE(result.ok());
  REQUIRE(result->ok());
  CHECK(Tokens(*result) == expected);
  CHECK(cloud.process().running());
}

// Sends `bytes` as one message of a Connect stream through a generic stub (no typed client
// can send what is not an AgentMessage), after the cloud's Hello, and returns the status the
// cloud ends the stream with.
grpc::Status SendRawBytesOnConnect(const std::string& address, const std::string& bytes) {
  auto channel = grpc::CreateChannel(address, DeviceCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30s);
  grpc::CompletionQueue queue;
  auto call = stub.PrepareCall(&context, "/tophat.v1.CloudService/Connect", &queue);
  // Each step waits for its own tag; the reads after the write drain the stream until the
  // cloud ends it.
  auto step = [&queue](intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(queue.Next(&tag, &ok));
    REQUIRE(reinterpret_cast<intptr_t>(tag) == expected);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  REQUIRE(step(1));
  grpc::ByteBuffer hello;
  call->Read(&hello, reinterpret_cast<void*>(2));
  REQUIRE(step(2));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer message(&slice, 1);
  call->Write(message, reinterpret_cast<void*>(3));
  step(3);
  grpc::ByteBuffer ignored;
  do {
    call->Read(&ignored, reinterpret_cast<void*>(4));
  } while (step(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

TEST_CASE("Bytes that are not an AgentMessage end their stream with INVALID_ARGUMENT, and the "
          "cloud keeps serving",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // A length-delimited field 1 that claims 127 bytes and has none; and seeded random bytes,
  // checked here not to parse (protobuf skips unknown fields, so most random bytes fail but
  // not all).
  std::vector<std::string> garbage = {std::string("\x0a\x7f", 2)};
  std::mt19937 random(7);
  while (garbage.size() < 3) {
    std::string bytes(64, '\0');
    for (char& c : bytes) c = static_cast<char>(random() & 0xff);
    v1::AgentMessage parsed;
    if (!parsed.ParseFromString(bytes)) garbage.push_back(bytes);
  }
  for (const std::string& bytes : garbage) {
    const grpc::Status status = SendRawBytesOnConnect(cloud.address(), bytes);
    INFO(status.error_code() << " " << status.error_message());
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message().find("message 1 on the stream is not a tophat.v1.AgentMessage") !=
          std::string::npos);
  }
  CHECK(testing::WaitUntil(
      [&] {
        const std::string log = cloud.process().Log();
        size_t lines = 0;
        for (size_t at = log.find("is not a tophat.v1.AgentMessage"); at != std::string::npos;
             at = log.find("is not a tophat.v1.AgentMessage", at + 1)) {
          ++lines;
        }
        return lines == garbage.size();
      },
      10s));
  // The daemon still serves: a stream that speaks the protocol gets its Hello and its results.
  RawStream raw(cloud.address());
  const uint32_t d = raw.hello().hidden_size();
  REQUIRE(raw.Send(OpenMessage(1, 64)));
  REQUIRE(raw.Send(ChunkMessage(1, 0, 4, d, v1::DTYPE_FLOAT32)));
  v1::CloudMessage reply = raw.ReadFor(1);
  REQUIRE(reply.has_result());
  CHECK(reply.result().states().num_positions() == 4);
  CHECK(cloud.process().running());
}

TEST_CASE("A malformed YAML config is refused with the file, key and line", "[serving]") {
  testing::TempDir dir;
  const fs::path config = dir.path() / "cloud.yaml";
  std::ofstream(config) << "bundle: /nowhere\nkv_cache:\n  block_size: many\n";
  ChildProcess cloud({(BinDir() / "tophat-cloud").string(), "--config", config.string()},
                     dir.path() / "cloud.log");
  auto code = cloud.Wait(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  const std::string log = cloud.Log();
  INFO(log);
  CHECK(log.find("cloud.yaml:3") != std::string::npos);
  CHECK(log.find("kv_cache.block_size") != std::string::npos);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Replaces the text `from` (which must be there) with `to` in the config file at `path`, as an
// operator should: a new file renamed over the old, so that a reload never reads half of it.
void ReplaceInConfig(const fs::path& path, const std::string& from, const std::string& to) {
  std::string text = ReadFile(path);
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  std::ofstream(path.string() + ".new") << text;
  fs::rename(path.string() + ".new", path);
}

// Rewrites `config`'s tls.device_tokens line (and adds tls.revoked_devices after it) as an
// operator should: a new file renamed over the old.
void RewriteAccess(const fs::path& config, const std::vector<std::string>& device_tokens,
                   const std::vector<std::string>& revoked_devices = {}) {
  std::istringstream in(ReadFile(config));
  std::ostringstream out;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("  revoked_devices: [")) continue;  // an earlier rewrite's
    if (line.starts_with("  device_tokens: [")) {
      line = "  device_tokens: [" + absl::StrJoin(device_tokens, ", ") + "]\n" +
             "  revoked_devices: [" + absl::StrJoin(revoked_devices, ", ") + "]";
    }
    out << line << "\n";
  }
  const fs::path replacement = config.string() + ".new";
  std::ofstream(replacement) << out.str();
  fs::rename(replacement, config);
}

// The log's count of `text` (a line the daemon writes once per event).
int Occurrences(const std::string& log, const std::string& text) {
  int count = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
  return count;
}

// Opens a stream to the cloud at `address` as a device would, with `credentials` and, when
// given, a bearer token: OK once the cloud's Hello arrives, else the status the call ended with.
grpc::Status OpenCloudStream(const std::string& address,
                             const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                             const std::string& token = "") {
  auto channel = grpc::CreateChannel(address, credentials);
  auto stub = v1::CloudService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 20s);
  if (!token.empty()) context.AddMetadata(kAuthorizationMetadata, BearerMetadataValue(token));
  auto stream = stub->Connect(&context);
  v1::CloudMessage first;
  if (stream->Read(&first) && first.has_hello()) {
    context.TryCancel();
    (void)stream->Finish();
    return grpc::Status::OK;
  }
  return stream->Finish();
}

TEST_CASE("The cloud's port takes only devices whose certificate its CA signed", "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  auto open_with = [&](const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    return OpenCloudStream(cloud.address(), credentials);
  };
  CHECK(open_with(DeviceCredentials("device-2")).ok());
  // The cloud knows the device by the name in its certificate.
  CHECK(testing::WaitUntil(
      [&] { return cloud.process().Log().find("(device device-2)") != std::string::npos; }, 10s));

  // Plaintext.
  CHECK(open_with(grpc::InsecureChannelCredentials()).error_code() ==
        grpc::StatusCode::UNAVAILABLE);
  // TLS that trusts the cloud but presents no certificate.
  grpc::SslCredentialsOptions no_certificate;
  no_certificate.pem_root_certs = ReadFile(Certs() / "ca.crt");
  CHECK(open_with(grpc::SslCredentials(no_certificate)).error_code() ==
        grpc::StatusCode::UNAVAILABLE);
  // A certificate with a device's name from another CA.
  const fs::path other = dir.path() / "other-ca";
  MakeCerts(other.string() + " device-1");
  auto forged = MutualTlsChannelCredentials({.certificate_file = (other / "device-1.crt").string(),
                                             .private_key_file = (other / "device-1.key").string(),
                                             .ca_file = (Certs() / "ca.crt").string()},
                                            "test");
  REQUIRE(forged.ok());
  CHECK(open_with(*forged).error_code() == grpc::StatusCode::UNAVAILABLE);
  // None of it disturbed the daemon.
  CHECK(open_with(DeviceCredentials("device-1")).ok());
  CHECK(cloud.process().running());
}

TEST_CASE("With device tokens the cloud takes a stream only with the token of its certificate's "
          "device, and an agent reaches it with its token file",
          "[serving]") {
  testing::TempDir dir;
  CloudSettings settings;
  settings.device_tokens = {"\"device-1:" + Sha256Hex("secret-1") + "\"",
                            "\"device-2:" + Sha256Hex("secret-2") + "\""};
  CloudProcess cloud(dir.path(), settings);
  auto open_with = [&](const std::string& token) {
    return OpenCloudStream(cloud.address(), DeviceCredentials("device-1"), token);
  };
  CHECK(open_with("").error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(open_with("secret-3").error_code() == grpc::StatusCode::UNAUTHENTICATED);
  // device-2's token on device-1's certificate.
  const grpc::Status crossed = open_with("secret-2");
  CHECK(crossed.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK_THAT(crossed.error_message(), Catch::Contains("device-2's, the certificate device-1's"));
  CHECK(open_with("secret-1").ok());

  const fs::path token_file = dir.path() / "device-1.token";
  std::ofstream(token_file) << "secret-1\n";
  AgentProcess agent(dir.path(), cloud, 16, "", 0, token_file.string());
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(11, 1)[0]);
  auto result = agent.client().Generate(IdsRequest(prompt, 8));
  REQUIRE(result.ok());
  INFO(result->error);
  REQUIRE(result->ok());
  CHECK(Tokens(*result) == Reference(prompt, 8, true));
  CHECK(cloud.process().running());
}

TEST_CASE("An agent whose certificate file is missing exits at once, naming the key",
          "[serving]") {
  testing::TempDir dir;
  const fs::path config = dir.path() / "agent.yaml";
  std::ofstream(config) << "bundle: " << (Bundles() / "device").string()
                        << "\ncloud_tls:\n  certificate_file: " << (dir.path() / "no.crt").string()
                        << "\n  private_key_file: " << DeviceTls("device-1").private_key_file
                        << "\n  ca_file: " << DeviceTls("device-1").ca_file
                        << "\nlisten_address: \"127.0.0.1:" << testing::FreePort()
                        << "\"\nmetrics_address: \"127.0.0.1:" << testing::FreePort() << "\"\n";
  // In a loop: the start-up error path must exit, every time (it once hung on the metrics
  // server's thread).
  for (int run = 0; run < 5; ++run) {
    ChildProcess agent({(BinDir() / "tophat-agent").string(), "--config", config.string()},
                       dir.path() / ("agent-" + std::to_string(run) + ".log"));
    auto code = agent.Wait(30s);
    REQUIRE(code.has_value());
    CHECK(*code == 1);
    CHECK_THAT(agent.Log(), Catch::Contains("cloud_tls.certificate_file: cannot read"));
  }
}

TEST_CASE("A daemon whose private key is not its certificate's exits at once, naming both",
          "[serving]") {
  testing::TempDir dir;
  // device-1's certificate beside device-2's key: a renewal that forgot one of the two files.
  const fs::path config = dir.path() / "agent.yaml";
  std::ofstream(config) << "bundle: " << (Bundles() / "device").string()
                        << "\ncloud_tls:\n  certificate_file: "
                        << DeviceTls("device-1").certificate_file
                        << "\n  private_key_file: " << DeviceTls("device-2").private_key_file
                        << "\n  ca_file: " << DeviceTls("device-1").ca_file
                        << "\nlisten_address: \"127.0.0.1:" << testing::FreePort()
                        << "\"\nmetrics_address: \"127.0.0.1:" << testing::FreePort() << "\"\n";
  ChildProcess agent({(BinDir() / "tophat-agent").string(), "--config", config.string()},
                     dir.path() / "agent.log");
  auto code = agent.Wait(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK_THAT(agent.Log(), Catch::Contains("cloud_tls.private_key_file: ") &&
                              Catch::Contains("device-2.key is not the key of "
                                              "cloud_tls.certificate_file") &&
                              Catch::Contains("device-1.crt"));
}

// Runs `daemon --config config --check-config`, its output to `log`: its exit code and output.
std::pair<int, std::string> CheckConfig(const std::string& daemon, const fs::path& config,
                                        const fs::path& log) {
  ChildProcess checked({(BinDir() / daemon).string(), "--config", config.string(), "--check-config"},
                       log);
  const auto code = checked.Wait(60s);
  REQUIRE(code.has_value());
  return {*code, checked.Log()};
}

TEST_CASE("tophat-cloud --check-config checks a config as far as a start gets before the "
          "weights, and names what would stop it",
          "[serving]") {
  testing::TempDir dir;
  const auto check = [&](const CloudProcess& cloud, const std::string& name) {
    return CheckConfig("tophat-cloud", cloud.config(), dir.path() / (name + ".log"));
  };
  SECTION("a good config passes; ports in use are said, not refused") {
    CloudProcess cloud(dir.path(), CloudSettings{.start = false});
    auto [code, log] = check(cloud, "good");
    INFO(log);
    CHECK(code == 0);
    CHECK_THAT(log, Catch::Contains("access: no device tokens (a certificate names its device); "
                                    "0 revoked device(s)"));
    CHECK_THAT(log, Catch::Contains("cloud.crt and its key are a pair, valid until"));
    CHECK_THAT(log, Catch::Contains("fingerprint sha256:"));
    CHECK_THAT(log, Catch::Contains("KV pool ") && Catch::Contains(" blocks x 16 positions"));
    CHECK_THAT(log, Catch::Contains("listen_address " + cloud.address() + ": free"));
    CHECK_THAT(log, Catch::Contains("ok: a start would load the weights next"));
    // The same config, its daemon running: still a pass, the port said to be in use.
    cloud.Start(dir.path());
    auto [running_code, running_log] = check(cloud, "running");
    INFO(running_log);
    CHECK(running_code == 0);
    CHECK_THAT(running_log, Catch::Contains("(a running tophat-cloud's?)"));
    // What a reload would apply is checked and said before it.
    RewriteAccess(cloud.config(), {"\"device-1:" + Sha256Hex("secret-1") + "\""},
                  {"device-7", "device-9"});
    auto [access_code, access_log] = check(cloud, "access");
    INFO(access_log);
    CHECK(access_code == 0);
    CHECK_THAT(
        access_log,
        Catch::Contains("access: 1 device token(s); 2 revoked device(s): device-7, device-9"));
    RewriteAccess(cloud.config(), {}, {"device-7", "device-7"});
    auto [twice_code, twice_log] = check(cloud, "twice");
    CHECK(twice_code == 1);
    CHECK_THAT(twice_log, Catch::Contains("tls.revoked_devices[1]: \"device-7\" is listed twice"));
  }
  SECTION("a CRL: what it revokes is said, and a file that is no CRL is refused") {
    const fs::path certs = CertsWithCrl(dir.path());
    CloudProcess cloud(dir.path(),
                       CloudSettings{.crl_file = (certs / "crl.pem").string(), .start = false});
    auto [code, log] = check(cloud, "crl");
    INFO(log);
    CHECK(code == 0);
    CHECK_THAT(log, Catch::Contains("crl: " + (certs / "crl.pem").string() +
                                    ": 0 revoked certificate(s) in 1 CRL(s), due for renewal at"));
    CloudProcess not_crl(dir.path(),
                         CloudSettings{.crl_file = (certs / "ca.crt").string(), .start = false});
    auto [not_crl_code, not_crl_log] = check(not_crl, "not-crl");
    CHECK(not_crl_code == 1);
    CHECK_THAT(not_crl_log,
               Catch::Contains("tls.crl_file: " + (certs / "ca.crt").string() + " holds no CRL"));
  }
  SECTION("the device bundle in the cloud's place") {
    CloudProcess cloud(dir.path(), CloudSettings{.bundle = (Bundles() / "device").string(),
                                                 .start = false});
    auto [code, log] = check(cloud, "device-bundle");
    CHECK(code == 1);
    CHECK_THAT(log, Catch::Contains("is a device bundle; the cloud daemon needs the cloud bundle"));
  }
  SECTION("a KV pool too small for one block") {
    CloudProcess cloud(dir.path(), CloudSettings{.kv_memory = "1KiB", .start = false});
    auto [code, log] = check(cloud, "kv");
    CHECK(code == 1);
    CHECK_THAT(log, Catch::Contains("kv_cache.memory_bytes: 1024 bytes hold no KV block"));
  }
  SECTION("a GPU that is not there") {
    CloudProcess cloud(dir.path(), CloudSettings{.device = "cuda:99", .start = false});
    auto [code, log] = check(cloud, "device");
    CHECK(code == 1);
    CHECK_THAT(log, Catch::Contains("device cuda:99 is not"));
  }
}

TEST_CASE("tophat-agent --check-config checks a config as far as a start gets before the "
          "weights, and names what would stop it",
          "[serving]") {
  testing::TempDir dir;
  const auto check = [&](const fs::path& bundle, const std::string& name,
                         const std::string& crl_file = "", const std::string& extra = "") {
    const fs::path config = dir.path() / (name + ".yaml");
    const int port = testing::FreePort();
    std::ofstream(config) << "bundle: " << bundle.string()
                          << "\ncloud_address: \"127.0.0.1:" << testing::FreePort() << "\""
                          << "\ncloud_tls:\n  certificate_file: "
                          << DeviceTls("device-1").certificate_file
                          << "\n  private_key_file: " << DeviceTls("device-1").private_key_file
                          << "\n  ca_file: " << DeviceTls("device-1").ca_file
                          << (crl_file.empty() ? "" : "\n  crl_file: " + crl_file)
                          << "\nlisten_address: \"127.0.0.1:" << port
                          << "\"\nmetrics_address: \"127.0.0.1:" << testing::FreePort() << "\"\n"
                          << extra;
    auto [code, log] = CheckConfig("tophat-agent", config, dir.path() / (name + ".log"));
    return std::tuple<int, std::string, int>(code, std::move(log), port);
  };
  {
    auto [code, log, port] = check(Bundles() / "device", "good");
    INFO(log);
    CHECK(code == 0);
    CHECK_THAT(log, Catch::Contains("cloud link: mutual TLS; certificate and key are a pair"));
    CHECK_THAT(log, Catch::Contains("fingerprint sha256:"));
    CHECK_THAT(log, Catch::Contains("listen_address 127.0.0.1:" + std::to_string(port) + ": free"));
    CHECK_THAT(log, Catch::Contains("ok: a start would load the weights next"));
  }
  {
    auto [code, log, port] = check(Bundles() / "cloud", "cloud-bundle");
    CHECK(code == 1);
    CHECK_THAT(log, Catch::Contains("is a cloud bundle; the device agent needs the device bundle"));
  }
  {
    const fs::path certs = CertsWithCrl(dir.path());
    MakeCerts("--revoke " + certs.string() + " cloud");
    auto [code, log, port] = check(Bundles() / "device", "crl", (certs / "crl.pem").string());
    INFO(log);
    CHECK(code == 0);
    CHECK_THAT(log, Catch::Contains("cloud link crl: " + (certs / "crl.pem").string() +
                                    ": 1 revoked certificate(s) in 1 CRL(s)"));
    auto [bad_code, bad_log, bad_port] =
        check(Bundles() / "device", "not-crl", (certs / "ca.crt").string());
    CHECK(bad_code == 1);
    CHECK_THAT(bad_log, Catch::Contains("cloud_tls.crl_file: " + (certs / "ca.crt").string() +
                                        " holds no CRL"));
  }
  {
    // The kept responses' folder: what a start would find there, made by the start, not the
    // check; one under a file is what a start would fail on.
    const auto openai = [&](const fs::path& store) {
      return "openai:\n  address: \"127.0.0.1:" + std::to_string(testing::FreePort()) +
             "\"\n  store_dir: " + store.string() + "\n";
    };
    auto [code, log, port] = check(Bundles() / "device", "store", "", openai(dir.path() / "kept"));
    INFO(log);
    CHECK(code == 0);
    CHECK_THAT(log, Catch::Contains("openai.store_dir: " + (dir.path() / "kept").string() +
                                    ": 0 kept responses and 0 kept conversations (files), "
                                    "writable"));
    CHECK_FALSE(fs::exists(dir.path() / "kept"));
    std::ofstream(dir.path() / "a-file") << "";
    auto [bad_code, bad_log, bad_port] =
        check(Bundles() / "device", "store-under-file", "", openai(dir.path() / "a-file" / "kept"));
    CHECK(bad_code == 1);
    CHECK_THAT(bad_log,
               Catch::Contains(
                   "openai.store_dir: " + (dir.path() / "a-file" / "kept" / "responses").string() +
                   ": " + (dir.path() / "a-file").string() + " is not a folder"));
  }
}

// What the cloud answers an OpenSession of 64 positions on `stream`: 0 when admitted, else the
// error's code, whose message must contain `refusal`.
int OpenSessionAnswer(RawStream& stream, uint64_t session, const std::string& refusal) {
  REQUIRE(stream.Send(OpenMessage(session, 64)));
  while (true) {
    v1::CloudMessage reply = stream.Read();
    if (reply.has_admitted() && reply.admitted().session_id() == session) return 0;
    if (reply.has_error() && reply.error().session_id() == session) {
      INFO(reply.error().message());
      CHECK_THAT(reply.error().message(), Catch::Contains(refusal));
      return reply.error().code();
    }
  }
}

TEST_CASE("A device holds at most its quota of sessions over all its streams, and other devices "
          "are not affected",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_sessions_per_device = 2});
  auto open = [](RawStream& stream, uint64_t session) {
    return OpenSessionAnswer(stream, session,
                             "device device-1 already has 2 sessions open "
                             "(limits.max_sessions_per_device)");
  };
  RawStream first(cloud.address(), "device-1");
  RawStream second(cloud.address(), "device-1");  // the same device on another stream
  RawStream other(cloud.address(), "device-2");
  CHECK(open(first, 1) == 0);
  CHECK(open(second, 1) == 0);
  CHECK(open(first, 2) == static_cast<int>(absl::StatusCode::kResourceExhausted));
  CHECK(open(second, 2) == static_cast<int>(absl::StatusCode::kResourceExhausted));
  CHECK(open(other, 1) == 0);  // another device is not counted against device-1
  CHECK(open(other, 2) == 0);
  // A closed session gives its place back.
  v1::AgentMessage close;
  close.mutable_close()->set_session_id(1);
  REQUIRE(first.Send(close));
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_num_sessions_running") == 3; }, 10s));
  CHECK(open(first, 3) == 0);
  CHECK(cloud.process().running());
}

TEST_CASE("A reload changes a device's session quota for the sessions it opens after it",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});  // no per-device session limit
  RawStream device_1(cloud.address(), "device-1");
  auto open = [&](uint64_t session) {
    return OpenSessionAnswer(device_1, session,
                             "device device-1 already has 3 sessions open "
                             "(limits.max_sessions_per_device)");
  };
  for (uint64_t session = 1; session <= 3; ++session) CHECK(open(session) == 0);
  ReplaceInConfig(cloud.config(), "max_sessions_per_device: 0", "max_sessions_per_device: 2");
  cloud.process().Signal(SIGHUP);
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_config_reloads_total", "result=\"applied\"") == 1; }, 20s));
  // Over the new quota: its three sessions run on, a fourth is refused.
  CHECK(open(4) == static_cast<int>(absl::StatusCode::kResourceExhausted));
  CHECK(cloud.Metric("tophat_num_sessions_running") == 3);
  const std::string log = cloud.process().Log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("per device at most 2 session(s)"));
  CHECK(log.find("take effect only at a restart") == std::string::npos);
  CHECK(cloud.Metric("tophat_config_keys_awaiting_restart") == 0);
}

TEST_CASE("A stream that does not read its results is ended and its KV freed, and other "
          "devices are served",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(),
                     {.max_queued_bytes_per_stream = "256KiB", .unread_stream_timeout_s = 2});
  AgentProcess agent(dir.path(), cloud, 16);
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(13, 1)[0]);
  const std::vector<int32_t> expected = Reference(prompt, 16, true);

  // A device that sends prompt chunks and never reads what comes back. HTTP/2's window
  // (64 KiB here) takes the first results; then the cloud's own queue passes the bound, the
  // engine stops computing for the stream, and 2 s without a result taken end it.
  RawStream greedy(cloud.address(), "device-2", 64 << 10);
  const uint32_t d = greedy.hello().hidden_size();
  const uint32_t positions = 128;
  int chunks = 0;
  auto congested = [&] { return cloud.Metric("tophat_streams_congested_total") >= 1; };
  for (uint64_t session = 1; session <= 400 && !congested(); ++session) {
    REQUIRE(greedy.Send(OpenMessage(session, 1024)));
    for (uint32_t first = 0; first < 1024 && !congested(); first += positions) {
      REQUIRE(greedy.Send(ChunkMessage(session, first, positions, d, v1::DTYPE_FLOAT32)));
      ++chunks;
    }
  }
  INFO(chunks << " chunks of " << positions * d * 4 << " bytes sent");
  // The engine computes them after they are sent; their results pass the bound then.
  REQUIRE(testing::WaitUntil(congested, 30s));
  auto ended = [&] { return cloud.Metric("tophat_streams_not_reading_total") >= 1; };
  REQUIRE(testing::WaitUntil(ended, 30s));
  // Its sessions are freed at once, not when the call is finally over.
  CHECK(testing::WaitUntil(
      [&] {
        return cloud.Metric("tophat_num_sessions_running") == 0 &&
               cloud.Metric("tophat_kv_cache_usage_ratio") == 0;
      },
      10s));
  CHECK(cloud.Metric("tophat_outgoing_queued_bytes") < 256 * 1024);
  // Another device is served correctly meanwhile.
  auto result = agent.client().Generate(IdsRequest(prompt, 16));
  REQUIRE(result.ok());
  REQUIRE(result->ok());
  CHECK(Tokens(*result) == expected);
  // What the greedy device finally reads ends with the reason.
  const grpc::Status status = greedy.Finish();
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(status.error_message(), Catch::Contains("limits.unread_stream_timeout_s"));
  CHECK(cloud.process().running());
}

// One line of /proc/PID/status in bytes ("VmRSS", "VmHWM"); -1 when unreadable.
int64_t ProcessStatusBytes(pid_t pid, const std::string& key) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}

// [memory]: it measures the cloud's resident memory, which under a sanitizer is the
// sanitizer's allocator's (its quarantine holds freed memory on purpose): release builds only.
TEST_CASE("A stream that stops reading costs the cloud its bounds and no more, and its memory "
          "comes back when it ends",
          "[serving][memory]") {
  testing::TempDir dir;
  // The bounds a non-reader fills: what its messages hold in the engine (16 MiB) and twice
  // the results queued for it (2 x 8 MiB, the hard cap). The stall timeout is long: the
  // stream must stay as it is while it is measured.
  CloudProcess cloud(dir.path(), {.max_queued_bytes_per_stream = "8MiB",
                                  .max_inflight_bytes_per_stream = "16MiB",
                                  .unread_stream_timeout_s = 120});
  const pid_t pid = cloud.process().pid();
  constexpr uint32_t kPositions = 128;
  // Warm-up: a stream that reads does the same kind of work first, so the baseline holds
  // what serving at all costs (thread pools, allocator arenas, gRPC's buffers).
  {
    RawStream reader(cloud.address(), "device-1");
    const uint32_t d = reader.hello().hidden_size();
    for (uint64_t session = 1; session <= 8; ++session) {
      REQUIRE(reader.Send(OpenMessage(session, 1024)));
      for (uint32_t first = 0; first < 1024; first += kPositions) {
        REQUIRE(reader.Send(ChunkMessage(session, first, kPositions, d, v1::DTYPE_FLOAT32)));
      }
      uint32_t got = 0;
      while (got < 1024) {
        v1::CloudMessage message = reader.Read();
        REQUIRE_FALSE(message.has_error());
        if (message.has_result()) got += message.result().states().num_positions();
      }
      v1::AgentMessage close;
      close.mutable_close()->set_session_id(session);
      REQUIRE(reader.Send(close));
    }
  }
  // Once that stream has gone (and the cloud has given back what it freed).
  REQUIRE(testing::WaitUntil(
      [&] {
        return cloud.Metric("tophat_num_sessions_running") == 0 &&
               cloud.Metric("tophat_streams_connected") == 0;
      },
      10s));
  int64_t before = std::numeric_limits<int64_t>::max();
  for (int sample = 0; sample < 5; ++sample) {
    before = std::min(before, ProcessStatusBytes(pid, "VmRSS"));
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(before > 0);
  // The peak from here on (VmHWM, reset by writing 5 to clear_refs).
  std::ofstream(std::string("/proc/") + std::to_string(pid) + "/clear_refs") << "5";

  RawStream greedy(cloud.address(), "device-2", 64 << 10);
  const uint32_t d = greedy.hello().hidden_size();
  std::atomic<int64_t> sent{0};
  std::thread sender([&] {
    for (uint64_t session = 1; session <= 400; ++session) {
      if (!greedy.Send(OpenMessage(session, 1024))) return;
      for (uint32_t first = 0; first < 1024; first += kPositions) {
        if (!greedy.Send(ChunkMessage(session, first, kPositions, d, v1::DTYPE_FLOAT32))) return;
        ++sent;
      }
    }
  });
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_streams_congested_total") >= 1; }, 60s));
  // Until the cloud has stopped reading it: no chunk goes out for two seconds (sampled).
  bool stalled = false;
  for (int64_t last = -1, sample = 0; !stalled && sample < 30; ++sample) {
    const int64_t now = sent.load();
    stalled = now == last;
    last = now;
    if (!stalled) std::this_thread::sleep_for(2s);
  }
  REQUIRE(stalled);
  const int64_t during = ProcessStatusBytes(pid, "VmRSS");
  INFO("while held: " << cloud.Metric("tophat_outgoing_queued_bytes") / (1 << 20)
                      << " MiB of results queued, "
                      << cloud.Metric("tophat_num_sessions_running") << " sessions running, "
                      << cloud.Metric("tophat_num_sessions_waiting") << " waiting");
  const int64_t peak = ProcessStatusBytes(pid, "VmHWM");
  const int64_t bounds = (16 << 20) + 2 * (8 << 20);
  // What the bounds do not count: gRPC's HTTP/2 receive windows (grown by its bandwidth
  // probe to some MiB), the messages being parsed and serialised, and the free space that
  // malloc's two arenas keep between payloads of different sizes. Measured: 30-45 MiB of
  // growth on an idle 2-core machine, 55-106 MiB with the other core busy (16 runs); with
  // glibc's default arenas (16 here) it was ~100 MiB idle, and none of it came back.
  const int64_t margin = 96 << 20;
  INFO(sent.load() << " chunks of " << kPositions * d * 4 << " bytes sent; RSS before "
                   << (before >> 20) << " MiB, with the non-reader " << (during >> 20)
                   << " MiB, peak " << (peak >> 20) << " MiB");
  CHECK(peak <= before + bounds + margin);

  // The stream goes: its sessions, its queue, and the memory they held.
  greedy.Cancel();
  sender.join();
  CHECK(testing::WaitUntil(
      [&] {
        return cloud.Metric("tophat_num_sessions_running") == 0 &&
               cloud.Metric("tophat_outgoing_queued_bytes") == 0;
      },
      20s));
  int64_t after = 0;
  CHECK(testing::WaitUntil(
      [&] {
        after = ProcessStatusBytes(pid, "VmRSS");
        return after <= before + before / 10;
      },
      20s));
  INFO("RSS after the stream ended " << (after >> 20) << " MiB");
  CHECK(after <= before + before / 10);
  CHECK(cloud.process().running());
}

// The fault behind "a saturated link lost 11 requests": a stream whose agent reads its results
// more slowly than the cloud computes them was ended as if it read nothing. Now its work waits.
TEST_CASE("A stream that reads its results slowly waits and loses nothing", "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(),
                     {.max_queued_bytes_per_stream = "256KiB", .unread_stream_timeout_s = 5});
  RawStream slow(cloud.address(), "device-2", 64 << 10);
  const uint32_t d = slow.hello().hidden_size();
  // 10 sessions of 1,024 positions: 7.5 MiB of results, far more than HTTP/2's window (64
  // KiB) and the bound (256 KiB) hold. The agent reads nothing until the cloud's queue has
  // passed its bound (so the stream is congested however fast this machine computes), then
  // reads at most one ~48 KiB result every 5 ms: every read is progress, so the stall check
  // (5 s) must never end the stream.
  constexpr int kSessions = 10;
  constexpr uint32_t kPositions = 1024;
  constexpr uint32_t kChunk = 128;
  std::thread sender([&] {
    for (uint64_t session = 1; session <= kSessions; ++session) {
      if (!slow.Send(OpenMessage(session, kPositions))) return;
      for (uint32_t first = 0; first < kPositions; first += kChunk) {
        if (!slow.Send(ChunkMessage(session, first, kChunk, d, v1::DTYPE_FLOAT32))) return;
      }
    }
  });
  const bool congested = testing::WaitUntil(
      [&] { return cloud.Metric("tophat_streams_congested_total") >= 1; }, 60s);
  std::map<uint64_t, uint32_t> computed;  // positions returned per session
  int done = 0;
  while (done < kSessions) {
    v1::CloudMessage message = slow.Read();
    INFO(message.ShortDebugString().substr(0, 300));
    REQUIRE_FALSE(message.has_error());
    if (!message.has_result()) continue;
    uint32_t& got = computed[message.result().session_id()];
    CHECK(message.result().first_position() == got);
    got += message.result().states().num_positions();
    if (got == kPositions) ++done;
    std::this_thread::sleep_for(5ms);
  }
  sender.join();
  CHECK(congested);
  CHECK(cloud.Metric("tophat_streams_not_reading_total") == 0);
  CHECK(cloud.process().running());
}

// [timing]: it bounds answer times in wall-clock seconds, which a sanitizer's slowdown moves.
TEST_CASE("A device above its message rate is slowed to it, and other devices are not",
          "[serving][timing]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_messages_per_second_per_device = 200});
  RawStream greedy(cloud.address(), "device-2");
  RawStream other(cloud.address(), "device-1");
  // How long until the cloud answers an OpenSession sent after everything before it.
  auto answered_after = [](RawStream& stream, uint64_t session) {
    const auto sent = std::chrono::steady_clock::now();
    REQUIRE(stream.Send(OpenMessage(session, 16)));
    while (true) {
      v1::CloudMessage reply = stream.Read();
      if ((reply.has_admitted() && reply.admitted().session_id() == session) ||
          (reply.has_error() && reply.error().session_id() == session)) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
      }
    }
  };
  CHECK(answered_after(other, 1) < 1.0);
  // 800 small messages (measurements; no answers) in a few milliseconds. With bursts of 200
  // and 200 a second, the cloud reads the last of them no sooner than 3 s later.
  v1::AgentMessage report;
  report.mutable_device_state()->set_draft_step_seconds(0.01);
  const auto flood_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 800; ++i) REQUIRE(greedy.Send(report));
  // Another device meanwhile is answered at once.
  CHECK(answered_after(other, 2) < 1.0);
  // The greedy device's next message waits behind its own flood.
  answered_after(greedy, 1);
  const double paced =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  CHECK(paced > 2.5);
  CHECK(cloud.Metric("tophat_stream_reads_paced_total") > 0);
  CHECK(cloud.process().running());
}

// Counts, not wall-clock bounds: a flood past a burst is paced however fast the machine.
TEST_CASE(
    "A reload sets a message rate on devices already connected, where the cloud started "
    "with none",
    "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_messages_per_second_per_device = 0});
  RawStream greedy(cloud.address(), "device-2");
  v1::AgentMessage report;
  report.mutable_device_state()->set_draft_step_seconds(0.01);
  // Until the cloud has answered an open sent after them, all of `count` reports were read.
  const auto flood = [&](int count, uint64_t then_open) {
    for (int i = 0; i < count; ++i) REQUIRE(greedy.Send(report));
    REQUIRE(greedy.Send(OpenMessage(then_open, 16)));
    while (true) {
      const v1::CloudMessage reply = greedy.Read();
      if (reply.has_admitted() && reply.admitted().session_id() == then_open) return;
      REQUIRE_FALSE(reply.has_error());
    }
  };
  flood(300, 1);
  CHECK(cloud.Metric("tophat_stream_reads_paced_total") == 0);

  ReplaceInConfig(cloud.config(), "max_messages_per_second_per_device: 0\n",
                  "max_messages_per_second_per_device: 100\n");
  cloud.process().Signal(SIGHUP);
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_config_reloads_total", "result=\"applied\"") == 1; }, 20s));
  const std::string log = cloud.process().Log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("100 message(s) and 20 refusal(s) a second (0: no limit)"));
  CHECK(cloud.Metric("tophat_config_keys_awaiting_restart") == 0);
  // The same stream: past a burst of 100, its reads are paced.
  flood(300, 2);
  CHECK(cloud.Metric("tophat_stream_reads_paced_total") > 0);
  CHECK(cloud.process().running());
}

// Counts and order, not wall-clock bounds: the cloud's clock paces the refusals, and a slower
// machine only sends fewer of them.
TEST_CASE("A device refused again and again is told at its refusal rate, without holding back "
          "its admitted session",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_sessions_per_device = 1,
                                  .max_refusals_per_second_per_device = 10});
  RawStream greedy(cloud.address(), "device-2");
  const uint32_t d = greedy.hello().hidden_size();
  REQUIRE(greedy.Send(OpenMessage(1, 64)));  // its one session: admitted
  // 60 more opens, each past its quota, and a chunk of each right behind it (as an agent
  // sends a prompt's first chunk without waiting for the admission).
  constexpr int kRefused = 60;
  for (uint64_t id = 100; id < 100 + kRefused; ++id) {
    REQUIRE(greedy.Send(OpenMessage(id, 64)));
    REQUIRE(greedy.Send(ChunkMessage(id, 0, 4, d, v1::DTYPE_FLOAT32)));
  }
  // Then a chunk of the admitted session: its result is not held behind the refusals.
  REQUIRE(greedy.Send(ChunkMessage(1, 0, 4, d, v1::DTYPE_FLOAT32)));
  const auto start = std::chrono::steady_clock::now();
  int refusals_before_result = -1;
  int refusals = 0;
  std::set<uint64_t> refused;
  while (refusals < kRefused || refusals_before_result < 0) {
    v1::CloudMessage reply = greedy.Read();
    if (reply.has_result() && reply.result().session_id() == 1) {
      refusals_before_result = refusals;
    } else if (reply.has_error() && reply.error().session_id() >= 100) {
      const uint64_t id = reply.error().session_id();
      INFO("session " << id << ": " << reply.error().message());
      // A session's refusal comes before anything else about it (its chunk's NOT_FOUND).
      if (refused.insert(id).second) {
        CHECK(reply.error().code() == static_cast<int>(absl::StatusCode::kResourceExhausted));
        ++refusals;
      } else {
        CHECK(reply.error().code() == static_cast<int>(absl::StatusCode::kNotFound));
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(refusals_before_result << " refusals before the admitted session's result; all "
       << kRefused << " in " << seconds << " s");
  // 10 a second with bursts of 10: the 60th no sooner than 5 s after the first.
  CHECK(seconds > 4.5);
  // The admitted session's chunk was computed and answered while most refusals were held.
  CHECK(refusals_before_result < kRefused / 2);
  // All but the burst's 10, and the few tokens the bucket refills while the cloud reads and
  // refuses that burst (one per tenth of a second: one on a release cloud; 2 were seen under
  // ThreadSanitizer, whose cloud is several times slower), waited for the pacer.
  CHECK(cloud.Metric("tophat_session_refusals_paced_total") >= kRefused - 15);
  CHECK(cloud.process().running());
}

TEST_CASE("A device cannot reach another device's sessions by naming their ids", "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  RawStream owner(cloud.address(), "device-1");
  RawStream intruder(cloud.address(), "device-2");
  const uint32_t d = owner.hello().hidden_size();
  REQUIRE(owner.Send(OpenMessage(7, 64)));
  REQUIRE(owner.Send(ChunkMessage(7, 0, 4, d, v1::DTYPE_FLOAT32)));
  v1::CloudMessage first = owner.ReadFor(7);
  REQUIRE(first.has_result());
  // The intruder names session 7 in every message that takes a session id.
  v1::AgentMessage truncate;
  truncate.mutable_truncate()->set_session_id(7);
  truncate.mutable_truncate()->set_length(0);
  v1::AgentMessage cancel;
  cancel.mutable_cancel()->set_session_id(7);
  v1::AgentMessage close;
  close.mutable_close()->set_session_id(7);
  for (const v1::AgentMessage& message :
       {truncate, cancel, close, ChunkMessage(7, 4, 4, d, v1::DTYPE_FLOAT32)}) {
    REQUIRE(intruder.Send(message));
  }
  // Its own stream has no session 7: what comes back (if anything) is NOT_FOUND for it.
  REQUIRE(intruder.Send(ChunkMessage(7, 0, 4, d, v1::DTYPE_FLOAT32)));
  v1::CloudMessage refused = intruder.ReadFor(7);
  REQUIRE(refused.has_error());
  CHECK(refused.error().code() == static_cast<int>(absl::StatusCode::kNotFound));
  // The owner's session is untouched: its KV still holds 4 positions, so the next chunk
  // continues at position 4.
  REQUIRE(owner.Send(ChunkMessage(7, 4, 4, d, v1::DTYPE_FLOAT32)));
  v1::CloudMessage next = owner.ReadFor(7);
  INFO(next.DebugString());
  REQUIRE(next.has_result());
  CHECK(next.result().states().num_positions() == 4);
}

TEST_CASE("The app port listens on a Unix socket for its user only, and refuses other hosts "
          "unless told",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  const TlsFiles tls = DeviceTls("device-1");
  const fs::path config = dir.path() / "agent.yaml";
  std::ofstream(config) << "cloud_tls:\n  certificate_file: " << tls.certificate_file
                        << "\n  private_key_file: " << tls.private_key_file
                        << "\n  ca_file: " << tls.ca_file << "\n";
  auto agent_args = [&](const std::string& listen) {
    return std::vector<std::string>{(BinDir() / "tophat-agent").string(), "--bundle",
                                    (Bundles() / "device").string(), "--listen", listen,
                                    "--cloud", cloud.address(), "--metrics", "",
                                    "--config", config.string()};
  };
  SECTION("a unix: socket, mode 0660, served through the SDK") {
    const fs::path socket = dir.path() / "agent.sock";
    ChildProcess agent(agent_args("unix:" + socket.string()), dir.path() / "agent-unix.log");
    REQUIRE(testing::WaitUntil([&] { return fs::exists(socket); }, 60s));
    struct stat info {};
    REQUIRE(stat(socket.c_str(), &info) == 0);
    CHECK((info.st_mode & 0777) == 0660);
    auto client = Client::Connect("unix:" + socket.string());
    REQUIRE(client.ok());
    REQUIRE(testing::WaitUntil(
        [&] {
          auto health = (*client)->Health();
          return health.ok() && health->cloud_connected();
        },
        30s));
    const std::vector<int32_t> prompt = Tokenize(ToyPrompts(17, 1)[0]);
    auto result = (*client)->Generate(IdsRequest(prompt, 8));
    REQUIRE(result.ok());
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == Reference(prompt, 8, true));
  }
  SECTION("an address other hosts can reach, with TLS and app tokens: each app alone with its "
          "requests") {
    const int port = testing::FreePort();
    const fs::path secured = dir.path() / "agent-secured.yaml";
    // The device's own certificate (DNS name device-1) serves the app port too.
    std::ofstream(secured) << ReadFile(config) << "app_tls:\n  certificate_file: "
                           << tls.certificate_file << "\n  private_key_file: "
                           << tls.private_key_file << "\napp_tokens:\n  - \"app-a:"
                           << Sha256Hex("token-a") << "\"\n  - \"app-b:" << Sha256Hex("token-b")
                           << "\"\n";
    ChildProcess agent({(BinDir() / "tophat-agent").string(), "--bundle",
                        (Bundles() / "device").string(), "--listen",
                        "0.0.0.0:" + std::to_string(port), "--cloud", cloud.address(),
                        "--metrics", "", "--config", secured.string()},
                       dir.path() / "agent-secured.log");
    RequireListening(agent, port, 60s);
    const std::string address = "127.0.0.1:" + std::to_string(port);
    auto connect = [&](const std::string& token) {
      return Client::Connect(address, ClientOptions{.timeout_s = 10,
                                                    .token = token,
                                                    .ca_file = tls.ca_file,
                                                    .server_name = "device-1"});
    };
    // Plaintext gets no connection at all.
    CHECK_FALSE(Client::Connect(address, 3.0).ok());
    auto anonymous = connect("");
    auto wrong = connect("token-c");
    auto app_a = connect("token-a");
    auto app_b = connect("token-b");
    REQUIRE((anonymous.ok() && wrong.ok() && app_a.ok() && app_b.ok()));
    // A probe needs no token; everything else does.
    CHECK((*anonymous)->Health().ok());
    CHECK(absl::IsUnauthenticated((*anonymous)->Info().status()));
    CHECK(absl::IsUnauthenticated((*wrong)->Info().status()));
    CHECK(absl::IsUnauthenticated((*wrong)->Cancel("shared-id").status()));
    REQUIRE(testing::WaitUntil(
        [&] {
          auto info = (*app_a)->Info();
          return info.ok() && info->cloud_connected();
        },
        30s));
    // Info names the model, not where the device keeps it.
    CHECK((*app_a)->Info()->model_id() == ToyDir().filename().string());
    // App a runs a long request under an id app b also uses: b can neither see nor end it.
    v1::GenerateRequest request = IdsRequest(Tokenize(ToyPrompts(6, 1)[0]), 900, true);
    request.set_request_id("shared-id");
    auto pending = std::async(std::launch::async, [&] { return (*app_a)->Generate(request); });
    REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_generation_tokens_total") > 0; },
                               30s));
    auto by_b = (*app_b)->Cancel("shared-id");
    REQUIRE(by_b.ok());
    CHECK_FALSE(*by_b);
    v1::GenerateRequest short_b = IdsRequest(Tokenize(ToyPrompts(7, 1)[0]), 2);
    short_b.set_request_id("shared-id");
    auto b_result = (*app_b)->Generate(short_b);
    REQUIRE(b_result.ok());
    CHECK(b_result->ok());
    CHECK(pending.wait_for(0s) == std::future_status::timeout);
    auto by_a = (*app_a)->Cancel("shared-id");
    REQUIRE(by_a.ok());
    CHECK(*by_a);
    absl::StatusOr<GenerateResult> a_result = pending.get();
    REQUIRE(a_result.ok());
    CHECK(a_result->finish_reason == v1::FINISH_REASON_CANCELLED);
    CHECK(agent.running());
  }
  SECTION("an address other hosts can reach is refused, naming the key") {
    ChildProcess agent(agent_args("0.0.0.0:" + std::to_string(testing::FreePort())),
                       dir.path() / "agent-remote.log");
    auto code = agent.Wait(60s);
    REQUIRE(code.has_value());
    CHECK(*code == 1);
    CHECK_THAT(agent.Log(), Catch::Contains("allow_remote_apps"));
  }
}

TEST_CASE("A frozen cloud is noticed by keepalives, and the agent comes back when it thaws",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16, "reconnect:\n  keepalive_s: 1\n  keepalive_timeout_s: 1\n");
  auto connected = [&] {
    auto health = agent.client().Health();
    return health.ok() && health->cloud_connected();
  };
  REQUIRE(connected());
  cloud.process().Signal(SIGSTOP);
  // A ping after 1 s of silence, unanswered for 1 s: about 2 s. Without keepalives Health
  // said connected until the requests' deadlines (600 s).
  const auto frozen = std::chrono::steady_clock::now();
  CHECK(testing::WaitUntil([&] { return !connected(); }, 15s));
  INFO("noticed after " << std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen).count() << " s");
  cloud.process().Signal(SIGCONT);
  CHECK(testing::WaitUntil(connected, 30s));
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(11, 1)[0]);
  auto result = agent.client().Generate(IdsRequest(prompt, 12));
  REQUIRE(result.ok());
  REQUIRE(result->ok());
  CHECK(Tokens(*result) == Reference(prompt, 12, /*stop_at_eos=*/true));
}

TEST_CASE("An agent refuses a cloud split from another checkpoint, naming both, and a bundle "
          "without a fingerprint",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // The device half of another checkpoint of the same shape: the same bundle with another
  // model's fingerprint (what `tophat split` of other weights writes); then with none.
  struct Case {
    std::string name;
    std::string fingerprint;  // replaces the manifest's "sha256:..." value
    std::vector<std::string> log;  // what the agent's log must say
  };
  const std::vector<Case> cases = {
      {"other", "sha256:" + std::string(64, '0'),
       {"the cloud serves another model (fingerprint sha256:",
        "than this device bundle was split from (sha256:0000"}},
      {"none", "", {"carries no model fingerprint"}}};
  for (const Case& c : cases) {
    INFO("device bundle with fingerprint: " << c.name);
    const fs::path other = dir.path() / ("device-" + c.name);
    fs::copy(Bundles() / "device", other, fs::copy_options::recursive);
    std::string manifest = ReadFile(other / "tophat_bundle.json");
    const size_t at = manifest.find("\"sha256:");
    REQUIRE(at != std::string::npos);
    manifest.replace(at + 1, 7 + 64, c.fingerprint);
    std::ofstream(other / "tophat_bundle.json") << manifest;
    const TlsFiles tls = DeviceTls("device-1");
    const int port = testing::FreePort();
    const fs::path config = dir.path() / ("agent-" + c.name + ".yaml");
    std::ofstream(config) << "bundle: " << other.string() << "\ncloud_address: \""
                          << cloud.address() << "\"\nlisten_address: \"127.0.0.1:" << port
                          << "\"\nmetrics_address: \"\"\nreconnect:\n  give_up_after_s: 2\n"
                          << "cloud_tls:\n  certificate_file: " << tls.certificate_file
                          << "\n  private_key_file: " << tls.private_key_file
                          << "\n  ca_file: " << tls.ca_file << "\n";
    ChildProcess agent({(BinDir() / "tophat-agent").string(), "--config", config.string()},
                       dir.path() / ("agent-" + c.name + ".log"));
    RequireListening(agent, port, 60s);
    auto client = Client::Connect("127.0.0.1:" + std::to_string(port));
    REQUIRE(client.ok());
    auto result = (*client)->Generate(IdsRequest(Tokenize(ToyPrompts(5, 1)[0]), 4));
    REQUIRE(result.ok());
    CHECK_FALSE(result->ok());  // refused, not answered with another model's tokens
    INFO(result->error);
    for (const std::string& expected : c.log) {
      CHECK(testing::WaitUntil(
          [&] { return agent.Log().find(expected) != std::string::npos; }, 10s));
    }
  }
}

TEST_CASE("The app port refuses an oversized prompt before tokenizing it, and its request ids "
          "cannot be guessed",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16, "max_prompt_bytes: 64KiB\n");
  v1::GenerateRequest huge;
  huge.set_prompt(std::string(3 << 20, 'a'));  // 3 MiB (gRPC's limit is 4): seconds to tokenize
  huge.set_max_new_tokens(4);
  const auto start = std::chrono::steady_clock::now();
  auto refused = agent.client().Generate(huge);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(refused.ok());
  CHECK_FALSE(refused->ok());
  CHECK_THAT(refused->error, Catch::Contains("3145728 bytes is more than max_prompt_bytes (65536)"));
  CHECK(seconds < 1.5);
  // Ids the agent makes up are random, not a counter another app could walk.
  std::set<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    auto result = agent.client().Generate(IdsRequest(Tokenize(ToyPrompts(8, 1)[0]), 2));
    REQUIRE(result.ok());
    REQUIRE(result->ok());
    CHECK(result->request_id.size() == 4 + 32);
    CHECK(result->request_id.starts_with("req-"));
    ids.insert(result->request_id);
  }
  CHECK(ids.size() == 2);
  CHECK(ids.count("req-1") + ids.count("req-2") + ids.count("req-3") == 0);
}

TEST_CASE("Killing an agent mid-generation frees its KV on the cloud", "[serving][cuda-cloud][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  REQUIRE(cloud.Metric("tophat_kv_cache_usage_ratio") == 0);
  auto agent = std::make_unique<AgentProcess>(dir.path(), cloud, 1);
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(3, 1)[0]);
  auto pending = std::async(std::launch::async, [&] {
    return agent->client().Generate(IdsRequest(prompt, 900, /*ignore_eos=*/true));
  });
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") > 0; },
                             20s));
  agent->process().Signal(SIGKILL);
  REQUIRE(agent->process().Wait(5s).has_value());
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") == 0; },
                           5s));
  CHECK(cloud.Metric("tophat_num_sessions_running") == 0);
  CHECK_FALSE(pending.get().ok());  // the app saw its agent die
}

TEST_CASE("Cancelling a request through the SDK ends it and frees its cloud KV", "[serving][cuda-cloud][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16);
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(6, 1)[0]);
  v1::GenerateRequest request = IdsRequest(prompt, 900, /*ignore_eos=*/true);
  request.set_request_id("long-1");
  auto pending = std::async(std::launch::async, [&] { return agent.client().Generate(request); });
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") > 0; },
                             20s));
  auto found = agent.client().Cancel("long-1");
  REQUIRE(found.ok());
  CHECK(*found);
  absl::StatusOr<GenerateResult> result = pending.get();
  REQUIRE(result.ok());
  CHECK(result->finish_reason == v1::FINISH_REASON_CANCELLED);
  CHECK(result->token_ids.size() < 900);
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") == 0; },
                           5s));
  auto unknown = agent.client().Cancel("no-such-request");
  REQUIRE(unknown.ok());
  CHECK_FALSE(*unknown);
}

// A 200-token greedy request started through `agent`, under way (20 tokens generated on
// `cloud`) when the constructor returns: the workload of the fault tests, which break the
// cloud under it at once and then check that it finished, after a reconnect, with the right
// tokens. The 180 tokens left (~2 s on an idle 2-core machine) outlast the break, which
// follows the 10 ms metrics poll within milliseconds.
class LongGeneration {
 public:
  LongGeneration(AgentProcess& agent, const CloudProcess& cloud)
      : prompt_(Tokenize(ToyPrompts(9, 1)[0])) {
    pending_ = std::async(std::launch::async, [this, &agent] {
      return agent.client().Generate(IdsRequest(prompt_, kMaxNewTokens, /*ignore_eos=*/true));
    });
    REQUIRE(testing::WaitUntil(
        [&] { return cloud.Metric("tophat_generation_tokens_total") >= 20; }, 30s));
  }

  // `reconnected`: the generation lost its stream on the way (and replayed).
  void CheckSurvived(bool reconnected = true) {
    absl::StatusOr<GenerateResult> result = pending_.get();
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    if (reconnected) CHECK(result->stats.reconnects() >= 1);
    CHECK(Tokens(*result) == Reference(prompt_, kMaxNewTokens, /*stop_at_eos=*/false));
  }

 private:
  static constexpr int64_t kMaxNewTokens = 200;
  std::vector<int32_t> prompt_;
  std::future<absl::StatusOr<GenerateResult>> pending_;
};

// Several clouds behind each agent (cloud_addresses): new requests go to the cloud with the
// shortest queue by the load the clouds report, and a cloud killed mid-generation loses no
// request: each moves to another cloud, replays its positions, and ends with the tokens a
// single cloud gives.
TEST_CASE("Three clouds share six agents' requests, and a killed cloud's requests finish on "
          "the others with the same tokens",
          "[serving][clouds]") {
  testing::TempDir dir;
  std::vector<std::unique_ptr<CloudProcess>> clouds;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    // A long grace period: the drain case holds a cloud in its drain with a session of its own.
    clouds.push_back(
        std::make_unique<CloudProcess>(dir.path(), CloudSettings{.drain_grace_period_s = 60}));
    addresses.push_back(clouds.back()->address());
  }
  std::vector<std::unique_ptr<AgentProcess>> agents;
  for (int i = 0; i < 6; ++i) {
    agents.push_back(std::make_unique<AgentProcess>(dir.path(), absl::StrJoin(addresses, ","), 16));
  }
  // Each agent's stream to every cloud is up before the load starts.
  for (auto& cloud : clouds) {
    REQUIRE(testing::WaitUntil([&] { return cloud->Metric("tophat_streams_connected") == 6; },
                               30s));
  }
  const std::vector<std::string> sentences = ToyPrompts(41, 12);
  const auto admitted = [&](size_t i) {
    return clouds[i]->Metric("tophat_sessions_admitted_total");
  };

  SECTION("a steady load is spread over the clouds") {
    // Every agent runs requests back to back, two at a time: 96 in all. (Were they placed
    // at random, a cloud would pass 1.5x the mean in about one run in 5,000.)
    std::vector<std::future<bool>> runs;
    for (auto& agent : agents) {
      for (int lane = 0; lane < 2; ++lane) {
        runs.push_back(std::async(std::launch::async, [&, lane] {
          for (int k = 0; k < 8; ++k) {
            auto result = agent->client().Generate(
                IdsRequest(Tokenize(sentences[(lane * 8 + k) % sentences.size()]), 12));
            if (!result.ok() || !result->ok()) return false;
          }
          return true;
        }));
      }
    }
    for (auto& run : runs) CHECK(run.get());
    double total = 0;
    std::vector<double> per_cloud;
    for (size_t i = 0; i < clouds.size(); ++i) {
      per_cloud.push_back(admitted(i));
      total += per_cloud.back();
    }
    INFO("sessions per cloud: " << absl::StrJoin(per_cloud, ", "));
    CHECK(total == 96);
    // Each agent counts what it placed where; over the agents, what each cloud admitted.
    for (size_t i = 0; i < clouds.size(); ++i) {
      double placed = 0;
      for (auto& agent : agents) {
        placed += agent->Metric("tophat_cloud_requests_placed_total",
                                "cloud=\"" + addresses[i] + "\"");
      }
      CHECK(placed == per_cloud[i]);
    }
    for (double sessions : per_cloud) CHECK(sessions <= 1.5 * total / 3);
  }

  SECTION("a cloud killed mid-generation loses no request") {
    // Long requests from every agent, spread over the three clouds.
    constexpr int64_t kMaxNewTokens = 150;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::future<absl::StatusOr<GenerateResult>>> pending;
    // Each thread gets its request by value: `prompts` grows (and moves its elements) while
    // the first threads run, so a thread reading prompts[i] would race with that move.
    for (size_t i = 0; i < agents.size(); ++i) {
      prompts.push_back(Tokenize(sentences[i]));
      pending.push_back(std::async(
          std::launch::async,
          [&client = agents[i]->client(), request = IdsRequest(prompts[i], kMaxNewTokens, true)] {
            return client.Generate(request);
          }));
    }
    // Once a cloud holds some of them mid-generation, it is killed. Which one is up to the
    // placement: six requests over three clouds can leave any one of them without a request.
    size_t victim = 0;
    REQUIRE(testing::WaitUntil(
        [&] {
          for (size_t i = 0; i < clouds.size(); ++i) {
            if (clouds[i]->Metric("tophat_generation_tokens_total") >= 20 &&
                clouds[i]->Metric("tophat_num_sessions_running") >= 1) {
              victim = i;
              return true;
            }
          }
          return false;
        },
        60s));
    const size_t survivor = (victim + 1) % clouds.size();
    const double lost = clouds[victim]->Metric("tophat_num_sessions_running") +
                        clouds[victim]->Metric("tophat_num_sessions_waiting");
    clouds[victim]->process().Signal(SIGKILL);
    int64_t moved = 0;
    for (size_t i = 0; i < pending.size(); ++i) {
      auto result = pending[i].get();
      REQUIRE(result.ok());
      INFO("request " << i << ": " << result->error);
      REQUIRE(result->ok());
      moved += result->stats.reconnects() > 0 ? 1 : 0;
      CHECK(Tokens(*result) == Reference(prompts[i], kMaxNewTokens, /*stop_at_eos=*/false));
    }
    INFO(lost << " session(s) were running on the killed cloud");
    CHECK(moved >= 1);
    CHECK(moved == static_cast<int64_t>(lost));
    // The agents' per-cloud metrics say the same: the requests that left the killed cloud,
    // and that its stream is down.
    const std::string killed = "cloud=\"" + addresses[victim] + "\"";
    double failovers = 0;
    for (auto& agent : agents) {
      failovers += agent->Metric("tophat_cloud_failovers_total", killed);
      CHECK(testing::WaitUntil(
          [&] { return agent->Metric("tophat_cloud_target_up", killed) == 0; }, 30s));
      CHECK(agent->Metric("tophat_cloud_target_up", "cloud=\"" + addresses[survivor] + "\"") ==
            1);
    }
    CHECK(failovers == moved);
    // New requests go to the clouds left.
    auto after = agents[0]->client().Generate(IdsRequest(prompts[0], 8));
    REQUIRE(after.ok());
    CHECK(after->ok());
  }

  SECTION("a draining cloud gets no new session, and once restarted it takes them again") {
    const auto run_requests = [&] {
      std::vector<std::future<bool>> runs;
      for (auto& agent : agents) {
        runs.push_back(std::async(std::launch::async, [&] {
          for (int k = 0; k < 4; ++k) {
            auto result = agent->client().Generate(IdsRequest(Tokenize(sentences[k]), 8));
            if (!result.ok() || !result->ok()) {
              // Catch's INFO is not for other threads; the reason goes to the log.
              std::fprintf(stderr, "request failed: %s\n",
                           (result.ok() ? result->error : result.status().ToString()).c_str());
              return false;
            }
          }
          return true;
        }));
      }
      bool all = true;
      for (auto& run : runs) all = run.get() && all;
      return all;
    };
    // A session of the test's own keeps cloud 1 in its drain until the test closes it.
    RawStream holder(clouds[1]->address());
    REQUIRE(holder.Send(OpenMessage(1, 16)));
    REQUIRE(holder.Read().has_admitted());
    clouds[1]->process().Signal(SIGTERM);
    WaitUntilDraining(holder, 100);
    // The agents learn of the drain from the cloud's load report, and from then on place
    // nothing there: not refused and moved, never sent (a request placed there before the
    // report would be refused and move on).
    const std::string draining = "cloud=\"" + addresses[1] + "\"";
    double placed_before = 0;
    for (auto& agent : agents) {
      REQUIRE(testing::WaitUntil(
          [&] { return agent->Metric("tophat_cloud_target_draining", draining) == 1; }, 10s));
      placed_before += agent->Metric("tophat_cloud_requests_placed_total", draining);
    }
    const double admitted_while_draining = admitted(1);
    CHECK(run_requests());
    CHECK(admitted(1) == admitted_while_draining);
    double placed_after = 0;
    for (auto& agent : agents) {
      placed_after += agent->Metric("tophat_cloud_requests_placed_total", draining);
    }
    CHECK(placed_after == placed_before);
    // Its last session closed, the cloud exits; restarted, it is used again.
    v1::AgentMessage close;
    close.mutable_close()->set_session_id(1);
    REQUIRE(holder.Send(close));
    REQUIRE(clouds[1]->process().Wait(30s).has_value());
    clouds[1]->Start(dir.path());
    REQUIRE(testing::WaitUntil(
        [&] { return clouds[1]->Metric("tophat_streams_connected") == 6; }, 60s));
    for (auto& agent : agents) {
      CHECK(testing::WaitUntil(
          [&] { return agent->Metric("tophat_cloud_target_draining", draining) == 0; }, 10s));
    }
    CHECK(run_requests());
    CHECK(admitted(1) > 0);
  }
}

TEST_CASE("A cloud whose device is lost (a failover drill) fails its sessions, exits 1 without "
          "a grace period, and its request finishes on the other cloud with the same tokens",
          "[serving][clouds][staged]") {
  testing::TempDir dir;
  // The drill's cloud serves 5 steps; a request there takes about 18 (its prompt, then one
  // step a token), so the request placed there first is mid-generation when the device is
  // "lost". A long grace period, which a lost device must not wait for.
  constexpr int kDrillSteps = 5;
  CloudProcess lost(dir.path(),
                    CloudSettings{.drain_grace_period_s = 600,
                                  .extra_args = {"--drill-device-loss-after-steps",
                                                 std::to_string(kDrillSteps)}});
  CloudProcess other(dir.path(), CloudSettings{});
  AgentProcess agent(dir.path(), lost.address() + "," + other.address(), 16);
  for (CloudProcess* cloud : {&lost, &other}) {
    REQUIRE(testing::WaitUntil([&] { return cloud->Metric("tophat_streams_connected") == 1; },
                               30s));
  }
  // Requests one after another until one is placed on the drill's cloud (each is placed on
  // either idle cloud at random: 40 all elsewhere would happen once in 2^40).
  const std::vector<std::string> sentences = ToyPrompts(43, 40);
  constexpr int64_t kMaxNewTokens = 16;
  int moved = 0;
  for (size_t i = 0; i < sentences.size() && moved == 0; ++i) {
    const std::vector<int32_t> prompt = Tokenize(sentences[i]);
    auto result = agent.client().Generate(IdsRequest(prompt, kMaxNewTokens, true));
    REQUIRE(result.ok());
    INFO("request " << i << ": " << result->error);
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == Reference(prompt, kMaxNewTokens, /*stop_at_eos=*/false));
    moved += result->stats.reconnects() > 0 ? 1 : 0;
  }
  REQUIRE(moved == 1);
  // The cloud exits 1 at once: no grace period (600 s here), and no free on the device.
  const auto code = lost.process().Wait(30s);
  INFO("the drill's cloud's log:\n" << lost.process().Log());
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  const std::string log = lost.process().Log();
  CHECK_THAT(log, Catch::Contains("is lost: a failover drill"));
  CHECK_THAT(log, Catch::Contains("grace period 0s"));
  CHECK_THAT(log, Catch::Contains("exiting without releasing it"));
  // A pipeline's later stages find stage 0 gone and end too.
  for (int stage = 1; stage < lost.stages(); ++stage) {
    INFO("stage " << stage << "'s log:\n" << lost.stage(stage).Log());
    CHECK(lost.stage(stage).Wait(30s).has_value());
  }
  const std::string labels = "cloud=\"" + lost.address() + "\"";
  CHECK(agent.Metric("tophat_cloud_failovers_total", labels) == 1);
  REQUIRE(testing::WaitUntil([&] { return agent.Metric("tophat_cloud_target_up", labels) == 0; },
                             30s));
  // What comes next goes to the cloud left.
  const std::vector<int32_t> prompt = Tokenize(sentences[0]);
  auto after = agent.client().Generate(IdsRequest(prompt, 8));
  REQUIRE(after.ok());
  CHECK(after->ok());
  CHECK(after->stats.reconnects() == 0);
}

TEST_CASE("An agent whose device is lost (a failover drill) fails that request and every later "
          "one with UNAVAILABLE and exits 1, and the cloud frees its stream",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), CloudSettings{});
  AgentProcess agent(dir.path(), cloud.address(), 16, "", 0, "", {}, {},
                     {"--drill-device-loss-after-requests", "2"});
  const std::vector<std::string> sentences = ToyPrompts(47, 3);
  for (int i = 0; i < 2; ++i) {
    const std::vector<int32_t> prompt = Tokenize(sentences[i]);
    auto result = agent.client().Generate(IdsRequest(prompt, 8, true));
    REQUIRE(result.ok());
    INFO("request " << i << ": " << result->error);
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == Reference(prompt, 8, /*stop_at_eos=*/false));
  }
  auto lost = agent.client().Generate(IdsRequest(Tokenize(sentences[2]), 8, true));
  REQUIRE(lost.ok());
  CHECK_FALSE(lost->ok());
  CHECK_THAT(lost->error, Catch::Contains("UNAVAILABLE: the agent's device (cpu) is lost: a "
                                          "failover drill"));
  const auto code = agent.process().Wait(30s);
  INFO("the agent's log:\n" << agent.process().Log());
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK_THAT(agent.process().Log(), Catch::Contains("exiting without releasing it"));
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_streams_connected") == 0; }, 30s));
}

TEST_CASE("Of several clouds one serving another model is refused by name, and the others "
          "serve",
          "[serving][clouds]") {
  testing::TempDir dir;
  // The cloud half of another checkpoint of the same shape: the same bundle with another
  // model's fingerprint (what `tophat split` of other weights writes).
  const fs::path other = dir.path() / "cloud-other";
  fs::copy(Bundles() / "cloud", other, fs::copy_options::recursive);
  std::string manifest = ReadFile(other / "tophat_bundle.json");
  const size_t at = manifest.find("\"sha256:");
  REQUIRE(at != std::string::npos);
  manifest.replace(at + 1, 7 + 64, "sha256:" + std::string(64, '0'));
  std::ofstream(other / "tophat_bundle.json") << manifest;
  CloudProcess good(dir.path(), {});
  CloudProcess wrong(dir.path(), {.bundle = other.string()});
  AgentProcess agent(dir.path(), good.address() + "," + wrong.address(), 16);
  const std::string wrong_label = "cloud=\"" + wrong.address() + "\"";
  // Named in the agent's log, its stream never up, and no request placed there.
  CHECK(testing::WaitUntil(
      [&] {
        return agent.process().Log().find("the cloud at " + wrong.address() +
                                          ": the cloud serves another model") !=
               std::string::npos;
      },
      30s));
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(5, 1)[0]);
  for (int i = 0; i < 6; ++i) {
    auto result = agent.client().Generate(IdsRequest(prompt, 8));
    REQUIRE(result.ok());
    INFO(result->error);
    CHECK(result->ok());
    CHECK(Tokens(*result) == Reference(prompt, 8, /*stop_at_eos=*/true));
  }
  CHECK(agent.Metric("tophat_cloud_target_up", wrong_label) == 0);
  CHECK(agent.Metric("tophat_cloud_requests_placed_total", wrong_label) == 0);
  CHECK(wrong.Metric("tophat_sessions_admitted_total") == 0);
  CHECK(good.Metric("tophat_sessions_admitted_total") == 6);
}

// One DNS name for several clouds, as a Kubernetes headless Service's. The agent runs in a
// mount namespace of its own (unshare, util-linux) whose /etc/hosts gives the name two
// loopback addresses; the test rewrites that file as a cluster's DNS would change.
TEST_CASE("One DNS name for two clouds: the agent keeps a stream to each of its addresses, and "
          "finds a cloud that comes back on a new one",
          "[serving][clouds]") {
  testing::TempDir dir;
  const int port = testing::FreePort();
  std::stringstream system_hosts;
  system_hosts << std::ifstream("/etc/hosts").rdbuf();
  const fs::path hosts = dir.path() / "hosts";
  // Rewritten in place: the bind mount shows the file's new text, not a new file.
  const auto name_resolves_to = [&](const std::vector<std::string>& ips) {
    std::ofstream out(hosts, std::ios::trunc);
    out << system_hosts.str() << "\n";
    for (const std::string& ip : ips) out << ip << " " << kCloudsDnsName << "\n";
  };
  name_resolves_to({"127.0.0.1", "127.0.0.2"});
  // Two clouds on one port, as a headless Service's pods are.
  std::vector<std::unique_ptr<CloudProcess>> clouds;
  for (const char* host : {"127.0.0.1", "127.0.0.2"}) {
    clouds.push_back(std::make_unique<CloudProcess>(
        dir.path(), CloudSettings{.listen_host = host}, port));
  }
  const std::string target = absl::StrCat("dns:///", kCloudsDnsName, ":", port);
  AgentProcess agent(dir.path(), target, 16, "", 0, "",
                     {"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "/bin/sh", "-c",
                      "mount --bind \"$0\" /etc/hosts && exec \"$@\"", hosts.string()});
  const auto slot_up = [&](int slot) {
    return agent.Metric("tophat_cloud_target_up",
                        absl::StrCat("cloud=\"", target, "#", slot, "\"")) == 1;
  };
  // One stream to each address: each cloud has the agent's stream.
  REQUIRE(testing::WaitUntil([&] { return slot_up(0) && slot_up(1); }, 30s));
  for (auto& cloud : clouds) {
    REQUIRE(testing::WaitUntil([&] { return cloud->Metric("tophat_streams_connected") == 1; },
                               30s));
  }
  const std::vector<std::string> sentences = ToyPrompts(43, 8);
  // Requests two at a time, so that both clouds' queues are seen busy, until each cloud
  // admitted some; each answer is the monolithic model's greedy output.
  const auto serve_until_each_admits = [&](const std::vector<CloudProcess*>& targets) {
    return testing::WaitUntil(
        [&] {
          std::vector<std::future<bool>> runs;
          for (int lane = 0; lane < 2; ++lane) {
            runs.push_back(std::async(std::launch::async, [&, lane] {
              const std::vector<int32_t> prompt = Tokenize(sentences[lane]);
              auto result = agent.client().Generate(IdsRequest(prompt, 8));
              return result.ok() && result->ok() &&
                     Tokens(*result) == Reference(prompt, 8, /*stop_at_eos=*/false);
            }));
          }
          bool all_right = true;
          for (auto& run : runs) all_right = run.get() && all_right;
          REQUIRE(all_right);
          for (CloudProcess* cloud : targets) {
            if (cloud->Metric("tophat_sessions_admitted_total") < 1) return false;
          }
          return true;
        },
        60s);
  };
  CHECK(serve_until_each_admits({clouds[0].get(), clouds[1].get()}));

  // The cloud at 127.0.0.2 dies, and comes back at 127.0.0.3: the name now says so.
  clouds[1]->process().Signal(SIGKILL);
  clouds[1]->process().Wait(10s);
  name_resolves_to({"127.0.0.1", "127.0.0.3"});
  CloudProcess moved(dir.path(), CloudSettings{.listen_host = "127.0.0.3"}, port);
  // The slot that lost its cloud resolves the name again and dials the new address.
  REQUIRE(testing::WaitUntil([&] { return moved.Metric("tophat_streams_connected") == 1; }, 30s));
  CHECK(testing::WaitUntil([&] { return slot_up(0) && slot_up(1); }, 30s));
  CHECK(serve_until_each_admits({&moved}));
  CHECK(clouds[0]->Metric("tophat_streams_connected") == 1);
  // Its log says where it went.
  CHECK_THAT(agent.process().Log(), Catch::Contains("dialling 127.0.0.3:" + std::to_string(port)));
}

TEST_CASE("A request whose app goes away while it waits for a cloud is cancelled at once, "
          "and the agent stops promptly",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // Without a cloud the agent would wait 120 s for one before failing the request.
  AgentProcess agent(dir.path(), cloud, 16, "reconnect:\n  give_up_after_s: 120\n");
  cloud.process().Signal(SIGKILL);
  REQUIRE(cloud.process().Wait(5s).has_value());
  REQUIRE(agent.WaitForCloud(false, 30s));
  const std::string cancelled = "finished_reason=\"cancelled\"";
  const double cancelled_before = agent.Metric("tophat_request_success_total", cancelled);
  // The app gives up after 1 s (its deadline), while the request waits for a cloud.
  auto channel = grpc::CreateChannel(agent.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::AgentService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 1s);
  const v1::GenerateRequest request = IdsRequest(Tokenize(ToyPrompts(3, 1)[0]), 8);
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  CHECK(reader->Finish().error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  // Cancelled within the wait's 100 ms slices (plus the metric's way out), not at the
  // give-up 120 s later.
  CHECK(testing::WaitUntil(
      [&] {
        return agent.Metric("tophat_request_success_total", cancelled) == cancelled_before + 1;
      },
      20s));
  CHECK(agent.Metric("tophat_num_requests_running") == 0);
  // Nothing holds the agent up now: SIGTERM ends it well before any give-up.
  agent.process().Signal(SIGTERM);
  const auto code = agent.process().Wait(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("A cloud restart mid-generation is survived with the right tokens", "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16);
  LongGeneration generation(agent, cloud);
  cloud.process().Signal(SIGKILL);
  REQUIRE(cloud.process().Wait(5s).has_value());
  cloud.Start(dir.path());  // same port, fresh process, empty KV
  generation.CheckSurvived();
}

TEST_CASE(
    "A reloaded cloud config rotates a device's token and revokes a device while streams "
    "run, and a config that does not load changes nothing",
    "[serving]") {
  testing::TempDir dir;
  const auto token_entry = [](const std::string& device, const std::string& token) {
    return "\"" + device + ":" + Sha256Hex(token) + "\"";
  };
  CloudSettings settings;
  settings.device_tokens = {token_entry("device-1", "secret-1"),
                            token_entry("device-2", "secret-2")};
  CloudProcess cloud(dir.path(), settings);
  const fs::path token_file = dir.path() / "device-1.token";
  std::ofstream(token_file) << "secret-1\n";
  AgentProcess agent(dir.path(), cloud, 16, "", 0, token_file.string());
  // device-2's stream, which none of the reloads below may touch.
  RawStream device_2(cloud.address(), "device-2", 0, "secret-2");
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_streams_connected") == 2; }, 10s));
  const auto reload = [&](int nth) {
    cloud.process().Signal(SIGHUP);
    // Applied or failed, the reload is counted once it is done.
    REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_config_reloads_total") == nth; },
                               20s));
  };

  // 1. Rotation mid-generation: the new token goes to the device first, then its digest
  // replaces the old one on the cloud. The reload ends the stream of the old token; the agent
  // reconnects, reading its token file again, and the request finishes with the right tokens.
  {
    LongGeneration generation(agent, cloud);
    std::ofstream(dir.path() / "device-1.token.new") << "secret-1b\n";
    fs::rename(dir.path() / "device-1.token.new", token_file);
    RewriteAccess(cloud.config(),
                  {token_entry("device-1", "secret-1b"), token_entry("device-2", "secret-2")});
    reload(1);
    generation.CheckSurvived();
  }
  std::string log = cloud.process().Log();
  INFO(log);
  CHECK(Occurrences(log, "ended by the reloaded config: the bearer token is not one configured") ==
        1);
  CHECK_THAT(log, Catch::Contains("2 device token(s), 0 revoked device(s), per device at most"));
  CHECK_THAT(log,
             Catch::Contains("log_level info; 1 open stream(s) no longer admitted were ended"));
  CHECK(cloud.Metric("tophat_streams_revoked_total") == 1);
  CHECK(cloud.Metric("tophat_config_reloads_total", "result=\"applied\"") == 1);
  // The old token no longer opens a stream; the new one does.
  CHECK(OpenCloudStream(cloud.address(), DeviceCredentials("device-1"), "secret-1").error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  CHECK(OpenCloudStream(cloud.address(), DeviceCredentials("device-1"), "secret-1b").ok());

  // 2. A config that does not load: nothing changes, and the error names the file and key.
  const std::string good = ReadFile(cloud.config());
  { std::ofstream(cloud.config(), std::ios::app) << "log_level: chatty\n"; }
  reload(2);
  log = cloud.process().Log();
  CHECK_THAT(log, Catch::Contains("not reloaded; tophat-cloud serves on with the config it had"));
  CHECK_THAT(log, Catch::Contains("log_level: expected one of"));
  CHECK(cloud.Metric("tophat_config_reloads_total", "result=\"failed\"") == 1);
  CHECK(OpenCloudStream(cloud.address(), DeviceCredentials("device-1"), "secret-1b").ok());

  // 3. Revocation: device-1's open stream ends at once and it gets no other; device-2 serves
  // on. A key only a restart applies is named as waiting for one.
  // The streams opened above to try the tokens leave the cloud's open streams when their
  // reactors are done ("stream N done"), which may come after this client saw them close
  // (late under ThreadSanitizer): the revocation must find device-1's agent stream alone.
  const auto open_streams = [&] {
    const std::string text = cloud.process().Log();
    return Occurrences(text, " connected from ") - Occurrences(text, " done\n");
  };
  REQUIRE(testing::WaitUntil([&] { return open_streams() == 2; }, 10s));
  std::ofstream(cloud.config()) << good;
  RewriteAccess(cloud.config(),
                {token_entry("device-1", "secret-1b"), token_entry("device-2", "secret-2")},
                {"device-1"});
  ReplaceInConfig(cloud.config(), "max_context: 1024", "max_context: 512");
  reload(3);
  log = cloud.process().Log();
  CHECK(Occurrences(log,
                    "ended by the reloaded config: device device-1 is revoked "
                    "(tls.revoked_devices)") == 1);
  CHECK_THAT(log, Catch::Contains("take effect only at a restart: max_context"));
  CHECK(cloud.Metric("tophat_config_keys_awaiting_restart") == 1);
  CHECK(cloud.Metric("tophat_streams_revoked_total") == 2);
  const grpc::Status revoked =
      OpenCloudStream(cloud.address(), DeviceCredentials("device-1"), "secret-1b");
  CHECK(revoked.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(revoked.error_message(), Catch::Contains("device device-1 is revoked"));
  REQUIRE(agent.WaitForCloud(false, 10s));
  // The ended stream leaves the gauge when the engine thread handles its detach, which may
  // come after the agent has seen the end: waited for, not read at once.
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_streams_connected") == 1; }, 10s));
  // device-2's stream was open through every reload and still serves.
  RequireServes(device_2, 1);
  CHECK(cloud.process().running());
}

TEST_CASE(
    "A reloaded CRL ends the stream of a device whose certificate it revokes, which opens no "
    "other, and another CA's CRL is refused",
    "[serving]") {
  testing::TempDir dir;
  const fs::path certs = CertsWithCrl(dir.path());  // which revokes device-1 here only
  CloudSettings settings;
  settings.crl_file = (certs / "crl.pem").string();
  CloudProcess cloud(dir.path(), settings);
  AgentProcess agent(dir.path(), cloud, 16);  // device-1
  RawStream device_2(cloud.address(), "device-2");
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_streams_connected") == 2; }, 10s));
  CHECK(cloud.Metric("tophat_crl_revoked_certificates") == 0);
  // make-certs.sh's CRLs are due for renewal in 30 days.
  const double in_30_days = static_cast<double>(absl::ToUnixSeconds(absl::Now()) + 30 * 86400);
  CHECK(std::abs(cloud.Metric("tophat_crl_next_update_timestamp_seconds") - in_30_days) < 600);
  {
    auto generated = agent.client().Generate(IdsRequest(Tokenize(ToyPrompts(3, 1)[0]), 8));
    REQUIRE(generated.ok());
  }
  const auto reload = [&](int nth) {
    cloud.process().Signal(SIGHUP);
    REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_config_reloads_total") == nth; },
                               20s));
  };

  // 1. device-1's certificate revoked: the reload reads the renewed CRL (the config is
  // unchanged) and ends device-1's open stream; device-1 opens no other.
  MakeCerts("--revoke " + certs.string() + " device-1");
  reload(1);
  std::string log = cloud.process().Log();
  INFO(log);
  CHECK(Occurrences(log,
                    "ended by the reloaded config: the certificate of device device-1 "
                    "(serial ") == 1);
  CHECK_THAT(log, Catch::Contains("1 certificate(s) revoked by 1 CRL(s)"));
  CHECK(cloud.Metric("tophat_crl_revoked_certificates") == 1);
  CHECK(cloud.Metric("tophat_streams_revoked_total") == 1);
  const grpc::Status revoked = OpenCloudStream(cloud.address(), DeviceCredentials("device-1"));
  CHECK(revoked.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(revoked.error_message(),
             Catch::Contains("issued by CN=tophat CA) is revoked (tls.crl_file)"));
  REQUIRE(agent.WaitForCloud(false, 10s));

  // 2. Another deployment's CRL in its place (its CA also named "tophat CA", by another key):
  // the reload fails and changes nothing.
  const fs::path stranger = dir.path() / "stranger";
  MakeCerts(stranger.string());
  MakeCerts("--crl " + stranger.string());
  fs::copy_file(stranger / "crl.pem", certs / "crl.pem.new");
  fs::rename(certs / "crl.pem.new", certs / "crl.pem");
  reload(2);
  log = cloud.process().Log();
  CHECK_THAT(log, Catch::Contains("names \"CN=tophat CA\" as its issuer but is not signed by "
                                  "that CA's key (tls.client_ca_file: "));
  CHECK(cloud.Metric("tophat_config_reloads_total", "result=\"failed\"") == 1);
  CHECK(cloud.Metric("tophat_crl_revoked_certificates") == 1);
  CHECK(OpenCloudStream(cloud.address(), DeviceCredentials("device-1")).error_code() ==
        grpc::StatusCode::PERMISSION_DENIED);

  // device-2's stream was open through both reloads and still serves (device-1's, ended,
  // leaves the gauge when the engine thread handles its detach: waited for).
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_streams_connected") == 1; }, 10s));
  RequireServes(device_2, 1);
  CHECK(OpenCloudStream(cloud.address(), DeviceCredentials("device-2")).ok());
  CHECK(cloud.process().running());
}

TEST_CASE(
    "An agent with a CRL ends its stream to a cloud whose certificate a reload revokes, "
    "refuses the cloud, and takes it again once a CRL without it is in place",
    "[serving]") {
  testing::TempDir dir;
  const fs::path certs = CertsWithCrl(dir.path());
  fs::copy_file(certs / "crl.pem", dir.path() / "crl-none-revoked.pem");
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud.address(), 16, "reconnect:\n  max_backoff_s: 0.5\n", 0, "",
                     {}, {}, {}, (certs / "crl.pem").string());
  const auto serves = [&](int seed) {
    auto generated = agent.client().Generate(IdsRequest(Tokenize(ToyPrompts(seed, 1)[0]), 8));
    REQUIRE(generated.ok());
    CHECK(generated->ok());
  };
  serves(3);
  // What the CRL revokes and when it is due, on the agent's metrics port.
  CHECK(agent.Metric("tophat_crl_revoked_certificates") == 0);
  const double in_30_days = static_cast<double>(absl::ToUnixSeconds(absl::Now()) + 30 * 86400);
  CHECK(std::abs(agent.Metric("tophat_crl_next_update_timestamp_seconds") - in_30_days) < 600);
  const auto reloads = [&](const std::string& result) {
    return agent.Metric("tophat_config_reloads_total", "result=\"" + result + "\"");
  };
  // A file that is no CRL fails the reload, and the stream stays.
  fs::copy_file(certs / "ca.crt", certs / "crl.pem.new");
  fs::rename(certs / "crl.pem.new", certs / "crl.pem");
  agent.process().Signal(SIGHUP);
  REQUIRE(testing::WaitUntil([&] { return reloads("failed") == 1; }, 20s));
  CHECK_THAT(
      agent.process().Log(),
      Catch::Contains("cloud_tls.crl_file: " + (certs / "crl.pem").string() + " holds no CRL"));
  CHECK(agent.process().Log().find("stream ended") == std::string::npos);
  fs::copy_file(dir.path() / "crl-none-revoked.pem", certs / "crl.pem",
                fs::copy_options::overwrite_existing);
  // The cloud's certificate revoked (by its CA: the copy's) and the agent reloaded: the open
  // stream ends, and the agent refuses the cloud from then on (it reads the CRL again before
  // every connection: the CRL it started with did not list the cloud).
  MakeCerts("--revoke " + certs.string() + " cloud");
  agent.process().Signal(SIGHUP);
  REQUIRE(testing::WaitUntil([&] { return reloads("applied") == 1; }, 20s));
  const auto refused_logged = [&] {
    return agent.process().Log().find("cloud_tls.crl_file) (retrying with backoff)") !=
           std::string::npos;
  };
  REQUIRE(testing::WaitUntil(refused_logged, 20s));
  std::string log = agent.process().Log();
  INFO(log);
  const std::string revoked = "PERMISSION_DENIED: the cloud at " + cloud.address() +
                              " presents a revoked certificate (serial ";
  CHECK_THAT(log, Catch::Contains("stream ended: " + revoked) &&
                      Catch::Contains("1 stream(s) to clouds whose certificates "
                                      "cloud_tls.crl_file revokes were ended") &&
                      Catch::Contains(revoked) &&
                      Catch::Contains("issued by CN=tophat CA; cloud_tls.crl_file) (retrying"));
  auto health = agent.client().Health();
  REQUIRE(health.ok());
  CHECK_FALSE(health->cloud_connected());
  CHECK(agent.Metric("tophat_crl_revoked_certificates") == 1);
  // A CRL that no longer lists it (here: the one from before): the next attempt connects.
  fs::copy_file(dir.path() / "crl-none-revoked.pem", certs / "crl.pem.new");
  fs::rename(certs / "crl.pem.new", certs / "crl.pem");
  REQUIRE(agent.WaitForCloud(true, 20s));
  serves(4);
  CHECK(agent.Metric("tophat_crl_revoked_certificates") == 0);  // read before that connection
}

TEST_CASE("The metrics port's /devices names the devices holding the most KV", "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16);  // device-1
  // device-2: two sessions of 64 positions, 4 blocks each.
  RawStream device_2(cloud.address(), "device-2");
  REQUIRE(device_2.Send(OpenMessage(1, 64)));
  REQUIRE(device_2.Send(OpenMessage(2, 64)));
  const auto devices = [&](const std::string& query) {
    const std::string body = cloud.MetricsPortGet("/devices" + query);
    INFO("/devices" << query << ": " << body);
    REQUIRE_FALSE(body.empty());
    return nlohmann::json::parse(body);
  };
  REQUIRE(testing::WaitUntil([&] { return devices("")["devices"] == 1; }, 10s));
  // device-1's long generation counts its whole context against the pool (200 positions and
  // its prompt: more than device-2's 8 blocks).
  LongGeneration generation(agent, cloud);
  nlohmann::json report = devices("");
  CHECK(report["devices"] == 2);
  CHECK(report["streams"] == 2);
  REQUIRE(report["top"].size() == 2);
  CHECK(report["top"][0]["device"] == "device device-1");
  CHECK(report["top"][0]["sessions"] == 1);
  CHECK(report["top"][0]["kv_blocks"].get<int64_t>() > 8);
  CHECK(report["top"][1]["device"] == "device device-2");
  CHECK(report["top"][1]["sessions"] == 2);
  CHECK(report["top"][1]["kv_blocks"] == 8);
  CHECK(report["top"][1]["streams"] == 1);
  CHECK(report["top"][1]["kv_fraction"].get<double>() ==
        Approx(8.0 / report["kv_blocks_total"].get<double>()));
  CHECK(devices("?limit=1")["top"].size() == 1);
  // A bad limit is refused (400), not served.
  CHECK(cloud.MetricsPortGet("/devices?limit=0").empty());
  CHECK(cloud.MetricsPortGet("/devices?limit=many").empty());
  generation.CheckSurvived(/*reconnected=*/false);
}

// [cli]: runs the `tophat` command line, which the sanitized tree (deploy/sanitize.sh) does not
// build.
TEST_CASE("tophat devices prints who holds the cloud as a table, or its JSON", "[serving][cli]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  RawStream device_2(cloud.address(), "device-2");
  const std::string metrics = "127.0.0.1:" + std::to_string(cloud.metrics_port());
  const auto devices = [&](const std::vector<std::string>& options, const std::string& name) {
    std::vector<std::string> args = {(BinDir() / "tophat").string(), "devices", "--cloud-metrics",
                                     metrics};
    args.insert(args.end(), options.begin(), options.end());
    ChildProcess run(args, dir.path() / (name + ".log"));
    const auto code = run.Wait(30s);
    REQUIRE(code.has_value());
    return std::pair<int, std::string>{*code, run.Log()};
  };
  auto [idle_code, idle] = devices({}, "idle");
  INFO(idle);
  CHECK(idle_code == 0);
  CHECK_THAT(idle, Catch::Contains("0 device(s) with sessions, 1 stream(s); KV blocks 0 of ") &&
                       Catch::Contains("no device holds a session"));
  // Two sessions of 64 positions: 4 blocks each.
  REQUIRE(device_2.Send(OpenMessage(1, 64)));
  REQUIRE(device_2.Send(OpenMessage(2, 64)));
  REQUIRE(
      testing::WaitUntil([&] { return cloud.Metric("tophat_num_sessions_running") == 2; }, 10s));
  auto [code, table] = devices({"--limit", "5"}, "table");
  INFO(table);
  CHECK(code == 0);
  // The header's blocks are those in use (none: no chunk came); a device's are those
  // its sessions count against the pool (reserved for their whole context).
  CHECK_THAT(table, Catch::Contains("1 device(s) with sessions, 1 stream(s); KV blocks 0 of ") &&
                        Catch::Contains(" in use (0.0%)"));
  CHECK_THAT(table,
             Catch::Matches("(.|\\n)*device +sessions +waiting +kv_blocks +kv_share +streams\\n"
                            "device device-2 +2 +0 +8 +[0-9.]+% +1\\n"));
  auto [json_code, json] = devices({"--json"}, "json");
  CHECK(json_code == 0);
  CHECK(nlohmann::json::parse(json)["top"][0]["kv_blocks"] == 8);
  // A cloud that is not there: a clear error, not a hang.
  CloudProcess gone(dir.path(), {.start = false});
  std::vector<std::string> args = {(BinDir() / "tophat").string(), "devices", "--cloud-metrics",
                                   "127.0.0.1:" + std::to_string(gone.metrics_port())};
  ChildProcess unreachable(args, dir.path() / "unreachable.log");
  const auto unreachable_code = unreachable.Wait(30s);
  REQUIRE(unreachable_code.has_value());
  CHECK(*unreachable_code == 1);
  CHECK_THAT(unreachable.Log(), Catch::Contains("cannot reach the cloud's metrics port"));
}

TEST_CASE(
    "A reloaded agent config replaces its app tokens, and cancels the running requests of "
    "a token it no longer lists",
    "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16,
                     "app_tokens: [\"app-a:" + Sha256Hex("token-a") + "\"]\n");
  const auto connect = [&](const std::string& token) {
    auto client = Client::Connect(agent.address(), ClientOptions{.timeout_s = 10, .token = token});
    REQUIRE(client.ok());
    return *std::move(client);
  };
  std::unique_ptr<Client> old_token = connect("token-a");
  std::unique_ptr<Client> new_token = connect("token-a2");
  CHECK(old_token->Info().ok());
  CHECK(absl::IsUnauthenticated(new_token->Info().status()));
  // A long request under the old token, running when the reload comes.
  auto running = std::async(std::launch::async, [&] {
    return old_token->Generate(IdsRequest(Tokenize(ToyPrompts(6, 1)[0]), 900, true));
  });
  REQUIRE(
      testing::WaitUntil([&] { return cloud.Metric("tophat_generation_tokens_total") > 0; }, 30s));

  // The new token replaces the old; the log level and a key only a restart applies change too.
  ReplaceInConfig(agent.config(), "app_tokens: [\"app-a:" + Sha256Hex("token-a") + "\"]",
                  "app_tokens: [\"app-a:" + Sha256Hex("token-a2") +
                      "\"]\nlog_level: debug\nmax_concurrent_requests: 3");
  agent.process().Signal(SIGHUP);
  REQUIRE(testing::WaitUntil(
      [&] { return agent.Metric("tophat_config_reloads_total", "result=\"applied\"") == 1; }, 20s));
  CHECK(absl::IsUnauthenticated(old_token->Info().status()));
  absl::StatusOr<GenerateResult> cut = running.get();
  REQUIRE(cut.ok());
  CHECK(cut->finish_reason == v1::FINISH_REASON_CANCELLED);
  CHECK(cut->token_ids.size() < 900);
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(13, 1)[0]);
  auto result = new_token->Generate(IdsRequest(prompt, 8));
  REQUIRE(result.ok());
  REQUIRE(result->ok());
  CHECK(Tokens(*result) == Reference(prompt, 8, true));
  const std::string log = agent.process().Log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("1 app token(s), log_level debug; 1 running request(s) of "
                                  "apps no longer admitted were cancelled"));
  CHECK_THAT(log, Catch::Contains("cancelled 1 running request(s) of app app-a"));
  CHECK_THAT(log, Catch::Contains("take effect only at a restart: max_concurrent_requests"));
  CHECK(agent.Metric("tophat_config_keys_awaiting_restart") == 1);

  // Tokens turned off again: every caller may call, so nothing running is cancelled.
  auto kept = std::async(std::launch::async, [&] {
    return new_token->Generate(IdsRequest(Tokenize(ToyPrompts(6, 1)[0]), 300, true));
  });
  const double generated = cloud.Metric("tophat_generation_tokens_total");
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_generation_tokens_total") > generated; }, 30s));
  ReplaceInConfig(agent.config(), "app_tokens: [\"app-a:" + Sha256Hex("token-a2") + "\"]",
                  "app_tokens: []");
  agent.process().Signal(SIGHUP);
  REQUIRE(testing::WaitUntil(
      [&] { return agent.Metric("tophat_config_reloads_total", "result=\"applied\"") == 2; }, 20s));
  absl::StatusOr<GenerateResult> whole = kept.get();
  REQUIRE(whole.ok());
  CHECK(whole->finish_reason == v1::FINISH_REASON_LENGTH);
  CHECK(whole->token_ids.size() == 300);
  CHECK(connect("")->Info().ok());
  CHECK(agent.process().running());
}

TEST_CASE("A drain past its grace period cancels what still runs, tells its agent, and exits 0",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.drain_grace_period_s = 0.2});
  RawStream stream(cloud.address());
  REQUIRE(stream.Send(OpenMessage(7, 16)));
  v1::CloudMessage admitted = stream.Read();
  REQUIRE(admitted.has_admitted());
  // The session stays open (no chunk, no close): the drain's grace period runs out on it.
  cloud.process().Signal(SIGTERM);
  v1::CloudMessage message = stream.Read();
  while (message.has_received()) message = stream.Read();
  REQUIRE(message.has_error());
  CHECK(message.error().session_id() == 7);
  CHECK(message.error().code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK_THAT(message.error().message(),
             Catch::Contains("the cloud shut down before the session ended"));
  const auto code = cloud.process().Wait(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("A draining cloud finishes in-flight work, and new requests move to its successor",
          "[serving][cuda-cloud][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.drain_grace_period_s = 60});
  // The late request waits for the old cloud to finish the long one and for the new one to
  // load: longer than the default 60 s give-up on a slow machine or under a sanitizer.
  AgentProcess agent(dir.path(), cloud, 16, "reconnect:\n  give_up_after_s: 600\n");
  const std::vector<int32_t> long_prompt = Tokenize(ToyPrompts(12, 1)[0]);
  const std::vector<int32_t> late_prompt = Tokenize(ToyPrompts(13, 1)[0]);
  auto in_flight = std::async(std::launch::async, [&] {
    // 300 tokens: after the first 20, ~280 rounds (~3 s on an idle 2-core machine) for the
    // drain to begin and the late request to be turned away while this one still runs.
    return agent.client().Generate(IdsRequest(long_prompt, 300, /*ignore_eos=*/true));
  });
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_generation_tokens_total") >= 20; }, 30s));
  RawStream probe(cloud.address());
  cloud.process().Signal(SIGTERM);
  // The late request must arrive during the drain, to be refused by the old cloud and
  // replayed on the new one: it is sent once the cloud refuses a probe's session.
  WaitUntilDraining(probe, 1000);
  probe.Cancel();
  // The daemon marks itself NOT_SERVING before the engine refuses sessions, so a load
  // balancer's health check already sees the drain.
  CHECK(HealthCheck(cloud.address()) == 2);
  auto late = std::async(std::launch::async, [&] {
    return agent.client().Generate(IdsRequest(late_prompt, 32, /*ignore_eos=*/true));
  });
  absl::StatusOr<GenerateResult> first = in_flight.get();
  REQUIRE(first.ok());
  INFO(first->error);
  REQUIRE(first->ok());
  CHECK(first->stats.reconnects() == 0);  // the drain let it finish where it was
  CHECK(Tokens(*first) == Reference(long_prompt, 300, false));
  auto code = cloud.process().Wait(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  cloud.Start(dir.path());
  absl::StatusOr<GenerateResult> second = late.get();
  REQUIRE(second.ok());
  INFO(second->error);
  REQUIRE(second->ok());
  CHECK(second->stats.reconnects() >= 1);  // it really was turned away by the draining cloud
  CHECK(Tokens(*second) == Reference(late_prompt, 32, false));
}

TEST_CASE("A conversation's later turns reuse its earlier turns' KV on both sides and decode "
          "what a fresh request decodes",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16, "conversation_cache:\n  enabled: true\n");
  std::vector<int32_t> history = Tokenize(ToyPrompts(6, 1)[0]);
  int64_t kept = 0;  // positions the previous turn left in both sides' KV
  for (int turn = 0; turn < 3; ++turn) {
    INFO("turn " << turn << ", " << history.size() << " prompt tokens");
    absl::StatusOr<GenerateResult> result = agent.client().Generate(IdsRequest(history, 12, true));
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == Reference(history, 12, false));
    // Everything but the answer's last token (which no KV holds yet) comes back.
    CHECK(result->stats.reused_prompt_tokens() == kept);
    kept = static_cast<int64_t>(history.size()) + 12 - 1;
    // The next turn: the answer, then a new message.
    history.insert(history.end(), result->token_ids.begin(), result->token_ids.end());
    const std::vector<int32_t> message = Tokenize(ToyPrompts(7 + turn, 1)[0]);
    history.insert(history.end(), message.begin(), message.end());
  }
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_num_sessions_parked") == 1; }, 10s));
  CHECK(cloud.Metric("tophat_parked_sessions_resumed_total") == 2);
  CHECK(agent.Metric("tophat_prompt_positions_reused_total") > 0);
}

// Plain and speculative greedy requests of agents on the int8 device bundle (with
// `agent_yaml`) against the model as quantized: the int8 device submodels (loaded with
// `reference_options`) around the float32 middle, in this process.
void CheckInt8BundleServes(const std::string& agent_yaml, const SubmodelOptions& reference_options,
                           const std::string& logged) {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});  // the float32 cloud half: the same for both splits
  AgentProcess plain(dir.path(), cloud.address(), 16,
                     agent_yaml + "speculative:\n  enabled: false\n", 0, "", {},
                     Int8Bundles() / "device");
  AgentProcess drafting(dir.path(), cloud.address(), 16, agent_yaml, 0, "", {},
                        Int8Bundles() / "device");
  CHECK_THAT(plain.process().Log(), Catch::Contains(logged));
  // The kernels' instruction sets, as this test's CPU offers them.
  CHECK_THAT(
      plain.process().Log(),
      Catch::Contains(absl::StrCat(
          "device CPU kernels: ", std::string(kernels::CpuIsaName(kernels::SelectedCpuIsa())),
          " for float and int8 weights, ",
          std::string(kernels::W8A8IsaName(kernels::SupportedW8A8Isas().back())),
          " for int8 activations (",
          kernels::HasInt8Gemm(kernels::SupportedW8A8Isas().back()) ? "prompts in integers"
                                                                    : "prompts through BLAS",
          ")")));
  CHECK_THAT(drafting.process().Log(), Catch::Contains("speculative decoding: adapter"));
  auto device = DeviceBundle::Load(Int8Bundles() / "device", reference_options);
  auto middle = CloudBundle::Load(Bundles() / "cloud");
  REQUIRE(device.ok());
  REQUIRE(middle.ok());
  REQUIRE(device->input->int8_weights());
  auto generator = PipelineGenerator::Create(
      {device->input.get(), middle->middle.get(), device->output.get()});
  REQUIRE(generator.ok());
  const std::vector<std::string> sentences = ToyPrompts(13, 12);
  int64_t drafted = 0;
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<int32_t> prompt =
        Tokenize(sentences[i] + " " + sentences[i + 4] + " " + sentences[i + 8]);
    GenerationOptions options;
    options.max_new_tokens = 32;
    auto expected = generator->Generate(prompt, options);
    REQUIRE(expected.ok());
    for (AgentProcess* agent : {&plain, &drafting}) {
      absl::StatusOr<GenerateResult> result =
          agent->client().Generate(IdsRequest(prompt, 32, /*ignore_eos=*/true));
      INFO("prompt " << i << (agent == &plain ? ", plain" : ", speculative"));
      REQUIRE(result.ok());
      INFO(result->error);
      REQUIRE(result->ok());
      CHECK(Tokens(*result) == expected->tokens);
      if (agent == &drafting) drafted += result->stats.accepted_tokens();
    }
  }
  // The drafter (its adapter in int8 too) still drafts tokens the model accepts.
  CHECK(drafted > 0);
}

TEST_CASE("An int8 device bundle serves plain and speculative greedy requests with the tokens "
          "of the model as quantized",
          "[serving]") {
  CheckInt8BundleServes("", {}, "device weights: int8 with per-row scales, computed in float32");
}

TEST_CASE("With int8 activations an int8 device bundle serves greedy requests with the tokens "
          "of the model as quantized, activations rounded",
          "[serving]") {
  CheckInt8BundleServes("int8_activations: true\n", {.int8_activations = true},
                        "activations rounded to int8 per block of 32");
}

TEST_CASE(
    "A conversation that shares only a beginning with a kept one forks it, and the kept "
    "one's next turn still reuses all of its own history",
    "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16, "conversation_cache:\n  enabled: true\n");
  // A shared beginning past min_reuse_tokens (an app's system prompt), then each
  // conversation's own message.
  const std::vector<int32_t> system = Tokenize(absl::StrJoin(ToyPrompts(21, 3), " "));
  REQUIRE(system.size() >= 16);
  const auto conversation = [&](int seed) {
    std::vector<int32_t> prompt = system;
    const std::vector<int32_t> message = Tokenize(absl::StrJoin(ToyPrompts(seed, 2), " "));
    prompt.insert(prompt.end(), message.begin(), message.end());
    return prompt;
  };
  const auto generate = [&](const std::vector<int32_t>& prompt) {
    absl::StatusOr<GenerateResult> result = agent.client().Generate(IdsRequest(prompt, 12, true));
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == Reference(prompt, 12, false));
    return *result;
  };
  const std::vector<int32_t> first = conversation(22);
  const GenerateResult first_answer = generate(first);
  CHECK(first_answer.stats.reused_prompt_tokens() == 0);

  const std::vector<int32_t> second = conversation(23);
  int64_t shared = 0;
  while (first[shared] == second[shared]) ++shared;
  REQUIRE(shared >= static_cast<int64_t>(system.size()));
  // It parts from the first conversation within the first's prompt: a conversation of its own.
  REQUIRE(shared < static_cast<int64_t>(first.size()) - 1);
  CHECK(generate(second).stats.reused_prompt_tokens() == shared);
  CHECK(cloud.Metric("tophat_parked_sessions_forked_total") == 1);
  CHECK(cloud.Metric("tophat_parked_sessions_resumed_total") == 0);

  // The first conversation's next turn: every position its first turn left, not only the
  // shared beginning the second conversation had.
  std::vector<int32_t> history = first;
  const std::vector<int32_t> answer = Tokens(first_answer);
  history.insert(history.end(), answer.begin(), answer.end());
  const std::vector<int32_t> message = Tokenize(ToyPrompts(24, 1)[0]);
  history.insert(history.end(), message.begin(), message.end());
  CHECK(generate(history).stats.reused_prompt_tokens() ==
        static_cast<int64_t>(first.size()) + 12 - 1);
  CHECK(cloud.Metric("tophat_parked_sessions_resumed_total") == 1);
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_num_sessions_parked") == 2; }, 10s));
}

TEST_CASE("A turn shorter than the parked session it continues resumes it and gives back the "
          "rest",
          "[serving]") {
  // The parked session holds the first turn's answer, 40 positions; the second turn asks the
  // same prompt again for 2 tokens, so it can grow to fewer positions than the session has.
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16, "conversation_cache:\n  enabled: true\n");
  const std::vector<std::string> sentences = ToyPrompts(6, 8);  // past min_reuse_tokens
  const std::vector<int32_t> prompt = Tokenize(absl::StrJoin(sentences, " "));
  REQUIRE(prompt.size() >= 16);
  absl::StatusOr<GenerateResult> first = agent.client().Generate(IdsRequest(prompt, 40, true));
  REQUIRE(first.ok());
  REQUIRE(first->ok());
  absl::StatusOr<GenerateResult> again = agent.client().Generate(IdsRequest(prompt, 2, true));
  REQUIRE(again.ok());
  INFO(again->error);
  REQUIRE(again->ok());
  CHECK(Tokens(*again) == Reference(prompt, 2, false));
  CHECK(again->stats.reused_prompt_tokens() == static_cast<int64_t>(prompt.size()) - 1);
  CHECK(cloud.Metric("tophat_parked_sessions_resumed_total") == 1);
  CHECK(testing::WaitUntil([&] { return cloud.Metric("tophat_num_sessions_parked") == 1; }, 10s));
}

TEST_CASE("An SDK conversation reuses its earlier turns and answers as a fresh request of the "
          "same text does",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // Short toy sentences: any shared prefix of 4 tokens is reused.
  AgentProcess keeping(dir.path(), cloud, 16,
                       "conversation_cache:\n  enabled: true\n  min_reuse_tokens: 4\n");
  AgentProcess fresh(dir.path(), cloud, 16);  // keeps nothing
  v1::GenerateRequest options;
  options.set_max_new_tokens(10);
  options.set_ignore_eos(true);
  Conversation conversation(keeping.client(), options);
  const std::vector<std::string> messages = ToyPrompts(11, 3);
  for (size_t turn = 0; turn < messages.size(); ++turn) {
    const std::string prompt = conversation.transcript() + messages[turn] + " ";
    absl::StatusOr<GenerateResult> said = conversation.Say(messages[turn] + " ");
    REQUIRE(said.ok());
    INFO("turn " << turn << ": " << said->error);
    REQUIRE(said->ok());
    v1::GenerateRequest same = options;
    same.set_prompt(prompt);
    absl::StatusOr<GenerateResult> reference = fresh.client().Generate(same);
    REQUIRE(reference.ok());
    REQUIRE(reference->ok());
    CHECK(said->token_ids == reference->token_ids);
    CHECK(reference->stats.reused_prompt_tokens() == 0);
    if (turn > 0) CHECK(said->stats.reused_prompt_tokens() > 0);
    CHECK(conversation.transcript() == prompt + said->text);
  }
}

TEST_CASE(
    "An SDK request's n choices compute the prompt once, each the answer its seed gives "
    "the prompt alone",
    "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess agent(dir.path(), cloud, 16,
                     "conversation_cache:\n  enabled: true\n  min_reuse_tokens: 4\n");
  v1::GenerateRequest request;
  request.set_prompt(ToyPrompts(17, 1)[0] + " " + ToyPrompts(18, 1)[0]);
  request.set_max_new_tokens(8);
  request.set_ignore_eos(true);
  request.mutable_sampling()->set_temperature(1.0);
  request.mutable_sampling()->set_seed(21);
  request.set_request_id("three");
  request.set_n(3);
  const double prompt_positions = cloud.Metric("tophat_prompt_tokens_total");
  const double forked = cloud.Metric("tophat_parked_sessions_forked_total");
  std::vector<int> messages(3, 0);
  absl::StatusOr<std::vector<GenerateResult>> many =
      agent.client().GenerateChoices(request, [&](const v1::GenerateResponse& response) {
        if (response.choice() < messages.size()) ++messages[response.choice()];
      });
  REQUIRE(many.ok());
  REQUIRE(many->size() == 3);
  const int64_t length = (*many)[0].stats.prompt_tokens();
  REQUIRE(length > 4);  // past min_reuse_tokens, so the prompt is kept for the choices
  // The prompt computed once, then its last position once a choice (each forks it).
  CHECK(cloud.Metric("tophat_prompt_tokens_total") - prompt_positions == length + 3);
  CHECK(cloud.Metric("tophat_parked_sessions_forked_total") - forked == 3);
  std::set<std::vector<uint32_t>> distinct;
  for (int64_t j = 0; j < 3; ++j) {
    const GenerateResult& choice = (*many)[j];
    INFO("choice " << j << ": " << choice.error);
    REQUIRE(choice.ok());
    CHECK(choice.request_id == absl::StrCat("three-", j));
    CHECK(choice.token_ids.size() == 8);
    CHECK(messages[j] >= 2);  // its tokens streamed, then its last message
    // The first counts what computing the prompt reused (nothing: a fresh prompt), the others
    // what they took from the kept prompt: all of it but the last position.
    CHECK(choice.stats.reused_prompt_tokens() == (j == 0 ? 0 : length - 1));
    v1::GenerateRequest alone = request;
    alone.clear_n();
    alone.clear_request_id();
    alone.mutable_sampling()->set_seed(21 + j);
    absl::StatusOr<GenerateResult> one = agent.client().Generate(alone);
    REQUIRE(one.ok());
    CHECK(one->token_ids == choice.token_ids);
    distinct.insert(choice.token_ids);
  }
  CHECK(distinct.size() > 1);
  // Generate returns one answer, so it refuses n above 1; the agent refuses more than 16.
  CHECK(agent.client().Generate(request).status().code() == absl::StatusCode::kInvalidArgument);
  request.set_n(17);
  absl::StatusOr<std::vector<GenerateResult>> too_many = agent.client().GenerateChoices(request);
  CHECK(too_many.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(too_many.status().message()), Catch::Contains("more than the 16"));
}

TEST_CASE("A conversation whose parked session the cloud evicted for another's KV starts afresh "
          "and decodes the same tokens",
          "[serving]") {
  testing::TempDir dir;
  // 20 blocks of 16 positions (the toy middle's 3 layers: 24 KiB a block), all for one device.
  CloudProcess cloud(dir.path(), {.kv_memory = std::to_string(20 * 24) + "KiB",
                                  .max_kv_fraction_per_device = 1});
  AgentProcess agent(dir.path(), cloud, 16, "conversation_cache:\n  enabled: true\n");
  std::vector<int32_t> history = Tokenize(ToyPrompts(6, 1)[0]);
  absl::StatusOr<GenerateResult> first = agent.client().Generate(IdsRequest(history, 8, true));
  REQUIRE(first.ok());
  REQUIRE(first->ok());
  // The park goes out as the answer ends, and the cloud takes it a moment later.
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_num_sessions_parked") == 1; }, 10s));
  // Another request that needs all 20 blocks: the parked session gives way.
  const std::vector<int32_t> other = Tokenize(ToyPrompts(9, 1)[0]);
  absl::StatusOr<GenerateResult> big = agent.client().Generate(
      IdsRequest(other, 320 - static_cast<int64_t>(other.size()), true));
  REQUIRE(big.ok());
  INFO(big->error);
  REQUIRE(big->ok());
  INFO("KV blocks " << cloud.Metric("tophat_kv_cache_blocks_total") << ", parked "
                    << cloud.Metric("tophat_num_sessions_parked"));
  CHECK(cloud.Metric("tophat_parked_sessions_evicted_total") == 1);
  // The cloud told the agent, which let its side go too: what it keeps is the big request's.
  CHECK(testing::WaitUntil([&] { return agent.Metric("tophat_conversations_kept") == 1; }, 10s));
  // The next turn of the first conversation: the whole prompt is computed and sent again,
  // with no resume asked for (and refused), and the answer is right.
  history.insert(history.end(), first->token_ids.begin(), first->token_ids.end());
  const std::vector<int32_t> message = Tokenize(ToyPrompts(7, 1)[0]);
  history.insert(history.end(), message.begin(), message.end());
  absl::StatusOr<GenerateResult> second = agent.client().Generate(IdsRequest(history, 12, true));
  REQUIRE(second.ok());
  INFO(second->error);
  REQUIRE(second->ok());
  CHECK(second->stats.reused_prompt_tokens() == 0);
  CHECK(Tokens(*second) == Reference(history, 12, false));
  CHECK(cloud.Metric("tophat_session_errors_total") == 0);
}

TEST_CASE("A full KV pool queues or refuses new sessions while running ones finish",
          "[serving][cuda-cloud][staged]") {
  testing::TempDir dir;
  // Toy middle: 3 layers x 2 KV heads x 32 dims x 16 positions x 4 bytes x (K, V) = 24 KiB a
  // block. 960 KiB = 40 blocks; a session of 300 positions takes 19, so two fit and a third
  // does not. The first two must still be running while the third and fourth arrive: from
  // both running to the fourth refused is two Opens and a metrics poll (10 ms apart), tens
  // of milliseconds, against ~280 decode rounds left of each (about 3 s at ~10 ms a round
  // on an idle 2-core machine, longer under a sanitizer). With pipeline stages, kv_cache
  // sizes stage 0's pool from its own layers (every stage gets as many blocks), so the same
  // 40 blocks take 8 KiB per layer stage 0 holds.
  const std::vector<int> stages = CloudStages();
  const int stage0_layers = stages.empty() ? 3 : stages[1] - stages[0];
  // One agent is one device: it may hold the whole pool here.
  CloudProcess cloud(dir.path(), {.kv_memory = std::to_string(40 * 8 * stage0_layers) + "KiB",
                                  .max_waiting_sessions = 1,
                                  .max_kv_fraction_per_device = 1});
  AgentProcess agent(dir.path(), cloud, 16);
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(4, 1)[0]);
  const int64_t max_new_tokens = 300 - static_cast<int64_t>(prompt.size());
  const auto start = [&] {
    return std::async(std::launch::async, [&] {
      return agent.client().Generate(IdsRequest(prompt, max_new_tokens, true));
    });
  };
  auto first = start();
  auto second = start();
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_num_sessions_running") == 2; }, 20s));
  auto third = start();  // waits in the queue
  REQUIRE(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_num_sessions_waiting") == 1; }, 20s));
  auto fourth = start();  // the queue is full
  absl::StatusOr<GenerateResult> refused = fourth.get();
  REQUIRE(refused.ok());
  CHECK_FALSE(refused->ok());
  CHECK(refused->error.find("RESOURCE_EXHAUSTED") != std::string::npos);
  const std::vector<int32_t> expected = Reference(prompt, max_new_tokens, false);
  for (auto* pending : {&first, &second, &third}) {
    absl::StatusOr<GenerateResult> result = pending->get();
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    CHECK(Tokens(*result) == expected);
  }
  CHECK(cloud.Metric("tophat_sessions_rejected_total") == 1);
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

// Checks one request's decode-round trace: every round rolls the device's input, adapter and
// output KV and the cloud's KV back to exactly the accepted length.
void CheckRollback(const v1::RequestStats& stats, int64_t prompt_length) {
  REQUIRE(stats.rounds_size() == static_cast<int>(stats.decode_rounds()));
  int64_t expected_start = prompt_length;  // the first generated token is the first round's
  for (int i = 0; i < stats.rounds_size(); ++i) {
    const v1::DecodeRound& round = stats.rounds(i);
    INFO("round " << i << " start " << round.start() << " drafted " << round.drafted()
                  << " accepted " << round.accepted());
    CHECK(round.start() == expected_start);
    CHECK(round.accepted() <= round.drafted());
    // The cloud computed every row of the round on top of the accepted prefix.
    CHECK(round.cloud_kv_after_verify() == round.start() + round.drafted() + 1);
    CHECK(round.kv_length() == round.start() + round.accepted() + 1);
    CHECK(round.input_kv_length() == round.kv_length());
    CHECK(round.adapter_kv_length() == round.kv_length());
    CHECK(round.output_kv_length() == round.kv_length());
    // The cloud confirmed its rollback (or had nothing to roll back); the last round's
    // confirmation may still be on its way when the request ends.
    if (i + 1 < stats.rounds_size()) CHECK(round.cloud_kv_length() == round.kv_length());
    // A round whose rows went ahead is the branch the round before sent, kept whole.
    if (round.rows_at_cloud_before() > 0) {
      CHECK(i > 0);
      if (i > 0) CHECK(stats.rounds(i - 1).sent_ahead());
      CHECK(round.parallel_hit());
      CHECK(round.rows_at_cloud_before() <= round.drafted() + 1);
    }
    expected_start = round.kv_length();
  }
}

TEST_CASE("Speculative decoding with parallel drafting reproduces monolithic greedy decoding "
          "over 50 prompts and rolls every KV back to the accepted length",
          "[serving][speculative][cuda-cloud][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_batch_tokens = 64});
  // Two agents: default speculative settings with a run sent ahead of each verification
  // (PipeInfer), and a narrower draft with wider fan-out whose drafts per round follow the
  // DSD-style adaptive window.
  AgentProcess wide(dir.path(), cloud, 32, "speculative:\n  max_runs_in_flight: 2\n");
  // It also drafts past where the drafter is sure (eta 0.15, not 0.6), so that some drafts are
  // rejected whatever the trained toy drafter's accuracy: on some CPUs its confident drafts
  // were all right, and "both outcomes of verification occurred" failed with accepted equal
  // to drafted (1,041 of 1,041).
  AgentProcess narrow(dir.path(), cloud, 16,
                      "speculative:\n  max_draft_tokens: 3\n  parallel_top_k: 3\n"
                      "  parallel_steps: 2\n  adaptive_window: true\n  eta: 0.15\n");
  std::vector<std::string> sentences = ToyPrompts(23, 80);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < 50; ++i) {
    std::string text = sentences[i];
    if (i % 3 == 0) text += " " + sentences[i + 50 < sentences.size() ? i + 25 : 0];
    prompts.push_back(Tokenize(text));
  }
  const int64_t max_new_tokens = 32;
  int64_t rounds = 0, drafted = 0, accepted = 0, hits = 0, ahead = 0, generated = 0;
  int64_t runs_sent = 0, runs_kept = 0;
  for (size_t begin = 0; begin < prompts.size(); begin += 4) {
    std::vector<std::future<absl::StatusOr<GenerateResult>>> futures;
    for (size_t i = begin; i < std::min(prompts.size(), begin + 4); ++i) {
      Client& client = (i % 2 == 0 ? wide : narrow).client();
      v1::GenerateRequest request = IdsRequest(prompts[i], max_new_tokens);
      request.set_trace(true);
      futures.push_back(std::async(std::launch::async, [&client, request] {
        return client.Generate(request);
      }));
    }
    for (size_t i = begin; i < std::min(prompts.size(), begin + 4); ++i) {
      absl::StatusOr<GenerateResult> result = futures[i - begin].get();
      INFO("prompt " << i << " (" << prompts[i].size() << " tokens)");
      REQUIRE(result.ok());
      INFO(result->error);
      REQUIRE(result->ok());
      CHECK(Tokens(*result) == Reference(prompts[i], max_new_tokens, /*stop_at_eos=*/true));
      CheckRollback(result->stats, static_cast<int64_t>(prompts[i].size()));
      rounds += result->stats.decode_rounds();
      drafted += result->stats.draft_tokens();
      accepted += result->stats.accepted_tokens();
      hits += result->stats.parallel_hits();
      ahead += result->stats.parallel_drafts();
      generated += result->stats.generated_tokens();
      runs_sent += result->stats.ahead_runs_sent();
      runs_kept += result->stats.ahead_runs_kept();
      if (i % 2 == 1) CHECK(result->stats.ahead_runs_sent() == 0);
    }
  }
  const double accept_length =
      static_cast<double>(generated - static_cast<int64_t>(prompts.size())) /
      static_cast<double>(rounds);
  INFO("rounds " << rounds << " drafted " << drafted << " accepted " << accepted
                 << " drafted ahead in " << ahead << " rounds, parallel hits " << hits << " tokens per round " << accept_length);
  // Speculation happened and paid off, and both outcomes of verification occurred.
  CHECK(accepted > 0);
  CHECK(accepted < drafted);
  CHECK(hits > 0);
  CHECK(accept_length > 1.3);
  // Runs went ahead of their verification; some became the next round, and the rest were
  // cancelled without changing a token.
  INFO("runs sent ahead " << runs_sent << ", kept " << runs_kept);
  CHECK(runs_kept > 0);
  CHECK(runs_kept < runs_sent);
  CHECK(wide.Metric("tophat_spec_decode_ahead_runs_sent_total") == runs_sent);
  const double agent_drafts = wide.Metric("tophat_spec_decode_num_drafts_total") +
                              narrow.Metric("tophat_spec_decode_num_drafts_total");
  CHECK(agent_drafts > 0);
  CHECK(wide.Metric("tophat_spec_decode_num_accepted_tokens_per_pos_total",
                    "position=\"0\"") > 0);
  // The drafter's measured step time went to the cloud's state monitor.
  CHECK(wide.Metric("tophat_draft_step_seconds") > 0);
  // Drafting happened under the adaptive window too; how the window moves is the adaptive
  // window test's.
  CHECK(narrow.Metric("tophat_spec_decode_num_drafts_total") > 0);
  REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") == 0; },
                             5s));
}

TEST_CASE("Two and three pipeline stages over Gloo reproduce the monolithic greedy tokens",
          "[serving][pipeline]") {
  testing::TempDir dir;
  // The toy model's middle is layers [2, 5): split after layer 3, after 2 and 3, and where
  // the planner puts the cut for two stages from their profiles.
  for (const std::vector<int>& boundaries : {std::vector<int>{2, 4, 5}, {2, 3, 4, 5}, {}}) {
    CloudProcess cloud(dir.path(), {.max_batch_tokens = 48,
                                    .layer_boundaries = boundaries,
                                    .planned_stages = boundaries.empty() ? 2 : 0});
    // Speculative decoding (the default) verifies drafts and rolls KV back on every stage;
    // chunk 8 splits prompts into several prefill chunks batched with decodes. η = 0.05 lets
    // the drafter go on past the tokens it is unsure of, so that some drafts are rejected
    // (the 900-step toy model drafts these short prompts without a miss at the default).
    AgentProcess agent(dir.path(), cloud, 8, "speculative:\n  eta: 0.05\n");
    std::vector<std::string> sentences = ToyPrompts(41, 12);
    const int64_t max_new_tokens = 24;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::future<absl::StatusOr<GenerateResult>>> futures;
    for (size_t i = 0; i < sentences.size(); ++i) {
      prompts.push_back(Tokenize(sentences[i] + " " + sentences[(i + 5) % sentences.size()]));
      futures.push_back(std::async(std::launch::async, [&agent, request = IdsRequest(
                                                         prompts.back(), max_new_tokens)] {
        return agent.client().Generate(request);
      }));
    }
    // A SIGHUP to every stage mid-generation (a `pkill -HUP tophat-cloud`): stage 0 reloads
    // its config, the later stages ignore the signal, and no request notices.
    for (int s = 1; s < cloud.stages(); ++s) cloud.stage(s).Signal(SIGHUP);
    cloud.process().Signal(SIGHUP);
    int64_t accepted = 0;
    int64_t drafted = 0;
    for (size_t i = 0; i < futures.size(); ++i) {
      absl::StatusOr<GenerateResult> result = futures[i].get();
      INFO((boundaries.empty() ? 2 : boundaries.size() - 1) << " stages, prompt " << i);
      REQUIRE(result.ok());
      INFO(result->error);
      REQUIRE(result->ok());
      CHECK(Tokens(*result) == Reference(prompts[i], max_new_tokens, /*stop_at_eos=*/true));
      accepted += result->stats.accepted_tokens();
      drafted += result->stats.draft_tokens();
    }
    // Both verification outcomes happened, so some steps rolled KV back.
    CHECK(accepted > 0);
    CHECK(accepted < drafted);
    REQUIRE(testing::WaitUntil([&] { return cloud.Metric("tophat_kv_cache_usage_ratio") == 0; },
                               5s));
    if (boundaries.empty()) {
      CHECK(cloud.process().Log().find("pipeline: planned layer boundaries [2, ") !=
            std::string::npos);
    }
    REQUIRE(testing::WaitUntil(
        [&] { return cloud.Metric("tophat_config_reloads_total", "result=\"applied\"") == 1; },
        10s));
    for (int s = 1; s < cloud.stages(); ++s) CHECK(cloud.stage(s).running());
    CHECK(cloud.process().running());
    // Each stage's own forward time reaches stage 0's metrics.
    const int stages = boundaries.empty() ? 2 : static_cast<int>(boundaries.size()) - 1;
    for (int s = 0; s < stages; ++s) {
      CHECK(cloud.Metric("tophat_pipeline_stage_seconds_sum",
                         "stage=\"" + std::to_string(s) + "\"") > 0);
    }
  }
}

TEST_CASE("A pipeline stage killed mid-generation fails over: stage 0 exits, and after a "
          "restart the request completes with the right tokens",
          "[serving][pipeline]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.layer_boundaries = {2, 4, 5}});
  AgentProcess agent(dir.path(), cloud, 16);
  LongGeneration generation(agent, cloud);
  cloud.stage(1).Signal(SIGKILL);
  // Stage 0 sees the lost link at its next transfer, fails the step's sessions with
  // UNAVAILABLE and exits non-zero for its supervisor; bounded by pipeline.timeout_s (30 s)
  // even if the loss showed only as silence.
  const std::optional<int> exit_code = cloud.process().Wait(40s);
  INFO(cloud.process().Log());
  REQUIRE(exit_code.has_value());
  CHECK(*exit_code != 0);
  CHECK(cloud.process().Log().find("pipeline: lost a stage") != std::string::npos);
  cloud.Start(dir.path());  // the supervisor's restart: both stages, same ports, empty KV
  generation.CheckSurvived();
}

// How often float32 greedy decoding would have chosen the token a run chose, given the run's
// own earlier tokens (teacher forcing on the reference, so that one early divergence does
// not count every later token as a disagreement).
struct Agreement {
  int64_t tokens = 0;
  int64_t agreed = 0;
  std::vector<double> disagreement_margins;  // float32 logit of its choice minus the run's
};
void AddAgreement(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated,
                  Agreement& agreement) {
  if (generated.empty()) return;
  std::lock_guard<std::mutex> lock(reference_mutex);
  Submodel& model = ReferenceModel();
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), generated.begin(), generated.end() - 1);
  KvCache cache = model.NewCache();
  auto hidden = model.Embed(at::tensor(ids, at::kLong));
  REQUIRE(hidden.ok());
  auto out = model.Forward(*hidden, cache);
  REQUIRE(out.ok());
  // Logits at the positions that chose each generated token.
  auto logits = model.Logits(out->narrow(0, static_cast<int64_t>(prompt.size()) - 1,
                                         static_cast<int64_t>(generated.size())));
  REQUIRE(logits.ok());
  const at::Tensor best = logits->argmax(-1);
  for (size_t i = 0; i < generated.size(); ++i) {
    ++agreement.tokens;
    const int64_t want = best[static_cast<int64_t>(i)].item<int64_t>();
    if (want == generated[i]) {
      ++agreement.agreed;
    } else {
      const at::Tensor row = (*logits)[static_cast<int64_t>(i)];
      agreement.disagreement_margins.push_back(row[want].item<double>() -
                                               row[generated[i]].item<double>());
    }
  }
}

// Greedy answers from `agent` for every sentence, eight requests at a time, each added to
// `agreement` against the float32 reference.
void AddAgreements(AgentProcess& agent, const std::vector<std::string>& sentences,
                   int64_t max_new_tokens, Agreement& agreement) {
  for (size_t begin = 0; begin < sentences.size(); begin += 8) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::future<absl::StatusOr<GenerateResult>>> futures;
    for (size_t i = begin; i < std::min(sentences.size(), begin + 8); ++i) {
      prompts.push_back(Tokenize(sentences[i]));
      futures.push_back(std::async(std::launch::async, [&agent, request = IdsRequest(
                                                         prompts.back(), max_new_tokens)] {
        return agent.client().Generate(request);
      }));
    }
    for (size_t i = 0; i < futures.size(); ++i) {
      absl::StatusOr<GenerateResult> result = futures[i].get();
      REQUIRE(result.ok());
      INFO(result->error);
      REQUIRE(result->ok());
      AddAgreement(prompts[i], Tokens(*result), agreement);
    }
  }
}

// [numerics]: 100 prompts of agreement statistics; the sanitized run leaves it out (its
// memory paths are those of the shorter bfloat16 case below).
TEST_CASE("In bfloat16 the agent and cloud choose float32's greedy token except at near ties",
          "[serving][cuda-cloud][numerics]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.dtype = "bfloat16"});
  // The agent computes in bfloat16 too (hidden states cross the wire in the cloud's dtype).
  AgentProcess agent(dir.path(), cloud, 32, "dtype: bfloat16\n");
  const int64_t max_new_tokens = 24;
  Agreement agreement;
  AddAgreements(agent, ToyPrompts(31, 100), max_new_tokens, agreement);
  const double fraction = static_cast<double>(agreement.agreed) / agreement.tokens;
  std::string margins;
  for (double m : agreement.disagreement_margins) margins += absl::StrFormat(" %.3f", m);
  std::printf("bfloat16 pipeline (cloud on %s) vs float32 greedy: %lld of %lld tokens agree "
              "(%.2f%%); float32 logit margins at the disagreements:%s\n",
              CloudDevice().c_str(), static_cast<long long>(agreement.agreed),
              static_cast<long long>(agreement.tokens), 100 * fraction, margins.c_str());
  INFO("agreement " << fraction << ", margins:" << margins);
  CHECK(agreement.tokens >= 100 * max_new_tokens / 2);
  // Every disagreement must be a near tie of the float32 model: bfloat16 keeps 8 mantissa
  // bits, so its hidden states move the logits by a hundredth or so here, and only choices
  // that close can flip. A real fault (a wrong layer, a stale KV row) flips confident choices
  // too. Before the head computed float32 logits, rounding them to bfloat16 (a step of 1/16
  // near the top logits, so up to 1/32 each way) flipped margins up to 0.053; with float32
  // logits the largest seen is 0.015.
  for (double margin : agreement.disagreement_margins) CHECK(margin < 0.03);
  // How many choices are near ties is the trained toy model's, and the toy model is trained
  // on the machine that runs the tests, whose floating point differs: on a 2-core AMD EPYC
  // 2,382 of 2,400 agreed (99.25%, margins 0.000-0.015), on an Intel Xeon with AMX 2,374
  // (98.92%, margins 0.003-0.013), each with the float32 head. So the near ties are asserted
  // above, and the count here guards against a fault that flips many near ties at once. The
  // head rounding its logits to bfloat16 fails one check or the other: on the AMD machine the
  // margins (98.12% agreed, margins up to 0.053), on the Xeon the count (97.88%, 2,349 of
  // 2,400, margins up to 0.026). On a GPU it is issue 31's goal, which the GPU check measures
  // on the bundle's toy model.
  const double least_fraction = CloudDevice() == "cpu" ? 0.98 : 0.99;
  CHECK(fraction >= least_fraction);
}

TEST_CASE("An agent computing in bfloat16 serves a float32 cloud, converting at the wire",
          "[serving]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});  // float32
  AgentProcess agent(dir.path(), cloud, 16, "dtype: bfloat16\n");
  const int64_t max_new_tokens = 24;
  Agreement agreement;
  AddAgreements(agent, ToyPrompts(37, 16), max_new_tokens, agreement);
  // Every request succeeded, so every chunk passed the cloud's check that it holds float32
  // (a bfloat16 payload fails its session: "states.dtype"); before the agent converted at
  // the wire, it refused this cloud at Hello.
  const double fraction = static_cast<double>(agreement.agreed) / agreement.tokens;
  std::string margins;
  for (double m : agreement.disagreement_margins) margins += absl::StrFormat(" %.3f", m);
  std::printf("bfloat16 agent, float32 cloud vs float32 greedy: %lld of %lld tokens agree "
              "(%.2f%%); margins at the disagreements:%s\n",
              static_cast<long long>(agreement.agreed), static_cast<long long>(agreement.tokens),
              100 * fraction, margins.c_str());
  INFO("agreement " << fraction << ", margins:" << margins);
  CHECK(agreement.tokens >= 16 * max_new_tokens / 2);
  // As in the all-bfloat16 test: only near ties of the float32 model may flip, and how many
  // there are is the trained toy model's. On the 2-core AMD EPYC 383 of 384 agree (99.74%,
  // margin 0.015); a toy model trained with the attention scores multiplied by 1/sqrt(32)
  // instead of divided by sqrt(32) (a last-bit difference, 2026-12-06) agreed on 380
  // (98.96%, margins 0.001-0.007). So the margins are asserted, and the count guards
  // against a fault that flips many near ties at once.
  for (double margin : agreement.disagreement_margins) CHECK(margin < 0.03);
  CHECK(fraction >= 0.98);
}

// What the cloud counts: hidden-state payload bytes received and sent, and positions computed.
std::array<double, 3> HiddenStateTotals(const CloudProcess& cloud) {
  return {cloud.Metric("tophat_hidden_state_bytes_total", "direction=\"in\""),
          cloud.Metric("tophat_hidden_state_bytes_total", "direction=\"out\""),
          cloud.Metric("tophat_prompt_tokens_total") +
              cloud.Metric("tophat_generation_tokens_total")};
}

TEST_CASE("A compressed wire carries each position in its own bytes both ways, and speculative "
          "decoding stays lossless against the model with that wire",
          "[serving][speculative]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});  // float32
  const int64_t hidden = ReferenceModel().config().hidden_size;
  const int64_t max_new_tokens = 16;
  const std::vector<std::string> sentences = ToyPrompts(41, Repetitions(8, 3));
  for (const std::string wire : {"float16", "int8"}) {
    INFO("wire_dtype " << wire);
    const int64_t row_bytes = wire == "int8" ? hidden + 4 : 2 * hidden;
    AgentProcess spec(dir.path(), cloud, 16, "wire_dtype: " + wire + "\n");
    AgentProcess plain(dir.path(), cloud, 16,
                       "wire_dtype: " + wire + "\nspeculative:\n  enabled: false\n");
    const std::array<double, 3> before = HiddenStateTotals(cloud);
    Agreement agreement;
    for (const std::string& sentence : sentences) {
      const std::vector<int32_t> prompt = Tokenize(sentence);
      auto drafted = spec.client().Generate(IdsRequest(prompt, max_new_tokens));
      auto decoded = plain.client().Generate(IdsRequest(prompt, max_new_tokens));
      REQUIRE(drafted.ok());
      REQUIRE(decoded.ok());
      INFO(drafted->error << decoded->error);
      REQUIRE(drafted->ok());
      REQUIRE(decoded->ok());
      CHECK(drafted->stats.draft_tokens() > 0);
      // Lossless as before, against the model served through this wire: plain decoding
      // through the same wire chooses the same tokens.
      CHECK(Tokens(*drafted) == Tokens(*decoded));
      AddAgreement(prompt, Tokens(*decoded), agreement);
    }
    const std::array<double, 3> after = HiddenStateTotals(cloud);
    const double positions = after[2] - before[2];
    REQUIRE(positions > 0);
    // Every position went up and came back in the wire's bytes (float32 would be 4 x hidden).
    CHECK(after[0] - before[0] == positions * static_cast<double>(row_bytes));
    CHECK(after[1] - before[1] == positions * static_cast<double>(row_bytes));
    // Against the float32 model: only near ties may flip. float16 moves logits by about a
    // thousandth, int8 (1/254 of each position's largest magnitude) by a few hundredths on
    // this model (docs/benchmarks.md); a misdecoded payload flips confident choices.
    std::string margins;
    for (double m : agreement.disagreement_margins) margins += absl::StrFormat(" %.3f", m);
    INFO("agreement " << agreement.agreed << "/" << agreement.tokens << ", margins:" << margins);
    for (double margin : agreement.disagreement_margins) CHECK(margin < 0.25);
    CHECK(agreement.agreed >= agreement.tokens * 95 / 100);
  }
}

TEST_CASE("An agent following the scheduler's wire dtype sends and receives in it",
          "[serving]") {
  testing::TempDir dir;
  // Not adaptive: every device keeps Hello's choice, the narrowest listed (the measured
  // choice is the engine's and the scheduler's unit tests').
  CloudProcess cloud(dir.path(), {.adaptive = false, .wire_dtypes = {"float32", "int8"}});
  const int64_t hidden = ReferenceModel().config().hidden_size;
  AgentProcess following(dir.path(), cloud, 16, "wire_dtype: scheduler\n");
  AgentProcess int8(dir.path(), cloud, 16, "wire_dtype: int8\n");
  for (const std::string& sentence : ToyPrompts(43, 4)) {
    const std::vector<int32_t> prompt = Tokenize(sentence);
    const std::array<double, 3> before = HiddenStateTotals(cloud);
    auto followed = following.client().Generate(IdsRequest(prompt, 12));
    const std::array<double, 3> after = HiddenStateTotals(cloud);
    auto chosen = int8.client().Generate(IdsRequest(prompt, 12));
    REQUIRE(followed.ok());
    REQUIRE(chosen.ok());
    INFO(followed->error << chosen->error);
    REQUIRE(followed->ok());
    REQUIRE(chosen->ok());
    // int8 both ways: hidden + 4 bytes per position (float32 would be 4 x hidden)...
    const double positions = after[2] - before[2];
    REQUIRE(positions > 0);
    CHECK(after[0] - before[0] == positions * static_cast<double>(hidden + 4));
    CHECK(after[1] - before[1] == positions * static_cast<double>(hidden + 4));
    // ...and the model served is the int8 wire's.
    CHECK(Tokens(*followed) == Tokens(*chosen));
  }
}

TEST_CASE("Sampled speculative decoding is reproducible for a seed with or without parallel "
          "drafting and drafting off is plain decoding",
          "[serving][speculative]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  AgentProcess spec(dir.path(), cloud, 32);
  AgentProcess plain(dir.path(), cloud, 32, "speculative:\n  enabled: false\n");
  const std::vector<int32_t> prompt = Tokenize(ToyPrompts(5, 1)[0]);
  v1::GenerateRequest request = IdsRequest(prompt, 24, /*ignore_eos=*/true);
  request.mutable_sampling()->set_temperature(0.8);
  request.mutable_sampling()->set_seed(42);
  auto first = spec.client().Generate(request);
  auto second = spec.client().Generate(request);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE(first->ok());
  CHECK(first->token_ids.size() == 24);
  CHECK(Tokens(*first) == Tokens(*second));
  CHECK(first->stats.draft_tokens() > 0);
  // How far parallel drafting got is timing; it must not show in the tokens of a seed.
  AgentProcess serial(dir.path(), cloud, 32, "speculative:\n  parallel_drafting: false\n");
  for (int run = 0; run < 2; ++run) {
    auto again = serial.client().Generate(request);
    REQUIRE(again.ok());
    REQUIRE(again->ok());
    CHECK(Tokens(*again) == Tokens(*first));
  }
  // Nor whether the next run went to the cloud before its verification (PipeInfer).
  // A run goes ahead when its branch is drafted before the answer returns, and only while
  // enough best branches are kept. Under ASan on a busy machine none went ahead in 3 runs
  // over bare loopback once, so the link is made slow (a 100 ms round trip, against the
  // milliseconds a branch of the toy drafter takes even under ASan) and the keep rate is
  // not consulted: every round has a branch ready in time and sends it.
  AgentProcess pipelined(dir.path(), cloud, 32,
                         "speculative:\n  max_runs_in_flight: 2\n  ahead_min_keep_rate: 0\n"
                         "link_emulation:\n  one_way_delay_s: 0.05\n");
  int64_t runs_sent = 0;
  for (int run = 0; run < 3; ++run) {
    auto again = pipelined.client().Generate(request);
    REQUIRE(again.ok());
    REQUIRE(again->ok());
    CHECK(Tokens(*again) == Tokens(*first));
    runs_sent += again->stats.ahead_runs_sent();
  }
  INFO("runs sent ahead " << runs_sent);
  CHECK(runs_sent > 0);

  auto baseline = plain.client().Generate(IdsRequest(prompt, 24));
  REQUIRE(baseline.ok());
  REQUIRE(baseline->ok());
  CHECK(Tokens(*baseline) == Reference(prompt, 24, /*stop_at_eos=*/true));
  CHECK(baseline->stats.draft_tokens() == 0);
  CHECK(baseline->stats.decode_rounds() + 1 == baseline->stats.generated_tokens());
  CHECK(plain.Metric("tophat_spec_decode_num_drafts_total") == 0);
}

// A prompt of at least `tokens` tokens made of the toy grammar's sentences from `first` on.
std::vector<int32_t> PromptOf(const std::vector<std::string>& sentences, size_t first,
                              size_t tokens) {
  std::string text;
  std::vector<int32_t> ids;
  for (size_t j = first; ids.size() < tokens; ++j) {
    text += sentences[j % sentences.size()] + " ";
    ids = Tokenize(text);
  }
  return ids;
}

// The emulated link of the link and λ tests, and the agent's chunk size that gives its
// estimator evidence both ways (see the link test).
constexpr const char* kEmulatedLink =
    "link_emulation:\n  one_way_delay_s: 0.01\n"
    "  uplink_bytes_per_second: 5e5\n  downlink_bytes_per_second: 1e6\n";
constexpr int64_t kMeasuredChunk = 256;

// Sends `requests` prompts of about 700 tokens, then waits for a DeviceState report made
// after all of them (reports go out at most once a second, from decode rounds): the gauges
// read afterwards are that report's, not the first non-zero values some early report set.
void MeasureLink(AgentProcess& agent, int requests) {
  const std::vector<std::string> sentences = ToyPrompts(31, 200);
  for (int i = 0; i < requests; ++i) {
    auto result = agent.client().Generate(
        IdsRequest(PromptOf(sentences, 11 * static_cast<size_t>(i), 700), 16));
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
  }
  const double reports = agent.Metric("tophat_device_state_reports_total");
  REQUIRE(reports >= 0);
  REQUIRE(testing::WaitUntil(
      [&] {
        auto result = agent.client().Generate(IdsRequest(PromptOf(sentences, 5, 8), 16));
        return result.ok() && result->ok() &&
               agent.Metric("tophat_device_state_reports_total") > reports;
      },
      30s));
}

TEST_CASE("An agent measures its emulated link and drafter speed from real transfers",
          "[serving][speculative][timing]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.max_batch_tokens = 64,
                                  .compute_threads = kOneComputeThread});
  // 10 ms each way, 0.5 MB/s up and 1 MB/s down. Each direction is measured by the
  // dispersion of runs of messages queued behind each other on it
  // (device_agent/link_estimator.h):
  //  - up: the agent sends a prompt's 256-position chunks (196 KB, 393 ms on the wire) as
  //    fast as it computes them (a few ms each), so a 700-token prompt's second and third
  //    chunks are a run of two queued messages over about 640 ms;
  //  - down: the cloud computes a 256-position chunk in four 64-token steps
  //    (max_batch_tokens, ~5 ms each) and sends each step's result (49 KB, 49 ms on the
  //    wire) as soon as the step ends, faster than the link drains them, so a chunk's
  //    results are a run of two or three queued messages over 100-147 ms.
  // A run's estimate is off by the lateness of the stamps at its two ends over its span.
  // Those stamps are taken by threads woken at the arrival (the emulator's, the cloud's
  // reactor). With the other core busy, the arrival gaps of queued messages were off their
  // crossing time by at most 20 ms (p99 7 ms down, 15 ms up; 20 runs). The estimate is the
  // bytes over the summed spans, so it is off by at most that lateness over the mean span:
  // 20/640 = 3% up, 20/130 = 15% down. Hence ±5% up and ±15% down.
  //
  // Passed 50 of 50 with the other core busy, from the build directory's parent:
  //   yes > /dev/null & for i in $(seq 50); do build/release/tests/tophat_serving_test
  //     "An agent measures its emulated link and drafter speed from real transfers"
  //     > /tmp/link-$i.log 2>&1 || echo "run $i failed"; done; kill %1
  // (one shell line; `yes` keeps one of the machine's two cores busy).
  // Decode rounds (a few KB, ~30 ms apart) once passed for queued pairs when read a few ms
  // late, and read up to 6% low: 2 runs in 18 on an idle machine, and once in CI. Since
  // (device_agent/link_estimator_test.cc, "Decode rounds a few milliseconds late"), 35 runs,
  // 15 of them with the other core busy, were within 0.4% up and 0.5% down.
  AgentProcess agent(dir.path(), cloud, kMeasuredChunk, kEmulatedLink, kOneComputeThread);
  MeasureLink(agent, 6);
  const double up = agent.Metric("tophat_link_bytes_per_second", "direction=\"up\"");
  const double down = agent.Metric("tophat_link_bytes_per_second", "direction=\"down\"");
  INFO("estimated " << up << " B/s up (emulated 5e5), " << down << " B/s down (emulated 1e6)");
  CHECK(up > 0.95 * 5e5);
  CHECK(up < 1.05 * 5e5);
  CHECK(down > 0.85 * 1e6);
  CHECK(down < 1.15 * 1e6);
  CHECK(agent.Metric("tophat_draft_step_seconds") > 0);

  // The per-request trace shows the prompt's chunks overlapping: chunk j+1 leaves before
  // chunk j's result is back, and each trip spends the emulated link's time on the wire.
  const std::vector<std::string> sentences = ToyPrompts(31, 40);
  std::string text;
  for (size_t j = 0; j < 20; ++j) text += sentences[j] + " ";
  v1::GenerateRequest request = IdsRequest(Tokenize(text), 4);
  request.set_prompt_chunk_size(16);
  request.set_trace(true);
  auto traced = agent.client().Generate(request);
  REQUIRE(traced.ok());
  REQUIRE(traced->ok());
  const auto& chunks = traced->stats.chunks();
  REQUIRE(chunks.size() >= 3);
  // Overlap is counted, not required of every pair: on a loaded 2-core CI machine one
  // chunk's input-submodel pass can outlast the link's round trip.
  int overlapped = 0;
  for (int j = 0; j < chunks.size(); ++j) {
    INFO("chunk " << j << " sent at " << chunks[j].sent_at() << " result at "
                  << chunks[j].result_at() << " network " << chunks[j].network_seconds());
    CHECK(chunks[j].positions() <= 16);
    CHECK(chunks[j].device_seconds() > 0);
    CHECK(chunks[j].result_at() > chunks[j].sent_at());
    CHECK(chunks[j].network_seconds() > 0.02);  // 10 ms each way plus the bytes
    if (j + 1 < chunks.size() && chunks[j + 1].sent_at() < chunks[j].result_at()) ++overlapped;
  }
  CHECK(2 * overlapped >= static_cast<int>(chunks.size()) - 1);
}

TEST_CASE("An agent drafts ahead as far as the cloud's λ once the cloud has computed it",
          "[serving][speculative][scheduler][timing]") {
  testing::TempDir dir;
  // Equation 6 needs γ and both link directions; the agent measures them on the link test's
  // link. The cloud caps λ at 1 and the agent's own parallel_steps is 3, so each round's
  // trace shows whose λ it drafted ahead with.
  CloudProcess cloud(dir.path(), {.max_batch_tokens = 64, .max_draft_steps = 1,
                                  .compute_threads = kOneComputeThread});
  AgentProcess agent(dir.path(), cloud, kMeasuredChunk,
                     std::string(kEmulatedLink) + "speculative:\n  parallel_steps: 3\n",
                     kOneComputeThread);
  const std::vector<std::string> sentences = ToyPrompts(37, 40);
  const auto lambdas = [&](size_t first) {
    v1::GenerateRequest request = IdsRequest(PromptOf(sentences, first, 12), 24, true);
    request.set_trace(true);
    auto result = agent.client().Generate(request);
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    std::set<uint32_t> seen;
    for (const v1::DecodeRound& round : result->stats.rounds()) seen.insert(round.parallel_steps());
    return seen;
  };
  // Short prompts queue nothing on the link, so the cloud cannot compute λ: the agent keeps
  // its own.
  CHECK(lambdas(0) == std::set<uint32_t>{3});
  MeasureLink(agent, 4);
  REQUIRE(agent.Metric("tophat_link_bytes_per_second", "direction=\"down\"") > 0);
  // The cloud answers that report with its λ; requests that start after it arrived use it.
  std::set<uint32_t> seen;
  CHECK(testing::WaitUntil(
      [&] {
        seen = lambdas(3);
        return seen.size() == 1 && *seen.begin() <= 1;
      },
      30s));
  INFO("λ in the rounds of the last request: " << *seen.begin());
  CHECK(cloud.Metric("tophat_scheduler_draft_steps_count") > 0);
}

// The draft limits of the traced rounds of `requests` greedy requests of 64 tokens, leaving
// out each request's first round (the window is decided after it) and rounds with less room
// than `max_drafts` (where the room, not the window, is the limit).
std::vector<uint32_t> DraftLimits(AgentProcess& agent, int requests, int64_t max_drafts) {
  const std::vector<std::string> sentences = ToyPrompts(41, 40);
  std::vector<uint32_t> limits;
  for (int i = 0; i < requests; ++i) {
    const std::vector<int32_t> prompt = PromptOf(sentences, 3 * static_cast<size_t>(i), 16);
    const int64_t max_new_tokens = 64;
    v1::GenerateRequest request = IdsRequest(prompt, max_new_tokens, /*ignore_eos=*/true);
    request.set_trace(true);
    auto result = agent.client().Generate(request);
    REQUIRE(result.ok());
    INFO(result->error);
    REQUIRE(result->ok());
    const auto& rounds = result->stats.rounds();
    for (int r = 1; r < rounds.size(); ++r) {
      // Tokens generated before the round: its first row is the last of them.
      const int64_t generated = rounds[r].start() - static_cast<int64_t>(prompt.size()) + 1;
      if (max_new_tokens - generated - 1 < max_drafts) continue;
      CHECK(rounds[r].drafted() <= rounds[r].draft_limit());
      limits.push_back(rounds[r].draft_limit());
    }
  }
  return limits;
}

TEST_CASE("The adaptive draft window opens on a long link and narrows on a short one",
          "[serving][speculative][timing]") {
  testing::TempDir dir;
  // DSD's window maximises tokens per second, (1 - a^(w+1)) / (1 - a) tokens per w draft
  // steps plus a round trip. η = 0.01 lets the drafter go on past the tokens it is unsure
  // of, so that fewer drafts are kept (a lower a) and a longer window costs something. With
  // a 100 ms round trip a draft step (about a millisecond) is still cheap and the window
  // opens wide; on loopback a round costs a few draft steps and it stays short. The daemons
  // run with one compute thread (kOneComputeThread): spinning pools would stretch the cloud's step,
  // and with it the loopback round, tenfold.
  CloudProcess cloud(dir.path(), {.compute_threads = kOneComputeThread});
  const std::string adaptive =
      "speculative:\n  max_draft_tokens: 12\n  adaptive_window: true\n  eta: 0.01\n";
  AgentProcess near(dir.path(), cloud, 32, adaptive, kOneComputeThread);
  AgentProcess far(dir.path(), cloud, 32,
                   adaptive + "link_emulation:\n  one_way_delay_s: 0.05\n",
                   kOneComputeThread);
  const std::vector<uint32_t> near_limits = DraftLimits(near, 3, 12);
  const std::vector<uint32_t> far_limits = DraftLimits(far, 3, 12);
  const auto mean = [](const std::vector<uint32_t>& v) {
    double sum = 0;
    for (uint32_t x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  const auto acceptance = [](AgentProcess& agent) {
    const double drafted = agent.Metric("tophat_spec_decode_num_draft_tokens_total");
    return drafted > 0 ? agent.Metric("tophat_spec_decode_num_accepted_tokens_total") / drafted
                       : 0.0;
  };
  INFO("mean draft window: near " << mean(near_limits) << " over " << near_limits.size()
                                  << " rounds, far " << mean(far_limits) << " over "
                                  << far_limits.size() << "; drafts kept: near "
                                  << acceptance(near) << ", far " << acceptance(far)
                                  << "; draft step s: near "
                                  << near.Metric("tophat_draft_step_seconds") << ", far "
                                  << far.Metric("tophat_draft_step_seconds") << "; far windows: "
                                  << absl::StrJoin(far_limits, " "));
  REQUIRE(near_limits.size() >= 5);
  REQUIRE(far_limits.size() >= 5);
  // Measured with the 900-step toy model (generator 3), whose drafts are kept 0.77-0.83 of
  // the time: the far window sits at the cap of 12 (11.86-11.92), the near one at 10.1 on an
  // idle machine and up to 10.9 on a loaded one, whose slower loopback rounds justify longer
  // windows. So the far window must be wider by half a draft on average over the rounds (a
  // window that did not adapt would be the same on both links), and the near one clear of
  // the cap.
  CHECK(mean(far_limits) > mean(near_limits) + 0.5);
  CHECK(mean(near_limits) < 11.5);
  // The gauge shows the window decided last (0, its initial value, if none was).
  CHECK(near.Metric("tophat_spec_decode_draft_window") >= 1);
  CHECK(far.Metric("tophat_spec_decode_draft_window") >= 1);
}

TEST_CASE("A stricter η drafts fewer tokens and decodes the same ones", "[serving][speculative]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // Without drafting ahead a round's drafts depend only on the drafter's confidence.
  const std::string serial = "speculative:\n  parallel_drafting: false\n";
  AgentProcess loose(dir.path(), cloud, 32, serial + "  eta: 0.3\n");
  AgentProcess strict(dir.path(), cloud, 32, serial + "  eta: 0.95\n");
  const std::vector<std::string> sentences = ToyPrompts(43, 40);
  int64_t loose_drafts = 0;
  int64_t strict_drafts = 0;
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<int32_t> prompt = PromptOf(sentences, 3 * i, 16);
    auto a = loose.client().Generate(IdsRequest(prompt, 48, /*ignore_eos=*/true));
    auto b = strict.client().Generate(IdsRequest(prompt, 48, /*ignore_eos=*/true));
    REQUIRE(a.ok());
    REQUIRE(a->ok());
    REQUIRE(b.ok());
    REQUIRE(b->ok());
    CHECK(Tokens(*a) == Tokens(*b));
    loose_drafts += a->stats.draft_tokens();
    strict_drafts += b->stats.draft_tokens();
  }
  INFO("drafts at eta 0.3: " << loose_drafts << ", at eta 0.95: " << strict_drafts);
  CHECK(strict_drafts < loose_drafts);
}

// The toy model's outline template, as configs/agent.yaml has it.
constexpr const char* kToyOutline =
    "outline:\n  directive: \" outline :\"\n"
    "  labels: [one, two, three, four, five, six, seven, eight, nine, ten]\n"
    "  expand: \" point {label} {point} :\"\n  stop: \" .\"\n";

TEST_CASE("An outline request expands its points as parallel requests and streams them in "
          "point order",
          "[serving][outline][staged]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // The points fork the outline's session: kept by the conversation cache, forked on the cloud.
  AgentProcess agent(dir.path(), cloud, 0,
                     std::string(kToyOutline) + "conversation_cache:\n  enabled: true\n");
  // Every point computing the whole prefix again: the answers must be the same.
  AgentProcess unshared(dir.path(), cloud, 0, kToyOutline);
  {
    // An outline's tokens come from several requests and a directive: no log-probabilities.
    v1::GenerateRequest request;
    request.set_prompt("the cat");
    request.mutable_outline()->set_enabled(true);
    request.set_logprobs(true);
    auto refused = agent.client().Generate(request);
    REQUIRE(refused.ok());
    CHECK(refused->finish_reason == v1::FINISH_REASON_ERROR);
    CHECK_THAT(refused->error, Catch::Contains("logprobs: not with an outline"));
  }
  int outlined = 0;
  int points = 0;
  for (const std::string& prompt : ToyOutlinePrompts(41, 4)) {
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.set_max_new_tokens(40);
    request.mutable_outline()->set_enabled(true);
    std::string streamed;
    auto result = agent.client().Generate(
        request, [&](const v1::GenerateResponse& update) { streamed += update.text(); });
    REQUIRE(result.ok());
    std::string recomputed;
    auto again = unshared.client().Generate(
        request, [&](const v1::GenerateResponse& update) { recomputed += update.text(); });
    REQUIRE(again.ok());
    CHECK(recomputed == streamed);  // forking the prefix changes nothing of the answer
    INFO(prompt << " -> " << streamed << " (" << result->error << ")");
    REQUIRE(result->ok());
    const v1::RequestStats& stats = result->stats;
    if (stats.outline_fallback()) continue;  // the model wrote no outline: see the next case
    ++outlined;
    REQUIRE(stats.outline_points() >= 2);
    // The answer: the outline, then each point's marker in the outline's order, each
    // followed by its expansion, in one stream.
    const std::vector<std::string> labels = {"one", "two", "three", "four", "five",
                                             "six", "seven", "eight", "nine", "ten"};
    const size_t outline_end = streamed.find(" .");
    REQUIRE(outline_end != std::string::npos);
    size_t at = outline_end;
    for (uint32_t i = 0; i < stats.outline_points(); ++i) {
      const size_t marker = streamed.find(" point " + labels[i] + " ", at);
      CHECK(marker != std::string::npos);
      if (marker == std::string::npos) break;
      at = marker + 1;
    }
    CHECK(streamed.find(" point " + labels[stats.outline_points()] + " ") ==
          std::string::npos);
    CHECK(stats.prompt_tokens() > 0);
    CHECK(stats.generated_tokens() > stats.outline_points());
    CHECK(stats.time_to_first_token_seconds() > 0);
    points += static_cast<int>(stats.outline_points());
  }
  CHECK(outlined >= 2);
  // Each point ran as a request of its own: the cloud admitted the outline and every point,
  // and the sharing agent's points forked the outline's parked session, reusing its prefix.
  CHECK(cloud.Metric("tophat_sessions_admitted_total") >= 3 * outlined);
  CHECK(cloud.Metric("tophat_parked_sessions_forked_total") >= points);
  CHECK(agent.Metric("tophat_prompt_positions_reused_total") > 0);
  CHECK(unshared.Metric("tophat_prompt_positions_reused_total") == 0);
}

TEST_CASE("An outline that does not parse falls back to sequential decoding, and an agent "
          "without a template refuses by key",
          "[serving][outline]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {});
  // Labels the model never writes: no outline parses.
  AgentProcess agent(dir.path(), cloud, 0,
                     "outline:\n  directive: \" outline :\"\n  labels: [alpha, beta]\n"
                     "  expand: \" point {label} {point} :\"\n  stop: \" .\"\n");
  v1::GenerateRequest request;
  request.set_prompt(ToyOutlinePrompts(43, 1).front());
  request.set_max_new_tokens(24);
  auto sequential = agent.client().Generate(request);
  request.mutable_outline()->set_enabled(true);
  auto fallback = agent.client().Generate(request);
  REQUIRE(sequential.ok());
  REQUIRE(sequential->ok());
  REQUIRE(fallback.ok());
  INFO(fallback->error);
  REQUIRE(fallback->ok());
  CHECK(fallback->stats.outline_fallback());
  CHECK(fallback->stats.outline_points() == 0);
  CHECK(Tokens(*fallback) == Tokens(*sequential));  // greedy: the same answer

  AgentProcess plain(dir.path(), cloud, 0);
  auto refused = plain.client().Generate(request);
  REQUIRE(refused.ok());
  CHECK_FALSE(refused->ok());
  CHECK_THAT(refused->error, Catch::Contains("FAILED_PRECONDITION") &&
                                 Catch::Contains("outline.directive"));
}

TEST_CASE("With prompt_chunk_plan jupiter an agent plans its prompts once every stage is timed, "
          "and answers as with equal chunks",
          "[serving][scheduler]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.min_prompt_chunk_size = 4,
                                  .compute_threads = kOneComputeThread});
  AgentProcess agent(dir.path(), cloud, 0,
                     std::string(kEmulatedLink) + "prompt_chunk_plan: jupiter\n",
                     kOneComputeThread);
  const std::vector<std::string> sentences = ToyPrompts(31, 200);
  const auto plans = [&](const char* plan) {
    return agent.Metric("tophat_prompt_chunk_plans_total", std::string("plan=\"") + plan + "\"");
  };
  // The first prompts go in equal chunks: no stage is timed and no link measured yet. Their
  // chunks queue on the emulated link, which measures it.
  size_t next = 0;
  REQUIRE(testing::WaitUntil(
      [&] {
        auto r = agent.client().Generate(IdsRequest(PromptOf(sentences, 7 * next++, 300), 4));
        return r.ok() && r->ok() && plans("jupiter") > 0;
      },
      90s));
  CHECK(plans("equal_unmeasured") > 0);

  // A planned prompt and the same prompt in equal chunks (the request's own size, which is
  // never planned): the same greedy tokens, and the plan covers the prompt exactly once.
  const std::vector<int32_t> prompt = PromptOf(sentences, 3, 500);
  v1::GenerateRequest request = IdsRequest(prompt, 12);
  request.set_trace(true);
  const double planned_before = plans("jupiter");
  auto planned = agent.client().Generate(request);
  request.set_prompt_chunk_size(16);
  auto equal = agent.client().Generate(request);
  REQUIRE(planned.ok());
  REQUIRE(planned->ok());
  REQUIRE(equal.ok());
  REQUIRE(equal->ok());
  CHECK(plans("jupiter") == planned_before + 1);
  CHECK(Tokens(*planned) == Tokens(*equal));
  std::string lengths;
  int64_t covered = 0;
  for (const v1::ChunkTrace& chunk : planned->stats.chunks()) {
    if (chunk.first_position() >= prompt.size()) continue;  // decode rounds
    CHECK(chunk.first_position() == covered);
    covered += chunk.positions();
    lengths += absl::StrCat(chunk.positions(), " ");
  }
  INFO("planned chunks: " << lengths);
  CHECK(covered == static_cast<int64_t>(prompt.size()));
}

TEST_CASE("Of two shaped links the slower gets smaller prompt chunks and chunking cuts its TTFT",
          "[serving][scheduler][timing]") {
  testing::TempDir dir;
  CloudProcess cloud(dir.path(), {.min_prompt_chunk_size = 4,
                                  .compute_threads = kOneComputeThread});
  // Both take the cloud's per-device chunk size (--prompt-chunk-size 0). 300 KB/s puts 2.6 ms
  // per position on the wire each way, far more than a cloud step spends on it; 3 MB/s puts
  // 0.26 ms. The cloud knows a link only once the agent has measured it, by the dispersion of
  // chunks queued on it: the agent must compute chunks faster than they cross, which it does
  // at 3 MB/s (not at 20 MB/s: a faster link stays unknown and gets the default chunk).
  const auto link = [](const char* bytes_per_second) {
    return std::string("link_emulation:\n  one_way_delay_s: 0.002\n  uplink_bytes_per_second: ") +
           bytes_per_second + "\n  downlink_bytes_per_second: " + bytes_per_second + "\n";
  };
  AgentProcess slow(dir.path(), cloud, 0, link("3e5"), kOneComputeThread);
  AgentProcess fast(dir.path(), cloud, 0, link("3e6"), kOneComputeThread);
  const std::vector<std::string> sentences = ToyPrompts(31, 40);
  std::string long_text;
  for (size_t j = 0; j < 40; ++j) long_text += sentences[j] + " ";
  const std::vector<int32_t> long_prompt = Tokenize(long_text);
  REQUIRE(long_prompt.size() > 150);

  // Requests teach each agent its link; its reports (at most one a second) let the cloud
  // size its chunks.
  uint32_t slow_chunk = 0;
  uint32_t fast_chunk = 0;
  REQUIRE(testing::WaitUntil(
      [&] {
        // Several chunks each, so that they queue behind each other.
        auto a = slow.client().Generate(IdsRequest(PromptOf(sentences, 0, 64), 12));
        auto b = fast.client().Generate(IdsRequest(PromptOf(sentences, 2, 64), 12));
        if (!a.ok() || !a->ok() || !b.ok() || !b->ok()) return false;
        slow_chunk = a->stats.prompt_chunk_size();
        fast_chunk = b->stats.prompt_chunk_size();
        // Both computed from measured uplinks, not one of them the default (16).
        return slow_chunk < fast_chunk && fast_chunk != 16 &&
               slow.Metric("tophat_link_bytes_per_second", "direction=\"up\"") > 0 &&
               fast.Metric("tophat_link_bytes_per_second", "direction=\"up\"") > 0;
      },
      60s));
  INFO("slow link: chunks of " << slow_chunk << ", fast link: chunks of " << fast_chunk);
  CHECK(slow_chunk < fast_chunk);
  CHECK(cloud.Metric("tophat_scheduler_chunk_size_count") > 0);
  // The step-time curve the cloud learned, as a simulation of it reads it: one-token decode
  // steps (bucket 1 holds only steps of exactly 1 token) and prompt chunks' larger steps.
  CHECK(testing::WaitUntil(
      [&] { return cloud.Metric("tophat_scheduler_step_curve_tokens", "bucket=\"1\"") == 1; },
      5s));
  CHECK(cloud.Metric("tophat_scheduler_step_curve_seconds", "bucket=\"1\"") > 0);
  CHECK((cloud.Metric("tophat_scheduler_step_curve_seconds", "bucket=\"16\"") > 0 ||
         cloud.Metric("tophat_scheduler_step_curve_seconds", "bucket=\"32\"") > 0 ||
         cloud.Metric("tophat_scheduler_step_curve_seconds", "bucket=\"64\"") > 0));

  // Same device, same prompt, same run: the cloud's chunks against the whole prompt at once
  // (the request overrides the chunk size). Best of two each, against scheduling noise.
  double chunked = 1e9;
  double whole = 1e9;
  for (int attempt = 0; attempt < 2; ++attempt) {
    v1::GenerateRequest request = IdsRequest(long_prompt, 2);
    auto a = slow.client().Generate(request);
    request.set_prompt_chunk_size(1024);
    auto b = slow.client().Generate(request);
    REQUIRE(a.ok());
    REQUIRE(a->ok());
    REQUIRE(b.ok());
    REQUIRE(b->ok());
    CHECK(Tokens(*a) == Tokens(*b));
    CHECK(a->stats.prompt_chunk_size() < long_prompt.size());
    CHECK(b->stats.prompt_chunk_size() == 1024);
    chunked = std::min(chunked, a->time_to_first_token_seconds());
    whole = std::min(whole, b->time_to_first_token_seconds());
  }
  INFO("TTFT of a " << long_prompt.size() << "-token prompt on the slow link: chunked "
                    << chunked * 1e3 << " ms, whole " << whole * 1e3 << " ms");
  CHECK(chunked < 0.8 * whole);
}

}  // namespace
}  // namespace tophat
