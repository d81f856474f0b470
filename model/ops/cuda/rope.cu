// RoPE on the GPU: one thread per rotated pair.
#include <vector>

#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/rope.h"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

// The rotation of one pair (a, b) at element indices ia, ib of x into out by ±angle of position
// ps, pair i: (a·c − b·s, a·s + b·c), s = sign·sin. A negative position is not representable in
// the table: the pair becomes NaN (visibly wrong). Both elements are read before either is
// written, so out may alias x. Shared by the plain and the packed-QKV kernels, so both round
// the same.
__device__ __forceinline__ void rotate_pair(bf16* out, const bf16* x, int64_t oa, int64_t ob,
                                            int64_t ia, int64_t ib, int32_t ps, int64_t i,
                                            int64_t half, const float* cos, const float* sin,
                                            float sign) {
  if (ps < 0) {
    out[oa] = to_bf16(NAN);
    out[ob] = to_bf16(NAN);
    return;
  }
  const float c = cos[static_cast<int64_t>(ps) * half + i];
  const float s = sign * sin[static_cast<int64_t>(ps) * half + i];
  const float a = to_f32(x[ia]), b = to_f32(x[ib]);
  out[oa] = to_bf16(a * c - b * s);
  out[ob] = to_bf16(a * s + b * c);
}

// Pair p of the flat index space (N·H·D/2 pairs): row nh = p / half, pair i = p % half.
__global__ void rope_kernel(bf16* out, const bf16* x, const int32_t* pos, const float* cos,
                            const float* sin, int64_t N, int64_t H, int64_t D, bool interleaved,
                            float sign) {
  const int64_t half = D / 2;
  const int64_t pairs = N * H * half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t nh = p / half, i = p % half;
    const int64_t ia = nh * D + (interleaved ? 2 * i : i);
    const int64_t ib = interleaved ? ia + 1 : ia + half;
    rotate_pair(out, x, ia, ib, ia, ib, pos[nh / H], i, half, cos, sin, sign);
  }
}

// RoPE on a packed QKV row layout. Pair p of N·(H + 2·Hkv)·D/2: token n, head h of the packed
// row [q heads | k heads | v heads], pair i. kSplit: reads the packed qkv, writes q, k rotated
// (sign) and v copied into their own (N, heads, D) arrays. !kSplit: the reverse, reads q, k, v and
// writes the packed row. kSplit with cache.k_cache: the k and v pairs also go to token n's slot
// of the paged cache (kv_cache_write_kernel's addressing).
template <bool kSplit>
__global__ void qkv_rope_kernel(bf16* packed_out, const bf16* packed_in, bf16* q_out, bf16* k_out,
                                bf16* v_out, const bf16* q_in, const bf16* k_in, const bf16* v_in,
                                const int32_t* pos, const float* cos, const float* sin, int64_t N,
                                int64_t H, int64_t Hkv, int64_t D, bool interleaved, float sign,
                                KvCacheWrite cache) {
  const int64_t half = D / 2, heads = H + 2 * Hkv;
  const int64_t pairs = N * heads * half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t nh = p / half, i = p % half;
    const int64_t n = nh / heads, h = nh % heads;
    const int64_t a = interleaved ? 2 * i : i;
    const int64_t b = interleaved ? a + 1 : a + half;
    const int64_t packed = nh * D;
    // The head's own array and row offset.
    int64_t row = 0;
    const bf16* src = nullptr;
    bf16* dst = nullptr;
    if (h < H) {
      row = (n * H + h) * D;
      src = q_in;
      dst = q_out;
    } else if (h < H + Hkv) {
      row = (n * Hkv + (h - H)) * D;
      src = k_in;
      dst = k_out;
    } else {
      row = (n * Hkv + (h - H - Hkv)) * D;
      src = v_in;
      dst = v_out;
    }
    bf16* out = kSplit ? dst : packed_out;
    const bf16* in = kSplit ? packed_in : src;
    const int64_t oa = kSplit ? row + a : packed + a, ob = kSplit ? row + b : packed + b;
    const int64_t ia = kSplit ? packed + a : row + a, ib = kSplit ? packed + b : row + b;
    if (h >= H + Hkv) {  // v: copied
      out[oa] = in[ia];
      out[ob] = in[ib];
    } else {
      rotate_pair(out, in, oa, ob, ia, ib, pos[n], i, half, cos, sin, sign);
    }
    if (kSplit && cache.k_cache != nullptr && h >= H) {
      const int64_t slot = cuda::paged_kv_row(cache.block_table + n * cache.table_stride, pos[n],
                                              (h - H) % Hkv, Hkv, cache.block_size, D);
      bf16* c = h < H + Hkv ? cache.k_cache : cache.v_cache;
      c[slot + a] = out[oa];
      c[slot + b] = out[ob];
    }
  }
}

