// The device agent's core: the input and output submodels of a device bundle, the tokenizer,
// and the per-request loop that sends shallow hidden states to the cloud and turns the deep
// states it returns into tokens. Token ids and text never leave this process.
#pragma once

#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "configs/agent_config.h"
#include "device_agent/agent_metrics.h"
#include "device_agent/chunk_tracker.h"
#include "device_agent/cloud_connection.h"
#include "device_agent/conversation_cache.h"
#include "device_agent/dns_clouds.h"
#include "device_agent/link_estimator.h"
#include "device_agent/prompt_chunk_planner.h"
#include "device_agent/speculative_decoder.h"
#include "models/runtime/bundle.h"
#include "models/runtime/device_watch.h"
#include "models/runtime/sampler.h"
#include "proto/certificate_revocation.h"
#include "scheduler/moving_average.h"
#include "tophat/v1/agent.pb.h"

namespace tophat {

// What the agent reports back to the app as a request runs.
struct TokenEvent {
  std::string request_id;  // the app's, or the one the agent made up
  std::vector<int32_t> token_ids;
  std::string text;
  // The text each token made final, one per token_ids entry (together `text`), where the
  // agent decoded them one by one; empty otherwise (an outline's parts).
  std::vector<std::string> token_texts;
  // With GenerateRequest.logprobs: one per token_ids entry.
  std::vector<TokenLogprob> logprobs;
  // With GenerateRequest.prompt_logprobs, in the first event: one per prompt token after the
  // first.
  std::vector<TokenLogprob> prompt_logprobs;
};

// The requests' link samples (ChunkTracker) go to the agent's LinkEstimator, shared by every
// request, through LinkSampleSink.
class Agent final : private LinkSampleSink {
 public:
  // Loads the device bundle and starts connecting to the cloud in the background.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(const AgentConfig& config,
                                                       prometheus::Registry* registry);
  // What Create checks before it loads the bundle's weights (tophat-agent --check-config):
  // the cloud link's certificate, key, CA and token file, the dtype, the bundle's manifest,
  // config and checkpoint headers, and the device. Returns the bundle as inspected.
  static absl::StatusOr<BundleContents> CheckConfig(const AgentConfig& config);
  ~Agent();

  // Runs one request to completion on the calling thread, calling `on_tokens` as tokens
  // are produced (return false from it to cancel). The final response (finish reason,
  // stats, error) is returned; it is also what a failure looks like: FINISH_REASON_ERROR with
  // a message, never a crash. `caller` is who asks (an app's token name; "" where the app
  // port has no tokens): request ids are scoped to it.
  // `client_gone` (optional) says whether the app has gone away: asked while the request
  // waits for a cloud, when no token is coming for on_tokens to notice it by.
  v1::GenerateResponse Generate(const v1::GenerateRequest& request,
                                const std::function<bool(const TokenEvent&)>& on_tokens,
                                const std::string& caller = "",
                                const std::function<bool()>& client_gone = {});

  // Several choices of one prompt (the OpenAI API's `n`) compute that prompt once:
  // KeepPrompt computes it on the device and the cloud and keeps it in the conversation cache
  // (its cloud session parked); each choice then runs through GenerateChoice, which takes a
  // copy of the kept device KV and forks the parked cloud session (ForkSession), computing
  // only the prompt's last position; ForgetKeptPrompt lets the kept prompt go once every
  // choice has started. A choice's answer is the one Generate gives its request.
  struct KeptPrompt {
    uint64_t epoch = 0;       // the parked session's stream
    uint64_t session_id = 0;  // the parked session
    // What computing the prompt itself reused from an earlier turn (a conversation's next
    // turn asked for several choices): the prompt's cached tokens, as the app sees them.
    int64_t reused_prompt_tokens = 0;
    // When KeepPrompt began: the choices' latencies (and deadlines) count from here, since
    // the app's request arrived then.
    std::chrono::steady_clock::time_point started_at{};
  };
  // Computes `request`'s prompt (its prompt or prompt_ids, skip_bos, prompt_chunk_size; the
  // rest is the choices') and keeps it. nullopt where the choices had better compute it each:
  // no conversation cache, a prompt no longer than conversation_cache.min_reuse_tokens (no
  // choice would match it), prompt log-probabilities asked for (every choice reads each
  // prompt position's result), a cloud that does not fork sessions, or a failure (which the
  // choices then meet and report themselves).
  std::optional<KeptPrompt> KeepPrompt(const v1::GenerateRequest& request,
                                       const std::string& caller = "",
                                       const std::function<bool()>& client_gone = {});
  // Generate for a choice of a kept prompt: `request`'s prompt is the kept one's. Should the
  // kept prompt be gone (the cache let it go, the cloud evicted the session, the stream
  // changed), the choice computes its prompt itself, as Generate does.
  v1::GenerateResponse GenerateChoice(const v1::GenerateRequest& request, const KeptPrompt& kept,
                                      const std::function<bool(const TokenEvent&)>& on_tokens,
                                      const std::string& caller = "",
                                      const std::function<bool()>& client_gone = {});
  // Drops the kept prompt from the conversation cache and closes its cloud session (each
  // choice parks its own conversation, which a next turn would extend instead).
  void ForgetKeptPrompt(const KeptPrompt& kept);

