#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace rlhf::optim {

namespace {

// Below this many elements the step runs on the calling thread: a parallel region costs more
// than the update itself.
constexpr int64_t kParallelMinElems = 1 << 15;

// The per-step scalars, computed once in double as PyTorch does (Python floats), then rounded to
// fp32 the way a Python scalar is cast when it meets an fp32 tensor.
struct StepCoeffs {
  float decay_mul;  // 1 − lr·λ, for decayed ranges
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float neg_step_size;  // −lr / (1 − β1^t)
  float bc2_sqrt;       // sqrt(1 − β2^t)
  float eps;
  float grad_scale;
};

StepCoeffs make_coeffs(const AdamWConfig& cfg, double lr, int64_t step, float grad_scale) {
  RLHF_CHECK(step >= 1, "AdamW: step must be >= 1 (1-based), got {}", step);
  RLHF_CHECK(std::isfinite(lr) && lr >= 0, "AdamW: learning rate must be finite and >= 0, got {}",
             lr);
  RLHF_CHECK(std::isfinite(grad_scale), "AdamW: grad_scale must be finite, got {}", grad_scale);
  const double t = static_cast<double>(step);
  StepCoeffs c;
  c.decay_mul = static_cast<float>(1.0 - lr * cfg.weight_decay);
  c.beta1 = static_cast<float>(cfg.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - cfg.beta1);
  c.beta2 = static_cast<float>(cfg.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - cfg.beta2);
  c.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(cfg.beta1, t))));
  c.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
  c.eps = static_cast<float>(cfg.eps);
  c.grad_scale = grad_scale;
  return c;
}

// The update of elements [0, n) of one range, in PyTorch's operation order:
// mul_(1 − lr·λ); m.mul_(β1).add_(g, α = 1 − β1); v.mul_(β2).addcmul_(g, g, 1 − β2);
// denom = sqrt(v) / sqrt(bc2) + eps; p.addcdiv_(m, denom, −step_size).
// `omp for simd` inside the caller's parallel region (or alone, when there is none).
inline void update_range(float* __restrict p, float* __restrict m, float* __restrict v,
                         const float* __restrict g, int64_t n, const StepCoeffs& c,
                         float decay_mul) {
  const float b1 = c.beta1, omb1 = c.one_minus_beta1, b2 = c.beta2, omb2 = c.one_minus_beta2;
  const float nss = c.neg_step_size, bc2s = c.bc2_sqrt, eps = c.eps, gs = c.grad_scale;
#pragma omp for simd schedule(static) nowait
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float mi = m[i] * b1 + omb1 * gi;
    const float vi = v[i] * b2 + omb2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2s + eps;
    p[i] = p[i] * decay_mul + nss * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void AdamWConfig::validate(const std::string& source) const {
  auto finite = [&](double x, const char* name) {
    RLHF_CHECK(std::isfinite(x), "{}: {} must be finite, got {}", source, name, x);
  };
  finite(lr, "lr");
  finite(beta1, "beta1");
  finite(beta2, "beta2");
  finite(eps, "eps");
  finite(weight_decay, "weight_decay");
  RLHF_CHECK(lr >= 0, "{}: lr must be >= 0, got {}", source, lr);
  RLHF_CHECK(beta1 >= 0 && beta1 < 1, "{}: beta1 must be in [0, 1), got {}", source, beta1);
  RLHF_CHECK(beta2 >= 0 && beta2 < 1, "{}: beta2 must be in [0, 1), got {}", source, beta2);
  RLHF_CHECK(eps >= 0, "{}: eps must be >= 0, got {}", source, eps);
  RLHF_CHECK(weight_decay >= 0, "{}: weight_decay must be >= 0, got {}", source, weight_decay);
}

void adamw_step_cpu(float* p, float* m, float* v, const float* g, int64_t n, const AdamWConfig& cfg,
                    double lr, int64_t step, bool decay, float grad_scale) {
  RLHF_CHECK(n >= 0, "AdamW: element count must be >= 0, got {}", n);
  const StepCoeffs c = make_coeffs(cfg, lr, step, grad_scale);
  const float decay_mul = decay ? c.decay_mul : 1.0f;
#pragma omp parallel if (n >= kParallelMinElems)
  update_range(p, m, v, g, n, c, decay_mul);
}

void adamw_step_segments_cpu(float* p, float* m, float* v, const float* g, int64_t n,
                             std::span<const AdamWSegment> segments, const AdamWConfig& cfg,
                             double lr, int64_t step, float grad_scale) {
  const StepCoeffs c = make_coeffs(cfg, lr, step, grad_scale);
  // Bounds and overlap: checked on a sorted copy (segments may come in any order).
  std::vector<AdamWSegment> sorted(segments.begin(), segments.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const AdamWSegment& a, const AdamWSegment& b) { return a.offset < b.offset; });
  int64_t total = 0, end = 0;
  for (const AdamWSegment& s : sorted) {
    RLHF_CHECK(s.offset >= 0 && s.length >= 0 && s.offset + s.length <= n,
               "AdamW: segment [{}, {}) is outside the buffer of {} elements", s.offset,
               s.offset + s.length, n);
    RLHF_CHECK(s.offset >= end, "AdamW: segment [{}, {}) overlaps the previous one (ends at {})",
               s.offset, s.offset + s.length, end);
    if (s.length > 0) end = s.offset + s.length;
    total += s.length;
  }
  // One parallel region; each segment is split statically over the threads (nowait: segments
  // are disjoint, so no thread waits for another between them).
#pragma omp parallel if (total >= kParallelMinElems)
  for (const AdamWSegment& s : sorted) {
    if (s.length == 0) continue;
    update_range(p + s.offset, m + s.offset, v + s.offset, g + s.offset, s.length, c,
                 s.decay ? c.decay_mul : 1.0f);
  }
}

}  // namespace rlhf::optim
