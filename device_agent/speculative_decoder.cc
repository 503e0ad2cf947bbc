#include "device_agent/speculative_decoder.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "models/runtime/speculative_verify.h"
#include "base/status_macros.h"

namespace tophat {

SpeculativeDecoder::SpeculativeDecoder(Models models, KvCache& input_cache,
                                       KvCache* adapter_cache, KvCache& output_cache,
                                       const SpeculativeOptions& options, Sampler& sampler)
    : models_(models),
      input_cache_(input_cache),
      adapter_cache_(adapter_cache),
      output_cache_(output_cache),
      options_(options),
      sampler_(sampler) {
  drafting_ = options_.enabled && options_.max_draft > 0 && models_.adapter != nullptr &&
              adapter_cache_ != nullptr;
}

namespace {
constexpr uint64_t kDraftSalt = 0x6a09e667f3bcc908ULL;
constexpr uint64_t kVerifySalt = 0xbb67ae8584caa73bULL;
// The most forced drafts a round takes (a thinking budget's message of up to 256 tokens goes
// in a few rounds): each is a row of the cloud's verification, as a prompt chunk's.
constexpr int64_t kMaxForcedDrafts = 64;
}  // namespace

uint64_t SpeculativeDecoder::RandomSeed(uint64_t salt, int64_t position) const {
  // splitmix64 of the request seed, the purpose and the position.
  uint64_t z = sampler_.params().seed ^ salt;
  z += 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(position) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

absl::Status SpeculativeDecoder::AbsorbPrompt(const at::Tensor& shallow) {
  if (!drafting_) return absl::OkStatus();
  return models_.adapter->Forward(shallow, *adapter_cache_).status();
}

absl::Status SpeculativeDecoder::Step(Run& run) {
  const int64_t position = run.start + run.processed();
  if (input_cache_.length() != position) {
    return absl::InternalError(absl::StrCat("drafting at position ", position,
                                            " but the input KV holds ", input_cache_.length()));
  }
  const auto started = std::chrono::steady_clock::now();
  const at::Tensor ids = at::full({1}, run.tokens[run.processed()], at::kLong);
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor embedded, models_.input->Embed(ids));
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor shallow, models_.input->Forward(embedded, input_cache_));
  run.shallow.push_back(shallow);
  if (drafting_) {
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor adapted, models_.adapter->Forward(shallow, *adapter_cache_));
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits, models_.output->Logits(adapted));
    run.next_logits = logits[0];
    draft_step_seconds_.Add(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  return absl::OkStatus();
}

std::vector<int32_t> SpeculativeDecoder::Pending(const Run& run) const {
  if (!sampler_.params().history_dependent()) return {};
  std::vector<int32_t> pending = run.pending_before;
  pending.insert(pending.end(), run.tokens.begin() + (run.first_committed ? 1 : 0),
                 run.tokens.end());
  return pending;
}

absl::StatusOr<bool> SpeculativeDecoder::Extend(Run& run, int64_t limit, bool one_step,
                                                int64_t room) {
  // The same rule for a round and for a branch drafted ahead (whose room is its limit), so
  // that a branch is a prefix of the round it becomes: a round's drafts, and so its random
  // draws, do not depend on how far drafting ahead got.
  room = std::max(room, limit);
  bool stepped = false;
  while (true) {
    if (run.processed() < static_cast<int64_t>(run.tokens.size())) {
      if (one_step && stepped) return true;
      TOPHAT_RETURN_IF_ERROR(Step(run));
      stepped = true;
      continue;
    }
    const int64_t forced = run.forced_drafts();
    if (options_.jump_forward && run.drafts() < room && forced < kMaxForcedDrafts &&
        sampler_.params().history_dependent()) {
      // A guess at a literal's spelling only without the drafter: under the same mask the
      // drafter knows the model's spelling better (guesses cut the toy model's rounds from
      // 4.2 to 3.5 tokens; docs/benchmarks.md, "Jump-forward").
      const std::optional<ForcedDraft> forced_draft = sampler_.ForcedToken(Pending(run));
      if (forced_draft && (forced_draft->only || !drafting_)) {
        // No q row: the verification takes a forced draft's q as all mass on it (one-hot),
        // without a vocabulary-sized row for each. The only token allowed has p = 1 too,
        // so it is kept; a guess is kept with the target's probability of it.
        run.tokens.push_back(forced_draft->token);
        run.forced.push_back(1);
        continue;
      }
    }
    if (!drafting_ || run.drafts() - forced >= limit || run.drafts() >= room ||
        !run.next_logits.defined()) {
      return false;
    }
    // The request's logit_bias and penalties shape the drafts as they shape the target's
    // choices.
    const std::vector<int32_t> pending = Pending(run);
    const at::Tensor biased = sampler_.Adjusted(run.next_logits, pending);
    const double confidence = at::softmax(biased, 0).max().item<double>();
    if (confidence < options_.eta) return false;
    int32_t draft = 0;
    if (sampler_.params().greedy()) {
      draft = static_cast<int32_t>(biased.argmax().item<int64_t>());
    } else {
      at::Tensor q = sampler_.Distribution(run.next_logits, pending);
      std::mt19937_64 rng(RandomSeed(kDraftSalt, run.start + static_cast<int64_t>(run.tokens.size())));
      draft = DrawIndex(q, rng);
      run.draft_probs.push_back(std::move(q));
    }
    run.tokens.push_back(draft);
    run.forced.push_back(0);
  }
}

