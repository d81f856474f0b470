// RMSNorm (Zhang & Sennrich 2019, eq. 4).
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// y = x * rsqrt(mean(x^2) + eps) * w.
/// y, x: (N, C); w: (C); rstd: (N), saved for backward (1 / rms per row).
template <typename T>
void rmsnorm_forward_cpu(T* y, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps);

/// dx += (x is the residual stream: accumulates), dw += (parameter; skipped when dw is nullptr: a
/// frozen weight). dy: (N, C).
template <typename T>
void rmsnorm_backward_cpu(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                          int64_t N, int64_t C);

#ifdef RLHF_CUDA
/// CUDA forward, same contract: y (N, C) bf16, rstd (N) fp32, x (N, C) bf16, w (C) bf16; sum of
/// squares and scaling in fp32 (one warp per row), y rounded once to bf16. Throws rlhf::Error if
/// N < 0 or C <= 0.
void rmsnorm_forward_cuda(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t N, int64_t C,
                          double eps, cudaStream_t stream);

/// Fused residual add + RMSNorm forward (one read of each input, llm.c's fused_residual_forward):
///   residual_out = bf16(residual_in + x)            (N, C) bf16; may alias residual_in
///   y = rmsnorm(residual_out) · w, rstd as above     (normalises the rounded sum: what backward
///                                                     reads as its x)
/// x (N, C) bf16 (the branch output), w (C) bf16. Equivalent to residual_forward then
/// rmsnorm_forward. Throws like rmsnorm_forward_cuda.
void rmsnorm_residual_forward_cuda(bf16* residual_out, bf16* y, float* rstd,
                                   const bf16* residual_in, const bf16* x, const bf16* w, int64_t N,
                                   int64_t C, double eps, cudaStream_t stream);

/// CUDA backward: dx (N, C) bf16 += (residual stream), dw (C) fp32 += (parameter gradient, fp32),
/// dy (N, C) bf16, x and w as forward, rstd (N) fp32 from forward. dx: one warp per row, fp32
/// math, one bf16 rounding of the sum. dw: in two stages — blocks of 32 columns × 128 rows into
/// a stream-ordered scratch (cudaMallocAsync), then each column's chunks in order — so the sum
/// has a fixed order (deterministic, no atomics) and every SM a share of the rows; skipped when
/// dw is nullptr (a frozen weight).
void rmsnorm_backward_cuda(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                           const float* rstd, int64_t N, int64_t C, cudaStream_t stream);
#endif

}  // namespace rlhf::model
