// Prometheus metrics of tophat-cloud. Names follow vLLM's (vllm:num_requests_running ->
// tophat_num_sessions_running, ...) so existing dashboards transfer. The cloud counts
// positions: it never sees token ids.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "proto/revocation_metrics.h"

namespace tophat {

struct CloudMetrics {
  explicit CloudMetrics(prometheus::Registry& registry);

  prometheus::Gauge& sessions_running;
  prometheus::Gauge& sessions_waiting;
  // Conversations' sessions kept between turns (ParkSession), and what became of them.
  prometheus::Gauge& sessions_parked;
  prometheus::Counter& parked_sessions_resumed;
  prometheus::Counter& parked_sessions_forked;
  prometheus::Counter& parked_sessions_evicted;  // for another session's KV or quota
  prometheus::Counter& parked_sessions_expired;
  prometheus::Gauge& kv_cache_usage_ratio;
  prometheus::Gauge& kv_cache_blocks_total;
  prometheus::Histogram& request_queue_time_seconds;  // admission wait for KV
  prometheus::Histogram& iteration_tokens;
  prometheus::Histogram& step_seconds;
  prometheus::Family<prometheus::Counter>& hidden_state_bytes_family;
  prometheus::Counter& hidden_state_bytes_in;
  prometheus::Counter& hidden_state_bytes_out;
  prometheus::Counter& prompt_tokens;      // positions run in prefill chunks
  prometheus::Counter& generation_tokens;  // positions run as decode/verification
  prometheus::Counter& sessions_admitted;
  prometheus::Counter& sessions_rejected;  // RESOURCE_EXHAUSTED at admission
  prometheus::Counter& session_errors;     // any SessionError sent
  prometheus::Counter& steps_failed;       // steps whose forward failed (each fails its sessions)
  // Positions of chunks a Truncate dropped before any step computed them (speculative runs
  // the agent gave up on).
  prometheus::Counter& truncated_unstarted_positions;
  prometheus::Gauge& streams_connected;
  // Bytes of results queued for agents and not yet handed to gRPC, over all streams.
  prometheus::Gauge& outgoing_queued_bytes;
  // Streams ended because their agent did not read its results (the outgoing bounds).
  prometheus::Counter& streams_not_reading;
  // Open streams ended because a reloaded config no longer admits their device.
  prometheus::Counter& streams_revoked;
  // tls.crl_file as last loaded.
  RevocationListMetrics crl;
  // Times a stream's unread results passed its bound and the engine paused its work.
  prometheus::Counter& streams_congested;
  // Reads of a stream held back by limits.max_messages_per_second_per_device.
  prometheus::Counter& reads_paced;
  // Refused sessions whose refusal was sent late (limits.max_refusals_per_second_per_device).
  prometheus::Counter& refusals_paced;
  // The scheduler's state monitor.
  prometheus::Gauge& mean_batched_tokens;        // μ, moving average
  prometheus::Gauge& predicted_step_seconds;     // g(μ)
  prometheus::Histogram& step_prediction_error_ratio;  // |g(tokens) - measured| / measured
  prometheus::Histogram& scheduler_chunk_size;   // per-device chunk sizes sent
  prometheus::Histogram& scheduler_draft_steps;  // per-device λ sent
  // Per-device wire dtypes chosen from a measured uplink, by dtype name.
  prometheus::Family<prometheus::Counter>& scheduler_wire_choices;
  // With pipeline stages: each stage's own forward time per step, by stage number.
  prometheus::Family<prometheus::Histogram>& pipeline_stage_seconds_family;
  prometheus::Histogram& PipelineStageSeconds(int stage);
  // The step-time predictor's curve g(μ), one point per bucket of batch sizes (labelled by
  // the bucket's smallest token count, a power of two): the bucket's moving mean of tokens
  // and of step seconds. What a simulation of this cloud takes as its step times.
  prometheus::Family<prometheus::Gauge>& step_curve_tokens_family;
  prometheus::Family<prometheus::Gauge>& step_curve_seconds_family;
  void SetStepCurvePoint(int64_t bucket_tokens, double tokens, double seconds);

 private:
  std::vector<std::pair<prometheus::Gauge*, prometheus::Gauge*>> step_curve_;  // by log2(bucket)
  std::vector<prometheus::Histogram*> pipeline_stage_seconds_;  // by stage, made on first use
};

}  // namespace tophat
