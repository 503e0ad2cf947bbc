#include "server/engine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "base/memory_release.h"
#include "base/status_macros.h"
#include "kernels/host_copy.h"
#include "proto/hidden_states.h"
#include "proto/protocol_version.h"
#include "base/clock.h"

namespace tophat {
namespace {


// How long the loop sleeps with no work before it checks deadlines again.
constexpr auto kIdleWait = std::chrono::milliseconds(50);
// Load reports: at most this often while the load changes (an agent places a request by a
// report at most this old, plus its own placements since), and this often regardless, so
// that an agent can tell a quiet cloud from a lost report. Each is a ~20-byte message per
// stream.
constexpr auto kLoadReportInterval = std::chrono::milliseconds(200);
// The step-time curve changes slowly; its gauges are for scrapes and simulations.
constexpr auto kCurveExportInterval = std::chrono::seconds(1);
constexpr auto kLoadReportHeartbeat = std::chrono::seconds(5);

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       std::shared_ptr<const Submodel> middle,
                                                       CloudMetrics* metrics) {
  if (middle == nullptr) return absl::InvalidArgumentError("engine needs a middle submodel");
  if (options.kv_block_size <= 0 || options.kv_num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool needs positive block size and count, got ",
                                                   options.kv_block_size, " x ",
                                                   options.kv_num_blocks));
  }
  if (options.max_batch_tokens <= 0 || options.max_chunk_tokens <= 0) {
    return absl::InvalidArgumentError("max_batch_tokens and max_chunk_tokens must be positive");
  }
  TOPHAT_ASSIGN_OR_RETURN(
      std::shared_ptr<KvBlockPool> pool,
      KvBlockPool::Create(middle->config(), middle->spec().layers.size(), options.kv_num_blocks,
                          options.kv_block_size, middle->options().dtype,
                          middle->options().device));
  auto engine = std::unique_ptr<Engine>(
      new Engine(options, std::move(middle), std::move(pool), metrics));
  TOPHAT_RETURN_IF_ERROR(engine->Warmup());
  return engine;
}

absl::Status Engine::Warmup() {
  // One forward at the largest step shape, so the allocator's pools and the BLAS threads are
  // ready before the first session (STYLE.md: warm up once at the worst case).
  c10::InferenceMode inference_mode;
  // The caller's thread: its current device may be another GPU than the middle's.
  const c10::DeviceGuard device_guard(middle_->options().device);
  const bool gpu = !middle_->options().device.is_cpu();
  // Every step runs in these, a middle without layers too (Launch passes them always).
  TOPHAT_RETURN_IF_ERROR(CatchExceptions("allocating the engine's step buffers", [&] {
    step_buffers_.emplace(middle_->NewStepBuffers(staging_.size(0), options_.kv_block_size));
    if (gpu) {
      for (InFlight& batch : in_flight_) {
        // Pinned (a tensor's options() do not carry that): a read-back into pageable memory
        // is synchronous, and would hold the engine thread until the step's kernels end.
        batch.host_output = at::empty(staging_.sizes(), staging_.options().pinned_memory(true));
      }
    }
  }));
  if (middle_->spec().layers.empty()) return absl::OkStatus();
  const int64_t rows = std::min<int64_t>(staging_.size(0), middle_->max_context());
  KvCache cache = middle_->NewCache(rows);
  at::Tensor input = staging_.narrow(0, 0, rows).zero_();
  const SequenceChunk chunk{.cache = &cache, .num_tokens = rows};
  absl::StatusOr<at::Tensor> out =
      middle_->Forward(input, std::span<const SequenceChunk>(&chunk, 1), *step_buffers_);
  if (out.ok() && gpu) {
    // The read-back path too, so that the first step pays for nothing.
    absl::Status read = CatchExceptions("reading back the warm-up forward", [&] {
      in_flight_.front().host_output.narrow(0, 0, rows).copy_(*out, /*non_blocking=*/true);
      in_flight_.front().output_read.Record();
      in_flight_.front().output_read.Wait();
    });
    if (!read.ok()) out = read;
  }
  const int64_t graph_batch = std::min({options_.cuda_graph_max_batch,
                                        options_.max_running_sessions, staging_.size(0)});
  if (out.ok() && gpu && graph_batch > 0) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::unique_ptr<DecodeGraphs>> graphs =
        DecodeGraphs::Capture(*middle_, *pool_, *step_buffers_, graph_batch);
    if (graphs.ok()) {
      decode_graphs_ = std::move(*graphs);
      spdlog::info("decode steps of up to {} sessions replay CUDA graphs ({} captured in {:.1f} s)",
                   graph_batch, decode_graphs_->buckets().size(), Seconds(Clock::now() - start));
    } else {
      // Slower, not wrong: every step runs eagerly.
      spdlog::warn("decode steps run eagerly: {}", graphs.status().ToString());
    }
  }
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        absl::StrCat("engine warm-up forward: ", out.status().message()));
  }
  return absl::OkStatus();
}

Engine::Engine(EngineOptions options, std::shared_ptr<const Submodel> middle,
               std::shared_ptr<KvBlockPool> pool, CloudMetrics* metrics)
    : options_(std::move(options)),
      middle_(std::move(middle)),
      device_watch_(middle_->options().device, "the cloud's", options_.device_check),
      pool_(std::move(pool)),
      metrics_(metrics),
      allocator_(static_cast<int32_t>(options_.kv_num_blocks),
                 static_cast<int32_t>(options_.kv_block_size)),
      monitor_(std::max<int64_t>(1, options_.max_batch_tokens), /*alpha=*/0.8,
               options_.downstream != nullptr ? options_.downstream->stages() : 1),
      device_ledger_({.max_sessions = options_.max_sessions_per_device,
                      .max_waiting = options_.max_waiting_sessions_per_device,
                      .max_kv_blocks = options_.max_kv_blocks_per_device,
                      .weights = options_.device_weights}),
      decode_step_stretch_(options_.decode_step_stretch) {
  const ModelConfig& config = middle_->config();
  wire_dtype_ = ToProtoDType(middle_->options().dtype).value_or(v1::DTYPE_FLOAT32);
  row_bytes_ = config.hidden_size * ElementBytes(wire_dtype_);
  result_format_ = {.compute_dtype = middle_->options().dtype,
                    .compute_wire_dtype = wire_dtype_,
                    .hidden_size = config.hidden_size,
                    .max_piece_bytes = options_.max_result_piece_bytes};
  hello_.set_model_id(options_.model_id);
  hello_.set_model_fingerprint(options_.model_fingerprint);
  hello_.set_protocol_version(kCloudProtocolVersion);
  hello_.set_parks_sessions(options_.max_parked_session_s > 0);
  hello_.set_forks_sessions(options_.max_parked_session_s > 0);
  hello_.set_hidden_size(static_cast<uint32_t>(config.hidden_size));
  hello_.set_dtype(wire_dtype_);
  hello_.set_first_layer(static_cast<uint32_t>(middle_->spec().layers.begin));
  hello_.set_end_layer(static_cast<uint32_t>(options_.downstream != nullptr
                                                 ? options_.downstream->end_layer()
                                                 : middle_->spec().layers.end));
  hello_.set_max_positions(static_cast<uint32_t>(middle_->max_context()));
  hello_.set_max_chunk_positions(static_cast<uint32_t>(options_.max_chunk_tokens));
  wire_choices_ = options_.wire_dtypes;
  std::stable_sort(wire_choices_.begin(), wire_choices_.end(), [&](v1::DType a, v1::DType b) {
    return WireBytesPerPosition(a, config.hidden_size) > WireBytesPerPosition(b, config.hidden_size);
  });
  for (v1::DType dtype : wire_choices_) {
    wire_choice_bytes_.push_back(static_cast<double>(WireBytesPerPosition(dtype, config.hidden_size)));
  }
  *hello_.mutable_control() = options_.control;
  if (!wire_choices_.empty()) hello_.mutable_control()->set_wire_dtype(wire_choices_.back());

  const int64_t rows = std::max(options_.max_batch_tokens, options_.max_chunk_tokens);
  // Pinned on a GPU server: the upload of a step's input is then an asynchronous DMA.
  staging_ = at::empty({rows, config.hidden_size},
                       at::TensorOptions()
                           .dtype(middle_->options().dtype)
                           .pinned_memory(!middle_->options().device.is_cpu()));
  const size_t max_sessions = options_.max_running_sessions + options_.max_waiting_sessions;
  pending_.reserve(max_sessions);
  pending_sessions_.reserve(max_sessions);
  arrival_sessions_.reserve(max_sessions);
  pending_groups_.reserve(max_sessions);
  // Slots: at most one a device with a session open.
  fair_order_.Reserve(max_sessions, max_sessions);
  plan_.reserve(max_sessions);
  chunks_.reserve(max_sessions);
  pipeline_depth_ =
      options_.downstream != nullptr ? static_cast<size_t>(options_.downstream->stages()) : 1;
  in_flight_.resize(pipeline_depth_);
  for (InFlight& batch : in_flight_) batch.parts.reserve(max_sessions);
  if (metrics_ != nullptr) metrics_->kv_cache_blocks_total.Set(options_.kv_num_blocks);
  UpdateGauges();
}