absl::Status SpeculativeDecoder::TruncateDrafterCaches(int64_t length) {
  TOPHAT_RETURN_IF_ERROR(input_cache_.Truncate(length));
  if (drafting_) TOPHAT_RETURN_IF_ERROR(adapter_cache_->Truncate(length));
  return absl::OkStatus();
}

absl::Status SpeculativeDecoder::BeginRound(int32_t token, int64_t max_drafts) {
  branches_.clear();
  candidates_.clear();
  best_candidate_.reset();
  branch_.reset();
  drafted_ahead_ = false;
  // After a hit the caches already hold the branch's rows past its start.
  if (next_run_ && next_run_->tokens[0] == token) {
    run_ = std::move(*next_run_);
    run_.first_committed = true;  // the caller committed the verification's tokens
    run_.pending_before.clear();
    run_from_parallel_ = true;
  } else {
    if (next_run_) TOPHAT_RETURN_IF_ERROR(TruncateDrafterCaches(next_run_->start));
    run_ = Run{.start = input_cache_.length(), .tokens = {token}};
    run_from_parallel_ = false;
  }
  next_run_.reset();
  const int64_t limit = drafting_ ? std::clamp<int64_t>(max_drafts, 0, options_.max_draft) : 0;
  round_limit_ = limit;
  round_room_ = std::max<int64_t>(max_drafts, 0);
  // Drafts made ahead that no longer fit (more of the drafter's than `limit`, more in all
  // than the room): cut them, and with them the drafter's state.
  int64_t fits = 0;
  for (int64_t guessed = 0; fits < std::min(run_.drafts(), std::max(round_room_, limit)); ++fits) {
    guessed += run_.forced[static_cast<size_t>(fits)] == 0;
    if (guessed > limit) break;
  }
  if (run_.drafts() > fits) {
    run_.tokens.resize(fits + 1);
    run_.forced.resize(fits);
    // One q row per drafter's draft (none when greedy).
    const auto drafters =
        static_cast<size_t>(std::count(run_.forced.begin(), run_.forced.end(), 0));
    run_.draft_probs.resize(std::min(run_.draft_probs.size(), drafters));
    if (run_.processed() > fits + 1) {
      run_.shallow.resize(fits + 1);
      TOPHAT_RETURN_IF_ERROR(TruncateDrafterCaches(run_.start + fits + 1));
    }
    run_.next_logits = at::Tensor();
  }
  TOPHAT_RETURN_IF_ERROR(Extend(run_, limit, /*one_step=*/false, round_room_).status());

  // Parallel drafting targets the round after this one, which starts at branch_start_ if
  // every draft is kept; it needs room for that round.
  branch_start_ = run_.start + static_cast<int64_t>(run_.tokens.size());
  branch_limit_ = std::min({options_.parallel_steps, options_.max_draft,
                            max_drafts - run_.drafts() - 1});
  if (drafting_ && options_.parallel && options_.parallel_top_k > 0 && branch_limit_ >= 0 &&
      run_.next_logits.defined()) {
    const int64_t k = std::min<int64_t>(options_.parallel_top_k, run_.next_logits.size(0));
    const at::Tensor top =
        std::get<1>(sampler_.Adjusted(run_.next_logits, Pending(run_)).topk(k)).contiguous();
    for (int64_t i = 0; i < k; ++i) candidates_.push_back(static_cast<int32_t>(top[i].item<int64_t>()));
    if (!candidates_.empty()) best_candidate_ = candidates_.front();
  }
  return absl::OkStatus();
}

at::Tensor SpeculativeDecoder::RoundShallow() const { return at::cat(run_.shallow, 0); }

absl::Status SpeculativeDecoder::SealBranch() {
  Run& branch = *branch_;
  const int64_t count = branch.processed();
  branch.input_rows = input_cache_.ExportPositions(branch.start, count);
  branch.adapter_rows = adapter_cache_->ExportPositions(branch.start, count);
  TOPHAT_RETURN_IF_ERROR(TruncateDrafterCaches(branch.start));
  branches_.push_back(std::move(branch));
  branch_.reset();
  return absl::OkStatus();
}

