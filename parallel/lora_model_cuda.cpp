#ifdef RLHF_CUDA
#include "parallel/lora_model_cuda.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "core/cuda_check.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "model/transformer_cuda.h"
#include "parallel/sweep_group.h"
#include "parallel/zero3_cuda.h"

namespace rlhf::parallel {

void lora_device_copy(const model::LoraLayout& layout, const float* adapters, model::bf16* out) {
  for (int64_t i = 0; i < layout.numel(); ++i) out[i] = __float2bfloat16_rn(adapters[i]);
  const float scale = float(layout.config().scale());
  for (int l = 0; l < layout.num_layers(); ++l)
    for (const model::ProjInfo& p : model::kProjections) {
      const model::LoraLayout::Entry& e = layout.entry(l, p.id);
      if (e.a < 0) continue;
      for (int64_t i = e.b; i < e.b + e.out * layout.config().rank; ++i)
        out[i] = __float2bfloat16_rn(scale * adapters[i]);
    }
}

namespace {

// The frozen base as the GPU model's provider: parameters from the device store, no gradient
// buffer (nullptr: the model skips every base gradient).
class FrozenBaseProviderCuda final : public model::UnitProviderCuda {
 public:
  explicit FrozenBaseProviderCuda(Zero3StoreCuda& base) : base_(base) {}
  const model::bf16* acquire_params(int u) override { return base_.acquire_params(u); }
  void release_params(int u) override { base_.release_params(u); }
  float* acquire_grads(int) override { return nullptr; }
  void release_grads(int) override {}
  void begin_pass(bool backward) override { base_.begin_pass(backward); }
  void end_pass(bool backward) override { base_.end_pass(backward); }
  cudaStream_t stream() const override { return base_.stream(); }

 private:
  Zero3StoreCuda& base_;
};

class LoraModelCuda final : public TrainModel {
 public:
  LoraModelCuda(std::unique_ptr<LoraStore> store, bool checkpointing, Comm* sweep_comm,
                int64_t sweep_budget)
      : store_(std::move(store)),
        base_(base_of(*store_)),
        provider_(base_),
        net_(store_->layout(), checkpointing),
        sweep_comm_(sweep_comm),
        sweep_budget_(sweep_budget) {
    const int64_t n = store_->lora_layout().numel();
    params_.resize(n, "the LoRA adapters (device, bf16)");
    grads_.resize(n, "the LoRA adapter gradients (device)");
    CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, size_t(n) * sizeof(float), stream()));
    staged_.resize(size_t(n));
    host_grads_.resize(size_t(n));
    net_.set_lora(&store_->lora_layout(), store_->adapters(), params_.get(), grads_.get());
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  ~LoraModelCuda() override { (void)cudaStreamSynchronize(stream()); }

  ParamStore& store() override { return *store_; }
  const char* device() const override { return "cuda"; }
  bool has_adapters() const override { return true; }
  void set_adapters_enabled(bool on) override { net_.set_lora_enabled(on); }
  void forward_lm(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float* lp,
                  float* entropy, bool for_backward, float inv_temperature,
                  model::SeqLens seqs) override {
    upload();
    net_.forward_lm(provider_, tokens, targets, B, T, lp, entropy, for_backward, inv_temperature,
                    seqs);
  }
  void backward_lm(const float* dlp, const float* dentropy) override {
    net_.backward_lm(provider_, dlp, dentropy);
    collect_grads();
  }
  void forward_scalar(const int32_t* tokens, int64_t B, int64_t T, float* values, bool for_backward,
                      model::SeqLens seqs) override {
    upload();
    net_.forward_scalar(provider_, tokens, B, T, values, for_backward, seqs);
  }
  void backward_scalar(const float* dvalues) override {
    net_.backward_scalar(provider_, dvalues);
    collect_grads();
  }
  void forward_lm_sweep(const std::vector<ForwardBatch>& batches, float inv_temperature) override {
    upload();
    for_each_group(batches, net_.sweep_residual_bytes_per_token(), sweep_budget_, sweep_comm_,
                   [&](const std::vector<ForwardBatch>& g) {
                     net_.forward_lm_sweep(provider_, g, inv_temperature);
                   });
  }
  void forward_scalar_sweep(const std::vector<ForwardBatch>& batches) override {
    upload();
    for_each_group(
        batches, net_.sweep_residual_bytes_per_token(), sweep_budget_, sweep_comm_,
        [&](const std::vector<ForwardBatch>& g) { net_.forward_scalar_sweep(provider_, g); });
  }
  int64_t activation_bytes() const override { return net_.activation_bytes(); }

 private:
  static Zero3StoreCuda& base_of(LoraStore& s) {
    auto* b = dynamic_cast<Zero3StoreCuda*>(&s.base());
    RLHF_CHECK(b != nullptr, "internal error: a GPU LoRA model needs a Zero3StoreCuda base");
    return *b;
  }
  cudaStream_t stream() const { return base_.stream(); }
  // The device copy follows the store's adapters (changed by the optimizer, a load, an init).
  void upload() {
    const int64_t n = store_->lora_layout().numel();
    const float* a = store_->adapters();
    if (uploaded_ && std::memcmp(a, shadow_.data(), size_t(n) * sizeof(float)) == 0) return;
    shadow_.assign(a, a + n);
    lora_device_copy(store_->lora_layout(), a, staged_.data());
    CUDA_CHECK(cudaMemcpyAsync(params_.get(), staged_.data(), size_t(n) * sizeof(model::bf16),
                               cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));  // `staged_` may be rewritten next time
    uploaded_ = true;
  }
  // The backward's adapter gradients into the store's host accumulator; the device's back to 0.
  void collect_grads() {
    const int64_t n = store_->lora_layout().numel();
    CUDA_CHECK(cudaMemcpyAsync(host_grads_.data(), grads_.get(), size_t(n) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, size_t(n) * sizeof(float), stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    float* g = store_->adapter_grads();
    for (int64_t i = 0; i < n; ++i) g[i] += host_grads_[size_t(i)];
  }

  std::unique_ptr<LoraStore> store_;
  Zero3StoreCuda& base_;
  FrozenBaseProviderCuda provider_;
  model::TransformerCuda net_;
  DeviceArray<model::bf16> params_;
  DeviceArray<float> grads_;
  std::vector<model::bf16> staged_;
  std::vector<float> shadow_, host_grads_;
  bool uploaded_ = false;
  Comm* sweep_comm_;
  int64_t sweep_budget_;
};

}  // namespace

std::unique_ptr<TrainModel> make_lora_cuda_model(std::unique_ptr<LoraStore> store,
                                                 bool gradient_checkpointing, Comm* sweep_comm,
                                                 int64_t sweep_budget_bytes) {
  return std::make_unique<LoraModelCuda>(std::move(store), gradient_checkpointing, sweep_comm,
                                         sweep_budget_bytes);
}

}  // namespace rlhf::parallel
#endif  // RLHF_CUDA
