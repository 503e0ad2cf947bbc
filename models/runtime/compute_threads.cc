#include "models/runtime/compute_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "kernels/gemv.h"

namespace tophat {
namespace {

// OpenBLAS is reached through the dynamic symbol table rather than linked: which BLAS
// LibTorch loads is Debian's alternatives' choice (OpenBLAS, BLIS, reference), and only
// OpenBLAS has these entry points.
template <typename Fn>
Fn OpenBlasFunction(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

absl::Status SetComputeThreads(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute_threads must be 0 (one per core) or positive, got ", threads));
  }
  kernels::SetSingleRowThreads(threads);  // 0: one per core
  if (threads == 0) return absl::OkStatus();
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = OpenBlasFunction<SetThreads>("openblas_set_num_threads")) set(threads);
  return absl::OkStatus();
}

int BlasThreads() {
  using GetThreads = int (*)();
  auto get = OpenBlasFunction<GetThreads>("openblas_get_num_threads");
  return get != nullptr ? get() : 0;
}

}  // namespace tophat
