#include "models/runtime/gemm_tactics.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/small_batch_gemm.h"

#ifdef TOPHAT_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tophat {

uint32_t SmallBatchRowsMask(std::span<const double> kernel_seconds,
                            std::span<const double> blas_seconds, double margin) {
  uint32_t mask = 0;
  const size_t rows = std::min({kernel_seconds.size(), blas_seconds.size(), size_t{31}});
  for (size_t i = 0; i < rows; ++i) {
    const double kernel = kernel_seconds[i];
    const double blas = blas_seconds[i];
    if (kernel > 0 && blas > 0 && kernel <= (1.0 - margin) * blas) mask |= 1u << (i + 1);
  }
  return mask;
}

std::vector<int64_t> SmallBatchRows(uint32_t mask) {
  std::vector<int64_t> rows;
  for (int64_t r = 1; r < 32; ++r) {
    if ((mask >> r) & 1u) rows.push_back(r);
  }
  return rows;
}

absl::StatusOr<SmallBatchTimings> TimeSmallBatchGemm(std::span<const at::Tensor> weights,
                                                     std::span<const at::Tensor> biases,
                                                     int64_t max_rows) {
  if (weights.empty() || (!biases.empty() && biases.size() != weights.size())) {
    return absl::InvalidArgumentError(absl::StrCat("small-batch GEMM timings: ", weights.size(),
                                                   " weights and ", biases.size(), " biases"));
  }
#ifdef TOPHAT_HAVE_CUDA
  const at::Tensor& weight = weights.front();
  if (!weight.is_cuda()) {
    return absl::UnimplementedError("small-batch GEMM timings need a CUDA tensor");
  }
  for (const at::Tensor& w : weights) {
    if (w.sizes() != weight.sizes() || w.device() != weight.device() ||
        w.scalar_type() != weight.scalar_type()) {
      return absl::InvalidArgumentError("small-batch GEMM timings: weights of several shapes");
    }
  }
  if (max_rows < 1 || max_rows > kernels::kSmallBatchGemmMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("max_rows ", max_rows, " outside [1, ",
                                                   kernels::kSmallBatchGemmMaxRows, "]"));
  }
  constexpr size_t kLaunches = 20;
  constexpr int kReplays = 3;
  SmallBatchTimings timings;
  absl::Status status = CatchExceptions("timing the small-batch GEMM", [&] {
    const int64_t n = weight.size(0);
    const int64_t k = weight.size(1);
    const at::Tensor x = at::randn({max_rows, k}, weight.options());
    at::Tensor out = at::empty({max_rows, n}, weight.options());
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    c10::cuda::getCurrentCUDAStream().synchronize();
    c10::cuda::CUDAStreamGuard guard(side);
    // One launch of a path on `rows` rows with the i-th weight (cycling); false when the
    // kernel does not take them.
    auto run = [&](bool kernel, int64_t rows, size_t i) {
      const at::Tensor& w = weights[i % weights.size()];
      const at::Tensor bias = biases.empty() ? at::Tensor() : biases[i % biases.size()];
      const at::Tensor xr = x.narrow(0, 0, rows);
      at::Tensor o = out.narrow(0, 0, rows);
      if (kernel) return kernels::SmallBatchGemmOut(xr, w, bias, o);
      if (bias.defined()) {
        at::addmm_out(o, bias, xr, w.t());
      } else {
        at::mm_out(o, xr, w.t());
      }
      return true;
    };
    // Seconds per launch: the best of kReplays replays of a graph of kLaunches launches.
    auto time = [&](bool kernel, int64_t rows) -> double {
      if (!run(kernel, rows, 0)) return -1;  // eager first: cuBLAS's workspace, module load
      at::cuda::CUDAGraph graph;
      graph.capture_begin();
      try {
        for (size_t i = 0; i < kLaunches; ++i) run(kernel, rows, i);
      } catch (...) {
        // End the capture before the error leaves: a pool stream left capturing would fail
        // whoever is handed it next.
        try {
          graph.capture_end();
        } catch (...) {
        }
        throw;
      }
      graph.capture_end();
      graph.replay();
      side.synchronize();
      double best = std::numeric_limits<double>::infinity();
      for (int r = 0; r < kReplays; ++r) {
        const auto start = std::chrono::steady_clock::now();
        graph.replay();
        side.synchronize();
        best = std::min(best, std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - start).count());
      }
      return best / kLaunches;
    };
    for (int64_t rows = 1; rows <= max_rows; ++rows) {
      timings.kernel_seconds.push_back(time(true, rows));
      timings.blas_seconds.push_back(time(false, rows));
    }
  });
  if (!status.ok()) return absl::InternalError(status.message());
  if (!timings.kernel_seconds.empty() && timings.kernel_seconds.front() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the small-batch GEMM does not take a ",
                     c10::toString(weight.scalar_type()), " [", weight.size(0), ", ",
                     weight.size(1), "] weight"));
  }
  return timings;
#else
  (void)max_rows;
  return absl::UnimplementedError("this build has no CUDA kernels");
#endif
}

}  // namespace tophat
