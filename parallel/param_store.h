// ParamStore: the training state of one model — master weights, gradients, AdamW moments — as the
// trainer sees it, whether it lives whole in this process or is ZeRO-3 sharded over train_comm.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/bf16_twin.h"
#include "model/layout.h"
#include "model/local_provider.h"
#include "model/provider.h"
#include "optim/adamw.h"

namespace rlhf::parallel {

/// Bytes of memory one rank holds for a model's training state.
struct MemoryReport {
  int64_t params_bytes = 0;     ///< master weights owned by this rank (fp32)
  int64_t grads_bytes = 0;      ///< gradient shard (fp32)
  int64_t optimizer_bytes = 0;  ///< AdamW m and v (fp32)
  int64_t gather_bytes = 0;     ///< transient full-unit buffers (ZeRO-3 gathers)
  bool optimizer_on_host = false;
};

/// This rank's part of a unit's master weights, as weight sync reads it: `count` elements at
/// `offset` in the unit. ZeRO-3 ranks' parts tile the unit padded as ShardLayout says (the last
/// parts end in zero padding); a replicated or local store holds the whole unit (offset 0, count
/// numel) on every rank.
struct UnitShard {
  const float* data = nullptr;
  int64_t offset = 0;
  int64_t count = 0;
};

/// The training state of one model. Collective methods must be called by every rank of the
/// store's communicator in the same order.
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  virtual const model::ParamLayout& layout() const = 0;
  /// What the model's forward/backward reads parameters from and accumulates gradients into.
  virtual model::UnitProvider<float>& provider() = 0;
  /// Zeroes the gradient accumulators (start of an optimizer step).
  virtual void zero_grads() = 0;
  /// Σ g² over every real (non-padding) gradient element of the whole model, in double.
  /// Collective.
  virtual double grad_sq_norm() = 0;
  /// One AdamW step on everything this rank owns, with this step's lr and the gradients
  /// multiplied by grad_scale (the clip coefficient). step is 1-based. No weight decay on tensors
  /// whose TensorInfo::weight_decay is false.
  virtual void adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                          float grad_scale) = 0;
  /// The consolidated parameters of unit u (layout().unit(u).numel floats) into out on every
  /// rank. Collective.
  virtual void gather_unit(int u, float* out) = 0;
  /// Sets the master weights of unit u from its full buffer (numel floats, the same on every
  /// rank).
  virtual void load_unit(int u, const float* full) = 0;
  /// Moments of unit u, consolidated (for checkpoints); m and v each numel floats. Collective.
  virtual void gather_moments(int u, float* m, float* v) = 0;
  /// Sets the moments of unit u from full buffers (numel floats each).
  virtual void load_moments(int u, const float* m, const float* v) = 0;
  virtual MemoryReport memory() const = 0;
  /// This rank's part of unit u (see UnitShard).
  virtual UnitShard unit_shard(int u) const = 0;
  /// True when every rank holds every unit whole (local or ZeRO-0), false for ZeRO-3 shards.
  virtual bool replicated() const = 0;
};

/// Global-norm clipping and one AdamW step (torch.nn.utils.clip_grad_norm_ then AdamW.step()):
/// grad_norm = sqrt(store.grad_sq_norm()), coefficient = optim::clip_coefficient(norm, max_norm)
/// folded into the step as grad_scale. Returns the gradient norm before clipping. Collective.
/// Throws rlhf::Error if the norm is not finite (NaN/Inf gradients), before touching the weights.
double clip_and_step(ParamStore& store, const optim::AdamWConfig& cfg, double lr, int64_t step,
                     double max_norm);

/// The AdamW segments of the element range [begin, begin + len) of unit u: the intersections
/// with each tensor, offsets relative to begin, with the tensor's weight-decay switch. Padding
/// between tensors is excluded.
std::vector<optim::AdamWSegment> adamw_segments(const model::UnitLayout& u, int64_t begin,
                                                int64_t len);

/// How a bf16 model (model::Transformer::set_bf16) reads a LocalParamStore: its fp32 units, plus a
/// bf16 copy of each (model/bf16_twin.h), made on the first use after the weights last changed.
/// Without it a bf16 model rounds every GEMM weight again in each forward and backward pass (twice
/// per micro-batch); with it, once per optimizer step. The copy is the same rounding
/// (float_to_bf16_n), so results are bit for bit those without it.
class LocalBf16Provider final : public model::UnitProvider<float>, public model::Bf16Twins {
 public:
  explicit LocalBf16Provider(model::LocalParams<float>& params);
  const float* acquire_params(int u) override { return params_.acquire_params(u); }
  void release_params(int u) override { params_.release_params(u); }
  float* acquire_grads(int u) override { return params_.acquire_grads(u); }
  void release_grads(int u) override { params_.release_grads(u); }
  /// The bf16 copy behind [p, p + n) of a unit's parameters, converted now when that unit changed
  /// since its last copy; nullptr when [p, p + n) is in no unit.
  const model::bfloat16* bf16_twin(const float* p, int64_t n) const override;
  /// The fp32 weights may have changed: every copy is made again on its next use.
  void invalidate() const;
  /// Elements converted to bf16 since construction (units × refreshes).
  int64_t converted() const { return converted_; }

 private:
  model::LocalParams<float>& params_;
  mutable std::vector<std::vector<model::bfloat16>> twin_;
  mutable std::vector<char> fresh_;
  mutable int64_t converted_ = 0;
};

/// A ParamStore that keeps everything whole in this process (one rank, no sharding).
class LocalParamStore : public ParamStore {
 public:
  /// bf16_twins: the provider keeps bf16 copies of the weights for a bf16 model
  /// (LocalBf16Provider; 2 more bytes per parameter).
  explicit LocalParamStore(const model::ParamLayout& layout, bool bf16_twins = false);
  const model::ParamLayout& layout() const override { return params_.layout(); }
  model::UnitProvider<float>& provider() override {
    if (twins_) return *twins_;
    return params_;
  }
  void zero_grads() override { params_.zero_grads(); }
  double grad_sq_norm() override;
  void adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                  float grad_scale) override;
  void gather_unit(int u, float* out) override;
  void load_unit(int u, const float* full) override;
  void gather_moments(int u, float* m, float* v) override;
  void load_moments(int u, const float* m, const float* v) override;
  MemoryReport memory() const override;
  UnitShard unit_shard(int u) const override;
  bool replicated() const override { return true; }
  /// The weights themselves, writable: the bf16 copies are made again on their next use.
  model::LocalParams<float>& local() {
    if (twins_) twins_->invalidate();
    return params_;
  }
  /// The bf16 copies' provider, or nullptr without bf16_twins.
  const LocalBf16Provider* bf16_provider() const { return twins_.get(); }

 private:
  model::LocalParams<float> params_;
  std::vector<std::vector<float>> m_, v_;
  std::unique_ptr<LocalBf16Provider> twins_;
};

}  // namespace rlhf::parallel
