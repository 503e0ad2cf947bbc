#include "device_agent/decode_round.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status_macros.h"

namespace tophat {

DecodeRounds::DecodeRounds(SpeculativeDecoder& decoder, RequestStatsRecorder& stats,
                           const DecodeRoundOptions& options)
    : decoder_(decoder), stats_(stats), options_(options) {}

absl::StatusOr<RoundOutcome> DecodeRounds::Run(int32_t token, int64_t room, CloudSession& session) {
  int64_t drafts = options_.adaptive_window && window_ >= 0 ? std::min(room, window_) : room;
  // A run the previous round kept is this round as it was sent, whatever the window says now
  // (its drafts were bounded by the room left when it was drafted).
  std::optional<SpeculativeDecoder::Branch> kept = std::move(kept_ahead_);
  kept_ahead_.reset();
  if (kept) drafts = std::max(drafts, kept->drafts);
  TOPHAT_RETURN_IF_ERROR(decoder_.BeginRound(token, drafts));

  const Clock::time_point begin = Clock::now();
  const double queue_before = stats_.cloud_queue_seconds();
  const double compute_before = stats_.cloud_compute_seconds();
  const int64_t start = decoder_.round_start();
  const at::Tensor rows = decoder_.RoundShallow();
  const int64_t end = start + rows.size(0);
  outputs_.clear();
  // Rows of this round already at the cloud: those of a kept run.
  const int64_t at_cloud = std::max<int64_t>(0, session.sent() - start);
  if (at_cloud > rows.size(0) || (at_cloud > 0 && (!kept || !decoder_.round_from_parallel() ||
                                                   kept->start != start))) {
    return absl::InternalError(absl::StrCat("decode round at ", start, ": ", at_cloud,
                                            " positions are at the cloud but the round has ",
                                            rows.size(0), " rows (a run sent ahead gone astray)"));
  }
  if (at_cloud < rows.size(0)) {
    session.SendDecodeRows(start + at_cloud, rows.narrow(0, at_cloud, rows.size(0) - at_cloud));
  }
  // Draft ahead while the cloud works, a token at a time, so the answer waits at most one
  // drafter step; with send_ahead, the best branch goes to the cloud once it is drafted.
  std::optional<SpeculativeDecoder::Branch> best;        // ready before the answer
  std::optional<SpeculativeDecoder::Branch> sent_ahead;  // sent before the answer
  const bool may_send = options_.send_ahead &&
                        (best_branch_kept_.empty() ||
                         best_branch_kept_.value() >= options_.ahead_min_keep_rate);
  while (session.consumed() < end) {
    TOPHAT_RETURN_IF_ERROR(session.Pump(end, /*block=*/false));
    if (session.consumed() >= end) break;
    if (options_.send_ahead && !best) {
      best = decoder_.BestBranch();
      if (best && may_send) {
        session.SendAheadRows(best->start, best->shallow);
        sent_ahead = best;
        stats_.RecordAheadRunSent();
        continue;
      }
    }
    TOPHAT_ASSIGN_OR_RETURN(bool drafted, decoder_.DraftAheadStep());
    if (!drafted) TOPHAT_RETURN_IF_ERROR(session.Pump(end, /*block=*/true));
  }
  const uint32_t cloud_after_verify = stats_.cloud_kv_length();
  TOPHAT_ASSIGN_OR_RETURN(RoundOutcome outcome, decoder_.FinishRound(at::cat(outputs_, 0)));
  // Whether the best branch is the next round: the verification kept everything it was built
  // on and chose its first token.
  const auto is_next_round = [&](const SpeculativeDecoder::Branch& branch) {
    return outcome.parallel_hit && outcome.length == branch.start &&
           outcome.tokens.back() == branch.token;
  };
  if (best) best_branch_kept_.Add(is_next_round(*best) ? 1.0 : 0.0);
  // The run sent ahead is kept as the next round unless the verification rejected what it was
  // built on (or a reconnect dropped it); otherwise the rollback cancels it.
  const bool keep_ahead = sent_ahead && is_next_round(*sent_ahead) &&
                          session.sent() == sent_ahead->start + sent_ahead->drafts + 1;
  if (keep_ahead) {
    session.KeepAheadRows();
    stats_.RecordAheadRunKept();
    kept_ahead_ = sent_ahead;
  } else {
    session.RollBack(outcome.length);
  }

  const double seconds = Seconds(Clock::now() - begin);
  stats_.RecordRound(outcome, seconds, decoder_);
  if (options_.adaptive_window) {
    ObserveForWindow(outcome, seconds, stats_.cloud_queue_seconds() - queue_before,
                     stats_.cloud_compute_seconds() - compute_before);
  }
  if (options_.trace) {
    v1::DecodeRound round;
    round.set_start(static_cast<uint32_t>(start));
    round.set_drafted(static_cast<uint32_t>(outcome.drafted));
    round.set_accepted(static_cast<uint32_t>(outcome.accepted));
    round.set_parallel_hit(decoder_.round_from_parallel());
    round.set_cloud_kv_after_verify(cloud_after_verify);
    round.set_kv_length(static_cast<uint32_t>(outcome.length));
    // Filled in when the cloud confirms its rollback; no rollback, no change.
    round.set_cloud_kv_length(outcome.length < end ? 0 : cloud_after_verify);
    round.set_input_kv_length(static_cast<uint32_t>(outcome.input_kv_length));
    round.set_adapter_kv_length(static_cast<uint32_t>(outcome.adapter_kv_length));
    round.set_output_kv_length(static_cast<uint32_t>(outcome.output_kv_length));
    round.set_seconds(seconds);
    round.set_draft_limit(static_cast<uint32_t>(decoder_.round_limit()));
    round.set_parallel_steps(static_cast<uint32_t>(decoder_.parallel_steps()));
    round.set_sent_ahead(sent_ahead.has_value());
    round.set_rows_at_cloud_before(static_cast<uint32_t>(at_cloud));
    round.set_forced(static_cast<uint32_t>(outcome.forced_drafted));
    stats_.AddRoundTrace(round);
  }
  return outcome;
}

void DecodeRounds::ObserveForWindow(const RoundOutcome& outcome, double round_seconds,
                                    double cloud_queue_seconds, double cloud_compute_seconds) {
  const double gamma = decoder_.draft_step_seconds();
  // A round with no drafts says nothing about acceptance. The estimate starts optimistic, and
  // while the window is closed it drifts back to that prior, round by round: otherwise a few
  // unlucky rounds (seen: 0 of 12 kept) close the window for the rest of the request, since
  // no drafts means no new measurement to reopen it. A reopened window is measured again
  // and closes again if drafting still does not pay.
  constexpr double kOptimisticAcceptance = 0.8;
  // The drafter's acceptance: drafts the format forced are not its guesses.
  const int64_t drafted = outcome.drafted - outcome.forced_drafted;
  const int64_t accepted = outcome.accepted - outcome.forced_accepted;
  if (drafted > 0) {
    acceptance_.Add(static_cast<double>(accepted) / static_cast<double>(drafted));
  } else if (acceptance_.empty() || window_ == 0) {
    acceptance_.Add(kOptimisticAcceptance);
  }
  const double drafting = gamma * static_cast<double>(drafted);
  const double cloud = cloud_queue_seconds + cloud_compute_seconds;
  round_network_seconds_.Add(std::max(0.0, round_seconds - drafting - cloud));
  round_cloud_seconds_.Add(cloud_compute_seconds);
  round_queue_share_.Add(cloud > 0 ? cloud_queue_seconds / cloud : 0.0);
  if (gamma <= 0) return;  // no drafter timing yet: keep drafting up to max_draft_tokens
  window_ = std::min(options_.max_draft_tokens,
                     draft_window_.Update({.acceptance_rate = acceptance_.value(),
                                           .rtt_seconds = round_network_seconds_.value(),
                                           .target_step_seconds = round_cloud_seconds_.value(),
                                           .queue_utilization = round_queue_share_.value(),
                                           .draft_step_seconds = gamma}));
  stats_.RecordDraftWindow(window_);
}

}  // namespace tophat
