#include "scheduler/chunk_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::array<double, 3> Features(int64_t positions, int64_t context) {
  const double x = static_cast<double>(positions);
  const double y = static_cast<double>(context);
  return {1.0, x, x * (y + (x + 1) / 2)};
}

// Least squares over the features in `used` (a bit mask), by the normal equations; false
// when they are singular. `coefficients` gets 0 for the features left out.
bool SolveSubset(std::span<const ChunkSample> samples, unsigned used,
                 std::array<double, 3>* coefficients, double* residual) {
  std::vector<int> columns;
  for (int c = 0; c < 3; ++c) {
    if (used & (1u << c)) columns.push_back(c);
  }
  const size_t n = columns.size();
  // Scaled to their largest value, so that the elimination's pivots compare like with like.
  std::array<double, 3> scale = {0, 0, 0};
  for (const ChunkSample& s : samples) {
    const auto f = Features(s.positions, s.context);
    for (int c = 0; c < 3; ++c) scale[c] = std::max(scale[c], std::abs(f[c]));
  }
  std::array<std::array<double, 4>, 3> m{};  // [A^T A | A^T b]
  for (const ChunkSample& s : samples) {
    const auto f = Features(s.positions, s.context);
    for (size_t r = 0; r < n; ++r) {
      const double fr = f[columns[r]] / scale[columns[r]];
      for (size_t c = 0; c < n; ++c) m[r][c] += fr * f[columns[c]] / scale[columns[c]];
      m[r][3] += fr * s.seconds;
    }
  }
  for (size_t p = 0; p < n; ++p) {
    size_t best = p;
    for (size_t r = p + 1; r < n; ++r) {
      if (std::abs(m[r][p]) > std::abs(m[best][p])) best = r;
    }
    if (std::abs(m[best][p]) < 1e-12 * static_cast<double>(samples.size())) return false;
    std::swap(m[p], m[best]);
    for (size_t r = 0; r < n; ++r) {
      if (r == p) continue;
      const double factor = m[r][p] / m[p][p];
      for (size_t c = p; c < n; ++c) m[r][c] -= factor * m[p][c];
      m[r][3] -= factor * m[p][3];
    }
  }
  *coefficients = {0, 0, 0};
  for (size_t r = 0; r < n; ++r) {
    (*coefficients)[columns[r]] = m[r][3] / m[r][r] / scale[columns[r]];
  }
  *residual = 0;
  for (const ChunkSample& s : samples) {
    const auto f = Features(s.positions, s.context);
    double predicted = 0;
    for (int c = 0; c < 3; ++c) predicted += (*coefficients)[c] * f[c];
    *residual += (predicted - s.seconds) * (predicted - s.seconds);
  }
  return true;
}

// One chunk's beat and its stage times' sum (the DP's tie-break), over all stages.
struct ChunkTime {
  double slowest = 0;
  double sum = 0;
  bool operator<(const ChunkTime& other) const {
    return slowest != other.slowest ? slowest < other.slowest : sum < other.sum;
  }
};

ChunkTime TimeOf(std::span<const ChunkCost> stages, int64_t positions, int64_t context) {
  ChunkTime t;
  for (const ChunkCost& stage : stages) {
    const double seconds = stage.Seconds(positions, context);
    t.slowest = std::max(t.slowest, seconds);
    t.sum += seconds;
  }
  return t;
}

// Equal chunks of the size that gives `k` of them (a multiple of the granularity), the last
// whatever is left.
std::vector<int64_t> EqualChunks(int64_t prompt, int64_t k, int64_t granularity) {
  int64_t size = (prompt + k - 1) / k;
  size = (size + granularity - 1) / granularity * granularity;
  std::vector<int64_t> chunks;
  for (int64_t at = 0; at < prompt; at += size) chunks.push_back(std::min(size, prompt - at));
  return chunks;
}

