#include "device_agent/agent.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "device_agent/app_request.h"
#include "device_agent/decode_round.h"
#include "device_agent/link_emulator.h"
#include "device_agent/request_stats.h"
#include "kernels/gemm_f32.h"
#include "kernels/gemm_int8.h"
#include "kernels/gemv.h"
#include "kernels/gemv_w8a8.h"
#include "models/tokenizers/tokenizer.h"
#include "proto/certificate_revocation.h"
#include "proto/channel_security.h"
#include "proto/hidden_states.h"
#include "proto/protocol_version.h"
#include "scheduler/cloud_placement.h"

namespace tophat {
namespace {

using SteadyClock = std::chrono::steady_clock;

SteadyClock::duration ToDuration(double seconds) {
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

absl::Status CloudError(const v1::SessionError& error) {
  return absl::Status(static_cast<absl::StatusCode>(error.code()),
                      absl::StrCat("cloud: ", error.message()));
}

}  // namespace

// One Generate call. Lives on the calling thread's stack; the agent's cancel map points at it
// while it runs. It holds the request's state and runs its protocol loop: prepare, open the
// session, prefill, decode, replay after a lost stream, emit, finish. The sent chunks and the
// link samples they give are ChunkTracker's, a decode round's drafting and verification
// DecodeRounds', the stats and metrics RequestStatsRecorder's.
class Agent::Request : private CloudSession {
 public:
  // `arrival`: when the app's request arrived (its latencies and deadline count from then).
  // `counted`: whether it is an app's request in the metrics (a kept prompt is not).
  Request(Agent& agent, const v1::GenerateRequest& request,
          const std::function<bool(const TokenEvent&)>& on_tokens,
          const std::function<bool()>& client_gone, SteadyClock::time_point arrival, bool counted)
      : agent_(agent),
        request_(request),
        on_tokens_(on_tokens),
        client_gone_(client_gone),
        arrival_(arrival),
        stats_(counted ? agent.metrics_.get() : nullptr, arrival_),
        chunks_(agent, arrival_, request.trace()) {}