Engine::~Engine() { Stop(); }

uint64_t Engine::Post(Event event) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(intake_mutex_);
    ticket = event.ticket = ++next_ticket_;
    intake_.push_back(std::move(event));
  }
  intake_cv_.notify_one();
  return ticket;
}

void Engine::AttachStream(StreamId stream, std::shared_ptr<MessageSink> sink, std::string device) {
  Post({.kind = Event::Kind::kAttach,
        .stream = stream,
        .sink = std::move(sink),
        .device = std::move(device)});
}

void Engine::Deliver(StreamId stream, v1::AgentMessage message) {
  Post({.kind = Event::Kind::kMessage,
        .stream = stream,
        .message = std::move(message),
        .received = Clock::now()});
}

void Engine::DetachStream(StreamId stream) {
  Post({.kind = Event::Kind::kDetach, .stream = stream});
}

void Engine::CancelAll(const absl::Status& status) {
  Post({.kind = Event::Kind::kCancelAll, .status = status});
}

void Engine::BeginDrain() { draining_ = true; }

void Engine::Start() {
  last_turn_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                   std::memory_order_relaxed);
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

bool Engine::WaitForNoSessions(std::chrono::steady_clock::time_point deadline) {
  idle_waiters_.fetch_add(1);
  const uint64_t barrier = Post({.kind = Event::Kind::kBarrier});
  std::unique_lock<std::mutex> lock(idle_mutex_);
  const bool none = idle_cv_.wait_until(lock, deadline, [&] {
    return handled_ticket_.load() >= barrier && stat_running_ + stat_waiting_ == 0;
  });
  idle_waiters_.fetch_sub(1);
  return none;
}

void Engine::Wake() {
  {
    std::lock_guard<std::mutex> lock(intake_mutex_);
    wake_ = true;
  }
  intake_cv_.notify_one();
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(intake_mutex_);
    stopping_ = true;
  }
  intake_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

v1::Hello Engine::hello() const { return hello_; }

void Engine::UpdateDeviceLimits(DeviceLimits limits, double decode_step_stretch) {
  Post({.kind = Event::Kind::kLimits,
        .limits = std::make_shared<const DeviceLimits>(std::move(limits)),
        .decode_step_stretch = decode_step_stretch});
}

absl::StatusOr<DevicesReport> Engine::Devices(size_t limit,
                                              std::chrono::steady_clock::time_point deadline) {
  auto report = std::make_shared<std::promise<DevicesReport>>();
  std::future<DevicesReport> answer = report->get_future();
  Post({.kind = Event::Kind::kReport, .report = std::move(report), .report_limit = limit});
  if (answer.wait_until(deadline) != std::future_status::ready) {
    return absl::UnavailableError(
        "the engine thread did not answer in time (a long step, or a stopped or wedged engine)");
  }
  try {
    return answer.get();
  } catch (const std::future_error&) {
    // The engine dropped the event unanswered (it stopped).
    return absl::UnavailableError("the engine has stopped");
  }
}

EngineStats Engine::stats() const {
  return {.sessions_running = stat_running_,
          .sessions_waiting = stat_waiting_,
          .kv_blocks_allocated = stat_blocks_,
          .kv_blocks_total = options_.kv_num_blocks,
          .steps = stat_steps_,
          .sessions_parked = stat_parked_};
}

void Engine::Loop() {
  // Per-thread state lives at the top of the thread (STYLE.md).
  c10::InferenceMode inference_mode;
  // The step's own CUDA work (pinned read-backs, their events, a pipeline's transfers) goes to
  // the current device's stream: the middle's, not the thread's default cuda:0.
  const c10::DeviceGuard device_guard(middle_->options().device);
  pthread_setname_np(pthread_self(), "tophat-engine");
  while (true) {
    last_turn_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                     std::memory_order_relaxed);
    // Work the step would take now, or a step to complete. Work of congested streams is not
    // work: the loop then waits for intake, a Wake (a stream drained) or kIdleWait, instead
    // of spinning over sessions its step skips.
    bool has_work = in_flight_count_ > 0;
    for (const auto& [key, session] : sessions_) {
      if (has_work) break;
      has_work = Runnable(*session);
    }
    if (!DrainIntake(/*wait=*/!has_work)) break;
    StepAfterIntake();
  }
  // Shutdown: steps in flight are completed (a pipeline's stages answer them), whatever is
  // left is cancelled, and its KV freed, before the thread exits.
  while (in_flight_count_ > 0) Complete();
  std::vector<SessionKey> keys;
  for (const auto& [key, session] : sessions_) keys.push_back(key);
  for (const SessionKey& key : keys) {
    FailSession(key, 0, absl::UnavailableError("the cloud is shutting down"));
  }
  UpdateGauges();
}

int64_t Engine::RunOnce() {
  c10::InferenceMode inference_mode;
  const c10::DeviceGuard device_guard(middle_->options().device);  // as Loop
  DrainIntake(/*wait=*/false);
  return StepAfterIntake();
}

int64_t Engine::StepAfterIntake() {
  ExpireDeadlines();
  AdmitWaiting();
  const int64_t tokens = Step();
  UpdateGauges();
  return tokens;
}

bool Engine::DrainIntake(bool wait) {
  {
    std::unique_lock<std::mutex> lock(intake_mutex_);
    if (wait && intake_.empty() && !stopping_) {
      intake_cv_.wait_for(lock, kIdleWait,
                          [&] { return !intake_.empty() || stopping_ || wake_; });
    }
    wake_ = false;
    if (stopping_) return false;
    events_.swap(intake_);
  }
  for (Event& event : events_) {
    HandleEvent(event);
    drained_ticket_ = std::max(drained_ticket_, event.ticket);
  }
  events_.clear();
  return true;
}

void Engine::HandleEvent(Event& event) {
  switch (event.kind) {
    case Event::Kind::kAttach: {
      StreamState& state = streams_[event.stream];
      state.sink = event.sink;
      // A plaintext stream has no identity: it is its own device for the limits.
      state.device = event.device.empty() ? absl::StrCat("stream ", event.stream)
                                          : absl::StrCat("device ", event.device);
      v1::CloudMessage hello;
      *hello.mutable_hello() = hello_;
      *hello.mutable_hello()->mutable_load() = CurrentLoad();
      Send(event.stream, std::move(hello));
      if (metrics_ != nullptr) metrics_->streams_connected.Increment();
      return;
    }
    case Event::Kind::kMessage:
      HandleMessage(event.stream, event.message, event.received);
      return;
    case Event::Kind::kDetach: {
      // The agent is gone: free its sessions' KV now, within this step.
      auto first = sessions_.lower_bound({event.stream, 0});
      std::vector<SessionKey> keys;
      for (auto it = first; it != sessions_.end() && it->first.first == event.stream; ++it) {
        keys.push_back(it->first);
      }
      for (const SessionKey& key : keys) EraseSession(key);
      monitor_.ForgetDevice(event.stream);
      if (streams_.erase(event.stream) > 0 && metrics_ != nullptr) {
        metrics_->streams_connected.Decrement();
      }
      if (!keys.empty()) {
        spdlog::info("stream {} closed; freed {} session(s)", event.stream, keys.size());
      }
      // The chunks and KV bookkeeping it held go back to the system, not only to malloc.
      ReleaseFreedMemory();
      return;
    }
    case Event::Kind::kCancelAll:
      FailAllSessions(event.status);
      return;
    case Event::Kind::kBarrier:
      return;
    case Event::Kind::kLimits:
      device_ledger_.SetLimits(*event.limits);
      decode_step_stretch_ = event.decode_step_stretch;
      return;
    case Event::Kind::kReport: {
      DevicesReport report{.devices = static_cast<int64_t>(device_ledger_.num_devices()),
                           .streams = static_cast<int64_t>(streams_.size()),
                           .kv_blocks_total = options_.kv_num_blocks,
                           .kv_blocks_allocated = stat_blocks_};
      std::unordered_map<std::string, int64_t> streams_of;
      for (const auto& [id, stream] : streams_) ++streams_of[stream.device];
      for (auto& [device, usage] : device_ledger_.Top(event.report_limit)) {
        const auto streams = streams_of.find(device);
        report.top.push_back({.device = std::move(device),
                              .sessions = usage.sessions,
                              .waiting = usage.waiting,
                              .kv_blocks = usage.blocks,
                              .streams = streams == streams_of.end() ? 0 : streams->second});
      }
      event.report->set_value(std::move(report));
      return;
    }
  }
}

