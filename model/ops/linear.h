// Linear layer through BLAS (OpenBLAS sgemm / dgemm), HF weight convention (out, in).
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// y = x · wᵀ + b (assigned).  y: (N, OC); x: (N, IC); w: (OC, IC); b: (OC) or nullptr.
/// With a bias, y is pre-filled with b and the GEMM adds into it (beta = 1).
template <typename T>
void linear_forward_cpu(T* y, const T* x, const T* w, const T* b, int64_t N, int64_t IC,
                        int64_t OC);

/// dx = dy · w  (or dx += when accumulate_dx; skipped when dx is nullptr),
/// dw += dyᵀ · x (skipped when dw is nullptr: a frozen weight), db += Σ_n dy (skipped when db is
/// nullptr). dy: (N, OC).
/// accumulate_dx lets q/k/v projections (or gate/up) sum their input gradients into one buffer.
/// db sums rows in order per column, so it does not depend on the thread count; dx and dw are
/// whatever order OpenBLAS uses.
template <typename T>
void linear_backward_cpu(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int64_t N,
                         int64_t IC, int64_t OC, bool accumulate_dx);

/// Plain row-major GEMM used by the ops: C(M,N) = alpha·op(A)·op(B) + beta·C, with leading
/// dimensions. Routes to cblas_sgemm / cblas_dgemm. op(A) is (M, K), op(B) is (K, N). K == 0 gives
/// C = beta·C (C = 0 when beta == 0). Throws rlhf::Error when a leading dimension is smaller than
/// its row (which OpenBLAS would only print and ignore) or a dimension exceeds INT_MAX.
template <typename T>
void gemm_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
              int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

#ifdef RLHF_CUDA
/// Rows up to which linear_forward_cuda takes the few-row kernel (linear_forward_skinny_cuda):
/// decode steps of small batches. Measured on an H200 (1B shape): 0.94x cuBLASLt's decode step
/// at 1 row, 1.14x at 8 (each row re-reads x from L1 per weight vector), hence 4.
inline constexpr int64_t kSkinnyMaxRows = 4;

/// The few-row forward of decode steps: y (N, OC) bf16 = x (N, IC) bf16 · w (OC, IC)ᵀ bf16 + b
/// (OC) bf16 or nullptr, fp32 sums rounded once to bf16. One warp per output feature streams w's
/// row with 16-byte loads (the weights are read once, at the memory's bandwidth), every row's
/// sum in the same order whatever N is (a row's result does not depend on the others). Needs
/// 1 <= N <= kSkinnyMaxRows, IC % 8 == 0, x and w 16-byte aligned: throws rlhf::Error otherwise.
void linear_forward_skinny_cuda(bf16* y, const bf16* x, const bf16* w, const bf16* b, int64_t N,
                                int64_t IC, int64_t OC, cudaStream_t stream);

/// The MLP's gate and up projections and SwiGLU in one few-row kernel: h (N, F) bf16 =
/// silu(g)·u with g = bf16(x·w_gateᵀ + b_gate), u = bf16(x·w_upᵀ + b_up) — the values
/// linear_forward_cuda twice and swiglu_forward_cuda give. x (N, IC); w_gate, w_up (F, IC); biases
/// (F) or nullptr. Requirements and errors as linear_forward_skinny_cuda.
void linear_swiglu_skinny_cuda(bf16* h, const bf16* x, const bf16* w_gate, const bf16* b_gate,
                               const bf16* w_up, const bf16* b_up, int64_t N, int64_t IC, int64_t F,
                               cudaStream_t stream);

/// Whether linear_forward_cuda gives (x, w, N, IC) to linear_forward_skinny_cuda: it is enabled
/// (set_linear_skinny_enabled; on by default) and its requirements hold.
bool linear_skinny_serves(const bf16* x, const bf16* w, int64_t N, int64_t IC) noexcept;

/// Process-wide switch of the few-row kernel (on by default): `rlhf bench generate` times decode
/// with and without it; the CUDA graphs captured meanwhile keep the kernels they captured.
void set_linear_skinny_enabled(bool on) noexcept;

/// CUDA forward through cuBLASLt, same contract: y (N, OC) bf16 = x (N, IC) bf16 · w (OC, IC)ᵀ
/// bf16 + b (OC) bf16 or nullptr; fp32 accumulation (CUBLAS_COMPUTE_32F), one bf16 rounding of
/// the result. The bias is added by the CUBLASLT_EPILOGUE_BIAS epilogue when b is 16-byte aligned,
/// else y is pre-filled with b and the GEMM adds into it (beta = 1). When cuBLASLt offers no
/// algorithm for the shape, falls back to cublasGemmEx. Handles and a 32 MiB workspace per
/// (device, stream) are created on first use and cached for the life of the process (see
/// linear_cuda_release). Up to kSkinnyMaxRows rows go to linear_forward_skinny_cuda where
/// linear_skinny_serves says so. N = 0 is a no-op. Throws rlhf::Error if N < 0, IC <= 0 or
/// OC <= 0, or on a cuBLAS error.
void linear_forward_cuda(bf16* y, const bf16* x, const bf16* w, const bf16* b, int64_t N,
                         int64_t IC, int64_t OC, cudaStream_t stream);

/// CUDA backward, same contract as linear_backward_cpu with fp32 parameter gradients:
///   dx (N, IC) bf16  = dy · w   (+= when accumulate_dx; skipped when dx is nullptr)
///   dw (OC, IC) fp32 += dyᵀ · x (skipped when dw is nullptr: a frozen weight)
///   db (OC) fp32     += Σ_n dy  (skipped when db is nullptr; fixed-order column sums,
///                                deterministic)
/// dy (N, OC) bf16, x (N, IC) bf16, w (OC, IC) bf16. GEMMs through cuBLASLt (A, B bf16; C, D bf16
/// for dx and fp32 for dw; fp32 compute). Throws like forward.
void linear_backward_cuda(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                          const bf16* w, int64_t N, int64_t IC, int64_t OC, bool accumulate_dx,
                          cudaStream_t stream);

/// Frees the cached cuBLASLt handles and workspaces of every device and stream (the caller must
/// have synchronised the streams that used them). Optional: the cache is otherwise released at
/// process exit by the driver. Never throws.
void linear_cuda_release() noexcept;
#endif

}  // namespace rlhf::model
