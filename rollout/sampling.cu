// Token sampling on the GPU (rollout/sampling.h, sample_rows_cuda): the host Sampler's untruncated
// and greedy cases, one block per row, so a decode step's logits never leave the device (B·V bf16
// copied and widened on the host, then B·V exps there, was most of a GPU decode step at batch 64).
#include <cmath>

#include "model/ops/cuda/cuda_common.cuh"
#include "rollout/sampling.h"

namespace rlhf::rollout {

using model::bf16;
using model::cuda::kWarpSize;
using model::cuda::to_f32;
using model::cuda::warp_sum;

namespace {

constexpr int kThreads = 256;
// Tokens per partial sum of exp(z − max z), as the host Sampler's kBlock: the CDF walk skips
// whole chunks.
constexpr int64_t kChunk = 256;
constexpr int64_t kMaxChunks = 48 * 1024 / int64_t(sizeof(float));  // 48 KiB of shared memory

// exp(z − m) for z = scale·x: the one expression both the chunk sums and the walk evaluate.
__device__ __forceinline__ float exp_term(float scale, bf16 x, float m) {
  return expf(scale * to_f32(x) - m);
}

// (m, arg) ← the larger of (m, arg) and (m2, arg2): the larger value, the lower id on ties.
__device__ __forceinline__ void max_arg(float& m, int32_t& arg, float m2, int32_t arg2) {
  if (m2 > m || (m2 == m && arg2 < arg)) {
    m = m2;
    arg = arg2;
  }
}

// Row b = blockIdx.x. m = max z (NaNs skipped, as on the host), arg = the lowest id among the
// maxima; chunk[c] = Σ exp(z − m) over tokens [c·kChunk, (c + 1)·kChunk); thread 0 then sums
// the chunks in double, checks them, and walks the CDF (or takes arg when greedy).
__global__ void sample_rows_kernel(int32_t* token, float* logprob, const bf16* logits, int64_t V,
                                   const float* inv_temperature, const double* u) {
  extern __shared__ float chunk[];
  __shared__ float warp_m[32];
  __shared__ int32_t warp_arg[32];
  const int64_t b = blockIdx.x;
  const bf16* x = logits + b * V;
  const float it = inv_temperature[b];
  const bool greedy = !(it > 0.0f);
  const float scale = greedy ? 1.0f : it;
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int nwarps = int(blockDim.x) / kWarpSize;

  float m = -INFINITY;
  int32_t arg = INT32_MAX;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float z = scale * to_f32(x[j]);
    if (z > m) {  // ascending j: the thread keeps its lowest id among equal maxima
      m = z;
      arg = int32_t(j);
    }
  }
  for (int o = kWarpSize / 2; o > 0; o >>= 1)
    max_arg(m, arg, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, arg, o));
  if (lane == 0) {
    warp_m[warp] = m;
    warp_arg[warp] = arg;
  }
  __syncthreads();
  m = warp_m[0];
  arg = warp_arg[0];
  for (int w = 1; w < nwarps; ++w) max_arg(m, arg, warp_m[w], warp_arg[w]);

  const int64_t nchunks = (V + kChunk - 1) / kChunk;
  for (int64_t c = warp; c < nchunks; c += nwarps) {
    const int64_t end = c * kChunk + kChunk < V ? c * kChunk + kChunk : V;
    float s = 0.0f;
    for (int64_t j = c * kChunk + lane; j < end; j += kWarpSize) s += exp_term(scale, x[j], m);
    s = warp_sum(s);
    if (lane == 0) chunk[c] = s;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;

  double total = 0;
  for (int64_t c = 0; c < nchunks; ++c) total += chunk[c];
  if (!(isfinite(total) && total > 0 && isfinite(m))) {
    token[b] = -1;
    logprob[b] = NAN;
    return;
  }
  const double lse = double(m) + log(total);
  int32_t tok = -1;
  if (greedy) {
    tok = arg;
  } else {
    // Inverse CDF in id order: find the chunk, then the token inside it (Sampler::sample).
    const double target = u[b] * total;
    double cum = 0;
    int64_t c = 0;
    while (c < nchunks - 1 && cum + chunk[c] <= target) cum += chunk[c++];
    const int64_t b0 = c * kChunk, b1 = b0 + kChunk < V ? b0 + kChunk : V;
    for (int64_t j = b0; j < b1; ++j) {
      const float e = exp_term(scale, x[j], m);
      if (e <= 0.0f) continue;
      tok = int32_t(j);  // the last token with mass so far: the fallback under rounding
      cum += e;
      if (cum > target) break;
    }
    for (int64_t j = b0 - 1; tok < 0 && j >= 0; --j)  // rounding put the target past the mass
      if (exp_term(scale, x[j], m) > 0.0f) tok = int32_t(j);
  }
  token[b] = tok;
  logprob[b] = float(double(scale * to_f32(x[tok])) - lse);
}

}  // namespace

void sample_rows_cuda(int32_t* token, float* logprob, const bf16* logits, int64_t B, int64_t V,
                      const float* inv_temperature, const double* u, cudaStream_t stream) {
  RLHF_CHECK(B >= 0, "sample_rows_cuda: B must be >= 0, got {}", B);
  const int64_t nchunks = (V + kChunk - 1) / kChunk;
  RLHF_CHECK(V > 0 && nchunks <= kMaxChunks,
             "sample_rows_cuda: vocabulary size V must be in [1, {}], got {}", kMaxChunks * kChunk,
             V);
  if (B == 0) return;
  sample_rows_kernel<<<unsigned(B), kThreads, size_t(nchunks) * sizeof(float), stream>>>(
      token, logprob, logits, V, inv_temperature, u);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::rollout
