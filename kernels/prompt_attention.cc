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
  const V r = (clamped * 1.44269504088896341f + magic) - magic;
  const V f = (clamped - r * 0.693359375f) - r * -2.12194440e-4f;
  V e = Splat<V>(1.0f / 720.0f);
  e = e * f + 1.0f / 120.0f;
  e = e * f + 1.0f / 24.0f;
  e = e * f + 1.0f / 6.0f;
  e = e * f + 0.5f;
  e = e * f + 1.0f;
  e = e * f + 1.0f;
  const I bits = (__builtin_convertvector(r, I) + 127) << 23;
  V two_to_r;
  std::memcpy(&two_to_r, &bits, sizeof two_to_r);
  return x < low ? V{} : e * two_to_r;
}

// Scores of kKeys keys against the tile's 2 x lanes rows: s[key][row] = sum_d k[key][d] *
// qt[d][row] (qt already scaled), into st rows.
template <typename V, int kKeys>
[[gnu::always_inline]] inline void ScoreKeys(const float* qt, int64_t hd, const float* const* keys,
                                             float* st) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V acc[kKeys][2];
#pragma GCC unroll 16
  for (int kk = 0; kk < kKeys; ++kk) acc[kk][0] = acc[kk][1] = V{};
  for (int64_t d = 0; d < hd; ++d) {
    const V q0 = LoadVector<V>(qt + d * 2 * kLanes);
    const V q1 = LoadVector<V>(qt + d * 2 * kLanes + kLanes);
#pragma GCC unroll 16
    for (int kk = 0; kk < kKeys; ++kk) {
      const float k = keys[kk][d];
      acc[kk][0] += k * q0;
      acc[kk][1] += k * q1;
    }
  }
#pragma GCC unroll 16
  for (int kk = 0; kk < kKeys; ++kk) {
    StoreVector(st + kk * 2 * kLanes, acc[kk][0]);
    StoreVector(st + kk * 2 * kLanes + kLanes, acc[kk][1]);
  }
}

// ot[d][row] = ot[d][row] * alpha[row] + sum_j pt[j][row] * v[j][d] for kDims dimensions from
// d0, over the block's `keys` value rows.
template <typename V, int kDims>
[[gnu::always_inline]] inline void AccumulateValues(const float* pt, int64_t keys,
                                                    const float* const* values, int64_t d0,
                                                    const V (&alpha)[2], float* ot) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V acc[kDims][2];
#pragma GCC unroll 16
  for (int dd = 0; dd < kDims; ++dd) {
    acc[dd][0] = LoadVector<V>(ot + (d0 + dd) * 2 * kLanes) * alpha[0];
    acc[dd][1] = LoadVector<V>(ot + (d0 + dd) * 2 * kLanes + kLanes) * alpha[1];
  }
  for (int64_t j = 0; j < keys; ++j) {
    const V p0 = LoadVector<V>(pt + j * 2 * kLanes);
    const V p1 = LoadVector<V>(pt + j * 2 * kLanes + kLanes);
    const float* v = values[j] + d0;
#pragma GCC unroll 16
    for (int dd = 0; dd < kDims; ++dd) {
      acc[dd][0] += v[dd] * p0;
      acc[dd][1] += v[dd] * p1;
    }
  }
#pragma GCC unroll 16
  for (int dd = 0; dd < kDims; ++dd) {
    StoreVector(ot + (d0 + dd) * 2 * kLanes, acc[dd][0]);
    StoreVector(ot + (d0 + dd) * 2 * kLanes + kLanes, acc[dd][1]);
  }
}

// Rows a tile holds: two vectors' lanes.
template <typename V>
constexpr int64_t TileRows() {
  return 2 * static_cast<int64_t>(sizeof(V) / sizeof(float));
}

