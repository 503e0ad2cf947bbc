#include "kernels/gemv_int8.h"

#include <catch2/catch.hpp>

#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

// The reference: LibTorch's float32 product with the dequantized matrix.
at::Tensor Reference(const at::Tensor& x, const Int8Matrix& w, const at::Tensor& bias = {}) {
  return bias.defined() ? at::linear(x, w.Dequantize(), bias) : at::linear(x, w.Dequantize());
}

TEST_CASE("Per-row int8 quantization is within half a step of every weight, and exact on "
          "the row's largest",
          "[kernels]") {
  at::manual_seed(3);
  at::Tensor w = testing::UniformInputs({37, 300});
  w[5].zero_();  // a row of zeros keeps zeros
  const Int8Matrix q = QuantizeInt8PerRow(w);
  REQUIRE(q.values.scalar_type() == at::kChar);
  REQUIRE(q.values.sizes() == w.sizes());
  REQUIRE(q.scale.sizes() == at::IntArrayRef{37});
  CHECK(q.values.abs().max().item<int>() == 127);
  const at::Tensor error = (q.Dequantize() - w).abs();
  CHECK((error <= q.scale.view({-1, 1}) / 2 + 1e-6).all().item<bool>());
  CHECK(q.scale[5].item<float>() == 0.0f);
  CHECK(at::equal(q.Dequantize()[5], w[5]));
  // bfloat16 weights quantize the same way: within half a step of the bfloat16 values.
  const at::Tensor w_bf16 = w.to(at::kBFloat16).to(at::kFloat);
  const Int8Matrix from_bf16 = QuantizeInt8PerRow(w.to(at::kBFloat16));
  CHECK(((from_bf16.Dequantize() - w_bf16).abs() <= from_bf16.scale.view({-1, 1}) / 2 + 1e-6)
            .all()
            .item<bool>());
}

TEST_CASE("The int8 kernel matches LibTorch on the dequantized matrix, every instruction set, "
          "for one row and a few",
          "[kernels]") {
  at::manual_seed(4);
  // Rows around the four-row blocks and the thread split; widths around the vector steps
  // (8, 16, 32 values) and the prefetch distance; x rows 1 (decode) to the kernel's most.
  // Each shape's inputs and reference are made once for every instruction set: under the
  // aarch64 emulator they cost more than the kernels.
  for (int64_t n : {1, 3, 4, 7, 300, 2305}) {
    for (int64_t k : {1, 13, 31, 64, 100, 768, 2100}) {
      for (int64_t m : {int64_t{1}, int64_t{3}, kInt8KernelMaxRows}) {
        // The largest shapes once per x-row count that keeps the plain loops quick (the
        // aarch64 tests run under an emulator).
        if (n * k * m > 20'000'000) continue;
        const Int8Matrix w = QuantizeInt8PerRow(testing::UniformInputs({n, k}));
        const at::Tensor x = testing::UniformInputs({m, k});
        const at::Tensor b = testing::UniformInputs({n});
        const at::Tensor expected = Reference(x, w);
        const at::Tensor expected_with_bias = expected + b;
        for (CpuIsa isa : SupportedCpuIsas()) {
          INFO(CpuIsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
          // Sums of up to 2100 float32 products in another order than BLAS's: an absolute
          // tolerance of 1e-3 on results of magnitude ~sqrt(k); a wrong value or scale is off
          // by far more.
          CHECK(at::allclose(LinearInt8WithIsa(isa, x, w), expected, 1e-4, 1e-3));
          CHECK(at::allclose(LinearInt8WithIsa(isa, x, w, b), expected_with_bias, 1e-4, 1e-3));
        }
      }
    }
  }
}

TEST_CASE("Many rows, strided rows and row blocks of an int8 matrix compute the same product",
          "[kernels]") {
  at::manual_seed(5);
  const Int8Matrix w = QuantizeInt8PerRow(testing::UniformInputs({301, 900}));
  // More rows than the kernel takes: dequantized, BLAS; a tall matrix takes several blocks
  // of rows (4 MiB of float32 each: 1165 rows of 900).
  const at::Tensor many = testing::UniformInputs({kInt8KernelMaxRows + 1, 900});
  CHECK(at::allclose(LinearInt8(many, w), Reference(many, w), 1e-4, 1e-4));
  const Int8Matrix tall = QuantizeInt8PerRow(testing::UniformInputs({3000, 900}));
  const at::Tensor tall_bias = testing::UniformInputs({3000});
  CHECK(at::allclose(LinearInt8(many, tall, tall_bias), Reference(many, tall, tall_bias), 1e-4,
                     1e-3));
  // x rows with a row stride (a narrow of a wider buffer).
  const at::Tensor wide_x = testing::UniformInputs({4, 1000}).narrow(1, 0, 900);
  REQUIRE(wide_x.stride(0) == 1000);
  CHECK(at::allclose(LinearInt8(wide_x, w), Reference(wide_x, w), 1e-4, 1e-4));
  // Into an output buffer, with a bias.
  const at::Tensor x = testing::UniformInputs({1, 900});
  const at::Tensor bias = testing::UniformInputs({301});
  at::Tensor out = at::empty({1, 301});
  LinearInt8Out(x, w, bias, out);
  CHECK(at::allclose(out, Reference(x, w, bias), 1e-4, 1e-4));
}

TEST_CASE("The bfloat16-weight kernel is LibTorch's float32 product with the bfloat16 matrix, "
          "every instruction set, one row to many",
          "[kernels]") {
  at::manual_seed(7);
  for (int64_t n : {1, 5, 300, 2305}) {
    for (int64_t k : {1, 13, 64, 100, 2100}) {
      for (int64_t m : {int64_t{1}, int64_t{3}, kInt8KernelMaxRows}) {
        if (n * k * m > 20'000'000) continue;  // as above, and so are the shared inputs
        const at::Tensor w = testing::UniformInputs({n, k}).to(at::kBFloat16);
        const at::Tensor x = testing::UniformInputs({m, k});
        const at::Tensor b = testing::UniformInputs({n});
        const at::Tensor expected = at::linear(x, w.to(at::kFloat), b);
        for (CpuIsa isa : SupportedCpuIsas()) {
          INFO(CpuIsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
          CHECK(at::allclose(LinearBf16WithIsa(isa, x, w, b), expected, 1e-4, 1e-3));
        }
      }
    }
  }
  // More rows than the kernel takes: BLAS on float32 blocks of the matrix.
  const at::Tensor tall = testing::UniformInputs({3000, 900}).to(at::kBFloat16);
  const at::Tensor many = testing::UniformInputs({kInt8KernelMaxRows + 1, 900});
  CHECK(at::allclose(LinearBf16(many, tall), at::linear(many, tall.to(at::kFloat)), 1e-4, 1e-3));
}

TEST_CASE("Stacked int8 matrices and looked-up rows dequantize as their parts do",
          "[kernels]") {
  at::manual_seed(6);
  const Int8Matrix a = QuantizeInt8PerRow(testing::UniformInputs({5, 64}));
  const Int8Matrix b = QuantizeInt8PerRow(testing::UniformInputs({3, 64}));
  const Int8Matrix ab = ConcatRows({a, b});
  CHECK(at::equal(ab.Dequantize(), at::cat({a.Dequantize(), b.Dequantize()})));
  const at::Tensor ids = at::tensor({7, 0, 7, 2}, at::kLong);
  CHECK(at::equal(GatherRowsInt8(ab, ids), ab.Dequantize().index_select(0, ids)));
}

}  // namespace
}  // namespace tophat::kernels
