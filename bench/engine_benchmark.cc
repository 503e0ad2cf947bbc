// tophat-bench-engine: what one cloud engine step costs next to the raw middle-submodel
// forward of the same tokens (issue 3: "a cloud step takes at most 1.15x the raw forward").
//
// Engine path: Engine::RunOnce() with every session's chunk already delivered, as the
// reactor leaves it: intake drain, validation, planning, staging copies, the forward over
// the paged KV pool, and result serialization. Raw path: Submodel::Forward over paged caches
// of a separate pool with the same history lengths, same tokens. The two are timed in
// alternation (engine, raw, engine, raw, ...) and compared through their medians.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/program.h"
#include "base/status_macros.h"
#include "bench/bench_util.h"
#include "bench/kernel_profile.h"
#include "bench/machine_bounds.h"
#include "bench/model_benchmark.h"
#include "kernels/cuda_device.h"
#include "kernels/decode_attention.h"
#include "kernels/gemm_f32.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/decode_graphs.h"
#include "models/runtime/gemm_tactics.h"
#include "models/runtime/kv_cache.h"
#include "models/runtime/submodel.h"
#include "proto/hidden_states.h"
#include "server/engine.h"
#include "server/message_sink.h"

using tophat::Fail;

namespace tophat {
namespace {

using bench::BenchClock;
using bench::Median;
using bench::SecondsBetween;

struct Args {
  std::string model_dir;  // empty: a random Bench110MConfig() checkpoint in a scratch dir
  int64_t input_layers = 2;   // m: the middle starts at layer m
  int64_t output_layers = 1;  // k: and ends k layers before the last
  int64_t context = 128;
  std::vector<int64_t> batches = {1, 8, 32};
  // Speculative verification cases: these batch sizes, each session sending verify_tokens
  // positions a step (none by default).
  std::vector<int64_t> verify_batches;
  int64_t verify_tokens = 5;
  int64_t prefill_tokens = 512;
  int repetitions = 30;
  int prefill_repetitions = 7;
  int warmup = 3;
  int64_t kv_block_size = 16;
  double goal = 1.15;
  uint64_t seed = 0;
  std::string json_path;
  std::string device = "cpu";     // where the middle runs: cpu | cuda | cuda:N
  std::string dtype = "float32";  // float32 | float16 | bfloat16
  int64_t cuda_graph_max_batch = 64;  // on a GPU: both paths replay decode graphs (0: eager)
  int profile_steps = 0;  // engine steps per case profiled after the timed ones (0: none)
  size_t profile_top = 15;
  std::string small_batch_gemm = "measured";  // measured | always | never
  bool overlap_launches = true;  // kernels::SetOverlapKernelLaunches
  bool fused_split_merge = true;  // kernels::SetFusedSplitMerge
  bool verification_as_decode_rows = true;  // SubmodelOptions::verification_as_decode_rows
  bool mxfp4_experts = true;                // SubmodelOptions::mxfp4_experts
  bool int8_activations = false;            // SubmodelOptions::int8_activations
};

// The row counts (1-8) at which each layer matrix's GEMM takes the small-batch kernel
// (SubmodelOptions::small_batch_gemm), from the first layer: every layer has its choice.
nlohmann::json SmallBatchGemmRows(const Submodel& middle) {
  nlohmann::json rows = nlohmann::json::object();
  if (middle.layers().empty()) return rows;
  const DecoderLayerWeights& w = middle.layers().front();
  for (const auto& [name, matrix] : {std::pair<const char*, const WeightMatrix*>{"qkv", &w.qkv},
                                     {"o_proj", &w.o_proj},
                                     {"gate_up", &w.gate_up},
                                     {"down", &w.down}}) {
    rows[name] = SmallBatchRows(matrix->small_batch_rows);
  }
  return rows;
}

// What one run measures of the machine: the bounds each case is compared with.
struct MachineBounds {
  double bandwidth = 0;   // bytes/s: device copy (read + write) on a GPU, read bandwidth on CPU
  double gemm_flops = 0;  // FLOP/s of a large product in the compute dtype
};

// The stream end the engine writes to. Keeps each step's messages so the benchmark can
// check the results after the timer stops; the real reactor queues them the same way.
class CollectingSink final : public MessageSink {
 public:
  void Send(v1::CloudMessage message) override {
    ++messages_;
    if (message.has_error()) errors_.push_back(message.error().message());
    if (message.has_result()) results_.push_back(std::move(message));
  }
  void Finish(const absl::Status& status) override {
    errors_.push_back(absl::StrCat("stream finished: ", status.ToString()));
  }
  void Consumed(int64_t bytes) override { consumed_bytes_ += bytes; }

  void ClearResults() { results_.clear(); }
  const std::vector<v1::CloudMessage>& results() const { return results_; }
  const std::vector<std::string>& errors() const { return errors_; }
  int64_t messages() const { return messages_; }

 private:
  int64_t messages_ = 0;
  int64_t consumed_bytes_ = 0;
  std::vector<v1::CloudMessage> results_;
  std::vector<std::string> errors_;
};

// Drives an engine on this thread the way the reactors and the engine thread would, one
// RunOnce at a time. Delivering (the reactor's job) and packing (the agent's) happen
// outside the timed step.
class EngineDriver {
 public:
  EngineDriver(std::unique_ptr<Engine> engine, std::shared_ptr<CollectingSink> sink)
      : engine_(std::move(engine)), sink_(std::move(sink)) {
    engine_->AttachStream(kStream, sink_);
  }

  Engine& engine() { return *engine_; }
  CollectingSink& sink() { return *sink_; }