  // A fresh request id, as the agent gives a request that names none.
  std::string NewRequestId();

  // Cancels `caller`'s running request by id; false if that caller runs no such request
  // (another caller's request of the same id is not touched).
  bool Cancel(const std::string& request_id, const std::string& caller = "");
  // Cancels every request `caller` runs (an app whose token a reload removed); returns how
  // many were running (an outline and each of its parts running count apart).
  int CancelCaller(const std::string& caller);

  // Reads cloud_tls.crl_file again (a reload) and ends the open streams of the clouds whose
  // certificates it now revokes (CloudConnection::EndStreamIfRevoked): how many, or the
  // error naming the file when it cannot be read or checked (nothing is ended then). 0
  // without a CRL file.
  absl::StatusOr<int> EndStreamsToRevokedClouds();

  v1::InfoResponse Info() const;
  // Not serving once its GPU is lost.
  v1::HealthResponse Health() const;
  // Called once, on the thread of the request that found it, when the device's GPU is
  // lost (models/runtime/device_watch.h): requests running then fail, and later ones fail at
  // once, with UNAVAILABLE naming the CUDA error; tophat-agent then exits for systemd to
  // restart it. Set before serving.
  void OnDeviceLost(std::function<void(const absl::Status&)> handler) {
    on_device_lost_ = std::move(handler);
  }
  // A failover drill (tophat-agent --drill-device-loss-after-requests): the request after
  // the first `requests` fails as if the device were lost, and the lost device's whole path
  // follows (UNAVAILABLE for it and every later request, Health not serving, OnDeviceLost)
  // with nothing broken. Set before serving.
  void DrillDeviceLoss(int64_t requests) { drill_after_requests_ = requests; }
  const AgentConfig& config() const { return config_; }
  // The bundle's tokenizer (thread-safe to encode and decode with).
  const Tokenizer& tokenizer() const { return *bundle_.tokenizer; }

 private:
  class Request;
  friend class Request;

  // `dns`: the slots of a dns:/// cloud_address (null for listed addresses).
  Agent(AgentConfig config, DeviceBundle bundle,
        std::shared_ptr<grpc::ChannelCredentials> cloud_credentials, std::string cloud_token,
        std::shared_ptr<const RevokedCertificates> cloud_revoked, std::shared_ptr<DnsClouds> dns,
        prometheus::Registry* registry);
  absl::Status CheckHello(const v1::Hello& hello) const;
  // After a request failed with `failure`: if it is INTERNAL (a computation threw), asks the
  // device (device_watch_), and returns the loss if it is lost (calling on_device_lost_ the
  // first time); else `failure`.
  absl::Status AfterRequestFailure(const absl::Status& failure);
  // How GenerateWith runs its request.
  struct RunOptions {
    // A kept conversation the prompt extends is shared (a copy; its cloud session forked),
    // not taken: several requests extend it at once (an outline's points, a prompt's choices).
    bool share_conversation = false;
    // KeepPrompt's request: the prompt alone, computed and parked; nothing is generated, and
    // it is not counted as an app's request in the metrics. Where it parked goes to `kept`.
    KeptPrompt* kept = nullptr;
    // When the app's request arrived, if before this call (a kept prompt's choice).
    std::optional<std::chrono::steady_clock::time_point> arrival;
  };
  // Generate's request, run as `options` say.
  v1::GenerateResponse GenerateWith(const v1::GenerateRequest& request,
                                    const std::function<bool(const TokenEvent&)>& on_tokens,
                                    const std::string& caller,
                                    const std::function<bool()>& client_gone,
                                    const RunOptions& options);
  // GenerateRequest.outline (Jupiter §IV-C; device_agent/outline.h, outline_request.cc):
  // the outline as a request of its own, then each of its points expanded as a request of
  // its own, all decoded together and streamed in point order; the prompt decoded
  // sequentially when the outline has fewer than two points.
  v1::GenerateResponse GenerateOutline(const v1::GenerateRequest& request,
                                       const std::function<bool(const TokenEvent&)>& on_tokens,
                                       const std::string& caller,
                                       const std::function<bool()>& client_gone);
  // Folds one decode round's measurements into the device's state and, at most once a
  // second, reports it to the cloud's state monitor (DeviceState on stream `epoch`).
  void ReportDecodeRound(uint64_t epoch, double draft_step_seconds, double tokens);
  // LinkSampleSink: into link_, under device_state_mutex_.
  void ObserveChunk(double sent_seconds, double cloud_received_at, double bytes) override;
  void ObserveResult(double cloud_sent_at, double received_seconds, double bytes) override;
  // Closes the cloud sessions of conversations the cache let go (on their streams, if still
  // up: a newer stream's cloud has lost them anyway).
  void CloseParked(const std::vector<ConversationCache::Closed>& closed);
  // The conversation cache's size and bytes into the metrics, after it changed.
  void ReportConversations();