void Engine::HandleMessage(StreamId stream, v1::AgentMessage& message,
                           Clock::time_point received) {
  if (!streams_.contains(stream)) return;  // raced with its detach
  if (message.kind_case() == v1::AgentMessage::kForward) {
    // Released for flow control when computed, dropped or refused.
    AcceptChunk(stream, *message.mutable_forward(), received);
    return;
  }
  bool held = false;  // a Truncate waiting behind chunks keeps its intake cost until applied
  switch (message.kind_case()) {
    case v1::AgentMessage::kOpen:
      Open(stream, message.open());
      break;
    case v1::AgentMessage::kTruncate:
      held = ApplyTruncate(stream, message.truncate());
      break;
    case v1::AgentMessage::kCancel:
    case v1::AgentMessage::kClose: {
      const uint64_t id = message.kind_case() == v1::AgentMessage::kCancel
                              ? message.cancel().session_id()
                              : message.close().session_id();
      // Closing an unknown session is not an error: it may have failed or expired already.
      if (Find(stream, id) != nullptr) EraseSession({stream, id});
      break;
    }
    case v1::AgentMessage::kPark:
      Park(stream, message.park());
      break;
    case v1::AgentMessage::kResume:
      Resume(stream, message.resume());
      break;
    case v1::AgentMessage::kFork:
      Fork(stream, message.fork());
      break;
    case v1::AgentMessage::kDeviceState: {
      const v1::DeviceState& state = message.device_state();
      monitor_.ObserveDevice(stream, {.uplink_bytes_per_second = state.uplink_bytes_per_second(),
                                      .downlink_bytes_per_second = state.downlink_bytes_per_second(),
                                      .draft_step_seconds = state.draft_step_seconds(),
                                      .draft_tokens_per_round = state.mean_round_length()});
      if (options_.adaptive) DecideForStream(stream);
      break;
    }
    case v1::AgentMessage::kForward:
      break;  // above
    case v1::AgentMessage::KIND_NOT_SET:
      SendError(stream, 0, 0, absl::InvalidArgumentError("AgentMessage.kind is not set"), true);
      break;
  }
  if (auto it = streams_.find(stream); !held && it != streams_.end() && it->second.sink) {
    it->second.sink->Consumed(kIntakeMessageBytes);
  }
}

void Engine::Open(StreamId stream, const v1::OpenSession& open) {
  const uint64_t id = open.session_id();
  if (draining_) {
    SendError(stream, id, 0,
              absl::UnavailableError("the cloud is draining and admits no new sessions"), false);
    return;
  }
  if (Find(stream, id) != nullptr) {
    SendError(stream, id, 0,
              absl::AlreadyExistsError(absl::StrCat("open.session_id ", id,
                                                    " is already open on this stream")),
              true);
    return;
  }
  const int64_t max_positions = open.max_positions();
  if (max_positions <= 0 || max_positions > middle_->max_context()) {
    SendError(stream, id, 0,
              absl::InvalidArgumentError(absl::StrCat("open.max_positions is ", max_positions,
                                                      "; it must be in [1, ",
                                                      middle_->max_context(), "]")),
              false);
    return;
  }
  const auto stream_state = streams_.find(stream);
  const std::string device =
      stream_state != streams_.end() ? stream_state->second.device : absl::StrCat("stream ", stream);
  const int32_t blocks = allocator_.BlocksFor(max_positions);
  // The device's own parked conversations give way to its new session.
  EvictParked([&] { return !device_ledger_.QuotaProblem(device, blocks).has_value(); }, &device);
  if (std::optional<std::string> over = device_ledger_.QuotaProblem(device, blocks)) {
    SendError(stream, id, 0, absl::ResourceExhaustedError(*over), false);
    if (metrics_ != nullptr) metrics_->sessions_rejected.Increment();
    return;
  }
  if (blocks > allocator_.num_blocks()) {
    SendError(stream, id, 0,
              absl::ResourceExhaustedError(absl::StrCat(
                  "a session of ", max_positions, " positions needs ", blocks,
                  " KV blocks; the whole pool has ", allocator_.num_blocks())),
              false);
    if (metrics_ != nullptr) metrics_->sessions_rejected.Increment();
    return;
  }
  if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting_sessions) {
    if (waiting_.empty() && num_running_ < options_.max_running_sessions) {
      EvictParked([&] { return blocks <= allocator_.num_unreserved(); });
    }
    const bool room_now = waiting_.empty() &&
                          num_running_ < options_.max_running_sessions &&
                          blocks <= allocator_.num_unreserved();
    if (!room_now) {
      SendError(stream, id, 0,
                absl::ResourceExhaustedError(absl::StrCat(
                    "no KV for a new session: ", allocator_.num_unreserved(), " of ",
                    allocator_.num_blocks(), " blocks free, ", waiting_.size(),
                    " session(s) already waiting (max_waiting_sessions)")),
                false);
      if (metrics_ != nullptr) metrics_->sessions_rejected.Increment();
      return;
    }
  }
  v1::DType result_dtype = open.result_dtype();
  if (result_dtype == v1::DTYPE_UNSPECIFIED) result_dtype = wire_dtype_;
  if (ElementBytes(result_dtype) == 0) {
    SendError(stream, id, 0,
              absl::InvalidArgumentError(absl::StrCat(
                  "open.result_dtype ", static_cast<int>(open.result_dtype()),
                  " is not a hidden-state dtype this cloud knows")),
              false);
    return;
  }
  auto session = std::make_unique<Session>(pool_);
  session->stream = stream;
  session->id = id;
  session->result_dtype = result_dtype;
  session->max_positions = max_positions;
  session->opened = Clock::now();
  session->device = device;
  session->quota_blocks = blocks;
  session->device_slot = device_ledger_.Open(device, blocks);
  session->deadline = Deadline(session->opened, open.timeout_ms());
  sessions_.emplace(SessionKey{stream, id}, std::move(session));
  waiting_.push_back({stream, id});
  AdmitWaiting();
}

Clock::time_point Engine::Deadline(Clock::time_point from, uint32_t timeout_ms) const {
  double timeout_s = timeout_ms > 0 ? timeout_ms / 1000.0 : options_.session_timeout_s;
  if (options_.max_session_timeout_s > 0) {
    timeout_s = std::min(timeout_s, options_.max_session_timeout_s);
  }
  return from + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(timeout_s));
}

void Engine::DecideForStream(StreamId stream) {
  auto it = streams_.find(stream);
  const std::optional<DeviceEstimate> device = monitor_.device(stream);
  if (it == streams_.end() || !device) return;
  // Unknown measurements fall back to the configured defaults (scheduler/decode_decisions.h).
  const DeviceControl decided = DecideDeviceControl(
      *device,
      static_cast<double>(it->second.uplink_row_bytes > 0 ? it->second.uplink_row_bytes
                                                          : row_bytes_),
      monitor_.mean_batched_tokens(),
      monitor_.step_time(),
      {.default_prompt_chunk = options_.control.prompt_chunk_size(),
       .default_draft_steps = options_.control.draft_steps(),
       .min_chunk = options_.min_prompt_chunk,
       .max_chunk = options_.max_chunk_tokens,
       .max_step_seconds = options_.max_step_seconds,
       .max_draft_steps = options_.max_draft_steps,
       .pipeline_stages = static_cast<int64_t>(pipeline_depth_),
       .stage_step_times = monitor_.stage_step_times(),
       .wire_bytes_per_position = wire_choice_bytes_});
  if (!decided.chunk_size_measured && !decided.draft_steps_measured &&
      !decided.wire_dtype_measured) {
    return;
  }
  v1::Control control = options_.control;
  control.set_prompt_chunk_size(static_cast<uint32_t>(decided.prompt_chunk_size));
  control.set_draft_steps(static_cast<uint32_t>(decided.draft_steps));
  control.set_per_device(true);
  control.set_draft_steps_per_device(decided.draft_steps_measured);
  if (decided.wire_dtype >= 0) {
    control.set_wire_dtype(wire_choices_[static_cast<size_t>(decided.wire_dtype)]);
    control.set_wire_dtype_per_device(decided.wire_dtype_measured);
  }
  StreamState& state = it->second;
  if (state.control && state.control->prompt_chunk_size() == control.prompt_chunk_size() &&
      state.control->draft_steps() == control.draft_steps() &&
      state.control->draft_steps_per_device() == control.draft_steps_per_device() &&
      state.control->wire_dtype() == control.wire_dtype() &&
      state.control->wire_dtype_per_device() == control.wire_dtype_per_device()) {
    return;
  }
  state.control = control;
  if (metrics_ != nullptr) {
    if (decided.chunk_size_measured) metrics_->scheduler_chunk_size.Observe(control.prompt_chunk_size());
    if (decided.draft_steps_measured) metrics_->scheduler_draft_steps.Observe(control.draft_steps());
    if (decided.wire_dtype_measured) {
      metrics_->scheduler_wire_choices.Add({{"dtype", WireDtypeName(control.wire_dtype())}})
          .Increment();
    }
  }
  v1::CloudMessage message;
  *message.mutable_control() = control;
  Send(stream, std::move(message));
}

