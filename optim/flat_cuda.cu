// Element-wise flat-buffer kernels (see optim/flat_cuda.h).
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "optim/flat_cuda.h"

namespace rlhf::optim {

namespace {

constexpr int kBlock = 256;
constexpr int kSumBlocks = static_cast<int>(kSumSquaresWorkspace - 1);

unsigned grid_for(int64_t n) {
  constexpr int64_t kMaxBlocks = 65535 * 8;
  const int64_t g = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(g < 1 ? 1 : g < kMaxBlocks ? g : kMaxBlocks);
}

__global__ void cast_f32_to_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void cast_bf16_to_f32_kernel(float* out, const __nv_bfloat16* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void accumulate_f32_kernel(float* acc, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc[i] += x[i];
}

// Block b sums x[i]² over its contiguous range [b·chunk, (b+1)·chunk) ∩ [0, n) (strided by
// thread), then a shared-memory tree: a fixed order for a given n.
__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double part[kBlock];
  const int64_t chunk = (n + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = begin + chunk < n ? begin + chunk : n;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double acc = 0.0;
  for (int i = 0; i < count; ++i) acc += partial[i];
  out[0] = acc;
}

void check_n(const char* op, int64_t n) {
  RLHF_CHECK(n >= 0, "{}: element count must be >= 0, got {}", op, n);
}

}  // namespace

void cast_f32_to_bf16_cuda(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_n("cast_f32_to_bf16_cuda", n);
  if (n == 0) return;
  cast_f32_to_bf16_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, in, n);
  CUDA_CHECK(cudaGetLastError());
}

void cast_bf16_to_f32_cuda(float* out, const __nv_bfloat16* in, int64_t n, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_n("cast_bf16_to_f32_cuda", n);
  if (n == 0) return;
  cast_bf16_to_f32_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, in, n);
  CUDA_CHECK(cudaGetLastError());
}

void accumulate_f32_cuda(float* acc, const float* x, int64_t n, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_n("accumulate_f32_cuda", n);
  if (n == 0) return;
  accumulate_f32_kernel<<<grid_for(n), kBlock, 0, stream>>>(acc, x, n);
  CUDA_CHECK(cudaGetLastError());
}

void sum_squares_cuda(double* out, const float* x, int64_t n, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_n("sum_squares_cuda", n);
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  sum_squares_partial_kernel<<<kSumBlocks, kBlock, 0, stream>>>(out + 1, x, n);
  CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, 1, 0, stream>>>(out, out + 1, kSumBlocks);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::optim
