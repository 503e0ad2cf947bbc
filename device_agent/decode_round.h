// A request's decode rounds (DESIGN.md request path, steps 4-5; docs/architecture.md
// "tophat-agent"). One round: the drafter proposes from the last accepted token, [token +
// drafts] goes to the cloud as one PHASE_DECODE chunk, the drafter works ahead while the
// cloud verifies, the answer is verified, and every KV cache, the cloud's included, is rolled
// back to what was kept. With drafting off a round is the token alone: plain decoding.
//
// With speculative.max_runs_in_flight 2 (PipeInfer), the branch drafted ahead from the best
// candidate goes to the cloud as soon as it is drafted, behind the verification in flight. If
// the verification keeps every draft and its token is that candidate, the branch is the next
// round and its verification is already under way; otherwise the round's rollback (a Truncate
// behind it) cancels it: the cloud drops it if no step has started it, and its results are
// dropped here. A run is sent only while it pays: every round that had the best branch
// ready before its answer records whether that branch became the next round (sent or not),
// and runs go ahead only while the moving average of that keep rate is at least
// speculative.ahead_min_keep_rate. Where drafts are mostly rejected a run sent ahead is mostly
// wasted cloud compute, and the request stops sending them until the rate recovers.
//
// With speculative.adaptive_window, what each round showed (acceptance, network, cloud queue
// and compute time) feeds DSD's draft window (scheduler/decode_decisions.h), which caps the
// drafts of the rounds that follow.
//
// A round runs inside the request's protocol loop, reached through CloudSession, and emits
// nothing: the kept tokens go back to the request. Not thread-safe: one request thread owns
// its rounds.
#pragma once

#include <chrono>
#include <optional>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device_agent/request_stats.h"
#include "device_agent/speculative_decoder.h"
#include "scheduler/decode_decisions.h"
#include "scheduler/moving_average.h"

namespace tophat {

// The request's session with the cloud, as a decode round uses it (Agent::Request).
class CloudSession {
 public:
  // Keeps `rows`, the shallow states of the positions from `start` on, for replay, and sends
  // them as one PHASE_DECODE chunk.
  virtual void SendDecodeRows(int64_t start, const at::Tensor& rows) = 0;
  // As SendDecodeRows, for a run sent ahead of the verification of the positions before
  // `start` (PipeInfer). A reconnect does not replay it: sent() goes back to `start`.
  virtual void SendAheadRows(int64_t start, const at::Tensor& rows) = 0;
  // The run sent ahead was kept: its rows are the next round's.
  virtual void KeepAheadRows() = 0;
  // Positions whose shallow states went to the cloud.
  virtual int64_t sent() const = 0;
  // Handles the session's messages until `target` positions have been consumed (`block`) or
  // none are waiting (not `block`). Their output-submodel states come back through
  // DecodeRounds::AddOutputStates.
  virtual absl::Status Pump(int64_t target, bool block) = 0;
  // Positions whose deep states went through the output submodel.
  virtual int64_t consumed() const = 0;
  // The round kept positions [0, length): the cloud drops the rest of its KV (a Truncate right
  // behind the answer; streams are ordered, so no round trip) and the session goes on from
  // `length`. Results of chunks sent before it that are still to come (a run sent ahead) are
  // dropped.
  virtual void RollBack(int64_t length) = 0;

 protected:
  ~CloudSession() = default;
};

struct DecodeRoundOptions {
  bool adaptive_window = false;  // speculative.adaptive_window
  int64_t max_draft_tokens = 8;  // speculative.max_draft_tokens: the window's ceiling
  bool trace = false;            // GenerateRequest.trace: a DecodeRound per round in the stats
  // speculative.max_runs_in_flight >= 2: send the best branch drafted ahead before the
  // verification returns.
  bool send_ahead = false;
  // speculative.ahead_min_keep_rate: send only while this share of best branches is kept.
  double ahead_min_keep_rate = 0.5;
};

class DecodeRounds {
 public:
  // `decoder` and `stats` are the request's and outlive the rounds.
  DecodeRounds(SpeculativeDecoder& decoder, RequestStatsRecorder& stats,
               const DecodeRoundOptions& options);

  // Runs one round from `token` (accepted, in no KV yet), drafting at most `room` tokens (what
  // the request's length limit leaves) and, with the adaptive window, at most the window.
  // Returns the verified outcome; the caller emits its tokens.
  absl::StatusOr<RoundOutcome> Run(int32_t token, int64_t room, CloudSession& session);

  // The output submodel's states for positions of the round in flight, in order, as the
  // cloud's results arrive.
  void AddOutputStates(const at::Tensor& states) { outputs_.push_back(states); }

 private:
  using Clock = std::chrono::steady_clock;

  // DSD: folds the round into the window's inputs and decides the next rounds' window.
  void ObserveForWindow(const RoundOutcome& outcome, double round_seconds,
                        double cloud_queue_seconds, double cloud_compute_seconds);

  SpeculativeDecoder& decoder_;
  RequestStatsRecorder& stats_;
  const DecodeRoundOptions options_;
  std::vector<at::Tensor> outputs_;  // of the round in flight
  // The run the previous round sent ahead and kept (PipeInfer): the rows of this round that
  // were at the cloud before it began.
  std::optional<SpeculativeDecoder::Branch> kept_ahead_;
  // Of the rounds whose best branch was ready before the answer, the share whose branch was
  // the next round (sent ahead or not); no sample yet: send.
  MovingAverage best_branch_kept_{0.7};

  AdaptiveDraftWindow draft_window_;
  MovingAverage acceptance_{0.6};
  MovingAverage round_network_seconds_{0.6};
  MovingAverage round_cloud_seconds_{0.6};
  MovingAverage round_queue_share_{0.6};
  int64_t window_ = -1;  // drafts allowed next round; -1: not decided yet (max_draft_tokens)
};

}  // namespace tophat
