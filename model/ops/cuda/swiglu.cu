// SwiGLU on the GPU: element-wise, fp32 math.
#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/swiglu.h"

namespace rlhf::model {

using cuda::sigmoid2;
using cuda::to_bf16;
using cuda::to_f32;

namespace {

__global__ void swiglu_forward_kernel(bf16* h, const bf16* gate, const bf16* up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]);
    float s, oms;
    sigmoid2(g, &s, &oms);
    h[i] = to_bf16(g * s * u);
  }
}

// dgate = dh·up·σ(g)·(1 + g·(1 − σ(g))), dup = dh·g·σ(g).
__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate,
                                       const bf16* up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), d = to_f32(dh[i]);
    float s, oms;
    sigmoid2(g, &s, &oms);
    dgate[i] = to_bf16(d * u * s * (1.0f + g * oms));
    dup[i] = to_bf16(d * g * s);
  }
}

void check_dims(const char* op, int64_t N, int64_t F) {
  RLHF_CHECK(N >= 0 && F >= 0, "{}: need N >= 0 and F >= 0, got N={} F={}", op, N, F);
}

}  // namespace

void swiglu_forward_cuda(bf16* h, const bf16* gate, const bf16* up, int64_t N, int64_t F,
                         cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("swiglu_forward_cuda", N, F);
  const int64_t n = N * F;
  if (n == 0) return;
  swiglu_forward_kernel<<<cuda::grid_for(n, 256), 256, 0, stream>>>(h, gate, up, n);
  CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward_cuda(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* up,
                          int64_t N, int64_t F, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("swiglu_backward_cuda", N, F);
  const int64_t n = N * F;
  if (n == 0) return;
  swiglu_backward_kernel<<<cuda::grid_for(n, 256), 256, 0, stream>>>(dgate, dup, dh, gate, up, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::model
