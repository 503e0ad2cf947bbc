// The cloud engine: one thread owns every session and the batch. Reactors hand it inbound
// messages through a locked intake queue; each step it drains the queue, admits sessions,
// plans a batch under the token budget (decode first, then prefill chunks), runs the middle
// submodel once over the batch with each session attending to its own paged KV, and sends
// each session's deep hidden states back to its stream.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/log_rate.h"
#include "kernels/cuda_device.h"
#include "kernels/host_copy.h"
#include "models/runtime/decode_graphs.h"
#include "models/runtime/device_watch.h"
#include "models/runtime/kv_cache.h"
#include "models/runtime/submodel.h"
#include "scheduler/batch_planner.h"
#include "scheduler/decode_decisions.h"
#include "scheduler/device_ledger.h"
#include "scheduler/kv_block_allocator.h"
#include "scheduler/state_monitor.h"
#include "server/cloud_metrics.h"
#include "server/message_sink.h"
#include "server/pipeline/pipeline_stage.h"
#include "server/result_pieces.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

struct EngineOptions {
  std::string model_id;
  std::string model_fingerprint;  // of the checkpoint the bundle was split from (Hello)
  int64_t kv_block_size = 16;
  int64_t kv_num_blocks = 1024;
  int64_t max_batch_tokens = 512;
  int64_t max_running_sessions = 64;
  int64_t max_waiting_sessions = 64;
  int64_t max_chunk_tokens = 2048;
  // On a GPU, decode steps of up to this many sessions replay CUDA graphs captured by
  // Create (capped at max_running_sessions); 0: every step eager. Ignored on a CPU.
  int64_t cuda_graph_max_batch = 0;
  // Prompt results leave in messages of at most this many bytes (at least one position each):
  // a decode result queued behind one waits for a piece, not a whole chunk, on the downlink.
  int64_t max_result_piece_bytes = 64 << 10;
  double session_timeout_s = 600;
  // The longest deadline an agent may ask for (OpenSession.timeout_ms); longer ones are cut
  // to it. 0: no cap.
  double max_session_timeout_s = 3600;
  // The longest a parked session keeps its KV (ParkSession.keep_alive_ms is cut to it);
  // 0: ParkSession closes the session, and Hello says the cloud does not park.
  double max_parked_session_s = 300;
  // Sessions one device may hold open (running and waiting) at once; 0: no limit. A device
  // is the identity of its certificate (mutual TLS), else its stream (plaintext).
  int64_t max_sessions_per_device = 0;
  // Of those, how many may wait for admission at once (0: no limit), so that one device
  // cannot fill max_waiting_sessions by itself.
  int64_t max_waiting_sessions_per_device = 0;
  // KV blocks one device's open sessions may reserve together, counted at OpenSession from
  // their max_positions (0: no limit), so that one device cannot hold the whole pool.
  int64_t max_kv_blocks_per_device = 0;
  // Fair share between devices (scheduler/batch_planner.h): each step's prompt budget is
  // split between the devices with prompts waiting by these weights (keyed by identity as
  // in the limits above; 1 for others), and while a device decodes, the other devices'
  // prompts may make a step at most decode_step_stretch times its decode work's predicted
  // time (0: no cap).
  std::map<std::string, double> device_weights;
  double decode_step_stretch = 2;
  v1::Control control;  // announced in Hello; per-device values replace it when adaptive
  // Adaptive scheduling: per-device Control from DeviceState (scheduler/decode_decisions.h).
  bool adaptive = false;
  int64_t min_prompt_chunk = 16;
  double max_step_seconds = 0;
  int64_t max_draft_steps = 8;
  // The wire dtypes the scheduler may choose for agents that follow it (Control.wire_dtype;
  // scheduler.wire_dtypes), in any order; empty: no choice.
  std::vector<v1::DType> wire_dtypes;
  // The stages after this one when the cloud is a pipeline (null: one stage). Every step's
  // output goes through them before it is sent; they end where the middle ends.
  pipeline::Downstream* downstream = nullptr;
  // Called once, on the engine thread, when the downstream stages are lost (a transfer
  // failed or timed out). The step's sessions have failed with UNAVAILABLE, which agents
  // answer by replaying on a successor; tophat-cloud then stops serving and exits for its
  // supervisor to restart the pipeline.
  std::function<void(const absl::Status&)> on_pipeline_lost;
  // Asked on the engine thread after a step fails: whether the device the middle runs on
  // can still compute (OK), or its context is lost (models/runtime/device_watch.h), as
  // UNAVAILABLE naming the error. Empty: DeviceWatch's own (CUDA's answer for a middle on a
  // GPU; on the CPU nothing is asked).
  DeviceWatch::Check device_check;
  // Called once, on the engine thread, when device_check finds the device lost. From then
  // on the engine computes nothing: the failed step's sessions, and every later step's,
  // fail with UNAVAILABLE (agents replay them on another cloud), and it admits nothing new.
  // tophat-cloud then stops serving and exits for its supervisor to restart it, on a
  // device that works again or not at all (its start-up then fails naming the device).
  std::function<void(const absl::Status&)> on_device_lost;
  // A failover drill (tophat-cloud --drill-device-loss-after-steps): after this many steps
  // (0: never) the next one fails and the device is found lost, so that a lost GPU's whole
  // path runs (every session fails with UNAVAILABLE, on_device_lost, the daemon's exit) on a
  // device that is fine. A step that fails for real before then is asked about as usual.
  int64_t drill_device_loss_after_steps = 0;
};