  absl::StatusOr<std::vector<uint64_t>> Open(int64_t count, int64_t max_positions) {
    std::vector<uint64_t> ids;
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t id = next_session_++;
      v1::AgentMessage message;
      message.mutable_open()->set_session_id(id);
      message.mutable_open()->set_max_positions(static_cast<uint32_t>(max_positions));
      engine_->Deliver(kStream, std::move(message));
      next_position_[id] = 0;
      ids.push_back(id);
    }
    engine_->RunOnce();
    TOPHAT_RETURN_IF_ERROR(CheckNoErrors("opening sessions"));
    return ids;
  }

  absl::Status DeliverChunk(uint64_t id, const at::Tensor& rows, v1::Phase phase) {
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_session_id(id);
    chunk->set_sequence_number(next_sequence_++);
    chunk->set_first_position(static_cast<uint32_t>(next_position_[id]));
    chunk->set_phase(phase);
    TOPHAT_RETURN_IF_ERROR(PackHiddenStates(rows, chunk->mutable_states()));
    next_position_[id] += rows.size(0);
    engine_->Deliver(kStream, std::move(message));
    return absl::OkStatus();
  }

  // Steps until no session has work left.
  absl::Status RunUntilIdle(const std::string& what) {
    while (engine_->RunOnce() > 0) {
    }
    return CheckNoErrors(what);
  }

  absl::Status Close(const std::vector<uint64_t>& ids) {
    for (uint64_t id : ids) {
      v1::AgentMessage message;
      message.mutable_close()->set_session_id(id);
      engine_->Deliver(kStream, std::move(message));
      next_position_.erase(id);
    }
    engine_->RunOnce();
    sink_->ClearResults();
    return CheckNoErrors("closing sessions");
  }

  absl::Status CheckNoErrors(const std::string& what) const {
    if (sink_->errors().empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(what, ": the engine answered with an error: ",
                                            sink_->errors().front()));
  }

  // The payload of the result for session `id` among the last step's results.
  const v1::ForwardResult* Result(uint64_t id) const {
    for (const v1::CloudMessage& message : sink_->results()) {
      if (message.result().session_id() == id) return &message.result();
    }
    return nullptr;
  }

  // Every result piece for session `id` among the last step's results, in the order sent:
  // a prompt chunk's result leaves the engine in pieces of at most max_result_piece_bytes,
  // and only the last one carries chunk_done.
  std::vector<const v1::ForwardResult*> Pieces(uint64_t id) const {
    std::vector<const v1::ForwardResult*> pieces;
    for (const v1::CloudMessage& message : sink_->results()) {
      if (message.result().session_id() == id) pieces.push_back(&message.result());
    }
    return pieces;
  }

 private:
  static constexpr StreamId kStream = 1;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<CollectingSink> sink_;
  uint64_t next_session_ = 1;
  uint64_t next_sequence_ = 1;
  std::map<uint64_t, int64_t> next_position_;
};

// Paged caches over their own pool, holding the blocks they need from the start.
class RawCaches {
 public:
  static absl::StatusOr<RawCaches> Create(const Submodel& middle, int64_t num_blocks,
                                          int64_t block_size) {
    TOPHAT_ASSIGN_OR_RETURN(std::shared_ptr<KvBlockPool> pool,
                            middle.NewPagedPool(num_blocks, block_size));
    return RawCaches(std::move(pool));
  }

  // The raw path computes in step buffers of its own, as the engine does, and on a GPU
  // replays decode graphs of its own (unless max_graph_batch is 0 or capture fails).
  absl::Status PrepareSteps(const Submodel& middle, int64_t max_tokens, int64_t max_graph_batch) {
    TOPHAT_RETURN_IF_ERROR(CatchExceptions("raw step buffers", [&] {
      buffers_.emplace(middle.NewStepBuffers(max_tokens, pool_->block_size()));
    }));
    if (middle.options().device.is_cpu() || max_graph_batch <= 0) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<DecodeGraphs>> graphs = DecodeGraphs::Capture(
        middle, *pool_, *buffers_, std::min(max_graph_batch, max_tokens));
    if (!graphs.ok()) {
      std::fprintf(stderr, "raw decode steps run eagerly: %s\n",
                   graphs.status().ToString().c_str());
      return absl::OkStatus();
    }
    graphs_ = std::move(*graphs);
    return absl::OkStatus();
  }
  // One raw step, through a graph where one fits.
  absl::StatusOr<at::Tensor> Step(const Submodel& middle, const at::Tensor& x,
                                  std::span<const SequenceChunk> chunks) {
    if (graphs_ != nullptr && graphs_->Fits(chunks)) return graphs_->Run(x, chunks);
    return middle.Forward(x, chunks, *buffers_);
  }
  bool graphs() const { return graphs_ != nullptr; }
  // The experts the last raw step computed over its sparse layers (0 for a dense middle).
  int64_t experts_computed() const { return buffers_ ? buffers_->experts_computed : 0; }

  // Replaces the caches with `count` empty ones of `positions` positions each.
  void Reset(int64_t count, int64_t positions) {
    caches_.clear();
    int32_t next_block = 0;
    const int64_t blocks = pool_->BlocksFor(positions);
    for (int64_t i = 0; i < count; ++i) {
      KvCache cache(pool_);
      for (int64_t b = 0; b < blocks; ++b) cache.AppendBlock(next_block++);
      caches_.push_back(std::move(cache));
    }
  }
  std::vector<KvCache>& caches() { return caches_; }

