#include "kernels/prompt_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/vector_types.h"

namespace tophat::kernels {
namespace {

// Keys per block of the running softmax: the block's scores ([block, tile rows] floats, 8 KB
// for AVX-512's 32 rows) stay in L1 between the products that make them and the ones that
// read them.
constexpr int64_t kKeyBlock = 64;

// One call's inputs, as the tiles read them.
struct Problem {
  const float* q;
  int64_t q_row_stride;   // between positions
  int64_t q_head_stride;  // between query heads
  KvRows keys;
  KvRows values;
  std::span<const int32_t> table;
  int64_t block_size;
  int64_t n;
  int64_t past;
  int64_t kv_heads;
  int64_t group;
  int64_t head_dim;
  int64_t window;  // 0: none
  float scale;
  const float* sinks;  // [heads], or null
  float* out;          // [n, heads * head_dim]
};

// The keys a tile call attends: [lo, hi) of what its queries see (lo a multiple of
// kKeyBlock), and where its result goes. partial null: normalized into Problem::out. Else
// each head's unnormalized output ot [head_dim][rows] then its lanes' maxima and sums
// ([rows] each) at partial + h * PartialFloats, for Run to merge with the other parts'; only
// the part with `sinks` counts the sinks.
struct KeyPart {
  int64_t lo = 0;
  int64_t hi = std::numeric_limits<int64_t>::max();
  bool sinks = true;
  float* partial = nullptr;
};

// A head's floats in a partial result: (head_dim + 2) x tile rows.
int64_t PartialFloats(int64_t head_dim, int64_t rows) { return (head_dim + 2) * rows; }

// Where key (or value) row j of KV head kv starts.
[[gnu::always_inline]] inline const float* RowOf(const KvRows& rows, const Problem& p, int64_t kv,
                                                 int64_t j) {
  return rows.base + p.table[static_cast<size_t>(j / p.block_size)] * rows.block_stride +
         (j % p.block_size) * rows.row_stride + kv * rows.head_stride;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

template <typename V>
struct IntVectorOf;
template <>
struct IntVectorOf<Vec4> {
  typedef int32_t type __attribute__((vector_size(16)));
};
template <>
struct IntVectorOf<Vec8> {
  typedef int32_t type __attribute__((vector_size(32)));
};
template <>
struct IntVectorOf<Vec16> {
  typedef int32_t type __attribute__((vector_size(64)));
};

template <typename V>
[[gnu::always_inline]] inline V Splat(float value) {
  return V{} + value;
}

template <typename V>
[[gnu::always_inline]] inline void StoreVector(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// a * b + c lane-wise, in one expression: the one place this file's lanes multiply and add.
// The file is compiled so that only such expressions fuse into multiply-adds (clang:
// -ffp-contract=on, kernels/CMakeLists.txt), so each lane's arithmetic is what is written
// whatever the tile's shape and a query's output does not depend on which tile holds it.
// With contraction across statements (clang's -ffp-contract=fast), clang fused different
// products into different adds in tiles of one and two vectors. GCC has no per-expression
// mode; its contraction across statements fuses these alike (the tests check both).
template <typename V>
[[gnu::always_inline]] inline V MultiplyAdd(const V& a, const V& b, const V& c) {
  return a * b + c;
}

// The same with a broadcast: a scalar times a vector needs no splat (a splat is an add to
// zero, which the compiler must keep: it turns -0 into +0).
template <typename V>
[[gnu::always_inline]] inline V MultiplyAdd(float a, const V& b, const V& c) {
  return a * b + c;
}

// exp(x) lane-wise, within about 2 ulp of expf; 0 below -87.3 (including -infinity, which
// masked scores are), so a fully masked block adds nothing. x = r ln 2 + f with r an integer
// (Cody and Waite's two-part ln 2 keeps f exact) and |f| <= ln 2 / 2, where e^f is its
// degree-6 Taylor polynomial (truncation below 1.2e-7 relative); 2^r is built in the exponent
// bits.
template <typename V>
[[gnu::always_inline]] inline V ExpVector(V x) {
  using I = typename IntVectorOf<V>::type;
  const V low = Splat<V>(-87.3f);
  const V high = Splat<V>(88.3f);
  const V clamped = x < low ? low : (x > high ? high : x);
  // Round to nearest: adding 1.5 * 2^23 leaves no fraction bits.
  const V magic = Splat<V>(12582912.0f);
  const V r = MultiplyAdd(clamped, Splat<V>(1.44269504088896341f), magic) - magic;
  const V f =
      MultiplyAdd(r, Splat<V>(2.12194440e-4f), MultiplyAdd(r, Splat<V>(-0.693359375f), clamped));
  V e = Splat<V>(1.0f / 720.0f);
  e = MultiplyAdd(e, f, Splat<V>(1.0f / 120.0f));
  e = MultiplyAdd(e, f, Splat<V>(1.0f / 24.0f));
  e = MultiplyAdd(e, f, Splat<V>(1.0f / 6.0f));
  e = MultiplyAdd(e, f, Splat<V>(0.5f));
  e = MultiplyAdd(e, f, Splat<V>(1.0f));
  e = MultiplyAdd(e, f, Splat<V>(1.0f));
  const I bits = (__builtin_convertvector(r, I) + 127) << 23;
  V two_to_r;
  std::memcpy(&two_to_r, &bits, sizeof two_to_r);
  return x < low ? V{} : e * two_to_r;
}

// Scores of kKeys keys against the tile's kVecs x lanes rows: s[key][row] = sum_d k[key][d] *
// qt[d][row] (qt already scaled), into st rows; key kk's values start at keys[kk] + offset.
template <typename V, int kVecs, int kKeys>
[[gnu::always_inline]] inline void ScoreKeys(const float* qt, int64_t hd, const float* const* keys,
                                             int64_t offset, float* st) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kRows = kVecs * kLanes;
  V acc[kKeys][kVecs];
#pragma GCC unroll 16
  for (int kk = 0; kk < kKeys; ++kk) {
#pragma GCC unroll 2
    for (int c = 0; c < kVecs; ++c) acc[kk][c] = V{};
  }
  for (int64_t d = 0; d < hd; ++d) {
    V q[kVecs];
#pragma GCC unroll 2
    for (int c = 0; c < kVecs; ++c) q[c] = LoadVector<V>(qt + d * kRows + c * kLanes);
#pragma GCC unroll 16
    for (int kk = 0; kk < kKeys; ++kk) {
      const float k = keys[kk][offset + d];
#pragma GCC unroll 2
      for (int c = 0; c < kVecs; ++c) acc[kk][c] = MultiplyAdd(k, q[c], acc[kk][c]);
    }
  }
#pragma GCC unroll 16
  for (int kk = 0; kk < kKeys; ++kk) {
#pragma GCC unroll 2
    for (int c = 0; c < kVecs; ++c) StoreVector(st + kk * kRows + c * kLanes, acc[kk][c]);
  }
}

// ot[d][row] = ot[d][row] * alpha[row] + sum_j pt[j][row] * v[j][d] for kDims dimensions from
// d0, over the block's `keys` value rows (row j's values at values[j] + offset).
template <typename V, int kVecs, int kDims>
[[gnu::always_inline]] inline void AccumulateValues(const float* pt, int64_t keys,
                                                    const float* const* values, int64_t offset,
                                                    int64_t d0, const V (&alpha)[kVecs],
                                                    float* ot) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kRows = kVecs * kLanes;
  // The block's weighted values are summed from zero, then added to the rescaled output.
  V acc[kDims][kVecs];
#pragma GCC unroll 16
  for (int dd = 0; dd < kDims; ++dd) {
#pragma GCC unroll 2
    for (int c = 0; c < kVecs; ++c) acc[dd][c] = V{};
  }
  for (int64_t j = 0; j < keys; ++j) {
    V weight[kVecs];
#pragma GCC unroll 2
    for (int c = 0; c < kVecs; ++c) weight[c] = LoadVector<V>(pt + j * kRows + c * kLanes);
    const float* v = values[j] + offset + d0;
#pragma GCC unroll 16
    for (int dd = 0; dd < kDims; ++dd) {
#pragma GCC unroll 2
      for (int c = 0; c < kVecs; ++c) {
        acc[dd][c] = MultiplyAdd(v[dd], weight[c], acc[dd][c]);
      }
    }
  }
#pragma GCC unroll 16
  for (int dd = 0; dd < kDims; ++dd) {
#pragma GCC unroll 2
    for (int c = 0; c < kVecs; ++c) {
      float* o = ot + (d0 + dd) * kRows + c * kLanes;
      StoreVector(o, MultiplyAdd(LoadVector<V>(o), alpha[c], acc[dd][c]));
    }
  }
}

// Rows a tile of kVecs vectors holds.
template <typename V, int kVecs>
constexpr int64_t TileRows() {
  return kVecs * static_cast<int64_t>(sizeof(V) / sizeof(float));
}

// Tile `tile` of KV heads [kv0, kv0 + kv_count): rows [tile * TileRows, ...) of each head's
// n * group query rows, ordered position-major (row = i * group + g), so a tile shares its
// keys across the group. Key blocks are the outer loop and the heads the inner one, so that
// the cache is read in its own order (a block's rows hold every head's keys side by side):
// a chunk of a few queries over a long history is bound by those reads, and one head at a
// time read a few hundred bytes a row, kv_heads * head_dim floats apart, which the hardware
// prefetchers do not follow across pages (a 5-row verification over 1,100 positions ran at
// 7 GB/s out of cache, slower than gathering the rows first).
template <typename V, int kVecs, int kKeys, int kDims>
[[gnu::always_inline]] inline void AttendTileVector(const Problem& p, int64_t kv0, int64_t kv_count,
                                                    int64_t tile, const KeyPart& part) {
  using I = typename IntVectorOf<V>::type;
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kRows = TileRows<V, kVecs>();
  const int64_t hd = p.head_dim;
  const int64_t first_row = tile * kRows;
  const int64_t rows = std::min(kRows, p.n * p.group - first_row);
  const int64_t first_position = p.past + first_row / p.group;
  const int64_t last_position = p.past + (first_row + rows - 1) / p.group;

  // Per head: scaled queries qt [hd][kRows], unnormalized outputs ot [hd][kRows], and each
  // lane's running maximum and sum (a sink counting as a first logit of weight one); then
  // one block's scores st [kKeyBlock][kRows], which the heads take in turn.
  const int64_t head_floats = (2 * hd + 2) * kRows;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(kv_count * head_floats + kKeyBlock * kRows));
  const auto qt_of = [&](int64_t h) { return scratch.data() + h * head_floats; };
  const auto ot_of = [&](int64_t h) { return qt_of(h) + hd * kRows; };
  const auto max_of = [&](int64_t h) { return ot_of(h) + hd * kRows; };
  const auto sum_of = [&](int64_t h) { return max_of(h) + kRows; };
  float* st = scratch.data() + kv_count * head_floats;

