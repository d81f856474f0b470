#include "model/ops/logprob.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "core/error.h"
#include "model/ops/cpu/vec_math.h"
#include "model/ops/half.h"

namespace rlhf::model {

namespace {

// Targets are checked before any parallel loop (an exception must not leave an OpenMP region).
void check_targets(const int32_t* targets, int64_t N, int64_t V, const char* op) {
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    RLHF_CHECK(t == -1 || (t >= 0 && t < V),
               "{}: target {} of row {} is outside [0, {}) and is not -1 (no target)\nhint: token "
               "ids must be below the model's vocab_size; mask positions with -1",
               op, t, n, V);
  }
}

constexpr int64_t kSumLanes = 16;

// Σ of the partial sums, pairwise in a fixed order.
template <typename T>
T lane_sum(T (&p)[kSumLanes]) {
  for (int64_t w = kSumLanes / 2; w >= 1; w /= 2)
    for (int64_t k = 0; k < w; ++k) p[k] += p[k + w];
  return p[0];
}

}  // namespace

// Per row, with z = scale·x and m = max z, e_j = exp(z_j − m), S = Σ e_j:
//   lse = m + log S,   entropy = lse − Σ p_j z_j = log S − Σ e_j (z_j − m) / S,
// where the second form sums non-positive terms around the max (no cancellation against m).
// Two passes over the row (max, then exp-sum); a row of V = 32000 floats (128 KiB) stays in L2.
template <typename T>
void logprob_forward_cpu(T* lp, T* lse, T* entropy, const T* logits, const int32_t* targets,
                         int64_t N, int64_t V, T scale) {
  RLHF_CHECK(V > 0, "logprob_forward_cpu: vocabulary size V must be > 0, got {}", V);
  check_targets(targets, N, V, "logprob_forward_cpu");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd simdlen(16) reduction(max : m)
    for (int64_t j = 0; j < V; ++j) {
      const T z = scale * x[j];
      m = z > m ? z : m;  // not std::max: GCC 12 leaves that reduction scalar
    }
    // Sums in kSumLanes explicit partial sums (element j goes to lane j % kSumLanes), added in a
    // fixed order: the same rounding on every instruction set (AVX2 or AVX-512 vectors, scalar),
    // and ~sqrt(V / kSumLanes) ulp of error instead of a scalar loop's ~V.
    T ps[kSumLanes] = {}, pz[kSumLanes] = {};
    const int64_t Vb = V / kSumLanes * kSumLanes;
    if (entropy) {
      for (int64_t j0 = 0; j0 < Vb; j0 += kSumLanes) {
#pragma omp simd
        for (int64_t k = 0; k < kSumLanes; ++k) {
          const T d = scale * x[j0 + k] - m;
          const T e = exp_vec(d);
          ps[k] += e;
          pz[k] += e * d;
        }
      }
      for (int64_t j = Vb; j < V; ++j) {
        const T d = scale * x[j] - m;
        const T e = exp_vec(d);
        ps[j - Vb] += e;
        pz[j - Vb] += e * d;
      }
    } else {
      for (int64_t j0 = 0; j0 < Vb; j0 += kSumLanes) {
#pragma omp simd
        for (int64_t k = 0; k < kSumLanes; ++k) ps[k] += exp_vec(scale * x[j0 + k] - m);
      }
      for (int64_t j = Vb; j < V; ++j) ps[j - Vb] += exp_vec(scale * x[j] - m);
    }
    const T s = lane_sum(ps), sez = lane_sum(pz);
    const T log_s = std::log(s);
    const T l = m + log_s;
    lse[n] = l;
    const int32_t t = targets[n];
    lp[n] = t < 0 ? T(0) : scale * x[t] - l;
    if (entropy) entropy[n] = log_s - sez / s;
  }
}

