// The *Out variants the decode step writes into its buffers with: the same values as the
// allocating forms, in the caller's storage, also where they fall back to composite ops.
#include <catch2/catch.hpp>

#include "kernels/decode_attention.h"
#include "kernels/gemv.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace tophat::kernels {
namespace {

TEST_CASE("Out variants write the allocating forms' values into the given storage",
          "[kernels][out]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {  // fused, then composite
    INFO("dtype " << c10::toString(dtype));
    const at::TensorOptions options = at::TensorOptions().dtype(dtype);
    const at::Tensor x = at::randn({3, 16}, options);
    const at::Tensor weight = at::randn({16}, options);

    at::Tensor norm = at::empty({3, 16}, options);
    const void* storage = norm.data_ptr();
    RmsNormOut(x, weight, 1e-5, norm);
    CHECK(norm.data_ptr() == storage);
    CHECK(at::allclose(norm, RmsNorm(x, weight, 1e-5)));

    at::Tensor residual = x.clone();
    at::Tensor residual_ref = x.clone();
    const at::Tensor delta = at::randn({3, 16}, options);
    AddRmsNormOut(residual, delta, weight, 1e-5, norm);
    CHECK(norm.data_ptr() == storage);
    CHECK(at::allclose(norm, AddRmsNorm(residual_ref, delta, weight, 1e-5)));
    CHECK(at::allclose(residual, residual_ref));

    const at::Tensor qk = at::randn({3, 2, 8}, options);
    const at::Tensor cos = at::rand({3, 4});
    const at::Tensor sin = at::rand({3, 4});
    at::Tensor rotated = at::empty({3, 2, 8}, options);
    RotaryEmbeddingOut(qk, cos, sin, rotated);
    CHECK(at::allclose(rotated, RotaryEmbedding(qk, cos, sin)));

    const at::Tensor gate_up = at::randn({3, 16}, options);
    at::Tensor activated = at::empty({3, 8}, options);
    SwiGluOut(gate_up, activated);
    CHECK(at::allclose(activated, SwiGlu(gate_up)));

    const at::Tensor row = at::randn({1, 16}, options);
    const at::Tensor matrix = at::randn({8, 16}, options);
    const at::Tensor bias = at::randn({8}, options);
    at::Tensor projected = at::empty({1, 8}, options);
    LinearSingleRowOut(row, matrix, bias, projected);
    CHECK(at::allclose(projected, at::linear(row, matrix, bias), 1e-4, 1e-5));
  }
}

}  // namespace
}  // namespace tophat::kernels
