#include "kernels/gemm_int8.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/avx512_tile.h"
#include "kernels/gemv_mxfp4.h"
#include "kernels/row_tiles.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace tophat::kernels {
namespace {

constexpr int64_t kBlock = kActivationBlock;  // 32 values: 8 four-value groups
constexpr int64_t kGroupsPerBlock = kBlock / 4;
// Blocks of the panel one pass of x's tiles reads: 8 blocks of 48 rows are 12 KiB, which stay
// in a 32 KiB L1 data cache beside the x tile's 1 KiB.
constexpr int64_t kChunkBlocks = 8;

int64_t BlocksOf(int64_t k) { return (k + kBlock - 1) / kBlock; }

// Whether `isa` multiplies with vpdpbusd (unsigned bytes by signed ones), so that its panels
// carry +128 and x's block sums come off (TileAvx512); sdot multiplies signed by signed.
bool BiasedPanels(W8A8Isa isa) { return isa == W8A8Isa::kAvx512Vnni || isa == W8A8Isa::kAvxVnni; }

// x's rows as the kernels read them: row i's int8 values at q + i * ldq (zeros past cols,
// in nibble order for MXFP4), its block scales at scale + i * blocks, and 128 times each
// block's sum of values at bias + i * blocks (AVX-512 only: see TileAvx512).
struct PromptRows {
  const int8_t* q = nullptr;
  int64_t ldq = 0;
  const float* scale = nullptr;
  const int32_t* bias = nullptr;
  int64_t blocks = 0;
};

// One panel of weight rows [r0, r0 + kInt8GemmPanel), repacked: for block b and four-value
// group g, the int32 word at ((b * 8 + g) * kInt8GemmPanel + j) holds row r0 + j's values
// 32 b + 4 g .. + 3 (rows past the matrix: zeros). For AVX-512 each byte has 128 added (see
// TileAvx512). MXFP4: block_scale[b * kInt8GemmPanel + j] is row r0 + j's block b's power of
// two, halved for the doubled codes; int8: row_scale[j] is the row's scale.
struct Panel {
  const uint8_t* values = nullptr;
  const float* block_scale = nullptr;  // MXFP4 only
  const float* row_scale = nullptr;    // int8 only
  int64_t rows = 0;                    // rows of the panel inside the matrix
};

// Four rows' block b as 4 x 32 signed values, then scattered into the panel's groups.
void PackFourRows(const int8_t (&values)[4][kBlock], int64_t b, int64_t j, bool biased,
                  uint8_t* panel) {
  const uint32_t flip = biased ? 0x80808080u : 0u;
  for (int64_t g = 0; g < kGroupsPerBlock; ++g) {
    uint8_t* to = panel + ((b * kGroupsPerBlock + g) * kInt8GemmPanel + j) * 4;
    for (int row = 0; row < 4; ++row) {
      uint32_t word;
      std::memcpy(&word, values[row] + g * 4, 4);
      word ^= flip;  // +128 in every byte, mod 256: int8 v becomes uint8 v + 128
      std::memcpy(to + row * 4, &word, 4);
    }
  }
}

// One MXFP4 block's 32 doubled codes in nibble order: the 16 low nibbles', then the 16 high.
void DecodeMxfp4Block(const uint8_t* bytes, int8_t* codes) {
#if defined(__aarch64__)
  const int8x16_t table = vld1q_s8(kMxfp4DoubledCodes.data());
  const uint8x16_t packed = vld1q_u8(bytes);
  vst1q_s8(codes, vqtbl1q_s8(table, vandq_u8(packed, vdupq_n_u8(0x0F))));
  vst1q_s8(codes + 16, vqtbl1q_s8(table, vshrq_n_u8(packed, 4)));
#else
  for (int v = 0; v < 16; ++v) {
    codes[v] = kMxfp4DoubledCodes[bytes[v] & 0x0F];
    codes[16 + v] = kMxfp4DoubledCodes[bytes[v] >> 4];
  }
#endif
}

// Repacks blocks [b0, blocks) of rows [r0, r0 + kInt8GemmPanel) of the matrix into `values`
// (blocks * 32 * kInt8GemmPanel bytes), four rows' block at a time.
void PackPanelBlocks(const Int8GemmWeights& w, int64_t r0, int64_t b0, bool biased,
                     uint8_t* values) {
  const int64_t blocks = BlocksOf(w.cols);
  const int64_t rows = std::min(kInt8GemmPanel, w.rows - r0);
  int8_t four[4][kBlock];
  for (int64_t j = 0; j < kInt8GemmPanel; j += 4) {
    for (int64_t b = b0; b < blocks; ++b) {
      for (int row = 0; row < 4; ++row) {
        const int64_t r = r0 + j + row;
        if (j + row >= rows) {
          std::memset(four[row], 0, kBlock);
        } else if (w.mxfp4_blocks != nullptr) {
          DecodeMxfp4Block(w.mxfp4_blocks + (r * blocks + b) * 16, four[row]);
        } else {
          const int64_t begin = b * kBlock;
          const int64_t count = std::min(kBlock, w.cols - begin);
          std::memcpy(four[row], w.int8_values + r * w.int8_stride + begin, count);
          std::memset(four[row] + count, 0, kBlock - count);
        }
      }
      PackFourRows(four, b, j, biased, values);
    }
  }
}

#if defined(__x86_64__)
// A gather's rows are as many streams, which the hardware prefetchers do not follow (out of
// cache the packing took twice the products' time in a gpt-oss layer's prefill): as the
// gathers reach offset `at` of their rows (a new cache line), each row's line kAheadBytes
// further is asked for; at = -1 asks for the lines before that.
constexpr int64_t kAheadBytes = 256;
inline void PrefetchRowsAhead(const uint8_t* row0, int64_t row_bytes, int64_t rows, int64_t at) {
  for (int64_t row = 0; row < rows; ++row) {
    const uint8_t* line = row0 + row * row_bytes;
    if (at < 0) {
      for (int64_t ahead = 0; ahead < kAheadBytes; ahead += 64) __builtin_prefetch(line + ahead);
    } else {
      __builtin_prefetch(line + at + kAheadBytes);
    }
  }
}

// What the gathering packers below read of rows [r0, r0 + kInt8GemmPanel): each row's bytes
// (MXFP4: 16 a block; int8: 32 a block, at the matrix's row stride), and MXFP4's doubled
// codes plus 128 as a lookup table repeated in each 128-bit lane.
struct GatherSource {
  bool mxfp4 = false;
  int64_t rows = 0;  // of the panel inside the matrix
  int64_t row_bytes = 0;
  int64_t block_bytes = 0;
  const uint8_t* first = nullptr;  // row r0
  alignas(64) std::array<uint8_t, 64> biased_codes{};