  // Takes a session id and a mailbox; called before the request is visible to Cancel().
  void Attach() {
    session_id_ = agent_.next_session_id_++;
    // Registered with a cloud once Open has placed the request on one.
    mailbox_ = std::make_shared<SessionMailbox>();
  }
  v1::GenerateResponse Run();
  void Cancel() {
    cancelled_ = true;
    if (mailbox_ != nullptr) mailbox_->Interrupt();
  }
  const std::string& id() const { return id_; }
  void set_id(std::string id) { id_ = std::move(id); }
  // A kept conversation this prompt extends is shared (a copy, its cloud session forked),
  // not taken: several requests extend it at once (an outline's points).
  void set_share_conversation(bool share) { share_conversation_ = share; }
  // KeepPrompt's request: the prompt computed and parked for choices to fork, nothing
  // generated.
  void set_keep_prompt(bool keep) { keep_prompt_ = keep; }
  // After Run: whether the session was parked with the conversation cache, and how.
  bool parked() const { return parked_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t session_id() const { return session_id_; }
  int64_t reused() const { return reused_; }
  SteadyClock::time_point arrival() const { return arrival_; }

 private:
  // Tokenises, checks the request against the context, and allocates its caches.
  absl::Status Prepare();
  absl::Status Open(uint64_t after_epoch);
  // Takes the cloud session parked with the adopted conversation; false (and the request
  // is fresh again) when the cloud no longer holds it or the stream changed.
  absl::StatusOr<bool> Resume(const CloudConnection::Connected& connected);
  // Drops an adopted conversation's positions: the request starts from position 0.
  void ForgetReused();
  // A shared (forked) conversation whose cloud session is gone (its stream ended, or the
  // cloud no longer holds it): its cache entry goes too, so that no later request forks it
  // again. A taken one has left the cache already.
  void DropGoneShared();
  // Parks the cloud session and keeps the caches for the conversation's next turn, when the
  // session is at rest; false: the caller closes it as before.
  bool Park();
  // Chunk j is computed and uploaded while the cloud works on chunk j-1; results are consumed
  // as they arrive.
  absl::Status Prefill();
  // Takes a copy of a kept conversation (set_share_conversation): its device KV and shallow
  // rows into this request's own caches, its cloud session to fork.
  absl::Status AdoptShared(const ConversationCache::Shared& shared, bool drafting);
  // The prompt's chunk lengths from position reused_: Jupiter's plan (prompt_chunk_plan:
  // jupiter, where the cloud chooses the size and every stage is measured), else chunk_size_.
  std::vector<int64_t> PromptChunks();
  // The first token from the prompt's last position, then decode rounds until a stop id or
  // the length limit.
  absl::Status Decode();
  absl::Status ComputeShallow(int64_t first, int64_t count);
  // Sends positions [from, to) of shallow_, split at the cloud's max_chunk_positions.
  // `device_seconds` (the input submodel's time on them) goes with the first message.
  void SendRows(int64_t from, int64_t to, v1::Phase phase, double device_seconds);
  // The wire dtype by the config: its own, the cloud scheduler's current choice, or the
  // cloud's compute dtype.
  v1::DType ChosenWireDtype() const;
  // Handles mailbox events until `consumed_` reaches `target` (block) or the mailbox is
  // empty (no block).
  absl::Status Pump(int64_t target, bool block) override;
  absl::Status HandleResult(const v1::ForwardResult& result);
  // Waits for a newer stream, reopens the session and replays every position sent.
  absl::Status Reconnect(const std::string& why);
  // Emits `tokens` (one round's) up to a stop token or the length limit; sets done_ when the
  // request is complete. `logits`: the rows that decided them, row i tokens[i] (for the
  // log-probabilities an app may ask for).
  absl::Status Emit(std::span<const int32_t> tokens, const at::Tensor& logits);
  void Finish(v1::GenerateResponse& response, v1::FinishReason reason, const absl::Status& error);

  // CloudSession, for the decode rounds.
  void SendDecodeRows(int64_t start, const at::Tensor& rows) override;
  void SendAheadRows(int64_t start, const at::Tensor& rows) override;
  void KeepAheadRows() override { ahead_from_ = -1; }
  int64_t sent() const override { return sent_; }
  int64_t consumed() const override { return consumed_; }
  void RollBack(int64_t length) override;
  // Rolls the cloud session's KV back to `length` positions (a Truncate; the next sequence
  // number).
  void SendTruncate(int64_t length);
  // Hands `message` to the cloud connection. UNAVAILABLE (the stream just broke) is left to
  // the mailbox's disconnect event, which replays; any other refusal (a full outbox) is kept
  // in send_failure_, which Pump returns: the request cannot complete without the message.
  void SendToCloud(v1::AgentMessage message, SentStamp sent = nullptr);
  absl::Status send_failure_;

  Agent& agent_;
  const v1::GenerateRequest& request_;
  const std::function<bool(const TokenEvent&)>& on_tokens_;
  const std::function<bool()>& client_gone_;  // may be empty
  const SteadyClock::time_point arrival_;
  RequestStatsRecorder stats_;
  ChunkTracker chunks_;
  SteadyClock::time_point deadline_;
  std::string id_;
  std::atomic<bool> cancelled_{false};

  std::vector<int32_t> tokens_;  // prompt, then generated
  std::vector<int32_t> generated_;
  int64_t prompt_length_ = 0;
  int64_t max_new_tokens_ = 0;
  int64_t max_positions_ = 0;
  int64_t chunk_size_ = 0;
  int64_t max_chunk_positions_ = 0;
  std::vector<int32_t> stop_ids_;
  int64_t top_logprobs_ = -1;  // AppRequestPlan's: -1, no log-probabilities
  bool want_prompt_logprobs_ = false;
  bool prompt_only_ = false;
  // The prompt's, as its results arrive (with want_prompt_logprobs_); sent with the first
  // event.
  std::vector<TokenLogprob> prompt_logprobs_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<StreamingDetokenizer> detokenizer_;

  // Grows shallow_ (as a KV cache grows: at least 1.5x, in kGrowthPositions steps) so it
  // holds `rows` rows, keeping those it has.
  void ReserveShallow(int64_t rows);

  // Positions a request's caches and shallow_ grow by at least.
  static constexpr int64_t kGrowthPositions = 64;

  // Shallow states of every position sent so far: what a replay resends to rebuild the
  // cloud's KV after a cloud restart. Rows [0, sent_) are valid.
  at::Tensor shallow_;
  std::optional<KvCache> input_cache_;
  std::optional<KvCache> output_cache_;
  std::optional<KvCache> adapter_cache_;
  std::unique_ptr<SpeculativeDecoder> decoder_;
  std::optional<DecodeRounds> rounds_;
  at::Tensor last_output_;  // output-submodel state of the newest consumed position
  bool decoding_ = false;
  bool done_ = false;
  int32_t next_token_ = 0;  // accepted, not yet in any KV: starts the next round
  int64_t sent_ = 0;        // positions whose shallow states went to the cloud
  int64_t consumed_ = 0;    // positions whose deep states went through the output submodel
  // Where the run sent ahead of its verification starts (PipeInfer), -1 without one: a
  // reconnect replays only the positions before it.
  int64_t ahead_from_ = -1;
  // Results of chunks numbered below this are stale: a rollback cancelled the positions they
  // hold (a run sent ahead that the verification rejected).
  uint64_t stale_below_sequence_ = 0;

  // A conversation's earlier turn taken from the agent's ConversationCache: positions
  // [0, reused_) of the caches and shallow_ are its, and its cloud session (parked as
  // parked_session_id_ on stream parked_epoch_, parked_length_ positions long) is resumed
  // instead of a new one opened. 0: a fresh request (or the resume fell through).
  int64_t reused_ = 0;
  uint64_t parked_session_id_ = 0;
  uint64_t parked_epoch_ = 0;
  int64_t parked_length_ = 0;
  bool cloud_parks_ = false;  // the cloud keeps parked sessions (Hello.parks_sessions)
  bool share_conversation_ = false;
  bool keep_prompt_ = false;
  bool cloud_forks_ = false;  // the cloud forks parked sessions (Hello.forks_sessions)
  bool parked_ = false;       // Park kept this request's session
  // parked_session_id_ is shared with other requests: forked (ForkSession), never taken over
  // or closed by this one.
  bool fork_parked_ = false;

  uint64_t session_id_ = 0;
  CloudConnection* cloud_ = nullptr;  // where Open placed the session; null before
  size_t cloud_index_ = 0;             // its index in agent_.clouds_
  uint64_t epoch_ = 0;
  uint64_t sequence_number_ = 0;
  std::shared_ptr<SessionMailbox> mailbox_;
  // The dtype hidden states cross the link in, both ways: the config's wire_dtype, or the
  // cloud's compute dtype (Hello). The agent converts to and from its own compute dtype at
  // this boundary, and asks for its results in it (OpenSession.result_dtype).
  v1::DType wire_dtype_ = v1::DTYPE_FLOAT32;
  v1::DType cloud_dtype_ = v1::DTYPE_FLOAT32;
};

v1::GenerateResponse Agent::Request::Run() {
  c10::InferenceMode inference_mode;
  // The request's own tensors on the device's GPU, not the thread's default one (the
  // submodels guard their own calls: submodel.h).
  const c10::DeviceGuard device_guard(agent_.bundle_.input->options().device);
  v1::GenerateResponse response;
  deadline_ = arrival_ + ToDuration(agent_.config_.request_timeout_s);
  absl::Status prepared;
  absl::Status caught = CatchExceptions("preparing the request", [&] { prepared = Prepare(); });
  if (prepared.ok()) prepared = caught;
  if (!prepared.ok()) {
    ForgetReused();
    Finish(response, v1::FINISH_REASON_ERROR, agent_.AfterRequestFailure(prepared));
    return response;
  }
  stats_.RecordPrompt(prompt_length_);

  const auto serve = [&]() -> absl::Status {
    // A kept prompt no choice could fork (none would match it, or the cloud cannot fork):
    // the choices compute it each, as without one.
    if (keep_prompt_ && prompt_length_ <= agent_.config_.conversation_cache.min_reuse_tokens) {
      return absl::OkStatus();
    }
    TOPHAT_RETURN_IF_ERROR(Open(0));
    if (keep_prompt_ && !(cloud_parks_ && cloud_forks_)) return absl::OkStatus();
    TOPHAT_RETURN_IF_ERROR(Prefill());
    if (keep_prompt_) return absl::OkStatus();        // parked below
    if (prompt_only_) return Emit({}, at::Tensor());  // the prompt's log-probabilities alone
    return Decode();
  };
  absl::Status result;
  absl::Status thrown = CatchExceptions("generating", [&] { result = serve(); });
  if (result.ok()) result = thrown;

  if (cloud_ != nullptr && (!result.ok() || !Park())) {
    v1::AgentMessage goodbye;
    if (result.ok()) {
      goodbye.mutable_close()->set_session_id(session_id_);
    } else {
      goodbye.mutable_cancel()->set_session_id(session_id_);
    }
    cloud_->Send(epoch_, std::move(goodbye)).IgnoreError();
  }
  if (cloud_ != nullptr) cloud_->Unregister(session_id_);

  if (sampler_ != nullptr && sampler_->format_cut_by_limit()) {
    // The answer may have ended before a match: say why where an operator looks.
    spdlog::warn(
        "request {}: its grammar met a bound of its matching (call depth, ways, stacks or "
        "work; docs/openai.md, \"Grammars\"): a way the grammar allows was not followed",
        id_);
    if (agent_.metrics_ != nullptr) agent_.metrics_->grammar_bounds_met.Increment();
  }
  if (result.ok()) {
    const bool stopped = !generated_.empty() &&
                         std::find(stop_ids_.begin(), stop_ids_.end(), generated_.back()) !=
                             stop_ids_.end();
    Finish(response, stopped ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH, result);
  } else if (absl::IsCancelled(result) && cancelled_) {
    Finish(response, v1::FINISH_REASON_CANCELLED, absl::OkStatus());
  } else {
    spdlog::warn("request {} failed: {}", id_, result.ToString());
    Finish(response, v1::FINISH_REASON_ERROR, agent_.AfterRequestFailure(result));
  }
  return response;
}

absl::Status Agent::Request::Prepare() {
  const DeviceBundle& bundle = agent_.bundle_;
  const AgentConfig& config = agent_.config_;
  TOPHAT_ASSIGN_OR_RETURN(
      AppRequestPlan plan,
      PlanAppRequest(request_, *bundle.tokenizer,
                     {.vocab_size = bundle.config.vocab_size,
                      .context = bundle.input->max_context(),
                      .max_prompt_bytes = config.max_prompt_bytes,
                      .default_max_new_tokens = config.default_max_new_tokens,
                      .eos_token_ids = bundle.config.eos_token_ids}));
  tokens_ = std::move(plan.prompt);
  prompt_length_ = static_cast<int64_t>(tokens_.size());
  max_new_tokens_ = plan.max_new_tokens;
  max_positions_ = prompt_length_ + max_new_tokens_;
  sampler_ = std::make_unique<Sampler>(plan.sampling, agent_.token_vocabulary_);
  sampler_->SetPrompt(tokens_);
  stop_ids_ = std::move(plan.stop_ids);
  top_logprobs_ = plan.top_logprobs;
  want_prompt_logprobs_ = plan.prompt_logprobs;
  prompt_only_ = plan.prompt_only;
  detokenizer_ = std::make_unique<StreamingDetokenizer>(*bundle.tokenizer);
  // The prompt goes through the detokenizer first so the answer decodes in context.
  for (int32_t id : tokens_) {
    TOPHAT_RETURN_IF_ERROR(detokenizer_->Push(id).status());
  }

  // The caches and shallow_ grow with the request (KvCache::Growing, ReserveShallow): a
  // request that may reach max_positions_ but stops early holds what it used. The prompt's
  // rows are certain, so they are reserved at once.
  const AgentConfig::Speculative& spec = config.speculative;
  const bool drafting = spec.enabled && bundle.adapter != nullptr;
  // An earlier turn of this conversation, when the agent kept one: its caches carry the
  // positions this prompt shares with it.
  std::optional<ConversationCache::Taken> taken;
  // Prompt log-probabilities need every prompt position's result: nothing is taken.
  const bool reuse = config.conversation_cache.enabled && !want_prompt_logprobs_;
  if (reuse && share_conversation_) {
    std::vector<ConversationCache::Closed> closed;
    std::optional<ConversationCache::Shared> shared =
        agent_.conversations_.Share(tokens_, SteadyClock::now(), closed);
    agent_.CloseParked(closed);
    agent_.ReportConversations();  // what expired
    if (shared.has_value() && shared->adapter.defined() == drafting) {
      TOPHAT_RETURN_IF_ERROR(AdoptShared(*shared, drafting));
    }
  } else if (reuse) {
    // The kept conversation this prompt continues, or a copy of one it only shares a
    // beginning with (left for its own next turn).
    std::vector<ConversationCache::Closed> closed;
    ConversationCache::Reuse found =
        agent_.conversations_.TakeOrShare(tokens_, SteadyClock::now(), closed);
    taken = std::move(found.taken);
    if (taken.has_value() && taken->conversation.adapter.has_value() != drafting) {
      closed.emplace_back(taken->conversation.epoch, taken->conversation.session_id);
      taken.reset();
    }
    agent_.CloseParked(closed);
    agent_.ReportConversations();
    if (found.shared.has_value() && found.shared->adapter.defined() == drafting) {
      TOPHAT_RETURN_IF_ERROR(AdoptShared(*found.shared, drafting));
    }
  }
  if (taken.has_value()) {
    ParkedConversation& kept = taken->conversation;
    reused_ = taken->reuse;
    parked_session_id_ = kept.session_id;
    parked_epoch_ = kept.epoch;
    parked_length_ = kept.length;
    input_cache_.emplace(std::move(*kept.input));
    output_cache_.emplace(std::move(*kept.output));
    if (drafting) adapter_cache_.emplace(std::move(*kept.adapter));
    for (std::optional<KvCache>* cache : {&input_cache_, &output_cache_, &adapter_cache_}) {
      if (!cache->has_value()) continue;
      (*cache)->RaiseMaxCapacity(max_positions_);
      TOPHAT_RETURN_IF_ERROR((*cache)->Truncate(reused_));
    }
    shallow_ = std::move(kept.shallow);
    sent_ = consumed_ = reused_;  // ReserveShallow keeps these rows
  } else if (!fork_parked_) {
    input_cache_.emplace(bundle.input->NewGrowingCache(max_positions_, kGrowthPositions));
    output_cache_.emplace(bundle.output->NewGrowingCache(max_positions_, kGrowthPositions));
    if (drafting) {
      adapter_cache_.emplace(bundle.adapter->NewGrowingCache(max_positions_, kGrowthPositions));
    }
  }
  const int64_t prompt_room = std::min(max_positions_, prompt_length_ + kGrowthPositions);
  TOPHAT_RETURN_IF_ERROR(input_cache_->Reserve(prompt_room));
  TOPHAT_RETURN_IF_ERROR(output_cache_->Reserve(prompt_room));
  if (adapter_cache_) TOPHAT_RETURN_IF_ERROR(adapter_cache_->Reserve(prompt_room));
  ReserveShallow(prompt_room);
  decoder_ = std::make_unique<SpeculativeDecoder>(
      SpeculativeDecoder::Models{.input = bundle.input.get(),
                                 .adapter = drafting ? bundle.adapter.get() : nullptr,
                                 .output = bundle.output.get()},
      *input_cache_, adapter_cache_ ? &*adapter_cache_ : nullptr, *output_cache_,
      SpeculativeOptions{.enabled = drafting,
                         .eta = spec.eta,
                         .max_draft = spec.max_draft_tokens,
                         .parallel = spec.parallel_drafting,
                         .parallel_top_k = spec.parallel_top_k,
                         .parallel_steps = spec.parallel_steps,
                         .jump_forward = spec.jump_forward},
      *sampler_);
  rounds_.emplace(*decoder_, stats_,
                  DecodeRoundOptions{.adaptive_window = spec.adaptive_window,
                                     .max_draft_tokens = spec.max_draft_tokens,
                                     .trace = request_.trace(),
                                     .send_ahead = spec.max_runs_in_flight >= 2,
                                     .ahead_min_keep_rate = spec.ahead_min_keep_rate});
  return absl::OkStatus();
}

absl::Status Agent::Request::AdoptShared(const ConversationCache::Shared& shared,
                                         bool drafting) {
  const DeviceBundle& bundle = agent_.bundle_;
  input_cache_.emplace(bundle.input->NewGrowingCache(max_positions_, kGrowthPositions));
  output_cache_.emplace(bundle.output->NewGrowingCache(max_positions_, kGrowthPositions));
  if (drafting) {
    adapter_cache_.emplace(bundle.adapter->NewGrowingCache(max_positions_, kGrowthPositions));
  }
  TOPHAT_RETURN_IF_ERROR(input_cache_->ImportPositions(0, shared.input));
  TOPHAT_RETURN_IF_ERROR(output_cache_->ImportPositions(0, shared.output));
  if (drafting) TOPHAT_RETURN_IF_ERROR(adapter_cache_->ImportPositions(0, shared.adapter));
  reused_ = shared.reuse;
  for (std::optional<KvCache>* cache : {&input_cache_, &output_cache_, &adapter_cache_}) {
    if (cache->has_value()) TOPHAT_RETURN_IF_ERROR((*cache)->Truncate(reused_));
  }
  shallow_ = shared.shallow;
  sent_ = consumed_ = reused_;  // ReserveShallow keeps these rows
  parked_session_id_ = shared.session_id;
  parked_epoch_ = shared.epoch;
  parked_length_ = shared.length;
  fork_parked_ = true;
  return absl::OkStatus();
}

absl::Status Agent::Request::Open(uint64_t after_epoch) {
  const SteadyClock::time_point wait_until =
      std::min(deadline_, SteadyClock::now() + ToDuration(agent_.config_.reconnect.give_up_after_s));
  // Waited for in slices, so that a request cancelled, or whose app went away, while no
  // cloud is connected ends now rather than at the give-up, and the agent's shutdown is not
  // held up by it.
  absl::StatusOr<Placement> placed;
  while (true) {
    const SteadyClock::time_point slice_end =
        std::min(wait_until, SteadyClock::now() + std::chrono::milliseconds(100));
    placed = agent_.PlaceOnCloud(slice_end, after_epoch,
                                 parked_session_id_ != 0 ? parked_epoch_ : 0);
    if (placed.ok()) {
      if (placed->cloud != cloud_) {
        if (cloud_ != nullptr) cloud_->Unregister(session_id_);
        placed->cloud->Register(session_id_, mailbox_);
        if (agent_.metrics_ != nullptr) {
          if (cloud_ != nullptr) agent_.cloud_targets_[cloud_index_].failovers.Increment();
          agent_.cloud_targets_[placed->index].placed.Increment();
        }
        cloud_ = placed->cloud;
        cloud_index_ = placed->index;
      }
      // Registered before this check: if the stream is still the one placed on, its loss
      // reaches the mailbox; if it went meanwhile, place again.
      const CloudConnection::LoadView now = cloud_->load_view();
      if (now.connected && now.epoch == placed->connected.epoch) break;
      continue;
    }
    if (cancelled_) return absl::CancelledError("cancelled");
    if (client_gone_ && client_gone_()) {
      cancelled_ = true;
      return absl::CancelledError("the client went away while the request waited for a cloud");
    }
    if (agent_.stopping() || SteadyClock::now() >= wait_until) return placed.status();
  }
  cloud_->CountPlacement();
  CloudConnection::Connected connected = std::move(placed->connected);
  epoch_ = connected.epoch;
  if (max_positions_ > connected.hello.max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", prompt_length_, " tokens + max_new_tokens ", max_new_tokens_,
        " exceeds the cloud's context of ", connected.hello.max_positions(), " positions"));
  }
  cloud_dtype_ = connected.hello.dtype();  // CheckHello made sure this build knows it
  wire_dtype_ = ChosenWireDtype();
  cloud_parks_ = connected.hello.parks_sessions();
  cloud_forks_ = connected.hello.forks_sessions();
  max_chunk_positions_ = std::max<int64_t>(1, connected.hello.max_chunk_positions());
  if (chunk_size_ == 0) {
    chunk_size_ = request_.prompt_chunk_size() > 0 ? request_.prompt_chunk_size()
                  : agent_.config_.prompt_chunk_size > 0
                      ? agent_.config_.prompt_chunk_size
                      : std::max<int64_t>(1, connected.hello.control().prompt_chunk_size());
  }
  if (parked_session_id_ != 0) {  // an earlier turn's session, not yet taken back
    TOPHAT_ASSIGN_OR_RETURN(bool resumed, Resume(connected));
    if (resumed) return absl::OkStatus();
  }
  v1::AgentMessage message;
  v1::OpenSession* open = message.mutable_open();
  open->set_session_id(session_id_);
  open->set_max_positions(static_cast<uint32_t>(max_positions_));
  const double left = Seconds(deadline_ - SteadyClock::now());
  open->set_timeout_ms(static_cast<uint32_t>(std::max(1.0, left * 1000)));
  open->set_result_dtype(wire_dtype_);
  SendToCloud(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<bool> Agent::Request::Resume(const CloudConnection::Connected& connected) {
  if (!cloud_parks_ || parked_epoch_ != connected.epoch ||
      (fork_parked_ && !connected.hello.forks_sessions())) {
    // A newer stream: the cloud that held the session is gone or has dropped it (or it
    // cannot fork it).
    if (agent_.CloudOfEpoch(parked_epoch_) == nullptr) DropGoneShared();
    ForgetReused();
    return false;
  }
  v1::AgentMessage message;
  const double left = Seconds(deadline_ - SteadyClock::now());
  const auto timeout_ms = static_cast<uint32_t>(std::max(1.0, left * 1000));
  // The parked session may be longer than this request can grow (an earlier turn that ran
  // longer than this one's prompt and max_new_tokens): the cloud takes it back at its
  // length, and the truncate to reused_ that follows gives back what this request will not use.
  const auto max_positions = static_cast<uint32_t>(std::max(max_positions_, parked_length_));
  if (fork_parked_) {
    v1::ForkSession* fork = message.mutable_fork();
    fork->set_session_id(parked_session_id_);
    fork->set_new_session_id(session_id_);
    fork->set_max_positions(max_positions);
    fork->set_timeout_ms(timeout_ms);
    fork->set_result_dtype(wire_dtype_);
  } else {
    v1::ResumeSession* resume = message.mutable_resume();
    resume->set_session_id(parked_session_id_);
    resume->set_new_session_id(session_id_);
    resume->set_max_positions(max_positions);
    resume->set_timeout_ms(timeout_ms);
  }
  SendToCloud(std::move(message));
  if (!send_failure_.ok()) return send_failure_;
  // Nothing else goes until the cloud answers: if it no longer holds the session, the whole
  // prompt goes to a new one, and no chunk meant for the old one may reach it.
  while (true) {
    if (cancelled_) return absl::CancelledError("cancelled");
    std::optional<MailboxEvent> event = mailbox_->Pop(deadline_);
    if (!event) {
      return absl::DeadlineExceededError("the request's deadline passed waiting for the cloud");
    }
    if (event->kind == MailboxEvent::Kind::kInterrupted) continue;  // cancelled_ says so
    if (event->epoch != epoch_) continue;
    if (event->kind == MailboxEvent::Kind::kDisconnected) {
      DropGoneShared();
      ForgetReused();  // the replay after a reconnect opens a new session
      return false;
    }
    const v1::CloudMessage& answer = event->message;
    if (answer.has_admitted()) {
      stats_.RecordAdmitted(answer.admitted().queue_seconds());
      break;
    }
    if (answer.has_error()) {
      spdlog::debug("request {}: the cloud no longer holds conversation session {} ({}); "
                    "sending the whole prompt",
                    id_, parked_session_id_, answer.error().message());
      DropGoneShared();
      ForgetReused();
      return false;
    }
  }
  parked_session_id_ = 0;  // it is this request's session now (a fork's copy, if forked)
  fork_parked_ = false;
  if (parked_length_ > reused_) SendTruncate(reused_);
  return true;
}

void Agent::Request::DropGoneShared() {
  if (!fork_parked_) return;
  std::vector<ConversationCache::Closed> closed;
  agent_.conversations_.Forget(parked_epoch_, parked_session_id_, SteadyClock::now(), closed);
  // The gone session itself has nothing left to close.
  std::erase(closed, ConversationCache::Closed{parked_epoch_, parked_session_id_});
  agent_.CloseParked(closed);
  agent_.ReportConversations();
}

void Agent::Request::ForgetReused() {
  // A shared (forked) session is the conversation cache's, not this request's to close.
  if (parked_session_id_ != 0 && !fork_parked_) {
    agent_.CloseParked({{parked_epoch_, parked_session_id_}});
  }
  parked_session_id_ = 0;
  fork_parked_ = false;
  if (reused_ == 0) return;
  for (std::optional<KvCache>* cache : {&input_cache_, &output_cache_, &adapter_cache_}) {
    if (cache->has_value()) (*cache)->Clear();
  }
  reused_ = 0;
  sent_ = consumed_ = 0;
}

bool Agent::Request::Park() {
  const AgentConfig::ConversationCache& config = agent_.config_.conversation_cache;
  // At rest: nothing sent ahead or unanswered, so the cloud's KV is exactly [0, sent_).
  if (!config.enabled || !cloud_parks_ || ahead_from_ >= 0 || sent_ != consumed_ ||
      !input_cache_.has_value() || !output_cache_.has_value() ||
      (keep_prompt_ && consumed_ < prompt_length_)) {
    return false;
  }
  ParkedConversation kept;
  kept.length = std::min({sent_, input_cache_->length(), output_cache_->length()});
  if (adapter_cache_.has_value()) kept.length = std::min(kept.length, adapter_cache_->length());
  kept.tokens = tokens_;
  kept.prompt_length = prompt_length_;
  kept.forkable = cloud_forks_;
  kept.session_id = session_id_;
  kept.epoch = epoch_;
  kept.input.emplace(std::move(*input_cache_));
  kept.output.emplace(std::move(*output_cache_));
  if (adapter_cache_.has_value()) kept.adapter.emplace(std::move(*adapter_cache_));
  input_cache_.reset();
  output_cache_.reset();
  adapter_cache_.reset();
  kept.shallow = std::move(shallow_);
  v1::AgentMessage message;
  message.mutable_park()->set_session_id(session_id_);
  message.mutable_park()->set_keep_alive_ms(
      static_cast<uint32_t>(std::min(config.keep_alive_s * 1000, 4e9)));
  cloud_->Send(epoch_, std::move(message)).IgnoreError();
  std::vector<ConversationCache::Closed> closed;
  agent_.conversations_.Keep(std::move(kept), SteadyClock::now(), closed);
  agent_.CloseParked(closed);
  agent_.ReportConversations();
  parked_ = true;
  return true;
}

std::vector<int64_t> Agent::Request::PromptChunks() {
  const AgentConfig& config = agent_.config_;
  if (config.prompt_chunk_plan == "jupiter" && request_.prompt_chunk_size() == 0 &&
      config.prompt_chunk_size == 0 && config.pipeline_prompt_chunks) {
    const int64_t hidden = agent_.bundle_.config.hidden_size;
    const v1::DType uplink_dtype =
        agent_.wire_dtype_from_scheduler_ ? ChosenWireDtype() : wire_dtype_;
    double up = 0;
    double down = 0;
    {
      std::lock_guard<std::mutex> lock(agent_.device_state_mutex_);
      up = agent_.link_.uplink_bytes_per_second();
      down = agent_.link_.downlink_bytes_per_second();
    }
    const PromptChunkPlanner::LinkRates links{
        .uplink_seconds_per_position =
            up > 0 ? static_cast<double>(WireBytesPerPosition(uplink_dtype, hidden)) / up : 0,
        .downlink_seconds_per_position =
            down > 0 ? static_cast<double>(WireBytesPerPosition(wire_dtype_, hidden)) / down
                     : 0};
    // No ceiling, as Jupiter plans: with HAT's size as one (PromptChunkPlanner::Plan's
    // max_chunk) the DP, whose link stage has no per-message cost, cut prompts into more,
    // smaller chunks and TTFT rose 36-69% against equal chunks; without one, its chunks were
    // longer than HAT's, TTFT fell 1-6% and TBT rose up to 48% (docs/benchmarks.md).
    std::optional<ChunkPlan> plan = agent_.chunk_planner_.Plan(reused_, prompt_length_, links);
    if (agent_.metrics_ != nullptr) {
      (plan ? agent_.metrics_->prompt_chunk_plans_jupiter
            : agent_.metrics_->prompt_chunk_plans_unmeasured)
          .Increment();
    }
    if (plan) {
      spdlog::debug("request {}: {} prompt positions in {} planned chunks ({} first, {} last); "
                    "{:.1f} ms predicted, {:.1f} ms in equal chunks",
                    id_, prompt_length_ - reused_, plan->chunks.size(), plan->chunks.front(),
                    plan->chunks.back(), 1e3 * plan->seconds, 1e3 * plan->equal_chunks_seconds);
      return std::move(plan->chunks);
    }
  }
  std::vector<int64_t> chunks;
  for (int64_t start = reused_; start < prompt_length_; start += chunk_size_) {
    chunks.push_back(std::min(chunk_size_, prompt_length_ - start));
  }
  return chunks;
}

absl::Status Agent::Request::Prefill() {
  // An earlier turn's positions [0, reused_) are in both sides' KV already.
  int64_t start = reused_;
  for (const int64_t n : PromptChunks()) {
    if (cancelled_) return absl::CancelledError("cancelled");
    const SteadyClock::time_point computing = SteadyClock::now();
    TOPHAT_RETURN_IF_ERROR(ComputeShallow(start, n));
    const double device_seconds = Seconds(SteadyClock::now() - computing);
    sent_ = start + n;
    SendRows(start, start + n, v1::PHASE_PREFILL, device_seconds);
    // The adapter's KV covers the prompt too; built while the chunk is on the wire.
    TOPHAT_RETURN_IF_ERROR(decoder_->AbsorbPrompt(shallow_.narrow(0, start, n)));
    // The device's input stage for the chunk planner: both, on this thread, less the send.
    agent_.chunk_planner_.ObserveDeviceInput(n, start, Seconds(SteadyClock::now() - computing));
    start += n;
    TOPHAT_RETURN_IF_ERROR(Pump(sent_, /*block=*/!agent_.config_.pipeline_prompt_chunks));
  }
  return Pump(prompt_length_, /*block=*/true);
}

absl::Status Agent::Request::Decode() {
  // The first token, from the prompt's last position.
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits, agent_.bundle_.output->Logits(last_output_));
  const int32_t first = sampler_->Sample(logits[0]);
  sampler_->Commit(std::span<const int32_t>(&first, 1));
  TOPHAT_RETURN_IF_ERROR(Emit(std::span<const int32_t>(&first, 1), logits));
  next_token_ = first;
  decoding_ = true;
  while (!done_) {
    if (cancelled_) return absl::CancelledError("cancelled");
    // A round emits at most drafts + 1 tokens; never draft past the length limit.
    const int64_t room = max_new_tokens_ - static_cast<int64_t>(generated_.size()) - 1;
    if (agent_.config_.speculative.parallel_steps_from_cloud) {
      const v1::Control control = cloud_->control();
      if (control.draft_steps_per_device()) decoder_->set_parallel_steps(control.draft_steps());
    }
    TOPHAT_ASSIGN_OR_RETURN(RoundOutcome outcome, rounds_->Run(next_token_, room, *this));
    sampler_->Commit(outcome.tokens);  // before the next round drafts past them
    TOPHAT_RETURN_IF_ERROR(Emit(outcome.tokens, outcome.logits));
    next_token_ = outcome.tokens.back();
    agent_.ReportDecodeRound(epoch_, decoder_->draft_step_seconds(),
                             static_cast<double>(outcome.accepted + 1));
  }
  return absl::OkStatus();
}

void Agent::Request::ReserveShallow(int64_t rows) {
  const int64_t held = shallow_.defined() ? shallow_.size(0) : 0;
  if (rows <= held) return;
  const int64_t wanted = std::max(rows, held + held / 2);
  const int64_t grown = std::min(
      max_positions_, (wanted + kGrowthPositions - 1) / kGrowthPositions * kGrowthPositions);
  at::Tensor bigger = at::empty({std::max(grown, rows), agent_.bundle_.config.hidden_size},
                                at::TensorOptions().dtype(agent_.bundle_.input->options().dtype));
  if (sent_ > 0) bigger.narrow(0, 0, sent_).copy_(shallow_.narrow(0, 0, sent_));
  shallow_ = std::move(bigger);
}

void Agent::Request::SendDecodeRows(int64_t start, const at::Tensor& rows) {
  const int64_t count = rows.size(0);
  ReserveShallow(start + count);
  shallow_.narrow(0, start, count).copy_(rows);
  sent_ = start + count;
  SendRows(start, sent_, v1::PHASE_DECODE, /*device_seconds=*/0);
}

void Agent::Request::SendAheadRows(int64_t start, const at::Tensor& rows) {
  if (ahead_from_ < 0) ahead_from_ = start;
  SendDecodeRows(start, rows);
}

void Agent::Request::SendTruncate(int64_t length) {
  v1::AgentMessage rollback;
  v1::Truncate* truncate = rollback.mutable_truncate();
  truncate->set_session_id(session_id_);
  truncate->set_sequence_number(++sequence_number_);
  truncate->set_length(static_cast<uint32_t>(length));
  SendToCloud(std::move(rollback));
}

void Agent::Request::RollBack(int64_t length) {
  if (length < sent_) {
    SendTruncate(length);
    // Every position up to `length` has been consumed, so whatever earlier chunk still
    // answers holds only positions the truncate cancels.
    stale_below_sequence_ = sequence_number_;
  }
  sent_ = consumed_ = length;
  ahead_from_ = -1;
}

absl::Status Agent::Request::ComputeShallow(int64_t first, int64_t count) {
  const DeviceBundle& bundle = agent_.bundle_;
  at::Tensor ids = at::empty({count}, at::kLong);
  for (int64_t i = 0; i < count; ++i) ids[i] = tokens_[first + i];
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor embedded, bundle.input->Embed(ids));
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor hidden, bundle.input->Forward(embedded, *input_cache_));
  ReserveShallow(first + count);
  shallow_.narrow(0, first, count).copy_(hidden);
  return absl::OkStatus();
}