void Engine::AdmitWaiting() {
  // First come, first served: the head waits rather than being overtaken by smaller ones,
  // so a long session cannot starve.
  while (!waiting_.empty()) {
    const SessionKey key = waiting_.front();
    Session* session = Find(key.first, key.second);
    if (session == nullptr) {
      waiting_.pop_front();
      continue;
    }
    if (num_running_ >= options_.max_running_sessions) break;
    // A resumed session already holds the blocks of its positions.
    const int32_t blocks = std::max<int32_t>(
        0, allocator_.BlocksFor(session->max_positions) -
               static_cast<int32_t>(session->cache.block_table().size()));
    // Parked conversations give way to sessions that would run now.
    EvictParked([&] { return blocks <= allocator_.num_unreserved(); });
    if (!allocator_.Reserve(blocks)) break;
    waiting_.pop_front();
    session->reserved_blocks = blocks;
    session->state = SessionState::kRunning;
    ++num_running_;
    device_ledger_.Admit(session->device);
    if (session->fork_source && !CompleteFork(key, *session)) continue;
    const double queued = Seconds(Clock::now() - session->opened);
    if (metrics_ != nullptr) {
      metrics_->sessions_admitted.Increment();
      metrics_->request_queue_time_seconds.Observe(queued);
    }
    v1::CloudMessage message;
    message.mutable_admitted()->set_session_id(key.second);
    message.mutable_admitted()->set_queue_seconds(queued);
    Send(key.first, std::move(message));
  }
}

void Engine::AcceptChunk(StreamId stream, v1::ForwardChunk& chunk, Clock::time_point received) {
  const uint64_t id = chunk.session_id();
  // A refused chunk is released at once for the stream's flow control; an accepted one when
  // its last position has been computed.
  const auto release = [&] {
    streams_[stream].sink->Consumed(kIntakeMessageBytes +
                                    static_cast<int64_t>(chunk.states().data().size()));
  };
  Session* session = Find(stream, id);
  if (session == nullptr) {
    release();
    SendError(stream, id, chunk.sequence_number(),
              absl::NotFoundError(absl::StrCat("forward.session_id ", id,
                                               " is not an open session on this stream")),
              false);
    return;
  }
  const v1::HiddenStates& states = chunk.states();
  // Any wire dtype: a payload not in the compute dtype is converted once it is accepted.
  absl::Status valid = ValidateHiddenStates(states, v1::DTYPE_UNSPECIFIED,
                                            middle_->config().hidden_size,
                                            options_.max_chunk_tokens);
  if (valid.ok() && chunk.first_position() != session->next_position) {
    valid = absl::InvalidArgumentError(absl::StrCat(
        "forward.first_position is ", chunk.first_position(), "; the session's next position is ",
        session->next_position, " (chunks must continue the KV without gaps)"));
  }
  if (valid.ok() && chunk.first_position() + states.num_positions() > session->max_positions) {
    valid = absl::OutOfRangeError(absl::StrCat(
        "forward would reach position ", chunk.first_position() + states.num_positions(),
        ", beyond the session's open.max_positions ", session->max_positions));
  }
  if (valid.ok() && chunk.phase() == v1::PHASE_UNSPECIFIED) {
    valid = absl::InvalidArgumentError("forward.phase is not set");
  }
  if (!valid.ok()) {
    release();
    FailSession({stream, id}, chunk.sequence_number(), valid);
    return;
  }
  if (metrics_ != nullptr) {
    metrics_->hidden_state_bytes_in.Increment(states.data().size() + states.scales().size());
  }
  streams_[stream].uplink_row_bytes =
      WireBytesPerPosition(states.dtype(), middle_->config().hidden_size);
  WorkItem item;
  item.sequence_number = chunk.sequence_number();
  item.first_position = chunk.first_position();
  item.num_tokens = states.num_positions();
  item.decode = chunk.phase() == v1::PHASE_DECODE;
  // Its next result is a token from here on (Session::decoding).
  session->decoding = item.decode || chunk.decode_follows();
  if (item.decode && session->last_decode_done != Clock::time_point{} &&
      received > session->last_decode_done) {
    // A run sent ahead (PipeInfer) arrives before the result it follows: no sample. The
    // shortest: what the links and the device take at their best, not what this cloud's
    // own load adds (its results waiting behind others' to leave, a busy host), which
    // would otherwise loosen the cap the more the cloud is loaded.
    const double away = Seconds(received - session->last_decode_done);
    session->decode_away_seconds = session->decode_away_seconds == 0
                                       ? away
                                       : std::min(session->decode_away_seconds, away);
  }
  item.arrival = next_arrival_++;
  item.wire_bytes = kIntakeMessageBytes + static_cast<int64_t>(states.data().size());
  if (states.dtype() == wire_dtype_) {
    item.data = std::move(*chunk.mutable_states()->mutable_data());
  } else {
    item.data.resize(item.num_tokens * row_bytes_);
    DecodeHiddenStates(states, middle_->options().dtype, item.data.data());
  }
  item.received = received;
  session->next_position += item.num_tokens;
  session->work.push_back(std::move(item));
}

bool Engine::ApplyTruncate(StreamId stream, const v1::Truncate& truncate) {
  const uint64_t id = truncate.session_id();
  Session* session = Find(stream, id);
  if (session == nullptr) {
    SendError(stream, id, truncate.sequence_number(),
              absl::NotFoundError(absl::StrCat("truncate.session_id ", id,
                                               " is not an open session on this stream")),
              false);
    return false;
  }
  const int64_t length = truncate.length();
  if (length > session->next_position) {
    SendError(stream, id, truncate.sequence_number(),
              absl::OutOfRangeError(absl::StrCat(
                  "truncate.length is ", length, " but the session's chunks end at position ",
                  session->next_position)),
              true);
    return false;
  }
  // The truncate comes after every chunk queued before it (stream order): positions those
  // chunks hold at or past `length` would be computed only to be dropped, so chunks not yet
  // started lose them (a speculative run the agent has given up on costs no compute). A chunk
  // in a step already launched is finished, and the truncate waits behind it.
  auto sink = streams_.find(stream);
  int64_t dropped = 0;
  while (!session->work.empty()) {
    WorkItem& last = session->work.back();
    // in_flight is the head's: a launched step holds it.
    const bool started = last.done > 0 || (session->in_flight && &last == &session->work.front());
    if (last.truncate_to >= 0 || started) break;
    if (last.first_position >= length) {
      dropped += last.num_tokens;
      if (sink != streams_.end()) sink->second.sink->Consumed(last.wire_bytes);
      session->work.pop_back();
      continue;
    }
    if (last.first_position + last.num_tokens > length) {
      dropped += last.first_position + last.num_tokens - length;
      last.num_tokens = length - last.first_position;
    }
    break;
  }
  if (dropped > 0 && metrics_ != nullptr) metrics_->truncated_unstarted_positions.Increment(dropped);
  session->next_position = length;
  if (session->work.empty()) {
    TruncateNow(*session, truncate.sequence_number(), length);
    return false;
  }
  // Only ApplyQueuedTruncates reads a marker: it never reaches Launch at the head. It holds
  // its message's intake cost until applied.
  WorkItem marker;
  marker.sequence_number = truncate.sequence_number();
  marker.truncate_to = length;
  marker.wire_bytes = kIntakeMessageBytes;
  session->work.push_back(std::move(marker));
  return true;
}

