// Kernels that exercise the emulator itself (see selftest_kernels.h).
#include "core/cuda_check.h"
#include "tests/cuda_emu/selftest_kernels.h"

namespace rlhf::emu::selftest {
namespace {

__global__ void block_sum_kernel(float* out, const float* in, int n) {
  extern __shared__ float part[];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += in[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = part[0];
}

__global__ void warp_xor_sum_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x) + 1;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

__global__ void shuffle_modes_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x);
  out[4 * t + 0] = __shfl_sync(0xffffffffu, t, 5);
  out[4 * t + 1] = __shfl_down_sync(0xffffffffu, t, 3);
  out[4 * t + 2] = __shfl_up_sync(0xffffffffu, t, 3);
  out[4 * t + 3] = __shfl_xor_sync(0xffffffffu, t, 1, 16);
}

__global__ void ballot_kernel(unsigned* out) {
  out[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
}

__global__ void racy_neighbour_kernel(int* out) {
  __shared__ int s[1024];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = t + 1;
  out[t] = s[(t + 1) % static_cast<int>(blockDim.x)];
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < blockDim.x / 2) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_after_exit_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void launch_config_kernel_impl(int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = static_cast<int>(gridDim.x * blockDim.x);
}

__global__ void iota_kernel(int64_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = i;
}

}  // namespace

void block_sum(float* out, const float* in, int n, int threads, cudaStream_t s) {
  block_sum_kernel<<<1, threads, threads * sizeof(float), s>>>(out, in, n);
  CUDA_CHECK(cudaGetLastError());
}
void warp_xor_sum(int* out, int threads, cudaStream_t s) {
  warp_xor_sum_kernel<<<1, threads, 0, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
void shuffle_modes(int* out, cudaStream_t s) {
  shuffle_modes_kernel<<<1, 32, 0, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
void ballot(unsigned* out, cudaStream_t s) {
  ballot_kernel<<<1, 32, 0, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
void racy_neighbour(int* out, int threads, cudaStream_t s) {
  racy_neighbour_kernel<<<1, threads, 0, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
void divergent_barrier(int* out, int threads, cudaStream_t s) {
  divergent_barrier_kernel<<<1, threads, 0, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
void shuffle_after_exit(int* out, cudaStream_t s) {
  shuffle_after_exit_kernel<<<1, 32, 0, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
void launch_config(int* out, unsigned grid, unsigned block, size_t smem, cudaStream_t s) {
  launch_config_kernel_impl<<<grid, block, smem, s>>>(out);
  CUDA_CHECK(cudaGetLastError());
}
const void* launch_config_kernel() {
  return reinterpret_cast<const void*>(&launch_config_kernel_impl);
}
void iota(int64_t* out, int64_t n, unsigned grid, cudaStream_t s) {
  iota_kernel<<<grid, 128, 0, s>>>(out, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::emu::selftest
