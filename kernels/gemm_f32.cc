#include "kernels/gemm_f32.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/avx512_tile.h"
#include "kernels/row_tiles.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tophat::kernels {
namespace {

constexpr int kTileRows = 8;

#if defined(__x86_64__)
bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

static_assert(kF32GemmPanel % 16 == 0, "panels are packed 16 rows at a time");

// Row `row`'s 16 values from `values` as float32 words: float32 as it is, bfloat16 widened
// (float32's upper half, exactly), int8 times the row's scale.
template <typename E>
__attribute__((target("avx512f"), always_inline)) inline __m512i WidenedValues(
    const E* values, const float* row_scale, int64_t row) {
  if constexpr (std::is_same_v<E, float>) {
    return _mm512_castps_si512(_mm512_loadu_ps(values));
  } else if constexpr (std::is_same_v<E, int8_t>) {
    const __m512 v = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values))));
    return _mm512_castps_si512(_mm512_mul_ps(v, _mm512_set1_ps(row_scale[row])));
  } else {
    return _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values))), 16);
  }
}

// One weight the scalar way, as WidenedValues makes it.
template <typename E>
float WidenedValue(E value, const float* row_scale, int64_t row) {
  if constexpr (std::is_same_v<E, float>) {
    return value;
  } else if constexpr (std::is_same_v<E, int8_t>) {
    return static_cast<float>(value) * row_scale[row];
  } else {
    const uint32_t bits = static_cast<uint32_t>(value) << 16;
    float widened;
    std::memcpy(&widened, &bits, sizeof(widened));
    return widened;
  }
}

// Sixteen panel rows of 16 words each, from j0: row jj's words as load(jj) gives them (zeros
// at and past `rows`), transposed into panel_at[w * kF32GemmPanel + jj] (panel_at: the
// block's first word, its word 0 of row j0).
template <typename Load>
__attribute__((target("avx512f"), always_inline)) inline void PackSixteenRows(int64_t j0,
                                                                              int64_t rows,
                                                                              const Load& load,
                                                                              void* panel_at) {
  __m512i block[16];
#pragma GCC unroll 16
  for (int jj = 0; jj < 16; ++jj) block[jj] = j0 + jj < rows ? load(jj) : _mm512_setzero_si512();
  Transpose16x16(block);
  auto* words = static_cast<uint32_t*>(panel_at);
#pragma GCC unroll 16
  for (int w = 0; w < 16; ++w) _mm512_storeu_si512(words + w * kF32GemmPanel, block[w]);
}

// Rows [r0, r0 + rows) and columns [k0, k0 + columns) of the weights into panel[k][j], j <
// kF32GemmPanel (rows past `rows`: zeros): 16 rows by 16 columns at a time, transposed in
// registers; the last columns one at a time.
template <typename E>
__attribute__((target("avx512f"))) void PackChunk(const E* w, int64_t ldw, const float* row_scale,
                                                  int64_t r0, int64_t rows, int64_t k0,
                                                  int64_t columns, float* panel) {
  const int64_t vector_columns = columns / 16 * 16;
  for (int64_t j0 = 0; j0 < kF32GemmPanel; j0 += 16) {
    for (int64_t c = 0; c < vector_columns; c += 16) {
      PackSixteenRows(
          j0, rows,
          [&](int jj) __attribute__((target("avx512f"))) {
            const int64_t j = j0 + jj;
            return WidenedValues<E>(w + (r0 + j) * ldw + k0 + c, row_scale, r0 + j);
          },
          panel + c * kF32GemmPanel + j0);
    }
  }
  for (int64_t j = 0; j < kF32GemmPanel; ++j) {
    if (j >= rows) {
      for (int64_t k = vector_columns; k < columns; ++k) panel[k * kF32GemmPanel + j] = 0.0f;
      continue;
    }
    const E* row = w + (r0 + j) * ldw + k0;
    for (int64_t k = vector_columns; k < columns; ++k) {
      panel[k * kF32GemmPanel + j] = WidenedValue<E>(row[k], row_scale, r0 + j);
    }
  }
}