v1::DType Agent::Request::ChosenWireDtype() const {
  if (agent_.wire_dtype_from_scheduler_) {
    const v1::DType chosen = cloud_->control().wire_dtype();
    // A dtype from a newer cloud that this build cannot encode: the compute dtype.
    if (chosen != v1::DTYPE_UNSPECIFIED && WireBytesPerPosition(chosen, 1) > 0) return chosen;
    return cloud_dtype_;
  }
  return agent_.wire_dtype_ != v1::DTYPE_UNSPECIFIED ? agent_.wire_dtype_ : cloud_dtype_;
}

void Agent::Request::SendRows(int64_t from, int64_t to, v1::Phase phase, double device_seconds) {
  for (int64_t start = from; start < to; start += max_chunk_positions_) {
    const int64_t n = std::min(max_chunk_positions_, to - start);
    v1::AgentMessage message;
    v1::ForwardChunk* chunk = message.mutable_forward();
    chunk->set_session_id(session_id_);
    chunk->set_sequence_number(++sequence_number_);
    chunk->set_first_position(static_cast<uint32_t>(start));
    chunk->set_phase(phase);
    // The prompt's last chunk (or a replay's, which reaches it): the session decodes next.
    chunk->set_decode_follows(phase == v1::PHASE_PREFILL && start + n == to &&
                           to >= prompt_length_);
    const at::Tensor rows = shallow_.narrow(0, start, n);
    // The scheduler's choice may change between chunks (the cloud takes any wire dtype);
    // results keep the session's (OpenSession.result_dtype).
    const v1::DType uplink_dtype =
        agent_.wire_dtype_from_scheduler_ ? ChosenWireDtype() : wire_dtype_;
    if (!PackHiddenStates(rows, uplink_dtype, chunk->mutable_states()).ok()) {
      // A value the wire cannot carry (not finite for int8, beyond float16's range): that
      // chunk goes in the cloud's own dtype, which carries it as it is.
      PackHiddenStates(rows, cloud_dtype_, chunk->mutable_states()).IgnoreError();
    }
    const size_t bytes = chunk->states().data().size() + chunk->states().scales().size();
    stats_.RecordUpload(bytes);
    // Prompt chunks may wait for the uplink pacer; their link samples start when they go.
    SentStamp sent_stamp =
        phase == v1::PHASE_PREFILL ? std::make_shared<std::atomic<int64_t>>(0) : nullptr;
    chunks_.Sent({.sequence_number = sequence_number_,
                  .epoch = epoch_,
                  .first_position = start,
                  .positions = n,
                  .bytes = bytes,
                  .wire_bytes = OnWireBytes(message.ByteSizeLong()),
                  .phase = phase,
                  .device_seconds = start == from ? device_seconds : 0,
                  .sent_stamp = sent_stamp});
    SendToCloud(std::move(message), std::move(sent_stamp));
  }
}