  // Each lane's position (padding lanes: one no key is hidden from, over zero queries).
  alignas(64) int32_t lane_position[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    lane_position[r] = r < rows ? static_cast<int32_t>(p.past + (first_row + r) / p.group)
                                : std::numeric_limits<int32_t>::max() / 2;
  }
  I position[kVecs];
  for (int c = 0; c < kVecs; ++c) std::memcpy(&position[c], lane_position + c * kLanes, sizeof(I));
  for (int64_t h = 0; h < kv_count; ++h) {
    float* qt = qt_of(h);
    std::fill(qt, qt + head_floats, 0.0f);
    std::fill(max_of(h), max_of(h) + kRows, -INFINITY);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = (first_row + r) / p.group;
      const int64_t head = (kv0 + h) * p.group + (first_row + r) % p.group;
      const float* q = p.q + i * p.q_row_stride + head * p.q_head_stride;
      for (int64_t d = 0; d < hd; ++d) qt[d * kRows + r] = q[d] * p.scale;
      if (p.sinks != nullptr && part.sinks) {
        max_of(h)[r] = p.sinks[head];
        sum_of(h)[r] = 1.0f;
      }
    }
  }

  // Blocks start at multiples of kKeyBlock whatever the tile, so each query's running softmax
  // sees the same blocks (and computes the same bits) however its prompt was split into calls.
  const int64_t key_end = std::min(last_position + 1, part.hi);
  const int64_t key_begin = std::max(
      part.lo, p.window > 0
                   ? std::max<int64_t>(0, first_position - p.window + 1) / kKeyBlock * kKeyBlock
                   : 0);
  // This block's key and value rows for head kv0 (a head's are head_stride further on), and
  // the next block's, which each head prefetches while it computes its part of this one.
  const float* rows_now[2][kKeyBlock];
  const float* rows_next[2][kKeyBlock];
  const auto set_rows = [&](int64_t j0, const float*(&into)[2][kKeyBlock]) {
    const int64_t keys = std::min(kKeyBlock, key_end - j0);
    for (int64_t j = 0; j < keys; ++j) {
      into[0][j] = RowOf(p.keys, p, kv0, j0 + j);
      into[1][j] = RowOf(p.values, p, kv0, j0 + j);
    }
    return keys;
  };
  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(float));
  int64_t keys_next = key_begin < key_end ? set_rows(key_begin, rows_next) : 0;
  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
    const int64_t keys = keys_next;
    std::copy_n(&rows_next[0][0], 2 * kKeyBlock, &rows_now[0][0]);
    keys_next = j0 + kKeyBlock < key_end ? set_rows(j0 + kKeyBlock, rows_next) : 0;
    // Keys some lane may not see: past the earliest position's diagonal, or before the
    // latest position's window.
    const bool causal_edge = j0 + keys - 1 > first_position;
    const bool window_edge = p.window > 0 && j0 <= last_position - p.window;

    for (int64_t h = 0; h < kv_count; ++h) {
      const float* qt = qt_of(h);
      float* ot = ot_of(h);
      const int64_t key_offset = h * p.keys.head_stride;
      const int64_t value_offset = h * p.values.head_stride;
      // The next block's rows of this head, into L2 while this head's block is computed
      // (about as long as reading them takes; a whole block of every head at once was more
      // than the cache held).
      for (int64_t jj = 0; jj < keys_next; ++jj) {
        const char* key_row = reinterpret_cast<const char*>(rows_next[0][jj] + key_offset);
        const char* value_row = reinterpret_cast<const char*>(rows_next[1][jj] + value_offset);
        for (int64_t offset = 0; offset < row_bytes; offset += 64) {
          __builtin_prefetch(key_row + offset, 0, 2);
          __builtin_prefetch(value_row + offset, 0, 2);
        }
      }
      int64_t j = 0;
      for (; j + kKeys <= keys; j += kKeys) {
        ScoreKeys<V, kVecs, kKeys>(qt, hd, rows_now[0] + j, key_offset, st + j * kRows);
      }
      for (; j < keys; ++j) {
        ScoreKeys<V, kVecs, 1>(qt, hd, rows_now[0] + j, key_offset, st + j * kRows);
      }

      if (causal_edge || window_edge) {
        const V hidden = Splat<V>(-INFINITY);
        for (int64_t jj = 0; jj < keys; ++jj) {
          const auto key = static_cast<int32_t>(j0 + jj);
          for (int c = 0; c < kVecs; ++c) {
            float* s = st + jj * kRows + c * kLanes;
            I visible = position[c] >= key;
            if (p.window > 0) visible &= position[c] - static_cast<int32_t>(p.window) < key;
            StoreVector(s, visible ? LoadVector<V>(s) : hidden);
          }
        }
      }

      V alpha[kVecs];
      for (int c = 0; c < kVecs; ++c) {
        const V maximum = LoadVector<V>(max_of(h) + c * kLanes);
        V block_max = LoadVector<V>(st + c * kLanes);
        for (int64_t jj = 1; jj < keys; ++jj) {
          const V s = LoadVector<V>(st + jj * kRows + c * kLanes);
          block_max = s > block_max ? s : block_max;
        }
        const V new_max = block_max > maximum ? block_max : maximum;
        // A lane that has seen only hidden keys keeps -infinity; subtracting 0 then keeps its
        // weights 0 instead of NaN.
        const V shift = new_max == Splat<V>(-INFINITY) ? V{} : new_max;
        alpha[c] = ExpVector<V>(maximum - shift);
        V block_sum{};
        for (int64_t jj = 0; jj < keys; ++jj) {
          float* s = st + jj * kRows + c * kLanes;
          const V w = ExpVector<V>(LoadVector<V>(s) - shift);
          StoreVector(s, w);
          block_sum += w;
        }
        StoreVector(sum_of(h) + c * kLanes,
                    MultiplyAdd(LoadVector<V>(sum_of(h) + c * kLanes), alpha[c], block_sum));
        StoreVector(max_of(h) + c * kLanes, new_max);
      }

      int64_t d = 0;
      for (; d + kDims <= hd; d += kDims) {
        AccumulateValues<V, kVecs, kDims>(st, keys, rows_now[1], value_offset, d, alpha, ot);
      }
      for (; d < hd; ++d) {
        AccumulateValues<V, kVecs, 1>(st, keys, rows_now[1], value_offset, d, alpha, ot);
      }
    }
  }

  if (part.partial != nullptr) {
    for (int64_t h = 0; h < kv_count; ++h) {
      std::copy_n(ot_of(h), PartialFloats(hd, kRows),
                  part.partial + (kv0 + h) * PartialFloats(hd, kRows));
    }
    return;
  }
  const int64_t heads = p.kv_heads * p.group;
  for (int64_t h = 0; h < kv_count; ++h) {
    const float* ot = ot_of(h);
    float* inverse = sum_of(h);
    for (int c = 0; c < kVecs; ++c) {
      StoreVector(inverse + c * kLanes, 1.0f / LoadVector<V>(inverse + c * kLanes));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = (first_row + r) / p.group;
      const int64_t head = (kv0 + h) * p.group + (first_row + r) % p.group;
      float* o = p.out + (i * heads + head) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = ot[d * kRows + r] * inverse[r];
    }
  }
}