absl::StatusOr<bool> SpeculativeDecoder::DraftAheadStep() {
  if (!branch_) {
    if (candidates_.empty()) return false;
    branch_ = Run{.start = branch_start_,
                  .tokens = {candidates_.front()},
                  .first_committed = false,
                  .pending_before = Pending(run_)};
    candidates_.erase(candidates_.begin());
    drafted_ahead_ = true;
  }
  TOPHAT_ASSIGN_OR_RETURN(bool grows,
                          Extend(*branch_, branch_limit_, /*one_step=*/true, branch_limit_));
  if (!grows) TOPHAT_RETURN_IF_ERROR(SealBranch());
  return true;
}

std::optional<SpeculativeDecoder::Branch> SpeculativeDecoder::BestBranch() const {
  // Candidates are drafted best first, one at a time: the first sealed branch is the best's.
  if (!best_candidate_ || branches_.empty() || branches_.front().tokens[0] != *best_candidate_) {
    return std::nullopt;
  }
  const Run& best = branches_.front();
  return Branch{.start = best.start,
                .token = best.tokens[0],
                .drafts = best.drafts(),
                .shallow = at::cat(best.shallow, 0)};
}

absl::StatusOr<RoundOutcome> SpeculativeDecoder::FinishRound(const at::Tensor& output_states) {
  // A branch cut short by the answer is still a valid (shorter) draft.
  if (branch_) TOPHAT_RETURN_IF_ERROR(SealBranch());
  candidates_.clear();
  best_candidate_.reset();
  const int64_t n = run_.drafts();
  if (output_states.dim() != 2 || output_states.size(0) != n + 1) {
    return absl::InternalError(absl::StrCat("verification needs ", n + 1, " output rows, got ",
                                            output_states.dim() == 2 ? output_states.size(0) : -1));
  }
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits, models_.output->Logits(output_states));
  const std::span<const int32_t> drafts(run_.tokens.data() + 1, static_cast<size_t>(n));
  VerifyResult verdict;
  if (n == 0) {
    verdict.next_token = sampler_.Sample(logits[0]);
  } else if (sampler_.params().greedy()) {
    verdict = VerifyGreedy(sampler_.AdjustedRows(logits, drafts), drafts);
  } else {
    std::vector<at::Tensor> target(static_cast<size_t>(n + 1));
    for (int64_t i = 0; i <= n; ++i) {
      target[i] = sampler_.Distribution(logits[i], drafts.first(static_cast<size_t>(i)));
    }
    std::mt19937_64 rng(RandomSeed(kVerifySalt, run_.start));
    const at::Tensor draft_probs =
        run_.draft_probs.empty()
            ? at::empty({0, logits.size(1)}, at::kFloat)  // every draft was forced
            : at::stack(run_.draft_probs);
    verdict = VerifySpeculativeSampling(at::stack(target), draft_probs, drafts, rng, run_.forced);
  }

  RoundOutcome outcome;
  outcome.drafted = n;
  outcome.accepted = verdict.accepted;
  outcome.forced_drafted = run_.forced_drafts();
  outcome.forced_accepted =
      std::count(run_.forced.begin(), run_.forced.begin() + verdict.accepted, 1);
  outcome.length = run_.start + verdict.accepted + 1;
  outcome.tokens.assign(drafts.begin(), drafts.begin() + verdict.accepted);
  outcome.tokens.push_back(verdict.next_token);
  outcome.logits = logits;
  TOPHAT_RETURN_IF_ERROR(TruncateDrafterCaches(outcome.length));
  TOPHAT_RETURN_IF_ERROR(output_cache_.Truncate(outcome.length));
  outcome.input_kv_length = input_cache_.length();
  outcome.adapter_kv_length = drafting_ ? adapter_cache_->length() : 0;
  outcome.output_kv_length = output_cache_.length();

  if (verdict.accepted == n) {
    for (Run& branch : branches_) {
      if (branch.tokens[0] != verdict.next_token || branch.start != outcome.length) continue;
      TOPHAT_RETURN_IF_ERROR(input_cache_.ImportPositions(branch.start, branch.input_rows));
      TOPHAT_RETURN_IF_ERROR(adapter_cache_->ImportPositions(branch.start, branch.adapter_rows));
      branch.input_rows = at::Tensor();
      branch.adapter_rows = at::Tensor();
      next_run_ = std::move(branch);
      outcome.parallel_hit = true;
      break;
    }
  }
  branches_.clear();
  return outcome;
}

}  // namespace tophat