  // Where a request goes: the cloud PlaceRequest (scheduler/cloud_placement.h) picks from
  // the clouds' load, not `lost_epoch`'s stream, the one of `preferred_epoch` while it
  // admits. Waits until `until` for a cloud to connect; UNAVAILABLE naming each cloud's last
  // failure if none does.
  struct Placement {
    CloudConnection* cloud = nullptr;
    size_t index = 0;  // in clouds_
    CloudConnection::Connected connected;
  };
  absl::StatusOr<Placement> PlaceOnCloud(std::chrono::steady_clock::time_point until,
                                         uint64_t lost_epoch, uint64_t preferred_epoch);
  // The cloud whose current stream is `epoch`; null once that stream is gone.
  CloudConnection* CloudOfEpoch(uint64_t epoch) const;
  bool AnyCloudConnected() const;
  bool stopping() const;
  const AgentConfig config_;
  // Asked after a request fails: whether config_.device still computes (device_watch.h).
  DeviceWatch device_watch_;
  std::function<void(const absl::Status&)> on_device_lost_;  // set before serving
  int64_t drill_after_requests_ = 0;  // DrillDeviceLoss; 0: no drill
  std::atomic<int64_t> requests_started_{0};  // counted only in a drill
  // config_.wire_dtype parsed; DTYPE_UNSPECIFIED: the cloud's compute dtype (Hello).
  v1::DType wire_dtype_ = v1::DTYPE_UNSPECIFIED;
  // config_.wire_dtype is "scheduler": the cloud's Control.wire_dtype, chunk by chunk.
  bool wire_dtype_from_scheduler_ = false;
  DeviceBundle bundle_;
  // The tokenizer's tokens as bytes, for answers in a format (JSON); built once.
  std::shared_ptr<const TokenVocabulary> token_vocabulary_;
  std::unique_ptr<AgentMetrics> metrics_;
  // One connection per cloud (config_.clouds()), filled in by the constructor and emptied by
  // the destructor under placement_mutex_ (their threads' state callbacks read it); fixed in
  // between.
  std::vector<std::unique_ptr<CloudConnection>> clouds_;
  // Each cloud's metrics, by the same index (empty without a registry); made before the
  // connections, whose threads set them.
  std::vector<AgentMetrics::CloudTarget> cloud_targets_;
  mutable std::mutex placement_mutex_;
  std::condition_variable placement_cv_;  // a cloud connected or disconnected
  std::mt19937_64 placement_random_{std::random_device{}()};  // under placement_mutex_
  std::atomic<uint64_t> next_session_id_{1};
  ConversationCache conversations_;
  std::mutex request_id_mutex_;
  std::mt19937_64 request_id_rng_{std::random_device{}()};

  // prompt_chunk_plan: jupiter: every request's prompt timings, and their plans.
  PromptChunkPlanner chunk_planner_;

  std::mutex device_state_mutex_;  // guards the four below
  MovingAverage draft_step_seconds_;  // γ, over requests
  MovingAverage tokens_per_round_;    // μ_i
  LinkEstimator link_;
  std::chrono::steady_clock::time_point last_device_report_{};

  mutable std::mutex requests_mutex_;
  // (caller, request id) -> request, for Cancel.
  std::map<std::pair<std::string, std::string>, Request*> running_;
  // The same for outline requests (whose parts run as requests of their own): set to cancel.
  std::map<std::pair<std::string, std::string>, std::atomic<bool>*> outlines_running_;
};

}  // namespace tophat
