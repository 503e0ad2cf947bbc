#include "kernels/decode_step.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/gemv_int8.h"
#include "kernels/gemv_w8a8.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace tophat::kernels {
namespace {

// What each thread keeps for itself: its copy of the normed row (cheaper to compute than to
// wait for), x rounded to int8 for integer matrices, and attention scores.
struct ThreadScratch {
  std::vector<float> normed;
  std::vector<int8_t> rounded;
  std::vector<float> rounded_scale;
  std::vector<float> scores;

  void Fit(int64_t hidden, int64_t widest, int64_t positions) {
    if (static_cast<int64_t>(normed.size()) < hidden) normed.resize(hidden);
    if (static_cast<int64_t>(rounded.size()) < widest) rounded.resize(widest);
    const int64_t blocks = (widest + kActivationBlock - 1) / kActivationBlock;
    if (static_cast<int64_t>(rounded_scale.size()) < blocks) rounded_scale.resize(blocks);
    if (static_cast<int64_t>(scores.size()) < positions) scores.resize(positions);
  }
};

ThreadScratch& OwnScratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

// What the threads share, owned by the calling thread: one layer's intermediate rows.
struct SharedScratch {
  std::vector<float> qkv, q, attention, projected, gate_up, activated;

  void Fit(const DecodeShape& shape) {
    const int64_t q_size = shape.heads * shape.head_dim;
    const int64_t kv_size = shape.kv_heads * shape.head_dim;
    auto fit = [](std::vector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    };
    fit(qkv, q_size + 2 * kv_size);
    fit(q, q_size);
    fit(attention, q_size);
    fit(projected, shape.hidden);
    fit(gate_up, 2 * shape.intermediate);
    fit(activated, shape.intermediate);
  }
};

// Thread t's share of n units of other work (heads), as evenly as they divide.
std::pair<int64_t, int64_t> UnitShare(int64_t n, int t, int count) {
  return {n * t / count, n * (t + 1) / count};
}

// The token's row of KV head `kv` in one layer's keys or values, to write: the cache's
// storage is writable; KvRows is const for the attention that reads it.
float* TokenRow(const KvRows& rows, int64_t block, int64_t row, int64_t kv) {
  return const_cast<float*>(rows.base) + block * rows.block_stride + row * rows.row_stride +
         kv * rows.head_stride;
}

// x rounded for an integer matrix, into the thread's scratch; nothing for the others.
void PrepareInput(const RowMatrix& m, const float* x, ThreadScratch& s) {
  if (m.kind == RowMatrix::Kind::kInt8Activations) {
    RoundActivationRow(x, m.cols, s.rounded.data(), s.rounded_scale.data());
  }
}

// Rows [r0, r1) of y = M x (PrepareInput first), plus bias where given.
void MatrixRows(const RowMatrix& m, const float* x, const float* bias, float* y, int64_t r0,
                int64_t r1, const ThreadScratch& s) {
  if (r0 >= r1) return;
  switch (m.kind) {
    case RowMatrix::Kind::kFloat32:
      LinearRowsFloat32(static_cast<const float*>(m.values), m.row_stride, x, y, m.cols, r0, r1);
      break;
    case RowMatrix::Kind::kBfloat16:
      LinearRowsBf16(static_cast<const uint16_t*>(m.values), m.row_stride, x, y, m.cols, r0,
                     r1);
      break;
    case RowMatrix::Kind::kInt8:
      LinearRowsInt8(static_cast<const int8_t*>(m.values), m.row_stride, m.scale, x, y, m.cols,
                     r0, r1);
      break;
    case RowMatrix::Kind::kInt8Activations:
      LinearRowsW8A8(static_cast<const int8_t*>(m.values), m.row_stride, m.scale,
                     s.rounded.data(), s.rounded_scale.data(), y, m.cols, r0, r1);
      break;
  }
  // As the layer-by-layer path: the bias added to the finished product.
  if (bias != nullptr) {
    for (int64_t r = r0; r < r1; ++r) y[r] += bias[r];
  }
}

bool MatrixIs(const RowMatrix& m, int64_t rows, int64_t cols) {
  return m.values != nullptr && m.rows == rows && m.cols == cols && m.row_stride >= cols &&
         ((m.kind != RowMatrix::Kind::kInt8 && m.kind != RowMatrix::Kind::kInt8Activations) ||
          m.scale != nullptr);
}

// A sublayer's output rows [d0, d1) added to the residual stream x: as they are, or (Gemma)
// the whole output normed first, which needs every thread's rows: a barrier, then each thread
// norms the row for itself into `normed` (its own scratch) and adds its rows. Every thread
// calls it, so the barrier is reached by all or none.
void AddSublayer(float* x, const float* projected, const float* norm, int64_t d, float eps,
                 float* normed, int64_t d0, int64_t d1) {
  const float* delta = projected;
  if (norm != nullptr) {
#pragma omp barrier
    RmsNormRow(projected, norm, d, eps, normed);
    delta = normed;
  }
  for (int64_t r = d0; r < d1; ++r) x[r] += delta[r];
}

// The step on one thread of `count` (t: its index); `count` threads run it together, each
// reaching every barrier.
void RunLayers(const DecodeShape& shape, std::span<const DecodeLayer> layers,
               const DecodePosition& at, float* x, SharedScratch& shared, int t, int count) {
  const int64_t d = shape.hidden;
  const int64_t hd = shape.head_dim;
  const int64_t half = hd / 2;
  const int64_t q_size = shape.heads * hd;
  const int64_t kv_size = shape.kv_heads * hd;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t inner = shape.intermediate;
  const int64_t positions = at.position + 1;
  // The layer-by-layer path's scale: 1 / sqrt(head_dim) in double, then float, unless given.
  const float scale = shape.attention_scale > 0
                          ? shape.attention_scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const int64_t slot_block = at.block_table[at.position / at.block_size];
  const int64_t slot_row = at.position % at.block_size;

  ThreadScratch& own = OwnScratch();
  own.Fit(d, std::max(d, std::max(q_size, inner)), positions);
  float* normed = own.normed.data();
  float* qkv = shared.qkv.data();
  float* q = shared.q.data();
  float* attention = shared.attention.data();
  float* projected = shared.projected.data();
  float* gate_up = shared.gate_up.data();
  float* activated = shared.activated.data();

  const auto [d0, d1] = RowBlockShare(d, t, count);
  const auto [h0, h1] = UnitShare(shape.heads, t, count);
  const auto [u0, u1] = UnitShare(shape.heads + shape.kv_heads, t, count);
  const auto [g0, g1] = RowBlockShare(inner, t, count);
  const auto [qkv0, qkv1] = RowBlockShare(q_size + 2 * kv_size, t, count);

  for (const DecodeLayer& layer : layers) {
    // Attention's input: every thread norms the row for itself (hidden values: less than a
    // barrier costs), then computes its rows of q, k and v.
    RmsNormRow(x, layer.input_norm, d, shape.eps, normed);
    PrepareInput(layer.qkv, normed, own);
    MatrixRows(layer.qkv, normed, layer.qkv_bias, qkv, qkv0, qkv1, own);
#pragma omp barrier
    // Rotary: query heads into q, key heads straight into the cache row with their values;
    // a head norm first where the model has one (in place: the head is this thread's).
    const float* cos = layer.local_rope ? at.local_cos : at.cos;
    const float* sin = layer.local_rope ? at.local_sin : at.sin;
    for (int64_t u = u0; u < u1; ++u) {
      if (u < shape.heads) {
        if (layer.q_norm != nullptr) {
          RmsNormRow(qkv + u * hd, layer.q_norm, hd, shape.eps, qkv + u * hd);
        }
        RotateHeadRow(qkv + u * hd, cos, sin, half, q + u * hd);
        continue;
      }
      const int64_t kv = u - shape.heads;
      if (layer.k_norm != nullptr) {
        float* key = qkv + q_size + kv * hd;
        RmsNormRow(key, layer.k_norm, hd, shape.eps, key);
      }
      RotateHeadRow(qkv + q_size + kv * hd, cos, sin, half,
                    TokenRow(layer.keys, slot_block, slot_row, kv));
      std::memcpy(TokenRow(layer.values, slot_block, slot_row, kv),
                  qkv + q_size + kv_size + kv * hd, sizeof(float) * hd);
    }
#pragma omp barrier
    const int64_t first = layer.window > 0 ? std::max<int64_t>(0, positions - layer.window) : 0;
    for (int64_t h = h0; h < h1; ++h) {
      AttendHead(q + h * hd, layer.keys, layer.values, h / group, hd, at.block_table, at.block_size,
                 first, positions, scale, shape.attention_softcap, own.scores.data(),
                 attention + h * hd);
    }
#pragma omp barrier
    // The output projection's rows and the residual add of the same rows.
    PrepareInput(layer.o_proj, attention, own);
    MatrixRows(layer.o_proj, attention, layer.o_bias, projected, d0, d1, own);
    AddSublayer(x, projected, layer.attention_out_norm, d, shape.eps, normed, d0, d1);
#pragma omp barrier
    // The MLP: each thread's gate rows with the same up rows, so SwiGLU needs no barrier.
    RmsNormRow(x, layer.post_norm, d, shape.eps, normed);
    PrepareInput(layer.gate_up, normed, own);
    MatrixRows(layer.gate_up, normed, nullptr, gate_up, g0, g1, own);
    MatrixRows(layer.gate_up, normed, nullptr, gate_up, inner + g0, inner + g1, own);
    if (layer.gelu_gate) {
      GeluTanhGluRow(gate_up + g0, gate_up + inner + g0, g1 - g0, activated + g0);
    } else {
      SwiGluRow(gate_up + g0, gate_up + inner + g0, g1 - g0, activated + g0);
    }
#pragma omp barrier
    PrepareInput(layer.down, activated, own);
    MatrixRows(layer.down, activated, nullptr, projected, d0, d1, own);
    AddSublayer(x, projected, layer.mlp_out_norm, d, shape.eps, normed, d0, d1);
#pragma omp barrier
  }
}

}  // namespace