 private:
  explicit RawCaches(std::shared_ptr<KvBlockPool> pool) : pool_(std::move(pool)) {}
  std::shared_ptr<KvBlockPool> pool_;
  std::vector<KvCache> caches_;
  std::optional<StepBuffers> buffers_;
  std::unique_ptr<DecodeGraphs> graphs_;
};

struct CaseResult {
  std::string name;
  std::string phase;
  int64_t sessions = 0;
  int64_t tokens = 0;          // per step
  int64_t context_first = 0;   // history length at the first timed step
  int64_t context_last = 0;    // ... and at the last
  int repetitions = 0;
  double engine_ms = 0;          // median RunOnce
  double engine_compute_ms = 0;  // median of the step's own compute_seconds (staging+forward)
  double raw_ms = 0;             // median Forward
  double ratio = 0;              // engine_ms / raw_ms
  double paired_ratio = 0;       // median over repetitions of engine / raw of the same pair
  double max_abs_diff = 0;       // engine result vs raw output, last repetition
  int64_t result_pieces = 1;     // the pieces one step's result for a session left in
  double experts_computed = 0;   // a mixture of experts: the experts a step computed (mean)
  double bound_ms = 0;           // the case's floor from the measured machine bounds
  double bound_fraction = 0;     // bound_ms / engine_ms
  bool pass = false;
  std::optional<bench::KernelProfile> profile;  // --profile-steps: where a step's time goes
};

double MaxAbsDiff(const v1::ForwardResult& result, const at::Tensor& raw_rows) {
  const std::string& data = result.states().data();
  at::Tensor engine_rows = at::from_blob(const_cast<char*>(data.data()), raw_rows.sizes(),
                                         raw_rows.scalar_type());
  return (engine_rows.to(at::kFloat) - raw_rows.to(at::kCPU, at::kFloat)).abs().max().item<double>();
}

// A chunk's result sent in pieces: they must cover its `n` positions from `first` in order,
// the last (and only the last) marked chunk_done. Returns the largest difference from the
// raw forward's rows.
absl::StatusOr<double> PiecesMaxAbsDiff(const std::vector<const v1::ForwardResult*>& pieces,
                                        int64_t first, int64_t n, const at::Tensor& raw_rows,
                                        const std::string& name) {
  double max_diff = 0;
  int64_t next = first;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const v1::ForwardResult& piece = *pieces[i];
    const int64_t rows = piece.states().num_positions();
    const bool last = i + 1 == pieces.size();
    if (static_cast<int64_t>(piece.first_position()) != next || rows <= 0 ||
        piece.chunk_done() != last) {
      return absl::InternalError(absl::StrCat(
          name, ": result piece ", i, " of ", pieces.size(), " holds positions [",
          piece.first_position(), ", ", piece.first_position() + rows, ") with chunk_done ",
          piece.chunk_done() ? "set" : "unset", "; expected it to start at ", next));
    }
    max_diff = std::max(max_diff, MaxAbsDiff(piece, raw_rows.narrow(0, next - first, rows)));
    next += rows;
  }
  if (next != first + n) {
    return absl::InternalError(absl::StrCat(name, ": the result pieces cover ", next - first,
                                            " of the chunk's ", n, " positions"));
  }
  return max_diff;
}

// Bytes a decode step must read at least: every weight once (of a mixture of experts, the
// experts the step's tokens chose: `experts_computed` over its sparse layers), and each
// session's keys and values of every layer.
double DecodeBytes(const Submodel& middle, int64_t batch, int64_t context,
                   double experts_computed) {
  const ModelConfig& c = middle.config();
  const double kv = 2.0 * static_cast<double>(middle.spec().layers.size() * c.num_key_value_heads *
                                              c.head_dim * at::elementSize(middle.options().dtype));
  const double weights =
      c.num_experts > 0
          ? static_cast<double>(middle.WeightBytesRead(std::llround(experts_computed)))
          : static_cast<double>(middle.WeightBytes());
  return weights + kv * static_cast<double>(batch) * static_cast<double>(context);
}

// FLOPs of a prefill chunk of n positions with no history: 2 per weight per token, plus
// QK^T and PV over the causal triangle.
double PrefillFlops(const Submodel& middle, int64_t n) {
  const ModelConfig& c = middle.config();
  const double params =
      static_cast<double>(middle.WeightBytes()) / at::elementSize(middle.options().dtype);
  const double attention = 2.0 * 2.0 * static_cast<double>(c.q_size()) * static_cast<double>(n) *
                           static_cast<double>(n + 1) / 2.0 *
                           static_cast<double>(middle.spec().layers.size());
  return 2.0 * params * static_cast<double>(n) + attention;
}

void Finish(CaseResult& r, const std::vector<double>& engine_s,
            const std::vector<double>& compute_s, const std::vector<double>& raw_s,
            double goal) {
  std::vector<double> ratios;
  for (size_t i = 0; i < engine_s.size(); ++i) ratios.push_back(engine_s[i] / raw_s[i]);
  r.repetitions = static_cast<int>(engine_s.size());
  r.engine_ms = 1e3 * Median(engine_s);
  r.engine_compute_ms = 1e3 * Median(compute_s);
  r.raw_ms = 1e3 * Median(raw_s);
  r.ratio = r.engine_ms / r.raw_ms;
  r.paired_ratio = Median(ratios);
  r.pass = r.ratio <= goal;
}

// `steps` more engine steps under the kernel profiler; `deliver(step)` hands the engine that
// step's chunks first. On a GPU only the device's work counts (the host's delivery is not in
// it), and the wall time per step is RunOnce's own. On a CPU the profiler counts the
// delivery's ATen ops too (its narrows), so the wall time takes it in: a delivery slowed by
// another process once made the ops outlast RunOnce alone (506 us of narrows against 135 us).
absl::StatusOr<bench::KernelProfile> ProfileEngineSteps(
    EngineDriver& driver, at::Device device, size_t steps,
    const std::function<absl::Status(size_t)>& deliver) {
  TOPHAT_ASSIGN_OR_RETURN(bench::KernelProfiler window, bench::KernelProfiler::Start(device));
  double run_ms = 0;
  for (size_t step = 0; step < steps; ++step) {
    const BenchClock::time_point delivered_from = BenchClock::now();
    TOPHAT_RETURN_IF_ERROR(deliver(step));
    driver.sink().ClearResults();
    const BenchClock::time_point t0 = device.is_cpu() ? delivered_from : BenchClock::now();
    driver.engine().RunOnce();
    run_ms += 1e3 * SecondsBetween(t0, BenchClock::now());
    TOPHAT_RETURN_IF_ERROR(driver.CheckNoErrors("a profiled step"));
  }
  SynchronizeDevice(device);
  TOPHAT_ASSIGN_OR_RETURN(bench::KernelProfile profile, window.Stop(static_cast<int>(steps)));
  profile.wall_ms = run_ms;
  return profile;
}

