// The per-device decisions of HAT's scheduler (DESIGN.md "The equations"), as pure functions
// of the state monitor's estimates:
//   - the prompt chunk size X_i, which balances uploading a chunk against the cloud computing
//     the previous one: X_i·A / β_i,up = (g(μ) + g(μ + X_i)) / P, where g / P is the
//     pipeline's beat when its P stages are even; with a step-time model per stage, the beat
//     is the slowest stage's: X_i·A / β_i,up = max_s g_s(μ) + max_s g_s(μ + X_i);
//   - the parallel-drafting steps λ_i = floor((μ_i·A/β_i,up + g(μ) + μ_i·A/β_i,down) / γ_i):
//     the drafter steps that fit in one verification trip;
//   - the wire dtype of the device's hidden states, among those the operator allows: the
//     widest whose upload keeps up with the cloud, X_max·A_d / β_i,up <= g(μ) + g(μ + X_max)
//     (the chunk-size balance at the largest chunk: compressing further would not make the
//     prompt reach the cloud sooner, the cloud would be what it waits for), else the narrowest;
//   - DSD's adaptive draft window (AdaptiveDraftWindow), as an option.
#pragma once

#include <cstdint>
#include <span>

#include "scheduler/state_monitor.h"
#include "scheduler/step_time_predictor.h"

