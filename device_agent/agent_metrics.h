// Prometheus metrics of tophat-agent, named after vLLM's request metrics.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

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
  prometheus::Gauge& cloud_connected;
  prometheus::Counter& cloud_reconnects;
};

}  // namespace tophat
