// RMSNorm (Zhang & Sennrich 2019, eq. 4).
#pragma once

#include <cstdint>

namespace rlhf::model {

/// y = x * rsqrt(mean(x^2) + eps) * w.
/// y, x: (N, C); w: (C); rstd: (N), saved for backward (1 / rms per row).
template <typename T>
void rmsnorm_forward_cpu(T* y, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps);

/// dx += (x is the residual stream: accumulates), dw += (parameter). dy: (N, C).
template <typename T>
void rmsnorm_backward_cpu(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                          int64_t N, int64_t C);

}  // namespace rlhf::model
