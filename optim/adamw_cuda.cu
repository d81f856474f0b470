// AdamW's element-wise update on the GPU (the kernel and its launcher; see optim/adamw_cuda.h).
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "optim/adamw_cuda.h"

namespace rlhf::optim {

namespace {

// PyTorch's operation order, as adamw.cpp's update_range.
__global__ void adamw_kernel(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                             const float* __restrict__ g, int64_t n, AdamWStepScalars s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i] * s.grad_scale;
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
    const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    p[i] = p[i] * s.decay_mul + s.neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_update_cuda(float* p, float* m, float* v, const float* g, int64_t n,
                       const AdamWStepScalars& s, cudaStream_t stream) {
  NVTX_RANGE_FN();
  if (n <= 0) return;
  constexpr int kBlock = 256;
  constexpr int64_t kMaxBlocks = 65535 * 8;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  adamw_kernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kBlock, 0,
                 stream>>>(p, m, v, g, n, s);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::optim
