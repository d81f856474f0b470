// The device half of AdamW on the GPU (optim/adamw_cuda.cu): the per-step scalars and the
// element-wise update launcher. Callers use adamw_step_cuda / adamw_step_segments_cuda
// (optim/adamw.h), which validate and compute the scalars; this header stays C++17-clean because
// nvcc compiles the .cu file with its default dialect.
#pragma once

#include <cstdint>

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

namespace rlhf::optim {

/// The fp32 scalars of one AdamW step (see optim/adamw.cpp): decay_mul = 1 − lr·λ (1 without
/// decay), neg_step_size = −lr / (1 − β1^t), bc2_sqrt = sqrt(1 − β2^t).
struct AdamWStepScalars {
  float decay_mul = 1.0f;
  float beta1 = 0.0f, one_minus_beta1 = 1.0f, beta2 = 0.0f, one_minus_beta2 = 1.0f;
  float neg_step_size = 0.0f;
  float bc2_sqrt = 1.0f;
  float eps = 0.0f;
  float grad_scale = 1.0f;
};

/// Enqueues on `stream`, for i < n (device fp32 arrays):
///   gi = g[i]·grad_scale; m[i] = β1·m[i] + (1−β1)·gi; v[i] = β2·v[i] + (1−β2)·gi²;
///   p[i] = p[i]·decay_mul + neg_step_size · m[i] / (sqrt(v[i]) / bc2_sqrt + eps).
/// No validation (n >= 0 assumed; n == 0 launches nothing). Throws rlhf::Error on a launch error.
void adamw_update_cuda(float* p, float* m, float* v, const float* g, int64_t n,
                       const AdamWStepScalars& s, cudaStream_t stream);

}  // namespace rlhf::optim
#endif