void Agent::Request::SendToCloud(v1::AgentMessage message, SentStamp sent) {
  absl::Status status = cloud_->Send(epoch_, std::move(message), std::move(sent));
  if (!status.ok() && status.code() != absl::StatusCode::kUnavailable && send_failure_.ok()) {
    send_failure_ = std::move(status);
  }
}

absl::Status Agent::Request::Pump(int64_t target, bool block) {
  while (consumed_ < target) {
    if (cancelled_) return absl::CancelledError("cancelled");
    if (!send_failure_.ok()) return send_failure_;
    std::optional<MailboxEvent> event =
        mailbox_->Pop(block ? deadline_ : SteadyClock::now());
    if (!event) {
      if (!block) return absl::OkStatus();
      return absl::DeadlineExceededError(absl::StrCat(
          "the request's deadline passed after ", consumed_, " of ", target, " positions"));
    }
    switch (event->kind) {
      case MailboxEvent::Kind::kInterrupted:
        continue;  // the cancelled_ check above ends the request
      case MailboxEvent::Kind::kDisconnected:
        // A stream this session no longer uses. Epochs name streams, not their order across
        // clouds: a session that moved may be on a stream older than the one it left.
        if (event->epoch != epoch_) continue;
        TOPHAT_RETURN_IF_ERROR(Reconnect("the cloud stream broke"));
        continue;
      case MailboxEvent::Kind::kMessage:
        if (event->epoch != epoch_) continue;  // an answer from a stream we left
        break;
    }
    const v1::CloudMessage& message = event->message;
    switch (message.kind_case()) {
      case v1::CloudMessage::kAdmitted:
        stats_.RecordAdmitted(message.admitted().queue_seconds());
        break;
      case v1::CloudMessage::kResult:
        if (const std::optional<double> network = chunks_.Answered(
                message.result(), event->epoch, event->received, OnWireBytes(message.ByteSizeLong()))) {
          stats_.RecordDecodeNetwork(*network);
        }
        TOPHAT_RETURN_IF_ERROR(HandleResult(message.result()));
        break;
      case v1::CloudMessage::kError: {
        const v1::SessionError& error = message.error();
        if (error.session_alive()) {
          return CloudError(error);
        }
        if (error.code() == static_cast<int32_t>(absl::StatusCode::kUnavailable)) {
          // The cloud is draining or shutting down: wait for its successor and replay.
          TOPHAT_RETURN_IF_ERROR(Reconnect(std::string(error.message())));
          break;
        }
        return CloudError(error);
      }
      case v1::CloudMessage::kTruncated:
        stats_.RecordTruncated(message.truncated().length());
        break;
      case v1::CloudMessage::kHello:
      case v1::CloudMessage::kControl:
      case v1::CloudMessage::kReceived:  // the connection's, never routed to a session
      case v1::CloudMessage::kLoad:
      case v1::CloudMessage::KIND_NOT_SET:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status Agent::Request::HandleResult(const v1::ForwardResult& result) {
  const DeviceBundle& bundle = agent_.bundle_;
  // Any wire dtype: results come in the session's, or in the cloud's where a value does not
  // fit the session's.
  TOPHAT_RETURN_IF_ERROR(ValidateHiddenStates(result.states(), v1::DTYPE_UNSPECIFIED,
                                              bundle.config.hidden_size, max_positions_));
  if (result.sequence_number() < stale_below_sequence_) return absl::OkStatus();
  stats_.RecordResult(result);
  const int64_t first = result.first_position();
  const int64_t count = result.states().num_positions();
  if (first > consumed_) {
    return absl::InternalError(absl::StrCat("the cloud returned positions from ", first,
                                            " but position ", consumed_, " is still missing"));
  }
  if (first + count <= consumed_) return absl::OkStatus();  // a replayed position
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor deep,
                          UnpackHiddenStates(result.states(), bundle.output->options().dtype));
  const int64_t skip = consumed_ - first;
  deep = deep.narrow(0, skip, count - skip);
  const SteadyClock::time_point computing = SteadyClock::now();
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor out, bundle.output->Forward(deep, *output_cache_));
  if (result.phase() == v1::PHASE_PREFILL && !decoding_) {
    // The prompt's pipeline stages for the chunk planner: the output submodel here, and the
    // cloud's step that carried these positions (with the rest of its batch).
    agent_.chunk_planner_.ObserveDeviceOutput(count - skip, consumed_,
                                              Seconds(SteadyClock::now() - computing));
    agent_.chunk_planner_.ObserveCloud(count, first, result.compute_seconds());
  }
  if (want_prompt_logprobs_ && !decoding_) {
    // Row j, position consumed_ + j, scores the prompt's next token; the last position's
    // row scores the first generated one instead.
    const int64_t scored = std::min(out.size(0), prompt_length_ - 1 - consumed_);
    if (scored > 0) {
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits,
                              bundle.output->Logits(out.narrow(0, 0, scored)));
      std::vector<TokenLogprob> rows = TokenLogprobs(
          logits, std::span<const int32_t>(tokens_).subspan(consumed_ + 1, scored),
          top_logprobs_);
      prompt_logprobs_.insert(prompt_logprobs_.end(), std::make_move_iterator(rows.begin()),
                              std::make_move_iterator(rows.end()));
    }
  }
  last_output_ = out.narrow(0, out.size(0) - 1, 1);
  if (decoding_) rounds_->AddOutputStates(out);
  consumed_ += count - skip;
  stats_.RecordCloudKvLength(result.kv_length());
  return absl::OkStatus();
}