  GatherSource(const Int8GemmWeights& w, int64_t r0)
      : mxfp4(w.mxfp4_blocks != nullptr),
        rows(std::min(kInt8GemmPanel, w.rows - r0)),
        row_bytes(mxfp4 ? BlocksOf(w.cols) * 16 : w.int8_stride),
        block_bytes(mxfp4 ? 16 : kBlock),
        first((mxfp4 ? w.mxfp4_blocks : reinterpret_cast<const uint8_t*>(w.int8_values)) +
              r0 * row_bytes) {
    for (int c = 0; c < 64; ++c) {
      biased_codes[c] = static_cast<uint8_t>(kMxfp4DoubledCodes[c % 16] + 128);
    }
  }
  // Panel rows [j, j + lanes) inside the matrix, and their first row's bytes.
  int64_t LanesFrom(int64_t j, int64_t lanes) const {
    return std::clamp<int64_t>(rows - j, 0, lanes);
  }
  const uint8_t* Row(int64_t j) const { return first + j * row_bytes; }
};

// The same for AVX-512 (values biased by 128), 16 rows at a time: each group of four values
// of 16 rows is one gather of int32 words (rows past the matrix masked off, so zero). MXFP4's
// gathered words hold four bytes of codes, which one table lookup (of the doubled codes plus
// 128) turns into the low nibbles' group and another into the high nibbles'. Five to six
// times the rate of the four-row loop, which took 40% of the time for an expert's 32 rows.
// Blocks [0, whole) only: an int8 row's last part-block is left to PackPanelBlocks.
__attribute__((target("avx512f,avx512bw"))) void PackPanelAvx512(const Int8GemmWeights& w,
                                                                 int64_t r0, int64_t whole,
                                                                 uint8_t* values) {
  const GatherSource source(w, r0);
  const __m512i lane_offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(source.row_bytes)));
  const __m512i table = _mm512_load_si512(source.biased_codes.data());
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = 0; j < kInt8GemmPanel; j += 16) {
    const int64_t lanes = source.LanesFrom(j, 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
    const uint8_t* row0 = source.Row(j);
    PrefetchRowsAhead(row0, source.row_bytes, lanes, -1);
    for (int64_t b = 0; b < whole; ++b) {
      const int64_t at = b * source.block_bytes;
      if (at % 64 == 0) PrefetchRowsAhead(row0, source.row_bytes, lanes, at);
      // Group g of these 16 rows' block b goes to to + g * kInt8GemmPanel * 4.
      uint8_t* to = values + (b * kGroupsPerBlock * kInt8GemmPanel + j) * 4;
      for (int64_t g = 0; g < (source.mxfp4 ? 4 : kGroupsPerBlock); ++g) {
        const __m512i words = lanes == 0
                                  ? _mm512_setzero_si512()
                                  : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask,
                                                                lane_offsets, row0 + at + 4 * g, 1);
        if (source.mxfp4) {
          _mm512_storeu_si512(to + g * kInt8GemmPanel * 4,
                              _mm512_shuffle_epi8(table, _mm512_and_si512(words, nibble)));
          _mm512_storeu_si512(
              to + (g + 4) * kInt8GemmPanel * 4,
              _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(words, 4), nibble)));
        } else {
          _mm512_storeu_si512(to + g * kInt8GemmPanel * 4, _mm512_xor_si512(words, flip));
        }
      }
    }
  }
}

