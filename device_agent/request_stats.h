// What one request measured, reported twice: to the app as the final response's RequestStats,
// and to the agent's Prometheus metrics (agent_metrics.h) as it happens. Time to first token,
// inter-token latency, the cloud's queue and compute time, reconnects, hidden-state bytes,
// decode-round counters and, with GenerateRequest.trace, one DecodeRound per round. The
// per-chunk trace is ChunkTracker's.
//
// Not thread-safe: one request thread owns a recorder (the metrics themselves are).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "device_agent/agent_metrics.h"
#include "device_agent/speculative_decoder.h"
#include "tophat/v1/agent.pb.h"
#include "tophat/v1/cloud.pb.h"

namespace tophat {

class RequestStatsRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // `metrics` is null for an agent without a registry; otherwise it outlives the recorder.
  // Latencies are measured from `arrival`.
  RequestStatsRecorder(AgentMetrics* metrics, Clock::time_point arrival);

  // The prompt was tokenised and checked: `tokens` of it.
  void RecordPrompt(int64_t tokens);
  // The cloud admitted the session after `queue_seconds` in its admission queue.
  void RecordAdmitted(double queue_seconds);
  // A ForwardChunk carrying `bytes` of hidden states is being sent.
  void RecordUpload(size_t bytes);
  // A valid result arrived: its bytes and the cloud's queue and compute time for it (replayed
  // positions included: the cloud did the work).
  void RecordResult(const v1::ForwardResult& result);
  // The cloud's KV length, as the last consumed result reported it.
  void RecordCloudKvLength(uint32_t length);
  // The cloud confirmed a rollback to `length`; the last round's trace learns it.
  void RecordTruncated(uint32_t length);
  // `count` tokens (one round's) reached the app at `now`. The first ones give the time to
  // first token; after that the time since the last emission is split evenly over them (as
  // SGLang does).
  void RecordTokens(Clock::time_point now, size_t count);
  void RecordReconnect();
  // One decode round, `seconds` from its send to its verified answer; `decoder` says whether
  // it drafted ahead and whether its drafts were made ahead.
  void RecordRound(const RoundOutcome& outcome, double seconds, const SpeculativeDecoder& decoder);
  // Drafts the adaptive window allows per round from now on.
  void RecordDraftWindow(int64_t window);
  // PipeInfer: a run went to the cloud ahead of a verification; a run sent ahead was kept.
  // A decode chunk's network seconds (ChunkTracker::Answered).
  void RecordDecodeNetwork(double seconds);
  void RecordAheadRunSent();
  void RecordAheadRunKept();
  // With GenerateRequest.trace.
  void AddRoundTrace(const v1::DecodeRound& round);

  // Sums over the request so far.
  double cloud_queue_seconds() const { return cloud_queue_; }
  double cloud_compute_seconds() const { return cloud_compute_; }
  uint32_t cloud_kv_length() const { return cloud_kv_length_; }

  // What the request state knows and the recorder does not.
  struct Sizes {
    int64_t prompt_tokens = 0;
    int64_t generated_tokens = 0;
    int64_t prompt_chunk_size = 0;  // 0 when the request never got as far as opening
    int64_t reused_prompt_tokens = 0;  // an earlier turn's positions it reused
  };
  // The response's stats (RequestStats.chunks aside); counts the request as finished for
  // `reason` with its end-to-end latency.
  v1::RequestStats Finish(v1::FinishReason reason, const Sizes& sizes);

 private:
  AgentMetrics* const metrics_;
  const Clock::time_point arrival_;
  bool emitted_ = false;  // whether any token reached the app
  Clock::time_point last_emission_;
  double ttft_ = 0;
  double itl_sum_ = 0;
  int64_t itl_count_ = 0;
  double cloud_queue_ = 0;
  double cloud_compute_ = 0;
  double decode_network_sum_ = 0;
  double decode_network_max_ = 0;
  uint32_t decode_network_chunks_ = 0;
  uint32_t reconnects_ = 0;
  uint32_t cloud_kv_length_ = 0;
  v1::RequestStats rounds_;  // the decode-round counters and trace
};

}  // namespace tophat