absl::Status Agent::Request::Reconnect(const std::string& why) {
  // A run sent ahead of its verification is not replayed: the round that sent it finds it
  // gone (sent() back at its start) and rolls back as for a miss.
  if (ahead_from_ >= 0) {
    sent_ = std::min(sent_, ahead_from_);
    ahead_from_ = -1;
  }
  spdlog::warn("request {}: {}; reconnecting and replaying {} position(s)", id_, why, sent_);
  stats_.RecordReconnect();
  const uint64_t old_epoch = epoch_;
  TOPHAT_RETURN_IF_ERROR(Open(old_epoch));
  SendRows(0, sent_, v1::PHASE_PREFILL, /*device_seconds=*/0);
  return absl::OkStatus();
}

absl::Status Agent::Request::Emit(std::span<const int32_t> tokens, const at::Tensor& logits) {
  const SteadyClock::time_point now = SteadyClock::now();
  TokenEvent event;
  event.request_id = id_;
  event.prompt_logprobs = std::move(prompt_logprobs_);  // the first event's
  prompt_logprobs_.clear();
  std::vector<TokenLogprob> logprobs;
  if (top_logprobs_ >= 0 && !tokens.empty()) {
    logprobs = TokenLogprobs(logits, tokens, top_logprobs_);
  }
  size_t taken = 0;
  for (int32_t token : tokens) {
    if (!logprobs.empty()) event.logprobs.push_back(std::move(logprobs[taken]));
    ++taken;
    generated_.push_back(token);
    tokens_.push_back(token);
    event.token_ids.push_back(token);
    TOPHAT_ASSIGN_OR_RETURN(std::string text, detokenizer_->Push(token));
    event.text += text;
    event.token_texts.push_back(std::move(text));
    if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end() ||
        static_cast<int64_t>(generated_.size()) >= max_new_tokens_) {
      done_ = true;
      break;
    }
  }
  if (taken > 0) stats_.RecordTokens(now, taken);  // a prompt-only answer has no first token
  if (!on_tokens_(event)) {
    cancelled_ = true;
    return absl::CancelledError("the client went away");
  }
  return absl::OkStatus();
}

void Agent::Request::Finish(v1::GenerateResponse& response, v1::FinishReason reason,
                            const absl::Status& error) {
  response.set_request_id(id_);
  response.set_finish_reason(reason);
  if (!error.ok()) response.set_error(error.ToString());
  if (reason != v1::FINISH_REASON_ERROR && detokenizer_ != nullptr) {
    auto rest = detokenizer_->Flush();
    if (rest.ok()) response.set_text(*rest);
  }
  v1::RequestStats* stats = response.mutable_stats();
  *stats = stats_.Finish(reason, {.prompt_tokens = prompt_length_,
                                  .generated_tokens = static_cast<int64_t>(generated_.size()),
                                  .prompt_chunk_size = chunk_size_,
                                  .reused_prompt_tokens = reused_});
  *stats->mutable_chunks() = chunks_.trace();
}

