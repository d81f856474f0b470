// AdamW on the GPU, host side: validation and the per-step scalars (as adamw.cpp), then the
// launcher of optim/adamw_cuda.cu.
#ifdef RLHF_CUDA

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/adamw_cuda.h"

namespace rlhf::optim {

namespace {

// The same scalars as adamw.cpp's make_coeffs (computed in double as PyTorch does, then rounded
// to fp32), so the GPU and CPU steps agree to fp32 rounding.
AdamWStepScalars make_scalars(const AdamWConfig& cfg, double lr, int64_t step, float grad_scale) {
  RLHF_CHECK(step >= 1, "AdamW: step must be >= 1 (1-based), got {}", step);
  RLHF_CHECK(std::isfinite(lr) && lr >= 0, "AdamW: learning rate must be finite and >= 0, got {}",
             lr);
  RLHF_CHECK(std::isfinite(grad_scale), "AdamW: grad_scale must be finite, got {}", grad_scale);
  const double t = static_cast<double>(step);
  AdamWStepScalars s;
  s.decay_mul = static_cast<float>(1.0 - lr * cfg.weight_decay);
  s.beta1 = static_cast<float>(cfg.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - cfg.beta1);
  s.beta2 = static_cast<float>(cfg.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - cfg.beta2);
  s.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(cfg.beta1, t))));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
  s.eps = static_cast<float>(cfg.eps);
  s.grad_scale = grad_scale;
  return s;
}

}  // namespace

void adamw_step_cuda(float* p, float* m, float* v, const float* g, int64_t n,
                     const AdamWConfig& cfg, double lr, int64_t step, bool decay, float grad_scale,
                     cudaStream_t stream) {
  RLHF_CHECK(n >= 0, "AdamW: element count must be >= 0, got {}", n);
  AdamWStepScalars s = make_scalars(cfg, lr, step, grad_scale);
  if (!decay) s.decay_mul = 1.0f;
  adamw_update_cuda(p, m, v, g, n, s, stream);
}

void adamw_step_segments_cuda(float* p, float* m, float* v, const float* g, int64_t n,
                              std::span<const AdamWSegment> segments, const AdamWConfig& cfg,
                              double lr, int64_t step, float grad_scale, cudaStream_t stream) {
  const AdamWStepScalars s = make_scalars(cfg, lr, step, grad_scale);
  std::vector<AdamWSegment> sorted(segments.begin(), segments.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const AdamWSegment& a, const AdamWSegment& b) { return a.offset < b.offset; });
  int64_t end = 0;
  for (const AdamWSegment& seg : sorted) {
    RLHF_CHECK(seg.offset >= 0 && seg.length >= 0 && seg.offset + seg.length <= n,
               "AdamW: segment [{}, {}) is outside the buffer of {} elements", seg.offset,
               seg.offset + seg.length, n);
    RLHF_CHECK(seg.offset >= end, "AdamW: segment [{}, {}) overlaps the previous one (ends at {})",
               seg.offset, seg.offset + seg.length, end);
    if (seg.length > 0) end = seg.offset + seg.length;
  }
  for (const AdamWSegment& seg : sorted) {
    if (seg.length == 0) continue;
    AdamWStepScalars ss = s;
    if (!seg.decay) ss.decay_mul = 1.0f;
    adamw_update_cuda(p + seg.offset, m + seg.offset, v + seg.offset, g + seg.offset, seg.length,
                      ss, stream);
  }
}

}  // namespace rlhf::optim

#endif  // RLHF_CUDA
