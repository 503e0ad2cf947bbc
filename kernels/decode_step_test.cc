#include "kernels/decode_step.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/gemv_int8.h"
#include "kernels/gemv_w8a8.h"

namespace tophat::kernels {
namespace {

constexpr DecodeShape kShape{.hidden = 64, .heads = 4, .kv_heads = 2, .head_dim = 16,
                             .intermediate = 96, .eps = 1e-5f};
constexpr int64_t kBlockSize = 8;
constexpr int64_t kBlocks = 3;

// One layer's weights as tensors (float32, or int8 / bfloat16 forms of the same matrices)
// and its K/V blocks [kBlocks, kBlockSize, kv_heads, head_dim].
struct LayerTensors {
  at::Tensor input_norm, post_norm, qkv_bias, o_bias;
  at::Tensor qkv, o_proj, gate_up, down;  // float32
  Int8Matrix qkv8, o_proj8, gate_up8, down8;
  at::Tensor qkv16, o_proj16, gate_up16, down16;  // bfloat16
  at::Tensor keys, values;
};

LayerTensors MakeLayer(int64_t seed) {
  at::manual_seed(seed);
  const int64_t q = kShape.heads * kShape.head_dim;
  const int64_t kv = kShape.kv_heads * kShape.head_dim;
  LayerTensors t;
  t.input_norm = 1.0f + 0.1f * at::randn({kShape.hidden});
  t.post_norm = 1.0f + 0.1f * at::randn({kShape.hidden});
  t.qkv_bias = 0.1f * at::randn({q + 2 * kv});
  t.o_bias = 0.1f * at::randn({kShape.hidden});
  t.qkv = 0.2f * at::randn({q + 2 * kv, kShape.hidden});
  t.o_proj = 0.2f * at::randn({kShape.hidden, q});
  t.gate_up = 0.2f * at::randn({2 * kShape.intermediate, kShape.hidden});
  t.down = 0.2f * at::randn({kShape.hidden, kShape.intermediate});
  t.qkv8 = QuantizeInt8PerRow(t.qkv);
  t.o_proj8 = QuantizeInt8PerRow(t.o_proj);
  t.gate_up8 = QuantizeInt8PerRow(t.gate_up);
  t.down8 = QuantizeInt8PerRow(t.down);
  t.qkv16 = t.qkv.to(at::kBFloat16);
  t.o_proj16 = t.o_proj.to(at::kBFloat16);
  t.gate_up16 = t.gate_up.to(at::kBFloat16);
  t.down16 = t.down.to(at::kBFloat16);
  t.keys = at::randn({kBlocks, kBlockSize, kShape.kv_heads, kShape.head_dim});
  t.values = at::randn({kBlocks, kBlockSize, kShape.kv_heads, kShape.head_dim});
  return t;
}

RowMatrix Float32Rows(const at::Tensor& w) {
  return {.kind = RowMatrix::Kind::kFloat32, .values = w.data_ptr(), .rows = w.size(0),
          .cols = w.size(1), .row_stride = w.stride(0)};
}
RowMatrix Bf16Rows(const at::Tensor& w) {
  return {.kind = RowMatrix::Kind::kBfloat16, .values = w.data_ptr(), .rows = w.size(0),
          .cols = w.size(1), .row_stride = w.stride(0)};
}
RowMatrix Int8Rows(const Int8Matrix& w, bool activations) {
  return {.kind = activations ? RowMatrix::Kind::kInt8Activations : RowMatrix::Kind::kInt8,
          .values = w.values.data_ptr(), .scale = w.scale.data_ptr<float>(), .rows = w.rows(),
          .cols = w.cols(), .row_stride = w.values.stride(0)};
}

enum class Form { kFloat32, kBfloat16, kInt8, kInt8Activations };

DecodeLayer LayerOf(LayerTensors& t, Form form) {
  DecodeLayer layer{.input_norm = t.input_norm.data_ptr<float>(),
                    .qkv_bias = t.qkv_bias.data_ptr<float>(),
                    .o_bias = t.o_bias.data_ptr<float>(),
                    .post_norm = t.post_norm.data_ptr<float>(),
                    .keys = KvRowsOf(t.keys),
                    .values = KvRowsOf(t.values)};
  switch (form) {
    case Form::kFloat32:
      layer.qkv = Float32Rows(t.qkv);
      layer.o_proj = Float32Rows(t.o_proj);
      layer.gate_up = Float32Rows(t.gate_up);
      layer.down = Float32Rows(t.down);
      break;
    case Form::kBfloat16:
      layer.qkv = Bf16Rows(t.qkv16);
      layer.o_proj = Bf16Rows(t.o_proj16);
      layer.gate_up = Bf16Rows(t.gate_up16);
      layer.down = Bf16Rows(t.down16);
      break;
    case Form::kInt8:
    case Form::kInt8Activations: {
      const bool activations = form == Form::kInt8Activations;
      layer.qkv = Int8Rows(t.qkv8, activations);
      layer.o_proj = Int8Rows(t.o_proj8, activations);
      layer.gate_up = Int8Rows(t.gate_up8, activations);
      layer.down = Int8Rows(t.down8, activations);
      break;
    }
  }
  return layer;
}

// The matrices the reference multiplies with: the form's values as float64.
at::Tensor Dense(const at::Tensor& f32, const Int8Matrix& i8,
                 const at::Tensor& b16, Form form) {
  switch (form) {
    case Form::kFloat32:
      return f32.to(at::kDouble);
    case Form::kBfloat16:
      return b16.to(at::kDouble);
    default:
      return i8.Dequantize().to(at::kDouble);
  }
}

// The layer in float64 ATen ops, written plainly (rotate_half, softmax, silu): updates x
// [hidden] and writes the token's K/V into the layer's blocks at `position`. w8a8 rounds
// each matrix's input as the kernel does.
void ReferenceLayer(LayerTensors& t, Form form, std::span<const int32_t> table,
                    int64_t position, const at::Tensor& cos, const at::Tensor& sin,
                    at::Tensor& x) {
  const int64_t hd = kShape.head_dim;
  const int64_t q_size = kShape.heads * hd;
  const int64_t kv_size = kShape.kv_heads * hd;
  auto norm = [&](const at::Tensor& v, const at::Tensor& g) {
    return v / at::sqrt((v * v).mean() + kShape.eps) * g.to(at::kDouble);
  };
  auto linear = [&](const at::Tensor& w, const at::Tensor& v) {
    if (form != Form::kInt8Activations) return at::mv(w, v);
    const at::Tensor rounded = RoundActivationsInt8(v.to(at::kFloat).unsqueeze(0))[0];
    return at::mv(w, rounded.to(at::kDouble));
  };
  auto rotate = [&](const at::Tensor& head) {
    const at::Tensor a = head.narrow(0, 0, hd / 2);
    const at::Tensor b = head.narrow(0, hd / 2, hd / 2);
    return at::cat({a * cos - b * sin, b * cos + a * sin});
  };
  const at::Tensor qkv = linear(Dense(t.qkv, t.qkv8, t.qkv16, form), norm(x, t.input_norm)) +
                         t.qkv_bias.to(at::kDouble);
  const int64_t block = table[position / kBlockSize];
  const int64_t row = position % kBlockSize;
  for (int64_t kv = 0; kv < kShape.kv_heads; ++kv) {
    t.keys[block][row][kv].copy_(rotate(qkv.narrow(0, q_size + kv * hd, hd)));
    t.values[block][row][kv].copy_(qkv.narrow(0, q_size + kv_size + kv * hd, hd));
  }
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < kShape.heads; ++h) {
    const at::Tensor q = rotate(qkv.narrow(0, h * hd, hd));
    const int64_t kv = h / (kShape.heads / kShape.kv_heads);
    std::vector<at::Tensor> keys, values;
    for (int64_t p = 0; p <= position; ++p) {
      keys.push_back(t.keys[table[p / kBlockSize]][p % kBlockSize][kv].to(at::kDouble));
      values.push_back(t.values[table[p / kBlockSize]][p % kBlockSize][kv].to(at::kDouble));
    }
    const at::Tensor scores = at::mv(at::stack(keys), q) / std::sqrt(static_cast<double>(hd));
    heads.push_back(at::mv(at::stack(values).t(), at::softmax(scores, 0)));
  }
  x = x + linear(Dense(t.o_proj, t.o_proj8, t.o_proj16, form), at::cat(heads)) +
      t.o_bias.to(at::kDouble);
  const at::Tensor gu =
      linear(Dense(t.gate_up, t.gate_up8, t.gate_up16, form), norm(x, t.post_norm));
  const at::Tensor gate = gu.narrow(0, 0, kShape.intermediate);
  const at::Tensor up = gu.narrow(0, kShape.intermediate, kShape.intermediate);
  x = x + linear(Dense(t.down, t.down8, t.down16, form), gate * at::sigmoid(gate) * up);
}

struct StepResult {
  at::Tensor x;
  std::vector<at::Tensor> keys, values;
};

// Two layers, the token at position 13 of a sequence whose blocks are {2, 0, 1} (so its row
// is block 0's row 5), on `threads` threads.
StepResult RunStep(Form form, int threads, bool reference) {
  std::vector<LayerTensors> tensors = {MakeLayer(1), MakeLayer(2)};
  const std::vector<int32_t> table = {2, 0, 1};
  const int64_t position = 13;
  at::manual_seed(3);
  const at::Tensor x0 = at::randn({kShape.hidden});
  const at::Tensor angles = position * at::exp(at::arange(kShape.head_dim / 2, at::kFloat) *
                                               (-std::log(10000.0f) * 2 / kShape.head_dim));
  const at::Tensor cos = angles.cos().contiguous();
  const at::Tensor sin = angles.sin().contiguous();
  StepResult result;
  if (reference) {
    at::Tensor x = x0.to(at::kDouble);
    for (LayerTensors& t : tensors) {
      ReferenceLayer(t, form, table, position, cos.to(at::kDouble), sin.to(at::kDouble), x);
    }
    result.x = x;
  } else {
    std::vector<DecodeLayer> layers;
    for (LayerTensors& t : tensors) layers.push_back(LayerOf(t, form));
    REQUIRE(DecodeStepTakes(kShape, layers));
    at::Tensor x = x0.clone();
    DecodeLayersOneToken(kShape, layers,
                         {.block_table = table, .block_size = kBlockSize, .position = position,
                          .cos = cos.data_ptr<float>(), .sin = sin.data_ptr<float>()},
                         x.data_ptr<float>(), threads);
    result.x = x.to(at::kDouble);
  }
  for (LayerTensors& t : tensors) {
    result.keys.push_back(t.keys.to(at::kDouble));
    result.values.push_back(t.values.to(at::kDouble));
  }
  return result;
}

TEST_CASE("The one-token decode step computes two layers as a plain float64 formulation does",
          "[kernels][decode_step]") {
  const auto [form, name] = GENERATE(table<Form, const char*>(
      {{Form::kFloat32, "float32"}, {Form::kBfloat16, "bfloat16"}, {Form::kInt8, "int8"},
       {Form::kInt8Activations, "int8 activations"}}));
  const int threads = GENERATE(1, 2, 3);
  INFO(name << " weights, " << threads << " threads");
  const StepResult expected = RunStep(form, threads, /*reference=*/true);
  const StepResult got = RunStep(form, threads, /*reference=*/false);
  CHECK(at::allclose(got.x, expected.x, 1e-4, 1e-4));
  for (size_t l = 0; l < got.keys.size(); ++l) {
    // Every row: the token's (block 0, row 5) as written, the others untouched.
    CHECK(at::allclose(got.keys[l], expected.keys[l], 1e-4, 1e-4));
    CHECK(at::allclose(got.values[l], expected.values[l], 1e-4, 1e-4));
  }
}

TEST_CASE("The decode step's numbers do not depend on its thread count",
          "[kernels][decode_step]") {
  const Form form = GENERATE(Form::kFloat32, Form::kBfloat16, Form::kInt8,
                             Form::kInt8Activations);
  const StepResult one = RunStep(form, 1, /*reference=*/false);
  for (int threads : {2, 3, 5}) {
    INFO(threads << " threads");
    const StepResult many = RunStep(form, threads, /*reference=*/false);
    CHECK(at::equal(many.x, one.x));
    for (size_t l = 0; l < one.keys.size(); ++l) {
      CHECK(at::equal(many.keys[l], one.keys[l]));
      CHECK(at::equal(many.values[l], one.values[l]));
    }
  }
}

TEST_CASE("The fused LM head norms the row and computes every logit, on any thread count",
          "[kernels][decode_step]") {
  at::manual_seed(5);
  const at::Tensor x = at::randn({kShape.hidden});
  const at::Tensor norm = 1.0f + 0.1f * at::randn({kShape.hidden});
  const at::Tensor head = at::randn({1001, kShape.hidden});  // rows not a multiple of four
  const at::Tensor normed = x / at::sqrt((x * x).mean() + kShape.eps) * norm;
  const at::Tensor expected = at::mv(head.to(at::kDouble), normed.to(at::kDouble));
  for (int threads : {1, 2, 3}) {
    at::Tensor logits = at::full({1001}, std::nanf(""));
    NormHeadOneToken(x.data_ptr<float>(), norm.data_ptr<float>(), kShape.hidden, kShape.eps,
                     Float32Rows(head), logits.data_ptr<float>(), threads);
    INFO(threads << " threads");
    CHECK(at::allclose(logits.to(at::kDouble), expected, 1e-4, 1e-4));
  }
}

TEST_CASE("The decode step refuses shapes it does not compute", "[kernels][decode_step]") {
  LayerTensors t = MakeLayer(1);
  std::vector<DecodeLayer> layers = {LayerOf(t, Form::kFloat32)};
  CHECK(DecodeStepTakes(kShape, layers));
  DecodeShape odd_head = kShape;
  odd_head.head_dim = 15;
  CHECK_FALSE(DecodeStepTakes(odd_head, layers));
  DecodeShape ungrouped = kShape;
  ungrouped.kv_heads = 3;
  CHECK_FALSE(DecodeStepTakes(ungrouped, layers));
  DecodeShape wider = kShape;
  wider.intermediate = 128;  // the MLP's matrices are not of this shape
  CHECK_FALSE(DecodeStepTakes(wider, layers));
  layers[0].input_norm = nullptr;
  CHECK_FALSE(DecodeStepTakes(kShape, layers));
}

}  // namespace
}  // namespace tophat::kernels