using StreamId = uint64_t;
using Clock = std::chrono::steady_clock;

// Session lifecycle. Legal transitions: kQueued -> kRunning (admitted), kRunning -> kParked
// (ParkSession: its KV kept for the next turn), kParked -> kQueued (ResumeSession, holding
// its KV while it waits), and any state -> erased (closed, cancelled, failed, expired,
// evicted, stream gone). Erasing frees the KV.
enum class SessionState { kQueued, kRunning, kParked };

// Who holds this cloud (the metrics port's /devices): the devices whose sessions count the
// most KV blocks.
struct DevicesReport {
  struct Device {
    std::string device;     // "device NAME" (certificate or token), or "stream N" (plaintext)
    int64_t sessions = 0;   // open: running, waiting or parked
    int64_t waiting = 0;    // of those, waiting for admission
    int64_t kv_blocks = 0;  // what they count against the pool (reserved, not only used)
    int64_t streams = 0;    // its streams open now
  };
  int64_t devices = 0;  // with sessions open, listed or not
  int64_t streams = 0;  // open, all devices
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_allocated = 0;
  std::vector<Device> top;  // most KV blocks first
};

struct EngineStats {
  int64_t sessions_running = 0;
  int64_t sessions_waiting = 0;
  int64_t kv_blocks_allocated = 0;
  int64_t kv_blocks_total = 0;
  int64_t steps = 0;
  int64_t sessions_parked = 0;
};