using TileFn = void (*)(const Problem& p, int64_t kv0, int64_t kv_count, int64_t tile,
                        const KeyPart& part);

// Each instruction set's tiles: two vectors of rows, and one for a chunk with fewer rows (a
// tile's cost per key is the same however few of its lanes are queries). Keys and dimensions
// per pass: eight accumulator chains at least, which the multiply-adds' latency needs; 16
// of the 16 registers at most where AVX2 and SSE have only 16.

// Plain C++ over four-lane vectors: what the compiler makes of them on any architecture.
template <int kVecs>
void AttendTileBaseline(const Problem& p, int64_t kv0, int64_t kv_count, int64_t tile,
                        const KeyPart& part) {
  AttendTileVector<Vec4, kVecs, 8 / kVecs, 8 / kVecs>(p, kv0, kv_count, tile, part);
}

#if defined(__x86_64__)
template <int kVecs>
__attribute__((target("avx512f,fma"))) void AttendTileAvx512(const Problem& p, int64_t kv0,
                                                             int64_t kv_count, int64_t tile,
                                                             const KeyPart& part) {
  AttendTileVector<Vec16, kVecs, 8, 8>(p, kv0, kv_count, tile, part);
}

template <int kVecs>
__attribute__((target("avx2,fma"))) void AttendTileAvx2(const Problem& p, int64_t kv0,
                                                        int64_t kv_count, int64_t tile,
                                                        const KeyPart& part) {
  AttendTileVector<Vec8, kVecs, 8 / kVecs, 8 / kVecs>(p, kv0, kv_count, tile, part);
}
#endif

