// RoPE on the GPU: one thread per rotated pair.
#include <vector>

#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/rope.h"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

// Pair p of the flat index space (N·H·D/2 pairs): row nh = p / half, pair i = p % half. Rotates
// (a, b) by ±angle: (a·c − b·s, a·s + b·c), s = sign·sin. Both elements of the pair are read
// before either is written, by the same thread, so out may alias x.
__global__ void rope_kernel(bf16* out, const bf16* x, const int32_t* pos, const float* cos,
                            const float* sin, int64_t N, int64_t H, int64_t D, bool interleaved,
                            float sign) {
  const int64_t half = D / 2;
  const int64_t pairs = N * H * half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t nh = p / half, i = p % half;
    const int32_t ps = pos[nh / H];
    const int64_t ia = nh * D + (interleaved ? 2 * i : i);
    const int64_t ib = interleaved ? ia + 1 : ia + half;
    if (ps < 0) {  // not representable in the table: make the row visibly wrong
      out[ia] = to_bf16(NAN);
      out[ib] = to_bf16(NAN);
      continue;
    }
    const float c = cos[static_cast<int64_t>(ps) * half + i];
    const float s = sign * sin[static_cast<int64_t>(ps) * half + i];
    const float a = to_f32(x[ia]), b = to_f32(x[ib]);
    out[ia] = to_bf16(a * c - b * s);
    out[ib] = to_bf16(a * s + b * c);
  }
}

void launch(bf16* out, const bf16* x, const int32_t* pos, const float* cos, const float* sin,
            int64_t N, int64_t H, int64_t D, RopeStyle style, float sign, const char* op,
            cudaStream_t stream) {
  RLHF_CHECK(D > 0 && D % 2 == 0, "{}: head_dim must be even and positive, got {}", op, D);
  RLHF_CHECK(N >= 0 && H > 0, "{}: need N >= 0 and H > 0, got N={} H={}", op, N, H);
  const int64_t pairs = N * H * (D / 2);
  if (pairs == 0) return;
  rope_kernel<<<cuda::grid_for(pairs, 256), 256, 0, stream>>>(
      out, x, pos, cos, sin, N, H, D, style == RopeStyle::kInterleaved, sign);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward_cuda(bf16* out, const bf16* x, const int32_t* pos, const float* cos,
                       const float* sin, int64_t N, int64_t H, int64_t D, RopeStyle style,
                       cudaStream_t stream) {
  NVTX_RANGE_FN();
  launch(out, x, pos, cos, sin, N, H, D, style, 1.0f, "rope_forward_cuda", stream);
}

void rope_backward_cuda(bf16* dx, const bf16* dout, const int32_t* pos, const float* cos,
                        const float* sin, int64_t N, int64_t H, int64_t D, RopeStyle style,
                        cudaStream_t stream) {
  NVTX_RANGE_FN();
  launch(dx, dout, pos, cos, sin, N, H, D, style, -1.0f, "rope_backward_cuda", stream);
}

void rope_tables_upload_cuda(float* cos, float* sin, int64_t max_pos, int64_t D, double theta) {
  std::vector<float> c(static_cast<size_t>(max_pos * D / 2)), s(c.size());
  rope_tables_cpu(c.data(), s.data(), max_pos, D, theta);
  CUDA_CHECK(cudaMemcpy(cos, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(sin, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice));
}

}  // namespace rlhf::model