namespace {

// cloud_tls.crl_file, checked against cloud_tls.ca_file, with a warning when it is due for
// renewal.
absl::StatusOr<RevokedCertificates> LoadCloudRevocationLists(const AgentConfig::CloudTls& tls) {
  TOPHAT_ASSIGN_OR_RETURN(
      RevokedCertificates revoked,
      LoadRevocationLists(tls.crl_file, "cloud_tls.crl_file", tls.ca_file, "cloud_tls.ca_file"));
  WarnOfStaleRevocationLists(revoked, "cloud_tls.crl_file", tls.crl_file,
                             "renew it (the agent reads it before every connection)");
  return revoked;
}

struct CloudLink {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string token;  // "": none
  std::shared_ptr<const RevokedCertificates> revoked;  // cloud_tls.crl_file's; null: none
};

// The link's credentials and token: checked first, so that a missing certificate fails
// before the bundle loads.
absl::StatusOr<CloudLink> CloudLinkOf(const AgentConfig& config) {
  CloudLink link;
  if (config.cloud_tls.insecure) {
    spdlog::warn("cloud_tls.insecure: the link to the cloud at {} is plaintext and "
                 "unauthenticated; use it only on a trusted network",
                 absl::StrJoin(config.clouds(), ", "));
    link.credentials = grpc::InsecureChannelCredentials();
  } else {
    TOPHAT_ASSIGN_OR_RETURN(link.credentials,
                            MutualTlsChannelCredentials({.certificate_file = config.cloud_tls.certificate_file,
                                                         .private_key_file = config.cloud_tls.private_key_file,
                                                         .ca_file = config.cloud_tls.ca_file},
                                                        "cloud_tls"));
  }
  if (!config.cloud_tls.token_file.empty()) {
    TOPHAT_ASSIGN_OR_RETURN(link.token,
                            ReadTokenFile(config.cloud_tls.token_file, "cloud_tls.token_file"));
  }
  if (!config.cloud_tls.crl_file.empty()) {
    TOPHAT_ASSIGN_OR_RETURN(RevokedCertificates revoked,
                            LoadCloudRevocationLists(config.cloud_tls));
    link.revoked = std::make_shared<const RevokedCertificates>(std::move(revoked));
  }
  return link;
}

}  // namespace

absl::StatusOr<BundleContents> Agent::CheckConfig(const AgentConfig& config) {
  TOPHAT_RETURN_IF_ERROR(CloudLinkOf(config).status());
  TOPHAT_RETURN_IF_ERROR(ParseTorchDtypeName(config.dtype, "dtype").status());
  TOPHAT_ASSIGN_OR_RETURN(BundleContents bundle, InspectBundle(config.bundle, BundleKind::kDevice));
  TOPHAT_RETURN_IF_ERROR(CheckDeviceOnHost(at::Device(config.device)));
  return bundle;
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentConfig& config,
                                                     prometheus::Registry* registry) {
  TOPHAT_ASSIGN_OR_RETURN(CloudLink link, CloudLinkOf(config));
  std::shared_ptr<grpc::ChannelCredentials> cloud_credentials = std::move(link.credentials);
  std::string cloud_token = std::move(link.token);
  std::shared_ptr<const RevokedCertificates> cloud_revoked = std::move(link.revoked);
  TOPHAT_ASSIGN_OR_RETURN(at::ScalarType dtype, ParseTorchDtypeName(config.dtype, "dtype"));
  SubmodelOptions options{.dtype = dtype,
                          .device = at::Device(config.device),
                          .max_context = config.max_context,
                          .bf16_weights = config.bf16_weights,
                          .int8_activations = config.int8_activations,
                          .bf16_activations = config.bf16_activations};
  TOPHAT_ASSIGN_OR_RETURN(DeviceBundle bundle, DeviceBundle::Load(config.bundle, options));
  const bool rounds_activations =
      bundle.input->rounds_activations() || bundle.output->rounds_activations();
  if (config.int8_activations && !rounds_activations) {
    spdlog::warn("int8_activations: the bundle {} has float weights, so its activations stay "
                 "float32 (make an int8 bundle with `tophat split --device-weights int8`)",
                 config.bundle);
  } else if (config.int8_activations && bundle.manifest.weights != "int8") {
    spdlog::info(
        "device weights: float, but for experts held in MXFP4, whose inputs are rounded "
        "to int8 per block of 32 for integer products");
  }
  if (config.bf16_weights && bundle.manifest.weights != "int8") {
    if (!config.bf16_activations) {
      spdlog::info("device weights: bfloat16, computed in float32");
    } else if (kernels::Bf16PromptKernelAvailable()) {
      spdlog::info(
          "device weights: bfloat16, computed in float32 for decode; prompts rounded "
          "to bfloat16 and multiplied in bfloat16 (AVX512_BF16)");
    } else {
      spdlog::warn(
          "bf16_activations: this CPU has no AVX512_BF16, so prompts are computed "
          "in float32 as decode is");
    }
  }
  if (bundle.manifest.weights == "int8") {
    if (bundle.input->int8_weights()) {
      spdlog::info("device weights: int8 with per-row scales, {}",
                   config.int8_activations
                       ? "activations rounded to int8 per block of 32, integer products"
                       : "computed in float32");
    } else {
      spdlog::info("device weights: int8 in the bundle, dequantized to {} on {} as they loaded",
                   config.dtype, config.device);
    }
  }
  if (options.device.is_cpu()) {
    // Which instruction sets the kernels chose on this CPU (a Jetson without Armv8.2's dot
    // products, say, decodes int8 activations slower and takes their prompts through BLAS):
    // for the operator reading the log.
    const kernels::W8A8Isa integer_isa = kernels::SupportedW8A8Isas().back();
    spdlog::info(
        "device CPU kernels: {} for float and int8 weights, {} for int8 activations ({})",
        kernels::CpuIsaName(kernels::SelectedCpuIsa()), kernels::W8A8IsaName(integer_isa),
        kernels::HasInt8Gemm(integer_isa) ? "prompts in integers" : "prompts through BLAS");
  }
  if (dtype == at::kBFloat16 && options.device.is_cpu() && !kernels::CpuHasBf16Arithmetic()) {
    spdlog::warn("dtype bfloat16: this CPU has no bfloat16 arithmetic, so LibTorch converts "
                 "each operation to float32 and back; the weights and KV take half the memory "
                 "but compute is slower than float32");
  }
  if (config.speculative.enabled && bundle.adapter == nullptr) {
    spdlog::warn("speculative decoding is on but the device bundle {} has no adapter; decoding "
                 "without drafts (run `tophat distill --out {}` to make one)",
                 config.bundle, config.bundle);
  } else if (config.speculative.enabled) {
    spdlog::info("speculative decoding: adapter with {} parameters, eta {}, up to {} drafts, "
                 "parallel drafting {}",
                 bundle.manifest.adapter->num_parameters, config.speculative.eta,
                 config.speculative.max_draft_tokens,
                 config.speculative.parallel_drafting
                     ? absl::StrCat("top-", config.speculative.parallel_top_k, " x ",
                                    config.speculative.parallel_steps)
                     : std::string("off"));
  }
  std::shared_ptr<DnsClouds> dns;
  if (config.cloud_addresses.empty() && IsDnsCloudTarget(config.cloud_address)) {
    TOPHAT_ASSIGN_OR_RETURN(
        dns, DnsClouds::Create(config.cloud_address, static_cast<size_t>(config.cloud_dns_streams)));
    spdlog::info("cloud_address {}: {} stream(s), one to each of its addresses",
                 config.cloud_address, dns->slots());
  }
  return std::unique_ptr<Agent>(new Agent(config, std::move(bundle), std::move(cloud_credentials),
                                          std::move(cloud_token), std::move(cloud_revoked),
                                          std::move(dns), registry));
}

Agent::Agent(AgentConfig config, DeviceBundle bundle,
             std::shared_ptr<grpc::ChannelCredentials> cloud_credentials, std::string cloud_token,
             std::shared_ptr<const RevokedCertificates> cloud_revoked,
             std::shared_ptr<DnsClouds> dns, prometheus::Registry* registry)
    : config_(std::move(config)),
      device_watch_(c10::Device(config_.device), "the agent's"),
      bundle_(std::move(bundle)),
      token_vocabulary_(TokenVocabulary::FromTokenizer(*bundle_.tokenizer)),
      conversations_({.max_bytes = config_.conversation_cache.max_bytes,
                      .keep_alive_s = config_.conversation_cache.keep_alive_s,
                      .min_reuse_tokens = config_.conversation_cache.min_reuse_tokens}) {
  wire_dtype_from_scheduler_ = config_.wire_dtype == "scheduler";
  if (config_.wire_dtype != "cloud" && !wire_dtype_from_scheduler_) {
    // Validated with the config (CheckWireDtype).
    wire_dtype_ = ParseWireDtypeName(config_.wire_dtype).value_or(v1::DTYPE_UNSPECIFIED);
  }
  if (registry != nullptr) metrics_ = std::make_unique<AgentMetrics>(*registry);
  // Epochs from one count over every cloud: an epoch names one stream of one cloud.
  auto epochs = std::make_shared<std::atomic<uint64_t>>(0);
  // Each cloud's name (for logs, errors and metrics): its address, or for a DNS name's slots
  // the name and the slot ("dns:///HOST:PORT#1"), which keep their name whatever address
  // they dial.
  std::vector<std::string> addresses = config_.clouds();
  if (dns != nullptr) {
    addresses.clear();
    for (size_t slot = 0; slot < dns->slots(); ++slot) {
      addresses.push_back(absl::StrCat(config_.cloud_address, "#", slot));
    }
  }
  if (metrics_ != nullptr) {
    for (const std::string& address : addresses) {
      cloud_targets_.push_back(metrics_->Target(address));
    }
  }
  for (size_t index = 0; index < addresses.size(); ++index) {
    std::function<absl::StatusOr<std::string>()> resolve;
    if (dns != nullptr) resolve = [dns, index] { return dns->AddressFor(index); };
    CloudConnectionOptions options{
        .address = addresses[index],
        .resolve = std::move(resolve),
        .credentials = cloud_credentials,
        // A DNS name's clouds are dialled by address; their certificates carry the name.
        .server_name = !config_.cloud_tls.server_name.empty() || dns == nullptr
                           ? config_.cloud_tls.server_name
                           : dns->host(),
        .token = cloud_token,
        .token_file = config_.cloud_tls.token_file,
        .crl_file = config_.cloud_tls.crl_file,
        .ca_file = config_.cloud_tls.ca_file,
        .revoked = cloud_revoked,
        .on_revocation_lists_read =
            [this](const RevokedCertificates& revoked) {
              if (metrics_ != nullptr) metrics_->cloud_crl.Report(&revoked);
            },
        .initial_backoff_s = config_.reconnect.initial_backoff_s,
        .max_backoff_s = config_.reconnect.max_backoff_s,
        .keepalive_s = config_.reconnect.keepalive_s,
        .keepalive_timeout_s = config_.reconnect.keepalive_timeout_s,
        .check_hello = [this](const v1::Hello& hello) { return CheckHello(hello); },
        .on_state_change =
            [this, index](bool connected) {
              std::lock_guard<std::mutex> lock(placement_mutex_);
              placement_cv_.notify_all();
              if (metrics_ == nullptr) return;
              cloud_targets_[index].up.Set(connected ? 1 : 0);
              // A lost stream's drain is over: the cloud comes back with a Hello of its own.
              if (!connected) cloud_targets_[index].draining.Set(0);
              int64_t up = 0;
              for (const auto& cloud : clouds_) up += cloud->connected() ? 1 : 0;
              metrics_->cloud_connected.Set(up > 0 ? 1 : 0);
              if (connected && index < clouds_.size() && clouds_[index]->reconnects() > 0) {
                metrics_->cloud_reconnects.Increment();
              }
            },
        .on_load =
            [this, index](const v1::CloudLoad& load) {
              if (metrics_ != nullptr) cloud_targets_[index].draining.Set(load.draining() ? 1 : 0);
            },
        // A parked session the cloud let go: its kept conversation goes too, so no later
        // request asks for it (the cloud has nothing left to close).
        .on_unclaimed_error =
            [this](uint64_t epoch, const v1::SessionError& error) {
              if (error.code() != static_cast<int32_t>(absl::StatusCode::kNotFound)) return false;
              std::vector<ConversationCache::Closed> closed;
              const bool kept =
                  conversations_.Forget(epoch, error.session_id(), SteadyClock::now(), closed);
              std::erase(closed, ConversationCache::Closed{epoch, error.session_id()});
              CloseParked(closed);
              ReportConversations();
              return kept;
            },
        .pace_uplink = config_.uplink_pacing.enabled,
        .pacing_lead_s = config_.uplink_pacing.lead_s,
        .measured_uplink_bytes_per_second =
            [this] {
              std::lock_guard<std::mutex> lock(device_state_mutex_);
              return link_.uplink_bytes_per_second();
            },
        .on_chunk_paced =
            [this](double seconds) {
              if (metrics_ != nullptr) metrics_->uplink_pacing_wait_seconds.Observe(seconds);
            },
        .max_outbox_bytes = config_.max_outbox_bytes,
        .max_outbox_messages = config_.max_outbox_messages,
        .epochs = epochs,
        .one_way_delay_s = config_.link_emulation.one_way_delay_s,
        .uplink_bytes_per_second = config_.link_emulation.uplink_bytes_per_second,
        .downlink_bytes_per_second = config_.link_emulation.downlink_bytes_per_second};
    auto connection = std::make_unique<CloudConnection>(std::move(options));
    std::lock_guard<std::mutex> lock(placement_mutex_);
    clouds_.push_back(std::move(connection));
  }
}

