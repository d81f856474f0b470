// AdamW on flat fp32 buffers (the ZeRO shard of a unit): the element-wise update of
// torch.optim.AdamW (foreach=False), host side, vectorised and threaded.
//
// `optim/` knows only flat buffers: it includes core/ and nothing else of ours.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace rlhf::optim {

/// AdamW hyper-parameters. Defaults follow OpenRLHF: `--actor_learning_rate` 1e-6, `--adam_betas`
/// (0.9, 0.95), eps 1e-8, `--l2` (weight decay) 0.
struct AdamWConfig {
  double lr = 1e-6;           ///< base learning rate (the schedule multiplies it)
  double beta1 = 0.9;         ///< first-moment decay
  double beta2 = 0.95;        ///< second-moment decay
  double eps = 1e-8;          ///< added to sqrt(v̂), as PyTorch does (outside the sqrt)
  double weight_decay = 0.0;  ///< decoupled weight decay λ (applied as p ← p·(1 − lr·λ))

  /// Throws rlhf::Error naming `source` and the field if lr < 0, beta ∉ [0, 1), eps < 0 or
  /// weight_decay < 0 (or any of them is not finite).
  void validate(const std::string& source = "AdamW config") const;
};

/// One range of a flat buffer that gets its own weight-decay switch: elements
/// [offset, offset + length). OpenRLHF does not decay biases and norm weights.
struct AdamWSegment {
  int64_t offset = 0;
  int64_t length = 0;
  bool decay = true;
};

/// One AdamW step (Loshchilov & Hutter 2019, Alg. 2, in PyTorch's bias-correction form), in fp32,
/// element-wise over p, m, v, g: (n) fp32 each. With g̃ = g·grad_scale and t = step (1-based):
///   p ← p·(1 − lr·λ)                               (λ = cfg.weight_decay if decay, else 0)
///   m ← β1·m + (1 − β1)·g̃
///   v ← β2·v + (1 − β2)·g̃²
///   p ← p − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)
/// `lr` is this step's learning rate (the schedule's output; cfg.lr is not read). `grad_scale`
/// folds the clip coefficient into the step (no separate pass over g). p, m, v are updated in
/// place (=); g is read only. Threaded with OpenMP (static schedule) and vectorised; the result
/// does not depend on the thread count. Throws rlhf::Error if step < 1, n < 0, lr < 0 or lr or
/// grad_scale is not finite; does not validate cfg (call cfg.validate() once).
void adamw_step_cpu(float* p, float* m, float* v, const float* g, int64_t n, const AdamWConfig& cfg,
                    double lr, int64_t step, bool decay, float grad_scale = 1.0f);

/// The same step on several ranges of one buffer of n elements (the ZeRO shard of a unit crosses
/// several tensors), in one threaded region. Each segment uses its own `decay`; elements outside
/// every segment are left untouched. Gives bit-identical results to one adamw_step_cpu call per
/// segment. Throws rlhf::Error if a segment is out of [0, n) or two segments overlap.
void adamw_step_segments_cpu(float* p, float* m, float* v, const float* g, int64_t n,
                             std::span<const AdamWSegment> segments, const AdamWConfig& cfg,
                             double lr, int64_t step, float grad_scale = 1.0f);

#ifdef RLHF_CUDA
/// adamw_step_cpu on the GPU: p, m, v, g (n) fp32 in device memory, the same formula, operation
/// order and per-step scalars (computed on the host in double, rounded to fp32 as on the CPU),
/// one thread per element (grid-stride), enqueued on `stream` (asynchronous: returns before the
/// update has run). Results agree with the CPU version to fp32 rounding (FMA contraction may
/// differ). Throws rlhf::Error like adamw_step_cpu (host-side checks only).
void adamw_step_cuda(float* p, float* m, float* v, const float* g, int64_t n,
                     const AdamWConfig& cfg, double lr, int64_t step, bool decay, float grad_scale,
                     cudaStream_t stream);

/// adamw_step_segments_cpu on the GPU: one launch per non-empty segment, all on `stream`.
/// Validates the segments on the host like the CPU version (bounds, no overlap).
void adamw_step_segments_cuda(float* p, float* m, float* v, const float* g, int64_t n,
                              std::span<const AdamWSegment> segments, const AdamWConfig& cfg,
                              double lr, int64_t step, float grad_scale, cudaStream_t stream);
#endif

}  // namespace rlhf::optim