// x rows [i0, i0 + kRows) (x already offset to the chunk's first column) against the panel's
// chunk of `columns` k values; y (offset to the panel's first column) holds the partial sums
// between chunks, `first` starts them at zero and `bias` (the panel's, or null) is added
// after the last.
template <int kRows>
__attribute__((target("avx512f,fma"), flatten)) void Tile(const float* panel, int64_t columns,
                                                          const float* x, int64_t ldx, int64_t i0,
                                                          int64_t valid, bool first,
                                                          const float* bias, float* y,
                                                          int64_t ldy) {
  constexpr int kVectors = kF32GemmPanel / 16;
  __mmask16 mask[kVectors];
  PanelLaneMasks(valid, mask);
  __m512 acc[kRows][kVectors];
  StartPartialSums<kRows>(first, mask, y, ldy, i0, acc);
  const float* rows[kRows];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) rows[i] = x + (i0 + i) * ldx;
  for (int64_t k = 0; k < columns; ++k) {
    const float* weights = panel + k * kF32GemmPanel;
    __m512 wv[kVectors];
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) wv[v] = _mm512_loadu_ps(weights + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const __m512 xv = _mm512_set1_ps(rows[i][k]);
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_fmadd_ps(xv, wv[v], acc[i][v]);
    }
  }
  StorePartialSums<kRows>(acc, mask, bias, y, ldy, i0);
}

// bfloat16 products (LinearBf16PromptOut): a chunk is kF32GemmChunk columns, kPairs pairs of
// them; panel[p][j] holds row j's pair p as one 32-bit word, its even column in the low half,
// as vdpbf16ps pairs the halves of each lane.
constexpr int64_t kPairs = kF32GemmChunk / 2;

bool CpuHasAvx512Bf16() { return CpuHasAvx512() && __builtin_cpu_supports("avx512bf16"); }

// Rows [r0, r0 + rows) and pairs [k0 / 2, k0 / 2 + pairs) of bfloat16 weights into
// panel[p][j] (rows past `rows`, and the odd column past k: zeros). A whole pair is its two
// values read as one little-endian word, so 16 rows by 16 pairs at a time are 16 loads and a
// transpose; the pairs after them one word at a time.
__attribute__((target("avx512f"))) void PackPairs(const uint16_t* w, int64_t ldw, int64_t r0,
                                                  int64_t rows, int64_t k0, int64_t pairs,
                                                  int64_t k, uint32_t* panel) {
  const int64_t whole_pairs = std::min(pairs, (k - k0) / 2);
  const int64_t vector_pairs = whole_pairs / 16 * 16;
  for (int64_t j0 = 0; j0 < kF32GemmPanel; j0 += 16) {
    for (int64_t p0 = 0; p0 < vector_pairs; p0 += 16) {
      PackSixteenRows(
          j0, rows,
          [&](int jj) __attribute__((target("avx512f"))) {
            return _mm512_loadu_si512(w + (r0 + j0 + jj) * ldw + k0 + 2 * p0);
          },
          panel + p0 * kF32GemmPanel + j0);
    }
  }
  for (int64_t j = 0; j < kF32GemmPanel; ++j) {
    if (j >= rows) {
      for (int64_t p = vector_pairs; p < pairs; ++p) panel[p * kF32GemmPanel + j] = 0;
      continue;
    }
    const uint16_t* row = w + (r0 + j) * ldw;
    for (int64_t p = vector_pairs; p < pairs; ++p) {
      const int64_t c = k0 + 2 * p;
      const uint32_t high = c + 1 < k ? row[c + 1] : 0;
      panel[p * kF32GemmPanel + j] = row[c] | (high << 16);
    }
  }
}

// One float32 rounded as vcvtneps2bf16 rounds it: to nearest even, a denormal as zero, a NaN
// kept quiet.
uint16_t RoundToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// x's rows rounded to bfloat16 (to nearest even, as vcvtneps2bf16), two columns a word; the
// odd column past k is zero. pairs_per_row = ceil(k / 2).
__attribute__((target("avx512f,avx512bf16"))) void RoundRows(const float* x, int64_t ldx, int64_t m,
                                                             int64_t k, int64_t pairs_per_row,
                                                             uint32_t* rounded) {
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    auto* out = reinterpret_cast<uint16_t*>(rounded + i * pairs_per_row);
    int64_t c = 0;
    for (; c + 16 <= k; c += 16) {
      const __m256bh half = _mm512_cvtneps_pbh(_mm512_loadu_ps(row + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                          reinterpret_cast<const __m256i&>(half));
    }
    for (; c < k; ++c) out[c] = RoundToBf16(row[c]);
    if (k % 2 != 0) out[k] = 0;
  }
}

