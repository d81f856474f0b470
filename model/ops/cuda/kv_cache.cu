// Paged KV cache writes and prefix copies on the GPU (see model/ops/kv_cache.h).
#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/kv_cache.h"

namespace rlhf::model {

namespace {

// One thread per element of the (N, Hkv, D) rows, grid-stride.
__global__ void kv_cache_write_kernel(bf16* k_cache, bf16* v_cache, const bf16* k_rows,
                                      const bf16* v_rows, const int32_t* table,
                                      int64_t table_stride, const int32_t* pos, int64_t N,
                                      int64_t Hkv, int64_t D, int64_t bs) {
  const int64_t total = N * Hkv * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, g = (i / D) % Hkv, n = i / (D * Hkv);
    const int64_t dst = cuda::paged_kv_row(table + n * table_stride, pos[n], g, Hkv, bs, D) + d;
    k_cache[dst] = k_rows[i];
    v_cache[dst] = v_rows[i];
  }
}

// One thread per element of (planes, n positions, Hkv, D).
__global__ void kv_cache_copy_prefix_kernel(bf16* cache, int64_t planes, int64_t plane_elems,
                                            const int32_t* src, const int32_t* dst, int64_t n,
                                            int64_t Hkv, int64_t D, int64_t bs) {
  const int64_t per_plane = n * Hkv * D, total = planes * per_plane;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = i / per_plane, r = i % per_plane;
    const int64_t d = r % D, g = (r / D) % Hkv, s = r / (D * Hkv);
    const int64_t off = (g * bs + s % bs) * D + d;
    bf16* plane = cache + p * plane_elems;
    plane[static_cast<int64_t>(dst[s / bs]) * Hkv * bs * D + off] =
        plane[static_cast<int64_t>(src[s / bs]) * Hkv * bs * D + off];
  }
}

}  // namespace

void kv_cache_write_cuda(bf16* k_cache, bf16* v_cache, const bf16* k_rows, const bf16* v_rows,
                         const int32_t* block_table, int64_t table_stride, const int32_t* pos,
                         int64_t N, int64_t Hkv, int64_t D, int64_t block_size,
                         cudaStream_t stream) {
  NVTX_RANGE_FN();
  RLHF_CHECK(N >= 0 && Hkv > 0 && D > 0 && block_size > 0 && table_stride >= 0,
             "kv_cache_write_cuda: bad sizes N={} Hkv={} D={} block_size={} table_stride={}", N,
             Hkv, D, block_size, table_stride);
  if (N == 0) return;
  kv_cache_write_kernel<<<cuda::grid_for(N * Hkv * D, 256), 256, 0, stream>>>(
      k_cache, v_cache, k_rows, v_rows, block_table, table_stride, pos, N, Hkv, D, block_size);
  CUDA_CHECK(cudaGetLastError());
}

void kv_cache_copy_prefix_cuda(bf16* cache, int64_t planes, int64_t plane_elems, const int32_t* src,
                               const int32_t* dst, int64_t n, int64_t Hkv, int64_t D,
                               int64_t block_size, cudaStream_t stream) {
  NVTX_RANGE_FN();
  RLHF_CHECK(planes > 0 && plane_elems > 0 && n >= 0 && Hkv > 0 && D > 0 && block_size > 0,
             "kv_cache_copy_prefix_cuda: bad sizes planes={} n={} Hkv={} D={} block_size={}",
             planes, n, Hkv, D, block_size);
  if (n == 0) return;
  kv_cache_copy_prefix_kernel<<<cuda::grid_for(planes * n * Hkv * D, 256), 256, 0, stream>>>(
      cache, planes, plane_elems, src, dst, n, Hkv, D, block_size);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::model
