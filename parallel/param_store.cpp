#include "parallel/param_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/clip.h"

namespace rlhf::parallel {

std::vector<optim::AdamWSegment> adamw_segments(const model::UnitLayout& u, int64_t begin,
                                                int64_t len) {
  std::vector<optim::AdamWSegment> segs;
  const int64_t end = begin + len;
  for (const model::TensorInfo& t : u.tensors) {
    const int64_t a = std::max(begin, t.offset), b = std::min(end, t.offset + t.numel);
    if (a < b) segs.push_back({a - begin, b - a, t.weight_decay});
  }
  return segs;
}

double clip_and_step(ParamStore& store, const optim::AdamWConfig& cfg, double lr, int64_t step,
                     double max_norm) {
  const double norm = std::sqrt(store.grad_sq_norm());
  RLHF_CHECK(std::isfinite(norm),
             "gradient norm is {} at optimizer step {}\nhint: lower the "
             "learning rate or check the data for empty or degenerate samples",
             norm, step);
  const double coef = optim::clip_coefficient(norm, max_norm);
  store.adamw_step(cfg, lr, step, static_cast<float>(coef));
  return norm;
}

LocalBf16Provider::LocalBf16Provider(model::LocalParams<float>& params)
    : params_(params),
      twin_(size_t(params.layout().num_units())),
      fresh_(size_t(params.layout().num_units()), 0) {}

const model::bfloat16* LocalBf16Provider::bf16_twin(const float* p, int64_t n) const {
  for (int u = 0; u < params_.layout().num_units(); ++u) {
    const float* base = params_.params(u);
    const int64_t numel = params_.layout().unit(u).numel;
    if (p < base || p + n > base + numel) continue;
    std::vector<model::bfloat16>& t = twin_[size_t(u)];
    if (!fresh_[size_t(u)]) {
      if (t.size() != size_t(numel)) t.resize(size_t(numel));
      model::float_to_bf16_n(t.data(), base, numel);
      fresh_[size_t(u)] = 1;
      converted_ += numel;
    }
    return t.data() + (p - base);
  }
  return nullptr;
}

void LocalBf16Provider::invalidate() const {
  std::fill(fresh_.begin(), fresh_.end(), 0);
}

LocalParamStore::LocalParamStore(const model::ParamLayout& layout, bool bf16_twins)
    : params_(layout) {
  for (const auto& u : layout.units()) {
    m_.emplace_back(static_cast<size_t>(u.numel), 0.0f);
    v_.emplace_back(static_cast<size_t>(u.numel), 0.0f);
  }
  if (bf16_twins) twins_ = std::make_unique<LocalBf16Provider>(params_);
}

double LocalParamStore::grad_sq_norm() {
  double s = 0;
  for (int u = 0; u < layout().num_units(); ++u)
    s += optim::sum_of_squares(params_.grads(u), layout().unit(u).numel);
  return s;
}

void LocalParamStore::adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                                 float grad_scale) {
  if (twins_) twins_->invalidate();
  for (int u = 0; u < layout().num_units(); ++u) {
    const auto& un = layout().unit(u);
    const auto segs = adamw_segments(un, 0, un.numel);
    optim::adamw_step_segments_cpu(params_.params(u), m_[size_t(u)].data(), v_[size_t(u)].data(),
                                   params_.grads(u), un.numel, segs, cfg, lr, step, grad_scale);
  }
}

void LocalParamStore::gather_unit(int u, float* out) {
  std::memcpy(out, params_.params(u), sizeof(float) * size_t(layout().unit(u).numel));
}

void LocalParamStore::load_unit(int u, const float* full) {
  if (twins_) twins_->invalidate();
  std::memcpy(params_.params(u), full, sizeof(float) * size_t(layout().unit(u).numel));
}

void LocalParamStore::gather_moments(int u, float* m, float* v) {
  const size_t n = size_t(layout().unit(u).numel);
  std::memcpy(m, m_[size_t(u)].data(), sizeof(float) * n);
  std::memcpy(v, v_[size_t(u)].data(), sizeof(float) * n);
}

void LocalParamStore::load_moments(int u, const float* m, const float* v) {
  const size_t n = size_t(layout().unit(u).numel);
  std::memcpy(m_[size_t(u)].data(), m, sizeof(float) * n);
  std::memcpy(v_[size_t(u)].data(), v, sizeof(float) * n);
}

UnitShard LocalParamStore::unit_shard(int u) const {
  auto& p = const_cast<model::LocalParams<float>&>(params_);
  return {p.params(u), 0, layout().unit(u).numel};
}

MemoryReport LocalParamStore::memory() const {
  MemoryReport r;
  const int64_t n = layout().total_numel() * int64_t(sizeof(float));
  r.params_bytes = n + (twins_ ? n / 2 : 0);  // + the bf16 copies
  r.grads_bytes = n;
  r.optimizer_bytes = 2 * n;
  return r;
}

}  // namespace rlhf::parallel