#if defined(__aarch64__)
// 32 NEON registers hold 8 keys' (or dimensions') two-vector accumulators.
template <int kVecs>
void AttendTileNeon(const Problem& p, int64_t kv0, int64_t kv_count, int64_t tile,
                    const KeyPart& part) {
  AttendTileVector<Vec4, kVecs, 8, 8>(p, kv0, kv_count, tile, part);
}
#endif
#pragma GCC diagnostic pop

struct TileKernel {
  TileFn fn;
  int64_t rows;
};

// The tile for `rows` query rows a KV head on `isa`: the narrowest that holds them, down to
// one vector; on AVX-512, chunks of 8 rows or fewer take AVX2's 8-lane tiles (two of its
// multiply-adds issue per cycle where one of AVX-512's does, so a quarter of the work).
TileKernel TileKernelFor(CpuIsa isa, int64_t rows) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      if (rows <= TileRows<Vec8, 1>()) return {AttendTileAvx2<1>, TileRows<Vec8, 1>()};
      if (rows <= TileRows<Vec16, 1>()) return {AttendTileAvx512<1>, TileRows<Vec16, 1>()};
      return {AttendTileAvx512<2>, TileRows<Vec16, 2>()};
    case CpuIsa::kAvx2:
      if (rows <= TileRows<Vec8, 1>()) return {AttendTileAvx2<1>, TileRows<Vec8, 1>()};
      return {AttendTileAvx2<2>, TileRows<Vec8, 2>()};
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon:
      if (rows <= TileRows<Vec4, 1>()) return {AttendTileNeon<1>, TileRows<Vec4, 1>()};
      return {AttendTileNeon<2>, TileRows<Vec4, 2>()};
