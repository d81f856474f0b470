// LoraStore: the training state of a LoRA run (model/lora.h) — the base model frozen in a
// weights-only store (no gradients, no AdamW moments: Zero3Options::frozen), and the adapters,
// whose AdamW state and reduced gradients are sharded over the training ranks (ZeRO-2 over one
// flat buffer; the adapters are ∝ r, so every rank keeps their full weights and a full local
// gradient accumulator).
#pragma once

#include <memory>
#include <vector>

#include "model/lora.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/runtime.h"
#include "parallel/train_model.h"

namespace rlhf::parallel {

/// The adapters' flat buffer (model::LoraLayout, padded to a multiple of the rank count) is split
/// evenly: rank j owns elements [j·S, (j+1)·S). A backward pass accumulates into the full local
/// gradient buffer; grad_sq_norm reduce-scatters it (sum over ranks) into this rank's shard, and
/// adamw_step updates this rank's slice of the weights with its moments, then all-gathers the
/// weights so every rank holds them whole. The ParamStore methods about units (gather_unit,
/// load_unit, unit_shard) are the frozen base's; the base has no moments (gather_moments and
/// load_moments throw — a LoRA checkpoint stores the adapters' state: adapter_moments).
class LoraStore final : public ParamStore {
 public:
  /// base: the frozen base model's store (its provider is wrapped so that no base gradient is
  /// requested). Adapters start at model::lora_init(seed). host_provider false: the base is a
  /// device store (Zero3StoreCuda, frozen) that has no host provider; its model runs on the GPU
  /// (make_lora_train_model), which keeps device copies of the adapters and adds its adapter
  /// gradients into adapter_grads() after each backward — the adapters' master weights, reduced
  /// gradients and AdamW moments stay here, on the host (--adam_offload style: they are ∝ r).
  LoraStore(std::unique_ptr<ParamStore> base, const model::LoraConfig& cfg, Comm& comm,
            uint64_t seed, bool host_provider = true);

  // ParamStore
  const model::ParamLayout& layout() const override { return base_->layout(); }
  /// The frozen base's provider; throws rlhf::Error for a device base (host_provider false).
  model::UnitProvider<float>& provider() override;
  void zero_grads() override;
  /// Reduce-scatters the adapter gradients (once per step), then Σ g² over every rank's shard.
  double grad_sq_norm() override;
  void adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                  float grad_scale) override;
  /// The merged weights of unit u: the base's, with W + (α/r)·B·A for every adapted projection
  /// of a layer unit, and the head unit's score.weight from the trained copy (save_score), so a
  /// saved model is the merged model. Collective.
  void gather_unit(int u, float* out) override;
  /// Loads the frozen base's unit u; the head unit's score.weight also starts the trained copy
  /// (save_score: PEFT's modules_to_save starts from the base module).
  void load_unit(int u, const float* full) override;
  void gather_moments(int u, float* m, float* v) override;
  void load_moments(int u, const float* m, const float* v) override;
  MemoryReport memory() const override;
  UnitShard unit_shard(int u) const override { return base_->unit_shard(u); }
  bool replicated() const override { return base_->replicated(); }

  // The adapters
  const model::LoraLayout& lora_layout() const { return lora_; }
  /// The frozen base's store.
  ParamStore& base() { return *base_; }
  /// The full adapter weights (lora_layout().numel() floats, the same on every rank).
  const float* adapters() const { return params_.data(); }
  /// The local adapter gradient accumulator the model adds into (numel floats).
  float* adapter_grads() { return grads_.data(); }
  /// Sets the adapter weights (numel floats, the same on every rank).
  void load_adapters(const float* full);
  /// PEFT's fresh adapters (model::lora_init with seed); the moments are not touched.
  void init_adapters(uint64_t seed) { model::lora_init(lora_, params_.data(), seed); }
  /// The adapters' AdamW moments, consolidated on every rank (numel floats each). Collective.
  void gather_adapter_moments(float* m, float* v);
  /// Sets the adapters' moments from full buffers (numel floats each).
  void load_adapter_moments(const float* m, const float* v);

 private:
  int64_t shard_begin() const { return int64_t(comm_.rank()) * S_; }
  std::unique_ptr<ParamStore> base_;
  std::unique_ptr<model::FrozenBaseProvider<float>> frozen_;  // a host base's
  model::LoraLayout lora_;
  Comm& comm_;
  int64_t S_ = 0;                      // shard size: ceil(numel / ranks)
  std::vector<float> params_, grads_;  // full (S·ranks, padding zero)
  std::vector<float> gshard_, m_, v_;  // this rank's shard: reduced gradients, moments
  bool reduced_ = false;               // gshard_ holds this step's reduced gradients
};

/// The model a LoRA training command trains on rt's device: a frozen base (a weights-only ZeRO-3
/// store over rt.train_comm) with the adapters of `lora` (LoraStore), run by
/// Transformer<float> with the adapters on. A model with a scalar head (reward model, critic)
/// also trains its score head (LoraConfig::save_score, PEFT's modules_to_save for SEQ_CLS). With
/// --device cuda the base is a frozen bf16 Zero3StoreCuda over rt.device_comm and the model is
/// TransformerCuda with the GPU adapter branch (parallel/lora_model_cuda.cpp). Call on training
/// ranks only.
std::unique_ptr<TrainModel> make_lora_train_model(const model::ParamLayout& layout,
                                                  TrainRuntime& rt, const ZeroOptions& z,
                                                  const model::LoraConfig& lora, uint64_t seed);

/// The reference policy of a LoRA model (TrainModel::has_adapters): the same model — the same
/// weights, no copy — with its adapters switched off for the duration of each forward (TRL's
/// disable_adapter). Forward only: the backward methods throw rlhf::Error. `m` must outlive it.
std::unique_ptr<TrainModel> adapters_off_view(TrainModel& m);

}  // namespace rlhf::parallel
