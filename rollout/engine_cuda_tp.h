// Tensor parallelism of the GPU generation engine (EngineCuda, rollout/engine_cuda.h): this rank's
// Megatron-style slices of every decoder layer in device memory (bf16), and the NCCL communicator
// over the engine's tensor-parallel group that sums the row-parallel outputs. The split is the CPU
// engine's (rollout/engine_cpu.cpp; model/projections.h's TpSplit): q/k/v and gate/up column
// parallel (this rank's output rows and their biases), o_proj and down_proj row parallel (this
// rank's input columns; the o_proj bias on rank 0 only, added once to the sum).
#pragma once

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "model/layer_params.h"
#include "model/layout.h"
#include "model/ops/cuda_types.h"
#include "rollout/engine_backend.h"

namespace rlhf::rollout {

/// Where one rank's slices of a decoder layer lie in its own flat bf16 buffer, and where they come
/// from in the layer's full unit buffer (ParamLayout order).
struct TpSlicePlan {
  /// `rows` runs of `width` elements: from full-unit offset src (runs `pitch` apart) to slice
  /// offset dst (runs back to back).
  struct Piece {
    int64_t src = 0, pitch = 0, dst = 0, width = 0, rows = 1;
  };
  std::vector<Piece> pieces;
  /// Slice offsets of each projection's weight and bias (by Proj; bias -1: none on this rank), and
  /// of the norms (-1: absent). The q/k/v weights lie back to back, and so do their biases, so the
  /// three are one GEMM (model::qkv_packed's contract) on the slices too.
  std::array<int64_t, model::kNumProj> w{}, b{};
  int64_t q_norm = -1, k_norm = -1, w_in = 0, w_post = 0;
  int64_t elems = 0;  ///< the slice buffer's elements (tensors 64-element aligned)

  /// Rank r of T's plan for layer unit u, s = tp_layer_spec (this rank's dims).
  TpSlicePlan(const model::UnitLayout& u, const model::LayerSpec& s, int T, int r);
};

/// A tensor-parallel GPU engine's layers (size > 1): slices and the group's NCCL communicator.
/// Not thread-safe.
class EngineCudaTp {
 public:
  /// Collective over tp.comm (every rank of the group constructs it together): creates the NCCL
  /// communicator of the group on the current CUDA device (rank 0's ncclUniqueId broadcast over
  /// tp.comm's MPI communicator) and allocates zeroed slices for every layer. Throws rlhf::Error
  /// when T does not divide the heads and MLP columns (tp_split_problem), in a build without
  /// NCCL, or on a CUDA/NCCL failure.
  EngineCudaTp(const model::ParamLayout& layout, const TpGroup& tp, cudaStream_t s);
  ~EngineCudaTp();
  EngineCudaTp(const EngineCudaTp&) = delete;
  EngineCudaTp& operator=(const EngineCudaTp&) = delete;

  /// Device elements of every layer's slices of rank 0 of a group of T (the largest rank's): what
  /// the engine's fixed memory counts instead of the layer units.
  static int64_t slice_elems(const model::ParamLayout& layout, int T);

  /// Layer l's slices from its full unit buffer: fp32 host memory (converted to bf16,
  /// round-to-nearest-even, staged through a host buffer) or bf16 device memory (2-D copies).
  /// Asynchronous on s (the host staging is synchronised before returning).
  void load_from_host(int l, const float* unit, cudaStream_t s);
  void load_from_device(int l, const model::bf16* unit, cudaStream_t s);
  /// Layer l's weights as the layer routine reads them (this rank's dims, tp_layer_spec).
  model::LayerParams<const model::bf16> layer(int l) const;
  /// Sums y (n bf16, device) over the group in place, enqueued on s (ncclAllReduce: capturable
  /// into a CUDA graph).
  void all_reduce(model::bf16* y, int64_t n, cudaStream_t s);

  /// Device bytes of the slices.
  int64_t bytes() const;
  /// Frees the slices (sleep); returns the bytes freed. allocate() takes them back (zeroed).
  int64_t release();
  int64_t allocate(cudaStream_t s);

 private:
  TpGroup tp_;
  std::vector<TpSlicePlan> plans_;                // per layer
  std::vector<DeviceArray<model::bf16>> slices_;  // per layer
  std::vector<model::bf16> staging_;              // host staging of load_from_host
  void* nccl_ = nullptr;                          // ncclComm_t
};

}  // namespace rlhf::rollout
#endif  // RLHF_CUDA
