// GCC vector types the CPU kernels are written in once for every instruction set: each
// kernel body is a template over the vector type, inlined into one function per instruction
// set compiled with its target attribute, where the vectors become zmm (AVX-512), ymm (AVX2)
// or NEON registers.
//
// GCC warns (-Wpsabi) that 32- and 64-byte vectors change the ABI of functions compiled
// without AVX; these vectors never cross a call: every helper is always inlined. The kernels
// that use them turn the warning off around their bodies too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tophat::kernels {

typedef float Vec4 __attribute__((vector_size(16)));
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec16 __attribute__((vector_size(64)));

template <typename V>
[[gnu::always_inline]] inline V LoadVector(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

// A vector's two halves added.
template <typename Half, typename V>
[[gnu::always_inline]] inline Half AddHalves(const V& v) {
  static_assert(2 * sizeof(Half) == sizeof(V), "half of V");
  Half low;
  Half high;
  std::memcpy(&low, &v, sizeof low);
  std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof low, sizeof high);
  return low + high;
}

// The sum of the lanes, as a tree: halves added as vectors down to four lanes (an extract
// and one add per level), then those four, instead of fifteen dependent scalar adds for
// sixteen lanes, which the GEMV kernels pay once per row (a row of 768 values is only 24
// iterations of their loop).
template <typename V>
[[gnu::always_inline]] inline float SumLanes(const V& v) {
  if constexpr (sizeof(V) == sizeof(Vec16)) {
    return SumLanes<Vec8>(AddHalves<Vec8>(v));
  } else if constexpr (sizeof(V) == sizeof(Vec8)) {
    return SumLanes<Vec4>(AddHalves<Vec4>(v));
  } else {
    float s = 0.0f;
    for (size_t i = 0; i < sizeof(V) / sizeof(float); ++i) s += v[i];
    return s;
  }
}

}  // namespace tophat::kernels

#pragma GCC diagnostic pop
