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
// The chunk sums' dynamic shared memory: 48 KiB (a kernel's limit without opting in) less 2 KiB
// for the static arrays (the warp maxima and one chunk's terms).
constexpr int64_t kMaxChunks = (48 * 1024 - 2 * 1024) / int64_t(sizeof(float));

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

// Tokens of one chunk held per lane in the chunk pass: lane l has tokens l, l + 32, ... (kChunk /
// kWarpSize of them), summed in that order.
constexpr int kPerLane = int(kChunk) / kWarpSize;
// Chunks a warp has in flight in the chunk pass: their loads are issued before any of their sums,
// so the pass waits on memory once per kChunksInFlight chunks, not once per chunk.
constexpr int kChunksInFlight = 4;

// (m, arg) over the row x (V tokens) of this thread's share: 16-byte loads of 8 tokens when V is a
// multiple of 8 (the rows then start 16-byte aligned), else token by token. Ascending ids within
// the thread, so it keeps its lowest id among equal maxima; NaNs never win.
__device__ __forceinline__ void thread_max(float& m, int32_t& arg, const bf16* x, int64_t V,
                                           float scale) {
  if (V % 8 == 0) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < V / 8; v += blockDim.x) {
      const uint4 r = xv[v];
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float z = scale * model::cuda::bf16_pair_to_f32(w[e / 2], e % 2);
        if (z > m) {
          m = z;
          arg = int32_t(8 * v + e);
        }
      }
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float z = scale * to_f32(x[j]);
    if (z > m) {
      m = z;
      arg = int32_t(j);
    }
  }
}

// Row b = blockIdx.x. m = max z (NaNs skipped, as on the host), arg = the lowest id among the
// maxima; chunk[c] = Σ exp(z − m) over tokens [c·kChunk, (c + 1)·kChunk), each warp loading
// kChunksInFlight chunks before summing them; warp 0 then checks the total, lane 0 finds the chunk
// that holds the draw, the warp evaluates that chunk's terms into shared memory, and lane 0 walks
// them (or takes arg when greedy). A chunk's sum is the same expression whichever warp and round
// compute it (each lane's kPerLane tokens in order, then the warp's butterfly), and lane 0 sums the
// chunks and walks the chosen one in id order, so a row's result depends on neither.
__global__ void sample_rows_kernel(int32_t* token, float* logprob, const bf16* logits, int64_t V,
                                   const float* inv_temperature, const double* u) {
  extern __shared__ float chunk[];
  __shared__ float warp_m[32];
  __shared__ int32_t warp_arg[32];
  __shared__ float terms[kChunk];
  const int64_t b = blockIdx.x;
  const bf16* x = logits + b * V;
  const float it = inv_temperature[b];
  const bool greedy = !(it > 0.0f);
  const float scale = greedy ? 1.0f : it;
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int nwarps = int(blockDim.x) / kWarpSize;

  float m = -INFINITY;
  int32_t arg = INT32_MAX;
  thread_max(m, arg, x, V, scale);
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
  for (int64_t c0 = warp; c0 < nchunks; c0 += int64_t(kChunksInFlight) * nwarps) {
    bf16 v[kChunksInFlight][kPerLane];
#pragma unroll
    for (int k = 0; k < kChunksInFlight; ++k)
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int64_t j = (c0 + int64_t(k) * nwarps) * kChunk + lane + kWarpSize * t;
        v[k][t] = j < V ? x[j] : bf16{};
      }
#pragma unroll
    for (int k = 0; k < kChunksInFlight; ++k) {
      const int64_t c = c0 + int64_t(k) * nwarps;  // warp-uniform
      if (c >= nchunks) break;
      float s = 0.0f;
#pragma unroll
      for (int t = 0; t < kPerLane; ++t)
        if (c * kChunk + lane + kWarpSize * t < V) s += exp_term(scale, v[k][t], m);
      s = warp_sum(s);
      if (lane == 0) chunk[c] = s;
    }
  }
  __syncthreads();
  if (warp != 0) return;

  double total = 0, cum = 0, target = 0;
  int c = 0, ok = 0;
  if (lane == 0) {
    for (int64_t i = 0; i < nchunks; ++i) total += chunk[i];
    ok = isfinite(total) && total > 0 && isfinite(m);
    if (ok && !greedy) {  // inverse CDF in id order: the chunk first (Sampler::sample)
      target = u[b] * total;
      while (c < nchunks - 1 && cum + chunk[c] <= target) cum += chunk[c++];
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  if (!ok) {
    if (lane == 0) {
      token[b] = -1;
      logprob[b] = NAN;
    }
    return;
  }
  if (!greedy) {  // the chunk's terms, evaluated by the warp, then walked by lane 0
    c = __shfl_sync(0xffffffffu, c, 0);
    const int64_t b0 = int64_t(c) * kChunk;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t j = b0 + lane + kWarpSize * t;
      terms[lane + kWarpSize * t] = j < V ? exp_term(scale, x[j], m) : 0.0f;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  const double lse = double(m) + log(total);
  int32_t tok = -1;
  if (greedy) {
    tok = arg;
  } else {
    const int64_t b0 = int64_t(c) * kChunk, b1 = b0 + kChunk < V ? b0 + kChunk : V;
    for (int64_t j = b0; j < b1; ++j) {
      const float e = terms[j - b0];
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
