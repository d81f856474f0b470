// Linear layer through BLAS (OpenBLAS sgemm / dgemm), HF weight convention (out, in).
#pragma once

#include <cstdint>

namespace rlhf::model {

/// y = x · wᵀ + b.  y: (N, OC); x: (N, IC); w: (OC, IC); b: (OC) or nullptr.
template <typename T>
void linear_forward_cpu(T* y, const T* x, const T* w, const T* b, int64_t N, int64_t IC,
                        int64_t OC);

/// dx = dy · w  (or dx += when accumulate_dx; skipped when dx is nullptr),
/// dw += dyᵀ · x, db += Σ_n dy (skipped when db is nullptr). dy: (N, OC).
/// accumulate_dx lets q/k/v projections (or gate/up) sum their input gradients into one buffer.
template <typename T>
void linear_backward_cpu(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int64_t N,
                         int64_t IC, int64_t OC, bool accumulate_dx);

/// Plain row-major GEMM used by the ops: C(M,N) = alpha·op(A)·op(B) + beta·C, with leading
/// dimensions. Routes to cblas_sgemm / cblas_dgemm.
template <typename T>
void gemm_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
              int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

}  // namespace rlhf::model
