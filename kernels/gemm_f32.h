// A prompt's float32 rows against float32, bfloat16 or int8 weights, on CPUs where LibTorch's BLAS
// leaves AVX-512 unused.
//
// Why: PyTorch's x86 builds multiply float32 matrices with MKL, and on an AMD CPU MKL runs
// its AVX2 sgemm (`mkl_blas_def_sgemm_kernel_0_zen` in a profile) even where the core has
// AVX-512: half the multiply-adds an instruction. On this project's 2-vCPU AMD EPYC VM a
// float32 prompt ran at 0.61-0.67x llama.cpp's (docs/benchmarks.md, "Against llama.cpp
// again"), whose own kernels use AVX-512.
//
// How: the weights are repacked a panel of kF32GemmPanel rows and kF32GemmChunk columns at a
// time, transposed so that one k's 48 weights are three vectors (bfloat16 widened exactly as
// they are packed); a tile of 8 x rows by those 48 weight rows is 24 accumulators, each x
// value broadcast from memory into three multiply-adds. A chunk of the panel (24 KiB) stays
// in L1 while every tile of x passes.
//
// What it computes: the float32 product, each output a chain of multiply-adds over k in
// order, so a row's result is the same bits whatever rows come with it (BLAS's need not be);
// it differs from BLAS's by the order of the sums.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace tophat::kernels {

inline constexpr int64_t kF32GemmPanel = 48;
inline constexpr int64_t kF32GemmChunk = 128;
// Fewer rows than this keep BLAS (or the few-row kernels): repacking each panel costs about
// one row's multiply-adds.
inline constexpr int64_t kF32GemmMinRows = 32;

// Whether float32 prompts take the kernel on this CPU: AVX-512F with FMA on an AMD CPU.
// TOPHAT_F32_PROMPT_KERNEL=on or off in the environment overrides the choice (measurements;
// "on" needs AVX-512F).
bool F32PromptKernelChosen();

// x: [M, K] float32 CPU, unit column stride; weight: [N, K] float32, bfloat16 or int8 CPU,
// unit column stride (int8 with row_scale [N] float32: each value times its row's scale as it
// is packed, the float32 of Int8Matrix::Dequantize); bias: [N] float32 or undefined; out:
// [M, N] float32 contiguous. Returns whether it computed out (false, nothing written: inputs
// it does not take, or a CPU without AVX-512F). Threads over panels (ATen's pool); per-thread
// buffers grow once.
bool LinearF32PromptOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::Tensor& out, const at::Tensor& row_scale = {});

// LinearF32PromptOut where this CPU chooses the kernel (F32PromptKernelChosen) and x has at
// least kF32GemmMinRows rows: the prompt path of the float32, int8 and bfloat16 linear layers
// (models/runtime/submodel.cc, LinearInt8Out, LinearBf16Out). Returns whether it computed out.
bool LinearF32PromptIfChosenOut(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& bias, at::Tensor& out,
                                const at::Tensor& row_scale = {});

// bfloat16 products for bfloat16 weights (SubmodelOptions.bf16_activations): each row of x
// rounded to bfloat16 (to nearest even) as it enters, then multiplied with AVX512_BF16's
// vdpbf16ps, two products a lane an instruction summed into float32: twice the float32
// kernel's multiply-adds an instruction, as llama.cpp's BF16 computes. The product of the
// rounded x with the bfloat16 matrix, each product exact and the sums float32 (in pairs, in k
// order), so a row's result does not depend on the rows beside it. Panels and tiles as
// LinearF32PromptOut's. Whether this CPU has AVX512_BF16 (with AVX-512F):
bool Bf16PromptKernelAvailable();
// x: [M, K] float32 CPU, unit column stride; weight: [N, K] bfloat16, unit column stride;
// bias: [N] float32 or undefined; out: [M, N] float32 contiguous. Returns whether it computed
// out (false, nothing written: inputs it does not take, or no AVX512_BF16).
bool LinearBf16PromptOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         at::Tensor& out);

}  // namespace tophat::kernels