void Engine::TruncateNow(Session& session, uint64_t sequence_number, int64_t length) {
  absl::Status status = session.cache.Truncate(length);
  if (!status.ok()) {
    SendError(session.stream, session.id, sequence_number,
              absl::OutOfRangeError(absl::StrCat("truncate.length: ", status.message())), true);
    return;
  }
  // Blocks past the new end go back to the pool but stay promised to this session.
  released_blocks_.clear();
  session.cache.ReleaseUnusedBlocks(released_blocks_);
  for (int32_t block : released_blocks_) {
    allocator_.Free(block);
    allocator_.Reserve(1);
    ++session.reserved_blocks;
  }
  v1::CloudMessage message;
  message.mutable_truncated()->set_session_id(session.id);
  message.mutable_truncated()->set_sequence_number(sequence_number);
  message.mutable_truncated()->set_length(static_cast<uint32_t>(length));
  Send(session.stream, std::move(message));
}

void Engine::ApplyQueuedTruncates(Session& session) {
  while (!session.work.empty() && session.work.front().truncate_to >= 0) {
    const WorkItem marker = std::move(session.work.front());
    session.work.pop_front();
    if (auto stream = streams_.find(session.stream); stream != streams_.end()) {
      stream->second.sink->Consumed(marker.wire_bytes);
    }
    TruncateNow(session, marker.sequence_number, marker.truncate_to);
  }
}

void Engine::ExpireDeadlines() {
  const Clock::time_point now = Clock::now();
  std::vector<SessionKey> expired;
  for (const auto& [key, session] : sessions_) {
    if (now >= session->deadline) expired.push_back(key);
  }
  for (const SessionKey& key : expired) {
    Session* session = Find(key.first, key.second);
    if (session != nullptr && session->state == SessionState::kParked) {
      // Nobody waits on a parked session: it goes, and its agent is told.
      if (metrics_ != nullptr) metrics_->parked_sessions_expired.Increment();
      LetParkedGo(key, "its keep-alive ran out", /*admit_waiting=*/true);
      continue;
    }
    FailSession(key, 0, absl::DeadlineExceededError("the session's deadline passed"));
  }
}

void Engine::Park(StreamId stream, const v1::ParkSession& park) {
  const SessionKey key{stream, park.session_id()};
  Session* session = Find(stream, park.session_id());
  if (session == nullptr) return;  // failed or expired already: nothing to keep
  const double keep_s =
      std::min(park.keep_alive_ms() / 1000.0, options_.max_parked_session_s);
  // Only a session at rest is kept: one with work left (an agent that parks mid-round) or
  // not yet admitted is closed, and its next turn starts afresh.
  if (keep_s <= 0 || session->state != SessionState::kRunning || !session->work.empty() ||
      session->in_flight) {
    EraseSession(key);
    return;
  }
  allocator_.Unreserve(session->reserved_blocks);
  session->reserved_blocks = 0;
  --num_running_;
  session->state = SessionState::kParked;
  session->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(keep_s));
  // Against its device's quota it now counts what it holds, not what it could grow to.
  const int32_t held = static_cast<int32_t>(session->cache.block_table().size());
  device_ledger_.Recount(session->device, session->quota_blocks, held);
  session->quota_blocks = held;
  session->parked_entry = parked_.insert(parked_.end(), key);
  AdmitWaiting();  // its reservation is free for others
}

void Engine::Resume(StreamId stream, const v1::ResumeSession& resume) {
  const uint64_t old_id = resume.session_id();
  // Answers go to the id the agent waits on.
  const uint64_t id = resume.new_session_id() != 0 ? resume.new_session_id() : old_id;
  Session* session = Find(stream, old_id);
  if (session == nullptr || session->state != SessionState::kParked) {
    SendError(stream, id, 0,
              absl::NotFoundError(absl::StrCat(
                  "resume.session_id ", old_id,
                  session == nullptr ? " is not held by this cloud (evicted, expired or never "
                                       "parked); open a new session"
                                     : " is not parked")),
              false);
    return;
  }
  if (id != old_id) {
    if (Find(stream, id) != nullptr) {
      SendError(stream, id, 0,
                absl::AlreadyExistsError(absl::StrCat("resume.new_session_id ", id,
                                                      " is already open on this stream")),
                true);
      return;
    }
    // The session goes by the new id from here on.
    auto node = sessions_.extract(SessionKey{stream, old_id});
    node.key() = SessionKey{stream, id};
    node.mapped()->id = id;
    *node.mapped()->parked_entry = node.key();
    session = sessions_.insert(std::move(node)).position->second.get();
  }
  const SessionKey key{stream, id};
  if (draining_) {
    FailSession(key, 0,
                absl::UnavailableError("the cloud is draining and admits no new sessions"));
    return;
  }
  const int64_t max_positions = resume.max_positions();
  if (max_positions < session->cache.length() || max_positions > middle_->max_context()) {
    FailSession(key, 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "resume.max_positions is ", max_positions, "; it must be in [",
                    session->cache.length(), " (the session's length), ",
                    middle_->max_context(), "]")));
    return;
  }
  parked_.erase(session->parked_entry);
  session->state = SessionState::kQueued;
  session->max_positions = max_positions;
  session->opened = Clock::now();
  const int32_t blocks = allocator_.BlocksFor(max_positions);
  device_ledger_.Recount(session->device, session->quota_blocks, blocks, /*waiting=*/true);
  session->quota_blocks = blocks;
  session->deadline = Deadline(session->opened, resume.timeout_ms());
  if (metrics_ != nullptr) metrics_->parked_sessions_resumed.Increment();
  waiting_.push_back(key);
  AdmitWaiting();
}

void Engine::Fork(StreamId stream, const v1::ForkSession& fork) {
  const uint64_t id = fork.new_session_id();
  const SessionKey source_key{stream, fork.session_id()};
  const Session* source = Find(stream, fork.session_id());
  if (id == 0 || Find(stream, id) != nullptr) {
    SendError(stream, id, 0,
              absl::AlreadyExistsError(absl::StrCat("fork.new_session_id ", id,
                                                    id == 0 ? " is not a session id"
                                                            : " is already open on this stream")),
              true);
    return;
  }
  if (source == nullptr || source->state != SessionState::kParked) {
    SendError(stream, id, 0,
              absl::NotFoundError(absl::StrCat(
                  "fork.session_id ", fork.session_id(),
                  source == nullptr ? " is not held by this cloud (evicted, expired or never "
                                      "parked); open a new session"
                                    : " is not parked")),
              false);
    return;
  }
  const int64_t length = source->cache.length();
  if (fork.max_positions() < length) {
    SendError(stream, id, 0,
              absl::InvalidArgumentError(absl::StrCat(
                  "fork.max_positions is ", fork.max_positions(),
                  "; it must be at least the parked session's length, ", length)),
              false);
    return;
  }
  // Everything else as an OpenSession of the same size: limits, quotas, the waiting line.
  v1::OpenSession open;
  open.set_session_id(id);
  open.set_max_positions(fork.max_positions());
  open.set_timeout_ms(fork.timeout_ms());
  open.set_result_dtype(fork.result_dtype());
  opening_fork_source_ = source_key;  // Open's evictions keep it
  Open(stream, open);
  opening_fork_source_.reset();
  Session* session = Find(stream, id);
  if (session == nullptr) return;  // refused (answered), or admitted and since failed
  if (session->state == SessionState::kQueued) {
    session->fork_source = source_key;
    session->fork_length = length;
    return;
  }
  // Admitted at once (Open admits what fits): copy now. Its SessionAdmitted is already on
  // its way, and its chunks cannot overtake it, since this runs on the engine thread first.
  session->fork_source = source_key;
  session->fork_length = length;
  CompleteFork({stream, id}, *session);
}

bool Engine::ForkPending(const SessionKey& source) const {
  if (opening_fork_source_ == source) return true;
  for (const SessionKey& key : waiting_) {
    const auto it = sessions_.find(key);
    if (it != sessions_.end() && it->second->fork_source == source) return true;
  }
  return false;
}