// The same with AVX2's 8-lane gathers, for AVX-VNNI's CPUs (no AVX-512): 8 rows at a time.
__attribute__((target("avx2"))) void PackPanelAvx2(const Int8GemmWeights& w, int64_t r0,
                                                   int64_t whole, uint8_t* values) {
  const GatherSource source(w, r0);
  const __m256i lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lane_offsets =
      _mm256_mullo_epi32(lane_index, _mm256_set1_epi32(static_cast<int32_t>(source.row_bytes)));
  const __m256i table =
      _mm256_load_si256(reinterpret_cast<const __m256i*>(source.biased_codes.data()));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = 0; j < kInt8GemmPanel; j += 8) {
    const int64_t lanes = source.LanesFrom(j, 8);
    // A lane gathers where its mask's top bit is set: lanes [0, lanes).
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(lanes)), lane_index);
    const uint8_t* row0 = source.Row(j);
    PrefetchRowsAhead(row0, source.row_bytes, lanes, -1);
    for (int64_t b = 0; b < whole; ++b) {
      const int64_t at = b * source.block_bytes;
      if (at % 64 == 0) PrefetchRowsAhead(row0, source.row_bytes, lanes, at);
      uint8_t* to = values + (b * kGroupsPerBlock * kInt8GemmPanel + j) * 4;
      for (int64_t g = 0; g < (source.mxfp4 ? 4 : kGroupsPerBlock); ++g) {
        const __m256i words = lanes == 0 ? _mm256_setzero_si256()
                                         : _mm256_mask_i32gather_epi32(
                                               _mm256_setzero_si256(),
                                               reinterpret_cast<const int*>(row0 + at + 4 * g),
                                               lane_offsets, mask, 1);
        __m256i* low = reinterpret_cast<__m256i*>(to + g * kInt8GemmPanel * 4);
        if (source.mxfp4) {
          __m256i* high = reinterpret_cast<__m256i*>(to + (g + 4) * kInt8GemmPanel * 4);
          _mm256_storeu_si256(low, _mm256_shuffle_epi8(table, _mm256_and_si256(words, nibble)));
          _mm256_storeu_si256(
              high,
              _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(words, 4), nibble)));
        } else {
          _mm256_storeu_si256(low, _mm256_xor_si256(words, flip));
        }
      }
    }
  }
}
#endif