// `batch` sessions, each sending `per_session` positions a step: 1 for decode, the draft and
// one more for a speculative verification chunk (PHASE_DECODE either way).
absl::StatusOr<CaseResult> RunDecodeCase(const Submodel& middle, EngineDriver& driver,
                                         RawCaches& raw, int64_t batch, int64_t per_session,
                                         const Args& args) {
  const int64_t d = middle.config().hidden_size;
  const int steps = args.warmup + args.repetitions;
  const int64_t max_positions = args.context + (steps + args.profile_steps) * per_session;
  CaseResult r{.name = per_session == 1 ? absl::StrCat("decode B=", batch)
                                        : absl::StrCat("verify B=", batch, "x", per_session),
               .phase = "decode",
               .sessions = batch,
               .tokens = batch * per_session,
               .context_first = args.context + args.warmup * per_session,
               .context_last = args.context + (steps - 1) * per_session};

  // History: the same random shallow states through both paths.
  TOPHAT_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, driver.Open(batch, max_positions));
  raw.Reset(batch, max_positions);
  const at::ScalarType dtype = middle.options().dtype;
  const at::Device device = middle.options().device;
  const at::Tensor history = at::randn({batch, args.context, d}).to(dtype);
  for (int64_t b = 0; b < batch; ++b) {
    TOPHAT_RETURN_IF_ERROR(driver.DeliverChunk(ids[b], history[b], v1::PHASE_PREFILL));
  }
  TOPHAT_RETURN_IF_ERROR(driver.RunUntilIdle("prefilling the history"));
  driver.sink().ClearResults();
  for (int64_t b = 0; b < batch; ++b) {
    TOPHAT_RETURN_IF_ERROR(middle.Forward(history[b].to(device), raw.caches()[b]).status());
  }
  std::vector<SequenceChunk> chunks;
  for (KvCache& cache : raw.caches()) {
    chunks.push_back({.cache = &cache, .num_tokens = per_session});
  }

  std::vector<double> engine_s, compute_s, raw_s;
  for (int step = 0; step < steps; ++step) {
    const at::Tensor x = at::randn({batch * per_session, d}).to(dtype);
    const at::Tensor x_device = x.to(device);
    for (int64_t b = 0; b < batch; ++b) {
      TOPHAT_RETURN_IF_ERROR(driver.DeliverChunk(
          ids[b], x.narrow(0, b * per_session, per_session), v1::PHASE_DECODE));
    }
    driver.sink().ClearResults();

    const BenchClock::time_point e0 = BenchClock::now();
    const int64_t computed = driver.engine().RunOnce();
    const BenchClock::time_point e1 = BenchClock::now();
    // The raw forward starts from states already on the device and ends when its output is
    // back on the host, as the engine's step does.
    const BenchClock::time_point r0 = BenchClock::now();
    absl::StatusOr<at::Tensor> out = raw.Step(middle, x_device, chunks);
    if (out.ok()) *out = out->to(at::kCPU);
    const BenchClock::time_point r1 = BenchClock::now();

    TOPHAT_RETURN_IF_ERROR(out.status());
    TOPHAT_RETURN_IF_ERROR(driver.CheckNoErrors(r.name));
    if (computed != batch * per_session ||
        static_cast<int64_t>(driver.sink().results().size()) != batch) {
      return absl::InternalError(absl::StrCat(
          r.name, ": the engine step computed ", computed, " positions and sent ",
          driver.sink().results().size(), " results; expected ", batch * per_session, " and ",
          batch));
    }
    if (step < args.warmup) continue;
    engine_s.push_back(SecondsBetween(e0, e1));
    raw_s.push_back(SecondsBetween(r0, r1));
    r.experts_computed += static_cast<double>(raw.experts_computed());
    compute_s.push_back(driver.sink().results().front().result().compute_seconds());
    if (step == steps - 1) {
      for (int64_t b = 0; b < batch; ++b) {
        const v1::ForwardResult* result = driver.Result(ids[b]);
        if (result == nullptr) return absl::InternalError("a session got no result");
        r.max_abs_diff = std::max(
            r.max_abs_diff, MaxAbsDiff(*result, out->narrow(0, b * per_session, per_session)));
      }
    }
  }
  if (args.profile_steps > 0) {
    std::vector<at::Tensor> inputs;
    for (int step = 0; step < args.profile_steps; ++step) {
      inputs.push_back(at::randn({batch * per_session, d}).to(dtype));
    }
    TOPHAT_ASSIGN_OR_RETURN(
        r.profile, ProfileEngineSteps(driver, device, inputs.size(), [&](size_t step) {
          for (int64_t b = 0; b < batch; ++b) {
            TOPHAT_RETURN_IF_ERROR(
                driver.DeliverChunk(ids[b], inputs[step].narrow(0, b * per_session, per_session),
                                    v1::PHASE_DECODE));
          }
          return absl::OkStatus();
        }));
  }
  TOPHAT_RETURN_IF_ERROR(driver.Close(ids));
  if (!raw_s.empty()) r.experts_computed /= static_cast<double>(raw_s.size());
  Finish(r, engine_s, compute_s, raw_s, args.goal);
  return r;
}