bool Engine::CompleteFork(const SessionKey& key, Session& session) {
  const SessionKey source_key = *session.fork_source;
  const int64_t length = session.fork_length;
  session.fork_source.reset();
  const Session* source = Find(source_key.first, source_key.second);
  if (source == nullptr || source->state != SessionState::kParked ||
      source->cache.length() < length) {
    FailSession(key, 0,
                absl::NotFoundError(absl::StrCat(
                    "the parked session ", source_key.second,
                    " this session forks went before it was admitted; open a new session")));
    return false;
  }
  while (session.cache.capacity() < length) {
    const std::optional<int32_t> block =
        session.reserved_blocks > 0 ? allocator_.AllocateReserved() : std::nullopt;
    if (!block) {
      FailSession(key, 0, absl::InternalError("the cloud's KV bookkeeping lost a fork's "
                                              "reserved blocks; open a new session"));
      return false;
    }
    --session.reserved_blocks;
    session.cache.AppendBlock(*block);
  }
  if (absl::Status copied = session.cache.CopyPrefixFrom(source->cache, length); !copied.ok()) {
    FailSession(key, 0, copied);
    return false;
  }
  if (options_.downstream != nullptr) {
    // The later stages copy their own layers' blocks before the next step they run: the
    // fork's first step at the earliest, and before any step that reuses the parent's.
    const auto blocks = static_cast<size_t>(pool_->BlocksFor(length));
    options_.downstream->QueueBlockCopies(source->cache.block_table().first(blocks),
                                          session.cache.block_table().first(blocks));
  }
  session.next_position = length;
  if (metrics_ != nullptr) metrics_->parked_sessions_forked.Increment();
  return true;
}

bool Engine::EvictParked(const std::function<bool()>& enough, const std::string* device) {
  auto it = parked_.begin();
  while (!enough() && it != parked_.end()) {
    const SessionKey key = *it++;  // EraseSession removes this entry
    Session* session = Find(key.first, key.second);
    if (session == nullptr) continue;
    if (device != nullptr && session->device != *device) continue;
    if (ForkPending(key)) continue;  // a waiting fork copies from it
    if (metrics_ != nullptr) metrics_->parked_sessions_evicted.Increment();
    // The caller admits, or is admitting.
    LetParkedGo(key, "evicted for another session's KV", /*admit_waiting=*/false);
  }
  return enough();
}

int64_t Engine::Step() {
  // With a pipeline of P stages up to P micro-batches are in flight, so that every stage
  // works while the others do; a session is in at most one of them (its next chunk needs
  // this one's answer, or at least its place in the KV order).
  int64_t launched = 0;
  if (in_flight_count_ < pipeline_depth_) launched = Launch();
  if (in_flight_count_ > 0 && (launched == 0 || in_flight_count_ == pipeline_depth_)) Complete();
  return launched;
}

bool Engine::Runnable(const Session& session) const {
  if (session.state != SessionState::kRunning || session.work.empty() || session.in_flight) {
    return false;
  }
  // A stream whose agent has not read its last results gets no more computed until it has
  // (MessageSink::Congested); its channel calls Wake when it drains.
  const auto stream = streams_.find(session.stream);
  return stream == streams_.end() || stream->second.sink == nullptr ||
         !stream->second.sink->Congested();
}

int64_t Engine::PlanStep() {
  pending_.clear();
  pending_sessions_.clear();
  slot_decoding_.assign(device_ledger_.num_slots(), 0);
  int64_t decoding = 0;  // running sessions past their prompts, whether or not work is here
  double decode_away = 0;  // the shortest of their rounds' time away from the cloud, if known
  for (auto& [key, session] : sessions_) {
    if (Runnable(*session)) pending_sessions_.push_back(session.get());
    if (session->state == SessionState::kRunning && session->decoding) {
      ++slot_decoding_[session->device_slot];
      ++decoding;
      if (session->decode_away_seconds > 0 &&
          (decode_away == 0 || session->decode_away_seconds < decode_away)) {
        decode_away = session->decode_away_seconds;
      }
    }
  }
  // First come, first served within a device, round-robin across devices
  // (RoundRobinOrder): pending_ and pending_sessions_ in the order the step plans them.
  std::sort(pending_sessions_.begin(), pending_sessions_.end(),
            [](const Session* a, const Session* b) {
              return a->work.front().arrival < b->work.front().arrival;
            });
  pending_groups_.clear();
  for (const Session* session : pending_sessions_) pending_groups_.push_back(session->device_slot);
  arrival_sessions_.swap(pending_sessions_);
  pending_sessions_.clear();
  for (const int32_t index : fair_order_.Order(pending_groups_, device_ledger_.num_slots())) {
    Session* session = arrival_sessions_[static_cast<size_t>(index)];
    const WorkItem& head = session->work.front();
    pending_sessions_.push_back(session);
    pending_.push_back({.num_tokens = head.num_tokens - head.done,
                        .decode = head.decode,
                        .group = session->device_slot});
  }
  if (pending_.empty()) return 0;
  // Fair share between devices: the prompt budget split by weight, and a device's prompts
  // kept from stretching the steps of another device that is decoding (its next token may
  // arrive while a step runs, and waits for it) past decode_step_stretch times what the
  // decode work alone is predicted to take.
  slot_shares_.resize(device_ledger_.num_slots());
  BatchLimits limits{.max_batch_tokens = options_.max_batch_tokens,
                     .max_sequences = options_.max_running_sessions};
  const std::optional<int64_t> capped_step = DecodeStretchStepTokens(
      monitor_.step_time(), decoding, decode_step_stretch_, decode_away, options_.max_batch_tokens);
  for (int32_t slot = 0; slot < device_ledger_.num_slots(); ++slot) {
    slot_shares_[slot] = {.weight = device_ledger_.slot_weight(slot),
                          .capped = capped_step && decoding > slot_decoding_[slot]};
  }
  if (capped_step) limits.capped_step_tokens = *capped_step;
  return planner_.Plan(pending_, limits, slot_shares_, steps_planned_++, plan_);
}

int64_t Engine::TakePlannedBlocks(int64_t total) {
  // Every chunk's KV blocks first. Admission reserved them, so this cannot fail unless that
  // bookkeeping is wrong; if it is, the session concerned fails alone and leaves the step,
  // rather than the forward refusing a step that is short of blocks and failing every
  // session in it.
  failed_sessions_.clear();
  std::erase_if(plan_, [&](const PlannedWork& planned) {
    Session* session = pending_sessions_[planned.index];
    KvCache& cache = session->cache;
    while (cache.capacity() < cache.length() + planned.num_tokens) {
      std::optional<int32_t> block;
      if (session->reserved_blocks > 0 &&
          injected_reservation_failures_.erase({session->stream, session->id}) == 0) {
        block = allocator_.AllocateReserved();
      }
      if (!block) {
        failed_sessions_.push_back({session->stream, session->id});
        total -= planned.num_tokens;
        return true;
      }
      --session->reserved_blocks;
      cache.AppendBlock(*block);
    }
    return false;
  });
  for (const SessionKey& key : failed_sessions_) {
    Session* session = Find(key.first, key.second);
    spdlog::error("session {} of stream {}: its reserved KV blocks ran out (a bookkeeping "
                  "bug); failing it alone", key.second, key.first);
    FailSession(key, session->work.front().sequence_number,
                absl::InternalError("the cloud's KV bookkeeping lost this session's reserved "
                                    "blocks; the session is failed, the others carry on"));
  }
  return total;
}

