#include "scheduler/batch_planner.h"

#include "scheduler/step_time_predictor.h"

#include <algorithm>
#include <cmath>

namespace tophat {

void BatchPlanner::WaterFill(int64_t budget, uint64_t rotation) {
  const size_t groups = demand_.size();
  grant_.assign(groups, 0);
  order_.clear();
  double total_weight = 0;
  for (size_t g = 0; g < groups; ++g) {
    if (demand_[g] <= 0) continue;
    order_.push_back(static_cast<int32_t>(g));
    total_weight += weight_[g];
  }
  // Smallest demand per unit of weight first: each either fits its share of what is left
  // (and takes only its demand) or, like every group after it, does not.
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return static_cast<double>(demand_[a]) * weight_[b] <
           static_cast<double>(demand_[b]) * weight_[a];
  });
  int64_t left = budget;
  size_t first_saturated = 0;
  for (; first_saturated < order_.size(); ++first_saturated) {
    const int32_t g = order_[first_saturated];
    const double share = static_cast<double>(left) * weight_[g] / total_weight;
    if (static_cast<double>(demand_[g]) > share) break;
    grant_[g] = demand_[g];
    left -= demand_[g];
    total_weight -= weight_[g];
  }
  if (first_saturated == order_.size() || left <= 0) return;
  // The rest want more than their shares: each gets its share, rounded down...
  int64_t handed = 0;
  for (size_t i = first_saturated; i < order_.size(); ++i) {
    const int32_t g = order_[i];
    grant_[g] = std::min<int64_t>(
        demand_[g],
        static_cast<int64_t>(std::floor(static_cast<double>(left) * weight_[g] / total_weight)));
    handed += grant_[g];
  }
  // ...and the tokens the rounding left go one each, starting at a group that rotates.
  const size_t saturated = order_.size() - first_saturated;
  int64_t spare = left - handed;
  for (size_t k = 0; spare > 0 && k < saturated * 2; ++k) {
    const int32_t g = order_[first_saturated + (rotation + k) % saturated];
    if (grant_[g] < demand_[g]) {
      ++grant_[g];
      --spare;
    }
  }
}

int64_t BatchPlanner::Plan(std::span<const PendingWork> pending, const BatchLimits& limits,
                           std::span<const GroupShare> groups, uint64_t rotation,
                           std::vector<PlannedWork>& plan) {
  plan.clear();
  int64_t used = 0;
  const auto full = [&] { return static_cast<int64_t>(plan.size()) >= limits.max_sequences; };
  size_t num_groups = groups.size();
  for (const PendingWork& work : pending) {
    num_groups = std::max(num_groups, static_cast<size_t>(work.group) + 1);
  }
  for (size_t i = 0; i < pending.size() && !full(); ++i) {
    const PendingWork& work = pending[i];
    if (!work.decode || work.num_tokens <= 0) continue;
    if (used + work.num_tokens > limits.max_batch_tokens && used > 0) continue;
    plan.push_back({static_cast<int32_t>(i), work.num_tokens});
    used += work.num_tokens;
  }
  const int64_t room = limits.max_batch_tokens - used;
  if (room <= 0 || full()) return used;

  demand_.assign(num_groups, 0);
  weight_.assign(num_groups, 1.0);
  for (size_t g = 0; g < groups.size(); ++g) weight_[g] = groups[g].weight;
  for (const PendingWork& work : pending) {
    if (!work.decode && work.num_tokens > 0) demand_[work.group] += work.num_tokens;
  }
  // The capped groups first share their own allowance; what each is granted there is all it
  // may ask of the step.
  bool any_capped = false;
  for (size_t g = 0; g < groups.size(); ++g) any_capped |= groups[g].capped && demand_[g] > 0;
  const int64_t capped_room = std::max<int64_t>(1, limits.capped_step_tokens - used);
  if (any_capped && capped_room < room) {
    capped_.assign(demand_.begin(), demand_.end());
    for (size_t g = 0; g < num_groups; ++g) {
      if (g >= groups.size() || !groups[g].capped) demand_[g] = 0;
    }
    WaterFill(capped_room, rotation);
    for (size_t g = 0; g < num_groups; ++g) {
      demand_[g] = g < groups.size() && groups[g].capped ? grant_[g] : capped_[g];
    }
  }
  WaterFill(room, rotation);

  for (size_t i = 0; i < pending.size() && !full(); ++i) {
    const PendingWork& work = pending[i];
    if (work.decode || work.num_tokens <= 0) continue;
    int64_t& grant = grant_[work.group];
    if (grant <= 0) continue;
    const int64_t take = std::min(work.num_tokens, grant);
    plan.push_back({static_cast<int32_t>(i), take});
    grant -= take;
    used += take;
  }
  return used;
}

void RoundRobinOrder::Reserve(size_t items, size_t groups) {
  seen_.reserve(groups);
  rank_.reserve(items);
  order_.reserve(items);
}

std::span<const int32_t> RoundRobinOrder::Order(std::span<const int32_t> groups,
                                                int32_t num_groups) {
  seen_.assign(static_cast<size_t>(num_groups), 0);
  rank_.resize(groups.size());
  order_.resize(groups.size());
  bool ranked = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    rank_[i] = seen_[static_cast<size_t>(groups[i])]++;
    ranked |= rank_[i] > 0;
    order_[i] = static_cast<int32_t>(i);
  }
  // One item per group (the common case): arrival order already is the order. Ties in rank
  // go by index, which is arrival (std::stable_sort would allocate its buffer every step).
  if (ranked) {
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
      return rank_[a] != rank_[b] ? rank_[a] < rank_[b] : a < b;
    });
  }
  return order_;
}

int64_t PlanBatch(std::span<const PendingWork> pending, const BatchLimits& limits,
                  std::vector<PlannedWork>& plan) {
  BatchPlanner planner;
  return planner.Plan(pending, limits, {}, 0, plan);
}

std::optional<int64_t> DecodeStretchStepTokens(const StepTimePredictor& step_time,
                                               int64_t decoding, double stretch,
                                               double decode_away_seconds,
                                               int64_t max_batch_tokens) {
  if (stretch <= 0 || decoding <= 0 || !step_time.has_data()) return std::nullopt;
  const double decode_seconds = step_time.Predict(static_cast<double>(decoding));
  const double step_seconds =
      std::max(stretch * decode_seconds,
               ((stretch - 1) * std::max(0.0, decode_away_seconds) + stretch * decode_seconds) /
                   2);
  return step_time.MaxTokensWithin(step_seconds, max_batch_tokens);
}

}  // namespace tophat
