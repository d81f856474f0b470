// The few-row linear forward of decode steps (model/ops/linear.h, linear_forward_skinny_cuda):
// y (N, OC) = x (N, IC) · w (OC, IC)ᵀ + b for N <= kSkinnyMaxRows. A decode step reads every
// weight once for a handful of rows, so its time is the weights' bytes over the memory bandwidth;
// this kernel streams each weight row once with 16-byte loads and keeps every row's dot product
// in registers, where a general GEMM tiles for reuse that a few rows cannot give.
//
// One warp per output feature o: lane l reads 8 consecutive weights (16 bytes) at chunks
// l, l + 32, ... of w's row o, multiplies them with the same 8 elements of each of the N rows of
// x (read through the read-only cache: every warp of the grid reads x, which stays in L1/L2),
// accumulates N fp32 sums, and the warp's butterfly sum gives the N dot products; lane 0 adds the
// bias and rounds once to bf16. Each row's sum is formed in the same order whatever N is, so a
// row's result does not depend on the other rows (batch-invariant). The gated form
// (linear_swiglu_skinny_cuda) reads the gate's and the up projection's rows together and writes
// SwiGLU of the two rounded results: the MLP's first half of a decode step in one kernel.
#include <atomic>

#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/linear.h"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

constexpr int kThreads = 256;  // 8 warps, 8 output features per block
constexpr int kUnroll = 4;     // 16-byte weight loads in flight per lane

std::atomic<bool> g_skinny_enabled{true};

// The low and the high bf16 of a 32-bit word as fp32 (exact).
__device__ __forceinline__ float lo_f32(uint32_t pair) {
  return cuda::bf16_pair_to_f32(pair, 0);
}
__device__ __forceinline__ float hi_f32(uint32_t pair) {
  return cuda::bf16_pair_to_f32(pair, 1);
}

// acc += Σ_e a[e]·b[e] over the 8 bf16 of two 16-byte vectors, in a fixed order.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  acc = fmaf(lo_f32(a.x), lo_f32(b.x), acc);
  acc = fmaf(hi_f32(a.x), hi_f32(b.x), acc);
  acc = fmaf(lo_f32(a.y), lo_f32(b.y), acc);
  acc = fmaf(hi_f32(a.y), hi_f32(b.y), acc);
  acc = fmaf(lo_f32(a.z), lo_f32(b.z), acc);
  acc = fmaf(hi_f32(a.z), hi_f32(b.z), acc);
  acc = fmaf(lo_f32(a.w), lo_f32(b.w), acc);
  acc = fmaf(hi_f32(a.w), hi_f32(b.w), acc);
  return acc;
}

// Grid: ceil(OC / 8) blocks of 8 warps; warp w of block b computes feature o = 8·b + w for all
// NR rows. chunks = IC / 8 (IC % 8 == 0; x and the weights 16-byte aligned). kGlu: w2/b2 are the
// up projection's, w/b the gate's, and y gets SwiGLU of the two rounded outputs,
// silu(gate)·up, as swiglu_forward_cuda computes it from the two GEMMs' bf16 outputs.
template <int NR, bool kGlu>
__global__ void __launch_bounds__(kThreads)
    skinny_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                  const bf16* __restrict__ b, const bf16* __restrict__ w2,
                  const bf16* __restrict__ b2, int64_t chunks, int64_t OC) {
  constexpr int kW = kGlu ? 2 : 1;  // weight rows per feature
  const int lane = threadIdx.x % cuda::kWarpSize;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * (kThreads / cuda::kWarpSize) +
                    threadIdx.x / cuda::kWarpSize;
  if (o >= OC) return;  // the whole warp leaves together
  const uint4* wr[kW];
  wr[0] = reinterpret_cast<const uint4*>(w) + o * chunks;
  if constexpr (kGlu) wr[kW - 1] = reinterpret_cast<const uint4*>(w2) + o * chunks;
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[kW][NR];
#pragma unroll
  for (int m = 0; m < kW; ++m)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[m][r] = 0.0f;
  int64_t c = lane;
  for (; c + (kUnroll - 1) * cuda::kWarpSize < chunks; c += kUnroll * cuda::kWarpSize) {
    uint4 wv[kW][kUnroll];
#pragma unroll
    for (int m = 0; m < kW; ++m)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[m][u] = __ldg(wr[m] + c + u * cuda::kWarpSize);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const uint4 xv = __ldg(xr + r * chunks + c + u * cuda::kWarpSize);
#pragma unroll
        for (int m = 0; m < kW; ++m) acc[m][r] = dot8(wv[m][u], xv, acc[m][r]);
      }
  }
  for (; c < chunks; c += cuda::kWarpSize) {
    uint4 wv[kW];
#pragma unroll
    for (int m = 0; m < kW; ++m) wv[m] = __ldg(wr[m] + c);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const uint4 xv = __ldg(xr + r * chunks + c);
#pragma unroll
      for (int m = 0; m < kW; ++m) acc[m][r] = dot8(wv[m], xv, acc[m][r]);
    }
  }
