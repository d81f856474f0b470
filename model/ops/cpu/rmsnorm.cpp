#include "model/ops/rmsnorm.h"

#include <algorithm>
#include <cmath>

namespace rlhf::model {

template <typename T>
void rmsnorm_forward_cpu(T* y, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T* yr = y + n * C;
    // Sum of squares in double (C is small: its rounding error stays far below fp32's, so rstd
    // rounds to the correctly rounded fp32 value but in vanishingly rare ties), summed in SIMD
    // lanes: a serial double chain costs C adds' latency, ~1 us a row at C = 576.
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    rstd[n] = r;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
  }
}

// y_c = x_c r w_c with r = (mean(x²) + eps)^(-1/2):
//   dy/dx: dx_c = r (w_c dy_c) − r³/C · x_c · Σ_k (w_k dy_k x_k)
//   dw_c  = Σ_n dy_c x_c r
template <typename T>
void rmsnorm_backward_cpu(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                          int64_t N, int64_t C) {
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dyr = dy + n * C;
      T* dxr = dx + n * C;
      const T r = rstd[n];
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += w[c] * dyr[c] * xr[c];
      const T k = r * r * r * dot / static_cast<T>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] += r * w[c] * dyr[c] - k * xr[c];
    }
    // Parameter gradient: columns split across threads, rows summed in order, so the result does
    // not depend on the thread count. A frozen weight (dw = nullptr, LoRA) has none.
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = dw != nullptr ? (C + kBlock - 1) / kBlock : 0;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t c0 = b * kBlock, c1 = std::min(C, c0 + kBlock);
      T acc[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T r = rstd[n];
        const T* xr = x + n * C;
        const T* dyr = dy + n * C;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dyr[c] * xr[c] * r;
      }
      for (int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
    }
  }
}

template void rmsnorm_forward_cpu<float>(float*, float*, const float*, const float*, int64_t,
                                         int64_t, double);
template void rmsnorm_forward_cpu<double>(double*, double*, const double*, const double*, int64_t,
                                          int64_t, double);
template void rmsnorm_backward_cpu<float>(float*, float*, const float*, const float*, const float*,
                                          const float*, int64_t, int64_t);
template void rmsnorm_backward_cpu<double>(double*, double*, const double*, const double*,
                                           const double*, const double*, int64_t, int64_t);

}  // namespace rlhf::model
