// Rotary position embedding (Su et al. 2021, RoFormer eq. 34), both pairing conventions.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/ops/cuda_types.h"
#include "model/ops/kv_cache.h"

namespace rlhf::model {

/// Tables for RoPE: cos[p, i], sin[p, i] = cos/sin(p · theta^(−2i/D)), p < max_pos, i < D/2.
/// cos, sin: (max_pos, D/2); computed in double, stored as T. Throws rlhf::Error unless D is even
/// and positive and theta > 0.
template <typename T>
void rope_tables_cpu(T* cos, T* sin, int64_t max_pos, int64_t D, double theta);

/// Tables for RoPE from given inverse frequencies: cos[p, i], sin[p, i] = cos/sin(p · inv_freq[i]),
/// p < max_pos, i < D/2; the angle p·inv_freq[i] and its cos/sin are computed in double, stored as
/// T. inv_freq: D/2 values in radians per position (model::rope_inv_freq(config): default or
/// llama3-scaled); with rope_default_inv_freq(D, theta) the tables are bit-identical to the theta
/// overload's. cos, sin: (max_pos, D/2). Throws rlhf::Error unless D is even and positive,
/// max_pos >= 0 and inv_freq is non-null.
template <typename T>
void rope_tables_cpu(T* cos, T* sin, int64_t max_pos, int64_t D, const double* inv_freq);

/// Rotates each head of x by its token's position. out, x: (N, H, D) (out may alias x);
/// pos: (N) int32 positions in [0, max_pos); cos, sin: from rope_tables_cpu.
/// kInterleaved rotates pairs (2i, 2i+1); kRotateHalf rotates pairs (i, i + D/2); pair i turns by
/// angle pos·theta^(−2i/D): (a, b) → (a·cos − b·sin, a·sin + b·cos). Throws rlhf::Error on a
/// negative position; positions ≥ max_pos are the caller's to prevent (the tables' length is not
/// passed in).
template <typename T>
void rope_forward_cpu(T* out, const T* x, const int32_t* pos, const T* cos, const T* sin, int64_t N,
                      int64_t H, int64_t D, RopeStyle style);

/// dx = Rᵀ · dout (the inverse rotation; dx may alias dout). Shapes as forward.
template <typename T>
void rope_backward_cpu(T* dx, const T* dout, const int32_t* pos, const T* cos, const T* sin,
                       int64_t N, int64_t H, int64_t D, RopeStyle style);

#ifdef RLHF_CUDA
/// CUDA forward, same contract: out, x (N, H, D) bf16 (out may alias x), pos (N) int32 device
/// positions, cos, sin (max_pos, D/2) fp32 device tables (rope_tables_cpu<float>, uploaded once).
/// fp32 math, one bf16 rounding. Positions are not validated on the device: the caller keeps them
/// in [0, max_pos) (a negative one yields NaN in its row instead of reading outside the table).
/// Throws rlhf::Error unless D is even and positive, N >= 0, H > 0.
void rope_forward_cuda(bf16* out, const bf16* x, const int32_t* pos, const float* cos,
                       const float* sin, int64_t N, int64_t H, int64_t D, RopeStyle style,
                       cudaStream_t stream);

/// CUDA backward: dx = Rᵀ · dout (assigned; dx may alias dout). Shapes and dtypes as forward.
void rope_backward_cuda(bf16* dx, const bf16* dout, const int32_t* pos, const float* cos,
                        const float* sin, int64_t N, int64_t H, int64_t D, RopeStyle style,
                        cudaStream_t stream);

/// RoPE fused with the split of a packed QKV projection (the one GEMM of the back-to-back q/k/v
/// weights, LayerParams::qkv_packed): qkv (N, (H + 2·Hkv)·D) bf16, each row [H q heads | Hkv k
/// heads | Hkv v heads]. Writes q (N, H, D) and k (N, Hkv, D) rotated exactly as
/// rope_forward_cuda rotates them (same rounding, bit-identical), and v (N, Hkv, D) copied: one
/// pass over qkv instead of two rotations in place. pos, cos, sin as rope_forward_cuda. With
/// `cache` (the generation engine), the same k and v rows also go into the paged KV cache, as
/// kv_cache_write_cuda with cache's arguments and pos would write them (one kernel fewer per
/// layer). Throws rlhf::Error unless D is even and positive, N >= 0, H > 0, Hkv > 0, and a cache's
/// block_size > 0.
void qkv_rope_split_cuda(bf16* q, bf16* k, bf16* v, const bf16* qkv, const int32_t* pos,
                         const float* cos, const float* sin, int64_t N, int64_t H, int64_t Hkv,
                         int64_t D, RopeStyle style, cudaStream_t stream,
                         const KvCacheWrite* cache = nullptr);

/// Backward of qkv_rope_split_cuda: dqkv rows = [Rᵀ·dq | Rᵀ·dk | dv] (assigned), the gradient of
/// the packed QKV GEMM output. Shapes as the forward; dq, dk rotated back exactly as
/// rope_backward_cuda does. Throws like the forward.
void qkv_rope_merge_backward_cuda(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv,
                                  const int32_t* pos, const float* cos, const float* sin, int64_t N,
                                  int64_t H, int64_t Hkv, int64_t D, RopeStyle style,
                                  cudaStream_t stream);

/// The RoPE tables of rope_tables_cpu<float> computed on the host and copied into device arrays
/// cos, sin of max_pos·D/2 floats each (synchronous). Throws rlhf::Error on a CUDA failure.
void rope_tables_upload_cuda(float* cos, float* sin, int64_t max_pos, int64_t D, double theta);

/// The RoPE tables of rope_tables_cpu<float>(.., inv_freq) (D/2 host inverse frequencies, e.g.
/// model::rope_inv_freq(config)) computed on the host and copied into device arrays cos, sin of
/// max_pos·D/2 floats each (synchronous). Throws rlhf::Error as rope_tables_cpu and on a CUDA
/// failure.
void rope_tables_upload_cuda(float* cos, float* sin, int64_t max_pos, int64_t D,
                             const double* inv_freq);
#endif

}  // namespace rlhf::model