#endif
    default:
      if (rows <= TileRows<Vec4, 1>()) return {AttendTileBaseline<1>, TileRows<Vec4, 1>()};
      return {AttendTileBaseline<2>, TileRows<Vec4, 2>()};
  }
}

bool Fits(const at::Tensor& q, const at::Tensor& key_blocks, const at::Tensor& value_blocks,
          std::span<const int32_t> block_table, int64_t past, const at::Tensor& out, int64_t window,
          double softcap, const at::Tensor& sinks) {
  const auto is_f32_cpu = [](const at::Tensor& t) {
    return t.defined() && t.is_cpu() && t.scalar_type() == at::kFloat && !t.requires_grad();
  };
  if (!is_f32_cpu(q) || !is_f32_cpu(key_blocks) || !is_f32_cpu(value_blocks) || !is_f32_cpu(out) ||
      softcap != 0 || past < 0 || window < 0) {
    return false;
  }
  if (q.dim() != 3 || q.size(0) < 1 || q.stride(2) != 1 || key_blocks.dim() != 4 ||
      value_blocks.sizes() != key_blocks.sizes() || key_blocks.stride(3) != 1 ||
      value_blocks.stride(3) != 1 || key_blocks.size(3) != q.size(2) || key_blocks.size(1) < 1 ||
      key_blocks.size(2) < 1 || q.size(1) % key_blocks.size(2) != 0) {
    return false;
  }
  const int64_t n = q.size(0);
  const int64_t heads = q.size(1);
  if (!out.is_contiguous() || out.numel() != n * heads * q.size(2)) return false;
  if (sinks.defined() && (!is_f32_cpu(sinks) || !sinks.is_contiguous() || sinks.numel() != heads)) {
    return false;
  }
  const int64_t block_size = key_blocks.size(1);
  const int64_t needed = (past + n + block_size - 1) / block_size;
  if (needed > static_cast<int64_t>(block_table.size())) return false;
  const int64_t num_blocks = key_blocks.size(0);
  for (int64_t b = 0; b < needed; ++b) {
    if (block_table[b] < 0 || block_table[b] >= num_blocks) return false;
  }
  // Positions are int32 lanes.
  return past + n < std::numeric_limits<int32_t>::max() / 4;
}

