// Zero3StoreCuda: ZeRO-3 (parallel/zero3.h) on the GPU. A rank owns 1/N of every unit: the fp32
// master weights, the fp32 gradient and the AdamW moments of its shard, plus a bf16 copy of the
// shard that forward and backward all-gather over NCCL into full bf16 units. Gradients are
// accumulated by the model in full fp32 unit buffers and reduce-scattered (fp32 sum) into the
// owner's shard as soon as the unit's backward is enqueued. With one rank there is no
// communicator: the shard is the unit.
#pragma once

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "core/device_memory.h"
#include "model/provider_cuda.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/shard_layout.h"
#include "parallel/unit_schedule.h"

namespace rlhf::parallel {

class NcclComm;

/// Options of the device store (the GPU meaning of the Zero3Options flags).
struct Zero3OptionsCuda {
  /// `--adam_offload`: master weights and AdamW moments of the shard live in pinned host memory;
  /// each step copies the gradient shard down asynchronously (a copy stream, one event per unit),
  /// runs the threaded, vectorised host AdamW (optim::adamw_step_segments_cpu) unit by unit as
  /// the copies land, and copies the updated bf16 shard back up while the next unit is stepped.
  bool adam_offload = false;
  /// A frozen model (reference policy, reward model): the bf16 shard only — no master, no
  /// gradients, no moments; acquiring gradients or stepping throws.
  bool frozen = false;
  /// Prefetch the next unit's all-gather (static order) when a unit is acquired.
  bool prefetch = true;
  /// `--zero_keep_params`: keep the forward's gathered units for backward.
  bool keep_params_for_backward = false;
};

/// The sharded training state on the GPU and the UnitProviderCuda the GPU model runs on.
///
/// Streams. Kernels of the model, the optimizer and the casts run on stream() (owned by the
/// store). Collectives run on the NCCL communicator's stream, ordered by events: a unit's gather
/// waits for the compute work that last used its buffer, compute waits only for the gather of
/// the unit it acquires (so the prefetched gather of unit u+1 overlaps the compute of unit u),
/// and a gradient's reduce-scatter waits for the compute that filled it. The optimizer, the
/// norm and every host-visible method first make stream() wait for all communication.
///
/// Which units are gathered, the prefetch cursor and when a copy is dropped are the UnitSchedule's
/// (parallel/unit_schedule.h), shared with the host Zero3Store.
///
/// Collective methods (every acquire/release when N > 1, grad_sq_norm, gather_*) must be called
/// in the same order on every rank. Not thread-safe.
class Zero3StoreCuda final : public ParamStore, public model::UnitProviderCuda {
 public:
  /// Shards `layout` over comm->size() ranks (ShardLayout), or 1 when comm is nullptr. comm must
  /// be an NcclComm (device buffers) when given. Allocates every shard on the current device
  /// (and pinned host memory with adam_offload). Throws rlhf::Error on a mismatch or when memory
  /// runs out (naming the bytes).
  Zero3StoreCuda(const model::ParamLayout& layout, Comm* comm, Zero3OptionsCuda options = {});
  ~Zero3StoreCuda() override;

  // ParamStore
  const model::ParamLayout& layout() const override { return layout_; }
  /// There is no host-side provider: the model of a device store is TransformerCuda, which uses
  /// the store as its UnitProviderCuda. Throws rlhf::Error.
  model::UnitProvider<float>& provider() override;
  void zero_grads() override;
  double grad_sq_norm() override;
  void adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                  float grad_scale) override;
  void gather_unit(int u, float* out) override;
  void load_unit(int u, const float* full) override;
  void gather_moments(int u, float* m, float* v) override;
  void load_moments(int u, const float* m, const float* v) override;
  /// params/grads/optimizer bytes of this rank's shards; gather_bytes is the pooled full-unit
  /// buffers; optimizer_on_host with adam_offload.
  MemoryReport memory() const override;
  /// This rank's fp32 master shard in host memory (the pinned master with adam_offload; else a
  /// host mirror downloaded by this call; a frozen store widens its bf16 shard).
  UnitShard unit_shard(int u) const override;
  bool replicated() const override { return nshards_ == 1; }

  // UnitProviderCuda
  const model::bf16* acquire_params(int u) override;
  void release_params(int u) override;
  float* acquire_grads(int u) override;
  void release_grads(int u) override;
  void begin_pass(bool backward) override;
  void end_pass(bool backward) override;
  cudaStream_t stream() const override { return compute_.get(); }

  int64_t shard_numel(int u) const { return shard_layout_.shard_numel(u); }
  const ShardLayout& shard_layout() const { return shard_layout_; }
  /// This rank's bf16 shard of unit u (device).
  const model::bf16* shard_params_bf16(int u) const { return shards_[size_t(u)].params16.get(); }

 private:
  template <typename T>
  struct Buffer {
    DeviceArray<T> data;
    CudaEvent reusable;  // recorded by the last stream that used the buffer
    bool used = false;
  };
  template <typename T>
  using Pool = std::map<int64_t, std::vector<std::unique_ptr<Buffer<T>>>>;
  struct Shard {
    DeviceArray<model::bf16> params16;
    DeviceArray<float> master, m, v, grads;                      // device (master/m/v: no offload)
    PinnedArray<float> master_host, m_host, v_host, grads_host;  // adam_offload
    PinnedArray<model::bf16> params16_host;                      // adam_offload: updated bf16 shard
    std::unique_ptr<CudaEvent> d2h, h2d;                         // adam_offload copies
    mutable std::vector<float> mirror;                           // unit_shard() without offload
  };
  struct Gathered {
    std::unique_ptr<Buffer<model::bf16>> buffer;
    CudaEvent ready;  // recorded on the comm stream after the all-gather
  };

  template <typename T>
  std::unique_ptr<Buffer<T>> take(Pool<T>& pool, int64_t n, cudaStream_t user);
  template <typename T>
  void give_back(Pool<T>& pool, std::unique_ptr<Buffer<T>> b, cudaStream_t last_user);
  std::unique_ptr<Gathered> post_gather(int u);
  void sync_comm();
  cudaStream_t comm_stream() const;
  const float* master_host_view(int u) const;
  // The host shards `mine` (this rank's, shard_numel(u) floats) of every rank, gathered over the
  // NCCL communicator's MPI twin; the unit's numel elements into out.
  void gather_host(int u, const float* mine, float* out);

  model::ParamLayout layout_;
  ShardLayout shard_layout_;
  NcclComm* nccl_ = nullptr;
  int nshards_ = 1, rank_ = 0;
  Zero3OptionsCuda opt_;
  CudaStream compute_;
  std::unique_ptr<CudaStream> copy_;  // adam_offload
  std::vector<Shard> shards_;
  UnitSchedule<std::unique_ptr<Gathered>> schedule_;  // gathered units, prefetch cursor
  std::map<int, std::unique_ptr<Buffer<float>>> grads_out_;
  Pool<model::bf16> free_params_;
  Pool<float> free_grads_, free_staging_;
  int64_t pooled_bytes_ = 0;
  std::deque<CommRequest> requests_;  // posted collectives (completion checked at sync points)
  CudaEvent compute_to_comm_;
  DeviceArray<double> norm_ws_;
};

}  // namespace rlhf::parallel
#endif  // RLHF_CUDA
