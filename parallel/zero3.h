// ZeRO-3 (Rajbhandari et al. 2020, §5.3): every unit's flat fp32 buffer is padded and split evenly
// over train_comm; a rank owns 1/N of every unit's master weights, gradients and AdamW moments.
// Forward and backward all-gather a unit when the model acquires it (prefetching the next unit
// in the static order), free the full copy on release, and reduce-scatter each unit's gradient
// into its owner's shard as soon as that unit's backward ends. Also the replicated baseline
// (ZeRO stage 0: full copies everywhere, gradients all-reduced before the step).
// With Zero3Options::bf16_gather (the CPU's --param_dtype bf16) the gathers move a bf16 copy of
// each shard (half the bytes, as the GPU store Zero3StoreCuda does); gradients still
// reduce-scatter in fp32 and the master weights and moments stay fp32.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "model/bf16_twin.h"
#include "model/ops/half.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/shard_layout.h"
#include "parallel/unit_schedule.h"

namespace rlhf::parallel {

/// Options of the sharded store.
struct Zero3Options {
  /// Keep the parameters gathered in forward until backward has used them (no second gather; the
  /// full model then lives on every rank during a step) — `--zero_keep_params`.
  bool keep_params_for_backward = false;
  /// `--adam_offload`: master weights, gradients and moments of the shard live in separate host
  /// buffers; the step runs on the host and the updated shard is copied back. On the CPU backend
  /// both sides are host memory, so only the copies differ; results are bit-identical.
  bool adam_offload = false;
  /// Prefetch the next unit's all-gather when a unit is acquired.
  bool prefetch = true;
  /// A frozen model (reference policy, reward model): weights only — no gradients, no optimizer
  /// state; acquiring gradients or stepping throws.
  bool frozen = false;
  /// `--param_dtype bf16` on the CPU: every rank also keeps its shard rounded to bf16 (nearest
  /// even, refreshed after each optimizer step and load), forward and backward all-gather those
  /// bf16 shards (2 bytes an element instead of 4), and acquire_params hands out the gathered unit
  /// widened to fp32 — the bf16 values exactly, as a bf16 model reads its weights. The bf16 unit
  /// itself is available to the model's bf16 GEMMs (acquired_bf16). Checkpoint gathers
  /// (gather_unit, gather_moments), the gradients and the optimizer stay fp32.
  bool bf16_gather = false;
};

/// The sharded ParamStore and the UnitProvider the model runs on. Collective methods (and every
/// acquire/release, which may communicate) must be called in the same order on every rank of
/// `comm`. Which units are gathered, the prefetch cursor and when a copy is dropped are the
/// UnitSchedule's (parallel/unit_schedule.h), shared with the GPU store.
class Zero3Store final : public ParamStore,
                         public model::UnitProvider<float>,
                         public model::Bf16Twins {
 public:
  /// Shards every unit of `layout` over comm.size() ranks (ShardLayout).
  Zero3Store(const model::ParamLayout& layout, Comm& comm, Zero3Options options = {});
  ~Zero3Store() override;

  // ParamStore
  const model::ParamLayout& layout() const override { return layout_; }
  model::UnitProvider<float>& provider() override { return *this; }
  void zero_grads() override;
  double grad_sq_norm() override;
  void adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                  float grad_scale) override;
  void gather_unit(int u, float* out) override;
  void load_unit(int u, const float* full) override;
  void gather_moments(int u, float* m, float* v) override;
  void load_moments(int u, const float* m, const float* v) override;
  MemoryReport memory() const override;
  UnitShard unit_shard(int u) const override {
    return {shards_[size_t(u)].params.data(), shard_layout_.shard_offset(u, comm_.rank()),
            shard_numel(u)};
  }
  bool replicated() const override { return false; }

  // UnitProvider
  const float* acquire_params(int u) override;
  void release_params(int u) override;
  float* acquire_grads(int u) override;
  void release_grads(int u) override;
  void begin_pass(bool backward) override;
  void end_pass(bool backward) override;

  /// With bf16_gather: the gathered bf16 elements behind [p, p + n) of a unit acquire_params
  /// returned (model/bf16_twin.h); nullptr otherwise (also always when the store gathers fp32).
  const model::bfloat16* bf16_twin(const float* p, int64_t n) const override;
  /// Bytes the parameter all-gathers of acquire_params (and prefetches) have received since
  /// construction: the padded unit times 2 (bf16_gather) or 4 bytes per gather — what
  /// CommStats::bytes counts for them. Checkpoint gathers are not included.
  int64_t param_gather_bytes() const { return param_gather_bytes_; }
  bool bf16_gather() const { return opt_.bf16_gather; }

