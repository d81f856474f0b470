// RMSNorm on the GPU: one warp per row for the row-wise passes, fixed-order column sums for dw.
#include <algorithm>

#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/rmsnorm.h"

namespace rlhf::model {

using cuda::kWarpSize;
using cuda::to_bf16;
using cuda::to_f32;
using cuda::warp_sum;

namespace {

constexpr int kRowsPerBlock = 8;       // one warp per row, 8 warps per block
constexpr int kColTile = 32;           // dw: columns per block (one per lane)
constexpr int kColRows = 16;           // dw: row groups per block (blockDim.y)
constexpr int64_t kDwChunkRows = 128;  // dw: rows per block of the first stage (at least)

constexpr int kUnroll = 8;  // row passes: elements per lane whose loads are issued together

// --- kernels ---------------------------------------------------------------------------------

// One lane's chunk of a row: out[u] = row[c0 + u·32] as fp32 for u < kUnroll (0 past C), every
// load issued before any is used.
__device__ __forceinline__ void load_lane_chunk(float (&out)[kUnroll], const bf16* row, int64_t c0,
                                                int64_t C) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = c0 + int64_t{u} * kWarpSize;
    out[u] = c < C ? to_f32(row[c]) : 0.0f;
  }
}

// Row n = blockIdx.x·8 + warp. With residual_in != nullptr the row is first formed as
// residual_out = bf16(residual_in + x) (stored), and normalised as rounded; else residual_out is
// x itself (read only).
__global__ void rmsnorm_forward_kernel(bf16* y, float* rstd, bf16* residual_out,
                                       const bf16* residual_in, const bf16* x, const bf16* w,
                                       int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;  // whole warp leaves together (n is warp-uniform)
  const bf16* xr = x + n * C;
  bf16* yr = y + n * C;
  const bf16* src = xr;  // the row that is normalised
  // Chunks of kUnroll elements per lane: every load of a chunk is issued before its stores (ro
  // may alias rr, so without the chunking each store would wait on the previous load). The sum
  // of squares still runs over c in increasing order per lane.
  float ss = 0.0f;
  if (residual_in != nullptr) {
    const bf16* rr = residual_in + n * C;
    bf16* ro = residual_out + n * C;
    for (int64_t c0 = lane; c0 < C; c0 += kWarpSize * kUnroll) {
      float a[kUnroll], b[kUnroll];
      load_lane_chunk(a, rr, c0, C);
      load_lane_chunk(b, xr, c0, C);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t{u} * kWarpSize;
        if (c >= C) break;
        const bf16 s = to_bf16(a[u] + b[u]);
        ro[c] = s;  // this lane read rr[c] above: ro may alias rr
        const float sf = to_f32(s);
        ss += sf * sf;
      }
    }
    src = ro;
  } else {
    for (int64_t c = lane; c < C; c += kWarpSize) {
      const float v = to_f32(xr[c]);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(C) + eps);
  if (lane == 0) rstd[n] = r;
  // src[c] for this lane's c was written (fused case) by this same lane above: visible to it.
  for (int64_t c0 = lane; c0 < C; c0 += kWarpSize * kUnroll) {
    float v[kUnroll], wv[kUnroll];
    load_lane_chunk(v, src, c0, C);
    load_lane_chunk(wv, w, c0, C);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * kWarpSize;
      if (c < C) yr[c] = to_bf16(v[u] * r * wv[u]);
    }
  }
}

// dx_c += r·w_c·dy_c − (r³/C)·x_c·Σ_k w_k·dy_k·x_k, one warp per row. Both passes go over the
// row in chunks of kUnroll elements per lane with every load of a chunk issued before its math
// (as the forward kernel), so a warp has kUnroll loads in flight instead of one.
__global__ void rmsnorm_backward_dx_kernel(bf16* dx, const bf16* dy, const bf16* x, const bf16* w,
                                           const float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const bf16* xr = x + n * C;
  const bf16* dyr = dy + n * C;
  bf16* dxr = dx + n * C;
  const float r = rstd[n];
  float dot = 0.0f;
  for (int64_t c0 = lane; c0 < C; c0 += kWarpSize * kUnroll) {
    float a[kUnroll], b[kUnroll], e[kUnroll];
    load_lane_chunk(a, w, c0, C);
    load_lane_chunk(b, dyr, c0, C);
    load_lane_chunk(e, xr, c0, C);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dot += a[u] * b[u] * e[u];
  }
  dot = warp_sum(dot);
  const float k = r * r * r * dot / static_cast<float>(C);
  for (int64_t c0 = lane; c0 < C; c0 += kWarpSize * kUnroll) {
    float a[kUnroll], b[kUnroll], e[kUnroll], d[kUnroll];
    load_lane_chunk(a, w, c0, C);
    load_lane_chunk(b, dyr, c0, C);
    load_lane_chunk(e, xr, c0, C);
    load_lane_chunk(d, dxr, c0, C);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * kWarpSize;
      if (c < C) dxr[c] = to_bf16(d[u] + (r * a[u] * b[u] - k * e[u]));
    }
  }
}

