// tophat-bench-transport: hidden-state throughput of one agent stream over loopback gRPC
// (issue 3: "at least 1 GB/s per stream with 4 KB/token payloads").
//
// Runs the real CloudService (callback reactors) over a real Engine in this process. The
// engine's middle submodel has no layers (hidden size 1024, float32: 4 KiB per position), so
// its forward returns the input and only advances the caches: what is measured is the
// transport plus the engine's bookkeeping. The client is a plain CloudService stub on
// loopback TCP that keeps a window of chunks in flight, with a reader thread for results.
#include <sys/resource.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/hidden_states.h"
#include "absl/strings/str_format.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "bench/machine_bounds.h"
#include "models/runtime/model_init.h"
#include "base/status_macros.h"
#include "models/runtime/submodel.h"
#include "bench/bench_util.h"
#include "server/cloud_service.h"
#include "server/engine.h"
#include "tophat/v1/cloud.grpc.pb.h"
#include "base/program.h"

using tophat::Fail;

namespace tophat {
namespace {

using bench::BenchClock;
using bench::Median;
using bench::SecondsBetween;

struct Args {
  std::vector<int64_t> tokens = {1, 16, 64, 256};
  int window = 4;
  double seconds = 0.5;      // of sending per repetition
  double ref_seconds = 0.1;  // of memcpy per repetition
  int repetitions = 3;
  int64_t hidden_size = 1024;
  int64_t max_context = 65536;  // positions per session before the client opens a new one
  double goal_gb_s = 1.0;
  std::string json_path;
};

constexpr int kMaxMessageBytes = 64 << 20;

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// A one-layer checkpoint whose layer the cloud never loads: only the config matters.
ModelConfig TransportConfig(const Args& args) {
  ModelConfig c = TinyTestConfig();
  c.hidden_size = args.hidden_size;
  c.head_dim = 64;
  c.num_attention_heads = args.hidden_size / 64;
  c.num_key_value_heads = c.num_attention_heads;
  c.intermediate_size = 256;
  c.num_hidden_layers = 1;
  c.max_position_embeddings = args.max_context;
  return c;
}

// What the reader thread shares with the writer (the main thread).
struct Flow {
  std::mutex mutex;
  std::condition_variable changed;
  int64_t inflight = 0;                   // chunks sent whose last result has not arrived
  std::map<uint64_t, int64_t> outstanding;  // the same, per session
  int64_t results_bytes = 0;              // payload bytes received since the last reset
  int64_t chunks_done = 0;
  BenchClock::time_point last_result;
  std::string error;
  bool ended = false;
};

void ReadResults(grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>* stream,
                 Flow* flow) {
  v1::CloudMessage message;
  while (stream->Read(&message)) {
    switch (message.kind_case()) {
      case v1::CloudMessage::kResult: {
        const v1::ForwardResult& result = message.result();
        std::lock_guard<std::mutex> lock(flow->mutex);
        flow->results_bytes += static_cast<int64_t>(result.states().data().size());
        if (result.chunk_done()) {
          --flow->inflight;
          --flow->outstanding[result.session_id()];
          ++flow->chunks_done;
          flow->last_result = BenchClock::now();
          flow->changed.notify_all();
        }
        break;
      }
      case v1::CloudMessage::kError: {
        std::lock_guard<std::mutex> lock(flow->mutex);
        flow->error = absl::StrCat("session ", message.error().session_id(), ": ",
                                   message.error().message());
        flow->changed.notify_all();
        break;
      }
      case v1::CloudMessage::kHello:
      case v1::CloudMessage::kReceived:
      case v1::CloudMessage::kAdmitted:
      case v1::CloudMessage::kTruncated:
      case v1::CloudMessage::kControl:
      case v1::CloudMessage::kLoad:
      case v1::CloudMessage::KIND_NOT_SET:
        break;
    }
  }
  std::lock_guard<std::mutex> lock(flow->mutex);
  flow->ended = true;
  flow->changed.notify_all();
}

struct Sample {
  double up_gb_s = 0;
  double down_gb_s = 0;
  double combined_gb_s = 0;
  double chunks_per_s = 0;
  double cpu_cores = 0;  // process CPU seconds per wall second while it ran (client + server)
  double memcpy_gb_s = 0;
};

// The writer side of one stream: sessions, positions, the window.
class Client {
 public:
  Client(grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>* stream, Flow* flow,
         int64_t session_positions, int64_t hidden_size)
      : stream_(stream),
        flow_(flow),
        session_positions_(session_positions),
        hidden_size_(hidden_size) {}