// Tile `tile` of KV head `kv`: rows [tile * TileRows, ...) of that head's n * group query rows,
// ordered position-major (row = i * group + g), so a tile shares its keys across the group.
template <typename V, int kKeys, int kDims>
[[gnu::always_inline]] inline void AttendTileVector(const Problem& p, int64_t kv, int64_t tile) {
  using I = typename IntVectorOf<V>::type;
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr int64_t kRows = TileRows<V>();
  const int64_t hd = p.head_dim;
  const int64_t first_row = tile * kRows;
  const int64_t rows = std::min(kRows, p.n * p.group - first_row);
  const int64_t first_position = p.past + first_row / p.group;
  const int64_t last_position = p.past + (first_row + rows - 1) / p.group;

  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>((2 * hd + kKeyBlock) * kRows));
  float* qt = scratch.data();   // [hd][kRows], scaled queries
  float* ot = qt + hd * kRows;  // [hd][kRows], unnormalized outputs
  float* st = ot + hd * kRows;  // [kKeyBlock][kRows], scores then weights
  std::fill(qt, st, 0.0f);

  // Each lane's position (padding lanes: one no key is hidden from, over zero queries) and its
  // running maximum and sum, a sink counting as a first logit of weight one.
  alignas(64) int32_t lane_position[kRows];
  alignas(64) float lane_max[kRows];
  alignas(64) float lane_sum[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    lane_position[r] = std::numeric_limits<int32_t>::max() / 2;
    lane_max[r] = -INFINITY;
    lane_sum[r] = 0.0f;
    if (r >= rows) continue;
    const int64_t i = (first_row + r) / p.group;
    const int64_t head = kv * p.group + (first_row + r) % p.group;
    lane_position[r] = static_cast<int32_t>(p.past + i);
    const float* q = p.q + i * p.q_row_stride + head * p.q_head_stride;
    for (int64_t d = 0; d < hd; ++d) qt[d * kRows + r] = q[d] * p.scale;
    if (p.sinks != nullptr) {
      lane_max[r] = p.sinks[head];
      lane_sum[r] = 1.0f;
    }
  }
  I position[2];
  V maximum[2];
  V sum[2];
  for (int c = 0; c < 2; ++c) {
    std::memcpy(&position[c], lane_position + c * kLanes, sizeof position[c]);
    maximum[c] = LoadVector<V>(lane_max + c * kLanes);
    sum[c] = LoadVector<V>(lane_sum + c * kLanes);
  }

  // Blocks start at multiples of kKeyBlock whatever the tile, so each query's running softmax
  // sees the same blocks (and computes the same bits) however its prompt was split into calls.
  const int64_t key_end = last_position + 1;
  const int64_t key_begin =
      p.window > 0 ? std::max<int64_t>(0, first_position - p.window + 1) / kKeyBlock * kKeyBlock
                   : 0;
  const float* key_rows[kKeyBlock];
  const float* value_rows[kKeyBlock];
  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
    const int64_t keys = std::min(kKeyBlock, key_end - j0);
    for (int64_t j = 0; j < keys; ++j) {
      key_rows[j] = RowOf(p.keys, p, kv, j0 + j);
      value_rows[j] = RowOf(p.values, p, kv, j0 + j);
    }
    int64_t j = 0;
    for (; j + kKeys <= keys; j += kKeys) ScoreKeys<V, kKeys>(qt, hd, key_rows + j, st + j * kRows);
    for (; j < keys; ++j) ScoreKeys<V, 1>(qt, hd, key_rows + j, st + j * kRows);

    // Keys some lane may not see: past the earliest position's diagonal, or before the
    // latest position's window.
    const bool causal_edge = j0 + keys - 1 > first_position;
    const bool window_edge = p.window > 0 && j0 <= last_position - p.window;
    if (causal_edge || window_edge) {
      const V hidden = Splat<V>(-INFINITY);
      for (int64_t jj = 0; jj < keys; ++jj) {
        const auto key = static_cast<int32_t>(j0 + jj);
        for (int c = 0; c < 2; ++c) {
          float* s = st + jj * kRows + c * kLanes;
          I visible = position[c] >= key;
          if (p.window > 0) visible &= position[c] - static_cast<int32_t>(p.window) < key;
          StoreVector(s, visible ? LoadVector<V>(s) : hidden);
        }
      }
    }

    V alpha[2];
    for (int c = 0; c < 2; ++c) {
      V block_max = LoadVector<V>(st + c * kLanes);
      for (int64_t jj = 1; jj < keys; ++jj) {
        const V s = LoadVector<V>(st + jj * kRows + c * kLanes);
        block_max = s > block_max ? s : block_max;
      }
      const V new_max = block_max > maximum[c] ? block_max : maximum[c];
      // A lane that has seen only hidden keys keeps -infinity; subtracting 0 then keeps its
      // weights 0 instead of NaN.
      const V shift = new_max == Splat<V>(-INFINITY) ? V{} : new_max;
      alpha[c] = ExpVector<V>(maximum[c] - shift);
      V block_sum{};
      for (int64_t jj = 0; jj < keys; ++jj) {
        float* s = st + jj * kRows + c * kLanes;
        const V w = ExpVector<V>(LoadVector<V>(s) - shift);
        StoreVector(s, w);
        block_sum += w;
      }
      sum[c] = sum[c] * alpha[c] + block_sum;
      maximum[c] = new_max;
    }

    int64_t d = 0;
    for (; d + kDims <= hd; d += kDims) {
      AccumulateValues<V, kDims>(st, keys, value_rows, d, alpha, ot);
    }
    for (; d < hd; ++d) AccumulateValues<V, 1>(st, keys, value_rows, d, alpha, ot);
  }

  for (int c = 0; c < 2; ++c) StoreVector(lane_sum + c * kLanes, 1.0f / sum[c]);
  const int64_t heads = p.kv_heads * p.group;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = (first_row + r) / p.group;
    const int64_t head = kv * p.group + (first_row + r) % p.group;
    float* o = p.out + (i * heads + head) * hd;
    for (int64_t d = 0; d < hd; ++d) o[d] = ot[d * kRows + r] * lane_sum[r];
  }
}

