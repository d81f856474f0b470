// Fused log-softmax + gather (+ entropy) over the vocabulary on the GPU: one block per row, the
// bf16 row streamed twice in fp32; nothing of size (N, V) in fp32.
#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/logprob.h"

namespace rlhf::model {

using cuda::block_max;
using cuda::block_sum;
using cuda::to_bf16;
using cuda::to_f32;

namespace {

constexpr int kBlock = 512;

// Row n = blockIdx.x (grid-stride over rows). z = scale·x, m = max z:
//   S = Σ exp(z − m), E = Σ exp(z − m)·(z − m), lse = m + log S, entropy = log S − E / S,
//   lp = z[target] − lse (0 for target −1, NaN for an invalid target).
__global__ void logprob_forward_kernel(float* lp, float* lse, float* entropy, const bf16* logits,
                                       const int32_t* targets, int64_t N, int64_t V, float scale) {
  __shared__ float scratch[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const bf16* x = logits + n * V;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, scale * to_f32(x[j]));
    m = block_max(m, scratch);
    float s = 0.0f, e = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float d = scale * to_f32(x[j]) - m;
      const float ex = expf(d);
      s += ex;
      e += ex * d;
    }
    s = block_sum(s, scratch);
    if (entropy != nullptr) e = block_sum(e, scratch);  // block-uniform condition
    if (threadIdx.x == 0) {
      const float log_s = logf(s);
      const float l = m + log_s;
      lse[n] = l;
      const int32_t t = targets[n];
      lp[n] = t == -1 ? 0.0f : (t >= 0 && t < V) ? scale * to_f32(x[t]) - l : NAN;
      if (entropy != nullptr) entropy[n] = log_s - e / s;
    }
  }
}

// dx_j = −scale·p_j·(c + b·log p_j) + scale·a·[j == target],  log p_j = scale·x_j − lse,
// a = dlp (0 without a target), b = dentropy, c = a + b·H. Each element is read and then written
// by the same thread: dlogits may alias logits.
__global__ void logprob_backward_kernel(bf16* dlogits, const float* dlp, const float* dentropy,
                                        const bf16* logits, const float* lse, const float* entropy,
                                        const int32_t* targets, int64_t N, int64_t V, float scale) {
  const bool with_entropy = dentropy != nullptr && entropy != nullptr;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const bf16* x = logits + n * V;
    bf16* dx = dlogits + n * V;
    const int32_t t = targets[n];
    if (t != -1 && (t < 0 || t >= V)) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = to_bf16(NAN);
      continue;
    }
    const float a = (dlp != nullptr && t >= 0) ? dlp[n] : 0.0f;
    const float b = with_entropy ? dentropy[n] : 0.0f;
    if (a == 0.0f && b == 0.0f) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = to_bf16(0.0f);
      continue;
    }
    const float l = lse[n];
    const float c = a + b * (with_entropy ? entropy[n] : 0.0f);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float log_p = scale * to_f32(x[j]) - l;
      float g = -scale * expf(log_p) * (c + b * log_p);
      if (j == t) g += scale * a;
      dx[j] = to_bf16(g);
    }
  }
}

void check_dims(const char* op, int64_t N, int64_t V) {
  RLHF_CHECK(V > 0, "{}: vocabulary size V must be > 0, got {}", op, V);
  RLHF_CHECK(N >= 0, "{}: N must be >= 0, got {}", op, N);
}

unsigned row_grid(int64_t N) {
  return static_cast<unsigned>(N < 65535 * 16 ? N : 65535 * 16);
}

}  // namespace

void logprob_forward_cuda(float* lp, float* lse, float* entropy, const bf16* logits,
                          const int32_t* targets, int64_t N, int64_t V, float scale,
                          cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("logprob_forward_cuda", N, V);
  if (N == 0) return;
  logprob_forward_kernel<<<row_grid(N), kBlock, 0, stream>>>(lp, lse, entropy, logits, targets, N,
                                                             V, scale);
  CUDA_CHECK(cudaGetLastError());
}

void logprob_backward_cuda(bf16* dlogits, const float* dlp, const float* dentropy,
                           const bf16* logits, const float* lse, const float* entropy,
                           const int32_t* targets, int64_t N, int64_t V, float scale,
                           cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("logprob_backward_cuda", N, V);
  if (N == 0) return;
  logprob_backward_kernel<<<row_grid(N), kBlock, 0, stream>>>(dlogits, dlp, dentropy, logits, lse,
                                                              entropy, targets, N, V, scale);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::model