  absl::Status Start() { return OpenNext(); }

  // Sends chunks of `tokens` positions for `seconds` (and at least 2 * window of them)
  // with at most `window` in flight, then waits for every result.
  absl::StatusOr<Sample> Measure(int64_t tokens, int window, double seconds) {
    const int64_t bytes = tokens * hidden_size_ * 4;
    std::string payload(static_cast<size_t>(bytes), '\0');
    std::mt19937 rng(static_cast<uint32_t>(tokens));
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < bytes / 4; ++i) {
      const float v = normal(rng);
      std::memcpy(payload.data() + 4 * i, &v, 4);
    }
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_phase(tokens == 1 ? v1::PHASE_DECODE : v1::PHASE_PREFILL);
    chunk->mutable_states()->set_dtype(v1::DTYPE_FLOAT32);
    chunk->mutable_states()->set_num_positions(static_cast<uint32_t>(tokens));
    chunk->mutable_states()->set_hidden_size(static_cast<uint32_t>(hidden_size_));
    *chunk->mutable_states()->mutable_data() = std::move(payload);
    {
      std::lock_guard<std::mutex> lock(flow_->mutex);
      flow_->results_bytes = 0;
      flow_->chunks_done = 0;
    }

    const double cpu0 = CpuSeconds();
    const BenchClock::time_point start = BenchClock::now();
    const BenchClock::time_point deadline =
        start + std::chrono::duration_cast<BenchClock::duration>(
                    std::chrono::duration<double>(seconds));
    int64_t sent = 0;
    while (BenchClock::now() < deadline || sent < 2 * window) {
      if (position_ + tokens > session_positions_) TOPHAT_RETURN_IF_ERROR(OpenNext());
      TOPHAT_RETURN_IF_ERROR(CloseRetired());
      {
        std::unique_lock<std::mutex> lock(flow_->mutex);
        flow_->changed.wait(lock, [&] {
          return flow_->inflight < window || !flow_->error.empty() || flow_->ended;
        });
        if (!flow_->error.empty()) return absl::InternalError(flow_->error);
        if (flow_->ended) return absl::UnavailableError("the stream ended");
        ++flow_->inflight;
        ++flow_->outstanding[session_];
      }
      chunk->set_session_id(session_);
      chunk->set_sequence_number(next_sequence_++);
      chunk->set_first_position(static_cast<uint32_t>(position_));
      if (!stream_->Write(message)) return absl::UnavailableError("write failed");
      position_ += tokens;
      ++sent;
    }
    const BenchClock::time_point last_write = BenchClock::now();
    Sample sample;
    BenchClock::time_point end;
    int64_t received = 0;
    {
      std::unique_lock<std::mutex> lock(flow_->mutex);
      flow_->changed.wait(lock, [&] {
        return flow_->inflight == 0 || !flow_->error.empty() || flow_->ended;
      });
      if (!flow_->error.empty()) return absl::InternalError(flow_->error);
      if (flow_->inflight != 0) return absl::UnavailableError("the stream ended");
      end = flow_->last_result;
      received = flow_->results_bytes;
    }
    const double cpu1 = CpuSeconds();
    const double sent_bytes = static_cast<double>(sent * bytes);
    const double total_s = SecondsBetween(start, end);
    sample.up_gb_s = sent_bytes / SecondsBetween(start, last_write) / 1e9;
    sample.down_gb_s = static_cast<double>(received) / total_s / 1e9;
    sample.combined_gb_s = (sent_bytes + static_cast<double>(received)) / total_s / 1e9;
    sample.chunks_per_s = static_cast<double>(sent) / total_s;
    sample.cpu_cores = (cpu1 - cpu0) / SecondsBetween(start, BenchClock::now());
    if (received != sent * bytes) {
      return absl::InternalError(absl::StrCat("sent ", sent * bytes, " payload bytes, got ",
                                              received, " back"));
    }
    return sample;
  }

