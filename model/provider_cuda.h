// UnitProviderCuda: the GPU counterpart of UnitProvider (model/provider.h). The model obtains a
// unit's full parameters as bf16 device memory and accumulates its gradients into an fp32 device
// buffer, without knowing whether they are one process's buffers or ZeRO-3 shards gathered over
// NCCL.
#pragma once

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// Same protocol as UnitProvider<T> (static unit order, calls may nest for the tied head), with
/// device pointers. Every pointer is valid for work enqueued on stream() after the acquire
/// returns; release_* may be called as soon as the work that reads (or writes) the buffer has
/// been enqueued on stream() — the provider orders its own use after it (e.g. by an event).
class UnitProviderCuda {
 public:
  virtual ~UnitProviderCuda() = default;
  /// Full parameters of unit u: at least numel bf16 (ParamLayout::unit(u) order) in device
  /// memory.
  virtual const bf16* acquire_params(int u) = 0;
  virtual void release_params(int u) = 0;
  /// Full fp32 gradient buffer of unit u (at least numel) in device memory; the model accumulates
  /// into it (+=) on stream().
  virtual float* acquire_grads(int u) = 0;
  /// Unit u's gradient for this backward pass is enqueued (a ZeRO-3 provider reduce-scatters it).
  virtual void release_grads(int u) = 0;
  virtual void begin_pass(bool backward) { (void)backward; }
  virtual void end_pass(bool backward) { (void)backward; }
  /// The compute stream the model enqueues its kernels on.
  virtual cudaStream_t stream() const = 0;
};

}  // namespace rlhf::model
#endif
