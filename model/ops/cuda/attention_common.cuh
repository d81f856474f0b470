// What the attention kernels of attention.cu (training: flash forward and backward) and
// attention_decode.cu (generation: decode over the KV cache) share: their thread-block geometry
// and the host-side checks and launch arithmetic. Included by those .cu files only.
#pragma once

#include <cstdint>

#include "model/ops/cuda/cuda_common.cuh"

namespace rlhf::model::attn {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 4;                      // warps per block (128 threads)
constexpr int kBc = 32;                        // keys per shared-memory tile (one per lane)
constexpr int kFwdRows = 4;                    // forward: query rows per warp
constexpr int kFwdBr = kWarps * kFwdRows;      // forward: 16 query rows per block
constexpr int kDqRows = 2;                     // backward dq: query rows per warp
constexpr int kDqBr = kWarps * kDqRows;        // backward dq: 8 query rows per block
constexpr int kKeysPerWarp = 8;                // backward dk/dv: keys owned per warp
constexpr int kDkvBc = kWarps * kKeysPerWarp;  // backward dk/dv: 32 keys per block
constexpr int kDkvBr = 32;                     // backward dk/dv: query rows per shared tile
constexpr int kMaxD = 128;
constexpr int kDecodeMaxHeadsPerWarp = 4;  // decode: G <= kWarps · 4 = 16

// Dot product of a shared row a[0, D) with a shared row b[0, D).
__device__ __forceinline__ float dot_shared(const float* a, const float* b, int D) {
  float acc = 0.0f;
  for (int d = 0; d < D; ++d) acc += a[d] * b[d];
  return acc;
}

inline void check_dims(const char* op, int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D) {
  RLHF_CHECK(B > 0 && T_ > 0 && H > 0 && Hkv > 0 && D > 0,
             "{}: all dimensions must be > 0, got B={} T={} H={} Hkv={} D={}", op, B, T_, H, Hkv,
             D);
  RLHF_CHECK(H % Hkv == 0,
             "{}: num_attention_heads H={} is not a multiple of num_key_value_heads Hkv={}", op, H,
             Hkv);
  RLHF_CHECK(D <= kMaxD, "{}: head_dim D={} is above the {} this kernel supports", op, D, kMaxD);
  RLHF_CHECK(T_ <= INT32_MAX / 2 && B * H * T_ <= INT32_MAX && B * T_ * H * D < (int64_t{1} << 62),
             "{}: sizes too large (B={} T={} H={} D={})", op, B, T_, H, D);
}

// Number of 32-wide dimension chunks per lane: 1, 2 or 4 (D <= 128).
inline int d_chunks(int64_t D) {
  return D <= 32 ? 1 : D <= 64 ? 2 : 4;
}

// Grid sizes are 1-D (gridDim.x allows 2^31 − 1 blocks).
inline unsigned grid_1d(int64_t blocks, const char* op) {
  RLHF_CHECK(blocks > 0 && blocks <= INT32_MAX, "{}: {} blocks do not fit one grid", op, blocks);
  return static_cast<unsigned>(blocks);
}

}  // namespace rlhf::model::attn
