// The small-batch GEMM (kernels/small_batch_gemm.h) against float64 (label `gpu`; skipped
// without a device).
#include "kernels/small_batch_gemm.h"

#include <catch2/catch.hpp>

#include "kernels/decode_attention.h"  // SwiGluOut
#include "kernels/rope.h"              // RotaryQkvToCache
#include "kernels/small_batch_gemm_cuda.cuh"

namespace tophat::kernels {
namespace {

const at::Device kCuda(at::kCUDA, 0);

// One rounding of a float32 result to the storage dtype, relative to the output's scale,
// plus float32 summation over K terms.
double Tolerance(at::ScalarType dtype) { return dtype == at::kHalf ? 2e-3 : 1.6e-2; }

TEST_CASE("The small-batch GEMM computes x times the weights' transpose for 1-8 rows",
          "[gpu][kernels]") {
  at::manual_seed(5);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    // Shapes: a row count that is not a multiple of the block's 8 rows, K that is not a
    // multiple of a warp's 256 elements a pass, and a Llama-3-8B o_proj.
    for (auto [n, k] : {std::pair<int64_t, int64_t>{13, 8}, {1000, 200}, {4096, 4096}}) {
      for (int64_t rows = 1; rows <= kSmallBatchGemmMaxRows; ++rows) {
        INFO(c10::toString(dtype) << " n " << n << " k " << k << " rows " << rows);
        const at::Tensor weight = at::randn({n, k}).to(kCuda, dtype);
        const at::Tensor bias = at::randn({n}).to(kCuda, dtype);
        // x as rows of a wider buffer (a step buffer's leading rows), out likewise.
        const at::Tensor x_buffer = at::randn({rows, k + 8}).to(kCuda, dtype);
        const at::Tensor x = x_buffer.narrow(1, 0, k);
        at::Tensor out_buffer = at::full({rows, n + 3}, 7.0, x.options());
        at::Tensor out = out_buffer.narrow(1, 0, n);
        for (const bool with_bias : {false, true}) {
          INFO("bias " << with_bias);
          REQUIRE(SmallBatchGemmOut(x, weight, with_bias ? bias : at::Tensor(), out));
          at::Tensor want = at::mm(x.to(at::kDouble), weight.to(at::kDouble).t());
          if (with_bias) want += bias.to(at::kDouble);
          const double error = (out.to(at::kDouble) - want).abs().max().item<double>();
          const double scale = want.abs().max().item<double>();
          INFO("max |error| " << error << " of " << scale);
          CHECK(error <= Tolerance(dtype) * scale);
          // Nothing written past the output's columns.
          CHECK(out_buffer.narrow(1, n, 3).eq(7.0).all().item<bool>());
        }
      }
    }
  }
}

TEST_CASE("The small-batch GEMM leaves what it does not take to BLAS", "[gpu][kernels]") {
  const at::Tensor x = at::randn({2, 64}).to(kCuda, at::kBFloat16);
  const at::Tensor weight = at::randn({32, 64}).to(kCuda, at::kBFloat16);
  at::Tensor out = at::empty({2, 32}, x.options());
  CHECK(SmallBatchGemmOut(x, weight, {}, out));
  // float32, too many rows, K not a multiple of 8, a transposed weight, CPU tensors.
  at::Tensor out32 = at::empty({2, 32}, x.options().dtype(at::kFloat));
  CHECK_FALSE(SmallBatchGemmOut(x.to(at::kFloat), weight.to(at::kFloat), {}, out32));
  const at::Tensor many = at::randn({9, 64}).to(kCuda, at::kBFloat16);
  at::Tensor out_many = at::empty({9, 32}, x.options());
  CHECK_FALSE(SmallBatchGemmOut(many, weight, {}, out_many));
  const at::Tensor odd = at::randn({2, 60}).to(kCuda, at::kBFloat16);
  const at::Tensor odd_weight = at::randn({32, 60}).to(kCuda, at::kBFloat16);
  CHECK_FALSE(SmallBatchGemmOut(odd, odd_weight, {}, out));
  const at::Tensor transposed = at::randn({64, 32}).to(kCuda, at::kBFloat16).t();
  CHECK_FALSE(SmallBatchGemmOut(x, transposed, {}, out));
  at::Tensor out_cpu = at::empty({2, 32}, at::kBFloat16);
  CHECK_FALSE(SmallBatchGemmOut(x.cpu(), weight.cpu(), {}, out_cpu));
  // The SwiGLU form: a weight that is not twice the output's columns.
  at::Tensor half = at::empty({2, 16}, x.options());
  CHECK(SmallBatchGemmSwiGluOut(x, weight, half));
  CHECK_FALSE(SmallBatchGemmSwiGluOut(x, weight, out));
}

TEST_CASE("The small-batch GEMM's SwiGLU form is the GEMM followed by SwiGLU, to the bit",
          "[gpu][kernels]") {
  at::manual_seed(9);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    // Columns not a multiple of the block's 8, K not a multiple of a pass, Llama-3-8B's MLP.
    for (auto [inner, k] : {std::pair<int64_t, int64_t>{13, 8}, {500, 200}, {14336, 4096}}) {
      // Made on the GPU, once for every row count: Llama-3-8B's is 117M values.
      const at::Tensor gate_up =
          (at::randn({2 * inner, k}, at::TensorOptions().device(kCuda)) / 8).to(dtype);
      for (int64_t rows = 1; rows <= kSmallBatchGemmMaxRows; ++rows) {
        INFO(c10::toString(dtype) << " inner " << inner << " k " << k << " rows " << rows);
        const at::Tensor x_buffer = at::randn({rows, k + 8}).to(kCuda, dtype);
        const at::Tensor x = x_buffer.narrow(1, 0, k);
        at::Tensor both = at::empty({rows, 2 * inner}, x.options());
        REQUIRE(SmallBatchGemmOut(x, gate_up, {}, both));
        at::Tensor want = at::empty({rows, inner}, x.options());
        SwiGluOut(both, want);
        at::Tensor out_buffer = at::full({rows, inner + 3}, 7.0, x.options());
        at::Tensor out = out_buffer.narrow(1, 0, inner);
        REQUIRE(SmallBatchGemmSwiGluOut(x, gate_up, out));
        CHECK(at::equal(out, want));
        CHECK(out_buffer.narrow(1, inner, 3).eq(7.0).all().item<bool>());
        // And against float64, as a check of the reference itself.
        const at::Tensor products = at::mm(x.to(at::kDouble), gate_up.to(at::kDouble).t());
        const at::Tensor exact = at::silu(products.narrow(1, 0, inner)) *
                                 products.narrow(1, inner, inner);
        const double error = (out.to(at::kDouble) - exact).abs().max().item<double>();
        const double scale = exact.abs().max().item<double>();
        INFO("max |error| " << error << " of " << scale);
        CHECK(error <= 2 * Tolerance(dtype) * scale);
      }
    }
  }
}