using TileFn = void (*)(const Problem& p, int64_t kv, int64_t tile);

// Plain C++ over four-lane vectors: what the compiler makes of them on any architecture.
void AttendTileBaseline(const Problem& p, int64_t kv, int64_t tile) {
  AttendTileVector<Vec4, 4, 4>(p, kv, tile);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) void AttendTileAvx512(const Problem& p, int64_t kv,
                                                             int64_t tile) {
  AttendTileVector<Vec16, 8, 8>(p, kv, tile);
}

__attribute__((target("avx2,fma"))) void AttendTileAvx2(const Problem& p, int64_t kv,
                                                        int64_t tile) {
  AttendTileVector<Vec8, 4, 4>(p, kv, tile);
}
#endif

#if defined(__aarch64__)
// 32 NEON registers hold 8 keys' (or dimensions') two-vector accumulators.
void AttendTileNeon(const Problem& p, int64_t kv, int64_t tile) {
  AttendTileVector<Vec4, 8, 8>(p, kv, tile);
}
#endif
#pragma GCC diagnostic pop

struct TileKernel {
  TileFn fn;
  int64_t rows;
};

TileKernel TileKernelFor(CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return {AttendTileAvx512, TileRows<Vec16>()};
    case CpuIsa::kAvx2:
      return {AttendTileAvx2, TileRows<Vec8>()};
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon:
      return {AttendTileNeon, TileRows<Vec4>()};
#endif
    default:
      return {AttendTileBaseline, TileRows<Vec4>()};
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

  const TileKernel kernel = TileKernelFor(isa);
  const int64_t tiles = (p.n * p.group + kernel.rows - 1) / kernel.rows;
  const int64_t items = p.kv_heads * tiles;
  // The last tiles see the most keys: handed out first, from a shared counter, so that the
  // threads finish together whatever the causal shape.
  const auto run_items = [&](std::atomic<int64_t>& next) {
    for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) {
      kernel.fn(p, item % p.kv_heads, tiles - 1 - item / p.kv_heads);
    }
  };
  std::atomic<int64_t> next{0};
  // Products per call: below a few hundred thousand a fork costs more than it saves.
  const int64_t products = p.n * p.group * p.kv_heads * (past + p.n) * p.head_dim;
  const int threads = std::min<int64_t>(at::get_num_threads(), items);
  if (threads <= 1 || products < (int64_t{1} << 18)) {
    run_items(next);
  } else {
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { run_items(next); });
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
