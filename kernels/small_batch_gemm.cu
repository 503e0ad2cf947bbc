// The small-batch GEMM (kernels/small_batch_gemm_cuda.cuh says what and why).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda_launch_status.cuh"
#include "kernels/cuda_numeric.cuh"
#include "kernels/cuda_overlap.cuh"
#include "kernels/small_batch_gemm_cuda.cuh"

namespace tophat::kernels {
namespace {

constexpr int kWarps = 8;  // weight rows per block
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;  // 16-byte loads in flight per lane
constexpr int kVector = 8;  // elements per 16 bytes

// 16 bytes of weights, read once: not kept in L1, which holds the activation rows.
__device__ inline uint4 LoadStreaming(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

template <typename T>
__device__ inline float2 Pair(uint32_t bits);
template <>
__device__ inline float2 Pair<__nv_bfloat16>(uint32_t bits) {
  __nv_bfloat162 v;
  memcpy(&v, &bits, sizeof(v));
  return __bfloat1622float2(v);
}
template <>
__device__ inline float2 Pair<__half>(uint32_t bits) {
  __half2 v;
  memcpy(&v, &bits, sizeof(v));
  return __half22float2(v);
}

template <typename T>
__device__ inline float Dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = Pair<T>(ws[i]);
    const float2 b = Pair<T>(xs[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// The weight rows a warp streams (one item of work) and where the rotary form's pair goes.
struct Item {
  int64_t rows[2];
  int kind;  // rotary form: 0 a query pair, 1 a key pair, 2 two value columns
  int head;  // a query or key pair's head
  int i;     // its index in the head's first half; a value pair's first column
};

// Rotary form, item w: the (heads + kv_heads) * half query and key pairs (i, i + half) in
// head order, then kv_heads * head_dim / 2 pairs of adjacent value columns.
__device__ inline Item RotaryItem(int64_t w, const SmallBatchGemmRotary& r) {
  const int half = r.head_dim / 2;
  const int64_t q_pairs = static_cast<int64_t>(r.heads) * half;
  const int64_t k_pairs = static_cast<int64_t>(r.kv_heads) * half;
  Item item{};
  if (w < q_pairs + k_pairs) {
    const bool key = w >= q_pairs;
    const int64_t p = key ? w - q_pairs : w;
    item.kind = key ? 1 : 0;
    item.head = static_cast<int>(p / half);
    item.i = static_cast<int>(p % half);
    item.rows[0] = (static_cast<int64_t>(key ? r.heads : 0) + item.head) * r.head_dim + item.i;
    item.rows[1] = item.rows[0] + half;
  } else {
    item.kind = 2;
    item.i = static_cast<int>(2 * (w - q_pairs - k_pairs));
    item.rows[0] = static_cast<int64_t>(r.heads + r.kv_heads) * r.head_dim + item.i;
    item.rows[1] = item.rows[0] + 1;
  }
  return item;
}

// One warp per item of work: each lane takes every 32nd 16-byte vector of the item's weight
// rows, for all M activation rows at once, so each weight is read once whatever M. An item
// is one weight row in the plain form (out column `item`), and two in the others, streamed
// together (twice the loads in flight): gate row j and up row n + j (kSwiGlu), a query or key
// pair (i, i + half) or two adjacent value columns (kRotaryQkv). `items`: how many.
template <typename T, int M, SmallBatchGemmForm kForm>
__global__ void __launch_bounds__(kThreads)
    SmallBatchGemmKernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ w,
                         const T* __restrict__ bias, T* __restrict__ out, int64_t ldo,
                         int64_t items, int64_t k, SmallBatchGemmRotary rotary) {
  constexpr int kRows = kForm == SmallBatchGemmForm::kPlain ? 1 : 2;
  const int lane = threadIdx.x % 32;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t vectors = k / kVector;
  Item item{};
  if constexpr (kForm == SmallBatchGemmForm::kRotaryQkv) {
    item = RotaryItem(index, rotary);
  } else {
    item.rows[0] = index;
    item.rows[1] = index + items;  // kSwiGlu: the up row
  }
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = reinterpret_cast<const uint4*>(w + item.rows[r] * k);
  // A pass: kUnroll 16-byte vectors of each row a lane, 32 apart.
  uint4 wv[kRows][kUnroll];
  auto load_pass = [&](int64_t base) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * 32;
        wv[r][u] = i < vectors ? LoadStreaming(wr[r] + i) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // The first pass is loaded while the preceding kernel finishes (an overlapped launch):
  // weights, which no kernel of a step writes (kernels/cuda_overlap.cuh), so that the loads
  // are in flight, not just the wait.
  if (index < items) load_pass(lane);
  WaitForPrecedingKernel();
  AllowNextKernelToStart();
  if (index >= items) return;  // the whole warp: index is the same for its lanes
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }
  for (int64_t base = lane; base < vectors; base += 32 * kUnroll) {
    if (base != lane) load_pass(base);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * 32;
      if (i < vectors) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + i);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[r][m] = Dot8<T>(wv[r][u], xv, acc[r][m]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
      }
    }
  }
  if (lane != 0) return;
  // Each product as the plain form writes it: its sum plus the bias (0.0f without one),
  // rounded once to T.
  T product[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float b = bias != nullptr ? ToFloat(bias[item.rows[r]]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) product[r][m] = FromFloat<T>(acc[r][m] + b);
  }
  if constexpr (kForm == SmallBatchGemmForm::kPlain) {
#pragma unroll
    for (int m = 0; m < M; ++m) out[m * ldo + index] = product[0][m];
  } else if constexpr (kForm == SmallBatchGemmForm::kSwiGlu) {
    // The SwiGLU kernel's expression on the rounded gate and up.
#pragma unroll
    for (int m = 0; m < M; ++m) {
      out[m * ldo + index] = FromFloat<T>(SwiGluOf(ToFloat(product[0][m]), ToFloat(product[1][m])));
    }
  } else {
    // The rotary + KV-write kernel's stores, row m being token m.
    const int half = rotary.head_dim / 2;
    T* q_out = static_cast<T*>(rotary.q_out);
    T* key_slots = static_cast<T*>(rotary.key_slots);
    T* value_slots = static_cast<T*>(rotary.value_slots);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int64_t slot = item.kind == 0 ? 0 : rotary.slots[m];
      if (slot < 0) continue;  // a padding row: its query only
      if (item.kind == 2) {
        T* v = value_slots + slot * rotary.kv_heads * rotary.head_dim + item.i;
        v[0] = product[0][m];
        v[1] = product[1][m];
        continue;
      }
      const float x1 = ToFloat(product[0][m]);
      const float x2 = ToFloat(product[1][m]);
      const float c = rotary.cos[m * half + item.i];
      const float s = rotary.sin[m * half + item.i];
      T* head = item.kind == 0
                    ? q_out + (static_cast<int64_t>(m) * rotary.heads + item.head) * rotary.head_dim
                    : key_slots + (slot * rotary.kv_heads + item.head) * rotary.head_dim;
      head[item.i] = FromFloat<T>(RotatedFirst(x1, x2, c, s));
      head[item.i + half] = FromFloat<T>(RotatedSecond(x1, x2, c, s));
    }
  }
}

