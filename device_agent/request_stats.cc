#include "device_agent/request_stats.h"

#include <algorithm>

#include "base/clock.h"

namespace tophat {

RequestStatsRecorder::RequestStatsRecorder(AgentMetrics* metrics, Clock::time_point arrival)
    : metrics_(metrics), arrival_(arrival) {}

void RequestStatsRecorder::RecordPrompt(int64_t tokens) {
  if (metrics_ != nullptr) metrics_->prompt_tokens.Increment(static_cast<double>(tokens));
}

void RequestStatsRecorder::RecordAdmitted(double queue_seconds) {
  if (metrics_ != nullptr) metrics_->request_queue_time_seconds.Observe(queue_seconds);
}

void RequestStatsRecorder::RecordUpload(size_t bytes) {
  if (metrics_ != nullptr) metrics_->hidden_state_bytes_up.Increment(static_cast<double>(bytes));
}

void RequestStatsRecorder::RecordResult(const v1::ForwardResult& result) {
  if (metrics_ != nullptr) {
    metrics_->hidden_state_bytes_down.Increment(static_cast<double>(result.states().data().size()));
  }
  cloud_queue_ += result.queue_seconds();
  cloud_compute_ += result.compute_seconds();
}

void RequestStatsRecorder::RecordCloudKvLength(uint32_t length) { cloud_kv_length_ = length; }

void RequestStatsRecorder::RecordTruncated(uint32_t length) {
  cloud_kv_length_ = length;
  if (rounds_.rounds_size() > 0) {
    rounds_.mutable_rounds(rounds_.rounds_size() - 1)->set_cloud_kv_length(length);
  }
}

void RequestStatsRecorder::RecordTokens(Clock::time_point now, size_t count) {
  if (!emitted_) {
    emitted_ = true;
    ttft_ = Seconds(now - arrival_);
    if (metrics_ != nullptr) metrics_->time_to_first_token_seconds.Observe(ttft_);
  } else {
    const double gap = Seconds(now - last_emission_) / static_cast<double>(count);
    itl_sum_ += gap * static_cast<double>(count);
    itl_count_ += static_cast<int64_t>(count);
    if (metrics_ != nullptr) {
      for (size_t i = 0; i < count; ++i) metrics_->inter_token_latency_seconds.Observe(gap);
    }
  }
  last_emission_ = now;
  if (metrics_ != nullptr) metrics_->generation_tokens.Increment(static_cast<double>(count));
}

void RequestStatsRecorder::RecordReconnect() { ++reconnects_; }

void RequestStatsRecorder::RecordDecodeNetwork(double seconds) {
  seconds = std::max(0.0, seconds);  // the cloud's durations and ours round differently
  decode_network_sum_ += seconds;
  decode_network_max_ = std::max(decode_network_max_, seconds);
  ++decode_network_chunks_;
  if (metrics_ != nullptr) metrics_->decode_network_seconds.Observe(seconds);
}

void RequestStatsRecorder::RecordRound(const RoundOutcome& outcome, double seconds,
                                       const SpeculativeDecoder& decoder) {
  rounds_.set_decode_rounds(rounds_.decode_rounds() + 1);
  // The drafter's drafts; the format's forced ones apart (never the drafter's to be wrong).
  const int64_t drafted = outcome.drafted - outcome.forced_drafted;
  const int64_t accepted = outcome.accepted - outcome.forced_accepted;
  rounds_.set_draft_tokens(rounds_.draft_tokens() + drafted);
  rounds_.set_accepted_tokens(rounds_.accepted_tokens() + accepted);
  rounds_.set_forced_tokens(rounds_.forced_tokens() + outcome.forced_accepted);
  rounds_.set_forced_draft_tokens(rounds_.forced_draft_tokens() + outcome.forced_drafted);
  if (decoder.drafted_ahead()) rounds_.set_parallel_drafts(rounds_.parallel_drafts() + 1);
  if (decoder.round_from_parallel()) rounds_.set_parallel_hits(rounds_.parallel_hits() + 1);
  if (metrics_ == nullptr) return;
  metrics_->spec_decode_round_seconds.Observe(seconds);
  if (drafted > 0) {
    metrics_->spec_decode_num_drafts.Increment();
    metrics_->spec_decode_num_draft_tokens.Increment(static_cast<double>(drafted));
    metrics_->spec_decode_num_accepted_tokens.Increment(static_cast<double>(accepted));
    for (int64_t i = 0; i < accepted; ++i) metrics_->AcceptedAtPosition(i).Increment();
  }
  metrics_->jump_forward_draft_tokens.Increment(static_cast<double>(outcome.forced_drafted));
  metrics_->jump_forward_kept_tokens.Increment(static_cast<double>(outcome.forced_accepted));
  if (decoder.drafted_ahead()) metrics_->spec_decode_parallel_drafts.Increment();
  if (decoder.round_from_parallel()) metrics_->spec_decode_parallel_hits.Increment();
}

void RequestStatsRecorder::RecordAheadRunSent() {
  rounds_.set_ahead_runs_sent(rounds_.ahead_runs_sent() + 1);
  if (metrics_ != nullptr) metrics_->spec_decode_ahead_runs_sent.Increment();
}

void RequestStatsRecorder::RecordAheadRunKept() {
  rounds_.set_ahead_runs_kept(rounds_.ahead_runs_kept() + 1);
  if (metrics_ != nullptr) metrics_->spec_decode_ahead_runs_kept.Increment();
}

void RequestStatsRecorder::RecordDraftWindow(int64_t window) {
  if (metrics_ != nullptr) metrics_->spec_decode_draft_window.Set(static_cast<double>(window));
}

void RequestStatsRecorder::AddRoundTrace(const v1::DecodeRound& round) {
  *rounds_.add_rounds() = round;
}

v1::RequestStats RequestStatsRecorder::Finish(v1::FinishReason reason, const Sizes& sizes) {
  v1::RequestStats stats = rounds_;
  stats.set_prompt_tokens(static_cast<uint32_t>(sizes.prompt_tokens));
  stats.set_generated_tokens(static_cast<uint32_t>(sizes.generated_tokens));
  stats.set_time_to_first_token_seconds(ttft_);
  stats.set_mean_inter_token_seconds(itl_count_ > 0 ? itl_sum_ / static_cast<double>(itl_count_)
                                                    : 0.0);
  stats.set_cloud_queue_seconds(cloud_queue_);
  stats.set_cloud_compute_seconds(cloud_compute_);
  stats.set_reconnects(reconnects_);
  stats.set_decode_network_seconds(decode_network_sum_);
  stats.set_decode_network_chunks(decode_network_chunks_);
  stats.set_decode_network_max_seconds(decode_network_max_);
  stats.set_prompt_chunk_size(static_cast<uint32_t>(sizes.prompt_chunk_size));
  stats.set_reused_prompt_tokens(static_cast<uint32_t>(sizes.reused_prompt_tokens));
  if (metrics_ == nullptr) return stats;
  metrics_->prompt_positions_reused.Increment(static_cast<double>(sizes.reused_prompt_tokens));
  metrics_->e2e_request_latency_seconds.Observe(Seconds(Clock::now() - arrival_));
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      metrics_->requests_stop.Increment();
      break;
    case v1::FINISH_REASON_LENGTH:
      metrics_->requests_length.Increment();
      break;
    case v1::FINISH_REASON_CANCELLED:
      metrics_->requests_cancelled.Increment();
      break;
    case v1::FINISH_REASON_ERROR:
    case v1::FINISH_REASON_UNSPECIFIED:
    case v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      metrics_->requests_error.Increment();
      break;
  }
  return stats;
}

}  // namespace tophat
