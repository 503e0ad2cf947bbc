#include "scheduler/batch_planner.h"

#include <algorithm>

namespace tophat {

int64_t PlanBatch(std::span<const PendingWork> pending, const BatchLimits& limits,
                  std::vector<PlannedWork>& plan) {
  plan.clear();
  int64_t used = 0;
  const auto full = [&] { return static_cast<int64_t>(plan.size()) >= limits.max_sequences; };
  for (size_t i = 0; i < pending.size() && !full(); ++i) {
    const PendingWork& work = pending[i];
    if (!work.decode || work.num_tokens <= 0) continue;
    if (used + work.num_tokens > limits.max_batch_tokens && used > 0) continue;
    plan.push_back({static_cast<int32_t>(i), work.num_tokens});
    used += work.num_tokens;
  }
  for (size_t i = 0; i < pending.size() && !full(); ++i) {
    const PendingWork& work = pending[i];
    if (work.decode || work.num_tokens <= 0) continue;
    const int64_t room = limits.max_batch_tokens - used;
    if (room <= 0) break;
    const int64_t take = std::min(work.num_tokens, room);
    plan.push_back({static_cast<int32_t>(i), take});
    used += take;
  }
  return used;
}

}  // namespace tophat
