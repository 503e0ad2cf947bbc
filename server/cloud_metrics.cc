#include "server/cloud_metrics.h"

#include <prometheus/family.h>

#include <bit>
#include <string>

#include "telemetry/metric_builders.h"

namespace tophat {
namespace {

const prometheus::Histogram::BucketBoundaries kSecondsBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
    0.75,  1.0,    2.5,   5.0,  7.5,   10.0, 20.0,  40.0, 80.0};

}  // namespace

CloudMetrics::CloudMetrics(prometheus::Registry& registry)
    : sessions_running(
          AddGauge(registry, "tophat_num_sessions_running", "Sessions holding KV on the cloud")),
      sessions_waiting(
          AddGauge(registry, "tophat_num_sessions_waiting", "Sessions queued for KV admission")),
      sessions_parked(AddGauge(registry, "tophat_num_sessions_parked",
                               "Finished sessions whose KV is kept for the conversation's next "
                               "turn (ParkSession)")),
      parked_sessions_resumed(AddCounter(registry, "tophat_parked_sessions_resumed_total",
                                         "Parked sessions taken back for a next turn")),
      parked_sessions_forked(AddCounter(registry, "tophat_parked_sessions_forked_total",
                                        "Sessions admitted with a copy of a parked session's "
                                        "KV as their start (ForkSession)")),
      parked_sessions_evicted(AddCounter(
          registry, "tophat_parked_sessions_evicted_total",
          "Parked sessions evicted because another session needed their KV or their device's "
          "quota")),
      parked_sessions_expired(AddCounter(registry, "tophat_parked_sessions_expired_total",
                                         "Parked sessions whose keep-alive ran out")),
      kv_cache_usage_ratio(AddGauge(registry, "tophat_kv_cache_usage_ratio",
                                    "Fraction of KV blocks allocated (1 = full)")),
      kv_cache_blocks_total(
          AddGauge(registry, "tophat_kv_cache_blocks_total", "KV blocks in the pool")),
      request_queue_time_seconds(AddHistogram(registry, "tophat_request_queue_time_seconds",
                                              "Time a session waited for KV admission",
                                              kSecondsBuckets)),
      iteration_tokens(AddHistogram(registry, "tophat_iteration_tokens",
                                    "Positions per engine step",
                                    {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192})),
      step_seconds(AddHistogram(registry, "tophat_step_seconds",
                                "Duration of one engine step (middle submodel forward)",
                                kSecondsBuckets)),
      hidden_state_bytes_family(prometheus::BuildCounter()
                                    .Name("tophat_hidden_state_bytes_total")
                                    .Help("Hidden-state payload bytes received (in) and sent (out)")
                                    .Register(registry)),
      hidden_state_bytes_in(hidden_state_bytes_family.Add({{"direction", "in"}})),
      hidden_state_bytes_out(hidden_state_bytes_family.Add({{"direction", "out"}})),
      prompt_tokens(AddCounter(registry, "tophat_prompt_tokens_total",
                               "Prompt positions computed (prefill chunks)")),
      generation_tokens(AddCounter(registry, "tophat_generation_tokens_total",
                                   "Decode and verification positions computed")),
      sessions_admitted(
          AddCounter(registry, "tophat_sessions_admitted_total", "Sessions given KV")),
      sessions_rejected(AddCounter(registry, "tophat_sessions_rejected_total",
                                   "Sessions refused with RESOURCE_EXHAUSTED")),
      session_errors(
          AddCounter(registry, "tophat_session_errors_total", "Per-session errors sent to agents")),
      steps_failed(AddCounter(registry, "tophat_steps_failed_total",
                              "Engine steps whose forward failed; each failed its sessions")),
      truncated_unstarted_positions(
          AddCounter(registry, "tophat_truncated_unstarted_positions_total",
                     "Positions of queued chunks a Truncate dropped before any step computed "
                     "them (speculative runs given up on)")),
      streams_connected(
          AddGauge(registry, "tophat_streams_connected", "Agent streams currently connected")),
      outgoing_queued_bytes(AddGauge(registry, "tophat_outgoing_queued_bytes",
                                     "Bytes of messages queued for agents, all streams")),
      streams_not_reading(AddCounter(registry, "tophat_streams_not_reading_total",
                                     "Streams ended because the agent did not read its results")),
      streams_revoked(AddCounter(registry, "tophat_streams_revoked_total",
                                 "Open streams ended because a reloaded config no longer "
                                 "admits their device (tls.device_tokens, tls.revoked_devices, "
                                 "tls.crl_file)")),
      crl(registry, "tls.crl_file"),
      streams_congested(AddCounter(registry, "tophat_streams_congested_total",
                                   "Times a stream's unread results passed its bound, pausing "
                                   "its work until the agent read them")),
      reads_paced(AddCounter(registry, "tophat_stream_reads_paced_total",
                             "Reads held back because a device sent above its message rate")),
      refusals_paced(AddCounter(registry, "tophat_session_refusals_paced_total",
                                "Refused sessions whose refusal was sent late because their "
                                "device was refused above its refusal rate")),
      mean_batched_tokens(AddGauge(registry, "tophat_scheduler_mean_batched_tokens",
                                   "Moving average of the tokens batched per step (mu)")),
      predicted_step_seconds(AddGauge(registry, "tophat_scheduler_predicted_step_seconds",
                                      "Step time the predictor expects at mu tokens, g(mu)")),
      step_prediction_error_ratio(
          AddHistogram(registry, "tophat_scheduler_step_prediction_error_ratio",
                       "|predicted - measured| / measured step time, predicted before each step",
                       {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0})),
      scheduler_chunk_size(AddHistogram(registry, "tophat_scheduler_chunk_size",
                                        "Prompt chunk sizes chosen for devices",
                                        {8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096})),
      scheduler_draft_steps(AddHistogram(registry, "tophat_scheduler_draft_steps",
                                         "Parallel-drafting steps (lambda) chosen for devices",
                                         {0, 1, 2, 3, 4, 6, 8, 12, 16})),
      scheduler_wire_choices(
          prometheus::BuildCounter()
              .Name("tophat_scheduler_wire_dtype_total")
              .Help("Wire dtypes chosen for devices from their measured uplink, by dtype")
              .Register(registry)),
      pipeline_stage_seconds_family(
          prometheus::BuildHistogram()
              .Name("tophat_pipeline_stage_seconds")
              .Help("Forward time of one pipeline stage's layers in one step, by stage")
              .Register(registry)),
      step_curve_tokens_family(
          prometheus::BuildGauge()
              .Name("tophat_scheduler_step_curve_tokens")
              .Help("The step-time predictor's curve: mean tokens of the steps in this bucket "
                    "of batch sizes (bucket = its smallest token count)")
              .Register(registry)),
      step_curve_seconds_family(
          prometheus::BuildGauge()
              .Name("tophat_scheduler_step_curve_seconds")
              .Help("The step-time predictor's curve: mean seconds of the steps in this bucket "
                    "of batch sizes")
              .Register(registry)) {}