// Moves chunk boundaries one granule at a time while that shortens PipelineSeconds: the DP
// minimises the slowest chunk, and a chunk that is not the slowest can still shorten the
// pipeline's start or its tail. Keeps every chunk at least `floor` long.
void Refine(std::span<const ChunkCost> stages, int64_t unit, int64_t floor, int64_t ceiling,
            std::vector<int64_t>* chunks, double* seconds) {
  for (int round = 0; round < 64; ++round) {
    bool improved = false;
    for (size_t i = 0; i + 1 < chunks->size(); ++i) {
      for (const int64_t shift : {unit, -unit}) {
        int64_t& left = (*chunks)[i];
        int64_t& right = (*chunks)[i + 1];
        if (left + shift < floor || right - shift < floor) continue;
        if (ceiling > 0 && (left + shift > ceiling || right - shift > ceiling)) continue;
        left += shift;
        right -= shift;
        const double candidate = PipelineSeconds(stages, *chunks);
        if (candidate < *seconds - 1e-15) {
          *seconds = candidate;
          improved = true;
        } else {
          left -= shift;
          right += shift;
        }
      }
    }
    if (!improved) return;
  }
}

}  // namespace

double ChunkCost::Seconds(int64_t positions, int64_t context) const {
  const auto f = Features(positions, context);
  return fixed_s * f[0] + per_position_s * f[1] + per_pair_s * f[2];
}

absl::StatusOr<ChunkCost> FitChunkCost(std::span<const ChunkSample> samples) {
  std::set<std::pair<int64_t, int64_t>> distinct;
  for (size_t i = 0; i < samples.size(); ++i) {
    const ChunkSample& s = samples[i];
    if (s.positions <= 0 || s.context < 0 || !(s.seconds > 0) || !std::isfinite(s.seconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk timing #", i, " (", s.positions, " positions after ", s.context, ", ",
          s.seconds, " s) cannot be fitted: positions and seconds must be positive"));
    }
    distinct.insert({s.positions, s.context});
  }
  if (distinct.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a chunk cost needs timings of at least 3 different (positions, context) pairs; got ",
        distinct.size()));
  }
  // Every subset of the coefficients, the full one first; the best fit with none negative.
  double best_residual = kInfinity;
  std::array<double, 3> best = {0, 0, 0};
  for (unsigned used : {7u, 3u, 5u, 6u, 1u, 2u, 4u}) {
    std::array<double, 3> coefficients;
    double residual = 0;
    if (!SolveSubset(samples, used, &coefficients, &residual)) continue;
    if (coefficients[0] < 0 || coefficients[1] < 0 || coefficients[2] < 0) continue;
    if (residual < best_residual) {
      best_residual = residual;
      best = coefficients;
    }
  }
  if (best_residual == kInfinity) {
    return absl::InvalidArgumentError("the chunk timings fit no cost with non-negative terms");
  }
  return ChunkCost{.fixed_s = best[0], .per_position_s = best[1], .per_pair_s = best[2]};
}

double PipelineSeconds(std::span<const ChunkCost> stages, std::span<const int64_t> chunks) {
  std::vector<double> left(stages.size(), 0);  // when the previous chunk left each stage
  int64_t context = 0;
  for (const int64_t positions : chunks) {
    double ready = 0;  // when this chunk left the stage before
    for (size_t s = 0; s < stages.size(); ++s) {
      ready = std::max(ready, left[s]) + stages[s].Seconds(positions, context);
      left[s] = ready;
    }
    context += positions;
  }
  return stages.empty() ? 0 : left.back();
}