bool DecodeStepTakes(const DecodeShape& shape, std::span<const DecodeLayer> layers) {
  if (shape.hidden <= 0 || shape.heads <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.head_dim % 2 != 0 || shape.heads % shape.kv_heads != 0 || shape.intermediate <= 0) {
    return false;
  }
  const int64_t q_size = shape.heads * shape.head_dim;
  const int64_t kv_size = shape.kv_heads * shape.head_dim;
  for (const DecodeLayer& layer : layers) {
    if (layer.input_norm == nullptr || layer.post_norm == nullptr ||
        !MatrixIs(layer.qkv, q_size + 2 * kv_size, shape.hidden) ||
        !MatrixIs(layer.o_proj, shape.hidden, q_size) ||
        !MatrixIs(layer.gate_up, 2 * shape.intermediate, shape.hidden) ||
        !MatrixIs(layer.down, shape.hidden, shape.intermediate)) {
      return false;
    }
  }
  return true;
}

void DecodeLayersOneToken(const DecodeShape& shape, std::span<const DecodeLayer> layers,
                          const DecodePosition& at, float* x, int threads) {
  thread_local SharedScratch calling_thread_scratch;
  // A plain reference for the region: inside it, the thread_local's name would be each
  // thread's own (empty) instance.
  SharedScratch& shared = calling_thread_scratch;
  shared.Fit(shape);
  // A region even for one thread: its barriers then bind to it, not to a region the caller
  // may be running in.
#pragma omp parallel num_threads(std::max(1, threads))
  RunLayers(shape, layers, at, x, shared, omp_get_thread_num(), omp_get_num_threads());
}