void CloudMetrics::SetStepCurvePoint(int64_t bucket_tokens, double tokens, double seconds) {
  if (bucket_tokens < 1) return;
  const auto index = static_cast<size_t>(std::bit_width(static_cast<uint64_t>(bucket_tokens)) - 1);
  if (index >= step_curve_.size()) step_curve_.resize(index + 1, {nullptr, nullptr});
  if (step_curve_[index].first == nullptr) {
    // Made once per bucket that ever sees a step: at most 64 series each.
    const std::string label = std::to_string(int64_t{1} << index);
    step_curve_[index] = {&step_curve_tokens_family.Add({{"bucket", label}}),
                          &step_curve_seconds_family.Add({{"bucket", label}})};
  }
  step_curve_[index].first->Set(tokens);
  step_curve_[index].second->Set(seconds);
}

prometheus::Histogram& CloudMetrics::PipelineStageSeconds(int stage) {
  const auto index = static_cast<size_t>(stage);
  if (index >= pipeline_stage_seconds_.size()) pipeline_stage_seconds_.resize(index + 1);
  if (pipeline_stage_seconds_[index] == nullptr) {
    pipeline_stage_seconds_[index] = &pipeline_stage_seconds_family.Add(
        {{"stage", std::to_string(stage)}}, kSecondsBuckets);
  }
  return *pipeline_stage_seconds_[index];
}

}  // namespace tophat