// Repacks rows [r0, r0 + kInt8GemmPanel) of the matrix into `values` (blocks * 32 *
// kInt8GemmPanel bytes) and the scales into `block_scale` (MXFP4: blocks * kInt8GemmPanel)
// or `row_scale` (int8: kInt8GemmPanel).
void PackPanel(W8A8Isa isa, const Int8GemmWeights& w, int64_t r0, uint8_t* values,
               float* block_scale, float* row_scale) {
  const int64_t blocks = BlocksOf(w.cols);
  const int64_t rows = std::min(kInt8GemmPanel, w.rows - r0);
  const bool biased = BiasedPanels(isa);
  int64_t packed = 0;
#if defined(__x86_64__)
  if (biased) {
    packed = w.mxfp4_blocks != nullptr ? blocks : w.cols / kBlock;
    (isa == W8A8Isa::kAvx512Vnni ? PackPanelAvx512 : PackPanelAvx2)(w, r0, packed, values);
  }
#endif
  if (packed < blocks) PackPanelBlocks(w, r0, packed, biased, values);
  if (w.mxfp4_blocks != nullptr) {
    const std::array<float, 256>& halved = Mxfp4HalvedScales();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t j = 0; j < kInt8GemmPanel; ++j) {
        block_scale[b * kInt8GemmPanel + j] =
            j < rows ? halved[w.mxfp4_scales[(r0 + j) * blocks + b]] : 0.0f;
      }
    }
  } else {
    for (int64_t j = 0; j < kInt8GemmPanel; ++j)
      row_scale[j] = j < rows ? w.row_scale[r0 + j] : 0.0f;
  }
}

#if defined(__x86_64__)
// Rows i0 .. i0 + kRows of x against the whole panel, blocks [b0, b1). vpdpbusd multiplies
// unsigned bytes by signed ones, summing four products into each int32 lane. The panel's
// values carry +128 (unsigned, 1..255 for int8 and 116..140 for MXFP4's doubled codes) and
// x's four values go in signed, broadcast to every lane; so a lane sums (w + 128) x, and
// subtracting 128 times the block's sum of x (PromptRows::bias, one broadcast per row and
// block) leaves the exact sum of w x. y holds the partial sums between chunks.
template <int kRows, bool kBlockScales>
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), flatten)) void TileAvx512(
    const Panel& panel, const PromptRows& x, int64_t i0, int64_t b0, int64_t b1, bool first,
    bool last, float* y, int64_t ldy) {
  constexpr int kVectors = kInt8GemmPanel / 16;
  __mmask16 mask[kVectors];
  PanelLaneMasks(panel.rows, mask);
  __m512 acc[kRows][kVectors];
  StartPartialSums<kRows>(first, mask, y, ldy, i0, acc);
  for (int64_t b = b0; b < b1; ++b) {
    __m512i sum[kRows][kVectors];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) sum[i][v] = _mm512_setzero_si512();
    }
    const uint8_t* block = panel.values + b * kGroupsPerBlock * kInt8GemmPanel * 4;
#pragma GCC unroll 8
    for (int64_t g = 0; g < kGroupsPerBlock; ++g) {
      __m512i wv[kVectors];
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) {
        wv[v] = _mm512_loadu_si512(block + (g * kInt8GemmPanel + 16 * v) * 4);
      }
#pragma GCC unroll 16
      for (int i = 0; i < kRows; ++i) {
        int32_t four;
        std::memcpy(&four, x.q + (i0 + i) * x.ldq + b * kBlock + g * 4, 4);
        const __m512i xv = _mm512_set1_epi32(four);
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) sum[i][v] = _mm512_dpbusd_epi32(sum[i][v], wv[v], xv);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const __m512i bias = _mm512_set1_epi32(x.bias[(i0 + i) * x.blocks + b]);
      const __m512 scale = _mm512_set1_ps(x.scale[(i0 + i) * x.blocks + b]);
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) {
        __m512 block_sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[i][v], bias));
        if constexpr (kBlockScales) {
          block_sum = _mm512_mul_ps(
              block_sum, _mm512_loadu_ps(panel.block_scale + b * kInt8GemmPanel + 16 * v));
        }
        acc[i][v] = _mm512_fmadd_ps(block_sum, scale, acc[i][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < kVectors; ++v) {
    const __m512 row_scale =
        !kBlockScales && last ? _mm512_loadu_ps(panel.row_scale + 16 * v) : _mm512_set1_ps(1.0f);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      _mm512_mask_storeu_ps(y + (i0 + i) * ldy + 16 * v, mask[v],
                            _mm512_mul_ps(acc[i][v], row_scale));
    }
  }
}
#endif