  /// This rank's shard of unit u: elements [rank·S, (rank+1)·S) of the padded unit, S =
  /// shard_numel(u) (ShardLayout). (The working copy the gathers read.)
  const float* shard_params(int u) const { return shards_[size_t(u)].params.data(); }
  const float* shard_grads(int u) const { return shards_[size_t(u)].grads.data(); }
  /// This rank's shard of unit u's AdamW first / second moments (shard_numel(u) floats each,
  /// same range as shard_params; the host copies with adam_offload). Null for a frozen store.
  const float* shard_m(int u) const {
    const Shard& s = shards_[size_t(u)];
    return opt_.frozen ? nullptr : opt_.adam_offload ? s.m_host.data() : s.m.data();
  }
  const float* shard_v(int u) const {
    const Shard& s = shards_[size_t(u)];
    return opt_.frozen ? nullptr : opt_.adam_offload ? s.v_host.data() : s.v.data();
  }
  int64_t shard_numel(int u) const { return shard_layout_.shard_numel(u); }
  const ShardLayout& shard_layout() const { return shard_layout_; }
  Comm& comm() { return comm_; }

 private:
  struct Shard {
    std::vector<float> params, grads, m, v;      // the "device" side (m, v empty with offload)
    std::vector<float> master_host, grads_host;  // adam_offload: host master + grad copy
    std::vector<float> m_host, v_host;
    std::vector<model::bfloat16> params16;  // bf16_gather: params rounded to bf16
    bool grads_fresh = true;  // no micro-batch has reduced into grads since zero_grads
  };
  // A gathered unit: its full buffer and the all-gather filling it (complete once `ready`).
  // bf16_gather: the all-gather fills buffer16, which `buffer` receives widened once complete.
  struct Gathered {
    std::vector<float>* buffer = nullptr;
    std::unique_ptr<std::vector<model::bfloat16>> buffer16;
    CommRequest request;
    bool ready = false;
  };
  struct PendingGrad {
    int unit = -1;
    std::vector<float>* full = nullptr;
    std::vector<float>* staging = nullptr;  // reduce-scatter output when accumulating
    CommRequest request;
  };

  // Buffers are pooled by size (a unit's padded size, or a shard's), so a layer never holds an
  // embedding-sized buffer.
  using Pool = std::map<int64_t, std::vector<std::unique_ptr<std::vector<float>>>>;
  std::vector<float>* take_buffer(Pool& free, int64_t n);
  void give_back(Pool& free, std::vector<float>* b);
  Gathered post_gather(int u);
  void finish_pending_grad(PendingGrad& g);
  // All-gathers the shards (one per rank, `shard` is this rank's) of unit u into a padded
  // scratch buffer and copies the unit's numel elements to out.
  void gather_padded(int u, const float* shard, float* out);
  void finish_all_pending_grads();
  // Completes a gather (waits for it; bf16_gather: widens buffer16 into buffer).
  void complete(Gathered& g, int64_t numel);
  void drop(Gathered& g);
  // bf16_gather: params16 of unit u's shard = round_bf16(params).
  void refresh_bf16(int u);

  model::ParamLayout layout_;
  ShardLayout shard_layout_;
  Comm& comm_;
  Zero3Options opt_;
  std::vector<Shard> shards_;
  UnitSchedule<Gathered> schedule_;
  Pool free_params_, free_grads_, free_staging_;
  std::map<const std::vector<float>*, std::unique_ptr<std::vector<float>>> in_use_;
  int64_t pooled_floats_ = 0;
  std::map<int64_t, std::vector<std::unique_ptr<std::vector<model::bfloat16>>>> free16_;
  int64_t pooled_bf16_ = 0;
  int64_t param_gather_bytes_ = 0;
  std::vector<const Gathered*> widened_;          // bf16_gather: completed gathers (for bf16_twin)
  std::map<int, std::vector<float>*> grads_out_;  // acquired, not yet released
  std::vector<PendingGrad> pending_;
};

/// ZeRO stage 0, the baseline: full weights, gradients and moments on every rank (like
/// LocalParamStore), gradients all-reduced (summed) over `comm` before the norm and the step.
class ReplicatedStore final : public ParamStore {
 public:
  /// bf16_twins: keep bf16 copies of the weights for a bf16 model, made once per optimizer step
  /// (LocalBf16Provider).
  ReplicatedStore(const model::ParamLayout& layout, Comm& comm, bool bf16_twins = false);
  const model::ParamLayout& layout() const override { return local_.layout(); }
  model::UnitProvider<float>& provider() override { return local_.provider(); }
  void zero_grads() override {
    local_.zero_grads();
    reduced_ = false;
  }
  /// All-reduces the gradients (once per step), then the local sum of squares.
  double grad_sq_norm() override;
  void adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                  float grad_scale) override;
  void gather_unit(int u, float* out) override { local_.gather_unit(u, out); }
  void load_unit(int u, const float* full) override { local_.load_unit(u, full); }
  void gather_moments(int u, float* m, float* v) override { local_.gather_moments(u, m, v); }
  void load_moments(int u, const float* m, const float* v) override {
    local_.load_moments(u, m, v);
  }
  MemoryReport memory() const override { return local_.memory(); }
  UnitShard unit_shard(int u) const override { return local_.unit_shard(u); }
  bool replicated() const override { return true; }

 private:
  void reduce_grads();
  LocalParamStore local_;
  Comm& comm_;
  bool reduced_ = false;
};

}  // namespace rlhf::parallel
