#include "parallel/lora_store.h"

#include <algorithm>
#include <cstring>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace rlhf::parallel {

LoraStore::LoraStore(std::unique_ptr<ParamStore> base, const model::LoraConfig& cfg, Comm& comm,
                     uint64_t seed, bool host_provider)
    : base_(std::move(base)),
      frozen_(host_provider ? std::make_unique<model::FrozenBaseProvider<float>>(base_->provider())
                            : nullptr),
      lora_(model::layer_spec(base_->layout().config()),
            int(base_->layout().config().num_hidden_layers), cfg),
      comm_(comm) {
  const int64_t n = lora_.numel(), R = comm.size();
  S_ = (n + R - 1) / R;
  checked_assign(params_, S_ * R, 0.0f, "the LoRA adapters");
  checked_assign(grads_, S_ * R, 0.0f, "the LoRA adapter gradients");
  checked_assign(gshard_, S_, 0.0f, "the LoRA adapter gradient shard");
  checked_assign(m_, S_, 0.0f, "the LoRA adapter AdamW moments");
  checked_assign(v_, S_, 0.0f, "the LoRA adapter AdamW moments");
  model::lora_init(lora_, params_.data(), seed);
}

model::UnitProvider<float>& LoraStore::provider() {
  RLHF_CHECK(frozen_ != nullptr,
             "internal error: a LoRA store over a device base has no host provider");
  return *frozen_;
}

void LoraStore::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  reduced_ = false;
}

double LoraStore::grad_sq_norm() {
  if (!reduced_) {
    if (comm_.size() == 1)
      std::copy(grads_.begin(), grads_.end(), gshard_.begin());
    else
      comm_.reduce_scatter(grads_.data(), gshard_.data(), S_);
    reduced_ = true;
  }
  double local = optim::sum_of_squares(gshard_.data(), S_), global = 0;  // padding is zero
  comm_.all_reduce(&local, &global, 1);
  return global;
}

void LoraStore::adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                           float grad_scale) {
  if (!reduced_) grad_sq_norm();
  // The segments of this rank's slice: every adapter tensor it crosses (decayed, as PEFT's
  // parameters are), not the alignment gaps or the padding.
  std::vector<optim::AdamWSegment> segs;
  const int64_t b = shard_begin(), e = b + S_;
  for (const model::TensorInfo& t : lora_.tensors()) {
    const int64_t lo = std::max(b, t.offset), hi = std::min(e, t.offset + t.numel);
    if (lo < hi) segs.push_back({lo - b, hi - lo, true});
  }
  optim::adamw_step_segments_cpu(params_.data() + b, m_.data(), v_.data(), gshard_.data(), S_, segs,
                                 cfg, lr, step, grad_scale);
  if (comm_.size() > 1) comm_.all_gather(params_.data() + b, params_.data(), S_);  // in place
}

void LoraStore::load_unit(int u, const float* full) {
  base_->load_unit(u, full);
  const model::UnitLayout& unit = layout().unit(u);
  if (lora_.score_offset() >= 0 && unit.kind == model::UnitKind::kHead) {
    const model::TensorInfo& t = unit.at("score.weight");
    std::copy(full + t.offset, full + t.offset + t.numel, params_.begin() + lora_.score_offset());
  }
}

void LoraStore::gather_unit(int u, float* out) {
  base_->gather_unit(u, out);
  const model::UnitLayout& unit = layout().unit(u);
  if (lora_.score_offset() >= 0 && unit.kind == model::UnitKind::kHead) {
    const model::TensorInfo& t = unit.at("score.weight");
    std::copy(params_.begin() + lora_.score_offset(),
              params_.begin() + lora_.score_offset() + t.numel, out + t.offset);
  }
  if (unit.kind != model::UnitKind::kLayer) return;
  const float scale = float(lora_.config().scale());
  for (const model::ProjInfo& p : model::kProjections) {
    const model::LoraLayout::Entry& e = lora_.entry(unit.layer, p.id);
    if (e.a < 0) continue;
    model::lora_merge_cpu(out + unit.at(p.weight_name).offset, params_.data() + e.a,
                          params_.data() + e.b, scale, int64_t(lora_.config().rank), e.in, e.out);
  }
}

