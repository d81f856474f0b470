#include "model/ops/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace rlhf::model {

template <typename T>
void rope_tables_cpu(T* cos, T* sin, int64_t max_pos, int64_t D, const double* inv_freq) {
  RLHF_CHECK(D > 0 && D % 2 == 0, "rope_tables_cpu: head_dim must be even and positive, got {}", D);
  RLHF_CHECK(max_pos >= 0, "rope_tables_cpu: max_pos must be >= 0, got {}", max_pos);
  RLHF_CHECK(inv_freq != nullptr, "rope_tables_cpu: null inv_freq");
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (max_pos * half >= 32768)
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // angle = p · inv_freq[i], in double so fp32 tables are correctly rounded at large p.
      const double angle = static_cast<double>(p) * inv_freq[i];
      cos[p * half + i] = static_cast<T>(std::cos(angle));
      sin[p * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

template <typename T>
void rope_tables_cpu(T* cos, T* sin, int64_t max_pos, int64_t D, double theta) {
  RLHF_CHECK(D > 0 && D % 2 == 0, "rope_tables_cpu: head_dim must be even and positive, got {}", D);
  RLHF_CHECK(theta > 0, "rope_tables_cpu: rope_theta must be > 0, got {}", theta);
  // inv_freq[i] = theta^(−2i/D).
  const std::vector<double> inv_freq = rope_default_inv_freq(D, theta);
  rope_tables_cpu(cos, sin, max_pos, D, inv_freq.data());
}

namespace {

// Rotates every pair (a, b) of every head by ±angle: (a, b) ← (a·c − s·b, a·s + b·c) with
// s = sign·sin. sign = +1 is the forward map R, sign = −1 its inverse Rᵀ. out may alias x: each
// pair is read before it is written.
template <typename T>
void rope_apply(T* out, const T* x, const int32_t* pos, const T* cos, const T* sin, int64_t N,
                int64_t H, int64_t D, RopeStyle style, T sign, const char* op) {
  RLHF_CHECK(D > 0 && D % 2 == 0, "{}: head_dim must be even and positive, got {}", op, D);
  const int64_t half = D / 2;
  for (int64_t n = 0; n < N; ++n)
    RLHF_CHECK(pos[n] >= 0, "{}: negative position {} at row {}", op, pos[n], n);
#pragma omp parallel for schedule(static) if (N * H * D >= 32768)
  for (int64_t nh = 0; nh < N * H; ++nh) {
    const int64_t p = pos[nh / H];
    const T* c = cos + p * half;
    const T* s = sin + p * half;
    const T* xr = x + nh * D;
    T* outr = out + nh * D;
    if (style == RopeStyle::kInterleaved) {
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = xr[2 * i], b = xr[2 * i + 1], si = sign * s[i];
        outr[2 * i] = a * c[i] - b * si;
        outr[2 * i + 1] = a * si + b * c[i];
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = xr[i], b = xr[i + half], si = sign * s[i];
        outr[i] = a * c[i] - b * si;
        outr[i + half] = a * si + b * c[i];
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward_cpu(T* out, const T* x, const int32_t* pos, const T* cos, const T* sin, int64_t N,
                      int64_t H, int64_t D, RopeStyle style) {
  rope_apply(out, x, pos, cos, sin, N, H, D, style, T(1), "rope_forward_cpu");
}

template <typename T>
void rope_backward_cpu(T* dx, const T* dout, const int32_t* pos, const T* cos, const T* sin,
                       int64_t N, int64_t H, int64_t D, RopeStyle style) {
  rope_apply(dx, dout, pos, cos, sin, N, H, D, style, T(-1), "rope_backward_cpu");
}

template void rope_tables_cpu<float>(float*, float*, int64_t, int64_t, double);
template void rope_tables_cpu<double>(double*, double*, int64_t, int64_t, double);
template void rope_tables_cpu<float>(float*, float*, int64_t, int64_t, const double*);
template void rope_tables_cpu<double>(double*, double*, int64_t, int64_t, const double*);
template void rope_forward_cpu<float>(float*, const float*, const int32_t*, const float*,
                                      const float*, int64_t, int64_t, int64_t, RopeStyle);
template void rope_forward_cpu<double>(double*, const double*, const int32_t*, const double*,
                                       const double*, int64_t, int64_t, int64_t, RopeStyle);
template void rope_backward_cpu<float>(float*, const float*, const int32_t*, const float*,
                                       const float*, int64_t, int64_t, int64_t, RopeStyle);
template void rope_backward_cpu<double>(double*, const double*, const int32_t*, const double*,
                                        const double*, int64_t, int64_t, int64_t, RopeStyle);

}  // namespace rlhf::model
