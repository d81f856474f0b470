// Device-side helpers shared by the CUDA ops (included by .cu files only): bf16 <-> fp32, warp and
// block reductions, launch-size arithmetic. Everything here is `static`/inline so each .cu file
// gets its own copy (no separable compilation needed).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"

namespace rlhf::model::cuda {

using bf16 = __nv_bfloat16;

constexpr int kWarpSize = 32;

/// bf16 -> fp32 (exact).
__device__ __forceinline__ float to_f32(bf16 x) {
  return __bfloat162float(x);
}
/// fp32 -> bf16, round to nearest even.
__device__ __forceinline__ bf16 to_bf16(float x) {
  return __float2bfloat16_rn(x);
}

/// Element `hi` (0: low half, 1: high half) of two packed bf16 (little-endian; a 16-byte load
/// seen as uint32 words) as fp32: the bf16 bits are the float's upper 16 bits, so this equals
/// to_f32 of that element; bits 0 give 0.0f.
__device__ __forceinline__ float bf16_pair_to_f32(uint32_t pair, int hi) {
  const uint32_t bits = hi ? (pair & 0xffff0000u) : (pair << 16);
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

/// Element offset of position s, KV head g, dimension 0 in a paged KV cache (num_blocks, Hkv,
/// block_size, D) (vLLM's head-major blocks), for a sequence whose block ids start at `table`.
/// Neither the block id nor s is validated.
__device__ __forceinline__ int64_t paged_kv_row(const int32_t* table, int64_t s, int64_t g,
                                                int64_t Hkv, int64_t block_size, int64_t D) {
  const int64_t blk = table[s / block_size];
  return ((blk * Hkv + g) * block_size + s % block_size) * D;
}

/// Sum over the 32 lanes of a warp (butterfly: every lane gets the total). All lanes must call it.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/// Max over the 32 lanes of a warp (every lane gets it). All lanes must call it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the whole block (blockDim.x a multiple of 32, at most 1024; 1-D blocks). Every thread
/// gets the total. `scratch` is __shared__ float[32]. Contains __syncthreads(): every thread of
/// the block must call it, and it may be called repeatedly with the same scratch.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
/// Max over the whole block; as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

/// σ(x) and 1 − σ(x) from e = exp(−|x|) ∈ [0, 1] (as the CPU version): never forms exp(+large),
/// and 1 − σ keeps full relative precision for large |x|. SwiGLU's (swiglu.cu, linear_skinny.cu).
__device__ __forceinline__ void sigmoid2(float x, float* s, float* one_minus_s) {
  const float e = expf(-fabsf(x));
  const float r = 1.0f / (1.0f + e), er = e * r;
  *s = x >= 0.0f ? r : er;
  *one_minus_s = x >= 0.0f ? er : r;
}

/// ceil(a / b) for positive b.
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/// Grid size for a grid-stride loop over n elements with `block` threads: enough blocks to cover
/// n, capped (the loop handles the rest) so that the grid fits gridDim.x and does not
/// oversubscribe. At least 1.
inline unsigned grid_for(int64_t n, int block) {
  constexpr int64_t kMaxBlocks = 65535 * 8;
  const int64_t g = ceil_div(n > 0 ? n : 1, block);
  return static_cast<unsigned>(g < kMaxBlocks ? g : kMaxBlocks);
}

}  // namespace rlhf::model::cuda
