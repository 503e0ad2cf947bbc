#include "models/runtime/compute_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/gemv.h"

namespace tophat {
namespace {

// OpenBLAS is reached through the dynamic symbol table rather than linked: only a LibTorch
// built against it (Debian's, say) loads it, and only OpenBLAS has these entry points.
template <typename Fn>
Fn OpenBlasFunction(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// The number LibTorch's own report gives after `key` ("mkl_get_max_threads() : 2"), or -1.
// MKL is linked into libtorch_cpu without exporting its symbols, so this is the one way to
// read the count that at::set_num_threads gave it.
int ParallelInfoCount(const std::string& info, const std::string& key) {
  const size_t at = info.find(key);
  if (at == std::string::npos) return -1;
  const size_t colon = info.find(':', at + key.size());
  const size_t end = info.find('\n', colon);
  int count = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(info.substr(colon + 1, end == std::string::npos ? end : end - colon - 1),
                        &count)) {
    return -1;
  }
  return count;
}

}  // namespace

absl::Status SetComputeThreads(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute_threads must be 0 (one per core) or positive, got ", threads));
  }
  kernels::SetSingleRowThreads(threads);  // 0: one per core
  if (threads == 0) return absl::OkStatus();
  // OpenMP's pool (one runtime: the kernels link LibTorch's libgomp) and MKL's count.
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = OpenBlasFunction<SetThreads>("openblas_set_num_threads")) set(threads);
  return absl::OkStatus();
}

int BlasThreads() {
  using GetThreads = int (*)();
  if (auto get = OpenBlasFunction<GetThreads>("openblas_get_num_threads")) return get();
  const std::string info = at::get_parallel_info();
  if (const int mkl = ParallelInfoCount(info, "mkl_get_max_threads()"); mkl >= 0) return mkl;
  // NVPL (PyTorch's aarch64 wheel) and other OpenMP BLAS libraries run on OpenMP's pool.
  return std::max(0, ParallelInfoCount(info, "omp_get_max_threads()"));
}

}  // namespace tophat