template <typename T, int M>
void Launch(const SmallBatchGemmArgs& a, cudaStream_t stream) {
  int64_t items = a.n;
  if (a.form == SmallBatchGemmForm::kRotaryQkv) {
    const SmallBatchGemmRotary& r = a.rotary;
    items = static_cast<int64_t>(r.heads + r.kv_heads) * (r.head_dim / 2) +
            static_cast<int64_t>(r.kv_heads) * r.head_dim / 2;
  }
  const auto blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
  auto* kernel = SmallBatchGemmKernel<T, M, SmallBatchGemmForm::kPlain>;
  if (a.form == SmallBatchGemmForm::kSwiGlu) {
    kernel = SmallBatchGemmKernel<T, M, SmallBatchGemmForm::kSwiGlu>;
  } else if (a.form == SmallBatchGemmForm::kRotaryQkv) {
    kernel = SmallBatchGemmKernel<T, M, SmallBatchGemmForm::kRotaryQkv>;
  }
  LaunchKernel(a.overlap, kernel, blocks, kThreads, stream, static_cast<const T*>(a.x), a.ldx,
               static_cast<const T*>(a.weight), static_cast<const T*>(a.bias),
               static_cast<T*>(a.out), a.ldo, items, a.k, a.rotary);
}

template <typename T>
void LaunchRows(const SmallBatchGemmArgs& a, cudaStream_t stream) {
  switch (a.rows) {
    case 1: return Launch<T, 1>(a, stream);
    case 2: return Launch<T, 2>(a, stream);
    case 3: return Launch<T, 3>(a, stream);
    case 4: return Launch<T, 4>(a, stream);
    case 5: return Launch<T, 5>(a, stream);
    case 6: return Launch<T, 6>(a, stream);
    case 7: return Launch<T, 7>(a, stream);
    default: return Launch<T, 8>(a, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

LaunchResult LaunchSmallBatchGemm(const SmallBatchGemmArgs& a, std::string* error) {
  static_assert(kSmallBatchGemmMaxRows == 8, "LaunchRows instantiates rows 1..8");
  const SmallBatchGemmRotary& r = a.rotary;
  const bool rotary = a.form == SmallBatchGemmForm::kRotaryQkv;
  // The rotary form writes no `out`: its n is the weight's rows, (heads + 2 kv_heads) x
  // head_dim.
  const bool rotary_fits = r.heads > 0 && r.kv_heads > 0 && r.head_dim > 0 && r.head_dim % 2 == 0 &&
                           a.n == static_cast<int64_t>(r.heads + 2 * r.kv_heads) * r.head_dim &&
                           r.q_out != nullptr && r.key_slots != nullptr &&
                           r.value_slots != nullptr && r.slots != nullptr && r.cos != nullptr &&
                           r.sin != nullptr;
  if (a.dtype == CudaDtype::kFloat32 || a.rows < 1 || a.rows > kSmallBatchGemmMaxRows || a.n < 1 ||
      a.k < kVector || a.k % kVector != 0 || a.ldx % kVector != 0 || a.ldx < a.k ||
      (!rotary && a.ldo < a.n) || !Aligned16(a.x) || !Aligned16(a.weight) ||
      (a.form == SmallBatchGemmForm::kSwiGlu && a.bias != nullptr) || (rotary && !rotary_fits) ||
      (a.n + kWarps - 1) / kWarps > 0x7fffffff) {
    return LaunchResult::kUnsupported;
  }
  const auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.dtype == CudaDtype::kBFloat16) {
    LaunchRows<__nv_bfloat16>(a, stream);
  } else {
    LaunchRows<__half>(a, stream);
  }
  return LaunchStatus(error);
}

}  // namespace tophat::kernels
