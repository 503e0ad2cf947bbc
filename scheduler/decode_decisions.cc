#include "scheduler/decode_decisions.h"

#include <algorithm>
#include <cmath>

namespace tophat {
namespace {

// The time between two steps leaving the cloud for a step of `tokens`: the slowest stage's
// own time when every stage has timings, else g split evenly over the P stages.
double PipelineBeat(int64_t pipeline_stages, std::span<const StepTimePredictor> stage_step_times,
                    const StepTimePredictor& step_time, double tokens) {
  const bool per_stage =
      !stage_step_times.empty() &&
      std::all_of(stage_step_times.begin(), stage_step_times.end(),
                  [](const StepTimePredictor& stage) { return stage.has_data(); });
  if (!per_stage) {
    return step_time.Predict(tokens) / static_cast<double>(std::max<int64_t>(1, pipeline_stages));
  }
  double slowest = 0;
  for (const StepTimePredictor& stage : stage_step_times) {
    slowest = std::max(slowest, stage.Predict(tokens));
  }
  return slowest;
}

}  // namespace

int64_t ChooseChunkSize(const ChunkSizeInputs& in, const StepTimePredictor& step_time) {
  const int64_t min_chunk = std::max<int64_t>(1, in.min_chunk);
  const int64_t max_chunk = std::max(min_chunk, in.max_chunk);
  const int64_t prompt = std::max<int64_t>(1, in.prompt_tokens);
  if (prompt <= min_chunk) return prompt;
  if (!(in.uplink_bytes_per_second > 0) || !(in.bytes_per_token > 0) || !step_time.has_data()) {
    return std::min(prompt, max_chunk);
  }
  // Positive once the upload of x positions outlasts the cloud's share of the overlap.
  auto gap = [&](int64_t x) {
    const double upload = static_cast<double>(x) * in.bytes_per_token / in.uplink_bytes_per_second;
    const double compute =
        PipelineBeat(in.pipeline_stages, in.stage_step_times, step_time, in.mean_batched_tokens) +
        PipelineBeat(in.pipeline_stages, in.stage_step_times, step_time,
                     in.mean_batched_tokens + static_cast<double>(x));
    return upload - compute;
  };
  int64_t chunk = max_chunk;
  if (gap(min_chunk) >= 0) {
    chunk = min_chunk;
  } else if (gap(max_chunk) > 0) {
    int64_t lo = min_chunk;  // gap < 0
    int64_t hi = max_chunk;  // gap > 0
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (gap(mid) < 0 ? lo : hi) = mid;
    }
    chunk = hi;
  }
  if (in.max_step_seconds > 0 &&
      step_time.Predict(in.mean_batched_tokens + static_cast<double>(chunk)) > in.max_step_seconds) {
    // The largest chunk whose step stays within the cap (g never decreases in its size).
    int64_t lo = min_chunk;
    int64_t hi = chunk;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (step_time.Predict(in.mean_batched_tokens + static_cast<double>(mid)) <= in.max_step_seconds
           ? lo
           : hi) = mid;
    }
    chunk = lo;
  }
  return std::min(prompt, chunk);
}

int64_t ChooseWireDtype(const WireDtypeInputs& in, const StepTimePredictor& step_time) {
  const int64_t count = static_cast<int64_t>(in.bytes_per_position.size());
  if (count == 0 || !(in.uplink_bytes_per_second > 0) || !std::isfinite(in.uplink_bytes_per_second) ||
      !step_time.has_data()) {
    return -1;
  }
  const double chunk = static_cast<double>(std::max<int64_t>(1, in.max_chunk));
  const double compute =
      PipelineBeat(in.pipeline_stages, in.stage_step_times, step_time, in.mean_batched_tokens) +
      PipelineBeat(in.pipeline_stages, in.stage_step_times, step_time,
                   in.mean_batched_tokens + chunk);
  for (int64_t d = 0; d < count; ++d) {
    if (chunk * in.bytes_per_position[d] / in.uplink_bytes_per_second <= compute) return d;
  }
  return count - 1;
}

int64_t ParallelDraftSteps(const ParallelDraftInputs& in) {
  if (!(in.draft_step_seconds > 0) || !(in.uplink_bytes_per_second > 0) ||
      !(in.downlink_bytes_per_second > 0)) {
    return 0;
  }
  const double bytes = std::max(0.0, in.draft_tokens) * in.bytes_per_token;
  const double trip = bytes / in.uplink_bytes_per_second + std::max(0.0, in.step_seconds) +
                      bytes / in.downlink_bytes_per_second;
  const double steps = std::floor(trip / in.draft_step_seconds);
  return static_cast<int64_t>(std::clamp(steps, 0.0, static_cast<double>(std::max<int64_t>(0, in.max_steps))));
}

