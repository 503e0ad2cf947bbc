// Token-budget batch planning for one cloud engine step (Sarathi-style chunked prefill):
// decode and verification work first, whole; then prefill chunks, split to fill the budget.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tophat {

// One session's pending work at the head of its queue.
struct PendingWork {
  int64_t num_tokens = 0;  // positions waiting to run
  bool decode = false;     // decode/verification: latency-critical, never split
};

struct PlannedWork {
  int32_t index = 0;       // into the `pending` span
  int64_t num_tokens = 0;  // <= pending[index].num_tokens
};

struct BatchLimits {
  int64_t max_batch_tokens = 512;
  int64_t max_sequences = 256;
};

// Plans one step. `pending` is in arrival order; the plan keeps that order within the
// decode group and within the prefill group, so waiting work is served first-come
// first-served. Decode work that does not fit waits for the next step, except that a step
// never comes out empty: a single item larger than the whole budget runs alone (decode) or
// is cut to the budget (prefill). `plan` is cleared and reused, so steady state does not
// allocate. Returns the planned token count.
int64_t PlanBatch(std::span<const PendingWork> pending, const BatchLimits& limits,
                  std::vector<PlannedWork>& plan);

}  // namespace tophat