  absl::Status Close() {
    retiring_.push_back(session_);
    for (uint64_t id : retiring_) TOPHAT_RETURN_IF_ERROR(SendClose(id));
    retiring_.clear();
    return absl::OkStatus();
  }

 private:
  // A new session once the current one is full; the old one is closed when its results are
  // all in (closing earlier would drop its queued chunks).
  absl::Status OpenNext() {
    if (session_ != 0) retiring_.push_back(session_);
    session_ = next_session_++;
    position_ = 0;
    v1::AgentMessage open;
    open.mutable_open()->set_session_id(session_);
    open.mutable_open()->set_max_positions(static_cast<uint32_t>(session_positions_));
    if (!stream_->Write(open)) return absl::UnavailableError("write failed");
    return absl::OkStatus();
  }

  absl::Status CloseRetired() {
    if (retiring_.empty()) return absl::OkStatus();
    std::vector<uint64_t> done;
    {
      std::lock_guard<std::mutex> lock(flow_->mutex);
      for (uint64_t id : retiring_) {
        if (flow_->outstanding[id] == 0) done.push_back(id);
      }
      for (uint64_t id : done) flow_->outstanding.erase(id);
    }
    for (uint64_t id : done) {
      TOPHAT_RETURN_IF_ERROR(SendClose(id));
      std::erase(retiring_, id);
    }
    return absl::OkStatus();
  }

  absl::Status SendClose(uint64_t id) {
    v1::AgentMessage close;
    close.mutable_close()->set_session_id(id);
    if (!stream_->Write(close)) return absl::UnavailableError("write failed");
    return absl::OkStatus();
  }

  grpc::ClientReaderWriter<v1::AgentMessage, v1::CloudMessage>* stream_;
  Flow* flow_;
  const int64_t session_positions_;
  const int64_t hidden_size_;
  uint64_t session_ = 0;
  uint64_t next_session_ = 1;
  uint64_t next_sequence_ = 1;
  int64_t position_ = 0;
  std::vector<uint64_t> retiring_;
};

// Same-run reference: memcpy of one chunk's payload, back to back, for `seconds`.
double MemcpyGbPerS(int64_t bytes, double seconds) {
  std::vector<char> src(static_cast<size_t>(bytes), 1);
  std::vector<char> dst(static_cast<size_t>(bytes), 0);
  int64_t copied = 0;
  const BenchClock::time_point start = BenchClock::now();
  BenchClock::time_point now = start;
  const double target = seconds;
  while (SecondsBetween(start, now) < target) {
    for (int i = 0; i < 64; ++i) {
      std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
      asm volatile("" : : "r"(dst.data()) : "memory");
    }
    copied += 64 * bytes;
    now = BenchClock::now();
  }
  return static_cast<double>(copied) / SecondsBetween(start, now) / 1e9;
}

struct TokensResult {
  int64_t tokens = 0;
  int64_t chunk_bytes = 0;
  Sample median;
  std::vector<Sample> samples;
  bool pass = false;
};

int Run(const Args& args) {
  if (args.hidden_size % 64 != 0) {
    return Fail(absl::InvalidArgumentError("--hidden-size must be a multiple of 64"));
  }
  auto scratch = bench::ScratchDir::Create("tophat-bench-transport");
  if (!scratch.ok()) return Fail(scratch.status());
  const ModelConfig config = TransportConfig(args);
  if (absl::Status s = WriteCheckpoint(config, InitWeights(config, 0), scratch->path());
      !s.ok()) {
    return Fail(s);
  }
  auto checkpoint = CheckpointReader::Open(scratch->path());
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  // An empty layer range: Forward returns its input and only advances the caches.
  const SubmodelSpec spec{.layers = {1, 1}};
  auto loaded = Submodel::Load(config, **checkpoint, spec,
                               {.max_context = args.max_context, .huge_pages = false});
  if (!loaded.ok()) return Fail(loaded.status());
  std::shared_ptr<const Submodel> middle = *std::move(loaded);

  const int64_t max_tokens = *std::max_element(args.tokens.begin(), args.tokens.end());
  const int64_t block_size = 16;
  const EngineOptions options{
      .model_id = "transport-bench",
      .kv_block_size = block_size,
      // Two sessions at once (the full one draining while the next fills), plus slack.
      .kv_num_blocks = 3 * ((middle->max_context() + block_size - 1) / block_size),
      .max_batch_tokens = std::max<int64_t>(512, 2 * max_tokens),
      .max_chunk_tokens = std::max<int64_t>(2048, max_tokens),
      .session_timeout_s = 24 * 3600.0};
  auto engine = Engine::Create(options, middle, nullptr);
  if (!engine.ok()) return Fail(engine.status());

  CloudServiceImpl service(engine->get(), {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::UnavailableError("cannot listen on 127.0.0.1"));
  }
  (*engine)->Start();

  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  channel_args.SetMaxSendMessageSize(kMaxMessageBytes);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::InsecureChannelCredentials(), channel_args);
  std::unique_ptr<v1::CloudService::Stub> stub = v1::CloudService::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Connect(&context);
  v1::CloudMessage hello;
  if (!stream->Read(&hello) || !hello.has_hello()) {
    return Fail(absl::UnavailableError("the cloud sent no Hello"));
  }
  const int64_t hidden = hello.hello().hidden_size();
  const int64_t session_positions = hello.hello().max_positions();
  std::fprintf(stderr,
               "loopback 127.0.0.1:%d, hidden %lld float32 (%lld bytes/position), no layers, "
               "window %d, sessions of %lld positions, %d CPUs\n",
               port, static_cast<long long>(hidden), static_cast<long long>(hidden * 4),
               args.window, static_cast<long long>(session_positions), UsableCpuCount());