#if defined(__x86_64__)
// The same with AVX-VNNI (vpdpbusd on 256-bit vectors) for 16 panel rows [j, j + 16), two
// vectors of 8. AVX2 has 16 vector registers: kRows (at most 3) x 2 int32 sums and float
// sums, the two weight vectors and x's broadcast.
template <int kRows, bool kBlockScales>
__attribute__((target("avx2,fma,avxvnni"), flatten)) void TileAvxVnni(
    const Panel& panel, const PromptRows& x, int64_t i0, int64_t j, int64_t b0, int64_t b1,
    bool first, bool last, float* y, int64_t ldy) {
  const int64_t columns = std::clamp<int64_t>(panel.rows - j, 0, 16);
  __m256 acc[kRows][2];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) {
    alignas(32) float partial[16] = {};
    if (!first) std::memcpy(partial, y + (i0 + i) * ldy + j, columns * sizeof(float));
    acc[i][0] = _mm256_load_ps(partial);
    acc[i][1] = _mm256_load_ps(partial + 8);
  }
  for (int64_t b = b0; b < b1; ++b) {
    __m256i sum[kRows][2];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) sum[i][0] = sum[i][1] = _mm256_setzero_si256();
    const uint8_t* block = panel.values + (b * kGroupsPerBlock * kInt8GemmPanel + j) * 4;
#pragma GCC unroll 8
    for (int64_t g = 0; g < kGroupsPerBlock; ++g) {
      const uint8_t* group = block + g * kInt8GemmPanel * 4;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32));
#pragma GCC unroll 16
      for (int i = 0; i < kRows; ++i) {
        int32_t four;
        std::memcpy(&four, x.q + (i0 + i) * x.ldq + b * kBlock + g * 4, 4);
        const __m256i xv = _mm256_set1_epi32(four);
        sum[i][0] = _mm256_dpbusd_avx_epi32(sum[i][0], w0, xv);
        sum[i][1] = _mm256_dpbusd_avx_epi32(sum[i][1], w1, xv);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const __m256i bias = _mm256_set1_epi32(x.bias[(i0 + i) * x.blocks + b]);
      const __m256 scale = _mm256_set1_ps(x.scale[(i0 + i) * x.blocks + b]);
#pragma GCC unroll 16
      for (int v = 0; v < 2; ++v) {
        __m256 block_sum = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[i][v], bias));
        if constexpr (kBlockScales) {
          block_sum = _mm256_mul_ps(
              block_sum, _mm256_loadu_ps(panel.block_scale + b * kInt8GemmPanel + j + 8 * v));
        }
        acc[i][v] = _mm256_fmadd_ps(block_sum, scale, acc[i][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) {
    alignas(32) float out[16];
#pragma GCC unroll 16
    for (int v = 0; v < 2; ++v) {
      __m256 value = acc[i][v];
      if (!kBlockScales && last) {
        value = _mm256_mul_ps(value, _mm256_loadu_ps(panel.row_scale + j + 8 * v));
      }
      _mm256_store_ps(out + 8 * v, value);
    }
    std::memcpy(y + (i0 + i) * ldy + j, out, columns * sizeof(float));
  }
}
#endif

#if defined(__aarch64__)
// One group of four values of eight panel rows (two vectors of four rows) against each x
// row's four values in lane kLane of its 16-value vector.
template <int kRows, int kLane>
__attribute__((target("arch=armv8.2-a+dotprod"), always_inline)) inline void SdotGroup(
    const int8_t* group, const int8x16_t (&xv)[kRows], int32x4_t (&sum)[kRows][2]) {
  const int8x16_t w0 = vld1q_s8(group);
  const int8x16_t w1 = vld1q_s8(group + 16);
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) {
    sum[i][0] = vdotq_laneq_s32(sum[i][0], w0, xv[i], kLane);
    sum[i][1] = vdotq_laneq_s32(sum[i][1], w1, xv[i], kLane);
  }
}

