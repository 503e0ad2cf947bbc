#include "models/runtime/gemm_tactics.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/decode_attention.h"  // SwiGluOut
#include "kernels/rope.h"
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
                                                     int64_t max_rows,
                                                     const SmallBatchEpilogue& epilogue) {
  if (weights.empty() || (!biases.empty() && biases.size() != weights.size())) {
    return absl::InvalidArgumentError(absl::StrCat("small-batch GEMM timings: ", weights.size(),
                                                   " weights and ", biases.size(), " biases"));
  }
  using Kind = SmallBatchEpilogue::Kind;
  const at::Tensor& weight = weights.front();
  const int64_t rows_out = weight.dim() == 2 ? weight.size(0) : -1;
  if (epilogue.kind == Kind::kSwiGlu && (rows_out % 2 != 0 || !biases.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "small-batch GEMM timings: the SwiGLU form takes [gate; up] weights of an even row "
        "count and no bias, got ", rows_out, " rows and ", biases.size(), " biases"));
  }
  if (epilogue.kind == Kind::kRotaryQkv &&
      (epilogue.heads < 1 || epilogue.kv_heads < 1 || epilogue.head_dim < 2 ||
       epilogue.head_dim % 2 != 0 ||
       rows_out != (epilogue.heads + 2 * epilogue.kv_heads) * epilogue.head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "small-batch GEMM timings: the rotary form's ", epilogue.heads, " heads, ",
        epilogue.kv_heads, " KV heads of ", epilogue.head_dim, " do not lay out ", rows_out,
        " qkv rows"));
  }
#ifdef TOPHAT_HAVE_CUDA
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
    // The pool stream, the capture and the kernels' launches are the current device's.
    const c10::cuda::CUDAGuard device_guard(weight.device());
    const int64_t n = weight.size(0);
    const int64_t k = weight.size(1);
    const at::Tensor x = at::randn({max_rows, k}, weight.options());
    at::Tensor out = at::empty({max_rows, n}, weight.options());
    // The epilogue's destinations: SwiGLU's output, or the rotary form's tables, queries and
    // a scratch cache with a slot per row.
    const int64_t heads = epilogue.heads;
    const int64_t kv_heads = epilogue.kv_heads;
    const int64_t head_dim = epilogue.head_dim;
    at::Tensor activated;
    at::Tensor cos;
    at::Tensor sin;
    at::Tensor key_slots;
    at::Tensor value_slots;
    at::Tensor slots;
    at::Tensor q;
    if (epilogue.kind == Kind::kSwiGlu) {
      activated = at::empty({max_rows, n / 2}, weight.options());
    } else if (epilogue.kind == Kind::kRotaryQkv) {
      const at::Tensor angles =
          at::rand({max_rows, head_dim / 2}, weight.options().dtype(at::kFloat)) * 6.0;
      cos = angles.cos();
      sin = angles.sin();
      key_slots = at::zeros({max_rows, kv_heads, head_dim}, weight.options());
      value_slots = at::zeros_like(key_slots);
      slots = at::arange(max_rows, weight.options().dtype(at::kLong));
      q = at::empty({max_rows, heads, head_dim}, weight.options());
    }
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    c10::cuda::getCurrentCUDAStream().synchronize();
    c10::cuda::CUDAStreamGuard guard(side);
    // One launch of a path on `rows` rows with the i-th weight (cycling), the epilogue
    // included; false when the kernel (or, on the BLAS path, the epilogue's kernel) does not
    // take them.
    auto run = [&](bool kernel, int64_t rows, size_t i) {
      const at::Tensor& w = weights[i % weights.size()];
      const at::Tensor bias = biases.empty() ? at::Tensor() : biases[i % biases.size()];
      const at::Tensor xr = x.narrow(0, 0, rows);
      at::Tensor o = out.narrow(0, 0, rows);
      auto blas = [&] {
        if (bias.defined()) {
          at::addmm_out(o, bias, xr, w.t());
        } else {
          at::mm_out(o, xr, w.t());
        }
      };
      switch (epilogue.kind) {
        case Kind::kSwiGlu: {
          at::Tensor a = activated.narrow(0, 0, rows);
          if (kernel) return kernels::SmallBatchGemmSwiGluOut(xr, w, a);
          blas();
          kernels::SwiGluOut(o, a);
          return true;
        }
        case Kind::kRotaryQkv: {
          const at::Tensor c = cos.narrow(0, 0, rows);
          const at::Tensor s = sin.narrow(0, 0, rows);
          const at::Tensor row_slots = slots.narrow(0, 0, rows);
          at::Tensor qr = q.narrow(0, 0, rows);
          if (kernel) {
            return kernels::SmallBatchGemmRotaryQkvToCache(xr, w, bias, c, s, heads, kv_heads,
                                                           head_dim, key_slots, value_slots,
                                                           row_slots, qr);
          }
          blas();
          return kernels::RotaryQkvToCache(o, c, s, heads, kv_heads, head_dim, key_slots,
                                           value_slots, row_slots, qr);
        }
        case Kind::kNone:
          break;
      }
      if (kernel) return kernels::SmallBatchGemmOut(xr, w, bias, o);
      blas();
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
        absl::StrCat("the small-batch GEMM", epilogue.kind == Kind::kNone ? "" : "'s fused form",
                     " does not take a ", c10::toString(weight.scalar_type()), " [",
                     weight.size(0), ", ", weight.size(1), "] weight"));
  }
  if (!timings.blas_seconds.empty() && timings.blas_seconds.front() < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the rotary + KV-write kernel does not take a [", weight.size(0), "] qkv row"));
  }
  return timings;
#else
  (void)max_rows;
  return absl::UnimplementedError("this build has no CUDA kernels");
#endif
}

}  // namespace tophat