// As Tile, over pairs: each lane of a weight vector holds one row's two bfloat16 values, x's
// pair is broadcast, and vdpbf16ps adds both products into the lane's float32 sum.
template <int kRows>
__attribute__((target("avx512f,avx512bf16"), flatten)) void PairTile(
    const uint32_t* panel, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t i0, int64_t valid,
    bool first, const float* bias, float* y, int64_t ldy) {
  constexpr int kVectors = kF32GemmPanel / 16;
  __mmask16 mask[kVectors];
  PanelLaneMasks(valid, mask);
  __m512 acc[kRows][kVectors];
  StartPartialSums<kRows>(first, mask, y, ldy, i0, acc);
  const uint32_t* rows[kRows];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) rows[i] = x + (i0 + i) * ldx;
  for (int64_t p = 0; p < pairs; ++p) {
    const uint32_t* weights = panel + p * kF32GemmPanel;
    __m512bh wv[kVectors];
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      const __m512i loaded = _mm512_loadu_si512(weights + 16 * v);
      wv[v] = reinterpret_cast<const __m512bh&>(loaded);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const __m512i pair = _mm512_set1_epi32(static_cast<int>(rows[i][p]));
      const __m512bh xv = reinterpret_cast<const __m512bh&>(pair);
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], xv, wv[v]);
    }
  }
  StorePartialSums<kRows>(acc, mask, bias, y, ldy, i0);
}

void RunPairs(const float* x, int64_t ldx, int64_t m, int64_t k, const uint16_t* w, int64_t ldw,
              int64_t n, const float* bias, float* y, int64_t ldy) {
  // x rounded once, on the calling thread (M x K conversions against M x K x N products).
  const int64_t pairs_per_row = (k + 1) / 2;
  thread_local std::vector<uint32_t> rounded;
  rounded.resize(static_cast<size_t>(m * pairs_per_row));
  RoundRows(x, ldx, m, k, pairs_per_row, rounded.data());
  const uint32_t* xr = rounded.data();
  const int64_t panels = (n + kF32GemmPanel - 1) / kF32GemmPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint32_t> panel;
    panel.resize(kPairs * kF32GemmPanel);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t r0 = p * kF32GemmPanel;
      const int64_t rows = std::min(kF32GemmPanel, n - r0);
      for (int64_t k0 = 0; k0 < k; k0 += kF32GemmChunk) {
        const int64_t pairs = (std::min(kF32GemmChunk, k - k0) + 1) / 2;
        PackPairs(w, ldw, r0, rows, k0, pairs, k, panel.data());
        const bool last = k0 + kF32GemmChunk >= k;
        const float* chunk_bias = last && bias != nullptr ? bias + r0 : nullptr;
        ForEachRowTile<kTileRows>(m, [&]<int kRows>(int64_t i0) {
          PairTile<kRows>(panel.data(), pairs, xr + k0 / 2, pairs_per_row, i0, rows, k0 == 0,
                          chunk_bias, y + r0, ldy);
        });
      }
    }
  });
}

template <typename E>
void Run(const float* x, int64_t ldx, int64_t m, int64_t k, const E* w, int64_t ldw,
         const float* row_scale, int64_t n, const float* bias, float* y, int64_t ldy) {
  const int64_t panels = (n + kF32GemmPanel - 1) / kF32GemmPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> panel;
    panel.resize(kF32GemmChunk * kF32GemmPanel);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t r0 = p * kF32GemmPanel;
      const int64_t rows = std::min(kF32GemmPanel, n - r0);
      for (int64_t k0 = 0; k0 < k; k0 += kF32GemmChunk) {
        const int64_t columns = std::min(kF32GemmChunk, k - k0);
        PackChunk(w, ldw, row_scale, r0, rows, k0, columns, panel.data());
        const bool last = k0 + columns == k;
        const float* chunk_bias = last && bias != nullptr ? bias + r0 : nullptr;
        ForEachRowTile<kTileRows>(m, [&]<int kRows>(int64_t i0) {
          Tile<kRows>(panel.data(), columns, x + k0, ldx, i0, rows, k0 == 0, chunk_bias, y + r0,
                      ldy);
        });
      }
    }
  });
}
#endif

}  // namespace