void check_qkv(const char* op, int64_t N, int64_t H, int64_t Hkv, int64_t D) {
  RLHF_CHECK(D > 0 && D % 2 == 0, "{}: head_dim must be even and positive, got {}", op, D);
  RLHF_CHECK(N >= 0 && H > 0 && Hkv > 0, "{}: need N >= 0, H > 0 and Hkv > 0, got N={} H={} Hkv={}",
             op, N, H, Hkv);
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

void qkv_rope_split_cuda(bf16* q, bf16* k, bf16* v, const bf16* qkv, const int32_t* pos,
                         const float* cos, const float* sin, int64_t N, int64_t H, int64_t Hkv,
                         int64_t D, RopeStyle style, cudaStream_t stream,
                         const KvCacheWrite* cache) {
  NVTX_RANGE_FN();
  check_qkv("qkv_rope_split_cuda", N, H, Hkv, D);
  RLHF_CHECK(cache == nullptr || (cache->k_cache && cache->v_cache && cache->block_table &&
                                  cache->block_size > 0 && cache->table_stride >= 0),
             "qkv_rope_split_cuda: a KV cache to write needs both caches, a block table, "
             "block_size > 0 and table_stride >= 0");
  const int64_t pairs = N * (H + 2 * Hkv) * (D / 2);
  if (pairs == 0) return;
  qkv_rope_kernel<true><<<cuda::grid_for(pairs, 256), 256, 0, stream>>>(
      nullptr, qkv, q, k, v, nullptr, nullptr, nullptr, pos, cos, sin, N, H, Hkv, D,
      style == RopeStyle::kInterleaved, 1.0f, cache != nullptr ? *cache : KvCacheWrite{});
  CUDA_CHECK(cudaGetLastError());
}

void qkv_rope_merge_backward_cuda(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv,
                                  const int32_t* pos, const float* cos, const float* sin, int64_t N,
                                  int64_t H, int64_t Hkv, int64_t D, RopeStyle style,
                                  cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_qkv("qkv_rope_merge_backward_cuda", N, H, Hkv, D);
  const int64_t pairs = N * (H + 2 * Hkv) * (D / 2);
  if (pairs == 0) return;
  qkv_rope_kernel<false><<<cuda::grid_for(pairs, 256), 256, 0, stream>>>(
      dqkv, nullptr, nullptr, nullptr, nullptr, dq, dk, dv, pos, cos, sin, N, H, Hkv, D,
      style == RopeStyle::kInterleaved, -1.0f, KvCacheWrite{});
  CUDA_CHECK(cudaGetLastError());
}

void rope_tables_upload_cuda(float* cos, float* sin, int64_t max_pos, int64_t D,
                             const double* inv_freq) {
  RLHF_CHECK(D > 0 && D % 2 == 0,
             "rope_tables_upload_cuda: head_dim must be even and positive, got {}", D);
  RLHF_CHECK(max_pos >= 0, "rope_tables_upload_cuda: max_pos must be >= 0, got {}", max_pos);
  std::vector<float> c(static_cast<size_t>(max_pos * D / 2)), s(c.size());
  rope_tables_cpu(c.data(), s.data(), max_pos, D, inv_freq);
  CUDA_CHECK(cudaMemcpy(cos, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(sin, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA lands, and kernels on non-blocking
  // streams do not wait for the legacy stream.
  CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void rope_tables_upload_cuda(float* cos, float* sin, int64_t max_pos, int64_t D, double theta) {
  RLHF_CHECK(D > 0 && D % 2 == 0,
             "rope_tables_upload_cuda: head_dim must be even and positive, got {}", D);
  RLHF_CHECK(theta > 0, "rope_tables_upload_cuda: rope_theta must be > 0, got {}", theta);
  const std::vector<double> inv_freq = rope_default_inv_freq(D, theta);
  rope_tables_upload_cuda(cos, sin, max_pos, D, inv_freq.data());
}

}  // namespace rlhf::model