void NormHeadOneToken(const float* x, const float* norm, int64_t hidden, float eps,
                      const RowMatrix& head, float* logits, int threads) {
  auto share = [&](int t, int count) {
    ThreadScratch& own = OwnScratch();
    own.Fit(hidden, hidden, 0);
    RmsNormRow(x, norm, hidden, eps, own.normed.data());
    PrepareInput(head, own.normed.data(), own);
    const auto [r0, r1] = RowBlockShare(head.rows, t, count);
    MatrixRows(head, own.normed.data(), nullptr, logits, r0, r1, own);
  };
  if (threads <= 1) {
    share(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  share(omp_get_thread_num(), omp_get_num_threads());
}

int DecodeStepThreads(int64_t bytes) {
  // Below this a layer's matrices read in a few tens of microseconds on one core, and a
  // second thread saves about what its five barriers a layer cost on a busy machine. Chosen
  // by analogy with the GEMV kernels' own one-thread cut-offs (256 KiB a matrix), not
  // measured apart: the toy models stay on one thread, the evaluation model (3 MiB a layer)
  // and larger split.
  constexpr int64_t kOneThreadBytes = int64_t{1} << 19;
  return bytes < kOneThreadBytes ? 1 : SingleRowThreads();
}

}  // namespace tophat::kernels