int64_t Engine::Launch() {
  int64_t total = PlanStep();
  if (total == 0) return 0;
  total = TakePlannedBlocks(total);
  if (total == 0) return 0;

  InFlight& batch = in_flight_[(in_flight_oldest_ + in_flight_count_) % pipeline_depth_];
  ++in_flight_count_;
  batch.submitted = false;
  batch.start = Clock::now();
  batch.total = total;
  batch.parts.clear();
  chunks_.clear();
  int64_t row = 0;
  auto* staging = static_cast<uint8_t*>(staging_.data_ptr());
  // A CPU step of one chunk reads its payload in place; a GPU one uploads from pinned staging
  // only (an upload from pageable memory waits for the stream's earlier work to finish).
  const bool gpu = !middle_->options().device.is_cpu();
  const bool gathered = plan_.size() > 1 || gpu;
  // Nothing touches a lost device: the step fails as it would have (Complete).
  absl::Status ready = device_watch_.lost();
  if (ready.ok() && !injected_step_failure_.ok()) ready = std::exchange(injected_step_failure_, {});
  if (ready.ok() && options_.drill_device_loss_after_steps > 0 &&
      steps_launched_ >= options_.drill_device_loss_after_steps) {
    device_watch_.StartDrill(absl::StrCat(
        "the cloud's device (", middle_->options().device.str(),
        ") is lost: a failover drill (drill_device_loss_after_steps ",
        options_.drill_device_loss_after_steps, "); the device itself is fine"));
    ready = absl::InternalError("the step failed for a failover drill");
  }
  ++steps_launched_;
  // The last upload from staging_ must have been read before it is overwritten.
  if (ready.ok() && gathered) {
    ready = CatchExceptions("waiting for the last upload", [&] { staging_read_.Wait(); });
  }
  gather_copies_.clear();
  for (const PlannedWork& planned : plan_) {
    Session* session = pending_sessions_[planned.index];
    const WorkItem& head = session->work.front();
    KvCache& cache = session->cache;
    if (gathered) {
      gather_copies_.push_back({.to = staging + row * row_bytes_,
                                .from = head.data.data() + head.done * row_bytes_,
                                .bytes = planned.num_tokens * row_bytes_});
    }
    chunks_.push_back({.cache = &cache, .num_tokens = planned.num_tokens});
    batch.parts.push_back({.key = {session->stream, session->id},
                           .num_tokens = planned.num_tokens});
    session->in_flight = true;
    row += planned.num_tokens;
  }
  absl::StatusOr<at::Tensor> output = at::Tensor();
  if (!ready.ok()) {
    output = ready;
  } else {
    // A prompt chunk's megabytes across threads (host_copy.h); a decode step's rows here.
    kernels::CopyAll(gather_copies_, copy_slices_);
    // The forward reports its own failures; the copies and fences around it throw theirs
    // (a CUDA error), which fail this step like any other instead of ending the process.
    absl::Status thrown = CatchExceptions("the step's device copies", [&] {
      output = ComputeStep(batch, gathered, gpu, total);
    });
    if (!thrown.ok()) output = thrown;
  }
  batch.own_seconds = Seconds(Clock::now() - batch.start);
  if (output.ok() && options_.downstream != nullptr) {
    // The later stages take it from here; Complete collects their answer.
    absl::Status submitted;
    absl::Status thrown = CatchExceptions("submitting the step to the pipeline", [&] {
      submitted = options_.downstream->Submit(*output, chunks_);
    });
    if (!thrown.ok()) submitted = thrown;
    output = submitted.ok() ? absl::StatusOr<at::Tensor>(at::Tensor()) : submitted;
    batch.submitted = submitted.ok();
  }
  batch.output = std::move(output);
  return total;
}

absl::StatusOr<at::Tensor> Engine::ComputeStep(InFlight& batch, bool gathered, bool gpu,
                                               int64_t total) {
  // A CPU step of one chunk reads its payload in place (the payload outlives the forward);
  // the rest were gathered into staging.
  at::Tensor input;
  if (!gathered) {
    const WorkItem& only = pending_sessions_[plan_[0].index]->work.front();
    input = at::from_blob(const_cast<char*>(only.data.data()) + only.done * row_bytes_,
                          {total, middle_->config().hidden_size}, staging_.options());
  } else {
    input = staging_.narrow(0, 0, total);
  }
  if (gpu) {
    // Into the step buffers' rows asynchronously (the forward then copies nothing).
    at::Tensor device_input = step_buffers_->residual.narrow(0, 0, total);
    device_input.copy_(input, /*non_blocking=*/true);
    staging_read_.Record();
    input = device_input;
  }
  absl::StatusOr<at::Tensor> output =
      decode_graphs_ != nullptr && decode_graphs_->Fits(chunks_)
          ? decode_graphs_->Run(input, chunks_)
          : middle_->Forward(input, chunks_, *step_buffers_);
  if (output.ok() && gpu && options_.downstream == nullptr) {
    // The read-back is queued behind the step's kernels now; Complete waits for it.
    at::Tensor host = batch.host_output.narrow(0, 0, total);
    host.copy_(*output, /*non_blocking=*/true);
    batch.output_read.Record();
    output = host;
  }
  return output;
}

void Engine::ObserveStep(const InFlight& batch, double compute_seconds, bool stages_timed) {
  const int64_t total = batch.total;
  stat_steps_++;
  // What g(μ) predicted for this step, before it learns from it.
  const double predicted = monitor_.step_time().Predict(static_cast<double>(total));
  const bool had_prediction = monitor_.step_time().has_data();
  monitor_.ObserveStep(total, compute_seconds);
  recent_step_seconds_ = recent_step_seconds_ == 0
                             ? compute_seconds
                             : 0.8 * recent_step_seconds_ + 0.2 * compute_seconds;
  if (stages_timed) {
    // Each stage's own forward time: the scheduler's per-stage models see the slowest stage.
    const std::vector<double>& stages = options_.downstream->stage_seconds();
    monitor_.ObserveStageStep(0, total, batch.own_seconds);
    for (size_t s = 1; s < stages.size(); ++s) {
      monitor_.ObserveStageStep(static_cast<int>(s), total, stages[s]);
    }
  }
  if (metrics_ != nullptr) {
    metrics_->step_seconds.Observe(compute_seconds);
    if (stages_timed) {
      // Which stage is the bottleneck: each one's own forward in this step.
      const std::vector<double>& stages = options_.downstream->stage_seconds();
      metrics_->PipelineStageSeconds(0).Observe(batch.own_seconds);
      for (size_t s = 1; s < stages.size(); ++s) {
        metrics_->PipelineStageSeconds(static_cast<int>(s)).Observe(stages[s]);
      }
    }
    metrics_->iteration_tokens.Observe(static_cast<double>(total));
    if (had_prediction && compute_seconds > 0) {
      metrics_->step_prediction_error_ratio.Observe(std::abs(predicted - compute_seconds) /
                                                    compute_seconds);
    }
    metrics_->mean_batched_tokens.Set(monitor_.mean_batched_tokens());
    metrics_->predicted_step_seconds.Set(
        monitor_.step_time().Predict(monitor_.mean_batched_tokens()));
  }
}

void Engine::Complete() {
  // The record stays untouched until the next Launch, which this call cannot reach.
  InFlight& batch = in_flight_[in_flight_oldest_];
  in_flight_oldest_ = (in_flight_oldest_ + 1) % pipeline_depth_;
  --in_flight_count_;
  absl::StatusOr<at::Tensor>& output = batch.output;
  if (batch.submitted) {
    absl::Status thrown = CatchExceptions("collecting the step from the pipeline", [&] {
      output = options_.downstream->Collect();
    });
    if (!thrown.ok()) output = thrown;
  }
  if (!output.ok() && options_.downstream != nullptr && options_.downstream->broken() &&
      !pipeline_lost_) {
    pipeline_lost_ = true;
    if (options_.on_pipeline_lost) options_.on_pipeline_lost(output.status());
  }
  at::Tensor deep;
  if (output.ok()) {
    absl::Status read = CatchExceptions("reading back the step's output", [&] {
      batch.output_read.Wait();  // a GPU step's read-back into batch.host_output
      deep = output->device().is_cpu() ? output->contiguous() : output->to(at::kCPU).contiguous();
    });
    if (!read.ok()) output = read;
  }
  bool just_lost = false;
  absl::Status lost;  // the device's loss, found now or before
  if (!output.ok()) {
    // Whether the step failed alone (a bad shape, memory short for once) or took the device
    // with it: then nothing later can compute, and staying up would fail every request while
    // health says SERVING.
    lost = device_watch_.CheckAfterFailure(&just_lost);
    if (just_lost) {
      draining_ = true;
      spdlog::error("{} (the step failed with: {}); failing every session with UNAVAILABLE "
                    "and admitting none",
                    std::string(lost.message()), output.status().ToString());
      if (options_.on_device_lost) options_.on_device_lost(lost);
    }
    if (!lost.ok()) output = lost;
  }
  if (!output.ok() && metrics_ != nullptr) metrics_->steps_failed.Increment();
  const Clock::time_point start = batch.start;
  const Clock::time_point end = Clock::now();
  const double compute_seconds = Seconds(end - start);
  ObserveStep(batch, compute_seconds, batch.submitted && output.ok());

  // Every result of this step leaves now, together: the agents' downlink dispersion pairs
  // their arrivals against this.
  const double sent_at_seconds = std::chrono::duration<double>(end.time_since_epoch()).count();
  int64_t row = 0;
  const auto* deep_bytes = output.ok() ? static_cast<const uint8_t*>(deep.data_ptr()) : nullptr;
  for (const InFlightPart& part : batch.parts) {
    const SessionKey key = part.key;
    const int64_t part_row = row;
    row += part.num_tokens;
    // A session closed, cancelled or failed while its work was in flight is gone; its rows
    // are dropped.
    Session* session = Find(key.first, key.second);
    if (session == nullptr) continue;
    session->in_flight = false;
    WorkItem& head = session->work.front();
    if (!output.ok()) {
      // A lost pipeline stage is the cloud being unavailable (agents retry and replay);
      // anything else is a failure of this step.
      FailSession(key, head.sequence_number,
                  output.status().code() == absl::StatusCode::kUnavailable
                      ? output.status()
                      : absl::InternalError(absl::StrCat("middle forward failed: ",
                                                         output.status().message())));
      continue;
    }
    const int64_t part_first = head.first_position + head.done;
    head.done += part.num_tokens;
    const bool chunk_done = head.done == head.num_tokens;
    if (chunk_done && head.decode) session->last_decode_done = end;
    if (chunk_done) {
      auto sink = streams_.find(session->stream);
      if (sink != streams_.end()) sink->second.sink->Consumed(head.wire_bytes);
    }
    // Counted before anything is sent: whoever has the result sees it counted.
    if (metrics_ != nullptr) {
      (head.decode ? metrics_->generation_tokens : metrics_->prompt_tokens)
          .Increment(part.num_tokens);
    }
    BuildResultPieces(
        result_format_,
        {.session_id = session->id,
         .sequence_number = head.sequence_number,
         .first_position = part_first,
         .num_rows = part.num_tokens,
         .decode = head.decode,
         .chunk_done = chunk_done,
         .dtype = session->result_dtype,
         .queue_seconds = Seconds(start - head.received),
         .received_at_seconds =
             std::chrono::duration<double>(head.received.time_since_epoch()).count(),
         .sent_at_seconds = sent_at_seconds,
         .compute_seconds = compute_seconds,
         .kv_length = session->cache.length()},
        deep_bytes + part_row * row_bytes_, result_messages_);
    for (v1::CloudMessage& message : result_messages_) {
      if (metrics_ != nullptr) {
        const v1::HiddenStates& states = message.result().states();
        metrics_->hidden_state_bytes_out.Increment(states.data().size() +
                                                    states.scales().size());
      }
      Send(key.first, std::move(message));
    }
    if (chunk_done) session->work.pop_front();
    if (chunk_done) ApplyQueuedTruncates(*session);
  }
  // The sessions not in this step too (waiting, parked, between chunks): their agents learn
  // now, not at their next chunk, and replay elsewhere.
  if (just_lost) FailAllSessions(lost);
}