Agent::~Agent() {
  // Emptied under the lock, destroyed outside it: a connection's thread may be in its state
  // callback, which takes the lock, until the connection stops it.
  std::vector<std::unique_ptr<CloudConnection>> clouds;
  {
    std::lock_guard<std::mutex> lock(placement_mutex_);
    clouds.swap(clouds_);
  }
  clouds.clear();
}

absl::StatusOr<Agent::Placement> Agent::PlaceOnCloud(SteadyClock::time_point until,
                                                     uint64_t lost_epoch,
                                                     uint64_t preferred_epoch) {
  std::unique_lock<std::mutex> lock(placement_mutex_);
  while (true) {
    std::vector<CloudCandidate> candidates;
    candidates.reserve(clouds_.size());
    for (const auto& cloud : clouds_) {
      const CloudConnection::LoadView view = cloud->load_view();
      candidates.push_back({.connected = view.connected,
                            .draining = view.load.draining(),
                            .epoch = view.epoch,
                            .running_sessions = view.load.running_sessions(),
                            .waiting_sessions = view.load.waiting_sessions(),
                            .kv_blocks_free = view.load.kv_blocks_free(),
                            .kv_blocks_total = view.load.kv_blocks_total(),
                            .placed_since_report = view.placed_since_report});
    }
    const std::optional<size_t> chosen =
        PlaceRequest(candidates, {.preferred_epoch = preferred_epoch,
                                  .lost_epoch = lost_epoch,
                                  .random = placement_random_()});
    if (chosen.has_value()) {
      CloudConnection* cloud = clouds_[*chosen].get();
      // Connected a moment ago; if it went since, look again.
      auto connected = cloud->WaitConnected(SteadyClock::now());
      if (connected.ok() && connected->epoch != lost_epoch) {
        return Placement{.cloud = cloud, .index = *chosen, .connected = *std::move(connected)};
      }
      continue;
    }
    if (clouds_.empty() || clouds_.front()->stopping() || SteadyClock::now() >= until) {
      std::string why;
      for (const auto& cloud : clouds_) {
        const absl::Status status = cloud->WaitConnected(SteadyClock::now()).status();
        if (!why.empty()) why += "; ";
        why += status.ok() ? absl::StrCat(cloud->address(), ": its stream was just lost")
                           : std::string(status.message());
      }
      return absl::UnavailableError(why.empty() ? "no cloud configured" : why);
    }
    placement_cv_.wait_until(lock, until);
  }
}

CloudConnection* Agent::CloudOfEpoch(uint64_t epoch) const {
  for (const auto& cloud : clouds_) {
    if (cloud->load_view().epoch == epoch) return cloud.get();
  }
  return nullptr;
}

bool Agent::AnyCloudConnected() const {
  for (const auto& cloud : clouds_) {
    if (cloud->connected()) return true;
  }
  return false;
}

bool Agent::stopping() const { return clouds_.empty() || clouds_.front()->stopping(); }

void Agent::CloseParked(const std::vector<ConversationCache::Closed>& closed) {
  for (const auto& [epoch, session_id] : closed) {
    v1::AgentMessage message;
    message.mutable_close()->set_session_id(session_id);
    // A gone stream took the session along.
    if (CloudConnection* cloud = CloudOfEpoch(epoch)) {
      cloud->Send(epoch, std::move(message)).IgnoreError();
    }
  }
}

void Agent::ReportConversations() {
  if (metrics_ == nullptr) return;
  metrics_->conversations_kept.Set(static_cast<double>(conversations_.size()));
  metrics_->conversations_kept_bytes.Set(static_cast<double>(conversations_.bytes()));
}

void Agent::ObserveChunk(double sent_seconds, double cloud_received_at, double bytes) {
  std::lock_guard<std::mutex> lock(device_state_mutex_);
  link_.ObserveUplink(sent_seconds, cloud_received_at, bytes);
}

void Agent::ObserveResult(double cloud_sent_at, double received_seconds, double bytes) {
  std::lock_guard<std::mutex> lock(device_state_mutex_);
  link_.ObserveDownlink(cloud_sent_at, received_seconds, bytes);
}

void Agent::ReportDecodeRound(uint64_t epoch, double draft_step_seconds, double tokens) {
  v1::AgentMessage message;
  {
    std::lock_guard<std::mutex> lock(device_state_mutex_);
    if (draft_step_seconds > 0) draft_step_seconds_.Add(draft_step_seconds);
    tokens_per_round_.Add(tokens);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_device_report_ < std::chrono::seconds(1)) return;
    last_device_report_ = now;
    // Per direction (link_estimator.h); 0 while unknown, which the cloud reads as "not
    // measured" and answers with its configured defaults.
    v1::DeviceState* state = message.mutable_device_state();
    state->set_uplink_bytes_per_second(link_.uplink_bytes_per_second());
    state->set_downlink_bytes_per_second(link_.downlink_bytes_per_second());
    state->set_draft_step_seconds(draft_step_seconds_.value());
    state->set_mean_round_length(tokens_per_round_.value());
  }
  if (metrics_ != nullptr) {
    metrics_->draft_step_seconds.Set(message.device_state().draft_step_seconds());
    metrics_->link_bytes_per_second_up.Set(message.device_state().uplink_bytes_per_second());
    metrics_->link_bytes_per_second_down.Set(message.device_state().downlink_bytes_per_second());
    metrics_->device_state_reports.Increment();
  }
  // Refused only when the outbox is full: this report is then simply skipped. It goes to the
  // cloud the reporting request is on (each cloud's scheduler learns from its own requests).
  if (CloudConnection* cloud = CloudOfEpoch(epoch)) {
    cloud->Send(epoch, std::move(message)).IgnoreError();
  }
}

absl::Status Agent::CheckHello(const v1::Hello& hello) const {
  const BundleManifest& manifest = bundle_.manifest;
  if (hello.protocol_version() != kCloudProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cloud speaks protocol version ", hello.protocol_version(),
        hello.protocol_version() == 0 ? " (a build from before versioning)" : "",
        ", this agent version ", kCloudProtocolVersion,
        "; run tophat-cloud and tophat-agent of the same release"));
  }
  // Two checkpoints of one shape split alike pass every check below and compute garbage
  // together; their fingerprints differ. Without one on either side nothing says they are
  // one model, so a missing fingerprint is refused too.
  if (manifest.model_fingerprint.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this device bundle (", manifest.source_model,
        ") carries no model fingerprint, so nothing shows the cloud serves the same model; "
        "split the checkpoint again with `tophat split` and deploy both halves"));
  }
  if (hello.model_fingerprint().empty()) {
    return absl::FailedPreconditionError(
        "the cloud announces no model fingerprint (its bundle was split before fingerprints, "
        "or it is an older build), so nothing shows it serves this device's model; split the "
        "checkpoint again with `tophat split` and deploy both halves");
  }
  if (hello.model_fingerprint() != manifest.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cloud serves another model (fingerprint ", hello.model_fingerprint().substr(0, 19),
        "…) than this device bundle was split from (", manifest.model_fingerprint.substr(0, 19),
        "…, ", manifest.source_model, "); deploy both halves of one `tophat split`"));
  }
  if (hello.hidden_size() != bundle_.config.hidden_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cloud's hidden size is ", hello.hidden_size(), ", the device bundle's is ",
        bundle_.config.hidden_size, " (different models)"));
  }
  if (hello.first_layer() != manifest.input_layers.end ||
      hello.end_layer() != manifest.output_layers.begin) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cloud serves layers [", hello.first_layer(), ", ", hello.end_layer(),
        "); this device holds [0, ", manifest.input_layers.end, ") and [",
        manifest.output_layers.begin, ", ", manifest.output_layers.end,
        ") — split the model once and deploy both halves"));
  }
  // Any dtype both ends know will do: the agent converts its own at the wire.
  if (auto wire = FromProtoDType(hello.dtype()); !wire.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cloud exchanges hidden states as dtype ", static_cast<int>(hello.dtype()),
        ", which this agent does not know; run tophat-cloud and tophat-agent of one release"));
  }
  return absl::OkStatus();
}

