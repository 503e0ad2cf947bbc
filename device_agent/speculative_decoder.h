// The device half of decoding (DESIGN.md, request path steps 4-5), without the transport:
// drafting with the drafter (input submodel -> adapter Λ -> final norm + LM head), the
// verification of the cloud's answer, KV rollback on the device, and parallel drafting.
//
// A round starts from the last accepted token t at position `start`, which no KV cache holds
// yet. The drafter proposes d1..dn, stopping when its top probability falls below eta or at
// the round's limit. The shallow states of [t, d1..dn] — computed while drafting — are what
// the caller sends to the cloud; the cloud's deep states go through the output submodel
// (advancing its KV by n + 1), and FinishRound verifies them: greedy longest agreeing prefix,
// or speculative sampling, plus one token from the target. Every device cache (input, Λ,
// output) is then rolled back to start + accepted + 1; the caller rolls back the cloud's.
//
// With drafting off (or no adapter) a round is one row, the token itself: plain U-shaped
// decoding through the same code.
//
// Parallel drafting (HAT section 3.5): while a verification is in flight the caller calls
// DraftAheadStep, which drafts up to `parallel_steps` tokens from each of the drafter's
// top-k candidates for the position after dn. Each branch runs in the same caches past the
// round's rows; its K/V rows are exported and the caches put back. If verification keeps
// every draft and its token equals a candidate, that branch's rows are imported and its
// drafts start the next round without drafting again. Anything else is dropped; tokens are
// only ever emitted after verification, so speculation never changes the output.
//
// Several runs in flight (PipeInfer): once the best candidate's branch is drafted to its end
// (BestBranch), the caller may send its rows to the cloud before the verification returns.
// On a hit that branch is the next round, already on its way; on a miss the caller truncates
// the cloud's KV and drops the branch's results. The branch is the same either way, so the
// output is too.
//
// Penalties on repetition (SamplingParams) count the drafts before a position as generated:
// a draft, its verification row and plain decoding see the same history, so speculative
// decoding stays exact with them.
//
// Sampled requests are reproducible for a seed: every random draw is keyed by the request's
// seed and the position it decides, so a draft made ahead equals the one drafting would
// have made, and timing never shows in the output.
//
// Not thread-safe: one request thread owns a decoder and its caches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/runtime/kv_cache.h"
#include "models/runtime/sampler.h"
#include "models/runtime/submodel.h"
#include "scheduler/moving_average.h"

namespace tophat {

struct SpeculativeOptions {
  bool enabled = true;      // draft at all (needs an adapter)
  double eta = 0.6;         // stop drafting when the drafter's top probability is below this
  int64_t max_draft = 8;    // drafts per round
  bool parallel = true;     // draft ahead while a verification is in flight
  int64_t parallel_top_k = 2;  // candidates drafted ahead from
  int64_t parallel_steps = 4;  // λ: drafts per candidate
  // Tokens the answer's format leaves go as drafts, with the drafter or without (Extend);
  // off, they take a round each like any other token (for A/B runs).
  bool jump_forward = true;
};

struct RoundOutcome {
  std::vector<int32_t> tokens;  // the kept drafts, then the target's token
  // The target's logits of the round's rows, [drafted + 1, V]: row i decided tokens[i] (the
  // rows past the last token are those of rejected drafts).
  at::Tensor logits;
  int64_t drafted = 0;
  int64_t accepted = 0;
  // Of those, the drafts the format forced (Sampler::ForcedToken), made without the drafter:
  // not the drafter's to be credited with. The only token allowed is rejected only after a
  // rejected draft; a guess at a literal's spelling (no drafter) may be rejected itself.
  int64_t forced_drafted = 0;
  int64_t forced_accepted = 0;
  int64_t length = 0;  // KV length after the round, everywhere: start + accepted + 1
  bool parallel_hit = false;  // the next round's drafts are already made
  // Device KV lengths right after the rollback (before a parallel hit's rows, which belong
  // to the next round, went in).
  int64_t input_kv_length = 0;
  int64_t adapter_kv_length = 0;
  int64_t output_kv_length = 0;
};

class SpeculativeDecoder {
 public:
  struct Models {
    const Submodel* input = nullptr;    // embedding + layers [0, m)
    const Submodel* adapter = nullptr;  // Λ, or null (no drafting)
    const Submodel* output = nullptr;   // layers [L-k, L) + norm + head
  };
  // The caches belong to the caller and outlive the decoder; adapter_cache may be null when
  // there is no adapter. `sampler` is the request's target sampler (its parameters decide
  // greedy vs sampling, and it draws every token that is not a kept draft).
  SpeculativeDecoder(Models models, KvCache& input_cache, KvCache* adapter_cache,
                     KvCache& output_cache, const SpeculativeOptions& options, Sampler& sampler);

  bool drafting() const { return drafting_; }
  // λ for the rounds that follow (the cloud's per-device decision).
  void set_parallel_steps(int64_t steps) { options_.parallel_steps = std::max<int64_t>(0, steps); }
  int64_t parallel_steps() const { return options_.parallel_steps; }
  // γ: moving average of one drafter step (input submodel + Λ + head), measured; 0 until
  // the first.
  double draft_step_seconds() const { return draft_step_seconds_.value(); }