// Rows i0 .. i0 + kRows of x against eight panel rows [j, j + 8), blocks [b0, b1). sdot
// multiplies signed bytes by signed bytes, summing four products into each int32 lane; the
// lane form takes x's four values from one lane of a 16-value vector, so one load of x serves
// four groups. y holds the partial sums between chunks.
template <int kRows, bool kBlockScales>
__attribute__((target("arch=armv8.2-a+dotprod"), flatten)) void TileNeonDot(
    const Panel& panel, const PromptRows& x, int64_t i0, int64_t j, int64_t b0, int64_t b1,
    bool first, bool last, float* y, int64_t ldy) {
  const int64_t columns = std::clamp<int64_t>(panel.rows - j, 0, 8);
  float32x4_t acc[kRows][2];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) {
    float partial[8] = {};
    if (!first) std::memcpy(partial, y + (i0 + i) * ldy + j, columns * sizeof(float));
    acc[i][0] = vld1q_f32(partial);
    acc[i][1] = vld1q_f32(partial + 4);
  }
  for (int64_t b = b0; b < b1; ++b) {
    int32x4_t sum[kRows][2];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) sum[i][0] = sum[i][1] = vdupq_n_s32(0);
    const int8_t* block = reinterpret_cast<const int8_t*>(panel.values) +
                          (b * kGroupsPerBlock * kInt8GemmPanel + j) * 4;
#pragma GCC unroll 16
    for (int half = 0; half < 2; ++half) {
      int8x16_t xv[kRows];
#pragma GCC unroll 16
      for (int i = 0; i < kRows; ++i)
        xv[i] = vld1q_s8(x.q + (i0 + i) * x.ldq + b * kBlock + half * 16);
      SdotGroup<kRows, 0>(block + (half * 4 + 0) * kInt8GemmPanel * 4, xv, sum);
      SdotGroup<kRows, 1>(block + (half * 4 + 1) * kInt8GemmPanel * 4, xv, sum);
      SdotGroup<kRows, 2>(block + (half * 4 + 2) * kInt8GemmPanel * 4, xv, sum);
      SdotGroup<kRows, 3>(block + (half * 4 + 3) * kInt8GemmPanel * 4, xv, sum);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const float scale = x.scale[(i0 + i) * x.blocks + b];
#pragma GCC unroll 16
      for (int v = 0; v < 2; ++v) {
        float32x4_t block_sum = vcvtq_f32_s32(sum[i][v]);
        if constexpr (kBlockScales) {
          block_sum =
              vmulq_f32(block_sum, vld1q_f32(panel.block_scale + b * kInt8GemmPanel + j + 4 * v));
        }
        acc[i][v] = vfmaq_n_f32(acc[i][v], block_sum, scale);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) {
    float out[8];
#pragma GCC unroll 16
    for (int v = 0; v < 2; ++v) {
      float32x4_t value = acc[i][v];
      if (!kBlockScales && last) value = vmulq_f32(value, vld1q_f32(panel.row_scale + j + 4 * v));
      vst1q_f32(out + 4 * v, value);
    }
    std::memcpy(y + (i0 + i) * ldy + j, out, columns * sizeof(float));
  }
}
#endif

// One chunk of blocks of the panel against all of x's rows.
template <bool kBlockScales>
void RunPanelChunk(W8A8Isa isa, const Panel& panel, const PromptRows& x, int64_t m, int64_t b0,
                   int64_t b1, bool first, bool last, float* y, int64_t ldy) {
  const int64_t width = std::min(panel.rows, kInt8GemmPanel);
#if defined(__x86_64__)
  if (isa == W8A8Isa::kAvx512Vnni) {
    ForEachRowTile<4>(m, [&]<int kRows>(int64_t i0) {
      TileAvx512<kRows, kBlockScales>(panel, x, i0, b0, b1, first, last, y, ldy);
    });
  } else {
    ForEachRowTile<3>(m, [&]<int kRows>(int64_t i0) {
      for (int64_t j = 0; j < width; j += 16) {
        TileAvxVnni<kRows, kBlockScales>(panel, x, i0, j, b0, b1, first, last, y, ldy);
      }
    });
  }
#elif defined(__aarch64__)
  (void)isa;
  ForEachRowTile<4>(m, [&]<int kRows>(int64_t i0) {
    for (int64_t j = 0; j < width; j += 8) {
      TileNeonDot<kRows, kBlockScales>(panel, x, i0, j, b0, b1, first, last, y, ldy);
    }
  });
#else
  (void)isa, (void)panel, (void)x, (void)m, (void)b0, (void)b1, (void)first, (void)last, (void)y,
      (void)ldy, (void)width;
#endif
}

}  // namespace

