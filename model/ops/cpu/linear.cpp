#include "model/ops/linear.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "core/error.h"
#include "model/op_clock.h"

namespace rlhf::model {

namespace {

// BLAS takes 32-bit ints (this OpenBLAS is LP64); a dimension past INT_MAX would silently wrap.
blasint to_blas(int64_t v, const char* what) {
  RLHF_CHECK(v >= 0 && v <= INT_MAX, "gemm_cpu: {} = {} does not fit a 32-bit BLAS int", what, v);
  return static_cast<blasint>(v);
}

// Leading dimensions are checked here because OpenBLAS's xerbla prints and returns on a bad one,
// leaving C untouched: that must be an error, not a silently wrong result.
void check_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc) {
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  RLHF_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_cpu: negative dimension M={} N={} K={}", M, N, K);
  RLHF_CHECK(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
                 ldc >= std::max<int64_t>(1, N),
             "gemm_cpu: leading dimension too small (M={} N={} K={} trans_a={} trans_b={}: lda={} "
             "needs >= {}, ldb={} needs >= {}, ldc={} needs >= {})",
             M, N, K, trans_a, trans_b, lda, a_cols, ldb, b_cols, ldc, N);
}

// C = beta·C for K == 0 (no product term); beta == 0 assigns zeros so NaN/garbage in C never leaks.
template <typename T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}

}  // namespace

template <typename T>
void gemm_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
              int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const blasint m = to_blas(M, "M"), n = to_blas(N, "N"), k = to_blas(K, "K");
  const blasint la = to_blas(lda, "lda"), lb = to_blas(ldb, "ldb"), lc = to_blas(ldc, "ldc");
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, la, B, lb, beta, C, lc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, la, B, lb, beta, C, lc);
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void linear_forward_cpu(T* y, const T* x, const T* w, const T* b, int64_t N, int64_t IC,
                        int64_t OC) {
  const OpClock clock(OpKind::kGemm);
  // (N, OC) = (N, IC) · (OC, IC)ᵀ; with a bias, y is pre-filled with b and the GEMM adds into it
  // (beta = 1), which costs one write pass instead of a read-modify-write pass after the GEMM.
  T beta = T(0);
  if (b != nullptr) {
    beta = T(1);
#pragma omp parallel for schedule(static) if (N * OC >= 32768)
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + OC, y + n * OC);
  }
  gemm_cpu<T>(false, true, N, OC, IC, T(1), x, IC, w, IC, beta, y, OC);
}

template <typename T>
void linear_backward_cpu(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int64_t N,
                         int64_t IC, int64_t OC, bool accumulate_dx) {
  const OpClock clock(OpKind::kGemm);
  // dx (N, IC) = dy (N, OC) · w (OC, IC)
  if (dx != nullptr)
    gemm_cpu<T>(false, false, N, IC, OC, T(1), dy, OC, w, IC, accumulate_dx ? T(1) : T(0), dx, IC);
  // dw (OC, IC) += dyᵀ (OC, N) · x (N, IC); a frozen weight (dw = nullptr) has none.
  if (dw != nullptr) gemm_cpu<T>(true, false, OC, IC, N, T(1), dy, OC, x, IC, T(1), dw, IC);
  if (db == nullptr) return;
  // db (OC) += Σ_n dy[n, :]. Columns are split into fixed blocks across threads and each column
  // sums its rows in order, so the result does not depend on the thread count.
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * OC >= 32768)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, len = std::min(OC, c0 + kBlock) - c0;
    T acc[kBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* dyr = dy + n * OC + c0;
#pragma omp simd
      for (int64_t c = 0; c < len; ++c) acc[c] += dyr[c];
    }
    for (int64_t c = 0; c < len; ++c) db[c0 + c] += acc[c];
  }
}

template void gemm_cpu<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                              const float*, int64_t, float, float*, int64_t);
template void gemm_cpu<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                               int64_t, const double*, int64_t, double, double*, int64_t);
template void linear_forward_cpu<float>(float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t);
template void linear_forward_cpu<double>(double*, const double*, const double*, const double*,
                                         int64_t, int64_t, int64_t);
template void linear_backward_cpu<float>(float*, float*, float*, const float*, const float*,
                                         const float*, int64_t, int64_t, int64_t, bool);
template void linear_backward_cpu<double>(double*, double*, double*, const double*, const double*,
                                          const double*, int64_t, int64_t, int64_t, bool);

}  // namespace rlhf::model
