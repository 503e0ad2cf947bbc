#include "device_agent/agent_metrics.h"

#include "telemetry/metric_builders.h"

namespace tophat {
namespace {

// vLLM's latency buckets, starting at 1 ms so fast decode steps stay resolved.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};

}  // namespace

AgentMetrics::AgentMetrics(prometheus::Registry& registry)
    : time_to_first_token_seconds(AddHistogram(registry, "tophat_time_to_first_token_seconds",
                                               "Time to first token", kLatencyBuckets)),
      inter_token_latency_seconds(AddHistogram(registry, "tophat_inter_token_latency_seconds",
                                               "Time between consecutive tokens", kLatencyBuckets)),
      e2e_request_latency_seconds(AddHistogram(registry, "tophat_e2e_request_latency_seconds",
                                               "Request latency from arrival to last token",
                                               kLatencyBuckets)),
      request_queue_time_seconds(AddHistogram(registry, "tophat_request_queue_time_seconds",
                                              "Time a request waited for cloud KV admission",
                                              kLatencyBuckets)),
      requests_running(
          AddGauge(registry, "tophat_num_requests_running", "Requests being generated")),
      hidden_state_bytes_family(prometheus::BuildCounter()
                                    .Name("tophat_hidden_state_bytes_total")
                                    .Help("Hidden-state payload bytes sent up to and received "
                                          "down from the cloud")
                                    .Register(registry)),
      hidden_state_bytes_up(hidden_state_bytes_family.Add({{"direction", "up"}})),
      hidden_state_bytes_down(hidden_state_bytes_family.Add({{"direction", "down"}})),
      prompt_tokens(AddCounter(registry, "tophat_prompt_tokens_total", "Prompt tokens processed")),
      generation_tokens(AddCounter(registry, "tophat_generation_tokens_total", "Tokens generated")),
      requests_finished_family(prometheus::BuildCounter()
                                   .Name("tophat_request_success_total")
                                   .Help("Finished requests by finish reason")
                                   .Register(registry)),
      requests_stop(requests_finished_family.Add({{"finished_reason", "stop"}})),
      requests_length(requests_finished_family.Add({{"finished_reason", "length"}})),
      requests_cancelled(requests_finished_family.Add({{"finished_reason", "cancelled"}})),
      requests_error(requests_finished_family.Add({{"finished_reason", "error"}})),
      grammar_bounds_met(AddCounter(registry, "tophat_grammar_bounds_met_total",
                                    "Requests whose GBNF grammar met a bound of its matching (a "
                                    "way it allows not followed)")),
      cloud_connected(AddGauge(registry, "tophat_cloud_connected",
                               "1 while the agent holds a stream to the cloud")),
      cloud_reconnects(AddCounter(registry, "tophat_cloud_reconnects_total",
                                  "Cloud streams re-established after a loss")),
      cloud_crl(registry, "cloud_tls.crl_file"),
      cloud_target_up_family(prometheus::BuildGauge()
                                 .Name("tophat_cloud_target_up")
                                 .Help("1 while the agent holds a stream to this cloud")
                                 .Register(registry)),
      cloud_target_draining_family(
          prometheus::BuildGauge()
              .Name("tophat_cloud_target_draining")
              .Help("1 while this cloud reports that it drains: no new request is placed there")
              .Register(registry)),
      cloud_requests_placed_family(prometheus::BuildCounter()
                                       .Name("tophat_cloud_requests_placed_total")
                                       .Help("Requests placed on this cloud, failovers included")
                                       .Register(registry)),
      cloud_failovers_family(prometheus::BuildCounter()
                                 .Name("tophat_cloud_failovers_total")
                                 .Help("Requests that lost this cloud and moved to another")
                                 .Register(registry)),
      spec_decode_num_drafts(AddCounter(registry, "tophat_spec_decode_num_drafts_total",
                                        "Verification rounds that carried at least one draft")),
      spec_decode_num_draft_tokens(AddCounter(registry, "tophat_spec_decode_num_draft_tokens_total",
                                              "Draft tokens sent for verification")),
      spec_decode_num_accepted_tokens(AddCounter(registry,
                                                 "tophat_spec_decode_num_accepted_tokens_total",
                                                 "Draft tokens the target kept")),
      spec_decode_accepted_per_pos_family(
          prometheus::BuildCounter()
              .Name("tophat_spec_decode_num_accepted_tokens_per_pos_total")
              .Help("Draft tokens the target kept, by position in the draft (0-based)")
              .Register(registry)),
      spec_decode_parallel_drafts(AddCounter(
          registry, "tophat_spec_decode_parallel_drafts_total",
          "Verification rounds during which the agent drafted ahead from top-k candidates")),
      spec_decode_parallel_hits(
          AddCounter(registry, "tophat_spec_decode_parallel_hits_total",
                     "Rounds whose drafts were made ahead (hit rate = hits / parallel_drafts)")),
      spec_decode_ahead_runs_sent(
          AddCounter(registry, "tophat_spec_decode_ahead_runs_sent_total",
                     "Branches drafted ahead sent to the cloud before their verification returned "
                     "(speculative.max_runs_in_flight 2)")),
      spec_decode_ahead_runs_kept(
          AddCounter(registry, "tophat_spec_decode_ahead_runs_kept_total",
                     "Runs sent ahead that were kept as the next round (the rest were cancelled)")),
      spec_decode_round_seconds(AddHistogram(registry, "tophat_spec_decode_round_seconds",
                                             "One decode round: drafting, verification trip, "
                                             "acceptance",
                                             kLatencyBuckets)),
      jump_forward_draft_tokens(
          AddCounter(registry, "tophat_jump_forward_draft_tokens_total",
                     "Tokens the response format left, sent as drafts without the drafter")),
      jump_forward_kept_tokens(AddCounter(registry, "tophat_jump_forward_kept_tokens_total",
                                          "Of the jump-forward drafts, those the target kept")),
      prompt_positions_reused(AddCounter(
          registry, "tophat_prompt_positions_reused_total",
          "Prompt positions an earlier turn of the conversation had computed on the device and "
          "the cloud, reused instead of computed and sent again")),
      conversations_kept(AddGauge(registry, "tophat_conversations_kept",
                                  "Conversations kept on the device for a next turn "
                                  "(conversation_cache), and prompts kept for their choices")),
      conversations_kept_bytes(AddGauge(registry, "tophat_conversations_kept_bytes",
                                        "Device memory the kept conversations hold: their KV "
                                        "caches and hidden states")),
      prompt_chunk_plans_family(
          prometheus::BuildCounter()
              .Name("tophat_prompt_chunk_plans_total")
              .Help("Prompts cut under prompt_chunk_plan: jupiter: plan=\"jupiter\" in chunks "
                    "of unequal length, plan=\"equal_unmeasured\" in equal chunks because a "
                    "pipeline stage or a link was not measured yet")
              .Register(registry)),
      prompt_chunk_plans_jupiter(prompt_chunk_plans_family.Add({{"plan", "jupiter"}})),
      prompt_chunk_plans_unmeasured(prompt_chunk_plans_family.Add({{"plan", "equal_unmeasured"}})),
      uplink_pacing_wait_seconds(AddHistogram(
          registry, "tophat_uplink_pacing_wait_seconds",
          "A prompt chunk's wait in the agent's outbox until the uplink pacer let it go (the "
          "cloud's receipt of the chunk before, or that one's expected crossing)",
          kLatencyBuckets)),
      decode_network_seconds(AddHistogram(
          registry, "tophat_decode_network_seconds",
          "A decode chunk's round trip less the cloud's queue and compute: both links, and any "
          "wait behind other messages (prompt chunks) on them",
          kLatencyBuckets)),
      spec_decode_draft_window(AddGauge(
          registry, "tophat_spec_decode_draft_window",
          "Drafts allowed in the next round by the adaptive window (last request to decide)")),
      draft_step_seconds(AddGauge(registry, "tophat_draft_step_seconds",
                                  "Drafter step time (gamma), moving average, as reported to "
                                  "the cloud")),
      link_bytes_per_second_family(
          prometheus::BuildGauge()
              .Name("tophat_link_bytes_per_second")
              .Help("Cloud link bandwidth per direction, measured by the dispersion of runs of "
                    "queued messages (0: unknown, no such runs seen), as last reported to the "
                    "cloud")
              .Register(registry)),
      link_bytes_per_second_up(link_bytes_per_second_family.Add({{"direction", "up"}})),
      link_bytes_per_second_down(link_bytes_per_second_family.Add({{"direction", "down"}})),
      device_state_reports(AddCounter(registry, "tophat_device_state_reports_total",
                                      "DeviceState reports sent to the cloud (at most one a "
                                      "second, while decoding)")) {}

AgentMetrics::CloudTarget AgentMetrics::Target(const std::string& address) {
  return {.up = cloud_target_up_family.Add({{"cloud", address}}),
          .draining = cloud_target_draining_family.Add({{"cloud", address}}),
          .placed = cloud_requests_placed_family.Add({{"cloud", address}}),
          .failovers = cloud_failovers_family.Add({{"cloud", address}})};
}

prometheus::Counter& AgentMetrics::AcceptedAtPosition(int64_t position) {
  // Family::Add returns the existing counter for known labels; it locks internally.
  return spec_decode_accepted_per_pos_family.Add({{"position", std::to_string(position)}});
}

}  // namespace tophat
