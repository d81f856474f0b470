#include "model/ops/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "model/op_clock.h"
#include "model/ops/cpu/attention_layout.h"
#include "model/ops/cpu/vec_math.h"

namespace rlhf::model {

namespace {

// Row-major GEMM, C(M,N) = alpha·op(A)·op(B) + beta·C. Local on purpose (model/ops/linear.h's
// gemm_cpu does the same): these calls run inside an OpenMP region, where the OpenMP build of
// OpenBLAS runs single-threaded, one (b, h) per thread.
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                 int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

// Queries are processed in blocks of kRowBlock rows; block [t0, t1) only needs key columns
// [0, t1), so the GEMMs skip the masked upper triangle block by block (at T = 256 they do 62% of
// the full T×T work).
constexpr int64_t kRowBlock = 64;

// n rounded up to a whole number of 16-lane vectors, capped at the row length.
inline int64_t padded_len(int64_t n, int64_t row_len) {
  return std::min(row_len, (n + 15) / 16 * 16);
}

void check_dims(const char* op, int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D) {
  RLHF_CHECK(B > 0 && T_ > 0 && H > 0 && Hkv > 0 && D > 0,
             "{}: all dimensions must be > 0, got B={} T={} H={} Hkv={} D={}", op, B, T_, H, Hkv,
             D);
  RLHF_CHECK(H % Hkv == 0,
             "{}: num_attention_heads H={} is not a multiple of num_key_value_heads Hkv={}", op, H,
             Hkv);
}

}  // namespace

namespace {

std::vector<int32_t> uniform_cu(int64_t B, int64_t T_) {
  std::vector<int32_t> cu(size_t(B + 1));
  for (int64_t b = 0; b <= B; ++b) cu[size_t(b)] = int32_t(b * T_);
  return cu;
}

void check_cu(const char* op, const int32_t* cu, int64_t n) {
  RLHF_CHECK(cu != nullptr && n >= 1 && cu[0] == 0, "{}: cu_seqlens must start at 0 (n = {})", op,
             n);
  for (int64_t s = 0; s < n; ++s)
    RLHF_CHECK(cu[s + 1] > cu[s], "{}: sample {} of the packed batch is empty", op, s);
}

// Per (sample, head), per block of query rows [t0, t1) of the sample's Tn tokens:
//   P[t0:t1, 0:t1] = Q[t0:t1] · K[0:t1]ᵀ / sqrt(D)            (GEMM, written straight into att)
//   row-wise softmax over s ≤ t, zeros for s > t
//   out[t0:t1]     = P[t0:t1, 0:t1] · V[0:t1]                  (GEMM)
template <typename T>
void forward_varlen(T* out, T* att, const T* q, const T* k, const T* v, const int32_t* cu,
                    int64_t n_seqs, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t G = H / Hkv;               // query heads per KV head
  const int64_t qs = H * D, ks = Hkv * D;  // row strides of q/out and k/v
  const T sc = T(1) / std::sqrt(static_cast<T>(D));
  const std::vector<int64_t> aoff = attention_prob_offsets(cu, n_seqs, H);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < n_seqs * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, g = h / G;
    const int64_t t_first = cu[b], T_ = cu[b + 1] - cu[b];
    const T* qb = q + t_first * qs + h * D;  // (T, D), row stride qs
    const T* kb = k + t_first * ks + g * D;  // (T, D), row stride ks
    const T* vb = v + t_first * ks + g * D;
    T* ob = out + t_first * qs + h * D;
    T* P = att + aoff[size_t(b)] + h * T_ * T_;  // (T, T)
    for (int64_t t0 = 0; t0 < T_; t0 += kRowBlock) {
      const int64_t t1 = std::min(T_, t0 + kRowBlock), m = t1 - t0;
      gemm(false, true, m, t1, D, sc, qb + t0 * qs, qs, kb, ks, T(0), P + t0 * T_, T_);
      for (int64_t t = t0; t < t1; ++t) {
        T* row = P + t * T_;
        const int64_t n = t + 1, n_pad = padded_len(n, T_);
        // −inf in the padding: the vector loops below then run whole vectors only (a scalar
        // remainder of exp calls costs more than the vector part for short rows) and give 0 there.
        for (int64_t s = n; s < n_pad; ++s) row[s] = -std::numeric_limits<T>::infinity();
        T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd simdlen(16) reduction(max : mx)
        for (int64_t s = 0; s < n_pad; ++s) mx = row[s] > mx ? row[s] : mx;  // std::max: scalar
        T sum = 0;
#pragma omp simd simdlen(16) reduction(+ : sum)
        for (int64_t s = 0; s < n_pad; ++s) {
          const T e = exp_vec(row[s] - mx);
          row[s] = e;
          sum += e;
        }
        const T inv = T(1) / sum;
#pragma omp simd simdlen(16)
        for (int64_t s = 0; s < n_pad; ++s) row[s] *= inv;
        std::fill(row + n_pad, row + T_, T(0));
      }
      gemm(false, false, m, D, t1, T(1), P + t0 * T_, T_, vb, ks, T(0), ob + t0 * qs, qs);
    }
  }
}

// With S = QKᵀ/sqrt(D), P = softmax(S) (causal), O = PV and dO given:
//   dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ⊙ (dP − rowsum(P ⊙ dP)),  dQ = dS·K/sqrt(D),
//   dK = dSᵀ·Q/sqrt(D),
// dK and dV summed over the G query heads of each KV head. The loop runs over (sample, KV head),
// each owned by one thread that adds its heads and row blocks in a fixed order: the result is
// deterministic and independent of the thread count, with no atomics. Per thread scratch: one
// (kRowBlock, longest sample) block of dP/dS, allocated once per call.
template <typename T>
void backward_varlen(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q, const T* k,
                     const T* v, const int32_t* cu, int64_t n_seqs, int64_t H, int64_t Hkv,
                     int64_t D) {
  const int64_t G = H / Hkv;
  const int64_t qs = H * D, ks = Hkv * D;
  const T sc = T(1) / std::sqrt(static_cast<T>(D));
  const std::vector<int64_t> aoff = attention_prob_offsets(cu, n_seqs, H);
  int64_t longest = 0;
  for (int64_t s = 0; s < n_seqs; ++s) longest = std::max<int64_t>(longest, cu[s + 1] - cu[s]);
  // Allocated here, not inside the parallel region, so that a failed allocation throws normally.
  const int64_t ds_elems = std::min(kRowBlock, longest) * longest;
  std::vector<T> ds_buf(static_cast<size_t>(omp_get_max_threads() * ds_elems));
#pragma omp parallel
  {
    T* ds = ds_buf.data() + omp_get_thread_num() * ds_elems;
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < n_seqs * Hkv; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      const int64_t t_first = cu[b], T_ = cu[b + 1] - cu[b];
      const T* kb = k + t_first * ks + g * D;
      const T* vb = v + t_first * ks + g * D;
      T* dkb = dk + t_first * ks + g * D;
      T* dvb = dv + t_first * ks + g * D;
      for (int64_t t = 0; t < T_; ++t) {
        std::fill(dkb + t * ks, dkb + t * ks + D, T(0));
        std::fill(dvb + t * ks, dvb + t * ks + D, T(0));
      }
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        const T* qb = q + t_first * qs + h * D;
        const T* dob = dout + t_first * qs + h * D;
        T* dqb = dq + t_first * qs + h * D;
        const T* P = att + aoff[size_t(b)] + h * T_ * T_;
        for (int64_t t0 = 0; t0 < T_; t0 += kRowBlock) {
          const int64_t t1 = std::min(T_, t0 + kRowBlock), m = t1 - t0;
          // dP = dO[t0:t1] · V[0:t1]ᵀ  -> ds (m, t1)
          gemm(false, true, m, t1, D, T(1), dob + t0 * qs, qs, vb, ks, T(0), ds, t1);
          // dV[0:t1] += P[t0:t1, 0:t1]ᵀ · dO[t0:t1]
          gemm(true, false, t1, D, m, T(1), P + t0 * T_, T_, dob + t0 * qs, qs, T(1), dvb, ks);
          // dS = P ⊙ (dP − rowsum(P ⊙ dP)) / sqrt(D), zero above the diagonal
          for (int64_t t = t0; t < t1; ++t) {
            const T* prow = P + t * T_;
            T* drow = ds + (t - t0) * t1;
            // Whole vectors: beyond the diagonal P is 0, so those entries of dS come out 0.
            const int64_t n_pad = padded_len(t + 1, t1);
            T dot = 0;
#pragma omp simd simdlen(16) reduction(+ : dot)
            for (int64_t s = 0; s < n_pad; ++s) dot += prow[s] * drow[s];
#pragma omp simd simdlen(16)
            for (int64_t s = 0; s < n_pad; ++s) drow[s] = sc * prow[s] * (drow[s] - dot);
            std::fill(drow + n_pad, drow + t1, T(0));
          }
          // dQ[t0:t1] = dS · K[0:t1]
          gemm(false, false, m, D, t1, T(1), ds, t1, kb, ks, T(0), dqb + t0 * qs, qs);
          // dK[0:t1] += dSᵀ · Q[t0:t1]
          gemm(true, false, t1, D, m, T(1), ds, t1, qb + t0 * qs, qs, T(1), dkb, ks);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_forward_cpu(T* out, T* att, const T* q, const T* k, const T* v, int64_t B,
                           int64_t T_, int64_t H, int64_t Hkv, int64_t D) {
  const OpClock clock(OpKind::kAttention);
  check_dims("attention_forward_cpu", B, T_, H, Hkv, D);
  forward_varlen(out, att, q, k, v, uniform_cu(B, T_).data(), B, H, Hkv, D);
}

template <typename T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q,
                            const T* k, const T* v, int64_t B, int64_t T_, int64_t H, int64_t Hkv,
                            int64_t D) {
  const OpClock clock(OpKind::kAttention);
  check_dims("attention_backward_cpu", B, T_, H, Hkv, D);
  backward_varlen(dq, dk, dv, dout, att, q, k, v, uniform_cu(B, T_).data(), B, H, Hkv, D);
}

template <typename T>
void attention_forward_varlen_cpu(T* out, T* att, const T* q, const T* k, const T* v,
                                  const int32_t* cu_seqlens, int64_t n_seqs, int64_t H, int64_t Hkv,
                                  int64_t D) {
  const OpClock clock(OpKind::kAttention);
  check_dims("attention_forward_varlen_cpu", n_seqs, 1, H, Hkv, D);
  check_cu("attention_forward_varlen_cpu", cu_seqlens, n_seqs);
  forward_varlen(out, att, q, k, v, cu_seqlens, n_seqs, H, Hkv, D);
}

template <typename T>
void attention_backward_varlen_cpu(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q,
                                   const T* k, const T* v, const int32_t* cu_seqlens,
                                   int64_t n_seqs, int64_t H, int64_t Hkv, int64_t D) {
  const OpClock clock(OpKind::kAttention);
  check_dims("attention_backward_varlen_cpu", n_seqs, 1, H, Hkv, D);
  check_cu("attention_backward_varlen_cpu", cu_seqlens, n_seqs);
  backward_varlen(dq, dk, dv, dout, att, q, k, v, cu_seqlens, n_seqs, H, Hkv, D);
}

template void attention_forward_cpu<float>(float*, float*, const float*, const float*, const float*,
                                           int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_forward_cpu<double>(double*, double*, const double*, const double*,
                                            const double*, int64_t, int64_t, int64_t, int64_t,
                                            int64_t);
template void attention_backward_cpu<float>(float*, float*, float*, const float*, const float*,
                                            const float*, const float*, const float*, int64_t,
                                            int64_t, int64_t, int64_t, int64_t);
template void attention_backward_cpu<double>(double*, double*, double*, const double*,
                                             const double*, const double*, const double*,
                                             const double*, int64_t, int64_t, int64_t, int64_t,
                                             int64_t);
#define RLHF_INSTANTIATE_VARLEN(T)                                                               \
  template void attention_forward_varlen_cpu<T>(                                                 \
      T*, T*, const T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t); \
  template void attention_backward_varlen_cpu<T>(T*, T*, T*, const T*, const T*, const T*,       \
                                                 const T*, const T*, const int32_t*, int64_t,    \
                                                 int64_t, int64_t, int64_t);
RLHF_INSTANTIATE_VARLEN(float)
RLHF_INSTANTIATE_VARLEN(double)
#undef RLHF_INSTANTIATE_VARLEN

}  // namespace rlhf::model