absl::StatusOr<CaseResult> RunPrefillCase(const Submodel& middle, EngineDriver& driver,
                                          RawCaches& raw, const Args& args) {
  const int64_t d = middle.config().hidden_size;
  const int64_t n = args.prefill_tokens;
  const at::ScalarType dtype = middle.options().dtype;
  const at::Device device = middle.options().device;
  const int warmup = 1;
  const int steps = warmup + args.prefill_repetitions;
  CaseResult r{.name = absl::StrCat("prefill ", n),
               .phase = "prefill",
               .sessions = 1,
               .tokens = n,
               .context_first = 0,
               .context_last = 0};
  raw.Reset(1, n);
  KvCache& cache = raw.caches().front();

  std::vector<double> engine_s, compute_s, raw_s;
  for (int step = 0; step < steps; ++step) {
    // A fresh session each time, opened (and admitted) before the timed step.
    TOPHAT_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, driver.Open(1, n));
    const at::Tensor x = at::randn({n, d}).to(dtype);
    const at::Tensor x_device = x.to(device);
    TOPHAT_RETURN_IF_ERROR(driver.DeliverChunk(ids[0], x, v1::PHASE_PREFILL));
    driver.sink().ClearResults();
    cache.Clear();

    const BenchClock::time_point e0 = BenchClock::now();
    const int64_t computed = driver.engine().RunOnce();
    const BenchClock::time_point e1 = BenchClock::now();
    const BenchClock::time_point r0 = BenchClock::now();
    const SequenceChunk chunk{.cache = &cache, .num_tokens = n};
    absl::StatusOr<at::Tensor> out =
        raw.Step(middle, x_device, std::span<const SequenceChunk>(&chunk, 1));
    if (out.ok()) *out = out->to(at::kCPU);
    const BenchClock::time_point r1 = BenchClock::now();

    TOPHAT_RETURN_IF_ERROR(out.status());
    TOPHAT_RETURN_IF_ERROR(driver.CheckNoErrors(r.name));
    const std::vector<const v1::ForwardResult*> pieces = driver.Pieces(ids[0]);
    if (computed != n || pieces.empty()) {
      return absl::InternalError(absl::StrCat(
          r.name, ": the engine step computed ", computed, " positions; expected the whole ", n,
          "-position chunk in one step (max_batch_tokens too small?)"));
    }
    TOPHAT_ASSIGN_OR_RETURN(const double diff, PiecesMaxAbsDiff(pieces, 0, n, *out, r.name));
    r.result_pieces = static_cast<int64_t>(pieces.size());
    if (step >= warmup) {
      engine_s.push_back(SecondsBetween(e0, e1));
      raw_s.push_back(SecondsBetween(r0, r1));
      compute_s.push_back(pieces.front()->compute_seconds());
    }
    if (step == steps - 1) r.max_abs_diff = diff;
    TOPHAT_RETURN_IF_ERROR(driver.Close(ids));
  }
  if (args.profile_steps > 0) {
    // A fresh session per chunk, as timed; opened and closed outside the profiled steps.
    const at::Tensor x = at::randn({n, d}).to(dtype);
    std::vector<std::vector<uint64_t>> sessions;
    for (int step = 0; step < args.profile_steps; ++step) {
      TOPHAT_ASSIGN_OR_RETURN(sessions.emplace_back(), driver.Open(1, n));
    }
    TOPHAT_ASSIGN_OR_RETURN(
        r.profile, ProfileEngineSteps(driver, device, sessions.size(), [&](size_t step) {
          return driver.DeliverChunk(sessions[step][0], x, v1::PHASE_PREFILL);
        }));
    for (const std::vector<uint64_t>& ids : sessions) TOPHAT_RETURN_IF_ERROR(driver.Close(ids));
  }
  Finish(r, engine_s, compute_s, raw_s, args.goal);
  return r;
}

std::string Table(const std::vector<CaseResult>& cases, double goal) {
  std::string out = absl::StrFormat(
      "%-14s | %6s | %-9s | %10s | %11s | %9s | %6s | %6s | %-6s | %6s | %8s | %6s | %s\n",
      "case", "tokens", "context", "engine ms", "(compute ms)", "raw ms", "ratio", "paired",
      "goal", "result", "bound ms", "of bnd", "tokens/s");
  absl::StrAppend(&out, std::string(140, '-'), "\n");
  for (const CaseResult& r : cases) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%-14s | %6d | %-9s | %10.3f | %11.3f | %9.3f | %6.3f | %6.3f | <=%-4.2f | "
                  "%6s | %8.3f | %5.1f%% | %.0f\n",
                  r.name, r.tokens,
                  r.phase == "decode" ? absl::StrCat(r.context_first, "-", r.context_last) : "0",
                  r.engine_ms, r.engine_compute_ms, r.raw_ms, r.ratio, r.paired_ratio, goal,
                  r.pass ? "PASS" : "FAIL", r.bound_ms, 100.0 * r.bound_fraction,
                  r.engine_ms > 0 ? 1e3 * static_cast<double>(r.tokens) / r.engine_ms : 0.0));
  }
  return out;
}