TEST_CASE("The small-batch GEMM's rotary form is the qkv GEMM followed by the rotary cache "
          "write, to the bit",
          "[gpu][kernels]") {
  at::manual_seed(11);
  struct Shape {
    int64_t heads, kv_heads, head_dim, k;
  };
  // An odd small shape (3 pairs a head, one block of 8 items a warp count does not divide),
  // as many KV heads as query heads (no grouping), a head of 80 (Phi's, not a power of two)
  // and Llama-3-8B's.
  for (const Shape& shape : {Shape{3, 1, 6, 24}, Shape{4, 4, 64, 256}, Shape{5, 1, 80, 160},
                             Shape{32, 8, 128, 4096}}) {
    const auto [heads, kv_heads, hd, k] = shape;
    const int64_t n = (heads + 2 * kv_heads) * hd;
    for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      const auto options = at::TensorOptions().device(kCuda).dtype(dtype);
      // Made on the GPU, once for every row count.
      const at::Tensor weight =
          (at::randn({n, k}, at::TensorOptions().device(kCuda)) / 8).to(dtype);
      for (const bool with_bias : {false, true}) {
        for (int64_t rows = 1; rows <= kSmallBatchGemmMaxRows; ++rows) {
          INFO(c10::toString(dtype) << " heads " << heads << "/" << kv_heads << " head_dim "
                                    << hd << " k " << k << " rows " << rows << " bias "
                                    << with_bias);
          const at::Tensor bias = with_bias ? at::randn({n}).to(kCuda, dtype) : at::Tensor();
          // Odd row counts read x as rows of a wider buffer (a row stride of k + 8).
          const at::Tensor x = rows % 2 == 1
                                   ? at::randn({rows, k + 8}).to(kCuda, dtype).narrow(1, 0, k)
                                   : at::randn({rows, k}).to(kCuda, dtype);
          const at::Tensor angles = at::rand({rows, hd / 2}) * 6.28;
          const at::Tensor cos = angles.cos().to(kCuda);
          const at::Tensor sin = angles.sin().to(kCuda);
          // Slots in no order, the last row a padding row (no key or value written).
          const int64_t num_slots = 3 * rows + 2;
          at::Tensor slots = at::randperm(num_slots, at::kLong).narrow(0, 0, rows).clone();
          if (rows > 1) slots[rows - 1] = -1;
          if (rows == 3) slots.fill_(-1);  // every row a padding row: no slot written
          slots = slots.to(kCuda);
          at::Tensor keys_want = at::full({num_slots, kv_heads, hd}, 5.0, options);
          at::Tensor values_want = keys_want.clone();
          at::Tensor q_want = at::full({rows, heads, hd}, 5.0, options);
          at::Tensor qkv = at::empty({rows, n}, options);
          REQUIRE(SmallBatchGemmOut(x, weight, bias, qkv));
          REQUIRE(RotaryQkvToCache(qkv, cos, sin, heads, kv_heads, hd, keys_want, values_want,
                                   slots, q_want));
          at::Tensor keys = at::full_like(keys_want, 5.0);
          at::Tensor values = at::full_like(values_want, 5.0);
          at::Tensor q = at::full_like(q_want, 5.0);
          REQUIRE(SmallBatchGemmRotaryQkvToCache(x, weight, bias, cos, sin, heads, kv_heads, hd,
                                                 keys, values, slots, q));
          CHECK(at::equal(q, q_want));
          CHECK(at::equal(keys, keys_want));  // the untouched slots too
          CHECK(at::equal(values, values_want));
        }
      }
    }
  }
  // What it declines: a head_dim that is odd, a weight of the wrong height.
  const at::Tensor x = at::randn({2, 64}).to(kCuda, at::kBFloat16);
  const at::Tensor weight = at::randn({(4 + 2 * 2) * 8, 64}).to(kCuda, at::kBFloat16);
  const at::Tensor cos = at::ones({2, 4}, at::TensorOptions().device(kCuda));
  at::Tensor keys = at::zeros({6, 2, 8}, x.options());
  at::Tensor values = at::zeros({6, 2, 8}, x.options());
  at::Tensor q = at::zeros({2, 4, 8}, x.options());
  const at::Tensor slots = at::arange(2, at::TensorOptions().device(kCuda).dtype(at::kLong));
  CHECK(SmallBatchGemmRotaryQkvToCache(x, weight, {}, cos, cos, 4, 2, 8, keys, values, slots, q));
  CHECK_FALSE(SmallBatchGemmRotaryQkvToCache(x, weight.narrow(0, 0, 56), {}, cos, cos, 4, 2, 8,
                                             keys, values, slots, q));
  CHECK_FALSE(
      SmallBatchGemmRotaryQkvToCache(x, weight, {}, cos, cos, 4, 2, 7, keys, values, slots, q));
}

}  // namespace
}  // namespace tophat::kernels