#pragma unroll
  for (int m = 0; m < kW; ++m)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[m][r] = cuda::warp_sum(acc[m][r]);
  if (lane != 0) return;
  const float bias = b != nullptr ? to_f32(b[o]) : 0.0f;
  if constexpr (kGlu) {
    const float bias2 = b2 != nullptr ? to_f32(b2[o]) : 0.0f;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const float g = to_f32(to_bf16(acc[0][r] + bias)), u = to_f32(to_bf16(acc[1][r] + bias2));
      float sg, one_minus;
      cuda::sigmoid2(g, &sg, &one_minus);
      y[r * OC + o] = to_bf16(g * sg * u);
    }
  } else {
#pragma unroll
    for (int r = 0; r < NR; ++r) y[r * OC + o] = to_bf16(acc[0][r] + bias);
  }
}

template <int NR, bool kGlu>
void launch(bf16* y, const bf16* x, const bf16* w, const bf16* b, const bf16* w2, const bf16* b2,
            int64_t IC, int64_t OC, cudaStream_t stream) {
  const int64_t per_block = kThreads / cuda::kWarpSize;
  const auto blocks = static_cast<unsigned>((OC + per_block - 1) / per_block);
  skinny_kernel<NR, kGlu><<<blocks, kThreads, 0, stream>>>(y, x, w, b, w2, b2, IC / 8, OC);
  CUDA_CHECK(cudaGetLastError());
}

template <bool kGlu>
void launch_rows(bf16* y, const bf16* x, const bf16* w, const bf16* b, const bf16* w2,
                 const bf16* b2, int64_t N, int64_t IC, int64_t OC, cudaStream_t stream) {
  static_assert(kSkinnyMaxRows == 4, "one case per row count up to kSkinnyMaxRows");
  switch (N) {
    case 1:
      return launch<1, kGlu>(y, x, w, b, w2, b2, IC, OC, stream);
    case 2:
      return launch<2, kGlu>(y, x, w, b, w2, b2, IC, OC, stream);
    case 3:
      return launch<3, kGlu>(y, x, w, b, w2, b2, IC, OC, stream);
    default:
      return launch<4, kGlu>(y, x, w, b, w2, b2, IC, OC, stream);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

void check_args(const char* op, const bf16* x, const bf16* w, const bf16* w2, int64_t N, int64_t IC,
                int64_t OC) {
  RLHF_CHECK(N >= 1 && N <= kSkinnyMaxRows && IC > 0 && IC % 8 == 0 && OC > 0,
             "{}: needs 1 <= N <= {} and IC % 8 == 0, got N={} IC={} OC={}", op, kSkinnyMaxRows, N,
             IC, OC);
  RLHF_CHECK(aligned16(x) && aligned16(w) && (w2 == nullptr || aligned16(w2)),
             "{}: x and the weights must be 16-byte aligned", op);
}

}  // namespace

void set_linear_skinny_enabled(bool on) noexcept {
  g_skinny_enabled.store(on);
}

bool linear_skinny_serves(const bf16* x, const bf16* w, int64_t N, int64_t IC) noexcept {
  return g_skinny_enabled.load() && N >= 1 && N <= kSkinnyMaxRows && IC % 8 == 0 && aligned16(x) &&
         aligned16(w);
}

void linear_forward_skinny_cuda(bf16* y, const bf16* x, const bf16* w, const bf16* b, int64_t N,
                                int64_t IC, int64_t OC, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_args("linear_forward_skinny_cuda", x, w, nullptr, N, IC, OC);
  launch_rows<false>(y, x, w, b, nullptr, nullptr, N, IC, OC, stream);
}

void linear_swiglu_skinny_cuda(bf16* h, const bf16* x, const bf16* w_gate, const bf16* b_gate,
                               const bf16* w_up, const bf16* b_up, int64_t N, int64_t IC, int64_t F,
                               cudaStream_t stream) {
  NVTX_RANGE_FN();
  RLHF_CHECK(w_up != nullptr, "linear_swiglu_skinny_cuda: no up projection weight");
  check_args("linear_swiglu_skinny_cuda", x, w_gate, w_up, N, IC, F);
  launch_rows<true>(h, x, w_gate, b_gate, w_up, b_up, N, IC, F, stream);
}

}  // namespace rlhf::model
