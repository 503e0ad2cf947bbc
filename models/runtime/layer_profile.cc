#include "models/runtime/layer_profile.h"

#include <algorithm>
#include <chrono>

#include "base/status_macros.h"
#include "models/runtime/submodel.h"

namespace tophat {

absl::StatusOr<LayerProfile> ProfileLayers(const ModelConfig& config,
                                           const CheckpointReader& checkpoint, LayerRange layers,
                                           at::Device device, int64_t tokens, int repetitions) {
  if (tokens <= 0 || repetitions <= 0 || layers.begin < 0 || layers.end <= layers.begin) {
    return absl::InvalidArgumentError("profiling needs layers, positions and repetitions");
  }
  LayerProfile profile;
  for (int64_t layer = layers.begin; layer < layers.end; ++layer) {
    TOPHAT_ASSIGN_OR_RETURN(
        std::unique_ptr<Submodel> model,
        Submodel::Load(config, checkpoint, {.layers = {layer, layer + 1}},
                       {.dtype = at::kFloat, .device = device, .max_context = tokens,
                        .huge_pages = false}));
    profile.bytes.push_back(static_cast<double>(model->StoredWeightBytes()));
    const at::Tensor hidden = at::randn({tokens, config.hidden_size}).to(device);
    std::vector<double> times;
    for (int r = 0; r <= repetitions; ++r) {  // the first is a warm-up
      KvCache cache = model->NewCache(tokens);
      const auto start = std::chrono::steady_clock::now();
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor out, model->Forward(hidden, cache));
      (void)out.sum().item<double>();  // waits for a GPU's queue
      if (r > 0) {
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    profile.seconds.push_back(times[times.size() / 2]);
  }
  return profile;
}

}  // namespace tophat