// One tile's queries over keys split into `parts` stretches of whole key blocks from
// `key_begin`, attended in parallel (every head each), then merged in order on this thread:
// each lane's maximum over the parts, and the parts' sums and outputs rescaled to it.
void AttendSplitKeys(const Problem& p, const TileKernel& kernel, int64_t key_begin,
                     int64_t key_blocks, int64_t parts) {
  const int64_t hd = p.head_dim;
  const int64_t part_floats = p.kv_heads * PartialFloats(hd, kernel.rows);
  thread_local std::vector<float> partials;
  partials.resize(static_cast<size_t>(parts * part_floats));
  // The calling thread's buffer, by address: inside the region `partials` would name each
  // worker's own.
  float* const partial_base = partials.data();
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      KeyPart part;
      part.lo = key_begin + key_blocks * t / parts * kKeyBlock;
      part.hi = key_begin + key_blocks * (t + 1) / parts * kKeyBlock;
      part.sinks = t == 0;
      part.partial = partial_base + t * part_floats;
      kernel.fn(p, 0, p.kv_heads, 0, part);
    }
  });
  const int64_t rows = p.n * p.group;
  const int64_t heads = p.kv_heads * p.group;
  thread_local std::vector<float> weights;
  weights.resize(static_cast<size_t>(parts));
  for (int64_t kv = 0; kv < p.kv_heads; ++kv) {
    for (int64_t r = 0; r < rows; ++r) {
      const auto part_of = [&](int64_t t) {
        return partial_base + t * part_floats + kv * PartialFloats(hd, kernel.rows);
      };
      const int64_t max_at = hd * kernel.rows + r;
      const int64_t sum_at = (hd + 1) * kernel.rows + r;
      float maximum = -INFINITY;
      for (int64_t t = 0; t < parts; ++t) maximum = std::max(maximum, part_of(t)[max_at]);
      float sum = 0.0f;
      for (int64_t t = 0; t < parts; ++t) {
        // A part whose keys this query sees none of holds zeros (and -infinity).
        const float part_max = part_of(t)[max_at];
        weights[t] = part_max == -INFINITY ? 0.0f : std::exp(part_max - maximum);
        sum += part_of(t)[sum_at] * weights[t];
      }
      const float inverse = 1.0f / sum;
      const int64_t i = r / p.group;
      const int64_t head = kv * p.group + r % p.group;
      float* o = p.out + (i * heads + head) * hd;
      for (int64_t d = 0; d < hd; ++d) {
        float value = 0.0f;
        for (int64_t t = 0; t < parts; ++t) {
          value += part_of(t)[d * kernel.rows + r] * weights[t];
        }
        o[d] = value * inverse;
      }
    }
  }
}