bool F32PromptKernelChosen() {
#if defined(__x86_64__)
  static const bool chosen = [] {
    if (!CpuHasAvx512()) return false;
    if (const char* forced = std::getenv("TOPHAT_F32_PROMPT_KERNEL")) {
      const std::string_view value(forced);
      if (value == "on") return true;
      if (value == "off") return false;
    }
    return __builtin_cpu_is("amd") != 0;
  }();
  return chosen;
#else
  return false;
#endif
}

bool LinearF32PromptOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::Tensor& out, const at::Tensor& row_scale) {
#if defined(__x86_64__)
  static const bool avx512 = CpuHasAvx512();
  const at::ScalarType type = weight.scalar_type();
  const bool takes =
      avx512 && x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1 &&
      weight.is_cpu() && weight.dim() == 2 && weight.stride(1) == 1 &&
      (type == at::kFloat || type == at::kBFloat16 ||
       (type == at::kChar && row_scale.defined() && row_scale.scalar_type() == at::kFloat &&
        row_scale.is_contiguous() && row_scale.numel() == weight.size(0))) &&
      weight.size(1) == x.size(1) && out.is_cpu() && out.scalar_type() == at::kFloat &&
      out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0) &&
      out.size(1) == weight.size(0) &&
      (!bias.defined() || (bias.is_cpu() && bias.scalar_type() == at::kFloat &&
                           bias.is_contiguous() && bias.numel() == weight.size(0)));
  if (!takes) return false;
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  if (type == at::kFloat) {
    Run(xp, x.stride(0), x.size(0), x.size(1), weight.data_ptr<float>(), weight.stride(0), nullptr,
        weight.size(0), b, yp, out.stride(0));
  } else if (type == at::kBFloat16) {
    Run(xp, x.stride(0), x.size(0), x.size(1),
        reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), weight.stride(0),
        nullptr, weight.size(0), b, yp, out.stride(0));
  } else {
    Run(xp, x.stride(0), x.size(0), x.size(1), weight.data_ptr<int8_t>(), weight.stride(0),
        row_scale.data_ptr<float>(), weight.size(0), b, yp, out.stride(0));
  }
  return true;
#else
  (void)x, (void)weight, (void)bias, (void)out, (void)row_scale;
  return false;
#endif
}

bool Bf16PromptKernelAvailable() {
#if defined(__x86_64__)
  static const bool available = CpuHasAvx512Bf16();
  return available;
#else
  return false;
#endif
}

bool LinearBf16PromptOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         at::Tensor& out) {
#if defined(__x86_64__)
  const bool takes = Bf16PromptKernelAvailable() && x.is_cpu() && x.scalar_type() == at::kFloat &&
                     x.dim() == 2 && x.stride(1) == 1 && weight.is_cpu() && weight.dim() == 2 &&
                     weight.stride(1) == 1 && weight.scalar_type() == at::kBFloat16 &&
                     weight.size(1) == x.size(1) && out.is_cpu() &&
                     out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                     out.size(0) == x.size(0) && out.size(1) == weight.size(0) &&
                     (!bias.defined() || (bias.is_cpu() && bias.scalar_type() == at::kFloat &&
                                          bias.is_contiguous() && bias.numel() == weight.size(0)));
  if (!takes) return false;
  RunPairs(x.data_ptr<float>(), x.stride(0), x.size(0), x.size(1),
           reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), weight.stride(0),
           weight.size(0), bias.defined() ? bias.data_ptr<float>() : nullptr, out.data_ptr<float>(),
           out.stride(0));
  return true;
#else
  (void)x, (void)weight, (void)bias, (void)out;
  return false;
#endif
}

bool LinearF32PromptIfChosenOut(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& bias, at::Tensor& out,
                                const at::Tensor& row_scale) {
  return x.dim() == 2 && x.size(0) >= kF32GemmMinRows && F32PromptKernelChosen() &&
         LinearF32PromptOut(x, weight, bias, out, row_scale);
}

}  // namespace tophat::kernels
