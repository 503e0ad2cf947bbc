// One token through a stack of Llama decoder layers (and Gemma 3's: norms around each
// sublayer, a GELU gate, sliding layers with a rotary table of their own) on a CPU, in one
// parallel region.
//
// Why: a decode step on a device's CPU is bound by reading the weights once, and the GEMV
// kernels read them near the memory's rate; what kept tophat's device decode at half its
// bound was everything around them. The layer-by-layer path (Submodel::RunLayers) opens an
// OpenMP region per matrix (four a layer, plus attention's) and runs the norms, rotary,
// K/V copies, SwiGLU and residual adds between them on one thread through ATen's dispatch,
// while the other threads wait (docs/benchmarks.md, "Against llama.cpp"). Here the threads
// of one region stay for the whole step: each computes its share of every matrix's rows,
// the small operations are split over them too (heads, rows) or done by each for itself
// where that is cheaper than waiting (a norm of one row), and barriers stand where one
// phase needs another's whole output: five a layer (seven for Gemma, whose sublayer outputs
// are normed whole before their adds). Nothing is allocated once the scratch has grown to the
// model's size.
//
// The numbers are the layer-by-layer path's, row for row: every piece is the same function
// (LinearRows*, RmsNormRow, RotateHeadRow, AttendHead, SwiGluRow, GeluTanhGluRow) and each
// matrix row is
// computed by the same kernel in a block of four rows, whatever thread computes it.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/decode_attention.h"

namespace tophat::kernels {

// A weight matrix as the step's threads read it, rows of `cols` values `row_stride` apart.
struct RowMatrix {
  enum class Kind {
    kFloat32,           // values: float
    kBfloat16,          // values: bfloat16 bit patterns, computed in float32
    kInt8,              // values: int8, one float32 scale per row, float32 activations
    kInt8Activations,   // int8 weights, activations rounded to int8 per block (gemv_w8a8.h)
  };
  Kind kind = Kind::kFloat32;
  const void* values = nullptr;
  const float* scale = nullptr;  // kInt8 and kInt8Activations: [rows]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

// One decoder layer's weights (float32 vectors; biases may be null) and its K/V storage.
struct DecodeLayer {
  const float* input_norm = nullptr;  // [hidden]
  RowMatrix qkv;                      // [q + 2 kv, hidden]
  const float* qkv_bias = nullptr;
  const float* q_norm = nullptr;      // [head_dim]: each query head's norm (Qwen3), or null
  const float* k_norm = nullptr;      // [head_dim]: each key head's norm (Qwen3), or null
  RowMatrix o_proj;                   // [hidden, q]
  const float* o_bias = nullptr;
  const float* post_norm = nullptr;   // [hidden]
  RowMatrix gate_up;                  // [2 intermediate, hidden]: gate rows, then up rows
  RowMatrix down;                     // [hidden, intermediate]
  // Gemma 3: attention's and the MLP's outputs normed before their residual adds ([hidden]),
  // or null.
  const float* attention_out_norm = nullptr;
  const float* mlp_out_norm = nullptr;
  bool gelu_gate = false;   // the MLP's gate is GELU's tanh form (Gemma 3), else SiLU
  int64_t window = 0;       // > 0: the token attends the last `window` positions only
  bool local_rope = false;  // turns by DecodePosition's local table (Gemma 3's sliding layers)
  // This layer's keys and values (float32): the token's K/V is written at `position`, and
  // positions [0, position] are attended. The sequence's, set by the caller for each step.
  KvRows keys;
  KvRows values;
};

struct DecodeShape {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  float eps = 1e-5f;
  float attention_scale = 0;    // scores' factor; 0: 1 / sqrt(head_dim)
  float attention_softcap = 0;  // > 0: scaled scores capped (Gemma 2), as AttendHead does
};

// Where the token's K/V goes and what it attends: the sequence's block table over the
// layers' storage (a contiguous cache: one block), and the token's position.
struct DecodePosition {
  std::span<const int32_t> block_table;  // covers positions [0, position]
  int64_t block_size = 0;
  int64_t position = 0;
  const float* cos = nullptr;  // the rotary rows of `position`: head_dim / 2 floats each
  const float* sin = nullptr;
  const float* local_cos = nullptr;  // the local_rope layers' rows, where any layer has one
  const float* local_sin = nullptr;
};

// Whether the step takes these layers' weights: every norm there and every matrix of the
// shapes `shape` implies, head_dim even, heads a multiple of kv_heads. The K/V rows are not
// looked at: a step's caller sets them.
bool DecodeStepTakes(const DecodeShape& shape, std::span<const DecodeLayer> layers);

// The token's hidden state x [hidden] (the residual stream, updated in place) through
// `layers` on `threads` threads (one region, of one thread at least). Writes the token's K/V
// at `at.position` of every layer. Preconditions: DecodeStepTakes, every layer's K/V rows
// set, and `at` in range (the caller checked them); nothing here throws or fails.
void DecodeLayersOneToken(const DecodeShape& shape, std::span<const DecodeLayer> layers,
                          const DecodePosition& at, float* x, int threads);

// The final norm and LM head of one row: logits [head.rows] = head · RmsNorm(x, norm), on
// `threads` threads (one region).
void NormHeadOneToken(const float* x, const float* norm, int64_t hidden, float eps,
                      const RowMatrix& head, float* logits, int threads);

// Threads worth a step that reads `bytes` of weights: one below a size where a region's
// start and barriers cost more than splitting saves, else SingleRowThreads().
int DecodeStepThreads(int64_t bytes);

}  // namespace tophat::kernels