void LoraStore::gather_moments(int, float*, float*) {
  RLHF_FAIL(
      "internal error: a LoRA run's base model has no optimizer state (use "
      "gather_adapter_moments)");
}

void LoraStore::load_moments(int, const float*, const float*) {
  RLHF_FAIL(
      "internal error: a LoRA run's base model has no optimizer state (use "
      "load_adapter_moments)");
}

MemoryReport LoraStore::memory() const {
  MemoryReport r = base_->memory();
  r.params_bytes += int64_t(params_.size() * sizeof(float));
  r.grads_bytes += int64_t((grads_.size() + gshard_.size()) * sizeof(float));
  r.optimizer_bytes += int64_t((m_.size() + v_.size()) * sizeof(float));
  return r;
}

void LoraStore::load_adapters(const float* full) {
  std::copy(full, full + lora_.numel(), params_.begin());
}

void LoraStore::gather_adapter_moments(float* m, float* v) {
  std::vector<float> fm(size_t(S_ * comm_.size())), fv(fm.size());
  comm_.all_gather(m_.data(), fm.data(), S_);
  comm_.all_gather(v_.data(), fv.data(), S_);
  std::copy(fm.begin(), fm.begin() + lora_.numel(), m);
  std::copy(fv.begin(), fv.begin() + lora_.numel(), v);
}

void LoraStore::load_adapter_moments(const float* m, const float* v) {
  const int64_t b = shard_begin(), n = lora_.numel();
  for (int64_t i = 0; i < S_; ++i) {
    m_[size_t(i)] = b + i < n ? m[b + i] : 0.0f;
    v_[size_t(i)] = b + i < n ? v[b + i] : 0.0f;
  }
}

namespace {

class AdaptersOff final : public TrainModel {
 public:
  explicit AdaptersOff(TrainModel& m) : m_(m) {
    RLHF_CHECK(m.has_adapters(), "internal error: a reference view needs a LoRA model");
  }
  ParamStore& store() override { return m_.store(); }
  const char* device() const override { return m_.device(); }
  void forward_lm(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float* lp,
                  float* entropy, bool for_backward, float inv_temperature,
                  model::SeqLens seqs) override {
    Off off(m_);
    m_.forward_lm(tokens, targets, B, T, lp, entropy, for_backward, inv_temperature, seqs);
  }
  void backward_lm(const float*, const float*) override { frozen(); }
  void forward_scalar(const int32_t* tokens, int64_t B, int64_t T, float* values, bool for_backward,
                      model::SeqLens seqs) override {
    Off off(m_);
    m_.forward_scalar(tokens, B, T, values, for_backward, seqs);
  }
  void backward_scalar(const float*) override { frozen(); }
  void forward_lm_sweep(const std::vector<ForwardBatch>& batches, float inv_temperature) override {
    Off off(m_);
    m_.forward_lm_sweep(batches, inv_temperature);
  }
  void forward_scalar_sweep(const std::vector<ForwardBatch>& batches) override {
    Off off(m_);
    m_.forward_scalar_sweep(batches);
  }
  int64_t activation_bytes() const override { return 0; }  // the model's own, counted there

 private:
  struct Off {  // adapters off for one call, back on however it ends
    explicit Off(TrainModel& m) : m(m) { m.set_adapters_enabled(false); }
    ~Off() { m.set_adapters_enabled(true); }
    TrainModel& m;
  };
  [[noreturn]] static void frozen() {
    RLHF_FAIL("internal error: backward through the LoRA reference policy (it is frozen)");
  }
  TrainModel& m_;
};

}  // namespace

std::unique_ptr<TrainModel> adapters_off_view(TrainModel& m) {
  return std::make_unique<AdaptersOff>(m);
}

}  // namespace rlhf::parallel