int Run(const Args& args) {
  c10::InferenceMode inference_mode;
  at::manual_seed(args.seed);

  std::optional<bench::ScratchDir> scratch;
  std::string model_dir = args.model_dir;
  if (model_dir.empty()) {
    auto dir = bench::ScratchDir::Create("tophat-bench-engine");
    if (!dir.ok()) return Fail(dir.status());
    scratch.emplace(*std::move(dir));
    model_dir = scratch->path().string();
    std::fprintf(stderr, "writing a random bench-110m checkpoint to %s\n", model_dir.c_str());
    if (absl::Status s = WriteRandomModel(Bench110MConfig(), args.seed, model_dir); !s.ok()) {
      return Fail(s);
    }
  }
  auto config = ModelConfig::Load(std::filesystem::path(model_dir) / "config.json");
  if (!config.ok()) return Fail(config.status());
  auto checkpoint = CheckpointReader::Open(model_dir);
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  const SubmodelSpec spec = SubmodelSpec::Middle(*config, args.input_layers, args.output_layers);
  auto dtype = ParseTorchDtypeName(args.dtype, "--dtype");
  if (!dtype.ok()) return Fail(dtype.status());
  at::Device device = at::kCPU;
  if (absl::Status s = CatchExceptions("--device", [&] { device = at::Device(args.device); });
      !s.ok()) {
    return Fail(s);
  }
  std::fprintf(stderr, "loading layers [%lld, %lld) as %s on %s ...\n",
               static_cast<long long>(spec.layers.begin), static_cast<long long>(spec.layers.end),
               args.dtype.c_str(), device.str().c_str());
  auto small_batch_gemm = ParseSmallBatchGemm(args.small_batch_gemm, "--small-batch-gemm");
  if (!small_batch_gemm.ok()) return Fail(small_batch_gemm.status());
  // Before the load, whose GEMM timings launch the kernels as steps will.
  kernels::SetOverlapKernelLaunches(args.overlap_launches);
  kernels::SetFusedSplitMerge(args.fused_split_merge);
  auto loaded = Submodel::Load(
      *config, **checkpoint, spec,
      {.dtype = *dtype,
       .device = device,
       .max_context = std::min<int64_t>(
           config->max_position_embeddings,
           std::max<int64_t>(4096, args.context + 1 +
                                       (args.warmup + args.repetitions + args.profile_steps) *
                                           std::max<int64_t>(1, args.verify_tokens))),
       .mxfp4_experts = args.mxfp4_experts,
       .int8_activations = args.int8_activations,
       .small_batch_gemm = *small_batch_gemm,
       .verification_as_decode_rows = args.verification_as_decode_rows});
  if (!loaded.ok()) return Fail(loaded.status());
  std::shared_ptr<const Submodel> middle = *std::move(loaded);
  const nlohmann::json small_batch_rows = SmallBatchGemmRows(*middle);
  std::printf("small-batch GEMM (%s): row counts taking the kernel, the rest cuBLAS: %s\n",
              args.small_batch_gemm.c_str(), small_batch_rows.dump().c_str());
  const bool overlapped = kernels::OverlapKernelLaunches();
  std::printf("kernel launches: %s\n",
              overlapped ? "overlapped (programmatic dependent launch)"
                         : (args.overlap_launches ? "serialized (not a GPU of compute capability 9.0+)"
                                                  : "serialized (--overlap-launches off)"));
  std::printf("split decode attention merged: %s\n",
              args.fused_split_merge ? "in the attention kernel"
                                     : "by a second kernel (--fused-split-merge off)");
  if (!args.verify_batches.empty()) {
    std::printf("verification chunks attend as: %s\n",
                device.is_cpu() ? "chunks, one by one (a CPU step has no batched kernel)"
                : args.verification_as_decode_rows
                    ? "decode rows (batched kernel, decode graphs)"
                    : "prompt chunks (--verification-as-decode-rows off)");
  }
  const int64_t max_batch = *std::max_element(args.batches.begin(), args.batches.end());
  // Positions a session reaches: the history, then a step's positions for every warm-up,
  // timed and profiled step.
  const int64_t steps = args.warmup + args.repetitions + args.profile_steps;
  const int64_t decode_positions = args.context + steps;
  const int64_t verify_positions = args.context + steps * args.verify_tokens;
  const int64_t max_verify_batch =
      args.verify_batches.empty()
          ? 0
          : *std::max_element(args.verify_batches.begin(), args.verify_batches.end());
  const int64_t longest = max_verify_batch > 0 ? verify_positions : decode_positions;
  if (longest > middle->max_context() || args.prefill_tokens > middle->max_context()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--context + (--warmup + --repetitions + --profile-steps) x the positions a step (",
        longest, ") and --prefill-tokens (", args.prefill_tokens,
        ") must fit the model's context of ", middle->max_context())));
  }

  // KV for the largest decode or verification case, or the prefill session, in each of the
  // two pools.
  auto blocks_for = [&](int64_t positions) {
    return (positions + args.kv_block_size - 1) / args.kv_block_size;
  };
  const int64_t num_blocks =
      std::max({max_batch * blocks_for(decode_positions),
                max_verify_batch * blocks_for(verify_positions),
                blocks_for(args.prefill_tokens)}) +
      1;
  const int64_t max_step_rows = std::max(max_batch, max_verify_batch * args.verify_tokens);
  const int64_t batch_tokens = std::max<int64_t>({512, args.prefill_tokens, max_step_rows});
  EngineOptions options{.model_id = "bench",
                        .kv_block_size = args.kv_block_size,
                        .kv_num_blocks = num_blocks,
                        .max_batch_tokens = batch_tokens,
                        .max_running_sessions = std::max<int64_t>({64, max_batch, max_verify_batch}),
                        .max_waiting_sessions = std::max<int64_t>({64, max_batch, max_verify_batch}),
                        .max_chunk_tokens = std::max(args.prefill_tokens, args.context),
                        .cuda_graph_max_batch = args.cuda_graph_max_batch,
                        .session_timeout_s = 24 * 3600.0};
  auto engine = Engine::Create(options, middle, nullptr);
  if (!engine.ok()) return Fail(engine.status());
  EngineDriver driver(*std::move(engine), std::make_shared<CollectingSink>());
  driver.engine().RunOnce();  // takes the attach (and sends Hello)
  auto raw = RawCaches::Create(*middle, num_blocks, args.kv_block_size);
  if (!raw.ok()) return Fail(raw.status());
  if (absl::Status prepared = raw->PrepareSteps(
          *middle, std::max(batch_tokens, std::max(args.prefill_tokens, args.context)),
          std::min(args.cuda_graph_max_batch, options.max_running_sessions));
      !prepared.ok()) {
    return Fail(prepared);
  }

  const ModelConfig& c = middle->config();
  std::fprintf(stderr,
               "middle layers [%lld, %lld) of %lld, dim %lld, %lld heads (%lld KV), %.1f MB "
               "weights (%.1f MB read a token); %d ATen threads on %d CPUs; KV pools %lld "
               "blocks x %lld\n",
               static_cast<long long>(spec.layers.begin), static_cast<long long>(spec.layers.end),
               static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
               static_cast<long long>(c.num_attention_heads),
               static_cast<long long>(c.num_key_value_heads), middle->StoredWeightBytes() / 1e6,
               middle->WeightBytes() / 1e6, at::get_num_threads(), UsableCpuCount(),
               static_cast<long long>(num_blocks), static_cast<long long>(args.kv_block_size));

  // This run's own bounds: what the hardware under this process can do right now.
  MachineBounds bounds;
  if (device.is_cpu()) {
    bounds.bandwidth = MeasureReadBandwidth();
    bounds.gemm_flops = MeasureGemmFlops(1024, 1024, 1024, 3, /*b_transposed=*/true);
  } else {
    bounds.bandwidth = MeasureDeviceCopyBandwidth(device, int64_t{2} << 30, 10);
    bounds.gemm_flops = MeasureDeviceGemmFlops(device, *dtype, 8192, 8192, 8192, 5);
  }
  std::fprintf(stderr, "measured bounds: %.1f GB/s memory, %.1f TFLOP/s %s GEMM\n",
               bounds.bandwidth / 1e9, bounds.gemm_flops / 1e12, args.dtype.c_str());

  std::vector<CaseResult> cases;
  // Decode cases, then verification cases: (batch, positions a session a step).
  std::vector<std::pair<int64_t, int64_t>> decode_cases;
  for (int64_t batch : args.batches) decode_cases.emplace_back(batch, 1);
  for (int64_t batch : args.verify_batches) decode_cases.emplace_back(batch, args.verify_tokens);
  for (const auto& [batch, per_session] : decode_cases) {
    std::fprintf(stderr, "%s ...\n",
                 (per_session == 1 ? absl::StrCat("decode B=", batch)
                                   : absl::StrCat("verify B=", batch, "x", per_session))
                     .c_str());
    auto r = RunDecodeCase(*middle, driver, *raw, batch, per_session, args);
    if (!r.ok()) return Fail(r.status());
    // Every weight and each session's history read once (a verification chunk's positions
    // share them), whatever the positions a step.
    const double mean_context = 0.5 * static_cast<double>(r->context_first + r->context_last);
    r->bound_ms =
        1e3 * DecodeBytes(*middle, batch, static_cast<int64_t>(mean_context), r->experts_computed) /
        bounds.bandwidth;
    r->bound_fraction = r->bound_ms / r->engine_ms;
    cases.push_back(*r);
  }
  if (args.prefill_tokens > 0) {
    std::fprintf(stderr, "prefill %lld ...\n", static_cast<long long>(args.prefill_tokens));
    auto r = RunPrefillCase(*middle, driver, *raw, args);
    if (!r.ok()) return Fail(r.status());
    r->bound_ms = 1e3 * PrefillFlops(*middle, args.prefill_tokens) / bounds.gemm_flops;
    r->bound_fraction = r->bound_ms / r->engine_ms;
    cases.push_back(*r);
  }

  bool all_pass = true;
  nlohmann::json json_cases = nlohmann::json::array();
  for (const CaseResult& r : cases) {
    all_pass = all_pass && r.pass;
    json_cases.push_back(
        {{"case", r.name},
         {"phase", r.phase},
         {"sessions", r.sessions},
         {"tokens", r.tokens},
         {"context_first", r.context_first},
         {"context_last", r.context_last},
         {"repetitions", r.repetitions},
         {"engine_ms", r.engine_ms},
         {"engine_compute_ms", r.engine_compute_ms},
         {"raw_ms", r.raw_ms},
         {"ratio", r.ratio},
         {"paired_ratio", r.paired_ratio},
         {"max_abs_diff", r.max_abs_diff},
         {"result_pieces", r.result_pieces},
         {"bound_ms", r.bound_ms},
         {"experts_computed", r.experts_computed},
         {"bound_fraction", r.bound_fraction},
         {"tokens_per_second",
          r.engine_ms > 0 ? 1e3 * static_cast<double>(r.tokens) / r.engine_ms : 0.0},
         {"pass", r.pass}});
    if (r.profile.has_value()) {
      const double steps = r.profile->steps;
      nlohmann::json kernels = nlohmann::json::array();
      for (size_t i = 0; i < std::min<size_t>(30, r.profile->kernels.size()); ++i) {
        const bench::KernelTime& k = r.profile->kernels[i];
        kernels.push_back({{"name", k.name.substr(0, 240)},
                           {"calls_per_step", k.calls / steps},
                           {"us_per_step", 1e3 * k.total_ms / steps}});
      }
      json_cases.back()["kernel_profile"] = {{"steps", r.profile->steps},
                                             {"busy_ms_per_step", r.profile->busy_ms / steps},
                                             {"wall_ms_per_step", r.profile->wall_ms / steps},
                                             {"kinds", r.profile->kernels.size()},
                                             {"top", kernels}};
    }
  }
  const nlohmann::json report = {
      {"benchmark", "engine_overhead"},
      {"goal", absl::StrFormat("engine step <= %.2fx raw middle forward", args.goal)},
      {"goal_ratio", args.goal},
      {"model",
       {{"dir", args.model_dir.empty() ? "random bench-110m" : args.model_dir},
        {"layers_begin", spec.layers.begin},
        {"layers_end", spec.layers.end},
        {"hidden_size", c.hidden_size},
        {"weight_bytes", middle->WeightBytes()},
        {"stored_weight_bytes", middle->StoredWeightBytes()}}},
      {"kv_block_size", args.kv_block_size},
      {"device", device.str()},
      {"cuda_graphs", raw->graphs()},
      {"small_batch_gemm", {{"mode", args.small_batch_gemm}, {"rows", small_batch_rows}}},
      {"overlapped_launches", overlapped},
      {"fused_split_merge", args.fused_split_merge},
      {"verification_as_decode_rows", args.verification_as_decode_rows},
      {"mxfp4_experts", args.mxfp4_experts},
      {"int8_activations", args.int8_activations},
      // float32 prompts through kernels/gemm_f32.h rather than BLAS (aten::mm).
      {"f32_prompt_kernel", device.is_cpu() && kernels::F32PromptKernelChosen()},
      {"dtype", args.dtype},
      {"bounds",
       {{"memory_bytes_per_second", bounds.bandwidth},
        {"memory_method",
         device.is_cpu() ? "multi-threaded read" : "device-to-device copy, read + write"},
        {"gemm_flops", bounds.gemm_flops}}},
      {"raw_caches", "paged, own KvBlockPool"},
      {"aten_threads", at::get_num_threads()},
      {"cpus", UsableCpuCount()},
      {"cases", json_cases},
      {"all_pass", all_pass}};

  std::string table = Table(cases, args.goal);
  for (const CaseResult& r : cases) {
    if (!r.profile.has_value()) continue;
    absl::StrAppend(&table, "\nkernel profile of ", r.name, " (", r.profile->steps,
                    " engine steps, ", device.is_cpu() ? "outermost ATen ops" : "device work",
                    "):\n", bench::KernelTable(*r.profile, args.profile_top));
  }
  if (absl::Status s = bench::PrintReport(table, report, args.json_path); !s.ok()) {
    return Fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace tophat

int main(int argc, char** argv) {
  tophat::Args args;
  CLI::App app{
      "tophat-bench-engine: one cloud engine step (Engine::RunOnce: intake, validation, "
      "planning, staging, forward, result serialization) against the raw middle-submodel "
      "forward of the same tokens over paged KV, measured alternately in the same run. "
      "Prints a table and a JSON report."};
  app.add_option("--model", args.model_dir,
                 "Checkpoint directory (default: a random bench-110m checkpoint in a scratch "
                 "directory)")
      ->check(CLI::ExistingDirectory);
  app.add_option("-m,--input-layers", args.input_layers, "The middle starts at layer m")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("-k,--output-layers", args.output_layers, "... and ends k layers before the last")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--context", args.context, "Positions of history per decode session")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--verify-batch", args.verify_batches,
                 "Speculative verification cases: batch sizes (sessions, each sending "
                 "--verify-tokens positions a step); none by default")
      ->check(CLI::PositiveNumber);
  app.add_option("--verify-tokens", args.verify_tokens,
                 "Positions a session sends a verification step (the draft and one more)")
      ->check(CLI::Range(int64_t{2}, int64_t{64}));
  app.add_option("--batch", args.batches, "Decode batch sizes (sessions, one token each)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prefill-tokens", args.prefill_tokens, "Prefill chunk size; 0 skips it")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--repetitions", args.repetitions, "Timed decode steps per batch size")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prefill-repetitions", args.prefill_repetitions, "Timed prefill chunks")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--cuda-graph-max-batch", args.cuda_graph_max_batch,
                 "On a GPU, decode steps of up to this many sessions replay CUDA graphs, in the "
                 "engine and the raw path alike (0: both eager)")
      ->capture_default_str();
  app.add_option("--profile-steps", args.profile_steps,
                 "After each case's timed steps, this many more engine steps under PyTorch's "
                 "profiler: a table of the kernels (on the CPU, outermost ATen ops) a step "
                 "spends its time in, and how much of the step they fill")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--profile-top", args.profile_top, "Rows of each kernel profile table")
      ->capture_default_str();
  app.add_option("--warmup", args.warmup, "Untimed decode steps first")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--kv-block-size", args.kv_block_size)->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--goal", args.goal, "Largest passing engine/raw ratio")->capture_default_str();
  app.add_option("--seed", args.seed)->capture_default_str();
  app.add_option("--json", args.json_path, "Also write the JSON report here");
  app.add_option("--device", args.device, "Where the middle runs: cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--dtype", args.dtype, "Compute dtype: float32, float16 or bfloat16")
      ->capture_default_str();
  app.add_option("--small-batch-gemm", args.small_batch_gemm,
                 "GPU steps of 1-8 rows: the small-batch GEMM kernel where it measured faster "
                 "at load (measured), for every matrix (always), or cuBLAS only (never)")
      ->check(CLI::IsMember({"measured", "always", "never"}))
      ->capture_default_str();
  std::string overlap = "on";
  app.add_option("--overlap-launches", overlap,
                 "On a GPU of compute capability 9.0+: tophat's kernels overlap the kernel before "
                 "them (on) or are serialized (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string fused_split_merge = "on";
  app.add_option("--fused-split-merge", fused_split_merge,
                 "On a GPU: split decode attention merges in the attention kernel (on) or in a "
                 "second kernel (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string verification_as_decode_rows = "on";
  app.add_option("--verification-as-decode-rows", verification_as_decode_rows,
                 "On a GPU: the --verify-batch cases' chunks attend as decode rows (on) or as "
                 "prompt chunks (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string mxfp4_experts = "on";
  app.add_option("--mxfp4-experts", mxfp4_experts,
                 "gpt-oss's experts stored in MXFP4: held and computed so (on) or dequantized to "
                 "float32 as they load (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string int8_activations = "off";
  app.add_option("--int8-activations", int8_activations,
                 "On the CPU in float32: int8 matrices and experts held in MXFP4 round their "
                 "inputs to int8 per block of 32 and multiply in integers (on), or multiply "
                 "float32 inputs (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  args.mxfp4_experts = mxfp4_experts == "on";
  args.int8_activations = int8_activations == "on";
  args.verification_as_decode_rows = verification_as_decode_rows == "on";
  args.overlap_launches = overlap == "on";
  args.fused_split_merge = fused_split_merge == "on";
  spdlog::set_level(spdlog::level::warn);
  return tophat::Run(args);
}