  Flow flow;
  std::thread reader(ReadResults, stream.get(), &flow);
  Client client(stream.get(), &flow, session_positions, hidden);
  absl::Status status = client.Start();

  std::vector<TokensResult> results;
  for (int64_t tokens : args.tokens) {
    if (!status.ok()) break;
    TokensResult r{.tokens = tokens, .chunk_bytes = tokens * hidden * 4};
    std::fprintf(stderr, "T=%lld ...\n", static_cast<long long>(tokens));
    // One untimed short run first, then transport and memcpy alternately.
    if (auto warm = client.Measure(tokens, args.window, 0.05); !warm.ok()) {
      status = warm.status();
      break;
    }
    for (int rep = 0; rep < args.repetitions && status.ok(); ++rep) {
      auto sample = client.Measure(tokens, args.window, args.seconds);
      if (!sample.ok()) {
        status = sample.status();
        break;
      }
      sample->memcpy_gb_s = MemcpyGbPerS(r.chunk_bytes, args.ref_seconds);
      r.samples.push_back(*sample);
    }
    if (!status.ok()) break;
    auto median_of = [&](double Sample::*field) {
      std::vector<double> values;
      for (const Sample& s : r.samples) values.push_back(s.*field);
      return Median(values);
    };
    r.median = {.up_gb_s = median_of(&Sample::up_gb_s),
                .down_gb_s = median_of(&Sample::down_gb_s),
                .combined_gb_s = median_of(&Sample::combined_gb_s),
                .chunks_per_s = median_of(&Sample::chunks_per_s),
                .cpu_cores = median_of(&Sample::cpu_cores),
                .memcpy_gb_s = median_of(&Sample::memcpy_gb_s)};
    r.pass = r.median.up_gb_s >= args.goal_gb_s && r.median.down_gb_s >= args.goal_gb_s;
    results.push_back(r);
  }

