#include "bench/dtype_numerics.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/submodel.h"
#include "proto/hidden_states.h"

namespace tophat {
namespace {

// The three submodels of the split, each in its own dtype, and the wire between them.
struct SplitPipeline {
  std::unique_ptr<Submodel> input;
  std::unique_ptr<Submodel> middle;
  std::unique_ptr<Submodel> output;
  v1::DType wire = v1::DTYPE_FLOAT32;
};

// Hidden states as the other end receives them: encoded in the wire dtype and decoded into
// the receiver's, as the agent and the cloud do.
absl::StatusOr<at::Tensor> AcrossWire(const at::Tensor& hidden, v1::DType wire,
                                      const Submodel& receiver) {
  v1::HiddenStates states;
  TOPHAT_RETURN_IF_ERROR(PackHiddenStates(hidden, wire, &states));
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor received,
                          UnpackHiddenStates(states, receiver.options().dtype));
  return received.to(receiver.options().device);
}

struct PipelineCaches {
  KvCache input;
  KvCache middle;
  KvCache output;
};

// ids -> float32 logits of every position, continuing the caches. The hidden states cross
// the wire twice: shallow -> cloud's float32, deep -> device dtype.
absl::StatusOr<at::Tensor> SplitLogits(const SplitPipeline& p, PipelineCaches& caches,
                                       const at::Tensor& ids) {
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor h, p.input->Embed(ids));
  TOPHAT_ASSIGN_OR_RETURN(h, p.input->Forward(h, caches.input));
  TOPHAT_ASSIGN_OR_RETURN(h, AcrossWire(h, p.wire, *p.middle));
  TOPHAT_ASSIGN_OR_RETURN(h, p.middle->Forward(h, caches.middle));
  TOPHAT_ASSIGN_OR_RETURN(h, AcrossWire(h, p.wire, *p.output));
  TOPHAT_ASSIGN_OR_RETURN(h, p.output->Forward(h, caches.output));
  return p.output->Logits(h);
}

absl::StatusOr<at::Tensor> FullLogits(const Submodel& full, KvCache& cache,
                                      const at::Tensor& ids) {
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor h, full.Embed(ids));
  TOPHAT_ASSIGN_OR_RETURN(h, full.Forward(h, cache));
  return full.Logits(h);
}

at::Tensor IdTensor(const std::vector<int32_t>& ids) {
  return at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong);
}

int32_t LastArgmax(const at::Tensor& logits) {
  return static_cast<int32_t>(logits[logits.size(0) - 1].argmax().item<int64_t>());
}

}  // namespace