namespace {

// With p = softmax(z), z = scale·x, log p_j = z_j − lse:
//   ∂lp/∂z_j = onehot_j − p_j,   ∂H/∂z_j = −p_j (log p_j + H),
// and ∂/∂x = scale · ∂/∂z. One row, written to dx (V values; every element of x is read before
// the same element of dx is written, so dx may be x itself).
template <typename T>
void logprob_backward_row(T* dx, const T* x, T a, T b, T l, T h, int32_t t, int64_t V, T scale) {
  if (a == T(0) && b == T(0)) {  // e.g. a prompt position: no target, no entropy term
    std::fill(dx, dx + V, T(0));
    return;
  }
  // dx_j = scale·[a·(onehot_j − p_j) − b·p_j·(log p_j + H)]
  //      = −scale·p_j·(c + b·log p_j) + scale·a·onehot_j,   c = a + b·H.
  const T c = a + b * h;
  if (b != T(0)) {
#pragma omp simd simdlen(16)
    for (int64_t j = 0; j < V; ++j) {
      const T log_p = scale * x[j] - l;
      dx[j] = -scale * exp_vec(log_p) * (c + b * log_p);
    }
  } else {
#pragma omp simd simdlen(16)
    for (int64_t j = 0; j < V; ++j) dx[j] = (-scale * c) * exp_vec(scale * x[j] - l);
  }
  if (t >= 0) dx[t] += scale * a;
}

// Row n's coefficients: a = dlp (0 without a target), b = dentropy, l = lse, h = entropy.
template <typename T>
struct RowCoeffs {
  T a, b, l, h;
};
template <typename T>
RowCoeffs<T> row_coeffs(int64_t n, const T* dlp, const T* dentropy, const T* lse, const T* entropy,
                        const int32_t* targets) {
  const bool with_entropy = dentropy != nullptr && entropy != nullptr;
  return {(dlp != nullptr && targets[n] >= 0) ? dlp[n] : T(0), with_entropy ? dentropy[n] : T(0),
          lse[n], with_entropy ? entropy[n] : T(0)};
}

}  // namespace

template <typename T>
void logprob_backward_cpu(T* dlogits, const T* dlp, const T* dentropy, const T* logits,
                          const T* lse, const T* entropy, const int32_t* targets, int64_t N,
                          int64_t V, T scale) {
  check_targets(targets, N, V, "logprob_backward_cpu");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const RowCoeffs<T> r = row_coeffs(n, dlp, dentropy, lse, entropy, targets);
    logprob_backward_row(dlogits + n * V, logits + n * V, r.a, r.b, r.l, r.h, targets[n], V, scale);
  }
}

void logprob_backward_bf16_cpu(bfloat16* dlogits, const float* dlp, const float* dentropy,
                               const float* logits, const float* lse, const float* entropy,
                               const int32_t* targets, int64_t N, int64_t V, float scale) {
  check_targets(targets, N, V, "logprob_backward_bf16_cpu");
  // Each thread computes a row into its own fp32 scratch (V floats: stays in L2), then rounds it
  // into dlogits: the values of logprob_backward_cpu rounded once, without an (N, V) fp32 pass.
  std::vector<float> scratch_buf(size_t(omp_get_max_threads()) * size_t(V));
#pragma omp parallel
  {
    float* row = scratch_buf.data() + size_t(omp_get_thread_num()) * size_t(V);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const RowCoeffs<float> r = row_coeffs(n, dlp, dentropy, lse, entropy, targets);
      logprob_backward_row(row, logits + n * V, r.a, r.b, r.l, r.h, targets[n], V, scale);
      float_to_bf16_row(dlogits + n * V, row, V);
    }
  }
}

template void logprob_forward_cpu<float>(float*, float*, float*, const float*, const int32_t*,
                                         int64_t, int64_t, float);
template void logprob_forward_cpu<double>(double*, double*, double*, const double*, const int32_t*,
                                          int64_t, int64_t, double);
template void logprob_backward_cpu<float>(float*, const float*, const float*, const float*,
                                          const float*, const float*, const int32_t*, int64_t,
                                          int64_t, float);
template void logprob_backward_cpu<double>(double*, const double*, const double*, const double*,
                                           const double*, const double*, const int32_t*, int64_t,
                                           int64_t, double);

}  // namespace rlhf::model