  if (status.ok()) status = client.Close();
  stream->WritesDone();
  reader.join();
  grpc::Status finish = stream->Finish();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*engine)->Stop();
  if (!status.ok()) return Fail(status);
  if (!finish.ok()) {
    return Fail(absl::InternalError(absl::StrCat("stream ended with ", finish.error_message())));
  }

  std::string table = absl::StrFormat(
      "%6s | %9s | %9s | %9s | %9s | %9s | %9s | %9s | %11s | %9s | %s\n", "T", "chunk",
      "up GB/s", "down GB/s", "both GB/s", "chunks/s", "CPU cores", "both/core", "memcpy GB/s",
      "up/memcpy", absl::StrFormat("goal >= %.2g GB/s", args.goal_gb_s));
  absl::StrAppend(&table, std::string(136, '-'), "\n");
  nlohmann::json json_results = nlohmann::json::array();
  bool all_pass = true;
  for (const TokensResult& r : results) {
    all_pass = all_pass && r.pass;
    const Sample& m = r.median;
    absl::StrAppend(&table,
                    absl::StrFormat("%6d | %7.0f K | %9.3f | %9.3f | %9.3f | %9.0f | %9.2f | "
                                    "%9.3f | %11.1f | %9.4f | %s\n",
                                    r.tokens, r.chunk_bytes / 1024.0, m.up_gb_s, m.down_gb_s,
                                    m.combined_gb_s, m.chunks_per_s, m.cpu_cores,
                                    m.combined_gb_s / m.cpu_cores, m.memcpy_gb_s,
                                    m.up_gb_s / m.memcpy_gb_s, r.pass ? "PASS" : "FAIL"));
    nlohmann::json samples = nlohmann::json::array();
    for (const Sample& s : r.samples) {
      samples.push_back({{"up_gb_s", s.up_gb_s},
                         {"down_gb_s", s.down_gb_s},
                         {"combined_gb_s", s.combined_gb_s},
                         {"chunks_per_s", s.chunks_per_s},
                         {"cpu_cores", s.cpu_cores},
                         {"memcpy_gb_s", s.memcpy_gb_s}});
    }
    json_results.push_back({{"tokens_per_chunk", r.tokens},
                            {"chunk_bytes", r.chunk_bytes},
                            {"up_gb_s", m.up_gb_s},
                            {"down_gb_s", m.down_gb_s},
                            {"combined_gb_s", m.combined_gb_s},
                            {"chunks_per_s", m.chunks_per_s},
                            {"cpu_cores", m.cpu_cores},
                            {"combined_gb_per_cpu_s", m.combined_gb_s / m.cpu_cores},
                            {"memcpy_gb_s", m.memcpy_gb_s},
                            {"up_over_memcpy", m.up_gb_s / m.memcpy_gb_s},
                            {"pass", r.pass},
                            {"samples", samples}});
  }
  const nlohmann::json report = {
      {"benchmark", "transport"},
      {"goal", absl::StrFormat(">= %.2f GB/s per stream per direction", args.goal_gb_s)},
      {"goal_gb_s", args.goal_gb_s},
      {"bytes_per_position", hidden * 4},
      {"window", args.window},
      {"seconds_per_repetition", args.seconds},
      {"repetitions", args.repetitions},
      {"cpus", UsableCpuCount()},
      {"results", json_results},
      {"all_pass", all_pass}};
  if (absl::Status s = bench::PrintReport(table, report, args.json_path); !s.ok()) {
    return Fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::ConfigureAllocatorForPayloads();
  tophat::Args args;
  CLI::App app{
      "tophat-bench-transport: hidden-state throughput of one agent stream over loopback gRPC "
      "against the real CloudService and Engine (a middle submodel with no layers), with a "
      "same-run memcpy reference. Prints a table and a JSON report."};
  app.add_option("--tokens", args.tokens, "Positions per ForwardChunk (one row per value)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--window", args.window, "Chunks in flight")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seconds", args.seconds, "Sending time per repetition")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repetitions", args.repetitions)->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--hidden-size", args.hidden_size, "float32 elements per position")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-context", args.max_context,
                 "Positions per session; the client opens a new session when one is full")
      ->capture_default_str()->check(CLI::Range(int64_t{256}, int64_t{1} << 20));
  app.add_option("--goal", args.goal_gb_s, "GB/s per direction to pass")->capture_default_str();
  app.add_option("--json", args.json_path, "Also write the JSON report here");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  return tophat::Run(args);
}