std::string Agent::NewRequestId() {
  // Unguessable: Cancel takes an id, and any local process that can reach the app port could
  // otherwise cancel another app's request by counting ("req-1", "req-2", ...).
  std::lock_guard<std::mutex> lock(request_id_mutex_);
  return absl::StrFormat("req-%016x%016x", request_id_rng_(), request_id_rng_());
}

v1::GenerateResponse Agent::Generate(const v1::GenerateRequest& request,
                                     const std::function<bool(const TokenEvent&)>& on_tokens,
                                     const std::string& caller,
                                     const std::function<bool()>& client_gone) {
  if (request.outline().enabled()) return GenerateOutline(request, on_tokens, caller, client_gone);
  return GenerateWith(request, on_tokens, caller, client_gone, {});
}

std::optional<Agent::KeptPrompt> Agent::KeepPrompt(const v1::GenerateRequest& request,
                                                   const std::string& caller,
                                                   const std::function<bool()>& client_gone) {
  if (!config_.conversation_cache.enabled || request.prompt_logprobs() || request.prompt_only()) {
    return std::nullopt;
  }
  // The prompt alone: no format to compile, nothing to sample.
  v1::GenerateRequest prompt;
  prompt.set_request_id(absl::StrCat(
      request.request_id().empty() ? NewRequestId() : request.request_id(), "/prompt"));
  if (request.has_prompt_ids()) {
    *prompt.mutable_prompt_ids() = request.prompt_ids();
  } else {
    prompt.set_prompt(request.prompt());
  }
  prompt.set_skip_bos(request.skip_bos());
  prompt.set_prompt_chunk_size(request.prompt_chunk_size());
  prompt.set_max_new_tokens(1);
  KeptPrompt kept;
  const v1::GenerateResponse done = GenerateWith(prompt, [](const TokenEvent&) { return true; },
                                                 caller, client_gone, {.kept = &kept});
  if (kept.session_id == 0) {
    if (done.finish_reason() == v1::FINISH_REASON_ERROR) {
      spdlog::debug("request {}: its prompt was not kept for its choices ({}); each computes it",
                    prompt.request_id(), done.error());
    }
    return std::nullopt;
  }
  return kept;
}

v1::GenerateResponse Agent::GenerateChoice(const v1::GenerateRequest& request,
                                           const KeptPrompt& kept,
                                           const std::function<bool(const TokenEvent&)>& on_tokens,
                                           const std::string& caller,
                                           const std::function<bool()>& client_gone) {
  return GenerateWith(request, on_tokens, caller, client_gone,
                      {.share_conversation = true, .arrival = kept.started_at});
}

void Agent::ForgetKeptPrompt(const KeptPrompt& kept) {
  std::vector<ConversationCache::Closed> closed;
  conversations_.Forget(kept.epoch, kept.session_id, SteadyClock::now(), closed);
  CloseParked(closed);
  ReportConversations();
}

v1::GenerateResponse Agent::GenerateWith(const v1::GenerateRequest& request,
                                         const std::function<bool(const TokenEvent&)>& on_tokens,
                                         const std::string& caller,
                                         const std::function<bool()>& client_gone,
                                         const RunOptions& options) {
  Request run(*this, request, on_tokens, client_gone, options.arrival.value_or(SteadyClock::now()),
              /*counted=*/options.kept == nullptr);
  run.set_share_conversation(options.share_conversation);
  run.set_keep_prompt(options.kept != nullptr);
  std::string id = request.request_id();
  if (id.empty()) id = NewRequestId();
  run.set_id(id);
  absl::Status lost = device_watch_.lost();
  // A drill counts the apps' requests.
  if (lost.ok() && drill_after_requests_ > 0 && options.kept == nullptr &&
      requests_started_.fetch_add(1) >= drill_after_requests_) {
    device_watch_.StartDrill(
        absl::StrCat("the agent's device (", config_.device,
                     ") is lost: a failover drill (drill_device_loss_after_requests ",
                     drill_after_requests_, "); the device itself is fine"));
    lost = AfterRequestFailure(absl::InternalError("the request failed for a failover drill"));
  }
  if (!lost.ok()) {
    v1::GenerateResponse refused;
    refused.set_request_id(id);
    refused.set_finish_reason(v1::FINISH_REASON_ERROR);
    refused.set_error(lost.ToString());
    return refused;
  }
  {
    std::lock_guard<std::mutex> lock(requests_mutex_);
    if (static_cast<int64_t>(running_.size()) >= config_.max_concurrent_requests) {
      v1::GenerateResponse busy;
      busy.set_request_id(id);
      busy.set_finish_reason(v1::FINISH_REASON_ERROR);
      busy.set_error(absl::ResourceExhaustedError(
                         absl::StrCat("the agent already runs ", running_.size(),
                                      " requests (max_concurrent_requests)"))
                         .ToString());
      return busy;
    }
    if (running_.contains({caller, id})) {
      v1::GenerateResponse duplicate;
      duplicate.set_request_id(id);
      duplicate.set_finish_reason(v1::FINISH_REASON_ERROR);
      duplicate.set_error(
          absl::AlreadyExistsError(absl::StrCat("request_id ", id, " is already running"))
              .ToString());
      return duplicate;
    }
    run.Attach();
    running_.emplace(std::pair(caller, id), &run);
  }
  if (metrics_ != nullptr) metrics_->requests_running.Increment();
  v1::GenerateResponse response = run.Run();
  if (metrics_ != nullptr) metrics_->requests_running.Decrement();
  if (options.kept != nullptr && run.parked()) {
    *options.kept = KeptPrompt{.epoch = run.epoch(),
                               .session_id = run.session_id(),
                               .reused_prompt_tokens = run.reused(),
                               .started_at = run.arrival()};
  }
  std::lock_guard<std::mutex> lock(requests_mutex_);
  running_.erase({caller, id});
  return response;
}

bool Agent::Cancel(const std::string& request_id, const std::string& caller) {
  std::lock_guard<std::mutex> lock(requests_mutex_);
  if (auto outline = outlines_running_.find({caller, request_id});
      outline != outlines_running_.end()) {
    *outline->second = true;  // parts that start later see it before they run
    // Its parts running now: request ids "<id>/outline" and "<id>/point-<i>".
    const std::string prefix = request_id + "/";
    for (auto& [key, running] : running_) {
      if (key.first == caller && key.second.starts_with(prefix)) running->Cancel();
    }
    return true;
  }
  auto it = running_.find({caller, request_id});
  if (it == running_.end()) return false;
  it->second->Cancel();
  return true;
}

int Agent::CancelCaller(const std::string& caller) {
  std::lock_guard<std::mutex> lock(requests_mutex_);
  int cancelled = 0;
  for (auto& [key, flag] : outlines_running_) {
    if (key.first != caller) continue;
    *flag = true;
    ++cancelled;
  }
  // Outlines' parts among them, which run under the outline's caller.
  for (auto& [key, running] : running_) {
    if (key.first != caller) continue;
    running->Cancel();
    ++cancelled;
  }
  return cancelled;
}

absl::StatusOr<int> Agent::EndStreamsToRevokedClouds() {
  if (config_.cloud_tls.crl_file.empty()) return 0;
  TOPHAT_ASSIGN_OR_RETURN(RevokedCertificates revoked, LoadCloudRevocationLists(config_.cloud_tls));
  if (metrics_ != nullptr) metrics_->cloud_crl.Report(&revoked);
  int ended = 0;
  for (const std::unique_ptr<CloudConnection>& cloud : clouds_) {
    if (std::optional<std::string> refusal = cloud->EndStreamIfRevoked(revoked)) {
      spdlog::warn("cloud {}: stream ended: {}", cloud->address(), *refusal);
      ++ended;
    }
  }
  return ended;
}

v1::InfoResponse Agent::Info() const {
  v1::InfoResponse info;
  // The checkpoint's directory name, not its path: Info tells apps what they talk to, not
  // where the device keeps its files.
  std::filesystem::path source(bundle_.manifest.source_model);
  if (source.filename().empty()) source = source.parent_path();  // "dir/"
  info.set_model_id(source.filename().string());
  info.set_architecture(bundle_.manifest.source_architecture);
  info.set_num_layers(static_cast<uint32_t>(bundle_.config.num_hidden_layers));
  info.set_input_layers(static_cast<uint32_t>(bundle_.manifest.input_layers.size()));
  info.set_output_layers(static_cast<uint32_t>(bundle_.manifest.output_layers.size()));
  info.set_hidden_size(static_cast<uint32_t>(bundle_.config.hidden_size));
  info.set_vocab_size(static_cast<uint32_t>(bundle_.config.vocab_size));
  info.set_max_context(static_cast<uint32_t>(bundle_.input->max_context()));
  info.set_cloud_address(absl::StrJoin(config_.clouds(), ","));
  info.set_cloud_connected(AnyCloudConnected());
  info.set_prompt_chunk_size(static_cast<uint32_t>(config_.prompt_chunk_size));
  info.set_version(TOPHAT_VERSION);
  return info;
}

absl::Status Agent::AfterRequestFailure(const absl::Status& failure) {
  // A refusal (a bad prompt, a full cloud, a deadline, no cloud) says nothing of the device;
  // an exception from a computation (CatchExceptions: INTERNAL) may be the GPU's. Asking
  // waits for the device's queued work, other requests' included.
  if (failure.code() != absl::StatusCode::kInternal) return failure;
  bool found = false;
  absl::Status lost = device_watch_.CheckAfterFailure(&found);
  if (found) {
    spdlog::error("{} (a request failed with: {}); failing every request with UNAVAILABLE",
                  std::string(lost.message()), failure.ToString());
    if (on_device_lost_) on_device_lost_(lost);
  }
  return lost.ok() ? failure : lost;
}

v1::HealthResponse Agent::Health() const {
  v1::HealthResponse health;
  health.set_serving(device_watch_.lost().ok());
  health.set_cloud_connected(AnyCloudConnected());
  std::lock_guard<std::mutex> lock(requests_mutex_);
  health.set_active_requests(static_cast<uint32_t>(running_.size()));
  return health;
}

}  // namespace tophat