DeviceControl DecideDeviceControl(const DeviceEstimate& device, double bytes_per_token,
                                  double mean_batched_tokens, const StepTimePredictor& step_time,
                                  const DeviceControlOptions& options) {
  const auto known = [](double value) { return value > 0 && std::isfinite(value); };
  DeviceControl control{.prompt_chunk_size = options.default_prompt_chunk,
                        .draft_steps = options.default_draft_steps,
                        .wire_dtype = static_cast<int64_t>(options.wire_bytes_per_position.size()) - 1};
  if (known(device.uplink_bytes_per_second) && step_time.has_data() &&
      !options.wire_bytes_per_position.empty()) {
    control.wire_dtype = ChooseWireDtype({.bytes_per_position = options.wire_bytes_per_position,
                                          .uplink_bytes_per_second = device.uplink_bytes_per_second,
                                          .mean_batched_tokens = mean_batched_tokens,
                                          .max_chunk = options.max_chunk,
                                          .pipeline_stages = options.pipeline_stages,
                                          .stage_step_times = options.stage_step_times},
                                         step_time);
    control.wire_dtype_measured = true;
  }
  if (!step_time.has_data() || !known(bytes_per_token)) return control;
  if (known(device.uplink_bytes_per_second)) {
    control.prompt_chunk_size = ChooseChunkSize(
        {.prompt_tokens = options.max_chunk,
         .bytes_per_token = bytes_per_token,
         .uplink_bytes_per_second = device.uplink_bytes_per_second,
         .mean_batched_tokens = mean_batched_tokens,
         .pipeline_stages = options.pipeline_stages,
         .stage_step_times = options.stage_step_times,
         .min_chunk = std::min(options.min_chunk, options.max_chunk),
         .max_chunk = options.max_chunk,
         .max_step_seconds = options.max_step_seconds},
        step_time);
    control.chunk_size_measured = true;
  }
  if (known(device.draft_step_seconds) && known(device.draft_tokens_per_round) &&
      known(device.uplink_bytes_per_second) && known(device.downlink_bytes_per_second)) {
    control.draft_steps = ParallelDraftSteps({.draft_tokens = device.draft_tokens_per_round,
                                              .bytes_per_token = bytes_per_token,
                                              .uplink_bytes_per_second = device.uplink_bytes_per_second,
                                              .downlink_bytes_per_second = device.downlink_bytes_per_second,
                                              .step_seconds = step_time.Predict(mean_batched_tokens),
                                              .draft_step_seconds = device.draft_step_seconds,
                                              .max_steps = options.max_draft_steps});
    control.draft_steps_measured = true;
  }
  return control;
}

AdaptiveDraftWindow::AdaptiveDraftWindow(const DraftWindowOptions& options) : options_(options) {
  options_.min_window = std::max<int64_t>(1, options_.min_window);
  options_.max_window = std::max(options_.min_window, options_.max_window);
  options_.smoothing = std::clamp(options_.smoothing, 0.0, 1.0);
  window_ = options_.min_window;
}

AdaptiveDraftWindow::Prediction AdaptiveDraftWindow::Predict(const DraftWindowSignals& s) const {
  const double a = std::clamp(s.acceptance_rate, 0.0, 0.999);
  const double verify = std::max(0.0, s.target_step_seconds) *
                        (1 + std::clamp(s.queue_utilization, 0.0, 1.0));
  const double base_round = std::max(1e-9, std::max(0.0, s.rtt_seconds) + verify);
  const double plain_rate = 1 / base_round;
  Prediction best;
  for (int64_t w = options_.min_window; w <= options_.max_window; ++w) {
    const double tokens = (1 - std::pow(a, static_cast<double>(w + 1))) / (1 - a);
    const double seconds = static_cast<double>(w) * std::max(0.0, s.draft_step_seconds) + base_round;
    const double speedup = tokens / seconds / plain_rate;
    if (speedup > best.speedup + 1e-12 || best.window == 0) best = {static_cast<double>(w), speedup};
  }
  return best;
}

int64_t AdaptiveDraftWindow::Update(const DraftWindowSignals& signals) {
  const Prediction prediction = Predict(signals);
  const double target = std::clamp(prediction.window, static_cast<double>(options_.min_window),
                                   static_cast<double>(options_.max_window));
  smoothed_ = seen_ ? options_.smoothing * target + (1 - options_.smoothing) * smoothed_ : target;
  seen_ = true;
  const bool gain = prediction.speedup >= options_.min_gain;
  no_gain_streak_ = gain ? 0 : no_gain_streak_ + 1;
  // Sticky: stop only after several rounds without a gain; resume at the first gain.
  if (drafting_ && no_gain_streak_ >= options_.hysteresis_steps) drafting_ = false;
  if (!drafting_ && gain) drafting_ = true;
  window_ = drafting_ ? std::clamp<int64_t>(std::llround(smoothed_), options_.min_window,
                                            options_.max_window)
                      : 0;
  return window_;
}

}  // namespace tophat
