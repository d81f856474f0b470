// Rotary position embedding (Su et al. 2021, RoFormer eq. 34), both pairing conventions.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace rlhf::model {

/// Tables for RoPE: cos[p, i], sin[p, i] = cos/sin(p · theta^(−2i/D)), p < max_pos, i < D/2.
/// cos, sin: (max_pos, D/2); computed in double, stored as T. Throws rlhf::Error unless D is even
/// and positive and theta > 0.
template <typename T>
void rope_tables_cpu(T* cos, T* sin, int64_t max_pos, int64_t D, double theta);

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

}  // namespace rlhf::model