void Engine::FailAllSessions(const absl::Status& status) {
  std::vector<SessionKey> keys;
  keys.reserve(sessions_.size());
  for (const auto& [key, session] : sessions_) keys.push_back(key);
  for (const SessionKey& key : keys) FailSession(key, 0, status);
}

Engine::Session* Engine::Find(StreamId stream, uint64_t id) {
  auto it = sessions_.find({stream, id});
  return it == sessions_.end() ? nullptr : it->second.get();
}

void Engine::Send(StreamId stream, v1::CloudMessage message) {
  auto it = streams_.find(stream);
  if (it != streams_.end()) it->second.sink->Send(std::move(message));
}

void Engine::SendError(StreamId stream, uint64_t session_id, uint64_t sequence_number,
                       const absl::Status& status, bool session_alive) {
  int64_t held_back = 0;
  if (session_error_log_.Allow(Clock::now(), &held_back)) {
    if (held_back > 0) {
      spdlog::warn("{} more session errors not logged (at most 20 a second)", held_back);
    }
    spdlog::warn("stream {} session {}: {}", stream, session_id, status.ToString());
  }
  if (metrics_ != nullptr) metrics_->session_errors.Increment();
  v1::CloudMessage message;
  v1::SessionError* error = message.mutable_error();
  error->set_session_id(session_id);
  error->set_sequence_number(sequence_number);
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message()));
  error->set_session_alive(session_alive);
  Send(stream, std::move(message));
}

void Engine::LetParkedGo(const SessionKey& key, const char* why, bool admit_waiting) {
  EraseSession(key, admit_waiting);
  v1::CloudMessage message;
  v1::SessionError* error = message.mutable_error();
  error->set_session_id(key.second);
  error->set_code(static_cast<int32_t>(absl::StatusCode::kNotFound));
  error->set_message(absl::StrCat("parked session ", key.second, " is gone: ", why));
  Send(key.first, std::move(message));
}

void Engine::EraseSession(const SessionKey& key, bool admit_waiting) {
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;
  Session& session = *it->second;
  auto stream = streams_.find(key.first);
  for (const WorkItem& item : session.work) {
    if (stream != streams_.end()) stream->second.sink->Consumed(item.wire_bytes);
  }
  // A queued session holds no blocks unless it is a resumed one; a parked one no reservation.
  for (int32_t block : session.cache.block_table()) allocator_.Free(block);
  allocator_.Unreserve(session.reserved_blocks);
  if (session.state == SessionState::kRunning) --num_running_;
  if (session.state == SessionState::kParked) parked_.erase(session.parked_entry);
  device_ledger_.Close(session.device, session.quota_blocks,
                       session.state == SessionState::kQueued);
  sessions_.erase(it);
  // A freed reservation may let the head of the queue in.
  if (admit_waiting) AdmitWaiting();
}

void Engine::FailSession(const SessionKey& key, uint64_t sequence_number,
                         const absl::Status& status) {
  if (!sessions_.contains(key)) return;
  EraseSession(key);
  SendError(key.first, key.second, sequence_number, status, false);
}

void Engine::UpdateGauges() {
  stat_running_ = num_running_;
  stat_waiting_ = static_cast<int64_t>(sessions_.size()) - num_running_ -
                  static_cast<int64_t>(parked_.size());
  handled_ticket_.store(drained_ticket_);
  if (idle_waiters_.load() > 0) {
    std::lock_guard<std::mutex> lock(idle_mutex_);
    idle_cv_.notify_all();
  }
  stat_blocks_ = allocator_.num_allocated();
  stat_parked_ = static_cast<int64_t>(parked_.size());
  if (metrics_ != nullptr) {
    metrics_->sessions_running.Set(static_cast<double>(num_running_));
    metrics_->sessions_waiting.Set(static_cast<double>(stat_waiting_));
    metrics_->sessions_parked.Set(static_cast<double>(parked_.size()));
    metrics_->kv_cache_usage_ratio.Set(allocator_.usage());
    if (const Clock::time_point now = Clock::now(); now - last_curve_export_ >= kCurveExportInterval) {
      last_curve_export_ = now;
      const size_t points = monitor_.step_time().FillPoints(curve_scratch_);
      for (size_t i = 0; i < points; ++i) {
        const StepTimePredictor::Point& p = curve_scratch_[i];
        const auto tokens = static_cast<uint64_t>(std::max(1.0, p.tokens));
        metrics_->SetStepCurvePoint(static_cast<int64_t>(std::bit_floor(tokens)), p.tokens,
                                    p.seconds);
      }
    }
  }
  ReportLoad();
}

v1::CloudLoad Engine::CurrentLoad() const {
  v1::CloudLoad load;
  load.set_running_sessions(static_cast<uint32_t>(num_running_));
  load.set_waiting_sessions(static_cast<uint32_t>(std::max<int64_t>(0, stat_waiting_)));
  load.set_kv_blocks_free(
      static_cast<uint32_t>(allocator_.num_blocks() - allocator_.num_allocated()));
  load.set_kv_blocks_total(static_cast<uint32_t>(allocator_.num_blocks()));
  load.set_step_seconds(recent_step_seconds_);
  load.set_draining(draining_.load());
  return load;
}

void Engine::ReportLoad() {
  if (streams_.empty()) return;
  const Clock::time_point now = Clock::now();
  const Clock::duration since = now - last_load_report_;
  if (since < kLoadReportInterval) return;
  v1::CloudLoad load = CurrentLoad();
  // The step time moves every step: a change in it alone waits for the heartbeat.
  const bool changed = load.running_sessions() != last_load_.running_sessions() ||
                       load.waiting_sessions() != last_load_.waiting_sessions() ||
                       load.kv_blocks_free() != last_load_.kv_blocks_free() ||
                       load.draining() != last_load_.draining();
  if (!changed && since < kLoadReportHeartbeat) return;
  last_load_report_ = now;
  last_load_ = load;
  for (const auto& [stream, state] : streams_) {
    v1::CloudMessage message;
    *message.mutable_load() = load;
    Send(stream, std::move(message));
  }
}

}  // namespace tophat
