#include "models/runtime/gemm_tactics.h"

#include <catch2/catch.hpp>
#include <string_view>
#include <vector>

#include "kernels/small_batch_gemm.h"
#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"
#include "base/test_util.h"

namespace tophat {
namespace {

TEST_CASE("The small-batch kernel is taken only for row counts where it was faster by the "
          "margin",
          "[gemm_tactics]") {
  // Rows 1..5: clearly faster, a near tie inside the margin, a tie, slower, not taken (-1).
  const std::vector<double> kernel = {5e-6, 9.8e-6, 10e-6, 12e-6, -1};
  const std::vector<double> blas = {10e-6, 10e-6, 10e-6, 10e-6, 10e-6};
  CHECK(SmallBatchRowsMask(kernel, blas) == 0b10u);
  CHECK(SmallBatchRowsMask(kernel, blas, /*margin=*/0.0) == 0b1110u);  // "at most": the tie too
  CHECK(SmallBatchRowsMask(kernel, blas, /*margin=*/0.5) == 0b10u);
  // Unequal lengths: only rows both have.
  CHECK(SmallBatchRowsMask(std::vector<double>{1e-6, 1e-6}, std::vector<double>{2e-6}) == 0b10u);
  CHECK(SmallBatchRowsMask({}, {}) == 0u);
  CHECK(SmallBatchRows(0b1010u) == std::vector<int64_t>{1, 3});
  CHECK(SmallBatchRows(0x1feu) == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(SmallBatchRows(0u).empty());
}

TEST_CASE("The small-batch GEMM's setting is measured, always or never", "[gemm_tactics]") {
  using Mode = SubmodelOptions::SmallBatchGemm;
  CHECK(*ParseSmallBatchGemm("measured", "k") == Mode::kMeasured);
  CHECK(*ParseSmallBatchGemm("always", "k") == Mode::kAlways);
  CHECK(*ParseSmallBatchGemm("never", "k") == Mode::kNever);
  const auto bad = ParseSmallBatchGemm("Never", "small_batch_gemm");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "small_batch_gemm: \"Never\" is none of \"measured\", \"always\", \"never\"");
}

TEST_CASE("Off a GPU nothing takes the small-batch kernel, whatever the option says",
          "[gemm_tactics]") {
  const at::Tensor x = at::randn({2, 64}).to(at::kBFloat16);
  const at::Tensor weight = at::randn({32, 64}).to(at::kBFloat16);
  at::Tensor out = at::empty({2, 32}, at::kBFloat16);
  CHECK_FALSE(kernels::SmallBatchGemmOut(x, weight, {}, out));
  at::Tensor activated = at::zeros({2, 16}, at::kBFloat16);
  CHECK_FALSE(kernels::SmallBatchGemmSwiGluOut(x, weight, activated));
  CHECK(activated.eq(0).all().item<bool>());
  at::Tensor keys = at::zeros({4, 1, 8}, at::kBFloat16);
  at::Tensor values = at::zeros({4, 1, 8}, at::kBFloat16);
  at::Tensor q = at::zeros({2, 2, 8}, at::kBFloat16);
  CHECK_FALSE(kernels::SmallBatchGemmRotaryQkvToCache(
      x, weight, {}, at::ones({2, 4}), at::zeros({2, 4}), 2, 1, 8, keys, values,
      at::arange(2, at::kLong), q));
  CHECK(q.eq(0).all().item<bool>());
  const std::vector<at::Tensor> weights = {weight};
  const absl::StatusOr<SmallBatchTimings> timings = TimeSmallBatchGemm(weights, {}, 4);
  REQUIRE_FALSE(timings.ok());
  CHECK(timings.status().code() == absl::StatusCode::kUnimplemented);
  // Weights and biases that do not pair are refused before anything runs.
  const std::vector<at::Tensor> two_biases = {at::zeros({32}), at::zeros({32})};
  CHECK(TimeSmallBatchGemm(weights, two_biases, 4).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(TimeSmallBatchGemm({}, {}, 4).status().code() == absl::StatusCode::kInvalidArgument);
  // So is a fused form whose layout the weights do not have: 32 rows are 2 heads and 1 KV
  // head of 8 ((2 + 2) x 8), not 2 heads and 2 KV heads; SwiGLU takes no bias.
  using Epilogue = SmallBatchEpilogue;
  const Epilogue rotary{.kind = Epilogue::Kind::kRotaryQkv, .heads = 2, .kv_heads = 1,
                        .head_dim = 8};
  CHECK(TimeSmallBatchGemm(weights, {}, 4, rotary).status().code() ==
        absl::StatusCode::kUnimplemented);
  Epilogue wrong = rotary;
  wrong.kv_heads = 2;
  const absl::Status refused = TimeSmallBatchGemm(weights, {}, 4, wrong).status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.message().find("do not lay out 32 qkv rows") != std::string_view::npos);
  wrong = {.kind = Epilogue::Kind::kRotaryQkv, .heads = 4, .kv_heads = 0, .head_dim = 8};
  CHECK(TimeSmallBatchGemm(weights, {}, 4, wrong).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const Epilogue swiglu{.kind = Epilogue::Kind::kSwiGlu};
  CHECK(TimeSmallBatchGemm(weights, {}, 4, swiglu).status().code() ==
        absl::StatusCode::kUnimplemented);
  const std::vector<at::Tensor> one_bias = {at::zeros({32})};
  CHECK(TimeSmallBatchGemm(weights, one_bias, 4, swiglu).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const std::vector<at::Tensor> odd = {at::randn({33, 64}).to(at::kBFloat16)};
  CHECK(TimeSmallBatchGemm(odd, {}, 4, swiglu).status().code() ==
        absl::StatusCode::kInvalidArgument);

  const ModelConfig config = TinyTestConfig();
  testing::TempDir dir;
  REQUIRE(WriteCheckpoint(config, InitWeights(config, 3), dir.path()).ok());
  auto checkpoint = CheckpointReader::Open(dir.path());
  REQUIRE(checkpoint.ok());
  auto model = Submodel::Load(config, **checkpoint, SubmodelSpec::Full(config),
                              {.dtype = at::kBFloat16,
                               .small_batch_gemm = SubmodelOptions::SmallBatchGemm::kAlways});
  REQUIRE(model.ok());
  for (const DecoderLayerWeights& w : (*model)->layers()) {
    for (const WeightMatrix* m : {&w.qkv, &w.o_proj, &w.gate_up, &w.down}) {
      CHECK(m->small_batch_rows == 0u);
    }
  }
}

}  // namespace
}  // namespace tophat