bool Run(CpuIsa isa, const at::Tensor& q, const at::Tensor& key_blocks,
         const at::Tensor& value_blocks, std::span<const int32_t> block_table, int64_t past,
         double scale, at::Tensor& out, int64_t window, double softcap, const at::Tensor& sinks) {
  if (!Fits(q, key_blocks, value_blocks, block_table, past, out, window, softcap, sinks)) {
    return false;
  }
  Problem p;
  p.q = q.data_ptr<float>();
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.keys = KvRowsOf(key_blocks);
  p.values = KvRowsOf(value_blocks);
  p.table = block_table;
  p.block_size = key_blocks.size(1);
  p.n = q.size(0);
  p.past = past;
  p.kv_heads = key_blocks.size(2);
  p.group = q.size(1) / p.kv_heads;
  p.head_dim = q.size(2);
  p.window = window;
  p.scale = static_cast<float>(scale);
  p.sinks = sinks.defined() ? sinks.data_ptr<float>() : nullptr;
  p.out = out.data_ptr<float>();

  const TileKernel kernel = TileKernelFor(isa, p.n * p.group);
  const int64_t tiles = (p.n * p.group + kernel.rows - 1) / kernel.rows;
  // Products per call: below a few hundred thousand a fork costs more than it saves.
  const int64_t products = p.n * p.group * p.kv_heads * (past + p.n) * p.head_dim;
  const int64_t threads =
      products < (int64_t{1} << 18) ? 1 : std::max<int64_t>(1, at::get_num_threads());
  // One tile (a few queries: verification rows) over a long history: split the keys, not the
  // heads, between the threads, so that each reads its own stretch of the cache whole, in
  // order, and merge the parts. Split by heads, each thread read part of every row, and the
  // step ran at 14 GB/s (docs/benchmarks.md, "Prompt attention").
  const int64_t window_begin =
      p.window > 0 ? std::max<int64_t>(0, past - p.window + 1) / kKeyBlock * kKeyBlock : 0;
  const int64_t blocks = (past + p.n - window_begin + kKeyBlock - 1) / kKeyBlock;
  if (tiles == 1 && threads > 1 && blocks >= 2 * threads) {
    AttendSplitKeys(p, kernel, window_begin, blocks, threads);
    return true;
  }
  // An item is a tile of a range of KV heads. With tiles enough to share out, one head each
  // (a head's keys and values stay in cache across its tiles); with few (a short chunk over
  // a long history), each thread walks the cache block by block for its share of the heads.
  const int64_t heads_per_item = tiles >= 2 * threads ? 1 : (p.kv_heads + threads - 1) / threads;
  const int64_t head_ranges = (p.kv_heads + heads_per_item - 1) / heads_per_item;
  const int64_t items = head_ranges * tiles;
  // Handed out from a shared counter, so that the threads finish together whatever the causal
  // shape: a range's tiles in turn, the last ones, which see the most keys, first.
  const auto run_items = [&](std::atomic<int64_t>& next) {
    for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) {
      const int64_t kv0 = item / tiles * heads_per_item;
      kernel.fn(p, kv0, std::min(heads_per_item, p.kv_heads - kv0), tiles - 1 - item % tiles,
                KeyPart{});
    }
  };
  std::atomic<int64_t> next{0};
  if (std::min(threads, items) <= 1) {
    run_items(next);
  } else {
    at::parallel_for(0, std::min(threads, items), 1, [&](int64_t, int64_t) { run_items(next); });
  }
  return true;
}

}  // namespace

