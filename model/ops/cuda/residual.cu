// Residual add on the GPU: element-wise, fp32 add, one bf16 rounding.
#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/residual.h"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

__global__ void residual_forward_kernel(bf16* out, const bf16* a, const bf16* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
}

// da += dout and/or db += dout (either may be null).
__global__ void residual_backward_kernel(bf16* da, bf16* db, const bf16* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d = to_f32(dout[i]);
    if (da != nullptr) da[i] = to_bf16(to_f32(da[i]) + d);
    if (db != nullptr) db[i] = to_bf16(to_f32(db[i]) + d);
  }
}

}  // namespace

void residual_forward_cuda(bf16* out, const bf16* a, const bf16* b, int64_t n,
                           cudaStream_t stream) {
  NVTX_RANGE_FN();
  RLHF_CHECK(n >= 0, "residual_forward_cuda: n must be >= 0, got {}", n);
  if (n == 0) return;
  residual_forward_kernel<<<cuda::grid_for(n, 256), 256, 0, stream>>>(out, a, b, n);
  CUDA_CHECK(cudaGetLastError());
}

void residual_backward_cuda(bf16* da, bf16* db, const bf16* dout, int64_t n, cudaStream_t stream) {
  NVTX_RANGE_FN();
  RLHF_CHECK(n >= 0, "residual_backward_cuda: n must be >= 0, got {}", n);
  if (n == 0 || (da == nullptr && db == nullptr)) return;
  residual_backward_kernel<<<cuda::grid_for(n, 256), 256, 0, stream>>>(da, db, dout, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::model
