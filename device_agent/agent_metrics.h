// Prometheus metrics of tophat-agent, named after vLLM's request metrics.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <string>

#include "proto/revocation_metrics.h"

namespace tophat {

struct AgentMetrics {
  explicit AgentMetrics(prometheus::Registry& registry);

  prometheus::Histogram& time_to_first_token_seconds;
  prometheus::Histogram& inter_token_latency_seconds;
  prometheus::Histogram& e2e_request_latency_seconds;
  prometheus::Histogram& request_queue_time_seconds;  // cloud admission wait
  prometheus::Gauge& requests_running;
  prometheus::Family<prometheus::Counter>& hidden_state_bytes_family;
  prometheus::Counter& hidden_state_bytes_up;
  prometheus::Counter& hidden_state_bytes_down;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Family<prometheus::Counter>& requests_finished_family;
  prometheus::Counter& requests_stop;
  prometheus::Counter& requests_length;
  prometheus::Counter& requests_cancelled;
  prometheus::Counter& requests_error;
  prometheus::Counter& grammar_bounds_met;
  prometheus::Gauge& cloud_connected;
  prometheus::Counter& cloud_reconnects;
  // cloud_tls.crl_file as last read (before each connection, at each reload).
  RevocationListMetrics cloud_crl;
  // Per cloud target (agent.yaml cloud_addresses, or the one cloud_address), labelled
  // cloud="host:port".
  struct CloudTarget {
    prometheus::Gauge& up;            // 1 while this cloud's stream is up
    prometheus::Gauge& draining;      // 1 while it reports a drain (no new requests go there)
    prometheus::Counter& placed;      // requests placed on it (failovers included)
    prometheus::Counter& failovers;   // requests that left it for another cloud, having lost it
  };
  CloudTarget Target(const std::string& address);
  prometheus::Family<prometheus::Gauge>& cloud_target_up_family;
  prometheus::Family<prometheus::Gauge>& cloud_target_draining_family;
  prometheus::Family<prometheus::Counter>& cloud_requests_placed_family;
  prometheus::Family<prometheus::Counter>& cloud_failovers_family;

  // Speculative decoding, named after vLLM's spec-decode metrics. A draft is one round's
  // proposal (rounds that proposed nothing are not drafts).
  prometheus::Counter& spec_decode_num_drafts;
  prometheus::Counter& spec_decode_num_draft_tokens;
  prometheus::Counter& spec_decode_num_accepted_tokens;
  prometheus::Family<prometheus::Counter>& spec_decode_accepted_per_pos_family;
  // Accepted drafts at draft position i (0-based), made on first use.
  prometheus::Counter& AcceptedAtPosition(int64_t position);
  prometheus::Counter& spec_decode_parallel_drafts;  // rounds that drafted ahead
  prometheus::Counter& spec_decode_parallel_hits;    // rounds whose drafts were made ahead
  // PipeInfer (speculative.max_runs_in_flight 2): branches sent before their verification
  // returned, and those kept as the next round.
  prometheus::Counter& spec_decode_ahead_runs_sent;
  prometheus::Counter& spec_decode_ahead_runs_kept;
  prometheus::Histogram& spec_decode_round_seconds;  // one verification round, end to end
  // Jump-forward: tokens the response format left, sent as drafts without the drafter, and
  // those the verification kept (RequestStats.forced_draft_tokens and forced_tokens).
  prometheus::Counter& jump_forward_draft_tokens;
  prometheus::Counter& jump_forward_kept_tokens;
  // Prompt positions a conversation's earlier turn had already computed on both sides
  // (device_agent/conversation_cache.h), so neither computed nor sent again.
  prometheus::Counter& prompt_positions_reused;
  // The conversation cache: conversations kept for a next turn (and prompts kept for their
  // choices), and the device memory they hold.
  prometheus::Gauge& conversations_kept;
  prometheus::Gauge& conversations_kept_bytes;
  // Prompts cut by prompt_chunk_plan: jupiter: planned (unequal chunks), or in HAT's equal
  // chunks because a stage was not measured yet.
  prometheus::Family<prometheus::Counter>& prompt_chunk_plans_family;
  prometheus::Counter& prompt_chunk_plans_jupiter;
  prometheus::Counter& prompt_chunk_plans_unmeasured;
  // A prompt chunk's wait in the agent's outbox for the uplink pacer
  // (scheduler/uplink_pacer.h).
  prometheus::Histogram& uplink_pacing_wait_seconds;
  // A decode chunk's round trip less the cloud's queue and compute: its time on the links,
  // waits behind other messages included.
  prometheus::Histogram& decode_network_seconds;
  prometheus::Gauge& spec_decode_draft_window;  // drafts allowed per round (adaptive_window)
  prometheus::Gauge& draft_step_seconds;  // γ as last reported to the cloud
  prometheus::Family<prometheus::Gauge>& link_bytes_per_second_family;
  prometheus::Gauge& link_bytes_per_second_up;  // the measured link, as last reported
  prometheus::Gauge& link_bytes_per_second_down;
  // Counts the reports, so that a reader can tell a fresh one from the gauges' last value.
  prometheus::Counter& device_state_reports;
};

}  // namespace tophat
