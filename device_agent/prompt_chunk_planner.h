// The agent's prompt chunks by Jupiter's sequence partition (scheduler/chunk_plan.h): chunks
// of unequal length, so that later chunks, which attend over more context, are shorter and
// the pipeline (the device's submodels -> uplink -> the cloud's step -> downlink) is not held
// to the pace of its slowest chunk. `prompt_chunk_plan: jupiter` in the agent's config.
//
// The agent plans, not the cloud: it alone has every stage's timings. Its own input and
// output submodels it times itself; the cloud's step it reads from every prompt result
// (ForwardResult.compute_seconds, the engine step that carried those positions, with the
// rest of that step's batch); the links are its link estimator's. Each stage's q(x, y) is
// fitted (FitChunkCost) from the most recent timings of all this agent's prompts. Until every
// stage has timings enough to fit, and the uplink is measured, there is no plan and the
// request uses HAT's one size (equation 3, the cloud's Control.prompt_chunk_size): the first
// prompts of an agent's life are chunked as before.
//
// The device's input and output submodels run on the request's one thread, in turn (a
// chunk's input layers, then the output layers of whatever results came back), so they are
// one stage of the flow shop, costing their sum. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "scheduler/chunk_plan.h"

namespace tophat {

class PromptChunkPlanner {
 public:
  struct Options {
    size_t window = 256;  // timings kept per stage, the most recent
    ChunkPlanOptions plan;
  };
  PromptChunkPlanner() : PromptChunkPlanner(Options{}) {}
  explicit PromptChunkPlanner(Options options) : options_(options) {}

  // A prompt chunk of `positions` after `context` earlier ones took `seconds`: on the device's
  // input submodel (with the adapter's KV for it), on its output submodel, in the cloud's step.
  void ObserveDeviceInput(int64_t positions, int64_t context, double seconds);
  void ObserveDeviceOutput(int64_t positions, int64_t context, double seconds);
  void ObserveCloud(int64_t positions, int64_t context, double seconds);

  struct LinkRates {
    double uplink_seconds_per_position = 0;    // the wire's bytes per position / bandwidth
    double downlink_seconds_per_position = 0;
  };
  // The chunk lengths for prompt positions [first, prompt) (first > 0: a conversation's
  // earlier turns are in the KV already), or nullopt when a stage cannot be fitted yet or the
  // uplink is unmeasured (0): the caller then uses equal chunks. An unmeasured downlink (0)
  // is left out of the pipeline: the estimator measures it only when results queue on it,
  // which on an edge link, faster down than up, they seldom do.
  // `max_chunk` > 0: no chunk longer (HAT's size from the cloud, which bounds how long the
  // chunks hold up other devices' decode steps): the plan shapes the chunks within it, on a
  // finer grain (a quarter of it).
  std::optional<ChunkPlan> Plan(int64_t first, int64_t prompt, const LinkRates& links,
                                int64_t max_chunk = 0) const;

  // The stages' cost models as fitted now (device, uplink, cloud, and downlink when
  // measured); nullopt as Plan.
  std::optional<std::vector<ChunkCost>> Stages(int64_t first, const LinkRates& links) const;

 private:
  void Add(std::deque<ChunkSample>& samples, int64_t positions, int64_t context,
           double seconds);
  const Options options_;
  mutable std::mutex mutex_;
  std::deque<ChunkSample> device_input_;   // under mutex_
  std::deque<ChunkSample> device_output_;  // under mutex_
  std::deque<ChunkSample> cloud_;          // under mutex_
};

}  // namespace tophat