class Engine {
 public:
  // `middle` runs on the engine thread only. `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        std::shared_ptr<const Submodel> middle,
                                                        CloudMetrics* metrics);
  ~Engine();

  // --- Thread-safe intake, called from gRPC reactors. Never blocks on the step. ---
  // `device`: the identity the stream's certificate gives ("" for plaintext).
  void AttachStream(StreamId stream, std::shared_ptr<MessageSink> sink, std::string device = "");
  void Deliver(StreamId stream, v1::AgentMessage message);
  void DetachStream(StreamId stream);

  // Starts the engine thread; Stop() joins it (sessions still open are cancelled).
  void Start();
  void Stop();
  // When the engine thread last began a turn of its loop (it turns at least every 50 ms when
  // idle; a step holds it for the step's length). The daemon feeds systemd's watchdog only
  // while this is recent, so a wedged engine gets the service restarted. Any thread.
  std::chrono::steady_clock::time_point last_turn() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_turn_.load(std::memory_order_relaxed)));
  }
  // Waits until no session runs or waits (a drain is over), or `deadline`; true if none
  // does. Counts as of after everything posted before the call (CancelAll included): the
  // engine's gauges of an earlier moment could say "none" just after a session opened. Any
  // thread but the engine's, while the engine thread runs (Start).
  bool WaitForNoSessions(std::chrono::steady_clock::time_point deadline);
  // Wakes the engine thread from its idle wait: a stream stopped being congested
  // (MessageSink::Congested), so work it skipped may run now. Any thread; never blocks on a
  // step.
  void Wake();
  // Stops admitting: new sessions get UNAVAILABLE. In-flight sessions continue.
  void BeginDrain();
  // Fails every session with `status` (end of the drain grace period).
  void CancelAll(const absl::Status& status);

  // The first message of every stream.
  v1::Hello hello() const;
  EngineStats stats() const;
  // New per-device limits (EngineOptions::max_*_per_device, device_weights and
  // decode_step_stretch; a config reload), from the engine thread's next turn
  // (DeviceLedger::SetLimits). Any thread.
  void UpdateDeviceLimits(DeviceLimits limits, double decode_step_stretch);
  // The `limit` devices holding the most KV, as the engine thread sees them at its next turn
  // (between steps). UNAVAILABLE when it has not answered by `deadline`: a step longer than
  // the wait, or a stopped or wedged engine (the watchdog's business). Any thread.
  absl::StatusOr<DevicesReport> Devices(size_t limit,
                                        std::chrono::steady_clock::time_point deadline);

  // Runs intake + one step on the calling thread (tests and benchmarks, engine not
  // started). Returns the positions computed.
  int64_t RunOnce();

  // The state monitor (step times vs batch size, per-stream device reports). Engine thread
  // only: tests that drive RunOnce, or code that runs on the engine thread.
  const StateMonitor& state_monitor() const { return monitor_; }

  // Teaches the step-time model g(mu) a step of `tokens` that took `seconds`, as a measured
  // step would (tests of what the scheduler derives from it; engine thread only).
  void ObserveStepForTest(int64_t tokens, double seconds) { monitor_.ObserveStep(tokens, seconds); }

  // Makes the next step that includes this session find its reserved KV blocks gone, as a
  // bookkeeping bug would (tests of the failure's containment; engine thread only).
  void InjectReservationFailureForTest(StreamId stream, uint64_t session_id) {
    injected_reservation_failures_.insert({stream, session_id});
  }
  // Makes the next step's forward fail with `status` instead of running, as a fault of the
  // device would (tests of what the engine does then; engine thread only).
  void InjectStepFailureForTest(absl::Status status) { injected_step_failure_ = std::move(status); }
  // Why the device is lost (device_check's answer), or OK while it computes. Any thread.
  absl::Status device_lost() const { return device_watch_.lost(); }

 private:
  using SessionKey = std::pair<StreamId, uint64_t>;
  struct WorkItem {
    uint64_t sequence_number = 0;
    int64_t first_position = 0;
    int64_t num_tokens = 0;
    int64_t done = 0;  // positions already computed (a prefill chunk may span steps)
    bool decode = false;
    uint64_t arrival = 0;  // engine-wide order of receipt: the batch plan serves FIFO
    std::string data;  // the chunk's payload in the compute dtype (converted from the wire's)
    int64_t wire_bytes = 0;  // what it held on the wire: the stream's flow control counted it
    Clock::time_point received;
    // >= 0: not a chunk but a Truncate to this length, queued behind chunks that must be
    // computed first (stream order); applied when it reaches the head of the work.
    int64_t truncate_to = -1;
  };
  struct Session {
    StreamId stream = 0;
    uint64_t id = 0;
    SessionState state = SessionState::kQueued;
    int64_t max_positions = 0;
    int32_t reserved_blocks = 0;  // reservation not yet turned into blocks
    KvCache cache;
    std::deque<WorkItem> work;
    int64_t next_position = 0;  // where the next chunk must start
    bool in_flight = false;     // its head chunk is in a launched, not completed, step
    Clock::time_point opened;
    Clock::time_point deadline;
    std::string device;  // the key it counts under in device_ledger_
    int32_t quota_blocks = 0;  // what it counts against its device's KV quota
    int32_t device_slot = 0;   // its device's slot in device_ledger_
    // Its next result is a token: its prompt's last chunk is here (ForwardChunk.
    // decode_follows), or decode work since; a prompt chunk of a new turn ends it. While it
    // is, other devices' prompts are capped (decode_step_stretch), so that they delay its
    // first token no more than its later ones. (Counting it only once that chunk was
    // computed let a flooding device's prompts double another's TTFT; the cap's going
    // negative when many prompts were queued, which that was for, is gone since the cap
    // limits the step rather than the step less every decoding session.)
    bool decoding = false;
    // Its decode rounds' time away from this cloud: from its last decode result's leaving
    // (last_decode_done) to its next decode chunk's arrival, the links and the device (the
    // shortest seen; 0 until measured). What decode_step_stretch's cap counts.
    Clock::time_point last_decode_done{};
    double decode_away_seconds = 0;
    v1::DType result_dtype = v1::DTYPE_FLOAT32;  // OpenSession.result_dtype, resolved
    std::list<SessionKey>::iterator parked_entry;  // in parked_, while kParked
    // A ForkSession waiting for admission: the parked session whose first fork_length
    // positions its KV starts as a copy of (made when it is admitted).
    std::optional<SessionKey> fork_source;
    int64_t fork_length = 0;
    explicit Session(std::shared_ptr<KvBlockPool> pool) : cache(std::move(pool)) {}
  };
  struct StreamState {
    std::shared_ptr<MessageSink> sink;
    bool draining_notice_sent = false;
    std::optional<v1::Control> control;  // the last per-device Control sent
    std::string device;  // whom the per-device limits count this stream's sessions for
    // Bytes of one position as this stream's newest chunk sent it (its wire dtype): what
    // the scheduler sizes its prompt chunks by. 0 until a chunk arrives: the cloud's own.
    int64_t uplink_row_bytes = 0;
  };
  struct Event {
    // kBarrier does nothing: WaitForNoSessions waits until the engine has handled it, so
    // that the counts it reads are of after everything posted before it.
    // kReport fills `report` with the top `report_limit` devices (Devices); kLimits sets the
    // per-device limits and the decode step stretch.
    enum class Kind { kAttach, kMessage, kDetach, kCancelAll, kBarrier, kReport, kLimits } kind;
    StreamId stream = 0;
    std::shared_ptr<MessageSink> sink;
    std::string device;  // kAttach
    v1::AgentMessage message;
    absl::Status status;
    Clock::time_point received;
    uint64_t ticket = 0;  // its place in the intake, set by Post
    std::shared_ptr<std::promise<DevicesReport>> report;  // kReport
    size_t report_limit = 0;                              // kReport
    std::shared_ptr<const DeviceLimits> limits;           // kLimits
    double decode_step_stretch = 0;                       // kLimits
  };

  Engine(EngineOptions options, std::shared_ptr<const Submodel> middle,
         std::shared_ptr<KvBlockPool> pool, CloudMetrics* metrics);

  absl::Status Warmup();
  // Queues `event` for the engine thread; returns its ticket (WaitForNoSessions).
  uint64_t Post(Event event);
  void Loop();
  bool DrainIntake(bool wait);
  // Everything a step does once the intake is drained; returns the positions computed.
  int64_t StepAfterIntake();
  void HandleEvent(Event& event);
  void HandleMessage(StreamId stream, v1::AgentMessage& message, Clock::time_point received);
  void Open(StreamId stream, const v1::OpenSession& open);
  // A session's deadline: `timeout_ms` after `from` (0: limits.session_timeout_s), cut to
  // limits.max_session_timeout_s.
  Clock::time_point Deadline(Clock::time_point from, uint32_t timeout_ms) const;
  void Park(StreamId stream, const v1::ParkSession& park);
  void Resume(StreamId stream, const v1::ResumeSession& resume);
  void Fork(StreamId stream, const v1::ForkSession& fork);
  // Whether a waiting fork copies from `source` (which eviction then keeps).
  bool ForkPending(const SessionKey& source) const;
  // A forked session admitted: its blocks for the copied prefix and the copy. False (and the
  // fork failed, NOT_FOUND) when the parked session is gone.
  bool CompleteFork(const SessionKey& key, Session& session);
  // Evicts parked sessions, least recently parked first (only `device`'s when it is set),
  // until `enough` holds or none is left; returns `enough()`.
  bool EvictParked(const std::function<bool()>& enough, const std::string* device = nullptr);
  void AcceptChunk(StreamId stream, v1::ForwardChunk& chunk, Clock::time_point received);
  // True when it waits as a marker behind pending chunks (and holds its intake cost).
  bool ApplyTruncate(StreamId stream, const v1::Truncate& truncate);
  // Truncates the session's KV to `length` now (its work ahead of the truncate is done).
  void TruncateNow(Session& session, uint64_t sequence_number, int64_t length);
  // Applies the Truncates at the head of the session's work.
  void ApplyQueuedTruncates(Session& session);
  void AdmitWaiting();
  // Recomputes the stream's per-device Control from the state monitor; sends it if changed.
  void DecideForStream(StreamId stream);
  void ExpireDeadlines();
  // One turn of the loop: launches a step (plans a batch and runs this stage's layers) and
  // completes the oldest launched one (sends its results) once `depth` are in flight.
  int64_t Step();
  int64_t Launch();
  // Launch's planning: the runnable sessions' head work (pending_sessions_, pending_) in
  // RoundRobinOrder, planned into plan_ under the token budget and the devices' shares.
  // Returns the planned positions (0: nothing to run).
  int64_t PlanStep();
  // Takes each planned session's KV blocks for its positions from its reservation; a
  // session whose reservation ran out (a bookkeeping bug) fails alone and leaves plan_.
  // Returns `total` less what left.
  int64_t TakePlannedBlocks(int64_t total);
  struct InFlight;
  // Launch's part on the device: the input's upload, the forward and the read-back queued
  // (a CUDA error in a copy or a fence throws; Launch turns that into the step's status).
  absl::StatusOr<at::Tensor> ComputeStep(InFlight& batch, bool gathered, bool gpu, int64_t total);
  void Complete();
  // Complete's accounting of a step that took `compute_seconds` (launch to results read):
  // the step-time model g(mu), the load reports' mean, the step metrics; `stages_timed`: and
  // each pipeline stage's own forward time.
  void ObserveStep(const InFlight& batch, double compute_seconds, bool stages_timed);
  // Fails every session, running, waiting or parked, with `status` (CancelAll, a lost device).
  void FailAllSessions(const absl::Status& status);
  // Whether Launch would take `session`'s work now: running, with work, none of it in
  // flight, and its stream not congested. The loop's idea of "has work" (Loop) is this
  // predicate, so that it never spins over work its step skips.
  bool Runnable(const Session& session) const;

  Session* Find(StreamId stream, uint64_t id);
  void Send(StreamId stream, v1::CloudMessage message);
  void SendError(StreamId stream, uint64_t session_id, uint64_t sequence_number,
                 const absl::Status& status, bool session_alive);
  // `admit_waiting`: then let the waiting sessions have what it freed (not from inside
  // AdmitWaiting, which is already doing so).
  void EraseSession(const SessionKey& key, bool admit_waiting = true);
  void FailSession(const SessionKey& key, uint64_t sequence_number, const absl::Status& status);
  // Erases a parked session the cloud lets go (evicted, expired) and tells its agent
  // (SessionError NOT_FOUND), whose conversation cache then forgets it rather than asking
  // for it later. Not logged or counted as an error: the parked metrics count it.
  void LetParkedGo(const SessionKey& key, const char* why, bool admit_waiting);
  void UpdateGauges();
  // The load agents place new requests by (CloudLoad), as of now.
  v1::CloudLoad CurrentLoad() const;
  // Sends CurrentLoad to every stream when it changed and kLoadReportInterval has passed
  // since the last report, or kLoadReportHeartbeat has, whatever it is.
  void ReportLoad();

  const EngineOptions options_;
  const std::shared_ptr<const Submodel> middle_;
  // Asked after a failed step; once it has found the device lost, every later step fails
  // with that loss without touching the device.
  DeviceWatch device_watch_;
  const std::shared_ptr<KvBlockPool> pool_;
  CloudMetrics* const metrics_;
  v1::Hello hello_;
  v1::DType wire_dtype_;  // the compute dtype as the wire names it (Hello.dtype)
  int64_t row_bytes_;     // bytes of one position in the compute dtype
  ResultFormat result_format_;  // how a step's rows go back (BuildResultPieces)
  // options_.wire_dtypes widest first, and their bytes per position (the scheduler's A_d).
  std::vector<v1::DType> wire_choices_;
  std::vector<double> wire_choice_bytes_;

  // Intake: the only state shared with other threads, besides the stats atomics.
  std::mutex intake_mutex_;
  std::condition_variable intake_cv_;
  std::vector<Event> intake_;
  bool stopping_ = false;
  bool wake_ = false;  // Wake() was called since the last idle wait
  // WaitForNoSessions: notified when the gauges are updated after a kBarrier event.
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  uint64_t next_ticket_ = 0;              // under intake_mutex_
  uint64_t drained_ticket_ = 0;           // engine thread: the newest event handled
  std::atomic<uint64_t> handled_ticket_{0};  // drained_ticket_ as of the last UpdateGauges
  std::atomic<int> idle_waiters_{0};
  std::atomic<int64_t> last_turn_{0};  // steady_clock ticks; see last_turn()
  std::atomic<bool> draining_{false};
  bool pipeline_lost_ = false;  // engine thread: on_pipeline_lost has been called

  // Engine-thread state.
  KvBlockAllocator allocator_;
  StateMonitor monitor_;  // devices keyed by stream id
  // What each device's open sessions hold, against the per-device limits, and its slot
  // (a small number while it has sessions: its group in fair batching).
  DeviceLedger device_ledger_;
  // EngineOptions::decode_step_stretch, as a reload last set it (UpdateDeviceLimits).
  double decode_step_stretch_;
  // Per device slot (Launch): its running sessions that are decoding.
  std::vector<int64_t> slot_decoding_;
  std::vector<GroupShare> slot_shares_;
  BatchPlanner planner_;
  uint64_t steps_planned_ = 0;
  RoundRobinOrder fair_order_;  // Launch: the order pending work is planned in
  LogRate session_error_log_{20};
  std::map<SessionKey, std::unique_ptr<Session>> sessions_;
  int64_t num_running_ = 0;  // sessions_ in kRunning, kept in step with admit and erase
  std::deque<SessionKey> waiting_;
  std::list<SessionKey> parked_;  // kParked sessions, least recently parked first
  std::optional<SessionKey> opening_fork_source_;  // while Fork opens its session
  std::unordered_map<StreamId, StreamState> streams_;
  std::vector<Event> events_;  // swapped with intake_ each step
  uint64_t next_arrival_ = 0;
  // Step buffers, sized once for the worst case.
  at::Tensor staging_;  // [max(max_batch_tokens, max_chunk_tokens), D] on the CPU (pinned: GPU)
  // Passed once the GPU has read staging_'s last upload; Launch waits for it before
  // gathering the next step there.
  kernels::CudaFence staging_read_;
  // Every tensor the middle's forward writes (made by Warmup, which runs the largest step).
  std::optional<StepBuffers> step_buffers_;
  // Decode steps as CUDA graphs (null: eager; always on a CPU, or when capture failed).
  std::unique_ptr<DecodeGraphs> decode_graphs_;
  std::vector<PendingWork> pending_;
  // Launch: the sessions with work this step, in the order planned (pending_'s), and in
  // arrival order with their device slots (scratch for fair_order_).
  std::vector<Session*> pending_sessions_;
  std::vector<Session*> arrival_sessions_;
  std::vector<int32_t> pending_groups_;
  std::vector<PlannedWork> plan_;
  std::vector<SessionKey> failed_sessions_;  // Launch: those whose KV blocks ran out
  std::set<SessionKey> injected_reservation_failures_;
  absl::Status injected_step_failure_;  // InjectStepFailureForTest
  int64_t steps_launched_ = 0;
  std::vector<SequenceChunk> chunks_;
  // The step's input rows gathered into staging_, and CopyAll's slices of them (scratch).
  std::vector<kernels::HostCopy> gather_copies_;
  std::vector<kernels::HostCopy> copy_slices_;
  // One part's result messages (BuildResultPieces) before they are sent, in order (scratch).
  std::vector<v1::CloudMessage> result_messages_;
  std::vector<int32_t> released_blocks_;
  // Launched steps not yet completed, oldest first: a ring of one record per pipeline stage
  // (one without a pipeline), made once so that launching a step allocates no record.
  struct InFlightPart {
    SessionKey key;
    int64_t num_tokens = 0;
  };
  struct InFlight {
    Clock::time_point start;
    int64_t total = 0;
    std::vector<InFlightPart> parts;  // in row order
    absl::StatusOr<at::Tensor> output = at::Tensor();  // this stage's, or its error
    bool submitted = false;  // handed to the downstream stages, whose answer is pending
    double own_seconds = 0;  // this stage's forward
    // A GPU step's output, copied back asynchronously into pinned memory allocated once
    // ([rows, D]); Complete waits for `output_read` before reading it.
    at::Tensor host_output;
    kernels::CudaFence output_read;
  };
  std::vector<InFlight> in_flight_;  // pipeline_depth_ records
  size_t in_flight_oldest_ = 0;
  size_t in_flight_count_ = 0;
  size_t pipeline_depth_ = 1;  // P: steps that may be in flight

  std::atomic<int64_t> stat_running_{0};
  std::atomic<int64_t> stat_waiting_{0};
  std::atomic<int64_t> stat_blocks_{0};
  std::atomic<int64_t> stat_steps_{0};
  std::atomic<int64_t> stat_parked_{0};
  // Load reports (engine thread).
  double recent_step_seconds_ = 0;  // exponentially weighted mean of the engine's steps
  v1::CloudLoad last_load_;
  Clock::time_point last_load_report_{};
  // The step-time curve's gauges, refreshed at most once a second (scratch: no allocation).
  Clock::time_point last_curve_export_{};
  std::array<StepTimePredictor::Point, StepTimePredictor::kMaxBuckets> curve_scratch_{};
  std::thread thread_;
};

}  // namespace tophat
