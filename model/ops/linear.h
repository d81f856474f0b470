// Linear layer through BLAS (OpenBLAS sgemm / dgemm), HF weight convention (out, in).
#pragma once

#include <cstdint>

namespace rlhf::model {

/// y = x · wᵀ + b (assigned).  y: (N, OC); x: (N, IC); w: (OC, IC); b: (OC) or nullptr.
/// With a bias, y is pre-filled with b and the GEMM adds into it (beta = 1).
template <typename T>
void linear_forward_cpu(T* y, const T* x, const T* w, const T* b, int64_t N, int64_t IC,
                        int64_t OC);

/// dx = dy · w  (or dx += when accumulate_dx; skipped when dx is nullptr),
/// dw += dyᵀ · x, db += Σ_n dy (skipped when db is nullptr). dy: (N, OC).
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

}  // namespace rlhf::model