// dw_c += Σ_n dy[n,c]·x[n,c]·rstd[n] in two fixed-order stages (deterministic). Stage 1, block
// (32, 16) of grid (column tiles, row chunks): column c = blockIdx.x·32 + threadIdx.x; thread row
// ty sums the chunk's rows ty, ty+16, ... in order, then thread ty = 0 adds the 16 partials in
// order into part[chunk, c]. Stage 2 adds the chunks' partials in chunk order into dw.
__global__ void rmsnorm_backward_dw_partial_kernel(float* part, const bf16* dy, const bf16* x,
                                                   const float* rstd, int64_t N, int64_t C,
                                                   int64_t chunk_rows) {
  __shared__ float sums[kColRows][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t n1 = n0 + chunk_rows < N ? n0 + chunk_rows : N;
  float acc = 0.0f;
  if (c < C) {
    for (int64_t n = n0 + threadIdx.y; n < n1; n += kColRows)
      acc += to_f32(dy[n * C + c]) * to_f32(x[n * C + c]) * rstd[n];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.0f;
    for (int i = 0; i < kColRows; ++i) s += sums[i][threadIdx.x];
    part[blockIdx.y * C + c] = s;
  }
}

__global__ void rmsnorm_backward_dw_sum_kernel(float* dw, const float* part, int64_t chunks,
                                               int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t i = 0; i < chunks; ++i) s += part[i * C + c];
  dw[c] += s;
}

void check_dims(const char* op, int64_t N, int64_t C) {
  RLHF_CHECK(N >= 0 && C > 0, "{}: need N >= 0 and C > 0, got N={} C={}", op, N, C);
}

unsigned row_grid(int64_t N) {
  return static_cast<unsigned>(cuda::ceil_div(N, kRowsPerBlock));
}

}  // namespace

// --- launchers -------------------------------------------------------------------------------

void rmsnorm_forward_cuda(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t N, int64_t C,
                          double eps, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("rmsnorm_forward_cuda", N, C);
  if (N == 0) return;
  rmsnorm_forward_kernel<<<row_grid(N), kRowsPerBlock * kWarpSize, 0, stream>>>(
      y, rstd, nullptr, nullptr, x, w, N, C, static_cast<float>(eps));
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_residual_forward_cuda(bf16* residual_out, bf16* y, float* rstd,
                                   const bf16* residual_in, const bf16* x, const bf16* w, int64_t N,
                                   int64_t C, double eps, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("rmsnorm_residual_forward_cuda", N, C);
  RLHF_CHECK(residual_in != nullptr && residual_out != nullptr,
             "rmsnorm_residual_forward_cuda: residual_in and residual_out must not be null");
  if (N == 0) return;
  rmsnorm_forward_kernel<<<row_grid(N), kRowsPerBlock * kWarpSize, 0, stream>>>(
      y, rstd, residual_out, residual_in, x, w, N, C, static_cast<float>(eps));
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward_cuda(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                           const float* rstd, int64_t N, int64_t C, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("rmsnorm_backward_cuda", N, C);
  if (N == 0) return;
  rmsnorm_backward_dx_kernel<<<row_grid(N), kRowsPerBlock * kWarpSize, 0, stream>>>(dx, dy, x, w,
                                                                                    rstd, N, C);
  CUDA_CHECK(cudaGetLastError());
  if (dw == nullptr) return;  // a frozen weight (LoRA's base)
  // Stage 1 over (column tiles, row chunks) into a stream-ordered scratch, stage 2 per column.
  const int64_t chunk_rows = std::max(kDwChunkRows, cuda::ceil_div(N, 65535));  // grid.y limit
  const int64_t chunks = cuda::ceil_div(N, chunk_rows);
  float* part = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&part),
                             static_cast<size_t>(chunks * C) * sizeof(float), stream));
  const dim3 block(kColTile, kColRows);
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, kColTile)),
                  static_cast<unsigned>(chunks));
  rmsnorm_backward_dw_partial_kernel<<<grid, block, 0, stream>>>(part, dy, x, rstd, N, C,
                                                                 chunk_rows);
  const cudaError_t launched = cudaGetLastError();
  if (launched == cudaSuccess)
    rmsnorm_backward_dw_sum_kernel<<<static_cast<unsigned>(cuda::ceil_div(C, 256)), 256, 0,
                                     stream>>>(dw, part, chunks, C);
  const cudaError_t summed = launched == cudaSuccess ? cudaGetLastError() : launched;
  CUDA_CHECK(cudaFreeAsync(part, stream));
  CUDA_CHECK(summed);
}

}  // namespace rlhf::model