bool HasInt8Gemm(W8A8Isa isa) {
#if defined(__x86_64__)
  return isa == W8A8Isa::kAvx512Vnni || isa == W8A8Isa::kAvxVnni;
#elif defined(__aarch64__)
  return isa == W8A8Isa::kNeonDot;
#else
  (void)isa;
  return false;
#endif
}

void ToNibbleOrder(const int8_t* q, int64_t k, int8_t* ordered) {
  for (int64_t j = 0; j < k; j += kBlock) {
    for (int v = 0; v < 16; ++v) {
      ordered[j + v] = q[j + 2 * v];
      ordered[j + 16 + v] = q[j + 2 * v + 1];
    }
  }
}

void Int8GemmRows(W8A8Isa isa, const float* x, int64_t ldx, int64_t m,
                  const Int8GemmWeights& weights, float* y, int64_t ldy) {
  TORCH_CHECK(HasInt8Gemm(isa), "Int8GemmRows: no prompt kernel for ", W8A8IsaName(isa));
  const bool mxfp4 = weights.mxfp4_blocks != nullptr;
  TORCH_CHECK(!mxfp4 || weights.cols % kBlock == 0, "Int8GemmRows: MXFP4 rows of ", weights.cols,
              " values, not whole blocks");
  const bool biased = BiasedPanels(isa);
  const int64_t k = weights.cols;
  const int64_t blocks = BlocksOf(k);
  const int64_t padded = blocks * kBlock;

  // x rounded once into buffers of this thread that grow once; rows in parallel.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<int32_t> bias;
  if (static_cast<int64_t>(q.size()) < m * padded) q.resize(m * padded);
  if (static_cast<int64_t>(scale.size()) < m * blocks) scale.resize(m * blocks);
  if (static_cast<int64_t>(bias.size()) < m * blocks) bias.resize(m * blocks);
  int8_t* qp = q.data();
  float* scalep = scale.data();
  int32_t* biasp = bias.data();
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    thread_local std::vector<int8_t> row;
    if (static_cast<int64_t>(row.size()) < padded) row.resize(padded);
    for (int64_t i = begin; i < end; ++i) {
      int8_t* qi = qp + i * padded;
      RoundActivationRow(x + i * ldx, k, mxfp4 ? row.data() : qi, scalep + i * blocks);
      if (mxfp4) ToNibbleOrder(row.data(), k, qi);
      std::fill(qi + k, qi + padded, int8_t{0});
      if (biased) {
        for (int64_t b = 0; b < blocks; ++b) {
          int32_t total = 0;
          for (int64_t v = 0; v < kBlock; ++v) total += qi[b * kBlock + v];
          biasp[i * blocks + b] = 128 * total;
        }
      }
    }
  });
  const PromptRows rows{.q = qp, .ldq = padded, .scale = scalep, .bias = biasp, .blocks = blocks};

  const int64_t panels = (weights.rows + kInt8GemmPanel - 1) / kInt8GemmPanel;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint8_t> values;
    thread_local std::vector<float> block_scale;
    thread_local std::vector<float> row_scale;
    if (static_cast<int64_t>(values.size()) < padded * kInt8GemmPanel) {
      values.resize(padded * kInt8GemmPanel);
    }
    if (static_cast<int64_t>(block_scale.size()) < blocks * kInt8GemmPanel) {
      block_scale.resize(blocks * kInt8GemmPanel);
    }
    row_scale.resize(kInt8GemmPanel);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t r0 = p * kInt8GemmPanel;
      PackPanel(isa, weights, r0, values.data(), block_scale.data(), row_scale.data());
      const Panel panel{.values = values.data(),
                        .block_scale = block_scale.data(),
                        .row_scale = row_scale.data(),
                        .rows = std::min(kInt8GemmPanel, weights.rows - r0)};
      for (int64_t b0 = 0; b0 < blocks; b0 += kChunkBlocks) {
        const int64_t b1 = std::min(blocks, b0 + kChunkBlocks);
        if (mxfp4) {
          RunPanelChunk<true>(isa, panel, rows, m, b0, b1, b0 == 0, b1 == blocks, y + r0, ldy);
        } else {
          RunPanelChunk<false>(isa, panel, rows, m, b0, b1, b0 == 0, b1 == blocks, y + r0, ldy);
        }
      }
    }
  });
}

}  // namespace tophat::kernels
