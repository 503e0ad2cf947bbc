// `tophat distill`: trains the drafter's adapter Λ (models/runtime/adapter.h) by knowledge
// distillation from the full model (HAT section 3.4, DESIGN.md "Adapter Λ"):
//
//   loss = SmoothL1(f_S, f_L) + w_ce · CE(softmax(H(f_L)), H(f_S))
//
// where f_L is the full model's residual stream after its last layer and f_S is Λ applied
// to the state after layer m - 1 (the input submodel's output), both at the same position,
// so both predict the next token, and H is the final norm + LM head. Only Λ trains; the
// teacher, the input layers and the head are frozen. AdamW, linear warm-up then cosine
// decay, gradient-norm clipping. The CE term is computed as KL(softmax(H(f_L)) ||
// softmax(H(f_S))) — the cross-entropy minus the teacher's entropy, which Λ cannot change —
// so gradients are the cross-entropy's and the reported loss falls to 0 at a perfect match. Deterministic for a given seed and thread count; state is
// checkpointed every `checkpoint_every` steps and on interruption, and a rerun with the same
// options resumes where the last one stopped.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "models/training/toy_model.h"

namespace tophat {

struct DistillOptions {
  std::filesystem::path model_dir;  // the full Hugging Face checkpoint (the teacher)
  // "toy" (the toy model's synthetic grammar, fresh documents from `seed`), or a file: plain
  // text (one document per non-empty line) or JSONL (`.jsonl`, a "text" field per line).
  std::string data = "toy";
  // Receives adapter.safetensors + adapter.json. A device bundle directory also gets the
  // adapter recorded in its manifest.
  std::filesystem::path out_dir;
  int64_t input_layers = 0;       // m; 0 takes it from out_dir's bundle manifest, else 2
  int64_t intermediate_size = 0;  // Λ's MLP width; 0: the model's
  int64_t init_layer = -1;        // teacher layer Λ starts from; -1: layer m
  uint64_t seed = 1234;
  int64_t steps = 400;
  int64_t batch_size = 16;
  int64_t sequence_length = 64;
  double learning_rate = 3e-3;
  double weight_decay = 0.01;
  double ce_weight = 0.1;
  double clip_norm = 1.0;
  int64_t checkpoint_every = 50;
  int64_t toy_documents = 4000;
  // The held-out acceptance estimate: greedy drafting with HAT's confidence threshold.
  double eta = 0.6;
  int64_t max_draft = 8;
  int64_t eval_prompts = 8;
  int64_t eval_new_tokens = 48;
  // Held-out prompt lengths the acceptance is measured at (the first is
  // heldout_accept_length): a drafter trained on short windows may fall apart deep into a
  // long prompt.
  std::vector<int64_t> eval_prompt_lengths = {12};
  int threads = 2;

  // Not part of a run's identity (a resumed run may change them):
  int64_t stop_after = 0;  // stop (checkpointed, unfinished) after this many steps; 0: never
  const std::atomic<bool>* interrupt = nullptr;  // set to stop at the next step boundary

  // What a run is, for resuming and for reusing a finished adapter.
  nlohmann::json ToJson() const;
};

struct DistillReport {
  bool reused = false;    // a finished adapter with the same options was already there
  bool finished = false;  // false: stopped early; rerun to resume
  int64_t resumed_from_step = 0;
  int64_t steps_done = 0;
  double seconds = 0;
  double first_train_loss = 0;
  double final_train_loss = 0;  // smoothed
  double initial_heldout_loss = 0;  // before training (Λ = the init layer)
  double heldout_loss = 0;
  double heldout_draft_top1 = 0;       // drafter argmax == target argmax, held out
  double heldout_accept_length = 0;    // tokens per verification round, greedy
  // (prompt length, tokens per round) for each of eval_prompt_lengths.
  std::vector<std::pair<int64_t, double>> accept_length_by_prompt_length;
  int64_t adapter_parameters = 0;
  int64_t model_parameters = 0;
  bool attached_to_bundle = false;
  nlohmann::json ToJson() const;
};

absl::StatusOr<DistillReport> Distill(
    const DistillOptions& options,
    const std::function<void(const TrainingProgress&)>& on_progress = {});

}  // namespace tophat
