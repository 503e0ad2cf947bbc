// gpt-oss's experts as its checkpoints store them: one tensor per layer for all experts,
// gate_up_proj [E, D, 2I] (x @ W, gate and up interleaved along the last dimension) with
// gate_up_proj_bias [E, 2I], and down_proj [E, I, D] with down_proj_bias [E, D]; or, in the
// released checkpoints, the two matrices in MXFP4 as gate_up_proj_blocks [E, 2I, D/32, 16]
// and gate_up_proj_scales [E, 2I, D/32] (rows already as a linear layer's), and so for down.
// Read here into the layout every other mixture's experts load in, one expert at a time.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gemv_mxfp4.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"

namespace tophat {

// The name of layer `layer`'s fused expert tensor `part` ("gate_up_proj", "down_proj",
// "gate_up_proj_bias", "down_proj_bias"; the MXFP4 ones add "_blocks" and "_scales").
std::string FusedExpertsTensorName(int64_t layer, std::string_view part);

// One expert in the runtime's layout (that of Submodel's expert_gate_up and expert_down).
struct ExpertTensors {
  at::Tensor gate_up;       // [2I, D]: gate's rows, then up's
  at::Tensor gate_up_bias;  // [2I], in the same order
  at::Tensor down;          // [D, I]
  at::Tensor down_bias;     // [D]
};

// Expert `expert` of layer `layer`, in `dtype` on the CPU, from either storage (MXFP4 where
// "<name>_blocks" is present). Errors name the file and tensor: a missing one, a shape that
// is not the config's, a dtype that is not a float's (or U8 for MXFP4).
absl::StatusOr<ExpertTensors> LoadFusedExpert(const CheckpointReader& checkpoint,
                                              const ModelConfig& config, int64_t layer,
                                              int64_t expert, at::ScalarType dtype);

// One expert's matrices held in MXFP4 as released (kernels/gemv_mxfp4.h), rows in the
// runtime's layout (gate's rows, then up's), and its biases in float32.
struct Mxfp4ExpertTensors {
  kernels::Mxfp4Matrix gate_up;  // [2I, D / 32, 16] and [2I, D / 32]
  at::Tensor gate_up_bias;       // [2I]
  kernels::Mxfp4Matrix down;     // [D, I / 32, 16] and [D, I / 32]
  at::Tensor down_bias;          // [D]
};

// Whether layer `layer`'s experts are stored in MXFP4 ("gate_up_proj_blocks" present).
bool FusedExpertsInMxfp4(const CheckpointReader& checkpoint, int64_t layer);

// Expert `expert` of layer `layer` from MXFP4 storage, kept packed. Errors as LoadFusedExpert's.
absl::StatusOr<Mxfp4ExpertTensors> LoadFusedExpertMxfp4(const CheckpointReader& checkpoint,
                                                        const ModelConfig& config, int64_t layer,
                                                        int64_t expert);

}  // namespace tophat