absl::StatusOr<DtypeNumericsReport> MeasureDeviceDtype(
    const DtypeNumericsOptions& options, const std::vector<std::vector<int32_t>>& prompts) {
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config,
                          ModelConfig::Load(options.model_dir / "config.json"));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                          CheckpointReader::Open(options.model_dir));
  const int64_t layers = config.num_hidden_layers;
  if (options.input_layers < 0 || options.output_layers < 0 ||
      options.input_layers + options.output_layers > layers) {
    return absl::InvalidArgumentError(absl::StrCat("m = ", options.input_layers, " and k = ",
                                                   options.output_layers, " do not fit ",
                                                   layers, " layers"));
  }
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, p.size());
  const int64_t context = longest + options.new_tokens + 1;
  const SubmodelOptions float32{.dtype = at::kFloat, .device = options.device,
                                .max_context = context, .huge_pages = false};
  SubmodelOptions device = float32;
  device.dtype = options.device_dtype;
  device.quantize_int8 = options.device_int8_weights;
  device.int8_activations = options.device_int8_activations;
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<Submodel> full,
                          Submodel::Load(config, *checkpoint, SubmodelSpec::Full(config), float32));
  SplitPipeline split;
  split.wire = options.wire_dtype != v1::DTYPE_UNSPECIFIED ? options.wire_dtype
                                                          : v1::DTYPE_FLOAT32;
  TOPHAT_ASSIGN_OR_RETURN(
      split.input,
      Submodel::Load(config, *checkpoint, SubmodelSpec::Input(options.input_layers), device));
  TOPHAT_ASSIGN_OR_RETURN(
      split.middle,
      Submodel::Load(config, *checkpoint,
                     SubmodelSpec::Middle(config, options.input_layers, options.output_layers),
                     float32));
  TOPHAT_ASSIGN_OR_RETURN(
      split.output,
      Submodel::Load(config, *checkpoint, SubmodelSpec::Output(config, options.output_layers),
                     device));
  auto new_caches = [&] {
    return PipelineCaches{.input = split.input->NewGrowingCache(),
                          .middle = split.middle->NewGrowingCache(),
                          .output = split.output->NewGrowingCache()};
  };

  DtypeNumericsReport report;
  report.device_dtype = TorchDtypeName(options.device_dtype);
  report.device_weights = !split.input->int8_weights()       ? report.device_dtype
                          : options.device_int8_activations ? "int8, int8 activations"
                                                            : "int8";
  report.wire_dtype = WireDtypeName(split.wire);
  report.wire_bytes_per_position = WireBytesPerPosition(split.wire, config.hidden_size);
  double error_sum = 0;
  double divergence_sum = 0;
  int64_t diverged = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    if (prompt.empty()) continue;
    ++report.prompts;
    const auto prompt_length = static_cast<int64_t>(prompt.size());
    // float32's greedy continuation, one token at a time as a server decodes.
    std::vector<int32_t> reference;
    {
      KvCache cache = full->NewGrowingCache();
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits, FullLogits(*full, cache, IdTensor(prompt)));
      for (int64_t t = 0; t < options.new_tokens; ++t) {
        reference.push_back(LastArgmax(logits));
        if (t + 1 == options.new_tokens) break;
        TOPHAT_ASSIGN_OR_RETURN(logits, FullLogits(*full, cache, IdTensor({reference.back()})));
      }
    }
    // Both models over prompt + continuation in one pass: logit error on every row, and
    // the device's choice at each continuation position (teacher forcing).
    std::vector<int32_t> sequence = prompt;
    sequence.insert(sequence.end(), reference.begin(), reference.end() - 1);
    const at::Tensor ids = IdTensor(sequence);
    KvCache full_cache = full->NewGrowingCache();
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor want, FullLogits(*full, full_cache, ids));
    PipelineCaches caches = new_caches();
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor got, SplitLogits(split, caches, ids));
    const at::Tensor error = (got.to(at::kCPU) - want.to(at::kCPU)).abs();
    report.max_abs_logit_error = std::max(report.max_abs_logit_error, error.max().item<double>());
    error_sum += error.sum().item<double>();
    report.positions += error.size(0);
    report.logit_range = std::max(report.logit_range, want.abs().max().item<double>());
    const at::Tensor tail_want = want.narrow(0, prompt_length - 1, options.new_tokens).argmax(-1);
    const at::Tensor tail_got = got.narrow(0, prompt_length - 1, options.new_tokens).argmax(-1);
    report.greedy_positions += options.new_tokens;
    report.greedy_agreed += tail_want.eq(tail_got).sum().item<int64_t>();

    // The device pipeline decoding freely.
    PipelineCaches free_caches = new_caches();
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor logits, SplitLogits(split, free_caches, IdTensor(prompt)));
    int64_t first_divergence = -1;
    for (int64_t t = 0; t < options.new_tokens; ++t) {
      const int32_t token = LastArgmax(logits);
      if (token != reference[t]) {
        first_divergence = t;
        break;
      }
      if (t + 1 == options.new_tokens) break;
      TOPHAT_ASSIGN_OR_RETURN(logits, SplitLogits(split, free_caches, IdTensor({token})));
    }
    if (first_divergence < 0) {
      ++report.identical_continuations;
    } else {
      ++diverged;
      divergence_sum += static_cast<double>(first_divergence);
    }
  }
  if (report.positions > 0) {
    report.mean_abs_logit_error = error_sum / static_cast<double>(report.positions) /
                                  static_cast<double>(config.vocab_size);
  }
  if (diverged > 0) report.mean_first_divergence = divergence_sum / static_cast<double>(diverged);
  return report;
}

std::string DtypeNumericsReport::ToTable() const {
  return absl::StrFormat(
      "| device dtype | device weights | wire dtype | wire bytes/position | prompts | logit rows | "
      "max abs logit error | mean abs logit error | "
      "largest abs logit | greedy agreement (teacher-forced) | identical continuations | "
      "mean first divergence |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
      "| %s | %s | %s | %d | %d | %d | %.4f | %.5f | %.2f | %.2f%% (%d/%d) | %d/%d | %s |",
      device_dtype, device_weights, wire_dtype, wire_bytes_per_position, prompts, positions, max_abs_logit_error, mean_abs_logit_error, logit_range,
      greedy_positions > 0 ? 100.0 * static_cast<double>(greedy_agreed) /
                                 static_cast<double>(greedy_positions)
                           : 0.0,
      greedy_agreed, greedy_positions, identical_continuations, prompts,
      identical_continuations == prompts ? std::string("-")
                                         : absl::StrFormat("%.1f", mean_first_divergence));
}

nlohmann::json DtypeNumericsReport::ToJson() const {
  return {{"device_dtype", device_dtype},
          {"device_weights", device_weights},
          {"wire_dtype", wire_dtype},
          {"wire_bytes_per_position", wire_bytes_per_position},
          {"prompts", prompts},
          {"logit_rows", positions},
          {"max_abs_logit_error", max_abs_logit_error},
          {"mean_abs_logit_error", mean_abs_logit_error},
          {"largest_abs_logit", logit_range},
          {"greedy_positions", greedy_positions},
          {"greedy_agreed", greedy_agreed},
          {"identical_continuations", identical_continuations},
          {"mean_first_divergence", mean_first_divergence}};
}

}  // namespace tophat