absl::StatusOr<ChunkPlan> PlanChunks(int64_t prompt, std::span<const ChunkCost> stages,
                                     const ChunkPlanOptions& options) {
  if (stages.empty()) return absl::InvalidArgumentError("a chunk plan needs at least one stage");
  if (prompt <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot plan chunks of a ", prompt,
                                                   "-position prompt"));
  }
  const int64_t unit = std::max<int64_t>(1, options.granularity);
  // Where chunks may end: multiples of the granularity, and the prompt's end.
  std::vector<int64_t> bounds;
  for (int64_t at = 0; at < prompt; at += unit) bounds.push_back(at);
  bounds.push_back(prompt);
  const size_t m = bounds.size() - 1;
  const int64_t ceiling = options.max_chunk;
  const auto usable = [&](size_t i, size_t j) {
    const int64_t length = bounds[j] - bounds[i];
    if (ceiling > 0 && length > ceiling) return false;
    return length >= options.min_chunk || (i == 0 && j == m);
  };
  // With a ceiling, a chunk ending at bounds[j] starts no earlier than this many bounds back.
  const size_t reach = ceiling > 0 ? static_cast<size_t>(ceiling / unit) + 1 : m;
  const size_t max_k = static_cast<size_t>(std::max<int64_t>(1, options.max_chunks));
  // best[k][j]: the best (beat, sum) of the first bounds[j] positions in k + 1 chunks.
  const ChunkTime unreachable{kInfinity, kInfinity};
  std::vector<std::vector<ChunkTime>> best(max_k, std::vector<ChunkTime>(m + 1, unreachable));
  std::vector<std::vector<size_t>> from(max_k, std::vector<size_t>(m + 1, 0));
  for (size_t j = 1; j <= m; ++j) {
    if (usable(0, j)) best[0][j] = TimeOf(stages, bounds[j], 0);
  }
  for (size_t k = 1; k < max_k; ++k) {
    for (size_t j = 1; j <= m; ++j) {
      for (size_t i = j > reach ? j - reach : 1; i < j; ++i) {
        if (best[k - 1][i].slowest == kInfinity || !usable(i, j)) continue;
        const ChunkTime last = TimeOf(stages, bounds[j] - bounds[i], bounds[i]);
        const ChunkTime candidate{std::max(best[k - 1][i].slowest, last.slowest),
                                  best[k - 1][i].sum + last.sum};
        if (candidate < best[k][j]) {
          best[k][j] = candidate;
          from[k][j] = i;
        }
      }
    }
  }
  // Candidates: the DP's split for each k, and (with refinement) HAT's equal chunks for each
  // k; the best few by latency are refined, and the fastest wins.
  std::vector<std::pair<double, std::vector<int64_t>>> candidates;
  for (size_t k = 0; k < max_k; ++k) {
    if (best[k][m].slowest == kInfinity) continue;
    std::vector<int64_t> chunks;
    size_t j = m;
    for (size_t level = k + 1; level-- > 0;) {
      const size_t i = level == 0 ? 0 : from[level][j];
      chunks.push_back(bounds[j] - bounds[i]);
      j = i;
    }
    std::reverse(chunks.begin(), chunks.end());
    candidates.emplace_back(PipelineSeconds(stages, chunks), std::move(chunks));
    if (!options.refine) continue;
    std::vector<int64_t> equal = EqualChunks(prompt, static_cast<int64_t>(k + 1), unit);
    const bool long_enough = std::all_of(equal.begin(), equal.end(), [&](int64_t x) {
      return (x >= options.min_chunk || equal.size() == 1) && (ceiling <= 0 || x <= ceiling);
    });
    if (long_enough) candidates.emplace_back(PipelineSeconds(stages, equal), std::move(equal));
  }
  std::sort(candidates.begin(), candidates.end());
  constexpr size_t kRefined = 4;
  ChunkPlan plan;
  plan.seconds = kInfinity;
  for (size_t c = 0; c < candidates.size() && (c < kRefined || !options.refine); ++c) {
    auto& [seconds, chunks] = candidates[c];
    if (options.refine) {
      Refine(stages, unit, std::max<int64_t>(1, options.min_chunk), ceiling, &chunks, &seconds);
    }
    if (seconds < plan.seconds) {
      plan.chunks = chunks;
      plan.seconds = seconds;
    }
    if (!options.refine) break;  // sorted: the first is the DP's fastest
  }
  if (plan.chunks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no split of ", prompt, " positions into at most ", max_k, " chunks of ",
        options.min_chunk, " to ", ceiling > 0 ? absl::StrCat(ceiling) : "any", " positions"));
  }
  int64_t context = 0;
  for (const int64_t positions : plan.chunks) {
    plan.slowest_stage_s = std::max(plan.slowest_stage_s, TimeOf(stages, positions, context).slowest);
    context += positions;
  }
  const std::vector<int64_t> equal =
      EqualChunks(prompt, static_cast<int64_t>(plan.chunks.size()), unit);
  plan.equal_chunks_seconds = PipelineSeconds(stages, equal);
  return plan;
}

}  // namespace tophat
