// Single-row linear layer for decode: y = x W^T (+ bias), x of one row.
//
// Why not at::linear: for one row OpenBLAS sgemm packs (copies) the whole weight matrix
// before multiplying, which reads it twice and reached 11-17 GB/s of a measured 66 GB/s
// here (docs/benchmarks.md). Decode is bound by reading the weights once, so this kernel
// streams each weight row exactly once, in memory order, with rows split across threads.
//
// One binary runs on any CPU of its architecture: the instruction set is chosen at run time
// (AVX-512, AVX2 or plain C++ on x86-64; NEON or plain C++ on aarch64), and
// TOPHAT_CPU_ISA=scalar|avx2|avx512|neon overrides the choice (for measurements; a set this
// CPU lacks falls back to the best it has, with a warning).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tophat::kernels {

enum class CpuIsa { kScalar, kAvx2, kAvx512, kNeon };

std::string_view CpuIsaName(CpuIsa isa);

// The instruction sets this CPU and this build can run, plain C++ first.
const std::vector<CpuIsa>& SupportedCpuIsas();

// The one LinearSingleRow uses: the best supported, unless TOPHAT_CPU_ISA names another.
CpuIsa SelectedCpuIsa();

// The kernels' *WithIsa entry points (tests) run a named instruction set: fails, naming it
// (`name`), unless it is among `supported`.
template <typename Isa>
void CheckIsaSupported(Isa isa, const std::vector<Isa>& supported, std::string_view name) {
  TORCH_CHECK(std::find(supported.begin(), supported.end(), isa) != supported.end(),
              "this CPU cannot run ", name);
}

// Whether this CPU has bfloat16 arithmetic instructions (x86-64: AVX512_BF16 or AMX-BF16;
// aarch64: the BF16 extension). Without them bfloat16 still computes, through conversions.
bool CpuHasBf16Arithmetic();

// Threads the single-row kernel splits its rows over. Default: one per core this process may
// run on, as Linux's topology counts them (CoresForCompute). Decode is bound by memory
// bandwidth, which one core cannot draw alone, so the kernel uses every core even where
// LibTorch's own pool is smaller: LibTorch counts cores from CPUID's SMT fields, which some
// hypervisors fill in as if two vCPUs were one core's two threads (a 2-vCPU AMD EPYC VM:
// LibTorch chose one thread and decode ran at 36-44% of the two-core bandwidth bound, issue
// 15), while Linux's sysfs topology, which its scheduler uses, said two cores.
int SingleRowThreads();

// Thread t's share of n rows among `count` threads: a static contiguous block, a multiple
// of four rows (the kernels' row blocks) except at the end. ParallelRowBlocks and the decode
// step (kernels/decode_step.h) split rows so.
std::pair<int64_t, int64_t> RowBlockShare(int64_t n, int t, int count);

// Runs rows(begin, end) on `threads` OpenMP threads (1: on this one), each given a static
// contiguous block of [0, n), a multiple of four rows (the kernels' row blocks), so that
// each thread streams its own slice of a matrix.
void ParallelRowBlocks(int64_t n, int threads, absl::FunctionRef<void(int64_t, int64_t)> rows);
void SetSingleRowThreads(int threads);  // <= 0 restores the default

// The cores this process may run on: CPUs of its affinity mask, counted once per core as
// Linux's topology groups them (SMT siblings are one core); the affinity mask's CPU count
// when the topology files cannot be read.
int CoresForCompute();

// x: [1, K] float32 CPU (any strides); weight: [N, K] float32 CPU whose rows are contiguous
// (row stride >= K, so a slice of a wider matrix is read in place); bias: [N] or undefined.
// Returns [1, N]. Other dtypes/devices/shapes fall back to at::linear.
at::Tensor LinearSingleRow(const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias = {});

// The same into `out` ([1, N], x's dtype and device); allocates nothing when the inputs fit
// the kernel and `out` is contiguous float32 (the decode step's buffers), else copies
// at::linear's result into it.
void LinearSingleRowOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::Tensor& out);

// A few rows of x ([R, K], 2 <= R <= kFewRowsMax, float32 CPU, contiguous) against the same
// weight as LinearSingleRowOut takes, into `out` ([R, N] contiguous float32): the weight is read
// from memory once for all R rows. Each thread takes its share of the weight's rows, as the
// single-row kernel does, and walks it in blocks small enough to stay in its core's cache
// while every x row passes over the block. Output row r is bit for bit the single-row
// kernel's for x row r, whatever R (the blocks start at multiples of four rows).
// Where BLAS multiplies a handful of rows it packs the whole weight first, reading it twice
// and then some: a mixture of experts' expert with two or three routed rows, a speculative
// verification chunk. False (nothing written) where the inputs do not fit, or where the
// environment sets TOPHAT_FEW_ROWS=off (measurements): the caller multiplies otherwise.
inline constexpr int64_t kFewRowsMax = 8;
bool LinearFewRowsOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      at::Tensor& out);

// Rows [r0, r1) of y = W x for one row x of k floats, on the calling thread (no OpenMP
// inside): the kernel LinearSingleRow runs on each thread's share, for callers that split
// the rows over threads of their own (kernels/decode_step.h). w: rows of k floats, ldw
// apart; y: indexed by row. A row's value does not depend on r0 and r1 when they are
// multiples of four (the kernel's row blocks).
void LinearRowsFloat32(const float* w, int64_t ldw, const float* x, float* y, int64_t k,
                       int64_t r0, int64_t r1);

// The same with a named instruction set, which must be in SupportedCpuIsas() (tests).
at::Tensor LinearSingleRowWithIsa(CpuIsa isa, const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& bias = {});

// Copies `t` into memory backed by transparent huge pages (2 MiB, MADV_HUGEPAGE), which
// read ~25% faster than 4 KiB pages when streamed (fewer TLB misses). Returns `t` itself for
// non-CPU tensors or when the mapping fails.
at::Tensor CopyToHugePages(const at::Tensor& t);

}  // namespace tophat::kernels