bool PromptAttentionKernelOn() {
  static const bool on = [] {
    const char* value = std::getenv("TOPHAT_PROMPT_ATTENTION");
    return value == nullptr || std::string_view(value) != "off";
  }();
  return on;
}

bool PagedPromptAttention(const at::Tensor& q, const at::Tensor& key_blocks,
                          const at::Tensor& value_blocks, std::span<const int32_t> block_table,
                          int64_t past, double scale, at::Tensor& out, int64_t window,
                          double softcap, const at::Tensor& sinks) {
  if (!PromptAttentionKernelOn()) return false;
  return Run(SelectedCpuIsa(), q, key_blocks, value_blocks, block_table, past, scale, out, window,
             softcap, sinks);
}

bool PagedPromptAttentionWithIsa(CpuIsa isa, const at::Tensor& q, const at::Tensor& key_blocks,
                                 const at::Tensor& value_blocks,
                                 std::span<const int32_t> block_table, int64_t past, double scale,
                                 at::Tensor& out, int64_t window, double softcap,
                                 const at::Tensor& sinks) {
  CheckIsaSupported(isa, SupportedCpuIsas(), CpuIsaName(isa));
  return Run(isa, q, key_blocks, value_blocks, block_table, past, scale, out, window, softcap,
             sinks);
}

}  // namespace tophat::kernels