namespace tophat {

struct ChunkSizeInputs {
  int64_t prompt_tokens = 0;
  double bytes_per_token = 0;          // A: hidden-state bytes per position on the wire
  double uplink_bytes_per_second = 0;  // β_i,up (0: unknown)
  double mean_batched_tokens = 0;      // μ
  int64_t pipeline_stages = 1;         // P
  // g_s per pipeline stage (StateMonitor::stage_step_times); used instead of g / P once
  // every stage has timings.
  std::span<const StepTimePredictor> stage_step_times;
  int64_t min_chunk = 16;
  int64_t max_chunk = 1024;
  // Optional cap (0: none): a step that carries the chunk should take at most this long, so
  // that the other devices' decode steps batched with it stay fast (Sarathi's reasoning).
  // Under load the cap binds first, and chunks shrink as the load grows.
  double max_step_seconds = 0;
};

// X_i for one prompt. Prompts of at most `min_chunk` tokens are not chunked (the whole
// prompt); so are all prompts when the bandwidth or the step curve is not known yet (then
// `max_chunk`, capped at the prompt). Otherwise the integer X in [min_chunk, max_chunk] where
// uploading X positions first takes at least as long as the cloud's share of the two steps
// it overlaps, found by bisection (the upload time grows faster in X than g does); then
// capped by max_step_seconds (never below min_chunk) and at the prompt.
//
// Note that the balance itself moves the other way with load: a busier cloud (larger μ, a
// slower g) leaves more time to upload a larger chunk behind each step. The step cap is what
// makes chunks smaller when the cloud is busy.
int64_t ChooseChunkSize(const ChunkSizeInputs& in, const StepTimePredictor& step_time);

struct ParallelDraftInputs {
  double draft_tokens = 0;             // μ_i: the device's tokens per verification
  double bytes_per_token = 0;          // A
  double uplink_bytes_per_second = 0;  // β_i,up
  double downlink_bytes_per_second = 0;
  double step_seconds = 0;             // g(μ): the verification step in the cloud
  double draft_step_seconds = 0;       // γ_i
  int64_t max_steps = 8;
};

// λ_i by HAT's equation 6, clamped to [0, max_steps]; 0 while γ_i or a bandwidth is unknown.
int64_t ParallelDraftSteps(const ParallelDraftInputs& in);

struct WireDtypeInputs {
  // The wire dtypes to choose among, as bytes per position (A_d), widest first.
  std::span<const double> bytes_per_position;
  double uplink_bytes_per_second = 0;  // β_i,up (0: unknown)
  double mean_batched_tokens = 0;      // μ
  int64_t max_chunk = 2048;            // X_max
  int64_t pipeline_stages = 1;         // P
  std::span<const StepTimePredictor> stage_step_times;  // g_s, as in ChunkSizeInputs
};

// The index (into bytes_per_position) of the widest dtype whose upload of a largest chunk
// takes no longer than the cloud's share of the two steps it overlaps, else of the narrowest;
// -1 when there is nothing to choose from or β_up or g is not known yet.
int64_t ChooseWireDtype(const WireDtypeInputs& in, const StepTimePredictor& step_time);

// The configured defaults and bounds of the per-device decisions (scheduler.* keys).
struct DeviceControlOptions {
  int64_t default_prompt_chunk = 128;  // scheduler.prompt_chunk_size
  int64_t default_draft_steps = 0;     // scheduler.draft_steps
  int64_t min_chunk = 16;              // scheduler.min_prompt_chunk_size
  int64_t max_chunk = 2048;            // limits.max_chunk_tokens
  double max_step_seconds = 0;         // scheduler.max_step_seconds
  int64_t max_draft_steps = 8;         // scheduler.max_draft_steps
  // P: the cloud's pipeline stages, which work on P micro-batches at once (HAT's Eq. 3
  // divides the step time the chunk's upload overlaps by P).
  int64_t pipeline_stages = 1;
  std::span<const StepTimePredictor> stage_step_times;  // g_s, as in ChunkSizeInputs
  // scheduler.wire_dtypes as bytes per position, widest first; empty: no wire choice.
  std::span<const double> wire_bytes_per_position;
};

// What the cloud tells one device, and which values came from its measurements.
struct DeviceControl {
  int64_t prompt_chunk_size = 0;
  bool chunk_size_measured = false;
  int64_t draft_steps = 0;
  bool draft_steps_measured = false;
  // Into DeviceControlOptions::wire_bytes_per_position (-1: none to choose from). Until the
  // uplink and g are known, the narrowest: the slow link is the case it is for, and a fast
  // one is measured within its first chunks.
  int64_t wire_dtype = -1;
  bool wire_dtype_measured = false;
  bool operator==(const DeviceControl&) const = default;
};

// Each value from the device's measurements when every input it needs is known, else the
// configured default; an unknown input (0 in DeviceEstimate, no step timings yet) is never
// replaced by a guess. X_i and the wire dtype need β_up and g; λ_i needs γ_i, μ_i, β_up,
// β_down and g.
DeviceControl DecideDeviceControl(const DeviceEstimate& device, double bytes_per_token,
                                  double mean_batched_tokens, const StepTimePredictor& step_time,
                                  const DeviceControlOptions& options);

struct DraftWindowOptions {
  int64_t min_window = 1;
  int64_t max_window = 12;
  double smoothing = 0.4;         // EMA weight on the new prediction (DSD: α = 0.4)
  int64_t hysteresis_steps = 2;   // consecutive "no gain" predictions before drafting stops
  double min_gain = 1.05;         // drafting must promise this much more tokens per second
};

// What the window controller sees each round.
struct DraftWindowSignals {
  double acceptance_rate = 0;     // recent fraction of drafts kept, in [0, 1]
  double rtt_seconds = 0;         // recent verification round trip, network only
  double target_step_seconds = 0; // recent cloud step (TPOT-like)
  double queue_utilization = 0;   // recent cloud queue depth / capacity, in [0, 1]
  double draft_step_seconds = 0;  // γ
};

// DSD's Adaptive Window Control with an analytic predictor in place of its trained network:
// the window w maximising expected tokens per second, (1 - a^(w+1)) / (1 - a) tokens per
// round over w·γ + RTT + t_verify seconds, where a queued cloud stretches t_verify by
// 1 + utilization. The prediction is clamped, smoothed (EMA) and rounded; when it promises
// no gain over plain decoding (one token per RTT + t_verify) for `hysteresis_steps` rounds in
// a row, drafting stops (window 0), and it resumes as soon as a gain is predicted again.
class AdaptiveDraftWindow {
 public:
  explicit AdaptiveDraftWindow(const DraftWindowOptions& options = {});
  // The window for the next round: 0 (no drafting) or in [min_window, max_window].
  int64_t Update(const DraftWindowSignals& signals);
  int64_t window() const { return window_; }
  double smoothed() const { return smoothed_; }

  // The unsmoothed best window and its predicted speedup over plain decoding.
  struct Prediction {
    double window = 0;
    double speedup = 1;
  };
  Prediction Predict(const DraftWindowSignals& signals) const;

 private:
  DraftWindowOptions options_;
  double smoothed_ = 0;
  bool seen_ = false;
  int64_t window_ = 0;
  int64_t no_gain_streak_ = 0;
  bool drafting_ = true;
};

}  // namespace tophat