  // Λ takes in prompt rows (shallow states [n, D]) so that its KV covers the prompt.
  absl::Status AbsorbPrompt(const at::Tensor& shallow);

  // Starts a round from `token`, accepted at position input_cache.length(), drafting at most
  // `max_drafts` tokens (the room the request has left).
  absl::Status BeginRound(int32_t token, int64_t max_drafts);
  int64_t round_start() const { return run_.start; }
  int64_t round_drafts() const { return run_.drafts(); }
  // The drafts this round was allowed: `max_drafts` within max_draft (0 without drafting).
  int64_t round_limit() const { return round_limit_; }
  bool round_from_parallel() const { return run_from_parallel_; }
  // Shallow states of [token, d1..dn]: [n + 1, D].
  at::Tensor RoundShallow() const;

  // One step of parallel drafting (one token through the drafter). False when there is
  // nothing left to draft ahead this round.
  absl::StatusOr<bool> DraftAheadStep();
  bool drafted_ahead() const { return drafted_ahead_; }

  // The branch drafted ahead from this round's best candidate, once it is drafted to its end;
  // nullopt before (or when there is none). On a hit with `token` as the target's token it is
  // the next round unchanged: rows [start, start + drafts + 1).
  struct Branch {
    int64_t start = 0;
    int32_t token = 0;
    int64_t drafts = 0;
    at::Tensor shallow;  // [drafts + 1, D]
  };
  std::optional<Branch> BestBranch() const;

  // `output_states`: the output submodel's states for the round's n + 1 rows (the output
  // cache already holds them). Verifies, rolls the device caches back and prepares a
  // parallel hit.
  absl::StatusOr<RoundOutcome> FinishRound(const at::Tensor& output_states);

 private:
  struct Run {
    int64_t start = 0;
    std::vector<int32_t> tokens;      // [x0, d1..dn]
    std::vector<at::Tensor> shallow;  // one [1, D] row per processed token
    std::vector<at::Tensor> draft_probs;  // q_i of the drafter's d_i (sampling only)
    std::vector<uint8_t> forced;          // 1 where d_i was forced by the format
    at::Tensor next_logits;           // drafter logits after the last processed token
    at::Tensor input_rows;            // exported K/V rows (a finished branch)
    at::Tensor adapter_rows;
    // Penalties and min_tokens count the tokens before a position (Sampler): a round's x0 is
    // committed when it begins, a branch's candidate is not, and the round's drafts come
    // before it.
    bool first_committed = true;
    std::vector<int32_t> pending_before;  // a branch's: the round's drafts
    int64_t drafts() const { return static_cast<int64_t>(tokens.size()) - 1; }
    int64_t forced_drafts() const { return std::count(forced.begin(), forced.end(), 1); }
    int64_t processed() const { return static_cast<int64_t>(shallow.size()); }
  };

  // The tokens between the committed history and run's next draft (empty without penalties
  // or a minimum length, which alone look at them).
  std::vector<int32_t> Pending(const Run& run) const;
  // Runs run.tokens[processed] through the input submodel (and Λ + head when drafting).
  absl::Status Step(Run& run);
  // Processes pending tokens, then drafts until eta, `limit` drafts, or (`one_step`) one
  // forward pass has been done. Returns whether the run can still grow. A token the format
  // forces is appended as a draft whatever the drafter (and without one), not counted in
  // `limit` but within `room` drafts in all (at least `limit`) and kMaxForcedDrafts forced:
  // a JSON Schema's key or a thinking budget's message costs one round, not one a token
  // (SGLang's jump-forward decoding, here as drafts the verification keeps). A guess at a
  // literal's spelling (TokenConstraint::Forced) only without the drafter.
  absl::StatusOr<bool> Extend(Run& run, int64_t limit, bool one_step, int64_t room);
  // Ends the branch being drafted: keeps its K/V rows and puts the caches back.
  absl::Status SealBranch();
  absl::Status TruncateDrafterCaches(int64_t length);

  Models models_;
  KvCache& input_cache_;
  KvCache* adapter_cache_;
  KvCache& output_cache_;
  SpeculativeOptions options_;
  Sampler& sampler_;
  // Random draws of sampled drafts and of verification come from generators seeded by
  // (request seed, position), not from running streams: how far parallel drafting gets
  // before an answer arrives is a matter of timing, and must not change which tokens a
  // seed produces.
  uint64_t RandomSeed(uint64_t salt, int64_t position) const;
  bool drafting_ = false;
  MovingAverage draft_step_seconds_;

  Run run_;
  int64_t round_limit_ = 0;
  int64_t round_room_ = 0;  // BeginRound's max_drafts
  bool run_from_parallel_ = false;
  // Parallel drafting for the current round.
  int64_t branch_start_ = 0;
  int64_t branch_limit_ = 0;
  std::vector<int32_t> candidates_;  // not started yet, best first
  std::optional<int32_t> best_candidate_;
  std::optional<Run> branch_;        // being drafted
  std::vector<Run> branches_;        // sealed
  bool drafted_ahead_ = false;
  std::optional<Run> next_run_;      // a hit, for the next BeginRound
};

}  // namespace tophat
